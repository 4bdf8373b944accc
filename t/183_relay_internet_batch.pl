# pepsi-stage-relay-to-internet takes the rows waiting for its worker as
# one batch, as relay-to-smarthost does: one load, the batch's rows to one
# destination through one SMTP session, each row its own transaction and
# its own outcome (250, 451, 550), the deliveries committed with one
# pepsi.workqueue_commit_many before any status line is written; each row
# asks pepsi.destination_begin for its turn once for a run of rows to one
# destination, carrying on under the slot it holds, unless the
# destination counts each message (a rate limit); the begin also says
# what TLS result is recorded for the domain: a worker that got the same
# does not write it again (no destination_end after a healthy delivery).  Rows of two
# destinations in one batch each go to their own MX host.  And a list's
# VERP fan-out (pepsi.list_fanout) gives a domain's subscribers together,
# so that the rows made of them reach one worker's batch together.
# Statements counted with pg_stat_statements, the SMTP side with the
# scripted peer t/bin/smtp-peer, MX records from the test's DNS server.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiStage;
use PepsiTest;
use TestDNS;

my $node = stage_node('relay_internet_batch');
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $peer = start_peer('--address', '127.0.0.3', '--port', $port,
	'--rcpt', 'soft@=451 4.2.0 mailbox busy',
	'--rcpt', 'gone@=550 5.1.1 <gone@batch.test>: no such user');
my $other = start_peer('--address', '127.0.0.4', '--port', $port);
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
$dns->zone(TestDNS::mx('batch.test', '127.0.0.3') . TestDNS::mx('other.test', '127.0.0.4'));

my $conf = stage_config($node, 'relay.conf', <<"INI");
[pepsi]
HOSTNAME = relay.local.test
DNS_FORWARDER = @{[ $dns->forwarder ]}

[stage-internet]
PROGRAM = pepsi-stage-relay-to-internet
SMTP_PORT = $port
DANE = no
MTA_STS = no
BOUNCE_STAGE = bounce
TIMEOUT = 10s
CONNECT_TIMEOUT = 5s
RETRY_BASE = 1h

[stage-bounce]
PROGRAM = pepsi-stage-discard
INI

my ($load_full, $commit_one, $commit_many) = @QUEUE_STATEMENT{qw(load_full commit_one commit_many)};
my $begin = '%FROM pepsi.destination_begin(%';
my $end = '%SELECT pepsi.destination_end(%';

# The SMTP sessions a peer served (each connection is its own process).
sub sessions
{
	my ($p) = @_;
	my %pids = map { /^(\d+) -> EHLO/i ? ($1 => 1) : () } split /\n/, slurp("$p->{dir}/transcript") // '';
	return scalar keys %pids;
}

#
# A batch of five rows to one destination: three delivered, a 451, a 550.
#
my @to = map { "$_\@batch.test" } qw(one soft two gone three);
my @ids = map { add_row($node, 'internet', rcpt => [$_]) } @to;
reset_statements($node);
my $r = run_worker(worker_cmd('pepsi-stage-relay-to-internet', $conf), join('', map { "$_\n" } @ids));
is($r->{exit}, 0, 'batch: the worker ends with its input') or diag($r->{stderr});
is(scalar @{ $r->{status} }, 5, 'batch: one status line a row');
is_deeply([ deliveries($r->{status}) ],
	[qw(sent deferred sent bounced sent)], 'batch: each row reports its own outcome, in order');
my @got = peer_messages($peer);
is(scalar @got, 3, 'batch: the MX host accepted the three');
is_deeply([ map { $_->{env} =~ /RCPT TO:<([^>]+)>/ ? $1 : '?' } @got ],
	[ 'one@batch.test', 'two@batch.test', 'three@batch.test' ],
	'batch: each in its own transaction');
is(sessions($peer), 1, 'batch: over one SMTP session');
is(statement_calls($node, $load_full), '1/5', 'batch: the five loaded with one statement');
is((split m{/}, statement_calls($node, $commit_many))[0], 1,
	'batch: the three deliveries committed with one statement');
is((split m{/}, statement_calls($node, $commit_one))[0], 2, 'batch: the 451 and the 550 each with its own');
# The first delivery ends its slot to write the TLS result; the second
# asks again and keeps it; the other three carry on under it.
is((split m{/}, statement_calls($node, $begin))[0], 2,
	'batch: the rows to the destination asked for their turn twice, not once a row');
is((split m{/}, statement_calls($node, $end))[0], 1,
	'batch: the first delivery wrote the TLS result, the others kept the slot');
my $tls = $node->safe_psql('postgres', "SELECT tls_policy || ': ' || tls_outcome FROM pepsi.destination WHERE domain = 'batch.test'");
isnt($tls, '', "batch: the domain's TLS result is recorded ($tls)");
ok(!defined row_json($node, $ids[0]) && !defined row_json($node, $ids[2]) && !defined row_json($node, $ids[4]),
	'batch: the delivered rows are done');
my $soft = row_json($node, $ids[1]);
is_deeply([ @$soft{qw(stage status)} ], [ 'internet', 'paused' ], 'batch: the 451 pauses its row at the relay stage');
like($soft->{state}{last_error}, qr/451 4\.2\.0 mailbox busy/, 'batch: with its own reply');
my $gone = row_json($node, $ids[3]);
is($gone->{stage}, 'bounce', 'batch: the 550 sends its row to BOUNCE_STAGE');
like($gone->{state}{last_error}, qr/550 5\.1\.1/, 'batch: with its own reply');

#
# Another worker (its memo empty) to the same domain: destination_begin
# says what is recorded, and the same result is not written again.
#
@ids = map { add_row($node, 'internet', rcpt => [$_]) } qw(six@batch.test seven@batch.test);
reset_statements($node);
$r = run_worker(worker_cmd('pepsi-stage-relay-to-internet', $conf), join('', map { "$_\n" } @ids));
is_deeply([ deliveries($r->{status}) ], [qw(sent sent)], 'recorded: both delivered') or diag($r->{stderr});
is((split m{/}, statement_calls($node, $end))[0], 0,
	'recorded: no destination_end, the TLS result being the one recorded');
is((split m{/}, statement_calls($node, $begin))[0], 1, 'recorded: one destination_begin for the two');

#
# A destination with a rate limit: each message asks for its turn.
#
$node->safe_psql('postgres', "SELECT pepsi.destination_set_limits('batch.test', NULL, 600000)");
@ids = map { add_row($node, 'internet', rcpt => [$_]) } qw(eight@batch.test nine@batch.test ten@batch.test);
reset_statements($node);
$r = run_worker(worker_cmd('pepsi-stage-relay-to-internet', $conf), join('', map { "$_\n" } @ids));
is_deeply([ deliveries($r->{status}) ], [qw(sent sent sent)], 'rate limit: all delivered') or diag($r->{stderr});
is((split m{/}, statement_calls($node, $begin))[0], 3, 'rate limit: one destination_begin a message');
$node->safe_psql('postgres', "SELECT pepsi.destination_set_limits('batch.test', NULL, NULL)");

#
# Two destinations in one batch: each row to its own domain's MX host.
#
my $before = scalar(peer_messages($peer));
@ids = map { add_row($node, 'internet', rcpt => [$_]) } qw(four@batch.test x@other.test five@batch.test);
reset_statements($node);
$r = run_worker(worker_cmd('pepsi-stage-relay-to-internet', $conf), join('', map { "$_\n" } @ids));
is_deeply([ deliveries($r->{status}) ], [qw(sent sent sent)], 'two destinations: every row delivered')
  or diag($r->{stderr});
is(statement_calls($node, $load_full), '1/3', 'two destinations: one batch');
is_deeply([ map { $_->{env} =~ /RCPT TO:<([^>]+)>/ ? $1 : '?' } (peer_messages($peer))[ $before .. $before + 1 ] ],
	[ 'four@batch.test', 'five@batch.test' ], 'two destinations: batch.test\'s rows to its MX host');
is_deeply([ map { $_->{env} =~ /RCPT TO:<([^>]+)>/ ? $1 : '?' } peer_messages($other) ],
	['x@other.test'], 'two destinations: other.test\'s to its own');
is(scalar(grep { defined row_json($node, $_) } @ids), 0, 'two destinations: the rows are done');

#
# A VERP list's fan-out: a domain's subscribers together, by domain then address.
#
my $list = $node->safe_psql('postgres', q{
	SELECT pepsi.list_configure(id, 'verp', 'true') IS NULL OR true, id
	FROM (SELECT pepsi.list_create('news@lists.test', 'owner@lists.test', 'News') AS id) c});
($list) = $list =~ /\|(\d+)$/;
$node->safe_psql('postgres',
	"SELECT pepsi.list_member_add($list, a) FROM unnest(ARRAY['a\@y.test', 'b\@x.test', 'c\@y.test',"
	  . " 'd\@x.test', 'e\@z.test', 'f\@x.test']) a");
is($node->safe_psql('postgres',
		"SELECT string_agg(g->'rcpt_to'->>0, ' ' ORDER BY n)"
		  . " FROM jsonb_array_elements(pepsi.list_fanout($list, 'internet')) WITH ORDINALITY AS x(g, n)"),
	'b@x.test d@x.test f@x.test a@y.test c@y.test e@z.test',
	'VERP fan-out: one group a subscriber, a domain\'s together');
like($node->safe_psql('postgres',
		"SELECT pepsi.list_fanout($list, 'internet')->3->>'mail_from'"),
	qr/^news-bounces\+a=y\.test\@lists\.test$/, 'VERP fan-out: each group its own return path');

done_testing();
