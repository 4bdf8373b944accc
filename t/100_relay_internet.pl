# pepsi-stage-relay-to-internet on a simulated internet: the test's DNS
# server (TestDNS) serves MX/A records pointing at 127.0.0.x, where the
# scripted peer t/bin/smtp-peer listens.  MX preference and fallback when
# the best MX refuses connections (pepsi.dns_address marks the address),
# three recipients of one domain in one transaction with a 451 for one of
# them (the others delivered, it alone retried), a 550 (a DSN carrying the
# remote reply), a null MX (5.1.10 at once), an IDN domain (looked up and
# sent in A-labels), no MX (the implicit MX) and a row for two domains
# (split, one transaction each).

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

my $node = delivery_node('relay_internet');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);
sub dsns { return maildir_files($root, $sender) }

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $peer = start_peer('--address', '127.0.0.3', '--port', $port,
	'--rcpt-first', 'busy@=1=451 4.2.1 mailbox busy, try later',
	'--rcpt', 'gone@=550 5.1.1 <gone@three.test>: no such user here');
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
$dns->zone(<<'EOF');
pref.test.              300 IN MX 10 mx1.pref.test.
pref.test.              300 IN MX 20 mx2.pref.test.
mx1.pref.test.          300 IN A  127.0.0.2
mx2.pref.test.          300 IN A  127.0.0.3
three.test.             300 IN MX 5 mx.three.test.
mx.three.test.          300 IN CNAME alias.three.test.
alias.three.test.       300 IN A  127.0.0.3
null.test.              300 IN MX 0 .
xn--bcher-kva.test.     300 IN MX 10 mx.xn--bcher-kva.test.
mx.xn--bcher-kva.test.  300 IN A  127.0.0.3
implicit.test.          300 IN A  127.0.0.3
EOF

my $config = delivery_config($node, maildir_root => $root, internet => $port,
	pepsi => { DNS_FORWARDER => $dns->forwarder });
my $d = start_dispatcher($config);

sub delivered_to
{
	my ($re) = @_;
	return scalar grep { $_->{env} =~ $re } peer_messages($peer);
}

# MX preference: mx1 refuses connections, mx2 takes the message.
inject($node, to => ['user@pref.test'], headers => "From: <$sender>\r\nTo: <user\@pref.test>\r\nSubject: pref\r\n");
ok(poll_until(sub { delivered_to(qr/RCPT TO:<user\@pref\.test>/) == 1 }),
	'the best MX refused the connection: the message went to the second');
ok(poll_until(sub { queue_count($node) == 0 }), 'and left the queue');
is($node->safe_psql('postgres',
		"SELECT failures > 0 AND next_retry > now() FROM pepsi.dns_address WHERE host = 'mx1.pref.test'"),
	't', 'pepsi.dns_address marks the refusing address, with a time for its next try');
# (A delivery's success is recorded by the worker's next delivery, or once it is idle.)
ok(poll_until(sub { $node->safe_psql('postgres',
		"SELECT failures = 0 AND last_success IS NOT NULL FROM pepsi.dns_address WHERE host = 'mx2.pref.test'") eq 't' }),
	'and the working one as working');
like(dispatcher_log($d), qr/to=<user\@pref\.test>, relay=mx2\.pref\.test\[127\.0\.0\.3\]:$port, .*status=sent/,
	'the delivery log line names the MX host, its address and port');

# Three recipients of one domain, one transaction; busy@ gets a 451 once, gone@ a 550.
inject($node, to => [ 'a@three.test', 'busy@three.test', 'gone@three.test' ],
	headers => "From: <$sender>\r\nTo: <a\@three.test>\r\nSubject: three\r\n");
ok(poll_until(sub { delivered_to(qr/busy\@three\.test/) == 1 && queue_count($node) == 0 }),
	'the deferred recipient was delivered on its retry');
my @three = grep { $_->{data} =~ /Subject: three/ } peer_messages($peer);
is(scalar @three, 2, 'two transactions carried the message');
like($three[0]{env}, qr/RCPT TO:<a\@three\.test>/, 'the first to a@');
is(scalar(() = $three[0]{env} =~ /RCPT TO/g), 1, 'alone: busy@ was deferred and gone@ refused in it');
like($three[1]{env}, qr/RCPT TO:<busy\@three\.test>/, 'the retry carried busy@');
my ($transaction) = grep { /RCPT TO:<a\@three\.test>/ } split /-> MAIL FROM/, slurp("$peer->{dir}/transcript");
like($transaction, qr/RCPT TO:<a\@three\.test>.*RCPT TO:<busy\@three\.test>.*RCPT TO:<gone\@three\.test>/s,
	'the three RCPTs went in one transaction');
ok(poll_until(sub { scalar(dsns()) == 1 }), 'gone@ bounced: one DSN');
my ($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[0])));
is($recipients->[0]{'final-recipient'}, 'rfc822; gone@three.test', 'for gone@');
is($recipients->[0]{status}, '5.1.1', 'with the remote status');
like($recipients->[0]{'diagnostic-code'}, qr/^smtp; 550 5\.1\.1 <gone\@three\.test>: no such user here/,
	'and the remote reply');
is($recipients->[0]{'remote-mta'}, 'dns; peer.test', 'Remote-MTA: the MX host, by its greeting');

# A null MX: bounced at once, 5.1.10.
inject($node, to => ['user@null.test'], headers => "From: <$sender>\r\nTo: <user\@null.test>\r\nSubject: null\r\n");
ok(poll_until(sub { scalar(dsns()) == 2 && queue_count($node) == 0 }), 'null MX: a DSN at once');
($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[1])));
is($recipients->[0]{status}, '5.1.10', 'Status: 5.1.10 (RFC 7505)');
like($recipients->[0]{'diagnostic-code'}, qr/null MX/, 'the reason names the null MX');

# An IDN domain: looked up and sent as its A-label.
inject($node, to => ["user\@b\x{c3}\x{bc}cher.test"],
	headers => "From: <$sender>\r\nTo: <user\@xn--bcher-kva.test>\r\nSubject: idn\r\n");
ok(poll_until(sub { delivered_to(qr/RCPT TO:<user\@xn--bcher-kva\.test>/) == 1 }),
	'an IDN domain: its MX found through the A-label, the RCPT in A-labels');

# No MX: the domain's own address (the implicit MX).
inject($node, to => ['user@implicit.test'], headers => "From: <$sender>\r\nTo: <user\@implicit.test>\r\nSubject: implicit\r\n");
ok(poll_until(sub { delivered_to(qr/RCPT TO:<user\@implicit\.test>/) == 1 }),
	'no MX record: delivered to the domain\'s own address');

# Two domains in one row: split, one transaction each.
inject($node, to => [ 'x@three.test', 'y@implicit.test', 'z@three.test' ],
	headers => "From: <$sender>\r\nTo: <x\@three.test>\r\nSubject: split\r\n");
ok(poll_until(sub { scalar(grep { $_->{data} =~ /Subject: split/ } peer_messages($peer)) == 2 && queue_count($node) == 0 }),
	'a row for two domains: two transactions');
my ($both) = grep { $_->{env} =~ /x\@three\.test/ } grep { $_->{data} =~ /Subject: split/ } peer_messages($peer);
like($both->{env}, qr/z\@three\.test/, 'the two recipients of one domain shared theirs');

# A bounce (null sender) to two recipients, one refused: delivered to the
# other, the refused one dropped (a bounce is never bounced).
inject($node, from => '', to => [ 'n1@three.test', 'gone@three.test' ],
	headers => "From: <>\r\nTo: <n1\@three.test>\r\nSubject: null sender\r\n");
ok(poll_until(sub { delivered_to(qr/RCPT TO:<n1\@three\.test>/) == 1 && queue_count($node) == 0 }),
	'a null-sender message: delivered to one recipient, the refused one dropped');
like(dispatcher_log($d), qr/to=<gone\@three\.test>, [^\n]*status=bounced \([^\n]*a bounce is never bounced/,
	'with a log line for the dropped one');

is(scalar(dsns()), 2, 'no other DSN');
is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
done_testing();
