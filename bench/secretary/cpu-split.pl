#!/usr/bin/perl
# cpu-split.pl POSTMASTER INGRESS DISPATCH [PID=GROUP]...: the CPU time used
# so far, in clock ticks, by who spent it, one tab-separated line each:
#   pid PID backend GROUP       each backend given as PID=GROUP (its
#                               application_name, from pg_stat_activity)
#   pid PID worker COMMAND      each stage worker (a child of the
#                               dispatcher), with the children it reaped
#   total postgres              the cluster's whole tree (the backends
#                               that exited, reaped by the postmaster,
#                               included)
#   total ingress               pepsi-ingress and its descendants
#   total dispatch              pepsi-dispatch alone
# A process's own time is lost to its group when it exits (a worker
# recycled after MAX_MESSAGES, its backend with it): snapshots taken
# often enough keep the last figure of each pid (run.sh's cpu_sampler).
use strict;
use warnings;

my ($postmaster, $ingress, $dispatch, @backends) = @ARGV;
my (%children, %own, %used);

opendir my $proc, '/proc' or die "cannot read /proc: $!\n";
for my $pid (grep { /^\d+$/ } readdir $proc)
{
	open my $fh, '<', "/proc/$pid/stat" or next;
	my $stat = <$fh> // '';
	close $fh;
	next if rindex($stat, ')') < 0;
	my @f = split ' ', substr($stat, rindex($stat, ')') + 2);
	next unless @f >= 15;
	push @{ $children{ $f[1] } }, $pid;
	$own{$pid} = $f[11] + $f[12];
	$used{$pid} = $own{$pid} + $f[13] + $f[14];
}
closedir $proc;

sub tree
{
	my @todo = @_;
	my ($total, %seen) = (0);
	while (defined(my $pid = shift @todo))
	{
		next if $seen{$pid}++;
		$total += $used{$pid} // 0;
		push @todo, @{ $children{$pid} // [] };
	}
	return $total;
}

sub cmdline
{
	open my $fh, '<', "/proc/$_[0]/cmdline" or return '?';
	local $/;
	my $line = <$fh> // '';
	close $fh;
	$line =~ s/\0+$//;
	$line =~ s/\0/ /g;
	# The configuration's path differs between runs: not part of the group.
	$line =~ s/ -c \S+//;
	return $line;
}

for (@backends)
{
	my ($pid, $name) = /^(\d+)=(.*)$/ or next;
	print "pid\t$pid\tbackend $name\t$own{$pid}\n" if exists $own{$pid};
}
for my $worker (@{ $children{$dispatch} // [] })
{
	print "pid\t$worker\tworker ", cmdline($worker), "\t", tree($worker), "\n";
}
print "total\tpostgres\t\t", tree($postmaster), "\n";
print "total\tingress\t\t", tree($ingress), "\n";
print "total\tdispatch\t\t", $own{$dispatch} // 0, "\n";
