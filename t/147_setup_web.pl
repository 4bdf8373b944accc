# The browser-driven setup: pepsi-setup init --web makes a one-time link
# (only its digest is kept, in [httpd] SETUP_TOKEN, with its expiry); in
# Debian's headless Chromium, driven through playwright-core by
# t/browser/setup.js, the link opens pepsi-httpd's interview, a domain
# that is not one is shown with its reason and enqueues nothing, a change
# without the CSRF token is refused, and the answers enqueue the plan's
# tasks through the configuration connection (written_by: its role, a
# member of pepsi_config; pepsi-httpd's own role cannot insert).  The test
# then runs pepsi-setup apply --root as the operator would, and the page
# shows the tasks finish with their log lines; the files and roles apply
# made are there.  The link is refused a second time, a wrong token and an
# expired one are refused and start no session.  Screenshots are kept with
# the test's log.

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
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

my $setup = pepsi_bin('pepsi-setup');
my $db = 'postgres';
my $node = pepsi_node('setup_web', extension => 1);
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $smtp_port = PostgreSQL::Test::Cluster::get_free_port();
my $shots = $ENV{PEPSI_SCREENSHOTS} // "$PostgreSQL::Test::Utils::log_path/147_setup_web_screenshots";
make_path($shots);

$node->safe_psql($db, 'CREATE ROLE web LOGIN IN ROLE pepsi_httpd');
$node->safe_psql($db, 'CREATE ROLE operator LOGIN IN ROLE pepsi_config');
my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
my $token_file = "$tmp/setup/token";
my $conf = "$tmp/pepsi.conf";
open my $fh, '>', $conf or die;
print $fh "[database]\nCONNINFO = $conninfo\nCONFIG_CONNINFO = $conninfo user=operator\n"
  . "ADMIN_CONNINFO = $conninfo\n"
  . "[httpd]\nADDRESS = 127.0.0.1\nPORT = $port\nCONNINFO = $conninfo user=web\nSETUP_TOKEN = $token_file\n";
close $fh;

sub run_setup
{
	my (@args) = @_;
	my ($out, $err) = ('', '');

	IPC::Run::run([ $setup, @args ], '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return ($? >> 8, $out, $err);
}

# A link's token, from what init --web printed.
sub link_of
{
	my ($out) = @_;
	return $out =~ m{^  (http://127\.0\.0\.1:$port/setup\?token=[0-9a-f]{64})$}m ? $1 : undef;
}

my $http = HTTP::Tiny->new(max_redirect => 0, timeout => 30);
my $tasks = 'SELECT count(*) FROM pepsi.setup_task';

my $httpd;
END { kill 'KILL', $httpd->{pid} if $httpd && !defined $httpd->{status} }
$httpd = start_dispatcher($conf, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts');

my $r = $http->get("http://127.0.0.1:$port/setup?token=" . ('ab' x 32));
is($r->{status}, 403, 'before any link is made, a token is refused');
$r = $http->get("http://127.0.0.1:$port/api/setup");
is($r->{status}, 403, 'and the setup API needs a setup session');

#
# An expired link: refused, and it starts no session.
#
my ($rc, $out, $err) = run_setup('init', '--web', '--lifetime', '1s', '-c', $conf, '--root', $root);
is($rc, 0, 'pepsi-setup init --web makes a link') or diag $err;
my $expiring = link_of($out);
ok($expiring, 'and prints it') or diag $out;
my ($expires) = (PostgreSQL::Test::Utils::slurp_file($token_file) =~ /^expires (\d+)$/m);
ok(poll_until(sub { time() > $expires }, 10), 'the short link expires');
$r = $http->get($expiring);
is($r->{status}, 403, 'an expired link is refused');
like($r->{content}, qr/expired/, 'and the page says it expired');
ok(!$r->{headers}{'set-cookie'}, 'and starts no session');

#
# The link the browser uses; a wrong token does not use it up.
#
($rc, $out, $err) = run_setup('init', '--web', '-c', $conf, '--root', $root);
is($rc, 0, 'a second init --web makes a new link') or diag $err;
my $link = link_of($out);
ok($link, 'and prints it') or diag $out;
my $file = PostgreSQL::Test::Utils::slurp_file($token_file);
my ($token) = $link =~ /token=([0-9a-f]+)/;
unlike($file, qr/$token/, 'the link file holds its digest, not the token');
is(sprintf('%04o', (stat $token_file)[2] & 07777), '0600', 'and only its owner reads it');
(my $wrong = $link) =~ s/token=./token=x/;
$r = $http->get($wrong);
is($r->{status}, 403, 'a wrong token is refused');
ok(-e $token_file, 'and does not use the link up');
like(PostgreSQL::Test::Utils::slurp_file($token_file), qr/^root \Q$root\E$/m,
	'the link file says where the plan puts things (--root)');

#
# The browser.
#
my %answers = (
	domains => 'web.test',
	hostname => 'mx.web.test',
	conninfo => $conninfo,
	listen => '127.0.0.1',
	'smtp-port' => "$smtp_port",
	delivery => 'maildir',
	relay => 'direct');
my $script = dirname(abs_path(__FILE__)) . '/browser/setup.js';
my $steps_file = "$tmp/browser.out";
my $browser;
{
	local $ENV{NODE_PATH} = $node_path;
	$browser = IPC::Run::start([ $node_js, $script, $link, encode_json(\%answers), $shots ],
		'>', $steps_file, '2>', "$tmp/browser.err", IPC::Run::timeout(300));
}
ok(file_shows($steps_file, qr/^(ok the answers enqueue the tasks|fail .*)$/m, 120),
	'the browser reaches the enqueued tasks');
my $enqueued = $node->safe_psql($db, $tasks);
cmp_ok($enqueued, '>', 0, 'the page enqueued tasks');
is( $node->safe_psql($db,
		"SELECT count(*) FROM pepsi.setup_task WHERE written_by <> 'operator' OR status <> 'pending'"),
	'0', 'each written by the configuration role, pending');
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.setup_task WHERE kind = 'config_file'"),
	'1', 'one pepsi.conf: the refused answers enqueued nothing');
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.setup_task WHERE params::text LIKE '%not_a_domain%'"),
	'0', 'nothing of the domain that was not one');

# The operator (root, or here the test) applies them while the page watches.
($rc, $out, $err) = run_setup('apply', '-c', $conf, '--root', $root);
is($rc, 0, 'pepsi-setup apply carries the tasks out') or diag "$out\n$err";
eval { $browser->finish; 1 } or diag "the browser script: $@";
my @steps = split /\n/, PostgreSQL::Test::Utils::slurp_file($steps_file);
for my $expected ('the link, followed from another site, opens the interview', 'a change without the CSRF token is refused',
	'a domain that is not one is shown with its reason', 'the answers enqueue the tasks',
	'the log lines of pepsi-setup apply appear', 'the link is refused a second time', 'no script error',
	'nothing loaded from elsewhere')
{
	my ($line) = grep { /^(ok|fail) \Q$expected\E(:|$)/ } @steps;
	is($line // "(not reached)", "ok $expected", "in the browser: $expected");
}
diag PostgreSQL::Test::Utils::slurp_file("$tmp/browser.err") if grep { /^fail/ } @steps;
for my $shot ('interview', 'bad-domain', 'enqueued', 'applied', 'link-reused')
{
	ok(-s "$shots/$shot.png", "a screenshot: $shot ($shots)");
}

#
# What apply wrote.
#
is($node->safe_psql($db, $tasks), $enqueued, 'no task was added after the answers');
is( $node->safe_psql($db,
		"SELECT count(*) FROM pepsi.setup_task WHERE status NOT IN ('done', 'unchanged')"),
	'0', 'every task is done');
cmp_ok($node->safe_psql($db, 'SELECT count(*) FROM pepsi.setup_task_log'), '>=', $enqueued,
	'each logged its lines');
# The answers go to the drop-in pepsi.conf.d/setup.conf: pepsi.conf is the
# package's conffile, which setup never rewrites (pepsi-setup(8)).
my $written = PostgreSQL::Test::Utils::slurp_file("$root/etc/pepsi/pepsi.conf.d/setup.conf");
like($written, qr/^LOCAL_DOMAINS = web\.test$/m, "apply wrote the answers' drop-in setup.conf under --root");
like($written, qr/^HOSTNAME = mx\.web\.test$/m, 'with the host name');
like($written, qr/^PORT = $smtp_port$/m, 'and the SMTP port');
ok(-s "$root/etc/pepsi/dkim/pepsi.web.test.pem", "and the domain's DKIM key");
is($node->safe_psql($db, "SELECT pg_has_role('pepsi_operator', 'pepsi_config', 'MEMBER')"),
	't', 'and the login roles');

#
# The link is used: refused again, and pepsi-httpd's own role cannot enqueue.
#
ok(!-e $token_file, 'the link file is gone');
$r = $http->get($link);
is($r->{status}, 403, 'the used link is refused');
ok(!$r->{headers}{'set-cookie'}, 'and starts no session');
my ($ok, $stderr);
$node->psql($db, "INSERT INTO pepsi.setup_task (kind) VALUES ('grant_policy')",
	extra_params => [ '-U', 'web' ], stderr => \$stderr, on_error_die => 0);
like($stderr, qr/permission denied/, "pepsi-httpd's own role cannot enqueue a task");
ok(file_shows("$tmp/httpd.log", qr/the setup link was used from 127\.0\.0\.1/), "pepsi-httpd's log says the link was used");

done_testing();
