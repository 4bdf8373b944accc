# DMARC verdicts counted for aggregate reports (RFC 7489 7.2): pepsi-ingress
# counts each verdict in memory (daemons/ingress/dmarc_tally.c) and adds
# the counts to pepsi.dmarc_aggregate in its periodic report's transaction.
# Messages from domains with DMARC records, served by the tests' DNS
# server, end up as one row per report record, with the right counts,
# disposition and aligned results; a domain without a record is not
# counted; the counts are not a round trip per message (the rows appear
# with the report, in one statement per report).

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;
use SmtpClient;
use TestDNS;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('dmarc_aggregate', extension => 1, conf => "log_statement = 'all'\n");

my $dns = TestDNS->new($tmp);
$dns->zone(<<'ZONE');
1.0.0.127.in-addr.arpa. 300 IN PTR mx.client.test.
mx.client.test. 300 IN A 127.0.0.1
mx.client.test. 300 IN TXT "v=spf1 a -all"
pass.test. 300 IN TXT "v=spf1 ip4:127.0.0.0/8 -all"
_dmarc.pass.test. 300 IN TXT "v=DMARC1; p=reject; rua=mailto:dmarc@pass.test"
fail.test. 300 IN TXT "v=spf1 ip4:192.0.2.0/24 -all"
_dmarc.fail.test. 300 IN TXT "v=DMARC1; p=quarantine"
sub.org.test. 300 IN TXT "v=spf1 ip4:127.0.0.0/8 -all"
_dmarc.org.test. 300 IN TXT "v=DMARC1; p=none"
nodmarc.test. 300 IN TXT "v=spf1 ip4:127.0.0.0/8 -all"
ZONE

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
DNS_FORWARDER = @{[ $dns->forwarder ]}
DNS_TIMEOUT = 4s
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
AUTHSERV_ID = auth.test
DATABASE_CONNECTIONS = 1
DNS_MESSAGE_BUDGET = 8s
[listener-mx]
ADDRESS = 127.0.0.1
PORT = $port
MESSAGE_AUTHENTICATION = on
# The tests' clients are on 127.0.0.1, a trusted network by default, whose
# mail is not checked unless this says so.
TRUSTED_MESSAGE_AUTHENTICATION = on
DMARC_POLICY = enforce
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-v', '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 1 ready/), 'ingress starts');

# One message; returns the reply to its DATA.
sub send_message
{
	my ($mail_from, $from) = @_;
	my $c = SmtpClient->new($port);
	$c->command('EHLO mx.client.test');
	$c->command("MAIL FROM:<$mail_from>");
	$c->command('RCPT TO:<rcpt@example.net>');
	$c->command('DATA');
	$c->send("From: <$from>\r\nTo: <rcpt\@example.net>\r\nSubject: dmarc\r\n\r\nhello\r\n.\r\n");
	my $reply = $c->reply(30);
	$c->close;
	return $reply;
}

my $offset = -s $node->logfile;
like(send_message('a@pass.test', 'a@pass.test'), qr/^250 /, 'an aligned message is taken') for 1 .. 3;
like(send_message('b@fail.test', 'b@fail.test'), qr/^250 /, 'a failing one, quarantine, is taken') for 1 .. 2;
like(send_message('c@sub.org.test', 'c@sub.org.test'), qr/^250 /, 'a subdomain under its organization\'s policy');
like(send_message('d@nodmarc.test', 'd@nodmarc.test'), qr/^250 /, 'one from a domain without DMARC');

ok(wait_until($node, $db, 'SELECT coalesce(sum(messages), 0) = 6 FROM pepsi.dmarc_aggregate', 't', 60),
	'the six verdicts are counted, with the ingress report');
is($node->safe_psql($db, q{
	SELECT string_agg(format('%s %s %s %s %s/%s %s %s:%s %s', policy_domain, header_from, source_ip, envelope_from,
	                         dkim, spf, disposition, spf_scope, spf_result, messages), E'\n'
	                  ORDER BY policy_domain, header_from)
	FROM pepsi.dmarc_aggregate}),
	"fail.test fail.test 127.0.0.1 fail.test fail/fail quarantine mfrom:fail 2\n"
	  . "org.test sub.org.test 127.0.0.1 sub.org.test fail/pass none mfrom:pass 1\n"
	  . "pass.test pass.test 127.0.0.1 pass.test fail/pass none mfrom:pass 3",
	'one row per record: the policy domain, the From domain, the client, aligned results, disposition, count');
is($node->safe_psql($db, q{SELECT count(*) FROM pepsi.dmarc_aggregate WHERE period <> date_trunc('hour', now())
	AND period <> date_trunc('hour', now() - interval '5 minutes')}), '0', 'counted in the hour they came in');
my $calls = () = log_since($node, $offset) =~ /statement: .*pepsi\.dmarc_tally\(/g;
cmp_ok($calls, '<', 7, 'fewer calls of pepsi.dmarc_tally than messages: batched with the report');

# pepsi_ingress may add counts; pepsi_monitor may read them, not add.
my ($rc, $out, $err) = $node->psql($db, q{SET ROLE pepsi_ingress; SELECT pepsi.dmarc_tally('[]')});
is($rc, 0, 'pepsi_ingress may call pepsi.dmarc_tally') or diag $err;
($rc, $out, $err) = $node->psql($db, q{SET ROLE pepsi_monitor; SELECT pepsi.dmarc_tally('[]')});
like($err, qr/permission denied for function dmarc_tally/, 'pepsi_monitor may not');
($rc, $out, $err) = $node->psql($db, q{SET ROLE pepsi_monitor; SELECT count(*) FROM pepsi.dmarc_aggregate});
is($out, '3', 'but may read them');
($rc, $out, $err) = $node->psql($db, q{SELECT pepsi.dmarc_tally('{"not": "an array"}')});
like($err, qr/counts must be a JSON array/, 'a batch that is not an array is refused');

$ingress->signal('TERM');
$ingress->finish;
done_testing();
