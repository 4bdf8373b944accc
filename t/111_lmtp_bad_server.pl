# pepsi-stage-relay-to-lmtp against LMTP servers that break the protocol
# (the scripted peer t/bin/smtp-peer --lmtp): fewer replies after the
# message (DATA or BDAT) than accepted recipients, then a closed
# connection or silence; a
# malformed reply; a reply far longer than any real one.  Which reply
# belongs to which recipient is then unknowable, so the row waits paused
# with the reason: never a guessed success, never a bounce.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('lmtp_bad_server');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

sub lmtp_config
{
	my ($port) = @_;
	return delivery_config($node, maildir_root => $root,
		extra => { init => "LOCAL_STAGE = lmtp\n" },
		more_stages => { lmtp => "PROGRAM = pepsi-stage-relay-to-lmtp\nSERVER = 127.0.0.1:$port\n"
			  . "BOUNCE_STAGE = bounce\nRETRY_BASE = 1h\nRETRY_MAX = 1h\nTIMEOUT = 2s\n" });
}

my @cases = (
	[ 'fewer replies, then the connection closed', [ '--short-replies', 'close' ],
		qr/closed the connection after 1 of the 2 replies LMTP owes/ ],
	[ 'fewer replies, then silence', [ '--short-replies', 'silent' ],
		qr/timed out talking to .* after 1 of the 2 replies LMTP owes/ ],
	[ 'fewer replies after BDAT', [ '--chunking', '--short-replies', 'close' ],
		qr/closed the connection after 1 of the 2 replies LMTP owes/ ],
	[ 'a malformed reply', [ '--bad-data-reply', 'malformed' ],
		qr/sent a malformed reply "OK, got it"/ ],
	[ 'an over-long reply', [ '--bad-data-reply', 'overlong' ],
		qr/sent a reply longer than 65536 bytes/ ],
);
for my $case (@cases)
{
	my ($name, $args, $error) = @$case;
	my $peer = start_peer('--lmtp', @$args);
	my $d = start_dispatcher(lmtp_config($peer->{port}));
	my $id = inject($node, to => [ 'one@local.test', 'two@local.test' ],
		headers => "From: <$sender>\r\nSubject: $name\r\n");

	ok(poll_until(sub { queue_count($node, "status = 'paused' AND stage = 'lmtp'") == 1 }),
		"$name: the row waits paused");
	is($node->safe_psql('postgres', "SELECT array_to_string(rcpt_to, ' ') FROM pepsi.workqueue"),
		'one@local.test two@local.test', "$name: with both recipients");
	like($node->safe_psql('postgres', "SELECT state->>'last_error' FROM pepsi.workqueue"), $error,
		"$name: last_error says what the server did");
	is(scalar(maildir_files($root, $sender)), 0, "$name: no DSN");
	unlike(dispatcher_log($d), qr/status=sent/, "$name: nothing logged as sent");
	is(stop_dispatcher($d), 0, "$name: the dispatcher stops cleanly");
	stop_process($peer);
	$node->safe_psql('postgres', 'DELETE FROM pepsi.workqueue');
}

done_testing();
