# pepsi-stage-relay-to-lmtp against a real Dovecot LMTP server (an
# unprivileged instance started here, with the quota plugin): three
# recipients in one transaction, one of them over quota, give two
# messages in their Maildirs and one DSN (Dovecot's 552 5.2.2 after the
# message, mapped back to that recipient alone); the same over TCP; a
# stopped Dovecot holds the mail paused until it is back.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use DovecotTest;
use PepsiTest;

my $node = delivery_node('lmtp_dovecot');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);
sub dsns { return maildir_files($root, $sender) }

my $dovecot = start_dovecot(users => { alice => {}, bob => {}, full => { quota => '1K' } });

# init sends local mail to the lmtp stage; DSNs still go to the sender's Maildir.
sub lmtp_config
{
	my ($server, $more) = @_;
	return delivery_config($node, maildir_root => $root,
		extra => { init => "LOCAL_STAGE = lmtp\n" },
		more_stages => { lmtp => "PROGRAM = pepsi-stage-relay-to-lmtp\nSERVER = $server\n"
			  . "BOUNCE_STAGE = bounce\nRETRY_BASE = 1s\nRETRY_MAX = 2s\nTIMEOUT = 10s\n"
			  . "PARALLELISM = 1\n" . ($more // '') });
}

my $d = start_dispatcher(lmtp_config($dovecot->{socket}));
my $big = join('', map { "line $_ of a message larger than the 1K quota\r\n" } 1 .. 60);
my $id = inject($node, to => ['alice@local.test', 'full@local.test', 'bob@local.test'],
	headers => "From: <$sender>\r\nTo: <alice\@local.test>\r\nSubject: three at once\r\n",
	body => $big);
ok(poll_until(sub { queue_count($node) == 0 && scalar(dsns()) == 1 }),
	'three recipients over the Unix socket: the queue empties and one DSN arrives');
my @alice = dovecot_messages($dovecot, 'alice');
my @bob = dovecot_messages($dovecot, 'bob');
is(scalar @alice, 1, 'alice has the message in her Maildir');
is(scalar @bob, 1, 'bob has it too');
is(scalar(dovecot_messages($dovecot, 'full')), 0, 'full, over quota, has nothing');
like($alice[0] // '', qr/^Subject: three at once\r?$/m, 'the headers arrived');
like($alice[0] // '', qr/line 60 of a message/, 'and the whole body');
like($alice[0] // '', qr/^Return-Path: <\Q$sender\E>/m, 'Dovecot wrote the Return-Path of our MAIL FROM');
like($alice[0] // '', qr/^Received: from mx\.pepsi\.test\s+by \S+ with LMTP/m,
	'and a Received line naming our LHLO (HOSTNAME) and LMTP');
my $dsn = parse_dsn(slurp((dsns())[0]));
my ($message, $recipients) = dsn_fields($dsn);
is(scalar @$recipients, 1, 'the DSN is about one recipient');
is($recipients->[0]{'final-recipient'}, 'rfc822; full@local.test', 'the one over quota');
is($recipients->[0]{action}, 'failed', 'Action: failed');
is($recipients->[0]{status}, '5.2.2', 'Status: 5.2.2 (mailbox full), from the reply after the message');
like($recipients->[0]{'diagnostic-code'}, qr/^smtp; 552 5\.2\.2 .*Quota exceeded/, 'Diagnostic-Code: Dovecot\'s reply');
like(dispatcher_log($d), qr/: $id: to=<alice\@local\.test>, relay=unix:\Q$dovecot->{socket}\E, .*status=sent/,
	'a delivery log line for alice');
like(dispatcher_log($d), qr/: $id: to=<bob\@local\.test>, relay=unix:.*status=sent/, 'and one for bob');
like(dispatcher_log($d), qr/to=<full\@local\.test>, relay=unix:.*dsn=5\.2\.2, status=bounced/,
	'and a bounced one for full');
my $log = slurp($dovecot->{log});
my $sessions = () = $log =~ /Connect from local/g;
is($sessions, 1, 'Dovecot saw one connection');
is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');

# Over TCP, a message of two recipients.
$d = start_dispatcher(lmtp_config("127.0.0.1:$dovecot->{port}"));
inject($node, to => ['alice@local.test', 'bob@local.test'],
	headers => "From: <$sender>\r\nSubject: over TCP\r\n");
ok(poll_until(sub { queue_count($node) == 0 && scalar(dovecot_messages($dovecot, 'bob')) == 2 }),
	'over TCP: delivered to both');
like((dovecot_messages($dovecot, 'alice'))[-1] // '', qr/^Subject: over TCP/m, 'alice has it');
like(dispatcher_log($d), qr/to=<alice\@local\.test>, relay=127\.0\.0\.1\[127\.0\.0\.1\]:$dovecot->{port}, .*status=sent/,
	'logged with the TCP relay');

# Dovecot stopped: the message waits paused; started again, it is delivered.
stop_dovecot($dovecot);
$id = inject($node, to => ['alice@local.test', 'bob@local.test'],
	headers => "From: <$sender>\r\nSubject: while down\r\n");
ok(poll_until(sub { queue_count($node, "status = 'paused' AND cardinality(rcpt_to) = 2") == 1 }),
	'with Dovecot down the row waits paused, both recipients on it');
like($node->safe_psql('postgres', "SELECT string_agg(state->>'last_error', '|') FROM pepsi.workqueue"),
	qr/cannot connect to 127\.0\.0\.1/, 'last_error says why');
restart_dovecot($dovecot);
ok(poll_until(sub { queue_count($node) == 0 }), 'Dovecot back: the retries deliver');
like((dovecot_messages($dovecot, 'bob'))[-1] // '', qr/^Subject: while down/m, 'bob has the message');
like((dovecot_messages($dovecot, 'alice'))[-1] // '', qr/^Subject: while down/m, 'and alice');
is(scalar(dsns()), 1, 'and no DSN was sent for the wait');
is(stop_dispatcher($d), 0, 'the dispatcher stops');
stop_dovecot($dovecot);

done_testing();
