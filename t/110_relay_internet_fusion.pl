# pepsi-stage-relay-to-internet runs fused after route (body-free) in the
# multi-call binary: route's pass loads the remote rows' bodies late and
# delivers them to their MX hosts itself, so a row is claimed, loaded and
# committed once.  A domain the process saw to be slow (a delivery there
# took DESTINATION_SLOW) is not fused afterwards: its next row advances to
# the relay stage's own workers, so that route's pass, whose other rows
# wait for it, is not held by it again.  One route worker's batch of four:
# fast.test, slow.test (its MX, t/bin/smtp-peer --data-delay 4, takes four
# seconds), slow.test again, fast.test again.  DESTINATION_SLOW (3 s) is
# far from both: a delivery to slow.test cannot take less than its delay
# however idle the machine, and one to fast.test, some milliseconds on an
# idle machine, took over 500 ms (the bound this used to have) at a load
# of 40, which made fast.test slow too.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiStage;
use PepsiTest;
use TestDNS;

my $node = stage_node('internet_fusion');
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $fast = start_peer('--address', '127.0.0.5', '--port', $port);
my $slow = start_peer('--address', '127.0.0.9', '--port', $port, '--data-delay', '4');
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
$dns->zone(TestDNS::mx('fast.test', '127.0.0.5') . TestDNS::mx('slow.test', '127.0.0.9'));

my $forwarder = $dns->forwarder;
my $conf = stage_config($node, 'fusion.conf', <<"INI");
[pepsi]
HOSTNAME = pepsi.local.test
DNS_FORWARDER = $forwarder

[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = local.test
LOCAL_STAGE = bounce
REMOTE_STAGE = internet

[stage-internet]
PROGRAM = pepsi-stage-relay-to-internet
SMTP_PORT = $port
BOUNCE_STAGE = bounce
TIMEOUT = 30s
CONNECT_TIMEOUT = 5s
RETRY_BASE = 1h
DESTINATION_SLOW = 3s

[stage-bounce]
PROGRAM = pepsi-stage-discard
INI

# A batch starts no late-loaded pass once it has run 1 s
# (STAGE_LATE_FUSION_US, common/runtime/stage_internal.h): its rows then
# all advance unfused, for the relay stage's own workers.  On a loaded
# machine route's batch of four took that long before its late load; that
# is a time, not what this file checks, so such a batch (no row fused,
# the four at the relay stage, nothing delivered) is run again with new
# rows, up to five times.
my @to = ('one@fast.test', 'one@slow.test', 'two@slow.test', 'two@fast.test');
my (@ids, $r, @reports);
for my $attempt (1 .. 5)
{
	@ids = map { add_row($node, 'init', rcpt => [$_]) } @to;
	$r = run_worker(unified_cmd('pepsi-stage-route', $conf), join('', map { "$_\n" } @ids));
	@reports = map { my (undef, $report) = decode_status($_); $report } @{ $r->{status} };
	last if $r->{exit} != 0 || grep { $_ && $_->{fused} } @reports;
	last if grep { my $row = row_json($node, $_); !$row || $row->{stage} ne 'internet' } @ids;
	last if peer_messages($fast) || peer_messages($slow);
	note("attempt $attempt: the batch ran out of its time for late fusion; again");
}
is($r->{exit}, 0, 'the route worker ends with its input') or diag($r->{stderr});
is_deeply([ map { $_ && $_->{fused} ? $_->{fused}[0]{stage} : 'none' } @reports ],
	[qw(internet internet none internet)],
	'the relay ran in route\'s pass, but not for the domain it had just seen to be slow');
is_deeply([ map { $_ && $_->{delivery} ? $_->{delivery}{status} : 'none' } @reports ],
	[qw(sent sent none sent)], 'the fused rows were delivered');
is(scalar(peer_messages($fast)), 2, 'fast.test\'s MX host took its two');
is(scalar(peer_messages($slow)), 1, 'slow.test\'s MX host took the first of its two');
ok(!defined row_json($node, $ids[0]) && !defined row_json($node, $ids[1]) && !defined row_json($node, $ids[3]),
	'the delivered rows are done, never at the relay stage\'s queue');
is_deeply([ @{ row_json($node, $ids[2]) }{qw(stage status)} ], [ 'internet', 'pending' ],
	'the second row for the slow domain advanced to the relay stage, for its own workers');

done_testing();
