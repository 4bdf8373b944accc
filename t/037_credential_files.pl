# A database password is never in a file others can read: a password file
# (passfile in CONNINFO, or PGPASSFILE) with group or other permissions is
# refused with a clear error, and so is a CONNINFO that holds a password in
# a pepsi.conf others can read.  libpq alone would warn about the first and
# use the second.  Checked through pepsi-queue (common/runtime/db.c, which every
# program connects with).

use strict;
use warnings FATAL => 'all';

use IPC::Run qw(run);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $bin = $ENV{PEPSI_BIN} or plan skip_all => 'PEPSI_BIN is not set';
my $db = 'postgres';
my $node = pepsi_node('credential_files', extension => 1);
my $dir = PostgreSQL::Test::Utils::tempdir();

sub conf
{
	my ($name, $conninfo, $mode) = @_;
	my $path = "$dir/$name";

	open my $fh, '>', $path or die "$path: $!";
	print $fh "[pepsi]\nHOSTNAME = cred.example.org\n[database]\n"
	  . sprintf("CONNINFO = host=%s port=%d dbname=%s %s\n", $node->host, $node->port, $db, $conninfo);
	close $fh;
	chmod $mode, $path;
	return $path;
}

sub queue_list
{
	my ($config, %env) = @_;
	my ($out, $err) = ('', '');
	local @ENV{ keys %env } = values %env;

	run([ "$bin/pepsi-queue", '-C', $config, 'list' ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $err);
}

# A password in CONNINFO: the file must be the owner's alone.
my ($rc, $err) = queue_list(conf('open.conf', 'password=sekrit', 0644));
isnt($rc, 0, 'a CONNINFO password in a file others may read: refused');
like($err, qr/open\.conf: \[database\] CONNINFO holds a password, and others may read the file \(mode 0644\); refused: chmod 600/,
	'naming the file, the mode and the fix');
($rc, $err) = queue_list(conf('closed.conf', 'password=sekrit', 0600));
is($rc, 0, 'the same file with mode 600 works') or diag($err);
($rc, $err) = queue_list(conf('nopass.conf', '', 0644));
is($rc, 0, 'a file without a password may be world-readable') or diag($err);

# A password file.
my $passfile = "$dir/pgpass";
PostgreSQL::Test::Utils::append_to_file($passfile, "*:*:*:*:sekrit\n");
chmod 0640, $passfile;
($rc, $err) = queue_list(conf('passfile.conf', "passfile=$passfile", 0644));
isnt($rc, 0, 'a passfile its group may read: refused');
like($err, qr/\[database\] CONNINFO: password file \Q$passfile\E.*\(mode 0640\); refused: chmod 600/, 'with its mode and the fix');
($rc, $err) = queue_list(conf('passfile.conf', '', 0644), PGPASSFILE => $passfile);
isnt($rc, 0, 'so is PGPASSFILE');
like($err, qr/password file \Q$passfile\E/, 'named as well');
chmod 0600, $passfile;
($rc, $err) = queue_list(conf('passfile.conf', "passfile=$passfile", 0644));
is($rc, 0, 'a passfile of mode 600 is used') or diag($err);
done_testing();
