# The secretary's batch decision holds its rows in its own transaction
# (pepsi.secretary_decide_many with each row's claim, as
# pepsi-stage-check-whitelist passes it: pepsi_hold_args).  Called as a
# pepsi_stage member on rows the dispatcher claimed: a row to hold is
# held there (paused with no retry time at the stage named, its state
# merged with the pass's and the secretary's), its answer says so, and
# its sender's challenge is opened; a whitelisted sender's row and a row
# passed without its claim stay running, for the stage's terminal.  If
# one row's claim is stale, the whole call fails and nothing of the batch
# is decided or held: no row is ever recorded as held (secretary_held, a
# challenge sent) without being held, which a worker killed between a
# decision and the hold's own commit used to leave; and a batch whose
# session dies before its commit leaves nothing either.  A row marked
# may_defer whose pair another batch is deciding (its challenge not yet
# committed) is left undecided, a null answer, instead of waited for.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $db = 'postgres';
my $node = pepsi_node('secretary_batch_hold', extension => 1);
$node->safe_psql($db, 'CREATE ROLE worker LOGIN IN ROLE pepsi_stage');
$node->safe_psql($db, 'CREATE ROLE dispatcher LOGIN IN ROLE pepsi_dispatch');
my $owner = 'bob@local.test';

sub sql { return $node->safe_psql($db, shift) }

# Run $sql as the pepsi_stage member; returns (exit code, stdout, stderr).
sub as_worker
{
	my ($sql) = @_;
	return $node->psql($db, $sql, extra_params => [ '-U', 'worker' ]);
}

# Rows from each of @senders to the owner, pending at init, claimed by
# the dispatcher: id => claim token.
sub claimed_rows
{
	my @senders = @_;
	my @ids = map {
		sql("SELECT pepsi.workqueue_add('$_', '{$owner}', 'Subject: hello', 'text', stage => 'init')")
	} @senders;
	my ($ret, $out, $err) = $node->psql($db,
		"SELECT id || ' ' || claim_token FROM pepsi.workqueue_claim_tokens(ARRAY['init'], ARRAY[100])",
		extra_params => [ '-U', 'dispatcher' ]);
	is($ret, 0, 'the dispatcher claims the rows') or diag($err);
	my %token = map { split / / } split /\n/, $out;
	return map { [ $_, $token{$_} ] } @ids;
}

# The question for row [id, token] from sender, held at secretary when $hold.
sub question
{
	my ($row, $sender, $hold) = @_;
	my $q = qq({"owner": "$owner", "sender": "$sender", "row_id": $row->[0], "verified": true);
	$q .= qq(, "hold": {"expected_stage": "init", "at_stage": "secretary", "claim_token": "$hold",)
	  . qq( "merge": {"route": "local"}})
	  if defined $hold;
	return "$q}";
}

sub decide_many
{
	my @questions = @_;
	return as_worker("SELECT pepsi.secretary_decide_many('[" . join(', ', @questions)
		  . "]'::jsonb, '7 days', 100)");
}

sub row_of
{
	my ($id) = @_;
	return sql("SELECT stage || ' ' || status || ' ' || coalesce(timeout::text, '-') FROM pepsi.workqueue WHERE id = $id");
}

sub counts
{
	return sql('SELECT (SELECT count(*) FROM pepsi.secretary_held) || \' held, \''
		  . ' || (SELECT count(*) FROM pepsi.secretary_challenge) || \' challenges\'');
}

# A stale claim in the batch: nothing of it is decided or held.
my ($r1, $r2) = claimed_rows('one@senders.test', 'two@senders.test');
my ($ret, $out, $err) = decide_many(question($r1, 'one@senders.test', $r1->[1]),
	question($r2, 'two@senders.test', '00000000-0000-4000-8000-000000000000'));
isnt($ret, 0, 'a batch with a stale claim fails');
like($err, qr/claim|token|not running/i, 'naming the claim') or diag($err);
is(counts(), '0 held, 0 challenges', 'no decision of the batch stays');
is(row_of($r1->[0]), 'init running -', 'the row with a good claim is still running')
  or diag(row_of($r1->[0]));
is(row_of($r2->[0]), 'init running -', 'and the other too');

# The same rows with their claims, and a row asked without one: the two are held by the call.
sql("INSERT INTO pepsi.whitelist (owner, sender, source) VALUES ('$owner', 'friend\@senders.test', 'operator')");
my ($r3, $r4) = claimed_rows('three@senders.test', 'friend@senders.test');
($ret, $out, $err) = decide_many(
	question($r1, 'one@senders.test', $r1->[1]),
	question($r2, 'two@senders.test', $r2->[1]),
	question($r3, 'three@senders.test'),
	question($r4, 'friend@senders.test', $r4->[1]));
is($ret, 0, 'the batch is decided') or diag($err);
my $answers = sql("SELECT string_agg(coalesce(a->>'action', '') || ' ' || coalesce(a->>'held', 'no')"
	  . " || ' ' || (a->>'token' IS NOT NULL), ',' ORDER BY o)"
	  . " FROM jsonb_array_elements('$out'::jsonb) WITH ORDINALITY AS x (a, o)");
is($answers, 'hold true true,hold true true,hold no true,pass no false',
	'held by the call with a challenge each, held by no call without a claim, a whitelisted sender passes');
for my $row ($r1, $r2)
{
	is(row_of($row->[0]), 'secretary paused infinity', "row $row->[0] is held at secretary");
	is( sql("SELECT w.state->>'route' || ' ' || (w.state->'secretary'->>'owner')"
			  . " || ' ' || (w.state->'secretary'->>'challenge' = h.challenge_id::text)"
			  . " FROM pepsi.workqueue w JOIN pepsi.secretary_held h ON h.row_id = w.id WHERE w.id = $row->[0]"),
		"local $owner true",
		'its state has the pass\'s merge and its challenge, the one it is recorded under');
}
is(row_of($r3->[0]), 'init running -', 'the row asked without its claim is left to the stage');
is(row_of($r4->[0]), 'init running -', 'and the whitelisted sender\'s row too');
is(sql('SELECT count(*) FROM pepsi.secretary_challenge WHERE challenged_at IS NOT NULL'),
	3, 'a challenge opened for each held sender');

# A batch whose session dies before its commit (a worker killed mid-batch): nothing stays.
my ($r5) = claimed_rows('five@senders.test');
my $before = counts();
my $session = $node->background_psql($db, extra_params => [ '-U', 'worker' ]);
$session->query_safe('BEGIN');
is( $session->query_safe("SELECT pepsi.secretary_decide_many('["
		  . question($r5, 'five@senders.test', $r5->[1])
		  . "]'::jsonb, '7 days', 100)->0->>'held'"),
	'true', 'a session decides and holds a batch, not yet committed');
my $pid = $session->query_safe('SELECT pg_backend_pid()');
is(sql("SELECT status FROM pepsi.workqueue WHERE id = $r5->[0]"), 'running', 'its hold is not seen outside');
is(sql("SELECT pg_terminate_backend($pid)"), 't', 'the session is killed');
ok($node->poll_query_until($db, "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid"),
	'its backend is gone');
eval { $session->quit };
is(counts(), $before, 'nothing of its batch was decided');
is(row_of($r5->[0]), 'init running -', 'and its row is still running, to be recovered and decided again');

# Two batches with rows of one pair: while the first is opening the
# pair's challenge (not yet committed), the second's row marked
# may_defer is left undecided (a null answer) instead of waiting, and
# nothing of it is recorded; once the first commits, it is held under
# that challenge.
my ($r6, $r7) = claimed_rows('six@senders.test', 'six@senders.test');
(my $deferrable = question($r7, 'six@senders.test', $r7->[1])) =~ s/^\{/{"may_defer": true, /;
$session = $node->background_psql($db, extra_params => [ '-U', 'worker' ]);
$session->query_safe('BEGIN');
is( $session->query_safe("SELECT pepsi.secretary_decide_many('["
		  . question($r6, 'six@senders.test', $r6->[1])
		  . "]'::jsonb, '7 days', 100)->0->>'token' IS NOT NULL"),
	't', 'a batch opens the pair\'s challenge, not yet committed');
($ret, $out, $err) = decide_many($deferrable);
is($ret, 0, 'another batch with a row of the pair, may_defer, is answered') or diag($err);
is($out, '[null]', 'its row left undecided');
is(row_of($r7->[0]), 'init running -', 'still running, for the stage to decide alone');
is(sql("SELECT count(*) FROM pepsi.secretary_held WHERE row_id = $r7->[0]"), '0', 'and not recorded as held');
$session->query_safe('COMMIT');
$session->quit;
($ret, $out, $err) = decide_many($deferrable);
is($ret, 0, 'asked again once the first batch committed') or diag($err);
is(sql("SELECT (a->>'action') || ' ' || (a->>'held') || ' ' || (a->>'challenge' = (SELECT h.challenge_id::text"
		  . " FROM pepsi.secretary_held h WHERE h.row_id = $r6->[0])) FROM jsonb_array_elements('$out'::jsonb) a"),
	'hold true true', 'it is held under the challenge the first batch opened');

done_testing();
