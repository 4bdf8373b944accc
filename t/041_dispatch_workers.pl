# pepsi-dispatch and workers that misbehave: one that answers a non-zero
# status, one that exits non-zero, one that segfaults, one that hangs past
# MAX_RUNTIME and one that writes garbage on its stdout each fail (or time
# out) the row they were working on with the reason recorded, are replaced,
# and the ids queued behind them go back to pending and are processed; a
# PROGRAM that does not exist, and one that exits before answering anything,
# hold their stage off for SPAWN_COOLDOWN instead of being retried in a
# tight loop, and fail no row.  Through all of it the daemon carries on.
# How long those take (MAX_RUNTIME, the cooldown between attempts) is
# measured by bench/timing, not asserted here.
# CRASH_LIMIT is 1 here, so the first death isolates its row at once;
# t/049_dispatch_crash_retry shows the retries that come before the limit.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_workers');
my $program = test_program('test-stage');
my $broken = test_program('broken-stage');
my $cooldown = 1.0;

# One worker at stage w, so "the worker" is well defined; room for four
# ids in flight, so rows queue behind the one it is working on.  No row
# of stage w is timed but the one that hangs (MAX_RUNTIME is lowered for
# it alone, below): MAX_RUNTIME counts from the moment an id is sent, and
# on a loaded machine a row held until the two behind it were claimed
# (misbehaving_row_and_two_behind) outlived 10 s, and timed out instead
# of failing.
my $config = write_config(
	$node,
	dispatch => { SPAWN_COOLDOWN => "${cooldown}s", CRASH_LIMIT => 1 },
	stages => <<"EOF");
[stage-w]
PROGRAM = $program
PARALLELISM = 1
QUEUE_LIMIT = 4
MAX_RUNTIME = 1h
[stage-missing]
PROGRAM = /nonexistent/pepsi-stage-missing
[stage-broken]
PROGRAM = $broken
EOF
my $d = start_dispatcher($config);

sub row_outcome
{
	my ($id) = @_;

	return scalar_query($node,
		    "SELECT coalesce((SELECT status || ': ' || coalesce(state->>'dispatch_error', '')"
		  . " FROM pepsi.workqueue WHERE id = $id), 'gone')");
}

sub logged_by
{
	my ($id) = @_;

	return scalar_query($node, "SELECT coalesce(string_agg(pid::text, ','), '') FROM test_log WHERE id = $id");
}

# A good row through w; returns the pid of the worker that concluded it.
sub warm_worker
{
	my ($id) = add_rows($node, 1, stage => 'w');

	poll_until(sub { logged_by($id) ne '' });
	return logged_by($id);
}

sub alive
{
	my ($pid) = @_;

	return grep { $_ == $pid } worker_pids($d, 'test-stage');
}

# A row that misbehaves, with two good rows admitted right behind it while
# the worker is still busy with it, so they queue behind it on the same
# worker.  The worker holds the bad row (state.wait_file) until both good
# ones are claimed, that is written to it: on a loaded machine the claim
# can take longer than any fixed delay.
my $release_count = 0;

sub misbehaving_row_and_two_behind
{
	my ($behaviour) = @_;
	my $release = $node->basedir . '/release-' . ++$release_count;
	my ($bad) = add_rows($node, 1, stage => 'w',
		state => qq({"test": "$behaviour", "wait_file": "$release"}));
	my @good = add_rows($node, 2, stage => 'w');

	poll_until(sub {
		scalar_query($node,
			"SELECT count(*) FROM pepsi.workqueue WHERE id IN ($good[0], $good[1]) AND status = 'running'")
		  == 2;
	});
	open(my $fh, '>', $release) or die "$release: $!";
	close $fh;
	return ($bad, @good);
}

#
# A non-zero status: the row fails with the worker's reason, the worker
# finishes what it was given and is replaced.
#
my $pid = warm_worker();
like($pid, qr/^\d+$/, 'a warm worker serves stage w');
my ($bad, @good) = misbehaving_row_and_two_behind('fail');
ok(poll_until(sub { row_outcome($bad) =~ /^failed/ }), 'a row answered non-zero is failed');
like(row_outcome($bad), qr/^failed: stage w: row $bad: told to fail$/,
	'with the reason from the status line in state.dispatch_error');
ok(poll_until(sub { logged_by($good[0]) ne '' && logged_by($good[1]) ne '' }),
	'the rows behind it are concluded');
ok(poll_until(sub { !alive($pid) }), 'the worker that failed a row is retired');
my $replacement = warm_worker();
isnt($replacement, $pid, 'a new worker takes the next row');

#
# Exits non-zero, and segfaults, while working on a row: that row fails
# with the reason, the two queued behind go back to pending and are done
# by the replacement.
#
for my $case ([ 'exit', qr/worker exited with status 3 while processing the row/ ],
	[ 'segv', qr/worker killed by signal 11 while processing the row/ ])
{
	my ($behaviour, $reason) = @$case;

	$pid = warm_worker();
	my $offset = -s $d->{log};
	($bad, @good) = misbehaving_row_and_two_behind($behaviour);
	ok(poll_until(sub { row_outcome($bad) =~ /^failed/ }), "$behaviour: the row is failed");
	like(row_outcome($bad), qr/^failed: stage w: $reason$/, "$behaviour: with the reason");
	ok(poll_until(sub { logged_by($good[0]) ne '' && logged_by($good[1]) ne '' }),
		"$behaviour: the two rows queued behind it are concluded");
	ok( !grep({ $_ eq $pid } map { logged_by($_) } @good),
		"$behaviour: by another worker than the one that died");
	like(substr(dispatcher_log($d), $offset),
		qr/stage w: 2 rows worker $pid had not answered go back to pending/,
		"$behaviour: they went back to pending, not failed");
	ok(!alive($pid), "$behaviour: the dead worker is gone");
}

#
# Hangs past MAX_RUNTIME: killed, its row set to timeout; the rows behind
# go back to pending.
#
# The dispatcher's reloads so far, to wait for the next one.
sub reloads
{
	my @lines = grep { /configuration reloaded/ } split /\n/, dispatcher_log($d);

	return scalar @lines;
}

# Set stage w's MAX_RUNTIME in the database (undef: unset it), and wait
# for the dispatcher to apply it.
sub max_runtime
{
	my ($value) = @_;
	my $before = reloads();

	$node->safe_psql($db,
		defined $value
		? "SELECT pepsi.config_set('global', 'stage-w', 'MAX_RUNTIME', '$value')"
		: "SELECT pepsi.config_unset('global', 'stage-w', 'MAX_RUNTIME')");
	poll_until(sub { reloads() > $before }) or die "the dispatcher did not reload its configuration";
}

$pid = warm_worker();
my $offset = -s $d->{log};
my $started = time;
($bad, @good) = misbehaving_row_and_two_behind('hang');
# The limit once the rows behind are queued, so that the wait for them is
# not timed (it counts from when the hung row was sent all the same); the
# reload retires the worker, which keeps its rows until it is killed.
max_runtime('10s');
ok(poll_until(sub { row_outcome($bad) =~ /^timeout/ }), 'hang: the row times out');
# Not before MAX_RUNTIME (10 s): bench/timing.  (It bounds every row of
# stage w, and at 1.5 s a row that was not to hang timed out at a load of
# 48.)
note(sprintf('timing hang_timeout_seconds %.3f', time - $started));
like(row_outcome($bad),
	qr/^timeout: stage w: no answer within MAX_RUNTIME \(10000 ms\); worker killed$/,
	'hang: with the reason in state.dispatch_error');
ok(poll_until(sub { !alive($pid) }), 'hang: the worker was killed');
ok(poll_until(sub { logged_by($good[0]) ne '' && logged_by($good[1]) ne '' }),
	'hang: the rows queued behind it are concluded by its replacement');
like(substr(dispatcher_log($d), $offset),
	qr/stage w: 2 rows worker $pid had not answered go back to pending/,
	'hang: they went back to pending');
max_runtime(undef);

#
# Garbage on stdout: that row fails with the reason, the worker is killed
# (what it says next cannot be trusted), the rows behind go back to
# pending, and the daemon carries on.
#
$pid = warm_worker();
$offset = -s $d->{log};
($bad, @good) = misbehaving_row_and_two_behind('garbage');
ok(poll_until(sub { row_outcome($bad) =~ /^failed/ }), 'garbage: the row is failed');
like(row_outcome($bad),
	qr/^failed: stage w: worker wrote a malformed status line: "this is not a status line"$/,
	'garbage: with the reason');
ok(poll_until(sub { !alive($pid) }), 'garbage: the worker was replaced');
ok(poll_until(sub { logged_by($good[0]) ne '' && logged_by($good[1]) ne '' }),
	'garbage: the rows queued behind it are concluded');
is(join(' ', map { row_outcome($_) } @good), 'gone gone', 'garbage: and none of them failed');
like(substr(dispatcher_log($d), $offset),
	qr/stage w: 2 rows worker $pid had not answered go back to pending/,
	'garbage: they went back to pending');
is(dispatcher_exit($d), undef, 'the dispatcher is still running');
isnt(warm_worker(), $pid, 'and stage w still works, with a new worker');

#
# A PROGRAM that does not exist: each claim's attempt to start it is held
# off for SPAWN_COOLDOWN; its rows stay pending; the other stages carry on.
#
sub attempts
{
	my ($pattern) = @_;
	my @lines = grep { /$pattern/ } split /\n/, dispatcher_log($d);

	return scalar @lines;
}

my $missing_attempts = qr/stage missing: cannot start \/nonexistent\/pepsi-stage-missing: No such file or directory; holding the stage off/;
$started = time;
my ($missing) = add_rows($node, 1, stage => 'missing');
ok(poll_until(sub { attempts($missing_attempts) >= 3 }),
	'a missing PROGRAM: three attempts to start it');
# SPAWN_COOLDOWN apart, not a tight loop: bench/timing.
note(sprintf('timing missing_program_cooldowns_per_attempt %.3f',
	(time - $started) / $cooldown / ((attempts($missing_attempts) - 1) || 1)));
is(scalar_query($node, "SELECT status FROM pepsi.workqueue WHERE id = $missing"),
	'pending', 'missing PROGRAM: its row waits, pending');
isnt(warm_worker(), '', 'missing PROGRAM: meanwhile stage w still works');

# The database cannot make the dispatcher run a program by its path, even
# a database whose guards a superuser dropped: the dispatcher refuses the
# override, says why, and keeps the graph it runs.
$node->safe_psql($db,
	"ALTER TABLE pepsi.config_override DROP CONSTRAINT config_override_program_name;"
	  . " ALTER TABLE pepsi.config_override DISABLE TRIGGER config_override_guard;"
	  . " INSERT INTO pepsi.config_override (scope, section, option, value)"
	  . " VALUES ('global', 'stage-missing', 'PROGRAM', '$program')");
ok(poll_until(sub { dispatcher_log($d) =~ /configuration not reloaded/ }),
	'a PROGRAM path in the database is refused');
like(dispatcher_log($d),
	qr/configuration not reloaded: override global \[stage-missing\] PROGRAM = \Q$program\E refused: .*never a path/,
	'with a clear message');
isnt(warm_worker(), '', 'the running graph keeps working');
is(logged_by($missing), '', 'and the program named by its path never ran');

# A program of Pepsi's, named by the override, brings the stage back.
$node->safe_psql($db,
	"DELETE FROM pepsi.config_override;"
	  . " INSERT INTO pepsi.config_override (scope, section, option, value)"
	  . " VALUES ('global', 'stage-missing', 'PROGRAM', 'pepsi-test-probe'),"
	  . " ('global', 'stage-missing', 'ACTION', 'pause')");
ok( poll_until(
		sub {
			scalar_query($node, "SELECT state->>'probe' FROM pepsi.workqueue WHERE id = $missing") eq
			  'pause';
		}),
	'once PROGRAM names a program of Pepsi\'s the row goes through at once');

#
# A program that exits before reading its input (as one refusing its
# configuration does) is a program that does not start: the stage is held
# off, and its rows are not failed.
#
my $broken_attempts = qr/stage broken: worker \d+ exited with status 1 before reading its input; holding the stage off/;
$started = time;
my @broken = add_rows($node, 3, stage => 'broken');
ok(poll_until(sub { attempts($broken_attempts) >= 3 }),
	'a program that exits at start: three attempts to start it');
# SPAWN_COOLDOWN apart: bench/timing.
note(sprintf('timing exits_at_start_cooldowns_per_attempt %.3f',
	(time - $started) / $cooldown / ((attempts(qr/broken-stage\[\d+\]: refusing to start/) - 1) || 1)));
# Each attempt claims the rows (running) until the program has exited, so
# the rows are looked at between two attempts: on a loaded machine the
# next attempt had begun by the time of the query.
my $broken_rows = 'SELECT string_agg(status::text, \',\' ORDER BY id) FROM pepsi.workqueue'
  . " WHERE stage = 'broken'";
is( poll_until(
		sub {
			my $statuses = scalar_query($node, $broken_rows);
			return $statuses =~ /running/ ? '' : $statuses;
		}),
	'pending,pending,pending',
	'exits at start: none of its rows failed, all wait pending');

#
# The statistics at shutdown account for all of it.
#
is(stop_dispatcher($d, 'TERM'), 0, 'SIGTERM: the dispatcher exits 0');
is( scalar_query($node,
		'SELECT kills || \' \' || timeouts || \' \' || crashes FROM pepsi.stage_stats'
		  . " WHERE stage = 'w'"),
	'2 1 2',
	'stage w: kills (timeout, garbage), timeouts, crashes (exit, segv) counted');
is(scalar_query($node, 'SELECT messages_failed FROM pepsi.dispatch_stats'),
	'5', 'five messages failed or timed out');
is(scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'"),
	'0', 'no row is left running');

done_testing();
