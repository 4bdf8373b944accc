# Key discovery (docs/pepsi-keydisc.8.md): pepsi-stage-encrypt parks a
# message for a recipient without a key (KEYDISC) with a key_request row;
# pepsi-keydisc finds the key in a Web Key Directory (served over HTTPS by
# a server the test starts, with a certificate of the test's own CA) or in
# an OPENPGPKEY record (RFC 7929) on the tests' DNS server, stores it in
# peer_key with its source, and keydisc_release resumes the message, which
# is then encrypted.  A lookup that finds nothing becomes the negative
# cache (the next message does not park); a WKD answer that is no key, or
# is bigger than MAX_KEY_SIZE, is refused with the reason.

use strict;
use warnings FATAL => 'all';

use Digest::SHA ();
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use KeydiscTest;
use PepsiGpg qw(gpg gpg_new_key);
use PepsiStage;
use PepsiTest;
use TestDNS;

plan skip_all => 'gpg is not installed' unless grep { -x "$_/gpg" } split /:/, $ENV{PATH};

my $db = 'postgres';
my $node = keydisc_node('keydisc');

my $tmp = PepsiStage::tmp();

# A key pair for $address; its fingerprint, its binary public key and WKD hash.
sub gpg_key
{
	my ($address) = @_;
	my $fpr = gpg_new_key($address);
	my ($hash) = gpg('--with-wkd-hash', '--list-keys', $fpr) =~ /^\s+([a-z0-9]{32})\@/m;
	return ($fpr, gpg('--export', $fpr), $hash);
}

# The WKD host: an HTTPS server on a free port, its certificate (of the
# test's CA) naming the WKD hosts.
my $https = start_key_server('wkd', 'DNS:openpgpkey.example.test, DNS:example.test, DNS:wkd.test');
my $www = $https->{root};

my ($alice, $alice_key, $alice_hash) = gpg_key('alice@example.test');
put_file("$www/.well-known/openpgpkey/example.test/hu/$alice_hash", $alice_key);
my ($dane, $dane_key) = gpg_key('dane@dane.test');
my ($junk_hash) = (gpg_key('junk@example.test'))[2];
put_file("$www/.well-known/openpgpkey/example.test/hu/$junk_hash", "<html>this is not a key</html>\n");
my ($big_hash) = (gpg_key('big@example.test'))[2];
put_file("$www/.well-known/openpgpkey/example.test/hu/$big_hash", 'x' x 5000);

my $dns = TestDNS->new($tmp);
my $owner = substr(Digest::SHA::sha256_hex('dane'), 0, 56);
$dns->zone("openpgpkey.example.test. 300 IN A 127.0.0.1\n"
	  . "$owner._openpgpkey.dane.test. 300 IN TYPE61 \\# " . length($dane_key) . ' ' . unpack('H*', $dane_key) . "\n");

# The tests' WKD is on 127.0.0.1, which pepsi-keydisc refuses unless
# ALLOW_PRIVATE_ADDRESSES: $conf allows it, $strict (the default) not.
sub keydisc_config
{
	my ($name, $allow, $encrypt_more) = @_;
	return stage_config($node, $name,
	sprintf("[pepsi]\nDNS_FORWARDER = %s\n[crypto]\nCONNINFO = host=%s port=%d dbname=postgres user=crypto\n"
		  . "[keydisc]\nTLS_CA_FILE = $https->{ca}\nHTTPS_PORT = %d\nMAX_KEY_SIZE = 4k\nNEGATIVE_CACHE = 1h\n"
		  . "HTTPS_TIMEOUT = 20s\n" . ($allow ? "ALLOW_PRIVATE_ADDRESSES = yes\n" : '')
		  . "[stage-encrypt]\nPROGRAM = pepsi-stage-encrypt\nNEXT_STAGE = sent\nPOLICY = required\n"
		  . "KEYDISC = required\nBOUNCE_STAGE = bounced\n" . ($encrypt_more // '')
		  . "[stage-sent]\nPROGRAM = pepsi-stage-discard\n[stage-bounced]\nPROGRAM = pepsi-stage-discard\n",
		$dns->forwarder, $node->host, $node->port, $https->{port}));
}
my $conf = keydisc_config('pepsi.conf', 1);
my $strict = keydisc_config('pepsi-strict.conf', 0);

sub encrypt_row
{
	my ($to) = @_;
	return add_row($node, 'encrypt', from => 'sender@example.org', rcpt => [$to], extra_headers => "To: <$to>\r\n");
}

sub keydisc
{
	my ($config) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-keydisc'), '-c', $config // $conf ], '<', \'', '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

sub sq { $node->safe_psql($db, $_[0]) }

# A message to each: parked, waiting for the lookup.
my %id;
for my $to (qw(alice@example.test dane@dane.test nobody@example.test junk@example.test big@example.test))
{
	$id{$to} = encrypt_row($to);
	my $r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id{$to}\n");
	is_deeply($r->{status}, ['0'], "the stage takes the message to $to") or diag($r->{stderr});
	my $row = row_json($node, $id{$to});
	is_deeply([ $row->{status}, @{ $row->{state}{encrypt} }{qw(result waiting_for)} ], [ 'paused', 'parked', $to ],
		"no key for $to: the message parks");
}
is(sq("SELECT string_agg(address, ' ' ORDER BY address) FROM pepsi.key_request WHERE settled_at IS NULL"),
	'alice@example.test big@example.test dane@dane.test junk@example.test nobody@example.test',
	'a key_request row each');

my ($rc, $out, $err) = keydisc();
is($rc, 0, 'pepsi-keydisc runs') or diag($err);
like($out, qr/^alice\@example\.test found, 1 message released$/m, 'alice\'s key found, her message released');
like($out, qr/^dane\@dane\.test found, 1 message released$/m, 'dane\'s found');
like($out, qr/^nobody\@example\.test not found, 1 message released$/m, 'nobody\'s not found');
is(sq("SELECT source || ' ' || fingerprint || ' ' || dnssec || ' ' || verdict || ' ' || (cache_until > now() + interval '6 days')"
	  . " FROM pepsi.peer_key WHERE address = 'alice\@example.test'"),
	"wkd-advanced $alice false valid true", 'alice\'s key in peer_key: from WKD (advanced), with a cache deadline');
is(sq("SELECT source || ' ' || fingerprint || ' ' || dnssec FROM pepsi.peer_key WHERE address = 'dane\@dane.test'"),
	"openpgpkey $dane false", 'dane\'s from the OPENPGPKEY record, not DNSSEC-validated (recorded so)');
like(slurp_file($https->{requests}), qr{^openpgpkey\.example\.test:\d+ /\.well-known/openpgpkey/example\.test/hu/\Q$alice_hash\E\?l=alice$}m,
	'asked over HTTPS where WKD says');
like($err, qr/junk\@example\.test: refused: wkd-advanced: /, 'an answer that is no key: refused, saying why');
like($err, qr/big\@example\.test: refused: .*bigger than \[keydisc\] MAX_KEY_SIZE \(4096 bytes\)/,
	'an answer over MAX_KEY_SIZE: refused, naming the option');
is(sq("SELECT count(*) FROM pepsi.peer_key WHERE address IN ('junk\@example.test', 'big\@example.test')"), '0',
	'and nothing stored for them');
like(sq("SELECT methods_replied[1] FROM pepsi.key_request WHERE address = 'junk\@example.test'"),
	qr/^wkd-advanced:refused: wkd-advanced: /, 'the request records the refusal and its reason');

# Released: decided afresh.
for my $to (qw(alice@example.test dane@dane.test))
{
	is(sq("SELECT status FROM pepsi.workqueue WHERE id = $id{$to}"), 'pending', "$to\'s message is pending again");
	set_running($node, $id{$to});
	run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id{$to}\n");
	my $row = row_json($node, $id{$to});
	is_deeply([ $row->{stage}, @{ $row->{state}{encrypt} }{qw(result format)} ], [ 'sent', 'encrypted', 'pgp/mime' ],
		"and is encrypted to the key found");
}
set_running($node, $id{'nobody@example.test'});
run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id{'nobody@example.test'}\n");
is(row_json($node, $id{'nobody@example.test'})->{stage}, 'bounced', 'nobody\'s: no key, policy required: bounced');

# The negative cache: the next message to nobody does not park.
ok(sq("SELECT negative_until > now() + interval '50 minutes' FROM pepsi.key_request WHERE address = 'nobody\@example.test'"),
	'the miss is cached for NEGATIVE_CACHE');
{
	my $id = encrypt_row('nobody@example.test');
	run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	my $row = row_json($node, $id);
	is($row->{stage} . ' ' . $row->{state}{encrypt}{result}, 'bounced refused',
		'the next message to nobody does not park: bounced at once');
}
($rc, $out, $err) = keydisc();
is($out, '', 'a second run has nothing to ask');

# A batch (the stage takes up to 16 waiting rows at once) whose outcomes
# do not all commit: what the stage wrote for a message (its portal link,
# its key request) is committed with the message's outcome or not at all.
# Of four messages fed at once, two come with a claim that has gone stale
# (the row requeued by an operator and claimed again meanwhile: the
# commit's guard refuses the old claim token): to nobody (in the negative
# cache, so NO_KEY = portal seals it for the portal) and to quinn (parked
# for key discovery).  Their commits fail, and with them their link and
# request; the other two, to nobody and to pat, commit theirs.
{
	my $portal = keydisc_config('pepsi-portal.conf', 1,
		"NO_KEY = portal\nPORTAL_URL = https://portal.example.org\nPORTAL_ADDRESS = secure\@example.org\n");
	my $links = sq('SELECT count(*) FROM pepsi.secure_link');
	my $sealed = encrypt_row('nobody@example.test');
	my $moved_sealed = encrypt_row('nobody@example.test');
	my $parked = encrypt_row('pat@example.test');
	my $moved_parked = encrypt_row('quinn@example.test');
	my $stale = '00000000-0000-4000-8000-000000000000';
	my %before = map { $_ => row_snapshot($node, $_) } $moved_sealed, $moved_parked;
	my $r = run_worker(worker_cmd('pepsi-stage-encrypt', $portal),
		"$sealed\n$moved_sealed $stale\n$parked\n$moved_parked $stale\n");
	is(scalar(@{ $r->{status} }), 4, 'the worker answers the four') or diag($r->{stderr});
	is_deeply([ map { (split / /, $_)[0] } @{ $r->{status} } ], [ 0, 1, 0, 1 ],
		'the two whose claim went stale fail, the others go on');
	like($r->{status}[1], qr/commit of row $moved_sealed failed/, 'the stale message\'s outcome is not committed');
	like($r->{status}[3], qr/commit of row $moved_parked failed/, 'nor the other\'s');
	my $row = row_json($node, $sealed);
	is($row->{stage} . ' ' . $row->{state}{encrypt}{result}, 'sent portal', 'the first is sealed for the portal');
	is(sq('SELECT count(*) FROM pepsi.secure_link') - $links, 1, 'one portal link is made, not two');
	is(sq("SELECT count(*) FROM pepsi.secure_link WHERE id = $row->{state}{encrypt}{secure_link}"), '1',
		'the committed notice\'s own');
	is(sq("SELECT count(*) FROM pepsi.event_log WHERE action = 'secure_link_stored'"), '1',
		'and only it is in the audit log');
	is(row_json($node, $parked)->{status}, 'paused', 'the message to pat parks');
	is(sq("SELECT string_agg(address, ' ' ORDER BY address) FROM pepsi.key_request"
		  . " WHERE address IN ('pat\@example.test', 'quinn\@example.test')"), 'pat@example.test',
		'a key request for pat, none for quinn');
	is(row_snapshot($node, $_), $before{$_}, "the stale claim's row $_ is left as it was") for sort keys %before;
}

# A hostile DNS answer points WKD at the machine itself: refused by
# default (ALLOW_PRIVATE_ADDRESSES off), where it connects, with the
# reason logged and recorded; nothing is fetched.
my ($carol, $carol_key, $carol_hash) = gpg_key('carol@example.test');
put_file("$www/.well-known/openpgpkey/example.test/hu/$carol_hash", $carol_key);
my $asked = -e $https->{requests} ? scalar(() = slurp_file($https->{requests}) =~ /\Q$carol_hash\E/g) : 0;
my $carol_row = encrypt_row('carol@example.test');
run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$carol_row\n");
is(row_json($node, $carol_row)->{status}, 'paused', 'a message to carol parks');
($rc, $out, $err) = keydisc($strict);
is($rc, 0, 'pepsi-keydisc runs without ALLOW_PRIVATE_ADDRESSES') or diag($err);
like($out, qr/^carol\@example\.test not found, 1 message released$/m, 'carol\'s key is not found');
like($err,
	qr{carol\@example\.test: refused: https://openpgpkey\.example\.test:\d+/\S+: not connecting to 127\.0\.0\.1, loopback \(127\.0\.0\.0/8\), not a public address \(\[keydisc\] ALLOW_PRIVATE_ADDRESSES\)},
	'the WKD on 127.0.0.1 is refused, logged with the reason and the option');
like(sq("SELECT methods_replied[1] FROM pepsi.key_request WHERE address = 'carol\@example.test'"),
	qr/^wkd-advanced:refused: .*not connecting to 127\.0\.0\.1, loopback .*ALLOW_PRIVATE_ADDRESSES/,
	'the request records the refusal as the lookup\'s reason');
is(scalar(() = (-e $https->{requests} ? slurp_file($https->{requests}) : '') =~ /\Q$carol_hash\E/g), $asked,
	'the WKD server was never asked');
is(sq("SELECT count(*) FROM pepsi.peer_key WHERE address = 'carol\@example.test'"), '0', 'nothing stored');

# With it on, the same lookup fetches the key as before.
sq("DELETE FROM pepsi.key_request WHERE address = 'carol\@example.test'");
$carol_row = encrypt_row('carol@example.test');
run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$carol_row\n");
is(row_json($node, $carol_row)->{status}, 'paused', 'the next message to carol parks again');
($rc, $out, $err) = keydisc($conf);
like($out, qr/^carol\@example\.test found, 1 message released$/m, 'with ALLOW_PRIVATE_ADDRESSES her key is found')
  or diag($err);
is(sq("SELECT source || ' ' || fingerprint FROM pepsi.peer_key WHERE address = 'carol\@example.test'"),
	"wkd-advanced $carol", 'from WKD on 127.0.0.1');

$node->stop;
done_testing();
