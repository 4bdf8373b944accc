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
# call (pepsi.quota_record_many), not one a delivery.

use strict;
use warnings FATAL => 'all';

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
sql(q{SELECT pepsi.quota_record('bob@x.test', 10, 1, 0, 0, true, '{}')});
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
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
make_mailbox($root, 'dan@local.test');
sql(q{SELECT pepsi.quota_set('dan@local.test', 1000000, NULL, 100)});
my $config = delivery_config($node, maildir_root => $root, path => "$tmp/pepsi.conf",
	extra => { maildir => "PARALLELISM = 1\n" });
inject($node, to => ['dan@local.test'], headers => "From: <s\@local.test>\r\nSubject: batch $_\r\n") for 1 .. 6;
my $d = start_dispatcher($config);
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

done_testing();
