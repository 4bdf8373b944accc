# pepsi-stage-relay-to-internet and the addresses of MX hosts, on a
# simulated internet (TestDNS; t/bin/smtp-peer on 127.0.0.x and ::1):
#   - an MX host with only an AAAA record (a peer on ::1) gets its mail;
#     with both A and AAAA, ADDRESS_PREFERENCE decides which address the
#     peer is reached on (skipped where ::1 is not available);
#   - once an MX host's A record has outlived its TTL, the next delivery
#     looks it up again and goes to its new address, which
#     pepsi.dns_address then shows;
#   - a destination given a rate limit (pepsi.destination_set_limits)
#     receives no faster than it allows, and the waits count no retry
#     against any message.

use strict;
use warnings FATAL => 'all';

use IO::Socket::IP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Socket qw(SOCK_STREAM);
use Test::More;
use Time::HiRes ();

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

my $node = delivery_node('relay_internet_addresses');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

my $port = PostgreSQL::Test::Cluster::get_free_port();
# Is there an IPv6 loopback to listen on?
my $probe = IO::Socket::IP->new(Type => SOCK_STREAM, LocalAddr => '::1', LocalPort => $port, Listen => 1,
	ReuseAddr => 1);
my $have_ipv6 = defined $probe;
$probe->close if $probe;

my $v4 = start_peer('--address', '127.0.0.12', '--port', $port);
my $v6 = $have_ipv6 ? start_peer('--address', '::1', '--port', $port) : undef;
my $old = start_peer('--address', '127.0.0.13', '--port', $port);
my $new = start_peer('--address', '127.0.0.14', '--port', $port);
my $rated = start_peer('--address', '127.0.0.15', '--port', $port);

my $zone = <<'EOF';
both.test.        300 IN MX 10 mx.both.test.
mx.both.test.     300 IN A  127.0.0.12
ttl.test.         300 IN MX 10 mx.ttl.test.
rate.test.        300 IN MX 10 mx.rate.test.
mx.rate.test.     300 IN A  127.0.0.15
EOF
$zone .= <<'EOF' if $have_ipv6;
v6only.test.      300 IN MX 10 mx.v6only.test.
mx.v6only.test.   300 IN AAAA ::1
mx.both.test.     300 IN AAAA ::1
EOF
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
$dns->zone($zone . "mx.ttl.test.      2 IN A  127.0.0.13\n");

sub config
{
	my (%smarthost) = @_;

	return delivery_config($node, maildir_root => $root, internet => $port,
		pepsi => { DNS_FORWARDER => $dns->forwarder },
		extra => { smarthost => join('', map { "$_ = $smarthost{$_}\n" } sort keys %smarthost) });
}
my $d = start_dispatcher(config());

sub received
{
	my ($peer, $rcpt) = @_;

	return scalar grep { $_->{env} =~ /RCPT TO:<\Q$rcpt\E>/ } peer_messages($peer);
}

sub send_to
{
	my ($rcpt) = @_;

	return inject($node, to => [$rcpt], headers => "From: <$sender>\r\nTo: <$rcpt>\r\nSubject: $rcpt\r\n");
}

sub addresses_of
{
	my ($host) = @_;

	return $node->safe_psql('postgres',
		"SELECT string_agg(host(address), ' ' ORDER BY address) FROM pepsi.dns_address WHERE host = '$host'");
}

# --- IPv6 -------------------------------------------------------------------
SKIP:
{
	skip 'no IPv6 loopback (::1) to listen on', 5 unless $have_ipv6;

	send_to('user@v6only.test');
	ok(poll_until(sub { received($v6, 'user@v6only.test') }, 60),
		'an MX host with only an AAAA record: delivered to the peer on ::1');
	is(addresses_of('mx.v6only.test'), '::1', 'pepsi.dns_address holds its IPv6 address');
	like(dispatcher_log($d), qr/to=<user\@v6only\.test>, relay=mx\.v6only\.test\[::1\]:$port, [^\n]*status=sent/,
		'the log line names it');

	send_to('pref6@both.test');
	ok(poll_until(sub { received($v6, 'pref6@both.test') }, 60),
		'A and AAAA, ADDRESS_PREFERENCE = ipv6 (the default): the peer saw it on ::1');
	is(received($v4, 'pref6@both.test'), 0, 'and not on 127.0.0.12');
}

# --- A new address after the TTL ----------------------------------------------
send_to('first@ttl.test');
ok(poll_until(sub { received($old, 'first@ttl.test') }, 60), 'delivered to the MX host\'s address');
is(addresses_of('mx.ttl.test'), '127.0.0.13', 'pepsi.dns_address has it');
$dns->zone($zone . "mx.ttl.test.      2 IN A  127.0.0.14\n");
# (A TTL under 5 seconds is kept for 5: the rows expire then.)
ok(poll_until(sub {
		$node->safe_psql('postgres',
			"SELECT count(*) FROM pepsi.dns_address WHERE host = 'mx.ttl.test' AND expires_at > now()") == 0
	}, 60),
	'its TTL passed');
send_to('second@ttl.test');
ok(poll_until(sub { received($new, 'second@ttl.test') }, 60),
	'the next delivery looked the host up again and went to its new address');
is(received($old, 'second@ttl.test'), 0, 'not to the old one');
is(addresses_of('mx.ttl.test'), '127.0.0.14', 'pepsi.dns_address shows the new address alone');
ok(poll_until(sub { queue_count($node) == 0 }, 60), 'the queue is empty');

# --- A rate limit -------------------------------------------------------------
my $count = 8;
$node->safe_psql('postgres', "SELECT pepsi.destination_set_limits('rate.test', NULL, 60)");
$node->safe_psql('postgres', qq{
	SELECT pepsi.workqueue_add('$sender', ARRAY['r' || i || '\@rate.test'],
		convert_to('From: <$sender>' || chr(13) || chr(10) || 'Subject: rate ' || i || chr(13) || chr(10), 'UTF8'),
		convert_to('hello' || chr(13) || chr(10), 'UTF8'), '{}'::jsonb)
	FROM generate_series(1, $count) AS i;
	SELECT pepsi.notify_workqueue();});
ok(poll_until(sub {
		$node->safe_psql('postgres', q{SELECT count(*) FROM pepsi.workqueue
			WHERE rcpt_to[1] LIKE '%@rate.test' AND status = 'paused' AND state ? 'postponed'}) > 0
	}, 60),
	'messages over the rate wait (paused, postponed)');
ok(poll_until(sub { peer_count($rated) == $count }, 180), "all $count were delivered");
my @times = sort { $a <=> $b }
  map { (Time::HiRes::stat("$rated->{dir}/msg-$_.eml"))[9] } 1 .. $count;
my $span = $times[-1] - $times[0];
# 60 a minute is one a second, one at once: $count take at least
# $count - 1 seconds.  Generous, for a loaded machine.
cmp_ok($span, '>=', ($count - 1) * 0.6,
	sprintf('at 60 a minute, the %d arrived over %.1f s, no faster than the limit allows', $count, $span));
my $early = grep { $_ - $times[0] < 2 } @times;
cmp_ok($early, '<=', 4, "$early arrived in the first two seconds (about 2 at that rate)");
is(scalar(() = dispatcher_log($d) =~ /\@rate\.test>, [^\n]*status=deferred/g), 0,
	'no delivery was tried and deferred: the waits were the destination\'s');
ok(poll_until(sub { queue_count($node) == 0 }, 60), 'the queue is empty');

# --- ADDRESS_PREFERENCE = ipv4 ------------------------------------------------
SKIP:
{
	skip 'no IPv6 loopback (::1) to listen on', 2 unless $have_ipv6;

	stop_dispatcher($d);
	$d = start_dispatcher(config(ADDRESS_PREFERENCE => 'ipv4'));
	send_to('pref4@both.test');
	ok(poll_until(sub { received($v4, 'pref4@both.test') }, 60),
		'ADDRESS_PREFERENCE = ipv4: the peer saw it on 127.0.0.12');
	is(received($v6, 'pref4@both.test'), 0, 'and not on ::1');
}

is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
done_testing();
