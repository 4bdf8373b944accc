# pepsi-stage-relay-to-smarthost takes the rows waiting for its worker as
# one batch: one load, every message through its one SMTP session, and
# each row's own outcome (250, 451, 550) committed, the deliveries in one
# pepsi.workqueue_commit_many, before any status line is written.
# Statements counted with pg_stat_statements, the SMTP side with the
# scripted peer t/bin/smtp-peer.

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
LOCAL_STAGE = lmtp
REMOTE_STAGE = smarthost

[stage-lmtp]
PROGRAM = pepsi-stage-relay-to-lmtp

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

my $load_full = '%w.headers, b.body FROM pepsi.workqueue w JOIN%';
my $load_meta = '%w.received_at)::text FROM pepsi.workqueue w WHERE w.id = ANY%';
my $late_full = 'SELECT w.id::text, w.headers, b.body FROM%';
my $commit_one = '%pepsi.workqueue_commit(%';
my $commit_many = '%pepsi.workqueue_commit_many(%';

# The SMTP sessions the peer served (each connection is its own process).
sub sessions
{
	my %pids = map { /^(\d+) -> EHLO/i ? ($1 => 1) : () } split /\n/, slurp("$peer->{dir}/transcript") // '';
	return scalar keys %pids;
}

# Each status line's delivery status, or 'none'.
sub deliveries
{
	my ($lines) = @_;
	return map {
		my (undef, $report) = decode_status($_);
		$report && $report->{delivery} ? $report->{delivery}{status} : 'none'
	} @$lines;
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

done_testing();
