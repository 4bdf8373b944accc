# pepsi-ingress's connection-level checks (daemons/ingress/screen.c): DNS
# block and allow lists served by the tests' DNS server, weighted as
# postscreen_dnsbl_sites, applied at RCPT on a MODE smtp listener (550
# 5.7.1 naming the list); a list's error reply (127.255.255.x), a reply
# outside the site's filter and a list that never answers are no listing;
# a trusted client is not screened; a client that talks before the banner
# (PREGREET_WAIT) is refused, and its verdict, like a DNSBL verdict, is
# kept for its next session, in pepsi.screen_verdict too, where a verdict
# another ingress host kept is applied as well.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IO::Socket::IP;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;
use SmtpClient qw(read_smtp_reply);
use TestDNS;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('ingress_dnsbl', extension => 1);

my $dns = TestDNS->new($tmp);
$dns->zone(<<'ZONE');
1.0.0.127.bl.test. 300 IN A 127.0.0.2
2.0.0.127.bl.test. 300 IN A 127.0.0.2
2.0.0.127.bl.test. 300 IN TXT "listed for a test"
3.0.0.127.bl.test. 300 IN A 127.255.255.254
5.0.0.127.bl.test. 300 IN A 127.0.0.4
5.0.0.127.wl.test. 300 IN A 127.0.0.2
7.0.0.127.bl.test. 300 IN A 127.0.0.20
8.0.0.127.bl.test. 300 IN A 127.0.0.2
9.0.0.127.bl.test. 300 IN A 127.0.0.2
; silent 6.0.0.127.slowbl.test
; silent 10.0.0.127.slowbl.test
ZONE

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
LOCAL_DOMAINS = local.test
DNS_FORWARDER = @{[ $dns->forwarder ]}
DNS_TIMEOUT = 2s
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 1
TRUSTED_NETWORKS = 127.0.0.1/32
DNSBL_SITES = bl.test=127.0.0.[2..11]*3, wl.test=127.0.0.[1;2]*-5, slowbl.test
DNSBL_THRESHOLD = 3
DNSBL_ALLOWLIST_THRESHOLD = -1
[listener-mx]
ADDRESS = 127.0.0.1
PORT = $port
PREGREET_WAIT = 500ms
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-v', '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 1 ready/), 'ingress starts');

# A transaction from $client up to RCPT (and its message, when taken): the replies.
sub try_client
{
	my ($client) = @_;
	my $c = SmtpClient->new($port, from => $client);
	my %r = (banner => $c->{banner});

	$c->command('EHLO client.test');
	$r{mail} = $c->command('MAIL FROM:<someone@sender.test>');
	$r{rcpt} = $c->command('RCPT TO:<user@local.test>');
	if ($r{rcpt} =~ /^250 /)
	{
		$c->command('DATA');
		$c->send("Subject: from $client\r\n\r\nbody\r\n.\r\n");
		$r{data} = $c->reply(30);
	}
	$c->command('QUIT');
	$c->close;
	return \%r;
}

my $r = try_client('127.0.0.2');
like($r->{mail}, qr/^250 /, 'a listed client: MAIL is taken (the verdict is applied at RCPT)');
like($r->{rcpt}, qr/^550 5\.7\.1 Service unavailable; client \[127\.0\.0\.2\] blocked using bl\.test/,
	'... its RCPT gets 550 5.7.1 naming the list');
ok(file_shows($log, qr/127\.0\.0\.2: screen verdict: listed \(DNSBL\), DNSBL score 3, listed by bl\.test/),
	'... and the verdict is logged');

$r = try_client('127.0.0.2');
like($r->{rcpt}, qr/^550 5\.7\.1 .*bl\.test/, 'its next session is refused too');
my @verdicts = slurp_file($log) =~ /127\.0\.0\.2: screen verdict/g;
is(scalar(@verdicts), 1, '... from the verdict kept, not asked again');

$r = try_client('127.0.0.4');
like($r->{data}, qr/^250 .*queued as/, 'a client no list knows: its message is taken');

$r = try_client('127.0.0.3');
like($r->{data}, qr/^250 .*queued as/, 'a list\'s error reply (127.255.255.254) is no listing');

$r = try_client('127.0.0.7');
like($r->{data}, qr/^250 .*queued as/, 'a reply outside the site\'s filter (127.0.0.20) is no listing');

$r = try_client('127.0.0.5');
like($r->{data}, qr/^250 .*queued as/, 'listed (3) and allow-listed (-5): taken');
ok(file_shows($log, qr/127\.0\.0\.5: screen verdict: allowed \(DNSWL\), DNSBL score -2/),
	'... as an allow-listed client');

$r = try_client('127.0.0.6');
like($r->{data}, qr/^250 .*queued as/, 'a list that never answers: taken');
ok(file_shows($log, qr/127\.0\.0\.6: DNSBL slowbl\.test did not answer: counted as not listed/),
	'... and its silence logged');

$r = try_client('127.0.0.1');
like($r->{data}, qr/^250 .*queued as/, 'a trusted client is not screened, listed or not');
unlike(slurp_file($log), qr/127\.0\.0\.1: screen verdict/, '... no verdict for it');

# A talker: EHLO before the banner.
my $talker = IO::Socket::IP->new(PeerAddr => '127.0.0.1', PeerPort => $port,
	LocalAddr => '127.0.0.8', Timeout => 10) or die "connect: $!";
print $talker "EHLO early.test\r\n";
my $early = read_smtp_reply($talker, 30);
like($early, qr/^554 5\.5\.1 Protocol error: talking before the greeting/,
	'a client that talks before the banner is refused');
unlike($early, qr/^220/m, '... and never sees the banner');
close $talker;
ok(file_shows($log, qr/127\.0\.0\.8: screen verdict: PREGREET/), '... with a logged verdict');
$r = try_client('127.0.0.8');
like($r->{banner}, qr/^220 /, 'its next session, polite, gets the banner at once');
like($r->{rcpt}, qr/^550 5\.5\.1 Protocol error: client \[127\.0\.0\.8\] talked before the greeting/,
	'... but its recipients are refused, from the verdict kept');

# A client that waits for the banner passes the test (and is listed).
$r = try_client('127.0.0.9');
like($r->{banner}, qr/^220 /, 'a client that waits for the banner gets it');
like($r->{rcpt}, qr/^550 5\.7\.1 .*blocked using bl\.test/, '... and its DNSBL verdict still applies');

# Postscreen's after-220 tests: commands sent without waiting where
# PIPELINING was not offered (HELO, not EHLO), and a bare LF.
my $piper = SmtpClient->new($port, from => '127.0.0.11');
$piper->send("HELO client.test\r\nMAIL FROM:<a\@sender.test>\r\n");
$piper->reply;
like($piper->reply, qr/^250 /, 'a client pipelining after HELO: its MAIL is answered');
like($piper->command('RCPT TO:<user@local.test>'),
	qr/^550 5\.5\.1 Protocol error: client \[127\.0\.0\.11\] sent commands without waiting/,
	'... but its recipients refused');
$piper->close;
ok(file_shows($log, qr/127\.0\.0\.11: screen verdict: PIPELINING/), '... with a logged verdict');
my $lf = SmtpClient->new($port, from => '127.0.0.12');
$lf->send("EHLO client.test\n");
like($lf->reply, qr/^500 5\.5\.2 Bare LF/, 'a command ending in a bare LF: 500');
$lf->command('EHLO client.test');
$lf->command('MAIL FROM:<a@sender.test>');
like($lf->command('RCPT TO:<user@local.test>'),
	qr/^550 5\.5\.1 Protocol error: client \[127\.0\.0\.12\] ended a command with a bare LF/,
	'... and the client\'s recipients refused');
$lf->close;
$r = try_client('127.0.0.12');
like($r->{rcpt}, qr/^550 5\.5\.1 /, '... in its next session too');

# The verdicts are kept in the database, for every host that shares it.
ok(wait_until($node, $db, "SELECT verdict || ' ' || coalesce(list, '-') FROM pepsi.screen_verdict WHERE client = '127.0.0.2'",
	'listed bl.test'), 'a DNSBL verdict is kept in pepsi.screen_verdict');
ok(wait_until($node, $db, "SELECT verdict FROM pepsi.screen_verdict WHERE client = '127.0.0.8'", 'pregreet'),
	'... and so is a talker\'s');
# Another host's verdict (127.0.0.10's lookups never end: the table answers first).
$node->safe_psql($db, "INSERT INTO pepsi.screen_verdict VALUES ('127.0.0.10', 'listed', 'other.test', now() + interval '1 hour')");
$r = try_client('127.0.0.10');
like($r->{rcpt}, qr/^550 5\.7\.1 .*blocked using other\.test/, 'a verdict another host kept there is applied here');

$ingress->signal('TERM');
$ingress->finish;
done_testing();
