# Least privilege at admission: the internet-facing programs (pepsi-ingress,
# pepsi-sendmail) connect as a member of pepsi_ingress, which may call the
# admission functions and nothing else, and only to start a message where
# the pipeline starts (pepsi.admission_stage): never straight at a delivery
# stage past the checks.  The pipeline (pepsi_stage) may inject anywhere
# and may not write the configuration.  Each role connects as itself.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $db = 'postgres';
my $node = pepsi_node('admission_role', extension => 1);
$node->safe_psql($db, q{
CREATE ROLE smtpd LOGIN IN ROLE pepsi_ingress;
CREATE ROLE relay LOGIN IN ROLE pepsi_stage;
});

sub as
{
	my ($role, $sql) = @_;
	my ($ret, $out, $err) = $node->psql($db, $sql, extra_params => [ '-U', $role ]);

	return ($ret, $out, $err);
}

my $add = "SELECT pepsi.workqueue_add('a\@example.org', '{b\@example.org}', '\\x'::bytea, '\\x'::bytea,"
  . " '{}', '192.0.2.1', NULL, '%s')";
my $inject = "SELECT pepsi.workqueue_inject('%s', 'a\@example.org', '{b\@example.org}', '\\x'::bytea, '\\x'::bytea)";

my ($ret, $out, $err) = as('smtpd', sprintf($add, 'init'));
is($ret, 0, 'ingress admits at stage init') or diag($err);
($ret, $out, $err) = as('smtpd', sprintf($add, 'smarthost'));
like($err, qr/role "smtpd" may admit messages only at stage "init", not "smarthost"/,
	'but not at another stage: the admission stage is forced');
($ret, $out, $err) = as('smtpd', sprintf($inject, 'smarthost'));
like($err, qr/may admit messages only at stage "init"/, 'nor inject at another stage');
($ret, $out, $err) = as('smtpd', sprintf($inject, 'init'));
is($ret, 0, 'inject at init is admission too') or diag($err);
($ret, $out, $err) = as('smtpd',
	"SELECT pepsi.workqueue_add('a\@example.org', '{b\@example.org}', '\\x'::bytea, '\\x'::bytea,"
	  . " '{}', NULL, E'alice\\r\\nX-Forged: yes', 'init')");
like($err, qr/auth_account has a control character/, 'an auth_account with CR LF is refused');

($ret, $out, $err) = as('smtpd',
	"INSERT INTO pepsi.workqueue (stage, mail_from, rcpt_to) VALUES ('smarthost', '', '{x\@y}')");
like($err, qr/permission denied for table workqueue/, 'ingress cannot insert into the queue directly');
($ret, $out, $err) = as('smtpd', "UPDATE pepsi.workqueue SET stage = 'smarthost'");
like($err, qr/permission denied for table workqueue/, 'nor move a row to another stage');
($ret, $out, $err) = as('smtpd', "SELECT count(*) FROM pepsi.workqueue");
like($err, qr/permission denied for table workqueue/, 'nor read the queue');
# Before the library is loaded the setting is a placeholder, which loading
# it then discards for a role that may not set it.
($ret, $out, $err) = as('smtpd', "SET pepsi.admission_stage = 'smarthost'; " . sprintf($add, 'smarthost'));
like($err, qr/permission denied to set parameter "pepsi\.admission_stage"/,
	'nor choose its own admission stage') or diag($err);
like($err, qr/may admit messages only at stage "init", not "smarthost"/, 'which stays init');
($ret, $out, $err) = as('smtpd', "SELECT pepsi.config_set('global', 'ingress', 'INIT_STAGE', 'x')");
like($err, qr/permission denied for function config_set/, 'nor write the configuration');

# The account: one line, never empty, at most 255 octets, whoever calls.
my $add_for = "SELECT pepsi.workqueue_add('a\@example.org', '{b\@example.org}', '\\x'::bytea, '\\x'::bytea,"
  . " '{}', '192.0.2.99', %s, 'init')";
($ret, $out, $err) = as('smtpd', sprintf($add_for, "''"));
like($err, qr/auth_account must not be empty/, 'an empty auth_account is refused');
($ret, $out, $err) = as('smtpd', sprintf($add_for, "repeat('a', 256)"));
like($err, qr/auth_account is 256 octets long, more than 255/, 'so is one of 256 octets');
($ret, $out, $err) = as('smtpd', sprintf($add_for, "repeat('a', 255)"));
is($ret, 0, 'one of 255 is taken') or diag($err);

# Which accounts an ingress role may claim: pepsi.admission_accounts, set
# per login role by the superuser, out of the role's reach.  An MX ingress
# (no AUTH offered) claims none; a submission ingress its own domain's.
$node->safe_psql($db, q{
CREATE ROLE smtpd_mx LOGIN IN ROLE pepsi_ingress;
ALTER ROLE smtpd_mx SET pepsi.admission_accounts = '';
CREATE ROLE smtpd_submission LOGIN IN ROLE pepsi_ingress;
ALTER ROLE smtpd_submission SET pepsi.admission_accounts = '@example.org, postmaster';
});
($ret, $out, $err) = as('smtpd_mx', sprintf($add_for, "'alice\@example.org'"));
like($err, qr/role "smtpd_mx" may not admit messages for account "alice\@example\.org"/,
	'an ingress allowed no account cannot claim one') or diag($err);
($ret, $out, $err) = as('smtpd_mx', sprintf($add_for, 'NULL'));
is($ret, 0, 'it admits unauthenticated mail as before') or diag($err);
($ret, $out, $err) = as('smtpd_mx',
	"SET pepsi.admission_accounts = '*'; " . sprintf($add_for, "'alice\@example.org'"));
like($err, qr/permission denied to set parameter "pepsi\.admission_accounts"/,
	'nor allow itself more');
like($err, qr/may not admit messages for account/, 'which stays refused');
($ret, $out, $err) = as('smtpd_submission', sprintf($add_for, "'alice\@Example.ORG'"));
is($ret, 0, 'a submission ingress claims an account of its domain (any case)') or diag($err);
($ret, $out, $err) = as('smtpd_submission', sprintf($add_for, "'postmaster'"));
is($ret, 0, 'and an account it names') or diag($err);
($ret, $out, $err) = as('smtpd_submission', sprintf($add_for, "'mallory\@example.net'"));
like($err, qr/may not admit messages for account "mallory\@example\.net"/,
	'not one of another domain');
($ret, $out, $err) = as('smtpd_submission', sprintf($add_for, "'eve\@evil-example.org'"));
like($err, qr/may not admit messages for account/, 'nor one whose domain only ends the same');
$node->safe_psql($db, "DELETE FROM pepsi.workqueue WHERE client_address = '192.0.2.99'");

# A system whose pipeline starts elsewhere: the superuser says so.
$node->safe_psql($db, "ALTER DATABASE $db SET pepsi.admission_stage = 'entry'");
($ret, $out, $err) = as('smtpd', sprintf($add, 'entry'));
is($ret, 0, 'pepsi.admission_stage moves the admission stage') or diag($err);
($ret, $out, $err) = as('smtpd', sprintf($add, 'init'));
like($err, qr/only at stage "entry", not "init"/, 'and only there');
$node->safe_psql($db, "ALTER DATABASE $db RESET pepsi.admission_stage");

# The pipeline injects anywhere, and does not write the configuration.
($ret, $out, $err) = as('relay', sprintf($inject, 'smarthost'));
is($ret, 0, 'a stage may inject a side message at any stage') or diag($err);
($ret, $out, $err) = as('relay',
	"INSERT INTO pepsi.config_override (scope, section, option, value)"
	  . " VALUES ('global', 'stage-smarthost', 'SMARTHOST', 'evil.example:25')");
like($err, qr/permission denied for table config_override/, 'a stage cannot insert into config_override');
($ret, $out, $err) = as('relay', "UPDATE pepsi.config_override SET value = 'x'");
like($err, qr/permission denied for table config_override/, 'nor update it');
($ret, $out, $err) = as('relay', "DELETE FROM pepsi.config_override");
like($err, qr/permission denied for table config_override/, 'nor delete from it');
($ret, $out, $err) = as('relay', "SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '1s')");
like($err, qr/permission denied for function config_set/, 'nor call the configuration writers');

is($node->safe_psql($db, "SELECT string_agg(stage, ',' ORDER BY id) FROM pepsi.workqueue"),
	'init,init,entry,smarthost', 'only the permitted admissions are in the queue');
done_testing();
