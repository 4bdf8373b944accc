# The maintenance worker names a transaction that holds back the xmin
# horizon (extension/src/maint.c): while it lasts, no dead version of a
# queue row can be removed, so after pepsi.snapshot_warning the worker logs
# a warning with its pid, program, state and statement, once per
# transaction: a read-only snapshot (a report in REPEATABLE READ) and a
# transaction that wrote and stays open alike.
use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::Bin/lib";
use PepsiTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $db = 'postgres';
my $node = pepsi_node('held_horizon', extension => 1, preload => 1,
	conf => "pepsi.snapshot_warning = 2\npepsi.maintenance_interval = 200\n");
my $worker;
poll_until(
	sub {
		$worker = $node->safe_psql($db,
			"SELECT pid FROM pg_stat_activity WHERE backend_type = 'pepsi maintenance'");
		return $worker;
	});
ok($worker, 'the maintenance worker runs');

my $warning = qr/WARNING:  pepsi maintenance: pid (\d+) \(([^,]+), ([^,]+), user \S+ from \S+\) has held back the xmin horizon for \d+ s/;

# A report's snapshot: REPEATABLE READ, idle in its transaction.
my $offset = -s $node->logfile;
my $report = $node->background_psql($db, on_error_stop => 1);
my $report_pid = $report->query_safe('SELECT pg_backend_pid()');
$report->query_safe('SET application_name = report');
$report->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$report->query_safe('SELECT count(*) FROM pepsi.workqueue');
ok( $node->wait_for_log(
		qr/\[$worker\] WARNING:  pepsi maintenance: pid $report_pid \(report, idle in transaction,/,
		$offset),
	'a snapshot held past pepsi.snapshot_warning is named, with its program and state');
like(slurp_file($node->logfile, $offset),
	qr/DETAIL:  Its last statement: SELECT count\(\*\) FROM pepsi\.workqueue/,
	'with its last statement');

# The worker keeps passing; the same transaction is not named again.
my $passes = sub {
	$node->safe_psql($db, "SELECT state_change FROM pg_stat_activity WHERE pid = $worker");
};
my $seen = $passes->();
for (1 .. 3)
{
	my $before = $seen;
	poll_until(sub { $seen = $passes->(); $seen ne $before });
}
my @warned = slurp_file($node->logfile, $offset) =~ /$warning/g;
is(scalar(@warned) / 3, 1, 'one warning per transaction, however long it lasts');

# A transaction that wrote and stays open holds its xid: named too, once
# the report is gone.
my $writer = $node->background_psql($db, on_error_stop => 1);
my $writer_pid = $writer->query_safe('SELECT pg_backend_pid()');
$writer->query_safe('BEGIN');
$writer->query_safe("INSERT INTO pepsi.workqueue_body (body) VALUES ('held')");
$report->query_safe('COMMIT');
$offset = -s $node->logfile;
ok( $node->wait_for_log(
		qr/\[$worker\] WARNING:  pepsi maintenance: pid $writer_pid \([^,]+, idle in transaction,/,
		$offset),
	'an open transaction that wrote is named once it is the oldest');
$writer->query_safe('ROLLBACK');

# Nothing held: no warning over the next passes.
$offset = -s $node->logfile;
$seen = $passes->();
for (1 .. 5)
{
	my $before = $seen;
	poll_until(sub { $seen = $passes->(); $seen ne $before });
}
unlike(slurp_file($node->logfile, $offset), $warning, 'no warning once nothing holds it back');

$report->quit;
$writer->quit;
done_testing();
