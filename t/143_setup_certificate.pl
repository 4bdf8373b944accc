# pepsi-setup certificate, with no cluster: certbot is t/bin/certbot-standin
# (certbot's command line, a self-signed certificate written where certbot
# writes its own, the deploy hook run as certbot runs it).  Found on PATH,
# it is run as certonly --webroot or --standalone for the configured host
# name with a deploy hook that installs the lineage and reloads ingress;
# the live/ files are installed as tls/ (the key mode 0640) and the drop-in
# pepsi.conf.d/certificate.conf points [listener-smtp] at them; a second run changes nothing; the recorded
# hook run on a renewed lineage installs the new certificate.  A given
# certificate is installed the same way.  Bad input stops before any
# change, the tree byte-identical: no certbot, no authenticator, an
# occupied --http-01-port, a certificate for another name.

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IO::Socket::INET;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiTest;
use SetupTest;

my $setup = pepsi_bin('pepsi-setup');
my $standin = dirname(abs_path(__FILE__)) . '/bin/certbot-standin';
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $host = 'mx.pepsi.test';
my $config = "$root/etc/pepsi/pepsi.conf";

mkdir "$root/etc";
mkdir "$root/etc/pepsi";
my $conffile = "# as pepsi-setup init leaves it, in short\n[pepsi]\nHOSTNAME = $host\nLOCAL_DOMAINS = local.test\n\n"
  . "[listener-smtp]\nADDRESS = 127.0.0.1\nPORT = 2525\n\n[srs]\nDOMAIN = local.test\n";
open(my $fh, '>', $config) or die "$config: $!";
print $fh $conffile;
close $fh;

# PATH with certbot (the stand-in) first, or without any.
my $with_certbot = "$tmp/with";
mkdir $with_certbot;
symlink($standin, "$with_certbot/certbot") or die "symlink: $!";
my $without = "$tmp/without";
mkdir $without;
symlink('/usr/bin/openssl', "$without/openssl") or die "symlink: $!";

sub certificate
{
	my ($path, @args) = @_;
	my ($out, $err) = ('', '');
	local $ENV{PATH} = "$path:/usr/bin:/bin";

	IPC::Run::run([ $setup, 'certificate', '--root', $root, @args ], '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return ($? >> 8, $out, $err);
}

my $webroot = "$tmp/www";
mkdir $webroot;
my $before = tree_state($root);

#
# Bad input: the reason, and nothing changed.
#
local $ENV{PATH} = '/usr/bin:/bin';
SKIP: {
	skip 'a real certbot is installed on this host', 2 if -x '/usr/bin/certbot';
	my ($rc, $out, $err) = certificate($without, '--webroot', $webroot);
	is($rc, 69, 'without certbot on PATH: certificate stops');
	like($err, qr/certbot is not installed \(apt install certbot, or --certbot PATH\).*nothing changed/, 'and says why');
}
my ($rc, $out, $err) = certificate($with_certbot);
is($rc, 64, 'no --webroot nor --standalone: certificate stops');
like($err, qr/certbot needs one of --webroot DIR .* or --standalone/, 'and says which options');
my $taken = IO::Socket::INET->new(LocalAddr => '0.0.0.0', LocalPort => 0, Listen => 1, ReuseAddr => 1) or die "listen: $!";
($rc, $out, $err) = certificate($with_certbot, '--standalone', '--http-01-port', $taken->sockport);
is($rc, 69, 'an occupied --http-01-port: certificate stops');
like($err, qr/--standalone: port \d+ on 0\.0\.0\.0 is in use/, 'and says why');
close $taken;
my $other = PostgreSQL::Test::Utils::tempdir();
self_signed_certificate($other, 'other.test');
($rc, $out, $err) = certificate($with_certbot, '--certificate', "$other/cert.pem", '--key', "$other/key.pem");
is($rc, 65, 'a certificate for another name: certificate stops');
like($out, qr/failed: the certificate \S+ is not for mx\.pepsi\.test/, 'and says why');
($rc, $out, $err) = certificate($with_certbot, '--hostname', 'not_a_host', '--webroot', $webroot);
is($rc, 64, 'a host name that is not a domain: certificate stops');
like($err, qr/--hostname: "not_a_host" is not a domain/, 'and says why');
is(tree_state($root), $before, 'none of them changed a byte under the root');

#
# certbot --webroot, found on PATH.
#
($rc, $out, $err) = certificate($with_certbot, '--webroot', $webroot, '--email', 'postmaster@local.test');
is($rc, 0, 'certificate with certbot --webroot succeeds') or diag("$out\n$err");
my @calls = split /^--\n/m, slurp("$root/var/log/letsencrypt/certbot-standin.args");
is(scalar(@calls), 1, 'certbot ran once');
my @argv = split /\n/, $calls[0];
my %at = map { $argv[$_] => $_ } 0 .. $#argv;
is($argv[0], 'certonly', 'certbot certonly');
ok(exists $at{'--non-interactive'} && exists $at{'--agree-tos'}, 'non-interactive, the terms agreed');
is($argv[ $at{'-m'} + 1 ], 'postmaster@local.test', 'the address of --email');
is($argv[ $at{'-w'} + 1 ], $webroot, 'the webroot');
ok(exists $at{'--webroot'}, 'by the webroot authenticator');
is($argv[ $at{'-d'} + 1 ], $host, 'for [pepsi] HOSTNAME');
is($argv[ $at{'--config-dir'} + 1 ], "$root/etc/letsencrypt", 'certbot\'s directories under the root');
my $hook = $argv[ $at{'--deploy-hook'} + 1 ];
like($hook, qr/pepsi-setup' certificate --deploy --hostname 'mx\.pepsi\.test' -c '\Q$config\E' --root '\Q$root\E'$/,
	'the deploy hook runs pepsi-setup certificate --deploy');
like($out, qr/pepsi-ingress\.service: not reloaded \(--root\)/, 'the hook installs and reloads ingress');
my $live = "$root/etc/letsencrypt/live/$host";
is(slurp("$root/etc/pepsi/tls/fullchain.pem"), slurp("$live/fullchain.pem"), 'the live certificate is installed');
is(slurp("$root/etc/pepsi/tls/privkey.pem"), slurp("$live/privkey.pem"), 'and its key');
is(sprintf('%04o', (stat "$root/etc/pepsi/tls/privkey.pem")[2] & 07777), '0640', 'the key of mode 0640');
is(slurp($config), $conffile, 'pepsi.conf is left as it was');
like(slurp("$root/etc/pepsi/pepsi.conf.d/certificate.conf"), qr/^\[listener-smtp\]\nCERTIFICATE = \Q$root\E\/etc\/pepsi\/tls\/fullchain\.pem\nKEY = \Q$root\E\/etc\/pepsi\/tls\/privkey\.pem\n\z/m,
	'the drop-in certificate.conf points [listener-smtp] at them');

my $after = tree_state($root);
($rc, $out, $err) = certificate($with_certbot, '--certificate', "$root/etc/pepsi/tls/fullchain.pem", '--key',
	"$root/etc/pepsi/tls/privkey.pem");
is($rc, 0, 'installing the same certificate again succeeds') or diag("$out\n$err");
like($out, qr/nothing changed: the certificate is installed already/, 'and changes nothing');
is(tree_state($root), $after, 'not a byte');

#
# Renewal: certbot runs the hook on a renewed lineage.
#
my $renewed = PostgreSQL::Test::Utils::tempdir();
self_signed_certificate($renewed, $host);
rename("$renewed/cert.pem", "$renewed/fullchain.pem") or die;
rename("$renewed/key.pem", "$renewed/privkey.pem") or die;
{
	local $ENV{RENEWED_LINEAGE} = $renewed;
	local $ENV{RENEWED_DOMAINS} = $host;
	my ($hook_out, $hook_err) = ('', '');
	IPC::Run::run([ '/bin/sh', '-c', $hook ], '<', \undef, '>', \$hook_out, '2>', \$hook_err, IPC::Run::timeout(60));
	is($? >> 8, 0, 'the deploy hook succeeds on a renewal') or diag("$hook_out\n$hook_err");
	like($hook_out, qr/tls\/fullchain\.pem: written.*pepsi-ingress\.service: not reloaded/s, 'installs and reloads');
}
is(slurp("$root/etc/pepsi/tls/fullchain.pem"), slurp("$renewed/fullchain.pem"), 'the renewed certificate is installed');

#
# certbot --standalone, by --certbot.
#
my $port = PostgreSQL::Test::Cluster::get_free_port();
($rc, $out, $err) = certificate($without, '--certbot', $standin, '--standalone', '--http-01-port', $port);
is($rc, 0, 'certificate with certbot --standalone succeeds') or diag("$out\n$err");
@calls = split /^--\n/m, slurp("$root/var/log/letsencrypt/certbot-standin.args");
@argv = split /\n/, $calls[-1];
%at = map { $argv[$_] => $_ } 0 .. $#argv;
ok(exists $at{'--standalone'} && $argv[ $at{'--http-01-port'} + 1 ] eq $port, 'standalone, on the port given');
ok(exists $at{'--register-unsafely-without-email'}, 'without an address, said so');
is(slurp("$root/etc/pepsi/tls/fullchain.pem"), slurp("$live/fullchain.pem"), 'its certificate is installed');

done_testing();
