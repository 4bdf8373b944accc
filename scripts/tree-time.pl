#!/usr/bin/perl
# tree-time.pl OUT CMD...: run CMD and write to OUT its wall time and the
# CPU time (user + system, seconds) of everything it started: "WALL CPU".
# The CPU time counts the processes that outlive their parents too (a
# cluster's postmaster, which pg_ctl leaves behind; a daemon a test
# started), as this process is their child subreaper (prctl(2)) and
# reaps them; those still running 15 s after CMD ended are left, and OUT
# says "leftover".  scripts/tap-file.sh times each TAP file with it: a
# file whose CPU time is far below its wall time waits.
#
# The orphans are reaped as they die, while CMD runs, not after it: an
# orphan left a zombie still exists for kill(pid, 0).  A postmaster killed
# with SIGKILL (t/161's lost host, whose Patroni died with it) stayed one,
# so pg_ctl stop, which waits for the postmaster to go, waited its whole
# minute (PGCTLTIMEOUT) at the end of t/161.
use strict;
use warnings;
use POSIX ':sys_wait_h';
use Time::HiRes qw(time sleep);

my $out = shift @ARGV;
eval {
	require 'syscall.ph';
	syscall(&SYS_prctl, 36, 1, 0, 0, 0);    # PR_SET_CHILD_SUBREAPER
};
my $start = time;
my $pid = fork // die "fork: $!";
if ($pid == 0)
{
	exec @ARGV or die "exec $ARGV[0]: $!";
}
# Every child as it ends, until CMD's own does.
my $status;
while ((my $child = waitpid(-1, 0)) > 0)
{
	if ($child == $pid)
	{
		$status = $?;
		last;
	}
}
defined $status or (waitpid($pid, 0), $status = $?);
my $wall = time - $start;
my $deadline = time + 15;
my $left = '';
while ((my $child = waitpid(-1, WNOHANG)) >= 0)
{
	next if $child > 0;
	if (time > $deadline)
	{
		$left = ' leftover';
		last;
	}
	sleep 0.05;
}
my (undef, undef, $cuser, $csys) = times;
open my $fh, '>', $out or die "$out: $!";
printf $fh "%.1f %.1f%s\n", $wall, $cuser + $csys, $left;
close $fh;
exit($status & 127 ? 128 + ($status & 127) : $status >> 8);
