# pepsi-dispatch refuses a configuration whose stage graph is broken, at
# start, with a message that says where and why, before it touches the
# database: a *_STAGE naming a missing section, an INIT_STAGE naming one, a
# cycle with no exit, a stage that only leads to itself, a PARALLELISM of 0,
# a stage with no PROGRAM, a malformed [dispatch] option.  A cycle with a
# way out is fine.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $node = dispatch_node('dispatch_config');
my $dir = PostgreSQL::Test::Utils::tempdir();

# Write $stages as the [stage-*] part of a configuration, start the
# dispatcher on it and wait for it to exit.  Returns (exit status, log,
# path of the file).
sub refused
{
	my ($name, $stages, %opts) = @_;
	my $path = "$dir/$name.conf";
	my $log = "$dir/$name.log";

	write_config($node, path => $path, stages => $stages, %opts);
	my $d = start_dispatcher($path, log => $log);
	my $status = dispatcher_exit($d, 30);
	if (!defined $status)
	{
		stop_dispatcher($d, 'KILL');
		$status = 'still running';
	}
	return ($status, dispatcher_log($d), $path);
}

my @cases = (
	[
		'missing NEXT_STAGE',
		"[stage-init]\nPROGRAM = pepsi-stage-discard\nNEXT_STAGE = nowhere\n",
		qr/:LINE: \[stage-init\] NEXT_STAGE names stage "nowhere", which has no \[stage-nowhere\] section/
	],
	[
		'missing THEN_STAGE',
		"[stage-init]\nPROGRAM = pepsi-stage-if\nCONDITION = rcpt_count > 1\n"
		  . "THEN_STAGE = split\nELSE_STAGE = init2\n[stage-init2]\nPROGRAM = pepsi-stage-discard\n",
		qr/:LINE: \[stage-init\] THEN_STAGE names stage "split", which has no \[stage-split\] section/
	],
	[
		'missing INIT_STAGE',
		"[stage-init]\nPROGRAM = pepsi-stage-discard\n",
		qr/:LINE: \[ingress\] INIT_STAGE names stage "entry", which has no \[stage-entry\] section/,
		pepsi => undef,
		extra => "[ingress]\nINIT_STAGE = entry\n"
	],
	[
		'cycle with no exit',
		"[stage-init]\nPROGRAM = pepsi-stage-if\nCONDITION = rcpt_count > 1\nTHEN_STAGE = a\nELSE_STAGE = a\n"
		  . "[stage-a]\nPROGRAM = pepsi-stage-route\nLOCAL_DOMAINS = example.org\n"
		  . "LOCAL_STAGE = b\nREMOTE_STAGE = b\n"
		  . "[stage-b]\nPROGRAM = pepsi-stage-if\nCONDITION = rcpt_count > 1\nTHEN_STAGE = a\nELSE_STAGE = a\n",
		qr/: stages (?:a -> b|b -> a) form a cycle with no exit: a message that enters it can never leave/
	],
	[
		'stage leading to itself',
		"[stage-init]\nPROGRAM = pepsi-stage-route\nLOCAL_DOMAINS = example.org\n"
		  . "LOCAL_STAGE = init\nREMOTE_STAGE = init\n",
		qr/: stage init names only itself as the next stage: a message that enters it can never leave/
	],
	[
		'PARALLELISM = 0',
		"[stage-init]\nPROGRAM = pepsi-stage-discard\nPARALLELISM = 0\n",
		qr/:LINE: \[stage-init\] PARALLELISM = 0: PARALLELISM is a whole number from 1 to 1024\./
	],
	[
		'BULK_NICE = 20',
		"[stage-init]\nPROGRAM = pepsi-stage-discard\nBULK_NICE = 20\n",
		qr/:LINE: \[stage-init\] BULK_NICE = 20: BULK_NICE is a whole number from 0 to 19\./
	],
	[
		'no PROGRAM',
		"[stage-init]\nNEXT_STAGE = init2\n[stage-init2]\nPROGRAM = pepsi-stage-discard\n",
		qr/: \[stage-init\] has no PROGRAM/
	],
	[
		'bad [dispatch] option',
		"[stage-init]\nPROGRAM = pepsi-stage-discard\n",
		qr/:LINE: \[dispatch\] WORKER_IDLE_TIMEOUT = soon: WORKER_IDLE_TIMEOUT is a duration: .*/,
		dispatch => { WORKER_IDLE_TIMEOUT => 'soon' }
	],);

for my $case (@cases)
{
	my ($name, $stages, $message, %opts) = @$case;
	my $file_name = $name =~ s/\W+/_/gr;
	my $text = ($opts{extra} // '') . $stages;
	my ($status, $log, $path) = refused($file_name, $text,
		$opts{dispatch} ? (dispatch => $opts{dispatch}) : ());

	# LINE in the expected message stands for the line of the option named.
	my ($option) = $message =~ /\] ([A-Z_]+)[ :]/;
	my @lines = split /\n/, PostgreSQL::Test::Utils::slurp_file($path);
	my ($line) = grep { $lines[ $_ - 1 ] =~ /^\Q$option\E\s*=/ } 1 .. @lines if $option;
	$message =~ s/LINE/$line/ if defined $line;

	ok($status =~ /^\d+$/ && $status != 0, "$name: refused, with a non-zero status");
	like($log, qr/^pepsi\/dispatch\[\d+\]: \Q$path\E$message$/m, "$name: the message says where and why");
	unlike($log, qr/connected to the database|started worker/,
		"$name: refused before touching the database");
}

# A cycle with a way out (a retry loop that can bounce) is accepted.
my $path = "$dir/exit.conf";
write_config($node, path => $path, stages => <<'EOF');
[stage-init]
PROGRAM = pepsi-stage-if
CONDITION = rcpt_count > 1
THEN_STAGE = a
ELSE_STAGE = a
[stage-a]
PROGRAM = pepsi-stage-if
CONDITION = state.done exists
THEN_STAGE = out
ELSE_STAGE = init
[stage-out]
PROGRAM = pepsi-stage-discard
EOF
my $d = start_dispatcher($path, log => "$dir/exit.log");
ok(poll_until(sub { dispatcher_log($d) =~ /connected to the database/ }),
	'a cycle with an exit is accepted: the dispatcher starts');
is(stop_dispatcher($d, 'TERM'), 0, 'and stops cleanly');

done_testing();
