# Health and version: every program answers --version (its name, "Pepsi"
# and the version) and --help (its usage on standard output, status 0),
# standalone and through the multi-call binary; pepsi-httpd's /healthz
# answers 200 while the database answers and the dispatcher runs, 503
# with the reason otherwise (the dispatcher stopped, the database
# stopped), and /metrics carries pepsi_up and pepsi_build_info;
# pepsi-config check validates a file without starting anything, naming
# the file, line, option and rule of a mistake; pepsi-status exits
# non-zero when it prints an ALERT.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(basename dirname);
use HTTP::Tiny;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $top = $ENV{PEPSI_TOP} // dirname(__FILE__) . '/..';
my $version = do
{
	my $meta = PostgreSQL::Test::Utils::slurp_file("$top/META.json");
	$meta =~ /"version":\s*"([^"]+)"/ or die 'no version in META.json';
	$1;
};

sub run_program
{
	my (@command) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run(\@command, '<', \'', '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

# --version and --help, every program, standalone and multi-call.
my $bindir = dirname(pepsi_bin('pepsi-dispatch'));
my @programs = grep { !/^pepsi-(test|helper)-/ && !/\.d$/ } map { basename($_) } glob("$bindir/pepsi-*");
cmp_ok(scalar @programs, '>=', 20, 'the programs are found') or diag "@programs";
# The multi-call binary's programs, as its usage lists them (not the set-id stages).
my ($rc, $out, $err) = run_program("$bindir/pepsi");
my %multi = map { $_ => 1 } $err =~ /^programs: (.*)$/m ? split(' ', $1) : ();
cmp_ok(scalar keys %multi, '>=', 20, 'the multi-call binary lists its programs') or diag $err;
for my $program (@programs)
{
	for my $how ([ "$bindir/$program" ], $multi{$program} ? ([ "$bindir/pepsi", $program ]) : ())
	{
		my $label = @$how == 1 ? $program : "pepsi $program";
		my ($rc, $out, $err) = run_program(@$how, '--version');
		is($rc, 0, "$label --version exits 0") or diag $err;
		is($out, "$program (Pepsi) $version\n", "... and prints its name and version");
		($rc, $out, $err) = run_program(@$how, '--help');
		is($rc, 0, "$label --help exits 0") or diag $err;
		like($out, qr/^usage: \Q$program\E /, '... printing the usage on standard output');
		is($err, '', '... and nothing on standard error');
	}
}
($rc, $out, $err) = run_program("$bindir/pepsi", '--version');
is($rc, 0, 'pepsi --version exits 0');
is($out, "pepsi (Pepsi) $version\n", '... naming the multi-call binary');
($rc, $out, $err) = run_program("$bindir/pepsi", '--help');
is($rc, 0, 'pepsi --help exits 0');
like($out, qr/^usage: pepsi PROGRAM/, '... with the usage on standard output');
($rc, $out, $err) = run_program("$bindir/pepsi-keys", 'generate', '--bogus');
is($rc, 64, 'a wrong option still exits 64');
like($err, qr/^usage: pepsi-keys/m, '... with the usage on standard error');

# pepsi-config check: a good file, then mistakes.
my $tmp = PostgreSQL::Test::Utils::tempdir();
sub config_check
{
	my ($text) = @_;
	my $path = "$tmp/check.conf";
	open my $fh, '>', $path or die "$path: $!";
	print $fh $text;
	close $fh;
	return run_program(pepsi_bin('pepsi-config'), 'check', $path);
}
($rc, $out, $err) = config_check("[database]\nCONNINFO = dbname=nowhere host=/nonexistent\n"
	  . "[dispatch]\nPOLL_INTERVAL = 2s\n");
is($rc, 0, 'pepsi-config check accepts a good file without connecting anywhere') or diag $err;
like($out, qr/\Q$tmp\E\/check\.conf: OK/, '... and says so');
($rc, $out, $err) = config_check("[database]\nCONNINFO = dbname=x\n[dispatch]\n\nPOLL_INTERVAL = banana\n");
isnt($rc, 0, 'pepsi-config check refuses a bad duration');
like($err, qr/check\.conf:5: \[dispatch\] POLL_INTERVAL = banana: POLL_INTERVAL is a duration/,
	'... naming the file, line, option and rule');
($rc, $out, $err) = config_check("[stage-init]\nPROGRAM = pepsi-stage-discard\nPARALLELISM = 5000\n");
is($rc, 78, 'pepsi-config check refuses a value out of range, exit status EX_CONFIG');
like($err, qr/check\.conf:3: \[stage-init\] PARALLELISM = 5000: PARALLELISM is a whole number from 1 to 1024/,
	'... naming the file, line, option and range');
($rc, $out, $err) = config_check("[dispatch]\nNO_SUCH_OPTION = 1\n");
isnt($rc, 0, 'pepsi-config check refuses an unknown option');
like($err, qr/check\.conf:2: \[dispatch\] has no option NO_SUCH_OPTION/, '... naming file, line and option');
($rc, $out, $err) = run_program(pepsi_bin('pepsi-config'), 'check', "$tmp/missing.conf");
isnt($rc, 0, 'pepsi-config check of a missing file fails');
like($err, qr/missing\.conf/, '... naming it');

# A cluster, a dispatcher, pepsi-httpd.
my $node = dispatch_node('health');
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = write_config($node, path => "$tmp/pepsi.conf", stages => real_stages());
{
	open my $fh, '>>', $conf or die "$conf: $!";
	print $fh "[httpd]\nADDRESS = 127.0.0.1\nPORT = $port\n";
	close $fh;
}
my $httpd;
END { kill 'KILL', $httpd->{pid} if $httpd && !defined $httpd->{status} }
$httpd = start_dispatcher($conf, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts');
my $http = HTTP::Tiny->new(timeout => 10, max_redirect => 0);
my $base = "http://127.0.0.1:$port";

my $r = $http->get("$base/healthz");
is($r->{status}, 503, '/healthz without a dispatcher answers 503');
like($r->{content}, qr/dispatch/i, '... saying the dispatcher is not running') or diag $r->{content};
my $metrics = $http->get("$base/metrics")->{content};
my ($parsed, $samples) = prometheus_samples($metrics);
ok($parsed, '/metrics parses') or diag $samples;
is($samples->{'pepsi_up{}'} // 'none', '0.0', 'pepsi_up is 0 without a dispatcher') or diag $metrics;
is($samples->{"pepsi_build_info{version=$version}"} // 'none', '1.0', 'pepsi_build_info carries the version')
  or diag explain $samples;

my $dispatcher = start_dispatcher($conf, log => "$tmp/dispatch.log");
ok(poll_until(sub { $http->get("$base/healthz")->{status} == 200 }),
	'/healthz answers 200 once the dispatcher runs');
($parsed, $samples) = prometheus_samples($http->get("$base/metrics")->{content});
is($samples->{'pepsi_up{}'} // 'none', '1.0', 'pepsi_up is 1');

# pepsi-status: no alert, exit 0; an alert, exit 1.
($rc, $out, $err) = run_program(pepsi_bin('pepsi-status'), '-C', $conf);
is($rc, 0, 'pepsi-status without an alert exits 0') or diag $err;
unlike($out, qr/ALERT/, '... and prints none');
unlike($out, qr/WARNING/, '... nor a warning: the stages need fewer connections than max_connections');
# Stage workers beyond max_connections (40 in this cluster, 3 reserved): a
# warning naming the options, and exit status 0 (a warning is no alert).
my $crowded = "$tmp/crowded.conf";
{
	my $text = PostgreSQL::Test::Utils::slurp_file($conf);
	$text =~ s/^\[stage-drop\]\n/[stage-drop]\nPARALLELISM = 30\n/m or die 'no [stage-drop]';
	$text .= "[listener-smtp]\nADDRESS = 127.0.0.1\nPORT = 2525\n";
	open my $fh, '>', $crowded or die "$crowded: $!";
	print $fh $text;
	close $fh;
}
($rc, $out, $err) = run_program(pepsi_bin('pepsi-status'), '-C', $crowded);
is($rc, 0, 'pepsi-status with too many connections configured exits 0') or diag $err;
like($out, qr/^WARNING: the configuration may open 45 database connections at once \(37 stage workers.*pepsi-ingress 6.*pepsi-httpd 1\), more than the 37 the server leaves to ordinary roles: raise max_connections \(now 40\)/m,
	'... warning that they exceed max_connections, with the count and the options') or diag $out;
($rc, $out, $err) = run_program(pepsi_bin('pepsi-status'), '-C', $crowded, '--json');
like($out, qr/"warnings": \[\s*"the configuration may open 45/, '... in JSON too');
$node->safe_psql('postgres',
	'UPDATE pepsi.dispatch_stats SET crash_failures = 1, last_crash_failure_at = now()');
($rc, $out, $err) = run_program(pepsi_bin('pepsi-status'), '-C', $conf);
like($out, qr/^ALERT: /m, 'pepsi-status prints an ALERT');
is($rc, 1, '... and exits 1');
($rc, $out, $err) = run_program(pepsi_bin('pepsi-status'), '-C', $conf, '--json');
is($rc, 1, '... in JSON too');

# The database stopped: 503, naming the database.
$node->stop('fast');
$r = $http->get("$base/healthz");
is($r->{status}, 503, '/healthz with the database stopped answers 503');
like($r->{content}, qr/database/, '... saying the database does not answer');
($parsed, $samples) = prometheus_samples($http->get("$base/metrics")->{content});
is($samples->{'pepsi_up{}'} // 'none', '0.0', 'pepsi_up is 0 with the database stopped') or diag explain $samples;
$node->start;
ok(poll_until(sub { $http->get("$base/healthz")->{status} == 200 }, 60),
	'/healthz answers 200 again once the database and the dispatcher are back');

stop_dispatcher($dispatcher);
stop_dispatcher($httpd);
done_testing();
