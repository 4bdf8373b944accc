# Pepsi on a highly available PostgreSQL (scripts/ha.sh: etcd and a
# three-node Patroni cluster, synchronous_mode), the smoke test of
# docs/scaling.md: every program is given all three hosts in one conninfo
# and finds the primary itself.  Two pepsi-ingress instances (two ports,
# one queue) and an active and a standby pepsi-dispatch relay to Postfix's
# smtp-sink: the active dispatcher is killed and the standby takes over;
# the primary is killed while mail is being sent and Patroni promotes a
# standby; every message that got a 250 is delivered; then a stage pool
# works through PgBouncer in transaction mode ([database] STAGE_POOLED).

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use IPC::Run;
use Net::SMTP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'patroni, etcd or pgbouncer is not installed (scripts/deps.sh check)'
  unless -x '/usr/bin/patroni' && -x '/usr/bin/etcd' && -x '/usr/sbin/pgbouncer';

my $top = $ENV{PEPSI_TOP} // dirname(abs_path(__FILE__)) . '/..';
my $ha = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $base = PostgreSQL::Test::Cluster::get_free_port();
my $user = getpwuid($<);
my $parent = $$;

sub ha
{
	my (@args) = @_;
	my ($out, $err) = ('', '');

	IPC::Run::run([ "$top/scripts/ha.sh", @args ], '>', \$out, '2>', \$err);
	chomp $out;
	return ($? == 0, $out, $err);
}

END { ha('stop', $ha) if $$ == $parent }

# The start's bound is the suite's for liveness (PG_TEST_TIMEOUT_DEFAULT,
# as poll_until's), not ha.sh's 120 s: three Patroni nodes starting on a
# loaded machine took longer.
$ENV{HA_START_TIMEOUT} = $PostgreSQL::Test::Utils::timeout_default;
# The first node a copy of scripts/check.sh's template with the extension
# created, when there is one (scripts/ha.sh): its script runs once a run.
$ENV{HA_TEMPLATE} = $ENV{PEPSI_INITDB_TEMPLATE_PEPSI} if $ENV{PEPSI_INITDB_TEMPLATE_PEPSI};
my ($started, undef, $start_err) = ha('start', $ha, $base);
ok($started, 'etcd and three Patroni nodes: a leader and two streaming standbys')
  or BAIL_OUT("scripts/ha.sh start: $start_err");
my (undef, $ports) = ha('ports', $ha);

# The primary's port, or undef: one psql given all three hosts, which
# takes the one not in recovery (ha.sh leader asks each node in turn, from
# a shell of its own: the same answer, polled, for a few processes more).
sub leader
{
	my ($out, $err) = ('', '');

	IPC::Run::run(
		[ 'psql', '-XAtq', '-d',
			"host=127.0.0.1,127.0.0.1,127.0.0.1 port=$ports dbname=postgres"
			  . ' target_session_attrs=primary connect_timeout=5',
			'-c', 'SHOW port' ],
		'>', \$out, '2>', \$err);
	chomp $out;
	return $? == 0 && $out =~ /^\d+$/ ? $out : undef;
}
my $first_leader = leader() // BAIL_OUT('no primary among the three nodes');

sub psql_at
{
	my ($port, $sql, $db) = @_;
	my ($out, $err) = ('', '');

	IPC::Run::run([ 'psql', '-XAtq', '-h', '127.0.0.1', '-p', $port, '-d', $db // 'postgres',
			'-c', $sql ], '>', \$out, '2>', \$err);
	chomp $out;
	return $? == 0 ? $out : undef;
}
psql_at($first_leader, 'CREATE EXTENSION IF NOT EXISTS pepsi') // BAIL_OUT('CREATE EXTENSION pepsi on the leader');

# write_config names [database] CONNINFO from the node's host and port: all
# three, and no target_session_attrs (every writer asks for read-write itself).
{
	package HaNodes;
	sub host { return '127.0.0.1,127.0.0.1,127.0.0.1' }
	sub port { return $_[0]{ports} }
}
my $nodes = bless { ports => $ports }, 'HaNodes';

my $root = PostgreSQL::Test::Utils::tempdir();
my $sink = start_sink();
my @ingress_ports = map { PostgreSQL::Test::Cluster::get_free_port() } 1 .. 2;
my %configs;
for my $role (qw(active standby))
{
	$configs{$role} = delivery_config($nodes, maildir_root => $root,
		smarthost => "127.0.0.1:$sink->{port}",
		path => "$tmp/pepsi-$role.conf",
		dispatch => { STANDBY => $role eq 'standby' ? 'yes' : 'no' },
		extra => { smarthost => "PARALLELISM = 2\n" });
}
my @ingress;
for my $i (0 .. 1)
{
	my $config = "$tmp/ingress$i.conf";
	PostgreSQL::Test::Utils::append_to_file($config,
		slurp($configs{active}) . "[ingress]\nAUTHSERV_ID = mx.pepsi.test\n"
		  . "[listener-smtp]\nADDRESS = 127.0.0.1\nPORT = $ingress_ports[$i]\n");
	push @ingress, start_ingress($config, $ingress_ports[$i], "$tmp/ingress$i.log");
}

# Send messages alternately through both ingress instances; returns the
# tags that got a 250 (the others got a 4xx or no answer).
my $sequence = 0;
sub send_messages
{
	my ($count, $seconds) = @_;
	my @accepted;

	for (1 .. $count)
	{
		my $tag = sprintf('msg-%04d', ++$sequence);
		my $smtp = Net::SMTP->new("127.0.0.1:$ingress_ports[$sequence % 2]", Hello => 'client.test',
			Timeout => $seconds // 10) or next;
		my $ok = $smtp->mail('sender@client.test') && $smtp->to("user\@remote.test")
		  && $smtp->data("From: <sender\@client.test>\r\nTo: <user\@remote.test>\r\n"
			  . "Subject: $tag\r\n\r\nbody of $tag\r\n");
		push @accepted, $tag if $ok && $smtp->code == 250;
		$smtp->quit;
	}
	return @accepted;
}

# The tags smtp-sink received, with how many times each.
sub delivered
{
	my %seen;

	for my $file (glob("$sink->{dir}/mail/*"))
	{
		my $text = slurp($file) // '';
		$seen{$1}++ while $text =~ /^Subject: (msg-\d+)/mg;
	}
	return \%seen;
}

sub all_delivered
{
	my (@tags) = @_;

	return poll_until(sub { my $seen = delivered(); !grep { !$seen->{$_} } @tags }, 120);
}

#
# An active and a standby dispatcher: the standby waits on the lock.
#
my $active = start_dispatcher($configs{active}, log => "$tmp/dispatch-active.log");
ok(poll_until(sub { dispatcher_log($active) =~ /connected to the database/ }, 60),
	'the active dispatcher found the primary among three hosts');
my $standby = start_dispatcher($configs{standby}, log => "$tmp/dispatch-standby.log");
ok(poll_until(sub { dispatcher_log($standby) =~ /standby: waiting for the dispatcher lock of every stage/ }, 60),
	'the standby dispatcher waits on the lock');

my @accepted = send_messages(20);
is(scalar @accepted, 20, 'twenty messages accepted through two ingress instances');
ok(all_delivered(@accepted), 'and delivered to smtp-sink by the active dispatcher');

kill 'KILL', $active->{pid};
dispatcher_exit($active, 10);
ok(poll_until(sub { dispatcher_log($standby) =~ /standby: took over every stage after [\d.]+ s/ }, 60),
	'the active dispatcher killed: the standby took over, and said so');
my @second = send_messages(10);
is(scalar @second, 10, 'ten more messages accepted');
ok(all_delivered(@second), 'and delivered by the dispatcher that took over');

#
# The primary killed while mail is being sent: a child sends, the parent kills.
#
my $sent_file = "$tmp/accepted-during-failover";
my $sender = fork;
die "fork: $!" unless defined $sender;
if ($sender == 0)
{
	# Until the parent says stop (a file), at most 400 messages.
	my $n = 0;
	$sequence = 1000;
	while (!-e "$tmp/stop-sending" && $n++ < 400)
	{
		my @ok = send_messages(1, 5);
		PostgreSQL::Test::Utils::append_to_file($sent_file, "$_\n") for @ok;
	}
	exit 0;
}
sub accepted_during
{
	my @tags = -e $sent_file ? split(/\n/, slurp($sent_file)) : ();

	return @tags;
}
ok(poll_until(sub { accepted_during() >= 10 }, 60), 'messages flow before the kill');
my (undef, $kill) = ha('kill-leader', $ha);
my ($killed) = split ' ', $kill;    # its port, then the time of the kill
my $new_leader;
ok(poll_until(sub { $new_leader = leader(); defined $new_leader && $new_leader ne $killed }, 90),
	'Patroni promoted a standby');
my $before = accepted_during();
ok(poll_until(sub { accepted_during() >= $before + 10 }, 90), 'ingress accepts again on the new primary');
PostgreSQL::Test::Utils::append_to_file("$tmp/stop-sending", '');
waitpid($sender, 0);
my @during = accepted_during();
ok(all_delivered(@during), scalar(@during) . ' messages got a 250 around the failover: every one delivered');
my $seen = delivered();
my @twice = grep { $seen->{$_} > 1 } keys %$seen;
note(scalar(@twice) . ' delivered twice (a delivery whose commit was lost with the primary)');
like(slurp("$tmp/ingress0.log") . slurp("$tmp/ingress1.log"),
	qr/lost the database connection to .*reconnecting/, 'ingress logged the loss in one line');
like(slurp("$tmp/ingress0.log") . slurp("$tmp/ingress1.log"),
	qr/reconnected to the database postgres on 127\.0\.0\.1 port $new_leader/, 'and reconnected to the new primary');
like(dispatcher_log($standby), qr/reconnected to the database postgres on 127\.0\.0\.1 port $new_leader/,
	'the dispatcher followed the primary');

#
# A stage pool through PgBouncer in transaction mode.
#
my $bouncer = DeliveryTest::start_server('pgbouncer', sub {
	my ($port, $dir) = @_;

	PostgreSQL::Test::Utils::append_to_file("$dir/pgbouncer.ini", <<"INI");
[databases]
postgres = host=127.0.0.1 port=$new_leader dbname=postgres user=$user
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 4
admin_users = $user
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
	return ('/usr/sbin/pgbouncer', "$dir/pgbouncer.ini");
});
my $bouncer_port = $bouncer->{port};
PostgreSQL::Test::Utils::append_to_file($configs{standby},
	"[database]\nSTAGE_CONNINFO = host=127.0.0.1 port=$bouncer_port dbname=postgres\nSTAGE_POOLED = yes\n");
kill 'HUP', $standby->{pid};
ok(poll_until(sub { dispatcher_log($standby) =~ /configuration reloaded/ }, 30), 'the dispatcher reloaded');
# Sent as a client sends: one refused for the moment (an ingress still
# finding the new primary answers 451) is sent again, within a minute.
my @pooled;
poll_until(sub { push @pooled, send_messages(10 - @pooled); @pooled >= 10 }, 60);
is(scalar @pooled, 10, 'ten messages accepted');
ok(all_delivered(@pooled), 'and delivered by stage workers connected through PgBouncer');
my $clients = psql_at($bouncer_port, 'SHOW STATS', 'pgbouncer') // '';
my ($xacts) = $clients =~ /^postgres\|(\d+)/m;
cmp_ok($xacts // 0, '>', 0, 'PgBouncer carried the stage workers\' transactions');
unlike(slurp("$tmp/dispatch-standby.log"), qr/prepared statement .* does not exist/,
	'no prepared statement was relied on through the pooler');

is(stop_dispatcher($standby), 0, 'the dispatcher stops cleanly');
stop_process($_) for @ingress;
stop_process($bouncer);
done_testing();
