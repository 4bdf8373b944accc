# pepsi-ingress's greylisting (a listener's GREYLIST, pepsi.greylist_check):
# a new triplet (client /24, sender, recipient) gets 451 4.7.1, and so does
# its retry before GREYLIST_DELAY; after it the retry is taken, and the
# client, having retried, is let through with another sender at once
# (auto-whitelist).  A trusted client and an allow-listed (DNSWL) one are
# not greylisted.  The triplets are rows of pepsi.greylist.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use PepsiTest;
use SmtpClient;
use TestDNS;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('ingress_greylist', extension => 1);

my $dns = TestDNS->new($tmp);
$dns->zone("5.0.0.127.wl.test. 300 IN A 127.0.0.2\n");

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
LOCAL_DOMAINS = local.test
DNS_FORWARDER = @{[ $dns->forwarder ]}
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 1
TRUSTED_NETWORKS = 127.0.0.1/32
DNSBL_SITES = wl.test*-5
DNSBL_ALLOWLIST_THRESHOLD = -1
[listener-mx]
ADDRESS = 127.0.0.1
PORT = $port
GREYLIST = on
GREYLIST_DELAY = 3s
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-v', '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 1 ready/), 'ingress starts');

# One message from $client: the RCPT reply, and the final one when taken.
sub try_send
{
	my ($client, $sender) = @_;
	my $c = SmtpClient->new($port, from => $client);
	my ($rcpt, $data);

	$c->command('EHLO client.test');
	$c->command("MAIL FROM:<$sender>");
	$rcpt = $c->command('RCPT TO:<user@local.test>');
	if ($rcpt =~ /^250 /)
	{
		$c->command('DATA');
		$c->send("Subject: greylisting\r\n\r\nbody\r\n.\r\n");
		$data = $c->reply(30);
	}
	$c->command('QUIT');
	$c->close;
	return ($rcpt, $data);
}

# The retry at once, before GREYLIST_DELAY (3 s: two sessions take far less).
my ($rcpt, $data) = try_send('127.0.0.4', 'first@sender.test');
my ($early) = try_send('127.0.0.4', 'first@sender.test');
like($rcpt, qr/^451 4\.7\.1 <user\@local\.test>: Recipient address rejected: Greylisted/,
	'a new triplet is greylisted: 451 4.7.1');
like($early, qr/^451 4\.7\.1 /, 'a retry before GREYLIST_DELAY is greylisted again');
is($node->safe_psql($db, "SELECT client || ' ' || sender || ' ' || recipient || ' ' || passed FROM pepsi.greylist"),
	'127.0.0.0/24 first@sender.test user@local.test false', '... and kept in pepsi.greylist, by /24');

# After the delay the retry is taken (polled, bounded: the delay is the server's clock).
my $taken;
for (1 .. 600)
{
	($rcpt, $data) = try_send('127.0.0.4', 'first@sender.test');
	if ($rcpt =~ /^250 /) { $taken = 1; last }
	usleep(100_000);
}
ok($taken, 'the retry after GREYLIST_DELAY is accepted');
like($data, qr/^250 .*queued as/, '... and its message stored');
is($node->safe_psql($db, "SELECT passed FROM pepsi.greylist"), 't', '... the triplet marked passed');

($rcpt) = try_send('127.0.0.9', 'other@elsewhere.test');
like($rcpt, qr/^250 /, 'the client retried: its /24 is let through with another sender at once');

($rcpt) = try_send('127.0.0.1', 'boss@local.test');
like($rcpt, qr/^250 /, 'a trusted client is not greylisted');

# The network's auto-whitelisting forgotten: an allow-listed client skips
# greylisting, one of the same network that is not allow-listed does not.
$node->safe_psql($db, 'TRUNCATE pepsi.greylist, pepsi.greylist_client');
($rcpt) = try_send('127.0.0.5', 'listed@sender.test');
like($rcpt, qr/^250 /, 'an allow-listed (DNSWL) client is not greylisted');
($rcpt) = try_send('127.0.0.6', 'new@sender.test');
like($rcpt, qr/^451 4\.7\.1 /, '... while another client of its network still is');
ok(file_shows($log, qr/127\.0\.0\.6: greylisted: from=<new\@sender\.test> to=<user\@local\.test>/),
	'... and says so in the log');

$ingress->signal('TERM');
$ingress->finish;
done_testing();
