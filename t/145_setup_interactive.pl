# pepsi-setup's other ways in and out.  A cluster without the extension's
# files (a relocated PostgreSQL whose share/extension lacks pepsi's) stops
# init with the reason and nothing changed.  init on a terminal (a pty):
# each question asked with its default, a wrong answer asked again with
# the reason, the answers written.  pepsi-setup check, and the dns_check
# task, against the tests' DNS server (t/lib/TestDNS.pm, which Pepsi's
# resolver forwards to): the MX and DKIM records published are ok, the
# DMARC record missing is said so.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use File::Copy qw(copy);
use File::Path qw(make_path);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiTest;
use SetupTest;
use TestDNS;

my $db = 'postgres';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $smtp_port = PostgreSQL::Test::Cluster::get_free_port();

#
# A cluster without the extension's files.
#
{
	my $pg = "$tmp/pg/usr";
	my $bindir = `pg_config --bindir`;
	my $sharedir = `pg_config --sharedir`;
	chomp($bindir, $sharedir);
	my $install = "$pg/lib/postgresql/15";
	make_path("$install/bin", "$pg/share/postgresql/15/extension");
	for my $program (glob "$bindir/*")
	{
		copy($program, "$install/bin/") or die "copy $program: $!";
		chmod 0755, "$install/bin/" . (split m{/}, $program)[-1];
	}
	symlink(dirname($bindir) . '/lib', "$install/lib") or die "symlink: $!";
	for my $entry (glob "$sharedir/*")
	{
		symlink($entry, "$pg/share/postgresql/15/" . (split m{/}, $entry)[-1]) or die "symlink: $!"
		  unless $entry =~ m{/extension$};
	}
	for my $entry (glob "$sharedir/extension/*")
	{
		symlink($entry, "$pg/share/postgresql/15/extension/" . (split m{/}, $entry)[-1]) or die "symlink: $!"
		  unless $entry =~ m{/pepsi[^/]*$};
	}
	my $bare = PostgreSQL::Test::Cluster->new('bare', install_path => $install);
	$bare->init;
	$bare->start;
	is($bare->safe_psql($db, "SELECT count(*) FROM pg_available_extensions WHERE name = 'pepsi'"), '0',
		'the relocated cluster has no pepsi extension files');
	my $root = PostgreSQL::Test::Utils::tempdir();
	my $before = tree_state($root);
	my $conninfo = sprintf('host=%s port=%d dbname=%s', $bare->host, $bare->port, $db);
	my ($rc, $out, $err) = run_setup('init', '--non-interactive', '--root', $root, '--domains', 'local.test',
		'--hostname', 'mx.pepsi.test', '--conninfo', $conninfo, '--listen', '127.0.0.1', '--smtp-port', $smtp_port);
	is($rc, 69, 'a cluster without the extension\'s files: init stops');
	like($err, qr/the cluster at "\Q$conninfo\E" has no pepsi extension files \(install the package postgresql-15-pepsi.*nothing changed/s,
		'and says why');
	is(tree_state($root), $before, 'nothing was written under the root');
	is($bare->safe_psql($db, "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'pepsi\\_%'"), '0', 'nor in the cluster');
	$bare->stop;
}

#
# init on a terminal.
#
my $node = pepsi_node('interactive', preload => 1);
my $root = PostgreSQL::Test::Utils::tempdir();
my $conninfo = sprintf('host=%s port=%d dbname=%s', $node->host, $node->port, $db);
my ($in, $out, $err) = ('', '', '');
my $interview = IPC::Run::start([ pepsi_bin('pepsi-setup'), 'init', '--root', $root ],
	'<pty<', \$in, '>pty>', \$out, '2>', \$err, IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
my @dialogue = (
	[ qr/The mail domains this server receives for \(space separated\): \z/, 'not_a_domain' ],
	[ qr/"not_a_domain" is not a domain[^\n]*\r?\nThe mail domains this server receives for \(space separated\): \z/, 'local.test' ],
	[ qr/This host's name, as the MX records will name it: \z/, 'mx.pepsi.test' ],
	[ qr/The PostgreSQL database, as its owner connects \(libpq conninfo\) \[host=\/var\/run\/postgresql dbname=pepsi user=postgres\]: \z/, $conninfo ],
	[ qr/Where local mail is delivered: maildir or lmtp:HOST:PORT \(Dovecot\) \[maildir\]: \z/, '' ],
	[ qr/How other mail leaves: direct, or smarthost:HOST:PORT \[direct\]: \z/, '' ],
	[ qr/TLS with the smarthost: verify, may or none \[verify\]: \z/, '' ],
	[ qr/The address pepsi-ingress listens on \[0\.0\.0\.0\]: \z/, '127.0.0.1' ],
	[ qr/The SMTP port \[25\]: \z/, $smtp_port ],
	[ qr/The account the daemons run as \[pepsi\]: \z/, '' ]);
for my $step (@dialogue)
{
	my ($prompt, $answer) = @$step;
	$interview->pump until $out =~ $prompt;
	$out = '';
	$in .= "$answer\n";
}
$interview->finish;
is($? >> 8, 0, 'init on a terminal succeeds') or diag("$out\n$err");
my $written = slurp("$root/etc/pepsi/pepsi.conf.d/setup.conf") // '';
like($written, qr/^LOCAL_DOMAINS = local\.test$/m, 'with the domain answered after the wrong one');
like($written, qr/^\[listener-smtp\]\nADDRESS = 127\.0\.0\.1\nPORT = $smtp_port$/m, 'and the listener answered');
like($written, qr/^PROGRAM = pepsi-stage-relay-to-internet$/m, 'and the defaults taken with an empty answer');

#
# check and the dns_check task, through the tests' DNS server.
#
my ($rc, $records) = run_setup('dns', '--root', $root);
is($rc, 0, 'pepsi-setup dns succeeds');
my ($dkim) = $records =~ /^(pepsi\._domainkey\.local\.test\. TXT .+)$/m;
ok(defined $dkim, 'and prints the DKIM record') or diag($records);
my $dns = TestDNS->new($tmp);
$dns->zone("local.test. 300 IN MX 10 mx.pepsi.test.\n"
	. TestDNS::txt('pepsi._domainkey.local.test.', join('', $dkim =~ /"([^"]*)"/g)));
# The operator's own drop-in, read after init's.
open(my $cf, '>', "$root/etc/pepsi/pepsi.conf.d/zz-dns.conf") or die;
print $cf "[pepsi]\nDNS_FORWARDER = ${\ $dns->forwarder}\n";
close $cf;
($rc, $out, $err) = run_setup('check', '--root', $root);
is($rc, 65, 'check exits 65 when a record is missing') or diag("$out\n$err");
like($out, qr/^local\.test MX: ok$/m, 'the MX record published: ok');
like($out, qr/^pepsi\._domainkey\.local\.test TXT DKIM: ok/m, 'the DKIM record published: ok');
like($out, qr/^_dmarc\.local\.test TXT v=DMARC1: no such name$/m, 'the DMARC record missing: said so');

my $operator = sprintf('host=%s port=%d dbname=%s user=pepsi_operator', $node->host, $node->port, $db);
sub as_operator { return as_role($operator, $_[0]); }
my $row = sub { return task_row($node, $db, $_[0]); };
my $check_id = as_operator(q{INSERT INTO pepsi.setup_task (kind, params) VALUES ('dns_check', '{"domain": "local.test"}') RETURNING id});
($rc, $out, $err) = run_setup('apply', '--root', $root);
like($row->($check_id), qr/^failed: local\.test MX: ok \| .*pepsi\._domainkey\.local\.test TXT DKIM: ok/,
	'the dns_check task logs each record') or diag("$out\n$err");
like($row->($check_id), qr/ \| _dmarc\.local\.test TXT v=DMARC1: no such name \| /, 'and fails for the missing one');

done_testing();
