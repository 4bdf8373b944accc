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

# Run the helper as the cluster's user with the helper's group added (as
# the set-group-id stage does); returns (exit code, stdout, stderr).
sub helper
{
	my ($input, @args) = @_;
	my ($out, $err) = ('', '');
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

# Bad requests.
my $err;
($rc, $out, $err) = helper(undef, 'read', '../etc');
isnt($rc, 0, 'a user name with a path is refused');
like($err, qr/refused: "\.\.\/etc" is not a user name/, 'and says so');
($rc, $out, $err) = helper('', 'pipe', $name, "s\r\n\@remote.test", 'r@local.test', '20', 'true');
like($err, qr/refused: argument 3 has a control character/, 'a control character is refused');
($rc, $out, $err) = helper(undef, 'frobnicate', $name);
isnt($rc, 0, 'an unknown mode is refused');

done_testing();
