# The operator tools, run as real processes against a real cluster whose
# queue holds rows in every status: pepsi-queue (list, show, the actions by
# id and by selector, shape, summary), pepsi-status and pepsi-config.  The
# tools connect as a login role in pepsi_config (and one in pepsi_monitor),
# as an operator's would.  Every action must change what it says and write
# its one pepsi.event_log row with the operator as principal; every bad
# input (an unknown or malformed id, a scope naming nothing, an option the
# section does not have, a file-only section) must be refused with an error
# naming the problem and a non-zero exit, changing nothing and logging
# nothing.
use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::Bin/lib";
use IPC::Run qw(run);
use JSON::PP;
use PepsiTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $bin = $ENV{PEPSI_BIN} or plan skip_all => 'PEPSI_BIN is not set';
my $db = 'postgres';
my $node = pepsi_node('cli', extension => 1);
$node->safe_psql($db, q{
	CREATE ROLE operator LOGIN IN ROLE pepsi_config;
	CREATE ROLE watcher LOGIN IN ROLE pepsi_monitor;
});

my $dir = PostgreSQL::Test::Utils::tempdir();
my $conf = "$dir/pepsi.conf";
my $monitor_conf = "$dir/monitor.conf";

# write_conf PATH USER: the operator's configuration.  The line numbers
# matter: get reports them as the origin of a value.
sub write_conf
{
	my ($path, $user) = @_;

	open my $fh, '>', $path or die "$path: $!";
	print $fh "[pepsi]\n"                                  # 1
	  . "HOSTNAME = cli.example.org\n"                     # 2
	  . "[database]\n"                                     # 3
	  . sprintf("CONNINFO = host=%s port=%d dbname=%s user=%s password=sekrit\n",
		$node->host, $node->port, $db, $user)              # 4
	  . "[dispatch]\n"                                     # 5
	  . "POLL_INTERVAL = 10s\n"                            # 6
	  . "[stage-relay]\n"                                  # 7
	  . "PROGRAM = relay-to-smarthost\n"                   # 8
	  . "MAX_LIFETIME = 5d\n"                              # 9
	  . "[listener-smtp]\n"                                # 10
	  . "ADDRESS = 127.0.0.1\n"                            # 11
	  . "PORT = 2525\n";                                   # 12
	close $fh;
	chmod 0600, $path;    # it holds a password: others may not read it
	return;
}
write_conf($conf, 'operator');
write_conf($monitor_conf, 'watcher');

# tool NAME ARGS...: run build/bin/pepsi-NAME as the operator; returns
# (exit code, stdout, stderr).  tool_with CONF NAME ARGS...: with another
# configuration.
sub tool_with
{
	my ($config, $name, @args) = @_;
	my ($out, $err) = ('', '');

	run([ "$bin/pepsi-$name", '-C', $config, @args ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}
sub tool { return tool_with($conf, @_); }

# One psql session for the test's own statements (PepsiTest's sql_session).
my $session = sql_session($node, $db);
sub sql { return $session->(shift); }
sub lit { my $s = shift; $s =~ s/'/''/g; return "'$s'"; }

#
# The queue: rows in every status, at several stages, of known ages.
#
# add(%message): admit through pepsi.workqueue_add, then put the row where
# the dispatcher and the stages would have left it.
sub add
{
	my (%m) = @_;
	my $rcpts = join(',', map { lit($_) } @{ $m{rcpt} });
	my $body = $m{body_hex} ? "decode('$m{body_hex}', 'hex')" : "convert_to(" . lit($m{body} // "hello\r\n") . ", 'UTF8')";
	my $id = sql("SELECT pepsi.workqueue_add(" . lit($m{from} // 'alice@example.org')
		  . ", ARRAY[$rcpts], convert_to("
		  . lit($m{headers} // "Subject: test\r\nFrom: alice\@example.org\r\n") . ", 'UTF8'), $body,"
		  . " state => " . lit($m{state} // '{}') . "::jsonb, stage => " . lit($m{stage}) . ")");
	my $timeout = !defined $m{timeout} ? 'NULL' : $m{timeout} eq 'infinity' ? "'infinity'" : "now() + interval '$m{timeout}'";
	sql("UPDATE pepsi.workqueue SET status = '$m{status}', timeout = $timeout,"
		  . " received_at = now() - interval '$m{age} minutes' WHERE id = $id");
	return $id;
}

# (The stored headers end with their last line's CRLF; the blank line
# between them and the body is not stored.)
my $headers1 = "Subject: first\r\nFrom: alice\@example.org\r\nTo: bob\@example.net\r\n";
my $body1 = "hello\r\n.leading dot\r\nlast line\r\n";
my $pending1 = add(rcpt => [ 'bob@example.net', 'bea@example.net' ], stage => 'init',
	status => 'pending', age => 2, headers => $headers1, body => $body1);
my $pending2 = add(from => 'carol@example.org', rcpt => [ 'dave@example.net', 'erin@example.com' ],
	stage => 'route', status => 'pending', age => 30, body_hex => '636166e90d0a');
my $running = add(rcpt => ['frank@example.com'], stage => 'relay', status => 'running', age => 7);
my $paused1 = add(rcpt => ['gina@example.com'], stage => 'relay', status => 'paused', timeout => '1 hour',
	age => 90, state => '{"last_error": "451 4.3.0 greylisted, try again later"}');
my $paused2 = add(rcpt => ['ivan@example.net'], stage => 'relay', status => 'paused', timeout => '2 hours',
	age => 200);
my $held = add(rcpt => ['judy@example.com'], stage => 'relay', status => 'paused', timeout => 'infinity',
	age => 1500);
my $failed1 = add(rcpt => ['kim@example.net'], stage => 'relay', status => 'failed', age => 45,
	state => '{"last_error": "550 5.1.1 <kim@example.net>: no such user"}');
my $failed2 = add(rcpt => ['leo@example.com'], stage => 'route', status => 'failed', age => 12,
	state => '{"dispatch_error": "stage route crashed"}');
my $timedout = add(rcpt => ['mia@example.net'], stage => 'relay', status => 'timeout', age => 600);
my $bounce = add(from => '', rcpt => ['nick@example.org'], stage => 'relay', status => 'failed', age => 3,
	state => '{"last_error": "line one\nline two"}');
my @all = ($pending1, $pending2, $running, $paused1, $paused2, $held, $failed1, $failed2, $timedout, $bounce);

# What the queue holds, and how many events have been logged: what a
# refusal must leave as it was.
sub queue_state
{
	return sql(q{SELECT string_agg(format('%s:%s:%s:%s', id, stage, status, coalesce(timeout::text, '-')),
	                               ' ' ORDER BY id) FROM pepsi.workqueue});
}
sub events { return sql('SELECT count(*) FROM pepsi.event_log'); }
sub overrides
{
	return sql(q{SELECT coalesce(string_agg(format('%s/%s/%s=%s', scope, section, option, value), ' '
	                                        ORDER BY scope, section, option), '')
	             FROM pepsi.config_override});
}
# The last event: principal|action|detail->>key for each key asked.
sub last_event
{
	my @keys = @_;
	my $fields = join('', map { " || '|' || coalesce(detail->>'$_', '-')" } @keys);
	return sql("SELECT principal || '|' || action$fields FROM pepsi.event_log ORDER BY id DESC LIMIT 1");
}

# refused(WHAT, EXIT, ERROR, TOOL ARGS...): the tool exits EXIT, says
# ERROR on stderr, and the queue, the overrides and the audit log are as
# they were.
sub refused_with
{
	my ($what, $exit, $error, $config, @cmd) = @_;
	my ($queue, $over, $count) = (queue_state(), overrides(), events());
	my ($rc, $out, $err) = tool_with($config, @cmd);

	is($rc, $exit, "$what: exit $exit");
	like($err, $error, "$what: the error names the problem") or diag("stderr: $err");
	is(queue_state() . overrides() . events(), $queue . $over . $count,
		"$what: nothing changed, nothing logged");
	return;
}
sub refused { my ($what, $exit, $error, @cmd) = @_; return refused_with($what, $exit, $error, $conf, @cmd); }

# acted(WHAT, OUTPUT, TOOL ARGS...): the tool exits 0, prints OUTPUT and
# writes exactly one event.
sub acted
{
	my ($what, $output, @cmd) = @_;
	my $count = events();
	my ($rc, $out, $err) = tool(@cmd);

	is($rc, 0, "$what: exit 0") or diag("stderr: $err");
	like($out, $output, "$what: says what it did");
	is(events(), $count + 1, "$what: one event logged");
	return;
}

my $json = JSON::PP->new->canonical;
sub json_out
{
	my ($what, @cmd) = @_;
	my ($rc, $out, $err) = tool(@cmd);

	is($rc, 0, "$what: exit 0") or diag("stderr: $err");
	my $data = eval { decode_json($out) };
	ok(defined $data, "$what: is JSON") or diag("stdout: $out");
	return $data;
}

#
# pepsi-queue list
#
my ($rc, $out, $err) = tool('queue', 'list');
is($rc, 0, 'list: exit 0') or diag($err);
my @lines = split /\n/, $out;
like($lines[0], qr/^ID\s+QUEUE_ID\s+AGE\s+SIZE\s+SENDER\s+RECIPIENTS\s+STAGE\s+STATUS\s+LAST_ERROR$/,
	'list: a header like mailq\'s columns');
is(scalar(@lines), 1 + @all, 'list: one line per row');
is(join(',', map { /^(\d+)/ ? $1 : 'x' } @lines[ 1 .. $#lines ]), join(',', @all),
	'list: oldest first (by id)');
my ($line1) = grep { /^$pending1\s/ } @lines;
like($line1, qr/^$pending1\s+\S.*\s+alice\@example\.org\s+bob\@example\.net, bea\@example\.net\s+init\s+pending\s*$/,
	'list: sender, recipients, stage and status of a row');
my $size1 = length($headers1) + 2 + length($body1);
like($line1, qr/\s$size1\s/, 'list: the size is headers, CRLF and body');
like((grep { /^$failed1\s/ } @lines)[0], qr/failed\s+550 5\.1\.1 <kim\@example\.net>: no such user$/,
	'list: the last error of a failed row');
like((grep { /^$failed2\s/ } @lines)[0], qr/failed\s+stage route crashed$/,
	'list: a dispatch error when there is no last error');
like((grep { /^$bounce\s/ } @lines)[0], qr/^$bounce\s+\S.*\s<>\s.*line one\\nline two$/,
	'list: the null sender as <>, a line break in an error escaped (one row, one line)');

($rc, $out) = tool('queue', 'list', '--limit', '3');
is(join(',', $out =~ /^(\d+)\s/mg), join(',', @all[ 0 .. 2 ]), 'list --limit 3: the three oldest');
($rc, $out) = tool('queue', 'list', '--stage', 'relay');
is(join(',', $out =~ /^(\d+)\s/mg), join(',', $running, $paused1, $paused2, $held, $failed1, $timedout, $bounce),
	'list --stage relay: the rows at relay');
($rc, $out) = tool('queue', 'list', '--status', 'failed');
is(join(',', $out =~ /^(\d+)\s/mg), join(',', $failed1, $failed2, $bounce), 'list --status failed');
($rc, $out) = tool('queue', 'list', '--stage', 'relay', '--status', 'paused');
is(join(',', $out =~ /^(\d+)\s/mg), join(',', $paused1, $paused2, $held), 'list --stage relay --status paused');

my $list = json_out('list --json', 'queue', '--json', 'list');
is(scalar(@$list), scalar(@all), 'list --json: every row');
is_deeply(
	$list->[0],
	{
		id => $pending1 + 0, queue_id => "$pending1", age_seconds => $list->[0]{age_seconds}, size => $size1,
		sender => 'alice@example.org', recipients => [ 'bob@example.net', 'bea@example.net' ],
		stage => 'init', status => 'pending', last_error => undef
	},
	'list --json: a row as an object, recipients as an array; a row admitted without a queue id goes by its id');
ok($list->[0]{age_seconds} >= 120 && $list->[0]{age_seconds} < 600, 'list --json: age in seconds');
is((grep { $_->{id} == $bounce } @$list)[0]{last_error}, "line one\nline two",
	'list --json: the error as it is');
is((grep { $_->{id} == $bounce } @$list)[0]{sender}, '', 'list --json: the null sender as ""');
$list = json_out('list --json --status timeout', 'queue', '--json', 'list', '--status', 'timeout');
is(join(',', map { $_->{id} } @$list), $timedout, 'list --json --status timeout');

#
# pepsi-queue show
#
($rc, $out, $err) = tool('queue', 'show', $paused1);
is($rc, 0, 'show: exit 0') or diag($err);
like($out, qr/^id\s+$paused1$/m, 'show: the id');
like($out, qr/^stage\s+relay$/m, 'show: the stage');
like($out, qr/^status\s+paused$/m, 'show: the status');
like($out, qr/^rcpt_to\s+\["gina\@example\.com"\]$/m, 'show: the recipients');
like($out, qr/^state\n\{\n\s+"last_error": "451 4\.3\.0 greylisted, try again later"\n\}$/m,
	'show: the state as pretty JSON');
like($out, qr/^headers\nSubject: test\r\nFrom: alice\@example\.org\r\n\z/m, 'show: the headers');

($rc, $out) = tool('queue', 'show', $pending1, '--body');
is($rc, 0, 'show --body: exit 0');
is($out, "$headers1\r\n$body1", 'show --body: the raw message, byte for byte');
($rc, $out) = tool('queue', 'show', $pending2, '--body');
is(unpack('H*', substr($out, -6)), '636166e90d0a', 'show --body: a body that is not UTF-8 comes out intact');

my $shown = json_out('show --json', 'queue', '--json', 'show', $failed1);
is($shown->{id}, $failed1, 'show --json: id');
is_deeply($shown->{rcpt_to}, ['kim@example.net'], 'show --json: recipients as an array');
is_deeply($shown->{state}, { last_error => '550 5.1.1 <kim@example.net>: no such user' },
	'show --json: state as an object');
is($shown->{headers}, "Subject: test\r\nFrom: alice\@example.org\r\n", 'show --json: the headers');
is($shown->{status}, 'failed', 'show --json: status');
$shown = json_out('show --json --body', 'queue', '--json', 'show', $pending1, '--body');
is($shown->{message}, "$headers1\r\n$body1", 'show --json --body: the message');
$shown = json_out('show --json --body, not UTF-8', 'queue', '--json', 'show', $pending2, '--body');
like($shown->{message_hex}, qr/636166e90d0a$/, 'show --json --body: a message not in UTF-8 is hex-encoded');

#
# pepsi-queue shape and summary: the views, as the tool prints them
#
my $shape = json_out('shape --json', 'queue', '--json', 'shape');
is(join(' ', map { "$_->{domain}:$_->{total}" } @$shape), 'example.net:6 example.com:5 example.org:1',
	'shape --json: recipients per domain, biggest first');
my %net = %{ $shape->[0] };
is(join(' ', map { "$_=$net{$_}" } qw(5m 10m 20m 40m 80m 160m 320m 640m 1280m 1280m+)),
	'5m=2 10m=0 20m=0 40m=1 80m=1 160m=0 320m=1 640m=1 1280m=0 1280m+=0',
	'shape --json: example.net by age');
is($shape->[1]{'1280m+'}, 1, 'shape --json: the held row, over a day old, in the last bucket');
is( $json->encode([ map { [ $_->{domain}, "$_->{total}", "$_->{'40m'}" ] } @$shape ]),
	$json->encode([ map { [ split /\|/ ] } split /\n/, sql(q{SELECT domain || '|' || total || '|' || "40m" FROM pepsi.queue_shape}) ]),
	'shape --json: what pepsi.queue_shape says');
($rc, $out) = tool('queue', 'shape');
like($out, qr/^DOMAIN\s+TOTAL\s+5M\s+10M\s+20M\s+40M\s+80M\s+160M\s+320M\s+640M\s+1280M\s+1280M\+$/m,
	'shape: a header like qshape\'s');
like($out, qr/^example\.net\s+6\s+2\s+0\s+0\s+1\s+1\s+0\s+1\s+1\s+0\s+0$/m, 'shape: a row per domain');

my $summary = json_out('summary --json', 'queue', '--json', 'summary');
is( join(' ', map { "$_->{stage}/$_->{status}:$_->{messages}/$_->{held}" } @$summary),
	'init/pending:1/0 relay/running:1/0 relay/paused:3/1 relay/failed:2/0 relay/timeout:1/0'
	  . ' route/pending:1/0 route/failed:1/0',
	'summary --json: stage x status, with the held rows counted');
like((grep { $_->{stage} eq 'relay' && $_->{status} eq 'paused' } @$summary)[0]{oldest_age}, qr/^1 day 01:0/,
	'summary --json: the age of the oldest');
($rc, $out) = tool('queue', 'summary');
like($out, qr/^STAGE\s+STATUS\s+MESSAGES\s+HELD\s+OLDEST_AGE$/m, 'summary: a header');
like($out, qr/^relay\s+paused\s+3\s+1\s+1 day 01:0\S+$/m, 'summary: a row per stage and status');

# The monitoring role reads the views, and not the messages.
($rc, $out, $err) = tool_with($monitor_conf, 'queue', '--json', 'summary');
is($rc, 0, 'summary as pepsi_monitor: exit 0') or diag($err);
($rc, $out, $err) = tool_with($monitor_conf, 'queue', 'shape');
is($rc, 0, 'shape as pepsi_monitor: exit 0') or diag($err);
refused_with('list as pepsi_monitor', 77, qr/permission denied/, $monitor_conf, 'queue', 'list');
refused_with('delete as pepsi_monitor', 77, qr/permission denied/, $monitor_conf, 'queue', 'delete', $failed1);

#
# pepsi-status: the statistics the dispatcher flushed, and the live counts
#
sql(q{INSERT INTO pepsi.stage_stats (stage, messages, processing_time, kills, timeouts, crashes, fused_hops)
      VALUES ('relay', 40, '20 seconds', 2, 1, 3, 4), ('route', 10, '1 second', 0, 0, 0, 7),
             ('dkim-sign', 5, '250 ms', 0, 0, 0, 0)});
sql(q{UPDATE pepsi.dispatch_stats SET stages_run = 55, messages = 45, messages_failed = 1,
             serialization_failures = 0, started_at = now() - interval '1 hour'});

my $status = json_out('status --json', 'status', '--json');
my %stage = map { $_->{stage} => $_ } @{ $status->{stages} };
is(join(',', sort keys %stage), 'dkim-sign,init,relay,route',
	'status --json: the stages with statistics and those with rows');
is_deeply(
	$stage{relay},
	{
		stage => 'relay', messages => 40, mean_ms => 500, kills => 2, timeouts => 1, crashes => 3,
		fused_hops => 4, pending => 0, running => 1, paused => 3, held => 1, failed => 2, timeout => 1
	},
	'status --json: relay: statistics, mean time per message, live counts');
is("$stage{route}{messages} $stage{route}{mean_ms} $stage{route}{pending} $stage{route}{failed}",
	'10 100 1 1', 'status --json: route');
is("$stage{init}{messages} $stage{init}{pending}", '0 1', 'status --json: a stage with rows and no statistics');
is("$stage{'dkim-sign'}{messages} $stage{'dkim-sign'}{mean_ms} $stage{'dkim-sign'}{pending}", '5 50 0',
	'status --json: a stage with statistics and no rows');
is("$status->{dispatch}{stages_run} $status->{dispatch}{messages} $status->{dispatch}{messages_failed}",
	'55 45 1', 'status --json: the dispatcher\'s totals');

($rc, $out, $err) = tool('status');
is($rc, 0, 'status: exit 0') or diag($err);
like($out, qr/^STAGE\s+MESSAGES\s+MEAN ms\s+KILLS\s+TIMEOUTS\s+CRASHES\s+FUSED\s+PENDING\s+RUNNING\s+PAUSED\s+HELD\s+FAILED\s+TIMEOUT$/m,
	'status: a header');
like($out, qr/^relay\s+40\s+500\.000\s+2\s+1\s+3\s+4\s+0\s+1\s+3\s+1\s+2\s+1$/m, 'status: a row per stage');
like($out, qr/^dispatcher: 55 stage passes, 45 messages, 1 failed/m, 'status: the dispatcher\'s totals');
unlike($out, qr/xmin horizon/, 'status: no alert while no transaction holds back the xmin horizon');

($rc, $out, $err) = tool_with($monitor_conf, 'status', '--json');
is($rc, 0, 'status as pepsi_monitor: exit 0 (it reads the views, not the queue)') or diag($err);
is(eval { decode_json($out)->{stages}[2]{stage} } // '', 'relay', 'status as pepsi_monitor: the same stages');

# --watch repeats: a row admitted while it runs shows up in a later frame.
{
	my ($wout, $werr) = ('', '');
	my $deadline = IPC::Run::timeout(20);
	my $h = IPC::Run::start([ "$bin/pepsi-status", '-C', $conf, '--watch', '0.2' ],
		'<', \undef, '>', \$wout, '2>', \$werr, $deadline);
	my $first = eval { $h->pump until $wout =~ /^init\s+0\s+0\.000(\s+\d+){4}\s+1\s/m; 1 };
	ok($first, 'status --watch: a first frame') or diag("stdout: $wout\nstderr: $werr");
	add(rcpt => ['olga@example.net'], stage => 'init', status => 'pending', age => 1);
	$wout = '';
	$deadline->start(20);
	my $seen = $first && eval { $h->pump until $wout =~ /^init\s+0\s+0\.000(\s+\d+){4}\s+2\s/m; 1 };
	ok($seen, 'status --watch: a later frame shows the new row') or diag("stdout: $wout\nstderr: $werr");
	$h->kill_kill;
	sql("DELETE FROM pepsi.workqueue WHERE rcpt_to = '{olga\@example.net}'");
}

# A transaction holding back the xmin horizon past pepsi.snapshot_warning
# (the maintenance worker's warning, extension/src/maint.c): the operator
# is told who holds it and since when, not what it ran, which may be
# another role's and not the operator's to read.
$node->append_conf('postgresql.conf', "pepsi.snapshot_warning = 1\n");
$node->reload;
{
	my $report = $node->background_psql($db, on_error_stop => 1);
	my $report_pid = $report->query_safe('SELECT pg_backend_pid()');
	$report->query_safe('SET application_name = report');
	$report->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
	$report->query_safe("SELECT count(*) FROM pepsi.workqueue WHERE mail_from = 'secret-report'");
	my $alert = qr/^ALERT: pid $report_pid \(report, idle in transaction, user \S+ from local\) has held back the xmin horizon since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \(\d+ s\)/m;
	poll_until(sub { ($rc, $out, $err) = tool_with($monitor_conf, 'status'); $out =~ $alert });
	is($rc, 1, 'status as pepsi_monitor with a transaction holding back the xmin horizon: exit 1 (an ALERT)')
	  or diag($err);
	like($out, $alert, 'status: an alert names who holds back the xmin horizon, and since when');
	unlike($out, qr/secret-report/, 'status: not its statement');
	($rc, $out, $err) = tool_with($monitor_conf, 'status', '--json');
	is($rc, 1, 'status --json: exit 1 too');
	my $alerts = eval { decode_json($out)->{alerts} } // [];
	my @alerts = @$alerts;
	is(scalar(grep { /^pid $report_pid \(report, .* has held back the xmin horizon since/ } @alerts), 1,
		'status --json: the same alert');
	$report->query_safe('COMMIT');
	($rc, $out, $err) = tool_with($monitor_conf, 'status');
	unlike($out, qr/xmin horizon/, 'status: no alert once the transaction ended');
	is($rc, 0, '... and exit 0 again');
	$report->quit;
}
$node->append_conf('postgresql.conf', "pepsi.snapshot_warning = 60\n");
$node->reload;

#
# pepsi-config
#
($rc, $out, $err) = tool('config', 'get', 'dispatch', 'POLL_INTERVAL');
is($rc, 0, 'config get: exit 0') or diag($err);
is($out, "10s\t($conf:6)\n", 'config get: the file\'s value, with file:line');
($rc, $out) = tool('config', 'get', '[dispatch]', 'POLL_INTERVAL');
is($out, "10s\t($conf:6)\n", 'config get: a section may be written with its brackets');
($rc, $out) = tool('config', 'get', 'dispatch', 'FAIR_HALF_LIFE');
is($rc, 0, 'config get of an option not set: exit 0');
like($out, qr/not set \(the program's default applies\)/, 'config get: says the default applies');
($rc, $out) = tool('config', 'get', 'listener-smtp', 'PORT');
is($out, "2525\t($conf:12)\n", 'config get: a file-only section can be read');

acted('config set', qr/^\[dispatch\] POLL_INTERVAL = 5s for global \(no override before\)/,
	'config', 'set', 'dispatch', 'POLL_INTERVAL', '5s');
is(overrides(), 'global/dispatch/POLL_INTERVAL=5s', 'config set: the override is written');
is(last_event(qw(scope section option value)), 'operator|config_set|global|dispatch|POLL_INTERVAL|5s',
	'config set: logged with the operator as principal');
is(sql("SELECT updated_by FROM pepsi.config_override"), 'operator', 'config set: updated_by is the operator');
($rc, $out) = tool('config', 'get', 'dispatch', 'POLL_INTERVAL');
is($out, "5s\t(override global)\n", 'config get: the override wins over the file');
acted('config set, unchanged', qr/already; nothing changed/, 'config', 'set', 'dispatch', 'POLL_INTERVAL', '5s');
is(last_event(qw(unchanged)), 'operator|config_set|true', 'config set, unchanged: logged as unchanged');
acted('config set again', qr/\(was 5s\)/, 'config', 'set', 'dispatch', 'POLL_INTERVAL', '7s');

acted('config set --scope domain:', qr/for domain:example\.com \(/,
	'config', 'set', 'stage-relay', 'MAX_LIFETIME', '2d', '--scope', 'domain:Example.COM');
acted('config set --address', qr/for address:Boss\@example\.com/,
	'config', 'set', 'stage-relay', 'MAX_LIFETIME', '1d', '--address', 'Boss@example.com');
is(overrides(),
	'address:Boss@example.com/stage-relay/MAX_LIFETIME=1d domain:example.com/stage-relay/MAX_LIFETIME=2d'
	  . ' global/dispatch/POLL_INTERVAL=7s',
	'config set --scope: stored with the scope in canonical form');
is(last_event(qw(scope value)), 'operator|config_set|address:Boss@example.com|1d', 'config set --address: logged');

($rc, $out) = tool('config', 'get', 'stage-relay', 'MAX_LIFETIME');
is($out, "5d\t($conf:9)\n", 'config get: without a scope, the file');
($rc, $out) = tool('config', 'get', 'stage-relay', 'MAX_LIFETIME', '--domain', 'example.com');
is($out, "2d\t(override domain:example.com)\n", 'config get --domain: the domain\'s override');
($rc, $out) = tool('config', 'get', 'stage-relay', 'MAX_LIFETIME', '--scope', 'address:someone@example.com');
is($out, "2d\t(override domain:example.com)\n", 'config get for an address: its domain\'s override');
($rc, $out) = tool('config', 'get', 'stage-relay', 'MAX_LIFETIME', '--address', 'Boss@example.com');
is($out, "1d\t(override address:Boss\@example.com)\n", 'config get --address: the address\'s own override');
($rc, $out) = tool('config', 'get', 'stage-relay', 'MAX_LIFETIME', '--scope', 'address:x@example.org');
is($out, "5d\t($conf:9)\n", 'config get for another domain: the file');
# An override elsewhere holding the same value is not where the value came from.
tool('config', 'set', 'stage-relay', 'MAX_LIFETIME', '5d', '--domain', 'example.org');
($rc, $out) = tool('config', 'get', 'stage-relay', 'MAX_LIFETIME');
is($out, "5d\t($conf:9)\n", 'config get: the origin is the value in force, not an equal value elsewhere');
tool('config', 'unset', 'stage-relay', 'MAX_LIFETIME', '--domain', 'example.org');
my $got = json_out('config get --json', 'config', '--json', 'get', 'stage-relay', 'MAX_LIFETIME', '--domain', 'example.com');
is_deeply($got,
	{ section => 'stage-relay', option => 'MAX_LIFETIME', scope => 'domain:example.com', value => '2d',
	  origin => 'override domain:example.com' },
	'config get --json');

($rc, $out, $err) = tool('config', 'list');
is($rc, 0, 'config list: exit 0') or diag($err);
like($out, qr/^SCOPE\s+SECTION\s+OPTION\s+VALUE\s+ORIGIN$/m, 'config list: a header');
like($out, qr/^file\s+dispatch\s+POLL_INTERVAL\s+10s\s+\Q$conf\E:6$/m, 'config list: the file\'s values');
like($out, qr/^global\s+dispatch\s+POLL_INTERVAL\s+7s\s+override by operator$/m, 'config list: the overrides');
like($out, qr/^domain:example\.com\s+stage-relay\s+MAX_LIFETIME\s+2d\s+override by operator$/m,
	'config list: a domain override');
unlike($out, qr/sekrit/, 'config list: the database password is not shown');
like($out, qr/password=\*+/, 'config list: but masked');
my $listed = json_out('config list --json', 'config', '--json', 'list');
is(scalar(@$listed), 10, 'config list --json: seven file values and three overrides');
is_deeply((grep { $_->{scope} eq 'global' } @$listed)[0],
	{ scope => 'global', section => 'dispatch', option => 'POLL_INTERVAL', value => '7s', origin => 'override by operator' },
	'config list --json: an override as an object');
$listed = json_out('config list --scope', 'config', '--json', 'list', '--scope', 'domain:EXAMPLE.com');
is(join(' ', map { "$_->{scope}/$_->{option}=$_->{value}" } @$listed), 'domain:example.com/MAX_LIFETIME=2d',
	'config list --scope: that scope\'s overrides, the scope taken in any case');

acted('config unset', qr/^\[dispatch\] POLL_INTERVAL unset for global \(was 7s\)/,
	'config', 'unset', 'dispatch', 'POLL_INTERVAL');
is(last_event(qw(scope option previous)), 'operator|config_unset|global|POLL_INTERVAL|7s', 'config unset: logged');
($rc, $out) = tool('config', 'get', 'dispatch', 'POLL_INTERVAL');
is($out, "10s\t($conf:6)\n", 'config get after unset: the file again');

# Bad input: refused, nothing written, nothing logged.
refused('config set --scope domain: (no domain)', 64, qr/"domain:" is not a scope/,
	'config', 'set', 'stage-relay', 'MAX_LIFETIME', '1d', '--scope', 'domain:');
refused('config set --scope address: (no address)', 64, qr/"address:" is not a scope/,
	'config', 'set', 'stage-relay', 'MAX_LIFETIME', '1d', '--scope', 'address:');
refused('config set --scope address without @', 64, qr/"address:postmaster" is not a scope/,
	'config', 'set', 'stage-relay', 'MAX_LIFETIME', '1d', '--scope', 'address:postmaster');
refused('config set --scope of no kind', 64, qr/"planet:mars" is not a scope/,
	'config', 'set', 'stage-relay', 'MAX_LIFETIME', '1d', '--scope', 'planet:mars');
refused('config get --domain ""', 64, qr/"domain:" is not a scope/,
	'config', 'get', 'stage-relay', 'MAX_LIFETIME', '--domain', '');
refused('config set --scope and --domain', 64, qr/one of --scope, --domain and --address/,
	'config', 'set', 'stage-relay', 'MAX_LIFETIME', '1d', '--scope', 'global', '--domain', 'example.com');
refused('config set of an option the section does not have', 65, qr/\[dispatch\] has no option NO_SUCH_OPTION/,
	'config', 'set', 'dispatch', 'NO_SUCH_OPTION', '1');
refused('config set in an unknown section', 65, qr/there is no section \[nosuch\]/,
	'config', 'set', 'nosuch', 'OPTION', '1');
refused('config set in [database]', 65, qr/\[database\] is read only from the file/,
	'config', 'set', 'database', 'CONNINFO', 'dbname=elsewhere');
refused('config set in [listener-smtp]', 65, qr/\[listener-smtp\] is read only from the file/,
	'config', 'set', 'listener-smtp', 'PORT', '25');
refused('config unset in [database]', 65, qr/\[database\] is read only from the file/,
	'config', 'unset', 'database', 'CONNINFO');
refused('config set of a malformed value', 65, qr/invalid value "banana" for POLL_INTERVAL in \[dispatch\]/,
	'config', 'set', 'dispatch', 'POLL_INTERVAL', 'banana');
refused('config set of a global-only option for a domain', 65, qr/POLL_INTERVAL of \[dispatch\] takes the global scope only/,
	'config', 'set', 'dispatch', 'POLL_INTERVAL', '5s', '--domain', 'example.com');
refused('config set of whom ingress runs as', 65, qr/option USER of \[ingress\] cannot be overridden/,
	'config', 'set', 'ingress', 'USER', 'root');
refused('config set for a malformed domain', 65, qr/invalid domain "exa mple\.com"/,
	'config', 'set', 'stage-relay', 'MAX_LIFETIME', '1d', '--domain', 'exa mple.com');
refused('config unset of an override that does not exist', 65, qr/no override of \[dispatch\] FAIR_HALF_LIFE at scope "global"/,
	'config', 'unset', 'dispatch', 'FAIR_HALF_LIFE');
refused('config get of an option the section does not have', 65, qr/\[dispatch\] has no option NOPE/,
	'config', 'get', 'dispatch', 'NOPE');
refused('config get in an unknown section', 65, qr/there is no section \[nosuch\]/,
	'config', 'get', 'nosuch', 'OPTION');
refused('config set without a value', 64, qr/wrong number of arguments for set/,
	'config', 'set', 'dispatch', 'POLL_INTERVAL');
refused('config: an unknown command', 64, qr/unknown command "frob"/, 'config', 'frob');
refused_with('config set as pepsi_monitor', 77, qr/permission denied/, $monitor_conf,
	'config', 'set', 'dispatch', 'POLL_INTERVAL', '1s');

#
# pepsi-queue: bad input, before anything has acted on the queue
#
refused('delete of an unknown id', 65, qr/workqueue row 999999 does not exist/, 'queue', 'delete', '999999');
refused('delete of a known and an unknown id', 65, qr/workqueue row 999999 does not exist/,
	'queue', 'delete', $pending2, '999999');
refused('retry of unknown ids', 65, qr/Rows 999998, 999999 do not exist; no row was retried/,
	'queue', 'retry', '999998', '999999', $failed1);
refused('hold of a running row', 65, qr/workqueue row $running is running and cannot be held/,
	'queue', 'hold', $pending1, $running);
refused('bounce of a bounce', 65, qr/workqueue row $bounce has the null sender and cannot be bounced/,
	'queue', 'bounce', $bounce);
refused('an id given twice', 65, qr/workqueue row $pending1 appears twice in ids/,
	'queue', 'hold', $pending1, $pending1);
for my $bad ('abc', '0', '12abc', '1.5', '99999999999999999999', '9223372036854775808', ' 7', '')
{
	refused("retry of the malformed id \"$bad\"", 64, qr/"\Q$bad\E" is not a message id/,
		'queue', 'retry', $failed1, $bad);
}
refused('retry of a negative id', 64, qr/"-5" is not a message id/, 'queue', 'retry', '--', '-5');
refused('retry of nothing', 64, qr/name the messages/, 'queue', 'retry');
refused('retry of ids and a selector', 64, qr/by id or by a selector, not both/,
	'queue', 'retry', $failed1, '--all-failed');
refused('two selectors', 64, qr/give one selector/, 'queue', 'retry', '--all-failed', '--all-paused');
refused('--stage without a selector', 64, qr/retry does not take --stage/, 'queue', 'retry', $failed1, '--stage', 'relay');
refused('bounce with an empty reason', 65, qr/reason must not be empty/,
	'queue', 'bounce', $failed1, '--reason', ' ');
refused('bounce to a malformed stage', 65, qr/invalid bounce stage name "Bad Stage"/,
	'queue', 'bounce', $failed1, '--bounce-stage', 'Bad Stage');
refused('--reason with another action', 64, qr/delete does not take --reason/,
	'queue', 'delete', $failed1, '--reason', 'x');
refused('show of an unknown id', 65, qr/no message 999999 in the queue/, 'queue', 'show', '999999');
refused('show of a malformed id', 64, qr/"x1" is not a message id/, 'queue', 'show', 'x1');
refused('show of two ids', 64, qr/show takes one message id/, 'queue', 'show', $pending1, $pending2);
refused('list --status of no status', 64, qr/--status is one of pending, running, paused, failed, timeout, not "stuck"/,
	'queue', 'list', '--status', 'stuck');
refused('list --limit 0', 64, qr/--limit takes a positive whole number, not "0"/, 'queue', 'list', '--limit', '0');
refused('list --limit x', 64, qr/--limit takes a positive whole number, not "x"/, 'queue', 'list', '--limit', 'x');
refused('list with a selector', 64, qr/list does not take --all-failed/, 'queue', 'list', '--all-failed');
refused('list with an argument', 64, qr/list takes no argument, not "$pending1"/, 'queue', 'list', $pending1);
refused('an unknown command', 64, qr/unknown command "purge"/, 'queue', 'purge', $pending1);

#
# pepsi-queue: the actions, by id and by selector
#
acted('retry by id', qr/^retry: 1 message$/, 'queue', 'retry', $failed1);
like(queue_state(), qr/\b$failed1:relay:pending:-/, 'retry: the failed row is pending at its stage');
is(last_event(qw(ids retried)), "operator|queue_retry|[$failed1]|1", 'retry: logged with the ids and the count');

acted('hold by id', qr/^hold: 2 messages$/, 'queue', 'hold', $pending1, $pending2);
like(queue_state(), qr/\b$pending1:init:paused:infinity $pending2:route:paused:infinity\b/, 'hold: paused until released');
is(last_event(qw(ids held)), "operator|queue_hold|[$pending1, $pending2]|2", 'hold: logged');
($rc, $out) = tool('queue', '--json', 'summary');
is((grep { $_->{stage} eq 'init' } @{ decode_json($out) })[0]{held}, 1, 'hold: summary counts the row as held');

acted('release by id', qr/^release: 1 message$/, 'queue', 'release', $pending1);
like(queue_state(), qr/\b$pending1:init:pending:-/, 'release: pending again');
is(last_event(qw(ids released)), "operator|queue_release|[$pending1]|1", 'release: logged');

# --all-paused at relay: the two deferred rows and the held one; a retry
# leaves the hold alone, a release ends only it.
acted('retry --all-paused --stage relay', qr/^retry: 2 messages$/,
	'queue', 'retry', '--all-paused', '--stage', 'relay');
is(last_event(qw(ids retried)), "operator|queue_retry|[$paused1, $paused2, $held]|2",
	'retry --all-paused: the selector\'s rows logged, and how many were retried');
like(queue_state(), qr/\b$paused1:relay:pending:- $paused2:relay:pending:- $held:relay:paused:infinity\b/,
	'retry --all-paused: the deferred rows are pending, the held one still held');
acted('release --all-paused', qr/^release: 2 messages$/, 'queue', 'release', '--all-paused');
like(queue_state(), qr/\b$pending2:route:pending:-.*\b$held:relay:pending:-/, 'release --all-paused: every hold ended');

acted('retry --all-failed --stage route', qr/^retry: 1 message$/, 'queue', 'retry', '--all-failed', '--stage', 'route');
is(last_event(qw(ids)), "operator|queue_retry|[$failed2]", 'retry --all-failed --stage route: that stage\'s failed row');

acted('bounce by id', qr/^bounce: 1 message$/, 'queue', 'bounce', $timedout, '--reason', '5.4.7 delivery time expired');
like(queue_state(), qr/\b$timedout:bounce:pending:-/, 'bounce: the row goes to the bounce stage, pending');
is(sql("SELECT state->'bounce'->>'diagnostic' || '|' || (state->'bounce'->>'failed_recipient') FROM pepsi.workqueue WHERE id = $timedout"),
	'5.4.7 delivery time expired|mia@example.net', 'bounce: state.bounce has the reason and the recipient');
is(last_event(qw(ids reason bounce_stage)), "operator|queue_bounce|[$timedout]|5.4.7 delivery time expired|bounce",
	'bounce: logged with the reason');

my $bodies = sql('SELECT count(*) FROM pepsi.workqueue_body');
acted('delete --all-failed', qr/^delete: 1 message$/, 'queue', 'delete', '--all-failed');
is(last_event(qw(ids deleted)), "operator|queue_delete|[$bounce]|1", 'delete --all-failed: the failed row');
is(sql("SELECT count(*) FROM pepsi.workqueue WHERE id = $bounce"), '0', 'delete: the row is gone');
is(sql('SELECT count(*) FROM pepsi.workqueue_body'), $bodies - 1, 'delete: and its body with it');

my $count = events();
($rc, $out) = tool('queue', 'retry', '--all-failed');
is("$rc $out", "0 no message matches\n", 'a selector matching nothing: says so, exit 0');
is(events(), $count, 'a selector matching nothing: nothing logged');

acted('delete by id', qr/^delete: 2 messages$/, 'queue', 'delete', $pending2, $failed2);
is(sql("SELECT count(*) FROM pepsi.workqueue WHERE id IN ($pending2, $failed2)"), '0', 'delete by id: gone');
refused('delete of a row just deleted', 65, qr/workqueue row $pending2 does not exist/, 'queue', 'delete', $pending2);
is(sql(q{SELECT count(DISTINCT principal) || ' ' || min(principal) FROM pepsi.event_log
         WHERE action LIKE 'queue\_%' OR action LIKE 'config\_%'}),
	'1 operator', 'every action was logged with the operator as principal');

#
# --help, the configuration and the database
#
for my $t ([ 'queue', qr/^usage: pepsi-queue .*^  list .*^  SELECTOR: /ms ], [ 'status', qr/^usage: pepsi-status / ],
	[ 'config', qr/^usage: pepsi-config .*^  SCOPE: /ms ])
{
	my ($help_out, $help_err) = ('', '');
	run([ "$bin/pepsi-$t->[0]", '--help' ], '<', \undef, '>', \$help_out, '2>', \$help_err);
	is($? >> 8, 0, "pepsi-$t->[0] --help: exit 0");
	like($help_out . $help_err, $t->[1], "pepsi-$t->[0] --help: the usage");
}
open my $fh, '>', "$dir/bad.conf" or die $!;
print $fh "[database]\nCONNINFO = dbname=postgres\n[dispatch]\nPOLL_INTERVALL = 1s\n";
close $fh;
for my $t ([ 'queue', 'list' ], [ 'status' ], [ 'config', 'list' ])
{
	($rc, $out, $err) = tool_with("$dir/bad.conf", @$t);
	is($rc, 78, "pepsi-$t->[0] with a bad configuration: EX_CONFIG");
	like($err, qr/bad\.conf:4: \[dispatch\] has no option POLL_INTERVALL/, "pepsi-$t->[0]: with file:line and the reason");
}
# What a sender wrote is shown, never obeyed: escape sequences that would
# retitle the window or clear the screen, a lone CR that would overwrite a
# line, and a C1 CSI come out as \xHH; CRLF and TAB stay.
my $hostile = sql("SELECT pepsi.workqueue_add('a\@example.org', '{b\@example.net}',"
	  . " decode('5375626a6563743a201b5d303b70776e6564071b5b324a2068690d0a582d53706f6f663a20610d620d0a582d4331" . "3a20c29b33316d0d0a', 'hex'),"
	  . " convert_to(E'body\\x1b[5m\\r\\n', 'UTF8'))");
($rc, $out, $err) = tool('queue', 'show', $hostile);
is($rc, 0, 'show of a message with escape sequences: exit 0') or diag($err);
unlike($out, qr/[\x1b\x07]|\r(?!\n)|\xc2\x9b/, 'show: no escape, bell, lone CR or CSI reaches the terminal');
like($out, qr/^Subject: \\x1b\]0;pwned\\x07\\x1b\[2J hi\r$/m, 'show: they are shown as \\xHH');
like($out, qr/^X-Spoof: a\\x0db\r$/m, 'show: a lone CR too');
like($out, qr/^X-C1: \\xc2\\x9b31m\r$/m, 'show: and a C1 control');
($rc, $out) = tool('queue', 'show', $hostile, '--body');
like($out, qr/body\x1b\[5m\r\n\z/, 'show --body into a pipe: the message exactly as stored');

$node->stop;
for my $t ([ 'queue', 'list' ], [ 'status' ], [ 'config', 'list' ], [ 'queue', 'delete', $held ])
{
	($rc, $out, $err) = tool(@$t);
	is($rc, 75, "pepsi-@$t with the database down: EX_TEMPFAIL");
	like($err, qr/cannot connect to the database/, "pepsi-@$t: says so");
}

done_testing();
