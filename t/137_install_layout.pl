# make install and the Debian package agree: the same files and links (the
# /usr/local and /usr prefixes aside), and as root the same owners and
# modes, the privileged programs' being those of debian/pepsi.postinst's
# table.  The package's side is what debian/rules stages (make install
# PREFIX=/usr SETID=no) after its postinst has run on it (DPKG_ROOT);
# make deb-check compares the built packages' own files the same way
# (scripts/deb.sh).  Both sides run against a root of their own whose
# accounts are the postinst's (scripts/install-layout.sh): the host's
# accounts are neither read nor changed.
use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/lib";
use RootTest;
use File::Copy qw(copy);
use PostgreSQL::Test::Utils;
use Test::More;

my $top = $ENV{PEPSI_TOP} // "$FindBin::RealBin/..";
my $layout = "$top/scripts/install-layout.sh";
my $tmp = PostgreSQL::Test::Utils::tempdir();

sub run_layout
{
	my @args = @_;
	my $out = `$layout @args 2>&1`;
	is($?, 0, "install-layout.sh $args[0]") or diag $out;
	return $out;
}

sub manifest
{
	my ($dir, $accounts) = @_;
	my @lines = split /\n/, run_layout('manifest', $dir, $accounts);
	return { map { my ($path, $rest) = split / /, $_, 2; ($path => $rest) } @lines };
}

# debian/pepsi.postinst's table: NAME => "OWNER GROUP MODE".
my $postinst = slurp_file("$top/debian/pepsi.postinst");
my ($table) = $postinst =~ /^# BEGIN PRIVILEGED\n(.*?)^# END PRIVILEGED$/ms;
my %privileged = map { my @f = split; ($f[0] => "$f[1] $f[2] $f[3]") } grep { /^pepsi-/ } split /\n/, $table;
ok(scalar keys %privileged >= 4, 'the postinst names the privileged programs: ' . join(' ', sort keys %privileged));

# The package's side, and make install as root on a host with its accounts.
my $image = "$tmp/image";
run_layout('image', $image);
my $make = "$tmp/make";
run_layout('make-install', $make, $image);
my %image = %{ manifest($image, $image) };
# (The accounts' files and dpkg's database are the root's, not what the
# package installs.)
delete @image{ grep { m{^/etc/(?!pepsi/|pepsi-telemetry/)} || m{^/var/lib/dpkg/} } keys %image };
my %make = %{ manifest($make, $image) };

my @only_make = sort grep { !exists $image{$_} } keys %make;
my @only_image = sort grep { !exists $make{$_} } keys %image;
is_deeply(\@only_make, [], 'every file make install installs, the package has');
is_deeply(\@only_image, [], 'every file the package has, make install installs');
my @differ = sort grep { exists $image{$_} && $image{$_} ne $make{$_} } keys %make;
is_deeply([ map { "$_: make install $make{$_}, the package $image{$_}" } @differ ],
	[], 'the same type, mode, owner and group (or link target) for each');

# The bits: the table's for its programs, on both sides, and nothing else
# set-id.
for my $name (sort keys %privileged)
{
	my ($owner, $group, $mode) = split / /, $privileged{$name};
	is($make{"/usr/bin/$name"}, "f $mode $owner $group", "make install: $name $owner:$group $mode");
	is($image{"/usr/bin/$name"}, "f $mode $owner $group", "the package: $name $owner:$group $mode");
}
my @setid = sort grep { $make{$_} =~ /^f [2467]/ && !exists $privileged{ (split m{/}, $_)[-1] } } keys %make;
is_deeply(\@setid, [], 'no other file make install installs carries a setuid or setgid bit');
ok(exists $make{'/usr/bin/pepsi-helper-maildir-writer'} && exists $make{'/etc/pepsi/pepsi.conf'}
	  && exists $make{'/usr/lib/sysusers.d/pepsi.conf'} && exists $make{'/usr/lib/tmpfiles.d/pepsi.conf'}
	  && exists $make{'/usr/lib/systemd/system/pepsi-dispatch.service'}
	  && exists $make{'/usr/lib/postgresql/15/lib/pepsi.so'},
	'both have the helpers, pepsi.conf, the sysusers.d and tmpfiles.d files, the units, the extension');

# The package's split: every file of the staged tree is claimed by one line
# of exactly one debian/*.install (dh_missing would otherwise fail the
# build), and every line claims something.
# (The package's units are in /lib/systemd, which the manifests write as
# /usr/lib/systemd.)
my %package_path = map { $_ => s{^/usr/lib/systemd/}{/lib/systemd/}r } keys %image;
my %claimed;
for my $install (glob("$top/debian/*.install"))
{
	my ($package) = $install =~ m{([^/]+)\.install$};
	for my $entry (grep { !/^#/ && /\S/ } split /\n/, slurp_file($install))
	{
		$entry =~ s{/$}{};
		my @hits = grep { $package_path{$_} eq "/$entry" || index($package_path{$_}, "/$entry/") == 0 }
		  keys %image;
		ok(scalar @hits, "$package.install: $entry claims files");
		push @{ $claimed{$_} }, [ $package, $package_path{$_} eq "/$entry" ] for @hits;
	}
}
# A file one package's line names exactly and another's takes with its
# directory is the first's: debian/rules removes it from the other (the
# telemetry collector's files, out of pepsi's usr/bin/ and the like).
for my $path (keys %claimed)
{
	my @exact = grep { $_->[1] } @{ $claimed{$path} };
	$claimed{$path} = \@exact if @exact == 1;
}
my @unclaimed = sort grep { !$claimed{$_} } keys %image;
is_deeply(\@unclaimed, [], 'every file is in a package');
my @twice = sort grep { @{ $claimed{$_} } > 1 } keys %claimed;
is_deeply(\@twice, [], 'no file is in two packages');

# The comparison sees a difference: a make install whose table gives a
# program another mode, and one on a host without the helpers' groups.
my $planted = "$tmp/postinst";
my $text = $postinst;
$text =~ s/^(pepsi-stage-relay-to-maildir +root +pepsi-maildir) 2755$/$1 2750/m or die 'no maildir line';
open my $fh, '>', $planted or die "$planted: $!";
print $fh $text;
close $fh;
run_layout('make-install', "$tmp/make-planted", $image, 'install-privileged', "PRIVILEGED_TABLE=$planted");
my %planted = %{ manifest("$tmp/make-planted", $image) };
is($planted{'/usr/bin/pepsi-stage-relay-to-maildir'}, 'f 2750 root pepsi-maildir',
	'make install follows the table it is given');
isnt($planted{'/usr/bin/pepsi-stage-relay-to-maildir'}, $image{'/usr/bin/pepsi-stage-relay-to-maildir'},
	'... and that differs from the package');

my $bare = "$tmp/bare";
run_layout('base', $bare);
run_layout('make-install', "$tmp/make-bare", $bare, 'install-privileged');
my $out = slurp_file("$tmp/make-bare.log");
like($out, qr/^warning: no user root or group pepsi-maildir on this host: pepsi-helper-maildir-writer installed without its bit/m,
	'a host without the group: make install says so');
my %bare = %{ manifest("$tmp/make-bare", $bare) };
is($bare{'/usr/bin/pepsi-helper-maildir-writer'}, 'f 0755 root root', '... and installs the helper without its bit');

done_testing();
