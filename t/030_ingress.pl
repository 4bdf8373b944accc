# pepsi-ingress (daemons/ingress) against real clients and a real cluster:
# swaks for what it can say, Net::SMTP for the extensions swaks lacks (BDAT,
# DSN parameters, BODY=), and a scripted socket where the point is a client
# misbehaving (pipelining after STARTTLS, leaving mid-DATA, going silent).
# Every stored row is checked byte for byte: headers || CRLF || body must be
# the message sent, after the Received and Authentication-Results headers
# ingress prepends.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IO::Socket::INET;
use IO::Socket::SSL;
use IPC::Run;
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use Net::SMTP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Socket qw(IPPROTO_TCP TCP_CORK);
use Test::More;
use Time::HiRes qw(time usleep);

use PepsiTest;
use SmtpClient qw(read_smtp_reply);

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $json = JSON::PP->new->canonical;

my $node = pepsi_node('ingress', extension => 1);

#
# A certificate made here (no private key is committed), credentials, and
# four listeners: smtp (STARTTLS, tight limits), submission, smtps, and one
# with a short idle timeout and two sessions per client.
#
self_signed_certificate($tmp, 'mx.test');
my $hash = `openssl passwd -6 -salt pepsitest 'correct horse'`;
chomp $hash;
# (setting up, not a test of openssl: the AUTH tests below use it)
$hash =~ /^\$6\$/ or die "openssl passwd -6 gave no SHA-512 crypt hash: $hash";
PostgreSQL::Test::Utils::append_to_file("$tmp/credentials",
	"# test accounts\nalice:$hash\n");
chmod 0600, "$tmp/credentials" or die "chmod: $!";

my %port = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } qw(smtp submission smtps slow);
my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
AUTHSERV_ID = auth.test
CREDENTIALS = $tmp/credentials
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 2
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port{smtp}
CERTIFICATE = $tmp/cert.pem
KEY = $tmp/key.pem
MAX_SIZE = 20000
MAX_RECIPIENTS = 3
MAX_ERRORS = 4
[listener-submission]
MODE = submission
ADDRESS = 127.0.0.1
PORT = $port{submission}
CERTIFICATE = $tmp/cert.pem
KEY = $tmp/key.pem
[listener-smtps]
MODE = smtps
ADDRESS = 127.0.0.1
PORT = $port{smtps}
CERTIFICATE = $tmp/cert.pem
KEY = $tmp/key.pem
[listener-slow]
ADDRESS = 127.0.0.1
PORT = $port{slow}
IDLE_TIMEOUT = 1s
MAX_SESSIONS_PER_CLIENT = 2
COMMAND_RATE = 1
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);

sub wait_for_log
{
	my ($pattern, $seconds) = @_;

	return file_shows($log, $pattern, $seconds);
}

ok(wait_for_log(qr/database connection 1 ready/), 'ingress starts and connects to the database');

#
# Clients
#

sub swaks
{
	my (@args) = @_;
	my ($out, $err) = ('', '');

	IPC::Run::run([ 'swaks', '--server', '127.0.0.1', '--ehlo', 'client.test', @args ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	return ($? >> 8, $out . $err);
}

sub queued_id
{
	my ($transcript) = @_;

	return $transcript =~ /<[-~]  (250 2\.0\.0 Ok: queued as [0-9A-Za-z]+)/ ? queued_row($node, $1) : undef;
}

sub message_file
{
	my ($name, $content) = @_;

	open my $fh, '>:raw', "$tmp/$name" or die;
	print $fh $content;
	close $fh;
	return "$tmp/$name";
}

# A scripted client: connect and return the socket and the banner.
sub connect_raw
{
	my ($port) = @_;
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 10)
	  or die "connect $port: $!";

	return ($s, read_reply($s));
}

sub read_reply
{
	my ($s, $seconds) = @_;

	return read_smtp_reply($s, $seconds);
}

sub command
{
	my ($s, $line) = @_;

	print $s "$line\r\n";
	return read_reply($s);
}

#
# The queue
#

sub row_count
{
	return $node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue');
}

sub row
{
	my ($id) = @_;
	my $r = $node->safe_psql($db,
		    "SELECT json_build_object('stage', stage, 'status', status, 'mail_from', mail_from,"
		  . " 'rcpt_to', rcpt_to, 'client_address', host(client_address),"
		  . " 'auth_account', auth_account, 'state', state,"
		  . " 'raw', encode(w.headers || '\\x0d0a'::bytea || b.body, 'hex'))"
		  . " FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id"
		  . " WHERE w.id = $id");

	return undef if $r eq '';
	my $row = decode_json($r);
	$row->{raw} = pack('H*', $row->{raw});
	return $row;
}

# Check a stored row: the message after the two trace headers is exactly
# what was sent.  Returns the row, with {trace} the prepended headers.
sub stored_as_sent
{
	my ($id, $sent, $label) = @_;
	my $row = defined $id ? row($id) : undef;

	if (!$row)
	{
		fail("$label: a row was stored");
		return {};
	}
	my ($trace, $rest) = $row->{raw} =~
	  /\A(Received: [^\r\n]*\r\n(?:\t[^\r\n]*\r\n)*Authentication-Results: [^\r\n]*\r\n(?:\t[^\r\n]*\r\n)*)(.*)\z/s;
	ok(defined $trace, "$label: Received and Authentication-Results come first");
	ok(defined $rest && $rest eq $sent, "$label: the rest is the message sent, byte for byte")
	  or diag(explain({ stored => $rest, sent => $sent }));
	$row->{trace} = $trace // '';
	return $row;
}

my @stored;		# every id we were told was queued

#
# Plain SMTP, with a dot-stuffed line.
#
my $plain = "From: b\@example.org\r\nTo: a\@example.net\r\nSubject: plain\r\n\r\nhello\r\n.a line starting with a dot\r\n..two dots\r\nend";
my ($rc, $out) = swaks('--port', $port{smtp}, '--from', 'b@example.org', '--to', 'a@example.net',
	'--data', '@' . message_file('plain.eml', $plain));
my $id = queued_id($out);
ok(defined $id, 'plain: 250 with the row id') or diag($out);
push @stored, $id;
my $row = stored_as_sent($id, "$plain\r\n", 'plain');
is($row->{stage}, 'init', 'plain: at stage init');
is($row->{status}, 'pending', 'plain: pending');
is($row->{mail_from}, 'b@example.org', 'plain: mail_from');
is_deeply($row->{rcpt_to}, ['a@example.net'], 'plain: rcpt_to');
is($row->{client_address}, '127.0.0.1', 'plain: client_address');
is($json->encode($row->{state}{origin}),
	$json->encode({ client_ip => '127.0.0.1', helo => 'client.test', esmtp => JSON::PP::true,
		smtputf8 => JSON::PP::false, body => '7BIT', tls => undef, listener => 'smtp',
		auth => undef, authserv_id => 'auth.test', trust => 'trusted-network' }),
	'plain: state.origin (a loopback client is in the default TRUSTED_NETWORKS)');
is($json->encode($row->{state}{dsn}),
	$json->encode({ ret => undef, envid => undef, rcpt => [ { notify => undef, orcpt => undef } ] }),
	'plain: state.dsn has one entry per recipient');
like($row->{trace}, qr/^Received: from client\.test \(\[127\.0\.0\.1\]\)\r\n\tby mx\.test \(Pepsi\) with ESMTP id \w+\r\n\tfor <a\@example\.net>; \w{3}, /,
	'plain: the Received header');
like($row->{trace}, qr/^Authentication-Results: auth\.test;\r\n\tspf=none smtp\.mailfrom=b\@example\.org;\r\n\tdkim=none;\r\n\tdmarc=none\r\n/m,
	'plain: Authentication-Results with the configured authserv-id');

#
# The dispatcher is woken after the commit, by the coalescing timer.
#
my $listener = $node->background_psql($db);
$listener->query_safe('LISTEN pepsi_workqueue');
($rc, $out) = swaks('--port', $port{smtp}, '--from', 'b@example.org', '--to', 'a@example.net',
	'--data', '@' . message_file('wake.eml', "Subject: wake\r\n\r\nwake up"));
$id = queued_id($out);
push @stored, $id;
my $notified = '';
poll_until(
	sub {
		$notified .= $listener->query_safe("SELECT count(*) FROM pepsi.workqueue WHERE id = $id");
		return $notified =~ /Asynchronous notification "pepsi_workqueue"/;
	});
like($notified, qr/Asynchronous notification "pepsi_workqueue"/,
	'the dispatcher is notified after a message is admitted');
$listener->quit;

#
# PIPELINING: two recipients; then commands pipelined behind the end of
# the content wait for its commit.
#
($rc, $out) = swaks('--port', $port{smtp}, '--pipeline', '--from', 'b@example.org',
	'--to', 'a@example.net,c@example.net', '--data', '@' . message_file('pipe.eml', "Subject: pipelined\r\n\r\nbody"));
$id = queued_id($out);
ok(defined $id, 'pipelining: queued') or diag($out);
push @stored, $id;
$row = stored_as_sent($id, "Subject: pipelined\r\n\r\nbody\r\n", 'pipelining');
is_deeply($row->{rcpt_to}, [ 'a@example.net', 'c@example.net' ], 'pipelining: both recipients');
is(scalar @{ $row->{state}{dsn}{rcpt} }, 2, 'pipelining: state.dsn.rcpt parallel to rcpt_to');
unlike($row->{trace}, qr/\tfor </, 'pipelining: Received names no recipient when there are two');

{
	my ($s) = connect_raw($port{smtp});
	command($s, 'EHLO client.test');
	print $s "MAIL FROM:<p1\@example.org>\r\nRCPT TO:<a\@example.net>\r\nDATA\r\n";
	my $replies = join '', map { read_reply($s) } 1 .. 3;
	like($replies, qr/^250 2\.1\.0.*^250 2\.1\.5.*^354 /ms, 'pipelined MAIL, RCPT, DATA');
	print $s "Subject: first\r\n\r\none\r\n.\r\nMAIL FROM:<p2\@example.org>\r\nRCPT TO:<a\@example.net>\r\nDATA\r\n";
	$replies = join '', map { read_reply($s) } 1 .. 4;
	like($replies, qr/^250 2\.0\.0 Ok: queued as ([0-9A-Za-z]+)\r\n250 2\.1\.0.*\r\n250 2\.1\.5.*\r\n354 /s,
		'commands pipelined after the content are answered after its commit, in order');
	my $first = queued_row($node, $replies);
	push @stored, $first;
	print $s "Subject: second\r\n\r\ntwo\r\n.\r\nQUIT\r\n";
	$replies = read_reply($s) . read_reply($s);
	like($replies, qr/^250 2\.0\.0 Ok: queued as ([0-9A-Za-z]+)\r\n221 /, 'the second message and QUIT');
	my $second = queued_row($node, $replies);
	push @stored, $second;
	stored_as_sent($first, "Subject: first\r\n\r\none\r\n", 'pipelined first');
	stored_as_sent($second, "Subject: second\r\n\r\ntwo\r\n", 'pipelined second');
	close $s;
}

#
# STARTTLS on the smtp listener.
#
($rc, $out) = swaks('--port', $port{smtp}, '-tls', '--from', 'b@example.org', '--to', 'a@example.net',
	'--data', '@' . message_file('tls.eml', "Subject: tls\r\n\r\nsecret"));
$id = queued_id($out);
ok(defined $id, 'STARTTLS: queued') or diag($out);
push @stored, $id;
$row = stored_as_sent($id, "Subject: tls\r\n\r\nsecret\r\n", 'STARTTLS');
like($row->{state}{origin}{tls}{version} // '', qr/^TLSv1\.[23]$/, 'STARTTLS: origin.tls.version');
ok(($row->{state}{origin}{tls}{bits} // 0) >= 128, 'STARTTLS: origin.tls.bits');
like($row->{trace}, qr/with ESMTPS id \w+\r\n\t\(version=TLSv1\.[23] cipher=\S+ bits=\d+\)\r\n/,
	'STARTTLS: Received carries the TLS parameters');

# Pipelining under TLS: one record per command, the records of a group in
# one TCP segment (corked), so that they reach ingress in one read: every
# command is answered, none waits in OpenSSL's buffer for more input.
{
	my ($s) = connect_raw($port{smtp});
	command($s, 'EHLO client.test');
	like(command($s, 'STARTTLS'), qr/^220 /, 'TLS pipelining: STARTTLS');
	ok(IO::Socket::SSL->start_SSL($s, SSL_verify_mode => SSL_VERIFY_NONE), 'TLS pipelining: TLS up')
	  or diag($IO::Socket::SSL::SSL_ERROR);
	command($s, 'EHLO client.test');
	my $corked = sub {
		my (@records) = @_;

		setsockopt($s, IPPROTO_TCP, TCP_CORK, 1) or die "TCP_CORK: $!";
		syswrite($s, $_) == length($_) or die "syswrite: $!" for @records;
		setsockopt($s, IPPROTO_TCP, TCP_CORK, 0) or die "TCP_CORK: $!";
	};
	$corked->("MAIL FROM:<b\@example.org>\r\n", "RCPT TO:<a\@example.net>\r\n", "DATA\r\n");
	like(read_reply($s, 10), qr/^250 2\.1\.0 /, 'TLS pipelining: MAIL answered');
	like(read_reply($s, 10), qr/^250 2\.1\.5 /, 'TLS pipelining: RCPT answered');
	like(read_reply($s, 10), qr/^354 /, 'TLS pipelining: DATA answered');
	$corked->("Subject: tls pipelined\r\n\r\n", "body\r\n", ".\r\n", "NOOP\r\n");
	my $queued = read_reply($s, 10);
	like($queued, qr/^250 2\.0\.0 Ok: queued as [0-9A-Za-z]+/, 'TLS pipelining: the message queued');
	like(read_reply($s, 10), qr/^250 /, 'TLS pipelining: the command behind the message answered');
	$id = queued_row($node, $queued);
	push @stored, $id if defined $id;
	stored_as_sent($id, "Subject: tls pipelined\r\n\r\nbody\r\n", 'TLS pipelining');
	command($s, 'QUIT');
	close $s;
}

#
# Submission: AUTH is refused before STARTTLS, needed after it.
#
{
	my ($s, $banner) = connect_raw($port{submission});
	like($banner, qr/^220 mx\.test /, 'submission: banner');
	my $ehlo = command($s, 'EHLO client.test');
	like($ehlo, qr/^250-STARTTLS\r$/m, 'submission: STARTTLS offered');
	unlike($ehlo, qr/AUTH/, 'submission: AUTH not offered before TLS');
	like(command($s, 'AUTH PLAIN ' . encode_base64("\0alice\0correct horse", '')),
		qr/^538 5\.7\.11 /, 'submission: AUTH before STARTTLS is refused (538 5.7.11)');
	like(command($s, 'MAIL FROM:<b@example.org>'), qr/^530 5\.7\.0 /,
		'submission: MAIL before STARTTLS is refused (530 5.7.0)');
	close $s;
}
my $before = row_count();
($rc, $out) = swaks('--port', $port{submission}, '-tls', '--from', 'b@example.org', '--to', 'a@example.net');
like($out, qr/<[*~]\* 530 5\.7\.0 Authentication required/, 'submission: MAIL without AUTH after TLS is refused');
($rc, $out) = swaks('--port', $port{submission}, '-tls', '-a', 'PLAIN', '-au', 'alice', '-ap', 'wrong',
	'--from', 'b@example.org', '--to', 'a@example.net');
like($out, qr/<[*~]\* 535 5\.7\.8 /, 'submission: bad credentials get 535 5.7.8');
($rc, $out) = swaks('--port', $port{submission}, '-tls', '-a', 'LOGIN', '-au', 'mallory', '-ap', 'correct horse',
	'--from', 'b@example.org', '--to', 'a@example.net');
like($out, qr/<[*~]\* 535 5\.7\.8 /, 'submission: an unknown user gets 535 5.7.8');
is(row_count(), $before, 'submission: nothing stored without authentication');

($rc, $out) = swaks('--port', $port{submission}, '-tls', '-a', 'PLAIN', '-au', 'alice', '-ap', 'correct horse',
	'--from', 'alice@example.org', '--to', 'a@example.net',
	'--data', '@' . message_file('sub.eml', "Subject: submitted\r\n\r\nby alice"));
$id = queued_id($out);
ok(defined $id, 'submission: AUTH PLAIN after STARTTLS, queued') or diag($out);
push @stored, $id;
$row = stored_as_sent($id, "Subject: submitted\r\n\r\nby alice\r\n", 'submission');
is($row->{state}{origin}{auth}, 'alice', 'submission: origin.auth');
is($row->{state}{origin}{trust}, 'authenticated', 'submission: origin.trust');
is($row->{auth_account}, 'alice', 'submission: auth_account');
is($row->{state}{origin}{listener}, 'submission', 'submission: origin.listener');
like($row->{trace}, qr/with ESMTPSA id/, 'submission: Received says ESMTPSA');
like($row->{trace}, qr/^\tauth=pass smtp\.auth=alice;\r$/m, 'submission: Authentication-Results auth=pass');

($rc, $out) = swaks('--port', $port{submission}, '-tls', '-a', 'LOGIN', '-au', 'alice', '-ap', 'correct horse',
	'--from', 'alice@example.org', '--to', 'a@example.net',
	'--data', '@' . message_file('login.eml', "Subject: login\r\n\r\nLOGIN"));
$id = queued_id($out);
ok(defined $id, 'submission: AUTH LOGIN, queued') or diag($out);
push @stored, $id;

#
# smtps: implicit TLS.
#
($rc, $out) = swaks('--port', $port{smtps}, '--tls-on-connect', '-a', 'PLAIN', '-au', 'alice',
	'-ap', 'correct horse', '--from', 'alice@example.org', '--to', 'a@example.net',
	'--data', '@' . message_file('smtps.eml', "Subject: smtps\r\n\r\nimplicit"));
$id = queued_id($out);
ok(defined $id, 'smtps: queued') or diag($out);
push @stored, $id;
$row = stored_as_sent($id, "Subject: smtps\r\n\r\nimplicit\r\n", 'smtps');
ok(defined $row->{state}{origin}{tls}, 'smtps: origin.tls');

#
# Net::SMTP: BDAT (BINARYMIME, octets left alone), 8BITMIME, SMTPUTF8, DSN.
#
sub net_smtp
{
	my $smtp = Net::SMTP->new('127.0.0.1', Port => $port{smtp}, Hello => 'client.test',
		Timeout => 30)
	  or die "Net::SMTP: $@";
	return $smtp;
}

{
	my $smtp = net_smtp();
	my $part1 = "Subject: binary\r\nMIME-Version: 1.0\r\n\r\n";
	my $part2 = "raw \x00 octets\nwith a bare LF\r and CR \xff\xfe\r\n.\r\n";
	ok($smtp->mail('b@example.org', Bits => 'binary'), 'BDAT: MAIL BODY=BINARYMIME');
	ok($smtp->to('a@example.net'), 'BDAT: RCPT');
	ok($smtp->bdat($part1), 'BDAT: first chunk');
	ok($smtp->bdatlast($part2), 'BDAT: last chunk');
	like($smtp->message, qr/queued as [0-9A-Za-z]+/, 'BDAT: queued');
	my $bdat_id = queued_row($node, $smtp->message);
	push @stored, $bdat_id;
	$row = stored_as_sent($bdat_id, $part1 . $part2, 'BDAT');
	is($row->{state}{origin}{body}, 'BINARYMIME', 'BDAT: origin.body');

	# BDAT without BINARYMIME: the same line-end rules as DATA.
	my $text = "Subject: chunks\r\n\r\nin two\r\nchunks\r\n";
	ok($smtp->mail('b@example.org'), 'BDAT text: MAIL');
	ok($smtp->to('a@example.net'), 'BDAT text: RCPT');
	$smtp->command('BDAT', 20);
	$smtp->rawdatasend(substr($text, 0, 20));
	is($smtp->response, 2, 'BDAT text: first chunk accepted');
	$smtp->command('BDAT', length($text) - 20, 'LAST');
	$smtp->rawdatasend(substr($text, 20));
	is($smtp->response, 2, 'BDAT text: last chunk accepted');
	my $chunk_id = queued_row($node, $smtp->message);
	push @stored, $chunk_id;
	stored_as_sent($chunk_id, $text, 'BDAT text');

	$before = row_count();
	ok($smtp->mail('b@example.org'), 'BDAT bare LF: MAIL');
	ok($smtp->to('a@example.net'), 'BDAT bare LF: RCPT');
	my $bare = "Subject: x\n\nbare\n";
	$smtp->command('BDAT', length($bare), 'LAST');
	$smtp->rawdatasend($bare);
	is($smtp->response, 5, 'BDAT bare LF: refused');
	like($smtp->message, qr/bare LF/, 'BDAT bare LF: says why');
	is(row_count(), $before, 'BDAT bare LF: nothing stored');
	$smtp->quit;
}

{
	my $smtp = net_smtp();
	my $text = "Subject: =?UTF-8?Q?gr=C3=BC=C3=9Fe?=\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\nGr\xc3\xbc\xc3\x9fe aus K\xc3\xb6ln\r\n";
	ok($smtp->mail('b@example.org', Bits => '8'), '8BITMIME: MAIL BODY=8BITMIME');
	ok($smtp->to('a@example.net'), '8BITMIME: RCPT');
	ok($smtp->data($text), '8BITMIME: DATA');
	my $eight = queued_row($node, $smtp->message);
	push @stored, $eight;
	$row = stored_as_sent($eight, $text, '8BITMIME');
	is($row->{state}{origin}{body}, '8BITMIME', '8BITMIME: origin.body');

	# SMTPUTF8 addresses (Net::SMTP has no option for the parameter).
	my $from = "j\xc3\xb6ran\@ex\xc3\xa4mple.org";
	my $to = "\xe7\x94\xa8\xe6\x88\xb7\@example.net";
	is($smtp->command('MAIL', "FROM:<$from> SMTPUTF8 BODY=8BITMIME")->response, 2, 'SMTPUTF8: MAIL');
	ok($smtp->to($to), 'SMTPUTF8: RCPT with a UTF-8 address');
	ok($smtp->data("Subject: utf8\r\n\r\nhi\r\n"), 'SMTPUTF8: DATA');
	my $utf8 = queued_row($node, $smtp->message);
	push @stored, $utf8;
	$row = stored_as_sent($utf8, "Subject: utf8\r\n\r\nhi\r\n", 'SMTPUTF8');
	utf8::decode($from);
	utf8::decode($to);
	is($row->{mail_from}, $from, 'SMTPUTF8: mail_from stored as UTF-8');
	is_deeply($row->{rcpt_to}, [$to], 'SMTPUTF8: rcpt_to stored as UTF-8');
	ok($row->{state}{origin}{smtputf8}, 'SMTPUTF8: origin.smtputf8');
	like($row->{trace}, qr/with UTF8SMTP id/, 'SMTPUTF8: Received says UTF8SMTP');

	# DSN parameters reach state.dsn, parallel to rcpt_to.
	ok($smtp->mail('b@example.org', Return => 'HDRS', Envelope => 'env id+1'), 'DSN: MAIL RET ENVID');
	ok($smtp->recipient('a@example.net', { Notify => [ 'SUCCESS', 'DELAY' ],
			ORcpt => 'rfc822;orig+2Bx@example.net' }), 'DSN: RCPT NOTIFY ORCPT');
	ok($smtp->recipient('c@example.net', { Notify => ['NEVER'] }), 'DSN: RCPT NOTIFY=NEVER');
	ok($smtp->recipient('d@example.net'), 'DSN: RCPT without parameters');
	ok($smtp->data("Subject: dsn\r\n\r\nx\r\n"), 'DSN: DATA');
	my $dsn = queued_row($node, $smtp->message);
	push @stored, $dsn;
	$row = row($dsn);
	is($json->encode($row->{state}{dsn}),
		$json->encode({ ret => 'HDRS', envid => 'env id+1', rcpt => [
			{ notify => 'SUCCESS,DELAY', orcpt => 'rfc822;orig+x@example.net' },
			{ notify => 'NEVER', orcpt => undef },
			{ notify => undef, orcpt => undef } ] }),
		'DSN: state.dsn (xtext decoded)');
	ok($smtp->mail('b@example.org'), 'DSN: another MAIL');
	is($smtp->command('RCPT', 'TO:<a@example.net> NOTIFY=NEVER,SUCCESS')->response, 5,
		'DSN: a NOTIFY list with NEVER is refused');
	like($smtp->message, qr/5\.5\.4/, 'DSN: with 501 5.5.4');
	$smtp->reset;
	$smtp->quit;
}

# A UTF-8 address without SMTPUTF8.
($rc, $out) = swaks('--port', $port{smtp}, '--from', "j\xc3\xb6ran\@example.org", '--to', 'a@example.net');
like($out, qr/<[*~]\* 553 5\.6\.7 /, 'a UTF-8 address without SMTPUTF8: 553 5.6.7');

#
# Bad input: nothing partial is ever stored.
#
$before = row_count();

($rc, $out) = swaks('--port', $port{smtp}, '--from', 'b@example.org', '--to', 'a@example.net',
	'--data', '@' . message_file('big.eml', "Subject: big\r\n\r\n" . ("x" x 70 . "\r\n") x 400));
like($out, qr/<[*~]\* 552 5\.3\.4 /, 'a message over MAX_SIZE: 552 5.3.4');
{
	my $smtp = net_smtp();
	ok(!$smtp->mail('b@example.org', Size => 1_000_000), 'MAIL SIZE= over the limit is refused');
	like($smtp->message, qr/5\.3\.4/, 'with 552 5.3.4');
	$smtp->quit;
}

($rc, $out) = swaks('--port', $port{smtp}, '--from', 'b@example.org',
	'--to', 'a@example.net,b@example.net,c@example.net,d@example.net',
	'--data', '@' . message_file('many.eml', "Subject: many\r\n\r\nmany"));
like($out, qr/<[*~]\* 452 4\.5\.3 Too many recipients/, 'the fourth recipient of three allowed: 452 4.5.3');
$id = queued_id($out);
is_deeply(defined $id ? row($id)->{rcpt_to} : [], [ 'a@example.net', 'b@example.net', 'c@example.net' ],
	'the message goes to the three recipients accepted');
push @stored, $id;
$before = row_count();

($rc, $out) = swaks('--port', $port{smtp}, '--from', 'b@example.org', '--to', 'a@example.net',
	'--data', '@' . message_file('long.eml', "Subject: long\r\n\r\n" . ('y' x 999)));
like($out, qr/<[*~]\* 554 5\.6\.0 .*longer than 998/, 'a line over 998 octets: 554 5.6.0');

($rc, $out) = swaks('--port', $port{smtp}, '--from', 'b@example.org', '--to', 'a@example.net',
	'--no-data-fixup', '--data',
	message_file('smuggle.eml', "Subject: smuggle\r\n\r\nhi\n.\r\nMAIL FROM:<evil\@example.org>\r\nRCPT TO:<victim\@example.net>\r\nDATA\r\nSubject: smuggled\r\n\r\n.\r\n"));
like($out, qr/<[*~]\* 554 5\.6\.0 .*bare LF/, 'bare LF in DATA (a smuggling attempt): 554 5.6.0');
unlike($out, qr/354 End data.*354 End data/s, 'the smuggled DATA never started');

($rc, $out) = swaks('--port', $port{smtp}, '--from', 'b@example.org', '--to', 'a@example.net',
	'--data', '@' . message_file('nul.eml', "Subject: nul\r\n\r\na \x00 b"));
like($out, qr/<[*~]\* 554 5\.6\.0 .*NUL/, 'a NUL octet in DATA: 554 5.6.0');

{
	my ($s) = connect_raw($port{smtp});
	command($s, 'EHLO client.test');
	command($s, 'MAIL FROM:<b@example.org>');
	command($s, 'RCPT TO:<a@example.net>');
	like(command($s, 'DATA'), qr/^354 /, 'mid-DATA disconnect: DATA started');
	print $s "Subject: cut\r\n\r\nhalf a message\r\n";
	close $s;
	ok(wait_for_log(qr/disconnected during message content/), 'mid-DATA disconnect: noticed');
}
is(row_count(), $before, 'none of the refused or abandoned messages was stored');

# STARTTLS with commands pipelined behind it in the same packet.
{
	my ($s) = connect_raw($port{smtp});
	command($s, 'EHLO client.test');
	syswrite($s, "STARTTLS\r\nMAIL FROM:<injected\@example.org>\r\n");
	like(read_reply($s), qr/^220 2\.0\.0 /, 'injection: STARTTLS answered');
	ok(IO::Socket::SSL->start_SSL($s, SSL_verify_mode => SSL_VERIFY_NONE), 'injection: TLS up')
	  or diag($IO::Socket::SSL::SSL_ERROR);
	my $ehlo = command($s, 'EHLO client.test');
	like($ehlo, qr/\A250-mx\.test\r\n/, 'injection: the first reply under TLS is the EHLO\'s');
	like(command($s, 'MAIL FROM:<b@example.org>'), qr/^250 2\.1\.0 /,
		'injection: the command sent before the handshake was discarded');
	command($s, 'QUIT');
	close $s;
}

# Malformed commands: 500/501 with enhanced codes, then 421 at MAX_ERRORS.
{
	my ($s) = connect_raw($port{smtp});
	like(command($s, 'FROB'), qr/^500 5\.5\.2 /, 'unknown command: 500 5.5.2');
	like(command($s, 'EHLO bad<domain>'), qr/^501 5\.5\.4 /, 'bad EHLO argument: 501 5.5.4');
	command($s, 'EHLO client.test');
	like(command($s, 'MAIL FROM:b@example.org'), qr/^501 5\.5\.4 /, 'MAIL without brackets: 501 5.5.4');
	like(command($s, 'RCPT TO:<a@example.net>'), qr/^503 5\.5\.1 /, 'RCPT before MAIL: 503 5.5.1');
	like(read_reply($s), qr/^421 4\.7\.0 /, 'the fourth error ends the session with 421 4.7.0');
	is(read_reply($s, 10), '', 'and the connection is closed');
	close $s;
}
{
	my ($s) = connect_raw($port{smtp});
	like(command($s, 'X' x 5000), qr/^500 5\.5\.2 Line too long/, 'an over-long command: 500 5.5.2');
	like(command($s, "NOOP\x00"), qr/^500 5\.5\.2 NUL/, 'a NUL in a command: 500 5.5.2');
	print $s "NOOP\n";
	like(read_reply($s), qr/^500 5\.5\.2 Bare LF/, 'a command ended by a bare LF: 500 5.5.2');
	like(command($s, 'NOOP'), qr/^250 /, 'the session goes on');
	close $s;
}

# The idle timeout, and the limit on sessions per client.
{
	my ($s, $banner) = connect_raw($port{slow});
	command($s, 'EHLO client.test');
	my ($s2) = connect_raw($port{slow});
	my ($s3, $refused) = connect_raw($port{slow});
	like($refused, qr/^421 4\.7\.0 /, 'MAX_SESSIONS_PER_CLIENT: the third session gets 421 4.7.0');
	my $start = time;
	like(read_reply($s, 30), qr/^421 4\.4\.2 /, 'a silent client gets 421 4.4.2 after IDLE_TIMEOUT');
	is(read_reply($s, 10), '', 'and is disconnected');
	close $_ for $s, $s2, $s3;
}
{
	# COMMAND_RATE = 1: ten seconds' worth of burst, then 421.
	my ($s) = connect_raw($port{slow});
	print $s "NOOP\r\n" x 12;
	my @replies = map { read_reply($s, 10) } 1 .. 11;
	is(scalar(grep { /^250 / } @replies[0 .. 9]), 10, 'COMMAND_RATE: a burst of ten commands passes');
	like($replies[10], qr/^421 4\.7\.0 /, 'COMMAND_RATE: the eleventh gets 421 4.7.0');
	close $s;
}

#
# The database goes away: 451 4.3.0, the session stays usable, and
# admission resumes when it is back.
#
$before = row_count();
$node->stop('fast');
{
	my ($s) = connect_raw($port{smtp});
	command($s, 'EHLO client.test');
	command($s, 'MAIL FROM:<b@example.org>');
	command($s, 'RCPT TO:<a@example.net>');
	command($s, 'DATA');
	like(command($s, "Subject: down\r\n\r\nthe database is down\r\n."), qr/^451 4\.3\.0 /,
		'database down: 451 4.3.0');
	like(command($s, 'RSET'), qr/^250 /, 'database down: the session is still usable');
	like(command($s, 'MAIL FROM:<b@example.org>'), qr/^250 /, 'database down: a new transaction starts');
	close $s;
}
$node->start;
my $back = poll_until(
	sub {
		($rc, $out) = swaks('--port', $port{smtp}, '--from', 'b@example.org', '--to', 'a@example.net',
			'--data', '@' . message_file('back.eml', "Subject: back\r\n\r\nagain"));
		return queued_id($out);
	},
	60);
ok(defined $back, 'database back: admission resumes after reconnecting');
push @stored, $back;
stored_as_sent($back, "Subject: back\r\n\r\nagain\r\n", 'after the reconnect');

#
# What was stored is exactly what was acknowledged, and ingress survived.
#
is($node->safe_psql($db, 'SELECT string_agg(id::text, \',\' ORDER BY id) FROM pepsi.workqueue'),
	join(',', sort { $a <=> $b } grep { defined } @stored),
	'the queue holds exactly the messages acknowledged with 250');
{
	my ($s, $banner) = connect_raw($port{smtp});
	like($banner, qr/^220 mx\.test ESMTP/, 'pepsi-ingress is still serving');
	close $s;
}
# (The server's own "FATAL: the database system is starting up", relayed
# on a reconnect attempt, and the FATAL it sends an idle connection as it
# stops, are not ingress's.)
unlike(join('', grep { !/database connection \d+: (?:cannot connect to the database|lost the database connection|the server says)/ } split /^/, slurp_file($log)),
	qr/(?:AddressSanitizer|runtime error|Segmentation|fatal)/i,
	'and logged nothing fatal');

$ingress->signal('TERM');
ok(eval { $ingress->finish; 1 } && wait_for_log(qr/stopped/), 'SIGTERM stops it cleanly');

done_testing();
