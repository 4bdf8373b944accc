# pepsi-stage-relay-to-maildir through pepsi-helper-maildir-writer under
# pepsi-dispatch, the helper without its bit (as make run has it: the
# mailboxes are the run user's): a mailbox over its Maildir++ quota gives
# the configured status, 5.2.2 and a bounce or 4.2.2 and a retry; a helper
# killed in the middle of a message leaves nothing in new/ and the row is
# retried and delivered whole; a local part that could be a path is
# refused at RCPT by pepsi-ingress and, admitted by other means, bounced
# by the stage without touching the file system.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use SmtpClient;
use Test::More;
use Time::HiRes qw(usleep);

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-helper-maildir-writer is not built' unless -x pepsi_bin('pepsi-helper-maildir-writer');

my $node = delivery_node('maildir_helper');
my $base = PostgreSQL::Test::Utils::tempdir();
my $root = "$base/mail";
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
mkdir $root;
make_mailbox($root, $_) for $sender, 'alice@local.test', 'full@local.test';

sub dsns { return maildir_files($root, $sender) }

sub set_quota
{
	my ($address, $limits) = @_;
	open my $fh, '>', "$root/$address/maildirsize" or die;
	print $fh "$limits\n0 0\n";
	close $fh;
}
set_quota('full@local.test', '1000S');

my $body = ('0123456789' x 200) . "\r\n";
my $config = delivery_config($node, maildir_root => $root, extra => { maildir => "PARALLELISM = 1\n" });
my $d = start_dispatcher($config);

# Over quota: 5.2.2 and a bounce.
inject($node, to => ['alice@local.test'], body => "first\r\n");
ok(poll_until(sub { scalar(maildir_files($root, 'alice@local.test')) == 1 }), 'a message is delivered through the helper');
inject($node, to => ['full@local.test'], headers => "From: <$sender>\r\nSubject: too big\r\n", body => $body);
ok(poll_until(sub { scalar(dsns()) == 1 && queue_count($node) == 0 }), 'over quota: a DSN comes back');
my ($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
is($recipients->[0]{status}, '5.2.2', 'Status: 5.2.2 (mailbox full)');
is($recipients->[0]{action}, 'failed', 'Action: failed');
like($recipients->[0]{'diagnostic-code'}, qr/^X-Pepsi; mailbox of <full\@local\.test> is over quota/,
	'Diagnostic-Code says so');
is(scalar(maildir_files($root, 'full@local.test')), 0, 'nothing was delivered');
is(stop_dispatcher($d), 0, 'the dispatcher stops');

# OVER_QUOTA_STATUS = 4.2.2: the row waits, and is delivered once there is room.
$config = delivery_config($node, maildir_root => $root,
	extra => { maildir => "PARALLELISM = 1\nOVER_QUOTA_STATUS = 4.2.2\n" });
$d = start_dispatcher($config);
my $id = inject($node, to => ['full@local.test'], body => $body);
ok(poll_until(sub { queue_count($node, "id = $id AND status = 'paused'") == 1 }),
	'OVER_QUOTA_STATUS = 4.2.2: the row is paused');
like($node->safe_psql('postgres', "SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $id"),
	qr/over quota/, 'state.last_error says why');
is(scalar(dsns()), 1, 'no DSN');
set_quota('full@local.test', '100000S');
ok(poll_until(sub { queue_count($node) == 0 }), 'with room made, a retry delivers it');
is(scalar(maildir_files($root, 'full@local.test')), 1, 'into new/');
open my $sizes, '<', "$root/full\@local.test/maildirsize" or die;
my @lines = <$sizes>;
close $sizes;
like($lines[-1], qr/^\d+ 1$/, 'and maildirsize counts it');

# The helper killed in the middle of a message: nothing in new/, the row retries.
{
	my ($worker) = worker_pids($d, 'relay-to-maildir');
	ok($worker, 'the maildir stage has its worker');
	my $big = ('x' x 1023 . "\n") x (16 * 1024);    # 16 MB
	my $before = scalar(maildir_files($root, 'alice@local.test'));
	$id = inject($node, to => ['alice@local.test'], body => $big);
	my ($helper, $partial);
	# The helper makes its file in tmp/, then copies the message from the
	# stage's pipe: the stage stopped there, the helper waits on the pipe.
	# Found first, the helper is then watched alone for its file (a short
	# look, often): a slower look let a quiet machine copy all 16 MB before
	# the stage stopped.
	for (1 .. 60_000)
	{
		last if $helper = child_of($worker);
		usleep(1_000);
	}
	for (1 .. 300_000)
	{
		last if !$helper || tmp_file_size('alice@local.test', 1);
		usleep(200);
	}
	kill 'STOP', $worker;
	ok($helper && kill(0, $helper), 'the helper runs, writing into tmp/');
	poll_until(sub { ($partial = tmp_file_size('alice@local.test')) > 0 }, 30);
	ok($partial && $partial < length($big), "part of the message is in tmp/ ($partial bytes)");
	kill 'KILL', $helper if $helper;
	kill 'CONT', $worker;
	ok(poll_until(sub { queue_count($node, "id = $id AND status = 'paused'") == 1 }),
		'the row is paused');
	like($node->safe_psql('postgres', "SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $id"),
		qr/killed by signal 9/, 'state.last_error: the helper was killed');
	is(scalar(maildir_files($root, 'alice@local.test')), $before, 'nothing reached new/');
	ok(poll_until(sub { queue_count($node) == 0 }, 60), 'the retry delivers it');
	my @files = maildir_files($root, 'alice@local.test');
	is(scalar(@files), $before + 1, 'one file more in new/');
	is(-s $files[-1], length("Return-Path: <$sender>\r\nDelivered-To: alice\@local.test\r\n"
		  . "From: <$sender>\r\nTo: <alice\@local.test>\r\nSubject: test\r\n\r\n" . $big),
		'the whole message');
}
is(stop_dispatcher($d), 0, 'the dispatcher stops');

# A child of $parent (the helper under the stage worker), from the process table.
sub child_of
{
	my ($parent) = @_;
	opendir my $proc, '/proc' or return undef;
	for my $pid (grep { /^\d+$/ } readdir $proc)
	{
		open my $fh, '<', "/proc/$pid/stat" or next;
		my $stat = <$fh> // '';
		close $fh;
		return $pid if $stat =~ /^\d+ \(pepsi-helper-ma[^)]*\) \S+ (\d+)/ && $1 == $parent;
	}
	return undef;
}

# The size of the file in a mailbox's tmp/ (0: none); with $exists, whether there is one.
sub tmp_file_size
{
	my ($address, $exists) = @_;
	opendir my $dh, "$root/$address/tmp" or return 0;
	my ($file) = grep { !/^\./ } readdir $dh;
	return $file ? 1 : 0 if $exists;
	return $file ? (-s "$root/$address/tmp/$file" // 0) : 0;
}

# Local parts that could be paths: refused at RCPT (LOCAL_RECIPIENTS = maildir) ...
{
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $ingress_config = delivery_config($node, maildir_root => $root,
		pepsi => { LOCAL_RECIPIENTS => 'maildir', MAILDIR_ROOT => $root, LOCAL_DOMAINS => 'local.test' },
		path => "$tmp/ingress.conf");
	PostgreSQL::Test::Utils::append_to_file($ingress_config,
		"[listener-smtp]\nADDRESS = 127.0.0.1\nPORT = $port\n");
	my $ingress = start_ingress($ingress_config, $port, "$tmp/ingress.log");
	my $smtp = SmtpClient->new($port);
	$smtp->command('EHLO client.test');
	like($smtp->command("MAIL FROM:<$sender>"), qr/^250/, 'MAIL FROM');
	like($smtp->command('RCPT TO:<alice@local.test>'), qr/^250/, 'an existing mailbox is accepted');
	for my $case (['../local.test@local.test', 'a parent directory'], ['a/b@local.test', 'a slash'],
		['.hidden@local.test', 'a leading dot'], ["a\x01b\@local.test", 'a control character'],
		[('x' x 300) . '@local.test', 'an over-long local part'])
	{
		my ($address, $what) = @$case;
		like($smtp->command("RCPT TO:<$address>"), qr/^5\d\d /, "RCPT with $what: refused");
	}
	$smtp->command('QUIT');
	kill 'TERM', $ingress->{pid};
	waitpid($ingress->{pid}, 0);
}

# ... and, admitted without a recipient check, bounced before any path is made.
$config = delivery_config($node, maildir_root => $root, extra => { maildir => "CREATE_MAILBOXES = yes\n" });
$d = start_dispatcher($config);
my @bad = ('../escape@local.test', 'a/b@local.test', '.hidden@local.test', ('y' x 300) . '@local.test');
eval { inject($node, to => ["ctl\x01x\@local.test"]) };
like($@, qr/rcpt_to\[1\] has a control character/, 'a control character is refused by the queue itself');
my $dsns_before = scalar(dsns());
inject($node, to => [$_], headers => "From: <$sender>\r\nSubject: bad\r\n") for @bad;
ok(poll_until(sub { scalar(dsns()) == $dsns_before + @bad && queue_count($node) == 0 }),
	'each bad local part bounces');
my %statuses;
for my $dsn ((dsns())[$dsns_before .. $#{ [ dsns() ] }])
{
	my (undef, $r) = dsn_fields(parse_dsn(slurp($dsn)));
	$statuses{ $r->[0]{status} }++;
}
is(join(',', keys %statuses), '5.1.3', 'all with 5.1.3 (bad destination mailbox address syntax)');
opendir my $dh, $root or die;
is(join(' ', sort grep { !/^\.\.?$/ } readdir $dh), "alice\@local.test full\@local.test $sender",
	'no mailbox was made in the root');
opendir $dh, $base or die;
is(join(' ', sort grep { !/^\.\.?$/ } readdir $dh), 'mail', 'nor beside it');
is(stop_dispatcher($d), 0, 'the dispatcher stops');

done_testing();
