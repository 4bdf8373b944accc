# The privileged Maildir delivery end to end: make install-privileged into
# a scratch prefix (pepsi-helper-maildir-writer set-user-id root, mode 4750
# in its caller group; pepsi-stage-relay-to-maildir set-group-id to that
# group), pepsi-dispatch running as an unprivileged user with that stage,
# which runs the helper.  Two stages of one installation, each with its
# own MAILBOXES in the helper's root-owned file: one delivers to system
# users (~/Maildir, each file owned by its user), the other to virtual
# mailboxes (owned by VIRTUAL_USER).  A privileged stage never runs fused
# in another stage's worker.  Needs root (RootTest).

use strict;
use warnings FATAL => 'all';

use RootTest;

use File::Temp ();
use IPC::Run ();
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

$ENV{PATH} = "$ENV{PATH}:/usr/sbin:/sbin";
my $top = $ENV{PEPSI_TOP} or die "PEPSI_TOP is not set";
my $build_bin = $ENV{PEPSI_BIN} // "$top/build/bin";

my $node = delivery_node('maildir_privileged_dispatch');
my $shared = shared_dir();
my $homes = "$shared/home";
my $root = "$shared/maildir";
my $vroot = "$shared/virtual";
my $tag = $$ % 1000000;
my $group = "pepsi-mw$tag";
my %u = map { $_ => "mw$tag$_" } qw(ann ben vmail);

mkdir $homes;
mkdir $root;
mkdir $vroot;
my $gid = add_system_group($group);
my %id;
for my $name (values %u)
{
	add_system_user($name, $homes);
	$id{$name} = join ':', (getpwnam($name))[ 2, 3 ];
}
chown((getpwnam($u{vmail}))[ 2, 3 ], $vroot);
chmod 0755, $vroot;
make_mailbox($root, 'sender@local.test');
system('chown', '-R', cluster_user() . ':', $root) == 0 or die 'chown';

# make install-privileged into a scratch prefix, with this run's group.
my $prefix = "$shared/prefix";
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'make', '-s', '-C', $top, '-o', 'programs', 'B=' . ($build_bin =~ s{/bin$}{}r),
			"PREFIX=$prefix", "PRIVILEGED_GROUP_pepsi-helper-maildir-writer=$group",
			"PRIVILEGED_GROUP_pepsi-helper-dot-forward=$group", 'install-privileged' ],
		'<', \undef, '>', \$out, '2>', \$err)
	  or die "make install-privileged: $err";
}
chmod 0755, $prefix, "$prefix/bin";
my $helper = "$prefix/bin/pepsi-helper-maildir-writer";
my $stage = "$prefix/bin/pepsi-stage-relay-to-maildir";
my @hst = stat $helper;
my @sst = stat $stage;
is(sprintf('%o %d:%d', $hst[2] & 07777, $hst[4], $hst[5]), "4750 0:$gid",
	'the helper is set-user-id root, for its group only');
is(sprintf('%o %d:%d', $sst[2] & 07777, $sst[4], $sst[5]), "2755 0:$gid",
	'the stage is set-group-id to that group');

# The helper's file, and the stages' (a set-group-id stage reads only
# root's): root's, in directories only root may write, naming each
# stage's kind of mailboxes.
my $etc = File::Temp::tempdir('pepsi-mw-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $etc;
my $writer_conf = "$etc/pepsi.conf";
open my $fh, '>', $writer_conf or die "$writer_conf: $!";
print $fh "[maildir-writer]\nCALLER_GROUP = $group\nHOME_ROOTS = $homes\nVIRTUAL_USER = $u{vmail}\n"
  . "[stage-maildir]\nPROGRAM = pepsi-stage-relay-to-maildir\nMAILBOXES = system\n"
  . "[stage-vmaildir]\nPROGRAM = pepsi-stage-relay-to-maildir\nMAILBOXES = virtual\nMAILDIR_ROOT = $vroot\n";
close $fh;
chmod 0644, $writer_conf;

# sys.test goes to the system users' stage, everything else to the virtual one.
my $writer = "MAILDIR_WRITER = $helper\nMAILDIR_WRITER_CONFIG = $writer_conf\n";
my $config = delivery_config($node, maildir_root => $root, local_domains => 'sys.test',
	path => "$etc/dispatch.conf",
	extra => {
		init => "LOCAL_STAGE = maildir\nREMOTE_STAGE = vmaildir\n",
		maildir => "PROGRAM = $stage\n$writer",
	},
	more_stages => {
		vmaildir => "PROGRAM = $stage\nMAILDIR_ROOT = $vroot\nCREATE_MAILBOXES = yes\n"
		  . "BOUNCE_STAGE = bounce\nRETRY_BASE = 1s\nRETRY_MAX = 2s\n$writer",
	});
chmod 0644, $config;
my $log = "$shared/dispatch.log";
my $d = start_dispatcher($config, log => $log, program => [ as_cluster_user(pepsi_bin('pepsi-dispatch')) ]);

inject($node, to => [ "$u{ann}\@sys.test", "$u{ben}\@sys.test", 'box@virtual.test' ],
	headers => "From: <sender\@local.test>\r\nTo: <$u{ann}\@sys.test>\r\nSubject: privileged\r\n");
ok(poll_until(sub { queue_count($node) == 0 }, 120), 'the message left the queue')
  or diag(slurp($log));

sub delivered
{
	my ($maildir) = @_;
	my @files;

	# An array, so that scalar(delivered(...)) is a count, 0 for no Maildir.
	opendir my $dh, "$maildir/new" or return @files;
	@files = map { "$maildir/new/$_" } grep { !/^\./ } readdir $dh;
	closedir $dh;
	return @files;
}

for my $who (qw(ann ben))
{
	my $name = $u{$who};
	my @files = delivered("$homes/$name/Maildir");
	is(scalar @files, 1, "$who (a system user) has it in ~/Maildir/new");
	my @st = stat($files[0] // '/nonexistent');
	is(join(':', $st[4] // -1, $st[5] // -1), $id{$name}, "owned by $who");
	like(slurp($files[0] // '/nonexistent') // '', qr/\AReturn-Path: <sender\@local\.test>\r\nDelivered-To: \Q$name\E\@sys\.test\r\n/,
		"with Return-Path and Delivered-To for $who");
}
my @virtual = delivered("$vroot/box\@virtual.test");
is(scalar @virtual, 1, 'the other stage delivered to a virtual mailbox, in the same installation');
my @vst = stat($virtual[0] // '/nonexistent');
is(join(':', $vst[4] // -1, $vst[5] // -1), $id{ $u{vmail} }, 'owned by VIRTUAL_USER');
ok(!-e "$homes/box", 'not to a system user');
is(scalar(delivered("$root/box\@virtual.test")), 0, 'nor to the unprivileged root');

# A message for one system user: the router's worker would take its next
# stage in the same pass, but not a privileged one, which runs as its own
# set-group-id file: delivered at the first attempt.
inject($node, to => ["$u{ben}\@sys.test"],
	headers => "From: <sender\@local.test>\r\nTo: <$u{ben}\@sys.test>\r\nSubject: alone\r\n");
ok(poll_until(sub { scalar(delivered("$homes/$u{ben}/Maildir")) == 2 && queue_count($node) == 0 }, 120),
	'a message for one system user is delivered');
unlike(slurp($log), qr/status=deferred/, 'every delivery at its first attempt (none ran without the stage\'s bit)');

stop_dispatcher($d);
done_testing();
