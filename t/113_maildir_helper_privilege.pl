# pepsi-helper-maildir-writer as installed: make install-privileged puts it
# set-user-id root and executable by its caller group only, and its stage
# set-group-id to that group, each a file of its own; it refuses a
# caller outside that group (by the file's mode, and by its own check when
# the mode would let one through), delivers as each system user into
# ~/Maildir (files owned by each), never runs as root once it has read its
# request, follows no symbolic link planted in a Maildir, refuses targets
# outside the configured roots and configurations root did not write, and
# keeps Maildir++ quotas.  Needs root (RootTest: make check runs this file
# as root); the users and the group it makes are removed at the end.

use strict;
use warnings FATAL => 'all';

use File::Copy qw(copy);
use File::Temp qw(tempdir);
use IPC::Run qw(run start);
use POSIX qw(WIFSIGNALED);
use Test::More;
use Time::HiRes qw(usleep);

use RootTest;

for my $tool (qw(useradd userdel groupadd groupdel setpriv))
{
	plan skip_all => "$tool is not installed"
	  unless grep { -x "$_/$tool" } split /:/, "$ENV{PATH}:/usr/sbin:/sbin";
}
$ENV{PATH} = "$ENV{PATH}:/usr/sbin:/sbin";

my $top = $ENV{PEPSI_TOP} or die "PEPSI_TOP is not set";
my $bin = $ENV{PEPSI_BIN} // "$top/build/bin";
my $dir = tempdir('pepsi-maildir-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $dir;

# Names of this run only, so that two runs on one machine never meet.
my $tag = sprintf('%x', $$ % 0xfffff);
my $group = "pmdg$tag";
my %user = map { $_ => "pmd$_$tag" } qw(caller member alice bob out virtual);
my @made_users;
my $made_group;

END
{
	system('userdel', $_) for @made_users;
	system('groupdel', $group) if $made_group;
}

sub cmd_ok
{
	my @cmd = @_;
	my ($out, $err) = ('', '');
	run \@cmd, \undef, \$out, \$err or die "@cmd: $err";
	return $out;
}

mkdir "$dir/$_", 0755 for qw(home elsewhere virtual etc victim);
cmd_ok('groupadd', $group);
$made_group = 1;
for my $role (sort keys %user)
{
	my $home = $role eq 'out' ? "$dir/elsewhere/$user{$role}" : "$dir/home/$user{$role}";
	my @groups = $role eq 'member' ? ('-G', $group) : ();
	cmd_ok('useradd', '-m', '-d', $home, '-s', '/usr/sbin/nologin', @groups, $user{$role});
	push @made_users, $user{$role};
}
my %uid = map { $_ => scalar getpwnam($user{$_}) } keys %user;
my %gid = map { $_ => (getpwnam($user{$_}))[3] } keys %user;
my $group_gid = getgrnam($group);
chown $uid{virtual}, $gid{virtual}, "$dir/virtual";

# make install-privileged into a scratch prefix, with this run's group and stage owner.
my $prefix = "$dir/prefix";
cmd_ok('make', '-s', '-C', $top, '-o', 'programs', "B=" . ($bin =~ s{/bin$}{}r), "PREFIX=$prefix",
	"PRIVILEGED_GROUP_pepsi-helper-maildir-writer=$group", 'install-privileged');
my $helper = "$prefix/bin/pepsi-helper-maildir-writer";
my $stage = "$prefix/bin/pepsi-stage-relay-to-maildir";
my @hst = lstat $helper;
my @sst = lstat $stage;
is(sprintf('%o %d %d', $hst[2] & 07777, $hst[4], $hst[5]), "4750 0 $group_gid",
	'make install: the helper is set-user-id root, executable by its group only');
is(sprintf('%o %d %d', $sst[2] & 07777, $sst[4], $sst[5]), "2755 0 $group_gid",
	'and the stage is set-group-id to that group');
ok(-f _ && !-l $stage && !-l $helper, 'each a file of its own, not a link to the multi-call binary');

# A copy anyone may execute, to reach the helper's own check of its caller.
my $open_helper = "$dir/etc/pepsi-helper-maildir-writer";
copy($helper, $open_helper) or die "copy: $!";
chmod 04755, $open_helper;

sub write_config
{
	my ($path, %o) = @_;
	open my $fh, '>', $path or die "$path: $!";
	print $fh "[maildir-writer]\nCALLER_GROUP = $group\nMAILBOXES = " . ($o{mailboxes} // 'system') . "\n"
	  . "HOME_ROOTS = $dir/home\n"
	  . ($o{virtual_user} ? "VIRTUAL_USER = $o{virtual_user}\n" : '')
	  . ($o{quota} ? "QUOTA = $o{quota}\n" : '')
	  . "MAX_MESSAGE_SIZE = 1M\n"
	  . "[stage-maildir]\nPROGRAM = pepsi-stage-relay-to-maildir\nMAILDIR_ROOT = $dir/virtual\n";
	close $fh;
	chmod 0644, $path;
}
my $system_conf = "$dir/etc/system.conf";
my $virtual_conf = "$dir/etc/virtual.conf";
write_config($system_conf);
write_config($virtual_conf, mailboxes => 'virtual', virtual_user => $user{virtual});

# setpriv execs with root's capabilities still in effect, which would let
# it run a file its new ids may not: env(1) in between execs as them (a
# shell would drop the effective group the stage has).
my @exec_as_ids = ('env');

# As the set-group-id stage runs it: the pipeline user, with the group as effective gid.
my @as_stage = ('--ruid', $uid{caller}, '--euid', $uid{caller}, '--rgid', $gid{caller},
	'--egid', $group_gid, '--clear-groups');
my @as_member = ('--reuid', $uid{member}, '--regid', $gid{member}, '--init-groups');
my @as_outsider = ('--reuid', $uid{caller}, '--regid', $gid{caller}, '--clear-groups');

sub request
{
	my (%o) = @_;
	my $message = $o{message} // "Subject: hi\r\n\r\nbody\r\n";
	my $size = $o{size} // length $message;
	return "section " . ($o{section} // 'stage-maildir') . "\n"
	  . "recipient $o{to}\nsender " . ($o{from} // 'sender@example.net') . "\n"
	  . "mailbox " . ($o{mailbox} // $o{to}) . "\ncreate " . ($o{create} // 'no') . "\nsize $size\n\n"
	  . ($o{partial} // $message);
}

# Run the helper; its reply line and exit status.
sub deliver
{
	my (%o) = @_;
	my @cmd = ('setpriv', @{ $o{as} // \@as_stage }, @exec_as_ids, $o{helper} // $helper, '-c',
		$o{config} // $system_conf);
	# The request comes from a file, not a pipe: a helper that refuses
	# before reading (or cannot even be executed) then exits without a
	# write of ours racing its exit into a broken pipe.
	my $in_file = "$dir/request.in";
	open my $in_fh, '>', $in_file or die "$in_file: $!";
	print $in_fh ($o{raw} // request(%o));
	close $in_fh or die "$in_file: $!";
	chmod 0644, $in_file;
	my ($out, $err) = ('', '');
	run \@cmd, '<', $in_file, '>', \$out, '2>', \$err;
	chomp $out;
	return wantarray ? ($out, $?, $err) : $out;
}

sub new_files
{
	my ($maildir) = @_;
	opendir(my $dh, "$maildir/new") or return ();
	my @files = map { "$maildir/new/$_" } grep { !/^\./ } readdir $dh;
	return @files;
}

sub maildir_of { return "$dir/home/$user{$_[0]}/Maildir" }

# The caller's group.
my ($reply, $status, $err) = deliver(to => "$user{alice}\@example.org", as => \@as_outsider);
ok($status != 0 && $reply eq '', 'a caller outside the group cannot even run the installed helper');
($reply, $status) = deliver(to => "$user{alice}\@example.org", as => \@as_outsider, helper => $open_helper);
like($reply, qr/^4\.3\.5 uid $uid{caller} is not in group $group: refused/,
	'with a mode that lets it run, the helper itself refuses a caller outside its group');
ok(!-e maildir_of('alice'), 'and nothing was written');

# Two system users: each file is its owner's.
$reply = deliver(to => "$user{alice}\@example.org");
like($reply, qr/^2\.0\.0 delivered to /, 'as the set-group-id stage: delivered to alice');
my @alice = new_files(maildir_of('alice'));
$reply = deliver(to => "\U$user{bob}\E\@example.org", as => \@as_member);
like($reply, qr/^2\.0\.0 /, 'as a member of the group (supplementary): delivered to bob, whose name was in upper case');
my @bob = new_files(maildir_of('bob'));
is(scalar(@alice) . ' ' . scalar(@bob), '1 1', 'one file in each ~/Maildir/new');
my @ast = stat $alice[0];
my @bst = stat $bob[0];
is("$ast[4]:$ast[5] $bst[4]:$bst[5]", "$uid{alice}:$gid{alice} $uid{bob}:$gid{bob}",
	'each file belongs to its mailbox\'s owner');
is(sprintf('%o', $ast[2] & 0777), '600', 'readable by its owner only');
my @mst = stat maildir_of('alice');
is("$mst[4]", "$uid{alice}", 'the Maildir made on first delivery is the user\'s too');
open my $fh, '<', $alice[0] or die;
my $content = do { local $/; <$fh> };
close $fh;
is($content, "Return-Path: <sender\@example.net>\r\nDelivered-To: $user{alice}\@example.org\r\nSubject: hi\r\n\r\nbody\r\n",
	'Return-Path and Delivered-To, then the message');
like($alice[0], qr{,S=\d+$}, 'the name carries its size (Maildir++)');

# One helper serves request after request of one owner, never another's.
{
	my $two = request(to => "$user{alice}\@example.org") . request(to => "$user{alice}\@example.org");
	my ($out) = deliver(raw => $two);
	like($out, qr/^2\.0\.0 [^\n]*\n2\.0\.0 /, 'two requests for alice on one pipe: both delivered');
	($out) = deliver(raw => request(to => "$user{alice}\@example.org") . request(to => "$user{bob}\@example.org"));
	like($out, qr/^2\.0\.0 [^\n]*\nagain /, 'then bob\'s: refused, for a new helper to take');
	is(scalar(new_files(maildir_of('alice'))) . ' ' . scalar(new_files(maildir_of('bob'))), '4 1',
		'alice got three more, bob none from that helper');
	unlink new_files(maildir_of('alice'));
	ok(deliver(to => "$user{alice}\@example.org") =~ /^2\.0\.0/, 'alice starts again with one');
}

# Never root past start-up: stopped inside the message, the helper's ids are alice's.
{
	my $message = "Subject: slow\r\n\r\n" . ("x" x 1000) . "\r\n";
	my $in = request(to => "$user{alice}\@example.org", message => $message, partial => substr($message, 0, 100));
	my ($out, $errs) = ('', '');
	my $h = start [ 'setpriv', @as_stage, @exec_as_ids, $helper, '-c', $system_conf ], \$in, \$out, \$errs;
	my $pid = $h->{KIDS}[0]{PID};
	my %ids;
	for (1 .. 600)
	{
		$h->pump_nb;
		# (The pid is setpriv's, then env's, then the helper's: each execs the next.)
		if (open my $st, '<', "/proc/$pid/status")
		{
			my @lines = <$st>;
			%ids = map { /^(Name|Uid|Gid|Groups):\s*(.*?)\s*$/ ? ($1 => $2) : () } @lines;
			last if ($ids{Name} // '') =~ /^pepsi-helper/ && ($ids{Uid} // '') =~ /^\d+\s+(\d+)/ && $1 != 0;
		}
		usleep(50_000);
	}
	is($ids{Uid}, join("\t", ($uid{alice}) x 4), 'reading the message: real, effective, saved and file uid are alice\'s');
	is($ids{Gid}, join("\t", ($gid{alice}) x 4), 'and every gid');
	is($ids{Groups}, "$gid{alice}", 'and no supplementary group but hers');
	$in .= substr($message, 100);
	$h->finish;
	like($out, qr/^2\.0\.0 /, 'the rest of the message, and it is delivered');
	is(scalar(new_files(maildir_of('alice'))), 2, 'alice has two messages');

	# Killed while writing: nothing in new/.
	$in = request(to => "$user{alice}\@example.org", message => $message, partial => substr($message, 0, 500));
	$h = start [ 'setpriv', @as_stage, @exec_as_ids, $helper, '-c', $system_conf ], \$in, \$out, \$errs;
	$pid = $h->{KIDS}[0]{PID};
	my $tmp_file;
	for (1 .. 600)
	{
		$h->pump_nb;
		opendir(my $dh, maildir_of('alice') . '/tmp');
		($tmp_file) = grep { !/^\./ } readdir $dh;
		last if $tmp_file;
		usleep(50_000);
	}
	ok($tmp_file, 'a message half-written is in tmp/');
	kill 'KILL', $pid;
	$h->finish;
	is(scalar(new_files(maildir_of('alice'))), 2, 'killed there, nothing reaches new/');
	unlink maildir_of('alice') . "/tmp/$tmp_file" if $tmp_file;
}

# Symbolic links planted in a Maildir are never followed.
{
	my $victim = "$dir/victim";
	chown $uid{bob}, $gid{bob}, $victim;
	my $bob_maildir = maildir_of('bob');
	rename "$bob_maildir/new", "$bob_maildir/new.real";
	symlink $victim, "$bob_maildir/new";
	$reply = deliver(to => "$user{bob}\@example.org");
	like($reply, qr/^4\.2\.0 .*new is a symbolic link/, 'new/ a symbolic link: refused, a temporary failure');
	unlink "$bob_maildir/new";
	rename "$bob_maildir/new.real", "$bob_maildir/new";

	rename "$bob_maildir/tmp", "$bob_maildir/tmp.real";
	symlink $victim, "$bob_maildir/tmp";
	like(deliver(to => "$user{bob}\@example.org"), qr/^4\.2\.0 .*tmp is a symbolic link/, 'tmp/ a symbolic link: refused');
	unlink "$bob_maildir/tmp";
	rename "$bob_maildir/tmp.real", "$bob_maildir/tmp";

	rename $bob_maildir, "$bob_maildir.real";
	symlink $victim, $bob_maildir;
	like(deliver(to => "$user{bob}\@example.org"), qr/^4\.2\.0 .*Maildir is a symbolic link/,
		'~/Maildir a symbolic link: refused');
	unlink $bob_maildir;
	rename "$bob_maildir.real", $bob_maildir;

	open my $target, '>', "$victim/sizes" or die;
	print $target "untouched\n";
	close $target;
	chown $uid{bob}, $gid{bob}, "$victim/sizes";
	symlink "$victim/sizes", "$bob_maildir/maildirsize";
	like(deliver(to => "$user{bob}\@example.org"), qr/^4\.3\.0 .*maildirsize/, 'maildirsize a symbolic link: refused');
	unlink "$bob_maildir/maildirsize";
	opendir(my $dh, $victim);
	is(join(',', sort grep { !/^\./ } readdir $dh), 'sizes', 'nothing was written where the links pointed');
	open $target, '<', "$victim/sizes" or die;
	is(scalar <$target>, "untouched\n", 'and the linked file is unchanged');
	is(scalar(new_files($bob_maildir)), 1, 'bob still has his one message');

	# A Maildir that is not the user's.
	my $alice_maildir = maildir_of('alice');
	chown $uid{bob}, $gid{bob}, "$alice_maildir/new";
	chmod 0777, "$alice_maildir/new";
	like(deliver(to => "$user{alice}\@example.org"), qr/^4\.2\.0 .*belongs to uid $uid{bob}/,
		'a new/ owned by someone else: refused');
	chown $uid{alice}, $gid{alice}, "$alice_maildir/new";
	chmod 0700, "$alice_maildir/new";
}

# Targets outside the configured roots.
like(deliver(to => "$user{out}\@example.org"), qr/^5\.7\.1 .*not below \[maildir-writer\] HOME_ROOTS/,
	'a user whose home is outside HOME_ROOTS: refused');
ok(!-e "$dir/elsewhere/$user{out}/Maildir", 'and no Maildir was made there');
like(deliver(to => 'root@example.org'), qr/^5\.7\.1 .*uid 0/, 'root: refused');
like(deliver(to => 'daemon@example.org'), qr/^5\.7\.1 .*MIN_UID/, 'a system account below MIN_UID: refused');
like(deliver(to => 'nosuchuser12345@example.org'), qr/^5\.1\.1 .*does not exist/, 'an unknown user: 5.1.1');

# Virtual mailboxes: the configured owner, below MAILDIR_ROOT.
{
	my $box = "$dir/virtual/info\@example.org";
	mkdir $box, 0700;
	mkdir "$box/$_", 0700 for qw(tmp new cur);
	chown $uid{virtual}, $gid{virtual}, $box, map { "$box/$_" } qw(tmp new cur);
	like(deliver(to => 'Info@Example.org', mailbox => 'info@example.org', config => $virtual_conf),
		qr/^2\.0\.0 /, 'a virtual mailbox: delivered');
	my ($file) = new_files($box);
	my @vst = stat $file;
	is("$vst[4]:$vst[5]", "$uid{virtual}:$gid{virtual}", 'as VIRTUAL_USER');
	write_config("$dir/etc/virtual-root.conf", mailboxes => 'virtual', virtual_user => 'root');
	like(deliver(to => 'info@example.org', config => "$dir/etc/virtual-root.conf"), qr/^5\.7\.1 .*as root is refused/,
		'VIRTUAL_USER = root: refused');
	like(deliver(to => 'new@example.org', config => $virtual_conf), qr/^5\.1\.1 mailbox <new\@example\.org> does not exist/,
		'a missing virtual mailbox: 5.1.1');
	like(deliver(to => 'new@example.org', create => 'yes', config => $virtual_conf), qr/^2\.0\.0 /,
		'or made when asked to');
	my @nst = stat "$dir/virtual/new\@example.org";
	is($nst[4], $uid{virtual}, 'by its owner');
}

# Bad input never reaches the file system as a path.
for my $case (['../etc', 'a parent directory'], ['a/b', 'a slash'], ['.hidden', 'a leading dot'],
	["a\x01b", 'a control character'], ['x' x 300, 'an over-long name'])
{
	my ($mailbox, $what) = @$case;
	like(deliver(to => "$mailbox\@example.org", mailbox => $mailbox, create => 'yes', config => $virtual_conf),
		qr/^5\.1\.3 /, "a virtual mailbox name with $what: refused (5.1.3)");
}
like(deliver(to => '../../etc@example.org'), qr/^5\.1\.3 .*cannot name a system user/,
	'a system user name with a path: refused');
like(deliver(raw => "section stage-maildir\nrecipient a\0b\@example.org\nsize 1\n\nx"), qr/^5\.1\.3 .*NUL/,
	'a NUL in the request: refused');
like(deliver(raw => "section stage-maildir\nrecipient " . ('a' x 9000) . "\n\n"), qr/^4\.3\.0 .*longer than/,
	'a request longer than its bound: refused');
like(deliver(to => "$user{alice}\@example.org", size => 2 * 1024 * 1024), qr/^5\.3\.4 .*MAX_MESSAGE_SIZE/,
	'a message over MAX_MESSAGE_SIZE: refused before a byte is written');
like(deliver(to => "$user{alice}\@example.org", size => 1000, message => 'short'), qr/^4\.3\.0 .*ended before/,
	'a message shorter than announced: a temporary failure');
opendir(my $alice_tmp, maildir_of('alice') . '/tmp');
is(scalar(grep { !/^\./ } readdir $alice_tmp), 0, 'and nothing of it is left in tmp/');
like(deliver(to => "$user{alice}\@example.org", section => 'stage-other'), qr/^4\.3\.5 .*not a section/,
	'a section that is not a maildir stage\'s: refused');

# The configuration must be root's.
{
	my $own = "$dir/home/$user{caller}/pepsi.conf";
	copy($system_conf, $own);
	chown $uid{caller}, $gid{caller}, $own;
	like(deliver(to => "$user{alice}\@example.org", config => $own), qr/^4\.3\.5 refusing the configuration/,
		'a configuration the caller owns: refused');
	chmod 0664, "$dir/etc/virtual-root.conf";
	like(deliver(to => "$user{alice}\@example.org", config => "$dir/etc/virtual-root.conf"),
		qr/^4\.3\.5 refusing the configuration: .*writable by others/, 'a group-writable one: refused');
	symlink $system_conf, "$dir/etc/link.conf";
	like(deliver(to => "$user{alice}\@example.org", config => "$dir/etc/link.conf"), qr/^4\.3\.5 refusing the configuration/,
		'one reached through a symbolic link: refused');
}

# Maildir++ quota: maildirsize is kept and enforced.
{
	my $maildir = maildir_of('bob');
	open my $size, '>', "$maildir/maildirsize" or die;
	print $size "1500S,100C\n0 0\n";
	close $size;
	chown $uid{bob}, $gid{bob}, "$maildir/maildirsize";
	my $message = "Subject: q\r\n\r\n" . ('y' x 800) . "\r\n";
	like(deliver(to => "$user{bob}\@example.org", message => $message), qr/^2\.0\.0 /, 'under quota: delivered');
	open $size, '<', "$maildir/maildirsize";
	my @lines = <$size>;
	close $size;
	like($lines[-1], qr/^\d+ 1$/, 'and counted in maildirsize');
	like(deliver(to => "$user{bob}\@example.org", message => $message), qr/^5\.2\.2 .*over quota/,
		'over quota: 5.2.2');
	write_config("$dir/etc/quota.conf", quota => '5k');
	like(deliver(to => "$user{alice}\@example.org", config => "$dir/etc/quota.conf"), qr/^2\.0\.0 /,
		'QUOTA: a mailbox without maildirsize is delivered to');
	open $size, '<', maildir_of('alice') . '/maildirsize';
	like(scalar <$size>, qr/^5120S$/, 'and gets a maildirsize with that quota');
}

done_testing();
