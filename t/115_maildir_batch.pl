# pepsi-stage-relay-to-maildir delivers the rows waiting for a worker as
# one batch through one pepsi-helper-maildir-writer: every message of the
# batch in new/ before any row commits, one helper for them all, nothing
# left in tmp/; Maildir++ quota counted across the batch (messages held
# for the same mailbox count before they reach new/); a refusal in the
# middle ends that helper after the earlier messages and the rows after it
# go to a new one.  The helper on its own: a batch's replies come only
# after its last request, and a batch its caller abandons (input ends
# while messages are held) leaves nothing in new/ or tmp/.

use strict;
use warnings FATAL => 'all';

use IPC::Run qw(run);
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-helper-maildir-writer is not built' unless -x pepsi_bin('pepsi-helper-maildir-writer');

my $node = delivery_node('maildir_batch');
my $base = PostgreSQL::Test::Utils::tempdir();
my $root = "$base/mail";
mkdir $root;
make_mailbox($root, $_) for qw(alice@local.test bob@local.test full@local.test);
open my $fh, '>', "$root/full\@local.test/maildirsize" or die;
print $fh "2C\n0 0\n";
close $fh;
# The helper behind a wrapper that counts its starts.
my $starts = "$base/starts";
my $counting = "$base/writer";
open $fh, '>', $counting or die "cannot write $counting: $!";
print $fh "#!/bin/sh\necho \$\$ >> '$starts'\nexec '" . pepsi_bin('pepsi-helper-maildir-writer') . "' \"\$@\"\n";
close $fh;
chmod 0755, $counting or die "cannot chmod $counting: $!";
my $config = delivery_config($node, maildir_root => $root, extra => { maildir => "MAILDIR_WRITER = $counting\n" });

# Rows set running at the maildir stage, as a claim leaves them, handed to one worker at once.
sub run_worker
{
	my (@to) = @_;
	my @ids = map { (add_running_message($node, 'postgres', 'maildir', [$_], "hello $_"))[0] } @to;
	my ($out, $err) = ('', '');
	run [ pepsi_bin('pepsi-stage-relay-to-maildir'), 'worker', '-c', $config ], \join('', map { "$_\n" } @ids),
	  \$out, \$err;
	return ($?, [ split /\n/, $out ], $err, @ids);
}

sub tmp_files
{
	my ($address) = @_;
	opendir my $dh, "$root/$address/tmp" or return 0;
	return scalar grep { !/^\./ } readdir $dh;
}

# How many helpers were started since the last call.
my $started = 0;
sub writer_starts
{
	my $all = () = (slurp($starts) // '') =~ /^\d+$/mg;
	my $new = $all - $started;
	$started = $all;
	return $new;
}

my ($status, $lines, $err, @ids) = run_worker(('alice@local.test', 'bob@local.test') x 3);
is($status, 0, 'the worker ends with its input');
is(scalar(@$lines), 6, 'one status line a row');
is(scalar(grep { /^0/ } @$lines), 6, 'each row concluded') or diag($err);
is(scalar(maildir_files($root, 'alice@local.test')), 3, 'alice has her three messages in new/');
is(scalar(maildir_files($root, 'bob@local.test')), 3, 'bob his three');
is(tmp_files('alice@local.test') + tmp_files('bob@local.test'), 0, 'nothing is left in tmp/');
is(writer_starts(), 1, 'one helper wrote them all');
is(queue_count($node, "stage = 'maildir'"), 0, 'no row is left at the stage');

# Quota across a batch: two messages fit; the batch's own count against the third.
($status, $lines, $err, @ids) = run_worker('alice@local.test', 'full@local.test', 'full@local.test',
	'full@local.test', 'bob@local.test', 'full@local.test', 'alice@local.test');
is(scalar(grep { /^0/ } @$lines), 7, 'each row of the second batch concluded') or diag($err);
is(scalar(maildir_files($root, 'full@local.test')), 2, 'full: two messages in new/, as its quota allows');
is(scalar(maildir_files($root, 'alice@local.test')), 5, 'alice: both of hers, the one after the refusals too');
is(scalar(maildir_files($root, 'bob@local.test')), 4, 'bob: his, after a refusal');
is(queue_count($node, "stage = 'bounce' AND id = ANY ('{$ids[3],$ids[5]}')"), 2,
	'the two over quota bounce');
like($node->safe_psql('postgres', "SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $ids[3]"),
	qr/over quota/, 'as over quota');
is(tmp_files('full@local.test'), 0, 'nothing of theirs in tmp/');
# alice, full, full, full refused; bob, full refused; alice.
is(writer_starts(), 3, 'the two that fit: one helper, with the first; a new one after each refusal');

# The helper itself: replies after the batch's last request, a held batch abandoned leaves nothing.
my $writer = pepsi_bin('pepsi-helper-maildir-writer');
sub request
{
	my ($to, $hold) = @_;
	my $message = "Subject: direct\r\n\r\nbody\r\n";
	return "section stage-maildir\nrecipient $to\nsender s\@local.test\nmailbox $to\ncreate no\n"
	  . "size " . length($message) . "\n" . ($hold ? "hold yes\n" : '') . "\n$message";
}
my $before = scalar(maildir_files($root, 'bob@local.test'));
my ($out, $stderr) = ('', '');
run [ $writer, '-c', $config ], \(request('bob@local.test', 1) . request('bob@local.test', 1)), \$out, \$stderr;
is($out, '', 'a batch whose input ends while held: no reply');
is(scalar(maildir_files($root, 'bob@local.test')), $before, 'nothing in new/');
is(tmp_files('bob@local.test'), 0, 'nor in tmp/');
run [ $writer, '-c', $config ],
  \(request('bob@local.test', 1) . request('alice@local.test', 1) . request('bob@local.test', 0)), \$out, \$stderr;
like($out, qr/\A(2\.0\.0 delivered to [^\n]+\n){3}\z/, 'a batch of three: three replies, in order') or diag($stderr);
is(scalar(maildir_files($root, 'bob@local.test')), $before + 2, 'both of bob\'s in new/');

done_testing();
