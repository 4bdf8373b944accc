# KeydiscTest: what the key-discovery tests (t/171, t/180) share: their
# cluster and gpg home, and the HTTPS key servers pepsi-keydisc asks (a
# Web Key Directory, an HKP key server): a CA of the test's own, a
# certificate it signs for the names the server answers as, and
# t/bin/key-https on 127.0.0.1 and a free port, serving the files the
# test puts under its root.
#
#   my $node = keydisc_node('keydisc');   # pepsi, the roles crypto and admin
#   my $ks = start_key_server('wkd', 'DNS:openpgpkey.example.test, DNS:wkd.test');
#   my $ks = start_key_server('hkp', 'IP:127.0.0.1');
#   put_file("$ks->{root}/...", $bytes);
#   $ks->{root}      the files served (wkd: by path; hkp: by address)
#   $ks->{ca}        the CA's certificate, for TLS_CA_FILE
#   $ks->{port}      where it listens
#   $ks->{requests}  "HOST PATH" a request, written before it is answered
#                    (absent until the first request)
# The server is stopped with the test's other servers (DeliveryTest).
package KeydiscTest;

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use Exporter 'import';
use File::Basename qw(dirname);
use File::Path ();
use IPC::Run;
use PostgreSQL::Test::Utils;

use DeliveryTest;
use PepsiGpg qw(gpg_home);
use PepsiTest;

our @EXPORT = qw(keydisc_node start_key_server put_file);

my $bin = dirname(abs_path(__FILE__)) . '/../bin';

# A cluster with pepsi and the roles crypto (pepsi_crypto) and admin
# (pepsi_config); the gpg home made, and TMPDIR=/tmp before anything runs
# (gpg's agent sockets want short paths).
sub keydisc_node
{
	my ($name) = @_;
	my $node = pepsi_node($name);

	$node->safe_psql('postgres', 'CREATE EXTENSION pepsi');
	$node->safe_psql('postgres',
		'CREATE ROLE crypto LOGIN IN ROLE pepsi_crypto; CREATE ROLE admin LOGIN IN ROLE pepsi_config;');
	gpg_home();
	return $node;
}

# $bytes into $path, its directories made (a key server's files); $path.
sub put_file
{
	my ($path, $bytes) = @_;
	File::Path::make_path($path =~ s{/[^/]+$}{}r);
	open my $fh, '>:raw', $path or die "$path: $!";
	print $fh $bytes;
	close $fh;
	return $path;
}

sub openssl
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'openssl', @args ], '<', \'', '>', \$out, '2>', \$err) or die "openssl @args: $err";
	return;
}

# $kind: wkd or hkp (t/bin/key-https); $names: the certificate's
# subjectAltName, the first one its CN too.
sub start_key_server
{
	my ($kind, $names) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my ($cn) = $names =~ /^\w+:([^,\s]+)/ or die "no name in \"$names\"";
	my $root = "$dir/root";

	openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$dir/ca-key.pem", '-out', "$dir/ca.pem",
		'-days', '2', '-subj', "/CN=Pepsi $kind test CA", '-addext', 'basicConstraints=critical,CA:TRUE');
	openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$dir/https-key.pem", '-out', "$dir/https.csr",
		'-subj', "/CN=$cn");
	PostgreSQL::Test::Utils::append_to_file("$dir/https.ext", "subjectAltName = $names\n");
	openssl('x509', '-req', '-in', "$dir/https.csr", '-CA', "$dir/ca.pem", '-CAkey', "$dir/ca-key.pem",
		'-CAcreateserial', '-out', "$dir/https.pem", '-days', '2', '-extfile', "$dir/https.ext");
	mkdir $root or die "mkdir $root: $!";
	my $server = start_server(
		"$kind-https",
		sub {
			my ($port) = @_;
			return ("$bin/key-https", $kind, $root, "$dir/requests", $port,
				"$dir/https.pem", "$dir/https-key.pem");
		});
	return { %$server, root => $root, ca => "$dir/ca.pem", requests => "$dir/requests" };
}

1;
