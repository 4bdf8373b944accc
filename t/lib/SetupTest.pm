# Helpers for the TAP tests of pepsi-setup: running it, the state of a
# --root tree (what "nothing changed" compares), setup_task rows written
# as pepsi_operator, and a row's status with its log lines.

package SetupTest;

use strict;
use warnings FATAL => 'all';

use Digest::SHA qw(sha256_hex);
use Exporter 'import';
use File::Find;
use IPC::Run;
use PostgreSQL::Test::Utils;

use DeliveryTest qw(pepsi_bin slurp);

our @EXPORT = qw(run_setup tree_state as_role task_row);

# pepsi-setup @args, standard input from $opts{stdin} (or none): (exit status, stdout, stderr).
sub run_setup
{
	my (@args) = @_;
	my ($out, $err) = ('', '');

	IPC::Run::run([ pepsi_bin('pepsi-setup'), @args ], '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return ($? >> 8, $out, $err);
}

# Every file and directory under $root with its mode (and a file's hash), one per line.
sub tree_state
{
	my ($root) = @_;
	my %state;

	find({ no_chdir => 1, wanted => sub {
		my @st = lstat $_;
		$state{$_} = -d _ ? sprintf('dir %04o', $st[2] & 07777)
		  : sprintf('%04o %s', $st[2] & 07777, sha256_hex(slurp($_) // ''));
	} }, $root);
	return join("\n", map { "$_ $state{$_}" } sort keys %state);
}

# $sql run by psql as the conninfo $conninfo (another role than the test's): its output.
sub as_role
{
	my ($conninfo, $sql) = @_;
	my ($stdout, $stderr) = ('', '');

	IPC::Run::run([ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $conninfo, '-c', $sql ],
		'>', \$stdout, '2>', \$stderr, IPC::Run::timeout(60));
	die "psql as $conninfo: $stderr" if $?;
	chomp $stdout;
	return $stdout;
}

# "STATUS: line | line ..." of setup_task $id.
sub task_row
{
	my ($node, $db, $id) = @_;

	return $node->safe_psql($db, "SELECT status || ': ' || coalesce(string_agg(l.line, ' | ' ORDER BY l.id), '') "
		. "FROM pepsi.setup_task t LEFT JOIN pepsi.setup_task_log l ON l.task_id = t.id WHERE t.id = $id GROUP BY t.status");
}

1;
