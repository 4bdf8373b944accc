# pepsi-sendmail: the sendmail(8) interface, run as a real process against
# a real cluster.  A message given on stdin must reach the queue intact
# (plus the headers sendmail adds when missing), -t must take To/Cc/Bcc and
# strip Bcc, -f sets the envelope sender (a mailbox or <>), an
# Authentication-Results claiming our authserv-id is removed however it is
# spelled, and bad use gets sysexits codes.
use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::Bin/lib";
use IPC::Run qw(run);
use PepsiTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $bin = $ENV{PEPSI_BIN} or plan skip_all => 'PEPSI_BIN is not set';
my $sendmail = "$bin/pepsi-sendmail";

my $node = pepsi_node('sendmail', extension => 1);
my $dir = PostgreSQL::Test::Utils::tempdir();
my $conf = "$dir/pepsi.conf";
open my $fh, '>', $conf or die $!;
printf $fh "[pepsi]\nHOSTNAME = host.example.org\n[database]\nCONNINFO = host=%s port=%d dbname=postgres\n[sendmail]\nINIT_STAGE = submit\n",
  $node->host, $node->port;
close $fh;

# The message comes from a file, not a pipe: pepsi-sendmail refuses some
# arguments before it reads its input, and IPC::Run writing the rest of
# a piped input to a process that has exited died of EPIPE (exit 32).
sub sendmail
{
	my ($input, @args) = @_;
	my ($out, $err) = ('', '');
	my $file = "$dir/stdin";

	open my $in, '>', $file or die "$file: $!";
	print $in $input;
	close $in or die "$file: $!";
	run([ $sendmail, '-C', $conf, @args ], '<', $file, '>', \$out, '2>', \$err);
	return ($? >> 8, $err);
}

sub last_row
{
	return $node->safe_psql('postgres', q{
		SELECT w.stage || '|' || w.mail_from || '|' || array_to_string(w.rcpt_to, ',')
		FROM pepsi.workqueue w ORDER BY id DESC LIMIT 1});
}

sub last_message
{
	return $node->safe_psql('postgres', q{
		SELECT convert_from(w.headers || '\x0d0a'::bytea || b.body, 'UTF8')
		FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id
		ORDER BY w.id DESC LIMIT 1});
}

# A complete message with recipients on the command line reaches the queue
# intact, its line ends made CRLF.
my $message = "From: Alice <alice\@example.org>\nTo: bob\@example.net\n"
  . "Date: Mon, 30 Nov 2026 10:00:00 +0000\nMessage-ID: <m1\@example.org>\n"
  . "Subject: hello\n\nfirst line\n\n.leading dot\nlast line\n";
my ($rc, $err) = sendmail($message, '-i', '-f', 'alice@example.org', 'bob@example.net');
my $stored;
is($rc, 0, 'a message is queued') or diag($err);
is(last_row(), 'submit|alice@example.org|bob@example.net',
	'at INIT_STAGE, with the -f sender and the recipient given');
(my $crlf = $message) =~ s/\n/\r\n/g;
is(last_message(), $crlf, 'the message is stored intact (CRLF line ends)');
like($node->safe_psql('postgres', 'SELECT state FROM pepsi.workqueue ORDER BY id DESC LIMIT 1'),
	qr/"local": true/, 'state.origin says it came from a local program');
is($node->safe_psql('postgres', "SELECT state->'origin'->>'trust' FROM pepsi.workqueue ORDER BY id DESC LIMIT 1"),
	'local', 'state.origin.trust is local: local submission is inside the trust boundary (signed)');

# -t: To, Cc and Bcc, Bcc removed from the stored message.
($rc, $err) = sendmail("To: a\@example.org, \"Doe, J\" <j\@example.org>\nCc: c\@example.org\n"
	  . "Bcc: hidden\@example.org\nSubject: t\n\nbody\n", '-t', '-f', 's@example.org');
is($rc, 0, '-t queues the message') or diag($err);
is(last_row(), 'submit|s@example.org|a@example.org,j@example.org,c@example.org,hidden@example.org',
	'-t takes To, Cc and Bcc');
unlike(last_message(), qr/^Bcc:/mi, 'the Bcc header is removed');
like(last_message(), qr/^Cc: c\@example.org\r$/m, 'Cc stays');

# Only ingress says what we checked: a claim of our authserv-id (HOSTNAME
# here) goes, with a space before its colon or the id quoted too.
($rc, $err) = sendmail("From: s\@example.org\nAuthentication-Results: host.example.org; dkim=pass plain=1\n"
	  . "Authentication-Results : host.example.org; dkim=pass spaced=1\n"
	  . "Authentication-Results: \"Host.Example.Org\"; dmarc=pass quoted=1\n"
	  . "Authentication-Results: other.example; spf=fail kept=1\nSubject: ar\n\nbody\n", 'x@example.org');
is($rc, 0, 'a message with Authentication-Results is queued') or diag($err);
$stored = last_message();
unlike($stored, qr/plain=1|spaced=1|quoted=1/, 'the three claiming our authserv-id are removed');
like($stored, qr/^Authentication-Results: other\.example; spf=fail kept=1\r$/m, "another server's stays");

# -f is a mailbox, in angle brackets or not, or <> for none.
($rc, $err) = sendmail("Subject: x\n\nx\n", '-f', '<alice@example.org>', 'b@example.org');
is($rc, 0, '-f <alice@example.org> is taken') or diag($err);
is(last_row(), 'submit|alice@example.org|b@example.org', 'without its angle brackets');
($rc, $err) = sendmail("Subject: x\n\nx\n", '-f', '<>', 'b@example.org');
is($rc, 0, '-f <> is taken') or diag($err);
is(last_row(), 'submit||b@example.org', 'as the null sender');

# Missing headers are added; without -i a lone dot ends the message.
($rc, $err) = sendmail("Subject: bare\n\nbefore\n.\nafter\n", 'x@example.org');
is($rc, 0, 'a message without From, Date or Message-ID is queued') or diag($err);
$stored = last_message();
like($stored, qr/^From: \S+\@host\.example\.org\r$/m, 'From is added from the user and HOSTNAME');
like($stored, qr/^Date: /m, 'Date is added');
like($stored, qr/^Message-ID: <[^>]+\@host\.example\.org>\r$/m, 'Message-ID is added');
unlike($stored, qr/after/, 'a lone dot ends the message without -i');

# Bad use.
my $rows = $node->safe_psql('postgres', 'SELECT count(*) FROM pepsi.workqueue');
($rc, $err) = sendmail("Subject: x\n\nx\n");
is($rc, 64, 'no recipient is a usage error (EX_USAGE)');
like($err, qr/no recipients/, 'and says so');
($rc, $err) = sendmail("Subject: x\n\nx\n", '-X', 'a@example.org');
is($rc, 64, 'an unknown option is a usage error');
($rc, $err) = sendmail("Subject: x\n\nx\n", 'not-an-address');
is($rc, 64, 'a recipient that is not an address is refused');
($rc, $err) = sendmail("", 'a@example.org');
is($rc, 65, 'an empty message is a data error (EX_DATAERR)');
# A control character in an envelope address or the full name would forge
# an SMTP command or a header line downstream: refused, nothing queued.
($rc, $err) = sendmail("Subject: x\n\nx\n", '-f', "a\@example.org\r\nRCPT TO:<victim\@example.net>",
	'b@example.org');
is($rc, 64, 'CR LF in -f is a usage error');
like($err, qr/the sender \(-f\) has a control character \(0x0d\); refused/, 'and says where');
($rc, $err) = sendmail("Subject: x\n\nx\n", '-F', "Alice\r\nBcc: victim\@example.net", 'b@example.org');
is($rc, 64, 'CR LF in -F is a usage error');
like($err, qr/the full name \(-F\) has a control character/, 'and says where');
for my $bad ('alice', 'alice@', '@example.org', 'a@b@example.org', 'a b@example.org', 'a@exa mple.org',
	'<a@example.org', 'x' x 250 . '@example.org')
{
	($rc, $err) = sendmail("Subject: x\n\nx\n", '-f', $bad, 'b@example.org');
	is($rc, 64, "-f '" . substr($bad, 0, 20) . "' is a usage error");
	like($err, qr/the sender \(-f\) "[^"]*" is not an address: local\@domain of at most 256 octets/,
		'naming the option and the limit');
}
($rc, $err) = sendmail("Subject: x\n\nx\n", "b\@example.org\x1b[2J");
is($rc, 64, 'an escape sequence in a recipient is refused');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pepsi.workqueue'), $rows,
	'nothing was queued by the refusals');
($rc, $err) = sendmail("Subject: quoted\n\nx\n", '-F', 'Al "the Pal" \\o/', 'b@example.org');
is($rc, 0, 'a full name with quotes is taken') or diag($err);
like(last_message(), qr/^From: "Al \\"the Pal\\" \\\\o\/" </m, 'and quoted as a quoted-string');
$rows++;

# The queue refuses them too, whoever calls it.
my ($ret, $qout, $qerr) = $node->psql('postgres',
	"SELECT pepsi.workqueue_inject('submit', E'a\@example.org\\r\\nX: y', '{b\@example.org}', 'h', 'b')");
isnt($ret, 0, 'workqueue_inject refuses a control character in mail_from');
like($qerr, qr/mail_from has a control character/, 'naming the argument');
($ret, $qout, $qerr) = $node->psql('postgres',
	"SELECT pepsi.workqueue_inject('submit', 'a\@example.org', ARRAY['ok\@example.org', E'b\@example.org\\n'], 'h', 'b')");
like($qerr, qr/rcpt_to\[2\] has a control character/, 'and in a recipient, naming which');
($ret, $qout, $qerr) = $node->psql('postgres',
	"SELECT pepsi.workqueue_add(E'a\\x01\@example.org', '{b\@example.org}', 'h', 'b')");
like($qerr, qr/mail_from has a control character/, 'so does workqueue_add');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pepsi.workqueue'), $rows,
	'and nothing is queued');

# The database down: EX_TEMPFAIL, so the calling program tries again later.
$node->stop;
($rc, $err) = sendmail("Subject: x\n\nx\n", 'a@example.org');
is($rc, 75, 'an unreachable queue is a temporary failure (EX_TEMPFAIL)');
like($err, qr/cannot connect/, 'and says so');

open $fh, '>', "$dir/bad.conf" or die $!;
print $fh "[database]\nCONNINFO = x\nNOPE = 1\n";
close $fh;
my ($out, $bad) = ('', '');
run([ $sendmail, '-C', "$dir/bad.conf", 'a@example.org' ], '<', \"x\n", '>', \$out, '2>', \$bad);
is($? >> 8, 78, 'a bad configuration is EX_CONFIG');
like($bad, qr/bad\.conf:3: \[database\] has no option NOPE/, 'with file:line and the reason');

done_testing();
