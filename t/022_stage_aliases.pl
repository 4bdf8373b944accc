# pepsi-stage-aliases end to end: recipients rewritten through an
# aliases(5) file by real workers, with the per-recipient DSN parameters
# (state.dsn.rcpt, RFC 3461) rebuilt in lockstep; the file re-read when it
# changes under a running worker; a bad file refused at start with
# file:line.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Sys::Hostname ();

use PepsiTest;
use PepsiStage;

my $node = stage_node('stage_aliases');
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $aliases = "$tmp/aliases";

sub write_aliases
{
	my ($text) = @_;

	open my $fh, '>', "$aliases.new" or die $!;
	print $fh $text;
	close $fh;
	rename "$aliases.new", $aliases or die $!;
}

write_aliases(<<'ALIASES');
# the team, and bob twice over
team: alice, bob,
      carol@example.net
staff: team, bob
loop: loop2
loop2: loop
self: self, self-archive@example.net
ALIASES

my $conf = stage_config($node, 'aliases.conf', <<"INI");
[pepsi]
HOSTNAME = example.org

[stage-expand]
PROGRAM = pepsi-stage-aliases
ALIASES_FILE = $aliases
NEXT_STAGE = expanded
INI

my @notify = map { +{ notify => $_, orcpt => "rfc822;r$_\@example.org" } } ('SUCCESS', 'NEVER', 'FAILURE', 'DELAY', 'SUCCESS,DELAY');
my %origin = (client => '198.51.100.4');

#
# Lockstep: each address takes the DSN parameters of the recipient it
# came from; a duplicate keeps the first.
#
my $row = add_row(
	$node, 'expand',
	rcpt => [ 'staff@example.org', 'bob@example.org', 'ext@other.net', 'loop@example.org', 'self@EXAMPLE.org' ],
	state => { dsn => { ret => 'HDRS', envid => 'abc', rcpt => \@notify }, origin => \%origin });
my $plain = add_row($node, 'expand', rcpt => ['nobody@example.org'], state => { dsn => { rcpt => [ $notify[1] ] } });
my $bare = add_row($node, 'expand', rcpt => ['team@example.org'], state => { origin => \%origin });
my $askew = add_row($node, 'expand', rcpt => [ 'team@example.org', 'x@other.net' ],
	state => { dsn => { rcpt => [ $notify[0] ] } });
my $plain_before = row_json($node, $plain);

my $r = run_worker(worker_cmd('pepsi-stage-aliases', $conf), join('', map { "$_\n" } $row, $plain, $bare, $askew));
is_deeply($r->{status}, [ '0', '0', '0', '0' ], 'every row done') or diag($r->{stderr});

my $expanded = row_json($node, $row);
is_deeply([ @$expanded{qw(stage status)} ], [ 'expanded', 'pending' ], 'the row goes on to NEXT_STAGE');
is_deeply(
	$expanded->{rcpt_to},
	[
		'alice@example.org', 'bob@example.org', 'carol@example.net', 'ext@other.net',
		'loop@example.org', 'self@EXAMPLE.org', 'self-archive@example.net'
	],
	'recipients expanded recursively, duplicates dropped, loops and self-references delivered as themselves'
);
is_deeply(
	$expanded->{state}{dsn}{rcpt},
	[ @notify[ 0, 0, 0, 2, 3, 4, 4 ] ],
	'state.dsn.rcpt rebuilt in lockstep: each address with its original recipient\'s NOTIFY and ORCPT');
is(scalar @{ $expanded->{state}{dsn}{rcpt} }, scalar @{ $expanded->{rcpt_to} },
	'state.dsn.rcpt is as long as rcpt_to');
is_deeply([ @{ $expanded->{state}{dsn} }{qw(ret envid)} ], [ 'HDRS', 'abc' ],
	'the message-level DSN parameters are kept');
is_deeply($expanded->{state}{origin}, \%origin, 'the rest of the state is kept');

my $plain_after = row_json($node, $plain);
is_deeply([ $plain_after->{rcpt_to}, $plain_after->{state} ], [ $plain_before->{rcpt_to}, $plain_before->{state} ],
	'a row with nothing to expand goes on unchanged');
is($plain_after->{stage}, 'expanded', 'and is advanced');

my $bare_after = row_json($node, $bare);
is_deeply($bare_after->{rcpt_to}, [ 'alice@example.org', 'bob@example.org', 'carol@example.net' ],
	'without state.dsn the recipients are still expanded');
is_deeply($bare_after->{state}, { origin => \%origin }, 'and no DSN parameters are made up');

my $askew_after = row_json($node, $askew);
is_deeply($askew_after->{rcpt_to}, [ 'alice@example.org', 'bob@example.org', 'carol@example.net', 'x@other.net' ],
	'a state.dsn.rcpt of the wrong length does not stop the expansion');
is_deeply($askew_after->{state}{dsn}{rcpt}, [ $notify[0] ],
	'but it is left as it was rather than misassigned');

#
# The file changes under a running worker: the next message sees the new
# table, with no restart.
#
{
	my $io = start_worker(worker_cmd('pepsi-stage-aliases', $conf));
	my $first = add_row($node, 'expand', rcpt => ['team@example.org']);
	is_deeply([ send_ids($io, "$first\n", 1) ], ['0'], 'running worker: first message');
	write_aliases("team: dave\n");
	# Make sure the file's time differs even on a coarse clock.
	utime(time + 5, time + 5, $aliases);
	my $second = add_row($node, 'expand', rcpt => ['team@example.org']);
	is_deeply([ send_ids($io, "$second\n", 1) ], ['0'], 'running worker: second message');
	ok($io->{harness}->finish, 'running worker: exits 0');
	is_deeply(row_json($node, $first)->{rcpt_to}, [ 'alice@example.org', 'bob@example.org', 'carol@example.net' ],
		'running worker: the first message used the old table');
	is_deeply(row_json($node, $second)->{rcpt_to}, ['dave@example.org'],
		'running worker: the second the new one, re-read when the file changed');

	# A broken file under a running worker fails the message, not the worker.
	$io = start_worker(worker_cmd('pepsi-stage-aliases', $conf));
	my $third = add_row($node, 'expand', rcpt => ['team@example.org']);
	is_deeply([ send_ids($io, "$third\n", 1) ], ['0'], 'running worker: a message before the break');
	write_aliases("team: dave\nbroken line\n");
	utime(time + 10, time + 10, $aliases);
	my $fourth = add_row($node, 'expand', rcpt => ['team@example.org']);
	my $before = row_snapshot($node, $fourth);
	my ($line) = send_ids($io, "$fourth\n", 1);
	like($line, qr/^1 .*aliases:2: expected/, 'running worker: a broken file fails the message with file:line');
	is(row_snapshot($node, $fourth), $before, 'running worker: and leaves the row as it was');
	write_aliases("team: erin\n");
	utime(time + 15, time + 15, $aliases);
	($line) = send_ids($io, "$fourth\n", 1);
	is($line, '0', 'running worker: once the file is mended the same id goes through');
	ok($io->{harness}->finish, 'running worker: exits 0');
	is_deeply(row_json($node, $fourth)->{rcpt_to}, ['erin@example.org'], 'running worker: with the mended table');
}

#
# A bad file, or no domain to look up, stops the worker at start.
#
{
	write_aliases("ok: fine\npipe: \"|/usr/bin/procmail\"\n");
	my $id = add_row($node, 'expand', rcpt => ['ok@example.org']);
	my $before = row_snapshot($node, $id);
	my $refused = run_worker(worker_cmd('pepsi-stage-aliases', $conf), "$id\n");
	isnt($refused->{exit}, 0, 'a bad aliases file: the worker refuses to start');
	like($refused->{stderr}, qr/\Q$aliases\E:2: alias "pipe": "\\?"?\|\/usr\/bin\/procmail/,
		'a bad aliases file: named with file:line');
	is($refused->{stdout}, '', 'a bad aliases file: no status line');
	is(row_snapshot($node, $id), $before, 'a bad aliases file: the row is left as it was');

	# With neither ALIAS_DOMAINS nor [pepsi] HOSTNAME the domain looked up
	# is the system's host name, the one fallback every program uses.
	write_aliases("ok: fine\n");
	my $nodomain = stage_config($node, 'nodomain.conf', <<"INI");
[stage-expand]
PROGRAM = pepsi-stage-aliases
ALIASES_FILE = $aliases
NEXT_STAGE = expanded
INI
	my $host = lc Sys::Hostname::hostname();
	my $local = add_row($node, 'expand', rcpt => ["ok\@$host"]);
	my $r = run_worker(worker_cmd('pepsi-stage-aliases', $nodomain), "$local\n");
	is_deeply($r->{status}, ['0'], 'no ALIAS_DOMAINS nor HOSTNAME: the worker runs') or diag($r->{stderr});
	is_deeply(row_json($node, $local)->{rcpt_to}, ["fine\@$host"],
		'no ALIAS_DOMAINS nor HOSTNAME: the system host name is the alias domain');
}

done_testing();
