# The resolver layer (common/dns/dns.c) against the tests' DNS server
# (t/lib/TestDNS.pm): every record type Pepsi asks for, NXDOMAIN and
# NODATA, CNAME chains, a TXT record of many strings and too big for UDP,
# a server that never answers (the per-lookup timeout, and the other
# lookups of the same loop answered meanwhile), SERVFAIL, a reply that is
# no DNS message, and names libunbound must not be given.  The same
# through the blocking form.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use TestDNS;

my $resolve = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-test-resolve';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $dns = TestDNS->new($tmp);
my $big = 'x' x 3000;

$dns->zone(<<"ZONE" . TestDNS::txt('big.example.com.', $big));
example.com. 300 IN TXT "v=spf1 " "ip4:192.0.2.1 -all"
example.com. 300 IN MX 10 mx.example.com.
example.com. 300 IN MX 20 mx2.example.com.
mx.example.com. 300 IN A 192.0.2.1
mx.example.com. 300 IN AAAA 2001:db8::1
alias.example.com. 300 IN CNAME mx.example.com.
1.2.0.192.in-addr.arpa. 300 IN PTR mx.example.com.
1.0.0.127.in-addr.arpa. 300 IN PTR localhost.example.com.
; silent slow.example.com
; servfail broken.example.com
; garbage junk.example.com
ZONE

my $conf = "$tmp/pepsi.conf";
PostgreSQL::Test::Utils::append_to_file($conf,
	"[pepsi]\nDNS_FORWARDER = " . $dns->forwarder . "\nDNS_TIMEOUT = 1s\n");

# MX records come in the server's order: compare them sorted.
sub sorted_records
{
	my ($line) = @_;
	my ($head, @records) = split / /, $line;
	my @status = splice(@records, 0, 2);

	return join(' ', $head, @status, sort @records);
}

sub lookups
{
	my (@args) = @_;
	my $out = `$resolve -c $conf @args 2>&1`;

	is($?, 0, 'pepsi-test-resolve exits 0') or diag($out);
	return map { / MX / ? sorted_records($_) : $_ } split /\n/, $out;
}

my $start = time;
my @lines = lookups(
	qw(TXT:slow.example.com TXT:example.com MX:example.com A:alias.example.com
	  AAAA:mx.example.com PTR:1.2.0.192.in-addr.arpa PTR:1.0.0.127.in-addr.arpa
	  A:nope.example.com A:example.com TXT:big.example.com TXT:broken.example.com
	  TXT:junk.example.com A:bad..name.example.com));
my $elapsed = time - $start;
is($lines[0], 'slow.example.com TXT timeout', 'a name never answered times out');
is($lines[1], 'example.com TXT ok "v=spf1 ip4:192.0.2.1 -all"(25)', 'TXT strings are joined');
is($lines[2], 'example.com MX ok 10:mx.example.com 20:mx2.example.com', 'MX');
is($lines[3], 'alias.example.com A ok 192.0.2.1', 'a CNAME is followed');
is($lines[4], 'mx.example.com AAAA ok 2001:db8::1', 'AAAA');
is($lines[5], '1.2.0.192.in-addr.arpa PTR ok mx.example.com', 'PTR');
is($lines[6], '1.0.0.127.in-addr.arpa PTR ok localhost.example.com',
	'the forwarder, not libunbound, answers for 127.0.0.0/8');
is($lines[7], 'nope.example.com A nxdomain', 'NXDOMAIN');
is($lines[8], 'example.com A ok', 'NODATA is an answer with no record');
is($lines[9], "big.example.com TXT ok \"$big\"(3000)",
	'a TXT record too big for UDP comes over TCP');
is($lines[10], 'broken.example.com TXT tempfail', 'SERVFAIL is a temporary failure');
is($lines[11], 'junk.example.com TXT tempfail',
	'a reply that is no DNS message is a temporary failure');
is($lines[12], 'bad..name.example.com A nxdomain', 'a name with an empty label is never asked: it cannot exist');
# The lookups ran together, the silent one costing its timeout (1 s) once:
# how long they took is bench/timing's.
note(sprintf('timing dns_lookups_together_seconds %.3f', $elapsed));

# The loop's cache: asked again once answered, the same answers, at once;
# a lookup that timed out is not kept.
$start = time;
my @twice = map { / MX / ? sorted_records($_) : $_ }
  split /\n/, `$resolve -a -c $conf TXT:example.com MX:example.com A:nope.example.com PTR:1.2.0.192.in-addr.arpa 2>&1`;
is_deeply([ @twice[ 4 .. 7 ] ], [ @twice[ 0 .. 3 ] ], 'the cache gives the answers libunbound gave');
is($twice[8], 'cache 4', 'all four asked again were answered by the cache');
@twice = split /\n/, `$resolve -a -c $conf TXT:slow.example.com 2>&1`;
is_deeply(\@twice, [ 'slow.example.com TXT timeout', 'slow.example.com TXT timeout', 'cache 0' ],
	'a timeout is not cached: it is asked again, and times out again');

# The blocking form's cache (a stage worker's: a relay worker asks the
# same MX and _mta-sts TXT for every message to a domain): the same
# answers, from the cache, not from libunbound's thread; an NXDOMAIN is
# kept (for its TTL, a minute at most), a timeout is not.
@twice = map { / MX / ? sorted_records($_) : $_ }
  split /\n/,
  `$resolve -s -a -c $conf TXT:example.com MX:example.com A:nope.example.com TXT:slow.example.com 2>&1`;
is_deeply([ @twice[ 4 .. 7 ] ], [ @twice[ 0 .. 3 ] ], 'the blocking form\'s cache gives the answers libunbound gave');
is($twice[8], 'cache 3', 'the blocking form answers three of four again from its cache (not the timeout)');

# The blocking form.
@lines = map { chomp; sorted_records($_) }
  `$resolve -s -c $conf MX:example.com TXT:slow.example.com A:nope.example.com`;
is_deeply(
	\@lines,
	[
		'example.com MX ok 10:mx.example.com 20:mx2.example.com',
		'slow.example.com TXT timeout',
		'nope.example.com A nxdomain'
	],
	'the blocking form gives the same answers, and times out too');

# A bad forwarder is refused with the option's name.
PostgreSQL::Test::Utils::append_to_file("$tmp/bad.conf",
	"[pepsi]\nDNS_FORWARDER = 127.0.0.1\@99999\n");
my $out = `$resolve -c $tmp/bad.conf A:example.com 2>&1`;
isnt($?, 0, 'a bad DNS_FORWARDER is refused');
like($out, qr/DNS_FORWARDER: "99999" is not a port/, 'naming the option and the problem');

$dns->stop;
done_testing();
