# Dispatchers on several hosts share one queue ([dispatch] STAGES): each
# serves only its stages and resets only their orphaned rows at start; two
# told to serve one stage, or one serving every stage beside them, are
# refused with a line naming the stages; a standby ([dispatch] STANDBY)
# waits on the lock and takes over when the active one dies.  And the bad
# conninfos: a standby where the primary is needed, no reachable host, and
# a list whose first host is down.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
# Streaming allowed: a standby of it is made at the end.
my $node = dispatch_node('stage_sets', conf => "wal_level = replica\nmax_wal_senders = 4\n");
my $stages = real_stages();

sub config_for
{
	my ($name, %dispatch) = @_;

	return write_config($node, path => PostgreSQL::Test::Utils::tempdir() . "/$name.conf",
		stages => $stages, dispatch => \%dispatch);
}

# A configuration whose [database] CONNINFO is host=$host port=$port (write_config's form).
{
	package Conninfo;
	sub host { return $_[0]{host} }
	sub port { return $_[0]{port} }
}

sub config_with
{
	my ($name, $host, $port) = @_;

	return write_config(bless({ host => $host, port => $port }, 'Conninfo'),
		path => PostgreSQL::Test::Utils::tempdir() . "/$name.conf", stages => $stages);
}

sub running_at
{
	my ($stage) = @_;

	return scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running' AND stage = '$stage'");
}

# Rows left running by a dispatcher that died: one at init, one at drop.
my ($at_init) = add_rows($node, 1, quiet => 1);
my ($at_drop) = add_rows($node, 1, stage => 'drop', quiet => 1);
$node->safe_psql($db, "UPDATE pepsi.workqueue SET status = 'running' WHERE id IN ($at_init, $at_drop)");

# A name that is no stage is refused before anything is touched.
my $bad = start_dispatcher(config_for('bad', STAGES => 'init, rout'));
ok(defined dispatcher_exit($bad, 30) && $bad->{status} != 0, 'STAGES naming no stage: refused');
like(dispatcher_log($bad), qr/\[dispatch\] STAGES names "rout", which has no \[stage-rout\] section/,
	'naming the stage');

my $front = start_dispatcher(config_for('front', STAGES => 'init route'));
ok(poll_until(sub { dispatcher_log($front) =~ /put 1 orphaned running rows back to pending/ }),
	'the dispatcher of init and route reset its own orphan');
is(running_at('drop'), 1, 'and left the running row at drop, another set\'s, alone');
ok(poll_until(sub { scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE stage <> 'drop'") == 0 }),
	'its row went on to drop');
is(scalar_query($node, "SELECT count(*) FROM pepsi.workqueue WHERE status = 'pending'"), 1,
	'where no dispatcher serves it yet');

my $back = start_dispatcher(config_for('back', STAGES => 'stage-drop'));
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
	'the dispatcher of drop reset its orphan and the queue drained');

my @ids = add_rows($node, 20);
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
	'twenty rows pass through both dispatchers');
is(scalar_query($node, "SELECT count(DISTINCT pid) FROM pg_stat_activity WHERE application_name = 'pepsi-dispatch'"),
	2, 'two dispatchers connected');

# Split brain: a second dispatcher told it is active for route.
my $twice = start_dispatcher(config_for('twice', STAGES => 'route'));
ok(defined dispatcher_exit($twice, 30) && $twice->{status} != 0, 'a second dispatcher for route: refused');
like(dispatcher_log($twice), qr/another pepsi-dispatch already serves stage route of this one's \[dispatch\] STAGES/,
	'naming the stage it would have served twice');
my $all = start_dispatcher(config_for('all'));
ok(defined dispatcher_exit($all, 30) && $all->{status} != 0, 'a dispatcher of every stage beside them: refused');
like(dispatcher_log($all), qr/another pepsi-dispatch is already running against this database, serving all of this one's stages: refused/,
	'saying why');

# A standby of drop waits, and takes over when the active one dies.
my $standby = start_dispatcher(config_for('standby', STAGES => 'drop', STANDBY => 'yes'));
ok(poll_until(sub { dispatcher_log($standby) =~ /standby: waiting for the dispatcher lock of drop/ }),
	'the standby of drop waits');
kill 'KILL', $back->{pid};
dispatcher_exit($back, 10);
ok(poll_until(sub { dispatcher_log($standby) =~ /standby: took over drop after [\d.]+ s/ }),
	'the active one killed: the standby took over, in one line');
add_rows($node, 10);
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
	'rows pass through the dispatcher that took over');
stop_dispatcher($_) for $front, $standby;

# Following the primary: the first host of the list is down.
my $dead = PostgreSQL::Test::Cluster::get_free_port();
my $d = start_dispatcher(config_with('listed', '127.0.0.1,' . $node->host, "$dead," . $node->port));
add_rows($node, 5);
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }),
	'a conninfo whose first host is down: the next one serves');
stop_dispatcher($d);

# No reachable host: a clear line, and it keeps trying.
$d = start_dispatcher(config_with('none', '127.0.0.1,127.0.0.1', "$dead,$dead"));
ok(poll_until(sub { dispatcher_log($d) =~ /cannot connect to the database .*Connection refused.*; trying again in/ }),
	'no reachable host: the line says so');
ok(!defined dispatcher_exit($d, 0), 'and the dispatcher waits for one');
stop_dispatcher($d);

# A standby where the primary is needed.
$node->append_conf('pg_hba.conf', "local replication all trust\n");
$node->reload;
$node->backup('b');
my $replica = PostgreSQL::Test::Cluster->new('stage_sets_standby');
$replica->init_from_backup($node, 'b', has_streaming => 1);
$replica->start;
my $on_standby = write_config($replica, path => PostgreSQL::Test::Utils::tempdir() . '/standby.conf', stages => $stages);
$d = start_dispatcher($on_standby);
ok(poll_until(sub { dispatcher_log($d) =~ /cannot connect to the database .*read-only.*a standby answered where the primary is needed/ }),
	'a standby given as the primary: refused, naming the problem');
ok(!defined dispatcher_exit($d, 0), 'the dispatcher waits for a primary');
stop_dispatcher($d);
$d = start_dispatcher(config_with('any', $replica->host, $replica->port . ' target_session_attrs=any'));
ok(poll_until(sub { dispatcher_log($d) =~ /cannot connect to the database .*the server is a standby \(in recovery\)/ }),
	'also with target_session_attrs=any');
stop_dispatcher($d);

# pepsi-status may read from the standby ([database] MONITOR_CONNINFO) and shows the lag.
my $monitor = write_config($node, path => PostgreSQL::Test::Utils::tempdir() . '/monitor.conf', stages => $stages);
PostgreSQL::Test::Utils::append_to_file($monitor, "[database]\nMONITOR_CONNINFO = host=" . $replica->host
	  . ' port=' . $replica->port . " dbname=$db\n");
my ($out, $err) = ('', '');
IPC::Run::run([ pepsi_bin('pepsi-status'), '-C', $monitor ], '>', \$out, '2>', \$err);
is($?, 0, 'pepsi-status reads from a standby') or diag($err);
like($out, qr/replication lag/, 'and shows the replication lag');

done_testing();
