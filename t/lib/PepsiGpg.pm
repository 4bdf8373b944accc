# Helpers for the TAP tests of end-to-end encryption: Debian's gpg in a
# home of the test's own, pepsi-keys, files in the test's directory, a
# queued message as it would be sent.

package PepsiGpg;

use strict;
use warnings FATAL => 'all';

use Exporter 'import';
use File::Temp ();
use IPC::Run;

use DispatchTest;
use PepsiStage;

our @EXPORT = qw(gpg_home gpg gpg_new_key keys_run write_file raw_message);

my $gnupg;

# The tests' gpg home, made on first use (gpg's agent socket lives in it:
# a short path under /tmp).
sub gpg_home
{
	$gnupg //= File::Temp::tempdir('/tmp/pepsi-gpg-XXXXXX', CLEANUP => 1);
	$ENV{TMPDIR} = '/tmp';
	return $gnupg;
}

# gpg @args in the tests' home, no passphrase; its output (dies on failure).
sub gpg
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ 'gpg', '--batch', '--homedir', gpg_home(), '--pinentry-mode', 'loopback',
			'--passphrase', '', @args ], '<', \'', '>', \$out, '2>', \$err);
	die "gpg @args: $err" unless $ok;
	return $out;
}

# A new key pair for <$address> in the tests' home, as a mail client makes
# one (ed25519 to sign and certify, a cv25519 subkey to encrypt): its
# fingerprint.
sub gpg_new_key
{
	my ($address) = @_;
	gpg('--quick-gen-key', "<$address>", 'ed25519', 'sign,cert', 'never');
	my ($fpr) = gpg('--with-colons', '--list-keys', "<$address>") =~ /^fpr:+([0-9A-F]{40}):/m
	  or die "gpg made no key for $address";
	gpg('--quick-add-key', $fpr, 'cv25519', 'encr', 'never');
	return $fpr;
}

# pepsi-keys @args: (exit code, stdout, stderr).
sub keys_run
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-keys'), @args ], '<', \'', '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

# $bytes into the test's directory as $name; its path.
sub write_file
{
	my ($name, $bytes) = @_;
	my $path = PepsiStage::tmp() . "/$name";
	open my $fh, '>:raw', $path or die "$path: $!";
	print $fh $bytes;
	close $fh;
	return $path;
}

# Row $id's message, headers and body, as text.
sub raw_message
{
	my ($node, $id) = @_;
	return $node->safe_psql('postgres',
		"SELECT convert_from(w.headers || '\\x0d0a'::bytea || b.body, 'UTF8') FROM pepsi.workqueue w"
		  . " JOIN pepsi.workqueue_body b ON b.id = w.body_id WHERE w.id = $id");
}

1;
