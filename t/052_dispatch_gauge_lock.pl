# The one-dispatcher lock and the queue gauges' refresh are different
# locks.  They once shared an advisory key: a dispatcher starting while the
# maintenance worker refreshed the gauges (every pass, each second) found
# the key taken and exited as if another dispatcher ran, and no refresh
# could run while a dispatcher held it.  Here a refresh holds its lock
# while a dispatcher starts, which must start and deliver, and a refresh
# made while the dispatcher runs must count.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_gauge_lock');
my $program = test_program('test-stage');
my $config = write_config($node, stages => "[stage-w]\nPROGRAM = $program\n");

# A gauge refresh in progress: its transaction holds the refresh lock.
my $refresh = $node->background_psql($db);
$refresh->query_safe('BEGIN');
is($refresh->query_safe('SELECT pepsi.queue_gauge_refresh(true)'), 't',
	'a gauge refresh runs and holds its lock');

my $d = start_dispatcher($config);
ok(poll_until(sub { dispatcher_log($d) =~ /connected to the database/ }),
	'a dispatcher starts while the refresh holds its lock');
my ($id) = add_rows($node, 1, stage => 'w');
ok(poll_until(sub { scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $id") == 1 }),
	'and delivers');
is(dispatcher_exit($d), undef, 'it is still running');
$refresh->query_safe('COMMIT');
$refresh->quit;

# While the dispatcher holds its lock, a refresh still counts.
add_rows($node, 3, stage => 'nowhere', quiet => 1);
is(scalar_query($node, 'SELECT pepsi.queue_gauge_refresh(true)'), 't',
	'a refresh while the dispatcher runs takes its own lock');
is(scalar_query($node,
		"SELECT messages FROM pepsi.queue_gauge WHERE stage = 'nowhere' AND status = 'pending'"),
	3, 'and counts the queue');
is(stop_dispatcher($d), 0, 'the dispatcher stops');

done_testing();
