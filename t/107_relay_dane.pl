# DANE (RFC 7672) in pepsi-stage-relay-to-internet: a DNSSEC-signed zone
# (ldns-keygen, ldns-signzone) served by nsd, whose key is the resolver's
# trust anchor ([pepsi] DNS_TRUST_ANCHOR), so that the MX and TLSA
# answers are validated by libunbound; scripted peers with certificates of
# t/bin/dane-certs.
#   DANE-EE(3) matching the peer's key: delivered "dane verified";
#   a TLSA record of another key: deferred, nothing sent, never in clear;
#   DANE-TA(2) naming the CA of an expired certificate: deferred, the
#     reason saying it expired (certificate-expired in state.tls);
#   only a TLSA record of an unknown usage: TLS without authentication;
#   a peer without STARTTLS under DANE: deferred, nothing sent in clear;
#   a secure MX and TLSA record (of another key) but an MX host whose
#   address is not DNSSEC-secure (a CNAME into an unsigned zone): no DANE
#   (RFC 7672 2.2.2), delivered as opportunistic TLS.
# The web page's destinations view shows each domain's TLS policy and
# its last outcome, as the relay recorded them; pepsi.tls_aggregate counts
# the sessions for TLS reports.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('relay_dane');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

my %hash = map { split / / } split /\n/, `$ENV{PEPSI_TOP}/t/bin/dane-certs $tmp`;
die 'dane-certs failed' unless $hash{ee} && $hash{ta} && $hash{other};

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $good = start_peer('--address', '127.0.0.5', '--port', $port,
	'--tls-cert', "$tmp/leaf.pem", '--tls-key', "$tmp/leaf-key.pem");
my $expired = start_peer('--address', '127.0.0.6', '--port', $port,
	'--tls-cert', "$tmp/expired.pem", '--tls-key', "$tmp/expired-key.pem");
my $clear = start_peer('--address', '127.0.0.7', '--port', $port);

# The signed zone.
my $zone = <<"EOF";
\$ORIGIN dane.test.
\$TTL 300
@ IN SOA ns.dane.test. hostmaster.dane.test. 1 3600 600 86400 300
@ IN NS ns.dane.test.
ns IN A 127.0.0.1
match IN MX 10 mx.match
mx.match IN A 127.0.0.5
_$port._tcp.mx.match IN TLSA 3 1 1 $hash{ee}
mismatch IN MX 10 mx.mismatch
mx.mismatch IN A 127.0.0.5
_$port._tcp.mx.mismatch IN TLSA 3 1 1 $hash{other}
expired IN MX 10 mx.expired
mx.expired IN A 127.0.0.6
_$port._tcp.mx.expired IN TLSA 2 0 1 $hash{ta}
unknown IN MX 10 mx.unknown
mx.unknown IN A 127.0.0.5
_$port._tcp.mx.unknown IN TLSA 4 1 1 $hash{ee}
clear IN MX 10 mx.clear
mx.clear IN A 127.0.0.7
_$port._tcp.mx.clear IN TLSA 3 1 1 $hash{ee}
insecure IN MX 10 mx.insecure
mx.insecure IN CNAME mx.plain.test.
_$port._tcp.mx.insecure IN TLSA 3 1 1 $hash{other}
EOF
# An unsigned zone beside it (no trust anchor covers it: insecure).
my $plain = <<"EOF";
\$ORIGIN plain.test.
\$TTL 300
@ IN SOA ns.plain.test. hostmaster.plain.test. 1 3600 600 86400 300
@ IN NS ns.plain.test.
ns IN A 127.0.0.1
mx IN A 127.0.0.5
EOF
my $zdir = PostgreSQL::Test::Utils::tempdir();
PostgreSQL::Test::Utils::append_to_file("$zdir/dane.test.zone", $zone);
PostgreSQL::Test::Utils::append_to_file("$zdir/plain.test.zone", $plain);
my $key = `cd $zdir && ldns-keygen -a ECDSAP256SHA256 -k dane.test`;
chomp $key;
system("cd $zdir && ldns-signzone dane.test.zone $key") == 0 or die 'ldns-signzone failed';
my $nsd = start_server('nsd', sub {
	my ($dns_port, $dir) = @_;
	PostgreSQL::Test::Utils::append_to_file("$dir/nsd.conf", <<"EOF");
server:
  ip-address: 127.0.0.1\@$dns_port
  username: ""
  chroot: ""
  zonesdir: "$zdir"
  zonelistfile: "$dir/zone.list"
  database: ""
  pidfile: "$dir/nsd.pid"
  xfrdfile: "$dir/xfrd.state"
  logfile: "$dir/nsd.log"
  verbosity: 1
remote-control:
  control-enable: no
zone:
  name: dane.test
  zonefile: "$zdir/dane.test.zone.signed"
zone:
  name: plain.test
  zonefile: "$zdir/plain.test.zone"
EOF
	return ('nsd', '-d', '-c', "$dir/nsd.conf");
});

my $config = delivery_config($node, maildir_root => $root, internet => $port,
	pepsi => { DNS_FORWARDER => "127.0.0.1\@$nsd->{port}", DNS_TRUST_ANCHOR => "$zdir/$key.ds" },
	extra => { smarthost => "MTA_STS = no\nRETRY_BASE = 60s\nRETRY_MAX = 60s\n" });
my $d = start_dispatcher($config);

my %id;
for my $name (qw(match mismatch expired unknown clear insecure))
{
	$id{$name} = inject($node, to => ["user\@$name.dane.test"],
		headers => "From: <$sender>\r\nTo: <user\@$name.dane.test>\r\nSubject: to $name\r\n");
}

sub sent_to
{
	my ($peer, $name) = @_;
	return scalar grep { $_->{env} =~ /RCPT TO:<user\@\Q$name\E\.dane\.test>/ } peer_messages($peer);
}

sub paused_state
{
	my ($id, $path) = @_;
	return poll_until(sub {
		$node->safe_psql('postgres',
			"SELECT state #>> '{$path}' FROM pepsi.workqueue WHERE id = $id AND status = 'paused'") });
}

ok(poll_until(sub { sent_to($good, 'match') == 1 }), 'DANE-EE matching the key: delivered');
ok(poll_until(sub { dispatcher_log($d) =~ /to=<user\@match\.dane\.test>.*status=sent.*tls=TLS\S* \S+ verified, tls_policy=dane verified \(usage 3\)/ }),
	'logged as dane verified');

like(paused_state($id{mismatch}, 'last_error'), qr/refused by the dane policy: the certificate of mx\.mismatch\.dane\.test/,
	'a TLSA record of another key: deferred, and last_error says why');
is(paused_state($id{mismatch}, 'tls,result'), 'validation-failure', 'state.tls: validation-failure');
is(sent_to($good, 'mismatch'), 0, 'nothing was sent');
unlike(slurp("$good->{dir}/transcript"), qr/RCPT TO:<user\@mismatch/, 'not even the envelope');

like(paused_state($id{expired}, 'last_error'), qr/certificate has expired/,
	'DANE-TA with an expired certificate: deferred with the reason');
is(paused_state($id{expired}, 'tls,result'), 'certificate-expired', 'state.tls: certificate-expired');
is(sent_to($expired, 'expired'), 0, 'nothing was sent');

ok(poll_until(sub { sent_to($good, 'unknown') == 1 }), 'only a TLSA record of an unknown usage: delivered');
ok(poll_until(sub { dispatcher_log($d) =~ /to=<user\@unknown\.dane\.test>.*status=sent.*tls=TLS\S* \S+ unverified, tls_policy=dane-encrypt/ }),
	'over TLS, unauthenticated (RFC 7672 2.2)');

like(paused_state($id{clear}, 'last_error'), qr/does not offer STARTTLS, which the dane policy requires/,
	'a DANE host without STARTTLS: deferred');
is(paused_state($id{clear}, 'tls,result'), 'starttls-not-supported', 'state.tls: starttls-not-supported');
unlike(slurp("$clear->{dir}/transcript"), qr/MAIL FROM/, 'nothing was sent in clear');

ok(poll_until(sub { sent_to($good, 'insecure') == 1 }),
	'a secure TLSA record but an insecure address of the MX host: delivered (no DANE)');
ok(poll_until(sub { dispatcher_log($d) =~ /to=<user\@insecure\.dane\.test>.*status=sent.*tls_policy=opportunistic/ }),
	'as opportunistic TLS (RFC 7672 2.2.2)');

# The web page's destinations view (pepsi.destination_overview, what
# /api/destinations returns) shows each destination's TLS policy and what
# it gave, recorded by the relay with the delivery's outcome.
sub destination_tls
{
	my ($name, $pattern) = @_;
	my $found = '';
	poll_until(sub {
		$found = $node->safe_psql('postgres',
			"SELECT tls_policy || ' | ' || coalesce(tls_outcome, '') FROM pepsi.destination_overview()"
			  . " WHERE domain = '$name.dane.test'");
		$found =~ $pattern;
	});
	return $found;
}
like(destination_tls('match', qr/^dane \| dane verified/), qr/^dane \| dane verified \(usage 3\)$/,
	'the destinations view: a domain delivered to with DANE shows DANE, verified');
like(destination_tls('mismatch', qr/^dane \| ./), qr/^dane \| (?!dane verified).+/,
	'... one whose TLSA record names another key: DANE, and what failed');
like(destination_tls('unknown', qr/^dane-encrypt/), qr/^dane-encrypt \| \S/,
	'... only a TLSA record of an unknown usage: DANE, encryption only');
like(destination_tls('insecure', qr/^opportunistic/), qr/^opportunistic \| \S/,
	'... an insecure address of the MX host: opportunistic');

# TLS reports (RFC 8460): each session is counted under the tlsa policy
# with its records, a failure with its result type (pepsi.tls_aggregate,
# for pepsi-tlsrpt).
my $tls_sql = "SELECT string_agg(format('%s %s %s %s', policy_domain, policy_type,"
  . " coalesce(nullif(result_type, ''), 'ok'), policy_string), '; ' ORDER BY policy_domain)"
  . " FROM pepsi.tls_aggregate WHERE policy_domain IN ('match.dane.test', 'mismatch.dane.test',"
  . " 'expired.dane.test', 'clear.dane.test')";
my $tls_want = lc("clear.dane.test tlsa starttls-not-supported 3 1 1 $hash{ee}; "
	  . "expired.dane.test tlsa certificate-expired 2 0 1 $hash{ta}; "
	  . "match.dane.test tlsa ok 3 1 1 $hash{ee}; mismatch.dane.test tlsa validation-failure 3 1 1 $hash{other}");
my $tls_got = '';
ok(poll_until(sub { $tls_got = lc($node->safe_psql('postgres', $tls_sql)); $tls_got eq $tls_want }, 30),
	'the TLS sessions are counted under the tlsa policy, the failures with their result types')
  or diag $tls_got;
stop_dispatcher($d);
done_testing();
