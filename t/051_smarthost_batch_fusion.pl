# pepsi-stage-relay-to-smarthost takes the rows waiting for its worker as
# one batch: one load, every message through its one SMTP session, and
# each row's own outcome (250, 451, 550) committed, the deliveries in one
# pepsi.workqueue_commit_many, before any status line is written.  In the
# multi-call binary it also runs fused after route, a body-free stage:
# route's pass loads the remote rows' bodies in one more statement and
# delivers them itself, so each row is claimed, loaded and committed once
# (a 451 in that pass pauses the row at the relay stage, as its own worker
# would); a row routed to a stage that does not load late, and any row in
# a standalone worker, advances as before.  Statements counted with
# pg_stat_statements, the SMTP side with the scripted peer t/bin/smtp-peer.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiStage;
use PepsiTest;

my $node = stage_node('smarthost_batch');
my $peer = start_peer('--rcpt', 'soft@=451 4.2.0 mailbox busy', '--rcpt',
	'gone@=550 5.1.1 <gone@remote.test>: no such user');

my $conf = stage_config($node, 'relay.conf', <<"INI");
[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = local.test
LOCAL_STAGE = maildir
REMOTE_STAGE = smarthost

[stage-maildir]
PROGRAM = pepsi-stage-relay-to-maildir

[stage-smarthost]
PROGRAM = pepsi-stage-relay-to-smarthost
SMARTHOST = 127.0.0.1:$peer->{port}
TLS = none
BOUNCE_STAGE = bounce
TIMEOUT = 10s
CONNECT_TIMEOUT = 5s
RETRY_BASE = 1h

[stage-bounce]
PROGRAM = pepsi-stage-discard
INI

my ($load_full, $load_meta, $late_full, $commit_one, $commit_many) =
  @QUEUE_STATEMENT{qw(load_full load_meta late_full commit_one commit_many)};

# The SMTP sessions the peer served (each connection is its own process).
sub sessions
{
	my %pids = map { /^(\d+) -> EHLO/i ? ($1 => 1) : () } split /\n/, slurp("$peer->{dir}/transcript") // '';
	return scalar keys %pids;
}

#
# A batch of five at the relay stage, standalone worker: three delivered,
# a 451, a 550, each row its own outcome.
#
my @to = map { "$_\@remote.test" } qw(one soft two gone three);
my @ids = map { add_row($node, 'smarthost', rcpt => [$_]) } @to;
reset_statements($node);
my $r = run_worker(worker_cmd('pepsi-stage-relay-to-smarthost', $conf), join('', map { "$_\n" } @ids));
is($r->{exit}, 0, 'batch: the worker ends with its input') or diag($r->{stderr});
is(scalar @{ $r->{status} }, 5, 'batch: one status line a row');
is_deeply([ deliveries($r->{status}) ],
	[qw(sent deferred sent bounced sent)], 'batch: each row reports its own outcome, in order');
is(scalar(peer_messages($peer)), 3, 'batch: the peer accepted the three');
is(sessions(), 1, 'batch: over one SMTP session');
is(statement_calls($node, $load_full), '1/5', 'batch: the five loaded with one statement');
is((split m{/}, statement_calls($node, $commit_many))[0], 1,
	'batch: the three deliveries committed with one statement');
is((split m{/}, statement_calls($node, $commit_one))[0], 2, 'batch: the 451 and the 550 each with its own');
ok(!defined row_json($node, $ids[0]) && !defined row_json($node, $ids[2]) && !defined row_json($node, $ids[4]),
	'batch: the delivered rows are done');
my $soft = row_json($node, $ids[1]);
is_deeply([ @$soft{qw(stage status)} ], [ 'smarthost', 'paused' ], 'batch: the 451 pauses at the relay stage');
like($soft->{state}{last_error}, qr/451 4\.2\.0 mailbox busy/, 'batch: with its own reply');
my $gone = row_json($node, $ids[3]);
is($gone->{stage}, 'bounce', 'batch: the 550 goes to BOUNCE_STAGE');
like($gone->{state}{last_error}, qr/550 5\.1\.1/, 'batch: with its own reply');

#
# Route fused into the relay, the body loaded late: four remote rows (one
# a 451) and a local one, one route worker's batch.
#
my $before = scalar(peer_messages($peer));
my @fused_to = ('four@remote.test', 'soft@remote.test', 'alice@local.test', 'five@remote.test',
	'six@remote.test');
@ids = map { add_row($node, 'init', rcpt => [$_]) } @fused_to;
reset_statements($node);
$r = run_worker(unified_cmd('pepsi-stage-route', $conf), join('', map { "$_\n" } @ids));
is($r->{exit}, 0, 'fused: the route worker ends with its input') or diag($r->{stderr});
my @reports = map { my (undef, $report) = decode_status($_); $report } @{ $r->{status} };
is_deeply([ map { $_ && $_->{fused} ? $_->{fused}[0]{stage} : 'none' } @reports ],
	[qw(smarthost smarthost none smarthost smarthost)],
	'fused: the remote rows ran the relay stage in route\'s pass, the local one did not');
is_deeply([ deliveries($r->{status}) ],
	[qw(sent deferred none sent sent)], 'fused: each with its own outcome');
my @got = (peer_messages($peer))[ $before .. $before + 2 ];
is(scalar(grep { $_ && $_->{data} =~ /Subject: test.*\r?\n\r?\nHello\./s } @got), 3,
	'fused: the three went out with their headers and bodies, loaded late');
is(statement_calls($node, $load_meta), '1/5', 'fused: the batch loaded once, without bodies');
is(statement_calls($node, $late_full), '1/4', 'fused: the remote rows\' bodies in one more statement');
is((split m{/}, statement_calls($node, $commit_many))[0], 1, 'fused: the three deliveries committed together');
ok(!defined row_json($node, $ids[0]) && !defined row_json($node, $ids[3]) && !defined row_json($node, $ids[4]),
	'fused: the delivered rows are done, never at the relay stage\'s queue');
$soft = row_json($node, $ids[1]);
is_deeply([ @$soft{qw(stage status)} ], [ 'smarthost', 'paused' ],
	'fused: the 451 pauses at the relay stage, as its own worker would');
like($soft->{state}{last_error}, qr/451 4\.2\.0/, 'fused: with its reply');
is_deeply([ @{ row_json($node, $ids[2]) }{qw(stage status)} ], [ 'maildir', 'pending' ],
	'fused: the local row advances to its stage (one that does not load late)');

#
# A standalone route worker has no registry: the rows advance to the relay.
#
$before = scalar(peer_messages($peer));
my $plain = add_row($node, 'init', rcpt => ['seven@remote.test']);
$r = run_worker(worker_cmd('pepsi-stage-route', $conf), "$plain\n");
is_deeply($r->{status}, ['0'], 'standalone: a plain status line');
is_deeply([ @{ row_json($node, $plain) }{qw(stage status)} ], [ 'smarthost', 'pending' ],
	'standalone: the row advances to the relay stage, undelivered');
is(scalar(peer_messages($peer)), $before, 'standalone: nothing sent by route');

done_testing();
