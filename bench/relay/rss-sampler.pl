#!/usr/bin/perl
# rss-sampler.pl PID...: every 50 ms, sum the resident memory (VmRSS) and
# the proportional share (Pss, shared pages divided among their users) of
# the given processes and all their descendants; on SIGTERM print the
# peaks, in kB, as "rss=N pss=N processes=N" and exit.
use strict;
use warnings;
use Time::HiRes qw(usleep);

my @roots = @ARGV;
my ($peak_rss, $peak_pss, $peak_procs) = (0, 0, 0);
my $stop = 0;
$SIG{TERM} = sub { $stop = 1 };

sub read_file { my ($p) = @_; open my $fh, '<', $p or return ''; local $/; my $t = <$fh> // ''; close $fh; return $t }

while (!$stop)
{
	my %children;
	opendir my $proc, '/proc' or die;
	for my $pid (grep { /^\d+$/ } readdir $proc)
	{
		my $stat = read_file("/proc/$pid/stat");
		push @{ $children{$1} }, $pid if $stat =~ /\)\s+\S\s+(\d+)/;
	}
	closedir $proc;
	my @todo = grep { -d "/proc/$_" } @roots;
	my %seen;
	my ($rss, $pss) = (0, 0);
	while (defined(my $pid = shift @todo))
	{
		next if $seen{$pid}++;
		push @todo, @{ $children{$pid} // [] };
		$rss += $1 if read_file("/proc/$pid/status") =~ /^VmRSS:\s+(\d+)/m;
		$pss += $1 if read_file("/proc/$pid/smaps_rollup") =~ /^Pss:\s+(\d+)/m;
	}
	$peak_rss = $rss if $rss > $peak_rss;
	$peak_pss = $pss if $pss > $peak_pss;
	$peak_procs = keys %seen if keys %seen > $peak_procs;
	usleep(50_000);
}
print "rss=$peak_rss pss=$peak_pss processes=$peak_procs\n";
