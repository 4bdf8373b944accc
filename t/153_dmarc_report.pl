# pepsi-dmarc-report end to end: a day of DMARC verdicts in
# pepsi.dmarc_aggregate becomes, for each policy domain, an RFC 7489
# aggregate report that validates with xmllint against
# docs/dmarc-aggregate.xsd (appendix C), gzip-compressed and queued as a
# message that reaches the rua mailbox through the pipeline (route,
# relay-to-maildir, under pepsi-dispatch); a rua in another organization
# is used only when it publishes the authorisation record (7.1), and one
# that does not, or a malformed rua, is refused with the reason logged and
# nothing sent.  The DNS is the tests' server.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IO::Uncompress::Gunzip qw(gunzip $GunzipError);
use IPC::Run qw(run);
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

my $db = 'postgres';
my $top = $ENV{PEPSI_TOP} // dirname(__FILE__) . '/..';
my $xsd = "$top/docs/dmarc-aggregate.xsd";
my $node = delivery_node('dmarc_report');
$node->safe_psql($db, 'CREATE ROLE operator LOGIN IN ROLE pepsi_config');
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $root = PostgreSQL::Test::Utils::tempdir();
make_mailbox($root, 'dmarc@reports.test');
make_mailbox($root, 'dmarc@own.test');

my $dns = TestDNS->new($tmp);
$dns->zone(<<'ZONE');
_dmarc.pass.test. 300 IN TXT "v=DMARC1; p=quarantine; sp=none; adkim=s; rua=mailto:dmarc@reports.test!10m"
pass.test._report._dmarc.reports.test. 300 IN TXT "v=DMARC1"
_dmarc.own.test. 300 IN TXT "v=DMARC1; p=reject; rua=mailto:dmarc@own.test"
_dmarc.noauth.test. 300 IN TXT "v=DMARC1; p=none; rua=mailto:dmarc@reports.test"
_dmarc.bad.test. 300 IN TXT "v=DMARC1; p=none; rua=https://reports.test/dmarc, mailto:nobody, mailto:x@y@reports.test"
_dmarc.gone.test. 300 IN TXT "v=spf1 -all"
ZONE

my $config = delivery_config($node, maildir_root => $root, local_domains => 'local.test reports.test own.test',
	pepsi => { DNS_FORWARDER => $dns->forwarder, DNS_TIMEOUT => '4s' },
	sections => "[dmarc-report]\nORG_NAME = Pepsi Test\nSENDER = dmarc-noreply\@mx.pepsi.test\n");
my $tool_config = operator_config($node, $config, 'operator');

sub sql { return $node->safe_psql($db, shift); }

sub report_tool
{
	my ($out, $err) = ('', '');
	local $ENV{PEPSI_LOG} = 'stderr';
	run([ pepsi_bin('pepsi-dmarc-report'), '-C', $tool_config, @_ ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

# A day of verdicts, yesterday (UTC): every hour two sources for pass.test
# (one aligned, one failing), one for own.test, noauth.test, bad.test and
# gone.test (whose record is gone since); and one row of today's, which
# yesterday's report leaves out.
my $yesterday = sql("SELECT extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC') - interval '1 day')::bigint");
sql(qq{
	INSERT INTO pepsi.dmarc_aggregate (period, policy_domain, header_from, source_ip, envelope_from, disposition,
		dkim, spf, dkim_domain, dkim_selector, dkim_result, spf_scope, spf_result, messages)
	SELECT to_timestamp($yesterday) + h * interval '1 hour', d.policy, d.header_from, d.ip::inet, d.envelope,
	       d.disposition, d.dkim, d.spf, d.dkim_domain, d.selector, d.dkim_result, 'mfrom', d.spf_result, d.n
	FROM generate_series(0, 23) h,
	     (VALUES ('pass.test', 'pass.test', '192.0.2.1', 'pass.test', 'none', 'pass', 'pass', 'pass.test', 's1', 'pass', 'pass', 3),
	             ('pass.test', 'news.pass.test', '2001:db8::25', 'bulk.example', 'quarantine', 'fail', 'fail', 'bulk.example', 'k', 'fail', 'softfail', 1),
	             ('own.test', 'own.test', '198.51.100.7', 'own.test', 'none', 'fail', 'pass', '', '', '', 'pass', 2),
	             ('noauth.test', 'noauth.test', '192.0.2.9', 'noauth.test', 'none', 'fail', 'pass', '', '', '', 'pass', 1),
	             ('bad.test', 'bad.test', '192.0.2.10', 'bad.test', 'none', 'fail', 'pass', '', '', '', 'pass', 1),
	             ('gone.test', 'gone.test', '192.0.2.11', 'gone.test', 'none', 'fail', 'pass', '', '', '', 'pass', 1))
	     AS d(policy, header_from, ip, envelope, disposition, dkim, spf, dkim_domain, selector, dkim_result, spf_result, n);
	INSERT INTO pepsi.dmarc_aggregate (period, policy_domain, header_from, source_ip, envelope_from, disposition,
		dkim, spf, spf_result, messages)
	VALUES (date_trunc('hour', now()), 'pass.test', 'pass.test', '192.0.2.99', 'pass.test', 'none', 'pass', 'pass', 'pass', 1000);
});

my $d = start_dispatcher($config);

my ($rc, $out, $err) = report_tool('--dry-run');
is($rc, 0, '--dry-run succeeds') or diag $err;
like($out, qr/^pass\.test: would send report pass\.test\.$yesterday\.\d+ to <dmarc\@reports\.test>/m,
	'--dry-run says what it would send');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'dmarc_report_sent'"), '0', '... and sends nothing');

($rc, $out, $err) = report_tool();
is($rc, 0, 'yesterday\'s reports: the run succeeds') or diag $err;
is($out, "2 reports queued, 4 destinations refused\n", 'two reports queued, four destinations refused');
like($err, qr/noauth\.test: rua "mailto:dmarc\@reports\.test" refused: reports\.test is outside noauth\.test and does not authorise its reports: no "v=DMARC1" TXT record at noauth\.test\._report\._dmarc\.reports\.test/,
	'an external rua without the authorisation record is refused, with the reason');
like($err, qr/bad\.test: rua "https:\/\/reports\.test\/dmarc" refused: not a mailto: URI/, 'an https: rua is refused');
like($err, qr/bad\.test: rua "mailto:nobody" refused: not one address/, 'a mailto: without an address');
like($err, qr/bad\.test: rua "mailto:x\@y\@reports\.test" refused: not one address/, 'a mailto: with two @');
like($err, qr/gone\.test: no report: no DMARC record at _dmarc\.gone\.test now/, 'a domain without a record now: none');
is(sql("SELECT string_agg(detail ->> 'rua', ' ' ORDER BY id) FROM pepsi.event_log WHERE action = 'dmarc_report_sent'"),
	'dmarc@own.test dmarc@reports.test', 'each queued report is in pepsi.event_log');

ok(poll_until(sub { maildir_files($root, 'dmarc@reports.test') == 1 && maildir_files($root, 'dmarc@own.test') == 1 }, 60),
	'the reports reach the rua mailboxes, the external one and the own domain\'s');
is(scalar(maildir_files($root, 'dmarc@reports.test')), 1, 'one report for reports.test (noauth.test\'s was not sent)');

# The report of pass.test: gzip, and valid against the schema.
my $message = parse_dsn(slurp((maildir_files($root, 'dmarc@reports.test'))[0]));
like($message->head->get('Subject'), qr/^Report Domain: pass\.test Submitter: Pepsi Test Report-ID: <pass\.test\.$yesterday\.\d+>$/,
	'the Subject of RFC 7489 7.2.1.1');
is($message->effective_type, 'application/gzip', 'the report is application/gzip');
like($message->head->recommended_filename, qr/^mx\.pepsi\.test!pass\.test!$yesterday!\d+\.xml\.gz$/,
	'named receiver!policy-domain!begin!end.xml.gz');
my $gz = $message->bodyhandle->as_string;
my $xml;
ok(gunzip(\$gz => \$xml), 'it gunzips') or diag $GunzipError;
PostgreSQL::Test::Utils::append_to_file("$tmp/report.xml", $xml);
my ($lint_out, $lint_err) = ('', '');
run([ 'xmllint', '--noout', '--schema', $xsd, "$tmp/report.xml" ], '>', \$lint_out, '2>', \$lint_err);
is($? >> 8, 0, 'the report validates with xmllint against RFC 7489 appendix C\'s schema') or diag $lint_err;
like($xml, qr{<policy_published>\s*<domain>pass\.test</domain>\s*<adkim>s</adkim>\s*<aspf>r</aspf>\s*<p>quarantine</p>\s*<sp>none</sp>\s*<pct>100</pct>},
	'the policy as published');
like($xml, qr{<begin>$yesterday</begin>\s*<end>@{[ $yesterday + 86399 ]}</end>}, 'the day\'s range');
my %count = $xml =~ m{<source_ip>([^<]+)</source_ip>\s*<count>(\d+)</count>}g;
is_deeply(\%count, { '192.0.2.1' => 72, '2001:db8::25' => 24 }, 'a record per source and outcome, the day\'s counts, not today\'s');
like($xml, qr{<source_ip>2001:db8::25</source_ip>.*?<disposition>quarantine</disposition>\s*<dkim>fail</dkim>\s*<spf>fail</spf>.*?<envelope_from>bulk\.example</envelope_from>\s*<header_from>news\.pass\.test</header_from>.*?<dkim>\s*<domain>bulk\.example</domain>\s*<selector>k</selector>\s*<result>fail</result>\s*</dkim>\s*<spf>\s*<domain>bulk\.example</domain>\s*<scope>mfrom</scope>\s*<result>softfail</result>}s,
	'each record: its evaluation, identifiers and results');

# The check is not one that passes anything: a planted mistake fails it.
(my $broken = $xml) =~ s{<disposition>quarantine</disposition>}{<disposition>maybe</disposition>};
PostgreSQL::Test::Utils::append_to_file("$tmp/broken.xml", $broken);
run([ 'xmllint', '--noout', '--schema', $xsd, "$tmp/broken.xml" ], '>', \$lint_out, '2>', \$lint_err);
isnt($? >> 8, 0, 'a report with a disposition the schema does not know fails xmllint');

# Bad options.
for my $bad ([ [ '--day', 'yesterday' ], qr/--day takes a date, YYYY-MM-DD/ ],
	[ [ '--begin', '100', '--end', '50' ], qr/the period needs --begin before --end/ ],
	[ [ '--begin', 'soon' ], qr/--begin takes seconds since the epoch/ ])
{
	($rc, $out, $err) = report_tool(@{ $bad->[0] });
	is($rc, 64, "@{ $bad->[0] }: refused");
	like($err, $bad->[1], '... naming the problem');
}

is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
done_testing();
