# Shared message bodies under concurrency (extension/src/body.c): a message
# fanned out one recipient per row keeps one body for all its siblings.
# Many sessions finishing or rewriting siblings at once must never free a
# body a row still references, and whatever a release race leaves behind
# must be swept by workqueue_body_gc(): no body leaks for good.
#
# No maintenance worker runs here (pepsi is not preloaded), so every sweep
# is the test's own.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $db = 'postgres';
my $clients = 8;
my $recipients = 200;
my $survivors = $clients;    # the last siblings, finished all at once

my $node = pepsi_node('bodies', extension => 1);
$node->safe_psql(
	$db, q{
	-- The ids of one race, shuffled; each session draws the next k, so
	-- every row gets exactly one outcome.
	CREATE TABLE race (k bigint PRIMARY KEY, id bigint NOT NULL);
	CREATE SEQUENCE race_k;
});

my @addresses = map { "rcpt$_\@example.net" } 1 .. $recipients;

# Load @$ids into the race table in random order and rewind its sequence.
sub set_race
{
	my (@ids) = @_;
	my $list = join(',', @ids);

	$node->safe_psql(
		$db, qq{
		TRUNCATE race;
		ALTER SEQUENCE race_k RESTART;
		INSERT INTO race
		SELECT row_number() OVER (ORDER BY random()), id FROM unnest(ARRAY[$list]::bigint[]) id});
}

sub finish_script
{
	my ($stage) = @_;

	return qq{
WITH n AS (SELECT nextval('race_k') AS k)
SELECT pepsi.workqueue_commit(r.id, '$stage', 'finish') FROM n JOIN race r USING (k);
};
}
my $finish_script = finish_script('relay');

# Even draws rewrite their row's body and move it on; odd draws finish it
# when $mixed, rewrite too otherwise.
sub rewrite_script
{
	my ($mixed) = @_;
	my $finishers = $mixed ? 'k % 2 = 1' : 'false';

	return qq{
SELECT nextval('race_k') AS k \\gset
SELECT pepsi.workqueue_commit(id, 'relay', 'advance', 'deliver',
	set_body => convert_to('rewritten ' || id, 'UTF8'))
FROM race WHERE k = :k AND NOT ($finishers);
SELECT pepsi.workqueue_commit(id, 'relay', 'finish') FROM race WHERE k = :k AND $finishers;
};
}

# Run a pgbench race; it must end cleanly: any session that hit an error
# (a foreign-key violation from a freed body, a deadlock) aborts it.
sub race
{
	my ($name, $clients, $transactions, $script) = @_;
	my ($status, $out, $err) =
	  concurrently($node, $db, $clients, $transactions, $script);

	is($status, 0, "$name: every session ran to completion")
	  or diag("pgbench stdout:\n$out\npgbench stderr:\n$err");
}

sub body_count
{
	return $node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue_body');
}

#
# Without contention the release is exact: the body goes with the last
# sibling, and a row rewriting a body it alone holds frees the old one.
#
my ($solo, $solo_body) =
  add_running_message($node, $db, 'relay', [ 'x@example.net', 'y@example.net', 'z@example.net' ]);
my @solo = running_siblings($node, $db, $solo, 'relay');
is(scalar @solo, 3, 'a split one per row makes a row per recipient');
$node->safe_psql($db, "SELECT pepsi.workqueue_commit($_, 'relay', 'finish')")
  for @solo[ 0 .. 1 ];
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.workqueue_body WHERE id = $solo_body"),
	'1', 'the body stays while one sibling is left');
$node->safe_psql($db, "SELECT pepsi.workqueue_commit($solo[2], 'relay', 'finish')");
is(body_count(), '0', 'finishing the last sibling releases the body at once');

my ($alone, $alone_body) = add_running_message($node, $db, 'relay', ['x@example.net']);
$node->safe_psql($db,
	"SELECT pepsi.workqueue_commit($alone, 'relay', 'fail', set_body => 'new'::bytea)");
is( $node->safe_psql(
		$db,
		"SELECT count(*) FROM pepsi.workqueue_body WHERE id = $alone_body"),
	'0',
	'rewriting the body of an unshared row frees the old body at once');
is( $node->safe_psql(
		$db,
		"SELECT convert_from(b.body, 'UTF8') FROM pepsi.workqueue w"
		  . " JOIN pepsi.workqueue_body b ON b.id = w.body_id WHERE w.id = $alone"),
	'new', 'and the row has the new body');
$node->safe_psql($db, "DELETE FROM pepsi.workqueue WHERE id = $alone");
is(body_count(), '0', 'an operator DELETE releases the body too');

#
# Finishing races: $recipients siblings, $clients sessions.  First all but
# $survivors, with sweeps running alongside; then the survivors all at once,
# which is the race between the last releases.
#
for my $round (1 .. 5)
{
	my ($first, $body) = add_running_message($node, $db, 'relay', \@addresses);
	my @ids = running_siblings($node, $db, $first, 'relay');
	is(scalar @ids, $recipients, "round $round: $recipients siblings share one body");

	my @doomed = @ids[ $survivors .. $#ids ];
	my @left = @ids[ 0 .. $survivors - 1 ];
	set_race(@doomed);

	# Sweep in a loop while the siblings go: a sweep must never take the
	# body from under the rows still holding it.
	my ($gc_in, $gc_out, $gc_err) = ('', '', '');
	my $sweeper = IPC::Run::start(
		[
			'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db),
			'-c',
			"DO \$\$ BEGIN FOR i IN 1..2000 LOOP PERFORM pepsi.workqueue_body_gc(); COMMIT;"
			  . " EXIT WHEN (SELECT count(*) FROM pepsi.workqueue WHERE body_id = $body) <= $survivors;"
			  . " END LOOP; END \$\$"
		],
		'<', \$gc_in, '>', \$gc_out, '2>', \$gc_err);
	race("round $round, all but $survivors",
		$clients, scalar(@doomed) / $clients, $finish_script);
	$sweeper->finish;
	is($gc_err, '', "round $round: the concurrent sweeps ran without error");

	my $left = join(',', @left);
	is( $node->safe_psql(
			$db,
			"SELECT count(*) FROM pepsi.workqueue w JOIN pepsi.workqueue_body b"
			  . " ON b.id = w.body_id WHERE w.id IN ($left) AND b.id = $body"),
		$survivors,
		"round $round: the survivors still resolve to the shared body");
	is( $node->safe_psql(
			$db, "SELECT count(*) FROM pepsi.workqueue WHERE body_id = $body"),
		$survivors, "round $round: every other sibling was finished");

	set_race(@left);
	race("round $round, the last $survivors at once", $clients, 1, $finish_script);
	is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue'),
		'0', "round $round: all siblings finished");
	my $leftover = body_count();
	ok($leftover <= 1, "round $round: at most the message's one body is left ($leftover)");
	is($node->safe_psql($db, 'SELECT pepsi.workqueue_body_gc()'),
		$leftover, "round $round: the sweep frees what the race left");
	is(body_count(), '0', "round $round: no body leaks");
}

#
# Copy-on-write races: siblings rewriting their body at once (and, mixed,
# others finishing meanwhile).  Each rewriter ends with a body of its own;
# the shared one is freed, by the last release or by the sweep.
#
for my $mixed (0, 1, 0, 1)
{
	my $name = $mixed ? 'rewrite and finish' : 'rewrite';
	my ($first, $body) = add_running_message($node, $db, 'relay', \@addresses);
	my @ids = running_siblings($node, $db, $first, 'relay');
	set_race(@ids);
	race($name, $clients, $recipients / $clients, rewrite_script($mixed));

	my $rewriters = $mixed ? $recipients / 2 : $recipients;
	my $list = join(',', @ids);
	is( $node->safe_psql(
			$db, qq{
			SELECT count(*) || ' ' || count(DISTINCT w.body_id) || ' '
			       || bool_and(convert_from(b.body, 'UTF8') = 'rewritten ' || w.id
			                   AND w.stage = 'deliver' AND w.body_id <> $body)
			FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
			WHERE w.id IN ($list)}),
		"$rewriters $rewriters true",
		"$name: every rewriter has a body of its own, with its content");
	my $leftover = $node->safe_psql($db,
		"SELECT count(*) FROM pepsi.workqueue_body WHERE id = $body");
	is($node->safe_psql($db, 'SELECT pepsi.workqueue_body_gc()'),
		$leftover, "$name: the sweep frees only the shared body, if the race left it");
	is(body_count(), $rewriters, "$name: one body per live row, no leak");

	# One statement finishing every row releases all their bodies.
	$node->safe_psql(
		$db, q{
		UPDATE pepsi.workqueue SET status = 'running';
		SELECT pepsi.workqueue_commit_many(array_agg(id), array_agg(stage), 'finish')
		FROM pepsi.workqueue});
	is(body_count(), '0', "$name: finishing the rows releases every body");
}

#
# Finishing with clones (a DSN per finished sibling, say) while the other
# siblings finish: the clones hold the body on, since each is inserted
# before its source row goes.
#
{
	my ($first, $body) = add_running_message($node, $db, 'relay', \@addresses);
	my @ids = running_siblings($node, $db, $first, 'relay');
	set_race(@ids);
	race(
		'finish with clones',
		$clients,
		$recipients / $clients,
		q{
SELECT nextval('race_k') AS k \gset
SELECT pepsi.workqueue_finish_with_clones(id, 'relay',
	jsonb_build_array(jsonb_build_object('token', 'dsn-' || id, 'stage', 'bounce')))
FROM race WHERE k = :k AND k % 5 = 0;
SELECT pepsi.workqueue_commit(id, 'relay', 'finish') FROM race WHERE k = :k AND k % 5 <> 0;
});
	my $clones = $recipients / 5;
	is( $node->safe_psql(
			$db, qq{
			SELECT count(*) || ' ' || count(*) FILTER (WHERE w.stage = 'bounce' AND b.id = $body)
			FROM pepsi.workqueue w LEFT JOIN pepsi.workqueue_body b ON b.id = w.body_id}),
		"$clones $clones",
		'finish with clones: only the clones are left, on the original body');
	is($node->safe_psql($db, 'SELECT pepsi.workqueue_body_gc()'),
		'0', 'finish with clones: the sweep finds nothing to free');

	my @clone_ids = split /\n/,
	  $node->safe_psql($db,
		"UPDATE pepsi.workqueue SET status = 'running' RETURNING id");
	set_race(@clone_ids);
	race('the clones at once', $clients, $clones / $clients, finish_script('bounce'));
	my $leftover = body_count();
	ok($leftover <= 1, "finish with clones: at most one body is left ($leftover)");
	$node->safe_psql($db, 'SELECT pepsi.workqueue_body_gc()');
	is(body_count(), '0', 'finish with clones: no body leaks');
}

$node->stop;

done_testing();
