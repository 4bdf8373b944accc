# pepsi-ingress reloads on SIGHUP without dropping a session: a new TLS
# session sees the new certificate while a session opened before finishes
# its transaction (its message is stored); new limits and credentials are
# in force for new sessions; a bad file, a missing key or a vanished
# listener are refused with the reason, and the old settings keep serving.

use strict;
use warnings FATAL => 'all';

use File::Copy qw(copy);
use IO::Socket::SSL;
use MIME::Base64 qw(encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;
use SmtpClient;

my $db = 'postgres';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $node = pepsi_node('ingress_reload');
$node->safe_psql($db, 'CREATE EXTENSION pepsi');
my $port = PostgreSQL::Test::Cluster::get_free_port();

for my $name ('first', 'second')
{
	system("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
		  . " -keyout $tmp/$name.key -out $tmp/$name.crt -days 2 -subj /CN=$name 2>/dev/null") == 0
	  or die 'openssl req failed';
}
copy("$tmp/first.crt", "$tmp/live.crt");
copy("$tmp/first.key", "$tmp/live.key");
chmod 0600, "$tmp/live.key";
sub credentials
{
	my ($user, $password) = @_;
	my $hash = `openssl passwd -6 -salt reloadtest '$password'`;
	chomp $hash;
	open my $fh, '>', "$tmp/credentials" or die;
	print $fh "$user:$hash\n";
	close $fh;
	chmod 0600, "$tmp/credentials";
}
credentials('alice', 'first secret');

my $conf = "$tmp/pepsi.conf";
sub write_conf
{
	my (%o) = @_;
	open my $fh, '>', $conf or die;
	print $fh "[pepsi]\nHOSTNAME = mx.test\nLOCAL_DOMAINS = example.org\n"
	  . "[database]\nCONNINFO = host=" . $node->host . ' port=' . $node->port . " dbname=$db\n"
	  . "[ingress]\nCREDENTIALS = $tmp/credentials\nDISPATCH_WAKE_INTERVAL = 20ms\n"
	  . "[listener-smtp]\nADDRESS = 127.0.0.1\nPORT = $port\n"
	  . "CERTIFICATE = $tmp/live.crt\nKEY = " . ($o{key} // "$tmp/live.key") . "\n"
	  . 'MAX_SIZE = ' . ($o{max_size} // 100000) . "\n" . ($o{extra} // '');
	close $fh;
}
write_conf();

my $ingress;
END { kill 'KILL', $ingress->{pid} if $ingress && !defined $ingress->{status} }
$ingress = start_dispatcher($conf, program => [ pepsi_bin('pepsi-ingress') ], log => "$tmp/ingress.log");
ok(file_shows("$tmp/ingress.log", qr/ready:/), 'pepsi-ingress starts');

# The certificate a new STARTTLS session gets, and the EHLO after it.
sub tls_session
{
	my $c = SmtpClient->new($port);
	$c->command('EHLO client.test');
	$c->starttls('client.test') or return;
	return ($c, $c->{socket}->peer_certificate('cn'));
}
sub ehlo_size
{
	my $c = SmtpClient->new($port);
	my ($size) = $c->command('EHLO client.test') =~ /^250[- ]SIZE (\d+)/m;
	$c->close;
	return $size // '';
}

my ($old, $cn) = tls_session();
is($cn, 'first', 'the first certificate');
like($old->command('MAIL FROM:<a@example.com>'), qr/^250/, 'an old session starts a transaction');
like($old->command('RCPT TO:<postmaster@example.org>'), qr/^250/, '... with a recipient');
is(ehlo_size(), 100000, 'SIZE is the first MAX_SIZE');

# Reload: a new certificate, a smaller MAX_SIZE, a new password.
copy("$tmp/second.crt", "$tmp/live.crt");
copy("$tmp/second.key", "$tmp/live.key");
credentials('alice', 'second secret');
write_conf(max_size => 50000);
kill 'HUP', $ingress->{pid};
ok(file_shows("$tmp/ingress.log", qr/reloaded .*in force for new sessions/), 'SIGHUP reloads');

my ($new, $new_cn) = tls_session();
is($new_cn, 'second', 'a new TLS session sees the new certificate');
$new->close;
is(ehlo_size(), 50000, 'and the new MAX_SIZE');
like($old->command('DATA'), qr/^354/, 'the old session goes on with DATA');
$old->send("Subject: before the reload\r\n\r\nhello\r\n.\r\n");
like($old->reply, qr/^250/, '... and its message is accepted');
$old->close;
ok(poll_until(sub { $node->safe_psql($db, "SELECT count(*) FROM pepsi.workqueue") eq '1' }),
	'and stored');

sub auth_plain
{
	my ($password) = @_;
	my ($c) = tls_session();
	my $reply = $c->command('AUTH PLAIN ' . encode_base64("\0alice\0$password", ''));
	$c->close;
	return $reply;
}
like(auth_plain('second secret'), qr/^235/, 'the new password is in force');
like(auth_plain('first secret'), qr/^535/, 'the old one is not');

# Refused reloads keep the old settings.
open my $bad, '>', $conf or die;
print $bad "[listener-smtp\nPORT = 1\n";
close $bad;
kill 'HUP', $ingress->{pid};
ok(file_shows("$tmp/ingress.log", qr/reload refused: .*pepsi\.conf:1/), 'a file that does not parse is refused, with its line');
write_conf(key => "$tmp/missing.key");
kill 'HUP', $ingress->{pid};
ok(file_shows("$tmp/ingress.log", qr/reload refused: .*missing\.key/), 'a missing key is refused, naming it');
write_conf(extra => "MAX_RECIPIENTS = many\n");
kill 'HUP', $ingress->{pid};
ok(file_shows("$tmp/ingress.log", qr/reload refused: .*MAX_RECIPIENTS/), 'a bad limit is refused, naming it');
open $bad, '>', $conf or die;
print $bad "[database]\nCONNINFO = host=" . $node->host . ' port=' . $node->port . " dbname=$db\n"
  . "[listener-other]\nADDRESS = 127.0.0.1\nPORT = 1\n";
close $bad;
kill 'HUP', $ingress->{pid};
ok(file_shows("$tmp/ingress.log", qr/reload refused: \[listener-smtp\] is gone/), 'a vanished listener is refused');
($new, $new_cn) = tls_session();
is($new_cn, 'second', 'the last good certificate keeps serving');
$new->close;
is(ehlo_size(), 50000, 'and the last good limits');

stop_dispatcher($ingress);
done_testing();
