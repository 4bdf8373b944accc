# pepsi-ingress reloads on SIGHUP without dropping a session: a new TLS
# session sees the new certificate while a session opened before finishes
# its transaction (its message is stored); new limits, credentials,
# TRUSTED_NETWORKS, LOCAL_DOMAINS and greylisting are in force for new
# sessions; a bad file, a missing key, a key others may read, a vanished or
# a new listener and an option that only a restart applies (the port, the
# database connections) are refused with the reason (naming the option),
# and the old settings keep serving.

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
my $node = pepsi_node('ingress_reload', extension => 1);
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
	print $fh "[pepsi]\nHOSTNAME = mx.test\nLOCAL_DOMAINS = " . ($o{local_domains} // 'example.org') . "\n"
	  . "[database]\nCONNINFO = host=" . $node->host . ' port=' . $node->port . " dbname=$db\n"
	  . "[ingress]\nCREDENTIALS = $tmp/credentials\nDISPATCH_WAKE_INTERVAL = 20ms\n"
	  . ($o{ingress} // '')
	  . "[listener-smtp]\nADDRESS = 127.0.0.1\nPORT = " . ($o{port} // $port) . "\n"
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
like(reload(), qr/reloaded .*in force for new sessions/, 'SIGHUP reloads');

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

# SIGHUP, then what the log says about it: "reloaded ..." or "reload refused: ...".
sub reload
{
	my $offset = -s "$tmp/ingress.log";
	my $said = '';
	kill 'HUP', $ingress->{pid};
	poll_until(
		sub {
			$said = PostgreSQL::Test::Utils::slurp_file("$tmp/ingress.log", $offset);
			$said =~ /reloaded|reload refused/;
		});
	return $said;
}
sub rcpt_reply
{
	my ($address) = @_;
	my $c = SmtpClient->new($port);
	$c->command('EHLO client.test');
	$c->command('MAIL FROM:<a@example.com>');
	my $reply = $c->command("RCPT TO:<$address>");
	$c->close;
	return $reply;
}

# TRUSTED_NETWORKS and LOCAL_DOMAINS take effect: 127.0.0.1 (loopback,
# trusted by default) may relay until its network is removed; example.net
# becomes local.
like(rcpt_reply('someone@elsewhere.example'), qr/^250/, 'loopback may relay by default');
like(rcpt_reply('someone@example.net'), qr/^250/, '... to example.net too');
write_conf(max_size => 50000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24\n");
like(reload(), qr/reloaded/, 'a new TRUSTED_NETWORKS reloads');
like(rcpt_reply('someone@elsewhere.example'), qr/^554 5\.7\.1/,
	'relay from the removed network is refused after SIGHUP');
like(rcpt_reply('someone@example.net'), qr/^554 5\.7\.1/, '... example.net is not local yet');
write_conf(max_size => 50000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24\n",
	local_domains => 'example.org example.net');
like(reload(), qr/reloaded/, 'a new LOCAL_DOMAINS reloads');
like(rcpt_reply('someone@example.net'), qr/^250/, 'example.net is local after SIGHUP');

# Greylisting turned on by a reload greets a new triplet with 451 at once,
# and turned off lets it through: the whole listener section is applied.
write_conf(max_size => 50000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24\n",
	local_domains => 'example.org example.net', extra => "GREYLIST = yes\n");
like(reload(), qr/reloaded/, 'GREYLIST = yes reloads');
like(rcpt_reply('greylisted@example.net'), qr/^451 4\.7\.1 .*Greylisted/,
	'a new triplet is greylisted after SIGHUP, without a restart');
is($node->safe_psql($db, "SELECT recipient FROM pepsi.greylist"), 'greylisted@example.net',
	'... its triplet recorded');
write_conf(max_size => 50000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24\n",
	local_domains => 'example.org example.net');
like(reload(), qr/reloaded/, 'GREYLIST back to no reloads');
like(rcpt_reply('greylisted@example.net'), qr/^250/, '... and the triplet is let through at once');
write_conf(max_size => 50000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24, nonsense\n",
	local_domains => 'example.org example.net');
like(reload(), qr/reload refused: .*TRUSTED_NETWORKS.*nonsense/, 'a bad TRUSTED_NETWORKS is refused, naming it');
like(rcpt_reply('someone@elsewhere.example'), qr/^554 5\.7\.1/, '... and the last good one stays');

# An option a reload cannot apply refuses it, naming the option, and
# nothing of that file is applied (MAX_SIZE here).
write_conf(max_size => 40000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24\nDATABASE_CONNECTIONS = 2\n",
	local_domains => 'example.org example.net');
like(reload(), qr/reload refused: \[ingress\] DATABASE_CONNECTIONS changed .*restart/,
	'a changed DATABASE_CONNECTIONS refuses the reload, saying a restart applies it');
is(ehlo_size(), 50000, '... and the old limits stay');
write_conf(max_size => 40000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24\n",
	local_domains => 'example.org example.net', port => $port + 1);
like(reload(), qr/reload refused: \[listener-smtp\] PORT changed .*restart/,
	"a listener's option a reload cannot apply (its port) is named too");
is(ehlo_size(), 50000, '... and the old limits stay');
write_conf(max_size => 40000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24\n",
	local_domains => 'example.org example.net',
	extra => "[listener-more]\nADDRESS = 127.0.0.1\nPORT = 1\n");
like(reload(), qr/reload refused: \[listener-more\] is new: .*restart/, 'a new listener refuses the reload');
is(ehlo_size(), 50000, '... and the old limits stay');

# The key is read again at each reload by the daemon's user: one that
# others may read is refused, naming its mode.
chmod 0644, "$tmp/live.key";
write_conf(max_size => 40000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24\n",
	local_domains => 'example.org example.net');
like(reload(), qr/reload refused: .*live\.key.*0644/, 'a key others may read is refused, with its mode');
chmod 0640, "$tmp/live.key";
like(reload(), qr/reloaded/, 'mode 0640 is accepted');

# What ingress does not read does not stop its reload.
write_conf(max_size => 40000, ingress => "TRUSTED_NETWORKS = 192.0.2.0/24\n",
	local_domains => 'example.org example.net',
	extra => "[dispatch]\nPOLL_INTERVAL = 7s\n[database]\nMONITOR_CONNINFO = dbname=elsewhere\n");
like(reload(), qr/reloaded/, "another program's options do not refuse ingress's reload");
is(ehlo_size(), 40000, 'and the new limits are in force');

# Refused reloads keep the old settings.
open my $bad, '>', $conf or die;
print $bad "[listener-smtp\nPORT = 1\n";
close $bad;
like(reload(), qr/reload refused: .*pepsi\.conf:1/, 'a file that does not parse is refused, with its line');
write_conf(key => "$tmp/missing.key");
like(reload(), qr/reload refused: .*missing\.key/, 'a missing key is refused, naming it');
write_conf(extra => "MAX_RECIPIENTS = many\n");
like(reload(), qr/reload refused: .*MAX_RECIPIENTS/, 'a bad limit is refused, naming it');
open $bad, '>', $conf or die;
print $bad "[database]\nCONNINFO = host=" . $node->host . ' port=' . $node->port . " dbname=$db\n"
  . "[listener-other]\nADDRESS = 127.0.0.1\nPORT = 1\n";
close $bad;
like(reload(), qr/reload refused: \[listener-smtp\] is gone/, 'a vanished listener is refused');
($new, $new_cn) = tls_session();
is($new_cn, 'second', 'the last good certificate keeps serving');
$new->close;
is(ehlo_size(), 40000, 'and the last good limits');

stop_dispatcher($ingress);
done_testing();
