# A real Dovecot for the LMTP tests: an unprivileged instance with its own
# configuration (base_dir, a passwd-file userdb with the test's own uid,
# Maildirs under the test's directory, the quota plugin) listening for
# LMTP on a Unix socket and on a TCP port of the loopback.

package DovecotTest;

use strict;
use warnings FATAL => 'all';

use Exporter 'import';
use File::Temp ();
use IO::Socket::INET;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes ();

use PepsiTest;

our @EXPORT = qw(start_dovecot restart_dovecot stop_dovecot dovecot_messages);

my @running;

END { stop_dovecot($_) for @running }

# %o: users => { name => { quota => '1K' } or {} }.  Returns { pid, socket,
# port, dir, log }.  Mail for user@any.domain goes to dir/mail/user/Maildir.
sub start_dovecot
{
	my (%o) = @_;
	# Socket paths are short (sun_path): base_dir in /tmp, mail beside it.
	my $dir = File::Temp::tempdir('/tmp/pepsi-dovecot-XXXXXX', CLEANUP => 1);
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my ($user, $group) = (scalar(getpwuid($>)), scalar(getgrgid($) + 0)));
	my ($uid, $gid) = ($>, $) + 0);
	my %users = %{ $o{users} };

	mkdir "$dir/$_" for qw(run mail state);
	open my $pw, '>', "$dir/passwd" or die "$dir/passwd: $!";
	for my $name (sort keys %users)
	{
		my $quota = $users{$name}{quota} ? "userdb_quota_rule=*:storage=$users{$name}{quota}" : '';
		print $pw "$name:{plain}unused:${uid}:${gid}::$dir/mail/${name}::$quota\n";
	}
	close $pw;
	open my $conf, '>', "$dir/dovecot.conf" or die "$dir/dovecot.conf: $!";
	print $conf <<"CONF";
base_dir = $dir/run
state_dir = $dir/state
log_path = $dir/dovecot.log
instance_name = pepsi-test-$port
default_internal_user = $user
default_internal_group = $group
default_login_user = $user
first_valid_uid = $uid
last_valid_uid = $uid
first_valid_gid = $gid
last_valid_gid = $gid
protocols = lmtp
ssl = no
listen = 127.0.0.1
auth_username_format = %Ln
mail_location = maildir:~/Maildir
mail_plugins = quota
mail_fsync = always
passdb {
  driver = passwd-file
  args = $dir/passwd
}
userdb {
  driver = passwd-file
  args = $dir/passwd
}
plugin {
  quota = maildir:User quota
  quota_rule = *:storage=100M
}
service lmtp {
  unix_listener lmtp {
    mode = 0600
  }
  inet_listener lmtp {
    address = 127.0.0.1
    port = $port
  }
}
service auth {
  user = $user
}
service auth-worker {
  user = $user
}
service anvil {
  chroot =
}
service stats {
  chroot =
}
CONF
	close $conf;
	my $d = { dir => $dir, socket => "$dir/run/lmtp", port => $port, log => "$dir/dovecot.log" };
	push @running, $d;
	restart_dovecot($d);
	return $d;
}

# Start (again) the instance of $d, and wait until it listens on both.
sub restart_dovecot
{
	my ($d) = @_;
	my $dir = $d->{dir};
	my $pid = fork;

	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDOUT, '>>', "$dir/dovecot.out";
		open STDERR, '>&', \*STDOUT;
		exec '/usr/sbin/dovecot', '-F', '-c', "$dir/dovecot.conf" or die "exec: $!";
	}
	$d->{pid} = $pid;
	poll_until(
		sub {
			return 0 unless -S $d->{socket};
			my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$d->{port}", Timeout => 1);
			$s->close if $s;
			return $s;
		},
		60) or die "dovecot did not start: " . (-e "$dir/dovecot.out" ? slurp_file("$dir/dovecot.out") : '');
	return $d;
}

sub stop_dovecot
{
	my ($d) = @_;

	return unless $d && $d->{pid};
	kill 'TERM', $d->{pid};
	waitpid($d->{pid}, 0);
	$d->{pid} = 0;
}

# The messages delivered to user's INBOX (new/ and cur/), as text, oldest
# first.  Dovecot names a delivery SECONDS.MMICROSECONDSPPID.HOST, with the
# microseconds not padded, so names compare as those two numbers: neither
# a file's mtime (whole seconds) nor the names as strings order two
# deliveries made in the same second.
sub dovecot_messages
{
	my ($d, $user) = @_;
	my @files = map { glob("$d->{dir}/mail/$user/Maildir/$_/*") } qw(new cur);
	my %when = map {
		my ($seconds, $micro) = m{/(\d+)\.M(\d+)P[^/]*$};
		($_ => defined $micro ? $seconds * 1_000_000 + $micro : (Time::HiRes::stat($_))[9] * 1_000_000)
	} @files;

	return map { slurp_file($_) } sort { $when{$a} <=> $when{$b} || $a cmp $b } @files;
}

1;
