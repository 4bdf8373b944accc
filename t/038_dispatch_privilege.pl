# pepsi-dispatch started as root never runs a stage as root: with
# [dispatch] USER (and GROUP) it becomes that user before it connects or
# starts a worker, so the dispatcher and every stage worker run with that
# user's ids (read from /proc/PID/status); without USER, or with a USER
# that is root, it refuses to start and says which option to set.  Needs
# root (RootTest: make check runs this file as root).

use strict;
use warnings FATAL => 'all';

use RootTest;

use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;

$ENV{PATH} = "$ENV{PATH}:/usr/sbin:/sbin";
my $shared = shared_dir();
my $db = 'postgres';
my $node = dispatch_node('dispatch_privilege');
my $user = cluster_user();
my ($uid, $gid) = (getpwnam($user))[ 2, 3 ];
my $tag = $$ % 1000000;
my $group = "pepsi-dp$tag";
my $other_gid = add_system_group($group);

sub config
{
	my (%dispatch) = @_;
	my $path = write_config($node, path => "$shared/pepsi.conf", dispatch => \%dispatch,
		stages => real_stages());

	chmod 0644, $path;
	return $path;
}

# The real and effective user and group ids of a process, and its groups.
sub ids
{
	my ($pid) = @_;
	my %ids;

	open my $fh, '<', "/proc/$pid/status" or return undef;
	while (<$fh>)
	{
		$ids{$1} = $2 if /^(Uid|Gid|Groups):\s*(.*?)\s*$/;
	}
	close $fh;
	return \%ids;
}

# 1. No USER: refused, naming the option, before any worker starts.
my $d = start_dispatcher(config(), log => "$shared/no-user.log");
my $status = dispatcher_exit($d, 30);
ok(defined $status && $status != 0, 'as root without [dispatch] USER: refused');
like(dispatcher_log($d), qr/refusing to run as root: set \[dispatch\] USER/,
	'with an error naming the option');

# 2. USER = root: refused as well.
$d = start_dispatcher(config(USER => 'root'), log => "$shared/root-user.log");
$status = dispatcher_exit($d, 30);
ok(defined $status && $status != 0, '[dispatch] USER = root: refused');
like(dispatcher_log($d), qr/\[dispatch\] USER root: refusing to run as root/,
	'saying why');

# 3. A user that does not exist: refused, naming it.
$d = start_dispatcher(config(USER => "nosuch$tag"), log => "$shared/nosuch.log");
$status = dispatcher_exit($d, 30);
ok(defined $status && $status != 0, 'an unknown USER: refused');
like(dispatcher_log($d), qr/\[dispatch\] USER nosuch$tag: no such user/, 'naming it');

# 4. USER and GROUP: the dispatcher and its workers run as them, and the
# mail goes through.
$d = start_dispatcher(config(USER => $user, GROUP => $group), log => "$shared/dispatch.log");
my @ids = add_rows($node, 5);
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }, 60),
	'the rows went through the stages')
  or diag(dispatcher_log($d));
like(dispatcher_log($d), qr/running as $user/, 'the dispatcher says whom it runs as');
my $ids = ids($d->{pid});
is($ids->{Uid}, join("\t", ($uid) x 4), "the dispatcher's user ids are all ${user}'s");
is($ids->{Gid}, join("\t", ($other_gid) x 4), "its group ids all [dispatch] GROUP's");
is($ids->{Groups}, $other_gid, 'and it has no other group');
my @workers = worker_pids($d);
ok(@workers >= 1, 'stage workers are running') or diag(dispatcher_log($d));
for my $pid (@workers)
{
	my $w = ids($pid);
	next unless $w;
	is($w->{Uid}, join("\t", ($uid) x 4), "worker $pid runs as $user");
	is($w->{Gid}, join("\t", ($other_gid) x 4), "worker $pid runs with group $group");
}
is(stop_dispatcher($d), 0, 'it stops cleanly on SIGTERM');

# 5. USER alone: the user's primary group.
$d = start_dispatcher(config(USER => $user), log => "$shared/dispatch2.log");
add_rows($node, 2);
ok(poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 }, 60),
	'with USER alone the rows go through too')
  or diag(dispatcher_log($d));
@workers = worker_pids($d);
ok(@workers >= 1, 'with workers');
is(ids($workers[0])->{Gid}, join("\t", ($gid) x 4), "in ${user}'s primary group") if @workers;
is(stop_dispatcher($d), 0, 'stopped');

done_testing();
