# pepsi-dispatch's fair share end to end: one sender's burst of 5,000
# messages, and 20 light senders' 10 messages each admitted after it, go
# through a stage with PARALLELISM 2 and a slow worker.  The light senders
# must not wait behind the burst: their mean completion position is within
# the first 10% of the run's 5,200 messages, while the burst still gets its
# FIFO share meanwhile.  Twice: with a worker that takes one message at a
# time, and with one that batches, as the METADATA stages do.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_fair');
my $program = test_program('test-stage');
my ($burst, $senders, $each) = (5000, 20, 10);
my $total = $burst + $senders * $each;

# Run the burst and the light senders through a stage with these options.
sub fair_run
{
	my ($label, $options) = @_;

	$node->safe_psql($db, 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body, test_log');
	my $config = write_config($node, stages => <<"EOF");
[stage-slow]
PROGRAM = $program
PARALLELISM = 2
$options
EOF

	# The burst first, then the light senders, interleaved, all in one
	# transaction so the first claim sees them all.
	$node->safe_psql(
		$db, qq{
		SELECT count(pepsi.workqueue_add('heavy\@example.org', ARRAY['rcpt\@example.net'],
			'Subject: burst'::bytea, 'body'::bytea, '{}', '10.0.0.1', stage => 'slow'))
		FROM generate_series(1, $burst);
		SELECT count(pepsi.workqueue_add('light\@example.org', ARRAY['rcpt\@example.net'],
			'Subject: light'::bytea, 'body'::bytea, '{}', '10.1.0.0'::inet + s, stage => 'slow'))
		FROM generate_series(1, $each) AS n, generate_series(1, $senders) AS s;
	});
	is( scalar_query($node,
			"SELECT count(DISTINCT sender_key) FROM pepsi.workqueue WHERE stage = 'slow'"),
		$senders + 1, "$label: $total rows from @{[ $senders + 1 ]} senders are waiting");

	my $d = start_dispatcher($config);
	my $light = "sender <> 'ip:10.0.0.1'";
	ok( poll_until(
			sub {
				scalar_query($node, "SELECT count(*) FROM test_log WHERE $light") ==
				  $senders * $each;
			}),
		"$label: every light sender's messages are done");
	is(stop_dispatcher($d, 'TERM'), 0, "$label: the dispatcher stops");

	# The next run's dispatcher must find the one-dispatcher lock free:
	# the server may end this one's session a moment after it exits.
	ok( poll_until(
			sub {
				scalar_query($node,
					"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
					  . ' AND classid = 1346720851 AND objid = 2') == 0;
			}),
		"$label: its session is gone, and the dispatcher lock with it");

	# Completion positions: the order of the commits (test_log.seq).
	my ($mean, $last, $heavy_before) = split /\|/,
	  scalar_query(
		$node, qq{
		WITH p AS (SELECT sender, row_number() OVER (ORDER BY seq) AS pos FROM test_log),
		     l AS (SELECT max(pos) AS last FROM p WHERE $light)
		SELECT round(avg(pos) FILTER (WHERE $light), 1), max(l.last),
		       count(*) FILTER (WHERE NOT ($light) AND pos < l.last)
		FROM p, l});
	note("$label: light senders' mean completion position $mean, last $last; "
		  . "$heavy_before burst messages done before the last light one");
	cmp_ok($mean, '<=', 0.10 * $total,
		"$label: the light senders' mean completion position is in the first 10% of $total");
	cmp_ok($heavy_before, '>', 0, "$label: the burst was not starved meanwhile");
	is(scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE status <> 'pending'"),
		'0', "$label: what was left of the burst is pending again");
}

fair_run('one at a time', "SLEEP_MS = 10\n");

# The answers of a batch arrive together; they must share its time.  Were
# the first charged all of it, the light senders, whose rows lead the
# claims, would look heavy and fall behind the burst.
fair_run('batching', "SLEEP_MS = 3\nBATCH = yes\nQUEUE_LIMIT = 16\n");

done_testing();
