#!/usr/bin/perl
# Open N SMTP sessions to HOST:PORT, read each banner and say EHLO, then
# print "ready" and hold them open until killed.  Used by
# bench/ingress/run.sh to measure what an idle session costs the server.
use strict;
use warnings;
use IO::Socket::INET;

my ($host, $port, $count) = @ARGV;
die "usage: idle-sessions.pl HOST PORT COUNT\n" unless $count;
$| = 1;

my @sessions;
for my $i (1 .. $count)
{
	my $s = IO::Socket::INET->new(PeerAddr => $host, PeerPort => $port, Timeout => 30)
	  or die "session $i: connect: $!\n";
	my $banner = <$s>;
	die "session $i: no banner\n" unless defined $banner && $banner =~ /^220 /;
	print $s "EHLO idle$i.example\r\n";
	while (defined(my $line = <$s>))
	{
		last if $line =~ /^250 /;
		die "session $i: EHLO refused: $line" if $line =~ /^[45]/;
	}
	push @sessions, $s;
}
print "ready\n";
sleep 3600 while 1;
