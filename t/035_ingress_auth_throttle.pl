# SMTP AUTH off the event loop, and failed AUTH throttled per client.
#
# A password whose hash takes a second to compute (SHA-crypt, a million
# rounds) is checked while another client is served: its NOOP is answered
# while the AUTH is still being hashed, which a check on the event loop
# could not do.  Then AUTH_FAILURE_LIMIT = 3 from one address: two 535s,
# the third failure closes the session with 421, and AUTH from that
# address gets 454 (even with the right password) while other addresses
# authenticate as before.  An IPv6 client is counted by its /64.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IO::Select;
use IO::Socket::IP;
use IPC::Run;
use MIME::Base64 qw(encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;
use SmtpClient;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('auth_throttle', extension => 1);

self_signed_certificate($tmp, 'mx.test');
my $alice = crypt('correct horse', '$6$pepsitest$');
my $slow = crypt('slow horse', '$6$rounds=1000000$pepsislow$');
PostgreSQL::Test::Utils::append_to_file("$tmp/credentials", "alice:$alice\nslow:$slow\n");
chmod 0600, "$tmp/credentials" or die "chmod: $!";

my $have_ipv6 = eval {
	my $s = IO::Socket::IP->new(LocalHost => '::1', Listen => 1, Proto => 'tcp');
	$s ? ($s->close, 1) : 0;
};
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $port6 = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
CREDENTIALS = $tmp/credentials
DATABASE_CONNECTIONS = 1
AUTH_FAILURE_LIMIT = 3
AUTH_FAILURE_DELAY = 100ms
AUTH_FAILURE_WINDOW = 1h
[listener-submission]
MODE = submission
ADDRESS = 127.0.0.1
PORT = $port
CERTIFICATE = $tmp/cert.pem
KEY = $tmp/key.pem
MAX_ERRORS = 100
CONF
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF") if $have_ipv6;
[listener-six]
MODE = submission
ADDRESS = ::1
PORT = $port6
CERTIFICATE = $tmp/cert.pem
KEY = $tmp/key.pem
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection \d+ ready/), 'ingress starts');

sub client
{
	my ($from, %opts) = @_;
	my $c = SmtpClient->new($opts{port} // $port, from => $from, ($opts{to} ? (to => $opts{to}) : ()));

	$c->command('EHLO client.test');
	$c->starttls('client.test') or die 'STARTTLS failed';
	return $c;
}

sub plain
{
	my ($user, $password) = @_;

	return 'AUTH PLAIN ' . encode_base64("\0$user\0$password", '');
}

# The event loop goes on while a slow hash is computed.
my $hashing = client('127.0.0.1');
my $other = client('127.0.0.1');
$hashing->send(plain('slow', 'slow horse') . "\r\n");
like($other->command('NOOP'), qr/^250 /, 'another session is answered meanwhile');
my $pending = IO::Select->new($hashing->{socket});
ok(!$pending->can_read(0), 'while the slow AUTH is still being checked');
like($hashing->reply(60), qr/^235 /, 'and then the slow password is accepted');
like($other->command(plain('alice', 'correct horse')), qr/^235 /, 'alice authenticates');
$_->close for $hashing, $other;

# Three failures from 127.0.0.2: 535, 535, then 421 and the session closed.
my $guesser = client('127.0.0.2');
like($guesser->command(plain('alice', 'guess 1')), qr/^535 5\.7\.8 /, 'first failure: 535');
like($guesser->command(plain('nobody', 'guess 2')), qr/^535 5\.7\.8 /, 'second failure (an unknown user): 535');
like($guesser->command(plain('alice', 'guess 3')), qr/^421 4\.7\.0 .*failed authentications/,
	'third failure: 421, too many failed authentications');
is($guesser->reply(10), '', 'and the session is closed');
ok(file_shows($log, qr/127\.0\.0\.2: authentication failed \(3 from 127\.0\.0\.2: closing/),
	'the log counts the failures per client');

# That address may no longer try, not even with the right password.
$guesser = client('127.0.0.2');
like($guesser->command(plain('alice', 'correct horse')), qr/^454 4\.7\.0 /,
	'a new session from the same address: AUTH gets 454');
like($guesser->command('NOOP'), qr/^250 /, 'the session itself goes on');
$guesser->close;
ok(file_shows($log, qr/127\.0\.0\.2: AUTH refused: too many failed authentications/),
	'the refusal is logged');

# Another address is not affected.
my $neighbour = client('127.0.0.3');
like($neighbour->command(plain('alice', 'wrong')), qr/^535 /, 'another address: a failure is a 535');
like($neighbour->command(plain('alice', 'correct horse')), qr/^235 /, 'and it may authenticate');
$neighbour->close;

SKIP:
{
	skip 'no IPv6 loopback', 2 unless $have_ipv6;
	my $six = client('::1', port => $port6, to => '::1');
	like($six->command(plain('alice', 'guess')), qr/^535 /, 'IPv6: a failure');
	ok(file_shows($log, qr/::1: authentication failed \(1 from ::\/64\)/),
		'is counted against the client\'s /64');
	$six->close;
}

$ingress->signal('TERM');
$ingress->finish;
done_testing();
