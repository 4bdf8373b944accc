# The privilege boundaries of the administrative surface
# (docs/architecture.md 7.2, docs/pepsi-admin.7.md): a login role in each group role the
# extension creates, connecting as itself, tries what it must not do (and
# gets a permission error) and what it may do.  The pipeline may not write
# the configuration; ingress may only admit; only pepsi_config writes
# config_override, and it acts on the queue only through the audited
# functions, which log it as the principal; nobody changes the audit log;
# the monitor reads the views and the statistics, never a message.  Then
# pepsi.apply_grants() against drift, the roles across databases, a
# re-creation of the extension and a restart.

use strict;
use warnings FATAL => 'all';

use FindBin;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $db = 'postgres';
my $node = pepsi_node('roles', extension => 1);

is( $node->safe_psql(
		$db,
		"SELECT string_agg(rolname || ':' || rolcanlogin, ' ' ORDER BY rolname)"
		  . " FROM pg_roles WHERE rolname LIKE 'pepsi\\_%'"),
	'pepsi_autopay:false pepsi_config:false pepsi_crypto:false pepsi_dispatch:false pepsi_httpd:false pepsi_ingress:false'
	  . ' pepsi_monitor:false'
	  . ' pepsi_stage:false pepsi_whitelist:false',
	'CREATE EXTENSION creates the nine group roles, none able to log in');
is($node->safe_psql($db, "SELECT pg_has_role('pepsi_dispatch', 'pepsi_stage', 'MEMBER')"),
	't', 'pepsi_dispatch is a member of pepsi_stage');

# docs/pepsi-admin.7.md's roles table says what the policy grants: a row
# per group role, and each row names every table and view its role may use.
{
	my $doc = slurp_file(($ENV{PEPSI_TOP} // "$FindBin::Bin/..") . "/docs/pepsi-admin.7.md");
	my %row = map { /^\| `(pepsi_\w+)` \|/ ? ($1 => $_) : () } split /\n/, $doc;
	my $roles = $node->safe_psql($db, 'SELECT string_agg(name, \' \' ORDER BY name) FROM pepsi.grant_role');
	is(join(' ', sort keys %row), $roles, 'pepsi-admin(7): the roles table has a row for each group role');
	my $count = scalar(my @names = split / /, $roles);
	like($doc, qr/creates \Q@{[ (qw(zero one two three four five six seven eight nine))[$count] ]}\E group roles/,
		'and says how many there are');
	for my $grant (split /\n/, $node->safe_psql($db,
		"SELECT role || ' ' || object_name FROM pepsi.grant_policy() WHERE object_kind IN ('table', 'view') ORDER BY 1"))
	{
		my ($role, $object) = split / /, $grant;
		like($row{$role} // '', qr/`\Q$object\E`/, "pepsi-admin(7): $role\'s row names $object");
	}
}

# One login role per group, and one in none.
$node->safe_psql(
	$db, q{
CREATE ROLE relay LOGIN IN ROLE pepsi_stage;
CREATE ROLE dispatcher LOGIN IN ROLE pepsi_dispatch;
CREATE ROLE smtpd LOGIN IN ROLE pepsi_ingress;
CREATE ROLE admin LOGIN IN ROLE pepsi_config;
CREATE ROLE grafana LOGIN IN ROLE pepsi_monitor;
CREATE ROLE nobody LOGIN;
});

# Run $sql as $role; returns (exit code, stdout, stderr).
sub as_role
{
	my ($role, $sql) = @_;
	my ($ret, $out, $err) =
	  $node->psql($db, $sql, extra_params => [ '-U', $role ]);
	return ($ret, $out, $err);
}

# $role may run $sql; returns its output.
sub may
{
	my ($role, $what, $sql) = @_;
	my ($ret, $out, $err) = as_role($role, $sql);

	is($ret, 0, "$role may $what") or diag($err);
	return $out;
}

# $role may not run $sql: it fails with an error matching $error
# (default: a permission error).
sub may_not
{
	my ($role, $what, $sql, $error) = @_;
	my ($ret, $out, $err) = as_role($role, $sql);

	$error //= qr/permission denied/;
	ok($ret != 0 && $err =~ $error, "$role may not $what")
	  or diag("exit $ret, stderr: $err");
	return;
}

sub superuser
{
	my ($sql) = @_;
	return $node->safe_psql($db, $sql);
}

# Rows for the roles to act on: one running at init (as if claimed), one
# failed at relay.
my $running = superuser(
	"SELECT pepsi.workqueue_add('s\@example.org', '{a\@example.net}', 'h', 'b')");
my $failed = superuser(
	"SELECT pepsi.workqueue_add('s\@example.org', '{b\@example.net}', 'h', 'b', stage => 'relay')"
);
superuser("UPDATE pepsi.workqueue SET status = 'running' WHERE id = $running");
superuser("UPDATE pepsi.workqueue SET status = 'failed' WHERE id = $failed");
superuser("SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '5s')");

#
# pepsi_stage: the pipeline
#
is(may('relay', 'read the queue', 'SELECT count(*) FROM pepsi.workqueue'),
	'2', 'the stage sees every row');
may('relay', 'commit a running row',
	"SELECT pepsi.workqueue_commit($running, 'init', 'advance', 'relay')");
# Claiming, and recovering the rows a dead worker held, are the
# dispatcher's (pepsi_dispatch): a stage's role may not, not even holding
# the dispatcher's advisory lock while no dispatcher runs.
may_not('relay', 'claim (the dispatcher claims)',
	"SELECT id FROM pepsi.workqueue_claim(ARRAY['relay'], ARRAY[10])");
may_not('relay', 'claim with tokens',
	"SELECT id FROM pepsi.workqueue_claim_tokens(ARRAY['relay'], ARRAY[10])");
may_not('relay', "reset orphans with the dispatcher's lock taken",
	"SELECT pg_advisory_lock(1346720851, 2); SELECT pepsi.workqueue_reset_orphans()");
may_not('relay', "recover a row with the dispatcher's lock taken",
	"SELECT pg_advisory_lock(1346720851, 2);"
	  . " SELECT pepsi.workqueue_recover(ARRAY[$running], ARRAY['relay'], 'pending', NULL, ARRAY[NULL::uuid])");
is( may('dispatcher', 'claim',
		"SELECT id FROM pepsi.workqueue_claim(ARRAY['relay'], ARRAY[10])"),
	$running,
	'the claim hands the dispatcher the advanced row');
is(may('dispatcher', 'read the queue, as pepsi_stage', 'SELECT count(*) FROM pepsi.workqueue'),
	'2', 'the dispatcher has pepsi_stage\'s rights too');
my $body = superuser("SELECT body_id FROM pepsi.workqueue WHERE id = $running");
may('relay', 'finish a row', "SELECT pepsi.workqueue_commit($running, 'relay', 'finish')");
is(superuser("SELECT count(*) FROM pepsi.workqueue_body WHERE id = $body"),
	'0', 'the body of the row the stage finished was released by its trigger');
is( may('relay', 'read the configuration overlay',
		"SELECT pepsi.config_get('global', 'dispatch', 'POLL_INTERVAL')"),
	'5s',
	'the stage reads the override');
may('relay', 'read per-address settings', 'SELECT count(*) FROM pepsi.settings');
may_not('relay', 'append to the audit log directly',
	"INSERT INTO pepsi.event_log (action) VALUES ('stage_note')");
may('relay', 'update the statistics',
	"INSERT INTO pepsi.stage_stats (stage, messages) VALUES ('relay', 1)");
may_not('relay', 'insert into config_override',
	"INSERT INTO pepsi.config_override (scope, section, option, value)"
	  . " VALUES ('global', 'dispatch', 'FAIR_HALF_LIFE', '1m')");
may_not('relay', 'update config_override',
	"UPDATE pepsi.config_override SET value = '1s'");
may_not('relay', 'delete from config_override', 'DELETE FROM pepsi.config_override');
may_not('relay', 'call config_set',
	"SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '1s')");
may_not('relay', 'insert into settings',
	"INSERT INTO pepsi.settings VALUES ('bob\@example.org', 'VACATION', 'on')");
may_not('relay', 'update settings', "UPDATE pepsi.settings SET value = 'off'");
may_not('relay', 'update the audit log', "UPDATE pepsi.event_log SET action = 'x'");
may_not('relay', 'delete from the audit log', 'DELETE FROM pepsi.event_log');
may_not('relay', 'truncate the audit log', 'TRUNCATE pepsi.event_log');
may_not('relay', 'read the audit log', 'SELECT count(*) FROM pepsi.event_log');
may_not('relay', 'call the audited queue actions', "SELECT pepsi.queue_delete('{$failed}')");
may_not('relay', 'reapply the grants', 'SELECT * FROM pepsi.apply_grants()');

#
# pepsi_ingress: admission only
#
my $admitted = may('smtpd', 'admit a message',
	"SELECT pepsi.workqueue_add('s\@example.org', '{c\@example.net}', 'h', 'b')");
is(superuser("SELECT stage || ' ' || status FROM pepsi.workqueue WHERE id = $admitted"),
	'init pending', 'the admitted row is in the queue');
may('smtpd', 'wake the dispatcher', 'SELECT pepsi.notify_workqueue()');
may('smtpd', 'read its configuration',
	"SELECT pepsi.config_get('global', 'dispatch', 'POLL_INTERVAL')");
may_not('smtpd', 'read the queue', 'SELECT count(*) FROM pepsi.workqueue');
may_not('smtpd', 'read a body', 'SELECT count(*) FROM pepsi.workqueue_body');
may_not('smtpd', 'insert a row directly',
	"INSERT INTO pepsi.workqueue (mail_from, rcpt_to, headers, body_id)"
	  . " VALUES ('s', '{r}', 'h', 1)");
may_not('smtpd', 'insert a body directly',
	"INSERT INTO pepsi.workqueue_body (body) VALUES ('b')");
may_not('smtpd', 'update a row', "UPDATE pepsi.workqueue SET stage = 'relay'");
may_not('smtpd', 'delete a row', 'DELETE FROM pepsi.workqueue');
# Local submission (pepsi-sendmail) is admission too, through workqueue_inject.
may('smtpd', 'submit locally through workqueue_inject',
	"SELECT pepsi.workqueue_inject('init', 's', '{r}', 'h', 'b') IS NOT NULL");
may_not('smtpd', 'commit a transition',
	"SELECT pepsi.workqueue_commit($failed, 'relay', 'finish')");
may_not('smtpd', 'claim', "SELECT * FROM pepsi.workqueue_claim(ARRAY['init'], ARRAY[1])");
may_not('smtpd', 'resume rows', "SELECT pepsi.workqueue_resume('{$failed}')");
may_not('smtpd', 'write the configuration',
	"SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '1s')");
may_not('smtpd', 'write settings',
	"INSERT INTO pepsi.settings VALUES ('bob\@example.org', 'VACATION', 'on')");
may_not('smtpd', 'write the audit log',
	"INSERT INTO pepsi.event_log (action) VALUES ('x')");
may_not('smtpd', 'read the queue views', 'SELECT * FROM pepsi.queue_summary');

# workqueue_add runs as the owner with its search_path pinned: a temporary
# table that shadows the queue in the caller's search_path changes nothing.
my $shadowed = may(
	'smtpd',
	'admit through a hostile search_path',
	"CREATE TEMP TABLE workqueue (LIKE pg_class);"
	  . " SET search_path = pg_temp, pepsi, pg_catalog;"
	  . " SELECT pepsi.workqueue_add('s\@example.org', '{d\@example.net}', 'h', 'b')");
is(superuser("SELECT count(*) FROM pepsi.workqueue WHERE id = $shadowed"),
	'1', 'the row went to pepsi.workqueue regardless');

#
# pepsi_config: the configuration, and the queue through audited functions
#
is( may('admin', 'set an override',
		"SELECT pepsi.config_set('domain:example.org', 'stage-relay', 'MAX_LIFETIME', '2d')"
		  . " IS NULL"),
	't',
	'config_set returns no previous value for a new override');
may('admin', 'replace an override',
	"SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '10s')");
is(may('admin', 'read an override', "SELECT pepsi.config_get('global', 'dispatch', 'POLL_INTERVAL')"),
	'10s', 'the replaced value is in force');
may('admin', 'remove an override',
	"SELECT pepsi.config_unset('domain:example.org', 'stage-relay', 'MAX_LIFETIME')");
# Only through the audited functions: no role writes the overlay or the
# audit log directly, so neither can be changed without a true record.
for my $role (qw(relay smtpd admin grafana nobody))
{
	may_not($role, 'insert into config_override directly',
		"INSERT INTO pepsi.config_override (scope, section, option, value)"
		  . " VALUES ('global', 'stage-filter', 'SPAM_SCORE', '6')");
	may_not($role, 'update config_override directly',
		"UPDATE pepsi.config_override SET value = '7'");
	may_not($role, 'delete from config_override directly', 'DELETE FROM pepsi.config_override');
	may_not($role, 'insert into the audit log directly',
		"INSERT INTO pepsi.event_log (principal, action) VALUES ('someone_else', 'forged')");
	may_not($role, 'write the audit log through event_log_write',
		"SELECT pepsi.event_log_write('forged', '{}')");
}
is(superuser("SELECT updated_by FROM pepsi.config_override WHERE option = 'POLL_INTERVAL'"),
	'admin', 'config_set records its caller as updated_by, though it runs as the owner');
may('admin', 'write settings',
	"INSERT INTO pepsi.settings VALUES ('bob\@example.org', 'VACATION', 'on')");
may_not(
	'admin',
	'override [database]',
	"SELECT pepsi.config_set('global', 'database', 'CONNINFO', 'host=evil.example')",
	qr/cannot be overridden/);
may_not('admin', 'point the smarthost elsewhere',
	"SELECT pepsi.config_set('global', 'stage-smarthost', 'SMARTHOST', 'evil.example:25')",
	qr/option SMARTHOST of \[stage-smarthost\] cannot be overridden/);
may_not('admin', 'name a file to read',
	"SELECT pepsi.config_set('global', 'stage-smarthost', 'AUTH_PASSWORD_FILE', '/etc/shadow')",
	qr/cannot be overridden/);
may_not('admin', 'run a program by its path',
	"SELECT pepsi.config_set('global', 'stage-smarthost', 'PROGRAM', '/bin/sh')",
	qr/PROGRAM/);
may('admin', 'read the queue, the views and the audit log',
	'SELECT count(*) FROM pepsi.workqueue; SELECT * FROM pepsi.queue_summary;'
	  . ' SELECT * FROM pepsi.queue_shape; SELECT * FROM pepsi.queue_senders;'
	  . ' SELECT count(*) FROM pepsi.event_log');
is(may('admin', 'hold a row', "SELECT pepsi.queue_hold('{$failed}')"), '1', 'one row held');
is(may('admin', 'release it', "SELECT pepsi.queue_release('{$failed}')"), '1', 'one row released');
superuser("UPDATE pepsi.workqueue SET status = 'failed' WHERE id = $failed");
is(may('admin', 'retry it', "SELECT pepsi.queue_retry('{$failed}')"), '1', 'one row retried');
is(may('admin', 'bounce it', "SELECT pepsi.queue_bounce('{$failed}', 'no such user')"),
	'1', 'one row bounced');
is(may('admin', 'delete it', "SELECT pepsi.queue_delete('{$failed}')"), '1', 'one row deleted');
is( superuser(
		"SELECT string_agg(action, ' ' ORDER BY id) FROM pepsi.event_log WHERE principal = 'admin'"),
	'config_set config_set config_unset queue_hold queue_release queue_retry queue_bounce queue_delete',
	'each action of the administrator is logged once, with the administrator as principal'
);
may_not('admin', 'update a queue row directly', "UPDATE pepsi.workqueue SET status = 'pending'");
may_not('admin', 'delete a queue row directly', 'DELETE FROM pepsi.workqueue');
may_not('admin', 'insert a queue row directly',
	"INSERT INTO pepsi.workqueue (mail_from, rcpt_to, headers, body_id)"
	  . " VALUES ('s', '{r}', 'h', 1)");
may_not('admin', 'commit a transition as a stage would',
	"SELECT pepsi.workqueue_commit($admitted, 'init', 'finish')");
may_not('admin', 'claim', "SELECT * FROM pepsi.workqueue_claim(ARRAY['init'], ARRAY[1])");
may_not('admin', 'update the audit log', "UPDATE pepsi.event_log SET principal = 'someone'");
may_not('admin', 'delete from the audit log', 'DELETE FROM pepsi.event_log');
may_not('admin', 'truncate the audit log', 'TRUNCATE pepsi.event_log');
may_not('admin', 'write the statistics', "UPDATE pepsi.dispatch_stats SET messages = 0");
may_not('admin', 'reapply the grants', 'SELECT * FROM pepsi.apply_grants()');

#
# pepsi_monitor: the views and the statistics
#
like(may('grafana', 'read queue_summary', 'SELECT * FROM pepsi.queue_summary'),
	qr/^init\|pending\|/m, 'the summary shows the queue');
like(may('grafana', 'read queue_shape', 'SELECT * FROM pepsi.queue_shape'),
	qr/^example\.net\|/m, 'the shape shows the destinations');
may('grafana', 'read queue_senders', 'SELECT * FROM pepsi.queue_senders');
may('grafana', 'read the statistics',
	'SELECT * FROM pepsi.stage_stats; SELECT * FROM pepsi.dispatch_stats');
may_not('grafana', 'read the queue', 'SELECT count(*) FROM pepsi.workqueue');
may_not('grafana', 'read the headers of a row', 'SELECT headers FROM pepsi.workqueue');
may_not('grafana', 'read a body', 'SELECT count(*) FROM pepsi.workqueue_body');
may_not('grafana', 'read the configuration', 'SELECT count(*) FROM pepsi.config_override');
may_not('grafana', 'read settings', 'SELECT count(*) FROM pepsi.settings');
may_not('grafana', 'read the audit log', 'SELECT count(*) FROM pepsi.event_log');
may_not('grafana', 'read the mail log', 'SELECT count(*) FROM pepsi.mail_log');
may_not('grafana', 'write the audit log', "INSERT INTO pepsi.event_log (action) VALUES ('x')");
may_not('grafana', 'act on the queue', "SELECT pepsi.queue_hold('{$admitted}')");
may_not('grafana', 'read an override', "SELECT pepsi.config_get('global', 'dispatch', 'POLL_INTERVAL')");
may_not('grafana', 'admit a message',
	"SELECT pepsi.workqueue_add('s', '{r}', 'h', 'b')");

#
# A role in no group, and the owner against the audit log
#
may_not('nobody', 'read the queue views', 'SELECT * FROM pepsi.queue_summary');
may_not('nobody', 'admit a message', "SELECT pepsi.workqueue_add('s', '{r}', 'h', 'b')");
my ($ret, $out, $err) = $node->psql($db, 'DELETE FROM pepsi.event_log');
ok($ret != 0 && $err =~ /pepsi\.event_log is append-only/,
	'not even the owner deletes from the audit log');

#
# apply_grants(): re-applies the policy and reports what it cannot repair
#
is(superuser('SELECT count(*) FROM pepsi.apply_grants()'), '0', 'no drift after CREATE EXTENSION');

# A blanket grant of the kind a setup script hands out opens the audit log
# and the configuration; re-applying closes them again.
superuser('GRANT ALL ON ALL TABLES IN SCHEMA pepsi TO relay, pepsi_stage');
may('relay', 'write config_override after a blanket grant',
	"UPDATE pepsi.config_override SET value = '10s' WHERE option = 'POLL_INTERVAL'");
is( superuser(
		"SELECT count(*) FROM pepsi.apply_grants() WHERE grantee = 'relay'"
		  . " AND object = 'table pepsi.config_override' AND privilege = 'UPDATE'"),
	'1',
	'the blanket grant to a login role is reported as drift');
may_not('relay', 'update the audit log after re-applying', "UPDATE pepsi.event_log SET action = 'x'");
may_not('relay', 'delete from the audit log after re-applying', 'DELETE FROM pepsi.event_log');
may('relay', 'still write config_override through its own grant, reported above',
	"UPDATE pepsi.config_override SET value = '10s' WHERE option = 'POLL_INTERVAL'");
superuser('REVOKE ALL ON ALL TABLES IN SCHEMA pepsi FROM relay');
may_not('relay', 'write config_override through pepsi_stage once re-applied',
	"UPDATE pepsi.config_override SET value = '1s'");

# A membership between group roles is drift that grants cannot undo.
superuser('GRANT pepsi_stage TO pepsi_monitor');
may('grafana', 'read the queue while pepsi_monitor is a member of pepsi_stage',
	'SELECT count(*) FROM pepsi.workqueue');
like(
	superuser("SELECT string_agg(DISTINCT grantee, ',') FROM pepsi.apply_grants()"),
	qr/^pepsi_httpd,pepsi_monitor$/,
	'apply_grants reports what pepsi_monitor now holds, and pepsi_httpd, its member, with it');
($ret, $out, $err) = $node->psql($db, 'SELECT * FROM pepsi.apply_grants(strict => true)');
like($err, qr/the grants of schema pepsi differ from the policy/, 'strict raises on it');
superuser('REVOKE pepsi_stage FROM pepsi_monitor');
is(superuser('SELECT count(*) FROM pepsi.apply_grants(strict => true)'), '0',
	'no drift once the membership is gone');
is( superuser(
		"SELECT count(*) FROM pepsi.event_log WHERE action = 'apply_grants'"),
	'4',
	'every apply_grants that returned was logged, the strict one that raised was not');

#
# The roles belong to the cluster: a second database, a re-creation
#
superuser('CREATE DATABASE second');
$node->safe_psql('second', 'CREATE EXTENSION pepsi');
is( $node->safe_psql('second',
		"SELECT count(*) FROM pg_roles WHERE rolname LIKE 'pepsi\\_%'"),
	'9',
	'CREATE EXTENSION in a second database finds the roles and keeps them');
is($node->safe_psql('second', 'SELECT count(*) FROM pepsi.apply_grants()'),
	'0', 'and grants them there too');
($ret, $out, $err) =
  $node->psql('second', 'SELECT count(*) FROM pepsi.queue_summary',
	extra_params => [ '-U', 'grafana' ]);
is($ret, 0, 'grafana reads the views of the second database') or diag($err);

superuser('DROP EXTENSION pepsi');
is(superuser("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'pepsi\\_%'"),
	'9', 'DROP EXTENSION leaves the roles');
superuser('CREATE EXTENSION pepsi');
is(superuser('SELECT count(*) FROM pepsi.apply_grants()'), '0',
	'a re-created extension grants the surviving roles again');

#
# The grants survive a restart.
#
$node->restart;
may('grafana', 'read the views after a restart', 'SELECT * FROM pepsi.queue_summary');
may_not('grafana', 'read the queue after a restart', 'SELECT count(*) FROM pepsi.workqueue');
may('smtpd', 'admit after a restart',
	"SELECT pepsi.workqueue_add('s\@example.org', '{e\@example.net}', 'h', 'b')");

#
# A hold is never due: the maintenance worker passes over it, and does not
# trip on its infinite retry time when it is the only paused row.
#
my $log_offset = -s $node->logfile;
my $held = superuser(
	"SELECT pepsi.workqueue_add('s\@example.org', '{f\@example.net}', 'h', 'b')");
superuser("SELECT pepsi.queue_hold('{$held}')");
is( superuser(
		"SELECT count(*) FROM pepsi.workqueue WHERE status = 'paused' AND timeout < 'infinity'"),
	'0',
	'the hold is the only paused row');
my $worker = superuser('SELECT pepsi.start_maintenance()');
for my $pass ('a pass', 'another pass')
{
	my $since = worker_state_change($node, $db, $worker);
	ok( wait_until(
			$node, $db,
			"SELECT state = 'idle' AND state_change > '$since'"
			  . " FROM pg_stat_activity WHERE pid = $worker"),
		"the maintenance worker finishes $pass over the held row");
}
is(maintenance_pid($node, $db), $worker, 'the worker is still the same process');
unlike(
	log_since($node, $log_offset),
	qr/\[$worker\] (?:ERROR|FATAL)|infinite/,
	'it logged no error');
is(superuser("SELECT status || ' ' || timeout FROM pepsi.workqueue WHERE id = $held"),
	'paused infinity', 'the row is still on hold');

$node->stop;
done_testing();
