# pepsi-ingress with its resolver down (the tests' DNS server stopped):
# mail from TRUSTED_NETWORKS is not SPF/DMARC-checked (unless
# TRUSTED_MESSAGE_AUTHENTICATION), so it asks the DNS nothing and waits for
# nothing; an untrusted client's first message waits out DNS_TIMEOUT once,
# and then the circuit breaker (DNS_PROBE_INTERVAL, common/dns/dns.c)
# answers temperror at once, so the next messages do not wait again.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use PepsiTest;
use SmtpClient;
use TestDNS;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('ingress_dns_down', extension => 1);

# A real server on a port of ours, then stopped: the port answers nothing.
my $dns = TestDNS->new($tmp);
$dns->zone(qq{sender.test. 300 IN TXT "v=spf1 ip4:127.0.0.0/8 -all"\n});
my $forwarder = $dns->forwarder;
$dns->stop;

# A DNS_TIMEOUT long enough that waiting it out cannot pass unseen.
my $timeout = 6;
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
LOCAL_DOMAINS = local.test
DNS_FORWARDER = $forwarder
DNS_TIMEOUT = ${timeout}s
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 1
DNS_MESSAGE_BUDGET = 20s
DNS_PROBE_INTERVAL = 200ms
TRUSTED_NETWORKS = 127.0.0.1/32
[listener-mx]
ADDRESS = 127.0.0.1
PORT = $port
MESSAGE_AUTHENTICATION = on
DMARC_POLICY = report
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-v', '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 1 ready/), 'ingress starts');

# One session, $n messages; returns the final replies and the seconds taken.
sub send_messages
{
	my ($client, $sender, $n) = @_;
	my $started = time;
	my $c = SmtpClient->new($port, from => $client);
	my @replies;

	$c->command('EHLO client.test');
	for my $i (1 .. $n)
	{
		$c->command("MAIL FROM:<$i\@$sender>");
		$c->command('RCPT TO:<user@local.test>');
		$c->command('DATA');
		$c->send("From: <$i\@$sender>\r\nSubject: $i\r\n\r\nbody\r\n.\r\n");
		push @replies, $c->reply(60);
	}
	$c->command('QUIT');
	$c->close;
	return (\@replies, time - $started);
}

sub auth_of
{
	my ($reply) = @_;
	my $id = queued_row($node, $reply) // return undef;

	return decode_json($node->safe_psql($db,
		"SELECT coalesce(state -> 'auth', 'null') FROM pepsi.workqueue WHERE id = $id"));
}

#
# Trusted: nothing asked, nothing waited for.
#
my ($replies, $took) = send_messages('127.0.0.1', 'sender.test', 3);
is(scalar(grep { /^250 / } @$replies), 3, 'a trusted client: its three messages are taken');
ok($took < $timeout, "... without waiting for the DNS (took ${\ sprintf('%.1f', $took)}s, DNS_TIMEOUT is ${timeout}s)");
my $trusted_auth = auth_of($replies->[0]);
ok(!exists $trusted_auth->{iprev} && $trusted_auth->{spf}{result} eq 'none'
	  && $trusted_auth->{dmarc}{result} eq 'none',
	'... and not checked: spf=none, dmarc=none, no iprev (as a listener without MESSAGE_AUTHENTICATION)');
unlike(slurp_file($log), qr/resolver answered nothing/, '... the resolver was not even asked');

#
# Untrusted: the first message waits out DNS_TIMEOUT, the breaker opens.
#
($replies, $took) = send_messages('127.0.0.2', 'sender.test', 1);
like($replies->[0], qr/^250 /, "an untrusted client's first message is taken");
is(auth_of($replies->[0])->{spf}{result}, 'temperror', '... with spf=temperror');
ok(file_shows($log, qr/dns: the resolver answered nothing for 6\.0s: lookups are answered temperror at once/),
	'the circuit breaker opens, and says so');

($replies, $took) = send_messages('127.0.0.2', 'other.test', 3);
is(scalar(grep { /^250 / } @$replies), 3, 'the next three messages are taken');
ok($took < $timeout, "... without waiting out DNS_TIMEOUT again (took ${\ sprintf('%.1f', $took)}s)");
my $auth = auth_of($replies->[2]);
is($auth->{spf}{result}, 'temperror', '... spf=temperror');
is($auth->{dmarc}{result}, 'temperror', '... dmarc=temperror');

$ingress->signal('TERM');
$ingress->finish;
done_testing();
