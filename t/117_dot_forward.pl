# ~/.forward through pepsi-stage-dot-forward and its setuid-root helper,
# installed as make install does (helper root:GROUP 4750, stage root:GROUP
# 2755) with the dispatcher running as an unprivileged user, for real
# system users: forwarding to another address (Delivered-To stamped),
# "\user" keeping a local copy, a forwarding loop bounced with 5.4.6, a
# .forward that is group-writable or owned by someone else ignored with a
# log line, an :include: file read with the same checks, a command refused
# unless ALLOW_FORWARD_PIPES and, when allowed,
# run as the owner with a clean environment; malformed lines, over-long
# lines and control characters logged and skipped; the helper refuses a
# caller outside its group.

use strict;
use warnings FATAL => 'all';

use RootTest;

use File::Basename qw(dirname);
use File::Temp ();
use Mail::SRS;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('dot_forward');
my $shared = shared_dir();
# The stages' configuration: a set-group-id stage reads only a file root
# alone can change, in directories only root may write.
my $etc = File::Temp::tempdir('pepsi-df-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $etc;
my $homes = "$shared/home";
my $root = "$shared/maildir";
my $sender = 'sender@local.test';
# Names of this run's own (so that two runs at once never share a user).
my $tag = $$ % 1000000;
my %u = map { $_ => "fw$tag$_" } qw(alice bob dave erin frank gina hank ivy jack kim);
my $group = "pepsi-fw$tag";
my $helper = 'pepsi-helper-dot-forward';
my $stage = 'pepsi-stage-dot-forward';
my $bin = "$shared/bin";

mkdir $homes;
mkdir $root;
add_system_group($group);
install_privileged(dirname(pepsi_bin('pepsi-dispatch')), $bin, $group, $helper, $stage);
my %user;
for my $name (grep { $_ ne $u{kim} } values %u) # kim comes later (9.)
{
	add_system_user($name, $homes);
	$user{$name} = [ (getpwnam($name))[ 2, 3 ] ];
}
make_mailbox($root, $_) for $sender, 'carol@local.test', map { "$_\@local.test" } keys %user, $u{kim};
system('chown', '-R', cluster_user() . ':', $root) == 0 or die 'chown';

# Write a .forward owned by $owner (default: the user) with $mode (0644).
sub dot_forward
{
	my ($name, $text, %o) = @_;
	my $path = "$homes/$name/.forward";
	my $owner = $o{owner} // $name;

	open my $fh, '>', $path or die "$path: $!";
	print $fh $text;
	close $fh;
	chown((getpwnam($owner))[ 2, 3 ], $path);
	chmod $o{mode} // 0644, $path;
}

sub config
{
	my (%o) = @_;

	return delivery_config($node, maildir_root => $root,
		path => "$etc/pepsi.conf",
		extra => {
			init => "LOCAL_STAGE = forward\n",
			maildir => "CREATE_MAILBOXES = no\n",
		},
		pepsi => { LOCAL_DOMAINS => 'local.test' })
	  . '';
}

sub write_graph
{
	my (%o) = @_;
	my $path = config();
	my $pipes = $o{pipes} ? 'yes' : 'no';

	open my $fh, '>>', $path or die;
	# Forwarded copies as in the sample graph: ARC-sealed, SRS-rewritten, routed again.
	print $fh "[srs]\nDOMAIN = local.test\nSECRET_FILE = $shared/srs-secret\n"
	  . "[dkim-key-arc]\nDOMAIN = local.test\nSELECTOR = arc\nKEY_FILE = $shared/arc.pem\n"
	  . "[stage-forwarded]\nPROGRAM = pepsi-stage-arc-seal\nKEY = arc\nNEXT_STAGE = forwarded-srs\n"
	  . "[stage-forwarded-srs]\nPROGRAM = pepsi-stage-srs\nNEXT_STAGE = init\n";
	print $fh "[stage-forward]\nPROGRAM = $bin/$stage\nNEXT_STAGE = maildir\n"
	  . "FORWARD_STAGE = forwarded\nBOUNCE_STAGE = bounce\nLOCAL_DOMAINS = local.test\n"
	  . "ALLOW_FORWARD_PIPES = $pipes\nALLOW_FORWARD_FILES = $pipes\n"
	  . "RETRY_BASE = 1s\nRETRY_MAX = 2s\nCOMMAND_TIME_LIMIT = 20s\n";
	close $fh;
	chmod 0644, $path;
	return $path;
}

# The SRS secret and the ARC key, the dispatcher's user's own.
{
	open my $fh, '>', "$shared/srs-secret" or die;
	print $fh "forward-secret\n";
	close $fh;
	system(pepsi_bin('pepsi-keys'), 'generate', '-a', 'rsa-sha256', '-o', "$shared/arc.pem") == 0
	  or die 'pepsi-keys generate';
	chown((getpwnam(cluster_user()))[ 2, 3 ], "$shared/srs-secret", "$shared/arc.pem");
	chmod 0600, "$shared/srs-secret", "$shared/arc.pem";
}

my $log = "$shared/dispatch.log";
my $d = start_dispatcher(write_graph(), log => $log,
	program => [ as_cluster_user(pepsi_bin('pepsi-dispatch')) ]);

sub deliver
{
	my ($to, %m) = @_;
	my $id = inject($node, to => [$to], from => $m{from} // $sender,
		headers => $m{headers} // "From: <$sender>\r\nTo: <$to>\r\nSubject: $m{subject}\r\n");
	return $id;
}

sub settled { return poll_until(sub { queue_count($node) == 0 }, 60) }
sub files { return scalar(maildir_files($root, $_[0])) }

# 1. Forwarded to another address, with Delivered-To stamped, sealed
# (ARC) and sent from an SRS address that reverses to the sender.
dot_forward($u{alice}, "# away\ncarol\@local.test\n");
deliver("$u{alice}\@local.test", subject => 'one', from => 'someone@remote.test');
ok(settled(), 'the forwarded message is delivered');
is(files('carol@local.test'), 1, 'carol has it');
is(files("$u{alice}\@local.test"), 0, 'alice has no copy');
my ($carol) = maildir_files($root, 'carol@local.test');
my $copy = slurp($carol);
like($copy, qr/\AReturn-Path: <(SRS0=[^>]+\@local\.test)>\r\nDelivered-To: carol\@local.test\r\n/,
	'its sender is an SRS address');
my ($srs) = $copy =~ /\AReturn-Path: <([^>]+)>/;
is(Mail::SRS->new(Secret => ['forward-secret'])->reverse($srs), 'someone@remote.test',
	'which Mail::SRS reverses to the original sender');
like($copy, qr/^ARC-Seal: i=1; .*\r\nDelivered-To: $u{alice}\@local.test\r\nFrom:/ms,
	'it is ARC-sealed, over Delivered-To: alice above the original headers');

# 2. "\user" keeps a local copy.
dot_forward($u{bob}, "\\$u{bob}, carol\@local.test\n");
deliver("$u{bob}\@local.test", subject => 'two');
ok(settled(), 'settled');
is(files("$u{bob}\@local.test"), 1, 'bob keeps a copy');
is(files('carol@local.test'), 2, 'and carol gets one');

# 3. A loop: dave -> erin -> dave bounces with 5.4.6.
dot_forward($u{dave}, "$u{erin}\@local.test\n");
dot_forward($u{erin}, "$u{dave}\@local.test\n");
deliver("$u{dave}\@local.test", subject => 'three');
ok(settled(), 'the loop ends');
is(files("$u{dave}\@local.test") + files("$u{erin}\@local.test"), 0, 'nothing delivered in the loop');
my @dsns = maildir_files($root, $sender);
is(scalar @dsns, 1, 'one bounce');
my (undef, $rcpts) = dsn_fields(parse_dsn(slurp($dsns[-1])));
is($rcpts->[0]{status}, '5.4.6', 'status 5.4.6');
like($rcpts->[0]{'diagnostic-code'}, qr/forwarding loop for $u{dave}\@local\.test/, 'the loop is named');

# 4. Unsafe .forward files are ignored, with a log line.
dot_forward($u{frank}, "carol\@local.test\n", mode => 0664);
deliver("$u{frank}\@local.test", subject => 'four');
dot_forward($u{gina}, "carol\@local.test\n", owner => $u{alice});
deliver("$u{gina}\@local.test", subject => 'five');
ok(settled(), 'settled');
is(files("$u{frank}\@local.test"), 1, 'a group-writable .forward is ignored: frank gets his mail');
is(files("$u{gina}\@local.test"), 1, 'a .forward owned by another user is ignored');
is(files('carol@local.test'), 2, 'neither forwarded');
ok(file_shows($log, qr/<$u{frank}\@local\.test>: ~$u{frank}\/\.forward ignored: \.forward is group- or world-writable/),
	'the group-writable one is logged');
ok(file_shows($log, qr/<$u{gina}\@local\.test>: ~$u{gina}\/\.forward ignored: \.forward is owned by uid $user{$u{alice}}[0], not by $u{gina}/),
	'the foreign-owned one is logged');

# 5. A command is refused unless allowed: that entry bounces (5.7.1), the rest happens.
dot_forward($u{hank}, "\\$u{hank}\n\"|env > \$HOME/env.out; id -u >> \$HOME/env.out; cat > \$HOME/msg.out\"\n");
deliver("$u{hank}\@local.test", subject => 'six');
ok(settled(), 'settled');
is(files("$u{hank}\@local.test"), 1, 'the local copy is delivered');
ok(!-e "$homes/$u{hank}/env.out", 'the command did not run');
@dsns = maildir_files($root, $sender);
is(scalar @dsns, 2, 'a bounce for the command');
(undef, $rcpts) = dsn_fields(parse_dsn(slurp($dsns[-1])));
is($rcpts->[0]{status}, '5.7.1', 'status 5.7.1');
ok(file_shows($log, qr/refused: ALLOW_FORWARD_PIPES is off/), 'logged');

# 6. Bad input: a malformed line, an over-long one, a control character: logged, skipped, no crash.
dot_forward($u{ivy}, "carol\@local.test\nbad <address\n" . ('x' x 5000) . "\@local.test\n"
	  . "ctl\x01char\@local.test\n\"unterminated\n\\$u{ivy}\n");
deliver("$u{ivy}\@local.test", subject => 'seven');
ok(settled(), 'settled');
is(files("$u{ivy}\@local.test"), 1, 'ivy keeps her copy');
is(files('carol@local.test'), 3, 'carol gets the forward');
my $text = slurp($log);
like($text, qr/~$u{ivy}\/\.forward line 2 an address with a character it cannot have/, 'the malformed line is named');
like($text, qr/~$u{ivy}\/\.forward line 3 a line longer than 4096 bytes/, 'the over-long line is named');
like($text, qr/~$u{ivy}\/\.forward line 4 a control character/, 'the control character is named');
like($text, qr/~$u{ivy}\/\.forward line 5 an unterminated double quote/, 'the open quote is named');

# 6b. An :include: file: its entries as if they were in the .forward; an
# unsafe one is skipped with a log line.
{
	my $list = "$homes/$u{jack}/list";
	open my $fh, '>', $list or die "$list: $!";
	print $fh "# the team\ncarol\@local.test\n\\$u{jack}\n";
	close $fh;
	chown @{ $user{$u{jack}} }, $list;
	chmod 0644, $list;
	open $fh, '>', "$list-open" or die;
	print $fh "$u{frank}\@local.test\n";
	close $fh;
	chown @{ $user{$u{jack}} }, "$list-open";
	chmod 0666, "$list-open";
}
dot_forward($u{jack}, ":include:$homes/$u{jack}/list\n:include:$homes/$u{jack}/list-open\n");
deliver("$u{jack}\@local.test", subject => 'include');
ok(settled(), 'settled');
is(files('carol@local.test'), 4, 'an :include: file forwards to carol');
is(files("$u{jack}\@local.test"), 1, 'and keeps jack\'s copy ("\\user" in it)');
is(files("$u{frank}\@local.test"), 1, 'the world-writable :include: file is not used (frank has only his own)');
ok(file_shows($log, qr/~$u{jack}\/\.forward line 2 :include:\S+list-open is group- or world-writable/),
	'and that is logged');

# 7. Commands and files allowed: run as the owner, with a clean environment.
stop_dispatcher($d);
$d = start_dispatcher(write_graph(pipes => 1), log => $log,
	program => [ as_cluster_user(pepsi_bin('pepsi-dispatch')) ]);
dot_forward($u{hank}, "\"|env > \$HOME/env.out; id -u >> \$HOME/env.out; cat > \$HOME/msg.out\"\n"
	  . "$homes/$u{hank}/mbox\n");
deliver("$u{hank}\@local.test", subject => 'eight');
ok(settled(), 'settled');
ok(-e "$homes/$u{hank}/env.out", 'the command ran');
is((stat "$homes/$u{hank}/env.out")[4], $user{$u{hank}}[0], 'as hank');
my @env = split /\n/, slurp("$homes/$u{hank}/env.out");
my $uid = pop @env;
is($uid, $user{$u{hank}}[0], 'id -u says hank');
my %env = map { /^([^=]+)=(.*)$/ ? ($1, $2) : () } @env;
is_deeply([ sort grep { !/^(PWD|SHLVL|_)$/ } keys %env ],
	[qw(HOME LOGNAME PATH RECIPIENT SENDER SHELL USER)], 'a clean environment');
is($env{SENDER}, $sender, 'SENDER');
is($env{HOME}, "$homes/$u{hank}", 'HOME');
like(slurp("$homes/$u{hank}/msg.out"), qr/\AReturn-Path: <\Q$sender\E>\nDelivered-To: $u{hank}\@local.test\nFrom:.*\nSubject: eight\n\nhello\n\z/s,
	'the command read the message, LF line ends');
like(slurp("$homes/$u{hank}/mbox"), qr/\AFrom \Q$sender\E .*\nReturn-Path:.*Subject: eight\n\nhello\n\n\z/s,
	'the file got it in mbox form');
is((stat "$homes/$u{hank}/mbox")[4], $user{$u{hank}}[0], 'written as hank');
is(files("$u{hank}\@local.test"), 1, 'no new mailbox copy (no \\$u{hank})');

# 8. The helper refuses whoever is not of its group.
my $out = `@{[ join ' ', map { "'$_'" } as_cluster_user("$bin/$helper", 'read', $u{alice}) ]} 2>&1`;
isnt($? >> 8, 0, 'mode 4750: the cluster user cannot run the helper');
system('cp', "$bin/$helper", "$shared/open-helper");
chmod 04755, "$shared/open-helper";
$out = `@{[ join ' ', map { "'$_'" } as_cluster_user("$shared/open-helper", 'read', $u{alice}) ]} 2>&1`;
like($out, qr/refused: uid \d+ is not of group \d+/, 'and the helper itself refuses a caller outside its group');
unlink "$shared/open-helper";

# 9. A user added after a message to the name: the stage keeps its
# getpwnam answer for a second (dot-forward.c), so a message to the new
# user after that second is forwarded by the .forward, as one before the
# user existed went to the mailbox (and those sent within the second).
deliver("$u{kim}\@local.test", subject => 'before');
ok(settled(), 'settled');
is(files("$u{kim}\@local.test"), 1, 'no system user kim yet: the mailbox has the message');
add_system_user($u{kim}, $homes);
$user{ $u{kim} } = [ (getpwnam($u{kim}))[ 2, 3 ] ];
dot_forward($u{kim}, "carol\@local.test\n");
# A message at a time until one is forwarded (a second or so): those
# before it still went to the mailbox, as the cached answer said.
my $tries = 0;
ok( poll_until(
		sub {
			deliver("$u{kim}\@local.test", subject => 'after ' . ++$tries);
			settled() or return 0;
			return files('carol@local.test') == 5;
		},
		10),
	'the new user\'s .forward is read a second or so later');
is(files('carol@local.test'), 5, 'carol has the one forwarded message');
is(files("$u{kim}\@local.test"), $tries, 'and the mailbox has the ones before it, not that one');
my ($forwarded) = grep { slurp($_) =~ /^Subject: after $tries\r?$/m } maildir_files($root, 'carol@local.test');
ok($forwarded, 'the one forwarded is the last sent');

stop_dispatcher($d);
done_testing();
