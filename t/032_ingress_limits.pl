# pepsi-ingress's resource limits against real clients: a slowloris client
# (message content a byte at a time) is cut when its rate stays under
# MIN_DATA_RATE while a normal client is served; a session that keeps busy
# is cut at SESSION_DEADLINE; the content all sessions hold together is
# capped by MAX_MESSAGE_MEMORY (451 4.3.1, our trouble, so a 4xx).  Nothing
# of a cut or refused message is stored.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use PepsiTest;
use SmtpClient;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('limits', extension => 1);

my %port = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } qw(rate deadline memory);
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
LOCAL_DOMAINS = example.org
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 1
MAX_MESSAGE_MEMORY = 200000
[listener-rate]
ADDRESS = 127.0.0.1
PORT = $port{rate}
MIN_DATA_RATE = 1000
SESSION_DEADLINE = 0
[listener-deadline]
ADDRESS = 127.0.0.1
PORT = $port{deadline}
SESSION_DEADLINE = 3s
[listener-memory]
ADDRESS = 127.0.0.1
PORT = $port{memory}
MIN_DATA_RATE = 0
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 0 ready/), 'ingress starts');

sub rows { return $node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue'); }

sub begin_data
{
	my ($port) = @_;
	my $c = SmtpClient->new($port);

	$c->command('EHLO client.test');
	$c->command('MAIL FROM:<sender@client.test>');
	$c->command('RCPT TO:<alice@example.org>');
	like($c->command('DATA'), qr/^354 /, "DATA on port $port");
	return $c;
}

#
# Slowloris: content at a few octets a second.
#
my $before = rows();
# The clock starts before the session does, so that however late this
# process runs, the server's grace period (from its 354) is within it.
my $started = time;
my $slow = begin_data($port{rate});
my $content_started = time;
$slow->send("Subject: slow\r\n\r\n");
my $cut;
my $served = 0;
# (a deadline for a server that never cuts, not a measure)
while (time - $started < 60)
{
	$slow->send('x');
	if (!$served && time - $started > 2)
	{
		my $c = begin_data($port{rate});
		like($c->command("Subject: normal\r\n\r\nbody\r\n."), qr/^250 /,
			'meanwhile a normal client is served');
		$c->close;
		$served = 1;
	}
	my $rin = '';
	vec($rin, fileno($slow->{socket}), 1) = 1;
	if (select(my $rout = $rin, undef, undef, 0.3))
	{
		$cut = $slow->reply(5);
		last;
	}
}
my $elapsed = time - $started;
my $cut_seconds = time - $content_started;
like($cut // '', qr/^421 4\.4\.2 mx\.test Error: message content too slow/,
	'a client sending content under MIN_DATA_RATE is cut with 421 4.4.2');
cmp_ok($elapsed, '>=', 9, 'after the grace period, not before');
# Soon after it (within 10 s of the grace period's end): bench/timing.
note(sprintf('timing slow_content_cut_seconds %.3f', $cut_seconds));
is(rows(), $before + 1, 'only the normal message is stored');
ok(file_shows($log, qr/127\.0\.0\.1: message content too slow/), 'the cut is logged');

#
# A session that keeps busy is still cut at SESSION_DEADLINE.
#
my $busy = SmtpClient->new($port{deadline});
$busy->command('EHLO client.test');
$started = time;
my $reply = '';
# (a deadline for a server that never cuts, not a measure)
while (time - $started < 60)
{
	$reply = $busy->command('NOOP');
	last if $reply !~ /^250 /;
	usleep(300_000);
}
like($reply, qr/^421 4\.4\.2 mx\.test Error: session too long/,
	'a session busy with NOOPs is cut at SESSION_DEADLINE');
# Within a few seconds of it: bench/timing.
note(sprintf('timing session_deadline_cut_seconds %.3f', time - $started));

#
# MAX_MESSAGE_MEMORY: the content every session holds together.
#
$before = rows();
my $big = begin_data($port{memory});
$big->send("Subject: big\r\n\r\n" . ("y" x 78 . "\r\n") x 2300);    # about 184 KB, not ended
usleep(300_000);
my $small = begin_data($port{memory});
like($small->command("Subject: small\r\n\r\n" . ("z" x 78 . "\r\n") x 300 . "."),
	qr/^451 4\.3\.1 Insufficient system storage/, 'content past MAX_MESSAGE_MEMORY: 451 4.3.1');
like($big->command("."), qr/^250 /, 'the message holding the memory is stored');
$small->command('MAIL FROM:<sender@client.test>');
$small->command('RCPT TO:<alice@example.org>');
like($small->command('DATA'), qr/^354 /, 'once it is, DATA is taken again');
like($small->command("Subject: small\r\n\r\n" . ("z" x 78 . "\r\n") x 300 . "."),
	qr/^250 /, 'and the same message is stored');
is(rows(), $before + 2, 'the refused attempt stored nothing');
$big->close;
$small->close;

$ingress->signal('TERM');
$ingress->finish;
done_testing();
