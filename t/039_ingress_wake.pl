# pepsi-ingress: when its commits wake the dispatcher (admit.c,
# ADMIT_WAKE_CLIENTS).  The wakes are the SELECT pepsi.notify_workqueue()
# statements in the server's log, next to the admissions.
#
# With DISPATCH_WAKE_INTERVAL = 12s: a lone message wakes the dispatcher at
# once, not at the interval's end; a second message of the same client
# within the interval does not wake it again at once; a message of
# another client does (a light sender's message during a burst), and that
# wake covers the second message too, so no wake is left for the interval's
# end.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use Time::Local qw(timegm);

use PepsiTest;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $node = pepsi_node('ingress_wake', extension => 1, conf => "log_statement = 'all'\nlog_timezone = 'UTC'\n");

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 12s
DATABASE_CONNECTIONS = 1
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
CONF
my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 0 ready/), 'ingress starts and connects to the database');

# Admissions and wakes in the server log from $offset on: [kind, epoch seconds].
sub events_since
{
	my ($offset) = @_;
	my @events;

	for my $line (split /\n/, log_since($node, $offset))
	{
		next
		  unless $line =~ /^(\d+)-(\d+)-(\d+) (\d+):(\d+):(\d+\.\d+) UTC .*(pepsi_ingress_admit:|pepsi\.notify_workqueue\(\))/;
		my $at = timegm(0, $5, $4, $3, $2 - 1, $1) + $6;
		push @events, [ $7 =~ /notify/ ? 'wake' : 'admit', $at ];
	}
	return @events;
}

sub send_from
{
	my ($address, $subject) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[
			'swaks', '--server', "127.0.0.1:$port", '--local-interface', $address,
			'--ehlo', 'client.test', '--from', 'sender@example.net',
			'--to', 'rcpt@example.org', '--header', "Subject: $subject"
		],
		'>', \$out, '2>', \$err);
	return $out =~ /<[-~]  250 2\.0\.0 Ok: queued as [0-9A-Za-z]+/;
}

my $offset = -s $node->logfile;
ok(send_from('127.0.0.1', 'first'), 'a lone message is accepted');
ok(poll_until(sub { grep { $_->[0] eq 'wake' } events_since($offset) }, 3),
	'it wakes the dispatcher');
my @events = events_since($offset);
my ($admit) = grep { $_->[0] eq 'admit' } @events;
my ($wake) = grep { $_->[0] eq 'wake' } @events;
# (A wake left for the interval's end would come up to 12 s later; how
# soon it comes: bench/timing.)  The interval is long enough for the
# steps below to come within it on a loaded machine: the second message's
# wake is owed at its end, 12 s after this wake.
cmp_ok($wake->[1] - $admit->[1], '<', 6,
	'at once after its commit, not at the end of the 12 s interval');
my $interval_end = $wake->[1] + 12;
note(sprintf('timing ingress_wake_lone_seconds %.3f', $wake->[1] - $admit->[1]));

$offset = -s $node->logfile;
ok(send_from('127.0.0.1', 'second'), 'a second message of the same client is accepted');
# (A wake it caused at once would show within the 1.5 s polled for.)
ok(!poll_until(sub { grep { $_->[0] eq 'wake' } events_since($offset) }, 1.5),
	'within the interval it does not wake the dispatcher at once');

ok(send_from('127.0.0.2', 'third'), 'a message of another client is accepted');
ok(poll_until(sub { grep { $_->[0] eq 'wake' } events_since($offset) }, 3),
	'the other client wakes the dispatcher');
@events = events_since($offset);
my @admits = grep { $_->[0] eq 'admit' } @events;
($wake) = grep { $_->[0] eq 'wake' } @events;
is(scalar @admits, 2, 'both admissions are in the log');
cmp_ok($wake->[1] - $admits[1][1], '<', 6, 'at once after its commit');
note(sprintf('timing ingress_wake_new_client_seconds %.3f', $wake->[1] - $admits[1][1]));
# A wake still owed for the second message would come at the end of the
# interval: poll until a second wake, or a moment past that end.
poll_until(sub { grep({ $_->[0] eq 'wake' } events_since($offset)) > 1 || time > $interval_end + 0.5 }, 20);
is(scalar(grep { $_->[0] eq 'wake' } events_since($offset)),
	1, 'and that wake covered the second message: none is left for the interval\'s end');
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.workqueue WHERE status = 'pending'"),
	3, 'the three messages are queued');

$ingress->signal('TERM');
$ingress->finish;
done_testing();
