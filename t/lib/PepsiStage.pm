# Helpers for the TAP tests of the stage runtime (common/runtime/stage.c): a cluster
# that counts statements (pg_stat_statements), configuration files that
# point the workers at it, queue rows set running as the dispatcher's claim
# would, and real worker processes from $PEPSI_BIN fed ids on stdin.

package PepsiStage;

use strict;
use warnings FATAL => 'all';

use Exporter 'import';
use File::Basename qw(basename);
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiTest;

our @EXPORT = qw(
  stage_node stage_config worker_cmd unified_cmd run_worker start_worker
  send_ids add_row set_running row_snapshot row_json rows_at
  statement_calls reset_statements decode_status deliveries %QUEUE_STATEMENT
);

my $json = JSON::PP->new->canonical;

my $bin = $ENV{PEPSI_BIN}
  or BAIL_OUT('PEPSI_BIN is not set: it names a copy of build/bin (see scripts/check.sh)');
my $tmp_dir;

# Files of this test: made on first use, since PostgreSQL::Test::Utils only
# knows its tmp_check directory once its INIT block has run.
sub tmp
{
	$tmp_dir //= PostgreSQL::Test::Utils::tempdir();
	return $tmp_dir;
}

# A started cluster with the pepsi extension and pg_stat_statements.
sub stage_node
{
	my ($name) = @_;
	my $node = pepsi_node(
		$name,
		extension => 1,
		conf => "shared_preload_libraries = 'pg_stat_statements'\n"
		  . "pg_stat_statements.max = 1000\n");

	$node->safe_psql('postgres', 'CREATE EXTENSION pg_stat_statements');
	return $node;
}

# Write $text as a configuration file, after a [database] section aimed at
# $node unless $text has its own.  Returns the path.
sub stage_config
{
	my ($node, $name, $text) = @_;
	my $path = tmp() . "/$name";
	my $database =
	  sprintf("[database]\nCONNINFO = host=%s port=%d dbname=postgres\n\n",
		$node->host, $node->port);

	open my $fh, '>', $path or die "cannot write $path: $!";
	print $fh ($text =~ /^\[database\]/m ? '' : $database), $text;
	close $fh;
	return $path;
}

# The command of a standalone worker: build/bin/PROGRAM worker -c CONFIG.
sub worker_cmd
{
	my ($program, $config) = @_;

	return [ "$bin/$program", 'worker', '-c', $config ];
}

# The same program through the multi-call binary, run by a symlink named
# for it, as make install lays it out.
sub unified_cmd
{
	my ($program, $config) = @_;
	my $link = tmp() . "/unified/$program";

	mkdir tmp() . '/unified';
	symlink("$bin/pepsi", $link) or die "cannot link $link: $!"
	  unless -l $link;
	return [ $link, 'worker', '-c', $config ];
}

# Run a worker to the end of $input (written to a file first, so every
# id is waiting before the worker reads: what arrives together is one
# batch).  Returns { exit, status => [lines], stdout, stderr }.
sub run_worker
{
	my ($cmd, $input) = @_;
	my $file = tmp() . '/input.' . int(rand(1e9));
	my ($out, $err) = ('', '');

	open my $fh, '>', $file or die "cannot write $file: $!";
	print $fh $input;
	close $fh;
	IPC::Run::run($cmd, '<', $file, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	unlink $file;
	return {
		exit => $? >> 8,
		status => [ split /\n/, $out ],
		stdout => $out,
		stderr => $err
	};
}

# A worker kept running, fed through send_ids.  Returns the harness and
# the hash its pipes fill.
sub start_worker
{
	my ($cmd) = @_;
	my $io = { in => '', out => '', err => '' };

	$io->{timer} = IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default);
	$io->{harness} = IPC::Run::start($cmd, '<', \$io->{in}, '>', \$io->{out},
		'2>', \$io->{err}, $io->{timer});
	return $io;
}

# Write $text to a started worker and wait for $count more status lines
# (no sleeping: pump until they are there or the timer runs out).  Returns
# the new status lines.
sub send_ids
{
	my ($io, $text, $count) = @_;
	my $before = () = $io->{out} =~ /\n/g;

	$io->{timer}->start($PostgreSQL::Test::Utils::timeout_default);
	$io->{in} .= $text;
	$io->{harness}->pump
	  until (() = $io->{out} =~ /\n/g) >= $before + $count;
	my @lines = split /\n/, $io->{out};
	return @lines[ $before .. $#lines ];
}

# A message at $stage, set running as the dispatcher's claim would.
# Options: from, rcpt => [...], state => {...}, extra_headers (after Subject and
# From), running (default 1).
sub add_row
{
	my ($node, $stage, %opt) = @_;
	my $from = $opt{from} // 'sender@example.net';
	my $rcpt = join(',', map { quote_literal($_) } @{ $opt{rcpt} // ['rcpt@example.org'] });
	my $state = quote_literal($json->encode($opt{state} // {}));
	my $headers = quote_literal("Subject: test\r\nFrom: <$from>\r\n" . ($opt{extra_headers} // ''));
	my $id = $node->safe_psql('postgres',
		    'SELECT pepsi.workqueue_add(' . quote_literal($from)
		  . ", ARRAY[$rcpt], convert_to($headers, 'UTF8'),"
		  . " convert_to('Hello.', 'UTF8'), ${state}::jsonb, stage => "
		  . quote_literal($stage) . ')');
	set_running($node, $id) if $opt{running} // 1;
	return $id;
}

sub set_running
{
	my ($node, @ids) = @_;

	$node->safe_psql('postgres',
		"UPDATE pepsi.workqueue SET status = 'running' WHERE id IN ("
		  . join(',', @ids) . ')');
}

sub quote_literal
{
	my ($s) = @_;

	$s =~ s/'/''/g;
	return "'$s'";
}

# Every column of a row as one string, '' when the row is gone: two equal
# snapshots mean the row was left exactly as it was.
sub row_snapshot
{
	my ($node, $id) = @_;

	return $node->safe_psql('postgres',
		"SELECT row_to_json(w)::text FROM pepsi.workqueue w WHERE id = $id");
}

# A row as a hash: stage, status, state (decoded), rcpt_to (array),
# mail_from, body_id, pending_seq, due (seconds until timeout); undef when gone.
sub row_json
{
	my ($node, $id) = @_;
	my $text = $node->safe_psql('postgres',
		    "SELECT json_build_object('id', id, 'stage', stage, 'status', status,"
		  . " 'state', state, 'rcpt_to', rcpt_to, 'mail_from', mail_from,"
		  . " 'headers', encode(headers, 'escape'), 'body_id', body_id,"
		  . " 'pending_seq', pending_seq,"
		  . " 'due', CASE WHEN isfinite(timeout) THEN extract(epoch FROM timeout - now()) END)::text"
		  . " FROM pepsi.workqueue WHERE id = $id");

	return $text eq '' ? undef : $json->decode($text);
}

# The ids of the rows at $stage, in id order.
sub rows_at
{
	my ($node, $stage) = @_;

	return split /\n/,
	  $node->safe_psql('postgres',
		'SELECT id FROM pepsi.workqueue WHERE stage = ' . quote_literal($stage) . ' ORDER BY id');
}

sub reset_statements
{
	my ($node) = @_;

	$node->safe_psql('postgres', 'SELECT pg_stat_statements_reset()');
}

# LIKE patterns for statement_calls: the stage runtime's statements on the
# queue (common/stage*.c), named once for every test that counts them.
our %QUEUE_STATEMENT = (
	load_full => '%w.headers, b.body FROM pepsi.workqueue w JOIN%',
	load_meta => '%received_at) * $_)::int8::text FROM pepsi.workqueue w WHERE w.id = ANY%',
	late_full => 'SELECT w.id::text, w.headers, b.body FROM%',
	commit_one => '%pepsi.workqueue_commit(%',
	commit_many => '%pepsi.workqueue_commit_many(%');

# Calls and rows of the statements whose text matches the LIKE $pattern
# (summed), as "calls/rows".
sub statement_calls
{
	my ($node, $pattern) = @_;

	return $node->safe_psql('postgres',
		    "SELECT coalesce(sum(calls), 0) || '/' || coalesce(sum(rows), 0)"
		  . ' FROM pg_stat_statements WHERE query LIKE ' . quote_literal($pattern)
		  . " AND query NOT LIKE '%pg_stat_statements%'");
}

# A status line as (code, report hash or undef).
sub decode_status
{
	my ($line) = @_;
	my ($code, $report) = $line =~ /^(\d+)(?: (\{.*\}))?$/
	  or return (undef, undef);

	return ($code, defined $report ? $json->decode($report) : undef);
}

# Each status line's delivery outcome (its report's delivery status), or 'none'.
sub deliveries
{
	my ($lines) = @_;
	return map {
		my (undef, $report) = decode_status($_);
		$report && $report->{delivery} ? $report->{delivery}{status} : 'none'
	} @$lines;
}

1;
