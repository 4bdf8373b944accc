# pepsi-dispatch: a claim names only the stages that may have pending rows
# (daemons/dispatch/pool.c, pool_may_have_work), and no row is left behind
# for it.
#
# The heartbeat is set to ten minutes, so that nothing here is found by it:
# every row must be claimed because a NOTIFY, a full claim or a status
# line said where it was.
#
#   - The real stages (if -> route -> drop, standalone builds), with a
#     stage no row ever reaches: the rows go through, each hop claimed
#     on the status line's "queued" of the one before, and the idle stage
#     is named only by the claims a NOTIFY or the start-up caused, not by
#     the claims after each status line.
#   - Test workers (not of our runtime: a plain "0"), a -> b -> c: a
#     status line that does not say where the row went makes the next
#     claim name every stage, so the rows go through as promptly.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use DispatchTest;
use PepsiTest;

my $db = 'postgres';
my $node = dispatch_node('dispatch_claim_stages', conf => "log_statement = 'all'\n");
my %no_heartbeat = (POLL_INTERVAL => '600s');

# The claims in the server's log from $offset on: the stages each named.
sub claims_since
{
	my ($offset) = @_;
	my @claims;

	my $claim = 0;
	for my $line (split /\n/, log_since($node, $offset))
	{
		push @claims, [ split /,/, $1 ] if $claim && $line =~ /DETAIL:  parameters: \$1 = '\{([^}]*)\}'/;
		$claim = $line =~ /execute pepsi_dispatch_claim:/;
	}
	return @claims;
}

sub wakes_since
{
	my ($offset) = @_;
	my @wakes = log_since($node, $offset) =~ /pepsi\.notify_workqueue\(\)/g;
	return scalar @wakes;
}

#
# The real stages, and one no row reaches.
#
my $stages = real_stages() . "[stage-spare]\nPROGRAM = pepsi-stage-discard\n";
my $config = write_config($node, stages => $stages, dispatch => \%no_heartbeat);
my $d = start_dispatcher($config);
ok(poll_until(sub { dispatcher_log($d) =~ /connected to the database/ }), 'the dispatcher is up');
my $offset = -s $node->logfile;
my $rows = 40;
add_rows($node, $rows);
my $started = time;
ok(poll_until(sub { queue_count($node) == 0 }, 120), "all $rows rows went through init, route and drop");
cmp_ok(time - $started, '<', 120, 'well before the heartbeat');
my @claims = claims_since($offset);
my @spare = grep { grep { $_ eq 'spare' } @$_ } @claims;
my $wakes = wakes_since($offset);
cmp_ok(scalar @claims, '>=', 3, 'the rows took several claims (' . scalar(@claims) . ')');
cmp_ok(scalar @spare, '<=', $wakes + 1,
	"the idle stage was named only by the claims a wake caused ($wakes wakes, "
	  . scalar(@spare) . ' of ' . scalar(@claims) . ' claims)');
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher exits 0');

#
# Workers not of our runtime say only "0": every stage may then have rows.
#
my $program = test_program('test-stage');
$config = write_config($node, dispatch => \%no_heartbeat, stages => <<"EOF");
[stage-a]
PROGRAM = $program
NEXT_STAGE = b
[stage-b]
PROGRAM = $program
NEXT_STAGE = c
[stage-c]
PROGRAM = $program
[stage-spare]
PROGRAM = $program
EOF
$d = start_dispatcher($config);
ok(poll_until(sub { dispatcher_log($d) =~ /connected to the database/ }), 'a dispatcher with test workers is up');
my @ids = add_rows($node, 20, stage => 'a');
$started = time;
ok(poll_until(sub { queue_count($node) == 0 }, 120), 'plain status lines: all 20 rows went through a, b and c');
cmp_ok(time - $started, '<', 120, 'plain status lines: well before the heartbeat');
is( scalar_query($node,
		"SELECT count(*) FROM (SELECT id, string_agg(stage, '' ORDER BY seq) AS path"
		  . ' FROM test_log GROUP BY id) p'
		  . " WHERE path = 'abc' AND id BETWEEN $ids[0] AND $ids[-1]"),
	'20', 'plain status lines: each row concluded at a, then b, then c');
is(stop_dispatcher($d, 'TERM'), 0, 'the dispatcher exits 0');

done_testing();
