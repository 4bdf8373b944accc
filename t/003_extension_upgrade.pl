# Upgrading the extension in place: ALTER EXTENSION pepsi UPDATE on a
# database whose queue holds messages in every state, with a worker's row
# running across the upgrade.
#
# The scheme (docs/upgrading.md): a released pepsi--V.sql is never edited;
# each version step ships one upgrade script pepsi--A--B.sql, to which every
# schema change of the step appends its own delimited block; and each step
# is tested here, the same way, from every version the installation
# directory offers: install that version, fill the queue, update to the
# default version, then every row and every body is still there and every
# function still works.  The assertions are on behaviour (rows, bodies,
# results of the queue and administrative functions, grants), never on the
# scripts' text, so that they hold while features append to the upgrade
# script, and fail when one of them loses data or breaks a function.
#
# Last, the two ways to the default version must give the same schema:
# CREATE EXTENSION pepsi (which runs the default version's full script,
# pepsi--V.sql) and CREATE EXTENSION pepsi VERSION <old> followed by ALTER
# EXTENSION UPDATE.  Compared in the catalogs: a pg_dump -s shows only
# CREATE EXTENSION for the extension's members.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $node = pepsi_node('upgrade');

my $default_version = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'pepsi'");
my @old_versions = split /\n/,
  $node->safe_psql('postgres',
	    "SELECT version FROM pg_available_extension_versions WHERE name = 'pepsi'"
	  . " AND version <> '$default_version' ORDER BY string_to_array(version, '.')::int[]");
ok(scalar @old_versions, "versions older than $default_version are installable: @old_versions");

# The tables whose rows are the installation's data (the queue, the
# operator's configuration, the logs, the statistics) rather than part of
# the schema: an upgrade keeps every one of their rows.
my @data_tables = qw(workqueue workqueue_body config_override settings
  dns_address event_log mail_log stage_stats dispatch_stats);

# Every row of pepsi.$table, one line each, with only the columns the table
# has now (@$columns; all of them if undef) and in a fixed order; only
# those $where (an SQL condition, of id) keeps if it is given.
sub table_rows
{
	my ($db, $table, $columns, $where) = @_;

	$columns //= [
		split /\n/,
		query(
			$db,
			"SELECT quote_ident(attname) FROM pg_attribute"
			  . " WHERE attrelid = 'pepsi.$table'::regclass AND attnum > 0"
			  . " AND NOT attisdropped ORDER BY attnum")
	];
	my $list = join ', ', @$columns;
	my @rows = split /\n/,
	  query($db, "SELECT row($list)::text FROM pepsi.$table t" . ($where ? " WHERE $where" : '') . ' ORDER BY 1');
	return ($columns, \@rows);
}

# Admit a message at $stage from $client; returns its id.
sub add
{
	my ($db, $stage, $rcpts, $body, $client) = @_;
	my $array = join ',', map { "'$_'" } @$rcpts;

	$client = $client ? "'$client'" : 'NULL';
	return query($db,
		    "SELECT pepsi.workqueue_add('sender\@example.org', ARRAY[$array],"
		  . " 'Subject: upgrade'::bytea, convert_to('$body', 'UTF8'),"
		  . " '{\"dsn\": {\"ret\": \"hdrs\"}}', $client, NULL, '$stage')");
}

# Does pepsi.secretary_challenge_open say yes ('t') to challenge $id of
# owner@example.net named with order reference $ref (undef: none)?
sub open_named
{
	my ($db, $id, $ref) = @_;
	return query($db,
		"SELECT pepsi.secretary_challenge_open('owner\@example.net', $id, " . (defined $ref ? "'$ref'" : 'NULL') . ')');
}

# The ids (comma-separated, in id order) the dispatcher's claim sets
# running at $stage.
sub claim
{
	my ($db, $stage) = @_;

	return query($db,
		    "SELECT coalesce(string_agg(id::text, ',' ORDER BY id), '')"
		  . " FROM pepsi.workqueue_claim(ARRAY['$stage'], ARRAY[100])");
}

# One psql session per database, kept open: a psql start per query made
# this file spend most of its time starting processes.  A query that fails
# dies with its error, as safe_psql does; notices are not errors.  Each
# query has PG_TEST_TIMEOUT_DEFAULT to answer (or $timeout, for it and the
# session's later ones), not the session: a session's timer ran from its
# start, and one that lived through many queries died on a loaded machine
# however quick each was.
my %session;

sub query
{
	my ($db, $sql, $timeout) = @_;
	my $session = $session{$db} //= do
	{
		my $s = $node->background_psql($db, on_error_stop => 0);
		$s->set_query_timer_restart;
		$s;
	};
	$session->{timeout}->interval($timeout) if $timeout;
	my $output = $session->query($sql);
	my $stderr = $session->{stderr};

	$session->{stderr} = '';
	die "query failed in $db: $stderr\nquery: $sql" if $stderr =~ /^(?:psql:.*)?(?:ERROR|FATAL|PANIC):/m;
	return $output;
}

sub quit_sessions
{
	$_->quit for values %session;
	%session = ();
	return;
}

# A session ends once its database is done with (and before CREATE
# DATABASE copies that database).
sub quit_session
{
	my ($db) = @_;

	(delete $session{$db})->quit if $session{$db};
	return;
}

# What the upgrade must not change and what later steps refer to, by
# name: row ids and body ids.  $t ("-0.3"...) ends every name a database
# holds once (stages, clone tokens, a domain, the statistics' row): the
# rows of several versions share one database (below).
sub fill_queue
{
	my ($db, $t) = @_;
	my %q;

	# pending at init, two recipients, from a client address
	$q{pending} = add($db, "init$t", [ 'x@example.net', 'y@example.com' ], 'pending body', '192.0.2.1');
	# paused by its stage with a retry time an hour away
	$q{paused} = add($db, "relay$t", ['p@example.net'], 'paused body');
	is(claim($db, "relay$t"), $q{paused}, 'before: the claim sets the relay row running');
	query($db, "SELECT pepsi.workqueue_pause($q{paused}, 'relay$t', 3600, '{\"attempts\": 1}')");
	# paused and already due
	$q{due} = add($db, "retry$t", ['d@example.net'], 'due body');
	claim($db, "retry$t");
	query($db, "SELECT pepsi.workqueue_pause($q{due}, 'retry$t', 0.001)");
	# held by an operator
	$q{held} = add($db, "hold$t", ['h@example.net'], 'held body');
	is(query($db, "SELECT pepsi.queue_hold(ARRAY[$q{held}])"), 1, 'before: an operator holds a row');
	# failed
	$q{failed} = add($db, "relay$t", ['f@example.net'], 'failed body');
	claim($db, "relay$t");
	query($db, "SELECT pepsi.workqueue_commit($q{failed}, 'relay$t', 'fail', merge_state => '{\"error\": \"550\"}')");
	# split one per row: three rows sharing one body; the first stays
	# running across the upgrade, as a worker's row would
	$q{running} = add($db, "deliver$t", [ 'a@example.org', 'b@example.org', 'c@example.org' ], 'shared body');
	claim($db, "deliver$t");
	$q{siblings} = query($db,
		"SELECT array_to_string(pepsi.workqueue_split_one_per_row($q{running}, 'deliver$t'), ',')");
	$q{shared_body} = query($db, "SELECT body_id FROM pepsi.workqueue WHERE id = $q{running}");
	is( query(
			$db,
			"SELECT count(*) FROM pepsi.workqueue WHERE body_id = $q{shared_body}"),
		3,
		'before: the split rows share one body');
	# paused with a delay-DSN clone, whose token makes it at-most-once
	$q{with_clone} = add($db, "dsn$t", ['late@example.net'], 'clone body');
	claim($db, "dsn$t");
	$q{clone} = query($db,
		    "SELECT array_to_string(pepsi.workqueue_pause($q{with_clone}, 'dsn$t', 3600,"
		  . " clones => '[{\"token\": \"delay-1$t\", \"stage\": \"bounce\","
		  . " \"state\": {\"bounce\": {\"kind\": \"delay\"}}}]'), ',')");
	like($q{clone}, qr/^\d+$/, 'before: the pause spawned its delay clone');
	# a body no row references (what a lost race leaves)
	$q{orphan_body} = query($db,
		"INSERT INTO pepsi.workqueue_body (body) VALUES ('orphan') RETURNING id");
	# the operator's configuration overlay and the statistics (the global
	# value set once in a database: setting it again would change the row
	# an earlier version's set, its updated_at, which the checks of that
	# version compare)
	query($db, "SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '5s')"
		  . " WHERE NOT EXISTS (SELECT FROM pepsi.config_override WHERE scope = 'global'"
		  . " AND section = 'dispatch' AND option = 'POLL_INTERVAL')");
	query($db, "SELECT pepsi.config_set('domain:example$t.net', 'stage-relay', 'MAX_LIFETIME', '5d')");
	query($db, "INSERT INTO pepsi.stage_stats (stage) VALUES ('relay$t')");
	return %q;
}

#
# The same schema either way: what CREATE EXTENSION pepsi makes, to
# compare each upgraded database with.
#
# One line per object of schema pepsi with what defines it: columns (by
# name: an upgrade appends a column a fresh install may place elsewhere),
# constraints, indexes, triggers, functions, views, types, sequences, the
# ACL of each (its entries sorted: the order they were granted in means
# nothing), the rows of the tables that are part of the schema
# (config_option's option table) rather than data, and the tables and
# sequences pg_dump keeps the rows of (pg_extension_config_dump, with
# their filters).
my $describe = q{
SELECT string_agg(line, E'\n' ORDER BY line) FROM (
    SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
           || CASE a.attgenerated WHEN 's' THEN ' generated' ELSE '' END
           || CASE WHEN a.attidentity <> '' THEN ' identity' ELSE '' END AS line
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind IN ('r', 'v', 'p')
      AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' '
           || coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(c.relacl) a), '')
           || coalesce(' ' || obj_description(c.oid, 'pg_class'), '')
    FROM pg_class c WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind <> 'i'
    UNION ALL
    SELECT 'constraint ' || conrelid::regclass || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'pepsi'::regnamespace
    UNION ALL
    SELECT 'index ' || regexp_replace(pg_get_indexdef(indexrelid), 'INDEX \S+ ON', 'INDEX ON')
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = 'pepsi'::regnamespace
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(t.oid)
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = 'pepsi'::regnamespace AND NOT t.tgisinternal
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure || ' ' || md5(pg_get_functiondef(p.oid))
           || ' ' || coalesce((SELECT string_agg(a::text, ',' ORDER BY a::text) FROM unnest(p.proacl) a), '')
    FROM pg_proc p WHERE p.pronamespace = 'pepsi'::regnamespace AND p.prokind IN ('f', 'p')
    UNION ALL
    SELECT 'view ' || c.relname || ' ' || md5(pg_get_viewdef(c.oid))
    FROM pg_class c WHERE c.relnamespace = 'pepsi'::regnamespace AND c.relkind = 'v'
    UNION ALL
    SELECT 'type ' || t.typname || ' ' || coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                                   FROM pg_enum e WHERE e.enumtypid = t.oid), '')
    FROM pg_type t WHERE t.typnamespace = 'pepsi'::regnamespace AND t.typtype IN ('e', 'd', 'c')
      AND NOT EXISTS (SELECT FROM pg_class c WHERE c.reltype = t.oid)
    UNION ALL
    SELECT 'option ' || o::text FROM pepsi.config_option o
    UNION ALL
    SELECT 'config_dump ' || c.oid::regclass || ' ' || quote_literal(c.condition)
    FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS c(oid, condition)
    WHERE e.extname = 'pepsi'
    UNION ALL
    SELECT 'member ' || pg_describe_object(d.classid, d.objid, 0)
    FROM pg_depend d WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
      AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pepsi')
) AS lines
};

# The lines only one of two descriptions has, marked - (fresh) or +.
sub diff_lines
{
	my ($fresh, $upgraded) = @_;
	my %f = map { $_ => 1 } split /\n/, $fresh;
	my %u = map { $_ => 1 } split /\n/, $upgraded;

	return ((map { "- $_" } grep { !$u{$_} } sort keys %f),
		(map { "+ $_" } grep { !$f{$_} } sort keys %u));
}

query('postgres', 'CREATE DATABASE fresh');
query('fresh', 'CREATE EXTENSION pepsi');
my $fresh = query('fresh', $describe);
like($fresh, qr/^function workqueue_claim\(/m, 'the description lists the functions');
like($fresh, qr/^config_dump workqueue ''$/m, 'and what pg_dump keeps the rows of');

# One version at a time (0.1 -> 0.2 -> 0.3 ...), as an installation that
# updated at every release went: each step reaches its version, and the
# last the schema CREATE EXTENSION pepsi makes.
#
# What each old version's programs made is then tested across the update
# to the default version (prepare_version, check_version).  The first
# version's in a database of its own, a copy of this one at that version,
# updated with the one ALTER EXTENSION pepsi UPDATE an installation runs:
# every step's script in one transaction.  The later versions' are made
# in this database itself as it passes their version, each under names of
# its own (fill_queue), and so cross every later step with it.  A copy per
# version updated from there (as this file did) ran each step's script
# once for every version before it, in one transaction, where a step costs
# about twice what it costs alone: most of this file's time, the longest
# of the suite's files.  At the default version, each of them is checked
# in a copy of this database without the other versions' rows, bodies and
# accounts, as if it had been alone.
sub database_of { return "upgrade_from_" . ($_[0] =~ s/\W/_/gr) }
my @path = (@old_versions, $default_version);
my %made;    # by version, what prepare_version returned
query('postgres', 'CREATE DATABASE upgrade_stepwise');
query('upgrade_stepwise', "CREATE EXTENSION pepsi VERSION '$path[0]'");
for my $step (0 .. $#path)
{
	my $to = $path[$step];

	if ($step > 0)
	{
		query('upgrade_stepwise', "ALTER EXTENSION pepsi UPDATE TO '$to'");
		is(query('upgrade_stepwise', "SELECT extversion FROM pg_extension WHERE extname = 'pepsi'"
			  . " UNION ALL SELECT version FROM pepsi.schema_version"),
			"$to\n$to", "stepwise: UPDATE TO '$to' reaches $to, and schema_version says so")
		  if @old_versions > 1;
	}
	next if $to eq $default_version;
	if ($step == 0)
	{
		# CREATE DATABASE copies no template with a session on it.
		quit_session('upgrade_stepwise');
		query('postgres', 'CREATE DATABASE ' . database_of($to) . ' TEMPLATE upgrade_stepwise');
		next;
	}
	$made{$to} = prepare_version('upgrade_stepwise', $to);
}
if (@old_versions > 1)
{
	my $stepwise = query('upgrade_stepwise', $describe);
	ok($stepwise eq $fresh, "stepwise: @path ends in the schema CREATE EXTENSION pepsi makes")
	  or diag(join "\n", diff_lines($fresh, $stepwise));
}
quit_session($_) for qw(postgres fresh upgrade_stepwise);

for my $from (@old_versions)
{
	my $db = database_of($from);
	my $v;

	if ($from eq $path[0])
	{
		$v = prepare_version($db, $from);
		# Every step's script in one statement, the longest of the suite:
		# 30 s on a quiet machine, over 170 s niced at a load of 40.  Four
		# times the default bound, which stays a bound of liveness.
		query($db, 'ALTER EXTENSION pepsi UPDATE', 4 * $PostgreSQL::Test::Utils::timeout_default);
		is(query($db, "SELECT extversion FROM pg_extension WHERE extname = 'pepsi'"),
			$default_version, "$from: ALTER EXTENSION pepsi UPDATE reaches $default_version");
	}
	else
	{
		$v = $made{$from};
		query('postgres', "CREATE DATABASE $db TEMPLATE upgrade_stepwise");
		# Only this version's rows, bodies and accounts: what the others
		# made, by the ids and names they made it under.  The rows and
		# bodies an update itself added (none should) stay, and fail the
		# comparisons below.
		for my $other (grep { $_ ne $from } keys %made)
		{
			my $o = $made{$other};
			query($db, "DELETE FROM pepsi.workqueue WHERE $o->{rows}");
			query($db, "DELETE FROM pepsi.workqueue_body WHERE $o->{bodies}");
			next unless $o->{has_accounts};
			query($db, "DELETE FROM pepsi.admin_account WHERE name = 'old-admin$o->{tag}'");
			query($db, "DELETE FROM pepsi.api_token WHERE name = 'old-token$o->{tag}'");
		}
		$v->{events} = query($db, 'SELECT count(*) FROM pepsi.event_log');
		is(query($db, "SELECT extversion FROM pg_extension WHERE extname = 'pepsi'"),
			$default_version, "$from: the updates one version at a time reach $default_version");
	}
	check_version($db, $from, $v);
	quit_session($db);
}

quit_sessions();
$node->stop;
done_testing();

# Database $db, at version $from, given what that version's programs made:
# the queue of fill_queue, and more for some versions.  Returns what
# check_version needs: the rows and bodies made (SQL conditions on their
# ids), the data tables' rows then (%before), the names' tag.
sub prepare_version
{
	my ($db, $from) = @_;
	my $t = "-$from";
	my %v = (tag => $t);

	is(query($db, "SELECT extversion FROM pg_extension WHERE extname = 'pepsi'"),
		$from, "$from: installed");
	my $rows_from = query($db, 'SELECT coalesce(max(id), 0) FROM pepsi.workqueue');
	my $bodies_from = query($db, 'SELECT coalesce(max(id), 0) FROM pepsi.workqueue_body');

	$v{q} = { fill_queue($db, $t) };
	# Two secretary challenges of 0.12: one sent (its payment request
	# named the order pepsi-ID), one opened without being sent (its sender
	# unproven).  0.13's order references are checked on them below.
	$v{challenge} = {};
	if ($from eq '0.12')
	{
		$v{challenge}{ $_->[0] } = query($db,
			"SELECT pepsi.secretary_decide('owner\@example.net', '$_->[0]\@example.org', $_->[1], $_->[2],"
			  . " NULL, false, '14 days', 10) ->> 'challenge'")
		  for [ 'sent', 900001, 'true' ], [ 'unsent', 900002, 'false' ];
	}
	# pepsi-httpd's credentials, made with the calls older programs use.
	$v{has_accounts} = query($db, "SELECT to_regclass('pepsi.admin_account') IS NOT NULL") eq 't';
	if ($v{has_accounts})
	{
		query($db, "SELECT pepsi.admin_account_set('old-admin$t', '\$argon2id\$v=19\$m=19456,t=2,p=1\$c2FsdA\$aGFzaA')");
		query($db, "SELECT pepsi.api_token_create('old-token$t')");
	}
	$v{max_id} = query($db, 'SELECT max(id) FROM pepsi.workqueue');
	$v{rows} = "id > $rows_from AND id <= $v{max_id}";
	$v{bodies} = "id > $bodies_from AND id <= " . query($db, 'SELECT max(id) FROM pepsi.workqueue_body');
	# (of the queue's tables, the rows this version made; of the others,
	# all, which must all still be there)
	$v{before}{$_} = [ table_rows($db, $_, undef, { workqueue => $v{rows}, workqueue_body => $v{bodies} }->{$_}) ]
	  for @data_tables;
	$v{events} = query($db, 'SELECT count(*) FROM pepsi.event_log');
	return \%v;
}

# What version $from made (prepare_version's $v) after the update to the
# default version, in database $db, where it is alone.
sub check_version
{
	my ($db, $from, $v) = @_;
	my $t = $v->{tag};
	my %q = %{ $v->{q} };
	my %before = %{ $v->{before} };
	my %challenge = %{ $v->{challenge} };
	my ($max_id, $events, $has_accounts) = @$v{qw(max_id events has_accounts)};

	#
	# Nothing lost: every row of the queue and every body is as it was
	# (in the columns the old version had), and the configuration, logs
	# and statistics keep every row.
	#
	for my $table (@data_tables)
	{
		my ($columns, $rows) = @{ $before{$table} };
		my (undef, $after) = table_rows($db, $table, $columns);

		if ($table =~ /^workqueue/)
		{
			is_deeply($after, $rows, "$from: every row of pepsi.$table is intact");
		}
		else
		{
			my %now = map { $_ => 1 } @$after;
			my @lost = grep { !$now{$_} } @$rows;
			is_deeply(\@lost, [], "$from: no row of pepsi.$table is lost or changed");
		}
	}
	is( query(
			$db,
			"SELECT count(*) FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id"
			  . " WHERE convert_from(b.body, 'UTF8') = 'shared body'"),
		3,
		"$from: the split rows still share their one body");

	#
	# Every function still works on the old rows.
	#
	is(claim($db, "init$t"), $q{pending}, "$from: the claim takes the pending row");
	is( query(
			$db,
			"SELECT sender_key FROM pepsi.workqueue WHERE id = $q{pending} AND status = 'running'"),
		'ip:192.0.2.1',
		"$from: the claimed row is running, charged to its sender");
	query($db, "SELECT pepsi.workqueue_commit($q{pending}, 'init$t', 'advance', 'relay$t')");
	is(claim($db, "relay$t"), $q{pending},
		"$from: commit advances it to relay, where the claim takes it (and nothing paused, held or failed)");
	my $split_off = query($db,
		"SELECT pepsi.workqueue_split_off($q{pending}, 'relay$t', ARRAY[2], 'deliver$t')");
	is( query(
			$db,
			"SELECT string_agg(array_to_string(rcpt_to, ' '), '|' ORDER BY id) || '|'"
			  . " || count(DISTINCT body_id) FROM pepsi.workqueue WHERE id IN ($q{pending}, $split_off)"),
		'x@example.net|y@example.com|1',
		"$from: split_off peels a recipient onto a sibling sharing the body");
	is( query(
			$db,
			"SELECT pepsi.workqueue_commit_many(ARRAY[$q{pending}], ARRAY['relay$t'],"
			  . " 'advance', ARRAY['deliver$t'])"),
		1,
		"$from: commit_many advances a batch");

	# The worker's row that was running across the upgrade concludes.
	query($db, "SELECT pepsi.workqueue_commit($q{running}, 'deliver$t', 'finish')");
	is( query(
			$db,
			"SELECT count(*) FROM pepsi.workqueue WHERE id = $q{running}") . '|'
		  . query($db, "SELECT count(*) FROM pepsi.workqueue_body WHERE id = $q{shared_body}"),
		'0|1',
		"$from: the running row finishes; its siblings keep the shared body");
	my @deliver = split /,/, claim($db, "deliver$t");
	is(scalar @deliver, 4, "$from: the siblings, the split-off row and the advanced row are claimed at deliver");
	for my $sibling (split /,/, $q{siblings})
	{
		query($db, "SELECT pepsi.workqueue_commit($sibling, 'deliver$t', 'finish')");
	}
	is(query($db, "SELECT count(*) FROM pepsi.workqueue_body WHERE id = $q{shared_body}"),
		0, "$from: finishing the last sibling releases the shared body");
	is( query(
			$db,
			"SELECT array_length(pepsi.workqueue_finish_with_clones($split_off, 'deliver$t',"
			  . " '[{\"token\": \"success-1$t\", \"stage\": \"bounce\", \"state\": {\"bounce\": {\"kind\": \"success\"}}}]'), 1)"
		),
		1,
		"$from: finish_with_clones deletes a row and spawns its clone");
	query($db, "SELECT pepsi.workqueue_pause($q{pending}, 'deliver$t', 60, '{\"attempts\": 1}')");
	is( query(
			$db,
			"SELECT status || ' ' || (state->>'attempts') || ' ' || (state->'dsn'->>'ret')"
			  . " FROM pepsi.workqueue WHERE id = $q{pending}"),
		'paused 1 hdrs',
		"$from: pause merges into the state the row had before the upgrade");

	is(query($db, 'SELECT pepsi.workqueue_requeue_due()'),
		1, "$from: requeue_due takes the paused row that is due, and only it");
	is(query($db, "SELECT status FROM pepsi.workqueue WHERE id = $q{due}"),
		'pending', "$from: the due row is pending again");
	is(query($db, "SELECT pepsi.workqueue_resume(ARRAY[$q{with_clone}])"),
		1, "$from: resume takes a paused row back to pending");
	claim($db, "dsn$t");
	is( query(
			$db,
			"SELECT cardinality(pepsi.workqueue_pause($q{with_clone}, 'dsn$t', 3600,"
			  . " clones => '[{\"token\": \"delay-1$t\", \"stage\": \"bounce\", \"state\": {}}]'))"),
		0,
		"$from: a clone token from before the upgrade still makes the clone at-most-once");

	ok(query($db, 'SELECT pepsi.workqueue_body_gc()') >= 1, "$from: body GC sweeps");
	is(query($db, "SELECT count(*) FROM pepsi.workqueue_body WHERE id = $q{orphan_body}"),
		0, "$from: the orphaned body from before the upgrade is gone");
	my @pending_rows = split /,/, claim($db, "retry$t");
	is( query(
			$db,
			"SELECT pepsi.workqueue_reset_orphans()"),
		scalar @pending_rows,
		"$from: reset_orphans puts running rows back to pending");

	my $new = add($db, "init$t", ['new@example.net'], 'new body');
	ok($new > $max_id, "$from: a new message gets an id after every old one");

	#
	# The administrative surface.
	#
	is( query(
			$db,
			"SELECT string_agg(stage || ':' || status || ':' || messages, ' ' ORDER BY stage, status)"
			  . " FROM pepsi.queue_summary"),
		query(
			$db,
			"SELECT string_agg(stage || ':' || status || ':' || n, ' ' ORDER BY stage, status)"
			  . " FROM (SELECT stage, status, count(*) AS n FROM pepsi.workqueue GROUP BY 1, 2) s"),
		"$from: queue_summary counts the queue");
	is(query($db, "SELECT held FROM pepsi.queue_summary WHERE stage = 'hold$t'"),
		1, "$from: queue_summary still counts the held row");
	is( query($db, 'SELECT sum(total) FROM pepsi.queue_shape'),
		query($db, 'SELECT sum(cardinality(rcpt_to)) FROM pepsi.workqueue'),
		"$from: queue_shape counts every recipient");
	is(query($db, "SELECT total FROM pepsi.queue_senders WHERE sender_key = 'local'"),
		query($db, "SELECT count(*) FROM pepsi.workqueue WHERE sender_key = 'local'"),
		"$from: queue_senders counts the local sender's rows");
	is(query($db, "SELECT pepsi.queue_release(ARRAY[$q{held}])"),
		1, "$from: queue_release frees the row held before the upgrade");
	is(query($db, "SELECT pepsi.queue_retry(ARRAY[$q{failed}])"),
		1, "$from: queue_retry takes the failed row back");
	is(query($db, "SELECT pepsi.queue_hold(ARRAY[$q{paused}])"),
		1, "$from: queue_hold parks the paused row");
	is(query($db, "SELECT pepsi.queue_bounce(ARRAY[$q{paused}], 'no such user')"),
		1, "$from: queue_bounce sends it to the bounce stage");
	is(query($db, "SELECT pepsi.queue_delete(ARRAY[$new])"),
		1, "$from: queue_delete deletes a row");
	is(query($db, 'SELECT count(*) FROM pepsi.event_log') - $events,
		5, "$from: each administrative action wrote its event");
	is( query(
			$db,
			"SELECT pepsi.config_get('domain:example$t.net', 'stage-relay', 'MAX_LIFETIME')"),
		'5d',
		"$from: a scoped override set before the upgrade is in force");
	is(query($db, "SELECT pepsi.config_set('global', 'dispatch', 'POLL_INTERVAL', '2s')"),
		'5s', "$from: config_set replaces a value set before the upgrade");
	is(query($db, "SELECT pepsi.config_unset('global', 'dispatch', 'POLL_INTERVAL')"),
		'2s', "$from: config_unset removes it");

	is(query($db, 'SELECT version FROM pepsi.schema_version'),
		$default_version, "$from: pepsi.schema_version says $default_version, which a restore checks");

	# The challenges open at the update keep no order reference, and the
	# sent one is named by its id alone (pepsi-ID), as its request named
	# it; the unsent one gets its reference when it is sent, as every
	# challenge opened since gets one, and then only that names it.
	if ($from eq '0.12')
	{
		my $zero = '0' x 32;
		is(query($db, 'SELECT count(*) FROM pepsi.secretary_challenge WHERE order_ref IS NULL'),
			2, "$from: the secretary's challenges keep no order reference");
		is(open_named($db, $challenge{sent}, undef), 't', "$from: the sent one is named by its id alone");
		is(open_named($db, $challenge{sent}, $zero), 'f', "$from: and by no reference");
		my $ref = query($db,
			"SELECT pepsi.secretary_decide('owner\@example.net', 'unsent\@example.org', 900003, true, NULL, false,"
			  . " '14 days', 10) ->> 'reference'");
		like($ref, qr/^[0-9a-f]{32}$/, "$from: the unsent one gets an order reference when it is sent");
		is(query($db, "SELECT order_ref FROM pepsi.secretary_challenge WHERE id = $challenge{unsent}"),
			$ref, "$from: kept in its row");
		is(open_named($db, $challenge{unsent}, $ref) . open_named($db, $challenge{unsent}, undef)
			  . open_named($db, $challenge{unsent}, $zero),
			'tff', "$from: only its reference names it then");
		my $new = query($db,
			"SELECT pepsi.secretary_decide('owner\@example.net', 'new\@example.org', 900004, true, NULL, false,"
			  . " '14 days', 10) ->> 'reference'");
		ok($new =~ /^[0-9a-f]{32}$/ && $new ne $ref, "$from: a new challenge gets a reference of its own");
	}

	# pepsi-httpd's accounts and tokens keep the rights they had (0.3 gave
	# them a role), and both the old calls and the ones with a role work.
	if ($has_accounts)
	{
		is(query($db, "SELECT (SELECT role FROM pepsi.admin_account WHERE name = 'old-admin$t')"
			  . " || ' ' || (SELECT role FROM pepsi.api_token WHERE name = 'old-token$t')"),
			'admin admin', "$from: an account and a token made before the upgrade are admins");
		query($db, "SELECT pepsi.admin_account_set('old-admin$t', '\$argon2id\$v=19\$m=19456,t=2,p=1\$c2FsdA\$aGFzaA')");
		query($db, "SELECT pepsi.api_token_create('new-token')");
		query($db, "SELECT pepsi.api_token_create('new-viewer', 'viewer')");
		query($db, "SELECT pepsi.admin_account_set('new-viewer', '\$argon2id\$v=19\$m=19456,t=2,p=1\$c2FsdA\$aGFzaA', 'viewer')");
		is(query($db, "SELECT string_agg(name || '=' || role, ' ' ORDER BY name) FROM"
			  . " (SELECT name, role FROM pepsi.admin_account UNION ALL SELECT name, role FROM pepsi.api_token) c"),
			"new-token=admin new-viewer=viewer new-viewer=viewer old-admin$t=admin old-token$t=admin",
			"$from: the old calls make admins, the new ones the role they name");
	}

	# Every object the upgrade added belongs to the group roles the policy
	# says, and nothing else changed hands.
	is(query($db, "SELECT count(*) FROM pepsi.grant_verify()"),
		0, "$from: the grants match the policy after the upgrade")
	  or diag(query($db, 'SELECT * FROM pepsi.grant_verify()'));
	query($db, "CREATE ROLE monitor_$db LOGIN IN ROLE pepsi_monitor");
	my ($ret, $out, $err) = $node->psql($db, 'SELECT count(*) > 0 FROM pepsi.queue_summary',
		extra_params => [ '-U', "monitor_$db" ]);
	is($ret . $out, '0t', "$from: pepsi_monitor reads the queue views");
	($ret, $out, $err) = $node->psql($db, 'SELECT count(*) FROM pepsi.workqueue',
		extra_params => [ '-U', "monitor_$db" ]);
	like($err, qr/permission denied for table workqueue/, "$from: and not the queue");

	my $upgraded = query($db, $describe);
	ok($upgraded eq $fresh, "$from: the updated schema is the one CREATE EXTENSION pepsi makes")
	  or diag(join "\n", diff_lines($fresh, $upgraded));
	return;
}
