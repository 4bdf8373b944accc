# pepsi-dispatch: the light lane (pool.c, light_lane_open).  A batching
# stage whose every worker holds a heavy sender's rows runs a light
# sender's row at once in one worker beyond PARALLELISM, instead of
# after the batch in progress; the lane is never given the heavy
# sender's rows; the other workers and their database sessions run at
# BULK_NICE (10) and the lane at the dispatcher's priority;
# LIGHT_LANE = no turns it off, and the nice value with it.
#
# A batching stage with one worker (PARALLELISM = 1): an earlier burst of
# the heavy sender charges it worker time and teaches the dispatcher that
# the program batches; then rows of the heavy sender that hold the worker
# until a file exists.  A light sender's row must then be done while they
# are held, by a second process of the stage (the lane), and heavy rows
# added meanwhile must wait for the held worker, not run in the lane.

use strict;
use warnings FATAL => 'all';

use List::Util qw(max);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_light_lane');
my $program = test_program('test-stage');

# The held batch of the heavy sender, after its earlier burst (100 rows
# unless said); returns its ids.
sub held_heavy_batch
{
	my ($gate, $burst) = @_;

	add_rows($node, $burst // 100, stage => 'batch', sender => '10.0.0.1');
	ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
		'the earlier burst drains');
	my @heavy = add_rows($node, 3, stage => 'batch', sender => '10.0.0.1',
		state => qq({"wait_file": "$gate"}));
	ok(poll_until(sub { queue_count($node, "status = 'running'") == 3 }), 'the heavy rows are running, held');
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
# Rows the dispatcher claimed and then put back to pending.
$node->safe_psql(
	$db, q{
	CREATE TABLE put_back (id bigint);
	CREATE FUNCTION put_back() RETURNS trigger LANGUAGE plpgsql
		AS $$ BEGIN INSERT INTO put_back VALUES (NEW.id); RETURN NULL; END $$;
	CREATE TRIGGER put_back AFTER UPDATE ON pepsi.workqueue FOR EACH ROW
		WHEN (OLD.status = 'running' AND NEW.status = 'pending') EXECUTE FUNCTION put_back();
});
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
# (At 10, or at the dispatcher's own nice value if that is higher: under
# a suite run with nice -n 19 both run at 19.)
is(nice_of($regular[0]), raised_nice(10, nice_of($d->{pid})), 'the worker runs at BULK_NICE, 10 by default');
is(nice_of($lane_pid), nice_of($d->{pid}), 'the lane at the dispatcher\'s own priority');

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

# The free lane's row of a claim after a NOTIFY, with the worker's queue
# full, is the heavy sender's when no light row waits: it waits in the
# dispatcher for the worker's next answer (the ring's spare id), instead
# of going back to pending, to be claimed and put back again while the
# queue stays full.  The heartbeat is a minute away: only NOTIFYs claim.
$node->safe_psql($db, 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body, test_log, put_back');
$gate = PostgreSQL::Test::Utils::tempdir() . '/gate';
$d = start_dispatcher(write_config($node, stages => $section, dispatch => { POLL_INTERVAL => '60s' }));
@heavy = held_heavy_batch($gate);
my @queued;
for my $n (4, 5)
{
	push @queued, add_rows($node, 1, stage => 'batch', sender => '10.0.0.1');
	ok(poll_until(sub { queue_count($node, "status = 'running'") == $n }), "queue full: heavy row $n is claimed");
}
# (A row put back would show within the second polled for.)
poll_until(sub { scalar_query($node, 'SELECT count(*) FROM put_back') > 0 }, 1);
is(scalar_query($node, 'SELECT count(*) FROM put_back'),
	0, 'queue full: no claimed row went back to pending');
is(queue_count($node, "status = 'running'"), 5, 'queue full: the row beyond QUEUE_LIMIT stays claimed');
release($gate);
is(scalar_query($node, 'SELECT count(*) FROM test_log WHERE id IN (' . join(',', @queued) . ')'),
	2, 'queue full: the waiting row was written to the worker once it answered, and ran');
stop_dispatcher($d);

# The lane's batches do not size the workers' pipelines: forty slow
# light rows through the lane (60 ms each, a batch of one) leave the depth
# the heavy worker's own batches gave it, not the three that a depth
# fitted on the lane's batches would give.  The depth is read from what
# the claims ask while the worker is held: after each of the lane's
# answers, a claim asks for the worker's free slots (the depth less the
# three held ids) and the lane's row (a claim after a NOTIFY asks the
# lane's row alone).  Nothing the held worker does can change the depth
# meanwhile (it answers nothing), so the claims after the last five light
# rows must ask what they asked after the first, within the lane's row;
# by then the lane's batches would fill the fit's window of 32, had they
# been recorded.  The heavy rows cost no sleep here, so the depth is well
# above the floor even with the dispatcher under the sanitizers; there
# are more of them, and their sender's use does not fade
# (FAIR_HALF_LIFE), so that it stays far heavier than the light senders'
# 60 ms.  After the release, the held batch's answer (seconds long)
# weighs on the fit in ways that depend on the machine's speed: nothing
# is asserted then.
$node->safe_psql($db, 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body, test_log, put_back');
$node->safe_psql($db, "ALTER SYSTEM SET log_statement = 'all'");
$node->safe_psql($db, 'SELECT pg_reload_conf()');

# The capacities the claims asked for the stage since the log's offset.
sub claims_asked
{
	my ($offset) = @_;
	my @asked;
	for my $line (split /\n/, PostgreSQL::Test::Utils::slurp_file($node->logfile, $offset))
	{
		push @asked, $1 if $line =~ /DETAIL:  parameters: \$1 = '\{batch\}', \$2 = '\{(\d+)\}'/;
	}
	return @asked;
}

# A light row of 60 ms through the lane; whether it was done in time.
sub slow_light_row
{
	my ($n) = @_;
	my ($slow) = add_rows($node, 1, stage => 'batch', sender => "10.8.0.$n", state => '{"sleep_ms": 60}');
	return poll_until(sub { scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $slow") == 1 }, 30);
}

$gate = PostgreSQL::Test::Utils::tempdir() . '/gate';
$d = start_dispatcher(write_config($node,
	stages => $section =~ s/QUEUE_LIMIT = 4/QUEUE_LIMIT = 16/r =~ s/SLEEP_MS = 5/SLEEP_MS = 0/r,
	dispatch => { POLL_INTERVAL => '60s', FAIR_HALF_LIFE => '1h' }));
@heavy = held_heavy_batch($gate, 1000);
my $offset = -s $node->logfile;
my $done = 0;
my @first;
for my $n (1 .. 40)
{
	last unless slow_light_row($n);
	$done++;
	@first = claims_asked($offset) if $n == 1;
	$offset = -s $node->logfile if $n == 35;
}
is($done, 40, 'slow light rows: forty went through the lane while the worker was held');
my @last = claims_asked($offset);
my $before = max(@first) // 0;
my $after = max(@last) // 0;
cmp_ok($before, '>=', 4,
	"slow light rows: after the first, a claim asks for the held worker's free slots and the lane's row (asked: @first)");
cmp_ok($after, '>=', $before - 1,
	"slow light rows: after the last five, the claims still ask as much (asked: @last)");
release($gate);
$node->safe_psql($db, "ALTER SYSTEM RESET log_statement");
$node->safe_psql($db, 'SELECT pg_reload_conf()');
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
# (Run beside the held batch, it would show within the 2 s polled for.)
poll_until(sub { scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $light") > 0 }, 2);
is(scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $light"),
	0, 'LIGHT_LANE = no: it waits behind the held batch');
is(scalar(my @one = worker_pids($d, 'test-stage')), 1, 'LIGHT_LANE = no: one process of the stage');
is(nice_of($one[0]), nice_of($d->{pid}), 'LIGHT_LANE = no: the worker runs at the dispatcher\'s priority');
release($gate);
is(scalar(my @pids = pids_of(@heavy, $light)), 1, 'LIGHT_LANE = no: every row ran on the one worker');
stop_dispatcher($d);

# A stage of the real runtime (pepsi-stage-discard, a batching stage):
# its worker passes its nice value on to its database session.
$node->safe_psql($db, 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body, test_log');
$d = start_dispatcher(write_config($node, stages => "[stage-drop]\nPROGRAM = pepsi-stage-discard\nPARALLELISM = 1\n"));
add_rows($node, 5, stage => 'drop', sender => '10.0.0.1');
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }), 'the discard stage drains its rows');
my ($discard) = worker_pids($d, 'pepsi-stage-discard');
my $bulk_nice = raised_nice(10, nice_of($d->{pid}));
is(nice_of($discard), $bulk_nice, 'a worker of the runtime runs at BULK_NICE');
my $session_nice = raised_nice($bulk_nice, server_nice($node));
ok(poll_until(sub { session_nices($node, $db, 'pepsi-stage-discard') eq $session_nice }, 10),
	'and its database session at the same nice value')
  or diag('the sessions\' nice values: ' . session_nices($node, $db, 'pepsi-stage-discard'));
SKIP:
{
	skip 'the kernel has no autogroups', 1 unless -e '/proc/self/autogroup';
	# With autogroups a backend's nice value only weighs within its own
	# session (extension/src/session.c): its group takes the value too.
	is(session_autogroup_nices($node, $db, 'pepsi-stage-discard'), $session_nice, 'and the session\'s autogroup');
}
stop_dispatcher($d);
$d = start_dispatcher(write_config($node, stages => "[stage-drop]\nPROGRAM = pepsi-stage-discard\nPARALLELISM = 1\n"
	  . "BULK_NICE = 0\n"));
add_rows($node, 5, stage => 'drop', sender => '10.0.0.1');
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }), 'again with BULK_NICE = 0');
($discard) = worker_pids($d, 'pepsi-stage-discard');
is(nice_of($discard), nice_of($d->{pid}), 'BULK_NICE = 0: the worker runs at the dispatcher\'s priority');
# (The server's and the dispatcher's nice value are the suite's: 0, or 19
# under nice -n 19, which the worker passes on to its session.)
$session_nice = raised_nice(nice_of($d->{pid}), server_nice($node));
is(session_nices($node, $db, 'pepsi-stage-discard'), $session_nice, 'and its database session at the server\'s');
SKIP:
{
	skip 'the kernel has no autogroups', 1 unless -e '/proc/self/autogroup';
	is(session_autogroup_nices($node, $db, 'pepsi-stage-discard'), $session_nice, 'and its autogroup with it');
}
stop_dispatcher($d);

# pepsi.session_nice: the caller's own backend, raised only, within 0..19.
my $five = raised_nice(5, server_nice($node));
is($node->safe_psql($db, 'SELECT pepsi.session_nice(5), pepsi.session_nice(2), pepsi.session_nice(0)'),
	"$five|$five|$five", 'pepsi.session_nice raises a session\'s nice value, and never lowers it');
for my $bad (20, -1)
{
	my ($rc, $out, $err) = $node->psql($db, "SELECT pepsi.session_nice($bad)");
	like($err, qr/nice value $bad is out of range/, "pepsi.session_nice($bad) is refused, naming the value");
}

done_testing();
