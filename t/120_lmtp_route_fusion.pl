# pepsi-stage-relay-to-lmtp runs fused after route in the multi-call
# binary, its body loaded late (common/runtime/stage.h late_load): route's pass
# loads the envelopes of its batch, then the bodies of the rows going to
# LMTP in one more statement, and delivers them over one LMTP session to a
# real Dovecot, so a local message is claimed, loaded and committed once.
# Each row keeps its own outcome (a recipient Dovecot does not know is
# refused at RCPT and goes on to the bounce stage); the deliveries commit in one statement; a
# row with two recipients (which relay-to-lmtp may have to fan out) does
# not fuse and advances to the LMTP stage as before.  Statements counted
# with pg_stat_statements.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DovecotTest;
use PepsiStage;
use PepsiTest;

my $node = stage_node('lmtp_route_fusion');
my $dovecot = start_dovecot(users => { alice => {}, bob => {} });

my $conf = stage_config($node, 'lmtp.conf', <<"INI");
[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = local.test
LOCAL_STAGE = lmtp
REMOTE_STAGE = lmtp

[stage-lmtp]
PROGRAM = pepsi-stage-relay-to-lmtp
SERVER = $dovecot->{socket}
BOUNCE_STAGE = bounce
TIMEOUT = 10s
RETRY_BASE = 1h

[stage-bounce]
PROGRAM = pepsi-stage-discard
INI

my ($load_meta, $late_full, $commit_many) = @QUEUE_STATEMENT{qw(load_meta late_full commit_many)};

# Each status line's fused stage and delivery status ('none' when absent).
sub outcomes
{
	my ($lines) = @_;
	return map {
		my (undef, $report) = decode_status($_);
		($report && $report->{fused} ? $report->{fused}[0]{stage} : 'none') . ':'
		  . ($report && $report->{delivery} ? $report->{delivery}{status} : 'none')
	} @$lines;
}

my @ids = (
	add_row($node, 'init', rcpt => ['alice@local.test']),
	add_row($node, 'init', rcpt => ['nobody@local.test']),
	add_row($node, 'init', rcpt => ['bob@local.test']),
	add_row($node, 'init', rcpt => [ 'alice@local.test', 'bob@local.test' ]));
reset_statements($node);
my $r = run_worker(unified_cmd('pepsi-stage-route', $conf), join('', map { "$_\n" } @ids));
is($r->{exit}, 0, 'the route worker ends with its input') or diag($r->{stderr});
is_deeply([ outcomes($r->{status}) ],
	[ 'lmtp:sent', 'lmtp:bounced', 'lmtp:sent', 'none:none' ],
	'the one-recipient rows ran the LMTP stage in route\'s pass, each with its own outcome');

my @alice = dovecot_messages($dovecot, 'alice');
my @bob = dovecot_messages($dovecot, 'bob');
is(scalar @alice, 1, 'alice has the message in her Maildir');
is(scalar @bob, 1, 'bob has his');
like($alice[0] // '', qr/^Subject: test\r?\n(?:.*\r?\n)*\r?\nHello\./m,
	'with the headers and the body, loaded late');
my $sessions = () = slurp_file($dovecot->{log}) =~ /Connect from local/g;
is($sessions, 1, 'over one LMTP session');

is(statement_calls($node, $load_meta), '1/4', 'the batch loaded once, without bodies');
is(statement_calls($node, $late_full), '1/3', 'the fused rows\' bodies in one more statement');
is((split m{/}, statement_calls($node, $commit_many))[0], 1, 'the two deliveries committed together');
ok(!defined row_json($node, $ids[0]) && !defined row_json($node, $ids[2]),
	'the delivered rows are done, never queued at the LMTP stage');
my (undef, $refused) = decode_status($r->{status}[1]);
is(join(' ', map { $_->{stage} } @{ $refused->{fused} // [] }), 'lmtp bounce',
	'the refused recipient\'s row went on to BOUNCE_STAGE in the same pass');
ok(!defined row_json($node, $ids[1]), 'which discarded it');
is_deeply([ @{ row_json($node, $ids[3]) }{qw(stage status)} ], [ 'lmtp', 'pending' ],
	'the row of two recipients advances to the LMTP stage for its own worker');

# That row through the LMTP stage's own worker: one transaction, both delivered.
set_running($node, $ids[3]);
$r = run_worker(worker_cmd('pepsi-stage-relay-to-lmtp', $conf), "$ids[3]\n");
is_deeply([ outcomes($r->{status}) ], ['none:sent'], 'its own worker delivers it');
is(scalar(dovecot_messages($dovecot, 'alice')), 2, 'alice has both messages');
is(scalar(dovecot_messages($dovecot, 'bob')), 2, 'bob too');

done_testing();
