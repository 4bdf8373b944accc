# Mailbox quotas (pepsi.quota, pepsi-quota(8)) end to end: swaks ->
# pepsi-ingress -> pepsi-dispatch -> pepsi-stage-relay-to-maildir ->
# pepsi-helper-maildir-writer.  A mailbox under its quota takes mail and
# its owner is warned once when the use crosses a QUOTA_WARNING threshold
# (not on every delivery after); a message that would push it over (which
# ingress cannot know) bounces with 5.2.2, or with OVER_QUOTA_STATUS =
# 4.2.2 waits; a mailbox the database knows full gets 452 4.2.2 at RCPT
# while another recipient of the same transaction is accepted; a domain's
# row applies to its addresses without their own, and a daily limit is
# kept; pepsi-quota recount matches what du counts in the Maildir; bad
# input is refused, named; pepsi-stage-relay-to-lmtp does not hand a
# mailbox known full to the LMTP server, and counts its deliveries against
# the daily limit.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use SmtpClient;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-ingress or the maildir writer is not built'
  unless -x pepsi_bin('pepsi-ingress') && -x pepsi_bin('pepsi-helper-maildir-writer');

my $node = delivery_node('quota');
my $db = 'postgres';
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $sender = 'sender@local.test';
make_mailbox($root, $_)
  for $sender, 'alice@local.test', 'full@local.test', 'carol@team.test', 'dave@team.test';
$node->safe_psql($db, 'CREATE ROLE operator LOGIN IN ROLE pepsi_config');

sub config
{
	my ($maildir) = @_;
	return delivery_config($node, maildir_root => $root, local_domains => 'local.test team.test',
		path => "$tmp/pepsi.conf",
		pepsi => { LOCAL_RECIPIENTS => 'maildir', MAILDIR_ROOT => $root },
		extra => { maildir => "PARALLELISM = 1\n$maildir" },
		sections => <<"CONF");
[ingress]
AUTHSERV_ID = mx.pepsi.test
DISPATCH_WAKE_INTERVAL = 10ms
LOCAL_RECIPIENTS_REFRESH = 60s
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
CONF
}
my $config = config('');
my $tool_config = operator_config($node, $config, 'operator');
my $ingress = start_ingress($config, $port, "$tmp/ingress.log");
my $d = start_dispatcher($config);

sub quota
{
	my $out = '';
	my $err = '';
	IPC::Run::run([ pepsi_bin('pepsi-quota'), '-C', $tool_config, @_ ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

my $n = 0;
sub swaks
{
	my ($to, $body_size) = @_;
	my $out = '';
	$n++;
	my $body = join('', map { sprintf("%-77s\r\n", "line $_ of message $n") } 1 .. int($body_size / 79));
	PostgreSQL::Test::Utils::append_to_file("$tmp/m$n.eml",
		"From: <$sender>\r\nTo: <$to>\r\nSubject: message $n\r\n\r\n$body");
	IPC::Run::run([ 'swaks', '--server', "127.0.0.1:$port", '--ehlo', 'client.test', '--from', $sender,
		'--to', $to, '--data', "$tmp/m$n.eml" ], '<', \undef, '>', \$out, '2>&1', IPC::Run::timeout(60));
	return ($? >> 8, $out);
}

sub files { return scalar(maildir_files($root, $_[0])) }
sub warnings { return grep { slurp($_) =~ /^Subject: Your mailbox is \d+% full/m } maildir_files($root, $_[0]) }
sub dsns { return maildir_files($root, $sender) }
sub used { return $node->safe_psql($db, "SELECT bytes FROM pepsi.quota_usage WHERE address = '$_[0]'") }

# The Maildir's messages as du counts them: the apparent sizes of the files of new/ and cur/.
sub du_bytes
{
	my ($mailbox) = @_;
	my $out = '';
	IPC::Run::run([ 'du', '-c', '-b', '--apparent-size', glob("$root/$mailbox/new/* $root/$mailbox/cur/*") ],
		'>', \$out);
	my ($total) = $out =~ /^(\d+)\s+total$/m;
	return $total // 0;
}

# 1. Under quota: delivered; the writer's count is recorded; the limits are in maildirsize.
my ($rc, $out, $err) = quota('set', 'full@local.test', 'bytes=20000');
is($rc, 0, 'pepsi-quota set: a limit of 20000 bytes') or diag($err);
($rc, $out) = swaks('alice@local.test', 1000);
is($rc, 0, 'a mailbox without a quota takes mail') or diag($out);
($rc, $out) = swaks('full@local.test', 6000);
is($rc, 0, 'a mailbox under its quota takes mail') or diag($out);
ok(poll_until(sub { files('full@local.test') == 1 && queue_count($node) == 0 }), 'delivered to it');
like(slurp("$root/full\@local.test/maildirsize"), qr/^20000S\n/, 'maildirsize carries the database\'s limit');
ok(used('full@local.test') > 6000, 'pepsi.quota_usage has the writer\'s count: ' . used('full@local.test'));
is(scalar(warnings('full@local.test')), 0, 'no warning below 80%');

# 2. Crossing 80%: one warning; the next delivery, still between 80 and 95%, sends none.
($rc, $out) = swaks('full@local.test', 10000);
is($rc, 0, 'a message that takes it past 80%');
ok(poll_until(sub { scalar(warnings('full@local.test')) == 1 && queue_count($node) == 0 }),
	'the owner is warned');
my ($warning) = warnings('full@local.test');
like(slurp($warning), qr/^Subject: Your mailbox is 80% full/m, 'at the 80% threshold');
like(slurp($warning), qr/^Auto-Submitted: auto-generated/m, 'an automatic message');
($rc, $out) = swaks('full@local.test', 200);
ok(poll_until(sub { files('full@local.test') == 4 && queue_count($node) == 0 }), 'another small message');
is(scalar(warnings('full@local.test')), 1, 'and still one warning: once per crossing, not per delivery');

# 3. A message that would push it over: ingress cannot know; the writer refuses, 5.2.2 by default.
($rc, $out) = swaks('full@local.test', 6000);
is($rc, 0, 'ingress takes a message that does not fit (the mailbox is not full yet)') or diag($out);
ok(poll_until(sub { scalar(dsns()) == 1 && queue_count($node) == 0 }), 'it bounces');
my (undef, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
is($recipients->[0]{status}, '5.2.2', 'Status: 5.2.2');
like($recipients->[0]{'diagnostic-code'}, qr/over quota/, 'Diagnostic-Code: over quota');
unlike($recipients->[0]{'diagnostic-code'}, qr/quota=/, 'without the writer\'s count');
is(files('full@local.test'), 4, 'nothing more in the mailbox');

# ... and with OVER_QUOTA_STATUS = 4.2.2 it waits.
is(stop_dispatcher($d), 0, 'the dispatcher stops');
$config = config("OVER_QUOTA_STATUS = 4.2.2\n");
$d = start_dispatcher($config);
($rc, $out) = swaks('full@local.test', 6000);
ok(poll_until(sub { queue_count($node, "status = 'paused' AND state->>'last_error' ~ 'over quota'") == 1 }),
	'OVER_QUOTA_STATUS = 4.2.2: the row waits');
is(scalar(dsns()), 1, 'no second DSN');
is(stop_dispatcher($d), 0, 'the dispatcher stops');
$node->safe_psql($db, "DELETE FROM pepsi.workqueue");
$config = config('');
$d = start_dispatcher($config);

# 4. Known full (its limit lowered under its use): 452 4.2.2 at RCPT; another recipient is accepted.
($rc, $out, $err) = quota('set', 'full@local.test', 'bytes=10k');
is($rc, 0, 'the limit lowered to 10k') or diag($err);
my $smtp = SmtpClient->new($port);
$smtp->command('EHLO client.test');
my $reply = '';
ok(poll_until(sub {
		$smtp->command('RSET');
		$smtp->command("MAIL FROM:<$sender>");
		$reply = $smtp->command('RCPT TO:<full@local.test>');
		return $reply =~ /^452/;
	}), 'RCPT to the full mailbox: 452');
like($reply, qr/^452 4\.2\.2 /, '452 4.2.2');
like($smtp->command('RCPT TO:<alice@local.test>'), qr/^250/, 'the other recipient is accepted');
like($smtp->command('DATA'), qr/^354/, 'DATA');
like($smtp->command("Subject: to both\r\n\r\nhello\r\n."), qr/^250/, 'the message is taken');
$smtp->command('QUIT');
ok(poll_until(sub { files('alice@local.test') == 2 && queue_count($node) == 0 }), 'and delivered to alice');
is(files('full@local.test'), 4, 'not to the full mailbox');
($rc, $out) = quota('--json', 'show', 'full@local.test');
like($out, qr/"full":\s*"?true/, 'pepsi-quota show: full');

# 5. A domain's row: for its addresses without their own.
($rc, $out, $err) = quota('set', '@team.test', 'bytes=3000');
is($rc, 0, 'a domain\'s limit') or diag($err);
($rc, $out, $err) = quota('set', 'dave@team.test', 'bytes=100000', 'messages=50');
($rc, $out) = quota('--json', 'show', 'carol@team.test');
like($out, qr/"source":\s*"domain"/, 'carol has the domain\'s limit');
($rc, $out) = swaks('carol@team.test', 4000);
($rc, $out) = swaks('dave@team.test', 4000);
ok(poll_until(sub { scalar(dsns()) == 2 && files('dave@team.test') == 1 && queue_count($node) == 0 }),
	'over the domain\'s limit: a bounce for carol; dave\'s own limit takes it');
is(files('carol@team.test'), 0, 'carol\'s mailbox got nothing');
like(slurp("$root/dave\@team.test/maildirsize"), qr/^100000S,50C\n/, 'dave\'s maildirsize has his own limits');

# ... and a daily limit: the day's deliveries are the database's count; past it, the stage refuses.
($rc, $out, $err) = quota('set', 'dave@team.test', 'daily=1');
is($rc, 0, 'dave: one message a day') or diag($err);
inject($node, to => ['dave@team.test'], headers => "From: <$sender>\r\nSubject: daily\r\n");
ok(poll_until(sub { scalar(dsns()) == 3 && queue_count($node) == 0 }), 'his second today bounces');
(undef, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
like($recipients->[0]{'diagnostic-code'}, qr/had its messages for today \(pepsi\.quota max_daily\)/,
	'Diagnostic-Code: the daily limit');
is(files('dave@team.test'), 1, 'nothing more in his mailbox');

# 6. pepsi-quota recount: the Maildir counted from disk, as du counts it; audited.
open my $extra, '>', "$root/full\@local.test/cur/1.extra.host:2,S" or die;
print $extra 'x' x 5000;
close $extra;
($rc, $out, $err) = quota('recount', 'full@local.test');
is($rc, 0, 'pepsi-quota recount') or diag($err);
my $du = du_bytes('full@local.test');
like($out, qr/^full\@local\.test: $du bytes in 5 messages$/, "it counts what du counts ($du bytes)");
is(used('full@local.test'), $du, 'and records it');
like(slurp("$root/full\@local.test/maildirsize"), qr/^10240S\n$du 5\n$/, 'maildirsize rewritten with it');
is($node->safe_psql($db, "SELECT string_agg(action, ',' ORDER BY id) FROM pepsi.event_log WHERE action LIKE 'quota%'"),
	'quota_set,quota_set,quota_set,quota_set,quota_set,quota_recount', 'each change and the recount in pepsi.event_log');

# 7. Bad input: refused, named, nothing written.
($rc, $out, $err) = quota('set', 'alice@local.test', 'bytes=-5');
isnt($rc, 0, 'a negative limit is refused');
like($err, qr/max_bytes must be 0 or more, not -5/, 'naming the limit');
($rc, $out, $err) = quota('set', 'alice@local.test', 'messages=-1');
like($err, qr/max_messages must be 0 or more/, 'a negative message count, named');
($rc, $out, $err) = quota('set', 'not an address', 'bytes=1000');
isnt($rc, 0, 'an address of unknown form is refused');
like($err, qr/invalid address "not an address"/, 'naming it');
($rc, $out, $err) = quota('set', 'alice@local.test', 'size=1000');
like($err, qr/"size=1000": not bytes=SIZE, messages=N or daily=N/, 'an unknown limit, named');
($rc, $out, $err) = quota('set', 'alice@local.test', 'bytes=lots');
like($err, qr/bytes: "lots" is not a size/, 'a size that is not one, named');
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.quota WHERE address = 'alice\@local.test'"), '0',
	'nothing was written');

is(stop_dispatcher($d), 0, 'the dispatcher stops');

# 8. LMTP: the stage checks pepsi.quota before delivery; a full mailbox is not handed to the server.
my $peer = start_peer('--lmtp');
$config = delivery_config($node, maildir_root => $root, local_domains => 'local.test team.test',
	path => "$tmp/lmtp.conf",
	extra => { init => "LOCAL_STAGE = lmtp\n", 'dsn-route' => "LOCAL_STAGE = dsn-maildir\n" },
	more_stages => { lmtp => "PROGRAM = pepsi-stage-relay-to-lmtp\nSERVER = 127.0.0.1:$peer->{port}\n"
		  . "BOUNCE_STAGE = bounce\nRETRY_BASE = 1s\nRETRY_MAX = 2s\nTIMEOUT = 10s\nPARALLELISM = 1\n" });
$d = start_dispatcher($config);
my $dsns_before = scalar(dsns());
inject($node, to => [ 'full@local.test', 'alice@local.test' ], headers => "From: <$sender>\r\nSubject: lmtp\r\n");
ok(poll_until(sub { queue_count($node) == 0 && scalar(dsns()) == $dsns_before + 1 }),
	'LMTP: the queue empties and a DSN comes back');
my @lmtp = peer_messages($peer);
is(scalar @lmtp, 1, 'one transaction reached the LMTP server');
like($lmtp[0]{env}, qr/^RCPT TO:<alice\@local\.test>$/m, 'to alice');
unlike($lmtp[0]{env}, qr/full\@/, 'not to the full mailbox');
(undef, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
is($recipients->[0]{status}, '5.2.2', 'the full mailbox bounced, 5.2.2');

# ... and counts what it delivers against the daily limit, as the maildir stage does.
($rc, $out, $err) = quota('set', 'carol@team.test', 'daily=1');
is($rc, 0, 'carol: one message a day') or diag($err);
inject($node, to => ['carol@team.test'], headers => "From: <$sender>\r\nSubject: lmtp daily 1\r\n");
ok(poll_until(sub { queue_count($node) == 0 && scalar(peer_messages($peer)) == 2 }),
	'LMTP: carol\'s first message today is delivered');
is($node->safe_psql($db, "SELECT day_messages FROM pepsi.quota_usage WHERE address = 'carol\@team.test' AND day = current_date"),
	'1', 'and counted in the day\'s deliveries');
$dsns_before = scalar(dsns());
inject($node, to => ['carol@team.test'], headers => "From: <$sender>\r\nSubject: lmtp daily 2\r\n");
ok(poll_until(sub { queue_count($node) == 0 && scalar(dsns()) == $dsns_before + 1 }),
	'her second today comes back');
is(scalar(peer_messages($peer)), 2, 'without reaching the LMTP server');
$smtp = SmtpClient->new($port);
$smtp->command('EHLO client.test');
ok(poll_until(sub {
		$smtp->command('RSET');
		$smtp->command("MAIL FROM:<$sender>");
		return $smtp->command('RCPT TO:<carol@team.test>') =~ /^452 4\.2\.2 /;
	}), 'and ingress answers 452 4.2.2 for her for the rest of the day');
$smtp->command('QUIT');
is(stop_dispatcher($d), 0, 'the dispatcher stops');

kill 'TERM', $ingress->{pid};
waitpid($ingress->{pid}, 0);
done_testing();
