# Helpers shared by the TAP tests of the pepsi extension: throwaway clusters,
# queue rows in a known state, polling with a deadline (poll_until, the one
# polling loop of the tests, and what is built on it), and concurrent
# sessions driven by pgbench.  Every helper talks to a real server through
# psql or pgbench; none of them reaches into the queue behind its back except
# where a test says so (a row set running by hand stands in for the claim).

package PepsiTest;

use strict;
use warnings FATAL => 'all';

use Exporter 'import';
use File::Basename qw(dirname);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes ();

# PostgreSQL::Test::Cluster->init runs "pg_regress --config-auth", found
# through PG_REGRESS, which PGXS's prove_check sets but a bare prove (as in
# scripts/check.sh) does not: find it next to the PGXS makefiles.
BEGIN
{
	if (!$ENV{PG_REGRESS})
	{
		my $pgxs = `pg_config --pgxs`;

		chomp $pgxs;
		$ENV{PG_REGRESS} = dirname($pgxs) . '/../test/regress/pg_regress'
		  if $pgxs;
	}
}

our @EXPORT = qw(
  pepsi_node poll_until wait_until queue_count maintenance_pid worker_state_change
  add_running_message running_siblings concurrently log_since file_shows
  prometheus_samples self_signed_certificate admit_sql nice_of raised_nice server_nice
  session_nices session_autogroup_nices queued_row psql_each_stderr sql_session poll_drained
);

# A /metrics exposition parsed by the Prometheus project's own parser
# (python3-prometheus-client): (undef, the parser's complaint) when it
# refuses the text, else (1, { "name{label=value,...}" => value }).
sub prometheus_samples
{
	my ($text) = @_;
	my ($out, $err) = ('', '');
	my $parser = <<'PY';
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join("%s=%s" % kv for kv in sorted(s.labels.items()))
        print("%s|%s|%s|%s" % (family.type, s.name, labels, s.value))
PY
	IPC::Run::run([ 'python3', '-c', $parser ], '<', \$text, '>', \$out, '2>', \$err)
	  or return (undef, $err);
	my %samples;
	for (split /\n/, $out)
	{
		my ($type, $name, $labels, $value) = split /\|/;
		$samples{"$name\{$labels\}"} = $value;
	}
	return (1, \%samples);
}

# $node->init, with the data directory copied from PEPSI_INITDB_TEMPLATE
# when it is set (scripts/check.sh runs initdb once per run and names the
# result there) instead of an initdb of its own: the same files initdb
# makes, in a fraction of its time.  The rest of init (the test
# configuration, the port) is PostgreSQL::Test::Cluster's own.
# "pg_regress --config-auth" changes nothing outside Windows, and the
# template was made with it.
sub init_from_template
{
	my ($node, $template) = @_;

	$template //= $ENV{PEPSI_INITDB_TEMPLATE};

	return $node->init unless $template;
	die "PEPSI_INITDB_TEMPLATE $template: not a data directory\n"
	  unless -f "$template/PG_VERSION";
	my $real = \&PostgreSQL::Test::Utils::system_or_bail;
	no warnings 'redefine';
	local *PostgreSQL::Test::Utils::system_or_bail = sub {
		return $real->('cp', '-RPp', $template, $_[2]) if $_[0] eq 'initdb';
		return if ($_[1] // '') eq '--config-auth';
		return $real->(@_);
	};
	return $node->init;
}

# A started cluster.  preload => 1 puts pepsi in shared_preload_libraries;
# conf => extra postgresql.conf lines; extension => 1 gives it the pepsi
# extension in database postgres: a copy of PEPSI_INITDB_TEMPLATE_PEPSI
# when it is set (scripts/check.sh made it from the initdb template with
# CREATE EXTENSION pepsi: the same catalogs, without running the
# extension's script again for each test), else a CREATE EXTENSION once
# the cluster has started.
sub pepsi_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	my $with_pepsi = $opts{extension} && $ENV{PEPSI_INITDB_TEMPLATE_PEPSI};

	init_from_template($node, $with_pepsi ? $ENV{PEPSI_INITDB_TEMPLATE_PEPSI} : undef);
	$node->append_conf('postgresql.conf', "shared_preload_libraries = 'pepsi'\n")
	  if $opts{preload};
	# Enough slots for a dynamic worker per database and the pgbench clients.
	$node->append_conf('postgresql.conf',
		"max_worker_processes = 16\nmax_connections = 40\n");
	$node->append_conf('postgresql.conf', $opts{conf}) if $opts{conf};
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION pepsi') if $opts{extension} && !$with_pepsi;
	return $node;
}

# The sessions of the polls running (poll_until), by connection string and
# the PG* environment, each { run, stdin, stdout, stderr, timer, count }
# (a run undef until the statement's second probe asks for one).
our %poll_sessions;
our $poll_depth = 0;

# Call $check until it returns a true value, for at most $seconds (default
# PostgreSQL's test timeout, PG_TEST_TIMEOUT_DEFAULT, 180 s unless set; 0
# checks once).  Returns the last value.  The default bounds liveness, not
# speed: it used to be 30 s, which a bounce or a retry that takes two
# seconds on a quiet machine overran on one whose two cores were busy
# (t/164's LMTP bounce under a load of 24), a flake rather than a finding;
# PostgreSQL's own waits (poll_query_until) take the same knob.  A test
# that asserts something does not happen passes its own short $seconds.
# Every 50 ms for the first second, then every 100 ms, and every
# 200 ms after five: most checks start a psql and a backend, which cost
# more CPU than a wait of 50 ms, and the suite's files share two cores.
#
# The statements a check runs through $node->psql or $node->safe_psql (as
# queue_count and wait_until do) go, from their second probe on, to one
# psql session kept open for the poll (poll_session_psql, below) instead
# of a psql process, a backend and an authentication each: the same
# answers, for a fraction of the CPU.  The sessions end with the poll.
sub poll_until
{
	my ($check, $seconds) = @_;
	my $started = Time::HiRes::time();
	my $deadline = $started + ($seconds // $PostgreSQL::Test::Utils::timeout_default);
	my $value;

	my $outermost = !$poll_depth++;
	my $real_psql = \&PostgreSQL::Test::Cluster::psql;
	no warnings 'redefine';
	local *PostgreSQL::Test::Cluster::psql =
	  $outermost ? sub { return poll_session_psql($real_psql, @_) } : $real_psql;
	use warnings 'redefine';
	my $ok = eval {
		while (1)
		{
			$value = $check->();
			my $now = Time::HiRes::time();
			last if $value || $now >= $deadline;
			my $waited = $now - $started;
			Time::HiRes::usleep($waited < 1 ? 50_000 : $waited < 5 ? 100_000 : 200_000);
		}
		1;
	};
	my $error = $@;
	$poll_depth--;
	poll_sessions_end() if $outermost;
	die $error unless $ok;
	return $value;
}

# A statement a kept session answers as a psql of its own would: one
# statement that only reads (SELECT, WITH, TABLE, VALUES), with nothing
# that would outlive it in the session (a setting, a lock of the session,
# a temporary table, a LISTEN) and no psql meta-command.
sub poll_session_statement_ok
{
	my ($sql) = @_;

	return 0 if ref $sql || !defined $sql;
	return 0 unless $sql =~ /^\s*(?:SELECT|WITH|TABLE|VALUES)\b/i;
	return 0 if $sql =~ /;\s*\S/ || $sql =~ /\\/;
	return 0 if $sql =~ /\b(?:set_config|advisory|temp|temporary|listen|dblink|INTO)\b/i;
	return 0 if $sql =~ /\b(?:INSERT|UPDATE|DELETE|MERGE|SET|CREATE|DROP|ALTER|LOCK)\s/i;
	return 1;
}

# $node->psql during a poll: a statement poll_session_statement_ok lets
# through, with only the options safe_psql passes, goes to the poll's
# session for its node, database and environment (opened on its second
# probe); anything else, or a session gone (the server restarted since),
# to a psql of its own as before.  Returns what psql would.
sub poll_session_psql
{
	my ($real, $node, $db, $sql, %params) = @_;
	my %known = map { $_ => 1 } qw(stdout stderr on_error_die on_error_stop);

	return $real->($node, $db, $sql, %params)
	  if grep({ !$known{$_} } keys %params) || !poll_session_statement_ok($sql);
	my $session;
	{
		local %ENV = $node->_get_env();
		my $key = join "\0", $node->connstr($db),
		  map { "$_=$ENV{$_}" } sort grep { /^PG/ } keys %ENV;
		$session = $poll_sessions{$key} //= { key => $key };
		if (!$session->{run} && $session->{count}++)
		{
			@$session{qw(stdin stdout stderr)} = ('', '', '');
			$session->{timer} = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
			$session->{run} = eval {
				IPC::Run::start(
					[
						$node->installed_command('psql'), '-XAtq', '-d',
						$node->connstr($db), '-f', '-'
					],
					'<', \$session->{stdin}, '>', \$session->{stdout},
					'2>', \$session->{stderr}, $session->{timer});
			};
		}
	}
	my ($out, $err);
	($out, $err) = poll_session_query($session, $sql) if $session->{run};
	return $real->($node, $db, $sql, %params) unless defined $out;

	# As psql itself: ON_ERROR_STOP makes an error exit 3, else 0.
	my $ret = ($params{on_error_stop} // 1) && $err =~ /^(?:psql:[^\n]*)?(?:ERROR|FATAL|PANIC):/m ? 3 : 0;
	chomp $out;
	chomp $err;
	${ $params{stdout} } = $out if ref $params{stdout};
	${ $params{stderr} } = $err if ref $params{stderr};
	die "error running SQL: '$err'\nwhile running psql in a poll's session with sql '$sql'"
	  if $ret && $params{on_error_die};
	return wantarray ? ($ret, $out, $err) : $ret;
}

# Run $sql in $session: (stdout, stderr), or () when the session is gone
# (it is then closed, and the caller runs a psql of its own).
sub poll_session_query
{
	my ($session, $sql) = @_;
	my $banner = 'pepsi poll ' . ++$session->{queries} . ':';
	my ($out, $err);

	my $ok = eval {
		$session->{timer}->start($PostgreSQL::Test::Utils::timeout_default);
		$session->{stdout} = $session->{stderr} = '';
		my $input = "$sql\n;\n\\echo '$banner'\n\\warn '$banner'\n";
		# (a statement without its ; runs at the next line's, in the session)
		my $before = ($session->{lines} // 0) + ($sql =~ /;\s*\z/ ? 0 : 1);
		$session->{lines} += ($input =~ tr/\n//);
		$session->{stdin} .= $input;
		$session->{run}->pump
		  until $session->{stdout} =~ /^\Q$banner\E\n/m && $session->{stderr} =~ /^\Q$banner\E\n/m;
		($out = $session->{stdout}) =~ s/^\Q$banner\E\n\z//m or die "output after the banner\n";
		($err = $session->{stderr}) =~ s/^\Q$banner\E\n\z//m or die "output after the banner\n";
		# psql numbers the lines of its input: as a psql of its own would.
		$err =~ s/^psql:<stdin>:(\d+):/'psql:<stdin>:' . ($1 - $before) . ':'/gme;
		1;
	};
	return ($out, $err) if $ok;
	poll_session_close($session);
	delete $poll_sessions{ $session->{key} };
	return ();
}

sub poll_session_close
{
	my ($session) = @_;
	my $run = delete $session->{run} or return;

	eval {
		$session->{stdin} .= "\\q\n" if $run->pumpable;
		$session->{timer}->start(10);
		$run->finish;
	};
	eval { $run->kill_kill } if $@;
	return;
}

sub poll_sessions_end
{
	poll_session_close($_) for values %poll_sessions;
	%poll_sessions = ();
	return;
}

# Call $count until it returns 0, for as long as it keeps falling: a load
# whose pace is the machine's (how busy its cores are) is bounded by a
# stall, not by a total.  False once the count has not fallen for $stall
# seconds (default 60), or after ten times that in all.
sub poll_drained
{
	my ($count, $stall) = @_;
	$stall //= 60;
	my ($least, $since, $left);

	poll_until(
		sub {
			$left = $count->();
			my $now = Time::HiRes::time();
			($least, $since) = ($left, $now) if !defined $least || $left < $least;
			return $left == 0 || $now - $since > $stall;
		},
		10 * $stall);
	return $left == 0;
}

# Poll until $sql (in database $db) returns $expected (default 't'), for at
# most $seconds (default as poll_until's); an error (the server restarting, say) counts
# as not yet.  On a timeout, says what it got last.
sub wait_until
{
	my ($node, $db, $sql, $expected, $seconds) = @_;
	my ($ret, $out, $err);

	$expected //= 't';
	return 1
	  if poll_until(
		sub {
			($ret, $out, $err) = $node->psql($db, $sql);
			return $ret == 0 && $out eq $expected;
		},
		$seconds);
	Test::More::diag("waited for \"$sql\" to return \"$expected\"; the last answer was \""
		  . ($ret == 0 ? $out : $err) . '"');
	return 0;
}

# The statement that admits $count rows at stage relay from client $address
# (one sender, one recipient, empty message): the claim tests' senders.
sub admit_sql
{
	my ($count, $address) = @_;

	return "SELECT count(pepsi.workqueue_add('s\@example.org', '{r\@example.net}', '', '', '{}',"
	  . " '$address'::inet, NULL, 'relay')) FROM generate_series(1, $count)";
}

# The row of the message ingress answered with $reply ("250 2.0.0 Ok:
# queued as QUEUE-ID"): its queue id is the row's state.queue_id
# (common/message/queue_id.h), or the mail log's for a row already gone.  undef
# when the reply queued nothing.
sub queued_row
{
	my ($node, $reply) = @_;
	my ($queue_id) = ($reply // '') =~ /queued as ([0-9A-Za-z]+)/ or return undef;
	my $row = $node->safe_psql('postgres',
		"SELECT coalesce((SELECT id FROM pepsi.workqueue WHERE state ->> 'queue_id' = '$queue_id'),"
		  . " (SELECT workqueue_id FROM pepsi.mail_log WHERE queue_id = '$queue_id' ORDER BY id LIMIT 1))");
	return $row eq '' ? undef : $row;
}

# A function that runs a statement in one psql session kept open (a
# BackgroundPsql), as $node->safe_psql would in a session of its own: each
# statement its own transaction, its output without the last newline, an
# error fatal.  A test of many small statements saves a psql start and a
# connection per statement.  The session's timer runs per statement; the
# session ends with the test, or with the server.
sub sql_session
{
	my ($node, $db) = @_;
	my $session = $node->background_psql($db, on_error_stop => 0);

	$session->set_query_timer_restart;
	return sub {
		my ($sql) = @_;

		$session->{stderr} = '';
		my $out = $session->query($sql);
		die "statement failed: $sql\n$session->{stderr}"
		  if $session->{stderr} =~ /^(?:psql:.*?)?(?:ERROR|FATAL|PANIC):/m;
		Test::More::note("stderr of \"$sql\": $session->{stderr}") if $session->{stderr} ne '';
		return $out;
	};
}

# Run the statements of @$statements in one psql session (each its own
# transaction, as separate psql calls would run them, and an error in one
# does not stop the next) and return what each wrote to stderr (its error,
# its notices), in order: one session instead of one per statement.  psql's
# \warn writes a marker to the same stderr between statements.
sub psql_each_stderr
{
	my ($node, $db, $statements) = @_;
	my $marker = '==pepsi-statement-' . int(rand(1e9)) . '==';
	my ($stdout, $stderr) = ('', '');
	my $script = '';

	for my $i (0 .. $#$statements)
	{
		die "psql_each_stderr: statement $i holds a newline\n"
		  if $statements->[$i] =~ /\n/;
		$script .= "\\warn $marker $i\n$statements->[$i];\n";
	}
	$script .= "\\warn $marker end\n";
	$node->psql($db, $script, stdout => \$stdout, stderr => \$stderr, on_error_stop => 0);
	# psql's own call (PostgreSQL::Test::Cluster) chomps its stderr.
	$stderr .= "\n";
	my @parts = split /^\Q$marker\E (?:\d+|end)\n/m, $stderr, -1;
	die "psql_each_stderr: expected "
	  . (@$statements + 2)
	  . " parts of psql's stderr, got "
	  . scalar(@parts)
	  . ":\n$stderr"
	  unless @parts == @$statements + 2 && $parts[0] eq '' && $parts[-1] eq '';
	# As that call would have returned each statement's.
	chomp @parts;
	return @parts[ 1 .. $#parts - 1 ];
}

# The nice value of process $pid (/proc/PID/stat, field 19).
sub nice_of
{
	my ($pid) = @_;
	open my $fh, '<', "/proc/$pid/stat" or die "cannot read /proc/$pid/stat: $!";
	my $stat = <$fh>;
	close $fh;
	$stat =~ s/^.*\) //s;
	return (split / /, $stat)[16];
}

# The nice value a process asked to run at $wanted has, when it started at
# the nice values of @from (its parent's, its server's): a nice value is
# only ever raised, as lowering it takes a privilege (the dispatcher's
# BULK_NICE, pepsi.session_nice).  So under a suite run at nice 19 the
# workers and sessions run at 19, not 10: the intent is that they run no
# sooner than $wanted, and no sooner than what started them.
sub raised_nice
{
	my ($wanted, @from) = @_;
	my $nice = $wanted;

	$_ > $nice and $nice = $_ for @from;
	return $nice;
}

# The nice value of $node's server (its postmaster, which every backend
# starts at).
sub server_nice
{
	my ($node) = @_;
	return nice_of($node->{_pid});
}

# The pids of the sessions of application $name in database $db.
sub session_pids
{
	my ($node, $db, $name) = @_;
	return split /\n/,
	  $node->safe_psql($db, "SELECT pid FROM pg_stat_activity WHERE application_name = '$name'");
}

# The nice values of the sessions of application $name, in order.
sub session_nices
{
	my ($node, $db, $name) = @_;
	return join ' ', sort { $a <=> $b } map { nice_of($_) } session_pids($node, $db, $name);
}

# The autogroup nice values of the same sessions, in order (sched(7);
# PostgreSQL makes each backend the leader of a session, so each has a
# group of its own: extension/src/session.c).
sub session_autogroup_nices
{
	my ($node, $db, $name) = @_;
	return join ' ', sort { $a <=> $b } map {
		open my $fh, '<', "/proc/$_/autogroup" or die "cannot read /proc/$_/autogroup: $!";
		my ($nice) = <$fh> =~ / nice (-?\d+)$/;
		$nice
	} session_pids($node, $db, $name);
}

# The number of rows of the queue (in database $db, default postgres),
# those matching $where if given.
sub queue_count
{
	my ($node, $where, $db) = @_;

	return $node->safe_psql($db // 'postgres',
		'SELECT count(*) FROM pepsi.workqueue' . ($where ? " WHERE $where" : ''));
}

# The pid of the maintenance worker serving $db, or '' if there is none.
sub maintenance_pid
{
	my ($node, $db) = @_;

	return $node->safe_psql($db,
		"SELECT coalesce(string_agg(pid::text, ','), '') FROM pg_stat_activity"
		  . " WHERE backend_type = 'pepsi maintenance' AND datname = '$db'");
}

# When the worker with this pid last changed state in pg_stat_activity.  A
# pass starts by reporting it active and ends by reporting it idle, so a
# later state_change with state idle means a pass has run since.
sub worker_state_change
{
	my ($node, $db, $pid) = @_;

	return $node->safe_psql($db,
		"SELECT state_change FROM pg_stat_activity WHERE pid = $pid");
}

# A message to @$rcpts admitted at $stage and set running by hand, as the
# dispatcher's claim would.  Returns (row id, body id).
sub add_running_message
{
	my ($node, $db, $stage, $rcpts, $body) = @_;
	my $array = join(',', map { "'$_'" } @$rcpts);

	$body //= 'hello, world';
	my $id = $node->safe_psql($db,
		    "SELECT pepsi.workqueue_add('sender\@example.org', ARRAY[$array],"
		  . " 'Subject: test'::bytea, convert_to('$body', 'UTF8'), stage => '$stage')");
	my $row = $node->safe_psql($db,
		"UPDATE pepsi.workqueue SET status = 'running' WHERE id = $id"
		  . " RETURNING id || '|' || body_id");
	return split /\|/, $row;
}

# Split the running row $id one recipient per row and set every sibling
# running too.  Returns the ids of the message's rows, the original first.
sub running_siblings
{
	my ($node, $db, $id, $stage) = @_;

	# Two statements: an UPDATE does not see rows its own function inserts.
	my $siblings = $node->safe_psql($db,
		"SELECT pepsi.workqueue_split_one_per_row($id, '$stage')");
	$node->safe_psql($db,
		"UPDATE pepsi.workqueue SET status = 'running' WHERE id = ANY ('$siblings')");
	return split /\n/,
	  $node->safe_psql($db,
		"SELECT id FROM pepsi.workqueue WHERE body_id ="
		  . " (SELECT body_id FROM pepsi.workqueue WHERE id = $id) ORDER BY id");
}

# Run $script in $clients concurrent pgbench sessions, $transactions each.
# Returns (exit status, stdout, stderr).  pgbench opens every connection
# before the first transaction, so the sessions really do overlap.
sub concurrently
{
	my ($node, $db, $clients, $transactions, $script) = @_;
	my $file = PostgreSQL::Test::Utils::tempdir() . '/script.sql';
	my ($out, $err) = ('', '');

	open my $fh, '>', $file or die "could not write $file: $!";
	print $fh $script;
	close $fh;
	IPC::Run::run(
		[
			'pgbench', '-n', '-h', $node->host, '-p', $node->port,
			'-c', $clients, '-j', $clients, '-t', $transactions,
			'-f', $file, $db
		],
		'>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

# Poll a file (a daemon's log) until it matches $pattern, for at most
# $seconds (default 30); on a timeout the file is shown.
sub file_shows
{
	my ($path, $pattern, $seconds) = @_;

	return 1
	  if poll_until(sub { -e $path && PostgreSQL::Test::Utils::slurp_file($path) =~ $pattern },
		$seconds);
	Test::More::diag(PostgreSQL::Test::Utils::slurp_file($path)) if -e $path;
	return 0;
}

# The server log from byte $offset on.
sub log_since
{
	my ($node, $offset) = @_;

	return PostgreSQL::Test::Utils::slurp_file($node->logfile, $offset);
}

# A throw-away P-256 certificate and key for CN=$cn, valid two days, as
# "$dir/cert.pem" and "$dir/key.pem".  -loglevel quiets OpenSSL 3; an
# older openssl without it is asked again without.
sub self_signed_certificate
{
	my ($dir, $cn) = @_;
	my @req = ('openssl', 'req', '-x509', '-newkey', 'ec', '-pkeyopt',
		'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', "$dir/key.pem",
		'-out', "$dir/cert.pem", '-days', '2', '-subj', "/CN=$cn");

	system(@req, '-loglevel', 'error') == 0
	  or system(@req) == 0
	  or die 'openssl req failed';
	return;
}

1;
