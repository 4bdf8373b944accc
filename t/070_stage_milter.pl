# pepsi-stage-milter against real filters speaking the milter protocol:
# t/bin/scripted-milter (python3-milter on Debian's libmilter) for every
# reply and edit on demand (headers, body shared by split rows, sender,
# recipients added and deleted, per-recipient tempfail and reject,
# quarantine, reject, tempfail, discard, a filter that never answers),
# and t/bin/bad-milter for what libmilter would never send (malformed,
# oversize and out-of-order packets, a close mid-message, a bad version,
# an edit not negotiated): the row paused with the reason or
# DEFAULT_ACTION applied, the connection re-opened, never a crash.

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiTest;
use PepsiStage;

my $here = dirname(abs_path(__FILE__));
my $node = stage_node('stage_milter');
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $json = JSON::PP->new->canonical;

# A filter program of t/bin on a free port: its port once it listens.
sub start_filter
{
	my ($program, @args) = @_;

	return start_server($program, sub { ('/usr/bin/python3', "$here/bin/$program", $_[0], @args) })->{port};
}

# A running row at $stage with our own header block and body.
sub add_message
{
	my (%m) = @_;
	my $from = $m{from} // 'sender@example.net';
	my $rcpt = join(',', map { PepsiStage::quote_literal($_) } @{ $m{rcpt} // ['rcpt@example.org'] });
	my $headers = $m{headers} // "From: <$from>\r\nTo: <rcpt\@example.org>\r\nSubject: $m{subject}\r\n";
	my $state = $m{state} // { origin => { client_ip => '198.51.100.7', helo => 'client.example.net',
		listener => 'mx', auth => 'alice', esmtp => JSON::PP::true, body => '8BITMIME',
		tls => { version => 'TLSv1.3', cipher => 'TLS_AES_256_GCM_SHA384', bits => 256 } } };
	my $id = $node->safe_psql('postgres',
		    'SELECT pepsi.workqueue_add(' . PepsiStage::quote_literal($from) . ", ARRAY[$rcpt],"
		  . ' convert_to(' . PepsiStage::quote_literal($headers) . ", 'UTF8'),"
		  . ' convert_to(' . PepsiStage::quote_literal($m{body} // "Hello.\r\nSecond line.\r\n") . ", 'UTF8'),"
		  . PepsiStage::quote_literal($json->encode($state)) . '::jsonb, stage => '
		  . PepsiStage::quote_literal($m{stage} // 'filter') . ')');
	set_running($node, $id);
	return $id;
}

sub body_of
{
	my ($id) = @_;
	return $node->safe_psql('postgres',
		"SELECT convert_from(b.body, 'UTF8') FROM pepsi.workqueue w"
		  . " JOIN pepsi.workqueue_body b ON b.id = w.body_id WHERE w.id = $id");
}

sub run_ids
{
	my ($conf, @ids) = @_;
	return run_worker(worker_cmd('pepsi-stage-milter', $conf), join('', map { "$_\n" } @ids));
}

my $log = "$tmp/scripted.jsonl";
my ($scripted) = start_filter('scripted-milter', $log);
my ($dead_port) = PostgreSQL::Test::Cluster::get_free_port();

sub scripted_records
{
	return map { $json->decode($_) } grep { /\S/ } split /\n/, slurp($log);
}

my $sink = start_sink();
my $conf = stage_config($node, 'milter.conf', <<"INI");
[pepsi]
HOSTNAME = mx.example.org
MAIL_LOG = yes
LOG = stderr

[stage-filtered]
PROGRAM = pepsi-stage-relay-to-smarthost
SMARTHOST = 127.0.0.1:$sink->{port}
TLS = none

[stage-filter]
PROGRAM = pepsi-stage-milter
MILTERS = inet:127.0.0.1:$scripted
FINAL_TIMEOUT = 2s
NEXT_STAGE = filtered
BOUNCE_STAGE = bounce

[stage-filter-discarding]
PROGRAM = pepsi-stage-milter
MILTERS = inet:127.0.0.1:$scripted
REJECT_ACTION = discard
NEXT_STAGE = filtered

[stage-filter-lenient]
PROGRAM = pepsi-stage-milter
MILTERS = inet:127.0.0.1:$dead_port inet:127.0.0.1:$scripted
FINAL_TIMEOUT = 2s
DEFAULT_ACTION = accept
NEXT_STAGE = filtered

[stage-filter-braces]
PROGRAM = pepsi-stage-milter
MILTERS = { inet:127.0.0.1:$dead_port, connect_timeout=2s, default_action=accept } { inet:127.0.0.1:$scripted, final_timeout = 1s }
FINAL_TIMEOUT = 10m
NEXT_STAGE = filtered

[stage-filter-down]
PROGRAM = pepsi-stage-milter
MILTERS = inet:127.0.0.1:$dead_port
CONNECT_TIMEOUT = 2s
RETRY_BASE = 5m
NEXT_STAGE = filtered
INI

#
# A clean message: it goes on, the macros Postfix sends were filled from
# state.origin and the envelope, and the verdict is recorded.
#
my $clean = add_message(subject => 'hello there', rcpt => [ 'one@example.org', 'two@example.org' ]);
my $r = run_ids($conf, $clean);
is_deeply($r->{status}, ['0'], 'the worker reports success') or diag $r->{stderr};
my $row = row_json($node, $clean);
is($row->{stage}, 'filtered', 'a clean message advances to NEXT_STAGE');
is($row->{status}, 'pending', '... pending there');
is($row->{state}{milter}{verdict}, 'accept', 'state.milter.verdict is accept');
is($row->{state}{milter}{filters}[0]{milter}, "inet:127.0.0.1:$scripted", 'state.milter names the filter');
is($node->safe_psql('postgres', "SELECT detail ->> 'verdict' FROM pepsi.mail_log WHERE workqueue_id = $clean AND event = 'milter'"),
	'accept', 'pepsi.mail_log records the verdict ([pepsi] MAIL_LOG)');
my ($rec) = grep { $_->{macros}{i} eq $clean } scripted_records();
ok($rec, 'the filter saw the message (macro i is the row id)');
is($rec->{macros}{j}, 'mx.example.org', 'j is [pepsi] HOSTNAME');
is($rec->{macros}{'{client_addr}'}, '198.51.100.7', '{client_addr} from state.origin');
is($rec->{macros}{'{daemon_name}'}, 'mx', '{daemon_name} is the listener');
is($rec->{macros}{'{auth_authen}'}, 'alice', '{auth_authen} is the authenticated account');
is($rec->{macros}{'{mail_addr}'}, 'sender@example.net', '{mail_addr} is the envelope sender');
is($rec->{macros}{'{tls_version}'}, 'TLSv1.3', '{tls_version} from state.origin.tls');
is($rec->{macros}{'{cipher}'}, 'TLS_AES_256_GCM_SHA384', '{cipher} from state.origin.tls');
is($rec->{macros}{'{cipher_bits}'}, '256', '{cipher_bits} from state.origin.tls');
is_deeply($rec->{rcpt_addr}, [ 'one@example.org', 'two@example.org' ], '{rcpt_addr} per recipient');
is($rec->{hostaddr}, '198.51.100.7', 'CONNECT carries the client address');
is($rec->{helo}, 'client.example.net', 'HELO is the client\'s');
is($rec->{mail}, '<sender@example.net>', 'MAIL is the envelope sender');
is_deeply($rec->{mail_args}, ['BODY=8BITMIME'], 'MAIL carries BODY=8BITMIME from state.origin');
is_deeply($rec->{headers}[2], [ 'Subject', 'hello there' ], 'headers are sent name and value');
is($rec->{body}, "Hello.\r\nSecond line.\r\n", 'the body is sent as stored');
is($node->safe_psql('postgres', "SELECT encode(headers, 'escape') FROM pepsi.workqueue WHERE id = $clean"),
	"From: <sender\@example.net>\r\nTo: <rcpt\@example.org>\r\nSubject: hello there\r\n",
	'an untouched message keeps its headers byte for byte');

#
# One kept connection: the next message from the same client is the next
# transaction of its session (MAIL after end of message, as Postfix sends
# a client's messages); one from another client is announced anew after
# QUIT_NC, on the same connection.
#
my $other = { origin => { client_ip => '203.0.113.9', helo => 'other.example.net', listener => 'mx' } };
my @kept = (add_message(subject => 'first'), add_message(subject => 'second'),
	add_message(subject => 'third', state => $other));
$r = run_ids($conf, @kept);
is_deeply($r->{status}, [ '0', '0', '0' ], 'three messages through one worker');
my %by_id = map { $_->{macros}{i} => $_ } scripted_records();
is($by_id{ $kept[1] }{connection}, $by_id{ $kept[0] }{connection},
	'the same client\'s next message shares the filter\'s connection context');
is($by_id{ $kept[1] }{message_in_connection}, 2, '... as its second transaction');
isnt($by_id{ $kept[2] }{connection}, $by_id{ $kept[1] }{connection},
	'another client\'s message is a new connection context (QUIT_NC, CONNECT)');
is($by_id{ $kept[2] }{hostaddr}, '203.0.113.9', '... announced with its own address');
is($by_id{ $kept[2] }{macros}{'{client_addr}'}, '203.0.113.9', '... and macros');

#
# Header edits: add, insert at the top, change, delete.
#
my $edit = add_message(headers => "From: <s\@example.net>\r\nX-Remove: me\r\nSubject: edit-headers\r\n");
$r = run_ids($conf, $edit);
is_deeply($r->{status}, ['0'], 'header edits: success') or diag $r->{stderr};
is($node->safe_psql('postgres', "SELECT encode(headers, 'escape') FROM pepsi.workqueue WHERE id = $edit"),
	"X-First: inserted at the top\r\nFrom: <s\@example.net>\r\nSubject: edited subject\r\n"
	  . "X-Scripted: added at the end\r\n",
	'headers added at the end, inserted at the top, changed and deleted');

#
# Replace body on one of three rows sharing a body: only that row changes.
#
my $shared = add_message(subject => 'replace-body', rcpt => [ 'a@example.org', 'b@example.org', 'c@example.org' ]);
$node->safe_psql('postgres', "SELECT pepsi.workqueue_split_one_per_row($shared, 'filter')");
my @siblings = split /\n/, $node->safe_psql('postgres',
	"SELECT id FROM pepsi.workqueue WHERE body_id = (SELECT body_id FROM pepsi.workqueue WHERE id = $shared) ORDER BY id");
is(scalar @siblings, 3, 'three rows share one body');
my $body_before = row_json($node, $shared)->{body_id};
$r = run_ids($conf, $shared);
is_deeply($r->{status}, ['0'], 'replace body: success') or diag $r->{stderr};
is(body_of($shared), "This body was replaced by the filter.\r\n", 'the filtered row has the new body');
isnt(row_json($node, $shared)->{body_id}, $body_before, '... in a body of its own');
for my $sibling (grep { $_ != $shared } @siblings)
{
	is(body_of($sibling), "Hello.\r\nSecond line.\r\n", "sibling $sibling keeps the shared body");
	is(row_json($node, $sibling)->{body_id}, $body_before, "... and its body_id");
}

#
# Envelope edits: sender changed, a recipient added, one deleted.
#
my $env = add_message(subject => 'chgfrom add-rcpt del-rcpt', rcpt => [ 'first@example.org', 'second@example.org' ],
	state => { origin => { client_ip => '198.51.100.7' },
		dsn => { ret => undef, envid => undef, rcpt => [ { notify => 'NEVER', orcpt => undef },
			{ notify => 'SUCCESS', orcpt => undef } ] } });
$r = run_ids($conf, $env);
is_deeply($r->{status}, ['0'], 'envelope edits: success') or diag $r->{stderr};
$row = row_json($node, $env);
is($row->{mail_from}, 'changed@example.net', 'CHGFROM changes the envelope sender');
is_deeply($row->{rcpt_to}, [ 'second@example.org', 'added@example.org' ],
	'DELRCPT removes a recipient, ADDRCPT adds one');
is_deeply([ map { $_->{notify} } @{ $row->{state}{dsn}{rcpt} } ], [ 'SUCCESS', undef ],
	'state.dsn.rcpt follows the recipients in lockstep');

#
# Per-recipient tempfail and reject: the others go on.
#
my $per = add_message(subject => 'per recipient',
	rcpt => [ 'ok@example.org', 'tempfail-busy@example.org', 'reject-gone@example.org', 'fine@example.org' ]);
$r = run_ids($conf, $per);
is_deeply($r->{status}, ['0'], 'per-recipient refusals: success') or diag $r->{stderr};
$row = row_json($node, $per);
is_deeply($row->{rcpt_to}, [ 'ok@example.org', 'fine@example.org' ], 'the accepted recipients go on');
is($row->{stage}, 'filtered', '... to NEXT_STAGE');
my ($paused) = split /\n/, $node->safe_psql('postgres',
	"SELECT id FROM pepsi.workqueue WHERE rcpt_to = ARRAY['tempfail-busy\@example.org']");
$row = row_json($node, $paused);
is($row->{status}, 'paused', 'the tempfailed recipient is paused');
is($row->{stage}, 'filter', '... at the milter stage, to be filtered again');
ok($row->{due} > 30, '... with a retry time');
like($row->{state}{milter}{reply}, qr/^451 4\.2\.0 mailbox of tempfail-busy/, '... and the filter\'s reply');
my ($bounced) = split /\n/, $node->safe_psql('postgres',
	"SELECT id FROM pepsi.workqueue WHERE rcpt_to = ARRAY['reject-gone\@example.org']");
$row = row_json($node, $bounced);
is($row->{stage}, 'bounce', 'the rejected recipient goes to BOUNCE_STAGE');
is($row->{state}{bounce}{failed_recipient}, 'reject-gone@example.org', '... with state.bounce for it');
is($row->{state}{bounce}{status}, '5.1.1', '... the filter\'s enhanced status');

#
# The steps are pipelined (every command written before the first reply
# is read): a refusal at an early step still decides, what was written
# after it is left unanswered, and the next message is filtered afresh.
#
my $early = add_message(subject => 'hello', from => 'reject-me@example.net');
my $all_refused = add_message(subject => 'hello', rcpt => [ 'reject-a@example.org', 'reject-b@example.org' ]);
my $next = add_message(subject => 'after an early refusal');
$r = run_ids($conf, $early, $all_refused, $next);
is_deeply($r->{status}, [ '0', '0', '0' ], 'early refusals: the worker goes on') or diag $r->{stderr};
$row = row_json($node, $early);
is($row->{stage}, 'bounce', 'a reject at MAIL decides though the rest was already written');
like($row->{state}{bounce}{diagnostic}, qr/550 5\.7\.1 sender reject-me\@example\.net refused/,
	'... with the filter\'s reply to MAIL');
$row = row_json($node, $all_refused);
is($row->{stage}, 'bounce', 'every recipient refused at RCPT: the message is rejected');
like($row->{state}{bounce}{diagnostic}, qr/550 5\.1\.1 no such user reject-a/, '... with the first refusal');
is(row_json($node, $next)->{stage}, 'filtered', 'the next message is filtered normally');
my ($next_rec) = grep { $_->{macros}{i} eq $next } scripted_records();
is($next_rec->{message_in_connection}, 1, '... on a fresh connection');

#
# Message-level verdicts.
#
my $quarantine = add_message(subject => 'quarantine');
my $reject = add_message(subject => 'reject');
my $tempfail = add_message(subject => 'tempfail');
my $discard = add_message(subject => 'discard');
my $accept = add_message(subject => 'accept');
$r = run_ids($conf, $quarantine, $reject, $tempfail, $discard, $accept);
is_deeply($r->{status}, [ '0', '0', '0', '0', '0' ], 'five verdicts through one worker') or diag $r->{stderr};
$row = row_json($node, $quarantine);
is($row->{status}, 'paused', 'quarantine holds the row for the operator');
is($node->safe_psql('postgres', "SELECT timeout = 'infinity' FROM pepsi.workqueue WHERE id = $quarantine"),
	't', '... on hold (no retry time), as pepsi.queue_hold leaves a row');
is($row->{stage}, 'filter', '... at the milter stage');
is($row->{state}{milter}{quarantine}, 'held by the scripted filter', '... with the reason');
is($row->{state}{milter}{verdict}, 'quarantine', '... verdict quarantine');
is($node->safe_psql('postgres', "SELECT held FROM pepsi.queue_summary WHERE stage = 'filter' AND status = 'paused'"),
	'1', '... counted as held by pepsi.queue_summary');
$row = row_json($node, $reject);
is($row->{stage}, 'bounce', 'reject bounces (REJECT_ACTION bounce)');
like($row->{state}{bounce}{diagnostic}, qr/554 5\.7\.1 rejected by the scripted filter/, '... with the filter\'s text');
$row = row_json($node, $tempfail);
is($row->{status}, 'paused', 'tempfail pauses');
is($row->{state}{milter}{verdict}, 'tempfail', '... verdict tempfail');
is($row->{state}{milter}{attempts}, 1, '... attempt 1');
ok($row->{due} > 30 && $row->{due} < 90, '... for RETRY_BASE');
is(row_json($node, $discard), undef, 'discard drops the row');
is($node->safe_psql('postgres', "SELECT string_agg(detail ->> 'verdict', ' ' ORDER BY workqueue_id) FROM pepsi.mail_log"
	  . " WHERE workqueue_id IN ($quarantine, $reject, $tempfail, $discard) AND event = 'milter'"),
	'quarantine reject tempfail discard', '... each verdict in pepsi.mail_log');
is(row_json($node, $accept)->{stage}, 'filtered', 'accept lets it go on');

# The verdict rides to the delivery log line of the stage that sends it.
set_running($node, $accept);
$r = run_worker(worker_cmd('pepsi-stage-relay-to-smarthost', $conf), "$accept\n");
like($r->{status}[0] // '', qr/^0( |$)/, 'the accepted message is relayed') or diag $r->{stdout}, $r->{stderr};
like($r->{stderr}, qr/: $accept: to=<rcpt\@example\.org>, relay=.*, status=sent \(.*\), milter=accept, row=$accept$/m,
	'the delivery log line carries milter=accept');
is($node->safe_psql('postgres', "SELECT detail ->> 'milter' FROM pepsi.mail_log WHERE workqueue_id = $accept AND event = 'delivery'"),
	'accept', '... and so does its pepsi.mail_log row');

# An operator releases the quarantined row: it goes on, unfiltered.
is($node->safe_psql('postgres', "SELECT pepsi.queue_release(ARRAY[$quarantine]::bigint[])"), '1',
	'pepsi.queue_release releases the quarantined row');
set_running($node, $quarantine);
my $count = () = scripted_records();
$r = run_ids($conf, $quarantine);
is(row_json($node, $quarantine)->{stage}, 'filtered', 'a released quarantined row goes on');
is(scalar(() = scripted_records()), $count, '... without being filtered again');

my $reject_discard = add_message(subject => 'reject', stage => 'filter-discarding');
$r = run_ids($conf, $reject_discard);
is_deeply($r->{status}, ['0'], 'REJECT_ACTION = discard: success');
is(row_json($node, $reject_discard), undef, 'REJECT_ACTION = discard drops a rejected message');

#
# A filter that never answers, and one that is down.
#
my $silent = add_message(subject => 'never-answer');
my $after = add_message(subject => 'after the silence');
$r = run_ids($conf, $silent, $after);
is_deeply($r->{status}, [ '0', '0' ], 'a silent filter: the worker goes on') or diag $r->{stderr};
$row = row_json($node, $silent);
is($row->{status}, 'paused', 'no answer within FINAL_TIMEOUT: DEFAULT_ACTION tempfail pauses');
is($row->{state}{milter}{verdict}, 'unavailable', '... verdict unavailable');
like($row->{state}{milter}{reply}, qr/timeout/, '... the reason says timeout');
is(row_json($node, $after)->{stage}, 'filtered', 'the next message is filtered on a new connection');

my $lenient = add_message(subject => 'never-answer', stage => 'filter-lenient');
$r = run_ids($conf, $lenient);
$row = row_json($node, $lenient);
is($row->{stage}, 'filtered', 'DEFAULT_ACTION = accept: a down filter and a silent one are passed over');
is_deeply([ map { $_->{verdict} } @{ $row->{state}{milter}{filters} } ], [ 'unavailable', 'unavailable' ],
	'... both recorded as unavailable');

# Per-filter settings (Postfix's braces): the first filter's own
# default_action passes it over while down, the second's own final_timeout
# (1s, not the stage's 10m) ends its silence, and the stage's
# DEFAULT_ACTION (tempfail) applies to it.
my $braces = add_message(subject => 'never-answer', stage => 'filter-braces');
my $started = time;
$r = run_ids($conf, $braces);
is_deeply($r->{status}, ['0'], 'per-filter settings: success') or diag $r->{stderr};
$row = row_json($node, $braces);
is($row->{status}, 'paused', 'per-filter settings: the silent filter\'s final_timeout=1s applies');
like($row->{state}{milter}{reply}, qr/timeout/, '... the reason says timeout');
is_deeply([ map { $_->{verdict} } @{ $row->{state}{milter}{filters} } ], [ 'unavailable', 'unavailable' ],
	'... the down filter passed over by its own default_action=accept');
ok(time - $started < 60, '... well before the stage\'s FINAL_TIMEOUT');

my $down = add_message(subject => 'hello', stage => 'filter-down');
$r = run_ids($conf, $down);
$row = row_json($node, $down);
is($row->{status}, 'paused', 'a filter that is down: paused (DEFAULT_ACTION tempfail)');
like($row->{state}{milter}{reply}, qr/cannot connect/, '... the reason says why');
ok($row->{due} > 250, '... for RETRY_BASE = 5m');

#
# Bad input: each misbehaving connection costs its message a pause, the
# next connection is fresh, and the worker never crashes.
#
my $bad_log = "$tmp/bad.log";
my @modes = qw(malformed oversize out-of-order close-mid bad-version undeclared flood good);
# The first connection is start_filter's probe.
my ($bad) = start_filter('bad-milter', $bad_log, 'probe', @modes);
my $bad_conf = stage_config($node, 'bad.conf', <<"INI");
[stage-filter]
PROGRAM = pepsi-stage-milter
MILTERS = inet:127.0.0.1:$bad
COMMAND_TIMEOUT = 5s
NEXT_STAGE = filtered
INI
my @bad_ids = map { add_message(subject => "bad $_") } @modes, 'good again';
$r = run_ids($bad_conf, @bad_ids);
is_deeply($r->{status}, [ ('0') x @bad_ids ], 'every bad filter: the worker answers each message')
  or diag $r->{stderr};
my %expect = (
	malformed => qr/malformed REPLYCODE/,
	oversize => qr/packet of 2147483647 bytes/,
	'out-of-order' => qr/CONNECT with ADDHEADER, out of order/,
	'close-mid' => qr/closed the connection/,
	'bad-version' => qr/protocol version 99/,
	undeclared => qr/ADDHEADER without negotiating/,
	flood => qr/more than 10000 edits/);
for my $i (0 .. $#modes - 1)
{
	$row = row_json($node, $bad_ids[$i]);
	is($row->{status}, 'paused', "$modes[$i]: the row is paused, not passed");
	like($row->{state}{milter}{reply}, $expect{ $modes[$i] }, "$modes[$i]: the reason names the problem");
}
is(row_json($node, $bad_ids[-2])->{stage}, 'filtered', 'a good connection after them filters normally');
is(row_json($node, $bad_ids[-1])->{stage}, 'filtered', '... and is kept for the next message');
is(scalar(split /\n/, slurp($bad_log)), 1 + scalar @modes, 'one connection per failure, then one kept');

# A bad configuration is refused at start.
my $broken = stage_config($node, 'broken.conf', <<"INI");
[pepsi]
LOG = stderr

[stage-filter]
PROGRAM = pepsi-stage-milter
MILTERS = tcp:somewhere
INI
$r = run_worker(worker_cmd('pepsi-stage-milter', $broken), '');
isnt($r->{exit}, 0, 'a bad MILTERS is refused at start');
like($r->{stderr}, qr/milter address "tcp:somewhere"/, '... naming it');
$broken = stage_config($node, 'broken-braces.conf', <<"INI");
[pepsi]
LOG = stderr

[stage-filter]
PROGRAM = pepsi-stage-milter
MILTERS = { inet:127.0.0.1:$scripted, command_timeout=soon }
INI
$r = run_worker(worker_cmd('pepsi-stage-milter', $broken), '');
isnt($r->{exit}, 0, 'a bad per-filter setting is refused at start');
like($r->{stderr}, qr/\[stage-filter\] MILTERS: command_timeout=soon for inet:127\.0\.0\.1:$scripted: /,
	'... naming the section, the setting and the filter');

done_testing();
