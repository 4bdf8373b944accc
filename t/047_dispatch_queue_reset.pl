# pepsi-dispatch after the queue is reset under it: TRUNCATE ... RESTART
# IDENTITY takes pepsi.pending_seq back below what the claim's sender cache
# has read, so the rows admitted next are invisible to its incremental
# read.  The claim must still use every free slot (what the fair picks
# cannot fill goes to the oldest rows) and the cache must rebuild at once,
# so 5,000 messages drain after the reset, and a lone message goes through
# every stage.  How fast (about as fast as before the reset, rather than
# trickling through the FIFO share until the periodic rebuild; the lone
# message at once) is measured by bench/timing.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_reset');
my $messages = 5000;

# Admit $count rows from ten senders in one transaction, wake the
# dispatcher, and return the seconds until the queue is empty (undef if it
# is not within 300 s, or the suite's bound for liveness if that is
# longer: a deadline for a broken dispatcher, not a measure; at a load of
# 48 the 5,000 rows took 251 s before the reset).
my $deadline = $PostgreSQL::Test::Utils::timeout_default > 300 ? $PostgreSQL::Test::Utils::timeout_default : 300;
sub drain_seconds
{
	my ($count) = @_;
	my $start = time;

	$node->safe_psql(
		$db, qq{
		SELECT count(pepsi.workqueue_add('sender\@example.org', ARRAY['rcpt\@example.net'],
			'Subject: reset'::bytea, 'body'::bytea, '{}', '10.2.0.0'::inet + n % 10))
		FROM generate_series(1, $count) AS n;
		SELECT pepsi.notify_workqueue();
	});
	return undef
	  unless poll_until(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') == 0 },
		$deadline);
	return time - $start;
}

# Small pools, so that the FIFO share of a claim is under one row: a
# claim that leaves the rest of its slots idle shows at once.
my $stages = real_stages() =~ s/^(\[stage-.*\]\n)/$1PARALLELISM = 1\nQUEUE_LIMIT = 4\n/mgr;
my $config = write_config($node, stages => $stages);
my $d = start_dispatcher($config);

# A few rows start the workers (and the claim's sender cache, whose
# periodic rebuild is then 30 s away); the next run is the reference.
ok(defined drain_seconds(20), 'a first 20 messages go through (workers started)');
my $before = drain_seconds($messages);
ok(defined $before, "$messages messages drain before the reset");

$node->safe_psql($db, 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body RESTART IDENTITY');
my $after = drain_seconds($messages);
ok(defined $after, "$messages messages drain after TRUNCATE ... RESTART IDENTITY");
# About as fast after the reset as before it (bench/timing): a claim that
# leaves slots idle crawls until the cache's periodic rebuild, some 20 s
# after the reset here.
note(sprintf('timing reset_drain_after_over_before %.3f', ($after // $deadline) / ($before || 1)));

# One message after another reset, timed alone: a claim that probes the
# stages for pending rows from a floor of the old numbering calls each
# stage empty until the floor's periodic recheck (5 s), at every hop.
$node->safe_psql($db, 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body RESTART IDENTITY');
my $one = drain_seconds(1);
ok(defined $one, 'a single message drains after a second reset');
# Claimed at once at every stage, not after a floor recheck (bench/timing).
note(sprintf('timing reset_single_message_seconds %.3f', $one // $deadline));
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher stops');

done_testing();
