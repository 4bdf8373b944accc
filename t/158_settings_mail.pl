# Settings by mail (pepsi-stage-settings) end to end, through pepsi-ingress
# (DKIM and DMARC checked against the tests' DNS server), pepsi-dispatch
# and the maildir writer: a command from the owner, DKIM-signed by the
# tests' key and DMARC aligned, is answered with a single-use token and
# not applied; the owner's reply with the token applies it (the row in
# pepsi.settings, the answer with the settings in force, and its effect:
# a vacation notice); a forged command, even with the right token, is
# dropped without a reply; unknown commands, options an owner may not set,
# oversized values and a reused token are answered with the reason and
# nothing is applied.  pepsi-settings sets, gets and lists an address's
# and a domain's settings, each change a pepsi.event_log row, and refuses
# what an owner may not set.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use MIME::Base64 qw(encode_base64);
use Mail::DKIM::PrivateKey;
use Mail::DKIM::Signer;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use SmtpClient;
use TestDNS;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');

my $db = 'postgres';
my $node = delivery_node('settings_mail');
$node->safe_psql($db, 'CREATE ROLE operator LOGIN IN ROLE pepsi_config');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $owner = 'bob@local.test';
make_mailbox($root, $_) for $owner, 'friend@local.test';

sub sql { return $node->safe_psql($db, shift) }

# The tests' DKIM key, published for local.test, whose DMARC policy is
# none: ingress takes a failing message, and the stage must tell.
my ($der, $ignored, $e) = ('', '', '');
IPC::Run::run([ 'openssl', 'genrsa', '-out', "$tmp/rsa.pem", '2048' ], '>', \$ignored, '2>', \$e)
  or die "openssl genrsa: $e";
IPC::Run::run([ 'openssl', 'rsa', '-in', "$tmp/rsa.pem", '-pubout', '-outform', 'DER' ], '>', \$der, '2>', \$e)
  or die "openssl rsa: $e";
my $dns = TestDNS->new($tmp);
$dns->zone(<<'ZONE' . TestDNS::txt('sel._domainkey.local.test.', 'v=DKIM1; k=rsa; p=' . encode_base64($der, '')));
1.0.0.127.in-addr.arpa. 300 IN PTR mx.client.test.
mx.client.test. 300 IN A 127.0.0.1
local.test. 300 IN TXT "v=spf1 -all"
_dmarc.local.test. 300 IN TXT "v=DMARC1; p=none"
ZONE

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $config = delivery_config($node, maildir_root => $root,
	pepsi => { DNS_FORWARDER => $dns->forwarder, DNS_TIMEOUT => '4s' },
	extra => { init => "LOCAL_STAGE = settings\n" },
	more_stages => {
		settings => "PROGRAM = pepsi-stage-settings\nNEXT_STAGE = vacation\nREPLY_STAGE = init\n"
		  . "MAX_VALUE_SIZE = 1k\n",
		vacation => "PROGRAM = pepsi-stage-vacation\nNEXT_STAGE = maildir\nREPLY_STAGE = init\n",
	},
	sections => <<"CONF");
[ingress]
AUTHSERV_ID = mx.pepsi.test
DISPATCH_WAKE_INTERVAL = 10ms
DNS_MESSAGE_BUDGET = 8s
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
MESSAGE_AUTHENTICATION = on
TRUSTED_MESSAGE_AUTHENTICATION = on
DMARC_POLICY = enforce
CONF
my $tool_config = operator_config($node, $config, 'operator');

my $ingress = start_ingress($config, $port, "$tmp/ingress.log");
my $d = start_dispatcher($config);

# Send a command message from $from (signed by local.test's key unless
# forged) to settings@local.test; returns the reply to its DATA.
my $n = 0;
sub command
{
	my ($text, %m) = @_;
	my $from = $m{from} // $owner;
	$n++;
	my $message = "From: <$from>\r\nTo: <settings\@local.test>\r\nSubject: " . ($m{subject} // "settings $n")
	  . "\r\nMessage-ID: <c$n\@local.test>\r\nDate: Sun, 6 Dec 2026 12:00:00 +0000\r\n\r\n$text";
	$message =~ s/(?<!\r)\n/\r\n/g;
	unless ($m{forged})
	{
		my $signer = Mail::DKIM::Signer->new(Algorithm => 'rsa-sha256', Method => 'relaxed',
			Domain => 'local.test', Selector => 'sel', Headers => 'from:to:subject:message-id',
			Key => Mail::DKIM::PrivateKey->load(File => "$tmp/rsa.pem"));
		$signer->PRINT($message);
		$signer->CLOSE;
		$message = $signer->signature->as_string . "\r\n" . $message;
	}
	my $c = SmtpClient->new($port);
	$c->command('EHLO mx.client.test');
	$c->command("MAIL FROM:<$from>");
	$c->command('RCPT TO:<settings@local.test>');
	$c->command('DATA');
	(my $data = $message) =~ s/^\./../mg;
	$c->send("$data\r\n.\r\n");
	my $reply = $c->reply(30);
	$c->command('QUIT');
	$c->close;
	return $reply;
}

sub settled { return poll_until(sub { queue_count($node) == 0 }, 60) }
# The answers in bob's Maildir, oldest first.
sub answers { return grep { /^From: <settings\@local\.test>\r$/m } map { slurp($_) } maildir_files($root, $owner) }

# 1. A signed command: a token, nothing applied yet.
like(command("set VACATION yes\nset VACATION_SUBJECT Away\nset VACATION_MESSAGE <<\nI am away.\n.. with a dot\n.\n"
		  . "-- \nBob\n"),
	qr/^250 /, 'ingress takes the signed command');
ok(poll_until(sub { scalar(answers()) == 1 }, 60), 'the owner gets an answer')
  or diag(sql("SELECT string_agg(concat_ws(' ', id, stage, status, state::text), E'\n') FROM pepsi.workqueue"),
	"\n", join("\n", grep { /settings|error|warn/i } split /\n/, dispatcher_log($d)),
	"\n", slurp("$tmp/ingress.log"));
my ($answer) = answers();
like($answer, qr/^From: <settings\@local\.test>\r$/m, 'from the settings address');
like($answer, qr/^Auto-Submitted: auto-replied\r$/m, 'an RFC 3834 auto-reply');
my ($token) = $answer =~ /^Subject: Settings: confirm ([0-9a-f]{64})\r$/m;
ok($token, 'its Subject carries the token');
like($answer, qr/set VACATION_MESSAGE I am away\.\r\n\. with a dot/, 'it lists the changes');
is(sql("SELECT count(*) FROM pepsi.settings WHERE address = '$owner'"), '0', 'nothing is applied yet');
is(sql("SELECT count(*) FROM pepsi.settings_request WHERE used_at IS NULL"), '1', 'the request waits');

# 2. A forged confirmation, with the right token: dropped, no answer.
like(command("confirm $token\n", forged => 1), qr/^250 /, 'ingress takes a forged one (DMARC p=none)');
ok(file_shows($d->{log}, qr/a command from <bob\@local\.test> without DMARC pass or an authenticated submission: dropped/),
	'the stage drops it with a log line');
ok(settled(), 'settled');
is(scalar(answers()), 1, 'the forged command gets no answer');
is(sql("SELECT count(*) FROM pepsi.settings WHERE address = '$owner'"), '0', 'and applies nothing');

# 3. The owner's reply with the token applies the changes.
like(command("Thanks.\n\n> confirm this\n", subject => "Re: Settings: confirm $token"), qr/^250 /,
	'the owner replies');
ok(poll_until(sub { scalar(answers()) == 2 }, 60), 'and gets an answer');
$answer = (answers())[1];
like($answer, qr/^Subject: Settings: changed\r$/m, 'the changes are applied');
like($answer, qr/  VACATION = yes\r\n/, 'the answer has the settings in force');
is(sql("SELECT string_agg(option || '=' || value, ',' ORDER BY option) FROM pepsi.settings WHERE address = '$owner'"),
	"VACATION=yes,VACATION_MESSAGE=I am away.\n. with a dot,VACATION_SUBJECT=Away", 'in pepsi.settings');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'settings_set' AND detail->>'by' = 'mail'"), '3',
	'each change in pepsi.event_log');

# Its effect: mail to bob gets bob's vacation notice.
inject($node, from => 'friend@local.test', to => [$owner],
	headers => "From: <friend\@local.test>\r\nTo: <$owner>\r\nSubject: hi\r\nMessage-ID: <f1\@local.test>\r\n");
ok(poll_until(sub { scalar(maildir_files($root, 'friend@local.test')) == 1 }, 60), 'friend gets a notice');
like(slurp((maildir_files($root, 'friend@local.test'))[0]), qr/^Subject: Away\r\n.*\r\n\r\nI am away\.\r\n\. with a dot\r\n\z/ms,
	'bob\'s subject and text');

# 4. The token again: answered with the reason, nothing applied.
like(command("confirm $token\n"), qr/^250 /, 'the token again');
ok(poll_until(sub { scalar(answers()) == 3 }, 60), 'answered');
like((answers())[2], qr/^Subject: Settings: not changed\r\n.*the token was already used/ms, 'reused: the reason');

# 5. Unknown commands, options an owner may not set and oversized values.
my $long = join("\n", ('x' x 60) x 30);
like(command("frobnicate now\nset VACATION_SUBJECT Gone\nset QUEUE_LIMIT 5\nset VACATION_MESSAGE <<\n$long\n.\n"
		  . "set VACATION maybe\n"),
	qr/^250 /, 'a command with problems');
ok(poll_until(sub { scalar(answers()) == 4 }, 60), 'answered');
$answer = (answers())[3];
like($answer, qr/^Subject: Settings: not changed\r$/m, 'nothing changed');
like($answer, qr/line 1: unknown command "frobnicate"/, 'the unknown command named');
like($answer, qr/line 3: QUEUE_LIMIT is not an option an address's owner may set/, 'the option an owner may not set');
like($answer, qr/line 4: the value of VACATION_MESSAGE is 1829 bytes, more than 1024 \(MAX_VALUE_SIZE\)/,
	'the oversized value, with the option that sets the limit');
like($answer, qr/line 36: .*VACATION/, 'the bad value');
is(sql("SELECT value FROM pepsi.settings WHERE address = '$owner' AND option = 'VACATION_SUBJECT'"), 'Away',
	'the good line of it is not applied either');
is(sql("SELECT count(*) FROM pepsi.settings_request"), '1', 'and no request recorded');

# 6. pepsi-settings: an operator's domain row, get, list, unset; each audited.
sub tool
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-settings'), '-C', $tool_config, @_ ], '<', \undef, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}
my ($rc, $out, $err) = tool('set', '@Local.Test', 'BLOCK_LANGUAGES', 'ru zh');
is($rc, 0, 'set a domain\'s setting') or diag($err);
($rc, $out, $err) = tool('set', 'carol@local.test', 'VACATION_SUBJECT', 'Carol is out');
is($rc, 0, 'set an address\'s') or diag($err);
($rc, $out) = tool('get', 'Bob@local.test');
like($out, qr/^BLOCK_LANGUAGES\s+ru zh\s+domain$/m, 'get: the domain\'s setting, in force for bob');
like($out, qr/^VACATION_SUBJECT\s+Away\s+address$/m, 'get: bob\'s own');
($rc, $out) = tool('--json', 'list', '@local.test');
like($out, qr/"address": "\@local\.test".*"address": "bob\@local\.test".*"address": "carol\@local\.test"/s,
	'list @domain: the domain\'s row and its addresses\'');
($rc, $out, $err) = tool('set', 'bob@local.test', 'QUEUE_LIMIT', '5');
is($rc, 65, 'an option an owner may not set is refused');
like($err, qr/QUEUE_LIMIT is not an option an address's owner may set/, 'with the reason');
($rc, $out, $err) = tool('set', 'bob@local.test', 'VACATION', 'maybe');
is($rc, 65, 'a bad value is refused');
($rc, $out, $err) = tool('set', 'not an address', 'VACATION', 'yes');
like($err, qr/invalid address "not an address"/, 'so is a bad address');
($rc, $out) = tool('unset', 'carol@local.test', 'VACATION_SUBJECT');
is($rc, 0, 'unset');
($rc, $out, $err) = tool('unset', 'carol@local.test', 'VACATION_SUBJECT');
is($rc, 65, 'unset what is not set: an error');
is(sql("SELECT string_agg(action || ' ' || (detail->>'address') || ' ' || (detail->>'option'), ', ' ORDER BY id)"
		  . " FROM pepsi.event_log WHERE principal LIKE '%operator%'"),
	'settings_set @local.test BLOCK_LANGUAGES, settings_set carol@local.test VACATION_SUBJECT, '
	  . 'settings_unset carol@local.test VACATION_SUBJECT, settings_unset carol@local.test VACATION_SUBJECT',
	'each change is in pepsi.event_log, as the operator');
($rc, $out) = tool('options');
like($out, qr/^VACATION_MESSAGE\tpepsi-stage-vacation\t/m, 'options lists what an owner may set');

# 7. show by mail: the domain's setting is in force for bob.
like(command("show\n"), qr/^250 /, 'show');
ok(poll_until(sub { scalar(answers()) == 5 }, 60), 'answered');
like((answers())[4], qr/  BLOCK_LANGUAGES = ru zh \(your domain's\)\r\n.*  VACATION = yes\r\n/s,
	'with the settings in force, the domain\'s marked');

# 8. The stage's role may not write the tables itself.
my ($prc, $pout, $perr) = $node->psql($db,
	"SET ROLE pepsi_stage; INSERT INTO pepsi.settings VALUES ('bob\@local.test', 'VACATION', 'no')");
like($perr, qr/permission denied for table settings/, 'pepsi_stage may not write pepsi.settings');

stop_process($ingress);
done_testing();
