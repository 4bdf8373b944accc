# pepsi-setup init --non-interactive against a fresh cluster (the
# extension's files installed, the extension not created), under --root
# with the package's pepsi.conf (a conffile, which init leaves alone: its
# settings are the drop-in pepsi.conf.d/setup.conf):
# pepsi-ingress and pepsi-dispatch start from what it wrote and deliver
# one message to a Maildir and one to a scripted smarthost (t/bin/smtp-peer),
# signed with the DKIM key it made.  A second init changes nothing (the
# files' hashes and modes, and the roles, memberships and grants, are the
# same).  Bad input stops init before any change: a domain that is not a
# domain, a conninfo that does not connect, an occupied SMTP port.
# pepsi.setup_task: written_by is the inserting role whatever the row says;
# pepsi-setup apply carries out a row of pepsi_config's, refuses one written
# by another role, one of a kind it does not know and one with a parameter
# the kind does not take, logging why in setup_task_log; a certificate
# task installs the certificate and points pepsi.conf at it (ingress,
# reloaded, offers STARTTLS with it); and after a manual
# GRANT and REVOKE, apply restores the grant policy and verifies it.

use strict;
use warnings FATAL => 'all';

use IO::Socket::INET;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use SetupTest;

my $setup = pepsi_bin('pepsi-setup');
die "pepsi-setup is not built: $setup\n" unless -x $setup;

my $db = 'postgres';
my $node = pepsi_node('setup', preload => 1,
	conf => "pepsi.database = '$db'\npepsi.maintenance_interval = '100ms'\n");
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $conninfo = sprintf('host=%s port=%d dbname=%s', $node->host, $node->port, $db);
my $smtp_port = PostgreSQL::Test::Cluster::get_free_port();
my $peer = start_peer();

my @answers = ('--domains', 'local.test', '--hostname', 'mx.pepsi.test', '--conninfo', $conninfo,
	'--delivery', 'maildir', '--relay', "smarthost:127.0.0.1:$peer->{port}", '--smarthost-tls', 'none',
	'--listen', '127.0.0.1', '--smtp-port', $smtp_port);

sub init_with
{
	my (%change) = @_;
	my @args = @answers;

	for (my $i = 0; $i < @args; $i += 2)
	{
		$args[ $i + 1 ] = $change{ $args[$i] } if exists $change{ $args[$i] };
	}
	return run_setup('init', '--non-interactive', '--root', $root, @args);
}

# The roles, their memberships and every ACL of the schema.
sub catalog_state
{
	return $node->safe_psql($db, q{
		SELECT string_agg(format('%s login=%s in=%s', r.rolname, r.rolcanlogin,
			(SELECT string_agg(g.rolname, ',' ORDER BY g.rolname) FROM pg_auth_members m
			 JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid)), E'\n' ORDER BY r.rolname)
		FROM pg_roles r WHERE r.rolname LIKE 'pepsi%'
		UNION ALL
		SELECT string_agg(format('%s %s', c.relname, c.relacl), E'\n' ORDER BY c.relname)
		FROM pg_class c WHERE c.relnamespace = 'pepsi'::regnamespace
		UNION ALL
		SELECT string_agg(format('%s %s', extname, extversion), ',') FROM pg_extension});
}

#
# Bad input: each stops with the reason, and nothing is changed.
#
# The package's pepsi.conf, a conffile: init never rewrites it.
my $conffile = "# the package's pepsi.conf\n";
mkdir "$root/etc";
mkdir "$root/etc/pepsi";
open(my $cf, '>', "$root/etc/pepsi/pepsi.conf") or die;
print $cf $conffile;
close $cf;
my $empty = tree_state($root);
my $no_extension = "SELECT count(*) FROM pg_extension WHERE extname = 'pepsi'";
my ($rc, $out, $err) = init_with('--domains' => 'not_a_domain');
isnt($rc, 0, 'a domain that is not a domain: init stops');
like($err, qr/--domains: "not_a_domain" is not a domain.*nothing changed/, 'and says why');
my $dead = PostgreSQL::Test::Cluster::get_free_port();
($rc, $out, $err) = init_with('--conninfo' => "host=127.0.0.1 port=$dead dbname=$db");
isnt($rc, 0, 'a conninfo that does not connect: init stops');
like($err, qr/conninfo "host=127\.0\.0\.1 port=$dead dbname=$db" does not connect:.*nothing changed/s, 'and says why');
my $taken = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1, ReuseAddr => 1)
  or die "listen: $!";
($rc, $out, $err) = init_with('--smtp-port' => $taken->sockport);
isnt($rc, 0, 'an occupied SMTP port: init stops');
like($err, qr/port \d+ on 127\.0\.0\.1 is in use.*nothing changed/, 'and says why');
close $taken;
is(tree_state($root), $empty, 'nothing was written under the root');
is($node->safe_psql($db, $no_extension), '0', 'nor created in the cluster');

#
# init: then the daemons run from what it wrote.
#
($rc, $out, $err) = init_with();
is($rc, 0, 'pepsi-setup init succeeds') or diag("$out\n$err");
like($out, qr/extension pepsi: created/, 'it creates the extension');
like($out, qr/pg_hba\.conf: local\s+postgres\s+pepsi_dispatch\s+peer map=pepsi/, 'and prints the pg_hba lines');
my $config = "$root/etc/pepsi/pepsi.conf";
my $dropin = "$root/etc/pepsi/pepsi.conf.d/setup.conf";
is(slurp($config), $conffile, 'pepsi.conf, the package\'s conffile, is left as it was');
like(slurp($dropin), qr/^\[database\]\nCONNINFO = /m, 'init\'s settings are the drop-in pepsi.conf.d/setup.conf');
is(sprintf('%04o', (stat $dropin)[2] & 07777), '0644', 'of mode 0644');
my $srs = "$root/etc/pepsi/secrets.d/srs.conf";
is(sprintf('%04o', (stat $srs)[2] & 07777), '0640', 'the SRS secret is a secrets.d fragment of mode 0640');
like(slurp($srs), qr/^\[srs\]\nSECRET = \S{40,}\n\z/, 'holding [srs] SECRET');
unlike(slurp($dropin), qr/SECRET =/, 'which the drop-in does not');
is($node->safe_psql($db, "SELECT count(*) FROM pg_roles r WHERE r.rolname IN "
	. "('pepsi_dispatch', 'pepsi_smtpd', 'pepsi_web', 'pepsi_viewer', 'pepsi_operator') AND r.rolcanlogin"),
	'5', 'the five login roles exist');
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.grant_verify()'), '0', 'and the grants are the policy');

my $maildir = "$root/var/mail/pepsi";
make_mailbox($maildir, 'alice@local.test');
my $ingress = start_ingress($config, $smtp_port, "$tmp/ingress.log");
my $dispatcher = start_dispatcher($config);

sub swaks
{
	my (@args) = @_;
	my $transcript = '';

	IPC::Run::run([ 'swaks', '--server', "127.0.0.1:$smtp_port", '--ehlo', 'client.test', @args ],
		'<', \undef, '>', \$transcript, '2>&1', IPC::Run::timeout(60));
	return ($? >> 8, $transcript);
}

my ($swaks_rc, $transcript) = swaks('--from', 'sender@local.test', '--to', 'alice@local.test',
	'--header', 'Subject: to the maildir');
is($swaks_rc, 0, 'ingress accepts a message for a local mailbox') or diag($transcript);
ok(poll_until(sub { scalar(maildir_files($maildir, 'alice@local.test')) == 1 }), 'it lands in the Maildir');
like(slurp((maildir_files($maildir, 'alice@local.test'))[0]) // '', qr/Subject: to the maildir/,
	'the message delivered');

($swaks_rc, $transcript) = swaks('--from', 'sender@local.test', '--to', 'bob@remote.test',
	'--header', 'Subject: to the smarthost');
is($swaks_rc, 0, 'ingress accepts a message for a remote address') or diag($transcript);
ok(poll_until(sub { scalar(peer_messages($peer)) == 1 }), 'the smarthost receives it');
my ($sent) = peer_messages($peer);
like($sent->{data} // '', qr/Subject: to the smarthost/, 'the message relayed');
like($sent->{data} // '', qr/^DKIM-Signature:.*d=local\.test.*s=pepsi/ms, 'signed with the key init made');
ok(poll_until(sub { queue_count($node) == 0 }), 'nothing is left in the queue');

#
# A second init changes nothing.
#
my $files = tree_state($root);
my $catalog = catalog_state();
($rc, $out, $err) = init_with();
is($rc, 0, 'a second init succeeds') or diag("$out\n$err");
like($out, qr/nothing changed: the host already is as the answers say/, 'and says it changed nothing');
is(tree_state($root), $files, 'every file is as it was (content and mode)');
is(catalog_state(), $catalog, 'and the roles, memberships and grants');

#
# pepsi.setup_task and pepsi-setup apply.
#
my $operator = sprintf('host=%s port=%d dbname=%s user=pepsi_operator', $node->host, $node->port, $db);
sub as_operator { return as_role($operator, $_[0]); }
my $hba = '{"type": "local", "database": "postgres", "user": "someone", "method": "peer"}';
my $good = as_operator("INSERT INTO pepsi.setup_task (kind, params, written_by, status) "
	. "VALUES ('pg_hba_line', '$hba', 'postgres', 'done') RETURNING id || ' ' || written_by || ' ' || status");
my ($good_id, $writer, $status) = split / /, $good;
is("$writer $status", 'pepsi_operator pending', 'written_by and status are the trigger\'s, not the row\'s');
my $owner_id = $node->safe_psql($db,
	"INSERT INTO pepsi.setup_task (kind, params) VALUES ('pg_hba_line', '$hba') RETURNING id");
# A schema newer than this applier, with a kind it does not know.
$node->safe_psql($db, 'ALTER TABLE pepsi.setup_task DROP CONSTRAINT setup_task_kind_check');
my $unknown_id = as_operator("INSERT INTO pepsi.setup_task (kind, params) VALUES ('format_disk', '{}') RETURNING id");
my $extra_id = as_operator("INSERT INTO pepsi.setup_task (kind, params) VALUES ('pg_hba_line', "
	. "'{\"type\": \"local\", \"database\": \"postgres\", \"user\": \"x\", \"method\": \"peer\", \"shell\": \"rm\"}') RETURNING id");
# A certificate for the host is installed; one for another name is not.
my ($good_tls, $other_tls) = (PostgreSQL::Test::Utils::tempdir(), PostgreSQL::Test::Utils::tempdir());
self_signed_certificate($good_tls, 'mx.pepsi.test');
self_signed_certificate($other_tls, 'other.test');
my $certificate = sub {
	my ($dir) = @_;
	return as_operator("INSERT INTO pepsi.setup_task (kind, params) VALUES ('certificate', "
		. "'{\"host\": \"mx.pepsi.test\", \"certificate\": \"$dir/cert.pem\", \"key\": \"$dir/key.pem\"}') RETURNING id");
};
my $cert_id = $certificate->($good_tls);
my $wrong_cert_id = $certificate->($other_tls);
my $row = sub { return task_row($node, $db, $_[0]); };

($rc, $out, $err) = run_setup('apply', '--root', $root);
is($rc, 65, 'apply reports the rows it refused') or diag("$out\n$err");
like($row->($good_id), qr/^done: pg_hba\.conf: local\s+postgres\s+someone\s+peer$/, 'a row of pepsi_config\'s is carried out');
like($row->($owner_id), qr/^refused: refused: written by \S+, which is not a member of pepsi_config/,
	'a row written by another role is refused, with the reason logged');
like($row->($unknown_id), qr/^refused: refused: unknown kind format_disk \(this pepsi-setup applies config_file, /,
	'a row of an unknown kind is refused, with the reason logged');
like($row->($extra_id), qr/^refused: refused: pg_hba_line takes no parameter "shell"/,
	'a row with a parameter its kind does not take is refused, with the reason logged');

like($row->($cert_id), qr/^done: .*tls\/fullchain\.pem: written/, 'a certificate for the host is installed');
is(slurp("$root/etc/pepsi/tls/fullchain.pem"), slurp("$good_tls/cert.pem"), 'as it was given');
is(sprintf('%04o', (stat "$root/etc/pepsi/tls/privkey.pem")[2] & 07777), '0640', 'its key of mode 0640');
like($row->($wrong_cert_id), qr/^failed: failed: the certificate \S+ is not for mx\.pepsi\.test$/,
	'a certificate for another name is not, and the log says why');
like(slurp("$root/etc/pepsi/pepsi.conf.d/certificate.conf"), qr/^\[listener-smtp\]\nCERTIFICATE = \Q$root\E\/etc\/pepsi\/tls\/fullchain\.pem\nKEY = /m,
	'the drop-in certificate.conf points [listener-smtp] at the installed certificate');
is(slurp($config), $conffile, 'pepsi.conf still as it was');
# Ingress, reloaded, offers STARTTLS with it.
my $reloads = () = (slurp("$tmp/ingress.log") // '') =~ /reloaded /g;
kill 'HUP', $ingress->{pid};
ok(poll_until(sub { my $n = () = (slurp("$tmp/ingress.log") // '') =~ /reloaded /g; $n > $reloads }),
	'ingress reloads') or diag(slurp("$tmp/ingress.log"));
($swaks_rc, $transcript) = swaks('--tls', '--from', 'sender@local.test', '--to', 'alice@local.test',
	'--header', 'Subject: over TLS');
is($swaks_rc, 0, 'and accepts a message over STARTTLS') or diag($transcript);
like($transcript, qr/TLS started/, 'with the certificate pepsi-setup installed');
ok(poll_until(sub { scalar(maildir_files($maildir, 'alice@local.test')) == 2 }), 'the message lands in the Maildir');

#
# A manual GRANT and REVOKE: apply puts the policy back and verifies it.
#
$node->safe_psql($db, 'REVOKE INSERT ON pepsi.setup_task FROM pepsi_config; '
	. 'GRANT INSERT ON pepsi.setup_task TO pepsi_stage; GRANT SELECT ON pepsi.workqueue TO PUBLIC');
isnt($node->safe_psql($db, 'SELECT count(*) FROM pepsi.grant_verify()'), '0', 'the manual grants are drift');
($rc, $out, $err) = run_setup('apply', '--root', $root);
is($rc, 0, 'apply succeeds') or diag("$out\n$err");
like($out, qr/grants: \d+ differences? from the policy undone, verified/, 'and says it undid the drift');
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.grant_verify()'), '0', 'the grants are the policy again');
ok($node->safe_psql($db, "SELECT has_table_privilege('pepsi_config', 'pepsi.setup_task', 'INSERT') "
	. "AND NOT has_table_privilege('pepsi_stage', 'pepsi.setup_task', 'INSERT')") eq 't',
	'pepsi_config may insert tasks again, pepsi_stage may not');

stop_dispatcher($dispatcher);
done_testing();
