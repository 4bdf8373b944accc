# pepsi-httpd viewers: an account or API token with the role "viewer" may
# read (the pages, the API's GET endpoints) and may not act.  Its actions
# (queue retry/hold/release/delete/bounce, config set/unset) get 403 naming
# why and change nothing, neither the queue nor the overlay nor the audit
# log; an admin's go through.  The database refuses a viewer's action as
# well, for a pepsi-httpd that would not check: as pepsi-httpd's own role,
# naming the viewer in pepsi.admin_account, the operator functions fail.
# pepsi-httpd passwd/token set the role; passwd without one keeps it.

use strict;
use warnings FATAL => 'all';

use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $node = dispatch_node('httpd_viewer');
my $db = 'postgres';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();

$node->safe_psql($db, 'CREATE ROLE web LOGIN IN ROLE pepsi_httpd');
my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
my $conf = "$tmp/pepsi.conf";
{
	open my $fh, '>', $conf or die "$conf: $!";
	print $fh "[database]\nCONNINFO = $conninfo\n[httpd]\nADDRESS = 127.0.0.1\nPORT = $port\n"
	  . "CONNINFO = $conninfo user=web\n";
	close $fh;
}

sub httpd_command
{
	my ($input, @args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-httpd'), '-c', $conf, @args ], '<', \$input, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

# Credentials: a viewer account, a viewer token, an admin token.
my ($rc, $out, $err) = httpd_command("viewer password\n", 'passwd', 'eve', 'viewer');
is($rc, 0, 'pepsi-httpd passwd NAME viewer makes a viewer') or diag $err;
($rc, undef, $err) = httpd_command("viewer password\n", 'passwd', 'eve');
is($rc, 0, 'a new password without a role') or diag $err;
is($node->safe_psql($db, "SELECT role FROM pepsi.admin_account WHERE name = 'eve'"), 'viewer',
	'... keeps the account a viewer');
($rc, undef, $err) = httpd_command("viewer password\n", 'passwd', 'eve', 'root');
is($rc, 64, 'an unknown role is refused');
like($err, qr/role must be "admin" or "viewer", not "root"/, '... naming the roles');
(undef, my $watch) = httpd_command('', 'token', 'watch', 'viewer');
chomp $watch;
like($watch, qr/^pepsi_[0-9a-f]{96}$/, 'pepsi-httpd token NAME viewer prints a token');
(undef, my $ops) = httpd_command('', 'token', 'ops');
chomp $ops;
is($node->safe_psql($db, "SELECT string_agg(name || '=' || role, ' ' ORDER BY name) FROM pepsi.api_token"),
	'ops=admin watch=viewer', 'a token without a role is an admin\'s, as before');

my @rows = add_rows($node, 2, quiet => 1);

my $httpd;
END { kill 'KILL', $httpd->{pid} if $httpd && !defined $httpd->{status} }
$httpd = start_dispatcher($conf, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts');

my $base = "http://127.0.0.1:$port";
my $http = HTTP::Tiny->new(timeout => 10, max_redirect => 0);
sub json_of { my $r = shift; return eval { decode_json($r->{content}) } }
sub state_of
{
	return $node->safe_psql($db,
		"SELECT string_agg(id || ':' || status || ':' || timeout, ' ' ORDER BY id) FROM pepsi.workqueue")
	  . ' | ' . $node->safe_psql($db, 'SELECT count(*) FROM pepsi.config_override')
	  . ' | ' . $node->safe_psql($db, "SELECT count(*) FROM pepsi.event_log WHERE action LIKE 'queue%' OR action LIKE 'config%'");
}

# A viewer's token reads.
my %viewer = (Authorization => "Bearer $watch");
my $r = $http->get("$base/api/summary", { headers => \%viewer });
is($r->{status}, 200, 'a viewer token reads the summary');
$r = $http->get("$base/api/queue", { headers => \%viewer });
is_deeply([ sort map { $_->{id} } @{ json_of($r) } ], [ sort @rows ], '... and the queue');
$r = $http->get("$base/api/queue/$rows[0]", { headers => \%viewer });
is(json_of($r)->{id}, $rows[0], '... and one message');
$r = $http->get("$base/api/session", { headers => \%viewer });
is(json_of($r)->{role}, 'viewer', '/api/session says the role');

# ... and may not act: 403, nothing changed.
my $before = state_of();
my %json = ('Content-Type' => 'application/json');
for my $action (qw(retry hold release delete bounce))
{
	$r = $http->post("$base/api/queue/$action",
		{ headers => { %viewer, %json }, content => encode_json({ ids => [ 0 + $rows[0] ] }) });
	is($r->{status}, 403, "a viewer token's $action: 403");
}
like(json_of($r)->{error}, qr/API token "watch" is a viewer: it may read, not act/, '... saying why');
$r = $http->post("$base/api/config", { headers => { %viewer, %json },
	content => encode_json({ section => 'dispatch', option => 'POLL_INTERVAL', value => '7s' }) });
is($r->{status}, 403, "a viewer token's config set: 403");
$r = $http->post("$base/api/config/unset", { headers => { %viewer, %json },
	content => encode_json({ section => 'dispatch', option => 'POLL_INTERVAL' }) });
is($r->{status}, 403, "... and config unset: 403");
is(state_of(), $before, 'the queue, the overlay and the audit log are as they were');

# A viewer's browser session: logs in, reads, may not act, logs out.
$r = $http->post("$base/api/login", { headers => \%json,
	content => encode_json({ name => 'eve', password => 'viewer password' }) });
is($r->{status}, 200, 'a viewer logs in');
my ($cookie) = $r->{headers}{'set-cookie'} =~ /^(pepsi_session=[0-9a-f]+)/;
my %browser = (Cookie => $cookie, 'X-CSRF-Token' => json_of($r)->{csrf});
$r = $http->get("$base/api/shape", { headers => \%browser });
is($r->{status}, 200, '... reads the queue\'s shape');
$r = $http->post("$base/api/queue/hold",
	{ headers => { %browser, %json }, content => encode_json({ ids => [ 0 + $rows[0] ] }) });
is($r->{status}, 403, '... and its hold, with the CSRF token, gets 403');
like(json_of($r)->{error}, qr/account "eve" is a viewer/, '... naming the account');
is(state_of(), $before, '... changing nothing');
$r = $http->request('DELETE', "$base/api/session", { headers => \%browser });
is($r->{status}, 200, 'a viewer logs out');

# An admin token acts (the same request, so the 403s above were the role's).
$r = $http->post("$base/api/queue/hold",
	{ headers => { Authorization => "Bearer $ops", %json }, content => encode_json({ ids => [ 0 + $rows[0] ] }) });
is($r->{status}, 200, 'an admin token holds') or diag $r->{content};
is($node->safe_psql($db, "SELECT timeout = 'infinity' FROM pepsi.workqueue WHERE id = $rows[0]"), 't',
	'... and the row is on hold');

# The database's own boundary: pepsi-httpd's role, naming a viewer, cannot act.
my ($stderr, $ret) = ('');
$ret = $node->psql($db, "BEGIN; SELECT set_config('pepsi.admin_account', 'token:watch', true);"
	  . " SELECT pepsi.queue_release(ARRAY[$rows[0]]::bigint[]); COMMIT;",
	stderr => \$stderr, extra_params => [ '-U', 'web', '-v', 'ON_ERROR_STOP=1' ]);
isnt($ret, 0, 'the database refuses pepsi-httpd acting for a viewer token');
like($stderr, qr/API token "watch" is a viewer: it may read, not queue_release/, '... saying why');
$ret = $node->psql($db, "BEGIN; SELECT set_config('pepsi.admin_account', 'eve', true);"
	  . " SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '7s'); COMMIT;",
	stderr => \$stderr, extra_params => [ '-U', 'web', '-v', 'ON_ERROR_STOP=1' ]);
like($stderr, qr/account "eve" is a viewer: it may read, not config_set/, '... and for a viewer account');
is($node->safe_psql($db, "SELECT timeout = 'infinity' FROM pepsi.workqueue WHERE id = $rows[0]")
	  . ' ' . $node->safe_psql($db, 'SELECT count(*) FROM pepsi.config_override'), 't 0',
	'... and nothing changed');

stop_dispatcher($httpd);
done_testing();
