# workqueue_claim when its sender cache is wrong.  The cache (sendercache.c)
# is only a guide to the fair picks: rows it never saw must still be
# claimed in the next claim that has room for them, and a sequence reset
# must make it rebuild at once rather than at its periodic rebuild.
use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::Bin/lib";
use PepsiTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $node = pepsi_node('claim_cache', extension => 1);

# One long-lived session, as the dispatcher's: its sender cache lives as
# long as it does.
my $claimer = $node->background_psql('postgres');

# Claim in the claimer's session; returns "sender=count ..." of the rows.
my $claimed_at = 0;
sub claim
{
	my ($capacity, %opts) = @_;
	my $fifo = $opts{fifo} // 0;
	my $account = $opts{account} // 'NULL, NULL, NULL';

	my $got = $claimer->query_safe(
		"SELECT coalesce(string_agg(sender_key || '=' || n, ' ' ORDER BY sender_key), '')"
		  . " FROM (SELECT sender_key, count(*) AS n FROM pepsi.workqueue_claim("
		  . "'{relay}', '{$capacity}', $account, $fifo) GROUP BY sender_key) c");
	$claimed_at = time;
	return $got;
}

# The cache rescans at a claim at most once a second
# (SENDER_CACHE_RESCAN_MS): poll until the next claim's is due, a second
# after the last claim returned (the rescan, if any, came before).
sub rescan_due
{
	my $due = $claimed_at + 1.05;
	poll_until(sub { time >= $due }, 5);
}

#
# Rows committed after the cache's rescan window: sender B's rows draw
# their pending_seq in a transaction that stays open while A's later rows
# are read and the rescan passes them by.  They are invisible to the cache
# (until its periodic rebuild, 30 s on), yet the next claim with room
# takes them, with no FIFO share to reach them either.
#
$node->safe_psql('postgres', admit_sql(20, '10.0.0.1'));
is(claim(10), 'ip:10.0.0.1=10', 'the first claim builds the cache and takes A\'s rows');

my $hider = $node->background_psql('postgres');
$hider->query_safe('BEGIN');
$hider->query_safe(admit_sql(15, '10.0.0.2'));

# A's later rows move the watermark past B's; two rescans a second apart
# move the rescan window past them too.
$node->safe_psql('postgres', admit_sql(20, '10.0.0.1'));
is(claim(5), 'ip:10.0.0.1=5', 'A is served while B\'s transaction is open');
for (1 .. 2)
{
	rescan_due();
	is(claim(1), 'ip:10.0.0.1=1', 'the rescan passes B\'s uncommitted rows by');
}
$hider->query_safe('COMMIT');
$hider->quit;

is(claim(1000), 'ip:10.0.0.1=23 ip:10.0.0.2=15',
	'the next claim takes every pending row, B\'s as well as A\'s');
is($node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue WHERE status = 'pending'"),
	'0', 'no pending row is left behind');

#
# The same, with a transaction open for longer than a rescan, while A has
# more rows waiting than a claim takes: the first rescan after the commit
# must find E's rows (it reads from before the oldest transaction the
# previous rescan could not see), so that the fair picks serve E within a
# second, rather than the FIFO share after every older row of A.
#
$node->safe_psql('postgres', admit_sql(10, '10.0.0.1'));
is(claim(2), 'ip:10.0.0.1=2', 'A is served');
$hider = $node->background_psql('postgres');
$hider->query_safe('BEGIN');
$hider->query_safe(admit_sql(3, '10.0.0.5'));
$node->safe_psql('postgres', admit_sql(200, '10.0.0.1'));
for (1 .. 2)
{
	rescan_due();
	is(claim(1), 'ip:10.0.0.1=1', 'the rescans pass E\'s uncommitted rows by');
}
$hider->query_safe('COMMIT');
$hider->quit;
rescan_due();
is( claim(6,
		account => q{'{relay}'::text[], '{ip:10.0.0.1}'::text[], '{1000000}'::float8[]}),
	'ip:10.0.0.1=3 ip:10.0.0.5=3',
	'a second after the commit, the fair picks serve E before A\'s older rows');
$node->safe_psql('postgres', "DELETE FROM pepsi.workqueue");

#
# TRUNCATE ... RESTART IDENTITY takes pepsi.pending_seq back below the
# cache's watermark, so the rows admitted next are below it too and its
# incremental read never sees them.  The cache must notice at the next
# claim and rebuild: a light sender C whose rows arrived after a heavy
# sender D's is then a fair candidate and gets its share of a claim too
# small for D's rows alone.  With the cache still trusted, C would be
# reached only after every older row of D.
#
$node->safe_psql('postgres', admit_sql(300, '10.0.0.9'));
is(claim(1000), 'ip:10.0.0.9=300', 'the watermark moves up');
$node->safe_psql('postgres',
	'TRUNCATE pepsi.workqueue, pepsi.workqueue_body RESTART IDENTITY');
$node->safe_psql('postgres', admit_sql(200, '10.0.0.4') . '; ' . admit_sql(3, '10.0.0.3'));
is( claim(10,
		account => q{'{relay}'::text[], '{ip:10.0.0.4}'::text[], '{1000000}'::float8[]}),
	'ip:10.0.0.3=3 ip:10.0.0.4=7',
	'after a sequence reset the light sender is served in the first claim');

$claimer->quit;
$node->stop;
done_testing();
