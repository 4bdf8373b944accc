# The key store of end-to-end encryption (docs/pepsi-keys.8.md,
# docs/pepsi-admin.7.md): private keys are readable by pepsi_crypto alone
# (every other role reads crypto_identity through a column-level grant
# without private_wrapped), they are sealed under the key-encryption key
# of a secrets.d fragment so that a pg_dump holds no byte of them in the
# clear, kek-rotate rewraps every key (all or nothing), and pepsi-keys
# refuses what it must not store: a revoked or expired key, one whose User
# ID is another address's, a public key alone, bytes that are no key, a
# sealed key that does not open.  Keys come from Debian's gpg.

use strict;
use warnings FATAL => 'all';

use Digest::SHA ();
use File::Temp ();
use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiGpg;
use PepsiStage;
use PepsiTest;

plan skip_all => 'gpg is not installed' unless grep { -x "$_/gpg" } split /:/, $ENV{PATH};

my $db = 'postgres';
my $node = pepsi_node('crypto', extension => 1);
$node->safe_psql(
	$db, q{
CREATE ROLE relay LOGIN IN ROLE pepsi_stage;
CREATE ROLE admin LOGIN IN ROLE pepsi_config;
CREATE ROLE web LOGIN IN ROLE pepsi_httpd;
CREATE ROLE grafana LOGIN IN ROLE pepsi_monitor;
CREATE ROLE crypto LOGIN IN ROLE pepsi_crypto;
});
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.apply_grants()'),
	'0', 'the column-level grants are the policy: no drift');

my $tmp = PepsiStage::tmp();
my $gnupg = gpg_home();


# A key pair of gpg's own for $address (Ed25519 and Curve25519); its fingerprint.
sub gpg_key
{
	my ($address, @faked) = @_;
	gpg(@faked, '--quick-gen-key', "<$address>", 'ed25519', 'sign,cert', @faked ? '1d' : 'never');
	my ($fpr) = gpg('--with-colons', '--list-keys', "<$address>") =~ /^fpr:+([0-9A-F]{40}):/m;
	# (Faked time starts again with each gpg: the subkey's is later than the key's.)
	gpg(@faked ? ('--faked-system-time', '20200101T010000') : (), '--quick-add-key', $fpr, 'cv25519', 'encr',
		@faked ? '1d' : 'never');
	return $fpr;
}


my $alice = gpg_key('alice@example.org');
my $alice_secret = gpg('--export-secret-keys', $alice);
my $alice_public = gpg('--export', $alice);
my $alice_file = write_file('alice.key', $alice_secret);

# The configuration: the key store's connection as the crypto login role,
# the KEK in a secrets.d fragment.
my $conf = stage_config($node, 'pepsi.conf',
	sprintf("[crypto]\nCONNINFO = host=%s port=%d dbname=postgres user=crypto\n", $node->host, $node->port));
my $secrets = "$tmp/secrets.d";
mkdir $secrets, 0755 or die "mkdir $secrets: $!";


sub kek_fragment
{
	my ($text) = @_;
	my $path = "$secrets/crypto.conf";
	unlink $path;
	write_file('secrets.d/crypto.conf', $text);
	chmod 0640, $path or die "chmod $path: $!";
}

my ($rc, $out, $err) = keys_run('identity', 'import', '-c', $conf, 'alice@example.org', $alice_file);
isnt($rc, 0, 'no KEK: the import is refused');
like($err, qr/\[crypto\] KEK is not set/, 'and says which option is missing');

($rc, my $kek1) = keys_run('kek-generate', 'k1');
like($kek1, qr/^\[crypto\]\nKEK = k1:[A-Za-z0-9+\/]{43}=\n$/, 'kek-generate prints a fragment');
kek_fragment($kek1);

($rc, $out, $err) = keys_run('identity', 'import', '-c', $conf, 'alice@example.org', $alice_file);
is($rc, 0, 'pepsi-keys imports gpg\'s secret key') or diag($err);
like($out, qr/^alice\@example\.org $alice openpgp ed25519 both$/m, 'and names it');
is( $node->safe_psql($db,
		"SELECT address || ' ' || status || ' ' || is_primary || ' ' || kek_id || ' ' || (public_key = '\\x"
		  . unpack('H*', $alice_public) . "'::bytea) FROM pepsi.crypto_identity WHERE fingerprint = '$alice'"),
	'alice@example.org active true k1 true',
	'the identity is stored: primary, sealed under k1, its public half as gpg exports it');

# Who reads what.
for my $role (qw(relay admin web grafana))
{
	my ($ret, undef, $stderr) =
	  $node->psql($db, 'SELECT private_wrapped FROM pepsi.crypto_identity', extra_params => [ '-U', $role ]);
	isnt($ret, 0, "$role may not read private_wrapped");
	like($stderr, qr/permission denied/, "$role: permission denied");
	($ret, undef, $stderr) =
	  $node->psql($db, 'SELECT * FROM pepsi.crypto_identity', extra_params => [ '-U', $role ]);
	isnt($ret, 0, "$role may not SELECT * either");
}
for my $role (qw(relay admin web))
{
	is( $node->safe_psql(
			$db, 'SELECT fingerprint FROM pepsi.crypto_identity',
			extra_params => [ '-U', $role ]),
		$alice,
		"$role reads the public columns");
}
is( $node->safe_psql(
		$db, 'SELECT length(private_wrapped) > 100 FROM pepsi.crypto_identity',
		extra_params => [ '-U', 'crypto' ]),
	't',
	'pepsi_crypto reads private_wrapped');

# A dump holds the public key and no run of the secret key's own bytes.
{
	my $dump = "$tmp/dump.sql";
	$node->command_ok([ 'pg_dump', '-d', $node->connstr($db), '-f', $dump ], 'pg_dump');
	my $text = slurp_file($dump);
	my $public_hex = unpack('H*', $alice_public);
	ok(index($text, $public_hex) >= 0, 'the dump holds the public key (the search finds bytea)');
	my $secret_hex = unpack('H*', $alice_secret);
	my @windows;
	for (my $i = 0; $i + 32 <= length($secret_hex); $i += 2)
	{
		my $w = substr($secret_hex, $i, 32);
		push @windows, $w if index($public_hex, $w) < 0;
	}
	cmp_ok(scalar(@windows), '>', 50, 'the secret key has bytes of its own');
	my @found = grep { index($text, $_) >= 0 || index($text, pack('H*', $_)) >= 0 } @windows;
	is(scalar(@found), 0, 'no 16-byte run of them is in the dump, as hex or raw');
}

# KEK rotation: the new key with the old one beside it, every key rewrapped.
my $wrapped_before = $node->safe_psql($db, 'SELECT private_wrapped FROM pepsi.crypto_identity',
	extra_params => [ '-U', 'crypto' ]);
(undef, my $kek2) = keys_run('kek-generate', 'k2');
(my $k1_value) = $kek1 =~ /KEK = (\S+)/;
kek_fragment($kek2 . "KEK_PREVIOUS = $k1_value\n");
($rc, $out, $err) = keys_run('kek-rotate', '-c', $conf);
is($rc, 0, 'kek-rotate') or diag($err);
like($out, qr/rewrapped 1 key under KEK k2/, 'says how many it rewrapped');
is($node->safe_psql($db, 'SELECT kek_id FROM pepsi.crypto_identity'), 'k2', 'the key is sealed under k2');
isnt($node->safe_psql($db, 'SELECT private_wrapped FROM pepsi.crypto_identity', extra_params => [ '-U', 'crypto' ]),
	$wrapped_before, 'with new ciphertext');
($rc, $out, $err) = keys_run('kek-rotate', '-c', $conf);
like($out, qr/rewrapped 0 keys/, 'a second run has nothing to do');

# A KEK that is not the one: refused, nothing changed.
(undef, my $kek3) = keys_run('kek-generate', 'k3');
(undef, my $wrong) = keys_run('kek-generate', 'k2');
(my $wrong_value) = $wrong =~ /KEK = (\S+)/;
kek_fragment($kek3 . "KEK_PREVIOUS = $wrong_value\n");
my $wrapped_k2 = $node->safe_psql($db, 'SELECT private_wrapped FROM pepsi.crypto_identity',
	extra_params => [ '-U', 'crypto' ]);
($rc, $out, $err) = keys_run('kek-rotate', '-c', $conf);
isnt($rc, 0, 'a wrong KEK_PREVIOUS: kek-rotate fails');
like($err, qr/does not open under KEK k2.*nothing rewrapped/, 'saying the key does not open');
is($node->safe_psql($db, 'SELECT kek_id || \' \' || (private_wrapped = \'' . $wrapped_k2 . '\') FROM pepsi.crypto_identity',
	extra_params => [ '-U', 'crypto' ]), 'k2 true', 'and nothing changed');

# A corrupted sealed key does not open either (a bit of byte 40 flipped:
# writing a fixed value there would change nothing when the byte had it).
kek_fragment($kek3 . "KEK_PREVIOUS = " . ($kek2 =~ /KEK = (\S+)/)[0] . "\n");
$node->safe_psql($db,
	"UPDATE pepsi.crypto_identity SET private_wrapped = set_byte(private_wrapped, 39, get_byte(private_wrapped, 39) # 1)",
	extra_params => [ '-U', 'crypto' ]);
($rc, $out, $err) = keys_run('kek-rotate', '-c', $conf);
isnt($rc, 0, 'a corrupted sealed key: kek-rotate fails');
like($err, qr/does not open under KEK k2/, 'saying it does not open');
$node->safe_psql($db, "UPDATE pepsi.crypto_identity SET private_wrapped = '$wrapped_k2'",
	extra_params => [ '-U', 'crypto' ]);
kek_fragment($kek2);

# Bad keys are refused with the reason, and nothing is stored.
my $count = sub { $node->safe_psql($db, 'SELECT count(*) FROM pepsi.crypto_identity') };
sub refused
{
	my ($what, $address, $file, $want) = @_;
	my $before = $count->();
	my ($code, undef, $stderr) = keys_run('identity', 'import', '-c', $conf, $address, $file);
	isnt($code, 0, "$what: refused");
	like($stderr, $want, "$what: the reason");
	is($count->(), $before, "$what: nothing stored");
}
refused('another address\'s key', 'bob@example.org', $alice_file, qr/has no User ID with the address bob\@example\.org/);
refused('a public key alone', 'alice@example.org', write_file('alice.pub', $alice_public),
	qr/only its public half/);
refused('bytes that are no key', 'alice@example.org', write_file('junk.key', "not a key\n" x 20),
	qr/no OpenPGP key/);
my ($expired, $revoked);
{
	$expired = gpg_key('old@example.org', '--faked-system-time', '20200101T000000');
	refused('an expired key', 'old@example.org', write_file('old.key', gpg('--export-secret-keys', $expired)),
		qr/has expired/);
	$revoked = gpg_key('gone@example.org');
	my $cert = slurp_file("$gnupg/openpgp-revocs.d/$revoked.rev");
	$cert =~ s/^:-----BEGIN/-----BEGIN/m;
	gpg('--import', write_file('gone.rev', $cert));
	refused('a revoked key', 'gone@example.org', write_file('gone.key', gpg('--export-secret-keys', $revoked)),
		qr/is revoked/);
}

# Export, revoke, purge: each audited.
($rc, $out, $err) = keys_run('identity', 'export', '-c', $conf, 'alice@example.org');
like($out, qr/^-----BEGIN PGP PUBLIC KEY BLOCK-----/, 'export prints the armored public key');
{
	my $pub = write_file('exported.asc', $out);
	my $shown = gpg('--with-colons', '--show-keys', $pub);
	like($shown, qr/^fpr:+\Q$alice\E:/m, 'gpg reads it as alice\'s key');
}
($rc, $out, $err) = keys_run('identity', 'generate', '-c', $conf, '-t', 'ed25519', 'alice@example.org');
is($rc, 0, 'generate a new key for alice') or diag($err);
my ($new) = $out =~ /^alice\@example\.org ([0-9A-F]{40}) openpgp/m;
is( $node->safe_psql($db,
		"SELECT string_agg(status || ':' || is_primary, ' ' ORDER BY created_at) FROM pepsi.crypto_identity"),
	'retired:false active:true', 'the new key is the primary, the old one retired');
($rc, $out, $err) = keys_run('identity', 'revoke', '-c', $conf, $alice, 'superseded');
is($rc, 0, 'revoke the old key') or diag($err);
($rc, $out, $err) = keys_run('identity', 'revoke', '-c', $conf, $alice);
isnt($rc, 0, 'revoking it again is refused');
($rc, $out, $err) = keys_run('identity', 'purge', '-c', $conf, $alice);
is($rc, 0, 'purge its private half') or diag($err);
is( $node->safe_psql($db,
		"SELECT status || ' ' || (private_purged_at IS NOT NULL) || ' ' || length(public_key) FROM pepsi.crypto_identity"
		  . " WHERE fingerprint = '$alice'"),
	'revoked true ' . length($alice_public), 'the row and the public half stay');
is( $node->safe_psql($db,
		"SELECT private_wrapped IS NULL FROM pepsi.crypto_identity WHERE fingerprint = '$alice'",
		extra_params => [ '-U', 'crypto' ]),
	't', 'the private half is gone');
is( $node->safe_psql($db,
		"SELECT string_agg(action, ' ' ORDER BY id) FROM pepsi.event_log WHERE action ~ '^(key|kek)_'"),
	'key_import kek_rotate kek_rotate key_generate key_revoke key_purge',
	'every operation is in event_log');
is( $node->safe_psql($db,
		"SELECT detail->>'fingerprint' || ' ' || (detail->>'reason') FROM pepsi.event_log WHERE action = 'key_revoke'"),
	"$alice superseded", 'with what it was about');

#
# pepsi-stage-encrypt: PGP/MIME to the recipient's key, signed with the
# sender's identity, the Subject protected; policy required without a
# usable key bounces, never clear text.
#
my $bob = gpg_key('bob@example.net');
my $carol = gpg_key('carol@example.net');
open my $cf, '>>', $conf or die;
print $cf <<'INI';

[stage-encrypt]
PROGRAM = pepsi-stage-encrypt
NEXT_STAGE = sent

[stage-encrypt-required]
PROGRAM = pepsi-stage-encrypt
NEXT_STAGE = sent
POLICY = required
BOUNCE_STAGE = bounced

[stage-decrypt]
PROGRAM = pepsi-stage-decrypt
NEXT_STAGE = sent
DECRYPT = yes

[stage-decrypt-not]
PROGRAM = pepsi-stage-decrypt
NEXT_STAGE = sent

[stage-learn]
PROGRAM = pepsi-stage-autocrypt-learn
NEXT_STAGE = sent

[stage-sent]
PROGRAM = pepsi-stage-discard

[stage-bounced]
PROGRAM = pepsi-stage-discard
INI
close $cf;

# A correspondent's key as key discovery would store it.
sub peer_key
{
	my ($address, $fpr) = @_;
	my $hex = unpack('H*', gpg('--export', $fpr));
	$node->safe_psql($db,
		"INSERT INTO pepsi.peer_key (address, protocol, fingerprint, key_data, source, verdict, cache_until)"
		  . " VALUES ('$address', 'openpgp', '$fpr', '\\x$hex', 'import', 'valid', 'infinity')",
		extra_params => [ '-U', 'admin' ]);
}
peer_key('bob@example.net', $bob);
peer_key('carol@example.net', $carol);
peer_key('old@example.org', $expired);
peer_key('gone@example.org', $revoked);
peer_key('mallory@example.net', $bob);

sub encrypt_row
{
	my ($stage, @rcpt) = @_;
	my $id = add_row($node, $stage, from => 'alice@example.org', rcpt => [@rcpt],
		extra_headers => "To: <$rcpt[0]>\r\n");
	# add_row's Subject is "test": make it one worth protecting.
	$node->safe_psql($db,
		"UPDATE pepsi.workqueue SET headers = convert_to(replace(convert_from(headers, 'UTF8'), 'Subject: test',"
		  . " 'Subject: the secret plans'), 'UTF8') WHERE id = $id");
	return $id;
}


my $enc = encrypt_row('encrypt', 'bob@example.net');
my $r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$enc\n");
is_deeply($r->{status}, ['0'], 'pepsi-stage-encrypt encrypts a message') or diag($r->{stderr});
my $row = row_json($node, $enc);
is($row->{stage}, 'sent', 'and passes it on');
is($row->{state}{encrypt}{result}, 'encrypted', 'state.encrypt says encrypted');
is($row->{state}{encrypt}{signed_by}, $new, 'signed with alice\'s primary key');
my $raw = raw_message($node, $enc);
like($raw, qr/^Content-Type: multipart\/encrypted;\r\n protocol="application\/pgp-encrypted"/m, 'PGP/MIME (RFC 3156)');
like($raw, qr/^Subject: \.\.\.\r$/m, 'the outer Subject is "..."');
unlike($raw, qr/secret plans|Hello\./, 'neither the Subject nor the body is in clear');
like($raw, qr/^Autocrypt: addr=alice\@example\.org; keydata=/m, 'an Autocrypt: field with alice\'s key');
{
	my ($armored) = $raw =~ /(-----BEGIN PGP MESSAGE-----.*?-----END PGP MESSAGE-----)/s;
	$armored =~ s/\r\n/\n/g;
	my ($alice_pub) = (keys_run('identity', 'export', '-c', $conf, 'alice@example.org'))[1];
	gpg('--import', write_file('alice-new.asc', $alice_pub));
	my ($plain, $status, $gerr) = ('', '', '');
	my $ok = IPC::Run::run([ 'gpg', '--batch', '--homedir', $gnupg, '--status-fd', '2', '--decrypt' ],
		'<', \$armored, '>', \$plain, '2>', \$status);
	ok($ok, 'gpg decrypts it') or diag($status);
	like($status, qr/^\[GNUPG:\] VALIDSIG \Q$new\E /m, 'and verifies alice\'s signature');
	like($plain, qr/^Subject: the secret plans\r$/m, 'the protected Subject is inside');
	like($plain, qr/^Content-Type: text\/plain; charset=us-ascii;\r\n protected-headers="v1"\r$/m,
		'marked as protected headers (v1)');
	like($plain, qr/\r\n\r\nHello\.$/, 'with the body');
}

# Opportunistic without a key: as it is.
my $clear = encrypt_row('encrypt', 'dave@example.net');
$r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$clear\n");
is_deeply($r->{status}, ['0'], 'opportunistic, no key') or diag($r->{stderr});
$row = row_json($node, $clear);
is($row->{stage} . ' ' . $row->{state}{encrypt}{result}, 'sent clear', 'goes on in clear');
like($row->{state}{encrypt}{reason}, qr/no key known for dave\@example\.net/, 'saying why');

# Required without a usable key: bounced with the reason, never sent in clear.
for my $case (
	[ 'no key', 'dave@example.net', qr/no key known for dave\@example\.net/ ],
	[ 'an expired key', 'old@example.org', qr/has expired/ ],
	[ 'a revoked key', 'gone@example.org', qr/is revoked/ ],
	[ 'another address\'s key', 'mallory@example.net', qr/no User ID with the address mallory\@example\.net/ ])
{
	my ($what, $to, $want) = @$case;
	my $id = encrypt_row('encrypt-required', $to);
	$r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], "required, $what") or diag($r->{stderr});
	$row = row_json($node, $id);
	is($row->{stage} . ' ' . $row->{state}{encrypt}{result}, 'bounced refused', "required, $what: bounced");
	like($row->{state}{bounce}{diagnostic}, $want, "required, $what: the DSN says why");
}

# Two recipients, one with a key: split, each its own way.
my $mixed = encrypt_row('encrypt-required', 'bob@example.net', 'dave@example.net');
$r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$mixed\n");
is_deeply($r->{status}, ['0'], 'required, one recipient with a key and one without') or diag($r->{stderr});
$row = row_json($node, $mixed);
is_deeply([ $row->{stage}, $row->{state}{encrypt}{result}, $row->{rcpt_to} ],
	[ 'sent', 'encrypted', ['bob@example.net'] ], 'the one with a key gets it encrypted');
my $other = $node->safe_psql($db,
	"SELECT id FROM pepsi.workqueue WHERE rcpt_to = ARRAY['dave\@example.net'] AND stage = 'encrypt-required'");
ok($other, 'the other is split off to the stage again');
set_running($node, $other);
$r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$other\n");
is(row_json($node, $other)->{stage}, 'bounced', 'and bounced');

# One worker, many messages: it keeps the keys it read (in process,
# librnp: no GNUPGHOME), but reads the key store's row before each use,
# so an identity revoked or replaced while it runs stops signing at once.
my $home_parent = File::Temp::tempdir('p163XXXX', DIR => '/tmp', CLEANUP => 1);
chmod 01777, $home_parent or die "chmod $home_parent: $!";
my $homes = sub {
	opendir my $dh, $home_parent or die "opendir $home_parent: $!";
	my @h = grep { /^pepsi-gnupg\./ } readdir $dh;
	closedir $dh;
	return @h;
};
{
	($rc, $out, $err) = keys_run('identity', 'generate', '-c', $conf, '-t', 'ed25519', 'erin@example.org');
	is($rc, 0, 'an identity for erin') or diag($err);
	my ($erin1) = $out =~ /^erin\@example\.org ([0-9A-F]{40}) openpgp/m;
	my $from_erin = sub {
		add_row($node, 'encrypt', from => 'erin@example.org', rcpt => ['bob@example.net'],
			extra_headers => "To: <bob\@example.net>\r\n");
	};
	my $io = start_worker([ 'env', "TMPDIR=$home_parent", @{ worker_cmd('pepsi-stage-encrypt', $conf) } ]);
	my $id = $from_erin->();
	my ($line) = send_ids($io, "$id\n", 1);
	is($line, '0', 'a running worker encrypts erin\'s message') or diag($io->{err});
	is(row_json($node, $id)->{state}{encrypt}{signed_by}, $erin1, 'signed with erin\'s key');
	$id = $from_erin->();
	($line) = send_ids($io, "$id\n", 1);
	is(row_json($node, $id)->{state}{encrypt}{signed_by}, $erin1, 'and the next one, from the key it holds');
	is(scalar($homes->()), 0, 'the encrypt worker runs no gpg: no GNUPGHOME');

	($rc, $out, $err) = keys_run('identity', 'revoke', '-c', $conf, $erin1, 'compromised');
	is($rc, 0, 'erin\'s key is revoked while the worker runs') or diag($err);
	$id = $from_erin->();
	($line) = send_ids($io, "$id\n", 1);
	is($line, '0', 'the worker goes on') or diag($io->{err});
	my $st = row_json($node, $id)->{state}{encrypt};
	is(($st->{result} // '') . ' ' . ($st->{signed_by} // 'unsigned'), 'encrypted unsigned',
		'the revoked key signs nothing more: the worker read its row again');

	($rc, $out, $err) = keys_run('identity', 'generate', '-c', $conf, '-t', 'ed25519', 'erin@example.org');
	my ($erin2) = $out =~ /^erin\@example\.org ([0-9A-F]{40}) openpgp/m;
	$id = $from_erin->();
	($line) = send_ids($io, "$id\n", 1);
	is(row_json($node, $id)->{state}{encrypt}{signed_by}, $erin2, 'her new key signs the next message');
	ok($io->{harness}->finish, 'the worker exits 0 when its input ends') or diag($io->{err});
	# Erin's keys are this block's alone: the publishing below is alice's.
	($rc, $out, $err) = keys_run('identity', 'revoke', '-c', $conf, $erin2, 'superseded');
	is($rc, 0, 'erin\'s second key is revoked too') or diag($err);
}

#
# pepsi-stage-decrypt: gpg's PGP/MIME to our identity, decrypted, the
# signature verified, the protected Subject restored; the stage's own
# message the other way; a damaged one left as it came.
#
sub add_message
{
	my ($stage, $from, $to, $headers, $body) = @_;
	my $id = $node->safe_psql($db,
		"SELECT pepsi.workqueue_add('$from', ARRAY['$to'], convert_to("
		  . PepsiStage::quote_literal($headers) . ", 'UTF8'), convert_to("
		  . PepsiStage::quote_literal($body) . ", 'UTF8'), '{}', stage => '$stage')");
	set_running($node, $id);
	return $id;
}

# A PGP/MIME message as a mail client makes it: gpg encrypts and signs.
sub pgp_mime
{
	my ($to_fpr, $signer, $subject, $text) = @_;
	my $entity = "Content-Type: text/plain; charset=utf-8; protected-headers=\"v1\"\r\n"
	  . "Subject: $subject\r\n\r\n$text\r\n";
	my $armored = gpg('--trust-model', 'always', '--armor', '--encrypt', '--sign', '-u', $signer, '-r', $to_fpr,
		'--output', '-', write_file('entity.txt', $entity));
	$armored =~ s/\r?\n/\r\n/g;
	my $headers = "From: <bob\@example.net>\r\nTo: <alice\@example.org>\r\nSubject: ...\r\n"
	  . "MIME-Version: 1.0\r\nContent-Type: multipart/encrypted; protocol=\"application/pgp-encrypted\"; boundary=\"b1\"\r\n";
	my $body = "--b1\r\nContent-Type: application/pgp-encrypted\r\n\r\nVersion: 1\r\n\r\n--b1\r\n"
	  . "Content-Type: application/octet-stream\r\n\r\n$armored\r\n--b1--\r\n";
	return ($headers, $body);
}

my ($dh, $db_body) = pgp_mime($new, $bob, 'meet at noon', 'Hi alice.');
my $dec = add_message('decrypt', 'bob@example.net', 'alice@example.org', $dh, $db_body);
$r = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$dec\n");
is_deeply($r->{status}, ['0'], 'pepsi-stage-decrypt decrypts gpg\'s message') or diag($r->{stderr});
$row = row_json($node, $dec);
is_deeply([ @{ $row->{state}{decrypt} }{qw(result key signature signed_by)} ],
	[ 'decrypted', $new, 'pass', $bob ], 'state.decrypt: decrypted with alice\'s key, bob\'s signature good');
$raw = raw_message($node, $dec);
like($raw, qr/^Subject: meet at noon\r$/m, 'the protected Subject is restored');
unlike($raw, qr/^Subject: \.\.\.\r$/m, 'the outer one is gone');

# A decrypt worker keeps one private GNUPGHOME for its life (removed when
# it exits), which holds the secret keys of every identity it has read: a
# message is decrypted only if it is encrypted to the key of the
# recipient it is addressed to, not by whichever key the home has.
{
	($rc, $out, $err) = keys_run('identity', 'generate', '-c', $conf, '-t', 'ed25519', 'frank@example.org');
	is($rc, 0, 'an identity for frank') or diag($err);
	my ($frank) = $out =~ /^frank\@example\.org ([0-9A-F]{40}) openpgp/m;
	# A home a killed worker left: its pid is gone.
	my $dead = fork() // die "fork: $!";
	POSIX::_exit(0) if $dead == 0;
	waitpid($dead, 0);
	my $left = "$home_parent/pepsi-gnupg.$dead.AbCdEf";
	mkdir $left, 0700 or die "mkdir $left: $!";
	open my $lk, '>', "$left/private-key" or die "$left/private-key: $!";
	print $lk "a key its agent wrote\n";
	close $lk;
	my $io = start_worker([ 'env', "TMPDIR=$home_parent", @{ worker_cmd('pepsi-stage-decrypt', $conf) } ]);
	my ($h1, $b1) = pgp_mime($new, $bob, 'for alice', 'Hi alice.');
	my $id = add_message('decrypt', 'bob@example.net', 'alice@example.org', $h1, $b1);
	send_ids($io, "$id\n", 1);
	is(row_json($node, $id)->{state}{decrypt}{result}, 'decrypted', 'a decrypt worker opens a message to alice');
	ok(!-e $left, 'the home a dead worker left is removed when a worker starts its own');
	my @h = $homes->();
	is(scalar(@h), 1, 'one GNUPGHOME for the decrypt worker');
	is(@h ? (stat("$home_parent/$h[0]"))[2] & 07777 : -1, 0700, 'private to its owner (0700)');
	$id = add_message('decrypt', 'bob@example.net', 'frank@example.org', $h1, $b1);
	my ($line) = send_ids($io, "$id\n", 1);
	is($line, '0', 'the same message to frank, in the same worker') or diag($io->{err});
	my $st = row_json($node, $id)->{state}{decrypt};
	is($st->{result}, 'failed', 'is not decrypted with alice\'s key, which the worker holds');
	like($st->{reason}, qr/not encrypted to key \Q$frank\E/, 'saying it is not for frank\'s key');
	unlike(raw_message($node, $id), qr/Hi alice/, 'and goes on encrypted');
	ok($io->{harness}->finish, 'the decrypt worker exits 0') or diag($io->{err});
	is(scalar($homes->()), 0, 'and its GNUPGHOME is gone');
	($rc, $out, $err) = keys_run('identity', 'revoke', '-c', $conf, $frank, 'superseded');
	is($rc, 0, 'frank\'s key is revoked (the publishing below is alice\'s)') or diag($err);
}
like($raw, qr/^Authentication-Results: [^;]+;\r\n x-pgp-decrypt=pass \(key \Q$new\E\);\r\n x-pgp-sign=pass header\.from=bob\@example\.net/m,
	'an Authentication-Results field with both verdicts');
like($raw, qr/\r\n\r\nHi alice\.\r\n$/, 'the body is the plain text');
unlike($raw, qr/multipart\/encrypted|protected-headers/, 'no trace of the envelope');

# Signed by a key that is not the sender's: decrypted, the signature fails.
{
	my ($h2, $b2) = pgp_mime($new, $carol, 'not from bob', 'Hi.');
	$h2 =~ s/bob\@example\.net/nobody\@example.net/;
	my $id = add_message('decrypt', 'nobody@example.net', 'alice@example.org', $h2, $b2);
	$r = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$id\n");
	$row = row_json($node, $id);
	is($row->{state}{decrypt}{signature}, 'fail', 'a signature by a key not the sender\'s fails');
	like($row->{state}{decrypt}{reason}, qr/not known for the sender/, 'with the reason');
	like(raw_message($node, $id), qr/x-pgp-sign=fail/, 'in Authentication-Results too');
}

# A damaged ciphertext: left as it came, with the reason.
{
	my ($h3, $b3) = pgp_mime($new, $bob, 'damaged', 'Hi.');
	my @lines = split /\r\n/, $b3;
	my ($first) = grep { $lines[$_] =~ /^[A-Za-z0-9+\/]{60,}$/ } 0 .. $#lines;
	$lines[ $first + 2 ] =~ tr/A-Za-z/N-ZA-Mn-za-m/;
	$b3 = join("\r\n", @lines) . "\r\n";
	my $id = add_message('decrypt', 'bob@example.net', 'alice@example.org', $h3, $b3);
	$r = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], 'a damaged ciphertext') or diag($r->{stderr});
	$row = row_json($node, $id);
	is($row->{state}{decrypt}{result}, 'failed', 'is not decrypted');
	like($row->{state}{decrypt}{reason}, qr/does not decrypt/, 'saying why');
	is(raw_message($node, $id), $h3 . "\r\n" . $b3, 'and goes on exactly as it came');
}

# An owner who did not choose server-side decryption: untouched.
{
	my $id = add_message('decrypt-not', 'bob@example.net', 'alice@example.org', $dh, $db_body);
	$r = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$id\n");
	is(row_json($node, $id)->{state}{decrypt}{result}, 'not chosen', 'DECRYPT no: not decrypted');
	is(raw_message($node, $id), $dh . "\r\n" . $db_body, 'the message as it came');
}

# The encrypt stage's message, the other way: bob's secret key as an
# identity of ours, the row decrypted, alice's signature verified with her
# identity.
($rc, $out, $err) = keys_run('identity', 'import', '-c', $conf, 'bob@example.net',
	write_file('bob.key', gpg('--export-secret-keys', $bob)));
is($rc, 0, 'bob\'s key imported as an identity') or diag($err);
{
	my $id = add_message('decrypt', 'alice@example.org', 'bob@example.net', split(/\r\n\r\n/, raw_message($node, $enc), 2));
	$r = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], 'the decrypt stage takes the encrypt stage\'s message') or diag($r->{stderr});
	$row = row_json($node, $id);
	is_deeply([ @{ $row->{state}{decrypt} }{qw(result key signature signed_by)} ],
		[ 'decrypted', $bob, 'pass', $new ], 'decrypted with bob\'s key, alice\'s signature good');
	$raw = raw_message($node, $id);
	like($raw, qr/^Subject: the secret plans\r$/m, 'the protected Subject survives the round trip');
	like($raw, qr/\r\n\r\nHello\.$/, 'and the body');
}

#
# pepsi-stage-autocrypt-learn: a peer's Autocrypt: key into peer_key; a
# decrypted message signed by its sender into peer_has_own_key.
#
sub autocrypt_field
{
	my ($addr, $fpr) = @_;
	my $b64 = MIME::Base64::encode_base64(gpg('--export', $fpr), '');
	$b64 =~ s/(.{76})/$1\r\n /g;
	return "Autocrypt: addr=$addr; prefer-encrypt=mutual; keydata=\r\n $b64\r\n";
}
require MIME::Base64;
{
	my $id = add_message('learn', 'carol@example.net', 'alice@example.org',
		"From: <Carol\@Example.net>\r\nSubject: hi\r\n" . autocrypt_field('carol@example.net', $carol), "Hi.\r\n");
	$node->safe_psql($db, "DELETE FROM pepsi.peer_key WHERE address = 'carol\@example.net'");
	$r = run_worker(worker_cmd('pepsi-stage-autocrypt-learn', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], 'pepsi-stage-autocrypt-learn') or diag($r->{stderr});
	is(row_json($node, $id)->{state}{autocrypt}{result}, 'learned', 'learns a peer\'s Autocrypt key');
	is( $node->safe_psql($db,
			"SELECT fingerprint || ' ' || source || ' ' || verdict || ' ' || prefer_encrypt || ' ' || (cache_until > now() + interval '179 days')"
			  . " FROM pepsi.peer_key WHERE address = 'carol\@example.net'"),
		"$carol autocrypt valid true true", 'into peer_key: source, verdict, prefer-encrypt, deadline');
	# And pepsi-stage-encrypt now uses it.
	my $to_carol = encrypt_row('encrypt', 'carol@example.net');
	run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$to_carol\n");
	is_deeply(row_json($node, $to_carol)->{state}{encrypt}{keys}, [$carol], 'the next message to carol is encrypted to it');
}
for my $case (
	[ 'addr is not From:', 'bob@example.net', autocrypt_field('carol@example.net', $carol), qr/not the From: address/ ],
	[ 'an expired key', 'old@example.org', autocrypt_field('old@example.org', $expired), qr/has expired/ ],
	[ 'another address\'s key', 'eve@example.net', autocrypt_field('eve@example.net', $bob), qr/no User ID/ ],
	[ 'an unknown critical attribute', 'bob@example.net', "Autocrypt: addr=bob\@example.net; x=1; keydata=AAAA\r\n", qr/unknown critical/ ])
{
	my ($what, $from, $field, $want) = @$case;
	my $before = $node->safe_psql($db, 'SELECT count(*) FROM pepsi.peer_key');
	my $id = add_message('learn', $from, 'alice@example.org', "From: <$from>\r\nSubject: hi\r\n$field", "Hi.\r\n");
	$r = run_worker(worker_cmd('pepsi-stage-autocrypt-learn', $conf), "$id\n");
	$row = row_json($node, $id);
	is($row->{state}{autocrypt}{result} . ' ' . $row->{stage}, 'ignored sent', "$what: ignored, the message goes on");
	like($row->{state}{autocrypt}{reason}, $want, "$what: the reason");
	is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.peer_key'), $before, "$what: nothing stored");
}
$node->safe_psql($db, "UPDATE pepsi.workqueue SET stage = 'learn', status = 'running' WHERE id = $dec");
$r = run_worker(worker_cmd('pepsi-stage-autocrypt-learn', $conf), "$dec\n");
is( $node->safe_psql($db,
		"SELECT p.peer_address || ' ' || i.fingerprint FROM pepsi.peer_has_own_key p"
		  . " JOIN pepsi.crypto_identity i ON i.id = p.identity_id"),
	"bob\@example.net $new", 'bob, who encrypted to alice\'s key and signed, holds it: peer_has_own_key');

# Publishing: the Web Key Directory tree and the OPENPGPKEY record.
{
	my $wkd = "$tmp/wkd";
	($rc, $out, $err) = keys_run('identity', 'wkd', '-c', $conf, $wkd);
	is($rc, 0, 'identity wkd') or diag($err);
	my ($hash) = gpg('--with-wkd-hash', '--list-keys', $new) =~ /^\s+([a-z0-9]{32})\@example\.org$/m;
	ok($hash, 'gpg names alice\'s WKD hash');
	my $file = "$wkd/example.org/hu/$hash";
	ok(-f $file, 'the key is where WKD looks for alice (gpg\'s hash)');
	like(gpg('--with-colons', '--show-keys', $file), qr/^fpr:+\Q$new\E:/m, 'and is her key');
	ok(-f "$wkd/example.org/policy", 'with the policy file');
	is($node->safe_psql($db, "SELECT published FROM pepsi.crypto_identity WHERE fingerprint = '$new'"),
		't', 'the identity is marked published');
	is($node->safe_psql($db, "SELECT count(*) FROM pepsi.event_log WHERE action = 'key_publish'"),
		'2', 'a key_publish event per key');
	($rc, $out, $err) = keys_run('identity', 'openpgpkey', '-c', $conf, 'alice@example.org');
	is($rc, 0, 'identity openpgpkey') or diag($err);
	my $owner = substr(Digest::SHA::sha256_hex('alice'), 0, 56);
	like($out, qr/^\Q$owner\E\._openpgpkey\.example\.org\. IN OPENPGPKEY [A-Za-z0-9+\/=]+$/, 'the RFC 7929 owner name');
	my ($b64) = $out =~ / OPENPGPKEY (\S+)$/;
	like(gpg('--with-colons', '--show-keys', write_file('dns.key', MIME::Base64::decode_base64($b64))),
		qr/^fpr:+\Q$new\E:/m, 'and the key in the record is hers');
}

#
# S/MIME (RFC 8551) through OpenSSL CMS: certificates from a CA of the
# test's own made with Debian's openssl; the stage's messages opened and
# verified by `openssl cms`, openssl's messages by the stage; bad
# certificates and a damaged ciphertext refused with the reason.
#
sub openssl
{
	my ($in, @args) = @_;
	my ($out, $oerr) = ('', '');
	my $ok = IPC::Run::run([ 'openssl', @args ], '<', \$in, '>', \$out, '2>', \$oerr);
	return wantarray ? ($ok, $out, $oerr) : ($ok ? $out : die "openssl @args: $oerr");
}
my $ssl = "$tmp/ssl";
mkdir $ssl or die "mkdir $ssl: $!";
write_file('ssl/index.txt', '');
write_file('ssl/ca.cnf', <<"CNF");
[ca]
default_ca = d
[d]
database = $ssl/index.txt
new_certs_dir = $ssl
serial = $ssl/serial
default_md = sha256
policy = p
unique_subject = no
[p]
commonName = supplied
CNF
openssl('', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$ssl/ca.key", '-out', "$ssl/ca.pem",
	'-subj', '/CN=Pepsi test CA', '-days', '30', '-addext', 'basicConstraints=critical,CA:TRUE',
	'-addext', 'keyUsage=critical,keyCertSign,cRLSign');
write_file('ssl/serial', "1000\n");

# A certificate from the CA: $name.pem and $name.key; its SHA-256 fingerprint.
sub smime_cert
{
	my ($name, $address, $alg, @dates) = @_;
	my $ec = $alg eq 'ec';
	openssl('', 'genpkey', '-out', "$ssl/$name.key",
		$ec ? ('-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256')
		: ('-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048'));
	openssl('', 'req', '-new', '-key', "$ssl/$name.key", '-subj', "/CN=$address", '-out', "$ssl/$name.csr");
	write_file("ssl/$name.ext", "subjectAltName = email:$address\nextendedKeyUsage = emailProtection\n"
		  . 'keyUsage = critical, digitalSignature, ' . ($ec ? 'keyAgreement' : 'keyEncipherment') . "\n");
	openssl('', 'ca', '-batch', '-notext', '-config', "$ssl/ca.cnf", '-cert', "$ssl/ca.pem", '-keyfile', "$ssl/ca.key",
		'-in', "$ssl/$name.csr", '-out', "$ssl/$name.pem", '-extfile', "$ssl/$name.ext",
		@dates ? ('-startdate', $dates[0], '-enddate', $dates[1]) : ('-days', '30'));
	my ($fpr) = openssl('', 'x509', '-in', "$ssl/$name.pem", '-noout', '-fingerprint', '-sha256') =~ /=(\S+)/;
	$fpr =~ s/://g;
	return $fpr;
}

($rc, $out, $err) = keys_run('ca', 'import', '-c', $conf, "$ssl/ca.pem", 'the test CA');
is($rc, 0, 'pepsi-keys ca import') or diag($err);
is($node->safe_psql($db, 'SELECT subject FROM pepsi.ca_trust'), '/CN=Pepsi test CA', 'the CA is trusted');

# alice's S/MIME identity (EC, PEM certificate and key), sam's (RSA, PKCS#12 with a password).
my $alice_x = smime_cert('alice', 'alice@example.org', 'ec');
write_file('ssl/alice.both', slurp_file("$ssl/alice.pem") . slurp_file("$ssl/alice.key"));
($rc, $out, $err) = keys_run('identity', 'import', '-c', $conf, 'alice@example.org', "$ssl/alice.both");
is($rc, 0, 'an S/MIME identity from a PEM certificate and key') or diag($err);
like($out, qr/^alice\@example\.org $alice_x smime ec256 both$/m, 'named by its certificate\'s SHA-256');
my $sam_x = smime_cert('sam', 'sam@example.org', 'rsa');
write_file('ssl/pw', "s3cret\n");
openssl('', 'pkcs12', '-export', '-in', "$ssl/sam.pem", '-inkey', "$ssl/sam.key", '-out', "$ssl/sam.p12",
	'-passout', 'pass:s3cret');
($rc, $out, $err) = keys_run('identity', 'import', '-c', $conf, 'sam@example.org', "$ssl/sam.p12");
isnt($rc, 0, 'PKCS#12 without its password: refused');
like($err, qr/PKCS#12 bundle \(or its password is not the one\)/, 'saying so');
($rc, $out, $err) = keys_run('identity', 'import', '-c', $conf, '-P', "$ssl/pw", 'sam@example.org', "$ssl/sam.p12");
is($rc, 0, 'an S/MIME identity from PKCS#12') or diag($err);
like($out, qr/^sam\@example\.org $sam_x smime rsa2048 both$/m, 'sam\'s');
($rc, $out, $err) = keys_run('identity', 'export', '-c', $conf, $sam_x);
is(openssl($out, 'x509', '-noout', '-subject'), "subject=CN = sam\@example.org\n", 'export gives the certificate (PEM)');
{
	my $key_hex = substr(unpack('H*', openssl('', 'pkey', '-in', "$ssl/sam.key", '-outform', 'DER')), 40, 64);
	unlike(
		$node->safe_psql($db,
			"SELECT encode(private_wrapped, 'hex') FROM pepsi.crypto_identity WHERE fingerprint = '$sam_x'"),
		qr/\Q$key_hex\E/, 'the private key is stored sealed');
}

# Correspondents' certificates: RSA (rita), EC that takes AES-256-GCM (eve).
my $rita_x = smime_cert('rita', 'rita@example.net', 'rsa');
my $eve_x = smime_cert('eve', 'eve@example.net', 'ec');
($rc, $out, $err) = keys_run('peer', 'import', '-c', $conf, 'rita@example.net', "$ssl/rita.pem");
is($rc, 0, 'pepsi-keys peer import: an S/MIME certificate') or diag($err);
($rc, $out, $err) = keys_run('peer', 'import', '-c', $conf, 'eve@example.net', "$ssl/eve.pem", 'aes-256-gcm,aes-256-cbc');
is($rc, 0, 'with the ciphers it takes') or diag($err);
my $old_x = smime_cert('old', 'old2@example.net', 'rsa', '20200101000000Z', '20200201000000Z');
for my $case ([ 'an expired certificate', 'old2@example.net', 'old', qr/has expired/ ],
	[ 'another address\'s certificate', 'mallory2@example.net', 'rita', qr/names no address mallory2\@example\.net/ ])
{
	my ($what, $to, $file, $want) = @$case;
	($rc, $out, $err) = keys_run('peer', 'import', '-c', $conf, $to, "$ssl/$file.pem");
	isnt($rc, 0, "peer import refuses $what");
	like($err, $want, 'with the reason');
	# As a lookup might store it: the stage checks again.
	my $hex = unpack('H*', openssl('', 'x509', '-in', "$ssl/$file.pem", '-outform', 'DER'));
	$node->safe_psql($db,
		"INSERT INTO pepsi.peer_key (address, protocol, fingerprint, key_data, source, verdict, cache_until)"
		  . " VALUES ('$to', 'smime', '" . ($file eq 'old' ? $old_x : $rita_x) . "', '\\x$hex', 'smimea', 'valid', 'infinity')",
		extra_params => [ '-U', 'admin' ]);
}

# The stage's S/MIME, opened and verified by openssl.
for my $case ([ 'rita@example.net', 'rita', 'aes-256-cbc', 'enveloped-data' ],
	[ 'eve@example.net', 'eve', 'aes-256-gcm', 'authEnveloped-data' ])
{
	my ($to, $name, $cipher, $type) = @$case;
	my $id = encrypt_row('encrypt', $to);
	$r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], "pepsi-stage-encrypt to $name\'s certificate") or diag($r->{stderr});
	$row = row_json($node, $id);
	is_deeply([ @{ $row->{state}{encrypt} }{qw(result format cipher signed_by)} ],
		[ 'encrypted', 's/mime', $cipher, $alice_x ], "S/MIME, $cipher, signed with alice's S/MIME identity")
	  or diag(explain($row));
	$raw = raw_message($node, $id);
	like($raw, qr/^Content-Type: application\/pkcs7-mime; smime-type=$type; name="smime\.p7m"\r$/m,
		"application/pkcs7-mime; smime-type=$type");
	like($raw, qr/^Subject: \.\.\.\r$/m, 'the outer Subject is "..."');
	unlike($raw, qr/secret plans|Hello\.|^Autocrypt:/m, 'nothing in clear, no Autocrypt field');
	my ($ok, $entity, $oerr) = openssl($raw, 'cms', '-decrypt', '-recip', "$ssl/$name.pem", '-inkey', "$ssl/$name.key");
	ok($ok, "openssl cms -decrypt opens it with $name\'s key") or diag($oerr);
	like($entity, qr/^Content-Type: multipart\/signed; protocol="application\/pkcs7-signature"/m, 'signed inside');
	my ($vok, $content, $verr) = openssl($entity, 'cms', '-verify', '-CAfile', "$ssl/ca.pem");
	ok($vok, 'openssl cms -verify: alice\'s signature is good') or diag($verr);
	like($content, qr/^Subject: the secret plans\r$/m, 'the protected Subject is inside');
	like($content, qr/\r\n\r\nHello\.$/, 'with the body');
}
for my $case ([ 'an expired certificate', 'old2@example.net', qr/has expired/ ],
	[ 'a certificate of another address', 'mallory2@example.net', qr/names no address mallory2\@example\.net/ ])
{
	my ($what, $to, $want) = @$case;
	my $id = encrypt_row('encrypt-required', $to);
	$r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	$row = row_json($node, $id);
	is($row->{stage} . ' ' . $row->{state}{encrypt}{result}, 'bounced refused', "required, $what: bounced");
	like($row->{state}{bounce}{diagnostic}, $want, "required, $what: the DSN says why");
}
{
	# Two recipients, an OpenPGP key and an S/MIME certificate: each its own way.
	my $id = encrypt_row('encrypt', 'rita@example.net', 'bob@example.net');
	$r = run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	$row = row_json($node, $id);
	is_deeply([ $row->{state}{encrypt}{format}, $row->{rcpt_to} ], [ 's/mime', ['rita@example.net'] ],
		'an S/MIME and an OpenPGP recipient: split, S/MIME for the one');
	my $other = $node->safe_psql($db,
		"SELECT id FROM pepsi.workqueue WHERE rcpt_to = ARRAY['bob\@example.net'] AND stage = 'encrypt'");
	set_running($node, $other);
	run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$other\n");
	is(row_json($node, $other)->{state}{encrypt}{format}, 'pgp/mime', 'PGP/MIME for the other');
}

# openssl's S/MIME (signed, then enveloped) to sam, through the decrypt stage.
sub openssl_smime
{
	my ($signer, $from, $to_cert, $subject, $text, @cipher) = @_;
	my $entity = "Content-Type: text/plain; charset=utf-8\r\nSubject: $subject\r\n\r\n$text\r\n";
	my $signed = openssl($entity, 'cms', '-sign', '-signer', "$ssl/$signer.pem", '-inkey', "$ssl/$signer.key",
		'-crlfeol');
	my $msg = openssl($signed, 'cms', '-encrypt', @cipher ? @cipher : '-aes256', '-from', $from, '-to',
		'sam@example.org', '-subject', '...', '-crlfeol', "$ssl/$to_cert.pem");
	return split /\r\n\r\n/, $msg, 2;
}
my ($sh, $sb) = openssl_smime('rita', 'rita@example.net', 'sam', 'lunch?', 'Hi sam.');
my $sdec = add_message('decrypt', 'rita@example.net', 'sam@example.org', "$sh\r\n", $sb);
$r = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$sdec\n");
is_deeply($r->{status}, ['0'], 'pepsi-stage-decrypt takes openssl\'s S/MIME') or diag($r->{stderr});
$row = row_json($node, $sdec);
is_deeply([ @{ $row->{state}{decrypt} }{qw(result format key signature signed_by)} ],
	[ 'decrypted', 's/mime', $sam_x, 'pass', $rita_x ],
	'decrypted with sam\'s identity, rita\'s signature good (it chains to the trusted CA)');
$raw = raw_message($node, $sdec);
like($raw, qr/^Subject: lunch\?\r$/m, 'the inner Subject replaces "..."');
like($raw, qr/^Authentication-Results: [^;]+;\r\n x-smime-decrypt=pass \(certificate \Q$sam_x\E\);\r\n x-smime-sign=pass header\.from=rita\@example\.net/m,
	'Authentication-Results with both verdicts');
like($raw, qr/\r\n\r\nHi sam\.\r\n$/, 'the body is the plain text');
unlike($raw, qr/pkcs7/, 'no trace of the envelope');
{
	my ($gh, $gb) = openssl_smime('rita', 'rita@example.net', 'sam', 'gcm', 'Hi.', '-aes-256-gcm');
	my $id = add_message('decrypt', 'rita@example.net', 'sam@example.org', "$gh\r\n", $gb);
	run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$id\n");
	is(row_json($node, $id)->{state}{decrypt}{signature}, 'pass', 'AES-256-GCM (authEnveloped-data) from openssl too');
}
{
	# Signed by a certificate that does not name the sender.
	my ($h2, $b2) = openssl_smime('eve', 'rita@example.net', 'sam', 'not eve', 'Hi.');
	my $id = add_message('decrypt', 'rita@example.net', 'sam@example.org', "$h2\r\n", $b2);
	run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$id\n");
	$row = row_json($node, $id);
	is($row->{state}{decrypt}{signature} . ' ' . $row->{state}{decrypt}{reason},
		'fail the signer\'s certificate does not name the sender rita@example.net',
		'a signer certificate of another address: the signature fails, saying why');
}
{
	# Signed by a certificate of no trusted CA.
	openssl('', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$ssl/self.key", '-out', "$ssl/self.pem",
		'-subj', '/CN=rita@example.net', '-days', '30', '-addext', 'subjectAltName=email:rita@example.net');
	my ($h2, $b2) = openssl_smime('self', 'rita@example.net', 'sam', 'self-signed', 'Hi.');
	my $id = add_message('decrypt', 'rita@example.net', 'sam@example.org', "$h2\r\n", $b2);
	run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$id\n");
	$row = row_json($node, $id);
	is($row->{state}{decrypt}{signature}, 'fail', 'a self-signed signer: the signature fails');
	like($row->{state}{decrypt}{reason}, qr/does not verify against the trusted CAs/, 'saying why');
	like(raw_message($node, $id), qr/^Subject: self-signed\r$/m, 'the message is decrypted all the same');
}
{
	# A damaged ciphertext: left as it came.
	my ($h3, $b3) = openssl_smime('rita', 'rita@example.net', 'sam', 'damaged', 'Hi.', '-aes-256-gcm');
	my @lines = split /\r?\n/, $b3;
	$lines[ int(@lines / 2) ] =~ tr/A-Za-z/N-ZA-Mn-za-m/;
	$b3 = join("\r\n", @lines) . "\r\n";
	my $id = add_message('decrypt', 'rita@example.net', 'sam@example.org', "$h3\r\n", $b3);
	$r = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], 'a damaged S/MIME ciphertext') or diag($r->{stderr});
	$row = row_json($node, $id);
	is($row->{state}{decrypt}{result}, 'failed', 'is not decrypted');
	like($row->{state}{decrypt}{reason}, qr/does not (decrypt|decode)/, 'saying why');
	is(raw_message($node, $id), "$h3\r\n\r\n$b3", 'and goes on exactly as it came');
}
{
	# The stage's own S/MIME the other way: alice to sam, decrypted by sam's identity.
	($rc, $out, $err) = keys_run('peer', 'import', '-c', $conf, 'sam@example.org', "$ssl/sam.pem");
	my $id = encrypt_row('encrypt', 'sam@example.org');
	run_worker(worker_cmd('pepsi-stage-encrypt', $conf), "$id\n");
	my ($bh, $bb) = split(/\r\n\r\n/, raw_message($node, $id), 2);
	my $back = add_message('decrypt', 'alice@example.org', 'sam@example.org', "$bh\r\n", $bb);
	$r = run_worker(worker_cmd('pepsi-stage-decrypt', $conf), "$back\n");
	$row = row_json($node, $back);
	is_deeply([ @{ $row->{state}{decrypt} }{qw(result signature signed_by)} ], [ 'decrypted', 'pass', $alice_x ],
		'the encrypt stage\'s S/MIME decrypted by the decrypt stage, alice\'s signature good')
	  or diag(explain($row->{state}));
	like(raw_message($node, $back), qr/^Subject: the secret plans\r$/m, 'the protected Subject survives the round trip');
}

IPC::Run::run([ 'gpgconf', '--homedir', $gnupg, '--kill', 'gpg-agent' ]);
$node->stop;
done_testing();
