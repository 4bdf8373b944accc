# The stage runtime (common/runtime/stage.c) as a worker process: ids on stdin,
# status lines on stdout, one extension call per outcome.  Every terminal's
# effect on the row, alone and in a batch; what the worker refuses (a
# stage reading more than its load, no terminal or two, a row of another
# program, bad id lines, rows not running or without a section) and that
# it goes on after each refusal leaving the row as it was; and a bad
# configuration stopping it before it takes any work.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;
use PepsiStage;

my $node = stage_node('stage_runtime');
my $tmp = PostgreSQL::Test::Utils::tempdir();

my $aliases = "$tmp/aliases";
{
	open my $fh, '>', $aliases or die $!;
	print $fh "# forty levels: deeper than the expansion goes\n";
	print $fh "deep$_: deep" . ($_ + 1) . "\n" for 0 .. 39;
	close $fh;
}

my $conf = stage_config($node, 'runtime.conf', <<"INI");
[stage-adv]
PROGRAM = pepsi-stage-if
CONDITION = mail_from = "nobody\@example.org"
THEN_STAGE = elsewhere
NEXT_STAGE = adv-next

[stage-branch]
PROGRAM = pepsi-stage-if
CONDITION = rcpt_count > 1
THEN_STAGE = many
ELSE_STAGE = one

[stage-exact]
PROGRAM = pepsi-stage-if
CONDITION = rcpt = ""odd, {x} y"\@example.org"
THEN_STAGE = matched
ELSE_STAGE = unmatched

[stage-drop]
PROGRAM = pepsi-stage-discard

[stage-reject]
PROGRAM = pepsi-stage-discard
BOUNCE = yes
BOUNCE_STAGE = bounce
DIAGNOSTIC = 5.7.1 not wanted here

[stage-route]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = example.org, example.com
LOCAL_STAGE = local
REMOTE_STAGE = remote

[stage-hold]
PROGRAM = pepsi-test-probe
ACTION = pause
PAUSE_SECONDS = 600

[stage-expand]
PROGRAM = pepsi-stage-aliases
ALIASES_FILE = $aliases
ALIAS_DOMAINS = example.org
NEXT_STAGE = expanded

[stage-peek-headers]
PROGRAM = pepsi-test-probe
ACTION = headers
NEXT_STAGE = peeked

[stage-peek-body]
PROGRAM = pepsi-test-probe
ACTION = body
NEXT_STAGE = peeked

[stage-peek-raw]
PROGRAM = pepsi-test-probe
ACTION = raw
NEXT_STAGE = peeked

[stage-no-terminal]
PROGRAM = pepsi-test-probe
ACTION = none

[stage-two-terminals]
PROGRAM = pepsi-test-probe
ACTION = twice
NEXT_STAGE = peeked

[stage-by-path]
PROGRAM = /usr/local/libexec/pepsi/pepsi-stage-if
CONDITION = rcpt_count > 0
THEN_STAGE = by-path-done
ELSE_STAGE = by-path-done
INI

my %dsn = (
	ret => 'HDRS',
	rcpt => [
		{ notify => 'SUCCESS', orcpt => 'rfc822;a@example.org' },
		{ notify => 'NEVER' },
		{ notify => 'FAILURE' },
		{ notify => 'DELAY' }
	]);
my %origin = (client => '192.0.2.7', helo => 'client.example.net');

# Run PROGRAM's worker on @ids, all in one batch; every status line must be 0.
sub run_ok
{
	my ($program, $what, @ids) = @_;
	my $r = run_worker(worker_cmd($program, $conf), join('', map { "$_\n" } @ids));

	is($r->{exit}, 0, "$what: the worker exits 0 at the end of its input");
	is_deeply($r->{status}, [ ('0') x @ids], "$what: one status line 0 per id")
	  or diag($r->{stderr});
	return $r;
}

#
# advance: NEXT_STAGE, the row pending there and queued behind the others.
#
for my $batch (1, 2)
{
	my @ids = map { add_row($node, 'adv', state => { origin => \%origin }) } 1 .. $batch;
	my @before = map { row_json($node, $_) } @ids;
	run_ok('pepsi-stage-if', "advance ($batch in a batch)", @ids);
	for my $i (0 .. $#ids)
	{
		my $row = row_json($node, $ids[$i]);
		is_deeply([ @$row{qw(stage status)} ], [ 'adv-next', 'pending' ],
			"advance ($batch): row $i is pending at NEXT_STAGE");
		cmp_ok($row->{pending_seq}, '>', $before[$i]{pending_seq},
			"advance ($batch): row $i queues behind the rows already waiting");
		is_deeply($row->{state}, $before[$i]{state}, "advance ($batch): row $i keeps its state");
	}
}

#
# advance_to: the target rides per row, so divergent branches share a batch.
#
{
	my $one = add_row($node, 'branch', rcpt => ['a@example.org']);
	my $many = add_row($node, 'branch', rcpt => [ 'a@example.org', 'b@example.org' ]);
	run_ok('pepsi-stage-if', 'advance_to', $one, $many);
	is(row_json($node, $one)->{stage}, 'one', 'advance_to: ELSE_STAGE for one recipient');
	is(row_json($node, $many)->{stage}, 'many', 'advance_to: THEN_STAGE for two, in the same batch');
	is(row_json($node, $many)->{status}, 'pending', 'advance_to: the row is pending there');
}

#
# The recipients reach the stage as they are in the row, whatever they
# hold: quotes, a comma, braces, spaces (the load reads them as a binary
# text[]).
#
{
	my $odd = '"odd, {x} y"@example.org';
	my $match = add_row($node, 'exact', rcpt => [ 'a@example.org', $odd ]);
	my $near = add_row($node, 'exact', rcpt => [ '"odd, {x}"@example.org', 'odd@example.org' ]);
	my $one = add_row($node, 'exact', rcpt => [$odd]);
	run_ok('pepsi-stage-if', 'recipients as loaded', $match, $near, $one);
	is(row_json($node, $match)->{stage}, 'matched', 'recipients: the quoted address, second of two');
	is(row_json($node, $near)->{stage}, 'unmatched', 'recipients: addresses near it do not match');
	is(row_json($node, $one)->{stage}, 'matched', 'recipients: the quoted address alone');
}

#
# reroute: discard with BOUNCE moves the row to BOUNCE_STAGE with
# state.bounce merged into what the state already held.
#
for my $batch (1, 2)
{
	my @ids = map {
		add_row($node, 'reject', state => { dsn => \%dsn, origin => \%origin })
	} 1 .. $batch;
	run_ok('pepsi-stage-discard', "reroute ($batch in a batch)", @ids);
	for my $id (@ids)
	{
		my $row = row_json($node, $id);
		is_deeply([ @$row{qw(stage status)} ], [ 'bounce', 'pending' ],
			"reroute ($batch): the row is pending at BOUNCE_STAGE");
		is_deeply(
			$row->{state},
			{
				dsn => \%dsn,
				origin => \%origin,
				bounce => { kind => 'permanent', diagnostic => '5.7.1 not wanted here' }
			},
			"reroute ($batch): state.bounce is merged, dsn and origin are kept");
	}
}

#
# finish: the row is deleted and its body released; a null sender is
# finished even where BOUNCE is on (a bounce is never bounced).
#
for my $batch (1, 2)
{
	my @ids = map { add_row($node, 'drop') } 1 .. $batch;
	my @bodies = map { row_json($node, $_)->{body_id} } @ids;
	run_ok('pepsi-stage-discard', "finish ($batch in a batch)", @ids);
	is($node->safe_psql('postgres',
			'SELECT count(*) FROM pepsi.workqueue WHERE id IN (' . join(',', @ids) . ')'),
		0, "finish ($batch): the rows are gone");
	is($node->safe_psql('postgres',
			'SELECT count(*) FROM pepsi.workqueue_body WHERE id IN (' . join(',', @bodies) . ')'),
		0, "finish ($batch): their bodies are released");
}
{
	my $null = add_row($node, 'reject', from => '');
	run_ok('pepsi-stage-discard', 'finish of a null sender', $null);
	is(row_json($node, $null), undef, 'a message from the null sender is finished, not bounced');
}

#
# pause: paused with its retry time, the merge in its state.
#
for my $batch (1, 2)
{
	my @ids = map { add_row($node, 'hold', state => { origin => \%origin }) } 1 .. $batch;
	run_ok('pepsi-test-probe', "pause ($batch in a batch)", @ids);
	for my $id (@ids)
	{
		my $row = row_json($node, $id);
		is_deeply([ @$row{qw(stage status)} ], [ 'hold', 'paused' ],
			"pause ($batch): the row is paused at its stage");
		ok($row->{due} > 590 && $row->{due} <= 600,
			"pause ($batch): due in PAUSE_SECONDS (in $row->{due} s)");
		is_deeply($row->{state}, { origin => \%origin, probe => 'pause' },
			"pause ($batch): the merge is in the state");
	}
}

#
# fail: aliases past its depth limit fails the row, recipients untouched.
#
for my $batch (1, 2)
{
	my @ids = map {
		add_row($node, 'expand', rcpt => [ 'deep0@example.org', 'x@example.org' ],
			state => { dsn => \%dsn })
	} 1 .. $batch;
	run_ok('pepsi-stage-aliases', "fail ($batch in a batch)", @ids);
	for my $id (@ids)
	{
		my $row = row_json($node, $id);
		is_deeply([ @$row{qw(stage status)} ], [ 'expand', 'failed' ],
			"fail ($batch): the row is failed at its stage");
		like($row->{state}{last_error}, qr/nests deeper than 32 levels/,
			"fail ($batch): the reason is in state.last_error");
		is_deeply($row->{rcpt_to}, [ 'deep0@example.org', 'x@example.org' ],
			"fail ($batch): the recipients are as they were");
		is_deeply($row->{state}{dsn}, \%dsn, "fail ($batch): state.dsn is kept");
	}
}

#
# split_off_recipients: route peels the remote recipients of a mixed row
# onto a sibling (same body) and sends the row on with the local ones;
# state.dsn.rcpt follows its recipients.
#
{
	my $mixed = add_row(
		$node, 'route',
		rcpt => [ 'a@example.org', 'x@remote.net', 'b@EXAMPLE.com', 'y@remote.net' ],
		state => { dsn => \%dsn });
	my $local = add_row($node, 'route', rcpt => [ 'a@example.org', 'postmaster' ]);
	my $remote = add_row($node, 'route', rcpt => ['x@remote.net']);
	my $before = row_json($node, $mixed);
	my $siblings_before = $node->safe_psql('postgres', 'SELECT count(*) FROM pepsi.workqueue');

	run_ok('pepsi-stage-route', 'route', $mixed, $local, $remote);
	my $row = row_json($node, $mixed);
	is_deeply([ @$row{qw(stage status)} ], [ 'local', 'pending' ],
		'split: the mixed row goes on to LOCAL_STAGE');
	is_deeply($row->{rcpt_to}, [ 'a@example.org', 'b@EXAMPLE.com' ],
		'split: it keeps the local recipients');
	is_deeply($row->{state}{dsn}{rcpt}, [ $dsn{rcpt}[0], $dsn{rcpt}[2] ],
		'split: and their DSN parameters');
	# The new rows at REMOTE_STAGE: all but the all-remote row route sent there.
	my @new_remote = grep { $_ != $remote } rows_at($node, 'remote');
	is(scalar @new_remote, 1, 'split: one new row is at REMOTE_STAGE');
	my $sib = row_json($node, $new_remote[0]);
	is_deeply($sib->{rcpt_to}, [ 'x@remote.net', 'y@remote.net' ],
		'split: the sibling has the remote recipients');
	is_deeply($sib->{state}{dsn}{rcpt}, [ $dsn{rcpt}[1], $dsn{rcpt}[3] ],
		'split: and their DSN parameters');
	is($sib->{status}, 'pending', 'split: the sibling is pending');
	is($sib->{body_id}, $before->{body_id}, 'split: the sibling shares the body');
	is($sib->{headers}, $before->{headers}, 'split: and has the same headers');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM pepsi.workqueue'),
		$siblings_before + 1, 'split: one sibling, and only for the mixed row');
	is(row_json($node, $local)->{stage}, 'local', 'route: an all-local row goes to LOCAL_STAGE');
	is(row_json($node, $remote)->{stage}, 'remote', 'route: an all-remote row goes to REMOTE_STAGE');
}

#
# PROGRAM may be a path: the basename is what must match.
#
{
	my $id = add_row($node, 'by-path');
	run_ok('pepsi-stage-if', 'a PROGRAM given as a path', $id);
	is(row_json($node, $id)->{stage}, 'by-path-done', 'the section whose PROGRAM is a path runs');
}

#
# Refusals: a non-zero status line with the reason, on stderr too; the
# worker goes on with the next id; the row is left exactly as it was.
#
sub refused
{
	my ($cmd, $what, $id, $reason) = @_;
	my $before = row_snapshot($node, $id);
	my $r = run_worker($cmd, "$id\n");

	is($r->{exit}, 0, "$what: the worker still ends normally");
	is(scalar @{ $r->{status} }, 1, "$what: one status line");
	my ($code, $report) = decode_status($r->{status}[0] // '');
	ok(defined $code && $code != 0, "$what: the status is non-zero");
	like($report->{error} // '', $reason, "$what: the status line gives the reason");
	like($r->{stderr}, $reason, "$what: and so does stderr");
	is(row_snapshot($node, $id), $before, "$what: the row is left as it was");
}

{
	my $id = add_row($node, 'peek-headers');
	refused(worker_cmd('pepsi-test-probe', $conf), 'headers read under a metadata load', $id,
		qr/pepsi-test-probe read the headers but declared a metadata load/);
	$id = add_row($node, 'peek-body');
	refused(worker_cmd('pepsi-test-probe', $conf), 'body read under a metadata load', $id,
		qr/read the body but did not declare a full load/);
	$id = add_row($node, 'peek-raw');
	refused(worker_cmd('pepsi-test-probe', $conf), 'raw message read under a metadata load', $id,
		qr/read the raw message but did not declare a full load/);
	$id = add_row($node, 'no-terminal');
	refused(worker_cmd('pepsi-test-probe', $conf), 'no terminal', $id,
		qr/called no terminal for row $id/);
	$id = add_row($node, 'two-terminals');
	refused(worker_cmd('pepsi-test-probe', $conf), 'two terminals', $id,
		qr/called a second terminal for row $id/);

	# A row of another program, to the standalone and to the unified binary.
	$id = add_row($node, 'route', rcpt => [ 'a@example.org', 'x@remote.net' ]);
	refused(worker_cmd('pepsi-stage-if', $conf), 'a row of another PROGRAM', $id,
		qr/row $id is at stage route, whose PROGRAM is pepsi-stage-route, not pepsi-stage-if/);
	refused(unified_cmd('pepsi-stage-if', $conf), 'a row of another PROGRAM (unified binary)', $id,
		qr/whose PROGRAM is pepsi-stage-route, not pepsi-stage-if/);
	is(scalar(rows_at($node, 'remote')), 2, 'the refused route row was not split');
}

#
# Bad input in one stream: each line gets its own status, in order, and
# the good ids among them are done (together, as one batch).
#
{
	my $pending = add_row($node, 'adv', running => 0);
	my $paused = add_row($node, 'hold');
	$node->safe_psql('postgres', "SELECT pepsi.workqueue_pause($paused, 'hold', 60)");
	my $nosection = add_row($node, 'nowhere');
	my ($good1, $good2) = map { add_row($node, 'adv') } 1 .. 2;
	my $missing = $good2 + 1000;
	my %before = map { $_ => row_snapshot($node, $_) } ($pending, $paused, $nosection);

	# The last line has no line end: it is still a line.
	my $r = run_worker(worker_cmd('pepsi-stage-if', $conf),
		"abc\n\n12x\n-3\n$pending\n$paused\n$nosection\n$good1\n$missing\n"
		  . ('9' x 300) . "\n $good1\n$good2");
	is($r->{exit}, 0, 'bad input: the worker ends normally');
	my @codes = map { (decode_status($_))[0] // 'garbled' } @{ $r->{status} };
	is_deeply(\@codes, [ 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 0 ],
		'bad input: one status line per input line, in order, the good ones 0');
	my @reasons = map { my (undef, $report) = decode_status($_); $report ? $report->{error} : '' }
	  @{ $r->{status} };
	like($reasons[0], qr/malformed id line "abc"/, 'a malformed id line is named');
	like($reasons[1], qr/malformed id line ""/, 'an empty line is malformed');
	like($reasons[3], qr/malformed id line "-3"/, 'a negative id is malformed');
	like($reasons[4], qr/row $pending is pending, not running/, 'a pending row is refused');
	like($reasons[5], qr/row $paused is paused, not running/, 'a paused row is refused');
	like($reasons[6], qr/row $nosection is at stage nowhere, but \S+ has no \[stage-nowhere\] section/,
		'a row whose stage has no section is refused');
	like($reasons[8], qr/row $missing does not exist/, 'an id with no row is refused');
	like($reasons[9], qr/malformed id line "9{20}/, 'an over-long line is malformed');
	like($reasons[10], qr/malformed id line " $good1"/,
		'an id with leading space is malformed (and not run twice)');
	for my $reason (grep { $_ ne '' } @reasons)
	{
		my $text = quotemeta $reason;
		like($r->{stderr}, qr/$text/, "stderr has the reason: $reason");
	}
	is(row_snapshot($node, $_), $before{$_}, "bad input: row $_ is left as it was")
	  for sort keys %before;
	is(row_json($node, $good1)->{stage}, 'adv-next', 'bad input: the first good id is done');
	is(row_json($node, $good2)->{stage}, 'adv-next',
		'bad input: so is the last, though its line had no line end');
}

#
# The same one at a time: a worker answers each line before the next
# arrives and carries on after a refusal.
#
{
	my ($good1, $good2) = map { add_row($node, 'adv') } 1 .. 2;
	my $io = start_worker(worker_cmd('pepsi-stage-if', $conf));
	my ($line) = send_ids($io, "bogus\n", 1);
	like($line, qr/^1 \{"error":"malformed id line \\"bogus\\""\}$/,
		'interactive: a bad line is answered at once');
	($line) = send_ids($io, "$good1\n", 1);
	is($line, '0', 'interactive: the next id is done');
	($line) = send_ids($io, "$good1\n", 1);
	like($line, qr/^1 .*row $good1 is pending, not running/,
		'interactive: an id already done is refused, not done again');
	($line) = send_ids($io, "$good2\n", 1);
	is($line, '0', 'interactive: and the worker still goes on');
	ok($io->{harness}->finish, 'interactive: the worker exits 0 when its input ends');
	is(row_json($node, $good2)->{stage}, 'adv-next', 'interactive: the rows moved on');
}

#
# A repeated id in one batch runs once; the repeat is refused as it would
# be one at a time.  (In a batch both copies would otherwise run on the
# row as loaded: a split made twice from stale recipients.)
#
{
	my $id = add_row($node, 'route', rcpt => [ 'a@example.org', 'x@remote.net', 'b@example.org' ]);
	my $r = run_worker(worker_cmd('pepsi-stage-route', $conf), "$id\n$id\n");
	is($r->{status}[0], '0', 'a repeated id: the first runs');
	like($r->{status}[1], qr/^1 .*row $id is already in this batch/, 'a repeated id: the repeat is refused');
	is_deeply(row_json($node, $id)->{rcpt_to}, [ 'a@example.org', 'b@example.org' ],
		'a repeated id: the row keeps both local recipients');
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM pepsi.workqueue WHERE body_id = (SELECT body_id FROM pepsi.workqueue WHERE id = $id)"),
		2, 'a repeated id: one split, one sibling');
}

#
# A bad configuration: the worker refuses to start, naming file:line, and
# takes no id.
#
sub refuses_to_start
{
	my ($what, $cmd, $reason, $id) = @_;
	my $before = defined $id ? row_snapshot($node, $id) : '';
	my $r = run_worker($cmd, defined $id ? "$id\n" : '');

	isnt($r->{exit}, 0, "$what: the worker exits non-zero");
	is($r->{stdout}, '', "$what: and writes no status line");
	like($r->{stderr}, $reason, "$what: stderr says why");
	is(row_snapshot($node, $id), $before, "$what: the row is left as it was") if defined $id;
}

{
	my $id = add_row($node, 'adv');
	my $bad = stage_config($node, 'bad-option.conf', <<'INI');
[stage-adv]
PROGRAM = pepsi-stage-if
CONDITION = rcpt_count > 0
Then_Stage = x
INI
	refuses_to_start('an option in lower case', worker_cmd('pepsi-stage-if', $bad),
		qr/\Q$bad\E:7: \[stage-adv\] has no option Then_Stage \(option names are upper case\)/, $id);

	$bad = stage_config($node, 'bad-section.conf', "[pepsi]\nHOSTNAME = mx\n[stage-adv]\nPROGRAM = pepsi-stage-if\n[stages]\nX = 1\n");
	refuses_to_start('an unknown section', unified_cmd('pepsi-stage-if', $bad),
		qr/\Q$bad\E:9: unknown section \[stages\]/, $id);

	$bad = stage_config($node, 'bad-line.conf', "[stage-adv]\nPROGRAM = pepsi-stage-if\nCONDITION\n");
	refuses_to_start('a malformed line', worker_cmd('pepsi-stage-if', $bad),
		qr/\Q$bad\E:6: malformed line/, $id);

	$bad = stage_config($node, 'twice.conf', "[stage-adv]\nPROGRAM = pepsi-stage-if\nPROGRAM = pepsi-stage-if\n");
	refuses_to_start('an option set twice', worker_cmd('pepsi-stage-if', $bad),
		qr/\Q$bad\E:6: \[stage-adv\] PROGRAM is set twice \(first at line 5\)/, $id);

	$bad = stage_config($node, 'bad-bool.conf', "[pepsi]\nALLOW_FUSION = sometimes\n");
	refuses_to_start('a bad boolean', unified_cmd('pepsi-stage-if', $bad),
		qr/\Q$bad\E:5: \[pepsi\] ALLOW_FUSION = sometimes: ALLOW_FUSION is a boolean/, $id);

	$bad = stage_config($node, 'bad-regex.conf', <<'INI');
[stage-adv]
PROGRAM = pepsi-stage-if
CONDITION = rcpt ~ ([a-z
THEN_STAGE = x
ELSE_STAGE = y
INI
	refuses_to_start("a stage's own option (if's CONDITION)", worker_cmd('pepsi-stage-if', $bad),
		qr/\Q$bad\E:6: \[stage-adv\] CONDITION regex/, $id);

	$bad = stage_config($node, 'no-database.conf',
		"[database]\nCONNINFO = host=$tmp port=1 dbname=postgres connect_timeout=5\n");
	refuses_to_start('an unreachable database', worker_cmd('pepsi-stage-if', $bad),
		qr/cannot connect to the database/, $id);

	refuses_to_start('a missing file', worker_cmd('pepsi-stage-if', "$tmp/absent.conf"),
		qr/\Q$tmp\E\/absent\.conf: No such file or directory/, $id);

	my $r = run_worker([ $ENV{PEPSI_BIN} . '/pepsi-stage-if' ], '');
	is($r->{exit}, 64, 'without "worker" the program prints its usage and exits 64');
	like($r->{stderr}, qr/usage: pepsi-stage-if worker/, 'the usage names the program');
}

done_testing();
