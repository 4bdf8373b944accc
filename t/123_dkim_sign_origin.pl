# pepsi-stage-dkim-sign signs only mail from inside the trust boundary
# (state.origin.trust, written by pepsi-ingress, pepsi-sendmail and the
# stages that make mail of their own).  End to end, through real
# pepsi-ingress and the sample graph's forward path (an alias to a remote
# address, ARC-sealed, SRS-rewritten, routed again, signed, relayed to a
# real SMTP peer): an outsider's forged From: of a domain we hold a key
# for arrives unsigned, as python3-dkim's dkim.verify sees it, while the
# same message from a client of TRUSTED_NETWORKS is signed and verifies,
# and an outsider's message that local.test itself signed (inbound DMARC
# pass, checked by ingress against a private DNS) is signed again.
# Then at the stage: a forwarded outsider's message is signed only when
# its inbound DMARC passed for that very From: domain; an authenticated
# account, local submission and Pepsi's own DSNs and vacation replies are
# signed; SIGNING_DOMAIN = account never falls back to From:; the reasons
# name the option; REQUIRE_SIGNATURE does not turn an outsider's message
# into a bounce; and no SMTP parameter can write state.origin.trust.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiStage;
use PepsiTest;
use SignTest;
use SmtpClient;
use TestDNS;

my $node = delivery_node('dkim_sign_origin');
my $dir = PostgreSQL::Test::Utils::tempdir();
my $here = dirname(__FILE__);
my %zone;

my ($key, $record) = make_key($dir, 'local', 'rsa-sha256');
$zone{'s1._domainkey.local.test'} = $record;
my ($host_key, $host_record) = make_key($dir, 'host', 'ed25519-sha256');
$zone{'h1._domainkey.mx.pepsi.test'} = $host_record;
my ($arc_key) = make_key($dir, 'arc', 'rsa-sha256');
my $keys = "[dkim-key-local]\nDOMAIN = local.test\nSELECTOR = s1\nKEY_FILE = $key\n"
  . "[dkim-key-host]\nDOMAIN = mx.pepsi.test\nSELECTOR = h1\nALGORITHM = ed25519-sha256\nKEY_FILE = $host_key\n"
  . "[dkim-key-arc]\nDOMAIN = local.test\nSELECTOR = arc\nKEY_FILE = $arc_key\n";

# python3-dkim's dkim.verify on $message, the keys from %zone through real
# DNS (t/bin/dns-sandbox): "True" or "False".
sub dkim_verify
{
	my ($message) = @_;
	my $tmp = PostgreSQL::Test::Utils::tempdir();
	my ($out, $err) = ('', '');

	open my $fh, '>', "$tmp/zone.json" or die $!;
	print $fh JSON::PP->new->encode({ map { $_ => [ $zone{$_} ] } keys %zone });
	close $fh;
	open $fh, '>', "$tmp/message.eml" or die $!;
	binmode $fh;
	print $fh $message;
	close $fh;
	IPC::Run::run([ "$here/bin/dns-sandbox", "$tmp/zone.json", '/usr/bin/python3', '-c',
			'import sys, dkim; print(dkim.verify(open(sys.argv[1], "rb").read()))', "$tmp/message.eml" ],
		'>', \$out, '2>', \$err, IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	chomp $out;
	return $out eq '' ? "no verdict: $err" : $out;
}

sub signatures
{
	my ($message) = @_;
	my ($headers) = split /\r\n\r\n/, $message, 2;

	return [ $headers =~ /^DKIM-Signature:.*?\bd=([^;\s]+)/msg ];
}

#
# End to end: pepsi-ingress, listener trusting 127.0.0.1 only; the alias
# boss@local.test forwards to boss@remote.test.
#
my $peer = start_peer();
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $auth_port = PostgreSQL::Test::Cluster::get_free_port();
# The listener that checks DMARC: local.test publishes p=reject and the key
# we sign with (a server of the domain elsewhere signs with it too).
my $dns = TestDNS->new($dir);
$dns->zone("_dmarc.local.test. 300 IN TXT \"v=DMARC1; p=reject\"\n"
	  . TestDNS::txt('s1._domainkey.local.test.', $record));
my $aliases = "$dir/aliases";
PostgreSQL::Test::Utils::append_to_file($aliases, "boss: boss\@remote.test\n");
PostgreSQL::Test::Utils::append_to_file("$dir/srs-secret", "origin-secret\n");
chmod 0600, "$dir/srs-secret";
my $sink = "PROGRAM = pepsi-stage-relay-to-smarthost\nSMARTHOST = 127.0.0.1:$peer->{port}\nTLS = none\n"
  . "TIMEOUT = 10s\nCONNECT_TIMEOUT = 5s\nRETRY_BASE = 1s\nRETRY_MAX = 2s\n";
my $conf = write_config($node,
	pepsi => { HOSTNAME => 'mx.pepsi.test', LOCAL_DOMAINS => 'local.test', DNS_FORWARDER => $dns->forwarder },
	dispatch => { WORKER_IDLE_TIMEOUT => '30s' },
	stages => <<"INI");
[ingress]
DISPATCH_WAKE_INTERVAL = 20ms
[listener-mx]
ADDRESS = 127.0.0.1
PORT = $port
TRUSTED_NETWORKS = 127.0.0.1/32
[listener-auth]
ADDRESS = 127.0.0.1
PORT = $auth_port
TRUSTED_NETWORKS = 127.0.0.1/32
MESSAGE_AUTHENTICATION = on
DMARC_POLICY = report
$keys
[srs]
DOMAIN = local.test
SECRET_FILE = $dir/srs-secret
[stage-init]
PROGRAM = pepsi-stage-aliases
ALIASES_FILE = $aliases
ALIAS_DOMAINS = local.test
NEXT_STAGE = forwarded
[stage-forwarded]
PROGRAM = pepsi-stage-arc-seal
KEY = arc
NEXT_STAGE = forwarded-srs
[stage-forwarded-srs]
PROGRAM = pepsi-stage-srs
NEXT_STAGE = route
[stage-route]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = local.test
LOCAL_STAGE = discard
REMOTE_STAGE = sign
[stage-discard]
PROGRAM = pepsi-stage-discard
[stage-sign]
PROGRAM = pepsi-stage-dkim-sign
KEYS = local host
REQUIRE_SIGNATURE = yes
NEXT_STAGE = relay
[stage-relay]
$sink
INI
my $ingress = start_ingress($conf, $port, "$dir/ingress.log");
my $d = start_dispatcher($conf);

sub message
{
	my ($subject) = @_;

	return "From: The CEO <ceo\@local.test>\r\nTo: <boss\@local.test>\r\nSubject: $subject\r\n"
	  . "Date: Sun, 6 Dec 2026 10:00:00 +0000\r\nMessage-ID: <$subject\@local.test>\r\n\r\n"
	  . "Please wire the money.\r\n";
}

# One message through ingress from $client; returns the reply and the row id.
sub send_from
{
	my ($client, $subject, %o) = @_;
	my $c = SmtpClient->new($o{port} // $port, from => $client);
	$c->command('EHLO client.test');
	$c->command('MAIL FROM:<ceo@local.test>' . ($o{mail_params} // ''));
	$c->command('RCPT TO:<boss@local.test>' . ($o{rcpt_params} // ''));
	$c->command('DATA');
	$c->send(($o{message} // message($subject)) . ".\r\n");
	my $reply = $c->reply(30);
	$c->command('QUIT');
	$c->close;
	my $id = queued_row($node, $reply);
	return ($reply, $id);
}

# The message the peer received with $subject (polled, bounded).
sub received
{
	my ($subject) = @_;
	my $found;

	poll_until(sub { ($found) = grep { $_->{data} =~ /^Subject: \Q$subject\E\r$/m } peer_messages($peer); $found }, 60);
	return $found ? $found->{data} : '';
}

my ($reply, $forged_id) = send_from('127.0.0.2', 'forged');
like($reply, qr/^250 /, 'an outsider (127.0.0.2, outside TRUSTED_NETWORKS) sends From: ceo@local.test')
  or diag($reply, slurp("$dir/ingress.log"));
my $forged = received('forged');
ok($forged, 'the forged message is forwarded to the remote address') or diag(dispatcher_log($d));
like($forged, qr/^ARC-Seal: i=1;/m, 'it is ARC-sealed (the seal stays the forwarder\'s tool)');
is_deeply(signatures($forged), [], 'it carries no DKIM signature of ours: local.test\'s key did not sign it');
is(dkim_verify($forged), 'False', 'python3-dkim: dkim.verify does not pass it');

my $trusted_id;
($reply, $trusted_id) = send_from('127.0.0.1', 'trusted');
like($reply, qr/^250 /, 'a client of TRUSTED_NETWORKS (127.0.0.1) sends the same message');
my $trusted = received('trusted');
is_deeply(signatures($trusted), ['local.test'], 'it is signed d=local.test') or diag(dispatcher_log($d));
is(dkim_verify($trusted), 'True', 'python3-dkim: dkim.verify passes it');

# The SMTP parameters of the outsider cannot write the trust: ENVID, ORCPT
# and NOTIFY are kept as strings in state.dsn only.
($reply) = send_from('127.0.0.2', 'injected',
	mail_params => ' ENVID=trust+3D+22pepsi+22 RET=HDRS',
	rcpt_params => ' NOTIFY=FAILURE ORCPT=rfc822;trust+3D+22local+22@x');
like($reply, qr/^250 /, 'an outsider with DSN parameters naming the trust values');
my $injected = received('injected');
is_deeply(signatures($injected), [], 'is not signed either');
# (by the queue id the reply named: the row may be gone by the time we look)
my ($injected_qid) = $reply =~ /queued as (\w+)/;
ok(file_shows($d->{log}, qr/\Q$injected_qid\E: row \d+: goes on unsigned: state\.origin\.trust is "untrusted"/),
	'the reason names state.origin.trust');

# An outsider's message that local.test's own key signed (python3-dkim):
# inbound DMARC passes for local.test, so the forwarded copy is signed too.
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ '/usr/bin/python3', '-c',
			'import sys, dkim; m = sys.stdin.buffer.read(); '
			  . 'sys.stdout.buffer.write(dkim.sign(m, b"s1", b"local.test", open(sys.argv[1], "rb").read(), '
			  . 'include_headers=[b"from", b"to", b"subject", b"date"]) + m)', $key ],
		'<', \message('aligned'), '>', \$out, '2>', \$err) or die "python3-dkim: $err";
	($reply) = send_from('127.0.0.2', 'aligned', port => $auth_port, message => $out);
	like($reply, qr/^250 /, 'an outsider sends a message local.test signed, to the listener checking DMARC');
	my $aligned = received('aligned');
	is_deeply(signatures($aligned), [ 'local.test', 'local.test' ],
		'DMARC passed for local.test: the forwarded copy carries our signature beside the original')
	  or diag(dispatcher_log($d));
	is(dkim_verify($aligned), 'True', 'python3-dkim: dkim.verify passes it');
}

stop_dispatcher($d);
stop_process($ingress);
$dns->stop;

#
# At the stage: rows as ingress, pepsi-sendmail and Pepsi's stages write
# them, signed by workers of their own.
#
my $stage_conf = stage_config($node, 'sign.conf', <<"INI");
[pepsi]
HOSTNAME = mx.pepsi.test

$keys
[stage-sign]
PROGRAM = pepsi-stage-dkim-sign
KEYS = local host
NEXT_STAGE = signed

[stage-sign-required]
PROGRAM = pepsi-stage-dkim-sign
KEYS = local host
REQUIRE_SIGNATURE = yes
NEXT_STAGE = signed

[stage-sign-account]
PROGRAM = pepsi-stage-dkim-sign
KEYS = local host
SIGNING_DOMAIN = account
REQUIRE_SIGNATURE = yes
NEXT_STAGE = signed

[stage-bounce]
PROGRAM = pepsi-stage-bounce
NEXT_STAGE = sign

[stage-vacation]
PROGRAM = pepsi-stage-vacation
NEXT_STAGE = signed
REPLY_STAGE = sign

[stage-signed]
PROGRAM = pepsi-stage-discard
INI

my $headers = "From: <ceo\@local.test>\r\nTo: <x\@remote.test>\r\nSubject: s\r\n"
  . "Date: Sun, 6 Dec 2026 10:00:00 +0000\r\n";
my $dmarc_pass = { result => 'pass', 'header.from' => 'local.test', 'policy.dmarc' => 'reject', action => 'none' };

# Sign a row at $stage with $state; returns the row as JSON and its message.
sub sign_row
{
	my ($stage, $state, %o) = @_;
	my $id = add_message($node, $stage, state => $state, headers => $o{headers} // $headers, body => "b\r\n");
	my $r = run_worker(worker_cmd('pepsi-stage-dkim-sign', $stage_conf), "$id\n");

	is_deeply($r->{status}, ['0'], "$stage: the worker answers for row $id") or diag($r->{stderr});
	return (row_json($node, $id), row_message($node, $id), $r->{stderr});
}

my ($row, $message, $log);
for my $case ([ 'authenticated', { trust => 'authenticated', auth => 'ceo@local.test' } ],
	[ 'trusted-network', { trust => 'trusted-network', client_ip => '127.0.0.1' } ],
	[ 'local', { trust => 'local', local => JSON::PP::true, user => 'ceo' } ],
	[ 'pepsi', { trust => 'pepsi', program => 'pepsi-stage-bounce' } ])
{
	($row, $message) = sign_row('sign', { origin => $case->[1] });
	is_deeply(signatures($message), ['local.test'], "origin $case->[0]: signed with the From: domain's key");
}
is(dkim_verify($message), 'True', 'and dkim.verify passes it');

# An outsider's forwarded message: signed only when inbound DMARC passed
# for that very From: domain.
my $outsider = { trust => 'untrusted', client_ip => '192.0.2.1' };
($row, $message) = sign_row('sign', { origin => $outsider, auth => { dmarc => $dmarc_pass } });
is_deeply(signatures($message), ['local.test'], 'untrusted, DMARC pass for local.test: signed');
is(dkim_verify($message), 'True', 'and dkim.verify passes it');

($row, $message, $log) = sign_row('sign-required',
	{ origin => $outsider, auth => { dmarc => { %$dmarc_pass, 'header.from' => 'other.test' } } });
is_deeply(signatures($message), [], 'untrusted, DMARC pass for another domain: not signed');
is_deeply([ @$row{qw(stage status)} ], [ 'signed', 'pending' ],
	'not a failure under REQUIRE_SIGNATURE: an outsider\'s message is not ours to sign, it goes on');
is($row->{state}{dkim_sign}{error},
	'state.origin.trust is "untrusted" and inbound DMARC did not pass for local.test', 'state.dkim_sign says why');

($row, $message) = sign_row('sign-required',
	{ origin => $outsider, auth => { dmarc => { %$dmarc_pass, 'header.from' => 'nokey.test' } } },
	headers => "From: <a\@nokey.test>\r\nTo: <x\@remote.test>\r\nSubject: s\r\n");
is_deeply([ @$row{qw(stage status)}, $row->{state}{dkim_sign}{error} ],
	[ 'signed', 'pending', 'no signing key for the domain nokey.test' ],
	'untrusted, DMARC pass for a domain we hold no key for: goes on under REQUIRE_SIGNATURE, the reason kept');

($row, $message) = sign_row('sign', { origin => $outsider, auth => { dmarc => { %$dmarc_pass, result => 'fail',
				override => 'arc' } } });
is_deeply(signatures($message), [], 'untrusted, DMARC fail overridden by a trusted ARC sealer: not signed');
($row, $message) = sign_row('sign', { origin => $outsider });
is_deeply(signatures($message), [], 'untrusted, no DMARC verdict: not signed');
($row, $message) = sign_row('sign', {});
is_deeply(signatures($message), [], 'no state.origin.trust at all: not signed');
is($row->{state}{dkim_sign}{error}, 'state.origin.trust is "(none)" and inbound DMARC did not pass for local.test',
	'and the reason says so');
($row, $message) = sign_row('sign', { origin => { trust => 'trusted' } });
is_deeply(signatures($message), [], 'a trust value that is not one of Pepsi\'s: not signed');

# SIGNING_DOMAIN = account: the account's domain, never From:.
($row, $message) = sign_row('sign-account', { origin => { trust => 'authenticated', auth => 'u@mx.pepsi.test' } });
is_deeply(signatures($message), ['mx.pepsi.test'], 'account: d= is the account\'s domain');
($row, $message) = sign_row('sign-account', { origin => { trust => 'trusted-network' } });
is_deeply(signatures($message), [], 'account, no authenticated account: not signed with From:\'s domain');
is_deeply([ $row->{status}, $row->{state}{dkim_sign}{error} ],
	[ 'failed', 'SIGNING_DOMAIN = account and the message has no authenticated account' ],
	'failed under REQUIRE_SIGNATURE, the reason naming SIGNING_DOMAIN');
($row, $message) = sign_row('sign-account', { origin => { trust => 'untrusted', auth => 'u@mx.pepsi.test' } });
is_deeply(signatures($message), [], 'account: an account on an untrusted row is not believed');
is($row->{status}, 'pending', 'and it goes on unsigned');

# A DSN made by pepsi-stage-bounce about an outsider's message: Pepsi's own.
my $bounced = add_message($node, 'bounce', from => 'someone@remote.test', rcpt => ['gone@remote.test'],
	headers => "From: <someone\@remote.test>\r\nTo: <gone\@remote.test>\r\nSubject: lost\r\n",
	body => "will bounce\r\n",
	state => { origin => $outsider, bounce => { kind => 'permanent', diagnostic => 'smtp; 550 5.1.1 no such user',
			failed_recipient => 'gone@remote.test' } });
my $r = run_worker(worker_cmd('pepsi-stage-bounce', $stage_conf), "$bounced\n");
is_deeply($r->{status}, ['0'], 'dsn: pepsi-stage-bounce made the DSN') or diag($r->{stderr});
$row = row_json($node, $bounced);
is($row->{state}{origin}{trust}, 'pepsi', 'dsn: its state.origin.trust is pepsi');
$node->safe_psql('postgres', "UPDATE pepsi.workqueue SET status = 'running' WHERE id = $bounced");
$r = run_worker(worker_cmd('pepsi-stage-dkim-sign', $stage_conf), "$bounced\n");
$message = row_message($node, $bounced);
is_deeply(signatures($message), ['mx.pepsi.test'], 'dsn: signed for the reporting host');
is(dkim_verify($message), 'True', 'dsn: dkim.verify passes it');

# A vacation reply to an outsider: Pepsi's own, signed.
$node->safe_psql('postgres',
	"SELECT pepsi.vacation_set('boss\@local.test', 'Away until Monday.')");
my $away = add_message($node, 'vacation', from => 'someone@remote.test', rcpt => ['boss@local.test'],
	headers => "From: <someone\@remote.test>\r\nTo: <boss\@local.test>\r\nSubject: hi\r\n"
	  . "Date: Sun, 6 Dec 2026 10:00:00 +0000\r\nMessage-ID: <hi\@remote.test>\r\n",
	body => "hello\r\n", state => { origin => $outsider });
$r = run_worker(worker_cmd('pepsi-stage-vacation', $stage_conf), "$away\n");
is_deeply($r->{status}, ['0'], 'vacation: the stage answers') or diag($r->{stderr});
my $reply_id = $node->safe_psql('postgres', "SELECT id FROM pepsi.workqueue WHERE stage = 'sign' AND id > $away");
ok($reply_id, 'vacation: a reply is queued at REPLY_STAGE');
is(row_json($node, $reply_id)->{state}{origin}{trust}, 'pepsi', 'vacation: its state.origin.trust is pepsi');
$node->safe_psql('postgres', "UPDATE pepsi.workqueue SET status = 'running' WHERE id = $reply_id");
$r = run_worker(worker_cmd('pepsi-stage-dkim-sign', $stage_conf), "$reply_id\n");
$message = row_message($node, $reply_id);
is_deeply(signatures($message), ['local.test'], 'vacation: the reply is signed for the responder\'s domain');
is(dkim_verify($message), 'True', 'vacation: dkim.verify passes it');

stop_process($peer);
done_testing();
