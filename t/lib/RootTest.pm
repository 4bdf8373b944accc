# For the TAP tests whose subject is privilege (setuid helpers, files owned
# by several users): they run as root (scripts/check.sh runs every file
# that says "use RootTest;" as root when it runs as root), and skip
# otherwise.  initdb refuses root, so the clusters run as the unprivileged
# user PEPSI_CLUSTER_USER: initdb and pg_ctl are wrapped to run as that
# user, the directories PostgreSQL::Test::Cluster makes are handed to it,
# and psql connects as it.  System users and groups a test adds are
# removed when it ends, whatever happens.

package RootTest;

use strict;
use warnings FATAL => 'all';

use parent 'Exporter';
use File::Copy qw(copy);
use File::Path qw(make_path);
use File::Temp ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(cluster_user as_cluster_user add_system_group add_system_user
  shared_dir install_privileged);

my $user = $ENV{PEPSI_CLUSTER_USER} // 'pepsi';
my (@users, @groups);
my $parent = $$;

sub import
{
	if ($> != 0)
	{
		plan skip_all => 'tests privilege: needs root (scripts/check.sh runs it as root)';
	}
	die "no user $user for the clusters (PEPSI_CLUSTER_USER)\n" unless defined getpwnam($user);
	__PACKAGE__->export_to_level(1, @_);
}

sub cluster_user { return $user }

# A command line that runs @command as the cluster's user (setpriv execs
# it in place, so its pid is the program's: signals reach it).
sub as_cluster_user
{
	return ('setpriv', "--reuid=$user", "--regid=$user", '--init-groups', '--', @_);
}

# initdb and pg_ctl (and postgres, which pg_ctl starts beside itself) as $user.
my $wrappers = File::Temp::tempdir('pepsi-root-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $wrappers;
for my $program (qw(initdb pg_ctl pg_controldata))
{
	my ($real) = grep { -x "$_/$program" } split /:/, $ENV{PATH};
	next unless $real;
	open my $fh, '>', "$wrappers/$program" or die "$wrappers/$program: $!";
	print $fh "#!/bin/sh\nexec runuser -u $user -- $real/$program \"\$@\"\n";
	close $fh;
	chmod 0755, "$wrappers/$program";
}
$ENV{PATH} = "$wrappers:$ENV{PATH}";

sub give
{
	my (@paths) = @_;
	my ($uid, $gid) = (getpwnam($user))[ 2, 3 ];

	chown $uid, $gid, grep { defined && -e } @paths;
}

{
	no warnings 'redefine';
	my $new = \&PostgreSQL::Test::Cluster::new;

	*PostgreSQL::Test::Cluster::new = sub {
		my $node = $new->(@_);

		# (PostgreSQL::Test::Utils clears PGUSER when it starts.)
		$ENV{PGUSER} = $user;
		give($PostgreSQL::Test::Utils::tmp_check, $PostgreSQL::Test::Utils::log_path,
			$node->basedir, $node->host);
		chmod 0755, $PostgreSQL::Test::Utils::tmp_check, $node->basedir;
		return $node;
	};
}

# A directory everyone can read (root's tempdirs are 0700): for the
# configuration and logs of the programs the test runs as other users.
sub shared_dir
{
	my $dir = PostgreSQL::Test::Utils::tempdir();

	chmod 0755, $dir;
	return $dir;
}

sub add_system_group
{
	my ($name) = @_;

	system('groupdel', $name) if defined getgrnam($name);
	system('groupadd', '--system', $name) == 0 or die "groupadd $name failed";
	push @groups, $name;
	return scalar getgrnam($name);
}

# A user with a home directory under $home_root (made 0755 for the path).
sub add_system_user
{
	my ($name, $home_root) = @_;

	system('userdel', '-r', $name) if defined getpwnam($name);
	chmod 0755, $home_root;
	system('useradd', '--create-home', '--home-dir', "$home_root/$name", '--shell', '/bin/sh',
		'--user-group', $name) == 0
	  or die "useradd $name failed";
	push @users, $name;
	return scalar getpwnam($name);
}

# Copy a helper and its stage from PEPSI_BIN into $dir as make install
# puts them: helper root:$group 4750, stage root:$group 2755.
sub install_privileged
{
	my ($bin, $dir, $group, $helper, $stage) = @_;
	my $gid = getgrnam($group);

	make_path($dir);
	chmod 0755, $dir;
	copy("$bin/$helper", "$dir/$helper") or die "copy $helper: $!";
	copy("$bin/$stage", "$dir/$stage") or die "copy $stage: $!";
	chown 0, $gid, "$dir/$helper", "$dir/$stage";
	chmod 04750, "$dir/$helper";
	chmod 02755, "$dir/$stage";
}

END
{
	if ($$ == $parent)
	{
		local $?;
		system('userdel', '-r', $_) for @users;
		system('groupdel', $_) for @groups;
	}
}

1;
