# S/MIME identities and the key-discovery methods t/171 does not cover
# (docs/pepsi-keys.8.md, docs/pepsi-keydisc.8.md):
#
# - `pepsi-keys identity generate -t smime-rsa3072` and `-t smime-ec`
#   make certificates that the openssl CLI verifies for S/MIME, that
#   pepsi-stage-encrypt signs with (openssl cms -verify accepts the
#   signature of a message the stage sent) and that pepsi-stage-decrypt
#   decrypts with (what openssl cms -encrypt made for them);
# - an SMIMEA record (RFC 8162) on the tests' DNS server: pepsi-keydisc
#   stores its certificate for the address and the parked message is then
#   encrypted to it (openssl cms -decrypt opens it); a record whose
#   certificate names another address, or that holds no certificate, is
#   refused with the reason;
# - an HKPS key server (a real HTTPS server with the test's CA on
#   127.0.0.1) answering /pks/lookup?op=get: its key is stored; garbage,
#   an answer over MAX_KEY_SIZE or another address's key is refused;
# - S/MIME signed mail teaches pepsi-stage-autocrypt-learn the sender's
#   certificate and the ciphers it announces (SMIMECapabilities), when the
#   signature is good;
# - a DNS server that never answers costs [pepsi] DNS_TIMEOUT per lookup:
#   pepsi-keydisc ends, records the failure and leaves the request open
#   (a lookup that got no answer is not a miss to cache).

use strict;
use warnings FATAL => 'all';

use Digest::SHA ();
use IO::Socket::INET;
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
my $node = keydisc_node('keydisc_smime');

my $tmp = PepsiStage::tmp();
my $ssl = "$tmp/ssl";
mkdir $ssl or die "mkdir $ssl: $!";

sub openssl
{
	my ($in, @args) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ 'openssl', @args ], '<', \$in, '>', \$out, '2>', \$err);
	return wantarray ? ($ok, $out, $err) : ($ok ? $out : die "openssl @args: $err");
}

# A key pair of gpg's for $address: its fingerprint and armored public key.
sub gpg_key
{
	my ($address) = @_;
	my $fpr = gpg_new_key($address);
	return ($fpr, gpg('--armor', '--export', $fpr));
}

# A correspondent's self-signed S/MIME certificate (RSA 2048), as mail
# clients make them: $name.pem, $name.key; its SHA-256 fingerprint.
sub peer_cert
{
	my ($name, $address) = @_;
	openssl('', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$ssl/$name.key", '-out',
		"$ssl/$name.pem", '-days', '30', '-subj', "/CN=$address", '-addext', "subjectAltName=email:$address",
		'-addext', 'keyUsage=critical,digitalSignature,keyEncipherment', '-addext', 'extendedKeyUsage=emailProtection');
	my ($fpr) = openssl('', 'x509', '-in', "$ssl/$name.pem", '-noout', '-fingerprint', '-sha256') =~ /=(\S+)/;
	return $fpr =~ s/://gr;
}

sub sq { $node->safe_psql($db, $_[0]) }

sub raw_message
{
	my ($id) = @_;
	return sq("SELECT convert_from(w.headers || '\\x0d0a'::bytea || b.body, 'UTF8') FROM pepsi.workqueue w"
		  . " JOIN pepsi.workqueue_body b ON b.id = w.body_id WHERE w.id = $id");
}

# The DNS, the key server (HTTPS, a certificate of the test's CA for 127.0.0.1).
my $dns = TestDNS->new($tmp);
my $keyserver = start_key_server('hkp', 'IP:127.0.0.1');
my $ks = $keyserver->{root};

my $stages = "[stage-encrypt]\nPROGRAM = pepsi-stage-encrypt\nNEXT_STAGE = sent\n"
  . "[stage-learn]\nPROGRAM = pepsi-stage-autocrypt-learn\nNEXT_STAGE = sent\n"
  . "[stage-decrypt]\nPROGRAM = pepsi-stage-decrypt\nNEXT_STAGE = sent\nDECRYPT = yes\n"
  . "[stage-decrypt-learn]\nPROGRAM = pepsi-stage-decrypt\nNEXT_STAGE = learn\nDECRYPT = yes\n"
  . "[stage-parking]\nPROGRAM = pepsi-stage-encrypt\nNEXT_STAGE = sent\nPOLICY = required\n"
  . "KEYDISC = required\nBOUNCE_STAGE = bounced\n"
  . "[stage-sent]\nPROGRAM = pepsi-stage-discard\n[stage-bounced]\nPROGRAM = pepsi-stage-discard\n";

# pepsi-keydisc's configuration: METHODS, the forwarder and other lines.
sub keydisc_config
{
	my ($name, $methods, %o) = @_;
	return stage_config($node, $name,
		sprintf("[pepsi]\nDNS_FORWARDER = %s\n%s[crypto]\nCONNINFO = host=%s port=%d dbname=postgres user=crypto\n"
			  . "[keydisc]\nMETHODS = %s\nKEYSERVERS = https://127.0.0.1:%d\nTLS_CA_FILE = $keyserver->{ca}\n"
			  . "MAX_KEY_SIZE = 4k\nNEGATIVE_CACHE = 1h\nHTTPS_TIMEOUT = 20s\n%s%s",
			$o{forwarder} // $dns->forwarder, $o{pepsi} // '', $node->host, $node->port, $methods,
			$keyserver->{port}, $o{strict} ? '' : "ALLOW_PRIVATE_ADDRESSES = yes\n", $stages));
}
my $conf = keydisc_config('pepsi.conf', 'smimea');
my $secrets = "$tmp/secrets.d";
mkdir $secrets, 0755 or die "mkdir $secrets: $!";

sub run_prog
{
	my ($program, @args) = @_;
	my ($out, $err) = ('', '');
	my $t = IPC::Run::timeout(120);
	my $ok = eval { IPC::Run::run([ pepsi_bin($program), @args ], '<', \'', '>', \$out, '2>', \$err, $t); 1 };
	return ($ok ? $? >> 8 : -1, $out, $ok ? $err : "$err\nkilled: $@");
}

my ($rc, $out, $err) = run_prog('pepsi-keys', 'kek-generate', 'k1');
put_file("$secrets/crypto.conf", $out);
chmod 0640, "$secrets/crypto.conf" or die;

#
# S/MIME identities made by pepsi-keys, checked by openssl.
#
my $rita = peer_cert('rita', 'rita@example.net');
($rc, $out, $err) = run_prog('pepsi-keys', 'peer', 'import', '-c', $conf, 'rita@example.net', "$ssl/rita.pem");
is($rc, 0, 'rita\'s certificate is a peer key') or diag($err);

my %gen;
for my $case ([ 'smime-rsa3072', 'alice@example.org', 'rsa3072', qr/Public-Key: \(3072 bit\)/ ],
	[ 'smime-ec', 'ellen@example.org', 'ec256', qr/ASN1 OID: prime256v1/ ])
{
	my ($type, $address, $alg, $key_text) = @$case;
	($rc, $out, $err) = run_prog('pepsi-keys', 'identity', 'generate', '-c', $conf, '-t', $type, $address);
	is($rc, 0, "identity generate -t $type") or diag($err);
	my ($fpr) = $out =~ /^\Q$address\E ([0-9A-F]{64}) smime \Q$alg\E both$/m;
	ok($fpr, "an S/MIME identity, $alg, that signs and encrypts") or diag($out);
	$fpr //= '';
	$gen{$address} = $fpr;
	($rc, $out, $err) = run_prog('pepsi-keys', 'identity', 'export', '-c', $conf, $fpr);
	is($rc, 0, 'exported') or diag($err);
	my $pem = put_file("$ssl/$address.pem", $out);
	my ($ok, $text, $oerr) = openssl('', 'x509', '-in', $pem, '-noout', '-text', '-fingerprint', '-sha256');
	ok($ok, 'openssl reads the certificate') or diag($oerr);
	like($text, $key_text, "the key is $alg");
	like($text, qr/X509v3 Subject Alternative Name: \n\s+email:\Q$address\E\n/, 'it names the address');
	like($text, qr/X509v3 Extended Key Usage: \n\s+E-mail Protection\n/, 'for e-mail protection');
	is($text =~ /sha256 Fingerprint=(\S+)/ ? $1 =~ s/://gr : '', $fpr, 'pepsi-keys names it by its SHA-256');
	# openssl's smimeencrypt purpose asks for keyEncipherment, which an EC
	# key does not have (RFC 5480 3: ECDH is keyAgreement): RSA only.
	for my $purpose ('smimesign', $alg eq 'ec256' ? () : 'smimeencrypt')
	{
		my ($vok, $vout, $verr) = openssl('', 'verify', '-CAfile', $pem, '-purpose', $purpose, $pem);
		ok($vok && $vout =~ /: OK$/m, "openssl verify -purpose $purpose accepts it") or diag("$vout$verr");
	}
	like($text, qr/X509v3 Key Usage: critical\n\s+Digital Signature, Key \Q@{[ $alg eq 'ec256' ? 'Agreement' : 'Encipherment' ]}\E\n/,
		'its key usage: signing, and ' . ($alg eq 'ec256' ? 'key agreement (ECDH)' : 'key encipherment'));

	# openssl encrypts to it; pepsi-stage-decrypt opens that with the identity.
	my $msg = openssl("Content-Type: text/plain\r\nSubject: inside\r\n\r\nFor $address only.\r\n", 'cms', '-encrypt',
		'-aes256', '-from', 'rita@example.net', '-to', $address, '-subject', '...', '-crlfeol', $pem);
	my ($mh, $mb) = split /\r\n\r\n/, $msg, 2;
	my $in = sq("SELECT pepsi.workqueue_add('rita\@example.net', ARRAY['$address'], convert_to("
		  . PepsiStage::quote_literal("$mh\r\n") . ", 'UTF8'), convert_to(" . PepsiStage::quote_literal($mb)
		  . ", 'UTF8'), '{}', stage => 'decrypt')");
	set_running($node, $in);
	my $dr = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$in\n");
	is_deeply([ @{ row_json($node, $in)->{state}{decrypt} }{qw(result format key)} ], [ 'decrypted', 's/mime', $fpr ],
		'what openssl cms -encrypt made for it, pepsi-stage-decrypt opens with the identity') or diag($dr->{stderr});
	like(raw_message($in), qr/^Subject: inside\r\n(?:[^\r\n]+\r\n)*\r\nFor \Q$address\E only\.\r\n$/m,
		'the text and Subject inside');

	# The stage signs a message to rita with it: openssl verifies the signature.
	my $id = add_row($node, 'encrypt', from => $address, rcpt => ['rita@example.net'],
		extra_headers => "To: <rita\@example.net>\r\n");
	my $r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], "pepsi-stage-encrypt takes $address\'s message") or diag($r->{stderr});
	my $row = row_json($node, $id);
	is_deeply([ @{ $row->{state}{encrypt} }{qw(result format signed_by)} ], [ 'encrypted', 's/mime', $fpr ],
		'encrypted S/MIME to rita, signed with the generated identity')
	  or diag(explain($row->{state}));
	my ($dok, $entity, $derr) =
	  openssl(raw_message($id), 'cms', '-decrypt', '-recip', "$ssl/rita.pem", '-inkey', "$ssl/rita.key");
	ok($dok, 'openssl cms -decrypt opens it with rita\'s key') or diag($derr);
	my ($vok, $content, $verr) = openssl($entity, 'cms', '-verify', '-CAfile', $pem);
	ok($vok, "openssl cms -verify: the signature by $address\'s generated certificate is good") or diag($verr);
	like($content, qr/\r\n\r\nHello\.$/, 'over the message');
	my ($bok, undef, $berr) = openssl($entity =~ s/Hello\./Hullo./r, 'cms', '-verify', '-CAfile', $pem);
	ok(!$bok && $berr =~ /digest failure|verification failure/i, 'and does not verify once the text is changed')
	  or diag($berr);
}

#
# S/MIME capabilities learnt from signed mail: pepsi-stage-autocrypt-learn
# takes the certificate of a good S/MIME signature (openssl cms -sign, a
# certificate of a CA in ca_trust naming the From: address) and the ciphers
# its SMIMECapabilities attribute announces; later mail to that sender is
# encrypted to it.  A signature that is not good teaches nothing.
#
openssl('', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$ssl/mailca.key", '-out', "$ssl/mailca.pem",
	'-days', '30', '-subj', '/CN=Pepsi mail CA', '-addext', 'basicConstraints=critical,CA:TRUE',
	'-addext', 'keyUsage=critical,keyCertSign,cRLSign');
($rc, $out, $err) = run_prog('pepsi-keys', 'ca', 'import', '-c', $conf, "$ssl/mailca.pem", 'the mail CA');
is($rc, 0, 'the mail CA is trusted') or diag($err);

# A certificate of the mail CA for $address: $name.pem, $name.key; its fingerprint.
sub ca_cert
{
	my ($name, $address) = @_;
	openssl('', 'req', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$ssl/$name.key", '-out', "$ssl/$name.csr",
		'-subj', "/CN=$address");
	put_file("$ssl/$name.ext", "subjectAltName = email:$address\nextendedKeyUsage = emailProtection\n"
		  . "keyUsage = critical, digitalSignature, keyEncipherment\n");
	openssl('', 'x509', '-req', '-in', "$ssl/$name.csr", '-CA', "$ssl/mailca.pem", '-CAkey', "$ssl/mailca.key",
		'-CAcreateserial', '-out', "$ssl/$name.pem", '-days', '30', '-extfile', "$ssl/$name.ext");
	my ($fpr) = openssl('', 'x509', '-in', "$ssl/$name.pem", '-noout', '-fingerprint', '-sha256') =~ /=(\S+)/;
	return $fpr =~ s/://gr;
}
my $sig = ca_cert('sig', 'sig@example.net');
my $plain = ca_cert('plain', 'plain@example.net');
ca_cert('imposter', 'imposter@example.net');

# A message from $from signed by openssl with $signer's certificate, at the learning stage.
sub signed_message
{
	my ($signer, $from, @opts) = @_;
	my $entity = "Content-Type: text/plain; charset=utf-8\r\n\r\nSigned by $signer.\r\n";
	my $msg = openssl($entity, 'cms', '-sign', '-signer', "$ssl/$signer.pem", '-inkey', "$ssl/$signer.key",
		'-from', $from, '-to', 'alice@example.org', '-subject', 'signed', '-crlfeol', @opts);
	my ($h, $b) = split /\r\n\r\n/, $msg, 2;
	my $id = sq("SELECT pepsi.workqueue_add('$from', ARRAY['alice\@example.org'], convert_to("
		  . PepsiStage::quote_literal("$h\r\n") . ", 'UTF8'), convert_to(" . PepsiStage::quote_literal($b)
		  . ", 'UTF8'), '{}', stage => 'learn')");
	set_running($node, $id);
	my $r = run_worker(worker_cmd('pepsi-stage-autocrypt-learn', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], "the learning stage takes $signer\'s signed message") or diag($r->{stderr});
	return row_json($node, $id);
}

my $row = signed_message('sig', 'sig@example.net');
is_deeply([ @{ $row->{state}{smime} }{qw(result certificate)} ], [ 'learned', $sig ],
	'a good S/MIME signature: the signer\'s certificate is learnt') or diag(explain($row->{state}));
is($row->{stage}, 'sent', 'and the message goes on');
is(sq("SELECT protocol || ' ' || fingerprint || ' ' || source || ' ' || verdict || ' '"
	  . " || array_to_string(smime_capabilities, ',') || ' ' || (cache_until > now() + interval '179 days')"
	  . " FROM pepsi.peer_key WHERE address = 'sig\@example.net'"),
	"smime $sig smime-signed valid aes-256-cbc,aes-192-cbc,aes-128-cbc true",
	'in peer_key with the AES ciphers its SMIMECapabilities announced, for KEY_LIFETIME');
$row = signed_message('plain', 'plain@example.net', '-nosmimecap');
is($row->{state}{smime}{result}, 'learned', 'a signature without SMIMECapabilities: the certificate is learnt');
is(sq("SELECT smime_capabilities IS NULL FROM pepsi.peer_key WHERE address = 'plain\@example.net'"), 't',
	'with no capabilities');
$row = signed_message('imposter', 'victim@example.net');
is_deeply([ @{ $row->{state}{smime} }{qw(result)} ], ['ignored'], 'a certificate of another address: nothing learnt');
like($row->{state}{smime}{reason}, qr/not good: the signer's certificate does not name the sender victim\@example\.net/,
	'saying why');
$row = signed_message('rita', 'rita@example.net');
is($row->{state}{smime}{result}, 'ignored', 'a self-signed certificate that chains to no trusted CA: nothing learnt');
like($row->{state}{smime}{reason}, qr/not good: the signature does not verify against the trusted CAs/, 'saying why');
is(sq("SELECT count(*) FROM pepsi.peer_key WHERE source = 'smime-signed'"), '2', 'only the two good ones stored');

# Signed, then encrypted to alice's generated identity: pepsi-stage-decrypt
# verifies the signature inside (and removes it), the learning stage after
# it records the signer from state.decrypt.
my $sig2 = ca_cert('sig2', 'sig2@example.net');
{
	my $inner = openssl("Content-Type: text/plain\r\nSubject: sealed\r\n\r\nSigned and sealed.\r\n", 'cms', '-sign',
		'-signer', "$ssl/sig2.pem", '-inkey', "$ssl/sig2.key", '-crlfeol');
	my $msg = openssl($inner, 'cms', '-encrypt', '-aes256', '-from', 'sig2@example.net', '-to', 'alice@example.org',
		'-subject', '...', '-crlfeol', "$ssl/alice\@example.org.pem");
	my ($h, $b) = split /\r\n\r\n/, $msg, 2;
	my $id = sq("SELECT pepsi.workqueue_add('sig2\@example.net', ARRAY['alice\@example.org'], convert_to("
		  . PepsiStage::quote_literal("$h\r\n") . ", 'UTF8'), convert_to(" . PepsiStage::quote_literal($b)
		  . ", 'UTF8'), '{}', stage => 'decrypt-learn')");
	set_running($node, $id);
	my $r = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$id\n");
	my $dec = row_json($node, $id)->{state}{decrypt};
	is_deeply([ @{$dec}{qw(result signature signed_by)} ], [ 'decrypted', 'pass', $sig2 ],
		'signed and encrypted to alice: decrypted, the signature good') or diag($r->{stderr});
	set_running($node, $id);
	$r = run_worker(worker_cmd('pepsi-stage-autocrypt-learn', $conf), "$id\n");
	is_deeply([ @{ row_json($node, $id)->{state}{smime} }{qw(result certificate capabilities)} ],
		[ 'learned', $sig2, 'aes-256-cbc,aes-192-cbc,aes-128-cbc' ],
		'the learning stage after it records the signer and its ciphers') or diag($r->{stderr});
	is(sq("SELECT source || ' ' || fingerprint FROM pepsi.peer_key WHERE address = 'sig2\@example.net'"),
		"smime-signed $sig2", 'in peer_key');
}
{
	my $id = add_row($node, 'encrypt', from => 'alice@example.org', rcpt => ['sig@example.net'],
		extra_headers => "To: <sig\@example.net>\r\n");
	my $r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	my $st = row_json($node, $id)->{state}{encrypt};
	is_deeply([ @{$st}{qw(result format cipher)} ], [ 'encrypted', 's/mime', 'aes-256-cbc' ],
		'mail to the signer is then encrypted with S/MIME, with a cipher it announced') or diag(explain($st));
	my ($dok, $entity, $derr) =
	  openssl(raw_message($id), 'cms', '-decrypt', '-recip', "$ssl/sig.pem", '-inkey', "$ssl/sig.key");
	ok($dok && $entity =~ /Hello\./, 'and openssl cms -decrypt opens it with the signer\'s key') or diag($derr);
}

#
# SMIMEA: a record holding a certificate, one naming another address, one
# that holds no certificate.
#
sub smimea_line
{
	my ($address, $rdata) = @_;
	my ($local, $domain) = split /\@/, $address;
	my $owner = substr(Digest::SHA::sha256_hex($local), 0, 56);
	return "$owner._smimecert.$domain. 300 IN TYPE53 \\# " . length($rdata) . ' ' . unpack('H*', $rdata) . "\n";
}
my $sm = peer_cert('sm', 'sm@smime.test');
my $sm_der = openssl('', 'x509', '-in', "$ssl/sm.pem", '-outform', 'DER');
$dns->zone(smimea_line('sm@smime.test', "\x03\x00\x00" . $sm_der)
	  . smimea_line('wrong@smime.test', "\x03\x00\x00" . $sm_der)
	  . smimea_line('junk@smime.test', "\x03\x00\x00this is not a certificate")
	  . smimea_line('hash@smime.test', "\x03\x00\x01" . Digest::SHA::sha256($sm_der)));

sub park
{
	my ($to) = @_;
	my $id = add_row($node, 'parking', from => 'alice@example.org', rcpt => [$to], extra_headers => "To: <$to>\r\n");
	run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	my $row = row_json($node, $id);
	is_deeply([ $row->{status}, $row->{state}{encrypt}{waiting_for} ], [ 'paused', $to ], "a message to $to parks");
	return $id;
}

sub keydisc
{
	my ($config) = @_;
	return run_prog('pepsi-keydisc', '-c', $config);
}

sub replied
{
	my ($address) = @_;
	return sq("SELECT array_to_string(methods_replied, '|') FROM pepsi.key_request WHERE address = '$address'");
}

my %parked = map { $_ => park($_) } qw(sm@smime.test wrong@smime.test junk@smime.test hash@smime.test);
($rc, $out, $err) = keydisc($conf);
is($rc, 0, 'pepsi-keydisc runs (METHODS = smimea)') or diag($err);
like($out, qr/^sm\@smime\.test found, 1 message released$/m, 'sm\'s certificate is found in SMIMEA');
is(sq("SELECT protocol || ' ' || fingerprint || ' ' || source || ' ' || dnssec || ' ' || verdict"
	  . " || ' ' || (key_data = '\\x" . unpack('H*', $sm_der) . "'::bytea) FROM pepsi.peer_key WHERE address = 'sm\@smime.test'"),
	"smime $sm smimea false valid true", 'stored: the record\'s certificate, from smimea, not DNSSEC-validated');
like($err, qr/wrong\@smime\.test: refused: smimea: .*names no address wrong\@smime\.test/,
	'a record whose certificate names another address: refused, saying so');
like($err, qr/junk\@smime\.test: refused: smimea: the SMIMEA record holds no X\.509 certificate/,
	'a record that holds no certificate: refused, saying so');
like($err, qr/hash\@smime\.test: refused: \S+_smimecert\.smime\.test: the SMIMEA record does not hold a whole certificate/,
	'a record of a certificate\'s hash: refused, saying so');
like(replied('junk@smime.test'), qr/^smimea:refused: smimea: the SMIMEA record holds no X\.509 certificate/,
	'the request records the reason');
is(sq("SELECT count(*) FROM pepsi.peer_key WHERE address LIKE '%\@smime.test' AND address <> 'sm\@smime.test'"),
	'0', 'nothing stored for them');
{
	my $id = $parked{'sm@smime.test'};
	is(sq("SELECT status FROM pepsi.workqueue WHERE id = $id"), 'pending', 'sm\'s message is released');
	set_running($node, $id);
	run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	my $row = row_json($node, $id);
	is_deeply([ $row->{stage}, @{ $row->{state}{encrypt} }{qw(result format)} ], [ 'sent', 'encrypted', 's/mime' ],
		'and is encrypted with S/MIME to the certificate found');
	my ($dok, $entity, $derr) =
	  openssl(raw_message($id), 'cms', '-decrypt', '-recip', "$ssl/sm.pem", '-inkey', "$ssl/sm.key");
	ok($dok && $entity =~ /Hello\./, 'openssl cms -decrypt opens it with sm\'s key') or diag($derr);
}

#
# The key server.
#
my ($ks_fpr, $ks_key) = gpg_key('ks@example.net');
my (undef, $other_key) = gpg_key('other@example.net');
put_file("$ks/ks\@example.net", $ks_key);
put_file("$ks/ksjunk\@example.net", "<html><body>No such key</body></html>\n");
put_file("$ks/ksbig\@example.net", "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n" . ('A' x 64 . "\n") x 80);
put_file("$ks/ksother\@example.net", $other_key);
my $ksconf = keydisc_config('pepsi-ks.conf', 'keyserver');
%parked = map { $_ => park($_) } qw(ks@example.net ksjunk@example.net ksbig@example.net ksother@example.net);
($rc, $out, $err) = keydisc($ksconf);
is($rc, 0, 'pepsi-keydisc runs (METHODS = keyserver)') or diag($err);
like($out, qr/^ks\@example\.net found, 1 message released$/m, 'ks\'s key is found on the key server');
is(sq("SELECT protocol || ' ' || fingerprint || ' ' || source FROM pepsi.peer_key WHERE address = 'ks\@example.net'"),
	"openpgp $ks_fpr keyserver", 'stored as the key server\'s');
like(slurp_file($keyserver->{requests}), qr{^127\.0\.0\.1:\d+ /pks/lookup\?op=get&options=mr&search=ks%40example\.net$}m,
	'asked over HTTPS as HKP says');
like($err, qr/ksjunk\@example\.net: refused: keyserver: /, 'an answer that is no key: refused');
like($err, qr/ksbig\@example\.net: refused: .*bigger than \[keydisc\] MAX_KEY_SIZE \(4096 bytes\)/,
	'an answer over MAX_KEY_SIZE: refused, naming the option');
like($err, qr/ksother\@example\.net: refused: keyserver: .*ksother\@example\.net/,
	'another address\'s key: refused, naming the address');
is(sq("SELECT count(*) FROM pepsi.peer_key WHERE address IN ('ksjunk\@example.net', 'ksbig\@example.net',"
	  . " 'ksother\@example.net')"), '0', 'nothing stored for them');
like(replied('ksbig@example.net'), qr/^keyserver:refused: .*MAX_KEY_SIZE/, 'the request records the reason');
{
	my $id = $parked{'ks@example.net'};
	set_running($node, $id);
	run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	is(row_json($node, $id)->{state}{encrypt}{format}, 'pgp/mime', 'ks\'s message is encrypted to the key found');
}
# The key server is on 127.0.0.1: refused without ALLOW_PRIVATE_ADDRESSES.
{
	put_file("$ks/ks2\@example.net", (gpg_key('ks2@example.net'))[1]);
	my $before = () = slurp_file($keyserver->{requests}) =~ /ks2%40/g;
	park('ks2@example.net');
	($rc, $out, $err) = keydisc(keydisc_config('pepsi-ks-strict.conf', 'keyserver', strict => 1));
	like($err, qr/ks2\@example\.net: refused: https:\/\/127\.0\.0\.1:\d+\/pks\/lookup\S*: not connecting to 127\.0\.0\.1, loopback/,
		'a key server on a loopback address is refused by default');
	is(scalar(() = slurp_file($keyserver->{requests}) =~ /ks2%40/g), $before, 'and never asked');
}

#
# A DNS server that never answers: each lookup waits [pepsi] DNS_TIMEOUT,
# no longer; the failure is recorded and the request stays open.
#
my $silent = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'udp') or die "udp: $!";
my $deaf = keydisc_config('pepsi-deaf.conf', 'openpgpkey smimea wkd-advanced',
	forwarder => '127.0.0.1@' . $silent->sockport, pepsi => "DNS_TIMEOUT = 1s\n");
my $late = park('late@example.test');
($rc, $out, $err) = keydisc($deaf);
is($rc, 0, 'pepsi-keydisc ends though the DNS never answers') or diag($err);
like($out, qr/^late\@example\.test not settled, the DNS did not answer: asked again next run$/m,
	'the request is not settled');
like($err, qr/late\@example\.test: openpgpkey: failed: \S+\._openpgpkey\.example\.test: no answer from the DNS within \[pepsi\] DNS_TIMEOUT \(1s\)/,
	'the log names the lookup and the option that bounds it');
is(replied('late@example.test'),
	join('|', map { "$_->[0]:failed: $_->[1]: no answer from the DNS within [pepsi] DNS_TIMEOUT (1s)" }
		[ 'openpgpkey', substr(Digest::SHA::sha256_hex('late'), 0, 56) . '._openpgpkey.example.test' ],
		[ 'smimea', substr(Digest::SHA::sha256_hex('late'), 0, 56) . '._smimecert.example.test' ],
		[ 'wkd-advanced', 'openpgpkey.example.test' ]),
	'every method\'s failure is recorded');
is(sq("SELECT (settled_at IS NULL) || ' ' || (negative_until IS NULL) FROM pepsi.key_request"
	  . " WHERE address = 'late\@example.test'"), 'true true', 'no negative cache: a failure is not a miss');
is(sq("SELECT status FROM pepsi.workqueue WHERE id = $late"), 'paused', 'the message still waits for its key');
$dns->zone(smimea_line('late@example.test', "\x03\x00\x00" . openssl('', 'x509', '-in', peer_cert('late', 'late@example.test') && "$ssl/late.pem", '-outform', 'DER')));
($rc, $out, $err) = keydisc(keydisc_config('pepsi-back.conf', 'openpgpkey smimea'));
like($out, qr/^late\@example\.test found, 1 message released$/m, 'the DNS back, the next run finds the key')
  or diag($err);

$node->stop;
done_testing();
