# pepsi-ingress authenticates what it receives (daemons/ingress/verify.c):
# iprev, SPF for MAIL FROM and HELO, DKIM (keys made for this run,
# messages signed by python3-dkim and Mail::DKIM), DMARC, against zones
# served by the tests' DNS server (TestDNS).  Every stored message's
# Authentication-Results is checked against state.auth, and its DKIM
# verdicts against what python3-dkim and Mail::DKIM compute on the same
# bytes through the same DNS.  A session whose DNS never answers gets
# temperror and its message is still taken, and does not hold up ten
# others meanwhile.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;
use Mail::DKIM::DNS;
use Mail::DKIM::PrivateKey;
use Mail::DKIM::Signer;
use Mail::DKIM::Verifier;
use MIME::Base64 qw(encode_base64);
use Net::DNS::Resolver;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use PepsiTest;
use PythonWarm;
use SmtpClient;
use TestDNS;

my $db = 'postgres';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $node = pepsi_node('ingress_auth', extension => 1);

#
# Keys, made for this run: RSA 2048 (openssl) and Ed25519 (PyNaCl).
#
sub run_ok
{
	my ($cmd, $in) = @_;
	my ($out, $err) = ('', '');

	IPC::Run::run($cmd, '<', \($in // ''), '>', \$out, '2>', \$err)
	  or die "@$cmd: $err";
	return $out;
}

# python3 snippets (python3-dkim's signer and verifier, PyNaCl) run as
# "python3 -c CODE ARGS" would, in one interpreter kept running: a python3
# start and its imports for each of dozens of calls were most of the
# test's time.  py_ok(CODE, [ARGS], STDIN) or py_ok(\FILE, [ARGS], STDIN).
my $py = PythonWarm->new;

sub py_ok
{
	my ($code, $argv, $in) = @_;
	my ($exit, $out, $err) =
	  ref $code ? $py->run_file($$code, $argv, $in) : $py->run($code, $argv, $in);

	die "python3 @{[ ref $code ? $$code : '-c' ]} @$argv: $err" if $exit != 0;
	return $out;
}

run_ok([ 'openssl', 'genrsa', '-out', "$tmp/rsa.pem", '2048' ]);
my $rsa_public = run_ok([ 'openssl', 'rsa', '-in', "$tmp/rsa.pem", '-pubout', '-outform', 'DER' ]);
$rsa_public = encode_base64($rsa_public, '');
my ($ed_private, $ed_public) = split /\n/, py_ok(
	'import nacl.signing, base64; k = nacl.signing.SigningKey.generate(); '
	  . 'print(base64.b64encode(bytes(k)).decode()); '
	  . 'print(base64.b64encode(bytes(k.verify_key)).decode())',
	[]);
PostgreSQL::Test::Utils::append_to_file("$tmp/ed25519.key", $ed_private);
# A second RSA key, published where the first one signs: the wrong key.
run_ok([ 'openssl', 'genrsa', '-out', "$tmp/other.pem", '2048' ]);
my $other_public = encode_base64(
	run_ok([ 'openssl', 'rsa', '-in', "$tmp/other.pem", '-pubout', '-outform', 'DER' ]), '');

#
# The DNS
#
my $dns = TestDNS->new($tmp);
my $zone = <<'ZONE';
1.0.0.127.in-addr.arpa. 300 IN PTR mx.client.test.
mx.client.test. 300 IN A 127.0.0.1
2.0.0.127.in-addr.arpa. 300 IN PTR liar.client.test.
liar.client.test. 300 IN A 192.0.2.9
4.0.0.127.in-addr.arpa. 300 IN PTR slow.client.test.
; silent slow.client.test
spf-pass.test. 300 IN TXT "v=spf1 ip4:127.0.0.0/8 -all"
spf-fail.test. 300 IN TXT "v=spf1 ip4:192.0.2.0/24 -all"
spf-softfail.test. 300 IN TXT "v=spf1 ~all"
spf-neutral.test. 300 IN TXT "v=spf1 ?all"
spf-permerror.test. 300 IN TXT "v=spf1 ip4:300.1.1.1 -all"
spf-loop.test. 300 IN TXT "v=spf1 include:spf-loop.test -all"
spf-none.test. 300 IN MX 10 mx.spf-none.test.
spf-temperror.test. 300 IN MX 10 mx.spf-temperror.test.
; silent spf-temperror.test
mx.client.test. 300 IN TXT "v=spf1 a -all"
signed.test. 300 IN TXT "v=spf1 -all"
_dmarc.spf-pass.test. 300 IN TXT "v=DMARC1; p=reject"
_dmarc.signed.test. 300 IN TXT "v=DMARC1; p=reject; adkim=r"
_dmarc.reject.test. 300 IN TXT "v=DMARC1; p=reject"
_dmarc.quarantine.test. 300 IN TXT "v=DMARC1; p=quarantine"
_dmarc.org.test. 300 IN TXT "v=DMARC1; p=none; sp=reject"
_dmarc.strict.test. 300 IN TXT "v=DMARC1; p=reject; adkim=s"
ZONE
$zone .= TestDNS::txt('rsa._domainkey.signed.test.', "v=DKIM1; k=rsa; p=$rsa_public");
$zone .= TestDNS::txt('rsa._domainkey.strict.test.', "v=DKIM1; k=rsa; p=$rsa_public");
$zone .= TestDNS::txt('arc._domainkey.forwarder.test.', "v=DKIM1; k=rsa; p=$rsa_public");
$zone .= TestDNS::txt('arc._domainkey.stranger.test.', "v=DKIM1; k=rsa; p=$rsa_public");
$zone .= TestDNS::txt('ed._domainkey.signed.test.', "v=DKIM1; k=ed25519; p=$ed_public");
$zone .= TestDNS::txt('wrong._domainkey.signed.test.', "v=DKIM1; k=rsa; p=$other_public");
$zone .= TestDNS::txt('edasrsa._domainkey.signed.test.', "v=DKIM1; k=rsa; p=$ed_public");
$zone .= TestDNS::txt('huge._domainkey.signed.test.', 'v=DKIM1; k=rsa; p=' . ('A' x 4000));
$dns->zone($zone);

#
# pepsi-ingress: one listener enforcing DMARC, one rejecting SPF fail,
# one reporting only.
#
my %port = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } qw(mx strict report);
my $conf = "$tmp/pepsi.conf";
# The timeouts are what a name that never answers costs (temperror), and
# long enough that a test DNS server slow under load is not taken for one
# (with 1 s, a loaded machine turned the first message's passes into
# temperrors).
PostgreSQL::Test::Utils::append_to_file($conf, <<"CONF");
[pepsi]
HOSTNAME = mx.test
DNS_FORWARDER = @{[ $dns->forwarder ]}
DNS_TIMEOUT = 4s
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
AUTHSERV_ID = auth.test
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 2
DNS_MESSAGE_BUDGET = 8s
ARC_TRUSTED_SEALERS = list.example, forwarder.test
[listener-mx]
ADDRESS = 127.0.0.1
PORT = $port{mx}
MESSAGE_AUTHENTICATION = on
TRUSTED_MESSAGE_AUTHENTICATION = on
DMARC_POLICY = enforce
[listener-strict]
ADDRESS = 127.0.0.1
PORT = $port{strict}
MESSAGE_AUTHENTICATION = on
TRUSTED_MESSAGE_AUTHENTICATION = on
SPF_FAIL = reject
DMARC_POLICY = off
[listener-report]
ADDRESS = 127.0.0.1
PORT = $port{report}
MESSAGE_AUTHENTICATION = on
TRUSTED_MESSAGE_AUTHENTICATION = on
DMARC_POLICY = report
CONF

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-v', '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 1 ready/), 'ingress starts');

#
# Signing, by two independent signers
#
sub sign_python
{
	my ($message, $selector, $domain, $keyfile, $algorithm) = @_;

	return py_ok(
		'import sys, dkim; m = sys.stdin.buffer.read(); '
		  . 'k = open(sys.argv[3], "rb").read().strip(); '
		  . 'sys.stdout.buffer.write(dkim.sign(m, sys.argv[1].encode(), sys.argv[2].encode(), k, '
		  . 'signature_algorithm=sys.argv[4].encode(), '
		  . 'include_headers=[b"from", b"to", b"subject", b"date"]) + m)',
		[ $selector, $domain, $keyfile, $algorithm ],
		$message);
}

sub sign_perl
{
	my ($message, $selector, $domain, %opts) = @_;
	my $signer = Mail::DKIM::Signer->new(
		Algorithm => 'rsa-sha256',
		Method => 'relaxed',
		Domain => $domain,
		Selector => $selector,
		Key => Mail::DKIM::PrivateKey->load(File => "$tmp/rsa.pem"),
		Headers => 'from:to:subject',
		%opts);

	$signer->PRINT($message);
	$signer->CLOSE;
	return $signer->signature->as_string . "\r\n" . $message;
}

#
# Clients
#
my @stored;

sub message
{
	my ($from, $subject, $body) = @_;

	return "From: <$from>\r\nTo: <rcpt\@example.net>\r\nSubject: $subject\r\n"
	  . "Date: Tue, 1 Dec 2026 12:00:00 +0000\r\n\r\n"
	  . ($body // "Hello.\r\nThis is the body.\r\n");
}

# Send one message; returns the final reply and the stored row (or undef).
sub send_message
{
	my (%m) = @_;
	my $c = SmtpClient->new($port{ $m{listener} // 'mx' }, from => $m{client} // '127.0.0.1');
	my @r = (
		$c->command("EHLO " . ($m{helo} // 'mx.client.test')),
		$c->command("MAIL FROM:<$m{mail_from}>"),
		$c->command('RCPT TO:<rcpt@example.net>'),
		$c->command('DATA'));
	(my $data = $m{message}) =~ s/^\./../mg;
	$c->send($data . ".\r\n");
	my $reply = $c->reply(30);
	$c->close;
	my $row;
	if ($reply =~ /^250 2\.0\.0 Ok: queued as ([0-9A-Za-z]+)/)
	{
		my $id = queued_row($node, $reply);
		push @stored, $id;
		$row = row($id);
	}
	return ($reply, $row);
}

sub row
{
	my ($id) = @_;
	my $r = $node->safe_psql($db,
		    "SELECT json_build_object('state', state,"
		  . " 'raw', encode(w.headers || '\\x0d0a'::bytea || b.body, 'hex'))"
		  . " FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id"
		  . " WHERE w.id = $id");
	my $row = decode_json($r);

	$row->{raw} = pack('H*', $row->{raw});
	($row->{received}, $row->{ar}, $row->{original}) = $row->{raw} =~
	  /\A(Received: [^\r\n]*\r\n(?:\t[^\r\n]*\r\n)*)(Authentication-Results: [^\r\n]*\r\n(?:\t[^\r\n]*\r\n)*)(.*)\z/s;
	return $row;
}

# The A-R lines as method => [ "result props..." ], for comparisons.
sub ar_methods
{
	my ($ar) = @_;
	my %m;

	for my $line (split /;\r\n\t/, ($ar =~ s/\AAuthentication-Results: [^;]*;\r\n\t//r) =~ s/\r\n\z//r)
	{
		my ($method, $rest) = $line =~ /^(\w+)=(.*)$/;
		push @{ $m{$method} }, $rest;
	}
	return \%m;
}

#
# iprev
#
my ($reply, $row) = send_message(mail_from => 'a@spf-pass.test',
	message => message('a@spf-pass.test', 'iprev pass'));
like($reply, qr/^250 /, 'iprev pass: accepted');
is($row->{state}{auth}{iprev}{result}, 'pass', 'iprev pass: state.auth.iprev');
is($row->{state}{origin}{iprev}{name}, 'mx.client.test', 'iprev pass: state.origin.iprev has the name');
like($row->{received}, qr/^Received: from mx\.client\.test \(mx\.client\.test \[127\.0\.0\.1\]\)/,
	'iprev pass: Received says "from HELO (name [ip])"');
like($row->{ar}, qr/\tiprev=pass \(mx\.client\.test\) policy\.iprev=127\.0\.0\.1;/,
	'iprev pass: in Authentication-Results');

($reply, $row) = send_message(client => '127.0.0.2', mail_from => 'a@spf-pass.test',
	message => message('a@spf-pass.test', 'iprev fail'));
is($row->{state}{auth}{iprev}{result}, 'fail', 'iprev: a name that does not lead back is fail');
like($row->{received}, qr/^Received: from mx\.client\.test \(\[127\.0\.0\.2\]\)/,
	'iprev fail: no name in Received');
($reply, $row) = send_message(client => '127.0.0.3', mail_from => 'a@spf-pass.test',
	message => message('a@spf-pass.test', 'iprev permerror'));
is($row->{state}{auth}{iprev}{result}, 'permerror', 'iprev: no PTR is permerror');
($reply, $row) = send_message(client => '127.0.0.4', mail_from => 'a@spf-pass.test',
	message => message('a@spf-pass.test', 'iprev temperror'));
like($reply, qr/^250 /, 'iprev temperror: accepted all the same');
is($row->{state}{auth}{iprev}{result}, 'temperror', 'iprev: a forward lookup never answered is temperror');

#
# SPF: every result, MAIL FROM and HELO
#
for my $case (
	[ 'spf-pass.test', 'pass' ], [ 'spf-fail.test', 'fail' ],
	[ 'spf-softfail.test', 'softfail' ], [ 'spf-neutral.test', 'neutral' ],
	[ 'spf-none.test', 'none' ], [ 'spf-permerror.test', 'permerror' ],
	[ 'spf-loop.test', 'permerror' ], [ 'spf-temperror.test', 'temperror' ])
{
	my ($domain, $expected) = @$case;
	($reply, $row) = send_message(listener => 'report', mail_from => "x\@$domain",
		message => message("x\@$domain", "spf $expected"));
	like($reply, qr/^250 /, "SPF $domain: accepted (SPF_FAIL = tag)");
	is($row->{state}{auth}{spf}{result}, $expected, "SPF $domain: $expected");
	like($row->{ar}, qr/\tspf=\Q$expected\E (?:reason="(?:[^"\\]|\\.)*" )?smtp\.mailfrom=x\@\Q$domain\E;/,
		"SPF $domain: Authentication-Results");
}
is($row->{state}{auth}{spf_helo}{result}, 'pass', 'SPF: the HELO identity is checked too');
like($row->{ar}, qr/\tspf=pass (?:reason="[^"]*" )?smtp\.helo=mx\.client\.test;/,
	'SPF: HELO in Authentication-Results');

($reply, $row) = send_message(listener => 'report', mail_from => '',
	message => message('x@spf-pass.test', 'null sender'));
is($row->{state}{auth}{spf}{result}, 'pass', 'SPF: a null sender is checked by its HELO');
is($row->{state}{auth}{spf}{'smtp.helo'}, 'mx.client.test', 'SPF: ... as smtp.helo');

($reply, $row) = send_message(listener => 'strict', mail_from => 'x@spf-fail.test',
	message => message('x@spf-fail.test', 'spf reject'));
like($reply, qr/^550 5\.7\.23 /, 'SPF_FAIL = reject: 550 5.7.23 after DATA');
ok(!defined $row, 'SPF_FAIL = reject: nothing stored');
($reply, $row) = send_message(listener => 'strict', mail_from => 'x@spf-softfail.test',
	message => message('x@spf-softfail.test', 'spf softfail'));
like($reply, qr/^250 /, 'SPF_FAIL = reject: softfail is still taken');

#
# DKIM
#
my %dkim_sent;    # row id => the message as signed, for the cross-check

sub dkim_case
{
	my ($label, $signed, $expected, %m) = @_;

	($reply, $row) = send_message(listener => 'report', mail_from => $m{mail_from} // 'x@other.test',
		message => $signed);
	like($reply, qr/^250 /, "DKIM $label: accepted");
	my @results = map { $_->{result} } @{ $row->{state}{auth}{dkim} // [] };
	is_deeply(\@results, $expected, "DKIM $label: @$expected") or diag(explain($row->{state}{auth}));
	$dkim_sent{ $stored[-1] } = $signed if $row;
	return $row;
}

my $plain = message('a@signed.test', 'dkim');
$row = dkim_case('rsa-sha256 by python3-dkim',
	sign_python($plain, 'rsa', 'signed.test', "$tmp/rsa.pem", 'rsa-sha256'), ['pass']);
is($row->{state}{auth}{dkim}[0]{'header.d'}, 'signed.test', 'DKIM: header.d');
is($row->{state}{auth}{dkim}[0]{'header.s'}, 'rsa', 'DKIM: header.s');
is($row->{state}{auth}{dkim}[0]{'header.a'}, 'rsa-sha256', 'DKIM: header.a');
like($row->{ar}, qr/\tdkim=pass header\.d=signed\.test header\.i=\@signed\.test header\.s=rsa header\.a=rsa-sha256 header\.b="?[^ ;]{8}"?;/,
	'DKIM: Authentication-Results with the RFC 8601 properties');
dkim_case('ed25519-sha256 by python3-dkim',
	sign_python($plain, 'ed', 'signed.test', "$tmp/ed25519.key", 'ed25519-sha256'), ['pass']);
dkim_case('rsa-sha256 by Mail::DKIM', sign_perl($plain, 'rsa', 'signed.test'), ['pass']);
my $two = sign_python(sign_perl($plain, 'rsa', 'signed.test'), 'ed', 'signed.test',
	"$tmp/ed25519.key", 'ed25519-sha256');
dkim_case('two signatures', $two, [ 'pass', 'pass' ]);

my $tampered = sign_python($plain, 'rsa', 'signed.test', "$tmp/rsa.pem", 'rsa-sha256');
$tampered =~ s/This is the body/This is the BODY/;
$row = dkim_case('body changed after signing', $tampered, ['fail']);
like($row->{state}{auth}{dkim}[0]{reason}, qr/body hash/, 'DKIM: the reason says body hash');
(my $header_changed = sign_python($plain, 'rsa', 'signed.test', "$tmp/rsa.pem", 'rsa-sha256'))
  =~ s/Subject: dkim/Subject: DKIM changed/;
dkim_case('signed header changed', $header_changed, ['fail']);
dkim_case('expired',
	sign_perl($plain, 'rsa', 'signed.test', Timestamp => time - 7200, Expiration => time - 3600),
	['fail']);
dkim_case('missing key', sign_python($plain, 'nokey', 'signed.test', "$tmp/rsa.pem", 'rsa-sha256'),
	['permerror']);
dkim_case('wrong key', sign_python($plain, 'wrong', 'signed.test', "$tmp/rsa.pem", 'rsa-sha256'),
	['fail']);
dkim_case('an ed25519 key published as k=rsa',
	sign_python($plain, 'edasrsa', 'signed.test', "$tmp/ed25519.key", 'ed25519-sha256'),
	['permerror']);
dkim_case('a key record of 4000 characters',
	sign_python($plain, 'huge', 'signed.test', "$tmp/rsa.pem", 'rsa-sha256'), ['permerror']);
my $absurd = "DKIM-Signature: v=1; a=rsa-sha256; d=signed.test; s=rsa; c=relaxed;"
  . " h=" . join(":\r\n\t", map { join(':', ('from') x 50) } 1 .. 40)
  . "; l=99999999999999999999; bh=AAAA; b=AAAA\r\n" . $plain;
dkim_case('absurd tags', $absurd, ['permerror']);
my $garbage = "DKIM-Signature: this is not a tag list\r\n" . $plain;
dkim_case('no tag list', $garbage, ['permerror']);
my $body = "Hello.\r\nThis is the body.\r\n";
my $with_l = sign_perl(message('a@signed.test', 'l='), 'rsa', 'signed.test', Method => 'relaxed');
# Mail::DKIM's l= needs the BodyLength option, which is not in its public API: use python.
$with_l = py_ok(
	'import sys, dkim; m = sys.stdin.buffer.read(); k = open(sys.argv[1], "rb").read(); '
	  . 'sys.stdout.buffer.write(dkim.sign(m, b"rsa", b"signed.test", k, length=True, '
	  . 'include_headers=[b"from", b"to", b"subject"]) + m)',
	["$tmp/rsa.pem"],
	message('a@signed.test', 'l='));
dkim_case('l= covering the whole body', $with_l, ['pass']);
dkim_case('l= with content appended', $with_l . "Unsigned content, appended later.\r\n", ['policy']);

#
# DMARC
#
($reply, $row) = send_message(mail_from => 'x@spf-pass.test',
	message => message('boss@spf-pass.test', 'dmarc by spf'));
like($reply, qr/^250 /, 'DMARC pass by SPF alignment only: accepted');
is($row->{state}{auth}{dmarc}{result}, 'pass', 'DMARC pass by SPF alignment only');
like($row->{ar}, qr/\tdmarc=pass reason="SPF aligned" header\.from=spf-pass\.test policy\.dmarc=reject;/,
	'DMARC: Authentication-Results');

($reply, $row) = send_message(mail_from => 'x@spf-fail.test',
	message => sign_python($plain, 'rsa', 'signed.test', "$tmp/rsa.pem", 'rsa-sha256'));
like($reply, qr/^250 /, 'DMARC pass by DKIM alignment only: accepted (SPF fails)');
is($row->{state}{auth}{dmarc}{result}, 'pass', 'DMARC pass by DKIM alignment only');
is($row->{state}{auth}{dmarc}{reason}, 'DKIM aligned', 'DMARC: by DKIM');

($reply, $row) = send_message(mail_from => 'x@spf-fail.test',
	message => message('ceo@reject.test', 'dmarc reject'));
like($reply, qr/^550 5\.7\.1 /, 'DMARC fail with p=reject, enforced: 550 5.7.1 after DATA');
ok(!defined $row, 'DMARC p=reject: nothing stored');
ok(file_shows($log, qr/dmarc fail for reject\.test \(policy reject, action reject\)/),
	'DMARC p=reject: logged');

($reply, $row) = send_message(listener => 'report', mail_from => 'x@spf-fail.test',
	message => message('ceo@reject.test', 'dmarc report only'));
like($reply, qr/^250 /, 'DMARC_POLICY = report: p=reject is taken');
is($row->{state}{auth}{dmarc}{result}, 'fail', 'DMARC report: recorded as fail');
is($row->{state}{auth}{dmarc}{action}, 'none', 'DMARC report: no action');

($reply, $row) = send_message(mail_from => 'x@spf-fail.test',
	message => message('ceo@quarantine.test', 'dmarc quarantine'));
like($reply, qr/^250 /, 'DMARC fail with p=quarantine: stored');
is($row->{state}{auth}{dmarc}{action}, 'quarantine', 'DMARC p=quarantine: state.auth.dmarc.action');

($reply, $row) = send_message(mail_from => 'x@spf-fail.test',
	message => message('a@org.test', 'dmarc p=none'));
is($row->{state}{auth}{dmarc}{action}, 'none', 'DMARC p=none at the organizational domain');
($reply, $row) = send_message(mail_from => 'x@spf-fail.test',
	message => message('a@deep.sub.org.test', 'dmarc sp'));
like($reply, qr/^550 5\.7\.1 /, 'DMARC: a subdomain takes sp=reject from the organizational domain');

($reply, $row) = send_message(mail_from => 'x@spf-fail.test',
	message => sign_python(message('a@mail.strict.test', 'strict'), 'rsa', 'strict.test',
		"$tmp/rsa.pem", 'rsa-sha256'));
like($reply, qr/^550 5\.7\.1 /, 'DMARC adkim=s: a parent domain signature does not align');
($reply, $row) = send_message(mail_from => 'x@spf-fail.test',
	message => "From: a\@signed.test\r\nFrom: b\@other.test\r\nSubject: two\r\n\r\nx\r\n");
is($row->{state}{auth}{dmarc}{result}, 'permerror', 'DMARC: two From fields are a permerror');

#
# ARC: chains sealed by python3-dkim's arc_sign (t/bin/arc-sign), as a
# mailing list that forwards would seal them.
#
sub arc_sealed
{
	my ($message, $domain) = @_;
	my $file = "$tmp/arc-" . time() . "-" . rand() . ".eml";

	open my $fh, '>:raw', $file or die;
	print $fh "Authentication-Results: $domain; spf=pass smtp.mailfrom=x\@$domain\r\n$message";
	close $fh;
	return py_ok(\(dirname(__FILE__) . '/bin/arc-sign'), [ $file, "$tmp/rsa.pem", $domain, 'arc', $domain ]);
}

my $forwarded = arc_sealed(message('ceo@reject.test', 'forwarded'), 'forwarder.test');
($reply, $row) = send_message(listener => 'report', mail_from => 'x@spf-fail.test', message => $forwarded);
is($row->{state}{auth}{arc}{result}, 'pass', 'ARC: a chain sealed by python3-dkim passes');
is($row->{state}{auth}{arc}{'header.oldest-pass'}, '1', 'ARC: oldest-pass');
is($row->{state}{auth}{arc}{sealer}, 'forwarder.test', 'ARC: the sealer is recorded');
like($row->{ar}, qr/\tarc=pass header\.oldest-pass=1\r\n\z/, 'ARC: Authentication-Results');
(my $broken = $forwarded) =~ s/This is the body/This is the changed body/;
($reply, $row) = send_message(listener => 'report', mail_from => 'x@spf-fail.test', message => $broken);
is($row->{state}{auth}{arc}{result}, 'fail', 'ARC: a body changed after sealing fails');
($reply, $row) = send_message(mail_from => 'x@spf-fail.test', message => $forwarded);
like($reply, qr/^250 /, 'ARC: a DMARC p=reject fail sealed by a trusted sealer is taken');
is($row->{state}{auth}{dmarc}{result}, 'fail', 'ARC: ... DMARC still says fail');
is($row->{state}{auth}{dmarc}{override}, 'arc', '... overridden by the trusted chain');
($reply, $row) = send_message(mail_from => 'x@spf-fail.test',
	message => arc_sealed(message('ceo@reject.test', 'stranger'), 'stranger.test'));
like($reply, qr/^550 5\.7\.1 /, 'ARC: a passing chain from a sealer not trusted does not override DMARC');

#
# DNS that never answers: temperror, the message taken, and ten other
# sessions served while it waits.
#
my $slow = SmtpClient->new($port{report});
$slow->command('EHLO mx.client.test');
$slow->command('MAIL FROM:<x@spf-temperror.test>');
$slow->command('RCPT TO:<rcpt@example.net>');
$slow->command('DATA');
$slow->send(message('x@spf-temperror.test', 'slow') . ".\r\n");
my $others = 0;
for my $i (1 .. 10)
{
	my ($r) = send_message(listener => 'report', mail_from => "x\@spf-pass.test",
		message => message('x@spf-pass.test', "other $i"));
	$others++ if $r =~ /^250 /;
}
my $slow_reply = $slow->reply(30);
is($others, 10, 'ten sessions were served while one waited for its DNS');
like($slow_reply, qr/^250 /, 'the session whose DNS never answered: its message is taken');
$slow->close;
my $slow_id = queued_row($node, $slow_reply);
push @stored, $slow_id;
is(row($slow_id)->{state}{auth}{spf}{result}, 'temperror', '... with spf=temperror');

#
# Every stored row: Authentication-Results is state.auth, written out.
#
my $mismatch = 0;
for my $id (@stored)
{
	my $r = row($id);
	my $m = ar_methods($r->{ar} // '');
	my $auth = $r->{state}{auth};

	$mismatch++ unless ($m->{spf}[0] // '') =~ /^\Q$auth->{spf}{result}\E\b/;
	$mismatch++ unless scalar(@{ $m->{dkim} // [] }) == (@{ $auth->{dkim} } || 1);
	for my $i (0 .. $#{ $auth->{dkim} })
	{
		$mismatch++ unless ($m->{dkim}[$i] // '') =~ /^\Q$auth->{dkim}[$i]{result}\E\b/;
	}
	if ($auth->{dmarc})
	{
		$mismatch++ unless ($m->{dmarc}[0] // '') =~ /^\Q$auth->{dmarc}{result}\E\b/;
	}
	else
	{
		$mismatch++ if $m->{dmarc};    # DMARC_POLICY = off: not in either
	}
	$mismatch++ unless ($m->{iprev}[0] // '') =~ /^\Q$auth->{iprev}{result}\E\b/;
}
is($mismatch, 0, 'every stored Authentication-Results says what state.auth says (' . scalar(@stored) . ' rows)');

#
# Cross-check: python3-dkim and Mail::DKIM on the same bytes, same DNS.
#
my $resolver = Net::DNS::Resolver->new(nameservers => ['127.0.0.1'], port => $dns->port,
	recurse => 1);
Mail::DKIM::DNS::resolver($resolver);
my $py_verify = <<'PY';
import sys, dkim, dns.resolver
r = dns.resolver.Resolver(configure=False)
r.nameservers = ['127.0.0.1']
r.port = int(sys.argv[1])
def txt(name, timeout=5):
    try:
        a = r.resolve(name.decode().rstrip('.'), 'TXT')
    except Exception:
        return None
    return b''.join(a[0].strings)
m = sys.stdin.buffer.read()
d = dkim.DKIM(m)
n = sum(1 for h in d.headers if h[0].lower() == b'dkim-signature')
out = []
for i in range(n):
    try:
        out.append('pass' if d.verify(idx=i, dnsfunc=txt) else 'fail')
    except Exception:
        out.append('fail')
print(' '.join(out))
PY
my $disagree = 0;
my $compared = 0;
my $no_ed25519 = 0;
for my $id (sort { $a <=> $b } keys %dkim_sent)
{
	my $r = row($id);
	my @ours = map { $_->{result} eq 'pass' ? 'pass' : 'fail' } @{ $r->{state}{auth}{dkim} };
	my @py = split ' ', py_ok($py_verify, [ $dns->port ], $r->{original});
	my $v = Mail::DKIM::Verifier->new;
	$v->PRINT($r->{original});
	$v->CLOSE;
	# Mail::DKIM lists signatures in header order, as we do.
	my @perl = map { $_->result eq 'pass' ? 'pass' : 'fail' } $v->signatures;
	my @detail = map { $_->result_detail } $v->signatures;
	# Debian 12's Mail::DKIM cannot verify Ed25519: no opinion there.  A
	# signature it cannot even parse, it does not list: not a pass.
	for my $i (0 .. $#ours)
	{
		$perl[$i] //= 'fail';
		if (($detail[$i] // '') =~ /unsupported algorithm ed25519/)
		{
			$perl[$i] = $ours[$i];
			$no_ed25519++;
		}
	}
	my ($subject) = $r->{original} =~ /^Subject: ([^\r\n]*)/m;

	$compared++;
	if ("@ours" ne "@py" || "@ours" ne "@perl")
	{
		# l= with appended content: both libraries say pass; we say policy on purpose.
		next if $r->{state}{auth}{dkim}[0]{result} eq 'policy' && "@py" eq 'pass';
		$disagree++;
		diag("row $id ($subject): ours @ours, python3-dkim @py, Mail::DKIM @perl (@detail)");
	}
}
ok($compared >= 10, "the DKIM cases were cross-checked ($compared)");
is($disagree, 0, 'python3-dkim and Mail::DKIM agree with every stored DKIM verdict'
	  . " (Mail::DKIM skipped $no_ed25519 Ed25519 signatures it cannot verify)");

ok(!file_shows($log, qr/fatal|assert|AddressSanitizer/i, 0.1), 'no fatal in the log');
$ingress->signal('TERM');
ok(eval { $ingress->finish; 1 } && file_shows($log, qr/stopped/), 'SIGTERM stops it cleanly');
$dns->stop;
done_testing();
