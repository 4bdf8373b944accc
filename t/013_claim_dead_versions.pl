# workqueue_claim while a snapshot held elsewhere keeps the queue's dead
# row versions: every row that left the stage leaves an index entry at its
# head which no scan may mark dead while the snapshot lasts.  The claim's
# reads start at the stage's floor (sendercache.c), so one claim walks the
# rows in reach and not every row that passed through the stage since the
# snapshot was taken (but for one claim every few seconds, which reads
# from 0); the count is taken from the indexes' own statistics (entries
# returned to the scans), not from timings.
use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::Bin/lib";
use PepsiTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = pepsi_node('claim_dead_versions', extension => 1);

# The dispatcher's long-lived session.
my $claimer = $node->background_psql('postgres');

sub claim
{
	my ($capacity) = @_;

	return $claimer->query_safe(
		"SELECT coalesce(string_agg(sender_key || '=' || n, ' ' ORDER BY sender_key), '')"
		  . " FROM (SELECT sender_key, count(*) AS n FROM pepsi.workqueue_claim("
		  . "'{relay}', '{$capacity}', NULL, NULL, NULL, 0) GROUP BY sender_key) c");
}

# Index entries the claimer's backend has had returned by scans of the
# queue's pending indexes (pg_stat_get_xact_tuples_returned: an entry
# counts whether or not its row is still visible; one marked dead is
# skipped inside the index and not returned).
my $entries_sql =
  "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid)) FROM pg_class c"
  . " WHERE c.relname IN ('workqueue_pending_fifo', 'workqueue_pending_sender')"
  . " AND c.relnamespace = 'pepsi'::regnamespace";

# Entries one claim of $capacity walks, in its own transaction.
sub claim_cost
{
	my ($capacity) = @_;

	$claimer->query_safe('BEGIN');
	my $before = $claimer->query_safe($entries_sql);
	my $claimed = claim($capacity);
	my $after = $claimer->query_safe($entries_sql);
	$claimer->query_safe('COMMIT');
	return ($claimed, $after - $before);
}

$node->safe_psql('postgres', admit_sql(1500, '10.0.0.1'));
is(claim(10), 'ip:10.0.0.1=10', 'the first claim builds the sender cache');
$node->safe_psql('postgres', "DELETE FROM pepsi.workqueue WHERE status = 'running'");

# A report's snapshot, as a REPEATABLE READ transaction that stays open.
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
is($holder->query_safe('SELECT count(*) FROM pepsi.workqueue'), '1490', 'the snapshot is taken');

# 1,400 rows pass through the stage and leave it, as the workers would
# finish them: 1,400 dead versions no scan may mark while the snapshot
# lasts, all at the head of the stage.
for (1 .. 14)
{
	is(claim(100), 'ip:10.0.0.1=100', 'a claim takes the oldest rows');
	$node->safe_psql('postgres', "DELETE FROM pepsi.workqueue WHERE status = 'running'");
}
$node->safe_psql('postgres', admit_sql(20, '10.0.0.2'));

# Fair claims: the window of the oldest rows, and the senders' reads.  One
# claim in SENDER_CACHE_FLOOR_RECHECK_MS (5 s) reads from 0 again, so of a
# few claims in a row at most one walks the dead versions.
my @walks;
my $served = '';
for (1 .. 4)
{
	my ($claimed, $walked) = claim_cost(10);
	push @walks, $walked;
	$served .= " $claimed";
}
like($served, qr/ip:10\.0\.0\.2=/, 'the claims serve the light sender too');
cmp_ok(scalar(grep { $_ >= 300 } @walks), '<=', 1,
	"the claims walk the rows in reach, not the 1,400 dead versions behind them each time (@walks entries)");
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL"
		  . " AND query LIKE 'SELECT count(*) FROM pepsi.workqueue%'"),
	'1', 'the snapshot was held all along');

# Every remaining row is still reached, in order, while the snapshot lasts.
$node->safe_psql('postgres', "DELETE FROM pepsi.workqueue WHERE status = 'running'");
my $left = $node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue WHERE status = 'pending'");
my ($claimed) = claim_cost(1000);
my $total = 0;
$total += $_ for $claimed =~ /=(\d+)/g;
is($total, $left, 'a claim with room for all takes every pending row');

$holder->query_safe('COMMIT');
$holder->quit;
$claimer->quit;
done_testing();
