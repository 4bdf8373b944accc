# MTA-STS (RFC 8461) in pepsi-stage-relay-to-internet, on the simulated
# internet of t/100: the test's DNS serves the domains' MX and _mta-sts
# TXT records, an HTTPS server (t/bin/sts-https, a certificate of a test
# CA that TLS_CA_FILE names) their policies, and scripted peers with
# certificates of the same CA the MX hosts.
#   enforce, the MX presenting a certificate for another name: deferred,
#     nothing sent; testing, the same: delivered, the failure logged;
#   enforce with the right certificate: delivered "sts enforce verified",
#     the policy cached in pepsi.mta_sts_policy with its max_age;
#   enforce whose mx does not list the MX host: deferred;
#   a malformed policy, one over the size cap, a redirect: no policy (and
#     the redirect not followed), delivered opportunistically;
#   a cached enforce policy whose refresh fails (the TXT id changed, the
#     policy host serves garbage): kept, so an MX it does not list is
#     still deferred and one it lists still delivered to, verified.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

my $node = delivery_node('relay_mta_sts');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

# A test CA and the certificates it signs.
sub run { system(@_) == 0 or die "@_ failed" }
run('openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
	'-keyout', "$tmp/ca-key.pem", '-out', "$tmp/ca.pem", '-days', '2', '-subj', '/CN=Pepsi test CA',
	'-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign');
sub issue
{
	my ($name, @dns) = @_;
	run('openssl', 'req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
		'-keyout', "$tmp/$name-key.pem", '-out', "$tmp/$name.csr", '-subj', "/CN=$dns[0]");
	PostgreSQL::Test::Utils::append_to_file("$tmp/$name.ext",
		'subjectAltName=' . join(',', map { "DNS:$_" } @dns) . "\n");
	run('openssl', 'x509', '-req', '-in', "$tmp/$name.csr", '-CA', "$tmp/ca.pem", '-CAkey', "$tmp/ca-key.pem",
		'-CAcreateserial', '-out', "$tmp/$name.pem", '-days', '2', '-extfile', "$tmp/$name.ext");
}
my @domains = qw(enforce testing good bad big redirect unlisted);
issue('https', map { "mta-sts.$_.test" } @domains, 'private', 'kept');
issue('wrong', 'wrong.example');
issue('right', 'mx.good.test', 'mx.unlisted.test', 'mx.kept.test', 'other.kept.test');

my $https = start_server('sts-https', sub {
	my ($port, $dir) = @_;
	return ("$ENV{PEPSI_TOP}/t/bin/sts-https", $dir, $port, "$tmp/https.pem", "$tmp/https-key.pem");
});
my $policies = $https->{dir};
sub policy { PostgreSQL::Test::Utils::append_to_file("$policies/mta-sts.$_[0].test.$_[1]", $_[2]) }
policy('enforce', 'txt', "version: STSv1\r\nmode: enforce\r\nmx: mx.enforce.test\r\nmax_age: 86400\r\n");
policy('testing', 'txt', "version: STSv1\nmode: testing\nmx: *.testing.test\nmax_age: 600\n");
policy('good', 'txt', "version: STSv1\r\nmode: enforce\r\nmx: mx.good.test\r\nmax_age: 86400\r\n");
policy('unlisted', 'txt', "version: STSv1\r\nmode: enforce\r\nmx: mx.elsewhere.test\r\nmax_age: 86400\r\n");
policy('bad', 'txt', "version: STSv1\r\nmode: sometimes\r\nmx: mx.bad.test\r\nmax_age: 86400\r\n");
policy('big', 'big', 200000);
policy('redirect', 'redirect', "https://mta-sts.good.test:$https->{port}/.well-known/mta-sts.txt");

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $wrong = start_peer('--address', '127.0.0.3', '--port', $port,
	'--tls-cert', "$tmp/wrong.pem", '--tls-key', "$tmp/wrong-key.pem");
my $right = start_peer('--address', '127.0.0.4', '--port', $port,
	'--tls-cert', "$tmp/right.pem", '--tls-key', "$tmp/right-key.pem");

my $zone = '';
for my $d (@domains)
{
	my $address = $d eq 'good' || $d eq 'unlisted' ? '127.0.0.4' : '127.0.0.3';
	$zone .= "$d.test. 300 IN MX 10 mx.$d.test.\n"
	  . "mx.$d.test. 300 IN A $address\n"
	  . "_mta-sts.$d.test. 300 IN TXT \"v=STSv1; id=${d}1\"\n"
	  . "mta-sts.$d.test. 300 IN A 127.0.0.1\n";
}
# private.test: its policy host is on 127.0.0.1 as every other's, asked
# only by the second dispatcher, whose relay does not allow that.
$zone .= "private.test. 300 IN MX 10 mx.private.test.\nmx.private.test. 300 IN A 127.0.0.3\n"
  . "_mta-sts.private.test. 300 IN TXT \"v=STSv1; id=private1\"\nmta-sts.private.test. 300 IN A 127.0.0.1\n";
policy('private', 'txt', "version: STSv1\r\nmode: enforce\r\nmx: mx.elsewhere.test\r\nmax_age: 86400\r\n");
# kept.test: its policy is cached at first, then its refresh fails (below).
# Its MX is mx.kept.test or, for a while, other.kept.test, both on the peer
# whose certificate names them, so only the policy can keep mail from
# other.kept.test.
sub kept_zone
{
	my ($mx, $id) = @_;
	return "kept.test. 300 IN MX 10 $mx.kept.test.\n$mx.kept.test. 300 IN A 127.0.0.4\n"
	  . "_mta-sts.kept.test. 300 IN TXT \"v=STSv1; id=$id\"\nmta-sts.kept.test. 300 IN A 127.0.0.1\n";
}
policy('kept', 'txt', "version: STSv1\r\nmode: enforce\r\nmx: mx.kept.test\r\nmax_age: 86400\r\n");
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
$dns->zone($zone . kept_zone('mx', 'kept1'));

my $config = delivery_config($node, maildir_root => $root, internet => $port,
	pepsi => { DNS_FORWARDER => $dns->forwarder },
	extra => { smarthost => "TLS_CA_FILE = $tmp/ca.pem\nMTA_STS_PORT = $https->{port}\n"
		  . "MTA_STS_TIMEOUT = 10s\nRETRY_BASE = 60s\nRETRY_MAX = 60s\n"
		  # The policy hosts are on 127.0.0.1: allowed here, refused by default (below).
		  . "MTA_STS_ALLOW_PRIVATE_ADDRESSES = yes\n" });
my $d = start_dispatcher($config);

my %id;
for my $domain (@domains)
{
	$id{$domain} = inject($node, to => ["user\@$domain.test"],
		headers => "From: <$sender>\r\nTo: <user\@$domain.test>\r\nSubject: to $domain\r\n");
}
sub inject_kept
{
	my ($user) = @_;
	return inject($node, to => ["$user\@kept.test"],
		headers => "From: <$sender>\r\nTo: <$user\@kept.test>\r\nSubject: to kept\r\n");
}
inject_kept('first');

sub sent_to
{
	my ($peer, $domain) = @_;
	return scalar grep { $_->{env} =~ /RCPT TO:<user\@\Q$domain\E\.test>/ } peer_messages($peer);
}

sub paused_error
{
	my ($id) = @_;
	return poll_until(sub {
		$node->safe_psql('postgres',
			"SELECT state->>'last_error' FROM pepsi.workqueue WHERE id = $id AND status = 'paused'") });
}

# enforce, a certificate for another name: deferred, never sent.
like(paused_error($id{enforce}), qr/sts enforce.*(hostname mismatch|certificate-host-mismatch)/,
	'enforce with a wrong certificate name: deferred, and last_error says why');
is($node->safe_psql('postgres', "SELECT state->'tls'->>'result' FROM pepsi.workqueue WHERE id = $id{enforce}"),
	'certificate-host-mismatch', 'state.tls has the RFC 8460 result type');
unlike(slurp("$wrong->{dir}/transcript"), qr/RCPT TO:<user\@enforce\.test>/, 'nothing was sent to it');

# testing, the same certificate: delivered, the failure logged.
ok(poll_until(sub { sent_to($wrong, 'testing') == 1 }), 'testing with a wrong certificate name: delivered');
ok(poll_until(sub { dispatcher_log($d) =~ /to=<user\@testing\.test>.*status=sent.*tls_policy=sts testing failed: certificate-host-mismatch/ }),
	'the delivery log line says the testing policy failed, and how');
like(dispatcher_log($d), qr/MTA-STS testing policy of testing\.test: mx\.testing\.test: .*delivered anyway/,
	'with a warning');

# enforce, the right certificate.
ok(poll_until(sub { sent_to($right, 'good') == 1 }), 'enforce with a valid certificate: delivered');
ok(poll_until(sub { dispatcher_log($d) =~ /to=<user\@good\.test>.*status=sent.*tls_policy=sts enforce verified/ }),
	'logged as sts enforce verified');
is($node->safe_psql('postgres',
		"SELECT policy_id || ' ' || mode || ' ' || max_age || ' ' || (expires_at > now() + interval '23 hours')"
		  . " FROM pepsi.mta_sts_policy WHERE domain = 'good.test'"),
	'good1 enforce 86400 true', 'the policy is cached with its id, mode and max_age');

# enforce whose mx does not list the host.
like(paused_error($id{unlisted}), qr/not among the mx of unlisted\.test's MTA-STS policy/,
	'an MX host the enforced policy does not list: deferred');
is(sent_to($right, 'unlisted'), 0, 'and not even connected for it');

# No usable policy: delivered as without one.
ok(poll_until(sub { sent_to($wrong, 'bad') == 1 }), 'a malformed policy: delivered without a policy');
like(dispatcher_log($d), qr/MTA-STS policy of bad\.test: policy mode "sometimes"/, 'the malformed policy is logged');
ok(poll_until(sub { sent_to($wrong, 'big') == 1 }), 'a policy over the size cap: delivered without a policy');
like(dispatcher_log($d), qr/MTA-STS policy of big\.test: the policy at \S+ is larger than 65536 bytes/,
	'the oversized policy is logged');
ok(poll_until(sub { sent_to($wrong, 'redirect') == 1 }), 'a redirected policy: delivered without a policy');
like(dispatcher_log($d), qr/MTA-STS policy of redirect\.test: .*HTTP status 301 \(a redirect/, 'the redirect is logged');
my @requests = split /\n/, slurp("$policies/requests");
is(scalar(grep { /^mta-sts\.good\.test / } @requests), 1, 'and not followed: good.test\'s policy was fetched once');
is($node->safe_psql('postgres', "SELECT count(*) FROM pepsi.mta_sts_policy WHERE domain IN ('bad.test', 'big.test', 'redirect.test')"),
	'0', 'nothing cached for them');

# kept.test's policy, fetched and cached (it is the one kept below).
ok(poll_until(sub { grep { $_->{env} =~ /RCPT TO:<first\@kept\.test>/ } peer_messages($right) }),
	'kept.test: delivered under its enforce policy');
ok(poll_until(sub { dispatcher_log($d) =~ /to=<first\@kept\.test>.*status=sent.*tls_policy=sts enforce verified/ }),
	'logged as sts enforce verified');
is($node->safe_psql('postgres', "SELECT policy_id || ' ' || mode FROM pepsi.mta_sts_policy WHERE domain = 'kept.test'"),
	'kept1 enforce', 'and its policy cached');

stop_dispatcher($d);

# By default (MTA_STS_ALLOW_PRIVATE_ADDRESSES off) a policy host on a
# loopback address is not fetched from: a hostile DNS answer cannot send
# the fetch to the machine itself.  The domain is delivered to as without
# a policy (its enforce policy, had it been fetched, would have deferred it).
my $strict = delivery_config($node, maildir_root => $root, internet => $port, path => "$tmp/pepsi-strict.conf",
	pepsi => { DNS_FORWARDER => $dns->forwarder },
	extra => { smarthost => "TLS_CA_FILE = $tmp/ca.pem\nMTA_STS_PORT = $https->{port}\n"
		  . "MTA_STS_TIMEOUT = 10s\nRETRY_BASE = 60s\nRETRY_MAX = 60s\n" });
$d = start_dispatcher($strict);
my $private = inject($node, to => ['user@private.test'],
	headers => "From: <$sender>\r\nTo: <user\@private.test>\r\nSubject: to private\r\n");
ok(poll_until(sub { sent_to($wrong, 'private') == 1 }),
	'a policy host on a loopback address: not fetched from, delivered without a policy');
like(dispatcher_log($d),
	qr{MTA-STS policy of private\.test: fetching https://mta-sts\.private\.test:\d+/\.well-known/mta-sts\.txt: not connecting to 127\.0\.0\.1, loopback \(127\.0\.0\.0/8\), not a public address \(\[pepsi-stage-relay-to-internet\] MTA_STS_ALLOW_PRIVATE_ADDRESSES\)},
	'the log says why, naming the option');
is(scalar(grep { /^mta-sts\.private\.test / } split /\n/, slurp("$policies/requests")), 0,
	'the policy host was never asked');
stop_dispatcher($d);

# A refresh that fails keeps the cached enforce policy in force (RFC 8461
# 5.1: a policy stays until its max_age runs out, not until the policy
# host stops serving it).  kept.test announces a new id, so the relay
# fetches again, and its policy host now serves garbage.  A new
# dispatcher: its resolver has not cached kept.test's old records.
sub kept_fetches { scalar grep { /^mta-sts\.kept\.test / } split /\n/, slurp("$policies/requests") }
is(kept_fetches(), 1, 'kept.test\'s policy was fetched once so far');
unlink("$policies/mta-sts.kept.test.txt") or die "unlink: $!";
policy('kept', 'txt', "<html><body>Service Unavailable</body></html>\n");

# Its MX moved to a host the cached policy does not list: deferred.
$dns->zone($zone . kept_zone('other', 'kept2'));
$d = start_dispatcher($config);
my $outside = inject_kept('outside');
like(paused_error($outside), qr/not among the mx of kept\.test's MTA-STS policy/,
	'failed refresh: an MX host the cached enforce policy does not list is still deferred');
is(scalar(grep { $_->{env} =~ /RCPT TO:<outside\@kept\.test>/ } peer_messages($right)), 0,
	'and nothing was sent to it');
cmp_ok(kept_fetches(), '>=', 2, 'the refresh was tried (the TXT id changed)');
like(dispatcher_log($d), qr/MTA-STS policy of kept\.test: /, 'its failure is logged');
stop_dispatcher($d);

# Back on the MX host the policy lists, the refresh still failing: delivered,
# verified under the kept policy.
$dns->zone($zone . kept_zone('mx', 'kept2'));
my $fetched = kept_fetches();
$d = start_dispatcher($config);
inject_kept('inside');
ok(poll_until(sub { grep { $_->{env} =~ /RCPT TO:<inside\@kept\.test>/ } peer_messages($right) }),
	'failed refresh: the MX host the cached policy lists is still delivered to');
ok(poll_until(sub { dispatcher_log($d) =~ /to=<inside\@kept\.test>.*status=sent.*tls_policy=sts enforce verified/ }),
	'under the kept policy: sts enforce verified');
cmp_ok(kept_fetches(), '>', $fetched, 'after another refresh was tried');
is($node->safe_psql('postgres', "SELECT policy_id || ' ' || mode FROM pepsi.mta_sts_policy WHERE domain = 'kept.test'"),
	'kept1 enforce', 'the cache still holds the policy that was fetched');
stop_dispatcher($d);
done_testing();
