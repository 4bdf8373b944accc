# pepsi-ingress in the statistics and the mail log, connected as a role
# that may only admit: its open sessions and counters reach
# pepsi.ingress_stats and /metrics (parsed by the Prometheus parser); with
# [pepsi] MAIL_LOG = yes each admission is one "received" row of
# pepsi.mail_log, stored with the message; a change made with
# pepsi.config_set reloads ingress without a signal (MAX_HOPS and MAIL_LOG
# change for the next message, an open session goes on); and a stopped
# ingress takes its statistics row with it.

use strict;
use warnings FATAL => 'all';

use HTTP::Tiny;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;
use SmtpClient;

my $db = 'postgres';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $node = dispatch_node('ingress_stats');
my $smtp_port = PostgreSQL::Test::Cluster::get_free_port();
my $http_port = PostgreSQL::Test::Cluster::get_free_port();

# Each daemon logs in as a role of its own, members of the Pepsi groups only.
$node->safe_psql($db, 'CREATE ROLE smtp LOGIN IN ROLE pepsi_ingress; CREATE ROLE web LOGIN IN ROLE pepsi_httpd');
my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
my $conf = "$tmp/pepsi.conf";
open my $fh, '>', $conf or die;
print $fh "[pepsi]\nHOSTNAME = mx.test\nLOCAL_DOMAINS = example.org\nMAIL_LOG = yes\n"
  . "[database]\nCONNINFO = $conninfo user=smtp\n"
  . "[ingress]\nDISPATCH_WAKE_INTERVAL = 20ms\n"
  . "[listener-smtp]\nADDRESS = 127.0.0.1\nPORT = $smtp_port\n"
  . "[httpd]\nADDRESS = 127.0.0.1\nPORT = $http_port\nCONNINFO = $conninfo user=web\n";
close $fh;

my ($ingress, $httpd);
END
{
	for ($ingress, $httpd) { kill 'KILL', $_->{pid} if $_ && !defined $_->{status} }
}
$ingress = start_dispatcher($conf, program => [ pepsi_bin('pepsi-ingress') ], log => "$tmp/ingress.log");
ok(file_shows("$tmp/ingress.log", qr/ready:/), 'pepsi-ingress starts as the admission role');

sub stats
{
	return $node->safe_psql($db,
		"SELECT instance || ' ' || sessions || ' ' || sessions_total || ' ' || messages FROM pepsi.ingress_stats");
}
my $instance = "mx.test:$ingress->{pid}";

# A message through a session; its reply.
sub send_message
{
	my ($c, %o) = @_;
	my $reply = $c->command('MAIL FROM:<alice@example.net>');
	return $reply unless $reply =~ /^250/;
	$reply = $c->command("RCPT TO:<$_\@example.org>") for qw(postmaster abuse);
	$c->command('DATA');
	$c->send(($o{received} // '') . "From: alice\@example.net\r\nSubject: " . ($o{subject} // 'hello')
		  . "\r\n\r\nhello\r\n.\r\n");
	return $c->reply;
}

my @open = map { SmtpClient->new($smtp_port) } 1 .. 2;
$_->command('EHLO client.test') for @open;
ok(poll_until(sub { stats() eq "$instance 2 2 0" }), 'two open sessions are reported in pepsi.ingress_stats')
  or diag stats();
my $reply = send_message($open[0]);
like($reply, qr/^250/, 'a message is accepted');
my ($queue_id) = $reply =~ /queued as (\w+)/;
my $id = $node->safe_psql($db, 'SELECT max(id) FROM pepsi.workqueue');
ok(file_shows("$tmp/ingress.log", qr/^pepsi\/smtpd\[\d+\]: \Q$queue_id\E: client=unknown\[127\.0\.0\.1\]$/m),
	'its admission is logged as Postfix\'s smtpd does, by the queue id of the reply');
ok(file_shows("$tmp/ingress.log",
		qr/^pepsi\/qmgr\[\d+\]: \Q$queue_id\E: from=<alice\@example\.net>, size=\d+, nrcpt=2 \(queue active, row $id\)$/m),
	'... and as its qmgr does, with the row id');
is($node->safe_psql($db,
		"SELECT event || ' ' || (detail->>'from') || ' ' || (detail->>'nrcpt') || ' ' || (detail->>'listener')"
	  . " || ' ' || (detail->>'helo') || ' ' || (detail->>'client') FROM pepsi.mail_log WHERE workqueue_id = $id AND queue_id = '$queue_id'"),
	'received alice@example.net 2 smtp client.test 127.0.0.1',
	'MAIL_LOG = yes: one "received" row of pepsi.mail_log, the same facts as the log line');
ok(poll_until(sub { stats() eq "$instance 2 2 1" }), 'the message is counted') or diag stats();

# /metrics shows what the row says.
$httpd = start_dispatcher($conf, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts');
my $scrape = HTTP::Tiny->new(timeout => 10)->get("http://127.0.0.1:$http_port/metrics");
is($scrape->{status}, 200, '/metrics answers');
my ($parsed, $samples) = prometheus_samples($scrape->{content});
ok($parsed, 'the Prometheus parser accepts it') or diag $samples;
$samples = {} unless $parsed;
is($samples->{"pepsi_ingress_sessions{instance=$instance}"}, '2.0', 'pepsi_ingress_sessions is 2');
is($samples->{"pepsi_ingress_sessions_total{instance=$instance}"}, '2.0', 'pepsi_ingress_sessions_total is 2');
is($samples->{"pepsi_ingress_messages_total{instance=$instance}"}, '1.0', 'pepsi_ingress_messages_total is 1');
$node->safe_psql($db,
	"INSERT INTO pepsi.ingress_stats (instance, sessions, updated_at) VALUES ('gone:1', 7, now() - interval '2 minutes')");
$scrape = HTTP::Tiny->new(timeout => 10)->get("http://127.0.0.1:$http_port/metrics");
unlike($scrape->{content}, qr/gone:1/, 'an instance silent for a minute is not shown');
stop_dispatcher($httpd);

# The admission role writes no table by itself.
my ($rc, undef, $err) = $node->psql($db, "INSERT INTO pepsi.ingress_stats (instance) VALUES ('forged:1')",
	extra_params => [ '-U', 'smtp' ]);
isnt($rc, 0, 'the admission role cannot write pepsi.ingress_stats directly');
($rc, undef, $err) = $node->psql($db, "INSERT INTO pepsi.mail_log (event) VALUES ('forged')",
	extra_params => [ '-U', 'smtp' ]);
isnt($rc, 0, '... nor pepsi.mail_log');
($rc, undef, $err) = $node->psql($db, "SELECT pepsi.ingress_report('x', -1, 0, 0)", extra_params => [ '-U', 'smtp' ]);
like($err, qr/cannot be negative/, 'ingress_report refuses a negative count, saying so');

# A looping message: three Received fields.  Under the default MAX_HOPS (50) it passes.
my $three_hops = join '', map { "Received: from hop$_.test by hop$_.test; Tue, 1 Dec 2026 10:00:00 +0000\r\n" } 1 .. 3;
my $c = SmtpClient->new($smtp_port);
$c->command('EHLO client.test');
like(send_message($c, received => $three_hops), qr/^250/, 'three Received fields pass under the default MAX_HOPS');

# Changed in the database: no signal, ingress reloads on pepsi_config_changed.
$node->safe_psql($db,
	"SELECT pepsi.config_set('global', 'ingress', 'MAX_HOPS', '2'); SELECT pepsi.config_set('global', 'pepsi', 'MAIL_LOG', 'no')");
ok(file_shows("$tmp/ingress.log", qr/the configuration changed in the database/),
	'config_set reaches ingress as a notification');
ok(file_shows("$tmp/ingress.log", qr/reloaded .*in force for new sessions/), 'and ingress reloads');
my $logged = $node->safe_psql($db, 'SELECT count(*) FROM pepsi.mail_log');
like(send_message($c, received => $three_hops), qr/^554 5\.4\.6/, 'the new MAX_HOPS refuses the loop (5.4.6)');
like(send_message($open[1], subject => 'after the reload'), qr/^250/,
	'a session opened before the reload goes on');
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.mail_log'), $logged, 'MAIL_LOG = no: no new mail log row');
$_->close for @open, $c;

# Stopping removes the instance's row.
stop_dispatcher($ingress);
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.ingress_stats WHERE instance = '$instance'"), '0',
	'a stopped ingress removes its statistics row');

done_testing();
