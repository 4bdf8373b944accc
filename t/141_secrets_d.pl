# secrets.d: the secrets (schema/options.def SECRET) come from fragments
# of secrets.d beside pepsi.conf, never from pepsi.conf.  pepsi-stage-srs
# signs with the [srs] SECRET of a fragment, which Mail::SRS (the reference
# implementation) reverses with the same secret; a secret written in
# pepsi.conf, a fragment others may read and a fragment holding an option
# that is no secret are each refused at start with the file and the reason,
# and nothing is rewritten.

use strict;
use warnings FATAL => 'all';

use Mail::SRS;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiStage;
use PepsiTest;

my $node = stage_node('secrets');
my $srs_domain = 'srs.example.org';
my $secret = 'fragment-secret-' . int(rand(1e9));

my $conf_text = <<"INI";
[pepsi]
HOSTNAME = mx.example.org
LOCAL_DOMAINS = example.org

[srs]
DOMAIN = $srs_domain

[stage-srs]
PROGRAM = pepsi-stage-srs
NEXT_STAGE = sign
INI
my $conf = stage_config($node, 'pepsi.conf', $conf_text);
my $secrets = PepsiStage::tmp() . '/secrets.d';
mkdir $secrets, 0755 or die "mkdir $secrets: $!";

sub fragment
{
	my ($name, $text, $mode) = @_;
	my $path = "$secrets/$name";

	unlink $path;
	PostgreSQL::Test::Utils::append_to_file($path, $text);
	chmod $mode, $path or die "chmod $path: $!";
	return $path;
}

# A fragment of mode 0640 (the group that reads it: here the test's own).
fragment('srs.conf', "[srs]\nSECRET = $secret\n", 0640);
my $row = add_row($node, 'srs', from => 'alice@remote.example');
my $r = run_worker(worker_cmd('pepsi-stage-srs', $conf), "$row\n");
is_deeply($r->{status}, ['0'], 'the stage starts with its secret from secrets.d') or diag($r->{stderr});
my $rewritten = row_json($node, $row)->{mail_from};
like($rewritten, qr/^SRS0=.*\@\Q$srs_domain\E$/, 'and rewrites the sender');
is(Mail::SRS->new(Secret => [$secret], HashLength => 8)->reverse($rewritten),
	'alice@remote.example', 'signed with the fragment\'s secret: Mail::SRS reverses it');

# Each refusal: the program does not start, names the file and the reason, and the row is untouched.
sub refused
{
	my ($what, $want) = @_;
	my $id = add_row($node, 'srs', from => 'bob@remote.example');
	my $res = run_worker(worker_cmd('pepsi-stage-srs', $conf), "$id\n");

	isnt($res->{exit}, 0, "$what: the stage does not start");
	like($res->{stderr}, $want, "$what: it says where and why");
	is(row_json($node, $id)->{mail_from}, 'bob@remote.example', "$what: nothing rewritten");
}

fragment('srs.conf', "[srs]\nSECRET = $secret\n", 0644);
refused('a fragment others may read', qr/\Q$secrets\E\/srs\.conf: refused: mode 0644 gives more than 0640/);

fragment('srs.conf', "[srs]\nSECRET = $secret\nMAX_AGE = 5\n", 0640);
refused('a fragment holding an option that is no secret',
	qr/\Q$secrets\E\/srs\.conf:3: \[srs\] MAX_AGE is not a secret/);

unlink "$secrets/srs.conf";
stage_config($node, 'pepsi.conf', $conf_text =~ s/(DOMAIN = \S+\n)/$1SECRET = $secret\n/r);
refused('a secret in pepsi.conf', qr/\Q$conf\E:\d+: \[srs\] SECRET is a secret: set it in a fragment of \Q$secrets\E/);
my $id = add_row($node, 'srs', from => 'carol@remote.example');
unlike(run_worker(worker_cmd('pepsi-stage-srs', $conf), "$id\n")->{stderr}, qr/\Q$secret\E/,
	'the refusal does not repeat the secret');

done_testing();
