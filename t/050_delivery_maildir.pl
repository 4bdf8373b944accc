# Local delivery into Maildirs under pepsi-dispatch: the file is the stored
# message plus Return-Path and Delivered-To, byte for byte, in new/ with
# nothing left in tmp/ and a unique name each; a missing mailbox bounces
# (5.1.1) unless CREATE_MAILBOXES; an unwritable one is a temporary failure
# retried once fixed; NOTIFY=SUCCESS gets a "delivered" DSN; RET=HDRS
# returns the headers only; a row with several local recipients is split.

use strict;
use warnings FATAL => 'all';


use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('delivery_maildir');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $_) for $sender, 'alice@local.test', 'Bob@Local.Test';

sub dsns { return maildir_files($root, $sender) }

my $config = delivery_config($node, maildir_root => $root);
my $d = start_dispatcher($config);

# The file is the message, byte for byte, after the two headers.
my $headers = "From: <$sender>\r\nTo: <alice\@local.test>\r\nSubject: hello alice\r\n";
my $body = "line one\r\n.dot line\r\n\r\nlast line\r\n";
my $id = inject($node, to => ['alice@local.test'], headers => $headers, body => $body);
ok(poll_until(sub { queue_count($node) == 0 }), 'the message is delivered and its row finished');
my @files = maildir_files($root, 'alice@local.test');
is(scalar @files, 1, 'one file in alice\'s new/');
is(slurp($files[0]),
	"Return-Path: <$sender>\r\nDelivered-To: alice\@local.test\r\n$headers\r\n$body",
	'it is Return-Path, Delivered-To, the headers, CRLF and the body');
like($files[0], qr{/new/\d+\.M\d{6}K\d+_0\.[^/]+,S=\d+$}, 'named time.MusecKrow_0.host,S=size, the same on every attempt');
opendir my $tmp_dir, "$root/alice\@local.test/tmp";
is(scalar(grep { !/^\./ } readdir $tmp_dir), 0, 'nothing is left in tmp/');
closedir $tmp_dir;

# Five more: five distinct names.
inject($node, to => ['alice@local.test'], body => "copy $_\r\n") for 1 .. 5;
ok(poll_until(sub { scalar(maildir_files($root, 'alice@local.test')) == 6 }), 'five more files');
my %names = map { $_ => 1 } maildir_files($root, 'alice@local.test');
is(scalar keys %names, 6, 'every name is unique');

# The mailbox name is the address, lower-cased.
inject($node, to => ['BOB@local.test']);
ok(poll_until(sub { scalar(maildir_files($root, 'bob@local.test')) == 1 }),
	'BOB@local.test is delivered to the mailbox bob@local.test');

# A missing mailbox: a DSN, 5.1.1, no Remote-MTA.
inject($node, to => ['nobody@local.test'],
	headers => "From: <$sender>\r\nSubject: to nobody\r\n", body => "lost body\r\n");
ok(poll_until(sub { scalar(dsns()) == 1 && queue_count($node) == 0 }), 'a missing mailbox bounces');
my $dsn = parse_dsn(slurp((dsns())[-1]));
my ($message, $recipients) = dsn_fields($dsn);
is($recipients->[0]{'final-recipient'}, 'rfc822; nobody@local.test', 'Final-Recipient');
is($recipients->[0]{status}, '5.1.1', 'Status: 5.1.1');
is($recipients->[0]{action}, 'failed', 'Action: failed');
ok(!exists $recipients->[0]{'remote-mta'}, 'no Remote-MTA for a local failure');
like($recipients->[0]{'diagnostic-code'}, qr/^X-Pepsi; mailbox <nobody\@local\.test> does not exist/,
	'Diagnostic-Code says why');
ok(!-e "$root/nobody\@local.test", 'no mailbox was created');

# RET=HDRS: the failure DSN returns the headers only.
inject($node, to => ['nobody@local.test'], state => '{"dsn":{"ret":"HDRS","envid":"hdrs-1"}}',
	headers => "From: <$sender>\r\nSubject: headers only\r\n", body => "secret body\r\n");
ok(poll_until(sub { scalar(dsns()) == 2 && queue_count($node) == 0 }), 'RET=HDRS: a DSN');
$dsn = parse_dsn(slurp((dsns())[-1]));
my ($part) = grep { $_->effective_type eq 'text/rfc822-headers' } $dsn->parts;
ok($part, 'with a text/rfc822-headers part');
like($part ? $part->as_string : '', qr/Subject: headers only/, 'holding the headers');
unlike(slurp((dsns())[-1]), qr/secret body/, 'and not the body');
($message) = dsn_fields($dsn);
is($message->{'original-envelope-id'}, 'hdrs-1', 'Original-Envelope-Id');

# NOTIFY=SUCCESS: a "delivered" DSN.
inject($node, to => ['alice@local.test'], state => '{"dsn":{"rcpt":[{"notify":"SUCCESS","orcpt":"rfc822;Alice@Local.Test"}]}}');
ok(poll_until(sub { scalar(dsns()) == 3 && queue_count($node) == 0 }), 'NOTIFY=SUCCESS: a DSN');
$dsn = parse_dsn(slurp((dsns())[-1]));
($message, $recipients) = dsn_fields($dsn);
is($recipients->[0]{action}, 'delivered', 'Action: delivered');
is($recipients->[0]{status}, '2.0.0', 'Status: 2.0.0');
is($recipients->[0]{'original-recipient'}, 'rfc822; Alice@Local.Test', 'Original-Recipient from ORCPT');
is(scalar(maildir_files($root, 'alice@local.test')), 7, 'and alice got the message');

# Three local recipients, one without a mailbox: split, two delivered, one DSN.
inject($node, to => ['alice@local.test', 'nobody@local.test', 'bob@local.test']);
ok(poll_until(sub { scalar(dsns()) == 4 && queue_count($node) == 0 }), 'three recipients: one DSN');
is(scalar(maildir_files($root, 'alice@local.test')) . ' ' . scalar(maildir_files($root, 'bob@local.test')),
	'8 2', 'alice and bob each got their copy');

# An unwritable mailbox is a temporary failure, delivered once fixed.
chmod 0500, "$root/bob\@local.test/tmp";
$id = inject($node, to => ['bob@local.test'], body => "retried\r\n");
ok(poll_until(sub { queue_count($node, "id = $id AND status = 'paused'") == 1 }),
	'an unwritable mailbox: the row is paused');
like($node->safe_psql('postgres', "SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $id"),
	qr/cannot write to mailbox .*Permission denied/, 'state.last_error says why');
chmod 0700, "$root/bob\@local.test/tmp";
ok(poll_until(sub { queue_count($node) == 0 }), 'delivered on a retry once it is writable');
like(slurp((maildir_files($root, 'bob@local.test'))[-1]), qr/retried\r\n\z/, 'the retried message');
is(scalar(dsns()), 4, 'no DSN for a temporary failure');
is(stop_dispatcher($d), 0, 'the dispatcher stops');

# CREATE_MAILBOXES = yes: a new mailbox on first delivery.
$config = delivery_config($node, maildir_root => $root,
	extra => { maildir => "CREATE_MAILBOXES = yes\n" });
$d = start_dispatcher($config);
inject($node, to => ['newcomer@local.test']);
ok(poll_until(sub { scalar(maildir_files($root, 'newcomer@local.test')) == 1 }),
	'CREATE_MAILBOXES: the mailbox is made and the message delivered');
ok(-d "$root/newcomer\@local.test/cur", 'with tmp, new and cur');
is(scalar(dsns()), 4, 'and no DSN');
is(stop_dispatcher($d), 0, 'the dispatcher stops');

# The multi-call binary: a bounce is made and delivered in the pass that
# found the mailbox missing (maildir -> bounce -> dsn-route -> dsn-maildir).
# dsn-maildir takes its rows late (a prepare, with the others of its
# batch), and a pass goes on to such a successor only within its first
# second (STAGE_LATE_FUSION_US): past that the row advances as it is, to a
# dsn-maildir worker of its own, as on a loaded machine.  So a missing
# mailbox is tried up to five times, until a pass runs all three fused;
# each attempt's hops are read once the dispatcher has flushed them (its
# statistics, once the pipeline is idle: the pass's report reaches it
# after the pass has committed).
SKIP:
{
	my $multicall = pepsi_bin('pepsi');
	skip 'the multi-call binary is not built', 5 unless -x $multicall;
	$config = delivery_config($node, maildir_root => $root);
	$d = start_dispatcher($config, program => [ $multicall, 'pepsi-dispatch' ]);
	my $maildir_hops = sub {
		return $node->safe_psql('postgres',
			"SELECT coalesce(max(fused_hops), 0) FROM pepsi.stage_stats WHERE stage = 'maildir'");
	};
	my ($arrived, $hops, $before, $offset, $started_worker) = (1, '', 0, 0, '');
	for my $attempt (1 .. 5)
	{
		$offset = length dispatcher_log($d);
		$before = $maildir_hops->();
		inject($node, to => ["ghost$attempt\@local.test"], headers => "From: <$sender>\r\nSubject: fused\r\n");
		$arrived &&= poll_until(sub { scalar(dsns()) == 4 + $attempt && queue_count($node) == 0 });
		last unless $arrived;
		poll_until(sub { $maildir_hops->() >= $before + 2 });
		$hops = $maildir_hops->() - $before;
		($started_worker) = substr(dispatcher_log($d), $offset) =~ /(stage (?:bounce|dsn-route|dsn-maildir): started worker)/;
		last if $hops == 3;
		note("attempt $attempt: $hops hops fused" . ($started_worker ? " ($started_worker)" : ''));
	}
	ok($arrived, 'multi-call: the DSN for a missing mailbox arrives');
	like(slurp((dsns())[-1]), qr/Final-Recipient: rfc822; ghost\d\@local\.test/, 'about the right recipient');
	is($hops, 3, 'the maildir worker ran bounce, dsn-route and dsn-maildir fused: three hops');
	is(stop_dispatcher($d), 0, 'the dispatcher stops');
	is($started_worker // '', '', 'no worker of those stages was started for it');
}

done_testing();
