# pepsi-stage-relay-to-maildir runs fused after pepsi-stage-vacation, its
# bodies loaded late (stage.h late_load): in the multi-call binary a
# vacation worker takes the rows waiting for it as one batch, loads their
# headers with one statement, and the rows going on to the maildir stage
# have their bodies loaded with one more and are delivered as one batch
# (the stage's prepare: the helper is sent them all before it answers),
# the deliveries committed together.  So a local message on make run's graph is claimed,
# loaded and committed once for the two stages instead of twice.  A row
# of two recipients (which maildir would split) advances to the maildir
# stage, as does every row in a standalone vacation worker, which has no
# registry.  Statements counted with pg_stat_statements.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiStage;
use PepsiTest;

plan skip_all => 'pepsi-helper-maildir-writer is not built' unless -x pepsi_bin('pepsi-helper-maildir-writer');

my $node = stage_node('vacation_maildir_fusion');
my $base = PostgreSQL::Test::Utils::tempdir();
my $root = "$base/mail";
mkdir $root or die "cannot create $root: $!";

my ($writer, $requests_held) = recording_maildir_writer($base);

my $conf = stage_config($node, 'fusion.conf', <<"INI");
[pepsi]
HOSTNAME = mail.local.test

[stage-vacation]
PROGRAM = pepsi-stage-vacation
NEXT_STAGE = maildir
REPLY_STAGE = init

[stage-maildir]
PROGRAM = pepsi-stage-relay-to-maildir
MAILDIR_ROOT = $root
MAILDIR_WRITER = $writer
CREATE_MAILBOXES = yes
INI

my %Q = %PepsiStage::QUEUE_STATEMENT;
my $load_headers = '%received_at) * $_)::int8::text, w.headers FROM pepsi.workqueue w WHERE w.id = ANY%';

my @to = ('alice@local.test', 'bob@local.test', 'alice@local.test');
my @ids = map { add_row($node, 'vacation', rcpt => [$_]) } @to;
my $two = add_row($node, 'vacation', rcpt => [ 'carol@local.test', 'dave@local.test' ]);
reset_statements($node);
my $r = run_worker(unified_cmd('pepsi-stage-vacation', $conf), join('', map { "$_\n" } @ids, $two));
is($r->{exit}, 0, 'fused: the vacation worker ends with its input') or diag($r->{stderr});
my @reports = map { my (undef, $report) = decode_status($_); $report } @{ $r->{status} };
is_deeply([ map { $_ && $_->{fused} ? $_->{fused}[0]{stage} : 'none' } @reports ],
	[qw(maildir maildir maildir none)],
	'fused: the one-recipient rows ran the maildir stage in vacation\'s pass, the two-recipient row did not');
is_deeply([ deliveries($r->{status}) ], [qw(sent sent sent none)], 'fused: delivered');
is(scalar(maildir_files($root, 'alice@local.test')), 2, 'fused: alice has her two messages');
is(scalar(maildir_files($root, 'bob@local.test')), 1, 'fused: bob has his');
like(slurp((maildir_files($root, 'bob@local.test'))[0]), qr/Subject: test\r?\n.*\r?\n\r?\nHello\./s,
	'fused: with the headers and the body, loaded late');
is($requests_held->(), '3/2', 'fused: the three delivered as one batch (the first two held for the third)');
is(statement_calls($node, $load_headers), '1/4', 'fused: the batch\'s headers loaded with one statement');
is(statement_calls($node, $Q{late_full}), '1/3', 'fused: the bodies of the rows going on, with one more');
is((split m{/}, statement_calls($node, $Q{commit_many}))[0], 1, 'fused: the three deliveries committed together');
ok(!defined row_json($node, $ids[0]) && !defined row_json($node, $ids[1]) && !defined row_json($node, $ids[2]),
	'fused: the delivered rows are done, never at the maildir stage\'s queue');
is_deeply([ @{ row_json($node, $two) }{qw(stage status)} ], [ 'maildir', 'pending' ],
	'fused: the two-recipient row advances to the maildir stage');

#
# A standalone vacation worker has no registry: the row advances.
#
my $plain = add_row($node, 'vacation', rcpt => ['erin@local.test']);
$r = run_worker(worker_cmd('pepsi-stage-vacation', $conf), "$plain\n");
is_deeply($r->{status}, ['0'], 'standalone: a plain status line');
is_deeply([ @{ row_json($node, $plain) }{qw(stage status)} ], [ 'maildir', 'pending' ],
	'standalone: the row advances to the maildir stage, undelivered');
is(scalar(maildir_files($root, 'erin@local.test')), 0, 'standalone: nothing delivered by vacation');

done_testing();
