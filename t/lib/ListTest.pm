# ListTest: the mailing-list tests' one set-up (t/165, t/169, t/170, t/177): a
# cluster, the tests' DNS server, pepsi-ingress, pepsi-dispatch and a
# scripted SMTP peer standing for the subscribers' servers.
#
#   my $l = list_setup('lists', arc_seal => 1);
#   ... create lists (before list_start: ingress reads their addresses
#       when it starts) ...
#   list_start();                    # pepsi-ingress and pepsi-dispatch
#   post(subject => 'hello');        # a post through ingress
#   ok(poll_until(sub { received('bob@one.test', 'hello') }), ...) or why_not();
#   ok(settled(), 'settled');
#   list_stop();
#
# The graph: init runs pepsi-stage-list (its replies and notices go to
# sign; with arc_seal, a post is first ARC-sealed by the seal stage and
# comes back to init), sign signs with the list's key (d=lists.test, s1),
# route sends local.test to maildir (owner@local.test has a mailbox) and
# the rest to the peer.  Ingress listens on port (checking DKIM, DMARC,
# SPF against the DNS) and plain_port (checking nothing); the [httpd]
# section is there for a test that starts pepsi-httpd (on http_port, as
# the role web).  The DNS has client.test (SPF passes from 127.0.0.1, its
# PTR mx.client.test), strict.test (p=reject; posts signed with
# strict_key pass DMARC, through post(sign => 1)) and both keys' records.
#
# $l has: node, db, root (the maildirs), tmp, dns, zone (the DKIM keys
# for verify_message), peer, port, plain_port, http_port, config,
# list_key, strict_key; after list_start, ingress and d (the dispatcher).
# One set-up a test file: the functions below act on it.
package ListTest;

use strict;
use warnings FATAL => 'all';

use Exporter 'import';
use Mail::DKIM::PrivateKey;
use Mail::DKIM::Signer;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More ();

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use SignTest;
use SmtpClient;
use TestDNS;

our @EXPORT = qw(list_setup list_start list_stop post received settled why_not rcpt_taken);

my $l;

sub list_setup
{
	my ($name, %o) = @_;
	my $db = 'postgres';
	my $node = delivery_node($name);
	my $root = PostgreSQL::Test::Utils::tempdir();
	my $tmp = PostgreSQL::Test::Utils::tempdir();
	my $secret = 'web-secret';

	$node->safe_psql($db, "CREATE ROLE web LOGIN PASSWORD '$secret' IN ROLE pepsi_httpd");
	make_mailbox($root, 'owner@local.test');

	# The list's signing key, and strict.test's (a p=reject domain whose
	# posts ingress sees pass DMARC).
	my ($list_key, $list_record) = make_key($tmp, 'lists', 'rsa-sha256');
	my ($strict_key, $strict_record) = make_key($tmp, 'strict', 'rsa-sha256');
	my %zone = ('s1._domainkey.lists.test' => $list_record, 's1._domainkey.strict.test' => $strict_record);
	my $dns = TestDNS->new($tmp);
	$dns->zone(<<'ZONE' . TestDNS::txt('s1._domainkey.strict.test.', $strict_record)
1.0.0.127.in-addr.arpa. 300 IN PTR mx.client.test.
mx.client.test. 300 IN A 127.0.0.1
strict.test. 300 IN TXT "v=spf1 -all"
_dmarc.strict.test. 300 IN TXT "v=DMARC1; p=reject"
client.test. 300 IN TXT "v=spf1 ip4:127.0.0.1 -all"
_dmarc.client.test. 300 IN TXT "v=DMARC1; p=none"
ZONE
		  . TestDNS::txt('s1._domainkey.lists.test.', $list_record));

	my $peer = start_peer();
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $plain_port = PostgreSQL::Test::Cluster::get_free_port();
	my $http_port = PostgreSQL::Test::Cluster::get_free_port();
	my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
	my $retry = "RETRY_BASE = 1s\nRETRY_MAX = 2s\n";
	my $seal = $o{arc_seal} ? "ARC_SEAL_STAGE = seal\n[stage-seal]\nPROGRAM = pepsi-stage-arc-seal\nKEY = lists\n"
	  . "NEXT_STAGE = init\n" : '';
	my $config = write_config($node,
		pepsi => { HOSTNAME => 'mx.pepsi.test', LOCAL_DOMAINS => 'local.test lists.test',
			LOCAL_RECIPIENTS => 'virtual', DNS_FORWARDER => $dns->forwarder, DNS_TIMEOUT => '4s' },
		dispatch => { WORKER_IDLE_TIMEOUT => '30s' },
		stages => <<"CONF");
[stage-init]
PROGRAM = pepsi-stage-list
NEXT_STAGE = sign
REPLY_STAGE = sign
$seal\[stage-sign]
PROGRAM = pepsi-stage-dkim-sign
NEXT_STAGE = route
[stage-route]
PROGRAM = pepsi-stage-route
LOCAL_DOMAINS = local.test
LOCAL_STAGE = maildir
REMOTE_STAGE = smarthost
[stage-maildir]
PROGRAM = pepsi-stage-relay-to-maildir
MAILDIR_ROOT = $root
$retry
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
MESSAGE_AUTHENTICATION = on
TRUSTED_MESSAGE_AUTHENTICATION = on
[listener-plain]
ADDRESS = 127.0.0.1
PORT = $plain_port
[httpd]
ADDRESS = 127.0.0.1
PORT = $http_port
CONNINFO = $conninfo user=web password=$secret
CONF
	chmod 0600, $config or die "chmod $config: $!";

	$l = { node => $node, db => $db, root => $root, tmp => $tmp, dns => $dns, zone => \%zone, peer => $peer,
		port => $port, plain_port => $plain_port, http_port => $http_port, config => $config,
		list_key => $list_key, strict_key => $strict_key, posts => 0 };
	return $l;
}

sub list_start
{
	$l->{ingress} = start_ingress($l->{config}, $l->{port}, "$l->{tmp}/ingress.log");
	$l->{d} = start_dispatcher($l->{config});
	return;
}

sub list_stop
{
	stop_dispatcher($l->{d});
	kill 'TERM', $l->{ingress}{pid};
	waitpid $l->{ingress}{pid}, 0;
	return;
}

sub sql { return $l->{node}->safe_psql($l->{db}, shift) }

# One SMTP transaction through ingress; returns the replies to RCPT and
# DATA.  %m: from (alice@client.test), to (dev@lists.test), from_field,
# subject, text, headers (more header lines), no_id (no Message-ID),
# mail_from (the envelope sender, from by default), raw (the message
# whole), sign (signed as strict.test), port (ingress's listener).
sub post
{
	my (%m) = @_;
	my $from = $m{from} // 'alice@client.test';
	my $to = $m{to} // 'dev@lists.test';
	my $n = ++$l->{posts};
	my $message = $m{raw} // ("From: " . ($m{from_field} // "Alice <$from>") . "\r\nTo: <$to>\r\nSubject: "
		  . ($m{subject} // "post $n") . "\r\n" . ($m{no_id} ? '' : "Message-ID: <p$n\@client.test>\r\n")
		  . ($m{headers} // '') . "Date: Sun, 6 Dec 2026 12:00:00 +0000\r\n\r\n" . ($m{text} // "Hello $n.\r\n"));
	$message =~ s/(?<!\r)\n/\r\n/g;
	if ($m{sign})
	{
		my $signer = Mail::DKIM::Signer->new(Algorithm => 'rsa-sha256', Method => 'relaxed',
			Domain => 'strict.test', Selector => 's1', Headers => 'from:to:subject:message-id:date',
			Key => Mail::DKIM::PrivateKey->load(File => $l->{strict_key}));
		$signer->PRINT($message);
		$signer->CLOSE;
		$message = $signer->signature->as_string . "\r\n" . $message;
	}
	my $c = SmtpClient->new($m{port} // $l->{port});
	$c->command('EHLO mx.client.test');
	$c->command('MAIL FROM:<' . ($m{mail_from} // $from) . '>');
	my $rcpt = $c->command("RCPT TO:<$to>");
	my $data = '';
	if ($rcpt =~ /^250/)
	{
		$c->command('DATA');
		(my $text = $message) =~ s/^\./../mg;
		$c->send("$text\r\n.\r\n");
		$data = $c->reply(60);
	}
	$c->command('QUIT');
	$c->close;
	return ($rcpt, $data);
}

# Whether ingress takes RCPT to $to (a transaction with no message): it
# learns a new list's addresses when it next reads them.
sub rcpt_taken
{
	my ($to) = @_;
	my $c = SmtpClient->new($l->{port});
	$c->command('EHLO mx.client.test');
	$c->command('MAIL FROM:<probe@client.test>');
	my $reply = $c->command("RCPT TO:<$to>");
	$c->command('QUIT');
	$c->close;
	return $reply =~ /^250/;
}

# Nothing left to run: every row gone but those held for a moderator.
sub settled
{
	return poll_until(sub { sql("SELECT count(*) FROM pepsi.workqueue WHERE timeout IS DISTINCT FROM 'infinity'") eq '0' },
		90);
}

# What the peer received for $rcpt (with $subject in its Subject:, if
# given): [{ data, env }].
sub received
{
	my ($rcpt, $subject) = @_;
	return grep { $_->{env} =~ /RCPT TO:<\Q$rcpt\E>/i && (!$subject || $_->{data} =~ /^Subject: .*\Q$subject\E/m) }
	  peer_messages($l->{peer});
}

# After a failed poll: the queue and what the dispatcher logged about it.
sub why_not
{
	Test::More::diag(sql("SELECT string_agg(concat_ws(' ', id, stage, status, state::text), E'\n') FROM pepsi.workqueue"),
		"\n", join("\n", grep { /list|archive|error|warn|fail/i } split /\n/, dispatcher_log($l->{d})));
	return;
}

1;
