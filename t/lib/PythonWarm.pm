# PythonWarm: python3 snippets run in one interpreter kept running
# (t/bin/python-warm), for a test that calls python3-dkim or another
# library slow to import many times: each call costs what the snippet
# does, not a python3 start and its imports.
#
#   my $py = PythonWarm->new;
#   my ($exit, $out, $err) = $py->run($source, \@argv, $stdin);   # python3 -c
#   my ($exit, $out, $err) = $py->run_file($path, \@argv, $stdin);  # a script
#
# Each runs with its own globals, sys.argv, stdin and stdout, as a python3
# of its own would; what differs is only that modules are imported once.
package PythonWarm;

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;
use MIME::Base64 qw(encode_base64 decode_base64);
use PostgreSQL::Test::Utils;

sub new
{
	my ($class) = @_;
	my $self = bless { in => '', out => '', err => '' }, $class;

	$self->{timer} = IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default);
	$self->{harness} = IPC::Run::start([ dirname(__FILE__) . '/../bin/python-warm' ],
		'<', \$self->{in}, '>', \$self->{out}, '2>', \$self->{err}, $self->{timer});
	return $self;
}

sub run
{
	my ($self, $code, $argv, $stdin, $file) = @_;
	my $json = JSON::PP->new->utf8->canonical;

	$self->{timer}->start($PostgreSQL::Test::Utils::timeout_default);
	$self->{in} .= $json->encode(
		{
			code => $code,
			file => $file // '',
			argv => [ map { "$_" } @{ $argv // [] } ],
			stdin => encode_base64($stdin // '', '')
		}) . "\n";
	$self->{harness}->pump until $self->{out} =~ /\n/;
	$self->{out} =~ s/^([^\n]*)\n//;
	my $reply = $json->decode($1);
	return ($reply->{exit}, decode_base64($reply->{stdout}), decode_base64($reply->{stderr}));
}

sub run_file
{
	my ($self, $file, $argv, $stdin) = @_;

	open my $fh, '<', $file or die "cannot read $file: $!";
	my $code = do { local $/; <$fh> };
	close $fh;
	return $self->run($code, $argv, $stdin, $file);
}

1;
