# pepsi-dispatch when PostgreSQL restarts under it: it notices, reconnects
# with backoff, and carries on; the workers, whose sessions died with the
# server, are replaced rather than handed rows they would fail; and a
# restart in the middle of a load loses no row and leaves none running.
# The stages are the real if, route and discard.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_pg_restart');

# CRASH_RETRY_DELAY: a worker that could not get its session back exits,
# and its row is paused for a retry, 60 s by default, which would stall
# the load's drain (bounded by its progress, below) for that long.
my $config = write_config($node, dispatch => { CRASH_RETRY_DELAY => '1s' }, stages => real_stages());

my $d = start_dispatcher($config);
add_rows($node, 100);
ok(poll_until(sub { queue_count($node) == 0 }), 'rows go through before the restart');
my @before = worker_pids($d, 'pepsi-stage');
is(scalar(@before), 6, 'two workers per stage are up, idle');

#
# A restart while the pipeline is idle.
#
my $offset = -s $d->{log};
$node->restart;
ok( poll_until(sub { substr(dispatcher_log($d), $offset) =~ /lost the database connection/ }),
	'the dispatcher notices the server went away');
ok(poll_until(sub { substr(dispatcher_log($d), $offset) =~ /connected to the database/ }),
	'and reconnects');
add_rows($node, 100);
ok(poll_until(sub { queue_count($node) == 0 }), 'rows admitted after the restart go through');
is( scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE status = 'failed'"),
	'0', 'none of them failed on a worker session that died with the server');
my %old = map { $_ => 1 } @before;
ok(poll_until(sub { !grep { $old{$_} } worker_pids($d, 'pepsi-stage') }),
	'the workers from before the restart are gone');
is(dispatcher_exit($d), undef, 'the dispatcher is still running');

#
# A restart in the middle of a load: no row is lost or left running;
# rows whose worker was cut off mid-statement may fail, with the reason.
#
add_rows($node, 3000);
ok( poll_until(
		sub {
			scalar_query($node,
				"SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'") > 0
			  && queue_count($node) < 2900;
		}),
	'a load is under way');
$offset = -s $d->{log};
$node->restart;
ok(poll_until(sub { substr(dispatcher_log($d), $offset) =~ /connected to the database/ }, 60),
	'the dispatcher reconnects again');
# The load's pace is the machine's: its drain is bounded by a stall, not
# by a total.
ok( poll_drained(
		sub {
			scalar_query($node,
				"SELECT count(*) FROM pepsi.workqueue WHERE status NOT IN ('failed', 'timeout')");
		}),
	'every row of the load goes through, or is failed');
my $failed = scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue');
note("$failed rows failed across the restart: "
	  . scalar_query($node,
		"SELECT string_agg(DISTINCT regexp_replace(state->>'dispatch_error', '\\d+', 'N', 'g'), '; ')"
		  . ' FROM pepsi.workqueue'));
cmp_ok($failed, '<=', 200, "only the rows in flight at the restart may fail ($failed did)");
is( scalar_query($node,
		"SELECT count(*) FROM pepsi.workqueue WHERE state->>'dispatch_error' IS NULL"),
	'0', 'each failed row has its reason in state.dispatch_error');
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher exits 0');
is(scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'"),
	'0', 'no row is left running');

done_testing();
