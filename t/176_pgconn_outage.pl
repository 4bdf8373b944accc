# common/runtime/pgconn.c's backoff during an outage (a failover: the
# primary gone for seconds until a standby is promoted), through
# t/pgconn/'s driver with a 30 s bound: no wait before the next attempt is
# longer than a tenth of the outage so far, so that a client finds the new
# primary within about a tenth of the time it was gone (docs/scaling.md,
# "Failover time"), where waits grown towards the 30 s bound could leave it
# idle for half a minute after the server is back.  The test's clock only
# loosens the bound: a line read at time T was logged before T, and the
# outage began after the server was told to stop.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

use DispatchTest qw(pepsi_bin);
use PepsiTest;

my $db = 'postgres';
my $bin = pepsi_bin('pepsi-test-pgconn');
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $node = pepsi_node('pgconn_outage');
my $backoff_max = 30;
my $outage = 10;    # seconds the server stays down

my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = pgconn.test
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
CONF

sub since
{
	my ($path, $offset) = @_;
	return '' unless -e $path;
	return substr(slurp_file($path), $offset // 0);
}

my $out = "$tmp/driver.out";
my $log = "$tmp/driver.log";
my $driver = IPC::Run::start([ $bin, $conf, 'plain', $backoff_max ], '<', \undef, '>', $out, '2>', $log);
my $server = qr/postgres on \Q@{[ $node->host ]}\E port @{[ $node->port ]}/;
ok(poll_until(sub { since($log) =~ /connected to the database $server/ }), 'connects')
  or diag(since($log));

# The server stops for $outage seconds; each wait is read as it is logged.
my $log_at = -s $log;
my $stopped_at = time;
$node->stop('immediate');
my @seen;    # [wait logged, seconds into the outage by which it was read]
while (time - $stopped_at < $outage)
{
	my @waits = since($log, $log_at) =~ /(?:reconnecting|trying again) in (\d+\.\d) s$/mg;
	my $now = time - $stopped_at;
	push @seen, map { [ $_, $now ] } @waits[ scalar(@seen) .. $#waits ];
	sleep 0.05;
}
cmp_ok(scalar @seen, '>=', 5, 'keeps trying while the server is down');
my @over = grep { $_->[0] > 0.1 && $_->[0] > 0.1 * $_->[1] + 0.05 } @seen;
ok(!@over, "no wait is longer than a tenth of the outage so far, though the bound is $backoff_max s")
  or diag(join("\n", map { sprintf('wait %s s logged by %.2f s into the outage', @$_) } @seen));

# The server is back: the connection comes back.
$node->start;
ok(poll_until(sub { since($log) =~ /reconnected to the database $server/ }, 60),
	'reconnects once the server is back');

$driver->signal('TERM');
eval { $driver->finish };
note("the driver's log:\n" . since($log));
done_testing();
