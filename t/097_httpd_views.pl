# The web page's views and /metrics' histograms and refusals, from real
# traffic: swaks sends four messages through pepsi-ingress, pepsi-dispatch
# delivers three to the scripted smarthost, which defers the fourth (451),
# and a client's two unknown commands are refused (500).  Then:
#
# - the maintenance worker's history (pepsi.stats_minute, read through
#   pepsi.stats_history) counts them, without the queue being scanned;
# - /metrics, parsed by the Prometheus project's parser, has the delivery
#   delay and stage run time histograms (as many observations as messages
#   delivered and processed) and the refusals by code;
# - in Chromium (t/browser/views.js), every view shows what the test put
#   in, a screenshot each, kept in the test's log directory; a viewer sees
#   no action button.

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use HTTP::Tiny;
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');

my $db = 'postgres';
my $node = delivery_node('httpd_views');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $smtp_port = PostgreSQL::Test::Cluster::get_free_port();
my $http_port = PostgreSQL::Test::Cluster::get_free_port();
# The screenshots: in PEPSI_SCREENSHOTS when set (scripts/check.sh removes
# its scratch copy), else with the test's log.
my $shots = $ENV{PEPSI_SCREENSHOTS} // "$PostgreSQL::Test::Utils::log_path/097_httpd_views_screenshots";
make_path($shots);

# The maintenance worker stores the history's first row before any traffic.
ok(poll_until(sub { $node->safe_psql($db, 'SELECT count(*) FROM pepsi.stats_minute') > 0 }, 60),
	'the maintenance worker stores a row of history');

my $peer = start_peer('--rcpt', 'later@=451 4.3.0 try again later');
my $secret = 'not-to-be-shown';
$node->safe_psql($db, "CREATE ROLE web LOGIN PASSWORD '$secret' IN ROLE pepsi_httpd");
my $config = delivery_config($node, maildir_root => $root, smarthost => "127.0.0.1:$peer->{port}",
	pepsi => { MAIL_LOG => 'yes' }, dispatch => { STATS_INTERVAL => '1s' });
my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
PostgreSQL::Test::Utils::append_to_file($config, <<"CONF");
[ingress]
AUTHSERV_ID = mx.pepsi.test
DISPATCH_WAKE_INTERVAL = 10ms
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $smtp_port
[httpd]
ADDRESS = 127.0.0.1
PORT = $http_port
CONNINFO = $conninfo user=web password=$secret
CONF
# (A password in the file: only its owner may read it.)
chmod 0600, $config or die "chmod $config: $!";
# The configuration page shows where each value comes from: this override
# replaces the file's RETRY_MAX (to the same value: the test's timings stay).
$node->safe_psql($db, "SELECT pepsi.config_set('global', 'stage-smarthost', 'RETRY_MAX', '2000ms')");
# A TLS policy the relay would have fetched for the deferred mail's domain.
$node->safe_psql($db, "SELECT pepsi.mta_sts_policy_put('remote.test', 'test1', 'testing',"
	  . " 'version: STSv1\nmode: testing\nmx: *.remote.test\nmax_age: 86400\n', 86400)");

my $ingress = start_ingress($config, $smtp_port, "$tmp/ingress.log");
my $dispatch = start_dispatcher($config, log => "$tmp/dispatch.log");

sub swaks
{
	my (@args) = @_;
	my $out = '';

	IPC::Run::run([ 'swaks', '--server', "127.0.0.1:$smtp_port", '--ehlo', 'client.test', @args ],
		'<', \undef, '>', \$out, '2>&1', IPC::Run::timeout(60));
	return ($? >> 8, $out);
}

for my $i (1 .. 3)
{
	my ($rc, $out) = swaks('--from', 'sender@client.test', '--to', 'sent@remote.test',
		'--header', "Subject: sent $i");
	is($rc, 0, "message $i is accepted") or diag $out;
}
# The deferred one's subject is markup: the message page shows it as text.
my $subject = 'deferred <img src=x onerror=alert(1)><b>bold</b>';
my ($rc, $out) = swaks('--from', 'sender@client.test', '--to', 'later@remote.test',
	'--header', "Subject: $subject");
is($rc, 0, 'the message to be deferred is accepted') or diag $out;

# Two commands ingress does not know: two refusals with code 500.
{
	my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$smtp_port", Timeout => 10) or die "connect: $!";
	my @replies;
	my $read = sub { my $line = <$s> // ''; push @replies, $line; $line };
	$read->();
	print $s "EHLO client.test\r\n";
	1 while $read->() =~ /^250-/;
	for (1 .. 2) { print $s "FROBNICATE\r\n"; $read->() }
	print $s "QUIT\r\n";
	$read->();
	close $s;
	is(scalar(grep { /^500 / } @replies), 2, 'ingress answers the unknown commands 500');
}

my $later = $node->safe_psql($db, "SELECT id FROM pepsi.workqueue WHERE 'later\@remote.test' = ANY (rcpt_to)");
ok($later, 'the deferred message is queued');
ok(poll_until(sub {
	$node->safe_psql($db, "SELECT count(*) FROM pepsi.mail_log WHERE event = 'delivery'"
		  . " AND detail ->> 'status' = 'sent'") == 3
	  && $node->safe_psql($db, "SELECT stage || ' ' || status FROM pepsi.workqueue WHERE id = $later")
	  =~ /^smarthost (paused|pending|running)$/
	  && $node->safe_psql($db, "SELECT count(*) FROM pepsi.mail_log WHERE workqueue_id = $later"
		  . " AND detail ->> 'status' = 'deferred'") >= 1
}, 60), 'three are delivered, the fourth deferred');

#
# The history: the counts since the first row, from the counters alone.
#
ok(poll_until(sub {
	$node->safe_psql($db, "SELECT format('%s %s %s', sum(received), sum(sent), sum(refused)) FROM pepsi.stats_history()")
	  eq '4 3 2'
}, 60), 'stats_history: 4 received, 3 sent, 2 refused over the last hour')
  or diag $node->safe_psql($db, 'SELECT * FROM pepsi.stats_history()');
ok($node->safe_psql($db, 'SELECT sum(deferred) FROM pepsi.stats_history()') >= 1, '... and deferred attempts');
is($node->safe_psql($db, "SELECT (queue ->> 'smarthost')::int > 0 FROM pepsi.stats_history()"
	  . ' ORDER BY at DESC LIMIT 1'), 't', '... and the deferred message in the queue depth now');
is($node->safe_psql($db, "SELECT deliveries FROM pepsi.stats_delivery_delay('1 hour') LIMIT 1"), 3,
	'stats_delivery_delay counts the three deliveries');
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.stats_delivery_delay('1 hour') WHERE seconds > 0"),
	3, '... and gives the three percentiles');
my ($err) = $node->psql($db, "SELECT * FROM pepsi.stats_history('2 days')");
isnt($err, 0, 'a span over a day is refused');

#
# /metrics
#
my $httpd;
END { kill 'KILL', $httpd->{pid} if $httpd && !defined $httpd->{status} }
$httpd = start_dispatcher($config, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts');
my $base = "http://127.0.0.1:$http_port";
my $http = HTTP::Tiny->new(timeout => 30);
my %m;
ok(poll_until(sub {
	my $r = $http->get("$base/metrics");
	my ($ok, $samples) = prometheus_samples($r->{content});
	return 0 unless $r->{status} == 200 && $ok;
	%m = %$samples;
	# The histograms and the counters are flushed in two statements.
	my @stages = map { /^pepsi_stage_messages_total\{stage=(.*)\}$/ ? $1 : () } keys %m;
	return 0 if grep { ($m{"pepsi_stage_run_seconds_count{stage=$_}"} // -1) != $m{"pepsi_stage_messages_total{stage=$_}"} } @stages;
	return ($m{'pepsi_delivery_delay_seconds_count{stage=smarthost}'} // 0) == 3
	  && ($m{'pepsi_smtp_refusals_total{code=500}'} // 0) == 2;
}, 60), '/metrics parses, with the histograms and the refusals') or diag explain \%m;
cmp_ok($m{'pepsi_delivery_delay_seconds_bucket{le=+Inf,stage=smarthost}'}, '==', 3,
	'pepsi_delivery_delay_seconds: three deliveries in the +Inf bucket');
ok($m{'pepsi_delivery_delay_seconds_sum{stage=smarthost}'} > 0, '... and a sum of their delays');
cmp_ok($m{'pepsi_stage_run_seconds_count{stage=init}'}, '==', 4, 'pepsi_stage_run_seconds: four messages through init');
my @buckets = map { $m{$_} } sort { ($a =~ /le=([^,}]+)/)[0] eq '+Inf' ? 1 : ($b =~ /le=([^,}]+)/)[0] eq '+Inf' ? -1
	  : ($a =~ /le=([^,}]+)/)[0] <=> ($b =~ /le=([^,}]+)/)[0] }
  grep { /^pepsi_stage_run_seconds_bucket\{.*stage=init\}$/ } keys %m;
is_deeply([ sort { $a <=> $b } @buckets ], \@buckets, '... its buckets cumulative');
cmp_ok($m{'pepsi_smtp_refusals_total{code=500}'}, '==', 2, 'pepsi_smtp_refusals_total{code="500"} is 2');
is(scalar(grep { /^pepsi_smtp_refusals_total/ } keys %m), 1, '... and no other code was refused');
cmp_ok($m{'pepsi_messages_received_total{}'}, '==', 4, 'pepsi_messages_received_total is 4');

#
# The API refuses what it should.
#
is($http->get("$base/api/history")->{status}, 401, '/api/history needs a login');
is($http->get("$base/api/config/in-force")->{status}, 401, '/api/config/in-force needs a login');

#
# The views, in Chromium.
#
my $chromium = '/usr/bin/chromium';
my $node_js = '/usr/bin/node';
my $node_path = `npm root -g 2>/dev/null`;
chomp $node_path;
SKIP:
{
	skip 'chromium, node or playwright-core is not installed (scripts/deps.sh installs them)', 1
	  unless -x $chromium && -x $node_js && -d "$node_path/playwright-core";
	my ($admin_password, $viewer_password) = ('views password 1', 'views password 2');
	IPC::Run::run([ pepsi_bin('pepsi-httpd'), '-c', $config, 'passwd', 'admin' ], '<', \"$admin_password\n")
	  or die 'pepsi-httpd passwd failed';
	IPC::Run::run([ pepsi_bin('pepsi-httpd'), '-c', $config, 'passwd', 'watcher', 'viewer' ],
		'<', \"$viewer_password\n")
	  or die 'pepsi-httpd passwd failed';
	my $expected = encode_json({
		received => 4, sent => 3, refused => 2, deferred_stage => 'smarthost',
		deferred_rcpt => 'later@remote.test', subject => $subject, domain => 'remote.test',
		deferred_error => '451 4.3.0 try again later', tls_policy => 'MTA-STS testing',
		override => { section => 'stage-smarthost', option => 'RETRY_MAX', value => '2000ms' },
		secret => $secret });
	my ($stdout, $stderr) = ('', '');
	{
		local $ENV{NODE_PATH} = $node_path;
		eval {
			IPC::Run::run([ $node_js, dirname(abs_path(__FILE__)) . '/browser/views.js', $base, 'admin',
					$admin_password, 'watcher', $viewer_password, $later, $shots, $expected ],
				'>', \$stdout, '2>', \$stderr, IPC::Run::timeout(300));
			1;
		} or diag "the browser script: $@";
	}
	my @steps = split /\n/, $stdout;
	for my $expected_step ('an administrator logs in',
		"the traffic chart's points count the messages sent",
		'the queue depth chart shows the deferred message at its stage',
		'the delay percentiles count the deliveries', 'the refusals by code',
		'the queue lists the deferred message',
		'the message page: envelope, headers as text, state, history',
		"the message page's actions: hold, then release",
		'the destination with deferred mail, its last error and TLS policy',
		"the delivery log's last lines",
		'the configuration in force, with where each value comes from',
		'no script error, nothing loaded from elsewhere',
		'a viewer sees the pages without an action')
	{
		my ($line) = grep { /^(ok|fail) \Q$expected_step\E(:|$)/ } @steps;
		is($line // "(not reached)", "ok $expected_step", "in the browser: $expected_step");
	}
	diag join "\n", $stderr, grep { /^#/ } @steps if grep { /^fail/ } @steps;
	for my $view (qw(overview queue message destinations log config viewer-message))
	{
		ok(-s "$shots/$view.png", "a screenshot of the view $view ($shots)");
	}
	is( $node->safe_psql($db,
			"SELECT string_agg(action || ' by ' || principal, ', ' ORDER BY id) FROM pepsi.event_log"
			  . " WHERE action IN ('queue_hold', 'queue_release')"),
		'queue_hold by web:admin, queue_release by web:admin',
		'the message page\'s hold and release were the administrator\'s');
}

stop_dispatcher($httpd);
stop_dispatcher($dispatch);
stop_process($ingress);
stop_process($peer);
done_testing();
