# pepsi-setup init --apply-pg-hba against a local cluster: its pg_hba.conf
# lines go in a marked block at the top of the cluster's pg_hba.conf (the
# first matching line wins), its pg_ident.conf lines in one at the end of
# pg_ident.conf, and the cluster is reloaded: peer authentication through
# the map then decides who logs in as pepsi_dispatch over the Unix socket
# (refused while the map names another account, let in once it names
# ours).  The block is replaced, never repeated; the same answers again
# change nothing; without the flag the files are left alone.  A block
# whose end marker was removed, or files this host cannot write, stop init
# before any change.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiTest;
use SetupTest;

my $setup = pepsi_bin('pepsi-setup');
my $db = 'postgres';
my $node = pepsi_node('hba', preload => 1);
my $root = PostgreSQL::Test::Utils::tempdir();
my $conninfo = sprintf('host=%s port=%d dbname=%s', $node->host, $node->port, $db);
my $smtp_port = PostgreSQL::Test::Cluster::get_free_port();
my $me = getpwuid($<);
my $hba = $node->safe_psql($db, 'SHOW hba_file');
my $ident = $node->safe_psql($db, 'SHOW ident_file');

sub init
{
	my (@extra) = @_;
	my ($out, $err) = ('', '');

	IPC::Run::run([ $setup, 'init', '--non-interactive', '--root', $root, '--domains', 'local.test',
		'--hostname', 'mx.pepsi.test', '--conninfo', $conninfo, '--delivery', 'maildir', '--relay', 'direct',
		'--listen', '127.0.0.1', '--smtp-port', $smtp_port, @extra ], '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return ($? >> 8, $out, $err);
}

# Can this account log in as pepsi_dispatch through the Unix socket?  The error if not.
sub socket_login
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'psql', '-XAtq', '-d', sprintf('host=%s port=%d dbname=%s user=pepsi_dispatch', $node->host,
		$node->port, $db), '-c', 'SELECT current_user' ], '<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	return $? == 0 && $out =~ /^pepsi_dispatch$/m ? 'in' : $err;
}

my $hba_before = slurp($hba);
my $ident_before = slurp($ident);

#
# Without the flag, the lines are printed and the files left alone.
#
my ($rc, $out, $err) = init('--user', 'nobody');
is($rc, 0, 'init without --apply-pg-hba succeeds') or diag("$out\n$err");
like($out, qr/pg_hba\.conf: local\s+postgres\s+pepsi_dispatch\s+peer map=pepsi/,
	'it prints the pg_hba.conf lines, for the conninfo\'s database');
like($out, qr/add the lines above to pg_hba\.conf and pg_ident\.conf \(or run init with --apply-pg-hba\)/,
	'and says to add them');
like($out, qr/role pepsi_payer: created, pepsi-helper-auto-pay's/, 'it makes the auto-pay helper\'s login role');
like($out, qr/pg_hba\.conf: local\s+postgres\s+pepsi_payer\s+peer map=pepsi/, 'and prints its pg_hba.conf line');
like($out, qr/^  pepsi  root  pepsi_payer$/m, 'and the pg_ident.conf line mapping root to it');
is(slurp($hba), $hba_before, 'pg_hba.conf is left alone');
is(slurp($ident), $ident_before, 'and pg_ident.conf');
is(socket_login(), 'in', 'the cluster\'s own rules still let this account in as pepsi_dispatch');

#
# Bad input: nothing changed.
#
my $tree = tree_state($root);
SKIP: {
	skip 'root may write a read-only file', 3 if $> == 0;
	chmod 0444, $hba;
	($rc, $out, $err) = init('--user', 'nobody', '--apply-pg-hba');
	chmod 0600, $hba;
	is($rc, 69, 'a pg_hba.conf this host cannot write: init stops');
	like($err, qr/--apply-pg-hba: the cluster's pg_hba\.conf, \S+, is not a file this host can write .*the cluster is not local.*nothing changed/,
		'and says why');
	is(slurp($hba), $hba_before, 'pg_hba.conf unchanged');
}
open(my $fh, '>>', $ident) or die "$ident: $!";
print $fh "# BEGIN pepsi-setup: a block whose end line was removed\npepsi  someone  pepsi_dispatch\n";
close $fh;
my $broken = slurp($ident);
($rc, $out, $err) = init('--user', 'nobody', '--apply-pg-hba');
is($rc, 69, 'a pepsi-setup block without its end marker: init stops');
like($err, qr/pg_ident\.conf: its "# BEGIN pepsi-setup" line has no "# END pepsi-setup" line after it.*nothing changed/,
	'and says why');
is(slurp($ident), $broken, 'pg_ident.conf unchanged');
is(slurp($hba), $hba_before, 'pg_hba.conf unchanged');
is(tree_state($root), $tree, 'nothing changed under the root');
open($fh, '>', $ident) or die "$ident: $!";
print $fh $ident_before;
close $fh;

#
# --apply-pg-hba, the map naming another account: this one is refused.
#
($rc, $out, $err) = init('--user', 'nobody', '--apply-pg-hba');
is($rc, 0, 'init --apply-pg-hba succeeds') or diag("$out\n$err");
like($out, qr/the cluster reloaded/, 'it reloads the cluster');
my $hba_now = slurp($hba);
like($hba_now, qr/\A# BEGIN pepsi-setup: [^\n]*\nlocal\s+postgres\s+pepsi_dispatch\s+peer map=pepsi\n(?:local[^\n]*\n){5}# END pepsi-setup\n\Q$hba_before\E\z/,
	'pg_hba.conf: the block first, the cluster\'s lines after it as they were');
my $ident_now_nobody = slurp($ident);
like($ident_now_nobody, qr/\A\Q$ident_before\E# BEGIN pepsi-setup: [^\n]*\npepsi  nobody  pepsi_dispatch\n(?:[^\n]*\n){5}# END pepsi-setup\n\z/,
	'pg_ident.conf: the block last');
is($node->safe_psql($db, 'SELECT count(*) FROM pg_hba_file_rules WHERE error IS NOT NULL'), '0',
	'the server parses every line');
my $refused;
ok(poll_until(sub { ($refused = socket_login()) =~ /Peer authentication failed for user "pepsi_dispatch"/ }),
	'the reloaded cluster refuses this account as pepsi_dispatch (the map names nobody)') or diag($refused);

#
# pepsi-helper-auto-pay's login: root, mapped to pepsi_payer, a member of
# pepsi_autopay alone with no password.  (The tests do not run as root:
# the map's line is read back as the server parsed it, the role's rights
# taken with SET ROLE, and any other account is refused as it.)
#
like($hba_now, qr/^local\s+postgres\s+pepsi_payer\s+peer map=pepsi$/m, 'pg_hba.conf: pepsi_payer by peer through the map');
is( $node->safe_psql($db, "SELECT string_agg(sys_name || ' ' || pg_username, ',') FROM pg_ident_file_mappings"
		  . " WHERE map_name = 'pepsi' AND pg_username = 'pepsi_payer' AND error IS NULL"),
	'root pepsi_payer', 'pg_ident.conf: root, and only root, may log in as pepsi_payer');
is( $node->safe_psql($db, "SELECT r.rolcanlogin || ' ' || (a.rolpassword IS NULL) || ' ' || r.rolsuper || ' '"
		  . " || (SELECT string_agg(g.rolname, ',') FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
		  . "     WHERE m.member = r.oid)"
		  . " FROM pg_roles r JOIN pg_authid a ON a.oid = r.oid WHERE r.rolname = 'pepsi_payer'"),
	'true true false pepsi_autopay', 'pepsi_payer logs in, has no password, is a member of pepsi_autopay alone');

# What the helper may do as pepsi_payer: claim and settle a payment, nothing else.
sub as_payer
{
	my ($sql) = @_;
	my ($ret, $stdout, $stderr) = $node->psql($db, "SET ROLE pepsi_payer; $sql");
	return $ret == 0 ? "ok $stdout" : $stderr =~ /permission denied/ ? 'denied' : $stderr;
}
like(as_payer('SELECT pepsi.auto_pay_claim(0)'), qr/^ok /, 'as pepsi_payer: auto_pay_claim may be called')
  or diag(as_payer('SELECT pepsi.auto_pay_claim(0)'));
is(as_payer('SELECT count(*) FROM pepsi.workqueue'), 'denied', 'the queue may not be read');
is(as_payer('SELECT count(*) FROM pepsi.payment'), 'denied', 'nor the payments table');
is(as_payer("SELECT pepsi.workqueue_add('a\@b.test', '{c\@d.test}', 'h', 'b')"), 'denied',
	'nor a message injected');
my $payer_login;
ok( poll_until(sub {
		my ($o, $e) = ('', '');
		IPC::Run::run([ 'psql', '-XAtq', '-d', sprintf('host=%s port=%d dbname=%s user=pepsi_payer', $node->host,
			$node->port, $db), '-c', 'SELECT 1' ], '<', \undef, '>', \$o, '2>', \$e, IPC::Run::timeout(60));
		($payer_login = $e) =~ /Peer authentication failed for user "pepsi_payer"/;
	}),
	'an account other than root is refused as pepsi_payer') or diag($payer_login);

#
# The same answers: nothing changes.
#
($rc, $out, $err) = init('--user', 'nobody', '--apply-pg-hba');
is($rc, 0, 'init --apply-pg-hba again succeeds') or diag("$out\n$err");
like($out, qr/their pepsi-setup block: as the answers say already/, 'the block is as the answers say');
like($out, qr/nothing changed: the host already is as the answers say/, 'init changed nothing');
is(slurp($hba), $hba_now, 'pg_hba.conf is byte for byte the same');
is(slurp($ident), $ident_now_nobody, 'and pg_ident.conf');
like($out, qr/role pepsi_payer: pepsi-helper-auto-pay's, a member of pepsi_autopay alone, no password, already/,
	'the auto-pay role is as it should be already');

# A password given to pepsi_payer, or another group: init takes them away again.
$node->safe_psql($db, "ALTER ROLE pepsi_payer PASSWORD 'guessable'; GRANT pepsi_stage TO pepsi_payer");
($rc, $out, $err) = init('--user', 'nobody', '--apply-pg-hba');
is($rc, 0, 'init again, pepsi_payer changed by hand') or diag("$out\n$err");
like($out, qr/role pepsi_payer: brought in line/, 'init brings the role back in line');
is( $node->safe_psql($db, "SELECT (a.rolpassword IS NULL) || ' ' || (SELECT string_agg(g.rolname, ',')"
		  . " FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = a.oid)"
		  . " FROM pg_authid a WHERE a.rolname = 'pepsi_payer'"),
	'true pepsi_autopay', 'no password again, and a member of pepsi_autopay alone');

#
# The map naming this account: the block replaced, and it logs in.
#
($rc, $out, $err) = init('--user', $me, '--apply-pg-hba');
is($rc, 0, "init --apply-pg-hba --user $me succeeds") or diag("$out\n$err");
my $ident_now = slurp($ident);
is(scalar(() = $ident_now =~ /^# BEGIN pepsi-setup/mg), 1, 'pg_ident.conf has one block');
like($ident_now, qr/^pepsi  \Q$me\E  pepsi_dispatch$/m, 'naming this account');
unlike($ident_now, qr/nobody/, 'and no longer the other');
is(scalar(() = slurp($hba) =~ /^# BEGIN pepsi-setup/mg), 1, 'pg_hba.conf has one block');
my $login;
ok(poll_until(sub { ($login = socket_login()) eq 'in' }), 'this account logs in as pepsi_dispatch by peer and the map')
  or diag($login);

done_testing();
