# pepsi-stage-relay-to-internet: a slow destination's share of the stage's
# workers.  A domain whose deliveries take DESTINATION_SLOW or longer on
# average (its pepsi.destination pace) holds at most DESTINATION_SLOW_SHARE
# percent of PARALLELISM at once, so that it cannot keep most workers
# waiting on it while another domain has mail.  Here 8 workers, a share of
# 25%: two of its concurrency slots held at once at most (sampled from
# pg_locks while the slow MX host, t/bin/smtp-peer --data-delay 1, takes
# its mail), whatever the default concurrency of 20 would let it have; the
# fast domain's mail flows past it, and the slow domain gets all of its
# own without a retry counted.  Then mail for the slow domain alone: with
# no other mail waiting, the cap does not apply (more than 2 slots held).

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

my $node = delivery_node('relay_slow_destination');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $slow = start_peer('--address', '127.0.0.9', '--port', $port, '--data-delay', '1');
my $sink = start_sink_on('127.0.0.5', $port);
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
$dns->zone(TestDNS::mx('fast.test', '127.0.0.5') . TestDNS::mx('slow.test', '127.0.0.9'));

my $config = delivery_config($node, maildir_root => $root, internet => $port,
	pepsi => { DNS_FORWARDER => $dns->forwarder },
	extra => { smarthost => "PARALLELISM = 8\nQUEUE_LIMIT = 1\nDESTINATION_SLOW = 800ms\n"
		  . "DESTINATION_SLOW_SHARE = 25\nRETRY_BASE = 10m\n" });
# What earlier deliveries taught: slow.test takes a second and a half.
$node->safe_psql('postgres',
	"INSERT INTO pepsi.destination (domain, service_seconds) VALUES ('slow.test', 1.5)");
my $d = start_dispatcher($config);

sub sink_count { my @f = glob("$sink->{dir}/mail/*"); return scalar @f }
sub slow_count { return peer_count($slow) }

# The slow destination's slots held now (session advisory locks, the
# bigint form: objsubid 1).
my $slow_slots_sql = q{
	SELECT count(*) FROM pg_locks
	WHERE locktype = 'advisory' AND granted AND objsubid = 1
	  AND classid = ((pepsi.destination_slot_key('slow.test', 0) >> 32) & 4294967295)::oid};
sub slow_slots_held { return $node->safe_psql('postgres', $slow_slots_sql) }

# The slow destination's slots held at once while the fast domain still
# had mail in the queue, sampled by the server every 5 ms (a loop in one
# session, started before the mail is queued): the fast domain's 300
# messages can be through in a fraction of a second on a quiet machine,
# where a sampler in this file, a query and a directory listing a sample,
# took too few samples to see the slow domain's slots (it once saw none).
# The loop starts counting when the fast mail is first seen and ends when
# it is gone (or after 300 s); its answer is read when the mail is through.
my $sampler = $node->background_psql('postgres');
$sampler->set_query_timer_restart;    # a timeout per query, not for the session
$sampler->query_safe(q{
	CREATE TEMP TABLE slow_sample (most int, samples int);
	CREATE FUNCTION pg_temp.sample_slow_slots() RETURNS void LANGUAGE plpgsql AS $$
	DECLARE
		held int;
		fast int;
		most int := 0;
		samples int := 0;
		seen boolean := false;
		deadline timestamptz := clock_timestamp() + interval '300 s';
	BEGIN
		LOOP
			held := (SLOW_SLOTS);
			SELECT count(*) INTO fast FROM pepsi.workqueue WHERE rcpt_to[1] LIKE '%@fast.test';
			IF fast > 0 THEN
				seen := true;
				samples := samples + 1;
				most := greatest(most, held);
			END IF;
			EXIT WHEN (seen AND fast = 0) OR clock_timestamp() > deadline;
			PERFORM pg_sleep(0.005);
		END LOOP;
		INSERT INTO slow_sample VALUES (most, samples);
	END
	$$;} =~ s/SLOW_SLOTS/$slow_slots_sql/r);
$sampler->query_until(qr/sampling/, "\\echo sampling
SELECT pg_temp.sample_slow_slots();
");

# 12 messages for the slow domain among 300 for the fast one.
$node->safe_psql('postgres', q{
	SELECT pepsi.workqueue_add('sender@local.test',
		ARRAY['user' || i || CASE WHEN i % 26 = 0 THEN '@slow.test' ELSE '@fast.test' END],
		convert_to('From: <sender@local.test>' || chr(13) || chr(10) || 'Subject: m' || i
			|| chr(13) || chr(10), 'UTF8'),
		convert_to('hello' || chr(13) || chr(10), 'UTF8'), '{}'::jsonb)
	FROM generate_series(1, 312) AS i;
	SELECT pepsi.notify_workqueue();});
ok(poll_until(sub { slow_count() == 12 }, 300), 'the 12 messages for the slow domain were delivered');
ok(poll_until(sub { sink_count() == 300 }, 120), 'and the 300 for the fast one');
ok(poll_until(sub { queue_count($node) == 0 }, 120), 'the queue is empty');
# (The sampler's loop ended when the fast mail left the queue.)
# (The output holds the sampling call's own result too, an empty line.)
my ($most, $samples) = $sampler->query_safe('SELECT most, samples FROM slow_sample') =~ /^(\d+)\|(\d+)$/m;
defined $samples or die 'the sampler gave no answer';
$sampler->quit;
note("slow slots sampled while the fast mail was queued: $samples samples, $most held at most");
cmp_ok($most, '<=', 2, "the slow destination never held more than its share of 2 slots ($most at most)");
cmp_ok($most, '>=', 1, "and it did hold slots while the fast domain's mail went");
my $dispatcher_log = dispatcher_log($d);
is(scalar(() = $dispatcher_log =~ /status=(?:deferred|bounced|expired)/g), 0,
	'no delivery was deferred or bounced');
cmp_ok($node->safe_psql('postgres', "SELECT service_seconds FROM pepsi.destination WHERE domain = 'slow.test'"),
	'>=', 0.8, "pepsi.destination keeps the slow destination's pace: its deliveries, not the waits for a slot");

# The cap protects other mail: with none waiting, the slow domain may use
# what its concurrency limit allows.  12 more messages, for it alone.
$node->safe_psql('postgres', q{
	SELECT pepsi.workqueue_add('sender@local.test', ARRAY['alone' || i || '@slow.test'],
		convert_to('From: <sender@local.test>' || chr(13) || chr(10) || 'Subject: a' || i
			|| chr(13) || chr(10), 'UTF8'),
		convert_to('hello' || chr(13) || chr(10), 'UTF8'), '{}'::jsonb)
	FROM generate_series(1, 12) AS i;
	SELECT pepsi.notify_workqueue();});
my $alone = 0;
ok( poll_until(
		sub {
			my $held = slow_slots_held();
			$alone = $held if $held > $alone;
			return slow_count() == 24;
		},
		300),
	'the 12 messages for the slow domain alone were delivered');
cmp_ok($alone, '>', 2, "with no other mail waiting, it held more than its share of 2 slots ($alone at most)");
ok(poll_until(sub { queue_count($node) == 0 }, 120), 'the queue is empty again');

is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
done_testing();
