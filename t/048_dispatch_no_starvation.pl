# pepsi-dispatch: a light sender never waits for a burst to drain.  One
# client's burst of 4,000 messages is waiting and ten light senders admit
# one message each every 0.2 s meanwhile, for as long as more than a
# quarter of the burst is left; every light message must be done before
# the burst is (and within a few seconds of its admission: bench/timing).  The burst cannot
# drain faster than its workers sleep (4,000 x 2 ms over 2 workers), so
# the light senders always have three seconds of it to compete with,
# however fast the machine; on a slow one they stop at a count.
#
# The burst follows a queue reset that left the claim's sender cache
# behind (TRUNCATE ... RESTART IDENTITY after a run that took
# pepsi.pending_seq high), as between two benchmark runs: that is how
# light messages used to wait for the whole burst, invisible to the fair
# picks and reached by the FIFO share only after every older burst row.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_starvation');
my $program = test_program('test-stage');
my ($burst, $light_senders, $light_most) = (4000, 10, 300);

my $config = write_config($node, stages => <<"EOF");
[stage-slow]
PROGRAM = $program
PARALLELISM = 2
SLEEP_MS = 2
EOF
my $d = start_dispatcher($config);

# An earlier run: the sequence far ahead, and the cache's watermark with it.
$node->safe_psql($db, "SELECT setval('pepsi.pending_seq', 100000)");
add_rows($node, 50, stage => 'slow', sender => '10.0.0.9');
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
	'an earlier run drains');

$node->safe_psql($db, 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body, test_log RESTART IDENTITY');
add_rows($node, $burst, stage => 'slow', sender => '10.0.0.1');

# The light senders, round robin, one admission every 0.2 s / senders,
# each with its wake-up, from one session, while more than a quarter of
# the burst is left; the time each was admitted, by id.
my %admitted;
my $session = $node->background_psql($db);
my $start = time;
my $sent = 0;
my $burst_left = $burst;
while ($sent < $light_most)
{
	my $at = time;
	my ($id, $left) = split /\n/, $session->query_safe(
		"SELECT pepsi.workqueue_add('light\@example.org', ARRAY['rcpt\@example.net'],"
		  . " 'Subject: light'::bytea, 'body'::bytea, '{}', '10.1.0."
		  . (1 + $sent % $light_senders) . "', stage => 'slow');"
		  . " SELECT count(*) FROM pepsi.workqueue WHERE sender_key = 'ip:10.0.0.1';"
		  . ' SELECT pepsi.notify_workqueue();');

	$admitted{$id} = $at;
	$sent++;
	$burst_left = $left;
	last if $burst_left <= $burst / 4;
	my $next = $start + $sent * 0.2 / $light_senders;
	usleep(1_000_000 * ($next - time)) if $next > time;
}
$session->quit;
note("$sent light messages admitted; $burst_left burst messages left after the last");
cmp_ok($sent, '>=', 20, 'light messages were admitted while the burst was in flight');

my $light = "sender <> 'ip:10.0.0.1'";
ok(poll_until(sub { scalar_query($node, "SELECT count(*) FROM test_log WHERE $light") == $sent }),
	"all $sent light messages are done");

# A light message's wait: from its admission to its commit by the worker.
my @waits;
for my $line (split /\n/,
	scalar_query($node, "SELECT id, extract(epoch FROM at) FROM test_log WHERE $light"))
{
	my ($id, $done) = split /\|/, $line;
	push @waits, $done - $admitted{$id};
}
@waits = sort { $a <=> $b } @waits;
note(sprintf('light messages: median wait %.3f s, longest %.3f s', $waits[@waits / 2], $waits[-1]));
# No light message waits more than a few seconds: bench/timing.
note(sprintf('timing light_longest_wait_seconds %.3f', $waits[-1]));

# Served in arrival order only, behind every burst row, the light messages
# would be done after the whole burst: the last of them must not be.
ok( poll_until(
		sub {
			scalar_query($node,
				"SELECT count(*) FROM pepsi.workqueue WHERE sender_key = 'ip:10.0.0.1'") == 0;
		}),
	'the burst drains');
my $burst_after = scalar_query(
	$node, qq{
	SELECT count(*) FROM test_log
	WHERE NOT ($light) AND seq > (SELECT max(seq) FROM test_log WHERE $light)});
cmp_ok($burst_after, '>', 0,
	"burst messages were still waiting when the last light one was done ($burst_after after it)");
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher stops');

done_testing();
