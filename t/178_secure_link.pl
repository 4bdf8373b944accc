# The secure-link portal (issue 41 item 5; pepsi-secure-link(8),
# pepsi-stage-encrypt(8) NO_KEY, pepsi-httpd(8)): mail whose POLICY is
# required to a recipient without a key is sealed for the portal and the
# recipient gets a notice with a link, never the clear text (the notice,
# the queue, the table and a pg_dump hold none of it).  Over HTTP, through
# a real pepsi-dispatch, pepsi-httpd and an SMTP peer that catches the
# notice and the code: the link page, a code mailed, a wrong code, the
# right one (a session), the same code again, the message and its
# attachment, a reply (from the portal's address, Reply-To the recipient,
# its CSRF token used once); a guessed link, another link's session, a
# revoked and an expired link, too many wrong codes, and a client refused
# too often: each refused with its reason.  A link opens PORTAL_OPENS
# times (default 1): after the code, the message and the reply, its page,
# a code asked for and a code checked (even a valid one) are refused with
# when it was used, audited, while the session open goes on; with
# PORTAL_OPENS = 2 a second session works, a third is refused, and the
# same code twice is refused as a used code.  pepsi-secure-link lists,
# revokes and expires, each audited.  And the flow in Chromium (notice
# link, code, message, reply; t/browser/secure_link.js), a screenshot a view.

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use HTTP::Tiny;
use JSON::PP qw(encode_json);
use IPC::Run;
use MIME::Base64 qw(decode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-httpd is not built' unless -x pepsi_bin('pepsi-httpd');

my $db = 'postgres';
my $node = delivery_node('portal');
my $tmp = PostgreSQL::Test::Utils::tempdir();
sub sql { return $node->safe_psql($db, shift) }

my $secret = 'web-secret';
sql("CREATE ROLE web LOGIN PASSWORD '$secret' IN ROLE pepsi_httpd; CREATE ROLE crypto LOGIN IN ROLE pepsi_crypto;"
	  . " CREATE ROLE admin LOGIN IN ROLE pepsi_config;");
my $peer = start_peer();
my $http_port = PostgreSQL::Test::Cluster::get_free_port();
my $base = "http://127.0.0.1:$http_port";
my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
my $config = write_config($node,
	pepsi => { HOSTNAME => 'mx.portal.test' },
	dispatch => { WORKER_IDLE_TIMEOUT => '30s' },
	stages => <<"CONF");
[crypto]
CONNINFO = $conninfo user=crypto
[stage-init]
PROGRAM = pepsi-stage-encrypt
NEXT_STAGE = smarthost
BOUNCE_STAGE = bounced
POLICY = opportunistic
NO_KEY = portal
PORTAL_URL = $base
PORTAL_ADDRESS = secure\@portal.test
[stage-smarthost]
PROGRAM = pepsi-stage-relay-to-smarthost
SMARTHOST = 127.0.0.1:$peer->{port}
TLS = none
TIMEOUT = 10s
CONNECT_TIMEOUT = 5s
RETRY_BASE = 1s
RETRY_MAX = 2s
[stage-bounced]
PROGRAM = pepsi-stage-discard
[httpd]
ADDRESS = 127.0.0.1
PORT = $http_port
CONNINFO = $conninfo user=web password=$secret
CONF
chmod 0600, $config or die "chmod $config: $!";
my $admin_config = operator_config($node, $config, 'admin');
# Encryption is required for one.test's addresses only: the replies, to
# alice@client.test, go in clear.
sql("SET ROLE admin; SELECT pepsi.config_set('domain:one.test', 'stage-init', 'POLICY', 'required')");
# One recipient's links open twice.
sql("SET ROLE admin; SELECT pepsi.config_set('address:frank\@one.test', 'stage-init', 'PORTAL_OPENS', '2')");

my $d = start_dispatcher($config);
my $httpd = start_dispatcher($config, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(poll_until(sub { file_shows("$tmp/httpd.log", qr/ready/) }, 60), 'pepsi-httpd starts');
my $http = HTTP::Tiny->new(timeout => 30, max_redirect => 0);

sub why_not
{
	diag(sql("SELECT string_agg(concat_ws(' ', id, stage, status, state::text), E'\n') FROM pepsi.workqueue"),
		"\n", join("\n", grep { /encrypt|portal|secure|error|warn/i } split /\n/, dispatcher_log($d)));
}

# The n-th message the peer caught (1-based), once it has.
sub caught
{
	my ($n) = @_;
	poll_until(sub { peer_count($peer) >= $n }, 60) or why_not();
	return (peer_messages($peer))[ $n - 1 ];
}

my $text = 'The wombat meets the quokka at noon.';
my $attachment = 'Quokka-plans-7731 in the attachment';
sub send_secret
{
	my ($to) = @_;
	return inject($node, from => 'alice@client.test', to => [$to],
		headers => "From: Alice <alice\@client.test>\r\nTo: <$to>\r\nSubject: the secret plans\r\n"
		  . "Message-ID: <plans.$to\@client.test>\r\nDate: Sun, 6 Dec 2026 12:00:00 +0000\r\n"
		  . "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"b\"\r\n",
		body => "--b\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n$text\r\n--b\r\n"
		  . "Content-Type: text/plain\r\nContent-Disposition: attachment; filename=\"plans.txt\"\r\n"
		  . "Content-Transfer-Encoding: base64\r\n\r\n"
		  . MIME::Base64::encode_base64($attachment, "\r\n") . "--b--\r\n");
}

# 1. The notice, and nowhere the clear text.
send_secret('bob@one.test');
my $notice = caught(1);
like($notice->{env}, qr/bob\@one\.test/, 'the recipient gets a mail');
like($notice->{data}, qr/^From: <secure\@portal\.test>\r?$/m, 'from the portal');
like($notice->{data}, qr/^Subject: An encrypted message from alice\@client\.test is waiting for you\r?$/m,
	'a notice');
unlike($notice->{data}, qr/wombat|secret plans|Quokka-plans|UXVva2Et/, 'which holds nothing of the message');
my ($link) = $notice->{data} =~ m{(\Q$base\E/secure/[0-9a-f]{64})\b};
ok($link, 'but the link') or diag($notice->{data});
(my $token = $link // '') =~ s{.*/}{};
is(sql("SELECT count(*) || ' ' || bool_and(position(convert_to('wombat', 'UTF8') in sealed) = 0)"
		. " || ' ' || bool_and(recipient = 'bob\@one.test') FROM pepsi.secure_link"), '1 true true',
	'the message is stored sealed');
is(sql("SELECT count(*) FROM pepsi.secure_link WHERE position(convert_to('$token', 'UTF8') in link_id) > 0"
		. " OR encode(link_id, 'hex') = '$token'"), '0', 'and the database has no link');
my ($dump, $dump_err) = ('', '');
IPC::Run::run([ 'pg_dump', '-d', $node->connstr($db) ], '<', \undef, '>', \$dump, '2>', \$dump_err,
	IPC::Run::timeout(120));
like($dump, qr/COPY pepsi\.secure_link /, 'a pg_dump holds the portal\'s table');
unlike($dump, qr/wombat|secret plans|Quokka-plans|UXVva2Et/, 'and no clear text of the message');
unlike($dump, qr/$token/, 'nor the link');

# 2. The link page; guessed and malformed links; no session yet.
my $r = $http->get($link);
is($r->{status}, 200, 'the link page');
like($r->{content}, qr/for <b>bob\@one\.test<\/b> is waiting/, 'says for whom');
like($r->{headers}{'content-security-policy'}, qr/script-src 'self'.*form-action 'self'/, 'under the strict CSP');
unlike($r->{content}, qr/<script|wombat/, 'no script, no clear text');
my $guess = join '', map { sprintf '%x', int rand 16 } 1 .. 64;
$r = $http->get("$base/secure/$guess");
is($r->{status}, 404, 'a guessed link is refused');
like($r->{content}, qr/unknown: this server sent no such link/, 'as unknown');
is($http->get("$base/secure/" . substr($token, 0, 63))->{status}, 404, 'and a link cut short');
$r = $http->get("$link/message");
is($r->{status}, 403, 'no message without a code');
like($r->{content}, qr/no session: enter the code mailed to you first/, 'and why');
unlike($r->{content}, qr/wombat/, 'never the clear text');

# 3. The code.
sub post_form
{
	my ($url, $form, $cookie) = @_;
	return $http->post_form($url, $form, $cookie ? { headers => { Cookie => $cookie } } : {});
}
$r = post_form("$link/code", {});
is($r->{status}, 200, 'a code is asked for') or diag($r->{content});
like($r->{content}, qr/A code is on its way to bob\@one\.test/, 'and is on its way');
my $code_mail = caught(2);
like($code_mail->{env}, qr/bob\@one\.test/, 'to the recipient');
my ($code) = $code_mail->{data} =~ /^Subject: Your code for the encrypted message: (\d{8})\r?$/m;
ok($code, 'with an 8-digit code') or diag($code_mail->{data});
unlike($code_mail->{data}, qr/wombat/, 'and nothing of the message');
my $wrong = $code eq '00000000' ? '00000001' : '00000000';
$r = post_form("$link/session", { code => $wrong });
is($r->{status}, 403, 'a wrong code is refused');
like($r->{content}, qr/wrong code \(4 of 5 tries left\)/, 'saying how many tries are left');
$r = post_form("$link/session", { code => $code });
is($r->{status}, 303, 'the right code opens a session');
my ($cookie) = ($r->{headers}{'set-cookie'} // '') =~ /^(pepsi_secure=[0-9a-f]{64});/;
ok($cookie, 'a cookie') or diag(explain($r->{headers}));
like($r->{headers}{'set-cookie'}, qr/Path=\/secure\/$token\/; Max-Age=900; HttpOnly; SameSite=Strict/,
	'bound to the link, short-lived, HttpOnly');
is($r->{headers}{location}, "/secure/$token/message", 'to the message');
$r = post_form("$link/session", { code => $code });
is($r->{status}, 410, 'the same code again is refused');
like($r->{content}, qr/this link was used already \(opened 1 of 1 times\) on [\d-]+ [\d:]+ UTC: ask alice\@client\.test to send the message again/,
	'as the link was used (it opens once)');

# 4. The message, its attachment, a reply.
$r = $http->get("$link/message", { headers => { Cookie => $cookie } });
is($r->{status}, 200, 'the message is served') or diag($r->{content});
like($r->{content}, qr/<td id="subject">the secret plans<\/td>/, 'its subject');
like($r->{content}, qr/<td id="from">Alice &lt;alice\@client\.test&gt;<\/td>/, 'its sender');
like($r->{content}, qr/\Q$text\E/, 'its text');
my ($part) = $r->{content} =~ m{href="/secure/$token/part/(\d+)">plans\.txt</a>};
ok(defined $part, 'its attachment, as a link');
my ($csrf) = $r->{content} =~ /name="csrf" value="([0-9a-f]{32})"/;
ok($csrf, 'a reply form with its CSRF token');
$r = $http->get("$link/part/" . ($part // 9), { headers => { Cookie => $cookie } });
is($r->{status}, 200, 'the attachment is served');
is($r->{content}, $attachment, 'decoded');
is($r->{headers}{'content-disposition'}, 'attachment; filename="plans.txt"', 'as a download');
is($r->{headers}{'content-type'}, 'application/octet-stream', 'never rendered');
$r = post_form("$link/reply", { csrf => 'f' x 32, subject => 'Re: the secret plans', body => 'No.' }, $cookie);
is($r->{status}, 403, 'a reply without the page\'s CSRF token is refused');
like($r->{content}, qr/the form is stale or not this page&#39;s|the form is stale or not this page's/, 'and why');
$r = post_form("$link/reply", { csrf => $csrf, subject => 'Re: the secret plans', body => "Noon suits me.\nBob" },
	$cookie);
is($r->{status}, 200, 'a reply is sent') or diag($r->{content});
like($r->{content}, qr/Your reply is on its way to alice\@client\.test/, 'to the sender');
my $reply = caught(3);
like($reply->{env}, qr/secure\@portal\.test/, 'from the portal\'s address (the envelope)');
like($reply->{env}, qr/alice\@client\.test/, 'to the sender');
like($reply->{data}, qr/^From: "bob\@one\.test via the secure portal" <secure\@portal\.test>\r?$/m,
	'From: the portal (bob\'s domain\'s DMARC is not ours to pass)');
like($reply->{data}, qr/^Reply-To: <bob\@one\.test>\r?$/m, 'Reply-To: the recipient');
like($reply->{data}, qr/^In-Reply-To: <plans\.bob\@one\.test\@client\.test>\r?$/m, 'in reply to the message');
my ($b64) = $reply->{data} =~ /\r?\n\r?\n(.*)\z/s;
is(decode_base64($b64 // ''), "Noon suits me.\r\nBob", 'what bob wrote');
$r = post_form("$link/reply", { csrf => $csrf, subject => 'Again', body => 'Again' }, $cookie);
is($r->{status}, 403, 'the same form posted again is refused (its token was used)');
# A ciphertext altered in the database does not open: refused, never shown.
sql("UPDATE pepsi.secure_link SET sealed = set_byte(sealed, 5, get_byte(sealed, 5) # 1) WHERE id = 1");
$r = $http->get("$link/message", { headers => { Cookie => $cookie } });
is($r->{status}, 500, 'an altered ciphertext does not open');
like($r->{content}, qr/the stored message does not open \(it was altered\)/, 'and the page says so');
sql("UPDATE pepsi.secure_link SET sealed = set_byte(sealed, 5, get_byte(sealed, 5) # 1) WHERE id = 1");
is($http->get("$link/message", { headers => { Cookie => $cookie } })->{status}, 200, 'restored, it opens again');

# 4b. The link was used (PORTAL_OPENS 1): forwarded or replayed, it opens
# nothing more, for the page, a code or a code's check; the session that
# is open goes on.
my $used = qr/this link was used already \(opened 1 of 1 times\) on [\d-]+ [\d:]+ UTC: ask alice\@client\.test to send the message again/;
is(sql("SELECT opened || ' ' || open_limit FROM pepsi.secure_link WHERE id = 1"), '1 1',
	'the link kept its limit (PORTAL_OPENS, default 1) and counts its opening');
like(caught(1)->{data}, qr/The link works for 14 days, for one visit: read and reply in it\./, 'the notice said so');
$r = $http->get($link);
is($r->{status}, 410, 'the used link\'s page is refused');
like($r->{content}, $used, 'saying when it was used and whom to ask');
unlike($r->{content}, qr/send-code|wombat/, 'no code form, no clear text');
my $mailed = sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'secure_link_code_mailed'");
$r = post_form("$link/code", {});
is($r->{status}, 410, 'a code for the used link is refused');
like($r->{content}, $used, 'with the reason');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'secure_link_code_mailed'"), $mailed, 'and none is mailed');
# A valid code the recipient could still hold (mailed before the link was
# used, as a second browser would have asked for) opens no session.
sql("UPDATE pepsi.secure_link SET code_hash = sha256(link_id || convert_to('24681357', 'UTF8')),"
	  . " code_expires_at = now() + interval '10 minutes', code_attempts = 0, code_used_at = NULL WHERE id = 1");
$r = post_form("$link/session", { code => '24681357' });
is($r->{status}, 410, 'a valid code for the used link is refused');
like($r->{content}, $used, 'with the reason');
ok(!$r->{headers}{'set-cookie'}, 'and starts no session');
is(sql("SELECT count(*) FROM pepsi.secure_link_session WHERE link = 1"), '1', 'only the first session exists');
is(sql("SELECT string_agg(detail->>'asked' || ' ' || (detail->>'opened') || '/' || (detail->>'opens'), ', '"
		. " ORDER BY id) FROM pepsi.event_log WHERE action = 'secure_link_reused' AND (detail->>'id')::bigint = 1"),
	'session 1/1, code 1/1, session 1/1', 'each refused use is audited (secure_link_reused)');
$r = $http->get("$link/message");
is($r->{status}, 403, 'the message without the session is refused');
like($r->{content}, $used, 'with the reason, not "enter the code"');
$r = $http->get("$link/message", { headers => { Cookie => $cookie } });
is($r->{status}, 200, 'the session open goes on');
like($r->{content}, qr/\Q$text\E/, 'with the message');

# 5. A second link: the first link's session does not open it; too many
# wrong codes; revoked.
send_secret('carol@one.test');
my $notice2 = caught(4);
my ($link2) = $notice2->{data} =~ m{(\Q$base\E/secure/[0-9a-f]{64})\b};
ok($link2 && $link2 ne $link, 'another recipient, another link');
$r = $http->get("$link2/message", { headers => { Cookie => $cookie } });
is($r->{status}, 403, 'another link\'s session opens nothing');
is(post_form("$link2/code", {})->{status}, 200, 'a code for the second link');
caught(5);
for my $try (1 .. 5)
{
	$r = post_form("$link2/session", { code => '99999999' });
}
like($r->{content}, qr/wrong code, the 5th: this code no longer counts/, 'five wrong codes: the code is void');
my ($code2) = (peer_messages($peer))[4]{data} =~ /message: (\d{8})/;
$r = post_form("$link2/session", { code => $code2 });
is($r->{status}, 403, 'even the right one, after');
like($r->{content}, qr/5 wrong codes: this one no longer counts; ask for a new one/, 'and why');

my $cli = sub {
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-secure-link'), '-C', $admin_config, @_ ], '<', \'', '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
};
my ($rc, $out, $err) = $cli->('list');
is($rc, 0, 'pepsi-secure-link list') or diag($err);
like($out, qr/^\s*1\s+bob\@one\.test\s+alice\@client\.test\s+\S+\s+[\d-]+ [\d:]+\s+[\d-]+ [\d:]+\s+used\s+1\/1\s+1\s*$/m,
	'shows the first link used, opened once of once, replied to once');
like($out, qr/^\s*2\s+carol\@one\.test\s+alice\@client\.test\s+\S+\s+[\d-]+ [\d:]+\s+[\d-]+ [\d:]+\s+open\s+0\/1\s+0\s*$/m,
	'and the second open, not opened');
($rc, $out, $err) = $cli->('--json', 'list', '--open');
is($rc, 0, 'pepsi-secure-link --json list --open') or diag($err);
like($out, qr/"opened":\s*0,\s*"open_limit":\s*1\b/, 'the counts apart in JSON');
unlike($out, qr/"id":\s*1\b/, 'the used link is not among the open ones');
my $id2 = sql("SELECT id FROM pepsi.secure_link WHERE recipient = 'carol\@one.test'");
($rc, $out, $err) = $cli->('revoke', '--reason', 'sent to the wrong person', $id2);
is($rc, 0, 'revoke') or diag($err);
is($out, "1 revoked\n", 'one revoked');
$r = $http->get($link2);
is($r->{status}, 410, 'a revoked link is refused');
like($r->{content}, qr/revoked on [\d-]+ [\d:]+ UTC: sent to the wrong person/, 'with the reason');
is(sql("SELECT sealed IS NULL FROM pepsi.secure_link WHERE id = $id2"), 't', 'and its ciphertext is gone');

# 6. Expired: by the command, and by time.
($rc, $out, $err) = $cli->('expire', '1');
is($out, "1 expired\n", 'expire a link now');
$r = $http->get("$link/message", { headers => { Cookie => $cookie } });
is($r->{status}, 410, 'an expired link is refused, session or not');
like($r->{content}, qr/expired on [\d-]+ [\d:]+ UTC: ask the sender to send the message again/, 'as expired');
unlike($r->{content}, qr/wombat/, 'never the clear text');
send_secret('dave@one.test');
caught(6);
sql("UPDATE pepsi.secure_link SET expires_at = now() - interval '1 second' WHERE recipient = 'dave\@one.test'");
is(sql("SELECT sealed IS NOT NULL FROM pepsi.secure_link WHERE recipient = 'dave\@one.test'"), 't',
	'a link past its time still has its ciphertext');
($rc, $out, $err) = $cli->('expire');
is($out, "1 expired\n", 'until expire with no id wipes it');
is(sql("SELECT sealed IS NULL FROM pepsi.secure_link WHERE recipient = 'dave\@one.test'"), 't', 'wiped');
($rc, $out, $err) = $cli->('revoke', '999');
isnt($rc, 0, 'revoking an unknown link fails');
like($err, qr/no secure link has id 999/, 'naming it');
($rc, $out, $err) = $cli->('revoke');
is($rc, 64, 'revoke needs ids');
is(sql("SELECT string_agg(action, ' ' ORDER BY action) FROM (SELECT DISTINCT action FROM pepsi.event_log"
		. " WHERE action LIKE 'secure_link%') a"),
	'secure_link_code_mailed secure_link_code_wrong secure_link_expired secure_link_opened secure_link_replied'
	  . ' secure_link_reused secure_link_revoked secure_link_stored', 'each step is audited');

# 7. The same in Chromium: the notice's link, the code, the message, a reply.
send_secret('erin@one.test');
my ($erin_link) = caught(7)->{data} =~ m{(\Q$base\E/secure/[0-9a-f]{64})\b};
my $shots = $ENV{PEPSI_SCREENSHOTS} // "$PostgreSQL::Test::Utils::log_path/178_secure_link_screenshots";
make_path($shots);
my $node_path = `npm root -g 2>/dev/null`;
chomp $node_path;
SKIP:
{
	skip 'chromium, node or playwright-core is not installed (scripts/deps.sh installs them)', 12
	  unless -x '/usr/bin/chromium' && -x '/usr/bin/node' && -d "$node_path/playwright-core";
	my $expected = encode_json({ recipient => 'erin@one.test', subject => 'the secret plans', text => $text,
		attachment => 'plans.txt', attachment_text => $attachment, reply => 'Typed in Chromium.' });
	my ($stdout, $stderr) = ('', '');
	{
		local $ENV{NODE_PATH} = $node_path;
		eval {
			IPC::Run::run([ '/usr/bin/node', dirname(abs_path(__FILE__)) . '/browser/secure_link.js', $erin_link,
					$peer->{dir}, $shots, $expected ], '>', \$stdout, '2>', \$stderr, IPC::Run::timeout(300));
			1;
		} or diag "the browser script: $@";
	}
	my @steps = split /\n/, $stdout;
	for my $expected_step ('the notice\'s link shows what waits', 'a code is mailed', 'the code opens the message',
		'the attachment is a download', 'a reply is sent',
		'no script error, nothing loaded from elsewhere, every page under the CSP')
	{
		my ($line) = grep { /^(ok|fail) \Q$expected_step\E(:|$)/ } @steps;
		is($line // "(not reached)", "ok $expected_step", "in the browser: $expected_step");
	}
	diag $stderr if grep { /^fail/ } @steps;
	my $browser_reply = caught(9);
	like($browser_reply->{data}, qr/^Reply-To: <erin\@one\.test>\r?$/m, 'the reply written in Chromium goes out');
	for my $view (qw(link code message reply))
	{
		ok(-s "$shots/portal-$view.png", "a screenshot of the view $view ($shots)");
	}
}

# 7b. PORTAL_OPENS = 2 (frank's address): a second session works, a third
# is refused; within the limit a code is still good only once.
sub caught_for
{
	my ($pattern, $count) = @_;
	my @matching;
	poll_until(sub { @matching = grep { $_->{data} =~ $pattern } peer_messages($peer); @matching >= $count }, 60)
	  or why_not();
	return $matching[ $count - 1 ] // { data => '' };
}
sub frank_code
{
	my ($n) = @_;
	my ($frank_code) = caught_for(qr/^To: <frank\@one\.test>\r?\nSubject: Your code for the encrypted message/m, $n)->{data}
	  =~ /message: (\d{8})/;
	return $frank_code // 'none';
}
send_secret('frank@one.test');
my $frank_notice = caught_for(qr/^To: <frank\@one\.test>\r?\nSubject: An encrypted message/m, 1)->{data};
my ($frank) = $frank_notice =~ m{(\Q$base\E/secure/[0-9a-f]{64})\b};
like($frank_notice, qr/The link works for 14 days, for 2 visits\./, 'a link that opens twice says so');
is(sql("SELECT open_limit FROM pepsi.secure_link WHERE recipient = 'frank\@one.test'"), '2',
	'and keeps its limit (PORTAL_OPENS for the address)');
is(post_form("$frank/code", {})->{status}, 200, 'a first code');
my $first = frank_code(1);
$r = post_form("$frank/session", { code => $first });
is($r->{status}, 303, 'a first session');
$r = post_form("$frank/session", { code => $first });
is($r->{status}, 403, 'the same code again is refused');
like($r->{content}, qr/this code was used already: ask for a new one/, 'as a used code (the link opens once more)');
is($http->get($frank)->{status}, 200, 'the link\'s page still offers a code');
is(post_form("$frank/code", {})->{status}, 200, 'a second code');
$r = post_form("$frank/session", { code => frank_code(2) });
is($r->{status}, 303, 'a second session works');
my ($frank_cookie) = ($r->{headers}{'set-cookie'} // '') =~ /^(pepsi_secure=[0-9a-f]{64});/;
$r = $http->get("$frank/message", { headers => { Cookie => $frank_cookie // '' } });
is($r->{status}, 200, 'and shows the message');
my $used_twice = qr/this link was used already \(opened 2 of 2 times\) on [\d-]+ [\d:]+ UTC: ask alice\@client\.test to send the message again/;
$r = $http->get($frank);
is($r->{status}, 410, 'then the page is refused');
like($r->{content}, $used_twice, 'opened 2 of 2 times');
$r = post_form("$frank/code", {});
is($r->{status}, 410, 'and a third code');
like($r->{content}, $used_twice, 'with the reason');
is(sql("SELECT count(*) FROM pepsi.secure_link_session s JOIN pepsi.secure_link l ON l.id = s.link"
		. " WHERE l.recipient = 'frank\@one.test'"), '2', 'two sessions, no third');
($rc, $out, $err) = $cli->('list');
like($out, qr/frank\@one\.test\s.*\sused\s+2\/2\s+0\s*$/m, 'pepsi-secure-link list: used, 2/2');

# 8. A client refused too often is refused for a while.
my $status = 0;
for my $i (1 .. 30)
{
	$status = $http->get("$base/secure/" . ('0' x 63) . ($i % 10))->{status};
	last if $status == 429;
}
is($status, 429, 'a client guessing links is stopped');
like($http->get($link2)->{content}, qr/too many refused links and codes from your address/, 'even for a real link');

done_testing();
