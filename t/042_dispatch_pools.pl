# pepsi-dispatch's worker pools: no worker until a stage has work; a trickle
# is packed onto one worker; a burst grows the pool to PARALLELISM and not
# beyond; idle workers are reaped after WORKER_IDLE_TIMEOUT; a worker
# recycles after MAX_MESSAGES (never handling more); and a configuration
# change (config_changed, or SIGHUP) retires the workers so that their
# replacements read the new values, while a broken change is refused and
# changes nothing; a stage removed by a reload has its pool freed.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_pools');
my $program = test_program('test-stage');
# WORKER_IDLE_TIMEOUT: short only while the reaping is tested.  Elsewhere
# a worker must outlive the test's own pauses between rows, which load
# can stretch past a couple of seconds: a worker reaped there would read
# as a second worker of the trickle, or as one a refused reload retired.
my $idle_timeout = 2;
my $idle_long = '600s';

sub stages
{
	my ($tag) = @_;

	return <<"EOF";
[stage-trickle]
PROGRAM = $program
PARALLELISM = 4
[stage-burst]
PROGRAM = $program
PARALLELISM = 3
QUEUE_LIMIT = 2
SLEEP_MS = 100
[stage-recycle]
PROGRAM = $program
PARALLELISM = 2
MAX_MESSAGES = 3
[stage-tagged]
PROGRAM = $program
TAG = $tag
EOF
}

my %dispatch = (WORKER_IDLE_TIMEOUT => $idle_long);
my $config = write_config($node, dispatch => \%dispatch, stages => stages('one'));
my $d = start_dispatcher($config);

sub done_count
{
	my ($stage) = @_;

	return scalar_query($node, "SELECT count(*) FROM test_log WHERE stage = '$stage'");
}

# The rows of a stage the dispatcher has read the worker's answer for (its
# statistics, flushed once the pipeline is idle): test_log has a row as
# soon as the worker commits, before its status line is read.
sub answered_count
{
	my ($stage) = @_;

	return scalar_query($node,
		"SELECT coalesce(sum(messages), 0) FROM pepsi.stage_stats WHERE stage = '$stage'");
}

# Rewrite the configuration with $stages and SIGHUP the dispatcher; true
# once it says it reloaded.
sub reload_with
{
	my ($stages) = @_;

	write_config($node, path => $config, dispatch => \%dispatch, stages => $stages);
	my $offset = -s $d->{log};
	kill 'HUP', $d->{pid};
	return poll_until(sub { substr(dispatcher_log($d), $offset) =~ /configuration reloaded/ });
}

sub pids_of
{
	my ($stage) = @_;

	return split /,/,
	  scalar_query($node,
		"SELECT coalesce(string_agg(DISTINCT pid::text, ','), '') FROM test_log WHERE stage = '$stage'");
}

# The dispatcher's children of a stage, told apart by pool from the log of
# the dispatcher ("stage X: started worker N").
sub workers_of
{
	my ($stage) = @_;
	my %started = map { $_ => 1 } (dispatcher_log($d) =~ /stage $stage: started worker (\d+)/g);

	return grep { $started{$_} } worker_pids($d, 'test-stage');
}

ok(poll_until(sub { dispatcher_log($d) =~ /connected to the database/ }), 'the dispatcher is up');
is(scalar(worker_pids($d)), 0, 'no worker runs before a stage has work');

#
# A trickle, one row at a time: one worker does it all.  Each row is added
# once the dispatcher has the answer for the one before: until then the
# worker still holds it, and one held long (load) counts as stalled, so
# that the next row would rightly go to a new worker.
#
for my $n (1 .. 6)
{
	add_rows($node, 1, stage => 'trickle');
	poll_until(sub { answered_count('trickle') == $n });
}
is(done_count('trickle'), 6, 'a trickle of six rows is done');
is(scalar(my @pids = pids_of('trickle')), 1, 'by a single worker, out of a PARALLELISM of 4');

#
# A burst of 60 slow rows: the pool grows to its PARALLELISM of 3 and never
# beyond, then, idle, is reaped (WORKER_IDLE_TIMEOUT short for this part).
#
$dispatch{WORKER_IDLE_TIMEOUT} = "${idle_timeout}s";
ok(reload_with(stages('one')), 'a short WORKER_IDLE_TIMEOUT is read');
add_rows($node, 60, stage => 'burst');
my $most = 0;
poll_until(
	sub {
		my $n = scalar workers_of('burst');
		$most = $n if $n > $most;
		return done_count('burst') == 60;
	},
	60);
is(done_count('burst'), 60, 'the burst of 60 rows is done');
is($most, 3, 'at most PARALLELISM workers ran at once, and it got there');
is(scalar(@pids = pids_of('burst')), 3, 'three workers did the burst');
ok(poll_until(sub { scalar(workers_of('burst')) == 0 }, 10 * $idle_timeout),
	'once idle, the workers are reaped');
like(dispatcher_log($d), qr/stage burst: worker \d+ idle; reaping it/,
	'the log says they were idle');
$dispatch{WORKER_IDLE_TIMEOUT} = $idle_long;
ok(reload_with(stages('one')), 'and a long one again');

#
# MAX_MESSAGES = 3: every worker concludes at most three rows, then is
# replaced, though the queue limit would let it take 16 at once.
#
add_rows($node, 30, stage => 'recycle');
ok(poll_until(sub { done_count('recycle') == 30 }), 'thirty rows through a stage with MAX_MESSAGES = 3');
is( scalar_query($node,
		"SELECT max(n) FROM (SELECT count(*) AS n FROM test_log WHERE stage = 'recycle' GROUP BY pid) c"),
	'3', 'no worker concluded more than MAX_MESSAGES rows');
cmp_ok(scalar(@pids = pids_of('recycle')), '>=', 10, 'so at least ten workers took turns');
ok(poll_until(sub { scalar(workers_of('recycle')) <= 2 }), 'and the recycled ones are gone');

#
# config_changed: an override retires the workers; their replacements read
# the new value.
#
my ($id) = add_rows($node, 1, stage => 'tagged');
poll_until(sub { done_count('tagged') == 1 });
my ($first) = pids_of('tagged');
is(scalar_query($node, "SELECT tag FROM test_log WHERE id = $id"), 'one', 'a worker with TAG one');
ok(grep({ $_ == $first } worker_pids($d)), 'that worker is still running, idle');

my $offset = -s $d->{log};
$node->safe_psql($db,
	"INSERT INTO pepsi.config_override (scope, section, option, value)"
	  . " VALUES ('global', 'stage-tagged', 'TAG', 'two')");
ok( poll_until(sub { substr(dispatcher_log($d), $offset) =~ /configuration reloaded/ }),
	'config_changed: the dispatcher reloads');
ok(poll_until(sub { !grep { $_ == $first } worker_pids($d) }), 'config_changed: the worker retires');
($id) = add_rows($node, 1, stage => 'tagged');
poll_until(sub { done_count('tagged') == 2 });
is( scalar_query($node, "SELECT tag || ' ' || (pid <> $first)::int FROM test_log WHERE id = $id"),
	'two 1', 'config_changed: a new worker with the new TAG takes the next row');

#
# A change that breaks the stage graph is refused: nothing is retired.
#
($first) = workers_of('tagged');
$offset = -s $d->{log};
$node->safe_psql($db,
	"INSERT INTO pepsi.config_override (scope, section, option, value)"
	  . " VALUES ('global', 'stage-tagged', 'NEXT_STAGE', 'nowhere')");
ok( poll_until(sub { substr(dispatcher_log($d), $offset) =~ /configuration not reloaded/ }),
	'a broken override is refused');
like(substr(dispatcher_log($d), $offset),
	qr/configuration not reloaded: override global: \[stage-tagged\] NEXT_STAGE names stage "nowhere", which has no \[stage-nowhere\] section/,
	'with a clear message');
ok(grep({ $_ == $first } worker_pids($d)), 'the worker was not retired');
($id) = add_rows($node, 1, stage => 'tagged');
poll_until(sub { done_count('tagged') == 3 });
is(scalar_query($node, "SELECT tag || ' ' || pid FROM test_log WHERE id = $id"),
	"two $first", 'and still takes rows, as before');

#
# SIGHUP re-reads the file: same again.
#
$node->safe_psql($db, 'DELETE FROM pepsi.config_override');
ok(poll_until(sub { !grep { $_ == $first } worker_pids($d) }),
	'removing the overrides reloads and retires too');
ok(reload_with(stages('three')), 'SIGHUP: the dispatcher reloads');
($id) = add_rows($node, 1, stage => 'tagged');
poll_until(sub { done_count('tagged') == 4 });
is(scalar_query($node, "SELECT tag FROM test_log WHERE id = $id"),
	'three', 'SIGHUP: the next row sees the TAG of the file');

#
# A stage removed by a reload: its workers retire, and once they are gone
# and its statistics flushed its pool is freed.  Put back, it starts afresh.
#
(my $without_recycle = stages('three')) =~ s/\[stage-recycle\][^[]*//;
write_config($node, path => $config, dispatch => \%dispatch, stages => $without_recycle);
$offset = -s $d->{log};
kill 'HUP', $d->{pid};
ok( poll_until(
		sub {
			substr(dispatcher_log($d), $offset)
			  =~ /stage recycle: removed from the configuration and drained; dropped/;
		}),
	'a stage removed by a reload has its pool dropped once drained');
ok(reload_with(stages('three')), 'the stage is put back');
my $recycled = done_count('recycle');
add_rows($node, 1, stage => 'recycle');
ok(poll_until(sub { done_count('recycle') == $recycled + 1 }),
	'and its new pool takes rows');

is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher exits 0');
is(scalar(worker_pids($d)), 0, 'and leaves no worker behind');

done_testing();
