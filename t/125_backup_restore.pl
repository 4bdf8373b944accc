# Backups keep the mail: pg_dump of a database whose queue holds about a
# hundred messages in every status, restored with pg_restore into a new
# cluster, gives back every row, body, setting, account and log entry, and
# sequences past the restored ids; daemons started on the restored
# cluster then deliver each message in a deliverable status exactly once
# (pending and running at once, paused when they fall due) and leave the
# failed, timed-out and held rows as they were.  A dump of another version
# of the extension is refused with what to do, and nothing half-restored.
# docs/backup.md is the procedure this follows.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes ();

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-dispatch is not built' unless -x pepsi_bin('pepsi-dispatch');

my $db = 'postgres';
my $tmp = PostgreSQL::Test::Utils::tempdir();

# The tables a restore must give back row for row, and the sequences that
# number their rows.
my @tables = qw(workqueue workqueue_body config_override settings virtual_mailbox
  admin_account api_token mail_log event_log stage_stats destination schema_version);
my @sequences = qw(workqueue_id_seq workqueue_body_id_seq pending_seq event_log_id_seq
  mail_log_id_seq api_token_id_seq);

# Every row of pepsi.$table as text, in a fixed order.
sub rows
{
	my ($node, $table) = @_;
	return $node->safe_psql($db, "SELECT string_agg(t::text, E'\\n' ORDER BY t::text) FROM pepsi.$table t");
}

sub sequence_value
{
	my ($node, $sequence) = @_;
	return $node->safe_psql($db, "SELECT last_value || ' ' || is_called FROM pepsi.$sequence");
}

# Admit $count messages at init to $to, each with its own token in the
# subject and body; returns the ids (in token order) and remembers each
# token by id in %$tokens.
sub admit
{
	my ($node, $tokens, $kind, $count, $to) = @_;
	# One statement for all of them (a psql start per message was most of
	# this file's time); admitted in token order.
	my @ids = split /\n/,
	  $node->safe_psql($db,
		    "SELECT pepsi.workqueue_add('sender\@local.test', ARRAY['$to'],"
		  . " convert_to(E'From: <sender\@local.test>\\r\\nTo: <$to>\\r\\nSubject: token $kind-' || i || E'\\r\\n', 'UTF8'),"
		  . " convert_to(E'body of $kind-' || i || E'\\r\\n', 'UTF8'), '{}', '192.0.2.7')"
		  . " FROM generate_series(1, $count) AS i ORDER BY i");
	die "admitted " . scalar(@ids) . " of $count" unless @ids == $count;
	$tokens->{ $ids[ $_ - 1 ] } = "$kind-$_" for 1 .. $count;
	return @ids;
}

# Claim exactly the rows @ids at init (they are the only pending ones there).
sub claim_all
{
	my ($node, @ids) = @_;
	my $claimed = $node->safe_psql($db,
		"SELECT string_agg(id::text, ',' ORDER BY id) FROM pepsi.workqueue_claim(ARRAY['init'], ARRAY[1000])");
	die "claimed $claimed, not @ids" unless $claimed eq join(',', sort { $a <=> $b } @ids);
}

sub run_tool
{
	my (@command) = @_;
	my ($out, $err) = ('', '');

	IPC::Run::run(\@command, '<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(120));
	return ($? >> 8, $out, $err);
}

#
# The source: a queue in every status, and every kind of state beside it.
#
# (No maintenance worker: the paused rows must still be paused in the dump.)
my $source = pepsi_node('backup_source', extension => 1);
my %token;
my %ids;
my $remote = 'user@remote.test';

# running: claimed by a worker when the dump is taken
$ids{running} = [ admit($source, \%token, 'running', 15, $remote) ];
claim_all($source, @{ $ids{running} });
# paused, due 25 seconds from now (after the restore), and paused for an hour
$ids{paused_soon} = [ admit($source, \%token, 'soon', 10, $remote) ];
$ids{paused_later} = [ admit($source, \%token, 'later', 5, $remote) ];
$ids{failed} = [ admit($source, \%token, 'failed', 10, $remote) ];
$ids{timeout} = [ admit($source, \%token, 'timeout', 5, $remote) ];
claim_all($source, map { @{ $ids{$_} } } qw(paused_soon paused_later failed timeout));
# (Each list of rows in one statement, each row in its own call.)
sub id_list { return 'ARRAY[' . join(',', @{ $_[0] }) . ']::bigint[]' }
$source->safe_psql($db,
	"SELECT count(pepsi.workqueue_pause(id, 'init', 25, '{\"attempts\": 1}')) FROM unnest("
	  . id_list($ids{paused_soon}) . ') AS id');
$source->safe_psql($db,
	"SELECT count(pepsi.workqueue_pause(id, 'init', 3600)) FROM unnest(" . id_list($ids{paused_later}) . ') AS id');
$source->safe_psql($db,
	"SELECT count(pepsi.workqueue_commit(id, 'init', 'fail', merge_state => '{\"error\": \"550 no\"}'))"
	  . ' FROM unnest(' . id_list($ids{failed}) . ') AS id');
my $timeout_list = join ',', @{ $ids{timeout} };
$source->safe_psql($db,
	    "SELECT pepsi.workqueue_recover(ARRAY[$timeout_list], array_fill('init'::text, ARRAY["
	  . scalar(@{ $ids{timeout} })
	  . "]), 'timeout', 'MAX_RUNTIME')");
# one message to three recipients split into rows sharing its body
my ($split) = admit($source, \%token, 'split', 1, $remote);
$source->safe_psql($db,
	"UPDATE pepsi.workqueue SET rcpt_to = ARRAY['a\@remote.test', 'b\@remote.test', 'c\@remote.test'] WHERE id = $split");
claim_all($source, $split);
$ids{split} = [ $split, split /,/,
	  $source->safe_psql($db, "SELECT array_to_string(pepsi.workqueue_split_one_per_row($split, 'init'), ',')") ];
is( $source->safe_psql($db,
		"SELECT count(DISTINCT body_id) || ' ' || count(*) FROM pepsi.workqueue WHERE id IN (" . join(',', @{ $ids{split} }) . ")"),
	'1 3', 'source: the split rows share one body');
$token{$_} = 'split-1' for @{ $ids{split} };
# held by an operator, and pending
$ids{held} = [ admit($source, \%token, 'held', 10, $remote) ];
$source->safe_psql($db, "SELECT pepsi.queue_hold(ARRAY[" . join(',', @{ $ids{held} }) . "])");
$ids{pending} = [ admit($source, \%token, 'pending', 40, $remote) ];

is( $source->safe_psql($db, "SELECT string_agg(status || ':' || n, ' ' ORDER BY status) FROM"
		  . " (SELECT status, count(*) AS n FROM pepsi.workqueue GROUP BY 1) s"),
	'pending:42 running:16 paused:25 failed:10 timeout:5',
	'source: 98 rows in every status (the paused count the held ones)');

# The operator's state beside the queue.
$source->safe_psql($db, <<'SQL');
SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '1s');
SELECT pepsi.virtual_mailbox_add('Dave@Local.test');
SELECT pepsi.admin_account_set('admin', '$argon2id$v=19$m=65536,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA');
SELECT pepsi.api_token_create('monitoring');
SELECT pepsi.destination_set_limits('remote.test', 5, 6000);
INSERT INTO pepsi.settings (address, option, value) VALUES ('dave@local.test', 'VACATION', 'yes');
INSERT INTO pepsi.mail_log (workqueue_id, event) SELECT id, 'received' FROM pepsi.workqueue;
INSERT INTO pepsi.stage_stats (stage, messages) VALUES ('init', 42);
SQL
my %before = map { $_ => rows($source, $_) } @tables;
my %before_seq = map { $_ => sequence_value($source, $_) } @sequences;
my $max_id = $source->safe_psql($db, 'SELECT max(id) FROM pepsi.workqueue');
my $max_seq = $source->safe_psql($db, 'SELECT max(pending_seq) FROM pepsi.workqueue');
my %paused_until = split /[|\n]/,
  $source->safe_psql($db,
	"SELECT id || '|' || extract(epoch FROM timeout) FROM pepsi.workqueue WHERE id IN ("
	  . join(',', @{ $ids{paused_soon} }) . ')');

#
# pg_dump, as docs/backup.md says.
#
my $dump = "$tmp/pepsi.dump";
my ($rc, $out, $err) = run_tool('pg_dump', '-h', $source->host, '-p', $source->port,
	'-Fc', '-f', $dump, $db);
is($rc, 0, 'pg_dump of the source database') or diag($err);

# A dump of another pepsi version (what a later release's dump looks like
# here: its schema_version row says so).
$source->safe_psql($db, "CREATE DATABASE other");
$source->safe_psql('other', 'CREATE EXTENSION pepsi');
$source->safe_psql('other', "UPDATE pepsi.schema_version SET version = '9.9'");
$source->safe_psql('other', "SELECT pepsi.workqueue_add('s\@local.test', ARRAY['$remote'], ''::bytea, 'x'::bytea, '{}')");
my $other_dump = "$tmp/other.dump";
($rc, $out, $err) = run_tool('pg_dump', '-h', $source->host, '-p', $source->port,
	'-Fc', '-f', $other_dump, 'other');
is($rc, 0, 'pg_dump of a database of another pepsi version') or diag($err);
$source->stop;

#
# pg_restore into a new cluster.
#
# Without the maintenance worker until the restored rows are compared: it
# would requeue the paused rows as they fall due.
my $target = pepsi_node('backup_target');
($rc, $out, $err) = run_tool('pg_restore', '-h', $target->host, '-p', $target->port,
	'--single-transaction', '-d', $db, $dump);
is($rc, 0, 'pg_restore into the new cluster') or diag($err);
is($err, '', 'without a warning or an error');

for my $table (@tables)
{
	is(rows($target, $table), $before{$table}, "every row of pepsi.$table is restored as it was");
}
for my $sequence (@sequences)
{
	is(sequence_value($target, $sequence), $before_seq{$sequence}, "pepsi.$sequence is restored");
}
is($target->safe_psql($db, 'SELECT count(*) FROM pepsi.dispatch_stats'),
	1, 'the seeded dispatch_stats row is not duplicated');
is($target->safe_psql($db, 'SELECT count(*) FROM pepsi.grant_verify()'),
	0, 'the grants are the policy\'s');

# The queue is live: a new message is numbered past every restored one.
my ($new) = admit($target, \%token, 'new', 1, $remote);
ok($new > $max_id, 'a message admitted after the restore gets an id past the restored ones');
ok($target->safe_psql($db, "SELECT pending_seq FROM pepsi.workqueue WHERE id = $new") > $max_seq,
	'and a pending_seq past theirs');

#
# The daemons on the restored cluster deliver what is deliverable, once.
#
$target->append_conf('postgresql.conf',
	"shared_preload_libraries = 'pepsi'\npepsi.database = '$db'\npepsi.maintenance_interval = '100ms'\n");
$target->restart;
my $root = PostgreSQL::Test::Utils::tempdir();
my $sink = start_sink();
my $config = delivery_config($target, maildir_root => $root, smarthost => "127.0.0.1:$sink->{port}",
	extra => { init => "PARALLELISM = 4\n", smarthost => "PARALLELISM = 4\n" });
# The restored retry times are the source's (compared above).  Those not
# yet reached are brought to a few seconds from now, so that the file does
# not idle until the source's 25 s are up; they must still not be reached
# early.
my %nearer = split /[|\n]/,
  $target->safe_psql($db,
	"UPDATE pepsi.workqueue SET timeout = now() + interval '3 seconds' WHERE id IN ("
	  . join(',', @{ $ids{paused_soon} })
	  . ") AND status = 'paused' AND timeout > now() + interval '3 seconds'"
	  . " RETURNING id || '|' || extract(epoch FROM timeout)");
@paused_until{ keys %nearer } = values %nearer;
my $d = start_dispatcher($config);

# Each message the sink received, by its token.
sub delivered
{
	my %n;
	for my $file (glob("$sink->{dir}/mail/*"))
	{
		my $text = slurp($file) // '';
		$n{$1}++ while $text =~ /^Subject: token (\S+)\r?$/mg;
	}
	return \%n;
}

# Whether every message of %expected reached the sink as often as
# expected, polled for at most $seconds.
my %expected;
sub all_delivered
{
	my ($seconds) = @_;
	return poll_until(
		sub {
			my $n = delivered();
			return (grep { ($n->{$_} // 0) < $expected{$_} } keys %expected) ? 0 : 1;
		},
		$seconds);
}

my @deliverable = map { @{ $ids{$_} } } qw(pending running paused_soon split);
$expected{ $token{$_} }++ for @deliverable, $new;
ok(all_delivered(90), 'every pending, running, due and split message is delivered');
ok( poll_until(sub { $target->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue') == 30 }, 30),
	'and finished: the queue holds only the rows that were not deliverable')
  or diag($target->safe_psql($db, "SELECT string_agg(id || ':' || stage || ':' || status, ' ') FROM pepsi.workqueue"));
my %mtime;
for my $file (glob("$sink->{dir}/mail/*"))
{
	my $text = slurp($file) // '';
	$mtime{$1} = (stat $file)[9] if $text =~ /^Subject: token (soon-\d+)\r?$/m;
}
my $early = grep { $mtime{ $token{$_} } < int($paused_until{$_}) } @{ $ids{paused_soon} };
is($early, 0, 'no paused message is delivered before its retry time');

is( $target->safe_psql($db,
		"SELECT string_agg(status || ':' || n, ' ' ORDER BY status) FROM"
		  . " (SELECT status, count(*) AS n FROM pepsi.workqueue GROUP BY 1) s"),
	'paused:15 failed:10 timeout:5',
	'the failed, timed-out, held and later rows are left');
my $left = join ',', map { @{ $ids{$_} } } qw(failed timeout held paused_later);
is( $target->safe_psql($db,
		"SELECT string_agg(t::text, E'\\n' ORDER BY t::text) FROM pepsi.workqueue t WHERE id IN ($left)"),
	join("\n", grep { /^\((\d+),/ && ",$left," =~ /,$1,/ } split /\n/, $before{workqueue}),
	'each exactly as it was in the source');

# Resumed, the rows paused for an hour are delivered too.
$target->safe_psql($db, "SELECT pepsi.workqueue_resume(ARRAY[" . join(',', @{ $ids{paused_later} }) . "])");
$expected{ $token{$_} }++ for @{ $ids{paused_later} };
ok(all_delivered(60), 'the rows paused for an hour are delivered once resumed');
ok(poll_until(sub { $target->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue') == 25 }, 30),
	'and finished');

my $n = delivered();
my @twice = grep { $n->{$_} > $expected{$_} } sort keys %$n;
is_deeply(\@twice, [], 'no message is delivered twice');
my @unexpected = grep { !$expected{$_} } sort keys %$n;
is_deeply(\@unexpected, [], 'and no failed, timed-out or held message is delivered');
is(scalar(keys %$n), scalar(keys %expected), 'the sink received every expected message');
stop_dispatcher($d);

#
# Bad input: a dump of another pepsi version says what to do, and the
# single-transaction restore leaves nothing behind.
#
$target->safe_psql($db, 'CREATE DATABASE fresh');
($rc, $out, $err) = run_tool('pg_restore', '-h', $target->host, '-p', $target->port,
	'--single-transaction', '-d', 'fresh', $other_dump);
isnt($rc, 0, 'pg_restore of a dump of another pepsi version fails');
like($err, qr/this dump holds pepsi 9\.9 data, and this database has pepsi \d+\.\d+/,
	'saying which versions differ');
like($err, qr/HINT:.*CREATE EXTENSION pepsi VERSION '9\.9'.*ALTER EXTENSION pepsi UPDATE/,
	'and what to do');
is($target->safe_psql('fresh', "SELECT count(*) FROM pg_namespace WHERE nspname = 'pepsi'"),
	0, 'nothing of it is left in the database');

$target->stop;
done_testing();
