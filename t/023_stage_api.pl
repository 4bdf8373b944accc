# The stage API's calls that no stock stage exercised, each driven through
# a real worker (the probe stage, t/probe/probe.c) against a real cluster:
# pepsi_fan_out (siblings by recipient index and with new addresses, one
# paused for retry, the body shared), pepsi_enqueue_new (a new message at
# another stage, at most once per token), pepsi_finish_with (the row gone,
# its clone created from it server-side) and pepsi_option_for (the
# configuration overlay's address and domain scopes over the file).

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;
use PepsiStage;

my $node = stage_node('stage_api');

# The overlay: read by the worker when it starts.
$node->safe_psql(
	'postgres', q{
SELECT pepsi.config_set('global', 'stage-scoped', 'MAX_LIFETIME', '3d');
SELECT pepsi.config_set('domain:example.net', 'stage-scoped', 'MAX_LIFETIME', '2d');
SELECT pepsi.config_set('address:vip@example.net', 'stage-scoped', 'MAX_LIFETIME', '9d');
});

# Two sections alike but for their name: the overlay has values for the
# first only.
my $option_sections = join "\n", map { <<"INI" } qw(scoped unscoped);
[stage-$_]
PROGRAM = pepsi-test-probe
ACTION = option_for
OPTION = MAX_LIFETIME
MAX_LIFETIME = 5d
NEXT_STAGE = scoped-next
INI

my $conf = stage_config($node, 'api.conf', <<"INI");
[stage-fan]
PROGRAM = pepsi-test-probe
ACTION = fan_out
FAN_STAGE = fanned
NEW_RCPT = forwarded\@example.net
NEXT_STAGE = fan-next

[stage-reply]
PROGRAM = pepsi-test-probe
ACTION = enqueue_new
ENQUEUE_STAGE = replies
NEXT_STAGE = reply-next

[stage-dsn]
PROGRAM = pepsi-test-probe
ACTION = finish_with
CLONE_STAGE = bounce

$option_sections
INI

my %dsn = (rcpt => [ { notify => 'SUCCESS' }, { notify => 'NEVER' }, { notify => 'FAILURE' } ]);

# The server's clock now, as a timestamptz literal's text.
sub server_clock
{
	return $node->safe_psql('postgres', 'SELECT clock_timestamp()');
}

# Run the probe on @ids in one batch; every status line must be 0.
sub run_ok
{
	my ($what, @ids) = @_;
	my $r = run_worker(worker_cmd('pepsi-test-probe', $conf), join('', map { "$_\n" } @ids));

	is_deeply($r->{status}, [ ('0') x @ids ], "$what: one status line 0 per id")
	  or diag($r->{stderr});
	return $r;
}

#
# pepsi_fan_out
#
{
	my $id = add_row($node, 'fan',
		rcpt => [ 'a@example.org', 'b@example.org', 'c@example.org' ],
		state => { dsn => \%dsn });
	my $before = row_json($node, $id);
	# The server's clock around the worker's run: its transaction, whose
	# now() the retry is due from, began between the two.  The due time is
	# checked against them, not against a later query's now(): on a loaded
	# machine the queries in between took 30 s.
	my $run_began = server_clock();
	run_ok('fan_out', $id);
	my $run_ended = server_clock();

	my $row = row_json($node, $id);
	is_deeply([ @$row{qw(stage status)} ], [ 'fan-next', 'pending' ],
		'fan_out: the row itself goes on to NEXT_STAGE');
	is_deeply($row->{rcpt_to}, ['a@example.org'], 'fan_out: it keeps only recipient 1');
	is_deeply($row->{state}{dsn}{rcpt}, [ $dsn{rcpt}[0] ], 'fan_out: and its DSN parameters');

	my @fanned = rows_at($node, 'fanned');
	is(scalar @fanned, 1, 'fan_out: one sibling at the group\'s stage');
	my $indexed = row_json($node, $fanned[0]);
	is_deeply($indexed->{rcpt_to}, [ 'b@example.org', 'c@example.org' ],
		'fan_out: the indexed group has recipients 2 and 3');
	is_deeply($indexed->{state}{dsn}{rcpt}, [ @{ $dsn{rcpt} }[ 1, 2 ] ],
		'fan_out: with their DSN parameters');
	is($indexed->{status}, 'pending', 'fan_out: the indexed group is pending');

	my @forwarded = grep { $_ != $id } rows_at($node, 'fan');
	is(scalar @forwarded, 1, 'fan_out: the group without a stage stays at the current one');
	my $new = row_json($node, $forwarded[0]);
	is_deeply($new->{rcpt_to}, ['forwarded@example.net'], 'fan_out: the new address');
	is($new->{status}, 'paused', 'fan_out: a retry group is paused');
	my ($after_began, $after_ended) = split /\|/,
	  $node->safe_psql('postgres',
		    "SELECT extract(epoch FROM timeout - '$run_began'::timestamptz),"
		  . " extract(epoch FROM timeout - '$run_ended'::timestamptz)"
		  . " FROM pepsi.workqueue WHERE id = $forwarded[0]");
	ok($after_began >= 60 && $after_ended <= 60,
		"fan_out: for its retry_seconds (due $after_began s after the run began, $after_ended s after it ended)");

	is( $node->safe_psql(
			'postgres',
			"SELECT count(DISTINCT body_id) || ' ' || count(*) FROM pepsi.workqueue"
			  . " WHERE id IN ($id, $fanned[0], $forwarded[0])"),
		'1 3',
		'fan_out: the three rows share the one body');
	is($row->{body_id}, $before->{body_id}, 'fan_out: the body the message came with');
}

#
# pepsi_enqueue_new
#
{
	my $id = add_row($node, 'reply', from => 'asker@example.net');
	run_ok('enqueue_new', $id);

	my $row = row_json($node, $id);
	is_deeply([ @$row{qw(stage status)} ], [ 'reply-next', 'pending' ],
		'enqueue_new: the row itself goes on');
	my ($first, $second) = @{ $row->{state}{enqueued} };
	ok($first > 0, 'enqueue_new: the first call returns the new row\'s id');
	is($second, 0, 'enqueue_new: the second call with the same live token creates nothing');
	is_deeply([ rows_at($node, 'replies') ], [$first], 'enqueue_new: one new row, at ENQUEUE_STAGE');

	my $reply = row_json($node, $first);
	is_deeply([ @$reply{qw(status mail_from)} ], [ 'pending', '' ],
		'enqueue_new: pending, from the null sender');
	is_deeply($reply->{rcpt_to}, ['asker@example.net'], 'enqueue_new: to the sender of the row');
	is( $node->safe_psql(
			'postgres',
			"SELECT headers = convert_to(E'Subject: probe reply\\r\\n', 'UTF8') FROM pepsi.workqueue WHERE id = $first"),
		't',
		'enqueue_new: with the headers given');
	is( $node->safe_psql(
			'postgres',
			"SELECT b.body = convert_to(E'An automatic reply.\\r\\n', 'UTF8') FROM pepsi.workqueue w"
			  . " JOIN pepsi.workqueue_body b ON b.id = w.body_id WHERE w.id = $first"),
		't',
		'enqueue_new: and the body given, stored as a body of its own');
	isnt($reply->{body_id}, $row->{body_id}, 'enqueue_new: not the row\'s body');
	my %state = %{ $reply->{state} };
	like(delete $state{queue_id} // '', qr/^[0-9A-Za-z]{15}$/, 'enqueue_new: a new message, with a queue id of its own');
	is_deeply(\%state, { probe => 'reply' }, 'enqueue_new: with the state given');
}

#
# pepsi_finish_with
#
{
	my $id = add_row($node, 'dsn', from => 'author@example.net', state => { dsn => { ret => 'HDRS' } });
	my $before = row_json($node, $id);
	run_ok('finish_with', $id);

	is(row_json($node, $id), undef, 'finish_with: the row is gone');
	my @clones = rows_at($node, 'bounce');
	is(scalar @clones, 1, 'finish_with: one clone, at its stage');
	my $clone = row_json($node, $clones[0]);
	is_deeply([ @$clone{qw(status mail_from)} ], [ 'pending', '' ],
		'finish_with: the clone is pending, from the null sender');
	is_deeply($clone->{rcpt_to}, ['author@example.net'], 'finish_with: to the rcpt_to given');
	is_deeply($clone->{state},
		{ dsn => { ret => 'HDRS' }, bounce => { kind => 'success' } },
		'finish_with: the state given is merged into the row\'s');
	is($clone->{headers}, $before->{headers}, 'finish_with: the headers are copied server-side');
	is($clone->{body_id}, $before->{body_id}, 'finish_with: and the body shared, not copied');
	is( $node->safe_psql(
			'postgres', "SELECT clone_token FROM pepsi.workqueue WHERE id = $clones[0]"),
		"probe-dsn-$id",
		'finish_with: the clone carries its token');
}

#
# pepsi_option_for: address over domain over global over the file, per
# recipient, domains and addresses compared without case.
#
{
	my @rcpt = ('vip@example.net', 'other@Example.NET', 'someone@example.org', 'postmaster');
	my $scoped = add_row($node, 'scoped', rcpt => \@rcpt);
	my $unscoped = add_row($node, 'unscoped', rcpt => \@rcpt);
	run_ok('option_for', $scoped, $unscoped);

	is_deeply(row_json($node, $scoped)->{state}{values}, [ '9d', '2d', '3d', '3d' ],
		'option_for: the address override, the domain override, then the global one');
	is_deeply(row_json($node, $unscoped)->{state}{values}, [ '5d', '5d', '5d', '5d' ],
		'option_for: a section without overrides reads the file');
}

$node->stop;
done_testing();
