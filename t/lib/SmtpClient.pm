# A scripted SMTP client for the TAP tests: one socket (IPv4 or IPv6), bound to a chosen
# local address when a test needs the server to see the client come from
# 127.0.0.x (trusted or untrusted networks), commands sent one at a time or
# pipelined, and each reply read whole (every line of a multi-line reply).

package SmtpClient;

use strict;
use warnings FATAL => 'all';

use Exporter 'import';
use IO::Socket::IP;
use IO::Socket::SSL;

our @EXPORT_OK = qw(read_smtp_reply);

# Connect from $opts{from} (default 127.0.0.1); returns the client, the banner read.
sub new
{
	my ($class, $port, %opts) = @_;
	my $socket = IO::Socket::IP->new(
		PeerAddr => $opts{to} // '127.0.0.1',
		PeerPort => $port,
		LocalAddr => $opts{from} // '127.0.0.1',
		Timeout => 10) or die "connect to port $port from " . ($opts{from} // '127.0.0.1') . ": $!";
	my $self = bless { socket => $socket }, $class;

	$self->{banner} = $self->reply;
	return $self;
}

sub reply
{
	my ($self, $seconds) = @_;

	return read_smtp_reply($self->{socket}, $seconds);
}

# One reply from a socket, all its lines; '' at EOF, 'TIMEOUT' when none came in time.
sub read_smtp_reply
{
	my ($socket, $seconds) = @_;
	my $reply = '';

	local $SIG{ALRM} = sub { die "timeout\n" };
	alarm($seconds // 30);
	my $ok = eval {
		while (defined(my $line = <$socket>))
		{
			$reply .= $line;
			last if $line =~ /^\d{3}(?: |\r?$)/;
		}
		1;
	};
	alarm(0);
	return $ok ? $reply : 'TIMEOUT';
}

sub command
{
	my ($self, $line) = @_;

	$self->send("$line\r\n");
	return $self->reply;
}

sub send
{
	my ($self, $bytes) = @_;

	print { $self->{socket} } $bytes;
}

# Pipeline the lines (RFC 2920); returns the replies, one per line.
sub pipeline
{
	my ($self, @lines) = @_;

	$self->send(join('', map { "$_\r\n" } @lines));
	return map { $self->reply } @lines;
}

# STARTTLS, the handshake, and EHLO again; true when it all worked.
sub starttls
{
	my ($self, $ehlo) = @_;

	return 0 unless $self->command('STARTTLS') =~ /^220/;
	IO::Socket::SSL->start_SSL($self->{socket}, SSL_verify_mode => SSL_VERIFY_NONE)
	  or return 0;
	return $self->command("EHLO $ehlo") =~ /^250 /m;
}

sub close
{
	my ($self) = @_;

	$self->command('QUIT');
	close $self->{socket};
}

1;
