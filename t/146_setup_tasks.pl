# The setup tasks that act on the host and the web administrators, after
# pepsi-setup init --non-interactive: the reload task runs systemctl
# try-reload-or-restart (a stand-in on PATH: this host runs no systemd),
# and its failure is logged; admin_account makes pepsi-httpd
# administrators that log in, the password from a file root's alone (made
# when none is given), never in the row.

use strict;
use warnings FATAL => 'all';

use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use SetupTest;

my $db = 'postgres';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $node = pepsi_node('tasks', preload => 1);
my $root = PostgreSQL::Test::Utils::tempdir();
my $conninfo = sprintf('host=%s port=%d dbname=%s', $node->host, $node->port, $db);
my ($rc, $out, $err) = run_setup('init', '--non-interactive', '--root', $root, '--domains', 'local.test',
	'--hostname', 'mx.pepsi.test', '--conninfo', $conninfo, '--listen', '127.0.0.1', '--smtp-port',
	PostgreSQL::Test::Cluster::get_free_port());
is($rc, 0, 'pepsi-setup init succeeds') or diag("$out\n$err");
my $config = "$root/etc/pepsi/pepsi.conf";
my $operator = sprintf('host=%s port=%d dbname=%s user=pepsi_operator', $node->host, $node->port, $db);
sub as_operator { return as_role($operator, $_[0]); }
my $row = sub { return task_row($node, $db, $_[0]); };

#
# reload: systemctl (a stand-in: this host runs no systemd).
#
my $bin = "$tmp/bin";
mkdir $bin;
open(my $sc, '>', "$bin/systemctl") or die;
print $sc "#!/bin/sh\necho \"\$@\" >> '$tmp/systemctl.calls'\ncase \"\$2\" in pepsi-httpd.service) exit 1;; esac\nexit 0\n";
close $sc;
chmod 0755, "$bin/systemctl";
my $reload_id = as_operator(q{INSERT INTO pepsi.setup_task (kind, params) VALUES ('reload', '{"service": "ingress"}') RETURNING id});
my $failing_id = as_operator(q{INSERT INTO pepsi.setup_task (kind, params) VALUES ('reload', '{"service": "httpd"}') RETURNING id});
{
	local $ENV{PATH} = "$bin:$ENV{PATH}";
	($rc, $out, $err) = run_setup('apply', '-c', $config);
}
is($rc, 65, 'apply reports the failed reload');
like($row->($reload_id), qr/^done: pepsi-ingress\.service: reloaded$/, 'the reload task reloads ingress');
like($row->($failing_id), qr/^failed: failed: systemctl try-reload-or-restart pepsi-httpd\.service did not succeed$/,
	'a reload that fails is logged');
is(slurp("$tmp/systemctl.calls"), "try-reload-or-restart pepsi-ingress.service\ntry-reload-or-restart pepsi-httpd.service\n",
	'systemctl was asked for each');

#
# admin_account: a pepsi-httpd administrator, its password from a file
# root's alone (made when not given), never a parameter; pepsi-httpd logs
# it in.
#
my $admin_task = sub {
	my ($params) = @_;
	return as_operator("INSERT INTO pepsi.setup_task (kind, params) VALUES ('admin_account', '$params') RETURNING id");
};
my $given = "$tmp/helpdesk.password";
open(my $pw, '>', $given) or die "$given: $!";
print $pw "correct horse battery\n";
close $pw;
chmod 0600, $given;
my $loose = "$tmp/loose.password";
open($pw, '>', $loose) or die "$loose: $!";
print $pw "readable by all\n";
close $pw;
chmod 0644, $loose;
my $made_id = $admin_task->('{"name": "postmaster"}');
my $given_id = $admin_task->("{\"name\": \"helpdesk\", \"role\": \"viewer\", \"password_file\": \"$given\"}");
my $loose_id = $admin_task->("{\"name\": \"loose\", \"password_file\": \"$loose\"}");
my $clear_id = $admin_task->('{"name": "clear", "password": "in the row"}');
($rc, $out, $err) = run_setup('apply', '--root', $root);
is($rc, 65, 'apply reports the admin_account rows it refused or failed') or diag("$out\n$err");
my $made = "$root/etc/pepsi/admin/postmaster.password";
like($row->($made_id), qr/^done: .*the password of postmaster is in \Q$made\E.*administrator postmaster: created/,
	'an administrator without a password file is created');
is(sprintf('%04o', (stat $made)[2] & 07777), '0600', 'its new password in a file of mode 0600');
my ($made_password) = slurp($made) =~ /^(\S{24})\n\z/;
ok(defined $made_password, 'holding a password of 24 characters');
like($row->($given_id), qr/^done: administrator helpdesk: created, role viewer, its password from \Q$given\E$/,
	'an administrator with a password file is created');
like($row->($loose_id), qr/^failed: failed: \Q$loose\E: .*(mode|read)/,
	'a password file others may read is refused, and the log says why');
like($row->($clear_id), qr/^refused: refused: admin_account takes no parameter "password"/,
	'a password in the row itself is refused');
is($node->safe_psql($db, "SELECT string_agg(name || ' ' || role, ',' ORDER BY name) FROM pepsi.admin_account"),
	'helpdesk viewer,postmaster admin', 'the accounts and their roles');
unlike($node->safe_psql($db, 'SELECT string_agg(params::text, \' \') FROM pepsi.setup_task'), qr/correct horse|\Q$made_password\E/,
	'no password is in a task row');
my $hashes = $node->safe_psql($db, 'SELECT string_agg(password_hash, \',\' ORDER BY name) FROM pepsi.admin_account');
$admin_task->('{"name": "postmaster"}');
$admin_task->("{\"name\": \"helpdesk\", \"role\": \"viewer\", \"password_file\": \"$given\"}");
($rc, $out, $err) = run_setup('apply', '--root', $root);
is($rc, 0, 'applying the same accounts again succeeds') or diag("$out\n$err");
like($out, qr/administrator postmaster: as \S+ says already.*administrator helpdesk: as \S+ says already/s,
	'and changes nothing');
is($node->safe_psql($db, 'SELECT string_agg(password_hash, \',\' ORDER BY name) FROM pepsi.admin_account'), $hashes,
	'not even a hash');

my $httpd_port = PostgreSQL::Test::Cluster::get_free_port();
my $httpd_conf = "$tmp/httpd.conf";
open(my $hc, '>', $httpd_conf) or die "$httpd_conf: $!";
print $hc "[database]\nCONNINFO = $conninfo user=pepsi_web\n[httpd]\nADDRESS = 127.0.0.1\nPORT = $httpd_port\n"
  . "CONNINFO = $conninfo user=pepsi_web\n";
close $hc;
my $httpd = start_dispatcher($httpd_conf, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts');
my $http = HTTP::Tiny->new(timeout => 10, max_redirect => 0);
my $login = sub {
	my ($name, $password) = @_;
	return $http->post("http://127.0.0.1:$httpd_port/api/login", { headers => { 'Content-Type' => 'application/json' },
		content => JSON::PP::encode_json({ name => $name, password => $password }) })->{status};
};
is($login->('postmaster', $made_password), 200, 'pepsi-httpd logs the made administrator in with the made password');
is($login->('helpdesk', 'correct horse battery'), 200, 'and the other with the given one');
is($login->('helpdesk', 'wrong horse battery'), 401, 'not with another');
stop_dispatcher($httpd);

done_testing();
