# What issue 39's secretary and quotas do at scale, each with the real
# extension and, for the maildir stage, the real dispatcher, stage and
# writer: pepsi.quota_usage keeps each mailbox's full state (is_full,
# daily_full_on) at each write and again when its own or its domain's
# limits change, and pepsi.quota_full reads only the full ones;
# pepsi.quota_delivered counts the LMTP path's deliveries against
# max_daily; pepsi.secretary_decide_many decides a batch of rows as
# secretary_decide decides each (a whitelisted sender passes, one
# challenge for a sender's several messages, a bad owner refused by
# name); pepsi-stage-relay-to-maildir records a batch's uses with one
# call (pepsi.quota_record_many), not one a delivery; pepsi-quota
# installed set-group-id (root:the writer's caller group, 2755) recounts a
# system user's Maildir, whose files only that user may read, for an
# operator outside the group, through the set-user-id writer beside it,
# and a copy without the bit cannot.  Needs root (RootTest).

use strict;
use warnings FATAL => 'all';

use RootTest;

use File::Basename qw(dirname);
use File::Copy qw(copy);
use File::Temp ();
use IPC::Run ();
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('owner_scale');
my $db = 'postgres';
sub sql { return $node->safe_psql($db, shift) }

# 1. The full state kept at each write, and when limits change.
sql(q{SELECT pepsi.quota_set('ann@x.test', 1000, NULL, NULL)});
sql(q{SELECT pepsi.quota_record('ann@x.test', 2000, 3, 0, 0, true, '{}')});
sql(q{SELECT pepsi.quota_record('bob@x.test', 10, 1, 0, 0, false, '{}')});
is(sql(q{SELECT string_agg(address || ':' || is_full, ',' ORDER BY address) FROM pepsi.quota_usage}),
	'ann@x.test:true,bob@x.test:false', 'quota_usage.is_full: ann over her 1000 bytes, bob under no limit');
is(sql(q{SELECT string_agg(a, ',' ORDER BY a) FROM pepsi.quota_full() a}), 'ann@x.test', 'quota_full: ann');
sql(q{SELECT pepsi.quota_unset('ann@x.test')});
is(sql(q{SELECT is_full FROM pepsi.quota_usage WHERE address = 'ann@x.test'}), 'f',
	'her limit removed: no longer full');
is(sql(q{SELECT count(*) FROM pepsi.quota_full()}), '0', 'quota_full: nobody');
sql(q{SELECT pepsi.quota_set('@x.test', NULL, 2, NULL)});
is(sql(q{SELECT string_agg(address || ':' || is_full, ',' ORDER BY address) FROM pepsi.quota_usage}),
	'ann@x.test:true,bob@x.test:false', 'a domain limit of 2 messages: ann (3) full again, bob (1) not');
is(sql(q{SELECT string_agg(a, ',' ORDER BY a) FROM pepsi.quota_full() a}), 'ann@x.test',
	'quota_full follows the domain\'s row');

# ... the daily limit, counted by quota_delivered (the LMTP path).
sql(q{SELECT pepsi.quota_set('bob@x.test', NULL, NULL, 2)});
is(sql(q{SELECT pepsi.quota_delivered('["bob@x.test", "Carl@y.test"]')}), '1',
	'quota_delivered counts bob (a max_daily), not carl (no limit)');
is(sql(q{SELECT count(*) FROM pepsi.quota_usage WHERE address = 'carl@y.test'}), '0', 'no row for carl');
is(sql(q{SELECT daily_full_on IS NULL FROM pepsi.quota_usage WHERE address = 'bob@x.test'}), 't',
	'bob, one of two today: not full');
sql(q{SELECT pepsi.quota_delivered('["BOB@x.test"]')});
is(sql(q{SELECT day_messages || ' ' || (daily_full_on = current_date) FROM pepsi.quota_usage WHERE address = 'bob@x.test'}),
	'2 true', 'his second today: done for the day');
is(sql(q{SELECT string_agg(a, ',' ORDER BY a) FROM pepsi.quota_full() a}), 'ann@x.test,bob@x.test',
	'quota_full: ann and bob');
sql(q{UPDATE pepsi.quota_usage SET day = current_date - 1 WHERE address = 'bob@x.test'});
is(sql(q{SELECT string_agg(a, ',' ORDER BY a) FROM pepsi.quota_full() a}), 'ann@x.test',
	'a day later bob takes mail again');
my ($rc, $out, $err) = $node->psql($db, q{SELECT pepsi.quota_delivered('{"a": 1}')});
like($err, qr/the addresses must be a JSON array, not object/, 'quota_delivered: not an array, named');

# 2. The secretary's batched decision.
sql(q{INSERT INTO pepsi.whitelist (owner, sender, source) VALUES ('own@x.test', 'friend@s.test', 'operator')});
my $answers = sql(q{SELECT string_agg((a->>'action') || ':' || (a->>'token' IS NOT NULL), ',' ORDER BY o)
	FROM jsonb_array_elements(pepsi.secretary_decide_many('[
	{"owner": "own@x.test", "sender": "stranger@s.test", "row_id": 901, "verified": true},
	{"owner": "Own@x.test", "sender": "friend@s.test", "row_id": 902, "verified": true},
	{"owner": "own@x.test", "sender": "stranger@s.test", "row_id": 903, "verified": true}]', '1 day', 10))
	WITH ORDINALITY AS x (a, o)});
is($answers, 'hold:true,pass:false,hold:false',
	'secretary_decide_many: answers in order: the stranger held and challenged, the friend passes, '
	  . 'the stranger\'s second held without a second challenge');
is(sql(q{SELECT string_agg(row_id::text, ',' ORDER BY row_id) FROM pepsi.secretary_held}), '901,903',
	'both of the stranger\'s rows recorded as held');
is(sql(q{SELECT count(*) FROM pepsi.secretary_challenge WHERE challenged_at IS NOT NULL}), '1', 'one challenge');
($rc, $out, $err) = $node->psql($db, q{SELECT pepsi.secretary_decide_many('[
	{"owner": "own@x.test", "sender": "other@s.test", "row_id": 904, "verified": true},
	{"owner": "no owner", "sender": "other@s.test", "row_id": 905, "verified": true}]', '1 day', 10)});
like($err, qr/invalid address "no owner"/, 'a bad owner in the batch: refused, named');
is(sql(q{SELECT count(*) FROM pepsi.secretary_held WHERE row_id IN (904, 905)}), '0', 'and nothing of it recorded');

# 3. The maildir stage records a batch's uses with one call.
$node->append_conf('postgresql.conf', "track_functions = 'all'");
$node->reload;
my $shared = shared_dir();
my $root = "$shared/maildir";
make_mailbox($root, 'dan@local.test');
system('chown', '-R', cluster_user() . ':', $root) == 0 or die 'chown';
chmod 0755, $node->host;
sql(q{SELECT pepsi.quota_set('dan@local.test', 1000000, NULL, 100)});
my $config = delivery_config($node, maildir_root => $root, path => "$shared/pepsi.conf",
	extra => { maildir => "PARALLELISM = 1\n" });
chmod 0644, $config;
inject($node, to => ['dan@local.test'], headers => "From: <s\@local.test>\r\nSubject: batch $_\r\n") for 1 .. 6;
my $d = start_dispatcher($config, log => "$shared/dispatch.log",
	program => [ as_cluster_user(pepsi_bin('pepsi-dispatch')) ]);
ok(poll_until(sub { maildir_files($root, 'dan@local.test') == 6 && queue_count($node) == 0 }),
	'six messages delivered to dan');
is(sql(q{SELECT messages || ' ' || day_messages FROM pepsi.quota_usage WHERE address = 'dan@local.test'}), '6 6',
	'his use recorded: six messages, six today');
my $calls = sub {
	return sql(q{SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'quota_record_many'), 0) || ' '
		|| coalesce(sum(calls) FILTER (WHERE funcname = 'quota_record'), 0)
		FROM pg_stat_user_functions WHERE schemaname = 'pepsi'});
};
ok(poll_until(sub { ($calls->() =~ /^(\d+) (\d+)$/)[1] >= 6 }), 'the statistics have the six records')
  or diag($calls->());
my ($many, $each) = $calls->() =~ /^(\d+) (\d+)$/;
ok($many >= 1 && $many < 6, "the stage recorded them in batches: $many call(s) of quota_record_many for $each records");
is(stop_dispatcher($d), 0, 'the dispatcher stops');

# 4. pepsi-quota recount set-group-id, as make install lays it out.
my $tag = $$ % 1000000;
my $group = "pq${tag}g";
my $gid = add_system_group($group);
my $homes = "$shared/home";
mkdir $homes;
my $owner = "pq${tag}own";
my $operator = "pq${tag}op";
add_system_user($_, $homes) for $owner, $operator;
my $etc = File::Temp::tempdir('pepsi-quota-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $etc;
install_privileged(dirname(pepsi_bin('pepsi-dispatch')), "$etc/bin", $group, 'pepsi-helper-maildir-writer',
	'pepsi-quota');
my @st = stat "$etc/bin/pepsi-quota";
is(sprintf('%o %d %d', $st[2] & 07777, $st[4], $st[5]), "2755 0 $gid",
	'pepsi-quota installed set-group-id to the writer\'s caller group');
my $maildir = "$homes/$owner/Maildir";
mkdir $_ for $maildir, map { "$maildir/$_" } qw(tmp new cur);
for my $i (1 .. 3)
{
	open my $fh, '>', "$maildir/cur/$i.m$i.host:2,S" or die;
	print $fh 'x' x (1000 * $i);
	close $fh;
}
system('chown', '-R', "$owner:$owner", $maildir) == 0 or die 'chown';
chmod 0700, $maildir, map { "$maildir/$_" } qw(tmp new cur);
chmod 0600, glob("$maildir/cur/*");
sql(qq{CREATE ROLE "$operator" LOGIN IN ROLE pepsi_config});
open my $cfh, '>', "$etc/pepsi.conf" or die;
print $cfh "[database]\nCONFIG_CONNINFO = host=" . $node->host . " port=" . $node->port
  . " dbname=$db user=$operator\n"
  . "[maildir-writer]\nCALLER_GROUP = $group\nMAILBOXES = system\nHOME_ROOTS = $homes\n"
  . "[stage-maildir]\nPROGRAM = pepsi-stage-relay-to-maildir\nMAILDIR_ROOT = $root\n";
close $cfh;
chmod 0644, "$etc/pepsi.conf";
# The same program without the bit, the installed writer beside it.
mkdir "$etc/nobit";
chmod 0755, "$etc/nobit";
copy("$etc/bin/pepsi-quota", "$etc/nobit/pepsi-quota") or die;
chmod 0755, "$etc/nobit/pepsi-quota";
symlink("$etc/bin/pepsi-helper-maildir-writer", "$etc/nobit/pepsi-helper-maildir-writer") or die;

sub as_operator
{
	my ($program, @args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'setpriv', "--reuid=$operator", "--regid=$operator", '--init-groups', '--', 'env',
		$program, '-C', "$etc/pepsi.conf", @args ], '<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	return ($? >> 8, $out, $err);
}
ok(!-r "$maildir/cur" || (stat "$maildir/cur")[4] != scalar(getpwnam($operator)), 'the operator cannot read the Maildir');
my ($qrc, $qout, $qerr) = as_operator("$etc/bin/pepsi-quota", 'recount', "$owner\@local.test");
is($qrc, 0, 'the operator, outside the group, recounts through the set-group-id pepsi-quota') or diag($qerr);
is($qout, "$owner\@local.test: 6000 bytes in 3 messages\n", 'the Maildir counted from disk: 6000 bytes in 3 messages');
is(sql(qq{SELECT bytes || ' ' || messages FROM pepsi.quota_usage WHERE address = '$owner\@local.test'}), '6000 3',
	'and recorded');
($qrc, $qout, $qerr) = as_operator("$etc/nobit/pepsi-quota", 'recount', "$owner\@local.test");
isnt($qrc, 0, 'the same program without the set-group-id bit cannot recount');
like($qerr, qr/pepsi-helper-maildir-writer|Permission denied|not in group/, 'it says why') or diag($qerr);

done_testing();
