# pepsi-dispatch and a worker that dies on a row: the row is not failed at
# once but paused and retried (its attempt counted in state.crash), so a
# worker SIGKILLed mid-message costs a delay, not the message.  A poison
# message that kills every worker it meets is isolated after CRASH_LIMIT
# attempts: failed with the reason, an event_log entry, a warning, the
# counter in dispatch_stats and an alert in pepsi-status, while the stage
# keeps serving the other rows.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
# The maintenance worker requeues the paused rows when they fall due.
my $node = dispatch_node('dispatch_crash_retry', preload => 1,
	conf => "pepsi.maintenance_interval = 200\n");
my $program = test_program('test-stage');
my $crash_limit = 3;

my $config = write_config(
	$node,
	dispatch => { CRASH_LIMIT => $crash_limit, CRASH_RETRY_DELAY => '500ms' },
	stages => <<"EOF");
[stage-w]
PROGRAM = $program
PARALLELISM = 2
EOF
my $d = start_dispatcher($config);

sub row
{
	my ($id) = @_;

	return scalar_query($node,
		    "SELECT coalesce((SELECT status || ' ' || coalesce(state->'crash'->>'attempts', '-')"
		  . " || ' ' || coalesce(state->>'dispatch_error', '-') FROM pepsi.workqueue WHERE id = $id),"
		  . " 'gone')");
}

sub concluded
{
	my ($id) = @_;

	return scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $id") > 0;
}

#
# SIGKILL the worker holding a row: the row is paused for a retry with the
# attempt counted, then retried and concluded by a new worker.
#
# The row is held until $gate exists, made only after the kill: however
# slow the machine, the worker cannot conclude it first, and its retry
# can conclude it.
# The worker is killed once it has read the row ($started), not merely
# been handed it: a worker killed before reading its input puts its rows
# back to pending, uncounted.
my $gate_dir = PostgreSQL::Test::Utils::tempdir();
my ($gate, $started) = ("$gate_dir/sigkill-gate", "$gate_dir/sigkill-started");
# (Its queue id, as ingress gives one, names it in the dispatcher's log.)
my $held_queue_id = '4jj2pl2f02qx001';
my ($held) = add_rows($node, 1, stage => 'w',
	state => qq({"wait_file": "$gate", "started_file": "$started", "queue_id": "$held_queue_id"}));
ok(poll_until(sub { -e $started && row($held) =~ /^running/ && worker_pids($d, 'test-stage') }),
	'a worker holds the row and has read it') or diag(dispatcher_log($d));
my ($victim) = worker_pids($d, 'test-stage');
my $offset = -s $d->{log};
kill 'KILL', $victim;
# The pause lasts CRASH_RETRY_DELAY, after which the retry holds the row
# running again until the gate opens: what the crash left is read then,
# in state.crash, which stays until the row is concluded.
my $crash = '';
ok( poll_until(
		sub {
			$crash = scalar_query($node,
				    "SELECT coalesce(state->'crash'->>'attempts' || ': ' || (state->'crash'->>'reason'), '')"
				  . " FROM pepsi.workqueue WHERE id = $held");
			$crash ne '';
		}),
	'SIGKILL: the row is no longer running');
open(my $gate_fh, '>', $gate) or die "$gate: $!";
close $gate_fh;
chmod 0644, $gate;
ok(poll_until(sub { row($held) =~ /^paused/ || concluded($held) }), 'SIGKILL: the row is paused');
like($crash, qr/^1: stage w: worker killed by signal 9 while processing the row$/,
	'SIGKILL: the attempt is counted in state.crash, with the reason');
ok(poll_until(sub { concluded($held) }), 'SIGKILL: the row is retried and concluded');
is(row($held), 'gone', 'SIGKILL: and finished, not failed');
isnt(scalar_query($node, "SELECT pid FROM test_log WHERE id = $held"),
	$victim, 'SIGKILL: by another worker than the one that died');
like(
	substr(dispatcher_log($d), $offset),
	qr/: \Q$held_queue_id\E: row $held paused for a retry: stage w: worker killed by signal 9/,
	'SIGKILL: the retry is logged, with the queue id beside the row');

#
# A poison message: every worker that takes it crashes.  It is tried
# CRASH_LIMIT times, with good rows admitted meanwhile concluded, then
# isolated.
#
$offset = -s $d->{log};
my ($poison) = add_rows($node, 1, stage => 'w', state => '{"test": "segv"}');
my @good;
for (1 .. 5)
{
	push @good, add_rows($node, 2, stage => 'w');
	usleep(300_000);
}
ok(poll_until(sub { row($poison) =~ /^failed/ }), 'poison: the row ends failed');
is( row($poison),
	"failed $crash_limit stage w: worker killed by signal 11 while processing the row",
	"poison: after $crash_limit attempts, with the reason");
ok(poll_until(sub { !grep { !concluded($_) } @good }),
	'poison: the rows admitted meanwhile are all concluded: the stage stayed up');
is(scalar(() = substr(dispatcher_log($d), $offset) =~ /row $poison paused for a retry/g),
	$crash_limit - 1, 'poison: retried CRASH_LIMIT - 1 times');
like(
	substr(dispatcher_log($d), $offset),
	qr/: $poison: row $poison isolated as failed after $crash_limit attempts that ended its worker \(CRASH_LIMIT\): stage w: worker killed by signal 11/,
	'poison: a warning when it is isolated (a row made without a queue id is named by its row id)');
is( scalar_query($node,
		    "SELECT (detail->>'attempts') || ' ' || (detail->>'stage') FROM pepsi.event_log"
		  . " WHERE action = 'crash_limit' AND (detail->>'id')::bigint = $poison"),
	"$crash_limit w",
	'poison: an event_log entry');
is(scalar_query($node, q{SELECT crash_retries || ' ' || crash_failures FROM pepsi.dispatch_stats}),
	'3 1', 'poison: dispatch_stats counts the retries (1 + 2) and the isolation');

my @status = (pepsi_bin('pepsi-status'), '-C', $config);
my ($out, $err) = ('', '');
IPC::Run::run(\@status, '>', \$out, '2>', \$err);
like(
	$out,
	qr/^ALERT: 1 message\(s\) isolated after ending their stage worker CRASH_LIMIT times/m,
	'pepsi-status raises the alert');
like($out, qr/^\s+3 retried and 1 isolated after their worker died$/m, 'pepsi-status: the counters');
IPC::Run::run([ @status, '--json' ], '>', \$out, '2>', \$err);
my $status = decode_json($out);
is(scalar(@{ $status->{alerts} }), 1, 'pepsi-status --json: the alert');
is($status->{dispatch}{crash_failures}, 1, 'pepsi-status --json: the counter');

is(dispatcher_exit($d), undef, 'the dispatcher is still running');
is(stop_dispatcher($d, 'TERM'), 0, 'and stops cleanly');

done_testing();
