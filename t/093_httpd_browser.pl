# pepsi-httpd's web page in a real browser: Debian's headless Chromium,
# driven through playwright-core by t/browser/webpage.js, logs in, finds a
# queued message, holds and releases it and sees the pipeline's counts
# change; the database shows each action, done by the administrator.

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $chromium = '/usr/bin/chromium';
my $node_js = '/usr/bin/node';
# playwright-core is installed globally by scripts/deps.sh.
my $node_path = `npm root -g 2>/dev/null`;
chomp $node_path;
plan skip_all => 'chromium, node or playwright-core is not installed (scripts/deps.sh installs them)'
  unless -x $chromium && -x $node_js && -d "$node_path/playwright-core";

my $node = dispatch_node('browser');
my $db = 'postgres';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
$node->safe_psql($db, 'CREATE ROLE web LOGIN IN ROLE pepsi_httpd');
my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
my $conf = "$tmp/pepsi.conf";
open my $fh, '>', $conf or die;
print $fh "[database]\nCONNINFO = $conninfo\n[httpd]\nADDRESS = 127.0.0.1\nPORT = $port\n"
  . "CONNINFO = $conninfo user=web\n";
close $fh;

my $password = 'browser password 1';
IPC::Run::run([ pepsi_bin('pepsi-httpd'), '-c', $conf, 'passwd', 'admin' ], '<', \"$password\n")
  or die 'pepsi-httpd passwd failed';
my $id = $node->safe_psql($db,
	"SELECT pepsi.workqueue_add('alice\@example.org', ARRAY['bob\@example.net'],"
	  . " convert_to(E'From: <alice\@example.org>\\r\\nSubject: browser test\\r\\n', 'UTF8'),"
	  . " 'hello'::bytea, '{}'::jsonb, stage => 'relay')");

my $httpd;
END { kill 'KILL', $httpd->{pid} if $httpd && !defined $httpd->{status} }
$httpd = start_dispatcher($conf, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts');

my $script = dirname(abs_path(__FILE__)) . '/browser/webpage.js';
my ($out, $err) = ('', '');
my $shot = "$tmp/page.png";
{
	local $ENV{NODE_PATH} = $node_path;
	eval {
		IPC::Run::run([ $node_js, $script, "http://127.0.0.1:$port", 'admin', $password, $id, $shot ],
			'>', \$out, '2>', \$err, IPC::Run::timeout(180));
		1;
	} or diag "the browser script: $@";
}
my @steps = split /\n/, $out;
for my $expected ('the page asks for a login', 'a wrong password is refused on the page',
	'the right password logs in', 'the queued message is listed',
	'the pipeline shows its stage with nothing held', 'hold', "the pipeline's held count follows",
	'release', "the message's details open", 'no script error', 'log out')
{
	my ($line) = grep { /^(ok|fail) \Q$expected\E(:|$)/ } @steps;
	is($line // "(not reached)", "ok $expected", "in the browser: $expected");
}
diag $err if $err && grep { /^fail/ } @steps;
ok(-s $shot, 'a screenshot of the page was taken');

is( $node->safe_psql($db,
		"SELECT string_agg(action || ' by ' || principal, ', ' ORDER BY id) FROM pepsi.event_log"
		  . " WHERE action IN ('queue_hold', 'queue_release')"),
	'queue_hold by web:admin, queue_release by web:admin',
	'the database recorded the hold and the release, by the administrator');
is($node->safe_psql($db, "SELECT status FROM pepsi.workqueue WHERE id = $id"), 'pending',
	'the message is pending again');
stop_dispatcher($httpd);
done_testing();
