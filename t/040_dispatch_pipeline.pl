# pepsi-dispatch: rows flow through a three-stage pipeline to the end, with
# the real if, route and discard stages and with test workers that record
# every row they conclude; the statistics it flushes match what was
# processed; with the multi-call binary the stages fuse and the fused hops
# are counted.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_pipeline');
my $rows = 300;

#
# The real stages: if -> route -> discard, standalone builds.
#
my $real_stages = real_stages();
my $config = write_config($node, stages => $real_stages);
my $d = start_dispatcher($config);

add_rows($node, $rows);
# (The polls' bounds only say when to give up: 300 rows through three
# stages took more than the common 30 s on a machine loaded many times
# over.)
ok(poll_until(sub { queue_count($node) == 0 }, 120), "all $rows rows went through init, route and drop");
ok(poll_until(sub { dispatcher_log($d) =~ /stage drop: started worker/ }),
	'the dispatcher started workers for the last stage');
is(stop_dispatcher($d, 'TERM'), 0, 'SIGTERM: the dispatcher exits 0');
is( scalar_query($node,
		"SELECT string_agg(stage || '=' || messages, ' ' ORDER BY stage) FROM pepsi.stage_stats"),
	"drop=$rows init=$rows route=$rows",
	'stage_stats counts every row once at each stage');
is( scalar_query($node,
		'SELECT stages_run || \' \' || messages_failed FROM pepsi.dispatch_stats'),
	3 * $rows . ' 0',
	'dispatch_stats counts three stage runs per row and no failure');
is( scalar_query($node,
		"SELECT bool_and(processing_time > '0') AND bool_and(kills + timeouts + crashes = 0)"
		  . ' FROM pepsi.stage_stats'),
	't',
	'every stage has processing time and no kill, timeout or crash');
unlike(dispatcher_log($d), qr/failed|cannot|lost/, 'nothing went wrong in the log');

#
# Rows admitted without a NOTIFY (as workqueue_add leaves them) are found
# by the POLL_INTERVAL heartbeat (1 s).  Without it they would never go,
# so the poll's bound only says when to give up, and the new dispatcher
# starts a worker of each of the three stages for them: a build under the
# sanitizers on a loaded machine took more than the 10 s this poll once
# allowed.
#
$d = start_dispatcher($config);
ok(poll_until(sub { dispatcher_log($d) =~ /connected to the database/ }), 'a dispatcher is up again');
add_rows($node, 10, quiet => 1);
ok(poll_until(sub { queue_count($node) == 0 }, 60), 'rows admitted without a NOTIFY go through too');
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher exits 0');

#
# Test workers that record each row: a -> b -> c, so the log shows every
# row concluded once at each stage, in stage order.
#
$node->safe_psql($db, 'TRUNCATE pepsi.stage_stats; UPDATE pepsi.dispatch_stats'
	  . ' SET stages_run = 0, messages = 0, messages_failed = 0');
my $program = test_program('test-stage');
$config = write_config($node, stages => <<"EOF");
[stage-a]
PROGRAM = $program
NEXT_STAGE = b
QUEUE_LIMIT = 4
[stage-b]
PROGRAM = $program
NEXT_STAGE = c
QUEUE_LIMIT = 4
[stage-c]
PROGRAM = $program
QUEUE_LIMIT = 4
EOF
$d = start_dispatcher($config);
my @ids = add_rows($node, 100, stage => 'a');
ok(poll_until(sub { queue_count($node) == 0 }), 'all 100 rows went through a, b and c');
is( scalar_query($node,
		"SELECT count(*) FROM (SELECT id, string_agg(stage, '' ORDER BY seq) AS path"
		  . ' FROM test_log GROUP BY id) p'
		  . " WHERE path = 'abc' AND id BETWEEN $ids[0] AND $ids[-1]"),
	'100', 'each row was concluded once at a, then b, then c');
# The idle flush comes 0.2 s after the last answer: wait for it, then stop.
ok( poll_until(sub { scalar_query($node, 'SELECT coalesce(sum(messages), 0) FROM pepsi.stage_stats') == 300 }),
	'the statistics are flushed once the pipeline is idle');
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher exits 0');
is( scalar_query($node,
		"SELECT string_agg(stage || '=' || messages, ' ' ORDER BY stage) FROM pepsi.stage_stats"),
	'a=100 b=100 c=100',
	'stage_stats match the rows the workers concluded, and nothing was counted twice');

#
# The multi-call binary: the workers are the same binary, so if, route
# and discard fuse into one pass and only init's pool is fed.
#
SKIP:
{
	my $multicall = pepsi_bin('pepsi');
	skip 'the multi-call binary is not built', 4 unless -x $multicall;

	$node->safe_psql($db, 'TRUNCATE pepsi.stage_stats; UPDATE pepsi.dispatch_stats'
		  . ' SET stages_run = 0, messages = 0, messages_failed = 0');
	$config = write_config($node, stages => $real_stages);
	$d = start_dispatcher($config, program => [ $multicall, 'pepsi-dispatch' ]);
	add_rows($node, $rows);
	ok(poll_until(sub { queue_count($node) == 0 }), "multi-call: all $rows rows went through");
	is(stop_dispatcher($d, 'TERM'), 0, 'multi-call: the dispatcher exits 0');
	is( scalar_query($node,
			"SELECT string_agg(stage || '=' || messages || '/' || fused_hops, ' ' ORDER BY stage)"
			  . ' FROM pepsi.stage_stats'),
		"drop=$rows/0 init=$rows/" . 2 * $rows . " route=$rows/0",
		'the fused hops are counted at the stage whose pass ran them, the messages at each stage');
	unlike(dispatcher_log($d), qr/stage (?:route|drop): started worker/,
		'no worker was started for the fused stages');
}

done_testing();
