# The plans of a stage worker's loads once the queue has grown under it.
# A worker keeps its session, and its load statements prepared, for its
# whole life; one started on an empty queue (as workers are, when mail
# starts to arrive) had its loads planned for a table of a few pages, and
# kept that plan, a sequential scan of pepsi.workqueue (and, for a load
# with the body, a hash join over every body), while a burst grew the
# table to thousands of pages: every load of a few rows then read them
# all.  The loads must go by primary key whatever the table's size was
# when they were planned.  A load of one row (a stage that takes one id at
# a time, a pass with one id waiting) goes by that id, not by an array of
# one: over an array the plan cache never kept the generic plan and
# planned every load afresh, the relay's loads spending more time in the
# planner than in the executor; its plan shows the parameter, not the id
# of the row it was planned for.  auto_explain logs the plan of each statement
# the worker's session runs; autovacuum is off, so no ANALYZE of the grown
# table invalidates the plans the worker kept.
use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;
use PepsiStage;

my $node = pepsi_node(
	'stage_load_plans',
	extension => 1,
	conf => "autovacuum = off\n"
	  . "auto_explain.log_min_duration = 0\n"
	  . "auto_explain.log_nested_statements = on\n");

# A stage of each load: the metadata (route), the headers (vacation),
# and the body (dkim-sign, which has no key for these messages' domain).
my $conf = stage_config($node, 'plans.conf', <<"INI");
[pepsi]
LOCAL_DOMAINS = example.org

[stage-init]
PROGRAM = pepsi-stage-route
LOCAL_STAGE = local
REMOTE_STAGE = remote

[stage-vacation]
PROGRAM = pepsi-stage-vacation
NEXT_STAGE = maildir
REPLY_STAGE = init

[stage-sign]
PROGRAM = pepsi-stage-dkim-sign
NEXT_STAGE = signed
REQUIRE_SIGNATURE = no
INI
my %program = (
	init => 'pepsi-stage-route',
	vacation => 'pepsi-stage-vacation',
	sign => 'pepsi-stage-dkim-sign');

# Only the workers' sessions log their plans.
local $ENV{PGOPTIONS} = '-c session_preload_libraries=auto_explain';

for my $stage ('init', 'vacation', 'sign')
{
	$node->safe_psql('postgres', 'TRUNCATE pepsi.workqueue, pepsi.workqueue_body');
	my $io = start_worker(worker_cmd($program{$stage}, $conf));

	# Eight passes on an almost empty queue: past the five executions a
	# prepared statement is planned for its parameters, so the plan it
	# keeps is the generic one, costed for this table.
	for my $pass (1 .. 8)
	{
		my @ids = map { add_row($node, $stage) } 1 .. 2;
		my @lines = send_ids($io, join('', map { "$_\n" } @ids), 2);
		is(join("|", @lines), "0|0", "$stage: pass $pass on a small queue succeeds");
		my $id = add_row($node, $stage);
		is(join("|", send_ids($io, "$id\n", 1)), "0", "$stage: pass $pass of one row succeeds");
	}

	# A burst: 20,000 rows, each with its body, most of them moved on.
	$node->safe_psql('postgres',
		"SELECT count(pepsi.workqueue_add('s\@example.org', '{r\@example.net}',"
		  . " convert_to('Subject: burst', 'UTF8'), convert_to(repeat('x', 500), 'UTF8'), '{}',"
		  . " stage => 'elsewhere')) FROM generate_series(1, 20000)");
	my $pages = $node->safe_psql('postgres',
		"SELECT pg_relation_size('pepsi.workqueue') / current_setting('block_size')::int");
	cmp_ok($pages, '>', 500, "$stage: the queue has grown to $pages pages");

	my $offset = -s $node->logfile;
	my @ids = map { add_row($node, $stage) } 1 .. 3;
	my @lines = send_ids($io, join('', map { "$_\n" } @ids), 3);
	is(join("|", @lines), "0|0|0", "$stage: the pass after the burst succeeds");
	my $one = add_row($node, $stage);
	is(join("|", send_ids($io, "$one\n", 1)), "0", "$stage: the pass of one row after the burst succeeds");
	$io->{in} = '';
	$io->{harness}->finish;

	my $log = slurp_file($node->logfile, $offset);
	my @loads = $log =~ /(Query Text: SELECT w\.id::text.*?)(?=\n\S|\z)/gs;
	cmp_ok(scalar(@loads), '>=', 1, "$stage: the worker's load was logged with its plan");
	for my $plan (@loads)
	{
		unlike($plan, qr/Seq Scan on workqueue/,
			"$stage: the load reads pepsi.workqueue by key, not all of it");
		like($plan, qr/Index Scan (using|on) workqueue_pkey/, "$stage: through its primary key");
	}
	my @singles = grep { /w\.id = \$1::int8/ } @loads;
	cmp_ok(scalar(@singles), '>=', 1, "$stage: the load of one row was logged with its plan");
	like($_, qr/Index Cond: \(id = \$1\)/, "$stage: the load of one row keeps its generic plan, not one per id")
	  for @singles;
	my @bodies = grep { /workqueue_body/ } @loads;
	unlike($_, qr/Seq Scan on workqueue_body/, "$stage: and its bodies by key") for @bodies;
}

done_testing();
