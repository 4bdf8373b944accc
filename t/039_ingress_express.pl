# pepsi-ingress: a new client's message goes to the connection kept for
# new clients, ahead of the admissions queued, in a transaction of its
# own (admit.c); with BULK_NICE the pool's other sessions run at that nice
# value, the new clients' one at the server's priority.  While the new
# clients' connection stores, the others start no batch.
#
# With one pool connection, its first admission is held on a lock (LOCK
# TABLE pepsi.workqueue), so the next ones queue in ingress.  A client
# seen a moment before (127.0.0.1) queues two messages; then a new client
# (127.0.0.2) sends one, which goes out at once on the other connection
# and waits on the lock beside the held one.  Once the lock is released,
# the new client's row is inserted before the two queued ahead of it,
# and committed in a transaction of its own; the other two share one.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::Local qw(timegm);
use Time::HiRes qw(time);

use PepsiTest;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $node = pepsi_node('ingress_express', extension => 1,
	conf => "log_statement = 'all'\nlog_line_prefix = '%m [%p] xid=%x '\n");

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
# A long wake interval: the clients seen stay as they are for the test.
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 60s
DATABASE_CONNECTIONS = 1
BULK_NICE = 10
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
CONF
my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 0 ready/), 'ingress starts and connects to the database');

# swaks from $address, in the background: [harness, \stdout].
sub start_send
{
	my ($address, $subject) = @_;
	my $out = '';
	my $run = IPC::Run::start(
		[
			'swaks', '--server', "127.0.0.1:$port", '--local-interface', $address,
			'--ehlo', 'client.test', '--from', 'sender@example.net',
			'--to', 'rcpt@example.org', '--header', "Subject: $subject"
		],
		'>', \$out, '2>', \$out);
	return [ $run, \$out ];
}

sub accepted
{
	my ($send) = @_;
	$send->[0]->finish;
	return ${ $send->[1] } =~ /<[-~]  250 2\.0\.0 Ok: queued as [0-9A-Za-z]+/;
}

ok(accepted(start_send('127.0.0.1', 'seen')), 'the first client sends a message');

my ($lock_in, $lock_out) = ('', '');
my $lock = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr($db) ],
	'<', \$lock_in, '>', \$lock_out, '2>', \$lock_out);
$lock_in .= "BEGIN;\nLOCK TABLE pepsi.workqueue IN SHARE MODE;\nSELECT 'locked';\n";
$lock->pump until $lock_out =~ /locked/;

sub waiting_on_lock
{
	return $node->safe_psql($db,
		"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%workqueue_add%'");
}

# (At 10, or at the server's own nice value if that is higher: under a
# suite run with nice -n 19 both run at 19.)
my $bulk_nice = raised_nice(10, server_nice($node));
is(session_nices($node, $db, 'pepsi-ingress'), $bulk_nice, 'the pool\'s session runs at BULK_NICE');
is(session_nices($node, $db, 'pepsi-ingress-express'),
	server_nice($node), 'the new clients\' session at the server\'s priority');
SKIP:
{
	skip 'the kernel has no autogroups', 2 unless -e '/proc/self/autogroup';
	# Each backend is a session of its own: its autogroup takes the value too.
	ok(poll_until(sub { session_autogroup_nices($node, $db, 'pepsi-ingress') eq $bulk_nice }, 10),
		'and the pool\'s session\'s autogroup');
	is(session_autogroup_nices($node, $db, 'pepsi-ingress-express'), '0', 'the new clients\' not');
}

my $held = start_send('127.0.0.1', 'held');
ok(poll_until(sub { waiting_on_lock() == 1 }, 30), 'its next admission waits on the lock');
# The two queued in ingress (its one pool connection is busy), then the
# new client's.  Each is sent to its end (swaks has written the final
# dot, and waits for the reply that the held admission delays) before the
# next starts, so each is in the queue before the next.
sub sent_to_the_end
{
	my ($send) = @_;
	return poll_until(
		sub {
			$send->[0]->pump_nb;
			return ${ $send->[1] } =~ /^ -> \.\r?$/m;
		});
}
my @queued = map {
	my $s = start_send('127.0.0.1', "queued$_");
	ok(sent_to_the_end($s), "queued$_ is sent and waits for its reply");
	$s
} 1 .. 2;
is(waiting_on_lock(), 1, 'the known client\'s next two wait in ingress, not on a connection of their own');
my $new = start_send('127.0.0.2', 'new');
ok(poll_until(sub { waiting_on_lock() == 2 }, 30),
	'the new client\'s message goes out at once, on the new clients\' connection');
$lock_in .= "COMMIT;\n";
$lock->finish;

ok(accepted($held), 'the held message is accepted once the lock is gone');
ok(accepted($_), 'a queued message is accepted') for @queued;
ok(accepted($new), 'the new client\'s message is accepted');

my %row = map { my ($subject, $id, $xmin) = split /\|/; ($subject => { id => $id, xmin => $xmin }) }
  split /\n/, $node->safe_psql($db, q{
	SELECT substring(convert_from(headers, 'UTF8') FROM 'Subject: (\w+)'), id, xmin
	FROM pepsi.workqueue});
is(scalar(keys %row), 5, 'five rows are queued');
cmp_ok($row{new}{id}, '<', $row{queued1}{id}, 'the new client\'s row comes before the first queued ahead of it');
cmp_ok($row{new}{id}, '<', $row{queued2}{id}, 'and the second');
isnt($row{new}{xmin}, $row{queued1}{xmin}, 'in a transaction of its own');
is($row{queued1}{xmin}, $row{queued2}{xmin}, 'the two queued ones share one');

# A new client's batch carries the dispatcher's wake in its own
# transaction (dbconn_start_batch), unless the last wake was less than a
# tenth of the interval ago: 6 s here.  Wait until the last wake the
# server logged is that old, and a second more, reading the log again at
# each poll: a wake still owed for the commits above (the timer's, up to
# 6 s after the one before) moves the wait on, as it would move ingress's.
sub last_wake
{
	my @wakes = PostgreSQL::Test::Utils::slurp_file($node->logfile)
	  =~ /^(\S+ \S+ \S+) \[\d+\] xid=\d+ LOG:  execute <unnamed>: SELECT pepsi\.notify_workqueue\(\)/mg;
	return 0 unless @wakes;
	# (The server logs in UTC here; another zone is left to the server to read.)
	return timegm(0, $5, $4, $3, $2 - 1, $1) + $6
	  if $wakes[-1] =~ /^(\d+)-(\d+)-(\d+) (\d+):(\d+):(\d+(?:\.\d+)?) UTC$/;
	return $node->safe_psql($db, "SELECT extract(epoch FROM '$wakes[-1]'::timestamptz)");
}
ok(poll_until(sub { time > last_wake() + 7 }, 40), 'no wake for 7 s: none is owed');
my $offset = -s $node->logfile;
ok(accepted(start_send('127.0.0.3', 'carried')), 'a third new client\'s message is accepted');
my $xmin = $node->safe_psql($db,
	q{SELECT xmin FROM pepsi.workqueue WHERE convert_from(headers, 'UTF8') LIKE '%Subject: carried%'});
ok(poll_until(sub { log_since($node, $offset) =~ /xid=$xmin LOG:  execute <unnamed>: SELECT pepsi\.notify_workqueue\(\)/ },
		10),
	'its wake is in the transaction that inserted its row')
  or diag("xmin $xmin:\n" . log_since($node, $offset));

# While the new clients' connection stores, the pool's others start no
# batch: a known client's message waits in ingress until the new client's
# transaction is done, and is stored after it.  The table is locked again:
# a new client's message waits on the lock on its connection; the known
# client's, sent to its end, must not go out on the idle pool connection.
$lock = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr($db) ],
	'<', \$lock_in, '>', \$lock_out, '2>', \$lock_out);
($lock_in, $lock_out) = ("BEGIN;\nLOCK TABLE pepsi.workqueue IN SHARE MODE;\nSELECT 'locked';\n", '');
$lock->pump until $lock_out =~ /locked/;
my $first = start_send('127.0.0.4', 'first');
ok(poll_until(sub { waiting_on_lock() == 1 }, 30), 'a new client\'s message waits on the lock');
my $after = start_send('127.0.0.1', 'after');
ok(sent_to_the_end($after), 'a known client\'s message is sent and waits for its reply');
# Absence can only be seen for a while: two seconds of polls.
ok(!poll_until(sub { waiting_on_lock() > 1 }, 2), 'and is not sent to the database while the new client\'s is stored');
$lock_in .= "COMMIT;\n";
$lock->finish;
ok(accepted($first), 'the new client\'s message is accepted');
ok(accepted($after), 'then the known client\'s');
my %late = map { my ($subject, $id) = split /\|/; ($subject => $id) }
  split /\n/, $node->safe_psql($db, q{
	SELECT substring(convert_from(headers, 'UTF8') FROM 'Subject: (\w+)'), id
	FROM pepsi.workqueue WHERE convert_from(headers, 'UTF8') ~ 'Subject: (first|after)'});
cmp_ok($late{first}, '<', $late{after}, 'stored in that order');

# The wait is bounded (admit_waits_for_express): a known client's message
# waits only for the new clients' transaction that was in flight when it
# was queued, never for one sent after it, and while the new clients'
# connection is busy the pool's connection takes new clients' messages
# too.  The table is locked once more.  A known client's message (k1)
# goes out on the pool connection and waits on the lock; a second (k2)
# queues in ingress behind it; then a new client's (n1) goes out on the
# express connection and waits on the lock too: it was sent after k2 was
# queued, so k2 must not wait for it.  k1's backend is cancelled (its
# sender gets a refusal and may retry): the pool connection is free, and
# k2 goes out on it while n1 is still being stored.  Then a second new
# client's (n2), with the express connection still busy, goes out on the
# pool connection once k2's is done, not later.
$lock = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr($db) ],
	'<', \$lock_in, '>', \$lock_out, '2>', \$lock_out);
($lock_in, $lock_out) = ("BEGIN;\nLOCK TABLE pepsi.workqueue IN SHARE MODE;\nSELECT 'locked';\n", '');
$lock->pump until $lock_out =~ /locked/;
sub waiting_from
{
	my ($application) = @_;
	return $node->safe_psql($db, qq{
		SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND query LIKE '%workqueue_add%' AND application_name = '$application'});
}
my $k1 = start_send('127.0.0.1', 'kone');
ok(poll_until(sub { waiting_from('pepsi-ingress') == 1 }, 30), 'a known client\'s message waits on the lock on the pool connection');
my $k2 = start_send('127.0.0.1', 'ktwo');
ok(sent_to_the_end($k2), 'a second waits in ingress behind it');
my $n1 = start_send('127.0.0.5', 'none');
ok(poll_until(sub { waiting_from('pepsi-ingress-express') == 1 }, 30),
	'a new client\'s message then waits on the lock on the express connection');
is($node->safe_psql($db, q{
	SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity
	WHERE wait_event_type = 'Lock' AND query LIKE '%workqueue_add%' AND application_name = 'pepsi-ingress'}),
	'1', 'the known client\'s first admission is cancelled');
ok(!accepted($k1), 'and its sender is not told it was queued');
ok(poll_until(sub { waiting_from('pepsi-ingress') == 1 }, 30),
	'the second goes out on the pool connection while the new client\'s is stored: it was queued before that one was sent');
is(waiting_from('pepsi-ingress-express'), '1', 'the new client\'s is still waiting');
$lock_in .= "COMMIT;\n";
$lock->finish;
ok(accepted($k2), 'the second known message is accepted');
ok(accepted($n1), 'the new client\'s message is accepted');

# The express connection busy, a second new client's message goes out on
# the idle pool connection rather than waiting for it.
$lock = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr($db) ],
	'<', \$lock_in, '>', \$lock_out, '2>', \$lock_out);
($lock_in, $lock_out) = ("BEGIN;\nLOCK TABLE pepsi.workqueue IN SHARE MODE;\nSELECT 'locked';\n", '');
$lock->pump until $lock_out =~ /locked/;
my $n2 = start_send('127.0.0.6', 'ntwo');
ok(poll_until(sub { waiting_from('pepsi-ingress-express') == 1 }, 30), 'a new client\'s message waits on the express connection');
my $n3 = start_send('127.0.0.7', 'nthree');
ok(poll_until(sub { waiting_from('pepsi-ingress') == 1 }, 30),
	'another new client\'s goes out on the idle pool connection meanwhile');
$lock_in .= "COMMIT;\n";
$lock->finish;
ok(accepted($n2), 'the first is accepted');
ok(accepted($n3), 'and the second');

# The known clients' open pipeline waits, after a commit, for the sessions
# that commit answered to come back with their next message (admit.c,
# admit_gather), but only for a bounded while: a session that quits, or
# never sends again, must not hold the next batch back.  A known client's
# message (gone) waits on the lock on the pool connection, a second
# (stays) waits in ingress behind it.  Once the lock is gone, gone's
# commit answers it and its sender quits: it never comes back, and stays'
# batch, open on the pool connection, must commit when the wait is up
# (at most ADMIT_GATHER_MAX), with nothing else happening in ingress to
# move it on.
$lock = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr($db) ],
	'<', \$lock_in, '>', \$lock_out, '2>', \$lock_out);
($lock_in, $lock_out) = ("BEGIN;\nLOCK TABLE pepsi.workqueue IN SHARE MODE;\nSELECT 'locked';\n", '');
$lock->pump until $lock_out =~ /locked/;
my $gone = start_send('127.0.0.1', 'gone');
ok(poll_until(sub { waiting_from('pepsi-ingress') == 1 }, 30), 'a known client\'s message waits on the lock');
my $stays = start_send('127.0.0.1', 'stays');
ok(sent_to_the_end($stays), 'a second known client\'s waits in ingress behind it');
$lock_in .= "COMMIT;\n";
$lock->finish;
ok(accepted($gone), 'the first is accepted, and its sender quits');
ok(accepted($stays), 'the second is accepted, though the session the commit before answered never comes back');
my %gathered = map { my ($subject, $xmin) = split /\|/; ($subject => $xmin) }
  split /\n/, $node->safe_psql($db, q{
	SELECT substring(convert_from(headers, 'UTF8') FROM 'Subject: (\w+)'), xmin
	FROM pepsi.workqueue WHERE convert_from(headers, 'UTF8') ~ 'Subject: (gone|stays)'});
isnt($gathered{stays}, $gathered{gone}, 'in a transaction after the first\'s: the open batch committed on its own');

$ingress->signal('TERM');
$ingress->finish;
done_testing();
