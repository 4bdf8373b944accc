# pepsi-stage-relay-to-internet against hostile or broken DNS answers and
# peers, on a simulated internet (TestDNS, t/bin/smtp-peer on 127.0.0.x):
# an MX that is this host, by name and by address (5.4.6 at once), a
# domain with 1,000 MX records (answered over TCP after a truncated UDP
# answer), an answer that is no DNS message, a peer sending 10 MB of reply
# text and a peer that stalls in the middle of its greeting (the reply
# timeout).  Each ends in a clear bounce or deferral with the reason in the
# DSN and the log, and the worker goes on delivering.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

my $node = delivery_node('relay_internet_bad_input');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);
sub dsns { return maildir_files($root, $sender) }

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $good = start_peer('--address', '127.0.0.3', '--port', $port);
my $flood = start_peer('--address', '127.0.0.11', '--port', $port, '--greeting-flood', 10_000_000);
my $stall = start_peer('--address', '127.0.0.12', '--port', $port, '--stall-greeting');
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
my $zone = <<'EOF';
good.test.            300 IN MX 10 mx.good.test.
mx.good.test.         300 IN A  127.0.0.3
loop.test.            300 IN MX 10 mx.pepsi.test.
loop.test.            300 IN MX 20 mx.good.test.
loopaddr.test.        300 IN MX 10 mx.loopaddr.test.
mx.loopaddr.test.     300 IN A  127.0.0.1
flood.test.           300 IN MX 10 mx.flood.test.
mx.flood.test.        300 IN A  127.0.0.11
stall.test.           300 IN MX 10 mx.stall.test.
mx.stall.test.        300 IN A  127.0.0.12
many.test.            300 IN MX 5 mx.good.test.
; garbage junk.test
EOF
$zone .= "many.test. 300 IN MX " . (10 + $_) . " mx$_.many.test.\n" for 1 .. 999;
$dns->zone($zone);

# The listener at 127.0.0.1 on the MX port makes that address this host's.
my $config = delivery_config($node, maildir_root => $root, internet => $port,
	pepsi => { DNS_FORWARDER => $dns->forwarder },
	extra => { smarthost => "TIMEOUT = 2s\nDELAY_DSN_AFTER = 0s\nRETRY_BASE = 10m\n" },
	sections => "[listener-smtp]\nADDRESS = 127.0.0.1\nPORT = $port\n");
my $d = start_dispatcher($config);
my $notify_delay = '{"dsn":{"rcpt":[{"notify":"DELAY,FAILURE"}]}}';

sub send_to
{
	my ($to, %o) = @_;
	return inject($node, to => [$to], state => $o{state},
		headers => "From: <$sender>\r\nTo: <$to>\r\nSubject: to $to\r\n");
}
sub dsn_for
{
	my ($to) = @_;
	for my $file (dsns())
	{
		my ($message, $recipients) = dsn_fields(parse_dsn(slurp($file)));
		return $recipients->[0] if $recipients->[0]{'final-recipient'} eq "rfc822; $to";
	}
	return undef;
}
sub delivered { my ($to) = @_; return scalar grep { $_->{env} =~ /<\Q$to\E>/ } peer_messages($good) }

# This host as the best MX, by name: 5.4.6, never tried.
send_to('user@loop.test');
ok(poll_until(sub { dsn_for('user@loop.test') }), 'MX loop by name: a DSN at once');
my $r = dsn_for('user@loop.test');
is($r->{status}, '5.4.6', 'Status 5.4.6');
like($r->{'diagnostic-code'}, qr/loops back to myself/, 'the reason in the DSN');
is(delivered('user@loop.test'), 0, 'and the lower MX was not used');
like(dispatcher_log($d), qr/to=<user\@loop\.test>, .*status=bounced \(mail for loop\.test loops back to myself/,
	'and in the log');

# By address: the MX host's address is one we listen on.
send_to('user@loopaddr.test');
ok(poll_until(sub { dsn_for('user@loopaddr.test') }), 'MX loop by address: a DSN');
is(dsn_for('user@loopaddr.test')->{status}, '5.4.6', 'Status 5.4.6');

# 1,000 MX records: a truncated UDP answer, then TCP; the best one is used.
send_to('user@many.test');
ok(poll_until(sub { delivered('user@many.test') == 1 }), '1,000 MX records: delivered to the best');

# An answer that is no DNS message: deferred, with a delay DSN saying why.
send_to('user@junk.test', state => $notify_delay);
ok(poll_until(sub { dsn_for('user@junk.test') }), 'a garbage DNS answer: a delay DSN');
$r = dsn_for('user@junk.test');
is($r->{action}, 'delayed', 'Action: delayed');
like($r->{'diagnostic-code'}, qr/MX lookup of junk\.test/, 'naming the failed MX lookup');
like(dispatcher_log($d), qr/to=<user\@junk\.test>, .*status=deferred \(the MX lookup of junk\.test/,
	'and the log line');

# 10 MB of reply text: cut off, deferred with the reason.
send_to('user@flood.test', state => $notify_delay);
ok(poll_until(sub { dsn_for('user@flood.test') }, 120), '10 MB of greeting: a delay DSN');
like(dsn_for('user@flood.test')->{'diagnostic-code'}, qr/reply longer than \d+ bytes/, 'saying the reply was too long');
like(dispatcher_log($d), qr/to=<user\@flood\.test>, .*status=deferred \([^)]*reply longer than/, 'and the log says so');

# A peer that stalls in the middle of its greeting: the reply timeout.
send_to('user@stall.test', state => $notify_delay);
ok(poll_until(sub { dsn_for('user@stall.test') }, 120), 'a stalled greeting: a delay DSN');
like(dsn_for('user@stall.test')->{'diagnostic-code'}, qr/timed out talking to mx\.stall\.test/, 'saying it timed out');

# The workers are not stuck: mail still flows.
send_to('after@good.test');
ok(poll_until(sub { delivered('after@good.test') == 1 }), 'the next message is delivered');
is($node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue WHERE status IN ('failed', 'timeout')"),
	0, 'no row failed or timed out');
is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
done_testing();
