# The SPF evaluator (common/auth/spf.c) over the OpenSPF RFC 7208 test
# suite, as Debian's python3-spf ships it: every scenario's zone served by
# the DNS backend of pepsi-test-spf-suite (t/spf/spf_suite.c), every test
# one TAP case: its result one of those the suite allows and, where the
# suite names one, the same explanation ("DEFAULT": the default one).
# No case is skipped.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;

my $suite_yaml = '/usr/share/doc/python3-spf/rfc7208-tests.yml.gz';
my $bin = ($ENV{PEPSI_BIN} // dirname(__FILE__) . '/../build/bin') . '/pepsi-test-spf-suite';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $json = "$tmp/rfc7208.json";

BAIL_OUT("$suite_yaml is missing: install python3-spf") unless -e $suite_yaml;

my ($out, $err) = run_command(
	[ '/usr/bin/python3', dirname(__FILE__) . '/spf/rfc7208_to_json.py', $suite_yaml ]);
BAIL_OUT("cannot convert the suite: $err") unless length $out;
PostgreSQL::Test::Utils::append_to_file($json, $out);
my $suite = JSON::PP->new->decode($out);

($out, $err) = run_command([ $bin, $json ]);
my %got;
for (split /\n/, $out)
{
	my ($name, $result, $explanation, $reason) = split /\t/;
	$got{$name} = { result => $result, explanation => $explanation, reason => $reason };
}

my $cases = 0;
for my $scenario (@$suite)
{
	for my $t (@{ $scenario->{tests} })
	{
		my $g = $got{ $t->{name} };
		my $what = "$scenario->{description}: $t->{name} (RFC 7208 $t->{spec})";

		$cases++;
		if (!$g)
		{
			fail("$what: no result");
			next;
		}
		my $ok = grep { $_ eq $g->{result} } @{ $t->{result} };
		ok($ok, "$what: $g->{result}")
		  or diag("expected one of @{ $t->{result} }, got $g->{result} ($g->{reason})");
		is($g->{explanation}, $t->{explanation}, "$what: explanation")
		  if defined $t->{explanation};
	}
}
is($cases, 203, 'the suite holds the 203 tests of its 2014.04 release');
is(scalar(keys %got), $cases, 'every test gave one result line') or diag($err);

done_testing();
