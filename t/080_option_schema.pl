# The option schema is one: every option pepsi.config_option lists (the
# extension's copy of schema/options.def) is accepted by pepsi.config_set
# with a valid value and refused with an invalid one, at the scopes its
# line allows and no other; and the programs (common/config/config.c, here through
# a stage worker loading pepsi.conf and the overrides) accept and refuse
# exactly the same.  An option added to one side only, or checked
# differently by the two, fails here.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Basename ();
use POSIX ();

use PepsiTest;
use PepsiStage;

my $node = stage_node('option_schema');

# The checks of the database side, each a statement and what its stderr
# must be, run in one psql session (psql_each_stderr) and asserted in order.
my @checks;

sub expect_error
{
	my ($sql, $check, $pattern, $name) = @_;

	push @checks, [ $sql, $check, $pattern, $name ];
	return;
}

# A value each kind accepts, and values it refuses.
sub samples
{
	my ($o) = @_;
	my ($kind, $min, $max) = @$o{qw(kind min_value max_value)};

	return ('on', ['maybe']) if $kind eq 'boolean';
	return ($min, [ 'ten', ($max ne '' ? $max + 1 : ()), ($min > 0 ? $min - 1 : ()) ])
	  if $kind eq 'integer';
	return (($min > 0 ? "${min}ms" : '2s'),
		[ '5 parsecs', ($min > 0 ? ($min - 1) . 'ms' : ()), ($max ne '' ? ($max + 1) . 'ms' : ()) ])
	  if $kind eq 'duration';
	return (($min > 0 ? $min : '1k'), [ '10 MB', ($max ne '' ? $max + 1 : ()) ]) if $kind eq 'size';
	return ('next-stage', ['Next Stage']) if $kind eq 'stage';
	return ('pepsi-stage-discard', ['/bin/sh']) if $kind eq 'program';
	return ('mx.example.org', ['mx..example.org']) if $kind eq 'domain';
	return ('example.org, example.net', ['example.org, -bad']) if $kind eq 'domain_list';
	return ('a@example.org b@example.net', ['no-at-sign']) if $kind eq 'address_list';
	return ('/tmp/anything', ['relative/path']) if $kind eq 'path';
	return ((split /\|/, $o->{choices})[-1], ['not-a-choice']) if $kind eq 'enum';
	return ('pepsi-test.2_x', [ 'pepsi test', 'pepsi/mx', 'x' x ($max + 1) ]) if $kind eq 'name';
	return ('some text', []) if $kind eq 'text';
	die "no samples for kind $kind";
}

my @columns = qw(section program option kind scope default_value min_value max_value choices);
my @options = map {
	my %o;
	@o{@columns} = split /\x1f/, $_, -1;
	\%o
} split /\n/, $node->safe_psql('postgres',
	'SELECT concat_ws(chr(31), ' . join(', ', map { "coalesce(${_}::text, '')" } @columns)
	  . ') FROM pepsi.config_option ORDER BY section, program NULLS FIRST, option');
cmp_ok(scalar @options, '>', 50, 'pepsi.config_option lists the schema');

# Each option gets a section of its own kind: a stage program's its own
# [stage-*] whose PROGRAM names it (in the file and as an override).
my (%section_of, %programs);
for my $o (@options)
{
	(my $section = $o->{section}) =~ s/\*$/x/;
	if ($o->{program} ne '')
	{
		$programs{ $o->{program} } //= 'stage-p' . scalar(keys %programs);
		$section = $programs{ $o->{program} };
	}
	$section_of{"$o->{section}/$o->{program}/$o->{option}"} = $section;
}
for my $program (sort keys %programs)
{
	$node->safe_psql('postgres',
		"SELECT pepsi.config_set('global', '$programs{$program}', 'PROGRAM', '$program')");
}

# The secret options (schema/options.def SECRET) are read only from a
# secrets.d fragment beside the file, never from the file itself.
my %secret;
{
	my $def = ($ENV{PEPSI_TOP} // File::Basename::dirname(__FILE__) . '/..') . '/schema/options.def';
	open my $fh, '<', $def or die "cannot read $def: $!";
	while (<$fh>)
	{
		$secret{"$1/$2"} = 1 if /^SECRET\("([^"]+)", "([^"]+)"\)/;
	}
	close $fh;
}
ok(scalar(keys %secret) > 0, 'options.def marks secret options');

# The database side.
my (%file, %fragment);
for my $o (@options)
{
	my $section = $section_of{"$o->{section}/$o->{program}/$o->{option}"};
	my $name = "[$section] $o->{option}";
	my ($valid, $invalid) = samples($o);

	my $where = $o->{program} ne '' ? $o->{program} : $o->{section};
	my $into = $secret{"$where/$o->{option}"} ? \%fragment : \%file;
	push @{ $into->{$section} }, "$o->{option} = $valid"
	  unless $o->{option} eq 'PROGRAM' || $section eq 'database';
	next if $o->{option} eq 'PROGRAM';
	if ($o->{scope} eq 'file')
	{
		expect_error("SELECT pepsi.config_set('global', '$section', '$o->{option}', '$valid')",
			'like', qr/cannot be overridden/, "$name: file only, no override");
		next;
	}
	expect_error("SELECT pepsi.config_set('global', '$section', '$o->{option}', '$valid')",
		'is', '', "$name: config_set accepts \"$valid\"");
	for my $bad (@$invalid)
	{
		expect_error("SELECT pepsi.config_set('global', '$section', '$o->{option}', '$bad')",
			'like', qr/invalid value "\Q$bad\E" for $o->{option}/, "$name: config_set refuses \"$bad\"");
	}
	my %allowed = (
		global => [ 'global' ],
		domain => [ 'global', 'domain' ],
		address => [ 'global', 'domain', 'address' ]);
	my %scope = (domain => 'domain:example.org', address => 'address:a@example.org');
	for my $kind ('domain', 'address')
	{
		my $sql = "SELECT pepsi.config_validate('$scope{$kind}', '$section', '$o->{option}', '$valid')";
		if (grep { $_ eq $kind } @{ $allowed{ $o->{scope} } })
		{
			expect_error($sql, 'is', '', "$name: the $kind scope is allowed");
		}
		else
		{
			expect_error($sql, 'like', qr/takes the global/, "$name: the $kind scope is refused");
		}
	}
}

my @errors = psql_each_stderr($node, 'postgres', [ map { $_->[0] } @checks ]);
for my $i (0 .. $#checks)
{
	my (undef, $check, $pattern, $name) = @{ $checks[$i] };
	if ($check eq 'is') { is($errors[$i], $pattern, $name); }
	else { like($errors[$i], $pattern, $name); }
}

# The programs' side: pepsi.conf with every valid value, and every override
# config_set took above, load in a stage worker.
sub probe
{
	my ($name, $text) = @_;

	return run_worker(worker_cmd('pepsi-test-probe', stage_config($node, $name, $text)), '');
}

my $conf = '';
for my $section (sort keys %file)
{
	my ($program) = grep { $programs{$_} eq $section } keys %programs;
	$conf .= "[$section]\n" . ($program ? "PROGRAM = $program\n" : '') . join("\n", @{ $file{$section} }) . "\n";
}
my $secrets = PepsiStage::tmp() . '/secrets.d';
mkdir $secrets, 0755 or die "mkdir $secrets: $!";
my $fragment = join('', map { "[$_]\n" . join("\n", @{ $fragment{$_} }) . "\n" } sort keys %fragment);
PostgreSQL::Test::Utils::append_to_file("$secrets/all.conf", $fragment);
chmod 0640, "$secrets/all.conf" or die "chmod: $!";
my $loaded = probe('every-option.conf', $conf);
is($loaded->{exit}, 0, 'the programs accept every valid value, in the file and as overrides')
  or diag($loaded->{stderr});

# ... and refuse every invalid one, naming it.  The probes are separate
# processes reading separate files: four run at once (most of a probe's
# time is its start and its connection), and are asserted in order.
# Started with fork and exec, each one's stderr in a file, rather than an
# IPC::Run harness each: for some 450 probes the harnesses' own Perl cost
# about as much CPU as the probes.
sub probe_all
{
	my (@texts) = @_;
	my (@results, @running);
	my $next = 0;

	while ($next < @texts || @running)
	{
		while (@running < 4 && $next < @texts)
		{
			my $cmd = worker_cmd('pepsi-test-probe', stage_config($node, "bad-$next.conf", $texts[$next]));
			my $err = PepsiStage::tmp() . "/bad-$next.err";
			my $pid = fork // die "fork: $!";
			if ($pid == 0)
			{
				open(STDIN, '<', '/dev/null') && open(STDOUT, '>', '/dev/null') && open(STDERR, '>', $err)
				  && exec(@$cmd);
				POSIX::_exit(127);
			}
			push @running, { index => $next, pid => $pid, err => $err };
			$next++;
		}
		my $job = shift @running;
		{
			local $SIG{ALRM} = sub { kill 'KILL', $job->{pid}; };
			alarm($PostgreSQL::Test::Utils::timeout_default);
			waitpid($job->{pid}, 0) == $job->{pid} or die "waitpid $job->{pid}: $!";
			alarm(0);
		}
		$results[ $job->{index} ] =
		  { exit => $? >> 8, stderr => PostgreSQL::Test::Utils::slurp_file($job->{err}) };
	}
	return @results;
}

my @bad;
for my $o (@options)
{
	next if $o->{option} eq 'PROGRAM';
	my $section = $section_of{"$o->{section}/$o->{program}/$o->{option}"};
	my $program = $o->{program} ne '' ? "PROGRAM = $o->{program}\n" : '';
	my (undef, $invalid) = samples($o);
	for my $bad (@$invalid)
	{
		next if $o->{kind} eq 'program';	# a path is a program in the file
		push @bad, [ $section, $o->{option}, $bad, "[$section]\n$program$o->{option} = $bad\n" ];
	}
}
my @refused = probe_all(map { $_->[3] } @bad);
for my $i (0 .. $#bad)
{
	my ($section, $option, $bad) = @{ $bad[$i] };
	my $r = $refused[$i];
	ok($r->{exit} != 0 && $r->{stderr} =~ /\[\Q$section\E\] $option = \Q$bad\E: /,
		"[$section] $option: the file's \"$bad\" is refused too") or diag($r->{stderr});
}

# An override written past config_set (by a superuser) at a scope the
# option does not take is refused by the programs as well.
$node->safe_psql('postgres',
	"INSERT INTO pepsi.config_override (scope, section, option, value) "
	  . "VALUES ('domain:example.org', 'dispatch', 'POLL_INTERVAL', '5s')");
my $r = probe('every-option.conf', $conf);
ok($r->{exit} != 0 && $r->{stderr} =~ /override domain:example\.org \[dispatch\] POLL_INTERVAL = 5s refused: .*read once by a process/,
	'a domain-scoped POLL_INTERVAL in the table stops the programs too') or diag($r->{stderr});

done_testing();
