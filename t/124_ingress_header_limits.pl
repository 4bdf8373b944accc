# No message can hold up pepsi-ingress's event loop by the size of its
# header section.  A header section over MAX_HEADER_FIELDS or
# MAX_HEADER_SIZE is counted as it arrives (DATA and BDAT) and refused with
# 552 5.3.4 naming the limit and its option; nothing of it is stored, and
# another client's transaction meanwhile is served.  A DKIM-Signature or
# ARC-Message-Signature whose h= names more than 128 fields, or that is
# longer than 16 KiB, fails verification (the message is still taken),
# and a message carrying one such with tens of thousands of names over as
# many fields does not make another session wait for it.

use strict;
use warnings FATAL => 'all';

use Digest::SHA qw(sha256_base64);
use File::Basename qw(dirname);
use IO::Select;
use IPC::Run;
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use PepsiTest;
use SmtpClient;
use TestDNS;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('header_limits', extension => 1);

sub run_ok
{
	my ($cmd, $in) = @_;
	my ($out, $err) = ('', '');

	IPC::Run::run($cmd, '<', \($in // ''), '>', \$out, '2>', \$err)
	  or die "@$cmd: $err";
	return $out;
}

run_ok([ 'openssl', 'genrsa', '-out', "$tmp/rsa.pem", '2048' ]);
my $rsa_public = encode_base64(
	run_ok([ 'openssl', 'rsa', '-in', "$tmp/rsa.pem", '-pubout', '-outform', 'DER' ]), '');

# The DMARC record of bomb.test never answers: its message waits for the
# DNS_MESSAGE_BUDGET, the window in which the other client must be served.
my $dns = TestDNS->new($tmp);
$dns->zone(<<"ZONE" . TestDNS::txt('sel._domainkey.signed.test.', "v=DKIM1; k=rsa; p=$rsa_public"));
1.0.0.127.in-addr.arpa. 300 IN PTR mx.client.test.
mx.client.test. 300 IN A 127.0.0.1
; silent _dmarc.bomb.test
ZONE

my %port = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } qw(mx small auth wide);
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
LOCAL_DOMAINS = example.org
DNS_FORWARDER = @{[ $dns->forwarder ]}
DNS_TIMEOUT = 2s
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 1
DNS_MESSAGE_BUDGET = 3s
[listener-mx]
ADDRESS = 127.0.0.1
PORT = $port{mx}
MIN_DATA_RATE = 0
[listener-small]
ADDRESS = 127.0.0.1
PORT = $port{small}
MAX_HEADER_FIELDS = 20
MAX_HEADER_SIZE = 2048
[listener-auth]
ADDRESS = 127.0.0.1
PORT = $port{auth}
MESSAGE_AUTHENTICATION = on
TRUSTED_MESSAGE_AUTHENTICATION = on
DMARC_POLICY = report
[listener-wide]
ADDRESS = 127.0.0.1
PORT = $port{wide}
MESSAGE_AUTHENTICATION = on
TRUSTED_MESSAGE_AUTHENTICATION = on
DMARC_POLICY = report
MAX_HEADER_FIELDS = 100000
MAX_HEADER_SIZE = 16M
MIN_DATA_RATE = 0
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 0 ready/), 'ingress starts');

sub rows { return $node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue'); }

sub begin_data
{
	my ($port, $from) = @_;
	my $c = SmtpClient->new($port);

	$c->command('EHLO mx.client.test');
	$c->command('MAIL FROM:<' . ($from // 'sender@client.test') . '>');
	$c->command('RCPT TO:<alice@example.org>');
	like($c->command('DATA'), qr/^354 /, "DATA on port $port");
	return $c;
}

# A whole transaction on its own connection; its final reply.
sub normal_transaction
{
	my ($port) = @_;
	my $c = begin_data($port);
	my $reply = $c->command("From: <sender\@client.test>\r\nSubject: normal\r\n\r\nbody\r\n.");

	$c->close;
	return $reply;
}

sub fields
{
	my ($n, $prefix) = @_;
	return join('', map { sprintf("%s-%06d: v\r\n", $prefix // 'X-Field', $_) } 1 .. $n);
}

#
# MAX_HEADER_FIELDS (default 1000), with DATA: 100,000 fields.  Another
# client, started after the bomb's DATA began, completes first.
#
my $before = rows();
my $bomb = begin_data($port{mx});
my $all = fields(100_000);
my $half = length($all) / 2;
$half = rindex($all, "\r\n", $half) + 2;
$bomb->send(substr($all, 0, $half));
like(normal_transaction($port{mx}), qr/^250 /,
	'meanwhile a client on another connection completes its transaction');
my $reply = $bomb->command(substr($all, $half) . "\r\nbody\r\n.");
like($reply, qr/^552 5\.3\.4 .*more than 1000 fields \(MAX_HEADER_FIELDS\)/,
	'a header section of 100,000 fields: 552 5.3.4 naming MAX_HEADER_FIELDS');
is(rows(), $before + 1, 'only the other client\'s message is stored');
$bomb->command('MAIL FROM:<sender@client.test>');
$bomb->command('RCPT TO:<alice@example.org>');
$bomb->command('DATA');
like($bomb->command(fields(1000) . "\r\n" . fields(5000) . "."), qr/^250 /,
	'1000 fields are taken, and field-like lines in the body do not count');
$bomb->close;
is(rows(), $before + 2, 'and stored');

#
# MAX_HEADER_SIZE (default 1 MiB): one field folded over 1,100 lines.
#
$before = rows();
my $c = begin_data($port{mx});
$reply = $c->command("Subject: long\r\n" . (" " . ("x" x 997) . "\r\n") x 1100 . "\r\nbody\r\n.");
like($reply, qr/^552 5\.3\.4 .*longer than 1048576 octets \(MAX_HEADER_SIZE\)/,
	'a header section over 1 MiB: 552 5.3.4 naming MAX_HEADER_SIZE');
$c->close;
is(rows(), $before, 'nothing is stored');

#
# The listener's own limits, and BDAT.
#
sub bdat
{
	my ($c, $chunk, $last) = @_;

	$c->send('BDAT ' . length($chunk) . ($last ? ' LAST' : '') . "\r\n$chunk");
	return $c->reply;
}

$before = rows();
$c = SmtpClient->new($port{small});
$c->command('EHLO mx.client.test');
$c->command('MAIL FROM:<sender@client.test>');
$c->command('RCPT TO:<alice@example.org>');
my $chunk = fields(15);
like(bdat($c, $chunk), qr/^250 /, 'BDAT: a first chunk of 15 fields');
$chunk = fields(6, 'X-More') . "\r\nbody\r\n";
like(bdat($c, $chunk, 1),
	qr/^552 5\.3\.4 .*more than 20 fields \(MAX_HEADER_FIELDS\)/,
	'BDAT: the 21st field in a later chunk: 552 naming MAX_HEADER_FIELDS = 20');
$c->command('MAIL FROM:<sender@client.test>');
$c->command('RCPT TO:<alice@example.org>');
$chunk = "Subject: " . ("y" x 900) . "\r\n" . "X-Long: " . ("z" x 900) . "\r\n" . "X-Over: " . ("w" x 300) . "\r\n\r\nbody\r\n";
like(bdat($c, $chunk, 1),
	qr/^552 5\.3\.4 .*longer than 2048 octets \(MAX_HEADER_SIZE\)/,
	'BDAT: a header section over MAX_HEADER_SIZE = 2048: 552');
$c->command('MAIL FROM:<sender@client.test>');
$c->command('RCPT TO:<alice@example.org>');
$chunk = fields(20) . "\r\n" . ("y" x 900 . "\r\n") x 5;
like(bdat($c, $chunk, 1), qr/^250 /,
	'BDAT: 20 fields and a body longer than MAX_HEADER_SIZE are taken');
$c->close;
is(rows(), $before + 1, 'only that one is stored');

#
# h= over 128 names fails verification; 128 verify.
#
sub row_auth
{
	my ($id) = @_;
	return decode_json($node->safe_psql($db, "SELECT state->'auth' FROM pepsi.workqueue WHERE id = $id"));
}

sub send_auth
{
	my ($port, $from, $message) = @_;
	my $c = begin_data($port, $from);
	my $reply = $c->command($message . ".");

	$c->close;
	my $id = queued_row($node, $reply);
	return ($reply, defined $id ? row_auth($id) : undef);
}

sub signed
{
	my ($names, $body) = @_;
	my $message = "From: <a\@signed.test>\r\nTo: <alice\@example.org>\r\nSubject: signed\r\n"
	  . fields($names - 3, 'X-Signed') . "\r\n" . ($body // "Hello.\r\n");

	return run_ok(
		[
			'/usr/bin/python3', '-c',
			'import sys, dkim; m = sys.stdin.buffer.read(); '
			  . 'k = open(sys.argv[1], "rb").read(); '
			  . 'h = [l.split(b":")[0].lower() for l in m.split(b"\r\n\r\n")[0].split(b"\r\n")]; '
			  . 'sys.stdout.buffer.write(dkim.sign(m, b"sel", b"signed.test", k, include_headers=h) + m)',
			"$tmp/rsa.pem"
		],
		$message);
}

my ($auth, $signed);
$signed = signed(128);
my ($h) = $signed =~ /[\s;]h=([^;]*);/s;
is(($h // "") =~ tr/://, 127, 'python3-dkim signs 128 names');
($reply, $auth) = send_auth($port{auth}, 'a@signed.test', $signed);
is($auth->{dkim}[0]{result}, 'pass', 'a DKIM-Signature whose h= names 128 fields passes');
$signed = signed(129);
($reply, $auth) = send_auth($port{auth}, 'a@signed.test', $signed);
like($reply, qr/^250 /, 'one naming 129 is taken');
is($auth->{dkim}[0]{result}, 'permerror', '... but its signature fails verification');
like($auth->{dkim}[0]{reason} // '', qr/h= names more than 128 fields/, '... saying why');

#
# The h= bomb: 30,000 fields, an ARC set and a DKIM-Signature whose h=
# name every one.  The message waits for its DMARC record (which never
# answers) meanwhile; another client started after its DATA completes
# first.
#
my $n = 30_000;
my $body = "Hello.\r\n";
my $names = join(':', map { sprintf('X-Bomb-%06d', $_) } 1 .. $n);
(my $folded = $names) =~ s/(.{900}[^:]*:)/$1\r\n\t/g;
my $bh = sha256_base64($body) . '=';
my $message =
	"ARC-Seal: i=1; a=rsa-sha256; cv=none; d=bomb.test; s=arc; b=AAAA\r\n"
  . "ARC-Message-Signature: i=1; a=rsa-sha256; c=relaxed/relaxed; d=bomb.test; s=arc;\r\n"
  . "\th=$folded;\r\n\tbh=$bh; b=AAAA\r\n"
  . "ARC-Authentication-Results: i=1; bomb.test; none\r\n"
  . "DKIM-Signature: v=1; a=rsa-sha256; c=relaxed/relaxed; d=bomb.test; s=dkim;\r\n"
  . "\th=$folded;\r\n\tbh=$bh; b=AAAA\r\n"
  . "From: <boss\@bomb.test>\r\nSubject: h= bomb\r\n"
  . fields($n, 'X-Bomb') . "\r\n$body";

$before = rows();
$bomb = begin_data($port{wide}, 'boss@bomb.test');
my $sent = time;
$bomb->send($message . ".\r\n");
like(normal_transaction($port{wide}), qr/^250 /, 'a client started after the h= bomb\'s DATA is served');
my $served = time - $sent;
ok(!IO::Select->new($bomb->{socket})->can_read(0), "before the h= bomb is answered (${served}s)");
$reply = $bomb->reply(60);
like($reply, qr/^250 /, 'the h= bomb is taken');
$auth = defined queued_row($node, $reply) ? row_auth(queued_row($node, $reply)) : {};
is($auth->{dkim}[0]{result}, 'permerror', 'its DKIM-Signature fails verification');
like($auth->{dkim}[0]{reason} // '', qr/too long|more than 128/, '... as too long');
is($auth->{arc}{result}, 'fail', 'its ARC chain fails');
like($auth->{arc}{reason} // '', qr/too long|more than 128/, '... as too long');
$bomb->close;
is(rows(), $before + 2, 'both messages are stored');

#
# A heavy message (64 KiB or more) is checked on a worker thread of its
# own: its signature passes there as a light one's does.  A client that
# leaves while its heavy message is being checked takes nothing down.
#
my $heavy = signed(128, ("Lorem ipsum dolor sit amet, consectetur adipiscing elit.\r\n" x 2000));
cmp_ok(length($heavy), '>', 65536, 'a signed message over 64 KiB');
($reply, $auth) = send_auth($port{auth}, 'a@signed.test', $heavy);
like($reply, qr/^250 /, 'it is taken');
is($auth->{dkim}[0]{result}, 'pass', '... and its DKIM-Signature passes');
for my $i (1 .. 5)
{
	my $gone = begin_data($port{auth}, 'a@signed.test');
	$gone->send($heavy . ".\r\n");
	$gone->close;
}
like(normal_transaction($port{auth}), qr/^250 /, 'after five clients left during their heavy messages\' checks, a message is taken');

$ingress->signal('TERM');
$ingress->finish;
done_testing();
