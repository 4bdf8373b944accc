# common/runtime/pgconn.c, the daemons' one database connection, against a real
# cluster through t/pgconn/'s driver: it connects and runs its set-up (a
# LISTEN, a notice the log gets), then queries, plain and in pipeline mode;
# a session the server terminates and a server that stops are each one log
# line naming the server and the reason, the reconnect attempts while the
# server is down wait no longer than the backoff's bound, and once the
# server is back the connection is set up afresh (its LISTEN too).

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest qw(pepsi_bin);
use PepsiTest;

my $db = 'postgres';
my $bin = pepsi_bin('pepsi-test-pgconn');
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $node = pepsi_node('pgconn');
my $backoff_max = 1.5;

my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = pgconn.test
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
CONF

# The driver's events (stdout) and log (stderr) from $offset on.
sub since
{
	my ($path, $offset) = @_;
	return '' unless -e $path;
	return substr(slurp_file($path), $offset // 0);
}

sub pids
{
	my ($text) = @_;
	my @pids = $text =~ /^pid (\d+)$/mg;
	return @pids;
}

for my $mode (qw(plain pipeline))
{
	my $out = "$tmp/$mode.out";
	my $log = "$tmp/$mode.log";
	my $driver =
	  IPC::Run::start([ $bin, $conf, $mode, $backoff_max ], '<', \undef, '>', $out, '2>', $log);
	my $server = qr/postgres on \Q@{[ $node->host ]}\E port @{[ $node->port ]}/;

	# Connected: the set-up ran in order, then queries.
	ok(poll_until(sub { pids(since($out)) >= 2 }), "$mode: connects and queries")
	  or diag(since($out), since($log));
	like(since($out), qr/\Asetup 0: LISTEN\nsetup 1: DO\nready\n/, "$mode: the set-up runs first, then ready");
	like(since($log), qr/test connection: connected to the database $server$/m,
		"$mode: the log names the server it connected to");
	like(since($log), qr/test connection: the server says: NOTICE:  hello from the set-up/,
		"$mode: a notice goes to the log");
	like(since($out), qr/^item 1: 2$/m, "$mode: the pipeline's second statement answers")
	  if $mode eq 'pipeline';
	my ($first_pid) = pids(since($out));

	$node->safe_psql($db, "NOTIFY pgconn_test, 'one'");
	ok(poll_until(sub { since($out) =~ /^notify pgconn_test one$/m }), "$mode: a notification arrives");

	# The server ends the session: one line, then a new session.
	my ($out_at, $log_at) = (-s $out, -s $log);
	$node->safe_psql($db, "SELECT pg_terminate_backend($first_pid)");
	ok( poll_until(sub { since($log, $log_at) =~ /reconnected to the database $server/ }),
		"$mode: reconnects after its session is terminated")
	  or diag(since($log, $log_at));
	like(
		since($log, $log_at),
		qr/test connection: lost the database connection to $server \((?:.*terminating connection due to administrator command|.*server closed the connection).*\); reconnecting in \d+\.\d s$/m,
		"$mode: the loss is one line naming the server and the reason");
	ok(poll_until(sub { grep { $_ != $first_pid } pids(since($out, $out_at)) }),
		"$mode: queries run on the new session");

	# The server stops: attempts go on, none waiting past the bound.
	($out_at, $log_at) = (-s $out, -s $log);
	$node->stop('fast');
	ok( poll_until(sub { (() = since($log, $log_at) =~ /cannot connect to the database/g) >= 8 }, 60),
		"$mode: keeps trying while the server is down");
	my $down = since($log, $log_at);
	like($down, qr/lost the database connection to $server|cannot connect to the database $server/,
		"$mode: the lines name the server");
	my @waits = $down =~ /(?:reconnecting|trying again) in (\d+\.\d) s/g;
	ok(@waits >= 8, "$mode: each attempt says how long it waits");
	ok(!grep({ $_ > $backoff_max } @waits), "$mode: no wait is longer than the backoff's bound ($backoff_max s)")
	  or diag("waits: @waits");
	like($down, qr/cannot connect to the database $server \(.*\); trying again in/,
		"$mode: a failed attempt says why");
	unlike($down, qr/\t|\n(?!pepsi\/test-pgconn\[|\z)/, "$mode: each is one line, libpq's line breaks folded");

	# The server is back: set up afresh, its LISTEN included.
	$node->start;
	ok(poll_until(sub { since($log, $log_at) =~ /reconnected to the database $server/ }, 60),
		"$mode: reconnects when the server is back");
	ok(poll_until(sub { pids(since($out, $out_at)) >= 1 }), "$mode: and queries again");
	like(since($out, $out_at), qr/^setup 0: LISTEN$/m, "$mode: the set-up ran again");
	$node->safe_psql($db, "NOTIFY pgconn_test, 'two'");
	ok(poll_until(sub { since($out, $out_at) =~ /^notify pgconn_test two$/m }),
		"$mode: notifications arrive after the reconnect");
	# A statement in flight when the server ended the session fails with
	# it (its error lines come just before the "lost" line); none other.
	(my $failed = since($out)) =~ s/^(?:error \d+:.*\n(?:\n)?)+(?=lost )//mg;
	unlike($failed, qr/^error/m, "$mode: no statement failed but with its lost session");

	$driver->signal('TERM');
	eval { $driver->finish };
	note("$mode: the driver's log:\n" . since($log));
	unlike(since($log), qr/(?:AddressSanitizer|runtime error|Segmentation)/, "$mode: nothing crashed");
}

done_testing();
