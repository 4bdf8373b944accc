# pepsi-stage-relay-to-lmtp's per-recipient replies and its session, with
# the scripted LMTP peer (t/bin/smtp-peer --lmtp): one transaction for
# four recipients, of which one is refused at RCPT, one fails for good
# after the message and one for a while, gives one delivery now, one on
# a retry, and one DSN about the other two; several messages share one connection;
# MAX_RECIPIENTS splits a row into transactions; BDAT when offered.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('lmtp_replies');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);
sub dsns { return maildir_files($root, $sender) }

my $peer = start_peer('--lmtp', '--rcpt', 'unknown@=550 5.1.1 <unknown@local.test>: no such user',
	'--data-rcpt', 'gone@=554 5.7.1 <gone@local.test>: refused by a filter',
	'--data-rcpt-first', 'later@=1=452 4.2.2 <later@local.test>: mailbox busy');
my $config = delivery_config($node, maildir_root => $root,
	extra => { init => "LOCAL_STAGE = lmtp\n" },
	more_stages => { lmtp => "PROGRAM = pepsi-stage-relay-to-lmtp\nSERVER = 127.0.0.1:$peer->{port}\n"
		  . "BOUNCE_STAGE = bounce\nRETRY_BASE = 1s\nRETRY_MAX = 2s\nTIMEOUT = 10s\n"
		  . "PARALLELISM = 1\nMAX_RECIPIENTS = 4\n" });
my $d = start_dispatcher($config);

my $id = inject($node, to => [ 'ok@local.test', 'unknown@local.test', 'gone@local.test', 'later@local.test' ],
	headers => "From: <$sender>\r\nSubject: four\r\n");
ok(poll_until(sub { queue_count($node) == 0 && scalar(dsns()) == 1 }),
	'four recipients: the queue empties, a DSN arrives');
my @messages = peer_messages($peer);
is(scalar @messages, 2, 'two transactions delivered something');
like($messages[0]{env}, qr/^RCPT TO:<ok\@local\.test>$/m, 'the first to ok@');
unlike($messages[0]{env}, qr/gone|later|unknown/, 'and to no one else');
like($messages[1]{env}, qr/^RCPT TO:<later\@local\.test>$/m, 'the retry to later@ alone');
my (undef, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[0])));
my %failed = map { ($_->{'final-recipient'} => $_) } @$recipients;
is(scalar @$recipients, 2, 'one DSN about the two that failed for good');
is($failed{'rfc822; unknown@local.test'}{status}, '5.1.1', 'unknown@ bounced with its RCPT reply\'s 5.1.1');
like($failed{'rfc822; unknown@local.test'}{'diagnostic-code'} // '', qr/^smtp; 550 5\.1\.1/, 'its Diagnostic-Code');
is($failed{'rfc822; gone@local.test'}{status}, '5.7.1', 'gone@ bounced with its reply after the message');
like($failed{'rfc822; gone@local.test'}{'diagnostic-code'} // '', qr/^smtp; 554 5\.7\.1 <gone\@local\.test>: refused/,
	'its Diagnostic-Code');
is(slurp("$peer->{dir}/attempts-data-later\@local.test"), "2\n", 'later@ was tried twice');
like(dispatcher_log($d), qr/to=<later\@local\.test>, .*dsn=4\.2\.2, status=deferred \(452 4\.2\.2/,
	'the 452 is logged as deferred');
my $transcript = slurp("$peer->{dir}/transcript");
like($transcript, qr/-> LHLO mx\.pepsi\.test/, 'LHLO with HOSTNAME');

# Five messages, one connection.
inject($node, to => ["user$_\@local.test"], headers => "From: <$sender>\r\nSubject: reuse $_\r\n") for 1 .. 5;
ok(poll_until(sub { queue_count($node) == 0 && scalar(peer_messages($peer)) == 7 }), 'five more delivered');
$transcript = slurp("$peer->{dir}/transcript");
my %connections = map { /^(\d+) <- 220 / ? ($1 => 1) : () } split /\n/, $transcript;
is(scalar(keys %connections), 1, 'the server saw one connection for all seven transactions');

# MAX_RECIPIENTS = 4: six recipients go in two transactions.
inject($node, to => [ map { "many$_\@local.test" } 1 .. 6 ], headers => "From: <$sender>\r\nSubject: six\r\n");
ok(poll_until(sub { queue_count($node) == 0 && scalar(peer_messages($peer)) == 9 }), 'six recipients delivered');
@messages = peer_messages($peer);
my @counts = sort map { scalar(() = $_->{env} =~ /^RCPT/mg) } @messages[ 7, 8 ];
is("@counts", '2 4', 'in transactions of four and two');
is(scalar(dsns()), 1, 'no further DSN');
is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
stop_process($peer);

# A server offering CHUNKING gets BDAT, and still one reply per recipient.
$peer = start_peer('--lmtp', '--chunking', '--data-rcpt', 'full@=552 5.2.2 <full@local.test>: over quota');
$config = delivery_config($node, maildir_root => $root,
	extra => { init => "LOCAL_STAGE = lmtp\n" },
	more_stages => { lmtp => "PROGRAM = pepsi-stage-relay-to-lmtp\nSERVER = 127.0.0.1:$peer->{port}\n"
		  . "BOUNCE_STAGE = bounce\nRETRY_BASE = 1s\nRETRY_MAX = 2s\nTIMEOUT = 10s\n" });
$d = start_dispatcher($config);
inject($node, to => [ 'alice@local.test', 'full@local.test' ], headers => "From: <$sender>\r\nSubject: chunked\r\n",
	body => ".a leading dot stays as it is in BDAT\r\n");
ok(poll_until(sub { queue_count($node) == 0 && scalar(dsns()) == 2 }), 'BDAT: the queue empties, one more DSN');
$transcript = slurp("$peer->{dir}/transcript");
like($transcript, qr/-> BDAT \d+ LAST/, 'the message went as BDAT ... LAST');
unlike($transcript, qr/-> DATA/, 'not as DATA');
@messages = peer_messages($peer);
is(scalar @messages, 1, 'one message stored');
like($messages[0]{env}, qr/^RCPT TO:<alice\@local\.test>$/m, 'for alice');
like($messages[0]{data}, qr/^\.a leading dot stays/m, 'with its body unstuffed');
(undef, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
is($recipients->[0]{'final-recipient'}, 'rfc822; full@local.test', 'the DSN is about full@');
is($recipients->[0]{status}, '5.2.2', 'with the 552\'s 5.2.2');
is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');

done_testing();
