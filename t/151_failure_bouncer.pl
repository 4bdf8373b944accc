# pepsi-failure-bouncer end to end, under pepsi-dispatch with the real
# bounce stage: failed and timed-out rows older than MAX_AGE are bounced
# exactly once (the DSN reaches the sender's Maildir through the bounce
# stage, dsn-route and dsn-maildir), a null-sender one is deleted with a
# log line, younger ones are left; each action is in pepsi.event_log as
# pepsi-queue's would be; --policy delete deletes without a DSN; a second
# run finds nothing; bad options are refused with the reason.

use strict;
use warnings FATAL => 'all';

use IPC::Run qw(run);
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = delivery_node('failure_bouncer');
$node->safe_psql($db, 'CREATE ROLE operator LOGIN IN ROLE pepsi_config');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
my $other = 'other@local.test';
make_mailbox($root, $_) for $sender, $other;

# The pipeline's configuration, and the tool's: the same file with the
# operator's connection and [failure-bouncer].
my $config = delivery_config($node, maildir_root => $root,
	sections => "[failure-bouncer]\nMAX_AGE = 1h\n");
my $tool_config = operator_config($node, $config, 'operator');

sub sql { return $node->safe_psql($db, shift); }

# bouncer ARGS...: (exit code, stdout, stderr).
sub bouncer
{
	my ($out, $err) = ('', '');
	local $ENV{PEPSI_LOG} = 'stderr';
	run([ pepsi_bin('pepsi-failure-bouncer'), '-C', $tool_config, @_ ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

# A row at stage smarthost left $status $age ago, as the delivery stage or
# the dispatcher would have left it.
sub stranded
{
	my (%m) = @_;
	my $id = inject($node, from => $m{from}, to => [ $m{to} ], quiet => 1,
		headers => "From: <" . ($m{from} || 'mailer-daemon@local.test') . ">\r\nTo: <$m{to}>\r\n"
		  . "Subject: $m{subject}\r\n");
	sql("UPDATE pepsi.workqueue SET stage = 'smarthost', status = '$m{status}',"
		  . " received_at = now() - interval '$m{age}',"
		  . " state = state || '{\"last_error\": \"$m{error}\"}' WHERE id = $id");
	return $id;
}

my $old_failed = stranded(from => $sender, to => 'gone@remote.test', status => 'failed', age => '3 hours',
	subject => 'old failed', error => '550 5.1.1 <gone@remote.test>: no such user');
my $old_timeout = stranded(from => $sender, to => 'slow@remote.test', status => 'timeout', age => '2 hours',
	subject => 'old timeout', error => 'stage smarthost timed out');
my $old_null = stranded(from => '', to => 'someone@remote.test', status => 'failed', age => '5 hours',
	subject => 'old dsn', error => '550 5.1.1 no such user');
my $young = stranded(from => $sender, to => 'new@remote.test', status => 'failed', age => '10 minutes',
	subject => 'young', error => '550 5.1.1 no such user');
my $old_paused = stranded(from => $sender, to => 'later@remote.test', status => 'failed', age => '4 hours',
	subject => 'paused', error => 'x');
sql("UPDATE pepsi.workqueue SET status = 'paused', timeout = 'infinity' WHERE id = $old_paused");

my $d = start_dispatcher($config);

# --dry-run: what it would do, nothing done.
my ($rc, $out, $err) = bouncer('--dry-run');
is($rc, 0, '--dry-run succeeds') or diag $err;
like($out, qr/^dry run: 2 bounced, 1 deleted$/m, '--dry-run counts two bounces and one deletion');
is(sql('SELECT count(*) FROM pepsi.workqueue WHERE status IN (\'failed\', \'timeout\')'), '4',
	'--dry-run changes nothing');

($rc, $out, $err) = bouncer();
is($rc, 0, 'the run succeeds') or diag $err;
is($out, "2 bounced, 1 deleted\n", 'it says what it did');
like($err, qr/^pepsi\/failure-bouncer\[\d+\]: \S+: from=<>, stage=smarthost, status=failed: deleted \(null sender, never bounced\)/m,
	'the null-sender row is deleted, with a log line');
like($err, qr/from=<\Q$sender\E>, stage=smarthost, status=timeout: bounced to the sender/m,
	'the timed-out row is bounced, with a log line');
is(sql("SELECT count(*) FROM pepsi.workqueue WHERE id = $old_null"), '0', 'the null-sender row is gone');
is(sql("SELECT stage || '|' || status FROM pepsi.workqueue WHERE id = $young"), 'smarthost|failed',
	'the young failed row is left as it was');
is(sql("SELECT stage || '|' || status FROM pepsi.workqueue WHERE id = $old_paused"), 'smarthost|paused',
	'a held row is not the bouncer\'s');

ok(poll_until(sub { scalar(maildir_files($root, $sender)) >= 2 && queue_count($node) == 2 }, 60),
	'two DSNs reach the sender\'s mailbox through the bounce stage');
my %dsn;
for my $file (maildir_files($root, $sender))
{
	my $entity = parse_dsn(slurp($file));
	my ($message, $recipients) = dsn_fields($entity);
	$dsn{ $recipients->[0]{'final-recipient'} } = $recipients->[0];
	like($entity->head->get('Subject'), qr/^Undelivered Mail Returned to Sender$/, 'a failure DSN');
}
is_deeply([ sort keys %dsn ], [ 'rfc822; gone@remote.test', 'rfc822; slow@remote.test' ],
	'one for each bounced message');
is($dsn{'rfc822; gone@remote.test'}{status}, '5.1.1', 'the failed one keeps its error\'s status');
is($dsn{'rfc822; slow@remote.test'}{status}, '5.4.7', 'the timed-out one says the delivery time expired');
like($dsn{'rfc822; gone@remote.test'}{'diagnostic-code'}, qr/failed at stage smarthost and not delivered after .*550 5\.1\.1/,
	'the Diagnostic-Code says where it failed, for how long, and why');
like(dispatcher_log($d), qr/failure DSN to <\Q$sender\E>/, 'the bounce stage logs the DSNs');

is(sql("SELECT string_agg(action || ':' || (detail ->> 'ids'), ' ' ORDER BY id) FROM pepsi.event_log"
	  . " WHERE action IN ('queue_bounce', 'queue_delete')"),
	"queue_bounce:[$old_failed] queue_bounce:[$old_timeout] queue_delete:[$old_null]",
	'each action is in pepsi.event_log, as pepsi-queue\'s');
is(sql("SELECT principal || '|' || (detail ->> 'bounced') || '|' || (detail ->> 'deleted')"
	  . " FROM pepsi.event_log WHERE action = 'failure_bounce'"),
	'operator|2|1', 'and the run, by the operator');

# Exactly once: a second run finds nothing, and no DSN follows.
($rc, $out, $err) = bouncer();
is($out, "0 bounced, 0 deleted\n", 'a second run finds nothing');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action IN ('queue_bounce', 'queue_delete')"), '3',
	'and logs nothing');
is(queue_count($node), '2', 'the queue holds only the young and the held row');
is(scalar(maildir_files($root, $sender)), 2, 'still two DSNs');

# --policy delete: no DSN.
my $to_delete = stranded(from => $other, to => 'x@remote.test', status => 'failed', age => '2 hours',
	subject => 'delete me', error => '550 5.1.1 no such user');
($rc, $out, $err) = bouncer('--policy', 'delete');
is($out, "0 bounced, 1 deleted\n", '--policy delete deletes');
like($err, qr/from=<\Q$other\E>, stage=smarthost, status=failed: deleted \(POLICY = delete\)/, '... with a log line');
is(sql("SELECT count(*) FROM pepsi.workqueue WHERE id = $to_delete"), '0', '... the row is gone');

# --older-than overrides MAX_AGE: the young row is now old enough.
($rc, $out, $err) = bouncer('--older-than', '5m');
is($out, "1 bounced, 0 deleted\n", '--older-than 5m takes the 10-minute-old row');
ok(poll_until(sub { scalar(maildir_files($root, $sender)) == 3 && queue_count($node) == 1 }, 60),
	'and its DSN arrives');

# Bad options: refused with the reason, nothing done.
my $events = sql('SELECT count(*) FROM pepsi.event_log');
for my $bad ([ [ '--older-than', 'soon' ], 64, qr/--older-than takes a duration/ ],
	[ [ '--policy', 'keep' ], 64, qr/--policy is bounce or delete, not "keep"/ ],
	[ [ '--max-rows', '0' ], 64, qr/--max-rows takes a whole number from 1 to 100000/ ],
	[ [ '--bounce-stage', 'Bad Stage' ], 65, qr/invalid bounce stage name "Bad Stage"/ ],
	[ ['extra'], 64, qr/takes no argument, not "extra"/ ])
{
	($rc, $out, $err) = bouncer(@{ $bad->[0] });
	is($rc, $bad->[1], "@{ $bad->[0] }: exit $bad->[1]");
	like($err, $bad->[2], '... naming the problem');
}
is(sql('SELECT count(*) FROM pepsi.event_log'), $events, 'no refused run logged anything');

is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
done_testing();
