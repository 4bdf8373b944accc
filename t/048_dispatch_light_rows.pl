# pepsi-dispatch: a light sender's row does not wait behind a heavy
# sender's batch (pool.c: pool_assign, worker_batch_limit).
#
# While another worker of the stage idles: a batching stage with two
# workers, both started by an earlier burst of the heavy sender (which
# charges it worker time) and idle again; then three rows of the heavy
# sender that hold their worker until a file exists, and a row of a light
# sender.  Packing would put the light row on the busy worker, behind the
# held batch; it must go to the idle one and be done while the heavy rows
# are still held.  Without the light sender (the heavy rows alone)
# packing stands: the held rows share one worker.
#
# With one worker: a light row and two held heavy rows claimed together
# must not go in one batch, where the light row's answer would wait for
# the held rows and the worker (QUEUE_LIMIT 3, the fewest with which the
# dispatcher learns that an unregistered program batches) would stay
# full.  The light row runs in a batch of its own, is answered, and a
# second light row is claimed while the heavy rows are still held.  (This
# is the path without the light lane, LIGHT_LANE = no, which
# t/048_dispatch_light_lane.pl tests: with it the light row would run
# beside the held batch.)

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_light_row_worker');
my $program = test_program('test-stage');
my $gate = PostgreSQL::Test::Utils::tempdir() . '/gate';

my $config = write_config($node, stages => <<"EOF");
[stage-batch]
PROGRAM = $program
PARALLELISM = 2
BATCH = yes
SLEEP_MS = 5
EOF
my $d = start_dispatcher($config);

# The earlier burst: more rows than one worker's queue limit, so both start.
add_rows($node, 200, stage => 'batch', sender => '10.0.0.1');
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
	'the earlier burst drains');
my @workers = worker_pids($d, 'test-stage');
is(scalar @workers, 2, 'both workers of the stage are running, idle');
is(scalar_query($node, "SELECT count(DISTINCT pid) FROM test_log WHERE sender = 'ip:10.0.0.1'"),
	2, 'the burst ran on both workers');

# The heavy sender's held rows, then the light sender's row.
my ($light, @heavy) = light_row_past_held($node, 'batch', $gate);
my $light_pid = scalar_query($node, "SELECT pid FROM test_log WHERE id = $light");
ok((grep { $_ == $light_pid } @workers), 'the light row ran on one of the two workers');

open my $fh, '>', $gate or die "cannot create $gate: $!";
close $fh;
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
	'the heavy rows go on once released');
is( scalar_query($node,
		'SELECT count(DISTINCT pid) FROM test_log WHERE id IN (' . join(',', @heavy) . ')'),
	1, 'the heavy rows, alone, were packed onto one worker');
isnt(
	scalar_query($node,
		'SELECT min(pid) FROM test_log WHERE id IN (' . join(',', @heavy) . ')'),
	$light_pid, 'and the light row ran on the other');

stop_dispatcher($d);

# One worker, which holds three ids at most.
$node->safe_psql($db, 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body, test_log');
my $gate2 = PostgreSQL::Test::Utils::tempdir() . '/gate2';
$config = write_config($node, stages => <<"EOF");
[stage-batch]
PROGRAM = $program
PARALLELISM = 1
QUEUE_LIMIT = 3
BATCH = yes
SLEEP_MS = 5
LIGHT_LANE = no
EOF
$d = start_dispatcher($config);
add_rows($node, 100, stage => 'batch', sender => '10.0.0.1');
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
	'one worker: the earlier burst drains');

# The held heavy rows and the first light row, waiting together for one claim.
my ($heavy2, $heavy3, $light1) = split /\n/, $node->safe_psql(
	$db, qq{
	SELECT pepsi.workqueue_add('sender\@example.org', ARRAY['rcpt\@example.net'],
		'Subject: test'::bytea, 'body'::bytea, '{"wait_file": "$gate2"}', '10.0.0.1',
		stage => 'batch')
	FROM generate_series(1, 2)
	UNION ALL
	SELECT pepsi.workqueue_add('sender\@example.org', ARRAY['rcpt\@example.net'],
		'Subject: test'::bytea, 'body'::bytea, '{}', '10.9.0.1', stage => 'batch');
	SELECT pepsi.notify_workqueue();
});
ok( poll_until(
		sub { scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $light1") == 1 }),
	'one worker: the first light row is done');
my ($light2) = add_rows($node, 1, stage => 'batch', sender => '10.9.0.2');
ok( poll_until(
		sub {
			scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE id = $light2"
				  . " AND status = 'pending'") == 0;
		}),
	'one worker: the second light row is claimed while the heavy rows are held');
is( scalar_query($node,
		"SELECT count(*) FROM pepsi.workqueue WHERE id IN ($heavy2, $heavy3) AND status = 'running'"),
	2, 'one worker: the heavy rows are still held meanwhile');
open $fh, '>', $gate2 or die "cannot create $gate2: $!";
close $fh;
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
	'one worker: all drain once the heavy rows are released');
stop_dispatcher($d);

done_testing();
