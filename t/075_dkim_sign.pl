# pepsi-stage-dkim-sign: every signature it makes is checked by three
# independent verifiers from Debian (python3-dkim, Mail::DKIM and
# opendkim-testmsg, i.e. libopendkim) with the public keys that pepsi-keys
# printed, served by a private DNS server; on the bytes a relay transmits
# (and on what a real SMTP peer received).  RSA and Ed25519 (dual signing),
# relaxed and simple, 8-bit and SMTPUTF8 messages, folded and duplicate
# fields, a DSN from pepsi-stage-bounce, and a body shared by three split
# rows (all signed, still one body row).  Then what cannot be signed:
# no From:, no key, an over-long line (failed under REQUIRE_SIGNATURE, else
# sent on with the reason), and a key file that is missing, readable by
# others or of the wrong type (paused with the reason, never sent unsigned);
# and a key file replaced under a running worker (signed with the new key).

use strict;
use warnings FATAL => 'all';


use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest qw(start_peer stop_process peer_messages);
use PepsiStage;
use PepsiTest;
use SignTest;
use TestDNS;

my $node = stage_node('dkim_sign');

# A message from a client of TRUSTED_NETWORKS, as pepsi-ingress writes
# state.origin.trust: the signer signs only mail from inside the trust
# boundary (t/123_dkim_sign_origin.pl tests the others).
sub add_trusted
{
	my ($node, $stage, %m) = @_;

	$m{state} //= {};
	$m{state}{origin}{trust} //= 'trusted-network';
	return add_message($node, $stage, %m);
}
my $dir = PostgreSQL::Test::Utils::tempdir();
my %zone;

sub key
{
	my ($name, $domain, $selector, $algorithm, $bits) = @_;
	my ($path, $record) = make_key($dir, $name, $algorithm, $bits);

	$zone{"$selector._domainkey.$domain"} = $record;
	return "[dkim-key-$name]\nDOMAIN = $domain\nSELECTOR = $selector\n"
	  . "ALGORITHM = $algorithm\nKEY_FILE = $path\n\n";
}

my $keys = key('org-rsa', 'example.org', 'rsa2026', 'rsa-sha256')
  . key('org-ed', 'example.org', 'ed2026', 'ed25519-sha256')
  . key('simple-rsa', 'simple.example', 'big', 'rsa-sha256', 3072)
  . key('ed-only', 'ed.example', 'e1', 'ed25519-sha256')
  . key('dsn', 'mx.example.org', 'dsn', 'rsa-sha256');

like($zone{'rsa2026._domainkey.example.org'}, qr/^v=DKIM1; k=rsa; p=[A-Za-z0-9+\/]+=*$/,
	'pepsi-keys prints the RSA record to publish');
like($zone{'ed2026._domainkey.example.org'}, qr/^v=DKIM1; k=ed25519; p=[A-Za-z0-9+\/]{43}=$/,
	'pepsi-keys prints the Ed25519 record (the bare 32-octet key, RFC 8463)');
is((stat("$dir/org-rsa.pem"))[2] & 07777, 0600, 'pepsi-keys writes the private key mode 0600');

# A key size that is not a whole number is refused, not read as 0 or 12.
for my $bits ('2048x', 'x', '')
{
	my ($out, $err);
	IPC::Run::run([ ($ENV{PEPSI_BIN} // 'build/bin') . '/pepsi-keys', 'generate', '-a', 'rsa-sha256', '-b', $bits,
		'-o', "$dir/bad-bits.pem" ], '<', \undef, '>', \$out, '2>', \$err);
	is($? >> 8, 64, "pepsi-keys generate -b '$bits': exit status 64");
	like($err, qr/-b \Q$bits\E: RSA keys are 2048 to \d+ bits/, "pepsi-keys generate -b '$bits': the reason");
}
ok(!-e "$dir/bad-bits.pem", 'pepsi-keys generate with a bad -b writes no key file');

# Keys that must not be used: readable by others, of the wrong type, gone.
my ($open_key) = make_key($dir, 'open', 'rsa-sha256');
chmod 0644, $open_key;
my ($ed_key) = make_key($dir, 'typed', 'ed25519-sha256');
$keys .= "[dkim-key-open]\nDOMAIN = open.example\nSELECTOR = s\nKEY_FILE = $open_key\n\n"
  . "[dkim-key-typed]\nDOMAIN = typed.example\nSELECTOR = s\nALGORITHM = rsa-sha256\nKEY_FILE = $ed_key\n\n"
  . "[dkim-key-gone]\nDOMAIN = gone.example\nSELECTOR = s\nKEY_FILE = $dir/no-such-key.pem\n\n";

my $peer = start_peer();
my $conf = stage_config($node, 'sign.conf', <<"INI");
[pepsi]
HOSTNAME = mx.example.org

$keys
[stage-sign]
PROGRAM = pepsi-stage-dkim-sign
NEXT_STAGE = signed

[stage-sign-simple]
PROGRAM = pepsi-stage-dkim-sign
CANONICALIZATION = simple/simple
NEXT_STAGE = signed

[stage-sign-account]
PROGRAM = pepsi-stage-dkim-sign
SIGNING_DOMAIN = account
NEXT_STAGE = signed

[stage-sign-required]
PROGRAM = pepsi-stage-dkim-sign
REQUIRE_SIGNATURE = yes
KEY_RETRY = 10m
NEXT_STAGE = signed

[stage-bounce]
PROGRAM = pepsi-stage-bounce
NEXT_STAGE = sign

[stage-route]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = local.test
LOCAL_STAGE = signed
REMOTE_STAGE = sign

[stage-signed]
PROGRAM = pepsi-stage-relay-to-smarthost
SMARTHOST = 127.0.0.1:$peer->{port}
TLS = none
TIMEOUT = 10s
CONNECT_TIMEOUT = 5s
INI

sub sign
{
	my ($stage, @ids) = @_;
	my $r = run_worker(worker_cmd('pepsi-stage-dkim-sign', $conf), join('', map { "$_\n" } @ids));

	is_deeply($r->{status}, [ ('0') x @ids ], "$stage: the worker signs " . scalar(@ids) . ' message(s)')
	  or diag($r->{stderr});
	return $r;
}

# Every signature passes with every verifier that knows its algorithm.
# Debian 12's Mail::DKIM (1.20230212) predates ed25519-sha256: it must say
# so rather than pass or fail it.
sub verified
{
	my ($name, $message, $algorithms) = @_;
	my $v = verify_message(\%zone, $message);

	is_deeply($v->{'python-dkim'}, [ ('pass') x @$algorithms ], "$name: python3-dkim passes every signature")
	  or diag($v->{output});
	for my $i (0 .. $#$algorithms)
	{
		if ($algorithms->[$i] eq 'ed25519')
		{
			like($v->{'mail-dkim'}[$i] // '', qr/^(pass|invalid .*unsupported algorithm ed25519)/,
				"$name: Mail::DKIM on signature $i (ed25519): pass, or not supported by this version");
		}
		else
		{
			is($v->{'mail-dkim'}[$i], 'pass', "$name: Mail::DKIM passes signature $i ($algorithms->[$i])")
			  or diag($v->{output});
		}
	}
	like($v->{opendkim} // '', qr/^pass/, "$name: opendkim-testmsg (libopendkim) passes")
	  or diag($v->{output});
	return $v;
}

sub signature_count
{
	my ($message) = @_;
	my ($headers) = split /\r\n\r\n/, $message, 2;

	return scalar(() = $headers =~ /^DKIM-Signature:/mg);
}

#
# Dual signing, relaxed/relaxed: folded and duplicate fields, an 8-bit body.
#
my ($r, $bad);
my $folded = add_trusted($node, 'sign',
	headers => "Received: from a.example by b.example; Mon, 1 Dec 2026 10:00:00 +0000\r\n"
	  . "Received: from c.example\r\n\tby d.example; Mon, 1 Dec 2026 10:00:01 +0000\r\n"
	  . "From: \"Alice  Example\" <alice\@Example.ORG>\r\n"
	  . "To: bob\@remote.test,\r\n    carol\@remote.test\r\n"
	  . "Subject:   folded\r\n  over\t two lines  \r\n"
	  . "Date: Mon, 1 Dec 2026 10:00:02 +0000\r\n"
	  . "Message-ID: <folded\@example.org>\r\n"
	  . "X-Note: one\r\nX-Note: two\r\n"
	  . "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=iso-8859-1\r\n"
	  . "Content-Transfer-Encoding: 8bit\r\n",
	body => "Caf\xe9 cr\xe8me  \t \r\n\r\ntrailing spaces   \r\n\r\n\r\n");
sign('relaxed', $folded);
my $row = row_json($node, $folded);
is_deeply([ @$row{qw(stage status)} ], [ 'signed', 'pending' ], 'relaxed: the row goes on to NEXT_STAGE');
my $signed = row_message($node, $folded);
is(signature_count($signed), 2, 'relaxed: a domain with an RSA and an Ed25519 key gets both signatures');
like($signed, qr/^DKIM-Signature: v=1; a=rsa-sha256; c=relaxed\/relaxed; d=example\.org;\s+s=rsa2026;/,
	'relaxed: d= is the From domain (lower case), s= the key\'s selector');
like($signed, qr/h=from:from:subject:subject:date:date:to:to:message-id:/,
	'relaxed: From, To, Subject and Date are oversigned');
verified('relaxed', $signed, [ 'rsa', 'ed25519' ]);

# The delivered bytes: relayed to a real SMTP peer, checked again there.
$node->safe_psql('postgres', "UPDATE pepsi.workqueue SET status = 'running' WHERE id = $folded");
my $relay = run_worker(worker_cmd('pepsi-stage-relay-to-smarthost', $conf), "$folded\n");
# (status 0, with the delivery's status= reported to the dispatcher)
like(join("\n", @{ $relay->{status} }), qr/^0 \{"delivery":\{"stage":"\S+","status":"sent"(?:,"delay":[0-9.]+)?\}\}$/,
	'relaxed: relayed to the SMTP peer') or diag($relay->{stderr});
my ($delivered) = peer_messages($peer);
ok($delivered, 'relaxed: the peer received the message');
verified('relaxed, as delivered', $delivered->{data}, [ 'rsa', 'ed25519' ]) if $delivered;

#
# simple/simple, RSA-3072, an SMTPUTF8 message (UTF-8 in the address and
# the fields).
#
my $utf8 = add_trusted($node, 'sign-simple', from => "j\xc3\xb6s\xc3\xa9\@simple.example",
	headers => "From: J\xc3\xb6s\xc3\xa9 <j\xc3\xb6s\xc3\xa9\@simple.example>\r\n"
	  . "To: <\xe7\x94\xa8\xe6\x88\xb7\@remote.test>\r\n"
	  . "Subject: \xe2\x98\x95 caf\xc3\xa9\r\n"
	  . "Date: Mon, 1 Dec 2026 10:00:03 +0000\r\n"
	  . "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n",
	body => "\xe2\x98\x95 Kaffee?\r\n");
sign('simple', $utf8);
$signed = row_message($node, $utf8);
like($signed, qr/^DKIM-Signature: v=1; a=rsa-sha256; c=simple\/simple; d=simple\.example; s=big;/,
	'simple: c=simple/simple with the 3072-bit key');
verified('simple, SMTPUTF8', $signed, ['rsa']);

# opendkim-testmsg refuses a message without Date: (RFC 5322 requires it).
my $date = "Date: Mon, 1 Dec 2026 10:00:04 +0000\r\n";

#
# Ed25519 alone.
#
my $ed = add_trusted($node, 'sign',
	headers => "From: <x\@ed.example>\r\nTo: <y\@remote.test>\r\nSubject: ed\r\n$date", body => "ed25519\r\n");
sign('ed25519', $ed);
$signed = row_message($node, $ed);
is(signature_count($signed), 1, 'ed25519: one signature');
like($signed, qr/a=ed25519-sha256;.*d=ed\.example;\s+s=e1;/s, 'ed25519: a=ed25519-sha256');
verified('ed25519', $signed, ['ed25519']);

#
# SIGNING_DOMAIN = account: d= is the authenticated account's domain, even
# for a From: of another domain; without an account, not signed (never
# with the From: domain).
#
my $account = add_trusted($node, 'sign-account', state => { origin => { trust => 'authenticated', auth => 'x@ed.example' } },
	headers => "From: <someone\@example.org>\r\nTo: <y\@remote.test>\r\nSubject: acct\r\n$date",
	body => "by account\r\n");
my $no_account = add_trusted($node, 'sign-account',
	headers => "From: <someone\@example.org>\r\nTo: <y\@remote.test>\r\nSubject: acct\r\n$date",
	body => "no account\r\n");
sign('account', $account, $no_account);
$signed = row_message($node, $account);
like($signed, qr/^DKIM-Signature: v=1; a=ed25519-sha256; c=relaxed\/relaxed; d=ed\.example;/,
	'account: d= is the authenticated account\'s domain');
verified('account', $signed, ['ed25519']);
unlike(row_message($node, $no_account), qr/^DKIM-Signature:/m,
	'account: without an authenticated account, not signed with the From: domain');
is(row_json($node, $no_account)->{state}{dkim_sign}{error},
	'SIGNING_DOMAIN = account and the message has no authenticated account', 'account: the reason names the option');

#
# A body shared by three split rows: each row signed, still one body row.
#
my $shared = add_trusted($node, 'sign', rcpt => [ map { "r$_\@remote.test" } 1 .. 3 ],
	headers => "From: <team\@example.org>\r\nTo: <all\@remote.test>\r\nSubject: three\r\n$date",
	body => "one body for three rows\r\n");
$node->safe_psql('postgres', "SELECT pepsi.workqueue_split_one_per_row($shared, 'sign')");
my @rows = split /\n/, $node->safe_psql('postgres',
	"SELECT id FROM pepsi.workqueue WHERE body_id = (SELECT body_id FROM pepsi.workqueue WHERE id = $shared) ORDER BY id");
is(scalar @rows, 3, 'split: three rows share the body');
$node->safe_psql('postgres', "UPDATE pepsi.workqueue SET status = 'running' WHERE id IN (" . join(',', @rows) . ')');
sign('split', @rows);
is($node->safe_psql('postgres',
	"SELECT count(DISTINCT body_id) || '/' || count(*) FROM pepsi.workqueue WHERE id IN (" . join(',', @rows) . ')'),
	'1/3', 'split: the three signed rows still share one body row');
for my $id (@rows)
{
	$signed = row_message($node, $id);
	is(signature_count($signed), 2, "split: row $id signed");
	verified("split row $id", $signed, [ 'rsa', 'ed25519' ]);
}

#
# A DSN: pepsi-stage-bounce builds it, the signer signs it for HOSTNAME.
#
my $bounced = add_message($node, 'bounce', from => 'alice@example.org', rcpt => ['gone@remote.test'],
	headers => "From: <alice\@example.org>\r\nTo: <gone\@remote.test>\r\nSubject: lost\r\n",
	body => "will bounce\r\n",
	state => { bounce => { kind => 'permanent', diagnostic => 'smtp; 550 5.1.1 no such user',
			failed_recipient => 'gone@remote.test' } });
my $b = run_worker(worker_cmd('pepsi-stage-bounce', $conf), "$bounced\n");
is_deeply($b->{status}, ['0'], 'dsn: pepsi-stage-bounce made the DSN') or diag($b->{stderr});
$node->safe_psql('postgres', "UPDATE pepsi.workqueue SET status = 'running' WHERE id = $bounced");
sign('dsn', $bounced);
$signed = row_message($node, $bounced);
like($signed, qr/^DKIM-Signature: v=1; a=rsa-sha256; c=relaxed\/relaxed; d=mx\.example\.org;\s+s=dsn;/,
	'dsn: signed for the reporting host\'s domain');
like($signed, qr/multipart\/report/, 'dsn: it is the DSN that was signed');
verified('dsn', $signed, ['rsa']);

#
# A batch: the rows waiting for a signing worker are loaded with one
# statement and committed with one (signed, they go on to the relay).
#
my @batch = map {
	add_trusted($node, 'sign',
		headers => "From: <b$_\@ed.example>\r\nTo: <y\@remote.test>\r\nSubject: batch $_\r\n$date",
		body => "batch $_\r\n")
} 1 .. 3;
reset_statements($node);
sign('batch', @batch);
is(statement_calls($node, '%w.headers, b.body FROM pepsi.workqueue w JOIN%'), '1/3',
	'batch: the three loaded with one statement');
is((split m{/}, statement_calls($node, '%pepsi.workqueue_commit(%'))[0], 3,
	'batch: each signed row commits its new header block');
is(scalar(grep { signature_count(row_message($node, $_)) == 1 } @batch), 3, 'batch: all three signed');

#
# In the multi-call binary, fused after route (body-free) with the relay
# after it: route's pass loads the rows' headers and bodies late, signs
# and relays them, and the delivered rows are committed together (a
# finished row keeps none of its new header block), each row claimed,
# loaded and committed once.
#
my $delivered_before = scalar(peer_messages($peer));
my @routed = map {
	add_trusted($node, 'route',
		headers => "From: <r$_\@example.org>\r\nTo: <y\@remote.test>\r\nSubject: routed $_\r\n$date",
		body => "routed $_\r\n")
} 1 .. 3;
reset_statements($node);
$r = run_worker(unified_cmd('pepsi-stage-route', $conf), join('', map { "$_\n" } @routed));
is($r->{exit}, 0, 'fused: the route worker ends with its input') or diag($r->{stderr});
is_deeply([ map { my (undef, $report) = decode_status($_); join(' ', map { $_->{stage} } @{ $report->{fused} // [] }) }
		@{ $r->{status} } ], [ ('sign signed') x 3 ], 'fused: signed and relayed in route\'s pass')
  or diag(join("\n", @{ $r->{status} }));
my @routed_out = (peer_messages($peer))[ $delivered_before .. $delivered_before + 2 ];
is(scalar(grep { $_ && signature_count($_->{data}) == 2 } @routed_out), 3,
	'fused: the peer received the three, each with both signatures');
verified('fused, as delivered', $routed_out[0]{data}, [ 'rsa', 'ed25519' ]) if $routed_out[0];
is(statement_calls($node, 'SELECT w.id::text, w.headers, b.body FROM%'), '1/3',
	'fused: the headers and bodies loaded late, with one statement');
is((split m{/}, statement_calls($node, '%pepsi.workqueue_commit_many(%'))[0], 1,
	'fused: the three delivered rows committed with one statement');
is(statement_calls($node, '%pepsi.workqueue_commit(%'), '0/0', 'fused: and none on its own');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pepsi.workqueue WHERE id IN (' . join(',', @routed) . ')'),
	0, 'fused: the delivered rows are done');

#
# What cannot be signed.
#
sub outcome
{
	my ($stage, $headers) = @_;
	my $id = add_trusted($node, $stage, headers => $headers, body => "x\r\n");
	my $before = row_message($node, $id);
	my $r = run_worker(worker_cmd('pepsi-stage-dkim-sign', $conf), "$id\n");
	my $after = row_json($node, $id);

	is_deeply($r->{status}, ['0'], "$stage: the worker answers for the message") or diag($r->{stderr});
	return ($after, row_message($node, $id) eq $before, $r->{stderr});
}

my ($o, $unchanged, $log) = outcome('sign-required', "To: <a\@remote.test>\r\nSubject: no from\r\n");
is_deeply([ @$o{qw(stage status)} ], [ 'sign-required', 'failed' ], 'no From:, signature required: failed');
is($o->{state}{dkim_sign}{error}, 'the message has no From: field', 'no From:: the reason is in state.dkim_sign');
ok($unchanged, 'no From:: the message is left as it was');
like($log, qr/no From: field/, 'no From:: and logged');

($o, $unchanged) = outcome('sign', "To: <a\@remote.test>\r\nSubject: no from\r\n");
is_deeply([ @$o{qw(stage status)} ], [ 'signed', 'pending' ], 'no From:, signature not required: sent on');
is_deeply($o->{state}{dkim_sign}, { error => 'the message has no From: field', signed => JSON::PP::false },
	'no From:, not required: unsigned, and state.dkim_sign says why');
ok($unchanged, 'no From:, not required: no signature added');

($o) = outcome('sign-required', "From: <a\@unknown.example>\r\nSubject: no key\r\n");
is_deeply([ $o->{status}, $o->{state}{dkim_sign}{error} ], [ 'failed', 'no signing key for the domain unknown.example' ],
	'no key for the domain, signature required: failed with the reason');

($o) = outcome('sign-required', "From: <a\@example.org>\r\nSubject: " . ('x' x 1200) . "\r\n");
is($o->{status}, 'failed', 'an over-long header line, signature required: failed');
like($o->{state}{dkim_sign}{error}, qr/^header line 2 is 1209 octets long, over the limit of 998$/,
	'an over-long header line: the reason names the line and the limit');

for my $case ([ 'open.example', qr/key file \S+open\.pem is accessible to group or others \(mode 0644\)/ ],
	[ 'typed.example', qr/holds an Ed25519 key, but the selector's algorithm is rsa-sha256/ ],
	[ 'gone.example', qr/no-such-key\.pem: No such file or directory/ ])
{
	my ($domain, $reason) = @$case;

	($o, $unchanged) = outcome('sign', "From: <a\@$domain>\r\nSubject: bad key\r\n");
	is($o->{status}, 'paused', "$domain: a key that cannot be loaded pauses the message (even when not required)");
	like($o->{state}{dkim_sign}{error}, $reason, "$domain: with the reason in state.dkim_sign");
	ok($o->{due} > 200, "$domain: until KEY_RETRY, for the operator to mend the key");
	ok($unchanged, "$domain: unsigned and unchanged, not sent");
}

#
# A configuration error stops the worker at start.
#
$bad = stage_config($node, 'bad.conf', "$keys\n[stage-sign]\nPROGRAM = pepsi-stage-dkim-sign\n"
	  . "NEXT_STAGE = signed\nKEYS = org-rsa nonesuch\n");
$r = run_worker(worker_cmd('pepsi-stage-dkim-sign', $bad), '');
isnt($r->{exit}, 0, 'KEYS naming a missing section: the worker refuses to start');
like($r->{stderr}, qr/KEYS names "nonesuch", which has no \[dkim-key-nonesuch\] section/, 'and says so');
$bad = stage_config($node, 'bad2.conf', "[stage-sign]\nPROGRAM = pepsi-stage-dkim-sign\n"
	  . "CANONICALIZATION = loose/simple\n");
$r = run_worker(worker_cmd('pepsi-stage-dkim-sign', $bad), '');
like($r->{stderr}, qr/CANONICALIZATION "loose\/simple" is not header\/body of simple or relaxed/,
	'a bad CANONICALIZATION is refused at start');

#
# pepsi-keys check: every key's published record, through the resolver.
#
{
	my $dns = TestDNS->new($dir);
	my %published = %zone;

	# One record of another key, one missing.
	$published{'e1._domainkey.ed.example'} = $zone{'ed2026._domainkey.example.org'};
	delete $published{'dsn._domainkey.mx.example.org'};
	$dns->zone(join('', map { TestDNS::txt("$_.", $published{$_}) } sort keys %published));
	my $check = stage_config($node, 'check.conf', "[pepsi]\nDNS_FORWARDER = " . $dns->forwarder . "\n\n"
		  . key_sections_only($keys));
	my ($out, $err) = ('', '');
	IPC::Run::run([ ($ENV{PEPSI_BIN} // 'build/bin') . '/pepsi-keys', 'check', '-c', $check ],
		'>', \$out, '2>', \$err);
	is($? >> 8, 65, 'pepsi-keys check: exit status 65 when a key is not published as it should be');
	like($out, qr/^\[dkim-key-org-rsa\] rsa2026\._domainkey\.example\.org: ok$/m, 'pepsi-keys check: a published key is ok');
	like($out, qr/^\[dkim-key-org-ed\] ed2026\._domainkey\.example\.org: ok$/m, 'pepsi-keys check: the Ed25519 one too');
	like($out, qr/^\[dkim-key-ed-only\] e1\._domainkey\.ed\.example: the published key is not the private key's$/m,
		'pepsi-keys check: another key\'s record is named as such');
	like($out, qr/^\[dkim-key-dsn\] dsn\._domainkey\.mx\.example\.org: no such name$/m,
		'pepsi-keys check: a missing record');
	like($out, qr/^\[dkim-key-open\] .*cannot be loaded: .*accessible to group or others/m,
		'pepsi-keys check: a private key readable by others is refused');
	$dns->stop;
}

#
# A rotated key: the operator renames a new key file over the old one and
# publishes its record.  A worker that keeps running looks at a loaded
# key's file at most once a second (common/auth/keys.c), so a message it
# signs a second or so after the rename carries the new key's signature.
#
{
	my $worker = start_worker(worker_cmd('pepsi-stage-dkim-sign', $conf));
	my $message = sub {
		add_trusted($node, 'sign',
			headers => "From: <x\@ed.example>\r\nTo: <y\@remote.test>\r\nSubject: rotation $_[0]\r\n$date",
			body => "rotation\r\n");
	};
	my $before = $message->('before');
	is_deeply([ send_ids($worker, "$before\n", 1) ], ['0'], 'rotation: the worker signs with the old key');
	verified('rotation, old key', row_message($node, $before), ['ed25519']);

	my ($new_path, $new_record) = make_key($dir, 'ed-only-next', 'ed25519-sha256');
	my %old_zone = %zone;
	rename($new_path, "$dir/ed-only.pem") or die "cannot rename $new_path: $!";
	$zone{'e1._domainkey.ed.example'} = $new_record;
	isnt($new_record, $old_zone{'e1._domainkey.ed.example'}, 'rotation: the new key is another key');

	# A message at a time until one carries the new key's signature: the
	# worker's next look at the file, a second at most after the last.
	my ($after, $signed_after, @answers);
	my $tries = 0;
	ok( poll_until(
			sub {
				$after = $message->('after ' . ++$tries);
				push @answers, send_ids($worker, "$after\n", 1);
				$signed_after = row_message($node, $after);
				return (verify_message(\%zone, $signed_after)->{'python-dkim'}[0] // '') eq 'pass';
			},
			10),
		'rotation: the same worker signs with the new key within a second or so of the rename');
	is_deeply(\@answers, [ ('0') x $tries ], 'rotation: the same worker signs every message after the rename');
	verified('rotation, new key', $signed_after, ['ed25519']);
	is_deeply(verify_message(\%old_zone, $signed_after)->{'python-dkim'}, ['fail'],
		'rotation: the old record no longer verifies it (the new key signed)');
	$worker->{in} = '';
	$worker->{harness}->finish;
}

stop_process($peer);
done_testing();

# The [dkim-key-*] sections of a configuration text.
sub key_sections_only
{
	my ($text) = @_;

	return join('', grep { /^\[dkim-key-/ } split /(?=^\[)/m, $text);
}
