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
use DispatchTest;
use PepsiTest;
use SignTest;
use SmtpClient;
use TestDNS;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');

my $db = 'postgres';
my $node = delivery_node('list_digest_cli');
my $tmp = PostgreSQL::Test::Utils::tempdir();

sub sql { return $node->safe_psql($db, shift) }

my %zone;
my ($list_key, $list_record) = make_key($tmp, 'lists', 'rsa-sha256');
$zone{'s1._domainkey.lists.test'} = $list_record;
my $dns = TestDNS->new($tmp);
$dns->zone(<<'ZONE' . TestDNS::txt('s1._domainkey.lists.test.', $list_record));
1.0.0.127.in-addr.arpa. 300 IN PTR mx.client.test.
mx.client.test. 300 IN A 127.0.0.1
client.test. 300 IN TXT "v=spf1 ip4:127.0.0.1 -all"
ZONE

my $peer = start_peer();
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $retry = "RETRY_BASE = 1s\nRETRY_MAX = 2s\n";
my $config = write_config($node,
	pepsi => { HOSTNAME => 'mx.pepsi.test', LOCAL_DOMAINS => 'lists.test', LOCAL_RECIPIENTS => 'virtual',
		DNS_FORWARDER => $dns->forwarder, DNS_TIMEOUT => '4s' },
	dispatch => { WORKER_IDLE_TIMEOUT => '30s' },
	stages => <<"CONF");
[stage-init]
PROGRAM = pepsi-stage-list
NEXT_STAGE = sign
REPLY_STAGE = sign
[stage-sign]
PROGRAM = pepsi-stage-dkim-sign
NEXT_STAGE = smarthost
[stage-smarthost]
PROGRAM = pepsi-stage-relay-to-smarthost
SMARTHOST = 127.0.0.1:$peer->{port}
TLS = none
TIMEOUT = 10s
CONNECT_TIMEOUT = 5s
$retry
[dkim-key-lists]
DOMAIN = lists.test
SELECTOR = s1
KEY_FILE = $list_key
[ingress]
AUTHSERV_ID = mx.pepsi.test
DISPATCH_WAKE_INTERVAL = 10ms
DNS_MESSAGE_BUDGET = 8s
LOCAL_RECIPIENTS_REFRESH = 1s
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
CONF
chmod 0600, $config or die "chmod $config: $!";

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

my $ingress = start_ingress($config, $port, "$tmp/ingress.log");
my $d = start_dispatcher($config);

my $n = 0;
sub post
{
	my ($subject) = @_;
	$n++;
	my $c = SmtpClient->new($port);
	$c->command('EHLO mx.client.test');
	$c->command('MAIL FROM:<alice@client.test>');
	my $rcpt = $c->command('RCPT TO:<dev@lists.test>');
	my $data = '';
	if ($rcpt =~ /^250/)
	{
		$c->command('DATA');
		$c->send("From: Alice <alice\@client.test>\r\nTo: <dev\@lists.test>\r\nSubject: $subject\r\n"
			  . "Message-ID: <d$n\@client.test>\r\nDate: Sun, 6 Dec 2026 12:00:00 +0000\r\n\r\nWords of $subject.\r\n.\r\n");
		$data = $c->reply(60);
	}
	$c->command('QUIT');
	$c->close;
	return ($rcpt, $data);
}
sub settled { return poll_until(sub { sql("SELECT count(*) FROM pepsi.workqueue WHERE timeout IS DISTINCT FROM 'infinity'") eq '0' }, 90) }
sub received
{
	my ($rcpt, $subject) = @_;
	return grep { $_->{env} =~ /RCPT TO:<\Q$rcpt\E>/i && (!$subject || $_->{data} =~ /^Subject: .*\Q$subject\E/m) }
	  peer_messages($peer);
}
sub why_not
{
	diag(sql("SELECT string_agg(concat_ws(' ', id, stage, status, state::text), E'\n') FROM pepsi.workqueue"),
		"\n", join("\n", grep { /list|error|warn|fail/i } split /\n/, dispatcher_log($d)));
}

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
	my ($rcpt, $data) = post($subject);
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

stop_dispatcher($d);
kill 'TERM', $ingress->{pid};
waitpid $ingress->{pid}, 0;
done_testing();
