# The smarthost's security options against the scripted peer (t/bin/smtp-peer)
# with a certificate made here: STARTTLS verifying the certificate and its
# name, then AUTH; a certificate the client does not trust, a wrong
# password and a server without STARTTLS each defer the message (it is
# paused with the reason in state.last_error) and no DSN is sent;
# TLS = no-verify delivers to the untrusted server.

use strict;
use warnings FATAL => 'all';


use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('delivery_tls');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

# Two self-signed certificates for localhost: the peer's, and one it does not have.
for my $name (qw(peer other))
{
	system('openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
		'-nodes', '-keyout', "$tmp/$name-key.pem", '-out', "$tmp/$name-cert.pem", '-days', '2',
		'-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1')
	  == 0
	  or die "openssl req failed for $name";
}
PostgreSQL::Test::Utils::append_to_file("$tmp/password", "s3cret\n");
PostgreSQL::Test::Utils::append_to_file("$tmp/wrong-password", "guess\n");
chmod 0600, "$tmp/password", "$tmp/wrong-password" or die "chmod: $!";

my $peer = start_peer('--tls-cert', "$tmp/peer-cert.pem", '--tls-key', "$tmp/peer-key.pem",
	'--auth', 'relay:s3cret');

# Deliver one message with these smarthost options; returns the row id and
# leaves the dispatcher running in $d.
my $d;
sub run_with
{
	my ($options, $rcpt) = @_;

	stop_dispatcher($d) if $d;
	my $config = delivery_config($node, maildir_root => $root,
		smarthost => "localhost:$peer->{port}",
		extra => { smarthost => $options . "RETRY_BASE = 60s\nRETRY_MAX = 60s\n" });
	$d = start_dispatcher($config);
	return inject($node, to => [$rcpt],
		headers => "From: <$sender>\r\nTo: <$rcpt>\r\nSubject: to $rcpt\r\n");
}

sub delivered
{
	my ($rcpt) = @_;

	return scalar grep { $_->{data} =~ /Subject: to \Q$rcpt\E/ } peer_messages($peer);
}

sub paused_error
{
	my ($id) = @_;

	return poll_until(sub {
		$node->safe_psql('postgres',
			"SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $id AND status = 'paused'")
	});
}

# verify + AUTH: delivered over TLS after authenticating.
run_with("TLS = verify\nTLS_CA_FILE = $tmp/peer-cert.pem\n"
	  . "AUTH_USER = relay\nAUTH_PASSWORD_FILE = $tmp/password\n", 'one@remote.test');
ok(poll_until(sub { delivered('one@remote.test') == 1 }), 'TLS = verify with AUTH: delivered');
my $transcript = slurp("$peer->{dir}/transcript");
like($transcript, qr/TLS established.*-> AUTH PLAIN/s, 'AUTH PLAIN came after STARTTLS');
unlike($transcript, qr/-> AUTH PLAIN.*TLS established/s, 'and never before it');
like($transcript, qr/<- 235 /, 'the peer accepted the credentials');
ok(poll_until(sub { queue_count($node) == 0 }), 'the row is finished');

# The verification is by name too: TLS_NAME that the certificate lacks.
my $id = run_with("TLS = verify\nTLS_CA_FILE = $tmp/peer-cert.pem\nTLS_NAME = mx.elsewhere.test\n"
	  . "AUTH_USER = relay\nAUTH_PASSWORD_FILE = $tmp/password\n", 'name@remote.test');
like(paused_error($id), qr/certificate not trusted for mx\.elsewhere\.test/,
	'a certificate for another name: deferred, and last_error says why');

# A certificate the client does not trust.
$id = run_with("TLS = verify\nTLS_CA_FILE = $tmp/other-cert.pem\n"
	  . "AUTH_USER = relay\nAUTH_PASSWORD_FILE = $tmp/password\n", 'two@remote.test');
like(paused_error($id), qr/certificate not trusted/, 'an untrusted certificate: deferred');
is(delivered('two@remote.test'), 0, 'nothing was delivered');
unlike(slurp("$peer->{dir}/transcript"), qr/-> AUTH PLAIN.*-> AUTH PLAIN.*-> AUTH PLAIN/s,
	'no credentials were sent to the untrusted server');

# A wrong password.
$id = run_with("TLS = verify\nTLS_CA_FILE = $tmp/peer-cert.pem\n"
	  . "AUTH_USER = relay\nAUTH_PASSWORD_FILE = $tmp/wrong-password\n", 'three@remote.test');
like(paused_error($id), qr/535 5\.7\.8/, 'a refused password: deferred with the 535');

# no-verify delivers to the server the client cannot verify (and the paused rows, resumed).
run_with("TLS = no-verify\nTLS_CA_FILE = $tmp/other-cert.pem\n"
	  . "AUTH_USER = relay\nAUTH_PASSWORD_FILE = $tmp/password\n", 'four@remote.test');
ok(poll_until(sub { delivered('four@remote.test') == 1 }), 'TLS = no-verify: delivered');
$node->safe_psql('postgres',
	"SELECT pepsi.workqueue_resume(array_agg(id)) FROM pepsi.workqueue WHERE status = 'paused'");
ok(poll_until(sub { queue_count($node) == 0 }), 'the deferred rows go once resumed');
is(delivered('two@remote.test') + delivered('three@remote.test') + delivered('name@remote.test'), 3,
	'each of them delivered once');
is(scalar(maildir_files($root, $sender)), 0, 'no DSN for any of the temporary failures');
stop_dispatcher($d);
undef $d;

# A server that offers only AUTH LOGIN, and does not pipeline.
my $login = start_peer('--tls-cert', "$tmp/peer-cert.pem", '--tls-key', "$tmp/peer-key.pem",
	'--auth', 'relay:s3cret', '--auth-mechanisms', 'LOGIN', '--no-pipelining');
my $config = delivery_config($node, maildir_root => $root, smarthost => "127.0.0.1:$login->{port}",
	extra => { smarthost => "TLS = verify\nTLS_CA_FILE = $tmp/peer-cert.pem\n"
	  . "AUTH_USER = relay\nAUTH_PASSWORD_FILE = $tmp/password\n" });
$d = start_dispatcher($config);
inject($node, to => ['login@remote.test']);
ok(poll_until(sub { scalar(peer_messages($login)) == 1 && queue_count($node) == 0 }),
	'AUTH LOGIN, without PIPELINING, over TLS verified by address: delivered');
like(slurp("$login->{dir}/transcript"), qr/-> AUTH LOGIN\n.*<- 235 /s, 'authenticated with LOGIN');
stop_dispatcher($d);
stop_process($login);

# A server without STARTTLS under TLS = verify: deferred, nothing sent in the clear.
my $plain = start_peer('--auth', 'relay:s3cret');
$config = delivery_config($node, maildir_root => $root, smarthost => "127.0.0.1:$plain->{port}",
	extra => { smarthost => "TLS = verify\nAUTH_USER = relay\nAUTH_PASSWORD_FILE = $tmp/password\n"
	  . "RETRY_BASE = 60s\nRETRY_MAX = 60s\n" });
$d = start_dispatcher($config);
$id = inject($node, to => ['five@remote.test']);
like(paused_error($id), qr/does not offer STARTTLS, which TLS = verify requires/,
	'no STARTTLS under verify: deferred');
unlike(slurp("$plain->{dir}/transcript"), qr/-> (AUTH|MAIL FROM)/, 'neither AUTH nor MAIL was sent');
stop_dispatcher($d);

stop_process($peer);
stop_process($plain);
done_testing();
