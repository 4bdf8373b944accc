# The "pepsi maintenance" background worker (extension/src/maint.c): static
# registration under shared_preload_libraries and dynamic start through
# pepsi.start_maintenance(); requeueing paused rows when they fall due (with
# a NOTIFY to the dispatcher), sweeping orphan bodies, pruning mail_log; and
# how it lives with SIGHUP, SIGTERM, a restart and a database that does not
# have the extension yet.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $db = 'postgres';
my $workers =
  "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pepsi maintenance')";

# Pause the running row $id for $seconds; returns its due time.
sub pause_row
{
	my ($node, $id, $seconds) = @_;

	$node->safe_psql($db, "SELECT pepsi.workqueue_pause($id, 'init', $seconds)");
	return $node->safe_psql($db,
		"SELECT timeout FROM pepsi.workqueue WHERE id = $id AND status = 'paused'");
}

# Wait until the worker with this pid has ended a pass after $since (a
# state_change timestamp from worker_state_change).
sub wait_for_pass_after
{
	my ($node, $pid, $since) = @_;

	return wait_until($node, $db,
		    "SELECT state = 'idle' AND state_change > '$since'"
		  . " FROM pg_stat_activity WHERE pid = $pid");
}

#
# A node that preloads pepsi and names a database without the extension.
#
my $node = pepsi_node(
	'maintenance',
	preload => 1,
	conf => "pepsi.database = '$db'\n"
	  . "pepsi.body_gc_interval = '1s'\n"
	  . "pepsi.mail_log_retention = '60s'\n");

ok(wait_until($node, $db, "SELECT $workers = 1"),
	'the preloaded worker is registered statically and starts with the server');
my $pid = maintenance_pid($node, $db);
like($pid, qr/^\d+$/, "one worker serves $db");

# Without the extension each pass must find nothing to do, not fail: a
# failing worker would exit with code 1 and be restarted every 10 s.
my $first = worker_state_change($node, $db, $pid);
ok(wait_for_pass_after($node, $pid, $first), 'a pass runs without the extension');
my $second = worker_state_change($node, $db, $pid);
ok(wait_for_pass_after($node, $pid, $second), 'and another one');
is(maintenance_pid($node, $db), $pid, 'the worker is still the same process');
my $log = log_since($node, 0);
unlike($log, qr/\[$pid\] (?:ERROR|FATAL|PANIC)/,
	'the worker logged no error while the extension was missing');
unlike($log, qr/background worker "pepsi maintenance".*exited/,
	'no maintenance worker has exited');

#
# The extension arrives: the same worker starts requeueing paused rows.
#
$node->safe_psql($db, 'CREATE EXTENSION pepsi');
my $listener = $node->background_psql($db);
$listener->query_safe('LISTEN pepsi_workqueue');

my ($row, $row_body) = add_running_message($node, $db, 'init', ['a@example.net']);
my $seq_before = $node->safe_psql($db,
	"SELECT pending_seq FROM pepsi.workqueue WHERE id = $row");
my $due = pause_row($node, $row, 2);
isnt($due, '', 'workqueue_pause parks the row with a retry time');
# Read with the clock: on a loaded machine the due time may have come
# before this check does, and then the row may rightly be pending already.
my ($status_now, $due_now) = split /\|/,
  $node->safe_psql($db,
	"SELECT status || '|' || (clock_timestamp() >= '$due') FROM pepsi.workqueue WHERE id = $row");
ok($status_now eq 'paused' || $due_now eq 'true',
	"the row is still paused right after the pause ($status_now, past due: $due_now)");

# Watch the row until it is pending: any sighting of "pending" while the
# clock is still short of the due time means the worker requeued it early.
my $early = 0;
my $pending = poll_until(
	sub {
		my ($status, $past_due) = split /\|/,
		  $node->safe_psql($db,
			    "SELECT status || '|' || (clock_timestamp() >= '$due')"
			  . " FROM pepsi.workqueue WHERE id = $row");
		return 0 unless $status eq 'pending';
		$early = 1 if $past_due ne 'true';
		return 1;
	});
ok($pending, 'the paused row is pending again once its retry time has come');
ok(!$early, 'and not before its retry time');
is( $node->safe_psql(
		$db,
		"SELECT timeout IS NULL AND pending_seq > $seq_before"
		  . " FROM pepsi.workqueue WHERE id = $row"),
	't',
	'the requeued row has no retry time and queues behind the rows already waiting');

# The requeue woke the dispatcher: the listener got a notification, and it
# came from the worker.
my $notified = '';
poll_until(
	sub {
		$notified .= $listener->query_safe('SELECT 1');
		return $notified =~ /Asynchronous notification "pepsi_workqueue"/;
	});
like(
	$notified,
	qr/Asynchronous notification "pepsi_workqueue" received from server process with PID $pid\b/,
	'the worker sends NOTIFY pepsi_workqueue when it requeues');
$listener->quit;

#
# Bodies: an orphan is swept, a body a row references is not.
#
my $offset = -s $node->logfile;
my $orphan = $node->safe_psql($db,
	"INSERT INTO pepsi.workqueue_body (body) VALUES ('orphan') RETURNING id");
ok( wait_until(
		$node, $db,
		"SELECT NOT EXISTS (SELECT 1 FROM pepsi.workqueue_body WHERE id = $orphan)"),
	'the worker sweeps a body no row references');
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.workqueue_body WHERE id = $row_body"),
	'1', 'the body of a live row is kept');
ok($node->wait_for_log(qr/\[$pid\] LOG:  pepsi maintenance: swept 1 unreferenced message bodies/,
		$offset),
	'the sweep is logged');

#
# mail_log: rows past pepsi.mail_log_retention go, fresh ones stay.
#
my ($old_log, $fresh_log) = split /\n/,
  $node->safe_psql(
	$db, q{
	INSERT INTO pepsi.mail_log (at, workqueue_id, event)
	VALUES (now() - interval '1 hour', 1, 'old'), (now(), 1, 'fresh')
	RETURNING id});
ok( wait_until(
		$node, $db,
		"SELECT NOT EXISTS (SELECT 1 FROM pepsi.mail_log WHERE id = $old_log)"),
	'mail_log rows past the retention are pruned');
is($node->safe_psql($db, "SELECT event FROM pepsi.mail_log WHERE id = $fresh_log"),
	'fresh', 'a mail_log row within the retention is kept');

#
# A paused row that is due but locked by another session (an operator's
# open transaction) cannot be requeued yet; the worker must not spin on it.
#
# The lock must be taken while the row is still paused and not yet due:
# on a loaded machine the worker may requeue a row due in 1 s before this
# session gets to lock it, so a row requeued first is replaced by another
# paused for longer.
my ($locked, $locked_due);
my $holder = $node->background_psql($db);
for my $delay (1, 4, 16)
{
	($locked) = add_running_message($node, $db, 'init', ["b$delay\@example.net"]);
	# (pause_row answers '' when the row was requeued before it read it back)
	$locked_due = pause_row($node, $locked, $delay);
	if ($locked_due ne '')
	{
		$holder->query_safe('BEGIN');
		last
		  if $holder->query_safe("SELECT status = 'paused' AND clock_timestamp() < '$locked_due'"
			  . " FROM pepsi.workqueue WHERE id = $locked FOR UPDATE") eq 't';
		$holder->query_safe('ROLLBACK');
	}
	note("row $locked was requeued before it could be locked; again, paused for longer than $delay s");
}
ok(wait_until($node, $db, "SELECT clock_timestamp() > '$locked_due'"),
	'the locked row falls due');
# Once the row is due, count the commits in the database over two seconds
# (one session, so the measurement itself adds one): an idle worker makes a
# pass a second, a spinning one hundreds.
my $commits = $node->safe_psql(
	$db, q{
	CREATE TEMP TABLE before AS
		SELECT xact_commit FROM pg_stat_database WHERE datname = current_database();
	SELECT pg_sleep(2);
	SELECT pg_stat_clear_snapshot();
	SELECT d.xact_commit - b.xact_commit
	FROM pg_stat_database d, before b WHERE d.datname = current_database()});
$commits = (split /\n/, $commits)[-1];
note("commits in the database over two seconds: $commits");
cmp_ok($commits, '<', 100,
	'the worker does not busy-loop on a due row another session has locked');
is($node->safe_psql($db, "SELECT status FROM pepsi.workqueue WHERE id = $locked"),
	'paused', 'the locked row is left alone');
$holder->query_safe('COMMIT');
ok( wait_until(
		$node, $db, "SELECT status = 'pending' FROM pepsi.workqueue WHERE id = $locked"),
	'once the lock is gone the row is requeued');
$holder->quit;

#
# The extension dropped and created again under the running worker: it
# idles meanwhile, then works on the new tables with the plans it keeps.
#
$node->safe_psql($db, 'DROP EXTENSION pepsi');
my $dropped = worker_state_change($node, $db, $pid);
ok(wait_for_pass_after($node, $pid, $dropped), 'a pass runs after DROP EXTENSION');
$node->safe_psql($db, 'CREATE EXTENSION pepsi');
my ($recreated) = add_running_message($node, $db, 'init', ['b2@example.net']);
pause_row($node, $recreated, 0.2);
ok( wait_until(
		$node, $db, "SELECT status = 'pending' FROM pepsi.workqueue WHERE id = $recreated"),
	'after CREATE EXTENSION again the worker requeues rows of the new queue');
is(maintenance_pid($node, $db), $pid, 'the same worker, which never failed');

#
# SIGTERM: the worker exits cleanly, so the postmaster does not restart it;
# pepsi.start_maintenance() starts a dynamic one in its place.
#
$offset = -s $node->logfile;
is($node->safe_psql($db, "SELECT pg_terminate_backend($pid)"),
	't', 'SIGTERM sent to the worker');
ok(wait_until($node, $db, "SELECT $workers = 0"), 'the worker exits on SIGTERM');
ok($node->wait_for_log(qr/\[$pid\] LOG:  pepsi maintenance worker shutting down/, $offset),
	'it says it is shutting down');
my $dynamic = $node->safe_psql($db, 'SELECT pepsi.start_maintenance()');
like($dynamic, qr/^\d+$/, 'pepsi.start_maintenance() returns a pid');
isnt($dynamic, $pid, 'that of a new worker');
is(maintenance_pid($node, $db), $dynamic, 'which serves the database alone');
unlike(log_since($node, $offset),
	qr/background worker "pepsi maintenance" \(PID $pid\) exited with exit code/,
	'the terminated worker exited with status 0 (no restart by the postmaster)');
my ($after_term) = add_running_message($node, $db, 'init', ['c@example.net']);
pause_row($node, $after_term, 0.2);
ok( wait_until(
		$node, $db,
		"SELECT status = 'pending' FROM pepsi.workqueue WHERE id = $after_term"),
	'the new worker requeues due rows');

#
# A restart brings the static worker back.  It comes back with a one-hour
# interval, for the SIGHUP test below.
#
$node->append_conf('postgresql.conf', "pepsi.maintenance_interval = '1h'\n");
$node->restart;
ok(wait_until($node, $db, "SELECT $workers = 1"), 'after a restart the worker is back');
my $restarted = maintenance_pid($node, $db);
like($restarted, qr/^\d+$/, 'one worker after the restart');
isnt($restarted, $dynamic, 'a new process');
ok(wait_until($node, $db, "SELECT state = 'idle' FROM pg_stat_activity WHERE pid = $restarted"),
	'its first pass is done');

#
# SIGHUP: the worker re-reads its settings and goes on.  With the one-hour
# interval it would sleep through the next due row; after the reload it
# must wake at the new interval.
#
my $before_reload = worker_state_change($node, $db, $restarted);
$node->safe_psql($db, "ALTER SYSTEM SET pepsi.maintenance_interval = '200ms'");
$node->safe_psql($db, 'SELECT pg_reload_conf()');
ok(wait_for_pass_after($node, $restarted, $before_reload),
	'SIGHUP wakes the worker for a pass');
is(maintenance_pid($node, $db), $restarted, 'the same worker survives the reload');
my ($after_hup) = add_running_message($node, $db, 'init', ['d@example.net']);
pause_row($node, $after_hup, 0.2);
ok( wait_until(
		$node, $db,
		"SELECT status = 'pending' FROM pepsi.workqueue WHERE id = $after_hup",
		't', 20),
	'after the reload the worker wakes at the new interval');
unlike(log_since($node, 0), qr/background worker "pepsi maintenance".*exited with exit code/,
	'no maintenance worker failed during the whole run');

$node->stop;

#
# A node without preload: the worker is started on demand, once per database.
#
# The extension from the start (the template's, scripts/check.sh), and
# the two other databases copies of this one made before any worker
# runs (a template must have no other session): what this part tests is
# the worker, and each CREATE EXTENSION pepsi cost seconds of CPU (its
# closing check of the grants).
my $dyn = pepsi_node('dynamic', extension => 1);
$dyn->safe_psql($db, "CREATE DATABASE $_ TEMPLATE $db") for qw(other racing);
is($dyn->safe_psql($db, "SELECT $workers"), '0', 'without preload no worker runs');
my $started = $dyn->safe_psql($db, 'SELECT pepsi.start_maintenance()');
like($started, qr/^\d+$/, 'pepsi.start_maintenance() returns a pid');
is( $dyn->safe_psql(
		$db,
		"SELECT backend_type || ' ' || datname FROM pg_stat_activity WHERE pid = $started"),
	"pepsi maintenance $db",
	'the pid is the maintenance worker of this database');
is($dyn->safe_psql($db, 'SELECT pepsi.start_maintenance()'),
	$started, 'a second call returns the same worker');
is($dyn->safe_psql($db, "SELECT $workers"), '1', 'and starts no other');

my $other = $dyn->safe_psql('other', 'SELECT pepsi.start_maintenance()');
isnt($other, $started, 'another database gets a worker of its own');
is($dyn->safe_psql($db, "SELECT $workers"), '2', 'both workers run');
is(maintenance_pid($dyn, 'other'), $other, 'the second one serves the other database');

# Sessions racing to start the worker of a database all get the one that
# serves it: a pid whose worker then bows out to another is no answer.
my @starters;
for my $i (1 .. 8)
{
	my %session = (out => '', err => '');
	$session{run} = IPC::Run::start(
		[
			'psql', '-XAtq', '-d', $dyn->connstr('racing'),
			'-c', 'SELECT pepsi.start_maintenance()'
		],
		'>', \$session{out}, '2>', \$session{err});
	push @starters, \%session;
}
$_->{run}->finish for @starters;
my %answers = map { my $pid = $_->{out}; chomp $pid; ($pid => 1) } @starters;
is(join('', map { $_->{err} } @starters), '', 'concurrent starts all succeed');
is(scalar keys %answers, 1, 'concurrent starts all return the same pid')
  or diag('pids returned: ' . join(' ', sort keys %answers));
ok(wait_until($dyn, 'racing', "SELECT $workers = 2 + 1"),
	'one worker is left serving that database');
is(maintenance_pid($dyn, 'racing'), (keys %answers)[0], 'and it is the pid they returned');

my ($dyn_row) = add_running_message($dyn, $db, 'init', ['e@example.net']);
$dyn->safe_psql($db, "SELECT pepsi.workqueue_pause($dyn_row, 'init', 0.5)");
ok( wait_until(
		$dyn, $db, "SELECT status = 'pending' FROM pepsi.workqueue WHERE id = $dyn_row"),
	'the dynamic worker requeues due rows');

$dyn->stop;

done_testing();
