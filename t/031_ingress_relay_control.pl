# Relay control and recipient validation at RCPT time (pepsi-ingress with
# common/local/local.c), against real clients bound to several loopback source
# addresses: 127.0.0.1 stands for a trusted network, 127.0.0.2 and
# 127.0.0.3 for the internet.  Every refusal is checked on the wire (code,
# enhanced code) and in the queue (nothing stored).

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use File::Path qw(make_path);
use IPC::Run;
use MIME::Base64 qw(encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use PepsiTest;
use SmtpClient;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('relay', extension => 1);

self_signed_certificate($tmp, 'mx.test');
my $hash = `openssl passwd -6 -salt pepsitest 'correct horse'`;
chomp $hash;
PostgreSQL::Test::Utils::append_to_file("$tmp/credentials", "alice:$hash\n");
chmod 0600, "$tmp/credentials" or die "chmod: $!";
PostgreSQL::Test::Utils::append_to_file("$tmp/aliases", "team: alice, carol\n");
make_path("$tmp/maildir/alice\@example.org", "$tmp/maildir/carol\@example.org");

my %port = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } qw(smtp open submission);

# The configuration, with $extra lines appended, as a file of its own.
sub write_conf
{
	my ($name, $extra) = @_;
	my $path = "$tmp/$name";

	open my $fh, '>', $path or die;
	print $fh <<"CONF";
[pepsi]
HOSTNAME = mx.test
LOCAL_DOMAINS = example.org, lists.example.org
LOCAL_RECIPIENTS = aliases maildir virtual
ALIASES_FILE = $tmp/aliases
MAILDIR_ROOT = $tmp/maildir
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
CREDENTIALS = $tmp/credentials
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 1
LOCAL_RECIPIENTS_REFRESH = 200ms
TRUSTED_NETWORKS = 127.0.0.1/32
$extra
CONF
	close $fh;
	return $path;
}

my $conf = write_conf('pepsi.conf', <<"CONF");
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port{smtp}
MAX_ERRORS = 100
MAX_RECIPIENTS = 50
[listener-open]
ADDRESS = 127.0.0.1
PORT = $port{open}
TRUSTED_NETWORKS = 127.0.0.2 ::1
[listener-submission]
MODE = submission
ADDRESS = 127.0.0.1
PORT = $port{submission}
CERTIFICATE = $tmp/cert.pem
KEY = $tmp/key.pem
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);

sub wait_for_log
{
	my ($pattern, $seconds) = @_;

	return file_shows($log, $pattern, $seconds);
}

ok(wait_for_log(qr/database connection \d+ ready/), 'ingress starts');

sub rows
{
	return $node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue');
}

sub recipients_of
{
	my ($id) = @_;

	return $node->safe_psql($db,
		"SELECT array_to_string(rcpt_to, ' ') FROM pepsi.workqueue WHERE id = $id");
}

# A transaction: EHLO, MAIL, the RCPTs; returns the client and the RCPT replies.
sub transaction
{
	my ($port, $from, @rcpt) = @_;
	my $c = SmtpClient->new($port, from => $from);

	$c->command('EHLO client.test');
	$c->command('MAIL FROM:<sender@sender.example>');
	return ($c, map { $c->command("RCPT TO:<$_>") } @rcpt);
}

sub send_data
{
	my ($c) = @_;
	my $reply = $c->command('DATA');

	return $reply unless $reply =~ /^354/;
	return $c->command("Subject: test\r\n\r\nbody\r\n.");
}

#
# Relay control
#
my $before = rows();
my ($c, $reply) = transaction($port{smtp}, '127.0.0.2', 'victim@gmail.example');
like($reply, qr/^554 5\.7\.1 <victim\@gmail\.example>: Relay access denied/,
	'an untrusted client cannot relay: 554 5.7.1');
like($c->command('DATA'), qr/^554 5\.5\.1 No valid recipients/, 'DATA after it: no valid recipients');
$c->close;
is(rows(), $before, 'nothing stored for the refused transaction');
ok(wait_for_log(qr/NOQUEUE: reject: RCPT from unknown\[127\.0\.0\.2\]: 554 5\.7\.1 <victim\@gmail\.example>: Relay access denied .*; from=<[^>]*> to=<victim\@gmail\.example> proto=ESMTP helo=<[^>]+>$/m),
	'the refusal is logged with the client address, as Postfix\'s smtpd logs it');

($c, $reply) = transaction($port{smtp}, '127.0.0.2', 'victim@example.org.evil.example');
like($reply, qr/^554 5\.7\.1/, 'a domain that only starts like a local one is not local');
$c->close;

($c, $reply) = transaction($port{smtp}, '127.0.0.1', 'friend@gmail.example');
like($reply, qr/^250 2\.1\.5/, 'a client in TRUSTED_NETWORKS may relay');
like(send_data($c), qr/^250 2\.0\.0 Ok: queued as [0-9A-Za-z]+/, 'and its message is queued');
$c->close;

($c, $reply) = transaction($port{open}, '127.0.0.2', 'friend@gmail.example');
like($reply, qr/^250 2\.1\.5/, "a listener's own TRUSTED_NETWORKS replaces [ingress]'s");
$c->close;
($c, $reply) = transaction($port{open}, '127.0.0.1', 'friend@gmail.example');
like($reply, qr/^554 5\.7\.1/, "... so [ingress]'s network is not trusted there");
$c->close;
($c, $reply) = transaction($port{open}, '127.0.0.3', 'friend@gmail.example');
like($reply, qr/^554 5\.7\.1/, '... nor any other address');
$c->close;

# Authenticated: the submission listener, from an untrusted address.
$c = SmtpClient->new($port{submission}, from => '127.0.0.3');
$c->command('EHLO client.test');
ok($c->starttls('client.test'), 'submission: STARTTLS');
like($c->command('AUTH PLAIN ' . encode_base64("\0alice\0correct horse", '')),
	qr/^235 /, 'submission: AUTH PLAIN');
$c->command('MAIL FROM:<alice@example.org>');
like($c->command('RCPT TO:<friend@gmail.example>'), qr/^250 2\.1\.5/,
	'an authenticated client may relay from anywhere');
like(send_data($c), qr/^250 2\.0\.0 Ok: queued/, 'and its message is queued');
$c->close;

#
# Recipient validation
#
$before = rows();
my @replies;
($c, @replies) = transaction($port{smtp}, '127.0.0.2', 'alice@example.org', 'bob@example.org',
	'postmaster@example.org', 'Abuse@Lists.Example.org', 'postmaster', 'team@example.org',
	'CAROL@EXAMPLE.ORG', '../alice@example.org');
like($replies[0], qr/^250 2\.1\.5/, 'a local mailbox (maildir) is accepted from anyone');
like($replies[1], qr/^550 5\.1\.1 <bob\@example\.org>: Recipient address rejected/,
	'an unknown local recipient: 550 5.1.1 at RCPT');
like($replies[2], qr/^250 /, 'postmaster always exists');
like($replies[3], qr/^250 /, 'abuse always exists, in any case, at every local domain');
like($replies[4], qr/^250 /, '<postmaster> without a domain is accepted');
like($replies[5], qr/^250 /, 'an alias name exists');
like($replies[6], qr/^250 /, 'a mailbox is found whatever the case of the address');
like($replies[7], qr/^550 5\.1\.1/, 'an address that would step out of the maildir root names no mailbox');
my $queued = send_data($c);
like($queued, qr/^250 2\.0\.0 Ok: queued as ([0-9A-Za-z]+)/, 'the message for the valid ones is queued');
my $id = queued_row($node, $queued);
is(recipients_of($id),
	'alice@example.org postmaster@example.org Abuse@Lists.Example.org postmaster team@example.org CAROL@EXAMPLE.ORG',
	'only the valid recipients are stored');
$c->close;
ok(wait_for_log(qr/NOQUEUE: reject: RCPT from unknown\[[^\]]+\]: 550 5\.1\.1 <bob\@example\.org>: Recipient address rejected: no such user here; from=<[^>]*> to=<bob\@example\.org> proto=ESMTP/),
	'the unknown recipient is logged');

# The aliases file is read again when it changes (its mtime, looked at
# once a second at most, common/local/local.c): polled with a bound, each
# attempt a transaction of its own.
PostgreSQL::Test::Utils::append_to_file("$tmp/aliases", "bob: alice\n");
utime(time + 2, time + 2, "$tmp/aliases");
poll_until(
	sub {
		($c, $reply) = transaction($port{smtp}, '127.0.0.2', 'bob@example.org');
		$c->close;
		return $reply =~ /^250 /;
	});
like($reply, qr/^250 /, 'a name added to the aliases file is accepted without a restart');

# A virtual mailbox (pepsi.virtual_mailbox) is picked up without a restart.
sub rcpt_reply_within
{
	my ($address, $pattern) = @_;
	my $reply;

	poll_until(
		sub {
			my $client;
			($client, $reply) = transaction($port{smtp}, '127.0.0.2', $address);
			$client->close;
			return $reply =~ $pattern;
		},
		10);
	return $reply;
}
like(rcpt_reply_within('dave@example.org', qr/^550/), qr/^550 5\.1\.1/,
	'a virtual mailbox not yet added is unknown');
$node->safe_psql($db, "SELECT pepsi.virtual_mailbox_add('Dave\@Example.org')");
like(rcpt_reply_within('dave@example.org', qr/^250/), qr/^250 2\.1\.5/,
	'once pepsi.virtual_mailbox_add has it, ingress accepts it');
$node->safe_psql($db, "SELECT pepsi.virtual_mailbox_remove('dave\@example.org')");
like(rcpt_reply_within('dave@example.org', qr/^550/), qr/^550 5\.1\.1/,
	'and after virtual_mailbox_remove it is unknown again');

#
# Duplicates: a thousand RCPTs of one address are stored once.
#
$c = SmtpClient->new($port{open}, from => '127.0.0.2');
$c->command('EHLO client.test');
$c->command('MAIL FROM:<sender@sender.example>');
@replies = $c->pipeline(map { 'RCPT TO:<alice@' . ($_ % 2 ? 'EXAMPLE.org' : 'example.org') . '>' } 1 .. 1000);
is(scalar(grep { /^250 / } @replies), 1000, '1,000 duplicate RCPTs are each answered 250');
like($replies[1], qr/duplicate/, 'the repeats say they are duplicates');
$queued = send_data($c);
$id = queued_row($node, $queued);
ok(defined $id, 'the message is queued') or diag($queued);
is(recipients_of($id), 'alice@EXAMPLE.org', 'stored with the recipient once');
$c->close;
($c, @replies) = transaction($port{open}, '127.0.0.2', 'alice@example.org', 'Alice@example.org');
like($replies[1], qr/^250 2\.1\.5 Recipient ok\r?$/m, 'local parts differing in case are two recipients');
$c->close;

#
# Trace fields: forged Authentication-Results, loops, the Received id.
#
sub send_message
{
	my ($content) = @_;
	my $c = SmtpClient->new($port{smtp}, from => '127.0.0.1');

	$c->command('EHLO client.test');
	$c->command('MAIL FROM:<sender@sender.example>');
	$c->command('RCPT TO:<alice@example.org>');
	$c->command('DATA');
	my $reply = $c->command("$content.");
	$c->close;
	return $reply;
}

sub stored_headers
{
	my ($id) = @_;

	return $node->safe_psql($db,
		"SELECT convert_from(headers, 'UTF8') FROM pepsi.workqueue WHERE id = $id");
}

$queued = send_message("Authentication-Results: mx.test; spf=pass smtp.mailfrom=ceo\@example.org\r\n"
	  . "Authentication-Results: (forged) MX.Test 1;\r\n\tdkim=pass header.d=example.org\r\n"
	  . "Authentication-Results: other.example; dkim=fail\r\n"
	  . "Authentication-Results: mx.test.evil.example; dmarc=pass\r\n"
	  . "Authentication-Results : mx.test; arc=pass smtp.spaced=before-colon\r\n"
	  . "Authentication-Results: \"mx.test\"; dkim=pass header.quoted=id\r\n"
	  . "Authentication-Results:\t(c) \"MX.T\\est\" 1; dmarc=pass header.quoted=escaped\r\n"
	  . "Subject: trust me\r\n\r\nbody\r\n");
$id = queued_row($node, $queued);
ok(defined $id, 'a message with Authentication-Results fields is queued') or diag($queued);
my $headers = stored_headers($id);
my @results = $headers =~ /^Authentication-Results:[^\r]*/mg;
is(scalar(@results), 3, 'the five claiming our authserv-id are gone, ours was added');
like($results[0], qr/^Authentication-Results: mx\.test;/, 'ours comes first');
like($headers, qr/^Authentication-Results: other\.example; dkim=fail\r$/m,
	"another server's is kept");
like($headers, qr/^Authentication-Results: mx\.test\.evil\.example; dmarc=pass\r$/m,
	'so is one whose authserv-id only starts like ours');
unlike($headers, qr/spf=pass smtp\.mailfrom=ceo|\(forged\)/, 'nothing of the forged ones is left');
unlike($headers, qr/before-colon/, 'nor of one with a space before its colon (RFC 5322 obs-optional)');
unlike($headers, qr/header\.quoted/, 'nor of those whose authserv-id is a quoted-string (RFC 8601 2.2)');
like($headers, qr/^Received: from client\.test \(\[127\.0\.0\.1\]\)\r\n\tby mx\.test \(Pepsi\) with ESMTP id ([0-9B-DF-HJ-NP-TV-Zb-df-hj-np-tv-z]{15})\r$/m,
	'the Received id is a queue id: fifteen of the digits and consonants of Postfix\'s long queue ids');
is(($headers =~ /with ESMTP id (\w+)/)[0], ($queued =~ /queued as (\w+)/)[0], '... the one the 250 reply named');

my $loop = join('', map { "Received: from hop$_.example by hop$_.example; Tue, 1 Dec 2026 00:00:00 +0000\r\n" } 1 .. 50);
$before = rows();
like(send_message($loop . "Subject: loop\r\n\r\nbody\r\n"), qr/^554 5\.4\.6 /,
	'a message that has been through MAX_HOPS (50) servers is refused: 5.4.6');
is(rows(), $before, 'and not stored');
$loop = join('', map { "Received: from hop$_.example by hop$_.example; Tue, 1 Dec 2026 00:00:00 +0000\r\n" } 1 .. 49);
like(send_message($loop . "Subject: far\r\n\r\nbody\r\n"), qr/^250 /, 'one through 49 is taken');

#
# NOTIFY=SUCCESS only for trusted or authenticated clients: anyone else
# could have us mail a success DSN to a forged sender (backscatter).
#
sub stored_notify
{
	my ($from, @params) = @_;
	my $c = SmtpClient->new($port{smtp}, from => $from);

	$c->command('EHLO client.test');
	$c->command('MAIL FROM:<victim@forged.example>');
	$c->command("RCPT TO:<alice\@example.org> NOTIFY=$_") for @params;
	my $qid = queued_row($node, send_data($c));
	$c->close;
	return $node->safe_psql($db,
		"SELECT string_agg(coalesce(r->>'notify', 'null'), ' ') FROM pepsi.workqueue,"
		  . " jsonb_array_elements(state->'dsn'->'rcpt') r WHERE id = $qid");
}
is(stored_notify('127.0.0.2', 'SUCCESS,DELAY'), 'DELAY',
	'an untrusted client: SUCCESS is dropped from NOTIFY');
is(stored_notify('127.0.0.2', 'SUCCESS'), 'FAILURE', '... and NOTIFY=SUCCESS alone becomes the default, FAILURE');
is(stored_notify('127.0.0.1', 'SUCCESS,DELAY'), 'SUCCESS,DELAY', 'a trusted client keeps it');

#
# Configuration errors name the file, the line and the option.
#
$ingress->signal('TERM');
$ingress->finish;
my $bad = write_conf('bad.conf', "[listener-x]\nPORT = $port{smtp}\nTRUSTED_NETWORKS = 10.0.0.1/8\n");
my ($out, $err) = ('', '');
IPC::Run::run([ $bin, '-c', $bad ], '<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(30));
isnt($?, 0, 'a CIDR block with host bits set is refused');
like($err, qr/bad\.conf:\d+: \[listener-x\] TRUSTED_NETWORKS: "10\.0\.0\.1\/8" has bits set beyond its \/8 prefix/,
	'... naming the file, the line and the option');
$bad = write_conf('bad2.conf', "[listener-x]\nPORT = $port{smtp}\n");
$bad =~ s/bad2/bad2/;
system("sed -i 's/^LOCAL_RECIPIENTS = .*/LOCAL_RECIPIENTS = aliases ldap/' $bad");
IPC::Run::run([ $bin, '-c', $bad ], '<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(30));
like($err, qr/bad2\.conf:\d+: \[pepsi\] LOCAL_RECIPIENTS: unknown source "ldap"/,
	'an unknown recipient source is refused with file:line');

# A credentials file others may read is refused, with what to do about it.
PostgreSQL::Test::Utils::append_to_file("$tmp/open-credentials", "alice:$hash\n");
chmod 0644, "$tmp/open-credentials" or die;
$bad = write_conf('open.conf', "[listener-x]\nPORT = $port{smtp}\n");
system("sed -i 's|^CREDENTIALS = .*|CREDENTIALS = $tmp/open-credentials|' $bad");
IPC::Run::run([ $bin, '-c', $bad ], '<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(30));
isnt($?, 0, 'a credentials file readable by others is refused');
like($err, qr/open-credentials: holds credentials but its group or others may access it \(mode 0644\); refused: chmod 600/,
	'... saying why and what to do');

done_testing();
