#!/usr/bin/perl
# cpu-time.pl PID...: the CPU time used so far, in milliseconds, by each
# given process and all its descendants, one number per PID in order
# (=PID: that process alone).  Those that exited count too: the parent
# that reaped them holds their time (cutime, cstime), so a tree's total is
# the sum over its live processes of their own time and their reaped
# children's.
use strict;
use warnings;
use POSIX qw(sysconf _SC_CLK_TCK);

my $ticks = sysconf(_SC_CLK_TCK);
my (%children, %used, %own);

opendir my $proc, '/proc' or die "cannot read /proc: $!\n";
for my $pid (grep { /^\d+$/ } readdir $proc)
{
	open my $fh, '<', "/proc/$pid/stat" or next;
	my $stat = <$fh> // '';
	close $fh;
	# After the command name (which may hold spaces): state, ppid, ... utime
	# stime cutime cstime are fields 14 to 17 of the whole line.
	# (a process that exited between readdir and the read has no line)
	next if rindex($stat, ')') < 0;
	my @f = split ' ', substr($stat, rindex($stat, ')') + 2);
	next unless @f >= 15;
	push @{ $children{ $f[1] } }, $pid;
	$own{$pid} = $f[11] + $f[12];
	$used{$pid} = $own{$pid} + $f[13] + $f[14];
}
closedir $proc;

my @totals;
for my $root (@ARGV)
{
	if ($root =~ /^=(\d+)$/)
	{
		push @totals, sprintf('%.0f', ($own{$1} // 0) * 1000 / $ticks);
		next;
	}
	my @todo = ($root);
	my ($total, %seen) = (0);
	while (defined(my $pid = shift @todo))
	{
		next if $seen{$pid}++;
		$total += $used{$pid} // 0;
		push @todo, @{ $children{$pid} // [] };
	}
	push @totals, sprintf('%.0f', $total * 1000 / $ticks);
}
print "@totals\n";
