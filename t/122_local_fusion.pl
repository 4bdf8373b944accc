# Local mail on make run's graph (route -> dot-forward -> vacation ->
# relay-to-maildir) runs as one pass of the route worker in the multi-call
# binary: dot-forward passes on a row none of whose recipients may have a
# .forward without loading it (stage.h fuses_passing_on), vacation loads
# late what it and the maildir stage after it need, with one statement for
# the batch, and the maildir stage delivers the batch's rows together, the
# deliveries committed together.  So a
# local message is claimed, loaded and committed once from route to its
# mailbox, and vacation reads the batch's recipients' settings with one
# statement.  A recipient that is a system user (who may have a .forward)
# stops the row at the dot-forward stage, for its own workers, as does
# every row in a standalone route worker.  Statements counted with
# pg_stat_statements.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiStage;
use PepsiTest;

plan skip_all => 'pepsi-helper-maildir-writer is not built' unless -x pepsi_bin('pepsi-helper-maildir-writer');

# A system user every machine has, whose local part dot-forward must look up.
my $system_user = (getpwuid(0))[0];

my $node = stage_node('local_fusion');
my $base = PostgreSQL::Test::Utils::tempdir();
my $root = "$base/mail";
mkdir $root or die "cannot create $root: $!";
my ($writer, $requests_held) = recording_maildir_writer($base);

my $conf = stage_config($node, 'fusion.conf', <<"INI");
[pepsi]
HOSTNAME = mail.local.test
LOCAL_DOMAINS = local.test

[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_STAGE = forward
REMOTE_STAGE = remote

[stage-forward]
PROGRAM = pepsi-stage-dot-forward
NEXT_STAGE = vacation
FORWARD_STAGE = forwarded
BOUNCE_STAGE = bounce

[stage-vacation]
PROGRAM = pepsi-stage-vacation
NEXT_STAGE = maildir
REPLY_STAGE = init
VACATION = no

[stage-maildir]
PROGRAM = pepsi-stage-relay-to-maildir
MAILDIR_ROOT = $root
MAILDIR_WRITER = $writer
CREATE_MAILBOXES = yes
INI

my %Q = %PepsiStage::QUEUE_STATEMENT;
my $late_headers = 'SELECT w.id::text, w.headers FROM%';

# The stages a status line's report says ran fused, in order.
sub fused_stages
{
	my ($line) = @_;
	my (undef, $report) = decode_status($line);

	return join(' ', map { $_->{stage} } @{ ($report // {})->{fused} // [] }) || 'none';
}

# The vacation replies queued (at REPLY_STAGE, from the null sender).
sub replies
{
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pepsi.workqueue WHERE stage = 'init' AND mail_from = ''");
}

# pf-alice's own setting (pepsi.settings) turns her vacation on; the
# section's VACATION = no stands for the others.
$node->safe_psql('postgres', "SELECT pepsi.vacation_set('PF-Alice\@Local.Test', 'Away until Monday.')");
my $settings_one = '%FROM pepsi.settings WHERE address = lower($1)%';
my $settings_many = '%unnest($1::text[]) AS a(address) JOIN pepsi.settings%';

my @to = ('pf-alice@local.test', 'pf-bob@local.test', 'pf-alice@local.test');
my @ids = map { add_row($node, 'init', rcpt => [$_], extra_headers => "To: <$_>\r\n") } @to;
my $system = add_row($node, 'init', rcpt => ["$system_user\@local.test"]);
reset_statements($node);
my $r = run_worker(unified_cmd('pepsi-stage-route', $conf), join('', map { "$_\n" } @ids, $system));
is($r->{exit}, 0, 'fused: the route worker ends with its input') or diag($r->{stderr});
is_deeply([ map { fused_stages($_) } @{ $r->{status} } ],
	[ ('forward vacation maildir') x 3, 'none' ],
	'fused: forward, vacation and maildir ran in route\'s pass; the system user\'s row stopped at forward');
is_deeply([ deliveries($r->{status}) ], [qw(sent sent sent none)], 'fused: delivered');
is(scalar(maildir_files($root, 'pf-alice@local.test')), 2, 'fused: pf-alice has her two messages');
is(scalar(maildir_files($root, 'pf-bob@local.test')), 1, 'fused: pf-bob has his');
like(slurp((maildir_files($root, 'pf-bob@local.test'))[0]), qr/Subject: test\r?\n.*\r?\n\r?\nHello\./s,
	'fused: with the headers and the body, loaded late');
is($requests_held->(), '3/2', 'fused: the three delivered as one batch (the first two held for the third)');
is(replies(), 1, 'fused: vacation ran in the pass, by pf-alice\'s own setting (one reply per interval)');
is(join(' ', map { (split m{/}, statement_calls($node, $_))[0] } $settings_many, $settings_one), '1 0',
	'fused: the recipients\' settings read with one statement for the batch');
is(statement_calls($node, $Q{load_meta}), '1/4', 'fused: the batch loaded once, envelopes only');
is(statement_calls($node, $Q{late_full}), '1/3',
	'fused: the headers and bodies of the rows going on to vacation and the maildir, with one statement');
is(statement_calls($node, $late_headers), '0/0', 'fused: none for the headers alone');
is(statement_calls($node, $Q{load_full}), '1/3',
	'fused: that was the one statement to load bodies (none for dot-forward, none for the row it keeps)');
is(join(' ', map { (split m{/}, statement_calls($node, $Q{$_}))[0] } qw(commit_many commit_one)), '1 1',
	'fused: the three deliveries committed together, the advance of the row kept for dot-forward apart');
ok(!defined row_json($node, $ids[0]) && !defined row_json($node, $ids[1]) && !defined row_json($node, $ids[2]),
	'fused: the delivered rows are done, never at a later stage\'s queue');
is_deeply([ @{ row_json($node, $system) }{qw(stage status)} ], [ 'forward', 'pending' ],
	'fused: the row for a system user advances to the dot-forward stage, for its own workers');

#
# A standalone route worker has no registry: the row advances to forward.
#
my $plain = add_row($node, 'init', rcpt => ['pf-carol@local.test']);
$r = run_worker(worker_cmd('pepsi-stage-route', $conf), "$plain\n");
is_deeply($r->{status}, ['0'], 'standalone: a plain status line');
is_deeply([ @{ row_json($node, $plain) }{qw(stage status)} ], [ 'forward', 'pending' ],
	'standalone: the row advances to the dot-forward stage');
is(scalar(maildir_files($root, 'pf-carol@local.test')), 0, 'standalone: nothing delivered by route');

#
# ALLOW_FUSION = no: the same, in the multi-call binary.
#
(my $text = slurp($conf)) =~ s/^\[pepsi\]\n/[pepsi]\nALLOW_FUSION = no\n/m;
my $unfused = stage_config($node, 'unfused.conf', $text);
my $kept = add_row($node, 'init', rcpt => ['pf-dan@local.test']);
$r = run_worker(unified_cmd('pepsi-stage-route', $unfused), "$kept\n");
is_deeply($r->{status}, ['0'], 'ALLOW_FUSION = no: a plain status line');
is_deeply([ @{ row_json($node, $kept) }{qw(stage status)} ], [ 'forward', 'pending' ],
	'ALLOW_FUSION = no: the row advances to the dot-forward stage');

done_testing();
