# pepsi-helper-dot-forward on its own, installed set-user-id root and run
# by a member of its group, for real system users: it ignores a .forward
# that is a symbolic link, a FIFO (without hanging), too large, or in a
# home directory others may write; it runs a command or writes a file only
# when the user's .forward lists it, never for root, as the user with the
# user's groups only, killed at its time limit; a file is written in mbox
# form without following a symbolic link; :include: files are read with
# the same checks, nested at most 5 deep, loops cut; bad user names,
# control characters and NUL bytes are refused with a clear message.

use strict;
use warnings FATAL => 'all';

use RootTest;

use File::Basename qw(dirname);
use File::Temp ();
use IPC::Run ();
use POSIX qw(mkfifo);
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;

my $shared = shared_dir();
my $homes = "$shared/home";
my $tag = $$ % 1000000;
my $group = "pepsi-fh$tag";
my $name = "fh${tag}user";
my $helper = 'pepsi-helper-dot-forward';
my $bin = "$shared/bin";

mkdir $homes;
my $gid = add_system_group($group);
install_privileged(dirname(pepsi_bin('pepsi-dispatch')), $bin, $group, $helper,
	'pepsi-stage-dot-forward');
add_system_user($name, $homes);
my ($uid, $ugid) = (getpwnam($name))[ 2, 3 ];
my $home = "$homes/$name";

# The stage's section in root's file: commands and files allowed in one,
# not in the other.  The helper reads it itself.
my $etc = File::Temp::tempdir('pepsi-fh-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $etc;
my $conf = "$etc/pepsi.conf";
open my $conf_fh, '>', $conf or die "$conf: $!";
print $conf_fh "[stage-forward]\nPROGRAM = pepsi-stage-dot-forward\nNEXT_STAGE = maildir\n"
  . "ALLOW_FORWARD_PIPES = yes\nALLOW_FORWARD_FILES = yes\n"
  . "[stage-strict]\nPROGRAM = pepsi-stage-dot-forward\nNEXT_STAGE = maildir\n"
  . "[stage-maildir]\nPROGRAM = pepsi-stage-relay-to-maildir\n";
close $conf_fh;
chmod 0644, $conf;
my @allowed = ('-c', $conf, '-s', 'stage-forward');

# Run the helper as the cluster's user with the helper's group added (as
# the set-group-id stage does); returns (exit code, stdout, stderr).
# pipe and file get @allowed first, unless the call gives its own options.
sub helper
{
	my ($input, @args) = @_;
	my ($out, $err) = ('', '');
	@args = (@allowed, @args) if @args && $args[0] =~ /^(pipe|file)$/;
	my @cmd = ('setpriv', '--reuid=' . cluster_user(), '--regid=' . cluster_user(),
		"--groups=$gid", '--', "$bin/$helper", @args);

	# Input from a file, not a pipe: a helper that refuses before reading
	# exits without a write of ours racing its exit into a broken pipe.
	my $in_file = "$shared/helper.in";
	open my $in_fh, '>', $in_file or die "$in_file: $!";
	print $in_fh ($input // '');
	close $in_fh or die "$in_file: $!";
	chmod 0644, $in_file;
	IPC::Run::run(\@cmd, '<', $in_file, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	return ($? >> 8, $out, $err);
}

sub dot_forward
{
	my ($text) = @_;

	unlink "$home/.forward";
	open my $fh, '>', "$home/.forward" or die $!;
	print $fh $text;
	close $fh;
	chown $uid, $ugid, "$home/.forward";
	chmod 0644, "$home/.forward";
}

# Entries as the helper lists them.
dot_forward("a\@remote.test,\\$name\n\"|cat > out\"\n/tmp/x\n");
my ($rc, $out) = helper(undef, 'read', $name);
is($rc, 0, 'read: exit 0');
is($out, "forward\naddress a\@remote.test\nlocal $name\npipe cat > out\nfile /tmp/x\n", 'the entries');

# Unsafe places are ignored.
unlink "$home/.forward";
symlink '/etc/passwd', "$home/.forward";
($rc, $out) = helper(undef, 'read', $name);
is($out, "ignored .forward is a symbolic link\n", 'a symbolic link is not followed');
unlink "$home/.forward";
mkfifo("$home/.forward", 0644) or die "mkfifo: $!";
chown $uid, $ugid, "$home/.forward";
($rc, $out) = helper(undef, 'read', $name);
is($out, "ignored .forward is not a regular file\n", 'a FIFO is ignored, without waiting on it');
unlink "$home/.forward";
my $big = ('x' x 70) . "\@remote.test\n";
dot_forward($big x 1000);
($rc, $out) = helper(undef, 'read', $name);
like($out, qr/^ignored \.forward is larger than 65536 bytes\n\z/, 'a large .forward is ignored');
dot_forward("a\@remote.test\n");
chmod 0777, $home;
($rc, $out) = helper(undef, 'read', $name);
like($out, qr/^ignored home directory \S+ is group- or world-writable\n\z/, 'a world-writable home is ignored');
chmod 0755, $home;
($rc, $out) = helper(undef, 'read', 'nosuchuser');
is($out, "nouser\n", 'no such user');
unlink "$home/.forward";
($rc, $out) = helper(undef, 'read', $name);
is($out, "none\n", 'no .forward');

# A NUL byte in a line: that line is bad, the others stand.
dot_forward("a\@remote.test\nb\0c\@remote.test\n");
($rc, $out) = helper(undef, 'read', $name);
is($out, "forward\naddress a\@remote.test\nbad 2 a NUL byte in the line\n", 'a NUL byte is a bad line');

# Commands: only those listed, as the user, within the time limit.
dot_forward("\"|id -u > $home/id.out; id -G >> $home/id.out; cat > $home/msg.out\"\n\"|sleep 30\"\n");
($rc, $out) = helper("hello\n", 'pipe', $name, 's@remote.test', "$name\@local.test", '20',
	'rm -rf /');
is($out, "permanent the command is not in ${name}'s .forward\n", 'a command not in the .forward is refused');
($rc, $out) = helper("hello\n", 'pipe', $name, 's@remote.test', "$name\@local.test", '20',
	"id -u > $home/id.out; id -G >> $home/id.out; cat > $home/msg.out");
is($out, "ok\n", 'a listed command runs');
my @id = split /\n/, slurp("$home/id.out");
is($id[0], $uid, 'as the user');
is($id[1], $ugid, 'with the user\'s groups only (not root\'s, not the helper\'s)');
is(slurp("$home/msg.out"), "hello\n", 'the message on its input');
($rc, $out) = helper('', 'pipe', $name, 's@remote.test', "$name\@local.test", '1', 'sleep 30');
like($out, qr/^temporary the command ran longer than 1 s and was killed/, 'killed at its time limit');
($rc, $out) = helper('', 'pipe', 'root', 's@remote.test', 'root@local.test', '20', 'true');
is($out, "permanent commands and files of a .forward are never run as root\n", 'never as root');

# Files: mbox form, From_ quoted; a symbolic link is not followed.
dot_forward("$home/mbox\n$home/link\n");
($rc, $out) = helper("Subject: x\n\nFrom here\n>From there\n", 'file', $name, 's@remote.test',
	"$name\@local.test", "$home/mbox");
is($out, "ok\n", 'written');
like(slurp("$home/mbox"), qr/\AFrom s\@remote\.test .+\nSubject: x\n\n>From here\n>>From there\n\n\z/,
	'in mbox form, From_ lines quoted');
is((stat "$home/mbox")[4], $uid, 'owned by the user');
symlink '/etc/shadow', "$home/link";
($rc, $out) = helper('', 'file', $name, 's@remote.test', "$name\@local.test", "$home/link");
is($out, "permanent $home/link: is a symbolic link\n", 'a symbolic link is not followed');

# :include: files: their entries stand in place of the line, read as the
# user with the checks a .forward gets, nested at most 5 deep, loops cut.
my $inc = "$home/lists";
mkdir $inc;
chown $uid, $ugid, $inc;
chmod 0755, $inc;
sub user_file
{
	my ($path, $text, %o) = @_;

	unlink $path;
	open my $fh, '>', $path or die "$path: $!";
	print $fh $text;
	close $fh;
	chown((defined $o{owner} ? ($o{owner}, $o{owner}) : ($uid, $ugid)), $path);
	chmod $o{mode} // 0644, $path;
}
user_file("$inc/team", "b\@remote.test\n:include:$inc/more\n");
user_file("$inc/more", "# more\nc\@remote.test, \"|cat > $home/inc.out\"\n");
dot_forward("a\@remote.test\n:include:$inc/team\n\\$name\n");
($rc, $out) = helper(undef, 'read', $name);
is($out, "forward\naddress a\@remote.test\naddress b\@remote.test\naddress c\@remote.test\n"
	  . "pipe cat > $home/inc.out\nlocal $name\n",
	':include: files, nested: their entries in place of the line');
($rc, $out) = helper("hello\n", 'pipe', $name, 's@remote.test', "$name\@local.test", '20',
	"cat > $home/inc.out");
is($out, "ok\n", 'a command listed in an :include: file is the user\'s to run');
is(slurp("$home/inc.out"), "hello\n", 'and it ran');

user_file("$inc/loop1", ":include:$inc/loop2\n");
user_file("$inc/loop2", "d\@remote.test\n:include:$inc/loop1\n");
dot_forward(":include:$inc/loop1\n");
($rc, $out) = helper(undef, 'read', $name);
like($out, qr/\Aforward\naddress d\@remote\.test\nbad 1 [^\n]*:include:\Q$inc\E\/loop1 is an :include: loop[^\n]*\n\z/,
	'an :include: loop is cut, with a bad entry naming it');
dot_forward("a\@remote.test\n:include:$home/.forward\n");
($rc, $out) = helper(undef, 'read', $name);
like($out, qr/\Aforward\naddress a\@remote\.test\nbad 2 :include:\Q$home\E\/\.forward is an :include: loop/,
	'a .forward including itself is a loop too');

for my $n (1 .. 7)
{
	user_file("$inc/deep$n", "x$n\@remote.test\n:include:$inc/deep" . ($n + 1) . "\n");
}
dot_forward(":include:$inc/deep1\n");
($rc, $out) = helper(undef, 'read', $name);
like($out, qr/^address x5\@remote\.test$/m, 'five :include: files deep are read');
unlike($out, qr/x6\@remote\.test/, 'the sixth is not');
like($out, qr/^bad 1 [^\n]*:include:\Q$inc\E\/deep6 is more than 5 :include: files deep: ignored$/m,
	'and a bad entry says why');

user_file("$inc/writable", "e\@remote.test\n", mode => 0664);
user_file("$inc/foreign", "f\@remote.test\n", owner => (getpwnam('nobody'))[2] // 65534);
symlink "$inc/team", "$inc/link";
mkdir "$home/open";
chmod 0777, "$home/open";
user_file("$home/open/list", "g\@remote.test\n");
dot_forward(":include:$inc/writable\n:include:$inc/foreign\n:include:$inc/link\n"
	  . ":include:$inc/missing\n:include:$home/open/list\n:include:relative\nh\@remote.test\n");
($rc, $out) = helper(undef, 'read', $name);
is($out, "forward\n"
	  . "bad 1 :include:$inc/writable is group- or world-writable (mode 0664): ignored\n"
	  . "bad 2 :include:$inc/foreign is owned by uid " . ((getpwnam('nobody'))[2] // 65534) . ", not by $name: ignored\n"
	  . "bad 3 :include:$inc/link is a symbolic link: ignored\n"
	  . "bad 4 :include:$inc/missing does not exist: ignored\n"
	  . "bad 5 :include:$home/open/list: its directory $home/open is group- or world-writable: ignored\n"
	  . "bad 6 :include: needs the absolute path of a file\n"
	  . "address h\@remote.test\n",
	'unsafe, missing and relative :include: files are bad entries; the rest stands');

# Commands and files are the stage's to allow, in root's file: the helper
# reads the permission itself, and refuses a file its caller could write.
dot_forward("\"|touch $home/ran\"\n$home/mbox\n");
($rc, $out) = helper('', '-c', $conf, '-s', 'stage-strict', 'pipe', $name, 's@remote.test',
	"$name\@local.test", '20', "touch $home/ran");
is($out, "permanent mail to commands is not allowed here: ALLOW_FORWARD_PIPES is off in [stage-strict] of $conf\n",
	'a command the section does not allow is refused, naming ALLOW_FORWARD_PIPES');
ok(!-e "$home/ran", 'and not run');
($rc, $out) = helper('', '-c', $conf, '-s', 'stage-strict', 'file', $name, 's@remote.test',
	"$name\@local.test", "$home/mbox");
like($out, qr/^permanent mail to files is not allowed here: ALLOW_FORWARD_FILES is off in \[stage-strict\]/,
	'a file likewise, naming ALLOW_FORWARD_FILES');
($rc, $out) = helper('', '-c', $conf, '-s', 'stage-maildir', 'pipe', $name, 's@remote.test',
	"$name\@local.test", '20', "touch $home/ran");
like($out, qr/^permanent \Q$conf\E: \[stage-maildir\] is not a section of pepsi-stage-dot-forward \(for ALLOW_FORWARD_PIPES\)/,
	'another program\'s section is refused');
($rc, $out) = helper('', '-c', $conf, 'pipe', $name, 's@remote.test', "$name\@local.test", '20',
	"touch $home/ran");
like($out, qr/^permanent .*is not a section of pepsi-stage-dot-forward/, 'so is no section at all');
my $mine = "$shared/mine";
mkdir $mine;
chown((getpwnam(cluster_user()))[ 2, 3 ], $mine);
my $evil = "$mine/evil.conf";
open my $evil_fh, '>', $evil or die "$evil: $!";
print $evil_fh "[stage-forward]\nPROGRAM = pepsi-stage-dot-forward\nNEXT_STAGE = x\nALLOW_FORWARD_PIPES = yes\n";
close $evil_fh;
chown((getpwnam(cluster_user()))[ 2, 3 ], $evil);
($rc, $out) = helper('', '-c', $evil, '-s', 'stage-forward', 'pipe', $name, 's@remote.test',
	"$name\@local.test", '20', "touch $home/ran");
like($out, qr/^permanent refusing the configuration for ALLOW_FORWARD_PIPES: \Q$mine\E.* belongs to uid \d+/,
	'a configuration the caller owns is refused, naming the option it was read for');
ok(!-e "$home/ran", 'and the command is not run');

# Nothing of the caller's reaches the command: its environment, its open
# descriptors, its umask, its lowered limits (a soft one here: raising a
# hard one back needs CAP_SYS_RESOURCE, which a container may lack).
dot_forward("\"|env > $home/env.out; ls /proc/self/fd > $home/fd.out; umask > $home/umask.out; "
	  . "head -c 100000 /dev/zero > $home/big.out\"\n");
{
	local $ENV{PEPSI_CALLER_SECRET} = 'leaked';
	my ($out_env, $err_env) = ('', '');
	my $in_file = "$shared/helper.in";
	open my $in_fh, '>', $in_file or die "$in_file: $!";
	close $in_fh;
	IPC::Run::run([ 'prlimit', '--fsize=4096:unlimited', '--', 'sh', '-c', 'umask 000; exec 7</etc/hostname; exec "$@"', 'sh',
			'setpriv', '--reuid=' . cluster_user(), '--regid=' . cluster_user(), "--groups=$gid", '--',
			"$bin/$helper", @allowed, 'pipe', $name, 's@remote.test', "$name\@local.test", '20',
			"env > $home/env.out; ls /proc/self/fd > $home/fd.out; umask > $home/umask.out; "
			  . "head -c 100000 /dev/zero > $home/big.out" ],
		'<', $in_file, '>', \$out_env, '2>', \$err_env, IPC::Run::timeout(60));
	is($out_env, "ok\n", 'a command run for a caller with its own environment, descriptor, umask and limit');
}
unlike(slurp("$home/env.out"), qr/PEPSI_CALLER_SECRET/, 'the caller\'s environment does not reach it');
unlike(slurp("$home/fd.out"), qr/^7$/m, 'nor its descriptor');
is(slurp("$home/umask.out"), "0077\n", 'nor its umask');
is(-s "$home/big.out", 100000, 'nor its file size limit');

# Bad requests.
my $err;
($rc, $out, $err) = helper(undef, 'read', '../etc');
isnt($rc, 0, 'a user name with a path is refused');
like($err, qr/refused: "\.\.\/etc" is not a user name/, 'and says so');
($rc, $out, $err) = helper('', 'pipe', $name, "s\r\n\@remote.test", 'r@local.test', '20', 'true');
like($err, qr/refused: argument 3 has a control character/, 'a control character is refused');
($rc, $out, $err) = helper(undef, 'frobnicate', $name);
isnt($rc, 0, 'an unknown mode is refused');

# The set-group-id stage trusts nothing its caller gives it: a local user's
# configuration (-c or PEPSI_CONFIG) is refused before it is read, so no
# HELPER of theirs runs with the helper's group; and the group is not used
# to read a file the caller names.
sub stage_as_user
{
	my (%o) = @_;
	my ($out_stage, $err_stage) = ('', '');
	local $ENV{PEPSI_CONFIG} = $o{env} if $o{env};

	IPC::Run::run([ 'setpriv', '--reuid=' . cluster_user(), '--regid=' . cluster_user(), '--init-groups', '--',
			"$bin/pepsi-stage-dot-forward", 'worker', $o{config} ? ('-c', $o{config}) : () ],
		'<', \'', '>', \$out_stage, '2>', \$err_stage, IPC::Run::timeout(60));
	return ($? >> 8, $err_stage);
}
open $evil_fh, '>', $evil or die "$evil: $!";
print $evil_fh "[database]\nCONNINFO = dbname=none host=/nonexistent\n"
  . "[stage-forward]\nPROGRAM = pepsi-stage-dot-forward\nNEXT_STAGE = x\nHELPER = /bin/sh\n";
close $evil_fh;
($rc, $err) = stage_as_user(config => $evil);
isnt($rc, 0, 'the set-group-id stage refuses a local user\'s -c ~/evil.conf');
like($err, qr/refusing the configuration \Q$evil\E: .*belongs to uid \d+.*only a file of root's is read/,
	'and says why, naming the file');
($rc, $err) = stage_as_user(env => $evil);
like($err, qr/refusing the configuration \Q$evil\E/, 'PEPSI_CONFIG likewise');
my $group_only = "$etc/group-only.conf";
open my $group_fh, '>', $group_only or die "$group_only: $!";
print $group_fh "[database]\nCONNINFO = secret\n";
close $group_fh;
chown 0, $gid, $group_only;
chmod 0640, $group_only;
($rc, $err) = stage_as_user(config => $group_only);
isnt($rc, 0, 'a file only the stage\'s group may read is not read for its caller');
like($err, qr/\Q$group_only\E.*Permission denied/, 'permission denied: the group is the helper\'s only');
unlike($err, qr/secret/, 'nothing of it shows');

done_testing();
