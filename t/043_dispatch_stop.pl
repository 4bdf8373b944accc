# pepsi-dispatch stopping and dying: SIGTERM mid-flight puts every claimed
# row back to pending, leaves nothing running, flushes statistics that match
# what the workers concluded, and exits 0; kill -9 mid-flight and a restart
# lose no row, leave none running, and process each at least once; and a
# second dispatcher against the same database refuses to start.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_stop');
my $program = test_program('test-stage');
my $rows = 200;

my $config = write_config($node, stages => <<"EOF");
[stage-a]
PROGRAM = $program
NEXT_STAGE = b
SLEEP_MS = 20
QUEUE_LIMIT = 4
[stage-b]
PROGRAM = $program
NEXT_STAGE = c
SLEEP_MS = 20
QUEUE_LIMIT = 4
[stage-c]
PROGRAM = $program
SLEEP_MS = 20
QUEUE_LIMIT = 4
EOF

sub count_of
{
	my ($sql) = @_;

	return scalar_query($node, "SELECT count(*) FROM $sql");
}

sub running { return count_of("pepsi.workqueue WHERE status = 'running'") }

# The workers a dispatcher started, still alive.
sub live_workers
{
	my ($d) = @_;
	my @started = dispatcher_log($d) =~ /started worker (\d+)/g;

	return grep { kill 0, $_ } @started;
}

#
# SIGTERM with rows in flight at every stage.
#
# (One queue id for all: as the rows split from one message share it.)
my $queue_id = '4jj2pl2f02qx002';
my @ids = add_rows($node, $rows, stage => 'a', state => qq({"queue_id": "$queue_id"}));
my $range = "id BETWEEN $ids[0] AND $ids[-1]";
my $d = start_dispatcher($config);
ok( poll_until(
		sub {
			count_of("test_log WHERE stage = 'c'") >= 10
			  && count_of("pepsi.workqueue WHERE status = 'running' AND stage = 'b'") > 0;
		}),
	'rows are in flight');
is(stop_dispatcher($d, 'TERM', 30), 0, 'SIGTERM: the dispatcher exits 0');
is(running(), '0', 'SIGTERM: no row is left running');
my $finished = count_of("(SELECT DISTINCT id FROM test_log WHERE stage = 'c' AND $range) f");
cmp_ok($finished, '<', $rows, 'SIGTERM: it stopped before the end');
is( count_of("pepsi.workqueue WHERE status = 'pending' AND $range") + $finished,
	$rows, 'SIGTERM: every row not finished is pending again, none lost or failed');
is(scalar(live_workers($d)), 0, 'SIGTERM: no worker is left running');
is( scalar_query($node,
		"SELECT string_agg(stage || '=' || messages, ' ' ORDER BY stage) FROM pepsi.stage_stats"),
	scalar_query($node,
		"SELECT string_agg(stage || '=' || n, ' ' ORDER BY stage)"
		  . ' FROM (SELECT stage, count(*) AS n FROM test_log GROUP BY stage) l'),
	'SIGTERM: the statistics flushed at shutdown match what the workers concluded');
is( scalar_query($node, 'SELECT stages_run || \' \' || messages_failed FROM pepsi.dispatch_stats'),
	count_of('test_log') . ' 0',
	'SIGTERM: dispatch_stats counts every answer, and no failure');
like(dispatcher_log($d), qr/stopping: workers are stopped.*\n(?s:.*)stopped$/m,
	'SIGTERM: the log says so');

#
# A second dispatcher against the same database refuses to start.
#
$d = start_dispatcher($config);
ok(poll_until(sub { count_of("test_log WHERE stage = 'c'") > $finished }),
	'a dispatcher runs again and carries on where the first stopped');
my $second = start_dispatcher($config, log => PostgreSQL::Test::Utils::tempdir() . '/second.log');
my $status = dispatcher_exit($second, 30);
ok(defined $status && $status != 0, 'a second dispatcher exits, with a non-zero status');
like(dispatcher_log($second),
	qr/another pepsi-dispatch is already running against this database/,
	'a second dispatcher says why');
unlike(dispatcher_log($second), qr/started worker|orphaned/,
	'a second dispatcher started no worker and reset no row');
is(dispatcher_exit($d), undef, 'the first dispatcher is still running');

#
# kill -9 mid-flight, then a restart: no row lost, none left running, each
# concluded at every stage at least once.
#
ok(poll_until(sub { running() > 0 }), 'rows are in flight again');
kill 'KILL', $d->{pid};
dispatcher_exit($d, 10);
ok(running() > 0, 'kill -9: rows are left running');
$d = start_dispatcher($config);
ok(poll_until(sub { count_of("pepsi.workqueue WHERE $range") == 0 }, 60),
	'after a restart every row goes through to the end');
my ($orphans) = dispatcher_log($d) =~ /put \d+ orphaned running rows back to pending: (.*)$/m;
ok($orphans, 'the restarted dispatcher put the orphaned rows back to pending');
like($orphans // '', qr/^$queue_id \(row \d+\)(, $queue_id \(row \d+\))*(, \.\.\.)?$/,
	'... naming each by its queue id and its row');
is( count_of(
		"(SELECT id FROM test_log WHERE $range GROUP BY id"
		  . " HAVING count(DISTINCT stage) = 3) p"),
	$rows, 'every row was concluded at a, b and c at least once');
is(running(), '0', 'no row is left running');
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher exits 0');

done_testing();
