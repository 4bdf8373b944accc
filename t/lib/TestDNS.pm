# TestDNS: a DNS server on a free loopback port, serving zones the test
# writes, for every test that needs the DNS (ingress's SPF, DKIM, DMARC and
# iprev; DKIM signing; the internet relay).  It runs as the test's own user
# (t/lib/testdns.py, over python3-dnslib) and answers as a recursive server
# does, so Pepsi's resolver simply forwards to it:
#
#   use TestDNS;
#   my $dns = TestDNS->new($tmpdir);          # started, listening
#   $dns->zone(<<'EOF');                      # replaces every record
#   example.test.            300 IN TXT  "v=spf1 ip4:127.0.0.1 -all"
#   mx.example.test.         300 IN A    127.0.0.1
#   1.0.0.127.in-addr.arpa.  300 IN PTR  mx.example.test.
#   ; silent slow.example.test        (never answers for that name)
#   ; servfail broken.example.test    (SERVFAIL)
#   ; garbage junk.example.test       (a reply that is no DNS message)
#   EOF
#   $dns->add(...);                           # appends records
#   $dns->zone(TestDNS::mx('fast.test', '127.0.0.5')   # a domain whose one
#     . TestDNS::mx('slow.test', '127.0.0.9'));        # MX host is mx.DOMAIN
#   "[pepsi]\nDNS_FORWARDER = " . $dns->forwarder   # "127.0.0.1@PORT"
#   $dns->port; $dns->stop;                   # stopped at exit anyway
#
# Lines are master-file syntax with absolute names; long TXT data is split
# into 255-octet strings by TestDNS::txt($name, $text).  Changes are seen
# by the next query (the server re-reads the file when it changes); a
# resolver's cache is not, so a test changing a name's answer uses a new
# name.
package TestDNS;

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(usleep);

sub new
{
	my ($class, $dir) = @_;
	my $self = bless { dir => $dir, zone => "$dir/testdns.zone", text => '' }, $class;
	my $script = dirname(__FILE__) . '/testdns.py';

	$self->zone('');
	$self->{port} = PostgreSQL::Test::Cluster::get_free_port();
	my $out = '';
	$self->{run} =
	  IPC::Run::start([ '/usr/bin/python3', $script, $self->{zone}, $self->{port} ],
		'<', \undef, '>', \$out, '2>', "$dir/testdns.log");
	for (1 .. 1200)
	{
		$self->{run}->pump_nb;
		last if $out =~ /ready/;
		die "testdns.py did not start: " . slurp_file("$dir/testdns.log")
		  unless $self->{run}->pumpable;
		usleep(50_000);
	}
	die 'testdns.py did not report ready' unless $out =~ /ready/;
	return $self;
}

sub port { return $_[0]->{port} }

sub forwarder { return '127.0.0.1@' . $_[0]->{port} }

# Replace the zone with $text (written whole, then renamed into place).
sub zone
{
	my ($self, $text) = @_;
	my $tmp = "$self->{zone}.tmp";

	$self->{text} = $text;
	open(my $fh, '>', $tmp) or die "$tmp: $!";
	print $fh $text;
	close($fh) or die "$tmp: $!";
	rename($tmp, $self->{zone}) or die "rename $tmp: $!";
	return;
}

sub add
{
	my ($self, $text) = @_;

	$self->zone($self->{text} . "\n" . $text);
	return;
}

# A TXT record line for text of any length (strings of at most 255 octets).
sub txt
{
	my ($name, $text, $ttl) = @_;
	my @strings;

	push @strings, substr($text, 0, 255, '') while length $text;
	@strings = ('') unless @strings;
	s/(["\\])/\\$1/g for @strings;
	return "$name " . ($ttl // 300) . ' IN TXT ' . join(' ', map { "\"$_\"" } @strings) . "\n";
}

# The two records of a domain served by one MX host, mx.$domain, at
# $address: what most delivery tests need of the DNS.
sub mx
{
	my ($domain, $address) = @_;

	return "$domain. 300 IN MX 10 mx.$domain.\nmx.$domain. 300 IN A $address\n";
}

sub stop
{
	my ($self) = @_;

	return unless $self->{run};
	# Reaping the server sets $?: stopped from an END block (or from a
	# DESTROY run during one) that would become the test's exit status.
	local $?;
	$self->{run}->kill_kill;
	delete $self->{run};
	return;
}

sub DESTROY { $_[0]->stop }

1;
