# The whole system, end to end: swaks -> pepsi-ingress -> pepsi-dispatch ->
# route -> relay-to-maildir (the file is the message sent plus the headers
# ingress and the Maildir delivery prepend) or relay-to-smarthost (Postfix's
# smtp-sink).  Then crash safety: a stream of 2,000 messages from four
# clients while pepsi-dispatch, a relay worker and pepsi-ingress are each
# killed with SIGKILL at random moments and restarted.  Every message that
# got a 250 must reach smtp-sink, none may stay in the queue; duplicates
# are counted and reported.

use strict;
use warnings FATAL => 'all';


use IPC::Run;
use Net::SMTP;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');

my $node = delivery_node('delivery_e2e');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
make_mailbox($root, 'alice@local.test');

my $sink = start_sink();
# CRASH_RETRY_DELAY: a row whose worker is killed under it is paused for
# a retry, 60 s by default, counted from the kill; the drain below is
# bounded by its progress, which such a pause would stall.
my $config = delivery_config($node, maildir_root => $root,
	smarthost => "127.0.0.1:$sink->{port}",
	dispatch => { CRASH_RETRY_DELAY => '1s' },
	extra => { smarthost => "PARALLELISM = 4\n", init => "PARALLELISM = 2\n" });
PostgreSQL::Test::Utils::append_to_file($config, <<"CONF");
[ingress]
AUTHSERV_ID = mx.pepsi.test
DISPATCH_WAKE_INTERVAL = 10ms
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
CONF

my $ingress_log = "$tmp/ingress.log";
my $ingress = start_ingress($config, $port, $ingress_log);
my $d = start_dispatcher($config);

sub swaks
{
	my (@args) = @_;
	my $out = '';

	IPC::Run::run([ 'swaks', '--server', "127.0.0.1:$port", '--ehlo', 'client.test', @args ],
		'<', \undef, '>', \$out, '2>&1', IPC::Run::timeout(60));
	return ($? >> 8, $out);
}

#
# swaks -> maildir: the file is the message as sent, after the prepended headers.
#
my $sent = "From: <sender\@local.test>\r\nTo: <alice\@local.test>\r\nSubject: end to end\r\n"
  . "Message-ID: <e2e-1\@client.test>\r\n\r\nHello Alice,\r\n.a line with a dot\r\n\r\nBye.";
# swaks ends the data with CRLF . CRLF: the last line gets its CRLF there.
PostgreSQL::Test::Utils::append_to_file("$tmp/e2e.eml", $sent);
$sent .= "\r\n";
my ($rc, $transcript) = swaks('--from', 'sender@local.test', '--to', 'alice@local.test',
	'--data', "$tmp/e2e.eml");
is($rc, 0, 'swaks: ingress accepts the message') or diag($transcript);
ok(poll_until(sub { scalar(maildir_files($root, 'alice@local.test')) == 1 }), 'it lands in alice\'s Maildir');
my $file = slurp((maildir_files($root, 'alice@local.test'))[0]);
my ($prepended, $rest) = $file =~ /\A((?:[A-Za-z-]+:.*\r\n(?:[ \t].*\r\n)*)*?)(From: <sender.*)\z/s;
is($rest, $sent, 'the file ends with the message sent, byte for byte');
like($prepended, qr/\AReturn-Path: <sender\@local\.test>\r\nDelivered-To: alice\@local\.test\r\nReceived: /,
	'after Return-Path, Delivered-To and ingress\'s Received');
like($prepended, qr/^Authentication-Results: mx\.pepsi\.test/m, 'and Authentication-Results');
ok(poll_until(sub { queue_count($node) == 0 }), 'nothing is left in the queue');

#
# swaks -> smtp-sink through the smarthost stage.
#
($rc, $transcript) = swaks('--from', 'sender@local.test', '--to', 'bob@remote.test',
	'--header', 'Subject: to the sink');
is($rc, 0, 'swaks: a remote message is accepted');
ok(poll_until(sub { grep { slurp($_) =~ /Subject: to the sink/ } glob("$sink->{dir}/mail/*") }),
	'smtp-sink receives it from the smarthost stage');
ok(poll_until(sub { queue_count($node) == 0 }), 'and its row is finished');

#
# Crash safety under a stream of 2,000 messages.
#
my $clients = 4;
my $per_client = 500;
my @children;
for my $c (1 .. $clients)
{
	my $pid = fork;
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open my $out, '>', "$tmp/accepted-$c" or die;
		$out->autoflush(1);
		my $smtp;
		my $deadline = time + 50;
		for my $i (1 .. $per_client)
		{
			my $token = "c${c}m$i";
			until ($smtp || time > $deadline)
			{
				$smtp = Net::SMTP->new("127.0.0.1:$port", Hello => 'client.test', Timeout => 10);
				usleep(20_000) unless $smtp;
			}
			last unless $smtp;
			my $ok = $smtp->mail('stream@local.test') && $smtp->to('user@remote.test')
			  && $smtp->data("Subject: crash $token\r\nMessage-ID: <$token\@client.test>\r\n\r\nbody $token\r\n");
			if ($ok && $smtp->code == 250) { print $out "$token\n" }
			else { $smtp->quit if $smtp; undef $smtp }
		}
		$smtp->quit if $smtp;
		close $out;
		POSIX::_exit(0);		# not exit: the END blocks would stop the cluster
	}
	push @children, $pid;
}

# Kill each component at random moments while the stream runs.
my %killed = (dispatcher => 0, worker => 0, ingress => 0);
my $started = time;
my @plan = map { [ $_, $started + 0.3 + rand(2.5) ] } qw(dispatcher worker ingress worker dispatcher ingress);
while (@plan)
{
	my ($what, $at) = @{ $plan[0] };
	usleep(20_000);
	next if time < $at;
	if ($what eq 'dispatcher')
	{
		kill 'KILL', $d->{pid};
		dispatcher_exit($d, 10);
		$d = start_dispatcher($config);
		$killed{dispatcher}++;
	}
	elsif ($what eq 'worker')
	{
		my @workers = worker_pids($d, 'relay-to-smarthost');
		if (!@workers) { $plan[0][1] += 0.1; next if time - $started < 20 }
		else { kill 'KILL', $workers[rand @workers]; $killed{worker}++ }
	}
	elsif ($what eq 'ingress')
	{
		kill 'KILL', $ingress->{pid};
		waitpid($ingress->{pid}, 0);
		$ingress = start_ingress($config, $port, $ingress_log);
		$killed{ingress}++;
	}
	shift @plan;
}
waitpid($_, 0) for @children;
ok($killed{dispatcher} >= 1 && $killed{worker} >= 1 && $killed{ingress} >= 1,
	"killed the dispatcher $killed{dispatcher}, a relay worker $killed{worker}, ingress $killed{ingress} times");

my %accepted;
for my $c (1 .. $clients)
{
	$accepted{$_} = 1 for split /\n/, slurp("$tmp/accepted-$c") // '';
}
my $accepted = scalar keys %accepted;
cmp_ok($accepted, '>', 1000, "$accepted of 2,000 messages got a 250 while components died");

# A row whose worker was killed under it is paused for a retry, and failed
# by the dispatcher once it has ended CRASH_LIMIT workers (a crash is how
# a poison message shows); the operator resumes those.  The drain's pace
# is the machine's: bounded by a stall, not by a total.
ok(poll_drained(sub { queue_count($node, "status IN ('pending', 'running', 'paused')") }),
	'the queue drains');
my $crashed = $node->safe_psql('postgres',
	"SELECT count(*) FROM pepsi.workqueue WHERE status = 'failed'"
	  . " AND state->>'dispatch_error' LIKE '%worker%'");
my $other = $node->safe_psql('postgres',
	"SELECT count(*) FROM pepsi.workqueue WHERE status <> 'failed'"
	  . " OR coalesce(state->>'dispatch_error', '') NOT LIKE '%worker%'");
is($other, 0, 'the only rows left are those failed under a killed worker');
diag("rows failed under a killed worker, resumed: $crashed");
$node->safe_psql('postgres',
	"SELECT pepsi.workqueue_resume(array_agg(id)) FROM pepsi.workqueue WHERE status = 'failed'")
  if $crashed > 0;
ok(poll_drained(sub { queue_count($node) }), 'none is left in the queue');

my %delivered;
for my $dump (glob("$sink->{dir}/mail/*"))
{
	my $text = slurp($dump) // '';
	$delivered{$1}++ while $text =~ /^Subject: crash (\S+)/mg;
}
my @lost = grep { !$delivered{$_} } sort keys %accepted;
is(scalar @lost, 0, 'every message that got a 250 reached smtp-sink')
  or diag("lost: @lost[0 .. ($#lost < 9 ? $#lost : 9)]");
my $duplicates = 0;
$duplicates += $_ - 1 for values %delivered;
my $unacknowledged = scalar grep { !$accepted{$_} } keys %delivered;
diag("delivered " . scalar(keys %delivered) . " distinct messages, $duplicates duplicates,"
	  . " $unacknowledged committed but unacknowledged (ingress died before its 250)");
cmp_ok($duplicates, '<=', 2 * ($killed{worker} + $killed{dispatcher}) * 4,
	'duplicates are bounded by the messages in flight at each kill');

stop_dispatcher($d);
kill 'TERM', $ingress->{pid};
waitpid($ingress->{pid}, 0);
stop_process($sink);
done_testing();
