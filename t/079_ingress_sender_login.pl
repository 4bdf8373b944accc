# pepsi-ingress binds senders to their login (SENDER_LOGIN_MAPS, file and
# sql sources): an authenticated user sending as an address that is not
# its account's gets 553 5.7.1 at MAIL FROM, or at the end of DATA for a
# From: that is not; and its send limits (SEND_LIMIT_MESSAGES), counted in
# pepsi.send_count so that every ingress host shares them, give 450 4.7.1
# at RCPT once spent.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
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

my $node = pepsi_node('ingress_sender_login', extension => 1);
$node->safe_psql($db, "INSERT INTO pepsi.sender_login (address, account) VALUES ('alias\@local.test', 'alice')");

self_signed_certificate($tmp, 'mx.test');
my $hash = crypt('correct horse', '$6$pepsitest$');
PostgreSQL::Test::Utils::append_to_file("$tmp/credentials", "alice:$hash\nbob:$hash\n");
chmod 0600, "$tmp/credentials" or die "chmod: $!";
PostgreSQL::Test::Utils::append_to_file("$tmp/logins",
	"# address account[,account...]\nalice\@local.test alice\n\@alice.test alice\nshared\@local.test alice,bob\n");

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
LOCAL_DOMAINS = local.test
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
CREDENTIALS = $tmp/credentials
DATABASE_CONNECTIONS = 1
DISPATCH_WAKE_INTERVAL = 20ms
SENDER_LOGIN_MAPS = file:$tmp/logins, sql
SEND_LIMIT_MESSAGES = 3
[listener-submission]
MODE = submission
ADDRESS = 127.0.0.1
PORT = $port
CERTIFICATE = $tmp/cert.pem
KEY = $tmp/key.pem
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-v', '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 1 ready/), 'ingress starts');

sub login
{
	my ($user) = @_;
	my $c = SmtpClient->new($port, from => '127.0.0.2');

	$c->command('EHLO client.test');
	$c->starttls('client.test') or die 'STARTTLS failed';
	$c->command('AUTH PLAIN ' . encode_base64("\0$user\0correct horse", '')) =~ /^235 /
	  or die "AUTH as $user failed";
	return $c;
}

my $alice = login('alice');
like($alice->command('MAIL FROM:<alice@local.test>'), qr/^250 /, 'alice sends as her address (file)');
$alice->command('RSET');
like($alice->command('MAIL FROM:<Someone@Alice.Test>'), qr/^250 /, '... as any address of her domain (file, @domain)');
$alice->command('RSET');
like($alice->command('MAIL FROM:<alias@local.test>'), qr/^250 /, '... as the address pepsi.sender_login gives her (sql)');
$alice->command('RSET');
like($alice->command('MAIL FROM:<shared@local.test>'), qr/^250 /, '... as an address she shares with bob');
$alice->command('RSET');
like($alice->command('MAIL FROM:<bob@local.test>'),
	qr/^553 5\.7\.1 <bob\@local\.test>: Sender address rejected: not owned by user alice/,
	'as someone else\'s address: 553 5.7.1');
like($alice->command('MAIL FROM:<>'), qr/^250 /, 'the null sender is no one\'s: taken');
$alice->command('RSET');
ok(file_shows($log, qr/sender <bob\@local\.test> refused: not owned by alice \(SENDER_LOGIN_MAPS\)/),
	'the refusal is logged');

# From: is hers too, or the message is refused, and nothing stored.
$alice->command('MAIL FROM:<alice@local.test>');
$alice->command('RCPT TO:<user@local.test>');
$alice->command('DATA');
$alice->send("From: Bob <bob\@local.test>\r\nSubject: forged\r\n\r\nbody\r\n.\r\n");
like($alice->reply(30), qr/^553 5\.7\.1 From: address not owned/, 'a From: of someone else\'s: 553 5.7.1 after DATA');
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue'), '0', '... and nothing is stored');
$alice->command('MAIL FROM:<alice@local.test>');
$alice->command('RCPT TO:<user@local.test>');
$alice->command('DATA');
$alice->send("From: Alice <alice\@local.test>\r\nSubject: mine\r\n\r\nbody\r\n.\r\n");
like($alice->reply(30), qr/^250 .*queued as/, 'her own From: is taken');
$alice->close;

my $bob = login('bob');
like($bob->command('MAIL FROM:<alice@local.test>'), qr/^553 5\.7\.1 /, 'bob may not send as alice');
$bob->command('RSET');
like($bob->command('MAIL FROM:<shared@local.test>'), qr/^250 /, '... but as the shared address');
$bob->close;

# Send limits: two transactions counted so far (the refused one and the
# stored one); another host's count, in the same table, counts as well.
is($node->safe_psql($db, "SELECT messages FROM pepsi.send_count WHERE account = 'alice'"), '2',
	'alice\'s messages this hour are counted in pepsi.send_count');
$alice = login('alice');
$alice->command('MAIL FROM:<alice@local.test>');
like($alice->command('RCPT TO:<user@local.test>'), qr/^250 /, 'her third message is taken');
like($alice->command('RCPT TO:<other@local.test>'), qr/^250 /, '... with a second recipient');
$alice->command('RSET');
$alice->command('MAIL FROM:<alice@local.test>');
like($alice->command('RCPT TO:<user@local.test>'),
	qr/^450 4\.7\.1 <user\@local\.test>: Recipient address rejected: too much mail from alice this hour/,
	'a fourth: 450 4.7.1 (SEND_LIMIT_MESSAGES = 3)');
$alice->close;
$node->safe_psql($db, "UPDATE pepsi.send_count SET messages = 0 WHERE account = 'alice'");
$alice = login('alice');
$alice->command('MAIL FROM:<alice@local.test>');
like($alice->command('RCPT TO:<user@local.test>'), qr/^250 /, 'the count is the database\'s: lowered there, she may send again');
$alice->close;
$node->safe_psql($db, "UPDATE pepsi.send_count SET messages = 3 WHERE account = 'alice'");
$alice = login('alice');
$alice->command('MAIL FROM:<alice@local.test>');
like($alice->command('RCPT TO:<user@local.test>'), qr/^450 4\.7\.1 /, '... and raised there (another host\'s mail), she may not');
$alice->close;

$ingress->signal('TERM');
$ingress->finish;
done_testing();
