# Backscatter caps of the bounce stage, end to end under pepsi-dispatch with
# the scripted smarthost t/bin/smtp-peer: a message to 50 recipients that
# all fail gets one DSN listing the 50 (the delivery stages fail one row
# per recipient; the bounce stage gathers them); recipients of one message
# that fail at different times get a DSN each time, none lost; and
# DSN_RATE_LIMIT caps the DSNs one address gets per hour, each drop logged
# and recorded in pepsi.event_log.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('bounce_backscatter');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
my $flood = 'flood@local.test';
make_mailbox($root, $_) for $sender, $flood;

my $peer = start_peer('--rcpt', 'gone\d*@=550 5.1.1 no such user',
	'--rcpt', 'slow@=451 4.2.1 mailbox busy');
# The stages run under two dispatchers: one serving the bounce stage alone
# (one row at a time), one every other stage.  One DSN answers the
# failures of a message that reach the bounce stage within GATHER_WINDOW
# of the first (those after it get a DSN of their own, as they should),
# and on a loaded machine the smarthost stage's refusals may come further
# apart than that; so each part holds the bounce stage back until the
# failures it is about are there.  And with one row in flight at the
# bounce stage, the row that gathers the others never runs beside a
# sibling claimed and not yet waiting (which it could not take).
sub front
{
	my ($lifetime) = @_;
	return start_dispatcher(delivery_config($node, maildir_root => $root,
		smarthost => "127.0.0.1:$peer->{port}",
		dispatch => { STAGES => 'init smarthost dsn-route dsn-maildir dsn-smarthost' },
		extra => {
			smarthost => "PARALLELISM = 4\nRETRY_BASE = 1s\nRETRY_MAX = 1s\nMAX_LIFETIME = $lifetime\n",
		}));
}

sub bouncer
{
	return start_dispatcher(delivery_config($node, maildir_root => $root,
		dispatch => { STAGES => 'bounce' },
		extra => { bounce => "GATHER_WINDOW = 3s\nDSN_RATE_LIMIT = 3\nPARALLELISM = 1\nQUEUE_LIMIT = 1\n" }));
}

sub dsns { my ($who) = @_; return maildir_files($root, $who // $sender) }

sub at_bounce
{
	my ($where) = @_;
	return queue_count($node, "stage = 'bounce' AND status = 'pending' AND $where");
}

# 50 recipients, all refused with 550: exactly one DSN, listing all 50.
my $front = front('8s');
my @fifty = map { "gone$_\@remote.test" } 1 .. 50;
inject($node, to => \@fifty,
	headers => "From: <$sender>\r\nTo: <gone1\@remote.test>\r\nSubject: fifty\r\n");
ok(poll_until(sub { at_bounce('true') == 50 }, 90), 'the 50 failures wait at the bounce stage');
my $d = bouncer();
ok(poll_until(sub { scalar(dsns()) >= 1 && queue_count($node) == 0 }, 90),
	'50 failed recipients: a DSN arrives and the queue empties');
is(scalar(dsns()), 1, 'exactly one DSN for the 50 failures');
my ($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[0])));
is(scalar @$recipients, 50, 'the DSN lists 50 recipients');
is_deeply([ sort map { $_->{'final-recipient'} } @$recipients ],
	[ sort map { "rfc822; $_" } @fifty ], 'each failed recipient once');
ok(!grep({ $_->{status} ne '5.1.1' } @$recipients), 'each with Status 5.1.1');
like(dispatcher_log($d), qr/failure DSN to <\Q$sender\E> about 50 recipients/,
	'the bounce stage logs one DSN about 50 recipients');

# Failures at different times: gone@ now, slow@ when MAX_LIFETIME ends.
# slow@'s lifetime is an hour until gone51@ and gone52@ are answered (the
# bounce stage held back until both failed), then 8 s: it fails on its
# next retry, after their DSN.
is(stop_dispatcher($d), 0, 'the bounce stage\'s dispatcher stops');
is(stop_dispatcher($front), 0, 'the other dispatcher stops');
$front = front('1h');
inject($node, to => [ 'gone51@remote.test', 'gone52@remote.test', 'slow@remote.test' ],
	headers => "From: <$sender>\r\nTo: <slow\@remote.test>\r\nSubject: later\r\n");
ok(poll_until(sub { at_bounce("rcpt_to[1] IN ('gone51\@remote.test', 'gone52\@remote.test')") == 2 }, 90),
	'gone51@ and gone52@ failed');
$d = bouncer();
ok(poll_until(sub { scalar(dsns()) == 2 }, 90), 'their DSN arrives');
is(stop_dispatcher($front), 0, 'the dispatcher of slow@\'s retries stops');
$front = front('8s');
ok(poll_until(sub { scalar(dsns()) == 3 && queue_count($node) == 0 }, 90),
	'failures at two times: two more DSNs, nothing left in the queue');
my @later = map { [ map { $_->{'final-recipient'} } @{ (dsn_fields(parse_dsn(slurp($_))))[1] } ] }
  (dsns())[ 1, 2 ];
is_deeply([ sort @{ $later[0] } ], [ 'rfc822; gone51@remote.test', 'rfc822; gone52@remote.test' ],
	'the first lists the two that failed together');
is_deeply($later[1], ['rfc822; slow@remote.test'], 'the second the one that failed later');

# DSN_RATE_LIMIT = 3: of five failing messages from one sender, three DSNs.
for my $n (1 .. 5)
{
	inject($node, from => $flood, to => ["gone$n\@remote.test"],
		headers => "From: <$flood>\r\nTo: <gone$n\@remote.test>\r\nSubject: flood $n\r\n");
}
ok(poll_until(sub { queue_count($node) == 0 && scalar(dsns($flood)) == 3 }, 90),
	'five failures to one sender: three DSNs, nothing left in the queue');
is(scalar(dsns($flood)), 3, 'no more than DSN_RATE_LIMIT');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pepsi.event_log WHERE action = 'dsn_rate_limited'"
		  . " AND detail->>'sender' = '$flood' AND (detail->>'limit')::int = 3"),
	'2', 'each dropped DSN is recorded in pepsi.event_log');
my $dropped = () = dispatcher_log($d) =~ /DSN to <\Q$flood\E> about 1 recipient dropped: more than 3 DSNs/g;
is($dropped, 2, 'and logged by the bounce stage');
is($node->safe_psql('postgres', "SELECT sent FROM pepsi.dsn_rate WHERE sender = '$flood'"),
	'5', 'pepsi.dsn_rate counts every DSN the address was due this hour');

# The counter and the gathering are the pipeline's: other roles get an error.
my ($ret, $out, $err) = $node->psql('postgres',
	"SET ROLE pepsi_monitor; SELECT pepsi.dsn_rate_take('x\@y.test', 1)");
like($err, qr/permission denied/, 'pepsi_monitor cannot count DSNs');
($ret, $out, $err) = $node->psql('postgres', "SET ROLE pepsi_stage; SELECT pepsi.bounce_gather(1, 'bounce', 1)");
like($err, qr/row 1 is not running/, 'pepsi.bounce_gather refuses a row that is not running');

is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
is(stop_dispatcher($front), 0, 'and so does the other');
stop_process($peer);
done_testing();
