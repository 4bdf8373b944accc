# pepsi-stage-encrypt's OpenPGP in process (librnp, common/crypto/rnp_session.c):
# one worker encrypts to a Curve25519 key and to an RSA-3072 key, signed
# with the sender's identity, and Debian's gpg decrypts both and verifies
# the signature; the worker runs no gpg (it makes no GNUPGHOME); it keeps
# the keys it read, yet a key replaced in the database, or changed in place
# (revoked), is the one it uses for the next message; a key row that does
# not read refuses that message with the reason, never sending it in clear;
# a worker whose session ends connects again and goes on, and one whose
# session loses the key store's prepared reads reads plainly and prepares
# them again.

use strict;
use warnings FATAL => 'all';

use File::Temp ();
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiGpg;
use PepsiStage;
use PepsiTest;

plan skip_all => 'gpg is not installed' unless grep { -x "$_/gpg" } split /:/, $ENV{PATH};

my $db = 'postgres';
my $node = pepsi_node('encrypt_inprocess', extension => 1);
$node->safe_psql($db, 'CREATE ROLE crypto LOGIN IN ROLE pepsi_crypto; CREATE ROLE admin LOGIN IN ROLE pepsi_config;');

my $tmp = PepsiStage::tmp();
my $gnupg = gpg_home();


# A key pair for $address: $primary signs, $sub encrypts.  Its fingerprint
# and the key id of its encryption subkey.
sub gpg_key
{
	my ($address, $primary, $sub) = @_;
	gpg('--yes', '--quick-gen-key', "<$address>", $primary, 'sign,cert', 'never');
	my $list = gpg('--with-colons', '--list-keys', "<$address>");
	my @fprs = $list =~ /^fpr:+([0-9A-F]{40}):/mg;
	my $fpr = $fprs[-1];
	gpg('--quick-add-key', $fpr, $sub, 'encr', 'never');
	my ($subid) = gpg('--with-colons', '--list-keys', $fpr) =~ /^sub:[^:]*:[^:]*:[^:]*:([0-9A-F]{16}):/m;
	return ($fpr, $subid);
}



my $conf = stage_config($node, 'pepsi.conf', sprintf(<<'INI', $node->host, $node->port));
[crypto]
CONNINFO = host=%s port=%d dbname=postgres user=crypto

[stage-encrypt]
PROGRAM = pepsi-stage-encrypt
NEXT_STAGE = sent
POLICY = required
BOUNCE_STAGE = bounced

[stage-sent]
PROGRAM = pepsi-stage-discard

[stage-bounced]
PROGRAM = pepsi-stage-discard
INI
my $secrets = "$tmp/secrets.d";
mkdir $secrets, 0755 or die "mkdir $secrets: $!";
my ($rc, $kek) = keys_run('kek-generate', 'k1');
write_file('secrets.d/crypto.conf', $kek);
chmod 0640, "$secrets/crypto.conf" or die "chmod: $!";

# The sender's identity, sealed under the KEK; its public half in gpg's home.
($rc, my $out, my $err) = keys_run('identity', 'generate', '-c', $conf, '-t', 'ed25519', 'alice@example.org');
is($rc, 0, 'an identity for alice') or diag($err);
my ($alice) = $out =~ /^alice\@example\.org ([0-9A-F]{40}) openpgp/m;
(undef, my $alice_pub) = keys_run('identity', 'export', '-c', $conf, 'alice@example.org');
gpg('--import', write_file('alice.asc', $alice_pub));

# Correspondents' keys, as key discovery stores them.
my ($bob, $bob_sub) = gpg_key('bob@example.net', 'ed25519', 'cv25519');
my ($rita, $rita_sub) = gpg_key('rita@example.net', 'rsa3072', 'rsa3072');
sub key_hex { return unpack('H*', gpg('--export', $_[0])); }
for ([ 'bob@example.net', $bob ], [ 'rita@example.net', $rita ])
{
	my ($address, $fpr) = @$_;
	$node->safe_psql($db,
		"INSERT INTO pepsi.peer_key (address, protocol, fingerprint, key_data, source, verdict, cache_until)"
		  . " VALUES ('$address', 'openpgp', '$fpr', '\\x" . key_hex($fpr) . "', 'import', 'valid', 'infinity')",
		extra_params => [ '-U', 'admin' ]);
}

sub message_to
{
	my ($to) = @_;
	my $id = add_row($node, 'encrypt', from => 'alice@example.org', rcpt => [$to], extra_headers => "To: <$to>\r\n");
	$node->safe_psql($db,
		"UPDATE pepsi.workqueue SET headers = convert_to(replace(convert_from(headers, 'UTF8'), 'Subject: test',"
		  . " 'Subject: the secret plans'), 'UTF8') WHERE id = $id");
	return $id;
}


# gpg --decrypt of a message's PGP/MIME part: (ok, plain text, status lines).
sub gpg_decrypt
{
	my ($raw) = @_;
	my ($armored) = $raw =~ /(-----BEGIN PGP MESSAGE-----.*?-----END PGP MESSAGE-----)/s;
	return (0, '', 'no PGP message') unless $armored;
	$armored =~ s/\r\n/\n/g;
	my ($plain, $status) = ('', '');
	my $ok = IPC::Run::run([ 'gpg', '--batch', '--homedir', $gnupg, '--status-fd', '2', '--decrypt' ],
		'<', \$armored, '>', \$plain, '2>', \$status);
	return ($ok, $plain, $status);
}

# One worker for every message below, its TMPDIR a directory of its own:
# GPGME would make its GNUPGHOME there.
my $worker_tmp = File::Temp::tempdir('/tmp/p179XXXX', CLEANUP => 1);
chmod 01777, $worker_tmp or die "chmod $worker_tmp: $!";
my $io = start_worker([ 'env', "TMPDIR=$worker_tmp", @{ worker_cmd('pepsi-stage-encrypt', $conf) } ]);

sub encrypt_one
{
	my ($to) = @_;
	my $id = message_to($to);
	my ($line) = send_ids($io, "$id\n", 1);
	is($line, '0', "the worker takes the message to $to") or diag($io->{err});
	return ($id, row_json($node, $id));
}

for my $case ([ 'Curve25519', 'bob@example.net', $bob, $bob_sub ], [ 'RSA-3072', 'rita@example.net', $rita, $rita_sub ])
{
	my ($type, $to, $fpr, $subid) = @$case;
	my ($id, $row) = encrypt_one($to);
	is_deeply([ $row->{stage}, @{ $row->{state}{encrypt} }{qw(result format signed_by)}, $row->{state}{encrypt}{keys} ],
		[ 'sent', 'encrypted', 'pgp/mime', $alice, [$fpr] ], "$type: encrypted to $to\'s key, signed by alice");
	my $raw = raw_message($node, $id);
	like($raw, qr/^Content-Type: multipart\/encrypted;\r\n protocol="application\/pgp-encrypted"/m,
		"$type: PGP/MIME (RFC 3156)");
	unlike($raw, qr/secret plans|Hello\./, "$type: nothing in clear");
	my ($ok, $plain, $status) = gpg_decrypt($raw);
	ok($ok, "$type: gpg decrypts it") or diag($status);
	like($status, qr/^\[GNUPG:\] ENC_TO \Q$subid\E /m, "$type: encrypted to the key's encryption subkey");
	like($status, qr/^\[GNUPG:\] VALIDSIG \Q$alice\E /m, "$type: gpg verifies alice's signature");
	like($plain, qr/^Subject: the secret plans\r$/m, "$type: the protected Subject inside");
	like($plain, qr/\r\n\r\nHello\.$/, "$type: the body inside");
}

# The worker ran no gpg: it made no GNUPGHOME (GPGME's worker made one).
{
	opendir my $dh, $worker_tmp or die "opendir $worker_tmp: $!";
	my @homes = grep { /^pepsi-gnupg\./ } readdir $dh;
	closedir $dh;
	is_deeply(\@homes, [], 'the worker encrypted and signed in process: no GNUPGHOME, no gpg');
}

# The worker's session ended under it (a server restart, an operator's
# pg_terminate_backend): it connects again, and the key store's reads,
# prepared once per session, are prepared in the new one.
{
	is($node->safe_psql($db, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'crypto'"),
		'1', 'the worker\'s session is ended');
	my ($id, $row) = encrypt_one('rita@example.net');
	is_deeply([ @{ $row->{state}{encrypt} }{qw(result signed_by)}, $row->{state}{encrypt}{keys} ],
		[ 'encrypted', $alice, [$rita] ], 'in its new session the worker reads the keys again: encrypted and signed');
	($id, $row) = encrypt_one('rita@example.net');
	is($row->{state}{encrypt}{result}, 'encrypted', 'and the next message too');
}

# The session loses the key store's statements (as DEALLOCATE or DISCARD
# ALL, or a pooler's other server session, would): the next message's
# reads, answered that the statement does not exist (26000), go as plain
# statements and the message is encrypted all the same; the one after
# prepares them again (runtime/db.c keeps which the session holds).  A
# trigger on the queue, run in the worker's session as it commits each
# message, notes which of them the session holds and, while armed,
# deallocates them.
$node->safe_psql($db, q{
CREATE TABLE public.keystore_held (message bigint, statements text);
CREATE TABLE public.keystore_drop (armed boolean NOT NULL);
INSERT INTO public.keystore_drop VALUES (true);
CREATE FUNCTION public.keystore_session() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    held text[] := ARRAY(SELECT name FROM pg_prepared_statements WHERE name LIKE 'pepsi\_keystore\_%' ORDER BY name);
    name text;
BEGIN
    IF session_user <> 'crypto' THEN
        RETURN NULL;
    END IF;
    INSERT INTO public.keystore_held VALUES (NEW.id, array_to_string(held, ' '));
    IF (SELECT armed FROM public.keystore_drop) THEN
        FOREACH name IN ARRAY held LOOP
            EXECUTE format('DEALLOCATE %I', name);
        END LOOP;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER keystore_session AFTER UPDATE ON pepsi.workqueue FOR EACH ROW EXECUTE FUNCTION public.keystore_session();
});
{
	my $held = sub {
		$node->safe_psql($db, "SELECT coalesce(string_agg(DISTINCT statements, ','), 'no commit seen') FROM public.keystore_held"
			  . " WHERE message = $_[0]");
	};
	my ($first) = encrypt_one('rita@example.net');
	like($held->($first), qr/(^| )pepsi_keystore_peer( |$)/, 'the worker\'s session holds the key store\'s reads, prepared');
	my ($id, $row) = encrypt_one('rita@example.net');
	is_deeply([ @{ $row->{state}{encrypt} }{qw(result signed_by)}, $row->{state}{encrypt}{keys} ],
		[ 'encrypted', $alice, [$rita] ], 'the session lost them: the reads go plainly, encrypted and signed all the same');
	is($held->($id), '', 'and are not prepared again while the statement fails');
	$node->safe_psql($db, 'UPDATE public.keystore_drop SET armed = false');
	($id, $row) = encrypt_one('rita@example.net');
	is($row->{state}{encrypt}{result}, 'encrypted', 'the next message is encrypted');
	is($held->($id), $held->($first), 'its reads prepared again in the session');

	# A plan gone stale under the session (0A000, "cached plan must not
	# change result type": an upgrade altered a column the read returns):
	# db.c sends that message's read plainly, deallocates the stale
	# statement and prepares it afresh on the next use, instead of failing
	# every message of the session from then on.  The trigger (disarmed)
	# still notes what the session holds at each commit.
	$node->safe_psql($db, 'ALTER TABLE pepsi.peer_key ALTER COLUMN fingerprint TYPE varchar');
	($id, $row) = encrypt_one('rita@example.net');
	is_deeply([ @{ $row->{state}{encrypt} }{qw(result signed_by)}, $row->{state}{encrypt}{keys} ],
		[ 'encrypted', $alice, [$rita] ], 'a stale plan (0A000): the read goes plainly, encrypted and signed all the same');
	unlike($held->($id), qr/(^| )pepsi_keystore_peer( |$)/, 'and the stale statement is deallocated');
	($id, $row) = encrypt_one('rita@example.net');
	is($row->{state}{encrypt}{result}, 'encrypted', 'the next message is encrypted');
	like($held->($id), qr/(^| )pepsi_keystore_peer( |$)/, 'its read prepared again, with the new result type');
	$node->safe_psql($db, 'ALTER TABLE pepsi.peer_key ALTER COLUMN fingerprint TYPE text');
	$node->safe_psql($db, 'DROP TRIGGER keystore_session ON pepsi.workqueue');
}

# Bob's key replaced in the database while the worker holds the old one.
my ($bob2, $bob2_sub) = gpg_key('bob@example.net', 'ed25519', 'cv25519');
$node->safe_psql($db,
	"UPDATE pepsi.peer_key SET fingerprint = '$bob2', key_data = '\\x" . key_hex($bob2)
	  . "', fetched_at = now() WHERE address = 'bob\@example.net'",
	extra_params => [ '-U', 'admin' ]);
{
	my ($id, $row) = encrypt_one('bob@example.net');
	is_deeply($row->{state}{encrypt}{keys}, [$bob2], 'a key replaced in the database: the next message uses the new one');
	my ($ok, $plain, $status) = gpg_decrypt(raw_message($node, $id));
	ok($ok, 'gpg decrypts it') or diag($status);
	like($status, qr/^\[GNUPG:\] ENC_TO \Q$bob2_sub\E /m, 'encrypted to the new key\'s subkey');
	unlike($status, qr/^\[GNUPG:\] ENC_TO \Q$bob_sub\E /m, 'not to the old one');
}

# The same key changed in place (its row's bytes now carry its revocation).
{
	my $cert = slurp_file("$gnupg/openpgp-revocs.d/$bob2.rev");
	$cert =~ s/^:-----BEGIN/-----BEGIN/m;
	gpg('--import', write_file('bob2.rev', $cert));
	$node->safe_psql($db,
		"UPDATE pepsi.peer_key SET key_data = '\\x" . key_hex($bob2) . "' WHERE fingerprint = '$bob2'",
		extra_params => [ '-U', 'admin' ]);
	my ($id, $row) = encrypt_one('bob@example.net');
	is($row->{stage} . ' ' . $row->{state}{encrypt}{result}, 'bounced refused',
		'the same key revoked in its row: the worker sees it and refuses');
	like($row->{state}{bounce}{diagnostic}, qr/key \Q$bob2\E is revoked/, 'saying the key is revoked');
}

# A key row that is not a key: that message is refused with the reason,
# never sent in clear, and the worker goes on.
$node->safe_psql($db,
	"UPDATE pepsi.peer_key SET key_data = overlay(key_data placing '\\xdeadbeefdeadbeef'::bytea from 3 for 8)"
	  . " WHERE address = 'rita\@example.net'",
	extra_params => [ '-U', 'admin' ]);
{
	my ($id, $row) = encrypt_one('rita@example.net');
	is($row->{stage} . ' ' . $row->{state}{encrypt}{result}, 'bounced refused', 'a corrupt key row: refused');
	like($row->{state}{bounce}{diagnostic}, qr/key \Q$rita\E: the stored key does not read/,
		'the reason names the key that does not read');
	unlike($row->{state}{encrypt}{reason} // '', qr/^$/, 'state.encrypt says why');
}
{
	my ($id, $row) = encrypt_one('rita@example.net');
	is($row->{stage}, 'bounced', 'and the next message to it too: nothing cached from the bad row');
}
ok($io->{harness}->finish, 'the worker exits 0 when its input ends') or diag($io->{err});

done_testing();
