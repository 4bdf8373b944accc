# The tree's layout, read from the source and needing no cluster.
#
# docs/architecture.md is the map of the code: every directory of common/
# (but the fuzz corpora and test data, which belong to the directory that
# reads them), of daemons/, stages/, helpers/ and cli/, and programs/ and
# every extension/src/*.c, is named there in backquotes; and what it names
# in backquotes as a file of the tree exists.  No C file grows past 1,000
# lines unnoticed (STYLE.md: such a file is two files waiting to be named):
# a new one fails, and the files still waiting to be split are listed
# below, the list only ever shrinking.  Those files and the functions over
# 120 lines are reported (diag), not failed.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(basename dirname);
use File::Find;
use Test::More;

my $top = $ENV{PEPSI_TOP} // dirname(__FILE__) . '/..';
my $map_file = 'docs/architecture.md';
my $file_limit = 1000;
my $function_limit = 120;

# The C files over $file_limit lines that are still to be split, with
# their length when they were listed.  Take a file off once it is split;
# add one only when a split cannot be made yet, saying why in the commit.
my %waiting_to_be_split = (
);

# Where the C code is, for the limits.
my @c_roots = qw(common schema daemons stages cli helpers programs extension/src scripts);

sub slurp
{
	my ($path) = @_;
	open(my $fh, '<', $path) or die "cannot read $path: $!";
	local $/;
	my $text = <$fh>;
	close($fh);
	return $text;
}

# Every file or directory (per $want) below $dir, as a path from $top,
# skipping the directories $skip matches and what is in them.
sub tree
{
	my ($dir, $want, $skip) = @_;
	my @found;

	find(
		{
			no_chdir => 1,
			wanted => sub {
				my $rel = $File::Find::name =~ s{^\Q$top\E/}{}r;
				if (-d $_ && $skip && $rel =~ $skip)
				{
					$File::Find::prune = 1;
					return;
				}
				push @found, $rel if $want->($_);
			},
		},
		"$top/$dir");
	return sort @found;
}

ok(-f "$top/$map_file", "$map_file is in the tree at $top (PEPSI_TOP)")
  or BAIL_OUT("no source tree at $top: set PEPSI_TOP");
my $map = slurp("$top/$map_file");
my %quoted = map { $_ => 1 } $map =~ /`([^`\n]+)`/g;

# --- the map names every directory and every file of the extension -------

my @directories = (
	tree('common', sub { -d $_[0] }, qr{/(?:corpus|data)$}),
	(map { s{^\Q$top\E/}{}r } grep { -d } map { glob("$top/$_/*") } qw(daemons stages helpers cli)),
	'programs');
my @extension_files = map { s{^\Q$top\E/}{}r } glob("$top/extension/src/*.c");
# A map checked against nothing would pass: the tree must have been found.
cmp_ok(scalar @directories, '>', 20, 'the directories of the code are found');
cmp_ok(scalar @extension_files, '>', 10, 'the files of the extension are found');

foreach my $path (@directories, @extension_files)
{
	my $named = $quoted{$path} || $quoted{"$path/"};
	ok($named, "$map_file names $path")
	  or diag("$path is not on the map: add a line for it to \"A map of the tree\" in $map_file,"
		  . " saying what it holds (`$path" . (-d "$top/$path" ? '/' : '') . "`: ...)");
}

# --- and names nothing that is gone -----------------------------------------

# A quoted path under one of these is a file or directory of the tree; a
# quoted bare name of a C source is one somewhere in the code.  (Globs and
# placeholders, `stages/*/tests/`, `daemons/X` or `pepsi--A--B.sql`, are
# not names.)
my $tree_dirs = qr{^(?:common|schema|daemons|stages|helpers|cli|programs|extension|dist|bench|docs|regress|scripts|t)/};
my %code_names = map { basename($_) => 1 }
  map { tree($_, sub { -f $_[0] }) } @c_roots, 'extension';
my @stale;
foreach my $name (sort keys %quoted)
{
	next if $name =~ /[*<>\$\s]/ || $name =~ m{(?:^|/)[A-Z]+(?:/|$)};
	if ($name =~ $tree_dirs)
	{
		push @stale, $name unless -e "$top/$name";
	}
	elsif ($name =~ /^[\w.-]+\.(?:c|h|def)$/)
	{
		push @stale, $name unless $code_names{$name};
	}
}
is_deeply(\@stale, [], "every file $map_file names exists")
  or diag("named in $map_file but not in the tree (renamed or removed? say what is there now): @stale");

# --- no C file over the limit but those waiting to be split ----------------

my %lines;
foreach my $file (map { tree($_, sub { -f $_[0] && $_[0] =~ /\.c$/ }) } @c_roots)
{
	$lines{$file} = () = slurp("$top/$file") =~ /\n/g;
}
cmp_ok(scalar keys %lines, '>', 100, 'the C files are found');

my @over = grep { $lines{$_} > $file_limit && !$waiting_to_be_split{$_} } sort keys %lines;
foreach my $file (@over)
{
	fail("$file has $lines{$file} lines, over $file_limit");
	diag("$file has $lines{$file} lines: a file past $file_limit lines is two files waiting to be named"
		  . " (STYLE.md).  Split it by what each part does, one subsystem per file.  Only when a split"
		  . " cannot be made yet, and the commit says why, add it to %waiting_to_be_split in"
		  . " t/004_layout.pl.");
}
pass("no other C file is over $file_limit lines") unless @over;

foreach my $file (sort keys %waiting_to_be_split)
{
	my $now = $lines{$file};

	if (!defined $now)
	{
		fail("$file, waiting to be split, is gone: remove it from the list");
		diag("$file is no longer in the tree: remove it from %waiting_to_be_split in t/004_layout.pl");
		next;
	}
	ok($now > $file_limit, "$file, waiting to be split, is still over $file_limit lines")
	  or diag("$file has $now lines now, within the limit: remove it from %waiting_to_be_split in"
		  . " t/004_layout.pl, so that it cannot grow past it again unnoticed");
	diag("warning: $file has $now lines (listed at $waiting_to_be_split{$file}), over $file_limit:"
		  . " waiting to be split")
	  if $now > $file_limit;
}

# --- functions over 120 lines (warnings only) ------------------------------

# The code is as clang-format leaves it (make format-check), PostgreSQL's
# layout: a definition's return type on a line of its own, then its name
# at column 0 (the parameters may continue on indented lines), the opening
# brace alone at column 0, and the closing brace the next line that starts
# with one at column 0.  A struct or an initializer never has a name and
# "(" at column 0 just above its brace.  Length: from the name to the
# closing brace.
my ($functions, @long);
foreach my $file (sort keys %lines)
{
	my @text = split /\n/, slurp("$top/$file");
	my ($name, $start);

	for my $i (0 .. $#text)
	{
		if (!defined $start && $text[$i] =~ /^\{/)
		{
			my $j = $i - 1;
			$j-- while $j >= 0 && $text[$j] =~ /^\s/;
			($name, $start) = ($1, $j) if $j >= 0 && $text[$j] =~ /^(\w+)\(/;
		}
		elsif (defined $start && $text[$i] =~ /^\}/)
		{
			my $length = $i - $start + 1;
			$functions++;
			push @long, [ $file, $start + 1, $name, $length ] if $length > $function_limit;
			undef $start;
		}
	}
}
# A scan that recognised nothing would warn of nothing.
cmp_ok($functions // 0, '>', 1000, 'the function scan finds the definitions');
diag("warning: $_->[0]:$_->[1] $_->[2] is $_->[3] lines, over $function_limit: one job per function")
  foreach sort { $b->[3] <=> $a->[3] } @long;

done_testing();
