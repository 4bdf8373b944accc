# The service units of dist/systemd, as "make install" writes them, pass
# systemd-analyze verify: every directive known and well-formed, every
# ExecStart executable.  A unit with a mistake planted in it fails, so the
# check is not one that passes whatever it is given.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(basename dirname);
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;

my $analyze = '/usr/bin/systemd-analyze';
plan skip_all => 'systemd-analyze is not installed' unless -x $analyze;

my $top = $ENV{PEPSI_TOP} // dirname(__FILE__) . '/..';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $bindir = dirname(pepsi_bin('pepsi-ingress'));
# The daemons' units: every service without a timer.  The oneshots their
# timers start (the failure bouncer's, the two report programs', the token
# refresh's) are checked below.
# (The telemetry collector's, another host's, is checked below.)
my @units = grep { (my $timer = $_) =~ s/\.service\.in$/.timer.in/; !-e $timer && !/pepsi-telemetry\.service/ }
  glob("$top/dist/systemd/*.service.in");
is(scalar @units, 3, 'three daemon units: pepsi-dispatch, pepsi-ingress, pepsi-httpd');

# What make install does to them (install-systemd), into a test directory.
sub install_unit
{
	my ($template, $edit) = @_;
	my $name = basename($template, '.in');
	my $text = PostgreSQL::Test::Utils::slurp_file($template);
	$text =~ s/\@BINDIR\@/$bindir/g;
	$text =~ s/\@SYSCONFDIR\@/\/etc/g;
	$text = $edit->($text) if $edit;
	open my $fh, '>', "$tmp/$name" or die "$tmp/$name: $!";
	print $fh $text;
	close $fh;
	return "$tmp/$name";
}

sub verify
{
	my ($path) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $analyze, 'verify', '--man=no', $path ], '>', \$out, '2>', \$err);
	return ($? >> 8, $out . $err);
}

for my $template (@units)
{
	my $unit = install_unit($template);
	my ($rc, $said) = verify($unit);
	is($rc, 0, basename($unit) . ' passes systemd-analyze verify');
	is($said, '', '... without a warning') or diag $said;
	my $text = PostgreSQL::Test::Utils::slurp_file($unit);
	like($text, qr/^Type=notify$/m, '... is Type=notify (sd_notify once ready)');
	like($text, qr/^WatchdogSec=/m, '... with a watchdog');
	# Each of the three reads its file again on SIGHUP: systemctl reload.
	like($text, qr/^ExecReload=\/bin\/kill -HUP \$MAINPID$/m, '... reloads with SIGHUP');
	if (basename($unit) eq 'pepsi-dispatch.service')
	{
		unlike($text, qr/^User=/m, '... started as root: it becomes [dispatch] USER itself');
	}
	else
	{
		like($text, qr/^User=pepsi$/m, '... runs as pepsi');
	}
	like($text, qr/^ProtectSystem=(strict|full)$/m, '... with the system read-only');
}

# pepsi-failure-bouncer, pepsi-dmarc-report, pepsi-tlsrpt and
# pepsi-secure-link expire: each a oneshot service and the timer that
# starts it on a calendar (the timer is verified with its service beside
# it, as installed).
for my $program (qw(pepsi-failure-bouncer pepsi-dmarc-report pepsi-tlsrpt pepsi-telemetry-client
	pepsi-secure-link-expire))
{
	my $service = install_unit("$top/dist/systemd/$program.service.in");
	my $timer = install_unit("$top/dist/systemd/$program.timer.in");
	for my $unit ($service, $timer)
	{
		my ($rc, $said) = verify($unit);
		is($rc, 0, basename($unit) . ' passes systemd-analyze verify');
		is($said, '', '... without a warning') or diag $said;
	}
	my $text = PostgreSQL::Test::Utils::slurp_file($service);
	like($text, qr/^Type=oneshot$/m, "$program is a oneshot");
	like($text, qr/^User=pepsi$/m, '... runs as pepsi');
	like($text, qr/^NoNewPrivileges=yes$/m, '... and can never gain privileges');
	like(PostgreSQL::Test::Utils::slurp_file($timer), qr/^OnCalendar=/m, '... its timer runs it on a calendar');
}

# The settings that set no_new_privs as NoNewPrivileges=yes does, for a
# unit without CAP_SYS_ADMIN (User= set): systemd.exec(5), "NoNewPrivileges=yes
# is implied".  With it no set-id program gains its bits.
my @implies_no_new_privileges = qw(PrivateDevices ProtectKernelTunables ProtectKernelModules
  ProtectKernelLogs ProtectClock ProtectHostname RestrictAddressFamilies RestrictNamespaces
  LockPersonality MemoryDenyWriteExecute RestrictRealtime RestrictSUIDSGID SystemCallFilter
  SystemCallArchitectures SystemCallLog DynamicUser);
sub sets_no_new_privileges
{
	my ($text) = @_;
	my %set = map { /^(\w+)=(.*)$/ ? ($1 => $2) : () } split /\n/, $text;
	my @why;

	push @why, 'NoNewPrivileges=yes' if ($set{NoNewPrivileges} // 'no') =~ /^(yes|true|on|1)$/;
	push @why, 'RestrictSUIDSGID=yes' if ($set{RestrictSUIDSGID} // 'no') =~ /^(yes|true|on|1)$/;
	if (defined $set{User} && $set{User} ne 'root')
	{
		push @why, map { "$_= with User=" } grep { defined $set{$_} && $set{$_} !~ /^(no|false|off|0|)$/ }
		  @implies_no_new_privileges;
	}
	return @why;
}
my $ingress = PostgreSQL::Test::Utils::slurp_file("$tmp/pepsi-ingress.service");
like($ingress, qr/^CapabilityBoundingSet=CAP_NET_BIND_SERVICE$/m, 'ingress keeps only the right to bind port 25');
like($ingress, qr/^NoNewPrivileges=yes$/m, 'ingress can never gain privileges');
my @why = sets_no_new_privileges(PostgreSQL::Test::Utils::slurp_file("$tmp/pepsi-dispatch.service"));
is("@why", '', 'the dispatcher may run the set-id delivery stages and helpers: nothing sets no_new_privs');
is(join(' ', sets_no_new_privileges("User=pepsi\nLockPersonality=yes\n")), 'LockPersonality= with User=',
	'(a setting that implies it under User= is seen)');

# pepsi-helper-token-refresh: a oneshot service its timer starts.
my @timers = glob("$top/dist/systemd/*.timer.in");
is( join(' ', map { basename($_, '.timer.in') } sort @timers),
	'pepsi-dmarc-report pepsi-failure-bouncer pepsi-keydisc pepsi-secure-link-expire pepsi-telemetry-client'
	  . ' pepsi-tlsrpt pepsi-token-refresh',
	'seven timers: the failure bouncer\'s, the two reports\', pepsi-keydisc\'s, the portal\'s expiry,'
	  . ' the telemetry report\'s and pepsi-token-refresh');
like(PostgreSQL::Test::Utils::slurp_file(install_unit("$top/dist/systemd/pepsi-secure-link-expire.service.in")),
	qr{^ExecStart=\Q$bindir\E/pepsi-secure-link -C /etc/pepsi/pepsi\.conf expire$}m,
	'the portal\'s timer runs pepsi-secure-link expire');

# pepsi-keydisc: a oneshot every minute, as the user whose peer
# authentication is the pepsi_crypto role's.
for my $template (map { "$top/dist/systemd/pepsi-keydisc.$_.in" } qw(service timer))
{
	my $unit = install_unit($template);
	my ($rc, $said) = verify($unit);
	is($rc, 0, basename($unit) . ' passes systemd-analyze verify');
	is($said, '', '... without a warning') or diag $said;
}
my $keydisc = PostgreSQL::Test::Utils::slurp_file("$tmp/pepsi-keydisc.service");
like($keydisc, qr/^Type=oneshot$/m, 'pepsi-keydisc is a oneshot');
like($keydisc, qr{^ExecStart=\Q$bindir\E/pepsi-keydisc -c /etc/pepsi/pepsi\.conf$}m, '... of pepsi-keydisc');
like($keydisc, qr/^User=pepsi-crypto$/m, '... runs as pepsi-crypto ([crypto] CONNINFO\'s peer authentication)');
like($keydisc, qr/^NoNewPrivileges=yes$/m, '... and can never gain privileges');
like(PostgreSQL::Test::Utils::slurp_file("$tmp/pepsi-keydisc.timer"), qr/^OnUnitActiveSec=1min$/m,
	'... started every minute by its timer');
for my $template (map { "$top/dist/systemd/pepsi-token-refresh.$_.in" } qw(service timer))
{
	my $unit = install_unit($template);
	my ($rc, $said) = verify($unit);
	is($rc, 0, basename($unit) . ' passes systemd-analyze verify');
	is($said, '', '... without a warning') or diag $said;
}
my $refresh = PostgreSQL::Test::Utils::slurp_file("$tmp/pepsi-token-refresh.service");
like($refresh, qr/^Type=oneshot$/m, 'the token refresh is a oneshot');
like($refresh, qr/^NoNewPrivileges=yes$/m, '... that can never gain privileges');
like(PostgreSQL::Test::Utils::slurp_file("$tmp/pepsi-token-refresh.timer"), qr/^OnUnitActiveSec=5min$/m,
	'... started every five minutes by its timer');

my $broken = install_unit($units[0], sub { my $t = shift; $t =~ s/^Restart=.*$/Restart=sometimes/m; $t });
my ($rc, $said) = verify($broken);
like($said, qr/restart specifier/, 'a planted mistake is reported');

# The telemetry collector (pepsi-telemetry's package, another host): a
# daemon of its own account, which reads its own file.
{
	my $unit = install_unit("$top/dist/systemd/pepsi-telemetry.service.in");
	my ($rc, $said) = verify($unit);
	is($rc, 0, 'pepsi-telemetry.service passes systemd-analyze verify');
	is($said, '', '... without a warning') or diag $said;
	my $text = PostgreSQL::Test::Utils::slurp_file($unit);
	like($text, qr/^Type=notify$/m, '... is Type=notify');
	like($text, qr/^WatchdogSec=/m, '... with a watchdog');
	like($text, qr/^User=pepsi-telemetry$/m, '... runs as pepsi-telemetry');
	like($text, qr/ -c \/etc\/pepsi-telemetry\/pepsi-telemetry\.conf$/m, '... from its own file');
	like($text, qr/^NoNewPrivileges=yes$/m, '... and can never gain privileges');
}

done_testing();
