# Helpers for the tests of outbound identity (DKIM signing, ARC sealing):
# keys made by pepsi-keys, messages admitted with exact bytes, the bytes
# of a row as the relay would transmit them, and the verdicts of
# independent verifiers (python3-dkim, Mail::DKIM, opendkim-testmsg) that
# fetch the public keys from a private DNS server (t/bin/dns-sandbox).

package SignTest;

use strict;
use warnings FATAL => 'all';

use Exporter 'import';
use File::Basename qw(dirname);
use Cwd qw(abs_path);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;

our @EXPORT = qw(make_key add_message row_message verify_message);

my $here = dirname(abs_path(__FILE__));
my $bin = $ENV{PEPSI_BIN} // "$here/../../build/bin";

# A key pair made by pepsi-keys generate.  Returns (path, TXT record).
sub make_key
{
	my ($dir, $name, $algorithm, $bits) = @_;
	my $path = "$dir/$name.pem";
	my ($out, $err) = ('', '');

	IPC::Run::run([ "$bin/pepsi-keys", 'generate', '-a', $algorithm,
		($bits ? ('-b', $bits) : ()), '-o', $path ], '>', \$out, '2>', \$err)
	  or die "pepsi-keys generate: $err";
	chomp $out;
	return ($path, $out);
}

# Admit a message with these exact header and body bytes at $stage and set
# it running.  Returns the row id.
sub add_message
{
	my ($node, $stage, %m) = @_;
	my $rcpts = join(',', map { "'$_'" } @{ $m{rcpt} // ['rcpt@remote.test'] });
	my $state = JSON::PP->new->canonical->encode($m{state} // {});
	my $id = $node->safe_psql('postgres',
		"SELECT pepsi.workqueue_add('" . ($m{from} // 'sender@example.org') . "', ARRAY[$rcpts],"
		  . " decode('" . unpack('H*', $m{headers}) . "', 'hex'),"
		  . " decode('" . unpack('H*', $m{body} // '') . "', 'hex'), '$state'::jsonb,"
		  . " stage => '$stage')");
	$node->safe_psql('postgres', "UPDATE pepsi.workqueue SET status = 'running' WHERE id = $id")
	  unless defined $m{running} && !$m{running};
	return $id;
}

# The raw message of a row: headers || CRLF || body, as the relay sends it.
sub row_message
{
	my ($node, $id) = @_;
	my $hex = $node->safe_psql('postgres',
		"SELECT encode(w.headers || '\\x0d0a'::bytea || b.body, 'hex')"
		  . " FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id WHERE w.id = $id");
	return pack('H*', $hex);
}

# The verifiers' verdicts on $message with the TXT records of %$zone
# ({ 'sel._domainkey.example.org' => 'v=DKIM1; ...' }).  Returns
# { 'python-dkim' => [per signature], 'mail-dkim' => [...], opendkim =>
# 'pass ...', arc => 'pass ...', output => all of it }.
sub verify_message
{
	my ($zone, $message) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my ($out, $err) = ('', '');
	my %verdict = ('python-dkim' => [], 'mail-dkim' => []);

	open my $fh, '>', "$dir/zone.json" or die $!;
	print $fh JSON::PP->new->encode({ map { $_ => [ $zone->{$_} ] } keys %$zone });
	close $fh;
	open $fh, '>', "$dir/message.eml" or die $!;
	binmode $fh;
	print $fh $message;
	close $fh;
	IPC::Run::run([ "$here/../bin/dns-sandbox", "$dir/zone.json", "$here/../bin/dkim-verifiers",
		"$dir/message.eml" ], '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	for my $line (split /\n/, $out)
	{
		if ($line =~ /^(python-dkim|mail-dkim) (\d+) (.*)$/) { $verdict{$1}[$2] = $3 }
		elsif ($line =~ /^(opendkim|arc) (.*)$/) { $verdict{$1} = $2 }
	}
	$verdict{output} = $out . $err;
	return \%verdict;
}

1;
