# Helpers for the TAP tests of pepsi-dispatch: a cluster with the extension
# and a test_log table the test workers (t/bin/test-stage) write to, a
# configuration file pointing at it, the dispatcher as a real child process
# with its log in a file, rows to feed it, and the process table.  Polling
# is PepsiTest's poll_until (exported here too, for the dispatcher tests).

package DispatchTest;

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use Exporter 'import';
use File::Basename qw(dirname);
use POSIX qw(WNOHANG);
use PostgreSQL::Test::Utils;

use PepsiTest;
use Test::Builder;

# Every dispatcher started, for the failure report in END.
my @started;

our @EXPORT = qw(
  dispatch_node write_config start_dispatcher stop_dispatcher dispatcher_exit
  dispatcher_log poll_until add_rows scalar_query worker_pids pepsi_bin
  test_program real_stages light_row_past_held
);

# A pipeline of the stock stages: bounces (null sender) dropped, the rest
# routed (a mixed row split) and dropped.
sub real_stages
{
	return <<'EOF';
[stage-init]
PROGRAM = pepsi-stage-if
CONDITION = mail_from = ""
THEN_STAGE = drop
ELSE_STAGE = route
[stage-route]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = example.org
LOCAL_STAGE = drop
REMOTE_STAGE = drop
[stage-drop]
PROGRAM = pepsi-stage-discard
EOF
}

my $db = 'postgres';

# Where the programs under test are: $PEPSI_BIN (scripts/check.sh), else
# the build tree this test file sits in.
sub pepsi_bin
{
	my ($name) = @_;
	my $dir = $ENV{PEPSI_BIN} // dirname(abs_path(__FILE__)) . '/../../build/bin';

	return abs_path($dir) . "/$name";
}

# A test stage program of t/bin/, by absolute path (the dispatcher execs
# a PROGRAM with a slash as given).
sub test_program
{
	my ($name) = @_;

	return abs_path(dirname(abs_path(__FILE__)) . "/../bin") . "/$name";
}

# A started cluster with the extension in database postgres and the table
# test-stage records what it did in: one row per row it concluded, in the
# order of their commits.
sub dispatch_node
{
	my ($name, %opts) = @_;
	my $node = pepsi_node($name, %opts, extension => 1);

	$node->safe_psql($db,
		    'CREATE TABLE test_log (seq bigserial PRIMARY KEY, id bigint NOT NULL,'
		  . ' stage text NOT NULL, sender text, pid integer, tag text,'
		  . ' at timestamptz NOT NULL DEFAULT clock_timestamp())');
	return $node;
}

# Write a pepsi.conf for $node: [database], a [dispatch] section from
# $opts{dispatch} (a hash), then $opts{stages}, the [stage-*] sections as
# text.  Returns the file's path.
sub write_config
{
	my ($node, %opts) = @_;
	my $path = $opts{path} // PostgreSQL::Test::Utils::tempdir() . '/pepsi.conf';
	my %dispatch = (POLL_INTERVAL => '1s', %{ $opts{dispatch} // {} });
	my $text = "[database]\nCONNINFO = host=" . $node->host
	  . ' port=' . $node->port . " dbname=$db\n";

	$text .= "[pepsi]\n" . join('', map { "$_ = $opts{pepsi}{$_}\n" } sort keys %{ $opts{pepsi} })
	  if $opts{pepsi};
	$text .= "[dispatch]\n" . join('', map { "$_ = $dispatch{$_}\n" } sort keys %dispatch);
	$text .= $opts{stages} // '';
	open my $fh, '>', $path or die "cannot write $path: $!";
	print $fh $text;
	close $fh;
	return $path;
}

# Start pepsi-dispatch -c $config -v with stdout and stderr in a log file.
# Returns a handle: { pid, log }.  $opts{program} replaces the binary (the
# multi-call one: [path, 'pepsi-dispatch']).
sub start_dispatcher
{
	my ($config, %opts) = @_;
	my $log = $opts{log} // PostgreSQL::Test::Utils::tempdir() . '/dispatch.log';
	my @command = $opts{program} ? @{ $opts{program} } : (pepsi_bin('pepsi-dispatch'));
	my $pid = fork;

	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDOUT, '>>', $log or die "cannot write $log: $!";
		open STDERR, '>&', \*STDOUT or die "dup: $!";
		exec @command, '-c', $config, '-v' or die "exec $command[0]: $!";
	}
	my $d = { pid => $pid, log => $log, offset => -e $log ? -s $log : 0 };
	push @started, $d;
	return $d;
}

# When a test file fails, the end of each dispatcher's log (its workers
# share it) is printed with the failure: the log is in a temporary
# directory that is gone once the test exits, and a failure that only
# happens on a loaded CI machine cannot be asked about afterwards.
END
{
	my $builder = Test::Builder->new;
	if (!$builder->is_passing)
	{
		for my $d (@started)
		{
			my @lines = split /\n/, dispatcher_log($d);
			splice @lines, 0, @lines - 60 if @lines > 60;
			$builder->diag("dispatcher $d->{pid}, the end of $d->{log}:\n" . join("\n", @lines));
		}
	}
}

# The exit status of a dispatcher that has exited (as $?), else undef;
# waits up to $seconds (default 0).
sub dispatcher_exit
{
	my ($d, $seconds) = @_;

	return $d->{status} if defined $d->{status};
	poll_until(
		sub {
			return 0 unless waitpid($d->{pid}, WNOHANG) == $d->{pid};
			$d->{status} = $?;
			return 1;
		},
		$seconds // 0);
	return $d->{status};
}

# Signal the dispatcher and wait up to $seconds (default 60) for it to exit.
# Returns its exit status, or undef if it did not exit (it is then killed).
sub stop_dispatcher
{
	my ($d, $signal, $seconds) = @_;

	return $d->{status} if defined $d->{status};
	kill $signal // 'TERM', $d->{pid};
	my $status = dispatcher_exit($d, $seconds // 60);
	if (!defined $status)
	{
		kill 'KILL', $d->{pid};
		dispatcher_exit($d, 10);
	}
	return $status;
}

# What the dispatcher (and its workers, which share its stderr) has logged.
sub dispatcher_log
{
	my ($d) = @_;

	return -e $d->{log} ? PostgreSQL::Test::Utils::slurp_file($d->{log}) : '';
}

sub scalar_query
{
	my ($node, $sql) = @_;

	return $node->safe_psql($db, $sql);
}

# Admit $count rows at $opts{stage} (default init), from $opts{sender} (a
# client address; none means sender "local"), with $opts{state} (JSON text),
# in one transaction, then wake the dispatcher.  Returns the ids.
sub add_rows
{
	my ($node, $count, %opts) = @_;
	my $stage = $opts{stage} // 'init';
	my $state = $opts{state} // '{}';
	my $address = defined $opts{sender} ? "'$opts{sender}'::inet" : 'NULL';
	my $ids = $node->safe_psql($db,
		    "SELECT string_agg(pepsi.workqueue_add('sender\@example.org',"
		  . " ARRAY['rcpt\@example.net'], 'Subject: test'::bytea, 'body'::bytea,"
		  . " '$state'::jsonb, $address, stage => '$stage')::text, ',')"
		  . " FROM generate_series(1, $count);"
		  # the wake, once they have committed, in the same psql
		  . ($opts{quiet} ? '' : "\nSELECT pepsi.notify_workqueue();"));
	return split /,/, (split /\n/, $ids)[0] // '';
}

# At stage $stage (a batching test-stage), three rows of the heavy sender
# 10.0.0.1 held until the file $gate exists, then a row of the light
# sender 10.9.0.1, which must be done while they are still held (tests
# named so).  Returns the light row's id and the held rows' ids.
sub light_row_past_held
{
	my ($node, $stage, $gate) = @_;
	my $held = qq({"wait_file": "$gate"});
	my @heavy = add_rows($node, 3, stage => $stage, sender => '10.0.0.1', state => $held);

	Test::More::ok(
		poll_until(
			sub {
				scalar_query($node,
					"SELECT count(*) FROM pepsi.workqueue WHERE stage = '$stage' AND status = 'running'"
				) == 3;
			}),
		'the heavy rows are running, held');
	my ($light) = add_rows($node, 1, stage => $stage, sender => '10.9.0.1');
	Test::More::ok(
		poll_until(
			sub { scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $light") == 1 }),
		'the light row is done while the heavy batch is held');
	Test::More::is(
		scalar_query($node,
			'SELECT count(*) FROM pepsi.workqueue WHERE id IN (' . join(',', @heavy) . ')'),
		3, 'the heavy rows are still held meanwhile');
	return ($light, @heavy);
}

# The pids of the dispatcher's children whose command line mentions
# $pattern (a worker's program), from the process table.
sub worker_pids
{
	my ($d, $pattern) = @_;
	my @pids;

	opendir my $proc, '/proc' or die "/proc: $!";
	for my $pid (grep { /^\d+$/ } readdir $proc)
	{
		open my $fh, '<', "/proc/$pid/stat" or next;
		my $stat = <$fh>;
		close $fh;
		next unless defined $stat && $stat =~ /\)\s+(\S)\s+(\d+)/;
		next if $1 eq 'Z' || $2 != $d->{pid};
		open $fh, '<', "/proc/$pid/cmdline" or next;
		my $cmdline = join ' ', split /\0/, (<$fh> // '');
		close $fh;
		push @pids, $pid if !defined $pattern || $cmdline =~ /$pattern/;
	}
	closedir $proc;
	@pids = sort { $a <=> $b } @pids;
	return @pids;
}

1;
