# The plans of workqueue_claim's statements once the table's statistics
# describe a queue in the middle of a burst: rows that moved on to later
# stages drew new pending_seq values interleaved with the new arrivals,
# and ANALYZE then sees the stages mixed on the pages.  The planner's
# estimate of the rows of a stage past a given pending_seq is then far too
# high (it cannot know that the highest values belong to other stages),
# and with a plan that can trade the ordered index scan for a bitmap heap
# scan and a sort it did: the claim's read of the arrivals became a sort
# of every matching row, through whichever index, and a bitmap scan never
# marks the dead entries it passes, so every later claim walked them all
# again until a vacuum removed them.  The claim's statements must keep
# reading the stage's pending rows in order through their indexes, so a
# claim's work is bounded by the rows it reads whatever the statistics.
# auto_explain logs the plan of each statement the claim runs.
use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::Bin/lib";
use PepsiTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = pepsi_node('claim_plans', extension => 1);

# A burst and a few light senders at relay; 60% of the burst then moves
# on to the later stages as the workers would send it (a new stage, a new
# pending_seq, a new row version wherever the page has room), and
# autovacuum's ANALYZE sees that.
$node->safe_psql('postgres', admit_sql(6000, '10.0.0.1'));
$node->safe_psql('postgres', admit_sql(3, "10.0.1.$_")) for 1 .. 10;
$node->safe_psql('postgres',
	"UPDATE pepsi.workqueue SET stage = (ARRAY['forward', 'vacation', 'maildir'])[1 + id % 3],"
	  . " pending_seq = nextval('pepsi.pending_seq')"
	  . " WHERE id IN (SELECT id FROM pepsi.workqueue ORDER BY pending_seq LIMIT 3600)");
$node->safe_psql('postgres', 'VACUUM ANALYZE pepsi.workqueue');

# The dispatcher's session, with every plan its statements run logged.
my $claimer = $node->background_psql('postgres');
$claimer->query_safe("LOAD 'auto_explain'");
$claimer->query_safe("SET auto_explain.log_min_duration = 0");
$claimer->query_safe("SET auto_explain.log_nested_statements = on");
my $pid = $claimer->query_safe('SELECT pg_backend_pid()');

sub claim
{
	my ($capacity) = @_;

	return $claimer->query_safe("SELECT count(*) FROM pepsi.workqueue_claim('{relay}', '{$capacity}')");
}

my $offset = -s $node->logfile;
is(claim(10), '10', 'the first claim (the sender cache\'s rebuild) takes 10 rows');
# Arrivals since that claim, read by each of the next ones (the first
# five runs of a kept statement are planned for their parameters).
for my $round (1 .. 6)
{
	$node->safe_psql('postgres', admit_sql(50, '10.0.0.1'));
	$node->safe_psql('postgres', admit_sql(1, "10.0.1.$round"));
	is(claim(10), '10', "claim $round after new arrivals takes 10 rows");
}
my $log = slurp_file($node->logfile, $offset);

# The plans the claimer's backend logged, one per statement.
my @plans = grep { /Query Text:/ } split /^\S.*?\[$pid\][^\n]*?LOG:\s+duration: /m, $log;
my @arrivals = grep { /Query Text: SELECT sender_key, min\(pending_seq\)/ } @plans;
my @windows = grep { /Query Text: SELECT id, sender_key, pending_seq FROM pepsi\.workqueue/ } @plans;
cmp_ok(scalar(@arrivals), '>=', 6, 'the claims read the arrivals (' . scalar(@arrivals) . ' plans logged)');
cmp_ok(scalar(@windows), '>=', 7, 'the claims read their window (' . scalar(@windows) . ' plans logged)');

my @unordered = grep { /Bitmap Heap Scan on workqueue|Sort Key:|Seq Scan on workqueue/ } @plans;
is(scalar(@unordered), 0, 'no statement of the claim reads the queue unordered or sorts its rows')
  or diag($unordered[0]);
is(scalar(grep { !/Index Scan using workqueue_pending_fifo on workqueue/ } @arrivals, @windows), 0,
	'the arrivals and the window are read in order through workqueue_pending_fifo');

# The light senders' rows are not in the window (the burst's are older):
# each is read through workqueue_pending_sender, its own rows in order.
# Through workqueue_pending_fifo, with a filter on the sender, the read
# walked every row of the stage from the floor, the burst's included.
my @senders = grep { /Query Text: SELECT s\.n::int4, w\.id, w\.pending_seq/ } @plans;
cmp_ok(scalar(@senders), '>=', 6, 'the claims read the light senders\' rows (' . scalar(@senders) . ' plans logged)');
is(scalar(grep { !/Index Scan using workqueue_pending_sender on workqueue/ || /workqueue_pending_fifo/ } @senders),
	0, 'each sender\'s rows are read through workqueue_pending_sender')
  or diag((grep { /workqueue_pending_fifo/ } @senders)[0]);

# The claim with tokens sets each row's digest from an array beside the
# ids (claim_token.c): its UPDATE joins the two unnested and must reach
# each row by primary key, never scan the queue to hash-join it, in the
# plans made for its parameters and in the generic one after them.
$offset = -s $node->logfile;
for my $round (1 .. 7)
{
	$node->safe_psql('postgres', admit_sql(10, "10.0.2.$round"));
	is( $claimer->query_safe(
			"SELECT count(DISTINCT claim_token) FROM pepsi.workqueue_claim_tokens('{relay}', '{10}')"),
		'10',
		"token claim $round takes 10 rows, each with a token of its own");
}
$log = slurp_file($node->logfile, $offset);
my @marks = grep { /Query Text: UPDATE pepsi\.workqueue w SET status = 'running', claim_digest = u\.digest/ }
  split /^\S.*?\[$pid\][^\n]*?LOG:\s+duration: /m, $log;
is(scalar(@marks), 7, 'each token claim set its rows running in one UPDATE');
is(scalar(grep { !/Index Scan using workqueue_pkey on workqueue/ || /Seq Scan on workqueue|Hash Join/ } @marks),
	0, 'which reaches each row through the primary key')
  or diag((grep { !/workqueue_pkey/ || /Seq Scan on workqueue|Hash Join/ } @marks)[0]);

$claimer->quit;
done_testing();
