# OAuth 2.0 to the smarthost: pepsi-helper-token-refresh gets an access
# token from a scripted HTTPS token endpoint (t/bin/oauth-endpoint) with
# a refresh token, and pepsi-stage-relay-to-smarthost authenticates with
# it (XOAUTH2, then OAUTHBEARER) to the scripted peer (t/bin/smtp-peer),
# which accepts only the token it is told is valid.  When that token
# expires the message is deferred with the server's reason; the helper
# renews the token, and the message goes on the next attempt.  Bad input:
# an endpoint that refuses the grant or fails, an http:// endpoint, a
# token file others may read, and contradictory options each leave the
# token as it was and say why.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('relay_oauth');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

# One certificate for localhost: the peer's STARTTLS and the endpoint's HTTPS.
system('openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
	'-nodes', '-keyout', "$tmp/key.pem", '-out', "$tmp/cert.pem", '-days', '2',
	'-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1') == 0
  or die 'openssl req failed';

my $endpoint = start_server('oauth-endpoint', sub {
	my ($port, $dir) = @_;
	return ("$ENV{PEPSI_TOP}/t/bin/oauth-endpoint", $dir, $port, "$tmp/cert.pem", "$tmp/key.pem");
});
my $state = $endpoint->{dir};
sub endpoint_set
{
	my ($name, $value) = @_;
	if (defined $value) { open my $f, '>', "$state/$name" or die; print $f "$value\n"; close $f }
	else { unlink "$state/$name" }
}
endpoint_set(client => 'pepsi-client s3cret-client');
endpoint_set(refresh => 'refresh-A');
endpoint_set(lifetime => 3600);
sub requests { return -e "$state/requests" ? scalar(() = slurp("$state/requests") =~ /\n/g) : 0 }

# The secrets: 0600, as the helper demands.
for ([ 'client-secret', 's3cret-client' ], [ 'refresh', 'refresh-A' ])
{
	open my $f, '>', "$tmp/$_->[0]" or die;
	print $f "$_->[1]\n";
	close $f;
	chmod 0600, "$tmp/$_->[0]" or die;
}
my $token_file = "$tmp/access-token";

# The peer's idea of the valid token, which the test changes to expire one.
my $valid = "$tmp/peer-valid-token";
sub peer_accepts { open my $f, '>', $valid or die; print $f "$_[0]\n"; close $f }
peer_accepts('tok-1');
my $peer = start_peer('--tls-cert', "$tmp/cert.pem", '--tls-key', "$tmp/key.pem",
	'--auth', 'relay@example.test:unused', '--auth-mechanisms', 'PLAIN XOAUTH2 OAUTHBEARER',
	'--oauth-token-file', $valid);

sub oauth_options
{
	my ($mechanism, %o) = @_;
	my $url = $o{url} // "https://localhost:$endpoint->{port}/token";
	return "TLS = verify\nTLS_CA_FILE = $tmp/cert.pem\nAUTH_USER = relay\@example.test\n"
	  . "AUTH_MECHANISM = $mechanism\nAUTH_TOKEN_FILE = $token_file\n"
	  . "OAUTH_TOKEN_ENDPOINT = $url\nOAUTH_CLIENT_ID = pepsi-client\n"
	  . "OAUTH_CLIENT_SECRET_FILE = $tmp/client-secret\nOAUTH_REFRESH_TOKEN_FILE = $tmp/refresh\n"
	  . "OAUTH_CA_FILE = $tmp/cert.pem\nOAUTH_REFRESH_BEFORE = 5m\n"
	  . "RETRY_BASE = 500ms\nRETRY_MAX = 1s\n"
	  # A session per message: a token the server took once is not asked again on the same session.
	  . "REUSE_MESSAGES = 1\n" . ($o{more} // '');
}

sub config_for
{
	my ($mechanism, %o) = @_;
	return delivery_config($node, maildir_root => $root, smarthost => "localhost:$peer->{port}",
		extra => { smarthost => oauth_options($mechanism, %o) });
}

# Run the helper; returns (exit status, its output).
sub refresh
{
	my ($config, @args) = @_;
	my $out = "$tmp/refresh.out";
	my $rc = system("'" . pepsi_bin('pepsi-helper-token-refresh') . "' -c '$config' @args > '$out' 2>&1");
	return ($rc >> 8, slurp($out));
}

sub delivered
{
	my ($rcpt) = @_;
	return scalar grep { $_->{data} =~ /Subject: to \Q$rcpt\E/ } peer_messages($peer);
}

sub send_to
{
	my ($rcpt) = @_;
	return inject($node, to => [$rcpt], headers => "From: <$sender>\r\nTo: <$rcpt>\r\nSubject: to $rcpt\r\n");
}

# --- The helper fetches the first token --------------------------------------
my $config = config_for('xoauth2');
my ($rc, $out) = refresh($config);
is($rc, 0, 'the helper renews a missing token') or diag($out);
like($out, qr/renewed the access token in \Q$token_file\E: valid for 3600s/, '... and says so');
is((split /\n/, slurp($token_file))[0], 'tok-1', 'the token file holds the issued token');
like(slurp($token_file), qr/^expires \d+$/m, '... and when it expires');
is(sprintf('%04o', (stat $token_file)[2] & 07777), '0640', 'mode 0640: for the pepsi-token group');
my ($request) = split /\n/, slurp("$state/requests");
like($request, qr/"grant_type": "refresh_token"/, 'RFC 6749 6: a refresh_token grant');
like($request, qr/"client_secret": "s3cret-client"/, 'the client authenticated in the body');

($rc, $out) = refresh($config);
is($rc, 0, 'a second run with a fresh token');
like($out, qr/good for \d+s more: not renewed/, '... renews nothing');
is(requests(), 1, '... and asks the endpoint nothing');

# --- XOAUTH2: delivered with the token, never fused --------------------------
my $d = start_dispatcher($config);
send_to('one@remote.test');
ok(poll_until(sub { delivered('one@remote.test') == 1 && queue_count($node) == 0 }),
	'XOAUTH2: delivered with the access token');
my $transcript = slurp("$peer->{dir}/transcript");
like($transcript, qr/TLS established.*-> AUTH XOAUTH2 \S+\n\d+ <- 235 /s, 'AUTH XOAUTH2 after STARTTLS, accepted');
unlike($transcript, qr/-> AUTH PLAIN/, 'no password mechanism was tried');
like(dispatcher_log($d), qr/smarthost/, 'the smarthost stage ran');

# --- The token expires: deferred with the reason; renewed; delivered ----------
peer_accepts('tok-2');
my $id = send_to('two@remote.test');
ok(poll_until(sub {
	$node->safe_psql('postgres', "SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $id")
	  =~ /invalid_token/ }),
	'a token the server refuses: deferred, last_error has the server\'s invalid_token');
is(delivered('two@remote.test'), 0, 'nothing delivered with the expired token');
($rc, $out) = refresh($config, '--force');
is($rc, 0, '--force renews a token not yet due') or diag($out);
is((split /\n/, slurp($token_file))[0], 'tok-2', 'the new token is in the file');
ok(poll_until(sub { delivered('two@remote.test') == 1 && queue_count($node) == 0 }),
	'the deferred message goes with the renewed token, without a restart');
stop_dispatcher($d);

# --- OAUTHBEARER (RFC 7628), and a rotated refresh token ----------------------
endpoint_set(rotate => 1);
peer_accepts('tok-3');
$config = config_for('oauthbearer');
($rc, $out) = refresh($config, '--force');
is($rc, 0, 'renewed once more') or diag($out);
like($out, qr/the refresh token was rotated/, 'the endpoint rotated the refresh token');
is(slurp("$tmp/refresh"), "refresh-A+\n", 'the rotated refresh token replaced the old one');
is(sprintf('%04o', (stat "$tmp/refresh")[2] & 07777), '0600', '... still mode 0600');
$d = start_dispatcher($config);
send_to('three@remote.test');
ok(poll_until(sub { delivered('three@remote.test') == 1 && queue_count($node) == 0 }),
	'OAUTHBEARER: delivered');
like(slurp("$peer->{dir}/transcript"), qr/-> AUTH OAUTHBEARER \S+\n\d+ <- 235 /, 'with AUTH OAUTHBEARER');
stop_dispatcher($d);
endpoint_set(rotate => undef);

# --- Bad input ---------------------------------------------------------------
my $before = slurp($token_file);
endpoint_set(fail => 400);
($rc, $out) = refresh($config, '--force');
is($rc, 65, 'a refused grant: exit status 65');
like($out, qr/HTTP 400: invalid_grant \(the test endpoint was told to fail\).*a new refresh token is needed/,
	'... naming the error and what to do');
is(slurp($token_file), $before, '... and the token file is unchanged');
endpoint_set(fail => 503);
($rc, $out) = refresh($config, '--force');
is($rc, 75, 'an endpoint that fails: exit status 75 (try again)');
like($out, qr/HTTP 503.*tried again at the next run/, '... and says it will be tried again');
is(slurp($token_file), $before, '... the token file unchanged');
endpoint_set(fail => undef);

($rc, $out) = refresh(config_for('xoauth2', url => "http://localhost:$endpoint->{port}/token"), '--force');
is($rc, 78, 'an http:// endpoint is refused');
like($out, qr/is not an https:\/\/ URL/, '... because tokens never travel in the clear');

chmod 0644, $token_file or die;
peer_accepts('tok-4');
$d = start_dispatcher(config_for('xoauth2'));
$id = send_to('four@remote.test');
ok(poll_until(sub {
	$node->safe_psql('postgres', "SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $id")
	  =~ /AUTH_TOKEN_FILE .*others may access it/ }),
	'a token file others may read is refused: deferred, with the reason');
stop_dispatcher($d);
chmod 0640, $token_file or die;
$node->safe_psql('postgres', "DELETE FROM pepsi.workqueue");

my $contradiction = delivery_config($node, maildir_root => $root, smarthost => "localhost:$peer->{port}",
	extra => { smarthost => "AUTH_USER = relay\nAUTH_TOKEN_FILE = $token_file\n" });
$d = start_dispatcher($contradiction);
send_to('five@remote.test');
ok(poll_until(sub { dispatcher_log($d) =~ /has AUTH_TOKEN_FILE but AUTH_MECHANISM is password/ }),
	'AUTH_TOKEN_FILE without a token mechanism: the worker refuses the configuration, naming both options');
stop_dispatcher($d);
$node->safe_psql('postgres', "DELETE FROM pepsi.workqueue");

done_testing();
