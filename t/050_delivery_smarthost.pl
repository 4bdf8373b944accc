# Delivery through a smarthost, end to end under pepsi-dispatch: Postfix's
# smtp-sink as the smarthost (delivered, sessions reused), then the scripted
# peer t/bin/smtp-peer: a 451 then 250 (delivered on retry, one delay DSN
# for NOTIFY=DELAY), a 550 (a DSN in the sender's Maildir, parsed as a
# multipart/report), NOTIFY=SUCCESS to a server without DSN (a "relayed"
# success DSN), NOTIFY=NEVER (nothing), a failing null-sender message (not
# bounced), and three recipients of which one fails for good and one for a
# while (two delivered, one DSN, the body stored once until the last row).

use strict;
use warnings FATAL => 'all';


use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('delivery_smarthost');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

sub dsns { return maildir_files($root, $sender) }

#
# smtp-sink: ten messages, one worker, one SMTP session.
#
my $sink = start_sink('-c');
my $config = delivery_config($node, maildir_root => $root, smarthost => "127.0.0.1:$sink->{port}",
	extra => { smarthost => "PARALLELISM = 1\n" });
my $d = start_dispatcher($config);
my @ids = map {
	inject($node, to => ['user@remote.test'], body => "message $_\r\n.leading dot\r\n")
} 1 .. 10;
ok(poll_until(sub { queue_count($node) == 0 }), 'ten messages relayed to smtp-sink, none left');
my @dumps = glob("$sink->{dir}/mail/*");
is(scalar @dumps, 10, 'smtp-sink received ten transactions');
like(slurp($dumps[0]), qr/message \d+\r?\n\.leading dot/, 'the body arrived, dot-stuffing undone');
is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly (the worker QUITs its session)');
stop_process($sink);
my $sink_log = slurp("$sink->{dir}/sink.log");
my ($sessions) = $sink_log =~ /sess=(\d+)/g ? ($sink_log =~ /sess=(\d+)/g)[-1] : (undef);
is($sessions, 2, 'one SMTP session carried all ten messages (the other is the start-up probe)');

#
# The scripted peer: slow@ gets 451 once, gone@ 550, later@ 451 twice.
#
my $peer = start_peer('--rcpt-first', 'slow@=1=451 4.3.0 try again later',
	'--rcpt-first', 'later@=2=451 4.2.1 mailbox busy',
	'--rcpt', 'gone@=550 5.1.1 <gone@remote.test>: no such user');
$config = delivery_config($node, maildir_root => $root,
	smarthost => "127.0.0.1:$peer->{port}",
	extra => { smarthost => "DELAY_DSN_AFTER = 0s\nRETRY_BASE = 2s\nRETRY_MAX = 3s\n" });
$d = start_dispatcher($config);

# 451 then 250, NOTIFY=DELAY,FAILURE: delivered on the retry, one delay DSN.
my $dsn_state = '{"dsn":{"ret":null,"envid":"env-slow","rcpt":[{"notify":"DELAY,FAILURE","orcpt":"rfc822;slow@remote.test"}]}}';
my $id = inject($node, to => ['slow@remote.test'], state => $dsn_state,
	headers => "From: <$sender>\r\nTo: <slow\@remote.test>\r\nSubject: slow\r\n");
ok(poll_until(sub { scalar(grep { /Subject: slow/ } map { $_->{data} } peer_messages($peer)) == 1 }),
	'451 then 250: delivered after a retry');
ok(poll_until(sub { queue_count($node) == 0 }), 'nothing left in the queue');
is(slurp("$peer->{dir}/attempts-slow\@remote.test"), "2\n", 'two attempts');
my @files = dsns();
is(scalar @files, 1, 'one DSN in the sender\'s Maildir');
my $dsn = parse_dsn(slurp($files[0]));
is($dsn->effective_type, 'multipart/report', 'the DSN is a multipart/report');
like($dsn->head->get('Content-Type'), qr/report-type="?delivery-status/, 'of report-type delivery-status');
my ($message, $recipients) = dsn_fields($dsn);
is($message->{'original-envelope-id'}, 'env-slow', 'Original-Envelope-Id is the ENVID');
is($recipients->[0]{'final-recipient'}, 'rfc822; slow@remote.test', 'Final-Recipient');
is($recipients->[0]{'original-recipient'}, 'rfc822; slow@remote.test', 'Original-Recipient from ORCPT');
is($recipients->[0]{action}, 'delayed', 'Action: delayed');
is($recipients->[0]{status}, '4.3.0', 'Status: the 451\'s enhanced code');
like($recipients->[0]{'diagnostic-code'}, qr/^smtp; 451 4\.3\.0 try again later/, 'Diagnostic-Code');
is($dsn->head->get('Subject'), "Delayed Mail (still being retried)\n", 'a delay subject');
like(slurp($files[0]), qr/^Return-Path: <>\r\n/, 'the DSN came from the null sender');
my ($returned) = grep { $_->effective_type eq 'text/rfc822-headers' } $dsn->parts;
ok($returned, 'a delay DSN returns the headers only');

# 550: a failure DSN with the whole message.
$id = inject($node, to => ['gone@remote.test'],
	headers => "From: <$sender>\r\nTo: <gone\@remote.test>\r\nSubject: gone\r\n",
	body => "the original body\r\n");
ok(poll_until(sub { scalar(dsns()) == 2 && queue_count($node) == 0 }), '550: a DSN arrives, the queue is empty');
$dsn = parse_dsn(slurp((dsns())[-1]));
($message, $recipients) = dsn_fields($dsn);
is($message->{'reporting-mta'}, 'dns; mx.pepsi.test', 'Reporting-MTA is [pepsi] HOSTNAME');
is($recipients->[0]{'final-recipient'}, 'rfc822; gone@remote.test', 'Final-Recipient: the failed one');
is($recipients->[0]{action}, 'failed', 'Action: failed');
is($recipients->[0]{status}, '5.1.1', 'Status: 5.1.1');
is($recipients->[0]{'remote-mta'}, 'dns; peer.test', 'Remote-MTA: the smarthost, by its greeting');
like($recipients->[0]{'diagnostic-code'}, qr/^smtp; 550 5\.1\.1 <gone\@remote\.test>: no such user/,
	'Diagnostic-Code: the 550');
($returned) = grep { $_->effective_type eq 'message/rfc822' } $dsn->parts;
ok($returned, 'the failed message is returned whole');
like($returned ? $returned->as_string : '', qr/the original body/, 'with its body');
is(scalar(grep { /Subject: gone/ } map { $_->{data} } peer_messages($peer)), 0,
	'the peer stored nothing for gone@');

# NOTIFY=NEVER: the 550 is not reported.
$id = inject($node, to => ['gone@remote.test'],
	state => '{"dsn":{"rcpt":[{"notify":"NEVER"}]}}');
ok(poll_until(sub { queue_count($node) == 0 }), 'NOTIFY=NEVER: the row is done');
ok(poll_until(sub { dispatcher_log($d) =~ /asked for no FAILURE DSN \(NOTIFY=NEVER\)/ }),
	'the bounce stage logs the suppressed DSN');
is(scalar(dsns()), 2, 'and no DSN was sent');

# A null-sender message that fails is finished with a log line, not bounced.
$id = inject($node, from => '', to => ['gone@remote.test']);
ok(poll_until(sub { queue_count($node) == 0 }), 'a failing bounce leaves the queue');
like(dispatcher_log($d),
	qr/: $id: to=<gone\@remote\.test>, .*status=bounced \(550 [^)]*; from the null sender: dropped, a bounce is never bounced\)/,
	'with a log line');
is(scalar(dsns()), 2, 'and nobody gets a DSN about it');

# NOTIFY=SUCCESS through a server without DSN: a "relayed" success DSN.
$id = inject($node, to => ['happy@remote.test'],
	state => '{"dsn":{"rcpt":[{"notify":"SUCCESS"}]}}',
	headers => "From: <$sender>\r\nTo: <happy\@remote.test>\r\nSubject: happy\r\n");
ok(poll_until(sub { scalar(dsns()) == 3 && queue_count($node) == 0 }), 'NOTIFY=SUCCESS: a DSN arrives');
$dsn = parse_dsn(slurp((dsns())[-1]));
($message, $recipients) = dsn_fields($dsn);
is($recipients->[0]{action}, 'relayed', 'Action: relayed (the smarthost has no DSN)');
is($recipients->[0]{status}, '2.0.0', 'Status: 2.0.0');
is($dsn->head->get('Subject'), "Successful Mail Delivery Report\n", 'a success subject');
is(scalar(grep { /Subject: happy/ } map { $_->{data} } peer_messages($peer)), 1,
	'and the message was delivered');

# Three recipients: ok@ delivered, gone@ 550, later@ 451 twice.
my $before = scalar(peer_messages($peer));
my $body_id;
($id, $body_id) = inject($node, to => ['ok@remote.test', 'gone@remote.test', 'later@remote.test'],
	headers => "From: <$sender>\r\nTo: <ok\@remote.test>\r\nSubject: three\r\n");
# (The DSN's file is written before its row is finished: wait for that
# too, or its row may still be in the queue beside later@'s.)
ok(poll_until(sub {
	queue_count($node, "status = 'paused' AND rcpt_to = '{later\@remote.test}'") == 1
	  && scalar(dsns()) == 4 && queue_count($node, "mail_from = ''") == 0 }),
	'three recipients: one DSN (gone@) while later@ waits paused');
is($node->safe_psql('postgres',
	"SELECT count(*) || ' ' || count(*) FILTER (WHERE body_id = $body_id) FROM pepsi.workqueue"),
	'1 1', 'the paused row is the only one left, sharing the original body');
is($node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue_body WHERE id = $body_id"),
	1, 'the body is stored once while a row references it');
ok(poll_until(sub { queue_count($node) == 0 }), 'later@ is delivered on a retry');
is(scalar(peer_messages($peer)) - $before, 2, 'two of the three recipients got the message');
is(scalar(dsns()), 4, 'one DSN for the three-recipient message');
($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
is($recipients->[0]{'final-recipient'}, 'rfc822; gone@remote.test', 'about gone@ only');
ok(poll_until(sub {
	$node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue_body WHERE id = $body_id") == 0
}), 'the body went with the last row');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pepsi.workqueue WHERE status <> \'pending\''),
	0, 'no row failed');

# An 8-bit body goes with BODY=8BITMIME, and every MAIL says its SIZE.
inject($node, to => ['eight@remote.test'], body => "caf\xc3\xa9\r\n",
	headers => "From: <$sender>\r\nSubject: eight\r\n");
ok(poll_until(sub { (grep { $_->{data} =~ /Subject: eight/ } peer_messages($peer)) && queue_count($node) == 0 }),
	'an 8-bit message');
my ($eight) = grep { $_->{data} =~ /Subject: eight/ } peer_messages($peer);
like($eight->{env}, qr/^MAIL FROM:<\Q$sender\E> SIZE=\d+ BODY=8BITMIME$/m, 'went with SIZE and BODY=8BITMIME');
unlike($eight->{env}, qr/NOTIFY|ORCPT|RET=|ENVID/, 'and no DSN parameters to a server without DSN');
is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');

# A server with DSN and a small SIZE, without SMTPUTF8.
my $strict = start_peer('--dsn', '--size', '600', '--hang-rcpt', 'slowpoke@');
$config = delivery_config($node, maildir_root => $root, smarthost => "127.0.0.1:$strict->{port}",
	extra => { smarthost => "TIMEOUT = 2s\nRETRY_BASE = 60s\nRETRY_MAX = 60s\n" });
$d = start_dispatcher($config);
$id = inject($node, to => ['passed@remote.test'],
	state => '{"dsn":{"ret":"HDRS","envid":"e=1","rcpt":[{"notify":"SUCCESS,FAILURE","orcpt":"rfc822;Passed+x@remote.test"}]}}',
	headers => "From: <$sender>\r\nSubject: passed\r\n");
ok(poll_until(sub { scalar(peer_messages($strict)) == 1 && queue_count($node) == 0 }), 'a DSN-capable server');
my ($passed) = peer_messages($strict);
like($passed->{env}, qr/^MAIL FROM:<\Q$sender\E> SIZE=\d+ RET=HDRS ENVID=e\+3D1$/m, 'RET and ENVID (xtext) passed on');
like($passed->{env}, qr/^RCPT TO:<passed\@remote\.test> NOTIFY=SUCCESS,FAILURE ORCPT=rfc822;Passed\+2Bx\@remote\.test$/m,
	'NOTIFY and ORCPT (xtext) passed on');
is(scalar(dsns()), 4, 'the next hop reports success itself: no DSN from here');
inject($node, to => ['big@remote.test'], body => join('', ('x' x 70 . "\r\n") x 10));
ok(poll_until(sub { scalar(dsns()) == 5 && queue_count($node) == 0 }), 'a message over SIZE bounces');
($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
is($recipients->[0]{status}, '5.3.4', 'Status: 5.3.4');
like($recipients->[0]{'diagnostic-code'}, qr/exceeds the limit of 600 bytes/, 'Diagnostic-Code says why');
inject($node, to => ["jos\xc3\xa9\@remote.test"]);
ok(poll_until(sub { scalar(dsns()) == 6 && queue_count($node) == 0 }),
	'a non-ASCII address to a server without SMTPUTF8 bounces');
($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
is($recipients->[0]{status}, '5.6.7', 'Status: 5.6.7');
# A bare CR (binary content a BDAT BINARYMIME client may have sent) is never
# passed on raw over DATA, where the next hop could take it for a line end:
# the text is converted to quoted-printable (t/105 has the rest).
inject($node, to => ['binary@remote.test'], body => "line\r.\r\nMAIL FROM:<x\@y>\r\n");
ok(poll_until(sub { scalar(peer_messages($strict)) == 2 && queue_count($node) == 0 }),
	'a message with a bare CR is sent converted');
my ($converted) = grep { $_->{env} =~ /binary\@remote/ } peer_messages($strict);
unlike($converted->{data}, qr/\r(?!\n)/, 'with no bare CR');
like($converted->{data}, qr/\r\n\r\nline=0D\.\r\nMAIL FROM:<x\@y>\r\n\z/, 'the CR is =0D in quoted-printable');
is(scalar(dsns()), 6, 'and no DSN for it');
$id = inject($node, to => ['slowpoke@remote.test']);
like(poll_until(sub {
	$node->safe_psql('postgres',
		"SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $id AND status = 'paused'") }),
	qr/timed out talking to 127\.0\.0\.1.* while sending RCPT TO/,
	'a server that stops answering: deferred when TIMEOUT runs out');
unlike(slurp("$strict->{dir}/transcript"), qr/RCPT TO:<(big|jos)/, 'not even announced');
is(stop_dispatcher($d), 0, 'the dispatcher stops');
stop_process($strict);

# Past MAX_LIFETIME a temporary failure bounces, with the last 4xx as its status.
my $stuck_state = '{"dsn":{"rcpt":[{"notify":"FAILURE"}]}}';
my $stuck = start_peer('--rcpt', 'stuck@=452 4.2.2 mailbox full');
$config = delivery_config($node, maildir_root => $root,
	smarthost => "127.0.0.1:$stuck->{port}",
	extra => { smarthost => "MAX_LIFETIME = 3s\nRETRY_BASE = 1s\nRETRY_MAX = 1s\n" });
$d = start_dispatcher($config);
# slowpoke@, still paused from above, is resumed and delivered here.
$node->safe_psql('postgres',
	"SELECT pepsi.workqueue_resume(array_agg(id)) FROM pepsi.workqueue WHERE status = 'paused'");
$id = inject($node, to => ['stuck@remote.test'], state => $stuck_state);
ok(poll_until(sub { scalar(dsns()) == 7 && queue_count($node) == 0 }),
	'MAX_LIFETIME: the message bounces after retrying');
($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
is($recipients->[0]{action}, 'failed', 'Action: failed');
is($recipients->[0]{status}, '4.2.2', 'Status: the last temporary failure\'s');
like($recipients->[0]{'diagnostic-code'}, qr/^smtp; 452 4\.2\.2 mailbox full \(gave up after \d+ attempts/,
	'Diagnostic-Code: the last reply, and that it gave up');
cmp_ok(slurp("$stuck->{dir}/attempts-stuck\@remote.test"), '>=', 2, 'after more than one attempt');
is(stop_dispatcher($d), 0, 'the dispatcher stops');
stop_process($stuck);

# No SMARTHOST: remote mail is held paused, with a log line saying what to set.
$config = delivery_config($node, maildir_root => $root);
$d = start_dispatcher($config);
$id = inject($node, to => ['held@remote.test']);
ok(poll_until(sub { queue_count($node, "id = $id AND status = 'paused'") == 1 }),
	'without SMARTHOST remote mail is paused');
like(dispatcher_log($d), qr/\[stage-smarthost\] has no SMARTHOST: row $id to <held\@remote\.test> is held paused/,
	'with a clear log line');
like($node->safe_psql('postgres', "SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $id"),
	qr/no SMARTHOST is configured/, 'and the reason in state.last_error');
is(stop_dispatcher($d), 0, 'the dispatcher stops');

stop_process($peer);
done_testing();
