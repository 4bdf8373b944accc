# A streaming standby (PostgreSQL::Test::Cluster) beside the primary:
#
# - pepsi-httpd's read-only views read through [httpd] READ_CONNINFO, which
#   lists the standby first with target_session_attrs=prefer-standby: with
#   the standby's replay paused, a message added on the primary is not in
#   the queue view (read from the standby) while an action on it goes
#   through (the primary), and GET /api/replica says the views come from a
#   standby and how far behind it is (the page shows it); replay resumed,
#   the view catches up;
# - the maintenance worker (pepsi preloaded on both) does not run on the
#   standby while it is in recovery, and serves once it is promoted; the
#   views then say they read from no standby.

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

plan skip_all => 'pepsi-httpd is not built' unless -x pepsi_bin('pepsi-httpd');

my $db = 'postgres';
my $primary = dispatch_node('standby_reads_primary', preload => 1,
	conf => "pepsi.database = '$db'\npepsi.maintenance_interval = '100ms'\n"
	  . "wal_level = replica\nmax_wal_senders = 4\nhot_standby = on\n");
$primary->safe_psql($db, 'CREATE ROLE web LOGIN IN ROLE pepsi_httpd');
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby_reads_standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);
is($standby->safe_psql($db, 'SELECT pg_is_in_recovery()'), 't', 'the standby streams from the primary');

my $tmp = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conninfo = 'host=' . $primary->host . ' port=' . $primary->port . " dbname=$db";
my $reads = 'host=' . $standby->host . ',' . $primary->host . ' port=' . $standby->port . ','
  . $primary->port . " dbname=$db user=web target_session_attrs=prefer-standby";
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf,
	"[database]\nCONNINFO = $conninfo\n[httpd]\nADDRESS = 127.0.0.1\nPORT = $port\n"
	  . "CONNINFO = $conninfo user=web\nREAD_CONNINFO = $reads\n");

my ($out, $err) = ('', '');
IPC::Run::run([ pepsi_bin('pepsi-httpd'), '-c', $conf, 'token', 'ops' ], '<', \'', '>', \$out, '2>', \$err);
chomp $out;
like($out, qr/^pepsi_[0-9a-f]{96}$/, 'an admin token') or diag $err;
my %auth = (Authorization => "Bearer $out");

my @rows = add_rows($primary, 2, quiet => 1);
$primary->wait_for_catchup($standby);

my $httpd;
END { kill 'KILL', $httpd->{pid} if $httpd && !defined $httpd->{status} }
$httpd = start_dispatcher($conf, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts with [httpd] READ_CONNINFO');

my $base = "http://127.0.0.1:$port";
my $http = HTTP::Tiny->new(timeout => 10, max_redirect => 0);
sub get_json
{
	my ($path) = @_;
	my $r = $http->get("$base$path", { headers => \%auth });
	return $r->{status} == 200 ? eval { decode_json($r->{content}) } : undef;
}
sub queue_ids { return [ sort { $a <=> $b } map { $_->{id} } @{ get_json('/api/queue') // [] } ] }

is_deeply(queue_ids(), [@rows], 'the queue view lists the rows');
my $replica = get_json('/api/replica');
ok($replica && $replica->{standby}, '/api/replica: the views read from a standby');
is($replica && $replica->{port}, $standby->port, '... the one READ_CONNINFO lists first');
ok(file_shows("$tmp/httpd.log", qr/the views read from .* port ${\ $standby->port} \(a standby\)/),
	'pepsi-httpd logged where its views read');

# Replay paused: what the primary commits now, the standby does not show.
$standby->safe_psql($db, 'SELECT pg_wal_replay_pause()');
ok(poll_until(sub { $standby->safe_psql($db, 'SELECT pg_get_wal_replay_pause_state()') eq 'paused' }, 30),
	'the standby\'s replay is paused');
my ($late) = add_rows($primary, 1, quiet => 1);
is_deeply(queue_ids(), [@rows], 'a row added on the primary since is not in the view (read from the standby)');
my $r = $http->post("$base/api/queue/hold",
	{ headers => { %auth, 'Content-Type' => 'application/json' }, content => encode_json({ ids => [ $late + 0 ] }) });
is($r->{status}, 200, 'an action on that row goes through: the actions are on the primary') or diag $r->{content};
is(eval { decode_json($r->{content})->{count} }, 1, '... and held it');
ok(poll_until(sub { my $x = get_json('/api/replica'); $x && $x->{standby} && $x->{lag_seconds} > 0 }, 30),
	'/api/replica shows the replication lag');
$r = $http->get("$base/");
like($r->{content} // '', qr/id="replica-lag"/, 'the page has its place for the lag');
$r = $http->get("$base/app.js");
like($r->{content} // '', qr{/api/replica}, '... which the page fills from /api/replica');

$standby->safe_psql($db, 'SELECT pg_wal_replay_resume()');
ok(poll_until(sub { grep { $_ == $late } @{ queue_ids() } }, 30), 'replay resumed: the view catches up');

# The maintenance worker: the primary's runs, the standby's does not.
my $workers = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pepsi maintenance'";
ok(poll_until(sub { $primary->safe_psql($db, $workers) == 1 }, 30), 'the primary runs the maintenance worker');
# After a commit on the primary the standby has replayed: it has been a standby all along.
$primary->safe_psql($db, 'CREATE TABLE replayed ()');
$primary->wait_for_catchup($standby);
is($standby->safe_psql($db, $workers), 0, 'the standby, in recovery, runs none');
is($standby->safe_psql($db, 'SELECT pepsi.maintenance_pid()'), 0, '... pepsi.maintenance_pid() says so');
unlike(slurp_file($standby->logfile), qr/pepsi maintenance.*(ERROR|read-only)|ERROR.*pepsi/,
	'... and its log has no maintenance error');

$standby->promote;
ok(poll_until(sub { $standby->safe_psql($db, $workers) == 1 }, 60), 'promoted, it runs the maintenance worker');
ok(file_shows($standby->logfile, qr/pepsi maintenance worker started/), '... which says it started');
ok(poll_until(sub { $standby->safe_psql($db, 'SELECT pepsi.maintenance_pid()') > 0 }, 30),
	'... and holds the worker\'s lock');
ok(poll_until(sub { my $x = get_json('/api/replica'); $x && !$x->{standby} }, 30),
	'the views say they no longer read from a standby');

kill 'TERM', $httpd->{pid};
done_testing();
