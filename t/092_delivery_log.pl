# The delivery log: exactly one line per delivery attempt, in the shape
# postmasters grep Postfix's for (to=, relay=, delay=, delays=, dsn=,
# status=sent|deferred|bounced|expired and the reply), through the real
# smarthost stage talking to Postfix's smtp-sink and to the scripted peer;
# with [pepsi] MAIL_LOG = yes the same events as pepsi.mail_log rows that
# match the lines, shown by pepsi-queue log; LOG_FORMAT = json as one JSON
# object per line.

use strict;
use warnings FATAL => 'all';


use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('delivery_log');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
make_mailbox($root, 'sender@local.test');
make_mailbox($root, 'here@local.test');

# The lines of a log for one recipient.
sub lines_for
{
	my ($log, $rcpt) = @_;
	return grep { /: to=<\Q$rcpt\E>/ } split /\n/, slurp($log);
}

#
# Sent: through smtp-sink, and to a local mailbox.
#
my $sink = start_sink('-c');
my $config = delivery_config($node, maildir_root => $root, smarthost => "127.0.0.1:$sink->{port}",
	pepsi => { MAIL_LOG => 'yes' });
my $d = start_dispatcher($config, log => "$tmp/dispatch.log");
my $sent = inject($node, to => ['far@remote.test']);
my $local = inject($node, to => ['here@local.test']);
ok(poll_until(sub { queue_count($node) == 0 }), 'both delivered');
stop_dispatcher($d);
stop_process($sink);

my @far = lines_for("$tmp/dispatch.log", 'far@remote.test');
is(scalar @far, 1, 'exactly one line for the remote delivery') or diag explain \@far;
like($far[0], qr/^pepsi\/smtp\[\d+\]: \d+: to=<far\@remote\.test>, relay=127\.0\.0\.1\[127\.0\.0\.1\]:$sink->{port}, /,
	'... tagged as Postfix\'s smtp, naming the message (a row admitted without a queue id: by its row id), the recipient and relay=host[address]:port');
like($far[0], qr/, delay=(\d+\.\d\d), delays=(\d+\.\d\d)\/(\d+\.\d\d)\/(\d+\.\d\d)\/(\d+\.\d\d), /,
	'... delay= and its four parts');
my ($delay, @parts) = $far[0] =~ /delay=([\d.]+), delays=([\d.]+)\/([\d.]+)\/([\d.]+)\/([\d.]+)/;
my $sum = 0;
$sum += $_ for @parts;
ok(abs($sum - $delay) < 0.05, "... which add up ($sum against $delay)");
like($far[0], qr/, dsn=2\.0\.0, status=sent \(250 2\.0\.0 Ok[^)]*\), row=$sent$/,
	'... dsn=2.0.0, status=sent and the server\'s reply');
my @here = lines_for("$tmp/dispatch.log", 'here@local.test');
is(scalar @here, 1, 'one line for the local delivery');
like($here[0], qr/^pepsi\/local\[\d+\]: $local: to=<here\@local\.test>, relay=local, .* dsn=2\.0\.0, status=sent \(delivered to maildir\), row=$local$/, '... relay=local, tagged as Postfix\'s local');

# The same events in pepsi.mail_log, written with the commit.
my $rows = $node->safe_psql('postgres',
	"SELECT workqueue_id || ' ' || (detail ->> 'status') || ' ' || (detail ->> 'relay') || ' ' || (detail ->> 'dsn')"
	  . " FROM pepsi.mail_log WHERE event = 'delivery' ORDER BY id");
my @expected = map { my ($relay, $dsn, $status, $id) = /: \d+: to=<[^>]+>, relay=(\S+), .*dsn=(\S+), status=(\w+).*, row=(\d+)$/;
	"$id $status $relay $dsn" } (@far, @here);
is_deeply([ sort split /\n/, $rows ], [ sort @expected ], 'pepsi.mail_log holds one row per line, matching it');
my ($rc, $out, $err) = queue_log_of($config, $sent);
is($rc, 0, 'pepsi-queue log ID');
like($out, qr/delivery .*sent .*far\@remote\.test/, '... shows the delivery');
($rc, $out) = queue_log_of($config, 'here@local.test');
like($out, qr/sent .*here\@local\.test .*local/, 'pepsi-queue log ADDRESS');

sub queue_log_of
{
	my ($config, $what) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-queue'), '-C', $config, 'log', $what ], '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

#
# Deferred, then sent; bounced; from a JSON logger.
#
my $peer = start_peer('--rcpt-first', 'slow@=1=451 4.3.0 try again later',
	'--rcpt', 'gone@=550 5.1.1 <gone@remote.test>: no such user');
$config = delivery_config($node, maildir_root => $root, smarthost => "127.0.0.1:$peer->{port}",
	pepsi => { MAIL_LOG => 'yes' }, extra => { smarthost => "RETRY_BASE = 1s\nRETRY_MAX = 1s\n" });
$d = start_dispatcher($config, log => "$tmp/peer.log");
my $slow = inject($node, to => ['slow@remote.test']);
my $gone = inject($node, to => ['gone@remote.test']);
ok(poll_until(sub { queue_count($node) == 0 }), 'the slow one delivered on retry, the bounce delivered');
stop_dispatcher($d);
stop_process($peer);
my @slow = lines_for("$tmp/peer.log", 'slow@remote.test');
is(scalar @slow, 2, 'two attempts, two lines');
like($slow[0], qr/, dsn=4\.3\.0, status=deferred \(451 4\.3\.0 try again later; attempt 1, next in \d+s\), row=$slow$/,
	'the first: status=deferred with the reply and when it is tried again');
like($slow[1], qr/, status=sent \(/, 'the second: status=sent');
my @gone = lines_for("$tmp/peer.log", 'gone@remote.test');
is(scalar @gone, 1, 'one line for the refused recipient');
like($gone[0], qr/, dsn=5\.1\.1, status=bounced \(550 5\.1\.1 <gone\@remote\.test>: no such user\), row=$gone$/,
	'... status=bounced with the reply');
like(slurp("$tmp/peer.log"), qr/pepsi\/bounce\[\d+\]: $gone: sender non-delivery notification: \w+ \(row $gone: \w+ DSN to <sender\@local\.test>/,
	'the bounce stage logs the DSN it makes');
is($node->safe_psql('postgres',
	"SELECT string_agg(detail ->> 'status', ' ' ORDER BY id) FROM pepsi.mail_log WHERE workqueue_id = $slow"),
	'deferred sent', 'mail_log: the slow row deferred, then sent');
is($node->safe_psql('postgres',
	"SELECT (detail ->> 'kind') || ' ' || (detail ->> 'to') || ' ' || (detail ->> 'final_recipient')"
	  . " FROM pepsi.mail_log WHERE event = 'dsn' AND workqueue_id = $gone"),
	'failure sender@local.test gone@remote.test', 'mail_log: the DSN the bounce stage made');
# The dispatcher counted the attempts from the workers' status lines.
is($node->safe_psql('postgres',
	"SELECT deliveries_sent || ' sent, ' || deliveries_deferred || ' deferred, ' || deliveries_bounced"
	  . " || ' bounced' FROM pepsi.stage_stats WHERE stage = 'smarthost'"),
	'2 sent, 1 deferred, 1 bounced', 'pepsi.stage_stats counts the attempts by status (for /metrics)');

# LOG_FORMAT = json: one object per line, the fields as members.
$sink = start_sink('-c');
$config = delivery_config($node, maildir_root => $root, smarthost => "127.0.0.1:$sink->{port}",
	pepsi => { LOG_FORMAT => 'json' });
$d = start_dispatcher($config, log => "$tmp/json.log");
inject($node, to => ['json@remote.test']);
ok(poll_until(sub { queue_count($node) == 0 }), 'delivered with JSON logs');
stop_dispatcher($d);
stop_process($sink);
my ($json_line) = grep { /json\@remote\.test/ } split /\n/, slurp("$tmp/json.log");
my $event = eval { decode_json($json_line) };
ok($event, 'the delivery line is one JSON object') or diag $json_line;
is($event->{status}, 'sent', '... with status');
is($event->{to}, 'json@remote.test', '... to');
like($event->{relay}, qr/^127\.0\.0\.1\[127\.0\.0\.1\]:\d+$/, '... relay');
is(ref $event->{delays}, 'HASH', '... and the delays by name');
is($event->{program}, 'pepsi-stage-relay-to-smarthost', '... and the program');
is($event->{tag}, 'pepsi/smtp', '... and its tag');
my @other = grep { !/^\{/ } split /\n/, slurp("$tmp/json.log");
is(scalar @other, 0, 'every line of the log is JSON') or diag explain \@other;

# A bad LOG_FORMAT is refused naming the option.
$config = delivery_config($node, maildir_root => $root, pepsi => { LOG_FORMAT => 'xml' });
$d = start_dispatcher($config, log => "$tmp/bad.log");
isnt(dispatcher_exit($d, 20), 0, 'a bad LOG_FORMAT stops the dispatcher');
like(slurp("$tmp/bad.log"), qr/\[pepsi\] LOG_FORMAT = xml: LOG_FORMAT is one of "text" or "json"/, '... saying why');

done_testing();
