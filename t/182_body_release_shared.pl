# The releases of one shared body do not take turns (extension/src/body.c):
# a session that finished a sibling of a message and has not committed yet
# does not hold up the sessions finishing the other siblings (the rows of
# a list's post, delivered by many workers at once).  Before, every
# release held the body's row lock to its commit, so each waited for the
# one before.  The last sibling still frees the body at once.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

my $db = 'postgres';
my $node = pepsi_node('bodyshare', extension => 1);

my @addresses = map { "rcpt$_\@example.net" } 1 .. 10;
my ($first, $body) = add_running_message($node, $db, 'relay', \@addresses);
my @ids = sort { $a <=> $b } running_siblings($node, $db, $first, 'relay');
is(scalar @ids, 10, 'ten siblings share one body');

# One session finishes the first sibling and keeps its transaction open.
my $open = $node->background_psql($db);
$open->query_safe('BEGIN');
$open->query_safe("SELECT pepsi.workqueue_commit($ids[0], 'relay', 'finish')");

# Another finishes the siblings the open transaction does not hold (it
# holds one FOR SHARE, which keeps the body) meanwhile, each within a lock
# timeout (before: each waited on the body's lock until the open one
# committed).
my @free = split /\n/,
  $node->safe_psql($db,
	"SELECT id FROM pepsi.workqueue WHERE id = ANY ('{@{[ join(',', @ids[ 1 .. 9 ]) ]}}') ORDER BY id FOR UPDATE SKIP LOCKED");
cmp_ok(scalar @free, '>=', 8, 'the open release holds at most one sibling');
my ($rc, $out, $err) = (0, '', '');
for my $id (@free[ 0 .. $#free - 1 ])
{
	$rc = $node->psql(
		$db,
		"SET lock_timeout = '20s'; SELECT pepsi.workqueue_commit($id, 'relay', 'finish')",
		stdout => \$out,
		stderr => \$err);
	last if $rc != 0;
}
is($rc, 0, 'siblings finish while another release of the body is not committed')
  or diag($err);
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.workqueue_body WHERE id = $body"),
	'1', 'the body stays while siblings are left');

$open->query_safe('COMMIT');
$open->quit;
my %done = map { $_ => 1 } @free[ 0 .. $#free - 1 ];
$node->safe_psql($db, "SELECT pepsi.workqueue_commit($_, 'relay', 'finish')")
  for grep { !$done{$_} } @ids[ 1 .. 9 ];
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue'), '0', 'every sibling finished');
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue_body'),
	'0', 'the last sibling frees the body at once');

done_testing();
