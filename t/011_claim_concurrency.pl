# workqueue_claim with more than one caller at once.  The dispatcher is the
# sole caller in production, but the claim must still never hand one row
# to two callers: each caller's final UPDATE re-checks that the row is
# pending, so the loser of a race gets fewer rows, never a duplicate.
use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::Bin/lib";
use PepsiTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = pepsi_node('claims', extension => 1);
$node->safe_psql('postgres', q{
	CREATE TABLE claimed (id bigint, caller int);
	SELECT count(pepsi.workqueue_add('s@example.org', '{r@example.net}', '', '', '{}',
	                                 ('10.0.' || (n % 50) || '.1')::inet, NULL, 'relay'))
	FROM generate_series(1, 6000) AS n;
});

# Eight sessions claim 25 rows at a time, 40 times each: up to 8,000 rows
# asked for 6,000 pending, so the sessions must collide on the last ones.
my ($status, $out, $err) = concurrently($node, 'postgres', 8, 40, q{
INSERT INTO claimed SELECT id, :client_id FROM pepsi.workqueue_claim('{relay}', '{25}', fifo_percent => 20);
});
is($status, 0, 'eight concurrent claimers ran') or diag($err);

is($node->safe_psql('postgres', 'SELECT count(*) - count(DISTINCT id) FROM claimed'),
	'0', 'no row was handed out twice');

# A caller that loses a race gets fewer rows than it asked for; one more
# claim takes whatever the races left, still without duplicates.
$node->safe_psql('postgres', q{
	INSERT INTO claimed SELECT id, 99 FROM pepsi.workqueue_claim('{relay}', '{10000}')});
is($node->safe_psql('postgres', 'SELECT count(*) - count(DISTINCT id) FROM claimed'),
	'0', 'still no row handed out twice');
is($node->safe_psql('postgres', 'SELECT count(*) FROM claimed'),
	'6000', 'every pending row was claimed once');
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'}),
	'6000', 'every claimed row is running');
cmp_ok($node->safe_psql('postgres', 'SELECT count(DISTINCT caller) FROM claimed'),
	'>', 1, 'the rows were shared between callers');

# Rows that become pending again after the callers' sender caches were
# built are found by the next claim.
my $reset = $node->safe_psql('postgres', q{
	WITH r AS (UPDATE pepsi.workqueue SET status = 'pending'
	           WHERE id IN (SELECT id FROM claimed WHERE caller = 0) RETURNING 1)
	SELECT count(*) FROM r});
cmp_ok($reset, '>', 0, 'some rows were put back to pending');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pepsi.workqueue_claim('{relay}', '{10000}')}),
	$reset, 'the rows put back are claimed again');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pepsi.workqueue WHERE status = 'pending'}),
	'0', 'nothing is left pending');

$node->stop;
done_testing();
