# Claim tokens (docs/architecture.md 2.1 and 9): a login role in
# pepsi_stage, connecting as itself, cannot change a row another worker
# was handed.  It cannot write the queue, the bodies, the DNS address
# cache, the destination table or the MTA-STS cache directly; a
# transition naming a wrong or stale claim token, or none, is refused
# with an error that says so and changes nothing; the token the claim
# returned works, once; a row claimed again gets a new token, and the old
# one is refused.  The claim keeps only the token's digest, so reading
# the row does not reveal it.  Claiming and recovering rows are the
# dispatcher's (pepsi_dispatch): the stage's role may do neither, even
# holding the dispatcher's lock.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $db = 'postgres';
my $node = pepsi_node('claim_tokens', extension => 1);
$node->safe_psql($db, 'CREATE ROLE worker LOGIN IN ROLE pepsi_stage');
$node->safe_psql($db, 'CREATE ROLE dispatcher LOGIN IN ROLE pepsi_dispatch');

# Run $sql as the pepsi_stage member; returns (exit code, stdout, stderr).
sub as_worker
{
	my ($sql) = @_;
	return $node->psql($db, $sql, extra_params => [ '-U', 'worker' ]);
}

# Run $sql as the pepsi_dispatch member (pepsi-dispatch's role).
sub as_dispatcher
{
	my ($sql) = @_;
	return $node->psql($db, $sql, extra_params => [ '-U', 'dispatcher' ]);
}

sub refused
{
	my ($what, $sql, $error) = @_;
	my ($ret, $out, $err) = as_worker($sql);

	ok($ret != 0 && $err =~ $error, "pepsi_stage member: $what is refused")
	  or diag("exit $ret, stdout: $out, stderr: $err");
	return;
}

# The row as the queue has it: what a refused call must leave alone.
sub row_of
{
	my ($id) = @_;
	return $node->safe_psql($db,
		"SELECT stage || ' ' || status || ' ' || state::text || ' ' || array_to_string(rcpt_to, ',')"
		  . " FROM pepsi.workqueue WHERE id = $id");
}

# Two rows pending at relay, claimed by the dispatcher (a pepsi_dispatch
# member) for two workers: each gets its own token.
my @ids = map {
	$node->safe_psql($db,
		"SELECT pepsi.workqueue_add('s\@example.org', '{r$_\@example.net,q$_\@example.net}',"
		  . " 'h', 'b', stage => 'relay')")
} 1 .. 2;
refused('a claim', "SELECT id FROM pepsi.workqueue_claim_tokens(ARRAY['relay'], ARRAY[10])",
	qr/permission denied for function workqueue_claim_tokens/);
refused('a claim without tokens', "SELECT id FROM pepsi.workqueue_claim(ARRAY['relay'], ARRAY[10])",
	qr/permission denied for function workqueue_claim/);
my ($ret, $claimed) = as_dispatcher(
	"SELECT id || ' ' || claim_token FROM pepsi.workqueue_claim_tokens(ARRAY['relay'], ARRAY[10])"
	  . " ORDER BY id");
is($ret, 0, 'pepsi_dispatch member may claim with tokens');
my %token = map { split / / } split /\n/, $claimed;
is(join(',', sort keys %token), join(',', @ids), 'the claim returns both rows');
like($token{ $ids[0] }, qr/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/,
	'each with a uuid token');
isnt($token{ $ids[0] }, $token{ $ids[1] }, 'a token of its own');
my ($mine, $theirs) = @ids;
my $theirs_before = row_of($theirs);

# Direct DML: none, on any of the tables the functions write.
refused('UPDATE of another worker\'s row',
	"UPDATE pepsi.workqueue SET stage = 'discard' WHERE id = $theirs", qr/permission denied for table workqueue/);
refused('DELETE from the queue', "DELETE FROM pepsi.workqueue WHERE id = $theirs",
	qr/permission denied for table workqueue/);
refused('INSERT into the queue',
	"INSERT INTO pepsi.workqueue (mail_from, rcpt_to, headers, body_id)"
	  . " SELECT mail_from, rcpt_to, headers, body_id FROM pepsi.workqueue WHERE id = $theirs",
	qr/permission denied for table workqueue/);
refused('UPDATE of a body', "UPDATE pepsi.workqueue_body SET body = 'x'",
	qr/permission denied for table workqueue_body/);
refused('INSERT into dns_address',
	"INSERT INTO pepsi.dns_address (host, address) VALUES ('mx.example.net', '127.0.0.9')",
	qr/permission denied for table dns_address/);
refused('DELETE from destination', 'DELETE FROM pepsi.destination',
	qr/permission denied for table destination/);
refused('DELETE from the MTA-STS cache', 'DELETE FROM pepsi.mta_sts_policy',
	qr/permission denied for table mta_sts_policy/);
($ret, my $digest) = as_worker("SELECT claim_digest IS NOT NULL FROM pepsi.workqueue WHERE id = $theirs");
is($digest, 't', 'the row keeps a digest of its token');
isnt(
	$node->safe_psql($db, "SELECT encode(claim_digest, 'hex') FROM pepsi.workqueue WHERE id = $theirs"),
	$token{$theirs} =~ s/-//gr,
	'not the token itself');
# The claim computes the digests in C; the PL/pgSQL that matches rows by
# token (workqueue_recover, the secretary's batch hold) computes them with
# SQL's sha256(uuid_send(token)): the two must agree, byte for byte.
is( $node->safe_psql($db,
		"SELECT string_agg((claim_digest = sha256(uuid_send(CASE id WHEN $ids[0] THEN '$token{$ids[0]}'"
		  . " ELSE '$token{$ids[1]}' END::uuid)))::text, ',' ORDER BY id) FROM pepsi.workqueue"),
	'true,true',
	'each row keeps the SHA-256 of its own token, as SQL computes it');

# The transitions, with my token on their row, with none, with a made-up one.
my $wrong = '00000000-0000-4000-8000-000000000000';
my @calls = (
	[ 'commit', "pepsi.workqueue_commit($theirs, 'relay', 'advance', 'discard', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'TOKEN')" ],
	[ 'commit_many', "pepsi.workqueue_commit_many(ARRAY[$theirs], ARRAY['relay'], 'finish', NULL, NULL, NULL, ARRAY['TOKEN']::uuid[])" ],
	[ 'pause', "pepsi.workqueue_pause($theirs, 'relay', 60, NULL, NULL, NULL, NULL, 'TOKEN')" ],
	[ 'finish_with_clones', "pepsi.workqueue_finish_with_clones($theirs, 'relay', '[]', 'TOKEN')" ],
	[ 'split_off', "pepsi.workqueue_split_off($theirs, 'relay', ARRAY[2], NULL, 'TOKEN')" ],
	[ 'split', "pepsi.workqueue_split($theirs, 'relay', ARRAY[1], '[{\"rcpt_indices\": [2]}]', 'TOKEN')" ],
	[ 'split_one_per_row', "pepsi.workqueue_split_one_per_row($theirs, 'relay', 'TOKEN')" ],
	[ 'a body rewrite', "pepsi.workqueue_commit($theirs, 'relay', 'advance', 'discard', NULL, NULL, NULL, 'new body', NULL, NULL, NULL, NULL, 'TOKEN')" ]);
for my $call (@calls)
{
	my ($name, $sql) = @$call;
	my $with = sub { my $t = shift; return 'SELECT ' . ($sql =~ s/TOKEN/$t/r) };
	refused("$name of another worker's row with its own token", $with->($token{$mine}),
		qr/ERROR:  claim token for workqueue row $theirs does not match/);
	refused("$name with a made-up token", $with->($wrong),
		qr/claim token for workqueue row $theirs does not match/);
}
refused('commit without a token (the overload of older programs)',
	"SELECT pepsi.workqueue_commit($theirs, 'relay', 'finish')",
	qr/ERROR:  workqueue row $theirs needs its claim token/);
refused('commit_many without a token',
	"SELECT pepsi.workqueue_commit_many(ARRAY[$mine, $theirs], ARRAY['relay', 'relay'], 'finish')",
	qr/workqueue row $mine needs its claim token/);
refused('a batch with one wrong token',
	"SELECT pepsi.workqueue_commit_many(ARRAY[$mine, $theirs], ARRAY['relay', 'relay'], 'finish',"
	  . " NULL, NULL, NULL, ARRAY['$token{$mine}', '$wrong']::uuid[])",
	qr/claim token for workqueue row $theirs does not match/);

# Nor can it put another worker's row back to be claimed again: the
# recovery of running rows is pepsi_dispatch's, and for the session
# holding the dispatcher's lock, as pepsi-dispatch does.
refused('an orphan reset', 'SELECT pepsi.workqueue_reset_orphans()',
	qr/permission denied for function workqueue_reset_orphans/);
refused('a recovery', "SELECT pepsi.workqueue_recover(ARRAY[$theirs], ARRAY['relay'], 'pending')",
	qr/permission denied for function workqueue_recover/);
refused('a crash report', "SELECT pepsi.workqueue_crashed($theirs, 'relay', 'killed', 3, 10)",
	qr/permission denied for function workqueue_crashed/);
refused("an orphan reset holding the dispatcher's lock (no dispatcher running)",
	"SELECT pg_try_advisory_lock(1346720851, 2); SELECT pepsi.workqueue_reset_orphans()",
	qr/permission denied for function workqueue_reset_orphans/);
($ret, my $out, my $err) = as_dispatcher('SELECT pepsi.workqueue_reset_orphans()');
ok($ret != 0 && $err =~ /workqueue_reset_orphans is for the dispatcher's session only/,
	'pepsi_dispatch member without the dispatcher\'s lock: an orphan reset is refused')
  or diag($err);
is(row_of($theirs), $theirs_before, 'the refused calls changed nothing');
($ret, $out, $err) = as_dispatcher("SELECT pg_try_advisory_lock(1346720851, 2);"
	  . " SELECT pepsi.workqueue_reset_orphans(ARRAY[$mine, $theirs])");
is($ret, 0, 'holding the dispatcher\'s lock, a pepsi_dispatch member may reset orphans') or diag($err);
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue'), 2, 'and made no rows');
my ($sqlstate) = (as_worker("\\set VERBOSITY verbose\nSELECT pepsi.workqueue_commit($theirs, 'relay', 'finish', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '$wrong')"))[2] =~ /ERROR:  (\w{5}):/;
is($sqlstate, '42501', 'the refusal is insufficient_privilege');

# The right token works, once.
($ret, undef, $err) = as_worker(
	"SELECT pepsi.workqueue_commit($mine, 'relay', 'pause', NULL, NULL, 60, NULL, NULL, NULL, NULL, NULL, NULL, '$token{$mine}')");
is($ret, 0, 'the worker handed the row commits it with its token') or diag($err);
is($node->safe_psql($db, "SELECT status FROM pepsi.workqueue WHERE id = $mine"), 'paused', 'and it is paused');
refused('the same commit again', "SELECT pepsi.workqueue_commit($mine, 'relay', 'finish', NULL, NULL, NULL,"
	  . " NULL, NULL, NULL, NULL, NULL, NULL, '$token{$mine}')",
	qr/workqueue row $mine is paused, not running/);

# A row claimed again (the dispatcher's orphan reset after a crash) gets a
# new token; the stale worker's is refused.
$node->safe_psql($db, 'SELECT pepsi.workqueue_reset_orphans()');
($ret, $claimed) = as_dispatcher(
	"SELECT claim_token FROM pepsi.workqueue_claim_tokens(ARRAY['relay'], ARRAY[10]) WHERE id = $theirs");
isnt($claimed, $token{$theirs}, 'a reclaimed row gets a new token');
($ret, my $recovered, $err) = as_dispatcher("SELECT pg_try_advisory_lock(1346720851, 2);"
	  . " SELECT cardinality(pepsi.workqueue_recover(ARRAY[$theirs], ARRAY['relay'], 'failed', 'worker failed',"
	  . " ARRAY['$token{$theirs}']::uuid[]));"
	  . " SELECT pepsi.workqueue_crashed($theirs, 'relay', 'killed', 3, 10, 'failed', '$token{$theirs}') IS NULL");
is($recovered, "t\n0\nt",
	'the dispatcher\'s recovery of the stale worker\'s failure or crash leaves the reclaimed row alone')
  or diag($err);
is($node->safe_psql($db, "SELECT status FROM pepsi.workqueue WHERE id = $theirs"), 'running', 'it is still running');
refused('a commit with the stale token',
	"SELECT pepsi.workqueue_commit_many(ARRAY[$theirs], ARRAY['relay'], 'finish', NULL, NULL, NULL,"
	  . " ARRAY['$token{$theirs}']::uuid[])",
	qr/claim token for workqueue row $theirs does not match/);
($ret, undef, $err) = as_worker(
	"SELECT pepsi.workqueue_commit_many(ARRAY[$theirs], ARRAY['relay'], 'finish', NULL, NULL, NULL,"
	  . " ARRAY['$claimed']::uuid[])");
is($ret, 0, 'the new token finishes it') or diag($err);
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.workqueue WHERE id = $theirs"), 0, 'the row is gone');

# A row claimed by the claim of older dispatchers has no token, and the
# overloads of older programs (no token) change it: the upgrade path.
$node->safe_psql($db, "SELECT pepsi.workqueue_resume(ARRAY[$mine])");
($ret, $claimed) = as_dispatcher("SELECT id FROM pepsi.workqueue_claim(ARRAY['relay'], ARRAY[10])");
is($claimed, $mine, 'the tokenless claim still claims');
refused('a token on a row claimed without one',
	"SELECT pepsi.workqueue_commit($mine, 'relay', 'finish', NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
	  . " NULL, NULL, '$token{$mine}')",
	qr/claim token for workqueue row $mine does not match/);
($ret, undef, $err) = as_worker("SELECT pepsi.workqueue_commit($mine, 'relay', 'finish')");
is($ret, 0, 'and the tokenless commit finishes it') or diag($err);

is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.apply_grants()'), 0, 'the grants have no drift');

done_testing();
