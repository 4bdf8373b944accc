# pepsi-dispatch when no maintenance worker serves the database (no
# shared_preload_libraries): paused rows must not wait for ever.  As a role
# allowed to, it starts the worker, again after a PostgreSQL restart; as a
# role that may not (pepsi_dispatch), it requeues the due rows itself and
# tells the DBA how to fix it.  Either way a paused row is retried across
# a restart.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_no_maintenance');
my $program = test_program('test-stage');
my $stages = <<"EOF";
[stage-w]
PROGRAM = $program
EOF

is(maintenance_pid($node, $db), '', 'no shared_preload_libraries: no maintenance worker');

# A row paused at stage w, due in a second.
sub paused_row
{
	my ($id) = add_rows($node, 1, stage => 'w', quiet => 1);

	$node->safe_psql($db,
		"UPDATE pepsi.workqueue SET status = 'paused', timeout = now() + interval '1 second' WHERE id = $id");
	return $id;
}

sub concluded
{
	my ($id) = @_;

	return scalar_query($node, "SELECT count(*) FROM test_log WHERE id = $id") > 0;
}

#
# A role that may start the worker (the superuser): it does, and again
# after a restart.
#
my $config = write_config($node, stages => $stages);
my $d = start_dispatcher($config);
ok( poll_until(sub { dispatcher_log($d) =~ /no maintenance worker served the database.*started one \(pid \d+\)/ }),
	'the dispatcher starts a maintenance worker, with a warning')
  or diag(dispatcher_log($d));
like(dispatcher_log($d), qr/add pepsi to shared_preload_libraries/, 'the warning says how to fix it');
ok(poll_until(sub { maintenance_pid($node, $db) ne '' }), 'a maintenance worker serves the database');

# The restart takes the dynamically started worker with it.
$node->restart;
my $row = paused_row();
ok(poll_until(sub { concluded($row) }), 'a paused row is still retried after the restart');
is(scalar(() = dispatcher_log($d) =~ /started one \(pid \d+\)/g), 2,
	'the dispatcher started the worker again');
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher stops');

#
# A role that may not (a member of pepsi_dispatch only): the dispatcher
# requeues the due rows itself.
#
# (test_log is in the schema named for the user that made it, if any.)
my $schema = scalar_query($node, "SELECT relnamespace::regnamespace FROM pg_class WHERE relname = 'test_log'");
$node->safe_psql($db,
	    'CREATE ROLE dispatcher LOGIN IN ROLE pepsi_dispatch;'
	  . " ALTER ROLE dispatcher SET search_path = $schema, public;"
	  . " GRANT USAGE ON SCHEMA $schema TO dispatcher;"
	  . " GRANT SELECT, INSERT ON $schema.test_log TO dispatcher;"
	  . " GRANT USAGE ON SEQUENCE $schema.test_log_seq_seq TO dispatcher");
$node->restart;
is(maintenance_pid($node, $db), '', 'restarted: no maintenance worker');
$config = write_config($node, stages => $stages);
{
	open my $fh, '<', $config or die "$config: $!";
	local $/;
	my $text = <$fh>;
	close $fh;
	$text =~ s/dbname=postgres/dbname=postgres user=dispatcher/;
	open $fh, '>', $config or die "$config: $!";
	print $fh $text;
	close $fh;
}
$d = start_dispatcher($config, log => PostgreSQL::Test::Utils::tempdir() . '/unprivileged.log');
ok( poll_until(sub { dispatcher_log($d) =~ /this role may not start one.*requeues the paused rows that are due itself/ }),
	'a role that may not start the worker: the dispatcher stands in, with a warning')
  or diag(dispatcher_log($d));
like(dispatcher_log($d), qr/add pepsi\s+to shared_preload_libraries/, 'the warning says how to fix it');
$row = paused_row();
ok(poll_until(sub { concluded($row) }), 'a paused row is retried by the dispatcher')
  or diag(dispatcher_log($d));
is(maintenance_pid($node, $db), '', 'with no maintenance worker');

$node->restart;
$row = paused_row();
ok(poll_until(sub { concluded($row) }), 'and again after a PostgreSQL restart');
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher stops');

done_testing();
