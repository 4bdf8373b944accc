# make run (scripts/run.sh) as root from a checkout in a directory owned by
# another user, as one cloned into a home directory: root, the cluster and
# the daemons are kept apart (the programs and the configuration root's
# alone, in a directory root's all the way up, so the Maildir helper
# trusts it), root logs in as pepsi-helper-auto-pay's role through the
# map, a message sent to its SMTP port lands in its maildir, an edit
# to the configuration survives make stop and a second make run, and make
# stop leaves no process behind.  It uses make run's fixed ports (5433,
# 2525, 8025): the only test that does.
use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/lib";
use RootTest;
use File::Path qw(remove_tree);
use IO::Socket::INET;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $top = $ENV{PEPSI_TOP} // "$FindBin::RealBin/..";
my $bin = $ENV{PEPSI_BIN} // "$top/build/bin";

for my $port (5433, 2525, 8025)
{
	plan skip_all => "port $port is taken: this test needs make run's ports"
	  if IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 1);
}

# The checkout: a copy of what make run uses, in a home directory of a user
# of its own (an ordinary user: not root, not the daemons').
my $homes = PostgreSQL::Test::Utils::tempdir();
my @owner = add_system_user('pepsi-clone', $homes);
my $checkout = "$homes/pepsi-clone/pepsi";
mkdir $checkout or die "$checkout: $!";
system('cp', '-r', "$top/scripts", "$top/docs", $checkout) == 0 or die 'cp failed';
mkdir "$checkout/build" or die "$checkout/build: $!";
system('cp', '-r', $bin, "$checkout/build/bin") == 0 or die 'cp failed';
system('chown', '-R', 'pepsi-clone:', $checkout) == 0 or die 'chown failed';

my $log = "$homes/run.log";
my ($run_pid, $run_dir);

# run.sh start in the background, its output in $log; the run's directory.
sub start_run
{
	unlink $log;
	$run_pid = fork // die "fork: $!";
	if ($run_pid == 0)
	{
		open STDIN, '<', '/dev/null';
		open STDOUT, '>', $log or die "$log: $!";
		open STDERR, '>&', \*STDOUT;
		exec 'bash', "$checkout/scripts/run.sh", 'start';
	}
	my $deadline = time + 180;
	while (time < $deadline)
	{
		my $out = -e $log ? slurp_file($log) : '';
		last if $out =~ /^Running;/m;
		if (waitpid($run_pid, 1) == $run_pid)
		{
			$run_pid = undef;
			last;
		}
		sleep 0.2;
	}
	my $out = slurp_file($log);
	($run_dir) = $out =~ /^  Config:\s+(\S+)\/pepsi\.conf$/m;
	return $out =~ /^Running;/m && defined $run_pid;
}

sub stop_run
{
	system('bash', "$checkout/scripts/run.sh", 'stop');
	if (defined $run_pid)
	{
		my $deadline = time + 60;
		while (time < $deadline && waitpid($run_pid, 1) != $run_pid) { sleep 0.1 }
		$run_pid = undef;
	}
}

# Processes of the run: what runs a program of its bin/ or the cluster's
# (or, @_ given, anything from the checkout or the run's directory).
sub leftover_pids
{
	my (@places) = @_ ? @_ : ("$run_dir/bin/", "$run_dir/pg");
	my @left;
	for my $proc (glob '/proc/[0-9]*')
	{
		my $exe = readlink "$proc/exe" // next;
		my $cmd = do { local $/; open my $fh, '<', "$proc/cmdline" or next; <$fh> } // '';
		$cmd =~ s/\0/ /g;
		push @left, $proc =~ s{^/proc/}{}r if grep { index("$exe $cmd", $_) >= 0 } @places;
	}
	return @left;
}

sub leftovers
{
	return '' unless defined $run_dir;
	return join "\n", map { "$_: " . (slurp_file("/proc/$_/cmdline") =~ s/\0/ /gr) } leftover_pids();
}

END
{
	my $status = $?;
	if (defined $run_pid || (defined $run_dir && -d "$run_dir/pids"))
	{
		stop_run();
	}
	$run_dir //= readlink "$checkout/run";
	# Whatever a failed stop left behind.
	my @left = leftover_pids($checkout, defined $run_dir ? ($run_dir) : ());
	kill 'KILL', @left if @left;
	# The run's directory root made elsewhere for this checkout.
	remove_tree($run_dir) if defined $run_dir && $run_dir =~ m{^/var/lib/pepsi-run/};
	$? = $status;
}

ok(start_run(), 'run.sh starts from a checkout in another user\'s home directory')
  or diag(slurp_file($log));
like($run_dir, qr{^/var/lib/pepsi-run/}, 'the run lives in a directory of root\'s');
is(readlink("$checkout/run"), $run_dir, 'and ./run links to it');

# Root, the cluster and the daemons apart.
my $conf = "$run_dir/pepsi.conf";
for my $path ($run_dir, "$run_dir/bin", "$run_dir/bin/pepsi-dispatch", $conf)
{
	my @st = stat $path;
	ok(@st && $st[4] == 0 && !($st[2] & 022), "$path is root's, writable by nobody else");
}
my @pg = stat "$run_dir/pg/data";
is(scalar(getpwuid($pg[4] // 0)), 'pepsi-pg', 'the cluster is its own user\'s');
my $dispatch_pid = -e "$run_dir/pids/pepsi-dispatch.pid" ? slurp_file("$run_dir/pids/pepsi-dispatch.pid") : "0";
chomp $dispatch_pid;
# (It drops root once started.)
my $uid = -1;
my $until = time + 30;
while (time < $until)
{
	last unless $dispatch_pid > 0 && -r "/proc/$dispatch_pid/status";
	($uid) = slurp_file("/proc/$dispatch_pid/status") =~ /^Uid:\s+\d+\s+(\d+)/m;
	last if $uid != 0;
	sleep 0.1;
}
is(scalar getpwuid($uid), 'pepsi', 'pepsi-dispatch runs as pepsi');

# pepsi-helper-auto-pay's login: root (as the set-user-id helper is), by
# peer authentication through the map, as pepsi_payer, with
# pepsi_autopay's rights and nothing more.
sub as_root_payer
{
	my ($sql) = @_;
	my $out = `psql -XAtq -h $run_dir/pg -p 5433 -U pepsi_payer -d pepsi -c "$sql" 2>&1`;
	return $? == 0 ? $out : $out =~ /permission denied/ ? "denied\n" : $out;
}
is(as_root_payer('SELECT current_user'), "pepsi_payer\n", 'root logs in as pepsi_payer through the map');
like(as_root_payer('SELECT pepsi.auto_pay_claim(0)'), qr/"pay": false/, 'and may ask to claim a payment');
is(as_root_payer('SELECT count(*) FROM pepsi.workqueue'), "denied\n", 'but not read the queue');
is(as_root_payer('SET ROLE pepsi_config'), "denied\n", 'nor take another role\'s rights');

# A message, through the Maildir helper, which must trust the configuration.
my $new = "$run_dir/maildir/you\@example.org/new";
my $swaks = `swaks --server 127.0.0.1:2525 --from alice\@example.org --to you\@example.org --h-Subject 'make run 130' 2>&1`;
like($swaks, qr/^<- +250 .*queued/mi, 'ingress accepts the message');
my $deadline = time + 60;
my @delivered;
while (time < $deadline && !(@delivered = glob "$new/*")) { sleep 0.2 }
is(scalar @delivered, 1, 'the message is delivered to the maildir')
  or diag(slurp_file($log));

# An edit, a stop, a start: the edit is kept, and nothing was left.
append_to_file($conf, "# edited by t/130\n");
stop_run();
is(leftovers(), '', 'make stop leaves no process of the run');
ok(!glob("$run_dir/pids/*.pid"), 'and no pid file');
ok(start_run(), 'run.sh starts again') or diag(slurp_file($log));
like(slurp_file($conf), qr/^# edited by t\/130$/m, 'the edit to pepsi.conf is kept');
like(slurp_file($log), qr/^Keeping \Q$conf\E/m, 'and run.sh says so');

# A second run.sh while one runs refuses, and a port taken is named.
my $again = `bash $checkout/scripts/run.sh start 2>&1`;
like($again, qr/running already/, 'a second start while running refuses');
stop_run();
is(leftovers(), '', 'the second make stop leaves no process either');
# A daemon that ends stops the whole run, saying which.
ok(start_run(), 'run.sh starts a third time') or diag(slurp_file($log));
my $ingress_pid = slurp_file("$run_dir/pids/pepsi-ingress.pid");
chomp $ingress_pid;
kill 'KILL', $ingress_pid;
my $ended = time + 60;
while (time < $ended && waitpid($run_pid, 1) != $run_pid) { sleep 0.1 }
ok(time < $ended, 'run.sh ends when pepsi-ingress does');
$run_pid = undef;
like(slurp_file($log), qr/pepsi-ingress ended .*stopping everything/, 'and says why');
is(leftovers(), '', 'and leaves no process');

my $squatter = IO::Socket::INET->new(LocalAddr => '127.0.0.1:2525', Listen => 1, ReuseAddr => 1)
  or die "listen 2525: $!";
my $taken = `bash $checkout/scripts/run.sh start 2>&1`;
like($taken, qr/port 2525 \(SMTP.*\) is taken.*PEPSI_SMTP_PORT/s, 'a port taken is named, with how to choose another');
close $squatter;
is(leftovers(), '', 'and nothing was started');

done_testing();
