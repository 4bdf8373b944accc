# pepsi-ingress: the known clients' gathered commits (admit.c,
# admit_gather).  A second gathered batch commits while the first is in
# flight, so its commit waits behind the first's flush rather than being
# sent after it; a third batch gathers meanwhile, and commits once one of
# the two completes.  A connection lost with its commit in flight answers
# its sessions with a temporary error and stores nothing of theirs, beside
# a batch that commits; nothing acknowledged is lost.
#
# The table is locked (LOCK TABLE pepsi.workqueue IN SHARE MODE), so each
# admission's call waits on the lock on its connection.  A known client
# (127.0.0.1, seen a moment before) sends four messages one after the
# other: the first's batch commits at once (no gathered commit is in
# flight), the second's as well (one is, and no session it answered is
# awaited), the third opens a batch that gathers while two are in flight,
# and the fourth joins it.  So once the lock is gone the first and second
# are each in a transaction of their own and the third and fourth share
# one (with one gathered commit at a time, the second, third and fourth
# would share one).

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $node = pepsi_node('ingress_gathered', extension => 1);

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
# A long wake interval: the client seen stays known for the test.
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 60s
DATABASE_CONNECTIONS = 4
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
CONF
my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 3 ready/), 'ingress starts and connects to the database');

# swaks from 127.0.0.1, in the background: [harness, \stdout].
sub start_send
{
	my ($subject) = @_;
	my $out = '';
	my $run = IPC::Run::start(
		[
			'swaks', '--server', "127.0.0.1:$port", '--local-interface', '127.0.0.1',
			'--ehlo', 'client.test', '--from', 'sender@example.net',
			'--to', 'rcpt@example.org', '--header', "Subject: $subject"
		],
		'>', \$out, '2>', \$out);
	return [ $run, \$out ];
}

# The reply to the final dot: its code.
sub reply
{
	my ($send) = @_;
	$send->[0]->finish;
	return ${ $send->[1] } =~ /^ [-~]> \.\r?\n<\S*\s+(\d{3})[ -]/m ? $1 : ${ $send->[1] };
}

# Sent to its end: swaks has written the final dot and waits for the reply.
sub sent_to_the_end
{
	my ($send) = @_;
	return poll_until(
		sub {
			$send->[0]->pump_nb;
			return ${ $send->[1] } =~ /^ -> \.\r?$/m;
		});
}

# The pool's admission calls waiting on the lock, oldest first: their pids.
sub waiting
{
	return grep { length } split /\n/, $node->safe_psql($db, q{
		SELECT pid FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND application_name = 'pepsi-ingress'
		  AND query LIKE '%workqueue_add%'
		ORDER BY query_start});
}

sub lock_table
{
	my $lock = $node->background_psql($db);
	$lock->query_safe('BEGIN; LOCK TABLE pepsi.workqueue IN SHARE MODE');
	return sub { $lock->query_safe('COMMIT'); $lock->quit; };
}

# subject => xmin of the rows whose subject matches.
sub rows
{
	my ($pattern) = @_;
	return map { split /\|/ } split /\n/, $node->safe_psql($db, qq{
		SELECT substring(convert_from(headers, 'UTF8') FROM 'Subject: (\\w+)'), xmin
		FROM pepsi.workqueue WHERE convert_from(headers, 'UTF8') ~ 'Subject: ($pattern)\\M'});
}

is(reply(start_send('seen')), '250', 'the client sends a first message (a new client\'s, stored at once)');

my $unlock = lock_table();
my @sends;
for my $n (1 .. 4)
{
	my $subject = (qw(first second third fourth))[ $n - 1 ];
	push @sends, start_send($subject);
	ok(sent_to_the_end($sends[-1]), "$subject is sent and waits for its reply");
	ok(poll_until(sub { scalar(waiting()) == ($n < 4 ? $n : 3) }, 30),
		$n < 4 ? "$subject\'s call waits on the lock on a connection of its own" : 'fourth joins the third\'s batch')
	  or diag(join ' ', waiting());
}
$unlock->();
is(reply($_), '250', 'a message is accepted once the lock is gone') for @sends;
my %xmin = rows('first|second|third|fourth');
is(scalar(keys %xmin), 4, 'four rows are stored');
isnt($xmin{first}, $xmin{second}, 'the first and second commit apart: two gathered commits in flight');
isnt($xmin{second}, $xmin{third}, 'the third does not join the second');
is($xmin{third}, $xmin{fourth}, 'the third and fourth gathered while two were in flight, and share one');

# Two gathered commits in flight, a third batch gathering: the two
# connections carrying the commits are lost (their backends terminated).
# Their sessions are told to try again and nothing of theirs is stored;
# the third batch commits once the lock is gone.
$unlock = lock_table();
@sends = ();
for my $subject (qw(lostA lostB kept))
{
	push @sends, start_send($subject);
	ok(sent_to_the_end($sends[-1]), "$subject is sent and waits for its reply");
	ok(poll_until(sub { scalar(waiting()) == @sends }, 30), "$subject\'s call waits on the lock");
}
my @pids = waiting();
is($node->safe_psql($db, "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM unnest('{$pids[0],$pids[1]}'::int[]) pid) t"),
	2, 'the two connections committing are cut off');
like(reply($sends[0]), qr/^4\d\d$/, 'the first lost batch\'s session is told to try again');
like(reply($sends[1]), qr/^4\d\d$/, 'and the second\'s');
$unlock->();
is(reply($sends[2]), '250', 'the gathering batch commits once the lock is gone');
my %lost = rows('lostA|lostB|kept');
is_deeply([ sort keys %lost ], ['kept'], 'only the acknowledged message is stored');
is(reply(start_send('after')), '250', 'the pool takes messages again');
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue'), 7, 'every acknowledged message is stored, and no other');

$ingress->signal('TERM');
$ingress->finish;
done_testing();
