# pepsi-stage-relay-to-internet's per-destination scheduling on a simulated
# internet (TestDNS, peers on 127.0.0.x): a destination that takes only two
# connections (t/bin/smtp-peer --max-sessions 2, slow) with 500 messages
# queued for it and 500 for another domain (Postfix's smtp-sink): the other
# domain drains first, the slow one gets all its mail without a retry
# counted against any message; a dead destination backs off as a group
# (pepsi.destination, pepsi.dns_address mark it) while other mail flows;
# a relay worker killed mid-transaction loses nothing.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

my $node = delivery_node('relay_internet_scheduling');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $limited = start_peer('--address', '127.0.0.6', '--port', $port, '--max-sessions', '2',
	'--data-delay', '0.02');
my $stalling = start_peer('--address', '127.0.0.8', '--port', $port, '--data-delay', '4');
my $sink = start_sink_on('127.0.0.5', $port);
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
$dns->zone(TestDNS::mx('fast.test', '127.0.0.5')
	  . TestDNS::mx('limited.test', '127.0.0.6')
	  . TestDNS::mx('dead.test', '127.0.0.7')
	  . TestDNS::mx('stall.test', '127.0.0.8'));

my $config = delivery_config($node, maildir_root => $root, internet => $port,
	pepsi => { DNS_FORWARDER => $dns->forwarder },
	dispatch => { CRASH_RETRY_DELAY => '1s', CRASH_LIMIT => 5 },
	extra => { smarthost => "PARALLELISM = 8\nQUEUE_LIMIT = 1\nDESTINATION_BACKOFF_AFTER = 2\n"
		  . "DESTINATION_BACKOFF_BASE = 10m\nRETRY_BASE = 10m\nRETRY_MAX = 1h\n" });
my $d = start_dispatcher($config);

sub sink_count { my @f = glob("$sink->{dir}/mail/*"); return scalar @f }
sub limited_count { return peer_count($limited) }
sub refusals { return scalar(() = (slurp("$limited->{dir}/transcript") // '') =~ /refused: too many sessions/g) }
sub log_count
{
	my ($re) = @_;
	return scalar(() = dispatcher_log($d) =~ /$re/g);
}

# $each messages for each domain, interleaved, in one transaction: enough
# for the window to narrow and for the fast domain to drain first.  The
# two-connection destination takes them one turn at a time, and its turns
# are what this file spends its time on: each costs a few context switches
# of the peer, the worker and PostgreSQL, so on a loaded machine (load 30)
# a turn takes some fifteen times as long as on a quiet one.  So no more
# than the assertions need: the bound on refusals below counts only those
# after the fast domain drained, against the messages delivered after it,
# so it does not depend on the count; 150 leave 130 to 140 messages for
# that tail, with 13 to 42 refusals in it (loads 10 to 26), where a window
# that never narrows was refused 2,596 times for 133.
my $each = 150;
$node->safe_psql('postgres', qq{
	SELECT pepsi.workqueue_add('sender\@local.test',
		ARRAY['user' || i || CASE WHEN i % 2 = 0 THEN '\@limited.test' ELSE '\@fast.test' END],
		convert_to('From: <sender\@local.test>' || chr(13) || chr(10) || 'Subject: m' || i
			|| chr(13) || chr(10), 'UTF8'),
		convert_to('hello' || chr(13) || chr(10), 'UTF8'), '{}'::jsonb)
	FROM generate_series(1, 2 * $each) AS i;
	SELECT pepsi.notify_workqueue();});
ok(poll_until(sub { sink_count() == $each }, 600), "the $each messages for the fast domain were delivered");
my $limited_then = limited_count();
my $refused_then = refusals();
cmp_ok($limited_then, '<', $each,
	"while the destination taking two connections still had mail queued ($limited_then of $each delivered)");
ok(poll_until(sub { limited_count() == $each }, 900), "then all $each reached the two-connection destination");
ok(poll_until(sub { queue_count($node) == 0 }, 120), 'and the queue is empty');
is(log_count(qr/\@limited\.test>, [^\n]*status=deferred/), 0,
	'its refusals of further connections counted no retry against any message');
is(log_count(qr/status=(?:bounced|expired)/), 0, 'nothing bounced');
my $refused = refusals() - $refused_then;
my $tail = $each - $limited_then;
# The bound: once the fast domain has drained, all eight workers want the
# destination; against a window that never narrowed six of eight
# connections a turn are refused, two messages a turn, about three
# refusals for each message delivered.  A narrowed window is refused only
# when it probes for one more connection (a probe every eighth message or
# so at a window of two) and the few refusals of a narrowing still under
# way.  One a message tells the two apart with room on both sides, at any
# count and any load.
note("refused: $refused_then before the fast domain drained, $refused after it for $tail messages");
cmp_ok($tail, '>=', 20, "the destination still had mail queued after the fast domain drained ($tail messages)");
cmp_ok($refused, '<', $tail,
	"the destination's window narrowed: $refused connections refused for the last $tail messages");

# A dead destination: nothing listens at its MX's address.
$node->safe_psql('postgres', q{
	SELECT pepsi.workqueue_add('sender@local.test', ARRAY['user' || i || '@dead.test'],
		convert_to('Subject: dead' || chr(13) || chr(10), 'UTF8'),
		convert_to('hello' || chr(13) || chr(10), 'UTF8'), '{}'::jsonb)
	FROM generate_series(1, 30) AS i;
	SELECT pepsi.notify_workqueue();});
ok(poll_until(sub { $node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue WHERE status = 'paused'") == 30 },
		120),
	'the 30 messages for the dead destination are all paused');
is($node->safe_psql('postgres',
		"SELECT failures >= 2 AND backoff_until > now() + interval '5 minutes' FROM pepsi.destination WHERE domain = 'dead.test'"),
	't', 'pepsi.destination: the destination backs off as a whole');
is($node->safe_psql('postgres',
		"SELECT failures > 0 AND next_retry >= last_failure + interval '1 minute' FROM pepsi.dns_address WHERE host = 'mx.dead.test'"),
	't', 'pepsi.dns_address marks its address');
my $tried = log_count(qr/\@dead\.test>, [^\n]*status=deferred/);
cmp_ok($tried, '<=', 10, "only $tried deliveries tried it; the others wait with it");
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pepsi.workqueue WHERE rcpt_to[1] LIKE '%\@dead.test' AND coalesce((state->>'attempts')::int, 0) = 0"),
	30 - $tried, 'and no attempt is counted against those that waited');
# Other mail flows past it.
$node->safe_psql('postgres', q{
	SELECT pepsi.workqueue_add('sender@local.test', ARRAY['after' || i || '@fast.test'],
		convert_to('Subject: after' || chr(13) || chr(10), 'UTF8'),
		convert_to('hello' || chr(13) || chr(10), 'UTF8'), '{}'::jsonb)
	FROM generate_series(1, 20) AS i;
	SELECT pepsi.notify_workqueue();});
ok(poll_until(sub { sink_count() == $each + 20 }, 120), 'mail for another domain is delivered meanwhile');
is($node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue WHERE rcpt_to[1] LIKE '%\@dead.test'"),
	30, 'while the dead destination\'s mail waits');
$node->safe_psql('postgres', "DELETE FROM pepsi.workqueue WHERE rcpt_to[1] LIKE '%\@dead.test'");

# A relay worker killed in the middle of a transaction (the peer takes 4s
# to answer the end of the message): the message is not lost.
my $id = inject($node, to => ['victim@stall.test'],
	headers => "From: <$sender>\r\nTo: <victim\@stall.test>\r\nSubject: victim\r\n");
ok(poll_until(sub { (slurp("$stalling->{dir}/transcript") // '') =~ /-> DATA/ }, 60),
	'the worker is in the middle of the transaction');
my @workers = grep {
	my $pid = $_;
	(slurp("/proc/$pid/stat") // '') =~ /\)\s+\S\s+$d->{pid}\s/
	  && (slurp("/proc/$pid/cmdline") // '') =~ /relay-to-internet/
} map { m{/proc/(\d+)$} ? $1 : () } glob('/proc/[0-9]*');
ok(scalar @workers >= 1, 'its worker process found');
kill 'KILL', @workers;
ok(poll_until(sub { queue_count($node) == 0 }, 120), 'after the kill, the message was delivered on a retry');
my $copies = grep { $_->{data} =~ /Subject: victim/ } peer_messages($stalling);
ok($copies >= 1 && $copies <= 2, "it arrived ($copies copies: at most the one in flight again)");
is($node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue WHERE status IN ('failed', 'timeout')"),
	0, 'no message failed');

is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
done_testing();
