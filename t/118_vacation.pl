# pepsi-stage-vacation under pepsi-dispatch (RFC 3834): a notice set with
# pepsi.vacation_set answers a sender once per interval, a different
# sender separately, and never a list (List-Id), bulk (Precedence), an
# automatic message (Auto-Submitted), the null sender, a list or system
# sender or the address itself; the reply is a new message from the null
# sender with Auto-Submitted: auto-replied, In-Reply-To and References,
# delivered like any other, and only to mail that names the recipient in
# To or Cc (RFC 3834 2); the message itself is delivered too.  An
# administrator's per-address override (pepsi.config_set) works as well;
# vacation_set refuses bad input; vacation_unset ends the replies; the
# maintenance worker prunes the record of replies past their interval.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('vacation');
my $root = PostgreSQL::Test::Utils::tempdir();
my @friends = qw(friend@local.test friend2@local.test owner-list@local.test list-request@local.test);
make_mailbox($root, $_) for 'alice@local.test', 'bob@local.test', @friends;

# The owner's notice, and an administrator's for bob (the override layer).
$node->safe_psql('postgres',
	"SELECT pepsi.vacation_set('Alice\@Local.Test', E'I am away.\\nBack on Monday.', NULL, '1 hour')");
$node->safe_psql('postgres', join ';',
	"SELECT pepsi.config_set('address:bob\@local.test', 'stage-vacation', 'VACATION', 'yes')",
	"SELECT pepsi.config_set('address:bob\@local.test', 'stage-vacation', 'VACATION_MESSAGE', 'Bob is out.')",
	"SELECT pepsi.config_set('address:bob\@local.test', 'stage-vacation', 'VACATION_SUBJECT', 'Out of office')");

my $config = delivery_config($node, maildir_root => $root,
	extra => { init => "LOCAL_STAGE = vacation\n" });
open my $fh, '>>', $config or die;
print $fh "[stage-vacation]\nPROGRAM = pepsi-stage-vacation\nNEXT_STAGE = maildir\nREPLY_STAGE = init\n";
close $fh;
my $d = start_dispatcher($config);

my $n = 0;
sub send_to
{
	my ($to, %m) = @_;
	my $from = $m{from} // 'friend@local.test';
	$n++;
	my $headers = "From: <$from>\r\nTo: " . ($m{to_header} // "<$to>") . "\r\nSubject: hello $n\r\n"
	  . "Message-ID: <m$n\@local.test>\r\n" . ($m{headers} // '');
	inject($node, from => $from, to => [$to], headers => $headers);
}
sub settled { return poll_until(sub { queue_count($node) == 0 }, 60) }
sub replies { return maildir_files($root, $_[0] // 'friend@local.test') }

# The first message gets a reply; the second from the same sender does not.
send_to('alice@local.test', headers => "References: <earlier\@local.test>\r\n");
ok(settled(), 'settled');
my @replies = replies();
is(scalar @replies, 1, 'one reply');
my $reply = slurp($replies[0]);
like($reply, qr/^Return-Path: <>\r\n/, 'from the null sender');
like($reply, qr/^From: <alice\@local\.test>\r\n/m, 'From: the address written to');
like($reply, qr/^To: <friend\@local\.test>\r\n/m, 'To: the sender');
like($reply, qr/^Subject: Auto: hello 1\r\n/m, 'Subject: Auto: and the original');
like($reply, qr/^Auto-Submitted: auto-replied\r\n/m, 'Auto-Submitted: auto-replied');
like($reply, qr/^In-Reply-To: <m1\@local\.test>\r\n/m, 'In-Reply-To the original');
like($reply, qr/^References: <earlier\@local\.test>\r\n <m1\@local\.test>\r\n/m, 'References: its references and it');
like($reply, qr/\r\n\r\nI am away\.\r\nBack on Monday\.\r\n\z/, 'the notice, CRLF line ends');
is(scalar(maildir_files($root, 'alice@local.test')), 1, 'alice gets the message');

send_to('alice@local.test');
ok(settled(), 'settled');
is(scalar(replies()), 1, 'no second reply within the interval');
is(scalar(maildir_files($root, 'alice@local.test')), 2, 'alice gets the second message');
ok(file_shows($d->{log}, qr/<friend\@local\.test> already had a vacation reply within VACATION_INTERVAL/),
	'logged');

# Another sender is answered on its own.
send_to('alice@local.test', from => 'friend2@local.test');
ok(settled(), 'settled');
is(scalar(replies('friend2@local.test')), 1, 'friend2 gets a reply');

# Once the interval has passed, the first sender is answered again.
$node->safe_psql('postgres',
	"UPDATE pepsi.autoreply_sent SET sent_at = now() - interval '61 minutes' WHERE recipient = 'friend\@local.test'");
send_to('alice@local.test');
ok(settled(), 'settled');
is(scalar(replies()), 2, 'a new reply after the interval');

# Never to lists, bulk, automatic messages, the null sender, list or system senders, oneself.
my @silent = (
	[ 'List-Id', headers => "List-Id: <team.lists.local.test>\r\n" ],
	[ 'List-Unsubscribe', headers => "List-Unsubscribe: <mailto:leave\@local.test>\r\n" ],
	[ 'Precedence: bulk', headers => "Precedence: bulk\r\n" ],
	[ 'Precedence: list', headers => "Precedence: List\r\n" ],
	[ 'Auto-Submitted', headers => "Auto-Submitted: auto-generated\r\n" ],
	[ 'the null sender', from => '' ],
	[ 'owner-', from => 'owner-list@local.test' ],
	[ '-request', from => 'list-request@local.test' ],
	[ 'oneself', from => 'alice@local.test' ]);
$node->safe_psql('postgres', 'DELETE FROM pepsi.autoreply_sent');
my $before = scalar(replies());
for my $case (@silent)
{
	my ($name, %m) = @$case;
	send_to('alice@local.test', %m);
}
ok(settled(), 'settled');
is(scalar(replies()), $before, 'no reply to List-Id, List-*, Precedence, Auto-Submitted');
is(scalar(replies('owner-list@local.test')) + scalar(replies('list-request@local.test')), 0,
	'no reply to owner- and -request senders');
is(scalar(maildir_files($root, 'alice@local.test')), 4 + @silent, 'every message is still delivered');
my $log = slurp($d->{log});
like($log, qr/no vacation reply: a mailing list's message \(List-Id\)/, 'List-Id logged');
like($log, qr/no vacation reply: Precedence: bulk/, 'Precedence logged');
like($log, qr/no vacation reply: Auto-Submitted: auto-generated/, 'Auto-Submitted logged');
like($log, qr/no vacation reply: the null sender/, 'the null sender logged');
like($log, qr/no vacation reply: the responder's own address/, 'oneself logged');
# Auto-Submitted: no is a person writing.
send_to('alice@local.test', headers => "Auto-Submitted: no\r\n");
ok(settled(), 'settled');
is(scalar(replies()), $before + 1, 'Auto-Submitted: no is answered');

# RFC 3834 2: only mail written to the recipient, in To or Cc, not a
# list's copy or an alias's expansion that names someone else.
$node->safe_psql('postgres', 'DELETE FROM pepsi.autoreply_sent');
$before = scalar(replies());
send_to('alice@local.test', to_header => 'Team <team@local.test>, undisclosed-recipients:;');
ok(settled(), 'settled');
is(scalar(replies()), $before, 'no reply when alice is in neither To nor Cc');
ok(file_shows($d->{log}, qr/<alice\@local\.test>: no vacation reply: <alice\@local\.test> is not in To or Cc \(RFC 3834 2\)/),
	'logged');
send_to('alice@local.test', to_header => '<team@local.test>', headers => "Cc: \"Alice\" <Alice\@Local.Test>\r\n");
ok(settled(), 'settled');
is(scalar(replies()), $before + 1, 'in Cc, in any case: answered');

# The administrator's per-address override for bob.
send_to('bob@local.test');
ok(settled(), 'settled');
my ($bob) = grep { slurp($_) =~ /^From: <bob\@local\.test>/m } replies();
ok($bob, 'bob\'s override answers');
like(slurp($bob // $replies[0]), qr/^Subject: Out of office\r\n.*\r\n\r\nBob is out\.\r\n\z/ms,
	'with his subject and message');

# vacation_set refuses bad input; vacation_unset ends it.
for my $bad (
	[ "'alice\@local.test', ''", qr/needs a message/ ],
	[ "'alice\@local.test', 'x', E'two\\nlines'", qr/invalid vacation subject/ ],
	[ "'alice\@local.test', 'x', NULL, '0 seconds'", qr/invalid vacation interval/ ],
	[ "E'al\\x01ice\@local.test', 'x'", qr/control character/ ],
	[ "'nobody', 'x'", qr/invalid mailbox address/ ])
{
	my ($ret, $out, $err) = $node->psql('postgres', "SELECT pepsi.vacation_set($bad->[0])");
	like($err, $bad->[1], "vacation_set($bad->[0]) is refused");
}
is($node->safe_psql('postgres', "SELECT pepsi.vacation_unset('alice\@local.test')"), 't', 'unset');
$before = scalar(replies());
send_to('alice@local.test', from => 'friend@local.test');
ok(settled(), 'settled');
is(scalar(replies()), $before, 'no reply once unset');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM pepsi.event_log WHERE action IN ('vacation_set', 'vacation_unset')"), '2',
	'both audited');

# The maintenance worker forgets whom a notice answered once the interval
# has passed (pepsi.autoreply_prune), and only then.
$node->append_conf('postgresql.conf', "pepsi.body_gc_interval = 1\n");
$node->reload;
$node->safe_psql('postgres', q{INSERT INTO pepsi.autoreply_sent (responder, recipient, sent_at, keep_until) VALUES
	('zed@local.test', 'past@remote.test', now() - interval '2 days', now() - interval '1 day'),
	('zed@local.test', 'current@remote.test', now(), now() + interval '1 day')});
ok(poll_until(sub {
		$node->safe_psql('postgres',
			"SELECT count(*) FROM pepsi.autoreply_sent WHERE recipient = 'past\@remote.test'") == 0
	}, 60),
	'the maintenance worker pruned a reply record past its interval');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM pepsi.autoreply_sent WHERE recipient = 'current\@remote.test'"), '1',
	'and kept one within it');

stop_dispatcher($d);
done_testing();
