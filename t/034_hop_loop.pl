# A mail loop between two routes stops at the hop limit with a bounce: the
# route for remote.test sends its mail to a smarthost that is this very
# pepsi-ingress, so a message goes round ingress -> route -> smarthost ->
# ingress, one Received field more each time, until ingress refuses it
# with 554 5.4.6 ([ingress] MAX_HOPS); the smarthost stage bounces it and
# the sender gets one DSN saying so.  Nothing stays in the queue.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');

my $node = delivery_node('hop_loop');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $max_hops = 6;
make_mailbox($root, 'alice@local.test');

# The smarthost of remote.test is our own listener: a loop of two routes.
my $config = delivery_config($node, maildir_root => $root, smarthost => "127.0.0.1:$port");
PostgreSQL::Test::Utils::append_to_file($config, <<"CONF");
[ingress]
AUTHSERV_ID = mx.pepsi.test
DISPATCH_WAKE_INTERVAL = 10ms
MAX_HOPS = $max_hops
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
CONF

my $ingress_log = "$tmp/ingress.log";
my $ingress_pid = fork;
die "fork: $!" unless defined $ingress_pid;
if ($ingress_pid == 0)
{
	open STDIN, '<', '/dev/null';
	open STDOUT, '>>', $ingress_log;
	open STDERR, '>&', \*STDOUT;
	exec pepsi_bin('pepsi-ingress'), '-c', $config or die "exec: $!";
}
poll_until(sub {
	my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 1);
	$s->close if $s;
	return $s;
}, 20) or die "pepsi-ingress did not start:\n" . (slurp($ingress_log) // '');
my $d = start_dispatcher($config);

my $out = '';
IPC::Run::run([ 'swaks', '--server', "127.0.0.1:$port", '--ehlo', 'client.test',
		'--from', 'alice@local.test', '--to', 'loop@remote.test',
		'--header', 'Subject: round and round' ],
	'<', \undef, '>', \$out, '2>&1', IPC::Run::timeout(60));
like($out, qr/<-\s+250 .*queued/m, 'the first pass is accepted') or diag($out);

my @dsns;
ok(poll_until(sub { @dsns = maildir_files($root, 'alice@local.test'); @dsns && queue_count($node) == 0 }, 120),
	'the loop ends: a DSN for the sender, nothing left in the queue');
is(scalar @dsns, 1, 'exactly one DSN');
my ($message, $recipients) = dsn_fields(parse_dsn(slurp($dsns[0])));
is($recipients->[0]{'final-recipient'}, 'rfc822; loop@remote.test', 'about the looping recipient');
is($recipients->[0]{status}, '5.4.6', 'Status 5.4.6: routing loop detected');
like($recipients->[0]{'diagnostic-code'}, qr/^smtp; 554 5\.4\.6 .*too many hops/,
	'Diagnostic-Code: the refusal by ingress');
my $ingress_said = slurp($ingress_log) // '';
like($ingress_said, qr/: reject: END-OF-MESSAGE from [^\s\[]+\[127\.0\.0\.1\]: 554 5\.4\.6 .*; from=<alice\@local\.test> /,
	'ingress logged the refusal with the client and the sender');
my $received = () = slurp($dsns[0]) =~ /^Received: from /mg;
ok($received >= $max_hops, "the returned message carries the $max_hops Received fields that stopped it")
  or diag("Received fields in the DSN: $received");
is($node->safe_psql('postgres', "SELECT count(*) FROM pepsi.workqueue"), '0', 'no row left behind');

is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
stop_process({ pid => $ingress_pid });
done_testing();
