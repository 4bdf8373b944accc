# An 8-bit message signed with DKIM and relayed to a next hop without
# 8BITMIME: the relay must convert it (RFC 6152), which would break a
# signature made over the 8-bit bytes.  So the signing stage converts
# first (DOWNGRADE_8BIT = yes, RFC 6376 5.3) and signs what every hop will
# get: the message arrives at the 7-bit peer quoted-printable, unchanged by
# the relay, and python3-dkim, Mail::DKIM and libopendkim all verify it.
# Without DOWNGRADE_8BIT the relay's conversion breaks the signature (the
# reason the option exists).

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use MIME::QuotedPrint qw(decode_qp);
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest qw(start_peer stop_process peer_messages);
use PepsiStage;
use PepsiTest;
use SignTest;

my $node = stage_node('dkim_downgrade');
my $dir = PostgreSQL::Test::Utils::tempdir();
my ($path, $record) = make_key($dir, 'org', 'rsa-sha256');
my %zone = ('s1._domainkey.example.org' => $record);

my $peer = start_peer('--no-8bitmime');
my $conf = stage_config($node, 'sign.conf', <<"INI");
[pepsi]
HOSTNAME = mx.example.org

[dkim-key-org]
DOMAIN = example.org
SELECTOR = s1
ALGORITHM = rsa-sha256
KEY_FILE = $path

[stage-sign]
PROGRAM = pepsi-stage-dkim-sign
DOWNGRADE_8BIT = yes
NEXT_STAGE = relay

[stage-sign-8bit]
PROGRAM = pepsi-stage-dkim-sign
NEXT_STAGE = relay

[stage-relay]
PROGRAM = pepsi-stage-relay-to-smarthost
SMARTHOST = 127.0.0.1:$peer->{port}
TLS = none
TIMEOUT = 10s
CONNECT_TIMEOUT = 5s
INI

my $body = "Gr\xc3\xbc\xc3\x9fe aus K\xc3\xb6ln,\r\nsch\xc3\xb6ne Gr\xc3\xbc\xc3\x9fe.\r\n";
sub message
{
	my ($stage, $subject) = @_;
	# A trusted client's message (state.origin.trust): the signer signs it.
	return add_message($node, $stage, state => { origin => { trust => 'trusted-network' } },
		headers => "From: <alice\@example.org>\r\nTo: <bob\@remote.test>\r\nSubject: $subject\r\n"
		  . "Date: Tue, 1 Dec 2026 10:00:00 +0000\r\nMessage-ID: <$subject\@example.org>\r\n"
		  . "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n"
		  . "Content-Transfer-Encoding: 8bit\r\n",
		body => $body);
}

sub sign_and_relay
{
	my ($stage, $id) = @_;
	my $r = run_worker(worker_cmd('pepsi-stage-dkim-sign', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], "$stage: signed") or diag($r->{stderr});
	$node->safe_psql('postgres', "UPDATE pepsi.workqueue SET status = 'running' WHERE id = $id");
	$r = run_worker(worker_cmd('pepsi-stage-relay-to-smarthost', $conf), "$id\n");
	like(join("\n", @{ $r->{status} }), qr/^0/, "$stage: relayed") or diag($r->{stderr});
}

my $id = message('sign', 'converted');
sign_and_relay('DOWNGRADE_8BIT', $id);
my ($m) = grep { $_->{data} =~ /^Subject: converted\r$/m } peer_messages($peer);
ok($m, 'the 7-bit peer received it');
unlike($m->{data}, qr/[\x80-\xff]/, 'with no 8-bit octet');
like($m->{data}, qr/^Content-Transfer-Encoding: quoted-printable\r$/m, 'quoted-printable');
my ($encoded) = $m->{data} =~ /\r\n\r\n(.*)\z/s;
(my $decoded = decode_qp($encoded)) =~ s/\r?\n/\r\n/g;
is($decoded, $body, 'decoding to the original text');
my $v = verify_message(\%zone, $m->{data});
is_deeply($v->{'python-dkim'}, ['pass'], 'python3-dkim verifies the signature') or diag($v->{output});
is($v->{'mail-dkim'}[0], 'pass', 'Mail::DKIM verifies it') or diag($v->{output});
like($v->{opendkim} // '', qr/^pass/, 'opendkim-testmsg verifies it') or diag($v->{output});

# Signed over the 8-bit bytes, converted by the relay afterwards: the signature breaks.
$id = message('sign-8bit', 'late');
sign_and_relay('signed 8-bit', $id);
($m) = grep { $_->{data} =~ /^Subject: late\r$/m } peer_messages($peer);
ok($m && $m->{data} =~ /quoted-printable/, 'the relay converted it for the 7-bit peer');
$v = verify_message(\%zone, $m->{data});
isnt($v->{'python-dkim'}[0] // '', 'pass', 'and the signature over the 8-bit body no longer verifies');

stop_process($peer);
done_testing();
