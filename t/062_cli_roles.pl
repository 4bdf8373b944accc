# The operator tools connect as the role their command needs, whatever
# [database] CONNINFO (the pipeline's) says: pepsi-status and pepsi-queue
# summary and shape as [database] MONITOR_CONNINFO (a member of
# pepsi_monitor), every command that reads messages or changes anything
# as [database] CONFIG_CONNINFO (a member of pepsi_config).  A write
# command given a monitor's connection cannot write: the database refuses
# it, and nothing changes.  A password in any CONNINFO is masked by
# pepsi-config list.
use strict;
use warnings FATAL => 'all';

use IPC::Run qw(run);
use JSON::PP;
use PepsiTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $bin = $ENV{PEPSI_BIN} or plan skip_all => 'PEPSI_BIN is not set';
my $db = 'postgres';
my $node = pepsi_node('cli_roles', extension => 1);
$node->safe_psql($db, q{
	CREATE ROLE pipeline LOGIN IN ROLE pepsi_stage;
	CREATE ROLE operator LOGIN IN ROLE pepsi_config;
	CREATE ROLE watcher LOGIN IN ROLE pepsi_monitor;
});

my $dir = PostgreSQL::Test::Utils::tempdir();

sub conninfo
{
	my ($user, $password) = @_;

	return sprintf('host=%s port=%d dbname=%s user=%s%s', $node->host, $node->port, $db, $user,
		$password ? " password=$password" : '');
}

# A configuration whose three connection strings name these roles.
sub write_conf
{
	my ($name, %role) = @_;
	my $path = "$dir/$name.conf";

	open my $fh, '>', $path or die "$path: $!";
	print $fh "[database]\n"
	  . 'CONNINFO = ' . conninfo($role{pipeline}, 'pipeline-secret') . "\n"
	  . ($role{monitor} ? 'MONITOR_CONNINFO = ' . conninfo($role{monitor}) . "\n" : '')
	  . ($role{config} ? 'CONFIG_CONNINFO = ' . conninfo($role{config}) . "\n" : '');
	close $fh;
	chmod 0600, $path;
	return $path;
}

sub tool
{
	my ($config, $name, @args) = @_;
	my ($out, $err) = ('', '');

	run([ "$bin/pepsi-$name", '-C', $config, @args ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

sub sql { return $node->safe_psql($db, shift); }

# Who the server saw acting: the last event's principal.
sub last_principal
{
	return sql('SELECT principal FROM pepsi.event_log ORDER BY id DESC LIMIT 1');
}

my $ids = sql(q{SELECT string_agg(pepsi.workqueue_add('a@example.org', '{b@example.net}',
	'Subject: x'::bytea, 'x'::bytea, '{}', NULL, NULL, 'init')::text, ',') FROM generate_series(1, 2)});
my ($first, $second) = split /,/, $ids;
sql("UPDATE pepsi.workqueue SET status = 'failed' WHERE id IN ($ids)");

# 1. Each command as its own role; CONNINFO's role is never used.
my $split = write_conf('split', pipeline => 'pipeline', monitor => 'watcher', config => 'operator');
my ($rc, $out, $err) = tool($split, 'status', '--json');
is($rc, 0, 'pepsi-status works as a member of pepsi_monitor') or diag($err);
ok(eval { decode_json($out)->{stages} }, 'and prints the stages');
($rc, $out, $err) = tool($split, 'queue', 'summary');
is($rc, 0, 'pepsi-queue summary as the monitor') or diag($err);
($rc, $out, $err) = tool($split, 'queue', 'list');
is($rc, 0, 'pepsi-queue list as the operator (it reads messages)') or diag($err);
like($out, qr/^\s*$first\s/m, 'and lists them');
($rc, $out, $err) = tool($split, 'queue', 'retry', $first);
is($rc, 0, 'pepsi-queue retry as the operator') or diag($err);
is(last_principal(), 'operator', 'logged with CONFIG_CONNINFO\'s role as principal');
($rc, $out, $err) = tool($split, 'config', 'set', 'dispatch', 'POLL_INTERVAL', '7s');
is($rc, 0, 'pepsi-config set as the operator') or diag($err);
is(last_principal(), 'operator', 'logged as the operator too');

# 2. A monitor's connection given for the writes: the database refuses them.
my $monitor_only = write_conf('monitor-only', pipeline => 'pipeline', monitor => 'watcher',
	config => 'watcher');
my $before = sql(q{SELECT string_agg(id || ':' || status, ',' ORDER BY id) FROM pepsi.workqueue})
  . sql('SELECT count(*) FROM pepsi.event_log')
  . sql('SELECT count(*) FROM pepsi.config_override');
($rc, $out, $err) = tool($monitor_only, 'status');
is($rc, 0, 'pepsi-status still works as the monitor') or diag($err);
($rc, $out, $err) = tool($monitor_only, 'queue', 'delete', $second);
is($rc, 77, 'pepsi-queue delete as a member of pepsi_monitor: refused (EX_NOPERM)');
like($err, qr/permission denied/, 'by the database');
($rc, $out, $err) = tool($monitor_only, 'config', 'set', 'dispatch', 'POLL_INTERVAL', '9s');
is($rc, 77, 'pepsi-config set as a member of pepsi_monitor: refused');
like($err, qr/permission denied/, 'by the database');
($rc, $out, $err) = tool($monitor_only, 'queue', 'show', $second);
is($rc, 77, 'pepsi-queue show as the monitor: refused (a monitor reads no message)');
is( sql(q{SELECT string_agg(id || ':' || status, ',' ORDER BY id) FROM pepsi.workqueue})
	  . sql('SELECT count(*) FROM pepsi.event_log')
	  . sql('SELECT count(*) FROM pepsi.config_override'),
	$before, 'nothing changed, nothing logged');

# 3. The pipeline's CONNINFO alone (no role for the tools): every tool uses it.
my $pipeline_only = write_conf('pipeline-only', pipeline => 'nosuchrole');
($rc, $out, $err) = tool($pipeline_only, 'status');
isnt($rc, 0, 'without MONITOR_CONNINFO pepsi-status uses CONNINFO');
like($err, qr/\[database\] CONNINFO.*role "nosuchrole" does not exist/s,
	'and says which option it connected with');

# 4. pepsi-config list masks a password in every CONNINFO.
($rc, $out, $err) = tool($split, 'config', 'list');
is($rc, 0, 'config list') or diag($err);
unlike($out, qr/pipeline-secret/, 'the password is not shown');
like($out, qr/password=\*{8}/, 'it is masked');

done_testing();
