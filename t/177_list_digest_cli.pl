# pepsi-list digest LIST: a list's digest sent now, as the schedule's row
# does when it is due (pepsi.list_digest_now, through list_digest_send):
# the waiting posts in one digest to the digest member only, signed by the
# list, the list_digest rows gone, the run audited in event_log; a second
# run finds nothing.  Bad input: no such list, a list with no digest
# member, nothing waiting, a configuration with no list stage: each a
# clear message and exit status, nothing queued.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use ListTest;
use PepsiTest;
use SignTest;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');

my $db = 'postgres';
my $l = list_setup('list_digest_cli');
my ($node, $tmp, $config) = @$l{qw(node tmp config)};
my %zone = %{ $l->{zone} };

sub sql { return $node->safe_psql($db, shift) }

my $list = sql("SELECT pepsi.list_create('dev\@lists.test', 'owner\@lists.test', 'Developers')");
sql("SELECT pepsi.list_member_add($list, 'alice\@client.test'), pepsi.list_member_add($list, 'bob\@one.test'),"
	  . " pepsi.list_member_add($list, 'dig\@one.test', 'digest')");
my $quiet = sql("SELECT pepsi.list_create('quiet\@lists.test', 'owner\@lists.test', 'No digests')");
sql("SELECT pepsi.list_member_add($quiet, 'alice\@client.test')");

sql('CREATE ROLE operator LOGIN IN ROLE pepsi_config');
my $tool_config = operator_config($node, $config, 'operator');
sub tool
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-list'), '-C', $tool_config, @args ], '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

list_start();

# Bad input first: nothing waits yet.
my ($rc, $out, $err) = tool('digest', 'nosuch@lists.test');
is($rc, 65, 'no such list: exit status 65');
like($err, qr/no mailing list nosuch\@lists\.test/, 'no such list: said so');
($rc, $out, $err) = tool('digest', 'quiet@lists.test');
is($rc, 65, 'a list with no digest member: exit status 65');
like($err, qr/list quiet\@lists\.test has no digest member/, 'a list with no digest member: said so');
($rc, $out, $err) = tool('digest', 'dev@lists.test');
is($rc, 65, 'nothing waiting: exit status 65');
like($err, qr/list dev\@lists\.test has no post waiting for a digest: none sent/, 'nothing waiting: said so');
($rc, $out, $err) = tool('digest', 'dev@lists.test', 'extra', 'words');
is($rc, 64, 'too many words: a usage error');
is(sql("SELECT count(*) FROM pepsi.workqueue"), '0', 'nothing queued by the refusals');
is(sql("SELECT digest_issue FROM pepsi.mailing_list WHERE id = $list"), '0', 'and no issue counted');

# Two posts: each member taking each message gets them, the digest member
# not; both wait for the digest.
for my $subject ('first topic', 'second topic')
{
	my ($rcpt, $data) = post(subject => $subject, text => "Words of $subject.\r\n");
	like($data, qr/^250 /, "a post: $subject") or diag(slurp("$tmp/ingress.log"));
}
ok(poll_until(sub { scalar(received('bob@one.test', 'second topic')) == 1 && scalar(received('bob@one.test', 'first topic')) == 1 }, 60),
	'the posts go out') or why_not();
ok(settled(), 'settled');
is(scalar(received('dig@one.test')), 0, 'the digest member got no post itself');
is(sql("SELECT count(*) FROM pepsi.list_digest WHERE list_id = $list"), '2', 'both posts wait for the digest');

# A configuration without the list stage cannot tell where a digest goes.
my $bare = "$tmp/bare.conf";
PostgreSQL::Test::Utils::append_to_file($bare, sprintf("[database]\nCONFIG_CONNINFO = host=%s port=%d dbname=%s user=operator\n",
	$node->host, $node->port, $db));
my ($bare_out, $bare_err) = ('', '');
IPC::Run::run([ pepsi_bin('pepsi-list'), '-C', $bare, 'digest', 'dev@lists.test' ], '>', \$bare_out, '2>', \$bare_err);
is($? >> 8, 78, 'no list stage in the configuration: exit status 78');
like($bare_err, qr/no \[stage-\*\] section runs pepsi-stage-list.*pepsi-list digest LIST STAGE/,
	'it says to name the stage');
is(sql("SELECT count(*) FROM pepsi.list_digest WHERE list_id = $list"), '2', 'the posts still wait');

# Now: the digest of both, to the digest member only, signed by the list.
($rc, $out, $err) = tool('digest', 'dev@lists.test');
is($rc, 0, 'pepsi-list digest') or diag($err);
like($out, qr/^dev\@lists\.test: digest issue 1 of 2 post\(s\) queued at sign on 1 row\(s\)$/m, 'it says what it queued');
is(sql("SELECT count(*) FROM pepsi.list_digest WHERE list_id = $list"), '0', 'the list_digest rows are gone');
ok(poll_until(sub { scalar(received('dig@one.test', 'Digest')) == 1 }, 60), 'the digest is delivered') or why_not();
my ($digest) = received('dig@one.test', 'Digest');
like($digest->{data}, qr/^Subject: dev Digest, Issue 1 \(2 messages\)\r$/m, 'its subject');
like($digest->{env}, qr/^MAIL FROM:<dev-bounces\@lists\.test>/m, 'from the list\'s bounce address');
like($digest->{data}, qr/Today's Topics:\r\n\r\n +1\. first topic .*\r\n +2\. second topic /, 'both posts in its contents');
like($digest->{data}, qr/Words of first topic\..*Words of second topic\./s, 'with their text');
my $verdict = verify_message(\%zone, $digest->{data});
is($verdict->{'python-dkim'}[0], 'pass', 'signed by the list (python3-dkim)') or diag($verdict->{output});
ok(settled(), 'settled');
is(scalar(received('bob@one.test', 'Digest')), 0, 'a member taking each message no digest');
is(scalar(received('alice@client.test', 'Digest')), 0, 'nor the other');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'list_digest' AND detail ->> 'list' = 'dev\@lists.test'"
	  . " AND (detail ->> 'posts')::int = 2 AND detail ->> 'stage' = 'sign' AND detail ->> 'issue' = '1'"), '1',
	'audited in event_log');
($rc, $out, $err) = tool('digest', 'dev@lists.test');
is($rc, 65, 'a second run finds nothing');
like($err, qr/no post waiting/, 'and says so');
is(scalar(received('dig@one.test', 'Digest')), 1, 'nothing sent twice');

list_stop();
done_testing();
