# The two optimisations under the stage contract (docs/architecture.md 3.3
# and 3.4), counted with pg_stat_statements: batching (ids waiting
# together share one load and one arrayed commit per outcome shape, with a
# status line per id in order) and fusion (in the multi-call binary a
# chain of stages runs in one pass and commits once, reporting its fused
# hops; with ALLOW_FUSION off, or in a standalone build, each stage takes
# its own pass; the rows end the same either way).

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;
use PepsiStage;

my $node = stage_node('stage_batching');
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $aliases = "$tmp/aliases";
{
	open my $fh, '>', $aliases or die $!;
	print $fh "team: alice, carol\n";
	print $fh "deep$_: deep" . ($_ + 1) . "\n" for 0 .. 39;
	close $fh;
}

# The load statements and the commits, as pg_stat_statements records them.
my $load = '%FROM pepsi.workqueue w WHERE w.id = ANY%';
my $commit_one = '%pepsi.workqueue_commit(%';
my $commit_many = '%pepsi.workqueue_commit_many(%';

my $chain = <<"INI";
[stage-b1]
PROGRAM = pepsi-stage-if
CONDITION = state.n < 25
THEN_STAGE = b-low
ELSE_STAGE = b-high

[stage-reject]
PROGRAM = pepsi-stage-discard
BOUNCE = yes
BOUNCE_STAGE = bounce

# f1 -> f2 -> f3, the second rewriting the recipients and the third
# branching on what the second wrote.
[stage-f1]
PROGRAM = pepsi-stage-if
CONDITION = rcpt ~ \@example\\.org\$
THEN_STAGE = f2
ELSE_STAGE = f-other

[stage-f2]
PROGRAM = pepsi-stage-aliases
ALIASES_FILE = $aliases
ALIAS_DOMAINS = example.org
NEXT_STAGE = f3

[stage-f3]
PROGRAM = pepsi-stage-if
CONDITION = rcpt = alice\@example.org
THEN_STAGE = f-done
ELSE_STAGE = f-wrong

# k1 -> k2 -> k3, no content written: a batch commits in one statement.
[stage-k1]
PROGRAM = pepsi-stage-if
CONDITION = rcpt_count > 0
THEN_STAGE = k2
ELSE_STAGE = k-wrong

[stage-k2]
PROGRAM = pepsi-stage-if
CONDITION = mail_from ~ \@
THEN_STAGE = k3
ELSE_STAGE = k-wrong

[stage-k3]
PROGRAM = pepsi-stage-if
CONDITION = state.k exists
THEN_STAGE = k-done
ELSE_STAGE = k-wrong

# g1 -> route: route's can_fuse refuses a row it must split.
[stage-g1]
PROGRAM = pepsi-stage-if
CONDITION = rcpt_count > 0
THEN_STAGE = g-route
ELSE_STAGE = g-route

[stage-g-route]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = example.org
LOCAL_STAGE = g-local
REMOTE_STAGE = g-remote

# h1 -> aliases failing: the failure is recorded at the fused stage.
[stage-h1]
PROGRAM = pepsi-stage-if
CONDITION = rcpt_count > 0
THEN_STAGE = h-expand
ELSE_STAGE = h-expand

[stage-h-expand]
PROGRAM = pepsi-stage-aliases
ALIASES_FILE = $aliases
ALIAS_DOMAINS = example.org
NEXT_STAGE = h-done
INI

my $conf = stage_config($node, 'fusion.conf', $chain);
my $conf_nofusion = stage_config($node, 'nofusion.conf', "[pepsi]\nALLOW_FUSION = no\n\n$chain");

#
# Batching: ids waiting together are loaded with one statement and their
# outcomes committed with one; a status line per id, in order, errors
# included.
#
{
	my @ids = map { add_row($node, 'b1', state => { n => $_ }) } 0 .. 49;
	my $stranger = add_row($node, 'b1', running => 0);
	my @input = @ids;
	splice @input, 10, 0, $stranger;
	splice @input, 20, 0, 'junk';
	reset_statements($node);
	my $r = run_worker(worker_cmd('pepsi-stage-if', $conf), join('', map { "$_\n" } @input));

	my @want = ('0') x @input;
	@want[ 10, 20 ] = (1, 1);
	is_deeply([ map { (decode_status($_))[0] } @{ $r->{status} } ], \@want,
		'batch: one status line per id, in input order, the refused ones where they were');
	# 51 rows: the pending one is loaded with the others, then refused.
	is(statement_calls($node, $load), '1/51',
		'batch: the 51 ids waiting together were loaded with one statement');
	is(statement_calls($node, $commit_many), '1/1',
		'batch: and their outcomes committed with one workqueue_commit_many');
	is(statement_calls($node, $commit_one), '0/0', 'batch: no row was committed on its own');
	is(scalar(rows_at($node, 'b-low')), 25, 'batch: the rows that matched went to THEN_STAGE');
	is(scalar(rows_at($node, 'b-high')), 25,
		'batch: the others to ELSE_STAGE, in the same statement');
}

# The same ids arriving one at a time are loaded one at a time: batching
# takes what is waiting and never waits for more.
{
	my @ids = map { add_row($node, 'b1', state => { n => $_ }) } 1 .. 3;
	my $io = start_worker(worker_cmd('pepsi-stage-if', $conf));
	reset_statements($node);
	is_deeply([ map { send_ids($io, "$_\n", 1) } @ids ], [ 0, 0, 0 ],
		'one at a time: a status line for each id before the next is sent');
	ok($io->{harness}->finish, 'one at a time: the worker exits 0');
	is(statement_calls($node, $load), '3/3', 'one at a time: one load per id');
	is(statement_calls($node, $commit_one), '3/3', 'one at a time: one single-row commit per id');
	is(statement_calls($node, $commit_many), '0/0', 'one at a time: no arrayed commit');
}

# Two outcome shapes in one batch: one arrayed commit each, each row with
# its own state merge.
{
	my @bounced = map { add_row($node, 'reject', state => { n => $_ }) } 1 .. 3;
	my @dropped = map { add_row($node, 'reject', from => '') } 1 .. 3;
	reset_statements($node);
	my $r = run_worker(worker_cmd('pepsi-stage-discard', $conf),
		join('', map { "$_\n" } @bounced, @dropped));
	is_deeply($r->{status}, [ ('0') x 6 ], 'two shapes: every row done');
	is(statement_calls($node, $load), '1/6', 'two shapes: one load');
	is(statement_calls($node, $commit_many), '2/2',
		'two shapes: one arrayed commit per shape (reroute, finish)');
	for my $i (0 .. $#bounced)
	{
		my $row = row_json($node, $bounced[$i]);
		is_deeply([ $row->{stage}, $row->{state}{n}, $row->{state}{bounce}{kind} ],
			[ 'bounce', $i + 1, 'permanent' ], "two shapes: bounced row $i keeps its state and gains the merge");
	}
	is($node->safe_psql('postgres',
			'SELECT count(*) FROM pepsi.workqueue WHERE id IN (' . join(',', @dropped) . ')'),
		0, 'two shapes: the null-sender rows are finished');
}

#
# Fusion: f1 -> f2 -> f3 in one pass of the multi-call binary.
#
my %dsn = (ret => 'FULL', rcpt => [ { notify => 'SUCCESS', orcpt => 'rfc822;team@example.org' } ]);
my %state = (dsn => \%dsn, origin => { client => '192.0.2.1' });

my $fused = add_row($node, 'f1', rcpt => ['team@example.org'], state => \%state);
reset_statements($node);
my $r = run_worker(unified_cmd('pepsi-stage-if', $conf), "$fused\n");
is(scalar @{ $r->{status} }, 1, 'fusion: one status line');
my ($code, $report) = decode_status($r->{status}[0]);
is($code, 0, 'fusion: the pass succeeded');
is_deeply([ map { $_->{stage} } @{ $report->{fused} // [] } ], [ 'f2', 'f3' ],
	'fusion: the status line reports the two fused hops');
ok(!grep({ ($_->{us} // -1) !~ /^\d+$/ } @{ $report->{fused} // [] }),
	'fusion: each hop with its time in microseconds');
is(statement_calls($node, $load), '1/1', 'fusion: the row was loaded once');
is(statement_calls($node, $commit_one), '1/1', 'fusion: and the chain committed once');
my $fused_row = row_json($node, $fused);
is_deeply([ @$fused_row{qw(stage status)} ], [ 'f-done', 'pending' ],
	'fusion: the third stage saw the second\'s rewrite in memory and branched on it');
is_deeply($fused_row->{rcpt_to}, [ 'alice@example.org', 'carol@example.org' ],
	'fusion: the rewritten recipients were committed');
is_deeply($fused_row->{state}{dsn}{rcpt}, [ $dsn{rcpt}[0], $dsn{rcpt}[0] ],
	'fusion: with state.dsn.rcpt rebuilt in lockstep');

# The same chain with ALLOW_FUSION = no: three passes, one per stage.
my $unfused = add_row($node, 'f1', rcpt => ['team@example.org'], state => \%state);
reset_statements($node);
my @passes;
for my $program (qw(pepsi-stage-if pepsi-stage-aliases pepsi-stage-if))
{
	my $pass = run_worker(unified_cmd($program, $conf_nofusion), "$unfused\n");
	push @passes, $pass->{status}[0] // '';
	push @passes, row_json($node, $unfused)->{stage};
	set_running($node, $unfused);
}
is_deeply(\@passes, [ '0', 'f2', '0', 'f3', '0', 'f-done' ],
	'no fusion: three passes, each a plain status line, each moving the row one stage');
is(statement_calls($node, $load), '3/3', 'no fusion: three loads');
is(statement_calls($node, $commit_one), '3/3', 'no fusion: three commits');
$node->safe_psql('postgres', "UPDATE pepsi.workqueue SET status = 'pending' WHERE id = $unfused");
my $unfused_row = row_json($node, $unfused);
delete @$_{qw(id body_id pending_seq)} for $fused_row, $unfused_row;
is_deeply($unfused_row, $fused_row, 'the rows end the same with and without fusion');

# The standalone build has no registry: fusion is inert there.
{
	my $id = add_row($node, 'f1', rcpt => ['team@example.org'], state => \%state);
	my $pass = run_worker(worker_cmd('pepsi-stage-if', $conf), "$id\n");
	is_deeply($pass->{status}, ['0'], 'standalone: a plain status line, no fused hops');
	is(row_json($node, $id)->{stage}, 'f2', 'standalone: the row waits at the next stage');
}

#
# Batched and fused: k1 -> k2 -> k3 for ten rows in one pass, one load and
# one arrayed commit.
#
{
	my @ids = map { add_row($node, 'k1', state => { k => $_ }) } 1 .. 10;
	reset_statements($node);
	my $pass = run_worker(unified_cmd('pepsi-stage-if', $conf), join('', map { "$_\n" } @ids));
	is(scalar @{ $pass->{status} }, 10, 'batched and fused: ten status lines');
	is_deeply(
		[ map { my (undef, $rep) = decode_status($_); join ',', map { $_->{stage} } @{ $rep->{fused} // [] } }
			  @{ $pass->{status} } ],
		[ ('k2,k3') x 10 ],
		'batched and fused: each reports its two fused hops');
	is(statement_calls($node, $load), '1/10', 'batched and fused: one load');
	is(statement_calls($node, $commit_many), '1/1', 'batched and fused: one arrayed commit');
	is(statement_calls($node, $commit_one), '0/0', 'batched and fused: no single-row commit');
	is(scalar(grep { row_json($node, $_)->{stage} eq 'k-done' } @ids), 10,
		'batched and fused: every row at the end of the chain');
}

#
# Fusion stops where the successor's can_fuse refuses: route will not
# split in a fused pass, so a mixed row waits for route's own worker.
#
{
	my $mixed = add_row($node, 'g1', rcpt => [ 'a@example.org', 'x@remote.net' ]);
	my $local = add_row($node, 'g1', rcpt => ['a@example.org']);
	my $pass = run_worker(unified_cmd('pepsi-stage-if', $conf), "$mixed\n$local\n");
	is($pass->{status}[0], '0', 'can_fuse: the mixed row\'s pass reports no fused hop');
	is_deeply([ @{ row_json($node, $mixed) }{qw(stage status)} ], [ 'g-route', 'pending' ],
		'can_fuse: the mixed row waits at route');
	is_deeply(row_json($node, $mixed)->{rcpt_to}, [ 'a@example.org', 'x@remote.net' ],
		'can_fuse: unsplit');
	like($pass->{status}[1], qr/^0 \{"fused":\[\{"stage":"g-route"/,
		'can_fuse: an all-local row is fused into route');
	is(row_json($node, $local)->{stage}, 'g-local', 'can_fuse: and goes on to LOCAL_STAGE');
}

#
# A fused successor that fails: the row fails at that stage (where its
# retry would run it again), not at the stage the pass began with.
#
{
	my $id = add_row($node, 'h1', rcpt => ['deep0@example.org']);
	my $pass = run_worker(unified_cmd('pepsi-stage-if', $conf), "$id\n");
	like($pass->{status}[0], qr/^0 \{"fused":\[\{"stage":"h-expand"/,
		'fused failure: the pass reports the hop');
	my $row = row_json($node, $id);
	is_deeply([ @$row{qw(stage status)} ], [ 'h-expand', 'failed' ],
		'fused failure: the row is failed at the fused stage');
	like($row->{state}{last_error}, qr/deeper than/, 'fused failure: with its reason');
}

#
# Asked by the dispatcher (PEPSI_STATUS_QUEUED=1), the status line says
# at which stages the pass left rows pending, so that the next claim names
# only those (daemons/dispatch/pool.c): the stage it advanced to, none when
# it finished, and nothing at all when it split the row (the runtime cannot
# vouch for where the parts went).  Unasked, the lines above stay as the
# protocol began.
#
{
	local $ENV{PEPSI_STATUS_QUEUED} = '1';
	my $conf_queued = stage_config($node, 'queued.conf',
		"$chain\n[stage-z]\nPROGRAM = pepsi-stage-discard\n");

	my $id = add_row($node, 'f1', rcpt => ['team@example.org'], state => \%state);
	my $r = run_worker(unified_cmd('pepsi-stage-if', $conf_nofusion), "$id\n");
	is($r->{status}[0], '0 {"queued":["f2"]}', 'queued: an advance names its stage');

	$id = add_row($node, 'f1', rcpt => ['team@example.org'], state => \%state);
	$r = run_worker(unified_cmd('pepsi-stage-if', $conf_queued), "$id\n");
	my ($code, $report) = decode_status($r->{status}[0]);
	is_deeply($report->{queued}, ['f-done'], 'queued: a fused pass names the stage its chain ended at');
	is(scalar @{ $report->{fused} // [] }, 2, 'queued: beside its fused hops');

	$id = add_row($node, 'z');
	$r = run_worker(unified_cmd('pepsi-stage-discard', $conf_queued), "$id\n");
	is($r->{status}[0], '0 {"queued":[]}', 'queued: a pass that finished the row names none');
	is($node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue WHERE id = $id"),
		0, 'queued: and the row is gone');

	my $mixed = add_row($node, 'g-route', rcpt => [ 'a@example.org', 'x@remote.net' ]);
	$r = run_worker(unified_cmd('pepsi-stage-route', $conf_queued), "$mixed\n");
	($code, $report) = decode_status($r->{status}[0]);
	is($code, 0, 'queued: a split row\'s pass succeeds');
	ok(!exists $report->{queued}, 'queued: and says nothing of where its parts went')
	  or diag $r->{status}[0];
	is($node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue WHERE id >= $mixed"),
		2, 'queued: the row was split in two');
}

done_testing();
