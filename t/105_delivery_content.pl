# What the SMTP client sends a next hop that cannot take the message as
# it is, through the smarthost stage to the scripted peer
# (t/bin/smtp-peer), which records the bytes it got:
#   - CHUNKING offered: the message goes with BDAT, byte for byte;
#   - a BINARYMIME body with a bare CR: with BDAT BODY=BINARYMIME to a
#     peer with CHUNKING and BINARYMIME, else converted (never raw over
#     DATA);
#   - an 8-bit body to a peer without 8BITMIME arrives quoted-printable
#     and decodes to the original;
#   - SMTPUTF8 mail to a peer without SMTPUTF8 bounces with 5.6.7;
#   - a REQUIRETLS message to a peer without TLS is not sent (5.7.30), and
#     goes with REQUIRETLS to a verified peer that offers it.

use strict;
use warnings FATAL => 'all';

use MIME::QuotedPrint qw(decode_qp);
use MIME::Base64 qw(decode_base64);
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('delivery_content');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

my $d;
# Deliver through a peer started with @args; returns the row id.
sub deliver_to
{
	my ($peer, %m) = @_;

	stop_dispatcher($d) if $d;
	my $config = delivery_config($node, maildir_root => $root,
		smarthost => "127.0.0.1:$peer->{port}",
		extra => { smarthost => ($m{options} // '') . "RETRY_BASE = 60s\nRETRY_MAX = 60s\n" });
	$d = start_dispatcher($config);
	return inject($node, to => [ $m{to} ], headers => $m{headers}, body => $m{body},
		state => $m{state} // '{}');
}

sub message_with_subject
{
	my ($peer, $subject) = @_;
	my ($m) = grep { $_->{data} =~ /^Subject: \Q$subject\E\r?$/m } peer_messages($peer);
	return $m;
}

sub dsn_status
{
	my ($rcpt) = @_;
	my @dsns;
	poll_until(sub {
		@dsns = grep { slurp($_) =~ /Final-Recipient: rfc822;\s*\Q$rcpt\E/i } maildir_files($root, $sender);
		@dsns > 0;
	}) or return undef;
	my ($message, $recipients) = dsn_fields(parse_dsn(slurp($dsns[0])));
	return $recipients->[0];
}

# --- BDAT when the peer offers CHUNKING ---------------------------------
my $chunking = start_peer('--chunking');
my $body = "line one\r\n.a line that DATA would dot-stuff\r\nlast line\r\n";
deliver_to($chunking, to => 'bdat@remote.test',
	headers => "From: <$sender>\r\nTo: <bdat\@remote.test>\r\nSubject: bdat\r\n", body => $body);
ok(poll_until(sub { message_with_subject($chunking, 'bdat') }), 'CHUNKING: delivered');
my $transcript = slurp("$chunking->{dir}/transcript");
like($transcript, qr/-> BDAT \d+ LAST/, 'the message went with BDAT');
unlike($transcript, qr/-> DATA/, 'not with DATA');
my $m = message_with_subject($chunking, 'bdat');
like($m->{data}, qr/\r\n\r\n\Q$body\E\z/, 'the body arrived byte for byte, not dot-stuffed');
ok(poll_until(sub { queue_count($node) == 0 }), 'the row is finished');

# --- a bare CR in a BINARYMIME body ---------------------------------------
my $binary_body = "before\rafter a bare CR\r\nsecond line\r\n";
my $binary_state = '{"origin": {"body": "BINARYMIME"}}';
my $binary = start_peer('--chunking', '--binarymime');
deliver_to($binary, to => 'binary@remote.test', state => $binary_state,
	headers => "From: <$sender>\r\nTo: <binary\@remote.test>\r\nSubject: binary\r\n"
	  . "MIME-Version: 1.0\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: binary\r\n",
	body => $binary_body);
ok(poll_until(sub { message_with_subject($binary, 'binary') }),
	'BINARYMIME to a peer with CHUNKING and BINARYMIME: delivered');
$m = message_with_subject($binary, 'binary');
like($m->{env}, qr/^MAIL FROM:<\Q$sender\E> .*BODY=BINARYMIME/m, 'declared BODY=BINARYMIME');
like($m->{data}, qr/\r\n\r\n\Q$binary_body\E\z/, 'the bare CR arrived as it was, with BDAT');

# The same to a peer without CHUNKING: converted, never raw over DATA.
my $plain = start_peer();
deliver_to($plain, to => 'nochunk@remote.test', state => $binary_state,
	headers => "From: <$sender>\r\nTo: <nochunk\@remote.test>\r\nSubject: nochunk\r\n"
	  . "MIME-Version: 1.0\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: binary\r\n",
	body => $binary_body);
ok(poll_until(sub { message_with_subject($plain, 'nochunk') }), 'to a peer without CHUNKING: delivered converted');
$m = message_with_subject($plain, 'nochunk');
unlike($m->{data}, qr/\r(?!\n)/, 'no bare CR went over DATA');
like($m->{data}, qr/^Content-Transfer-Encoding: base64\r$/mi, 'the binary part is base64 now');
unlike($m->{data}, qr/^Content-Transfer-Encoding: binary/mi, 'the old encoding is gone');
my ($encoded) = $m->{data} =~ /\r\n\r\n(.*)\z/s;
is(decode_base64($encoded), $binary_body, 'and it decodes to the original octets');

# A multipart whose text part holds a bare CR: that part quoted-printable, the rest untouched.
my $multi_body = "preamble\r\n--b1\r\nContent-Type: text/plain\r\n\r\nplain part\r\n"
  . "--b1\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: binary\r\n\r\n"
  . "r\xc3\xa9sum\xc3\xa9\rwith CR\r\n--b1--\r\n";
deliver_to($plain, to => 'multi@remote.test', state => $binary_state,
	headers => "From: <$sender>\r\nTo: <multi\@remote.test>\r\nSubject: multi\r\n"
	  . "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"b1\"\r\n",
	body => $multi_body);
ok(poll_until(sub { message_with_subject($plain, 'multi') }), 'a multipart with a bare CR: delivered');
$m = message_with_subject($plain, 'multi');
unlike($m->{data}, qr/\r(?!\n)/, 'no bare CR in it');
like($m->{data}, qr/--b1\r\nContent-Type: text\/plain\r\n\r\nplain part\r\n--b1\r\n/, 'the clean part is untouched');
like($m->{data}, qr/Content-Transfer-Encoding: quoted-printable\r\n\r\nr=C3=A9sum=C3=A9=0Dwith CR\r\n--b1--/,
	'the text part with the bare CR is quoted-printable');

# Content that cannot be converted (raw octets in a part that claims base64) bounces with 5.6.3.
deliver_to($plain, to => 'broken@remote.test', state => $binary_state,
	headers => "From: <$sender>\r\nTo: <broken\@remote.test>\r\nSubject: broken\r\n"
	  . "MIME-Version: 1.0\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\n",
	body => "AAAA\rBBBB\r\n");
my $status = dsn_status('broken@remote.test');
is($status->{status}, '5.6.3', 'binary content that cannot be converted: bounced with 5.6.3');
like($status->{'diagnostic-code'} // '', qr/cannot be converted/, 'the DSN says why');
ok(!message_with_subject($plain, 'broken'), 'and nothing was sent');

# --- 8-bit to a peer without 8BITMIME ---------------------------------------
my $seven = start_peer('--no-8bitmime');
my $eight_body = "Gr\xc3\xbc\xc3\x9fe aus K\xc3\xb6ln\r\n" . ('x' x 90) . "\xc3\xa9\r\ntrailing space \r\n";
deliver_to($seven, to => 'seven@remote.test',
	headers => "From: <$sender>\r\nTo: <seven\@remote.test>\r\nSubject: seven\r\n"
	  . "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n",
	body => $eight_body);
ok(poll_until(sub { message_with_subject($seven, 'seven') }), '8-bit to a peer without 8BITMIME: delivered');
$m = message_with_subject($seven, 'seven');
unlike($m->{data}, qr/[\x80-\xff]/, 'nothing 8-bit went to the peer');
unlike($m->{env}, qr/BODY=8BITMIME/, 'and no BODY=8BITMIME was declared');
like($m->{data}, qr/^Content-Transfer-Encoding: quoted-printable\r$/m, 'the body is quoted-printable');
($encoded) = $m->{data} =~ /\r\n\r\n(.*)\z/s;
ok(!grep({ length($_) > 76 } split /\r\n/, $encoded), 'no encoded line is longer than 76');
(my $decoded = decode_qp($encoded)) =~ s/\r?\n/\r\n/g;
is($decoded, $eight_body, 'it decodes to the original body');

# --- SMTPUTF8 to a peer without it ----------------------------------------
deliver_to($plain, to => 'utf8@remote.test', state => '{"origin": {"smtputf8": true}}',
	headers => "From: <$sender>\r\nTo: <utf8\@remote.test>\r\nSubject: J\xc3\xbcrgen's utf8\r\n");
$status = dsn_status('utf8@remote.test');
is($status->{status}, '5.6.7', 'SMTPUTF8 mail to a peer without SMTPUTF8: bounced with 5.6.7');
like($status->{'diagnostic-code'} // '', qr/SMTPUTF8/, 'the DSN says why');
ok(!message_with_subject($plain, "J\xc3\xbcrgen's utf8"), 'and nothing was sent');

# The same to a peer with SMTPUTF8.
my $utf8 = start_peer('--smtputf8');
deliver_to($utf8, to => 'utf8ok@remote.test', state => '{"origin": {"smtputf8": true}}',
	headers => "From: <$sender>\r\nTo: <utf8ok\@remote.test>\r\nSubject: utf8ok \xc3\xbc\r\n");
ok(poll_until(sub { message_with_subject($utf8, "utf8ok \xc3\xbc") }), 'to a peer with SMTPUTF8: delivered');
like(message_with_subject($utf8, "utf8ok \xc3\xbc")->{env}, qr/ SMTPUTF8/, 'with the SMTPUTF8 parameter');

# --- REQUIRETLS -------------------------------------------------------------
for my $name (qw(peer))
{
	system('openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
		'-nodes', '-keyout', "$tmp/$name-key.pem", '-out', "$tmp/$name-cert.pem", '-days', '2',
		'-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1')
	  == 0
	  or die "openssl req failed for $name";
}
deliver_to($plain, to => 'requiretls@remote.test', state => '{"origin": {"requiretls": true}}',
	options => "TLS = may\n",
	headers => "From: <$sender>\r\nTo: <requiretls\@remote.test>\r\nSubject: requiretls\r\n");
$status = dsn_status('requiretls@remote.test');
is($status->{status}, '5.7.30', 'REQUIRETLS to a peer without TLS: bounced with 5.7.30');
ok(!message_with_subject($plain, 'requiretls'), 'and nothing was sent');
unlike(slurp("$plain->{dir}/transcript"), qr/-> MAIL FROM:<\Q$sender\E> .*REQUIRETLS/, 'not even MAIL FROM');

my $secure = start_peer('--tls-cert', "$tmp/peer-cert.pem", '--tls-key', "$tmp/peer-key.pem", '--requiretls');
deliver_to($secure, to => 'requiretls-ok@remote.test', state => '{"origin": {"requiretls": true}}',
	options => "TLS = verify\nTLS_CA_FILE = $tmp/peer-cert.pem\n",
	headers => "From: <$sender>\r\nTo: <requiretls-ok\@remote.test>\r\nSubject: requiretls-ok\r\n");
ok(poll_until(sub { message_with_subject($secure, 'requiretls-ok') }),
	'REQUIRETLS over verified TLS to a peer offering it: delivered')
  or diag($node->safe_psql('postgres', 'SELECT status, state FROM pepsi.workqueue'),
	slurp("$secure->{dir}/transcript"), slurp("$secure->{dir}/peer.log"));
like((message_with_subject($secure, 'requiretls-ok') // {})->{env} // '', qr/ REQUIRETLS/,
	'with MAIL FROM ... REQUIRETLS');

stop_dispatcher($d);
stop_process($_) for ($chunking, $binary, $plain, $seven, $utf8, $secure);
done_testing();
