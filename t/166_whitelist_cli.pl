# pepsi-whitelist installed as make install lays it out (set-user-id to
# its own account, mode 4755; pepsi-helper-mailbox-scan beside it, no
# bit), with that account's login role a member of pepsi_whitelist and
# reachable only by peer authentication: two system users each change
# their own whitelist and never the other's (no argument, environment or
# configuration of theirs names another owner); the role may call the
# three whitelist functions and nothing else; seed reads the user's real
# Maildir sent folder (as the user: the files are 0600) and whitelists
# the To/Cc/Bcc addresses, and a later message from a seeded address
# passes pepsi-stage-check-whitelist straight into the owner's Maildir
# while a stranger's is held.  Bad input: a non-address, a missing
# Maildir, a message over SEED_MAX_SIZE, each named, nothing added.
# Needs root (RootTest).

use strict;
use warnings FATAL => 'all';

use RootTest;

use File::Copy qw(copy);
use File::Path qw(make_path);
use File::Temp ();
use IPC::Run ();
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

$ENV{PATH} = "$ENV{PATH}:/usr/sbin:/sbin";
my ($setpriv) = grep { -x } map { "$_/setpriv" } split /:/, $ENV{PATH};

my $db = 'postgres';
my $node = delivery_node('whitelist_cli');
my $shared = shared_dir();
my $homes = "$shared/home";
my $root = "$shared/maildir";
my $tag = $$ % 1000000;
my %u = map { $_ => "wl$tag$_" } qw(ann ben);
my $account = "wl${tag}set";
mkdir $homes;
mkdir $root;
add_system_user($_, $homes) for values %u, $account;
my %owner = map { $_ => "$u{$_}\@local.test" } keys %u;
make_mailbox($root, $owner{ann});
system('chown', '-R', cluster_user() . ':', $root) == 0 or die 'chown';

sub sql { return $node->safe_psql($db, shift) }

# The socket directory must be reachable by the users; the set-uid
# account's role logs in by peer authentication only.
chmod 0755, $node->host;
sql(qq{CREATE ROLE "$account" LOGIN IN ROLE pepsi_whitelist});
{
	my $hba = $node->data_dir . '/pg_hba.conf';
	my $text = slurp($hba);
	open my $fh, '>', $hba or die "$hba: $!";
	print $fh "local all $account peer\n$text";
	close $fh;
	$node->reload;
}

# The installation: root's directories, the program set-user-id to its account.
my $etc = File::Temp::tempdir('pepsi-wl-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $etc;
make_path("$etc/bin");
chmod 0755, "$etc/bin";
my $program = "$etc/bin/pepsi-whitelist";
copy(pepsi_bin('pepsi-whitelist'), $program) or die "copy: $!";
copy(pepsi_bin('pepsi-helper-mailbox-scan'), "$etc/bin/pepsi-helper-mailbox-scan") or die "copy: $!";
chown((getpwnam($account))[ 2, 3 ], $program);
chmod 04755, $program;
chmod 0755, "$etc/bin/pepsi-helper-mailbox-scan";

sub write_root_config
{
	my ($path, $extra) = @_;
	open my $fh, '>', $path or die "$path: $!";
	print $fh "[pepsi]\nLOCAL_DOMAINS = local.test other.test\n"
	  . "[database]\nCONNINFO = host=" . $node->host . " port=" . $node->port . " dbname=$db\n"
	  . "[whitelist]\nCONNINFO = host=" . $node->host . " port=" . $node->port . " dbname=$db\n"
	  . ($extra // '');
	close $fh;
	chmod 0644, $path;
	return $path;
}
my $conf = write_root_config("$etc/pepsi.conf");

# Run pepsi-whitelist as $user; returns (exit code, stdout, stderr).
sub wl
{
	my ($user, @args) = @_;
	my %env = %{ ref $args[0] eq 'HASH' ? shift @args : {} };
	my ($out, $err) = ('', '');
	local %ENV = (%ENV, %env);
	IPC::Run::run([ $setpriv, "--reuid=$u{$user}", "--regid=$u{$user}", '--init-groups', '--', $program, @args ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	return ($? >> 8, $out, $err);
}
sub entries { return sql("SELECT string_agg(sender || ' ' || source, ',' ORDER BY sender) FROM pepsi.whitelist WHERE owner = '$_[0]'") }

my @st = stat $program;
is(sprintf('%o', $st[2] & 07777), '4755', 'pepsi-whitelist is set-user-id');

# 1. Each user's own list.
my ($rc, $out, $err) = wl('ann', '-C', $conf, 'add', 'carol@sender.test', 'Dave@Sender.Test');
is($rc, 0, 'ann adds two senders') or diag($err);
like($out, qr/^carol\@sender\.test: added$/m, 'said');
is(entries($owner{ann}), 'carol@sender.test owner,dave@sender.test owner', 'on ann\'s whitelist, as ann@local.test');
($rc, $out) = wl('ann', '-C', $conf, 'list');
is($rc, 0, 'ann lists');
like($out, qr/carol\@sender\.test.*\n.*dave\@sender\.test/s, 'her entries');
($rc, $out, $err) = wl('ann', '-C', $conf, 'remove', 'dave@sender.test');
is($rc, 0, 'ann removes one');
is(entries($owner{ann}), 'carol@sender.test owner', 'gone');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action IN ('whitelist_add', 'whitelist_remove') AND principal = '$account' AND detail->>'owner' = '$owner{ann}'"),
	'3', 'each change audited');

# 2. Never another's.
($rc, $out) = wl('ben', '-C', $conf, 'list');
is($rc, 0, 'ben lists');
unlike($out, qr/carol/, 'not ann\'s entries');
($rc, $out) = wl('ben', '-C', $conf, 'remove', 'carol@sender.test');
like($out, qr/not on the whitelist/, 'ben\'s remove finds nothing');
is(entries($owner{ann}), 'carol@sender.test owner', 'ann\'s entry stays');
($rc, $out, $err) = wl('ben', '-C', $conf, 'add', '--owner', $owner{ann}, 'mallory@evil.test');
isnt($rc, 0, 'an --owner argument is refused');
like($err, qr/"--owner" is not an address/, 'named');
($rc, $out, $err) = wl('ben', '-C', $conf, 'add', "$owner{ann}:mallory\@evil.test");
isnt($rc, 0, 'an address that is not one is refused');
like($err, qr/is not an address.*nothing changed/, 'named, nothing changed');
($rc, $out, $err) = wl('ben', { USER => $u{ann}, LOGNAME => $u{ann}, HOME => "$homes/$u{ann}", PGUSER => cluster_user(),
		PGOPTIONS => '-c role=' . cluster_user() }, '-C', $conf, 'add', 'mallory@evil.test');
is($rc, 0, 'ben with ann\'s name in his environment') or diag($err);
is(entries($owner{ben}), 'mallory@evil.test owner', 'changes his own list');
is(entries($owner{ann}), 'carol@sender.test owner', 'never ann\'s');
my $own = "$homes/$u{ben}/pepsi.conf";
write_root_config($own, "[whitelist]\nDOMAIN = local.test\n");
system('chown', "$u{ben}:", $own);
($rc, $out, $err) = wl('ben', '-C', $own, 'list');
is($rc, 78, 'a configuration of ben\'s own is refused');
like($err, qr/refusing the configuration \Q$own\E/, 'named');

# The role's rights: the three functions only; its login only by peer.
for my $query ('SELECT count(*) FROM pepsi.whitelist', "SELECT pepsi.settings_set('$owner{ann}', 'WHITELIST', 'no')",
	'SELECT count(*) FROM pepsi.workqueue', 'SELECT pepsi.secretary_expire()')
{
	my ($ret, $o, $e) = $node->psql($db, qq{SET ROLE "$account"; $query});
	like($e, qr/permission denied/, "the role may not: $query");
}
{
	my ($o, $e) = ('', '');
	IPC::Run::run([ 'setpriv', "--reuid=$u{ben}", "--regid=$u{ben}", '--init-groups', '--', 'psql',
			'-h', $node->host, '-p', $node->port, '-U', $account, '-d', $db, '-c', 'SELECT 1' ],
		'<', \undef, '>', \$o, '2>', \$e);
	like($e, qr/Peer authentication failed/, 'ben cannot log in as the set-uid account\'s role');
}

# 3. seed: ann's sent folder, 0600 files of hers.
my $sent = "$homes/$u{ann}/Maildir/.Sent";
make_path("$sent/cur", "$sent/new", "$sent/tmp");
sub sent_message
{
	my ($dir, $name, $headers) = @_;
	open my $fh, '>', "$sent/$dir/$name" or die;
	print $fh "$headers\r\n\r\nHello.\r\nTo: body\@not-a-header.test\r\n";
	close $fh;
}
sent_message('cur', '1.a.host:2,S', "From: <$owner{ann}>\r\nTo: \"Erin, E.\" <Erin\@Sender.test>,\r\n frank\@sender.test (Frank)\r\n"
	  . "Cc: team: grace\@sender.test, heidi\@sender.test;\r\nSubject: one");
sent_message('new', '2.b.host', "From: <$owner{ann}>\r\nTO: erin\@sender.test\r\nBcc: ivan\@sender.test, not-an-address\r\n"
	  . "Subject: two");
system('chown', '-R', "$u{ann}:", "$homes/$u{ann}/Maildir");
system('chmod', '-R', 'go-rwx', "$homes/$u{ann}/Maildir");
# A scanner of the same name first in PATH is not the one run.
my $decoy = "$homes/$u{ann}/bin";
make_path($decoy);
open my $fake, '>', "$decoy/pepsi-helper-mailbox-scan" or die;
print $fake "#!/bin/sh\necho decoy\@evil.test\n";
close $fake;
chmod 0755, $decoy, "$decoy/pepsi-helper-mailbox-scan";
($rc, $out, $err) = wl('ann', { PATH => "$decoy:/usr/bin:/bin" }, '-C', $conf, 'seed');
is($rc, 0, 'ann seeds her whitelist') or diag($err);
like($out, qr/5 addresses found in \Q$sent\E, 5 added/, 'from her sent folder');
like($err, qr/2\.b\.host: Bcc: "not-an-address" is not an address: left out/, 'the entry that is no address named');
is(entries($owner{ann}),
	'carol@sender.test owner,erin@sender.test sent-folder,frank@sender.test sent-folder,grace@sender.test sent-folder,'
	  . 'heidi@sender.test sent-folder,ivan@sender.test sent-folder', 'To, Cc and Bcc recipients, each once, lower case');

# Bad input: no Maildir; a message too big; nothing added.
($rc, $out, $err) = wl('ben', '-C', $conf, 'seed');
is($rc, 65, 'ben has no Maildir');
like($err, qr{\Q$homes/$u{ben}/Maildir/.Sent\E/cur: No such file or directory}, 'named');
open my $big, '>', "$sent/cur/3.c.host:2,S" or die;
print $big "To: judy\@sender.test\r\n\r\n" . ('x' x 4096) . "\r\n";
close $big;
system('chown', "$u{ann}:", "$sent/cur/3.c.host:2,S");
my $small = write_root_config("$etc/small.conf", "SEED_MAX_SIZE = 1k\n");
($rc, $out, $err) = wl('ann', '-C', $small, 'seed');
is($rc, 65, 'a message over SEED_MAX_SIZE stops the seed');
like($err, qr{3\.c\.host:2,S: \d+ bytes is larger than the limit of 1024 .*SEED_MAX_SIZE}, 'named, with the option');
unlike(entries($owner{ann}), qr/judy/, 'nothing added');

# 4. A seeded sender's mail passes the secretary straight; a stranger's is held.
sql("SELECT pepsi.settings_set('$owner{ann}', 'WHITELIST', 'yes')");
my $config = delivery_config($node, maildir_root => $root, local_domains => 'local.test',
	path => "$etc/dispatch.conf",
	extra => { init => "LOCAL_STAGE = secretary\n" },
	more_stages => { secretary => "PROGRAM = pepsi-stage-check-whitelist\nNEXT_STAGE = maildir\nREPLY_STAGE = init\n" });
chmod 0644, $config;
my $d = start_dispatcher($config, log => "$shared/dispatch.log",
	program => [ as_cluster_user(pepsi_bin('pepsi-dispatch')) ]);
inject($node, from => 'frank@sender.test', to => [ $owner{ann} ],
	headers => "From: <frank\@sender.test>\r\nTo: <$owner{ann}>\r\nSubject: from a seeded address\r\n");
ok(poll_until(sub { scalar(maildir_files($root, $owner{ann})) == 1 }, 60),
	'the seeded sender\'s message is delivered at once')
  or diag(slurp("$shared/dispatch.log"));
inject($node, from => 'mallory@evil.test', to => [ $owner{ann} ],
	headers => "From: <mallory\@evil.test>\r\nTo: <$owner{ann}>\r\nSubject: from a stranger\r\n");
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'secretary' AND status = 'paused'") == 1 }, 60),
	'a stranger\'s is held');
is(scalar(maildir_files($root, $owner{ann})), 1, 'and not delivered');

done_testing();
