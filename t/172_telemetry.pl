# Telemetry end to end: pepsi-telemetry-client against a real
# pepsi-telemetry collector (HTTPS with a test CA, its own database and
# role on the test cluster).  The client sends nothing while off (the
# default) and makes no install id; --dry-run prints the report, whose
# keys are checked against the allow-list of pepsi-telemetry-client(8)
# (and the check is shown to catch an added key), which carries no
# address, no host name and no stage or third-party program name unless
# allowed; the volumes are pepsi.stats_daily's days.  Sent, the collector
# stores exactly that report and its totals page (under a strict CSP)
# shows the install, the version and the volumes by day.  A second report
# within MIN_INTERVAL gets 429; reports with an unknown key, a wrong type,
# too many entries, an oversized body or no JSON get 400 with the reason
# and nothing is stored; a collector whose certificate the client's CA
# does not vouch for gets nothing.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $top = $ENV{PEPSI_TOP} // dirname(__FILE__) . '/..';
my $db = 'postgres';
my $node = dispatch_node('telemetry');
my $tmp = PostgreSQL::Test::Utils::tempdir();
sub sql { return $node->safe_psql($db, shift); }
sub tsql { return $node->safe_psql('pepsi_telemetry', shift); }

# The collector's own database, from its own SQL file, and its own role.
$node->safe_psql($db, 'CREATE DATABASE pepsi_telemetry');
$node->command_ok([ 'psql', '-X', '-q', '-d', $node->connstr('pepsi_telemetry'), '-f',
		"$top/daemons/telemetry/telemetry.sql" ], 'telemetry.sql makes the collector\'s schema');
tsql('CREATE ROLE collector LOGIN IN ROLE pepsi_telemetry');
sql('CREATE ROLE monitor LOGIN IN ROLE pepsi_monitor');
is($node->psql('pepsi_telemetry', 'SELECT count(*) FROM telemetry.report', extra_params => [ '-U', 'collector' ]),
	3, 'the collector\'s role reads no table itself');

# A test CA, the collector's certificate for 127.0.0.1, and another CA.
sub openssl { system('openssl', @_) == 0 or die "openssl @_ failed" }
for my $ca (qw(ca other-ca))
{
	openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
		'-keyout', "$tmp/$ca-key.pem", '-out', "$tmp/$ca.pem", '-days', '2', '-subj', "/CN=Pepsi test $ca",
		'-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign');
}
openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
	'-keyout', "$tmp/collector-key.pem", '-out', "$tmp/collector.csr", '-subj', '/CN=127.0.0.1');
PostgreSQL::Test::Utils::append_to_file("$tmp/collector.ext", "subjectAltName=IP:127.0.0.1\n");
openssl('x509', '-req', '-in', "$tmp/collector.csr", '-CA', "$tmp/ca.pem", '-CAkey', "$tmp/ca-key.pem",
	'-CAcreateserial', '-out', "$tmp/collector.pem", '-days', '2', '-extfile', "$tmp/collector.ext");
chmod 0600, "$tmp/collector-key.pem";

# The collector, on its own file.
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $collector_conf = "$tmp/pepsi-telemetry.conf";
PostgreSQL::Test::Utils::append_to_file($collector_conf,
	"[telemetry-collector]\nADDRESS = 127.0.0.1\nPORT = $port\nCERTIFICATE = $tmp/collector.pem\n"
	  . "KEY = $tmp/collector-key.pem\nMIN_INTERVAL = 1h\nMAX_DAYS = 31\nMAX_BODY = 16k\n"
	  . 'CONNINFO = host=' . $node->host . ' port=' . $node->port . " dbname=pepsi_telemetry user=collector\n");
my $collector_log = "$tmp/collector.log";
my $collector_pid = fork // die "fork: $!";
if ($collector_pid == 0)
{
	open STDOUT, '>>', $collector_log or die "cannot write $collector_log: $!";
	open STDERR, '>&', \*STDOUT or die "dup: $!";
	exec pepsi_bin('pepsi-telemetry'), '-c', $collector_conf, '-v' or die "exec: $!";
}
END { kill 'TERM', $collector_pid if $collector_pid; }
ok(poll_until(sub { -e $collector_log && PostgreSQL::Test::Utils::slurp_file($collector_log) =~ /ready/ }),
	'the collector starts') or diag PostgreSQL::Test::Utils::slurp_file($collector_log);
my $url = "https://127.0.0.1:$port";
my $https = HTTP::Tiny->new(verify_SSL => 1, SSL_options => { SSL_ca_file => "$tmp/ca.pem" }, timeout => 20);

# Volumes: the minute roll keeps today's totals; three earlier days stand
# for the maintenance worker's first rolls of those days.
sql('SELECT pepsi.stats_minute_roll()');
is(sql("SELECT count(*) FROM pepsi.stats_day WHERE day = (now() AT TIME ZONE 'UTC')::date"), 1,
	'the minute roll keeps today\'s totals in pepsi.stats_day');
sql(<<'SQL');
UPDATE pepsi.stats_day SET received = 200, sent = 175, deferred = 12, bounced = 4;
INSERT INTO pepsi.stats_day (day, received, sent, deferred, bounced)
SELECT (now() AT TIME ZONE 'UTC')::date - d, r, s, f, b
FROM (VALUES (3, 100, 90, 5, 2), (2, 150, 130, 8, 3), (1, 180, 160, 9, 3)) AS v (d, r, s, f, b);
SQL
my @expected_days = map {
	my ($ago, @counts) = @$_;
	my %day = (day => sql("SELECT ((now() AT TIME ZONE 'UTC')::date - $ago)::text"));
	@day{qw(received delivered deferred bounced)} = @counts;
	\%day;
} ([ 3, 50, 40, 3, 1 ], [ 2, 30, 30, 1, 0 ], [ 1, 20, 15, 3, 1 ]);

# pepsi.conf: a host name, a third-party stage and names of the operator's own.
my $id_file = "$tmp/install-id";
sub client_config
{
	my ($telemetry) = @_;
	my $path = "$tmp/pepsi-" . int(rand(1e9)) . '.conf';
	write_config($node, path => $path, pepsi => { HOSTNAME => 'mx.secret-host.test' },
		stages => "[stage-init]\nPROGRAM = pepsi-stage-route\nNEXT_STAGE = acme-filter\nBOUNCE_STAGE = bounce\n"
		  . "[stage-acme-filter]\nPROGRAM = /opt/acme/bin/acme-secret-filter\nNEXT_STAGE = deliver\n"
		  . "[stage-bounce]\nPROGRAM = pepsi-stage-bounce\nNEXT_STAGE = deliver\n"
		  . "[stage-deliver]\nPROGRAM = pepsi-stage-discard\n"
		  . "[telemetry]\nINSTALL_ID_FILE = $id_file\nRETRY_DELAY = 0\n$telemetry");
	# (MONITOR_CONNINFO: the client reads as a member of pepsi_monitor.)
	my $text = PostgreSQL::Test::Utils::slurp_file($path);
	$text =~ s/^(CONNINFO = .*)$/$1\nMONITOR_CONNINFO = $1 user=monitor/m;
	$text =~ s/MONITOR_CONNINFO = CONNINFO = /MONITOR_CONNINFO = /;
	open my $fh, '>', $path or die $!;
	print $fh $text;
	close $fh;
	return $path;
}
sub client
{
	my ($config, @args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-telemetry-client'), '-C', $config, @args ], '<', \'', '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}
sub reports { return tsql('SELECT count(*) FROM telemetry.report'); }

# Off by default: nothing sent, nothing made, nothing connected to.
my $enabled = "URL = $url/report\nCA_FILE = $tmp/ca.pem\n";
my ($rc, $out, $err) = client(client_config($enabled));
is($rc, 0, 'the client off by default exits 0') or diag $err;
like($err, qr/telemetry is off \(\[telemetry\] ENABLED = no\): nothing sent/, '... saying it is off');
is(reports(), 0, '... and the collector got nothing');
ok(!-e $id_file, '... nor did it make an install id');

# The allow-list of pepsi-telemetry-client(8): every key of the report.
my %allowed = (
	'' => [qw(schema install_id version extension_version hostname days stages)],
	days => [qw(day received delivered deferred bounced)],
	stages => [qw(name program next bounce)]);
sub off_list_keys
{
	my ($report) = @_;
	my @bad;
	my %top = map { $_ => 1 } @{ $allowed{''} };
	for my $key (sort keys %$report)
	{
		push @bad, $key and next unless $top{$key};
		next unless $allowed{$key};
		push @bad, "$key is not a list" and next unless ref $report->{$key} eq 'ARRAY';
		my %inner = map { $_ => 1 } @{ $allowed{$key} };
		for my $entry (@{ $report->{$key} })
		{
			push @bad, "$key entry is not an object" and next unless ref $entry eq 'HASH';
			push @bad, map { "$key.$_" } grep { !$inner{$_} || ref $entry->{$_} } sort keys %$entry;
		}
	}
	return @bad;
}

# --dry-run prints exactly the report, on or off.
my $dry_config = client_config('');
($rc, $out, $err) = client($dry_config, '--dry-run');
is($rc, 0, '--dry-run exits 0 while off') or diag $err;
my $report = eval { decode_json($out) };
ok($report, '... printing the report as JSON') or diag $out;
is_deeply([ off_list_keys($report) ], [], 'every key of the report is on the allow-list') or diag $out;
my %with_extra = (%$report, client_ip => '127.0.0.1');
is_deeply([ off_list_keys(\%with_extra) ], ['client_ip'], '... and the check fails on an added key');
my @nested = @{ $report->{stages} };
$nested[0] = { %{ $nested[0] }, address => 'x' };
is_deeply([ off_list_keys({ %$report, stages => \@nested }) ], ['stages.address'], '... nested too');
like($report->{install_id}, qr/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
	'the install id is a random (version 4) UUID');
is(PostgreSQL::Test::Utils::slurp_file($id_file), "$report->{install_id}\n", '... kept in INSTALL_ID_FILE');
is($report->{schema}, 1, 'the report says its format');
my $version = (PostgreSQL::Test::Utils::slurp_file("$top/META.json") =~ /"version":\s*"([^"]+)"/)[0];
is($report->{version}, $version, '... Pepsi\'s version');
is($report->{extension_version}, sql("SELECT extversion FROM pg_extension WHERE extname = 'pepsi'"),
	'... the extension\'s');
is_deeply($report->{days}, \@expected_days, '... the volumes of the complete days, from pepsi.stats_daily');
is_deeply($report->{stages}, [
		{ name => 'stage1', program => 'pepsi-stage-route', next => 'stage2', bounce => 'stage3' },
		{ name => 'stage2', program => 'other', next => 'stage4' },
		{ name => 'stage3', program => 'pepsi-stage-bounce', next => 'stage4' },
		{ name => 'stage4', program => 'pepsi-stage-discard' } ],
	'... the stage graph\'s shape, the names anonymised');
unlike($out, qr/secret-host|acme|filter|monitor|\@|127\.0\.0/, '... and no host name, stage name or address');
($rc, $out, $err) = client(client_config("SEND_STAGE_NAMES = yes\nSEND_HOSTNAME = yes\n"), '--dry-run');
my $named = decode_json($out);
is($named->{hostname}, 'mx.secret-host.test', 'SEND_HOSTNAME sends [pepsi] HOSTNAME');
is_deeply([ map { "$_->{name}:$_->{program}" } @{ $named->{stages} } ],
	[qw(init:pepsi-stage-route acme-filter:acme-secret-filter bounce:pepsi-stage-bounce deliver:pepsi-stage-discard)],
	'SEND_STAGE_NAMES sends the names');
is($named->{install_id}, $report->{install_id}, 'the install id stays the same');

# Sent: stored as printed, and on the totals page.
my $on = client_config("ENABLED = yes\n$enabled");
($rc, $out, $err) = client($on);
is($rc, 0, 'the client sends its report') or diag $err;
like($err, qr/sent to \Q$url\E\/report: HTTP 200/, '... logging the collector\'s answer');
is(reports(), 1, 'the collector stored one report');
is_deeply(decode_json(tsql('SELECT payload FROM telemetry.report')), $report,
	'... exactly the report --dry-run printed');
is(tsql("SELECT string_agg(format('%s %s %s %s %s', day, received, delivered, deferred, bounced), '; ' ORDER BY day)"
		  . ' FROM telemetry.volume'),
	join('; ', map { "$_->{day} $_->{received} $_->{delivered} $_->{deferred} $_->{bounced}" } @expected_days),
	'... and its volumes by day');
my $page = $https->get("$url/");
is($page->{status}, 200, 'the totals page answers') or diag "$page->{status} $page->{content}";
is($page->{headers}{'content-security-policy'},
	"default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'", '... under a strict CSP');
like($page->{content}, qr{<tr><td>1</td><td>1</td><td>1</td></tr>}, '... showing one install and one report');
like($page->{content}, qr{<tr><td>\Q$version\E</td><td>\Q$report->{extension_version}\E</td><td>1</td></tr>},
	'... its version');
like($page->{content}, qr{<tr><td>$_->{day}</td><td>1</td><td>$_->{received}</td><td>$_->{delivered}</td>}, "... the volumes of $_->{day}")
  for @expected_days;

# Again within MIN_INTERVAL: 429, not retried, nothing stored.
($rc, $out, $err) = client($on);
is($rc, 75, 'a second report within MIN_INTERVAL is refused for now') or diag $err;
like($err, qr/HTTP 429 .*MIN_INTERVAL/, '... naming the rate limit');
unlike($err, qr/trying again/, '... and not retried') or diag $err;
is(reports(), 1, '... and not stored');

# Bad reports, posted by hand: 400 with the reason, nothing stored.
sub post
{
	my ($body, $type) = @_;
	return $https->post("$url/report", { content => $body, headers => { 'Content-Type' => $type // 'application/json' } });
}
my %fresh = (%$report, install_id => '0b6f0a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b');
my @bad = (
	[ { %fresh, addresses => ['a@example.org'] }, qr/unknown key \\"addresses\\"/, 'an unknown key' ],
	[ { %fresh, days => [ { %{ $expected_days[0] }, received => '50' } ] }, qr/days\[0\]\.received\\" must be an integer/,
		'a wrong type' ],
	[ { %fresh, days => [ { %{ $expected_days[0] }, city => 'x' } ] }, qr/days\[0\]: unknown key \\"city\\"/,
		'an unknown nested key' ],
	[ { %fresh, days => [ map { { %{ $expected_days[0] }, day => sprintf('2026-01-%02d', $_) } } 1 .. 31 ],
		stages => [ ({ name => 'x', program => 'y' }) x 65 ] },
		qr/\\"stages\\" has 65 entries, more than 64 \(\[telemetry-collector\] MAX_STAGES\)/, 'too many entries' ],
	[ { %fresh, version => '<script>' }, qr/\\"version\\" must be a version/, 'markup in a string' ],
	[ { %fresh, schema => 2 }, qr/\\"schema\\" must be the integer 1/, 'another format' ],
	[ { %fresh, days => [ $expected_days[0], $expected_days[0] ] }, qr/is there twice/, 'a day twice' ]);
for my $case (@bad)
{
	my ($body, $reason, $what) = @$case;
	my $res = post(encode_json($body));
	is($res->{status}, 400, "$what: 400");
	like($res->{content}, $reason, '... with the reason') or diag $res->{content};
}
my $res = post('{"schema": 1,');
is($res->{status}, 400, 'no JSON: 400');
like($res->{content}, qr/not JSON/, '... saying so');
$res = post(encode_json({ %fresh, pad => 'x' x 20000 }));
is($res->{status}, 400, 'an oversized body: 400');
like($res->{content}, qr/larger than 16384 bytes \(\[telemetry-collector\] MAX_BODY\)/, '... naming the limit');
$res = post(encode_json(\%fresh), 'text/plain');
is($res->{status}, 415, 'another content type: 415');
is(reports(), 1, 'no bad report was stored');
is(tsql('SELECT count(*) FROM telemetry.install'), 1, '... nor its install');
$res = post(encode_json(\%fresh));
is($res->{status}, 200, 'the same report, fixed, is stored') or diag $res->{content};
is(reports(), 2, '... as a second report');

# A collector the client's CA does not vouch for gets nothing.
unlink $id_file;
($rc, $out, $err) = client(client_config("ENABLED = yes\nURL = $url/report\nCA_FILE = $tmp/other-ca.pem\n"));
is($rc, 77, 'a certificate that does not verify: nothing sent') or diag $err;
like($err, qr/certificate.*CA_FILE/i, '... saying why');
unlike($err, qr/trying again/, '... and not retried');
is(reports(), 2, '... and nothing stored');
($rc, $out, $err) = client(client_config("ENABLED = yes\nURL = http://127.0.0.1:$port/report\n"));
is($rc, 78, 'an http: URL is refused');
like($err, qr/\[telemetry\] URL must be the collector's https: address/, '... saying so');

done_testing();
