# The one timer (pepsi.schedule, run by the maintenance worker): a row fires
# at its time, once per period (periods below a second here), keeps its
# phase, and survives a restart of the server without firing again for
# the periods it was down; a one-shot row calling an allow-listed function
# (the failure bouncer) fires once; the administration functions refuse bad
# rows with the reason, log what they do in pepsi.event_log, and are
# pepsi_config's, not pepsi_monitor's.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes ();

use PepsiTest;

my $db = 'postgres';
my $node = pepsi_node('schedule', extension => 1, preload => 1,
	conf => "pepsi.database = '$db'\npepsi.maintenance_interval = '100ms'\n");
$node->safe_psql($db, q{
	CREATE ROLE operator LOGIN IN ROLE pepsi_config;
	CREATE ROLE watcher LOGIN IN ROLE pepsi_monitor;
});
ok(wait_until($node, $db, "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'pepsi maintenance'"),
	'the maintenance worker runs');

sub sql { return $node->safe_psql($db, shift); }

# The rows the "tick" schedule injected: their state.schedule.due times in
# microseconds since the epoch, in order.
sub tick_dues
{
	my $out = sql(q{SELECT string_agg((extract(epoch FROM (state #>> '{schedule,due}')::timestamptz)
	                                    * 1000000)::bigint::text, ' ' ORDER BY id)
	               FROM pepsi.workqueue WHERE stage = 'scheduled' AND state #>> '{schedule,name}' = 'tick'});
	return split / /, $out // '';
}

# The period, in microseconds.
my $period_us = 300_000;

#
# An inject row every 300 ms, first 500 ms from now, as the operator.
#
my ($rc, $out, $err) = $node->psql($db,
	"SET ROLE operator; SELECT pepsi.schedule_add('tick', clock_timestamp() + interval '500 ms',"
	  . " interval '300 ms', stage => 'scheduled', rcpt_to => ARRAY['postmaster\@example.org'],"
	  . " arguments => '{\"report\": \"test\"}')");
is($rc, 0, 'pepsi_config adds a schedule') or diag $err;
my $added = sql("SELECT (extract(epoch FROM (detail ->> 'run_at')::timestamptz) * 1000000)::bigint"
	  . " FROM pepsi.event_log WHERE action = 'schedule_add'");
is(sql("SELECT principal || '|' || (detail ->> 'stage') FROM pepsi.event_log WHERE action = 'schedule_add'"),
	'operator|scheduled', 'the addition is in pepsi.event_log, with the operator as principal');

ok(poll_until(sub { scalar(tick_dues()) >= 4 }, 30), 'the schedule fires again and again');
my @dues = tick_dues();
is($dues[0], $added, 'the first row is for the first time');
# A pass later than a whole period (a loaded machine) skips that period
# rather than firing twice for it; so: each in the phase, each later than
# the one before.
is(scalar(grep { ($dues[$_] - $dues[0]) % $period_us != 0 } 0 .. $#dues), 0,
	'each row is for a time of the schedule: the first plus whole periods');
is(scalar(grep { $dues[$_] <= $dues[ $_ - 1 ] } 1 .. $#dues), 0, 'each for a later period: none twice');
is(sql(q{SELECT count(*) FROM pepsi.workqueue WHERE stage = 'scheduled'
         AND received_at < (state #>> '{schedule,due}')::timestamptz}), '0',
	'no row is injected before its time');
is(sql(q{SELECT string_agg(DISTINCT format('%s|%s|%s|%s', status, mail_from, array_to_string(rcpt_to, ','),
                                             state ->> 'report'), ' ')
         FROM pepsi.workqueue WHERE stage = 'scheduled'}),
	'pending||postmaster@example.org|test',
	'each is a pending row at the stage, from the null sender, to the recipients, with the arguments');
my $runs = sql("SELECT runs FROM pepsi.schedule WHERE name = 'tick'");
cmp_ok($runs, '>=', scalar(@dues), 'runs counts the firings');
like(sql("SELECT last_outcome FROM pepsi.schedule WHERE name = 'tick'"), qr/^ok: row \d+ at scheduled$/,
	'last_outcome says what the last firing did');

#
# A restart: the row is still there, keeps its phase, and the periods the
# server was down for are one firing, not a burst.
#
$node->stop;
my $down_from = int(Time::HiRes::time() * 1_000_000);
sleep 1;    # not a synchronisation: the server stays down for a few periods
$node->start;
my $up_at = int(Time::HiRes::time() * 1_000_000);
my $before = scalar(tick_dues());
ok(poll_until(sub { scalar(tick_dues()) >= $before + 3 }, 30), 'after a restart the schedule fires again');
@dues = tick_dues();
my @steps = map { ($dues[$_] - $dues[0]) / $period_us } 0 .. $#dues;
is(scalar(grep { $_ != int($_) } @steps), 0, 'every firing is still in the first one\'s phase');
my %seen;
is(scalar(grep { $seen{$_}++ } @dues), 0, 'no period fired twice');
cmp_ok(scalar(grep { $_ > $down_from && $_ < $up_at } @dues), '<=', 1,
	'the periods the server was down for fire once at most, not in a burst on start');
cmp_ok(scalar(@dues), '<', ($dues[-1] - $dues[0]) / $period_us,
	'so there are fewer rows than periods since the first');

#
# A one-shot call of the failure bouncer: an old failed row is bounced, a
# young one left, and the row stays with next_run infinity.
#
my $old = sql("SELECT pepsi.workqueue_add('alice\@example.org', ARRAY['bob\@example.net'],"
	  . " convert_to('Subject: old', 'UTF8'), convert_to('hi', 'UTF8'), stage => 'relay')");
my $young = sql("SELECT pepsi.workqueue_add('carol\@example.org', ARRAY['dan\@example.net'],"
	  . " convert_to('Subject: young', 'UTF8'), convert_to('hi', 'UTF8'), stage => 'relay')");
sql("UPDATE pepsi.workqueue SET status = 'failed', state = '{\"last_error\": \"550 5.1.1 no such user\"}'"
	  . " WHERE id IN ($old, $young)");
sql("UPDATE pepsi.workqueue SET received_at = now() - interval '2 hours' WHERE id = $old");
($rc, $out, $err) = $node->psql($db,
	"SET ROLE operator; SELECT pepsi.schedule_add('bouncer', clock_timestamp() + interval '200 ms',"
	  . " function_name => 'failure_bounce', arguments => '{\"older_than\": \"1 hour\"}')");
is($rc, 0, 'a one-shot call of failure_bounce is added') or diag $err;
ok(wait_until($node, $db, "SELECT runs = 1 FROM pepsi.schedule WHERE name = 'bouncer'"), 'it fires');
is(sql("SELECT stage || '|' || status || '|' || (state #>> '{bounce,source}') FROM pepsi.workqueue WHERE id = $old"),
	'bounce|pending|failure-bouncer', 'the old failed row went to the bounce stage');
is(sql("SELECT stage || '|' || status FROM pepsi.workqueue WHERE id = $young"), 'relay|failed',
	'the young one is left');
is(sql("SELECT next_run || '|' || last_outcome FROM pepsi.schedule WHERE name = 'bouncer'"),
	'infinity|ok: 1 bounced, 0 deleted', 'the one-shot row keeps its record and will not fire again');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'queue_bounce' AND detail -> 'ids' = '[$old]'"),
	'1', 'the bounce is in the audit log as pepsi-queue\'s would be');

#
# Bad rows are refused with the reason; pepsi_monitor may only look.
#
my @refusals = (
	[ "SELECT pepsi.schedule_add('evil', now(), function_name => 'pg_terminate_backend')",
		qr/a schedule may not call "pg_terminate_backend".*The functions a schedule may call: failure_bounce/s,
		'a function off the allow-list' ],
	[ "SELECT pepsi.schedule_add('x', now(), function_name => 'failure_bounce', arguments => '{\"older_than\": \"soon\"}')",
		qr/older_than is not an interval: "soon"/, 'an argument of the wrong type' ],
	[ "SELECT pepsi.schedule_add('x', now(), function_name => 'failure_bounce', arguments => '{\"older_than\": \"1h\", \"rm\": 1}')",
		qr/failure_bounce takes no argument rm/, 'an unknown argument' ],
	[ "SELECT pepsi.schedule_add('x', now(), stage => 'report')",
		qr/needs its recipients/, 'an inject without recipients' ],
	[ "SELECT pepsi.schedule_add('x', now(), stage => 'report', rcpt_to => '{a\@b.c}', function_name => 'failure_bounce')",
		qr/either a stage to inject a row at or a function to call/, 'both a stage and a function' ],
	[ "SELECT pepsi.schedule_add('x', now(), interval '-1 s', stage => 'report', rcpt_to => '{a\@b.c}')",
		qr/every must be a positive interval/, 'a negative period' ],
	[ "SELECT pepsi.schedule_add('Bad Name', now(), stage => 'report', rcpt_to => '{a\@b.c}')",
		qr/invalid schedule name "Bad Name"/, 'a malformed name' ],
	[ "SELECT pepsi.schedule_add('tick', now(), stage => 'report', rcpt_to => '{a\@b.c}')",
		qr/schedule "tick" exists already/, 'a name taken' ],
);
my $events = sql('SELECT count(*) FROM pepsi.event_log');
for my $r (@refusals)
{
	($rc, $out, $err) = $node->psql($db, "SET ROLE operator; $r->[0]");
	isnt($rc, 0, "refused: $r->[2]");
	like($err, $r->[1], '... with the reason');
}
is(sql("SELECT count(*) FROM pepsi.schedule"), '2', 'no refused row was stored');
is(sql('SELECT count(*) FROM pepsi.event_log'), $events, 'and none was logged');
($rc, $out, $err) = $node->psql($db,
	"SET ROLE watcher; SELECT pepsi.schedule_add('w', now(), stage => 'x', rcpt_to => '{a\@b.c}')");
like($err, qr/permission denied for function schedule_add/, 'pepsi_monitor may not add a schedule');
($rc, $out, $err) = $node->psql($db, "SET ROLE watcher; SELECT name FROM pepsi.schedule_list() ORDER BY 1");
is($out, "bouncer\ntick", 'but may list them');
($rc, $out, $err) = $node->psql($db, "SET ROLE operator; INSERT INTO pepsi.schedule (name, action, function_name, next_run)"
	  . " VALUES ('raw', 'call', 'pg_terminate_backend', now())");
like($err, qr/permission denied for table schedule/, 'no role writes the table but through the functions');

($rc, $out, $err) = $node->psql($db, "SET ROLE operator; SELECT pepsi.schedule_remove('tick')");
is($out, 't', 'remove says it removed the row');
my $count = scalar(tick_dues());
is(sql("SELECT detail ->> 'name' FROM pepsi.event_log WHERE action = 'schedule_remove'"), 'tick', 'logged');
# Three periods' worth of passes (the worker wakes at least every 100 ms).
my $pass = sql("SELECT state_change FROM pg_stat_activity WHERE backend_type = 'pepsi maintenance'");
ok(wait_until($node, $db, "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'pepsi maintenance'"
	  . " AND state = 'idle' AND state_change > '$pass'::timestamptz + interval '900 ms'"),
	'the worker has run passes for three periods since');
is(scalar(tick_dues()), $count, 'a removed schedule fires no more');

my $log = log_since($node, 0);
unlike($log, qr/background worker "pepsi maintenance".*exited/, 'the worker never exited');

done_testing();
