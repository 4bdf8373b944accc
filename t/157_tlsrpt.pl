# SMTP TLS reporting (RFC 8460) end to end, on the simulated internet of
# t/106: pepsi-stage-relay-to-internet delivers under MTA-STS (a policy
# host, t/bin/sts-https, and scripted peers with certificates of a test
# CA) and counts its sessions into pepsi.tls_aggregate without a round
# trip per message; pepsi-tlsrpt turns a day of them into RFC 8460 JSON
# reports, gzip-compressed, and sends each to the rua of the domain's
# _smtp._tls record: a mailto: as a multipart/report message that reaches
# the rua mailbox through the pipeline, an https: as a POST to the test's
# HTTPS server.  A malformed rua, an http: rua, a record without rua and
# an https: server answering 503 are each logged with the reason, and get
# nothing.  Then the prune
# functions, called by a pepsi.schedule row, delete old rows only.

use strict;
use warnings FATAL => 'all';

use IO::Uncompress::Gunzip qw(gunzip $GunzipError);
use IPC::Run qw(run);
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

my $db = 'postgres';
my $node = delivery_node('tlsrpt');
$node->safe_psql($db, 'CREATE ROLE operator LOGIN IN ROLE pepsi_config');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);
make_mailbox($root, 'tlsrpt@reports.local');

sub sql { return $node->safe_psql($db, shift); }

# A test CA and the certificates it signs.
sub openssl { system('openssl', @_) == 0 or die "openssl @_ failed" }
openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
	'-keyout', "$tmp/ca-key.pem", '-out', "$tmp/ca.pem", '-days', '2', '-subj', '/CN=Pepsi test CA',
	'-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign');
sub issue
{
	my ($name, @dns) = @_;
	openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
		'-keyout', "$tmp/$name-key.pem", '-out', "$tmp/$name.csr", '-subj', "/CN=$dns[0]");
	PostgreSQL::Test::Utils::append_to_file("$tmp/$name.ext",
		'subjectAltName=' . join(',', map { "DNS:$_" } @dns) . "\n");
	openssl('x509', '-req', '-in', "$tmp/$name.csr", '-CA', "$tmp/ca.pem", '-CAkey', "$tmp/ca-key.pem",
		'-CAcreateserial', '-out', "$tmp/$name.pem", '-days', '2', '-extfile', "$tmp/$name.ext");
}
issue('https', 'mta-sts.good.test', 'mta-sts.testing.test', 'mta-sts.notls.test', 'reports.test');
issue('wrong', 'wrong.example');
issue('right', 'mx.good.test', 'mx.plain.test');

my $https = start_server('sts-https', sub {
	my ($port, $dir) = @_;
	return ("$ENV{PEPSI_TOP}/t/bin/sts-https", $dir, $port, "$tmp/https.pem", "$tmp/https-key.pem");
});
my $web = $https->{dir};
PostgreSQL::Test::Utils::append_to_file("$web/mta-sts.good.test.txt",
	"version: STSv1\r\nmode: enforce\r\nmx: mx.good.test\r\nmax_age: 86400\r\n");
PostgreSQL::Test::Utils::append_to_file("$web/mta-sts.testing.test.txt",
	"version: STSv1\nmode: testing\nmx: *.testing.test\nmax_age: 600\n");
PostgreSQL::Test::Utils::append_to_file("$web/mta-sts.notls.test.txt",
	"version: STSv1\nmode: testing\nmx: mx.notls.test\nmax_age: 600\n");

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $wrong = start_peer('--address', '127.0.0.3', '--port', $port,
	'--tls-cert', "$tmp/wrong.pem", '--tls-key', "$tmp/wrong-key.pem");
my $right = start_peer('--address', '127.0.0.4', '--port', $port,
	'--tls-cert', "$tmp/right.pem", '--tls-key', "$tmp/right-key.pem");
my $clear = start_peer('--address', '127.0.0.5', '--port', $port);

my $post_url = "https://reports.test:$https->{port}/tlsrpt";
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
$dns->zone(<<"ZONE");
good.test. 300 IN MX 10 mx.good.test.
mx.good.test. 300 IN A 127.0.0.4
_mta-sts.good.test. 300 IN TXT "v=STSv1; id=good1"
mta-sts.good.test. 300 IN A 127.0.0.1
_smtp._tls.good.test. 300 IN TXT "v=TLSRPTv1; rua=mailto:tlsrpt\@reports.local,$post_url"
testing.test. 300 IN MX 10 mx.testing.test.
mx.testing.test. 300 IN A 127.0.0.3
_mta-sts.testing.test. 300 IN TXT "v=STSv1; id=testing1"
mta-sts.testing.test. 300 IN A 127.0.0.1
_smtp._tls.testing.test. 300 IN TXT "v=TLSRPTv1; rua=mailto:tlsrpt\@reports.local"
notls.test. 300 IN MX 10 mx.notls.test.
mx.notls.test. 300 IN A 127.0.0.5
_mta-sts.notls.test. 300 IN TXT "v=STSv1; id=notls1"
mta-sts.notls.test. 300 IN A 127.0.0.1
plain.test. 300 IN MX 10 mx.plain.test.
mx.plain.test. 300 IN A 127.0.0.4
_smtp._tls.plain.test. 300 IN TXT "v=TLSRPTv1; rua=http://reports.test:$https->{port}/tlsrpt, mailto:x\@y\@reports.local, ftp://reports.test/"
_smtp._tls.norua.test. 300 IN TXT "v=TLSRPTv1; ruf=mailto:tlsrpt\@reports.local"
reports.test. 300 IN A 127.0.0.1
ZONE

my $config = delivery_config($node, maildir_root => $root, internet => $port,
	local_domains => 'local.test reports.local',
	pepsi => { DNS_FORWARDER => $dns->forwarder, DNS_TIMEOUT => '4s' },
	extra => { smarthost => "TLS_CA_FILE = $tmp/ca.pem\nMTA_STS_PORT = $https->{port}\n"
		  . "MTA_STS_TIMEOUT = 10s\nREUSE_MESSAGES = 1\n"
		  # The policy hosts are on 127.0.0.1, which pepsi-stage-relay-to-internet
		  # refuses to fetch from unless allowed (t/106).
		  . "MTA_STS_ALLOW_PRIVATE_ADDRESSES = yes\n" },
	sections => "[tlsrpt]\nORG_NAME = Pepsi Test\nSENDER = tlsrpt-noreply\@mx.pepsi.test\n"
	  . "TLS_CA_FILE = $tmp/ca.pem\nHTTPS_TIMEOUT = 10s\n");
my $tool_config = operator_config($node, $config, 'operator');
my $d = start_dispatcher($config);

# Two messages to good.test (enforce, the right certificate), one to
# testing.test (testing, a certificate for another name: delivered, a
# failure), one to notls.test (testing, no STARTTLS: delivered in clear,
# a failure), one to plain.test (no policy).  One message per session.
for my $to (qw(good.test good.test testing.test notls.test plain.test))
{
	inject($node, to => ["user\@$to"], headers => "From: <$sender>\r\nTo: <user\@$to>\r\nSubject: to $to\r\n");
}
sub sent_to
{
	my ($peer, $domain) = @_;
	return scalar grep { $_->{env} =~ /RCPT TO:<user\@\Q$domain\E>/ } peer_messages($peer);
}
ok(poll_until(sub { sent_to($right, 'good.test') == 2 && sent_to($wrong, 'testing.test') == 1
			&& sent_to($right, 'plain.test') == 1 && sent_to($clear, 'notls.test') == 1 }),
	'the five messages are delivered');

# The counts reach pepsi.tls_aggregate once the worker is idle, batched.
# A failure names our sending address too: the relay connects from the
# loopback route's source, 127.0.0.1.
my $counts_sql = "SELECT string_agg(format('%s %s %s %s %s %s %s', policy_domain, policy_type,"
  . " coalesce(nullif(result_type, ''), 'ok'), coalesce(nullif(receiving_mx_hostname, ''), '-'),"
  . " coalesce(nullif(receiving_ip, ''), '-'), coalesce(nullif(sending_mta_ip, ''), '-'), sessions),"
  . " '; ' ORDER BY policy_domain, result_type) FROM pepsi.tls_aggregate";
my $expected = 'good.test sts ok - - - 2; notls.test sts starttls-not-supported mx.notls.test 127.0.0.5 127.0.0.1 1; '
  . 'plain.test no-policy-found ok - - - 1; '
  . 'testing.test sts certificate-host-mismatch mx.testing.test 127.0.0.3 127.0.0.1 1';
ok(poll_until(sub { sql($counts_sql) eq $expected }, 30), 'the TLS sessions are counted per domain, policy and result')
  or diag sql($counts_sql);
is(sql("SELECT policy_string || ' | ' || mx_host FROM pepsi.tls_aggregate WHERE policy_domain = 'good.test'"),
	"version: STSv1\nmode: enforce\nmx: mx.good.test\nmax_age: 86400 | mx.good.test",
	'with the policy\'s text and MX patterns');

# A domain whose record has no rua (counted directly: no delivery needed).
sql("SELECT pepsi.tls_tally('[{\"policy_domain\": \"norua.test\", \"policy_type\": \"no-policy-found\", \"count\": 3}]')");

sub tlsrpt_tool
{
	my ($out, $err) = ('', '');
	local $ENV{PEPSI_LOG} = 'stderr';
	run([ pepsi_bin('pepsi-tlsrpt'), '-C', $tool_config, @_ ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}
my $today = sql("SELECT (now() AT TIME ZONE 'UTC')::date");
my $begin = sql("SELECT extract(epoch FROM (now() AT TIME ZONE 'UTC')::date::timestamp)::bigint");

my ($rc, $out, $err) = tlsrpt_tool('--day', $today, '--dry-run');
is($rc, 0, '--dry-run succeeds') or diag $err;
like($out, qr/^good\.test: would POST report good\.test\.$begin\@mx\.pepsi\.test to \Q$post_url\E/m,
	'--dry-run says what it would send');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'tlsrpt_sent'"), '0', '... and sends nothing');

($rc, $out, $err) = tlsrpt_tool('--day', $today);
is($rc, 0, 'the day\'s reports: the run succeeds') or diag $err;
is($out, "3 reports sent, 4 destinations refused\n", 'three sent (two mailed, one POSTed), four refused')
  or diag $err;
like($err, qr{plain\.test: rua "http://reports\.test:\d+/tlsrpt" refused: an http: URI \(reports are POSTed over https only\)},
	'an http: rua is refused, with the reason');
like($err, qr/plain\.test: rua "mailto:x\@y\@reports\.local" refused: not one address/, 'a malformed mailto: rua');
like($err, qr{plain\.test: rua "ftp://reports\.test/" refused: neither a mailto: nor an https: URI}, 'another scheme');
like($err, qr/norua\.test: no report: its TLSRPT record "v=TLSRPTv1; ruf=[^"]*" has no rua/, 'a record without rua');
is(sql("SELECT string_agg((detail ->> 'domain') || ' ' || (detail ->> 'rua'), ', ' ORDER BY id)"
	  . " FROM pepsi.event_log WHERE action = 'tlsrpt_sent'"),
	"good.test tlsrpt\@reports.local, good.test $post_url, testing.test tlsrpt\@reports.local",
	'what was sent is in pepsi.event_log, nothing for plain.test or norua.test');

# The report as RFC 8460 section 4 describes it.
sub check_report
{
	my ($json, $what) = @_;
	my $r = eval { JSON::PP->new->decode($json) };
	ok($r, "$what: the report is JSON") or return;
	for my $field ('organization-name', 'contact-info', 'report-id')
	{
		ok(defined $r->{$field} && !ref $r->{$field}, "$what: $field is a string");
	}
	is($r->{'organization-name'}, 'Pepsi Test', "$what: organization-name is ORG_NAME");
	is($r->{'contact-info'}, 'tlsrpt-noreply@mx.pepsi.test', "$what: contact-info is SENDER");
	is_deeply($r->{'date-range'}, { 'start-datetime' => "${today}T00:00:00Z", 'end-datetime' => "${today}T23:59:59Z" },
		"$what: date-range covers the day");
	is(ref $r->{policies}, 'ARRAY', "$what: policies is an array");
	for my $p (@{ $r->{policies} // [] })
	{
		my $policy = $p->{policy};
		ok(defined $policy->{'policy-type'} && ref $policy->{'policy-string'} eq 'ARRAY'
			  && defined $policy->{'policy-domain'} && ref $policy->{'mx-host'} eq 'ARRAY',
			"$what: each policy has policy-type, policy-string, policy-domain and mx-host");
		ok(defined $p->{summary}{'total-successful-session-count'}
			  && defined $p->{summary}{'total-failure-session-count'}, "$what: each policy has its summary");
		is(ref $p->{'failure-details'}, 'ARRAY', "$what: and its failure-details");
	}
	return $r;
}

ok(poll_until(sub { maildir_files($root, 'tlsrpt@reports.local') == 2 }, 60),
	'the mailed reports reach the rua mailbox');
my %mail;
for my $file (maildir_files($root, 'tlsrpt@reports.local'))
{
	my $m = parse_dsn(slurp($file));
	$mail{ $m->head->get('TLS-Report-Domain') =~ s/\s+$//r } = $m;
}
my $m = $mail{'good.test'};
ok($m, 'a report for good.test') or BAIL_OUT('no report for good.test');
like($m->head->get('Subject'), qr/^Report Domain: good\.test Submitter: mx\.pepsi\.test Report-ID: <good\.test\.$begin\@mx\.pepsi\.test>$/,
	'the Subject of RFC 8460 5.3');
is($m->head->get('TLS-Report-Submitter') =~ s/\s+$//r, 'mx.pepsi.test', 'TLS-Report-Submitter');
is($m->effective_type, 'multipart/report', 'a multipart/report');
like($m->head->get('Content-Type'), qr/report-type="?tlsrpt"?/, 'report-type=tlsrpt');
my ($part) = grep { $_->effective_type eq 'application/tlsrpt+gzip' } $m->parts;
ok($part, 'with an application/tlsrpt+gzip part');
like($part->head->recommended_filename, qr/^mx\.pepsi\.test!good\.test!$begin!@{[ $begin + 86399 ]}\.json\.gz$/,
	'named sender!policy-domain!begin!end.json.gz');
my $gz = $part->bodyhandle->as_string;
my $json;
ok(gunzip(\$gz => \$json), 'it gunzips') or diag $GunzipError;
my $r = check_report($json, 'good.test by mail');
is($r->{'report-id'}, "good.test.$begin\@mx.pepsi.test", 'the report-id');
is_deeply($r->{policies}, [ {
			policy => { 'policy-type' => 'sts', 'policy-domain' => 'good.test', 'mx-host' => ['mx.good.test'],
				'policy-string' => [ 'version: STSv1', 'mode: enforce', 'mx: mx.good.test', 'max_age: 86400' ] },
			summary => { 'total-successful-session-count' => 2, 'total-failure-session-count' => 0 },
			'failure-details' => [] } ],
	'good.test: the sts policy, two successful sessions');

$part = (grep { $_->effective_type eq 'application/tlsrpt+gzip' } $mail{'testing.test'}->parts)[0];
$gz = $part->bodyhandle->as_string;
ok(gunzip(\$gz => \$json), 'testing.test\'s report gunzips');
$r = check_report($json, 'testing.test by mail');
is_deeply($r->{policies}[0]{summary}, { 'total-successful-session-count' => 0, 'total-failure-session-count' => 1 },
	'testing.test: one failed session');
is_deeply($r->{policies}[0]{'failure-details'}, [ { 'result-type' => 'certificate-host-mismatch',
			'receiving-mx-hostname' => 'mx.testing.test', 'receiving-ip' => '127.0.0.3',
			'sending-mta-ip' => '127.0.0.1', 'failed-session-count' => 1 } ],
	'with its failure details');
is_deeply($r->{policies}[0]{policy}{'mx-host'}, ['*.testing.test'], 'and the policy\'s mx pattern');

# The https: report: one POST, application/tlsrpt+gzip, the same report.
my @posts = grep { /^post-\d+$/ } do { opendir(my $dh, $web) or die; readdir $dh };
is(scalar @posts, 1, 'one report was POSTed');
my $head = slurp("$web/post-1.head");
like($head, qr{^POST /tlsrpt\n}, 'to the rua\'s path');
like($head, qr{^Content-Type: application/tlsrpt\+gzip$}mi, 'as application/tlsrpt+gzip');
$gz = slurp("$web/post-1");
ok(gunzip(\$gz => \$json), 'the POSTed report gunzips');
$r = check_report($json, 'good.test by https');
is($r->{'report-id'}, "good.test.$begin\@mx.pepsi.test", 'the same report as the mailed one');

# An https: destination that answers with an error: refused, the status logged.
PostgreSQL::Test::Utils::append_to_file("$web/post-status", "503");
($rc, $out, $err) = tlsrpt_tool('--day', $today, '--domain', 'good.test');
is($rc, 0, 'a run whose POST fails still succeeds');
like($err, qr{good\.test: rua "\Q$post_url\E" refused: the server answered HTTP status 503}, 'the status is logged');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'tlsrpt_sent' AND detail ->> 'rua' = '$post_url'"), '1',
	'and it is not recorded as sent');

# Bad options.
($rc, $out, $err) = tlsrpt_tool('--day', 'yesterday');
is($rc, 64, 'a bad --day is a usage error');
like($err, qr/--day takes a date, YYYY-MM-DD, not "yesterday"/, 'naming the option');

stop_dispatcher($d);

# Pruning, by schedule rows run as the maintenance worker runs them: old
# rows go, the recent ones stay.
sql(q{
	INSERT INTO pepsi.tls_aggregate (day, policy_domain, policy_type, sessions)
	VALUES ((now() AT TIME ZONE 'UTC')::date - 40, 'old.test', 'no-policy-found', 5);
	INSERT INTO pepsi.greylist (client, sender, recipient, first_seen, last_seen)
	VALUES ('192.0.2.0/24', 'a@old.test', 'b@local.test', now() - interval '60 days', now() - interval '60 days'),
	       ('192.0.2.0/24', 'a@new.test', 'b@local.test', now(), now());
	INSERT INTO pepsi.greylist_client (client, until)
	VALUES ('192.0.2.1', now() - interval '1 day'), ('192.0.2.2', now() + interval '1 day');
	INSERT INTO pepsi.send_count (account, hour, messages, recipients)
	VALUES ('alice', date_trunc('hour', now()) - interval '3 days', 5, 5), ('alice', date_trunc('hour', now()), 1, 1);
	INSERT INTO pepsi.screen_verdict (client, verdict, expires)
	VALUES ('192.0.2.7', 'listed', now() - interval '1 minute'), ('192.0.2.8', 'pass', now() + interval '1 hour');
});
for my $call ([ 'tls', 'tls_aggregate_prune', '{"older_than": "30 days"}' ],
	[ 'grey', 'greylist_prune', '{"older_than": "35 days"}' ],
	[ 'sends', 'send_count_prune', '{"older_than": "1 day"}' ],
	[ 'verdicts', 'screen_verdict_prune', '{}' ])
{
	$node->psql($db, "SET ROLE operator; SELECT pepsi.schedule_add('$call->[0]', now(), interval '1 day',"
		  . " function_name => '$call->[1]', arguments => '$call->[2]')", on_error_die => 1);
}
sql('SELECT pepsi.schedule_run_due()');
is(sql("SELECT string_agg(name || ': ' || last_outcome, ', ' ORDER BY name) FROM pepsi.schedule"),
	'grey: ok: 2 rows pruned, sends: ok: 1 rows pruned, tls: ok: 1 rows pruned, verdicts: ok: 1 rows pruned',
	'each prune ran from its schedule row');
is(sql("SELECT count(*) FROM pepsi.tls_aggregate WHERE policy_domain = 'old.test'"), '0', 'the old TLS counts went');
is(sql("SELECT count(*) FROM pepsi.tls_aggregate"), '5', 'today\'s stayed');
is(sql("SELECT string_agg(sender, ' ') FROM pepsi.greylist"), 'a@new.test', 'the stale greylist triplet went');
is(sql("SELECT string_agg(client, ' ') FROM pepsi.greylist_client"), '192.0.2.2', 'the ended auto-whitelisting went');
is(sql("SELECT count(*) FROM pepsi.send_count WHERE hour = date_trunc('hour', now())"), '1', 'this hour\'s send count stayed');
is(sql("SELECT count(*) FROM pepsi.send_count"), '1', 'the old hour went');
is(sql("SELECT string_agg(client, ' ') FROM pepsi.screen_verdict"), '192.0.2.8', 'the expired verdict went');

# A schedule row with a bad argument is refused when it is added.
my ($prc, $pout, $perr) = $node->psql($db, "SELECT pepsi.schedule_add('bad', now(), function_name => 'tls_aggregate_prune',"
	  . " arguments => '{\"older_than\": \"2 hours\"}')");
like($perr, qr/tls_aggregate_prune needs older_than, a day or more/, 'tls_aggregate_prune refuses less than a day');
($prc, $pout, $perr) = $node->psql($db, "SELECT pepsi.schedule_add('bad', now(), function_name => 'screen_verdict_prune',"
	  . " arguments => '{\"older_than\": \"2 hours\"}')");
like($perr, qr/screen_verdict_prune takes no argument older_than/, 'screen_verdict_prune takes no argument');

done_testing();
