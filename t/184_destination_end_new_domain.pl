# destination_end at a destination that has no pepsi.destination row yet
# (extension/sql/pepsi--0.14--0.15.sql): the workers that start on a new domain
# at once, as a list's VERP fan-out grouped by domain makes them, all find
# no row and each has the TLS result to keep.  One of them writes it; the
# others must not wait for its commit only to find the row there (an
# INSERT ... ON CONFLICT waits on a conflicting row not yet committed):
# while one transaction has written the row and not committed, another's
# destination_end returns at once, under a lock_timeout that a wait would
# break.  What the first wrote is kept, and a later delivery's result still
# updates it as before.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::Bin/lib";
use PepsiTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $db = 'postgres';
my $node = pepsi_node('destination_end_new', extension => 1);

my $end = sub {
	my ($domain, $policy, $outcome) = @_;
	return "SELECT pepsi.destination_end('$domain', NULL, 'connected', NULL, 'mx.$domain',"
	  . " '192.0.2.7', NULL, NULL, 3, 60, 3600, 0.1, '$policy', '$outcome')";
};

# The first worker: its row written, its transaction open.
my $first = $node->background_psql($db, on_error_stop => 1);
$first->query_safe('BEGIN');
$first->query_safe($end->('new.example', 'sts', 'success'));

# The second, at the same new domain: no wait for the first's commit.
my ($rc, $out, $err) = $node->psql($db,
	"SET lock_timeout = '3s'; " . $end->('new.example', 'sts', 'success'));
is($rc, 0, 'a second worker ending at the same new domain does not wait for the first one')
  or diag($err);
unlike($err, qr/lock timeout/, 'no lock wait timed out');

# A third while the first is still open: the same.
($rc, $out, $err) = $node->psql($db,
	"SET lock_timeout = '3s'; " . $end->('new.example', 'dane', 'failure'));
is($rc, 0, 'nor does a third with another result') or diag($err);

$first->query_safe('COMMIT');
$first->quit;
is( $node->safe_psql(
		$db,
		"SELECT tls_policy || ' ' || tls_outcome FROM pepsi.destination WHERE domain = 'new.example'"),
	'sts success',
	'the first worker\'s TLS result is the one recorded');

# With the row there, a different result is written as before.
$node->safe_psql($db, $end->('new.example', 'dane', 'failure'));
is( $node->safe_psql(
		$db,
		"SELECT tls_policy || ' ' || tls_outcome FROM pepsi.destination WHERE domain = 'new.example'"),
	'dane failure',
	'a later delivery\'s other result replaces it');

# Alone at a new domain, a worker writes the row at once.
$node->safe_psql($db, $end->('alone.example', 'none', 'success'));
is( $node->safe_psql(
		$db,
		"SELECT tls_policy || ' ' || tls_outcome FROM pepsi.destination WHERE domain = 'alone.example'"),
	'none success',
	'a worker alone at a new domain records its TLS result');

$node->stop;
done_testing();
