# pepsi-stage-arc-seal against python3-dkim's ARC implementation: a fresh
# message sealed (i=1, cv=none), a chain started by dkim.arc_sign
# continued (i=2, cv=pass, after the stage validated it itself with keys
# from DNS), and dkim.arc_verify passing both and failing a tampered copy.
# A chain broken in transit and a malformed ARC set are sealed cv=fail
# with the reason in state.arc_seal; the ARC-Authentication-Results carry
# state.auth under state.origin.authserv_id; a key that cannot be loaded
# pauses the message.

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiStage;
use PepsiTest;
use SignTest;
use TestDNS;

my $node = stage_node('arc_seal');
my $dir = PostgreSQL::Test::Utils::tempdir();
my $here = dirname(abs_path(__FILE__));
my %zone;

my ($ours, $ours_record) = make_key($dir, 'ours', 'rsa-sha256');
my ($hop1, $hop1_record) = make_key($dir, 'hop1', 'rsa-sha256');
$zone{'arc1._domainkey.arc.example.org'} = $ours_record;
$zone{'h1._domainkey.hop1.example'} = $hop1_record;
my $dns = TestDNS->new($dir);
$dns->zone(join('', map { TestDNS::txt("$_.", $zone{$_}) } sort keys %zone));

my $conf = stage_config($node, 'arc.conf', <<"INI");
[pepsi]
HOSTNAME = mx.arc.example.org
DNS_FORWARDER = @{[ $dns->forwarder ]}

[dkim-key-arc]
DOMAIN = arc.example.org
SELECTOR = arc1
KEY_FILE = $ours

[dkim-key-gone]
DOMAIN = arc.example.org
SELECTOR = gone
KEY_FILE = $dir/no-such-key.pem

[stage-seal]
PROGRAM = pepsi-stage-arc-seal
KEY = arc
NEXT_STAGE = sealed

[stage-seal-nokey]
PROGRAM = pepsi-stage-arc-seal
KEY = gone
NEXT_STAGE = sealed
INI

my %auth = (
	spf => { result => 'pass', 'smtp.mailfrom' => 'alice@hop0.example' },
	dkim => [ { result => 'pass', 'header.d' => 'hop0.example', 'header.s' => 'sel' } ],
	dmarc => { result => 'pass', 'header.from' => 'hop0.example' },
);
my %origin = (authserv_id => 'mx.arc.example.org', client_ip => '192.0.2.7');

my $message_headers = "From: Alice <alice\@hop0.example>\r\nTo: <list\@arc.example.org>\r\n"
  . "Subject: forwarded\r\nDate: Mon, 1 Dec 2026 10:00:00 +0000\r\nMessage-ID: <m1\@hop0.example>\r\n";
my $message_body = "a message that travels\r\n";

sub split_message
{
	my ($raw) = @_;
	my ($h, $b) = split /\r\n\r\n/, $raw, 2;

	return ("$h\r\n", $b);
}

sub seal
{
	my ($stage, @ids) = @_;
	my $r = run_worker(worker_cmd('pepsi-stage-arc-seal', $conf), join('', map { "$_\n" } @ids));

	is_deeply($r->{status}, [ ('0') x @ids ], "$stage: the worker answers") or diag($r->{stderr});
	return $r;
}

#
# A fresh message: i=1, cv=none.
#
my $fresh = add_message($node, 'seal', headers => $message_headers, body => $message_body,
	state => { auth => \%auth, origin => \%origin });
seal('fresh', $fresh);
my $sealed = row_message($node, $fresh);
like($sealed, qr/^ARC-Seal: i=1; a=rsa-sha256; t=\d+; cv=none;\r\n\td=arc\.example\.org; s=arc1;/,
	'fresh: ARC-Seal i=1, cv=none, on top');
like($sealed, qr/^ARC-Message-Signature: i=1; a=rsa-sha256; c=relaxed\/relaxed;\s+d=arc\.example\.org;/m,
	'fresh: ARC-Message-Signature i=1');
like($sealed, qr/^ARC-Authentication-Results: i=1; mx\.arc\.example\.org;\r\n\tspf=pass smtp\.mailfrom=alice\@hop0\.example;\r\n\tdkim=pass header\.d=hop0\.example header\.s=sel;\r\n\tdmarc=pass header\.from=hop0\.example\r\n/m,
	'fresh: the AAR carries state.auth under state.origin.authserv_id');
my $v = verify_message(\%zone, $sealed);
like($v->{arc} // '', qr/^pass/, 'fresh: python3-dkim arc_verify passes') or diag($v->{output});

(my $tampered = $sealed) =~ s/a message that travels/a message that was changed/;
$v = verify_message(\%zone, $tampered);
like($v->{arc} // '', qr/^fail/, 'fresh, tampered body: arc_verify fails') or diag($v->{output});

#
# A chain made by python3-dkim's arc_sign, continued.
#
sub arc_signed
{
	my ($headers, $body) = @_;
	my $file = "$dir/in." . int(rand(1e9));
	my ($out, $err) = ('', '');

	open my $fh, '>', $file or die $!;
	binmode $fh;
	print $fh "Authentication-Results: hop1.example; spf=pass smtp.mailfrom=hop0.example\r\n$headers\r\n$body";
	close $fh;
	IPC::Run::run([ "$here/bin/arc-sign", $file, $hop1, 'hop1.example', 'h1', 'hop1.example' ],
		'>', \$out, '2>', \$err) or die "arc-sign: $err";
	return $out;
}

my $hop1_message = arc_signed($message_headers, $message_body);
like($hop1_message, qr/^ARC-Seal: i=1;/m, 'python3-dkim\'s arc_sign started a chain');
$v = verify_message(\%zone, $hop1_message);
like($v->{arc} // '', qr/^pass/, 'and arc_verify passes it as it arrives') or diag($v->{output});

my ($h, $b) = split_message($hop1_message);
my $continued = add_message($node, 'seal', headers => $h, body => $b,
	state => { auth => \%auth, origin => \%origin });
seal('continued', $continued);
$sealed = row_message($node, $continued);
like($sealed, qr/^ARC-Seal: i=2; a=rsa-sha256; t=\d+; cv=pass;/, 'continued: i=2 and cv=pass (validated by the stage, keys from DNS)');
like($sealed, qr/^ARC-Authentication-Results: i=2; mx\.arc\.example\.org;.*\r\n\tarc=pass\r\n/ms,
	'continued: the AAR says arc=pass');
$v = verify_message(\%zone, $sealed);
like($v->{arc} // '', qr/^pass/, 'continued: arc_verify passes the two-instance chain') or diag($v->{output});
($tampered = $sealed) =~ s/^(Subject: )forwarded/$1altered/m;
$v = verify_message(\%zone, $tampered);
like($v->{arc} // '', qr/^fail/, 'continued, tampered Subject: arc_verify fails') or diag($v->{output});
is(row_json($node, $continued)->{state}{arc_seal}, undef, 'continued: no failure recorded');

#
# A chain broken on the way (the body changed after hop1 sealed it).
#
(my $broken_body = $b) =~ s/travels/travelled through a mailing list footer/;
my $broken = add_message($node, 'seal', headers => $h, body => $broken_body,
	state => { auth => \%auth, origin => \%origin });
seal('broken', $broken);
$sealed = row_message($node, $broken);
like($sealed, qr/^ARC-Seal: i=2; a=rsa-sha256; t=\d+; cv=fail;/, 'broken: sealed i=2 with cv=fail');
my $state = row_json($node, $broken)->{state}{arc_seal};
is($state->{cv}, 'fail', 'broken: state.arc_seal.cv');
like($state->{reason}, qr/ARC-Message-Signature i=1: the body hash does not match/, 'broken: and the reason');
$v = verify_message(\%zone, $sealed);
like($v->{arc} // '', qr/^(fail|none)/, 'broken: arc_verify does not pass it') or diag($v->{output});

#
# Ingress's verdict in state.auth.arc is used as it is.
#
my $told = add_message($node, 'seal', headers => $h, body => $broken_body,
	state => { auth => { %auth, arc => { result => 'pass' } }, origin => \%origin });
seal('state.auth.arc', $told);
like(row_message($node, $told), qr/^ARC-Seal: i=2; [^\r]*cv=pass;/, 'state.auth.arc=pass: taken as ingress found it');

#
# A malformed ARC set: an ARC-Seal without a usable i=.
#
my $malformed = add_message($node, 'seal',
	headers => "ARC-Seal: i=zero; a=rsa-sha256; cv=none; d=x.example; s=s; b=AAAA\r\n$message_headers",
	body => $message_body, state => { origin => \%origin });
seal('malformed', $malformed);
$sealed = row_message($node, $malformed);
like($sealed, qr/^ARC-Seal: i=1; [^\r]*cv=fail;/, 'malformed: sealed cv=fail');
like(row_json($node, $malformed)->{state}{arc_seal}{reason},
	qr/^malformed ARC chain: an ARC-Seal field has no valid i= \(1 to 50\)$/, 'malformed: the reason names the field');
like($sealed, qr/^ARC-Authentication-Results: i=1; mx\.arc\.example\.org;\r\n\tarc=fail\r\n/m,
	'malformed, no state.auth: the AAR says only arc=fail');

#
# A key that cannot be loaded pauses the message.
#
my $nokey = add_message($node, 'seal-nokey', headers => $message_headers, body => $message_body);
my $before = row_message($node, $nokey);
seal('no key', $nokey);
my $row = row_json($node, $nokey);
is($row->{status}, 'paused', 'no key: paused');
like($row->{state}{arc_seal}{error}, qr/no-such-key\.pem: No such file or directory/, 'no key: with the reason');
is(row_message($node, $nokey), $before, 'no key: the message is unchanged');

$dns->stop;
done_testing();
