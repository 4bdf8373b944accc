# pepsi-ingress and REQUIRETLS (RFC 8689): offered in EHLO only on a TLS
# session; MAIL FROM ... REQUIRETLS on a session in clear is refused
# (530 5.7.10) and nothing is stored; under STARTTLS it is accepted and the
# stored row carries state.origin.requiretls, which the relays honour
# (t/105_delivery_content.pl); a message without it, or after RSET, does
# not carry it; a repeated or valued REQUIRETLS is a syntax error.  The TLS
# client is IO::Socket::SSL (t/lib/SmtpClient.pm), and swaks for a message
# without the parameter.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;
use SmtpClient;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('ingress_requiretls', extension => 1);

self_signed_certificate($tmp, 'mx.test');

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 1
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
CERTIFICATE = $tmp/cert.pem
KEY = $tmp/key.pem
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection \d+ ready/), 'ingress starts');

sub rows { return $node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue') }

sub requiretls_of
{
	my ($id) = @_;

	return $node->safe_psql($db,
		"SELECT coalesce(state->'origin'->>'requiretls', 'absent') FROM pepsi.workqueue WHERE id = $id");
}

# Send one message on an open session; the id it was queued as.
sub send_message
{
	my ($c, $mail, $subject) = @_;

	like($c->command($mail), qr/^250 /, "$subject: MAIL accepted");
	like($c->command('RCPT TO:<a@example.net>'), qr/^250 /, "$subject: RCPT accepted");
	like($c->command('DATA'), qr/^354 /, "$subject: DATA");
	my $reply = $c->command("Subject: $subject\r\n\r\nhello\r\n.");
	like($reply, qr/^250 2\.0\.0 Ok: queued as [0-9A-Za-z]+/, "$subject: queued");
	return queued_row($node, $reply) // -1;
}

# In clear: not offered, and refused.
{
	my $c = SmtpClient->new($port);
	my $ehlo = $c->command('EHLO client.test');
	like($ehlo, qr/^250-STARTTLS\r$/m, 'in clear: STARTTLS offered');
	unlike($ehlo, qr/REQUIRETLS/, 'REQUIRETLS is not');
	my $before = rows();
	like($c->command('MAIL FROM:<b@example.org> REQUIRETLS'), qr/^530 5\.7\.10 /,
		'MAIL FROM with REQUIRETLS in clear: 530 5.7.10');
	like($c->command('RCPT TO:<a@example.net>'), qr/^503 /, 'no transaction began');
	$c->close;
	is(rows(), $before, 'nothing stored');
}

# Under STARTTLS: offered, accepted, stored in the row's state.
{
	my $c = SmtpClient->new($port);
	$c->command('EHLO client.test');
	ok($c->starttls('client.test'), 'STARTTLS and EHLO again');
	my $ehlo = $c->command('EHLO client.test');
	like($ehlo, qr/^250-REQUIRETLS\r$/m, 'under TLS, EHLO offers REQUIRETLS');
	my $id = send_message($c, 'MAIL FROM:<b@example.org> REQUIRETLS', 'requiretls');
	is(requiretls_of($id), 'true', 'the row carries state.origin.requiretls = true');

	my $plain = send_message($c, 'MAIL FROM:<b@example.org>', 'same session, without it');
	is(requiretls_of($plain), 'absent', 'the next transaction without it does not carry it');

	like($c->command('MAIL FROM:<b@example.org> REQUIRETLS'), qr/^250 /, 'REQUIRETLS, then RSET');
	like($c->command('RSET'), qr/^250 /, 'RSET');
	my $after_rset = send_message($c, 'MAIL FROM:<b@example.org>', 'after RSET');
	is(requiretls_of($after_rset), 'absent', 'RSET forgot it');

	like($c->command('MAIL FROM:<b@example.org> REQUIRETLS REQUIRETLS'), qr/^501 5\.5\.4 /,
		'REQUIRETLS twice: 501 5.5.4');
	like($c->command('MAIL FROM:<b@example.org> REQUIRETLS=YES'), qr/^501 5\.5\.4 /,
		'REQUIRETLS with a value: 501 5.5.4');
	$c->close;
}

# swaks over STARTTLS, no REQUIRETLS: an ordinary message.
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'swaks', '--server', '127.0.0.1', '--port', $port, '--ehlo', 'client.test', '-tls',
			'--from', 'b@example.org', '--to', 'a@example.net' ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	my $id = "$out$err" =~ /<[-~]  (250 2\.0\.0 Ok: queued as [0-9A-Za-z]+)/ ? queued_row($node, $1) : undef;
	ok(defined $id, 'swaks -tls: queued') or diag("$out$err");
	like("$out$err", qr/<~  250-REQUIRETLS/, 'swaks saw REQUIRETLS offered under TLS');
	is(requiretls_of($id // 0), 'absent', 'a message sent without REQUIRETLS does not carry it');
}

$ingress->kill_kill;
done_testing();
