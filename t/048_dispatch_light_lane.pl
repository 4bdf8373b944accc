# pepsi-dispatch: the light lane (pool.c, light_lane_open).  A batching
# stage whose every worker holds a heavy sender's rows runs a light
# sender's row at once in one worker beyond PARALLELISM, instead of
# after the batch in progress; the lane is never given the heavy
# sender's rows; LIGHT_LANE = no turns it off.
#
# A batching stage with one worker (PARALLELISM = 1): an earlier burst of
# the heavy sender charges it worker time and teaches the dispatcher that
# the program batches; then rows of the heavy sender that hold the worker
# until a file exists.  A light sender's row must then be done while they
# are held, by a second process of the stage (the lane), and heavy rows
# added meanwhile must wait for the held worker, not run in the lane.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_light_lane');
my $program = test_program('test-stage');

# The held batch of the heavy sender, after its earlier burst; returns its ids.
sub held_heavy_batch
{
	my ($gate) = @_;

	add_rows($node, 100, stage => 'batch', sender => '10.0.0.1');
	ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
		'the earlier burst drains');
	my @heavy = add_rows($node, 3, stage => 'batch', sender => '10.0.0.1',
		state => qq({"wait_file": "$gate"}));
	ok( poll_until(
			sub {
				scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'")
				  == 3;
			}),
		'the heavy rows are running, held');
	return @heavy;
}

sub release
{
	my ($gate) = @_;
	open my $fh, '>', $gate or die "cannot create $gate: $!";
	close $fh;
	ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
		'every row drains once the heavy rows are released');
}

sub pids_of
{
	my (@ids) = @_;
	return split /\n/,
	  $node->safe_psql($db,
		'SELECT DISTINCT pid FROM test_log WHERE id IN (' . join(',', @ids) . ') ORDER BY 1');
}

my $section = <<"EOF";
[stage-batch]
PROGRAM = $program
PARALLELISM = 1
QUEUE_LIMIT = 4
BATCH = yes
SLEEP_MS = 5
EOF

# The lane.
my $gate = PostgreSQL::Test::Utils::tempdir() . '/gate';
my $d = start_dispatcher(write_config($node, stages => $section));
my @heavy = held_heavy_batch($gate);
my @regular = worker_pids($d, 'test-stage');
is(scalar @regular, 1, 'one worker of the stage runs (PARALLELISM = 1)');

my ($light) = add_rows($node, 1, stage => 'batch', sender => '10.9.0.1');
ok( poll_until(
		sub { scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $light") == 1 }, 30),
	'the light row is done while the heavy batch is held');
is(scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue WHERE id IN (' . join(',', @heavy) . ')'),
	3, 'the heavy rows are still held meanwhile');
my ($lane_pid) = pids_of($light);
ok(!grep({ $_ == $lane_pid } @regular), 'the light row ran in a process beyond PARALLELISM');
is(scalar(my @all = worker_pids($d, 'test-stage')), 2, 'the stage runs two processes: its worker and the lane');

# More of the heavy sender's rows, and a second light row, while the batch is held.
my @later = add_rows($node, 6, stage => 'batch', sender => '10.0.0.1');
my ($light2) = add_rows($node, 1, stage => 'batch', sender => '10.9.0.2');
ok( poll_until(
		sub { scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $light2") == 1 }, 30),
	'a second light sender\'s row is done while the batch is held');
is(scalar_query($node, 'SELECT count(*) FROM test_log WHERE id IN (' . join(',', @later) . ')'),
	0, 'the heavy rows added meanwhile were not run in the lane');
release($gate);
my @heavy_pids = pids_of(@heavy, @later);
ok(!grep({ $_ == $lane_pid } @heavy_pids), 'no heavy row ever ran in the lane')
  or diag("heavy rows ran in @heavy_pids, the lane is $lane_pid");
like(dispatcher_log($d), qr/started the light lane/, 'the log says when the lane starts');
stop_dispatcher($d);

# LIGHT_LANE = no: the light row waits for the held batch (a batch of its own after it).
$node->safe_psql($db, 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body, test_log');
$gate = PostgreSQL::Test::Utils::tempdir() . '/gate';
$d = start_dispatcher(write_config($node, stages => $section . "LIGHT_LANE = no\n"));
@heavy = held_heavy_batch($gate);
($light) = add_rows($node, 1, stage => 'batch', sender => '10.9.0.1');
ok( poll_until(
		sub {
			scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE id = $light"
				  . " AND status = 'running'") == 1;
		},
		30),
	'LIGHT_LANE = no: the light row is claimed');
sleep 2;
is(scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $light"),
	0, 'LIGHT_LANE = no: it waits behind the held batch');
is(scalar(my @one = worker_pids($d, 'test-stage')), 1, 'LIGHT_LANE = no: one process of the stage');
release($gate);
is(scalar(my @pids = pids_of(@heavy, $light)), 1, 'LIGHT_LANE = no: every row ran on the one worker');
stop_dispatcher($d);

done_testing();
