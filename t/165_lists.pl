# Mailing lists (pepsi-stage-list) end to end, through pepsi-ingress (DKIM
# and DMARC checked against the tests' DNS server), pepsi-dispatch, the
# DKIM signer and a scripted SMTP peer standing for the subscribers'
# servers: ingress knows the list's addresses at RCPT; a member's post
# reaches every subscriber once, on its own VERP return path, with
# List-Id, List-Unsubscribe and List-Unsubscribe-Post; a non-member's post
# is held and goes out when a moderator replies with the token; the
# one-click URL unsubscribes on a POST and not on a GET (pepsi-httpd); a
# p=reject sender's From: is rewritten to the list and the copy verifies
# (python3-dkim, Mail::DKIM) with d= the list's domain, aligned with the
# new From:; a subscription takes effect only once confirmed; DSNs to a
# -bounces+ address raise the score and stop delivery at the threshold,
# the owner told; a loop and a post with no Message-ID are handled with a
# log line and nothing is sent twice.

use strict;
use warnings FATAL => 'all';

use HTTP::Tiny;
use IPC::Run;
use MIME::Base64 qw(encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use ListTest;
use PepsiTest;
use SignTest;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');

my $db = 'postgres';
my $l = list_setup('lists');
my ($node, $root, $tmp, $peer, $port, $plain_port, $http_port, $config) =
  @$l{qw(node root tmp peer port plain_port http_port config)};
my %zone = %{ $l->{zone} };

sub sql { return $node->safe_psql($db, shift) }

# The list: VERP, one-click URL, a tag and a footer; owner@local.test
# owns and moderates it; three subscribers at two domains.
my $list = sql("SELECT pepsi.list_create('dev\@lists.test', 'owner\@local.test', 'Developers')");
sql("SELECT pepsi.list_configure($list, 'unsubscribe_url', 'http://127.0.0.1:$http_port/list/unsubscribe'),"
	  . " pepsi.list_configure($list, 'subject_tag', '[dev]'),"
	  . " pepsi.list_configure($list, 'footer_text', 'The dev list'),"
	  . " pepsi.list_configure($list, 'bounce_threshold', '2'),"
	  . " pepsi.list_member_add($list, 'alice\@client.test'), pepsi.list_member_add($list, 'bob\@one.test'),"
	  . " pepsi.list_member_add($list, 'carol\@two.test'), pepsi.list_member_add($list, 'sam\@strict.test')");
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action IN ('list_create', 'list_configure', 'list_subscribe')"),
	'9', 'each change is audited');

list_start();
my $d = $l->{d};
my $httpd = start_dispatcher($config, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(poll_until(sub { file_shows("$tmp/httpd.log", qr/ready/) }, 60), 'pepsi-httpd starts');

sub notices { return map { slurp($_) } maildir_files($root, 'owner@local.test') }

# 1. Ingress: the list's addresses exist, others of its domain do not.
ok(poll_until(sub { (post(to => 'dev-request@lists.test', raw => "Subject: help\r\n\r\nhelp\r\n"))[0] =~ /^250/ }, 30),
	'ingress takes RCPT to dev-request@') or diag(slurp("$tmp/ingress.log"));
like((post(to => 'dev-bounces+bob=one.test@lists.test', raw => "Subject: x\r\n\r\nx\r\n"))[0], qr/^250/,
	'and to a -bounces+ (VERP) address');
like((post(to => 'nosuch@lists.test'))[0], qr/^550 5\.1\.1/, 'and refuses another address of the list domain');
ok(settled(), 'settled');
my $before = () = peer_messages($peer);

# 2. A member's post: one copy per subscriber, each on its own VERP path.
my ($rcpt, $data) = post(subject => 'first');
like($data, qr/^250 /, 'ingress takes a member\'s post');
ok(poll_until(sub { scalar(received('carol@two.test', 'first')) == 1 && scalar(received('sam@strict.test', 'first')) == 1
			&& scalar(received('bob@one.test', 'first')) == 1 && scalar(received('alice@client.test', 'first')) == 1 }, 60),
	'every subscriber gets it') or why_not();
ok(settled(), 'settled');
my ($copy) = received('bob@one.test', 'first');
like($copy->{env}, qr/^MAIL FROM:<dev-bounces\+bob=one\.test\@lists\.test>/m, 'from its VERP return path');
is(scalar(() = $copy->{env} =~ /RCPT TO/g), 1, 'to that subscriber alone');
like($copy->{data}, qr/^List-Id: "Developers" <dev\.lists\.test>\r$/m, 'List-Id (RFC 2919)');
my ($unsubscribe) = $copy->{data} =~ /^List-Unsubscribe: <(http[^>]+)>, <mailto:dev-unsubscribe\@lists\.test>\r$/m;
ok($unsubscribe, 'List-Unsubscribe with an HTTP URL and a mailto (RFC 2369)');
like($unsubscribe, qr/a=bob\@one\.test/, 'the URL names this subscriber');
like($copy->{data}, qr/^List-Unsubscribe-Post: List-Unsubscribe=One-Click\r$/m, 'List-Unsubscribe-Post (RFC 8058)');
like($copy->{data}, qr/^List-Post: <mailto:dev\@lists\.test>\r$/m, 'List-Post');
like($copy->{data}, qr/^Subject: \[dev\] first\r$/m, 'the subject tag');
like($copy->{data}, qr/^-- \r\nThe dev list\r$/m, 'the footer');
like($copy->{data}, qr/^DKIM-Signature:.*?d=lists\.test/ms, 'signed by the list\'s domain');
my ($carol) = received('carol@two.test', 'first');
unlike($carol->{data}, qr/a=bob/, 'carol\'s copy has her own URL');
is(sql("SELECT count(DISTINCT body_id) FROM pepsi.workqueue"), '0', 'nothing left queued');

# 3. One-click unsubscribe: a GET changes nothing, a POST unsubscribes.
my $http = HTTP::Tiny->new(timeout => 30);
my $get = $http->get($unsubscribe);
is($get->{status}, 200, 'a GET of the URL shows a page');
is(sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'bob\@one.test'"), '1', 'and does not unsubscribe');
my $bad = $http->request('POST', $unsubscribe =~ s/t=[0-9a-f]+/t=00000000000000000000000000000000/r,
	{ headers => { 'content-type' => 'application/x-www-form-urlencoded' }, content => 'List-Unsubscribe=One-Click' });
is($bad->{status}, 403, 'a POST with a wrong token is refused');
my $post = $http->request('POST', $unsubscribe,
	{ headers => { 'content-type' => 'application/x-www-form-urlencoded' }, content => 'List-Unsubscribe=One-Click' });
is($post->{status}, 200, 'the one-click POST succeeds') or diag($post->{content});
is(sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'bob\@one.test'"), '0', 'bob is unsubscribed');
is(sql("SELECT detail->>'by' FROM pepsi.event_log WHERE action = 'list_unsubscribe'"), 'one-click', 'audited');

# 4. A non-member's post is held; the moderator's reply releases it.
($rcpt, $data) = post(from => 'mallory@client.test', subject => 'held one');
like($data, qr/^250 /, 'ingress takes a non-member\'s post');
ok(poll_until(sub { grep { /^Subject: Moderation: approve [0-9a-f]{64}/m } notices() }, 60),
	'the moderator is asked') or why_not();
my ($ask) = grep { /^Subject: Moderation: approve/m } notices();
my ($token) = $ask =~ /^Subject: Moderation: approve ([0-9a-f]{64})\r$/m;
like($ask, qr/^From: <dev-request\@lists\.test>\r$/m, 'by the list\'s request address');
# (the notice's own row goes once its delivery commits, just after the peer has it)
ok(poll_until(sub { sql("SELECT string_agg(status || ' ' || (timeout = 'infinity'), ',') FROM pepsi.workqueue") eq 'paused true' }, 60),
	'the post is on hold') or why_not();
is(scalar(received('carol@two.test', 'held one')), 0, 'and not sent');
($rcpt, $data) = post(from => 'owner@local.test', to => 'dev-request@lists.test',
	subject => "Re: Moderation: approve $token", text => "OK\n");
like($data, qr/^250 /, 'the moderator replies');
ok(poll_until(sub { scalar(received('carol@two.test', 'held one')) == 1 }, 60), 'the held post goes out') or why_not();
ok(settled(), 'settled');
is(sql("SELECT decision || ' ' || decided_by FROM pepsi.list_held"), 'approve owner@local.test', 'recorded');
is(scalar(received('bob@one.test', 'held one')), 0, 'not to the unsubscribed bob');

# 5. A p=reject sender: From: rewritten to the list, DKIM and DMARC aligned.
($rcpt, $data) = post(from => 'sam@strict.test', from_field => 'Sam <sam@strict.test>', subject => 'strict',
	sign => 1);
like($data, qr/^250 /, 'ingress takes a signed post from a p=reject domain');
ok(poll_until(sub { scalar(received('carol@two.test', 'strict')) == 1 }, 60), 'it goes out') or why_not();
($copy) = received('carol@two.test', 'strict');
like($copy->{data}, qr/^From: "Sam via dev" <dev\@lists\.test>\r$/m, 'From: is the list');
like($copy->{data}, qr/^Reply-To: Sam <sam\@strict\.test>\r$/m, 'Reply-To: the author');
unlike($copy->{data}, qr/^DKIM-Signature:[^\r]*\bd=strict\.test/m, 'the author\'s broken signature is gone');
is(scalar(() = $copy->{data} =~ /^From:/mg), 1, 'one From: field');
my $verdict = verify_message(\%zone, $copy->{data});
is($verdict->{'python-dkim'}[0], 'pass', 'python3-dkim verifies the list\'s signature') or diag($verdict->{output});
like($verdict->{'mail-dkim'}[0] // '', qr/^pass/, 'Mail::DKIM too');
my ($d_domain) = $copy->{data} =~ /^DKIM-Signature:.*?\bd=([^;\s]+)/ms;
is($d_domain, 'lists.test', 'd= is the From: domain: DMARC aligned');
ok(file_shows($d->{log}, qr/From: <sam\@strict\.test> rewritten to the list \(its domain's DMARC policy is reject\)/),
	'logged');

# Through a listener that checks nothing, the stage looks the policy up.
post(port => $plain_port, from => 'sam@strict.test', from_field => 'Sam <sam@strict.test>', subject => 'unchecked');
ok(poll_until(sub { scalar(received('carol@two.test', 'unchecked')) == 1 }, 60), 'an unchecked post goes out')
  or why_not();
($copy) = received('carol@two.test', 'unchecked');
like($copy->{data}, qr/^From: "Sam via dev" <dev\@lists\.test>\r$/m, 'its From: rewritten by the DNS lookup of the policy');

# 6. Subscribe by mail: nothing until confirmed.
($rcpt, $data) = post(from => 'dave@client.test', to => 'dev-subscribe@lists.test', subject => 'join');
like($data, qr/^250 /, 'a subscribe request');
ok(poll_until(sub { grep { $_->{env} =~ /RCPT TO:<dave\@client\.test>/ } peer_messages($peer) }, 60),
	'dave is asked to confirm') or why_not();
my ($confirm) = grep { $_->{env} =~ /RCPT TO:<dave\@client\.test>/ } peer_messages($peer);
like($confirm->{env}, qr/^MAIL FROM:<>/m, 'from the null sender');
my ($ctoken) = $confirm->{data} =~ /^Subject: Confirm ([0-9a-f]{64})/m;
ok($ctoken, 'with a token');
is(sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'dave\@client.test'"), '0', 'not yet a member');
is(sql("SELECT count(*) FROM pepsi.list_pending"), '1', 'the request waits');
post(from => 'dave@client.test', to => 'dev-request@lists.test', subject => "Re: Confirm $ctoken (subscribe dev\@lists.test)");
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'dave\@client.test'") eq '1' }, 60),
	'the confirmation subscribes him') or why_not();
post(from => 'eve@client.test', to => 'dev-subscribe@lists.test', subject => 'join');
ok(settled(), 'settled');
is(sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'eve\@client.test'"), '0',
	'an unconfirmed subscription adds no one');
ok(file_shows($d->{log}, qr/the subscribe of <eve\@client\.test> awaits confirmation/), 'logged');

# 7. Bounces: the score rises, and at the threshold (2) delivery stops.
my $dsn = "From: MAILER-DAEMON\@one.test\r\nTo: <dev-bounces+carol=two.test\@lists.test>\r\nSubject: failure\r\n"
  . "Content-Type: multipart/report; report-type=delivery-status; boundary=\"b\"\r\n\r\n--b\r\n"
  . "Content-Type: text/plain\r\n\r\nIt failed.\r\n--b\r\nContent-Type: message/delivery-status\r\n\r\n"
  . "Reporting-MTA: dns; mx.two.test\r\n\r\nFinal-Recipient: rfc822; carol\@two.test\r\nAction: failed\r\n"
  . "Status: 5.1.1\r\nDiagnostic-Code: smtp; 550 5.1.1 no such user\r\n\r\n--b--\r\n";
post(mail_from => '', to => 'dev-bounces+carol=two.test@lists.test', raw => $dsn);
ok(poll_until(sub { sql("SELECT bounce_score FROM pepsi.list_member WHERE address = 'carol\@two.test'") eq '1' }, 60),
	'a DSN raises carol\'s score') or why_not();
is(sql("SELECT disabled IS NULL FROM pepsi.list_member WHERE address = 'carol\@two.test'"), 't', 'still enabled');
post(mail_from => '', to => 'dev-bounces+carol=two.test@lists.test', raw => $dsn);
ok(poll_until(sub { sql("SELECT disabled FROM pepsi.list_member WHERE address = 'carol\@two.test'") eq 'bounce' }, 60),
	'the second disables her') or why_not();
ok(poll_until(sub { grep { /^Subject: Subscriber disabled by bounces/m } notices() }, 60), 'the owner is told');
post(subject => 'after bounces');
ok(poll_until(sub { scalar(received('alice@client.test', 'after bounces')) == 1 }, 60), 'the next post goes out');
ok(settled(), 'settled');
is(scalar(received('carol@two.test', 'after bounces')), 0, 'but not to carol');

# 8. Bad input: a loop, no Message-ID.  Nothing sent twice.
my $count = () = peer_messages($peer);
post(subject => 'looped', headers => "List-Id: Developers <dev.lists.test>\r\n");
post(subject => 'xloop', headers => "X-Loop: dev\@lists.test\r\n");
ok(settled(), 'settled');
is(scalar(() = peer_messages($peer)), $count, 'a post carrying our own List-Id or X-Loop is not sent');
ok(file_shows($d->{log}, qr/a loop: it carries this list's own List-Id: dropped/), 'logged (List-Id)');
ok(file_shows($d->{log}, qr/a loop: its X-Loop names this list: dropped/), 'logged (X-Loop)');
post(subject => 'no id', no_id => 1);
ok(poll_until(sub { scalar(received('alice@client.test', 'no id')) == 1 }, 60), 'a post without Message-ID goes out');
ok(settled(), 'settled');
($copy) = received('alice@client.test', 'no id');
like($copy->{data}, qr/^Message-ID: <[^>]+\.list\@lists\.test>\r$/m, 'with one the list gave it');
ok(file_shows($d->{log}, qr/has no Message-ID: given one/), 'logged');
post(to => 'dev-owner@lists.test', subject => 'for the owner');
ok(poll_until(sub { grep { /^Subject: for the owner\r$/m } notices() }, 60), 'mail to dev-owner@ reaches the owner');
my %seen;
$seen{ ($_->{env} =~ /RCPT TO:<([^>]+)>/)[0] . ' ' . (($_->{data} =~ /^Subject: (.*)\r$/m)[0] // '') }++
  for peer_messages($peer);
is(join(',', grep { $seen{$_} > 1 } sort keys %seen), '', 'no subscriber got any message twice');

# 9. pepsi-list: import Mailman's and mlmmj's member lists, export them,
# moderate and re-enable from the command line; each change audited.
sql('CREATE ROLE operator LOGIN IN ROLE pepsi_config');
my $tool_config = operator_config($node, $config, 'operator');
sub tool
{
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ pepsi_bin('pepsi-list'), '-C', $tool_config, @_ ], '>', \$out, '2>', \$err);
	return ($ok, $out, $err);
}
my ($ok, $out, $err) = tool('create', 'ops@lists.test', 'owner@local.test', 'Operations');
ok($ok, 'pepsi-list create') or diag($err);
PostgreSQL::Test::Utils::append_to_file("$tmp/mailman.txt", "Fred Flintstone <fred\@one.test>\nwilma\@two.test\n");
PostgreSQL::Test::Utils::append_to_file("$tmp/mlmmj-subscribers", "barney\@one.test\n");
PostgreSQL::Test::Utils::append_to_file("$tmp/bad.txt", "pebbles\@one.test\nnot an address\n");
($ok, $out, $err) = tool('import', 'ops@lists.test', "$tmp/mailman.txt");
like($out, qr/^2 member\(s\) added$/m, 'imports Mailman\'s list_members output') or diag($err);
($ok, $out) = tool('import', 'ops@lists.test', "$tmp/mlmmj-subscribers");
like($out, qr/^1 member\(s\) added$/m, 'and an mlmmj subscribers.d file');
($ok, $out, $err) = tool('import', 'ops@lists.test', "$tmp/bad.txt");
ok(!$ok, 'a bad line refuses the import');
like($err, qr/bad\.txt:2: <not an address> refused: nothing imported/, 'naming the file and line');
is(sql("SELECT string_agg(m.address || ':' || coalesce(m.display_name, ''), ' ' ORDER BY m.address) FROM pepsi.list_member m"
	  . " JOIN pepsi.mailing_list l ON l.id = m.list_id WHERE l.address = 'ops\@lists.test'"),
	'barney@one.test: fred@one.test:Fred Flintstone wilma@two.test:', 'and nothing of it is in');
($ok, $out) = tool('export', 'ops@lists.test', 'mailman');
is($out, "barney\@one.test\n\"Fred Flintstone\" <fred\@one.test>\nwilma\@two.test\n", 'exports Mailman\'s format');
($ok, $out) = tool('export', 'ops@lists.test', 'mlmmj');
is($out, "barney\@one.test\nfred\@one.test\nwilma\@two.test\n", 'and mlmmj\'s');
$count = () = peer_messages($peer);
# Ingress learns a new list's addresses when it next reads them (on the
# notification pepsi-list's change sends, or its refresh).
ok(poll_until(sub { rcpt_taken('ops@lists.test') }, 30), 'ingress takes RCPT to the new list');
post(from => 'mallory@client.test', to => 'ops@lists.test', subject => 'to be rejected');
# (held once its row is paused too: the list_held row can be seen before
# the row's own commit, and a row still running cannot be released)
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.list_held h JOIN pepsi.workqueue w ON w.id = h.workqueue_id"
			  . " WHERE h.subject = 'to be rejected' AND w.status = 'paused'") eq '1' }, 60),
	'a non-member\'s post to it is held');
my $held = sql("SELECT id FROM pepsi.list_held WHERE subject = 'to be rejected'");
($ok, $out) = tool('held', 'ops@lists.test');
like($out, qr/mallory\@client\.test/, 'pepsi-list held shows it');
($ok, $out, $err) = tool('reject', $held);
ok($ok, 'pepsi-list reject') or diag($err);
ok(settled(), 'settled');
is(scalar(() = grep { $_->{data} =~ /to be rejected/ } peer_messages($peer)), 0, 'the rejected post is not sent');
ok(file_shows($d->{log}, qr/the held post from <mallory\@client\.test> was rejected by a moderator: dropped/), 'logged');
# Without VERP: one row per destination domain.
($ok, $out, $err) = tool('set', 'ops@lists.test', 'verp', 'false');
ok($ok, 'pepsi-list set verp false') or diag($err);
($ok, $out, $err) = tool('set', 'ops@lists.test', 'posting_policy', 'sometimes');
like($err, qr/posting_policy/, 'a bad setting value is refused, naming the setting');
post(from => 'owner@local.test', to => 'ops@lists.test', subject => 'per domain');
ok(poll_until(sub { file_shows($d->{log}, qr/list 2: the post goes out on 2 row\(s\)/) }, 60),
	'an owner\'s post to a non-VERP list is split into one row per domain (two)') or why_not();
ok(poll_until(sub { scalar(grep { $_->{data} =~ /^Subject: per domain/m } peer_messages($peer)) == 3 }, 60),
	'it reaches the three members');
my @per_domain = grep { $_->{data} =~ /^Subject: per domain/m } peer_messages($peer);
is(scalar(grep { $_->{env} =~ /^MAIL FROM:<ops-bounces\@lists\.test>/m } @per_domain), 3, 'from list-bounces@');
my ($one) = @per_domain;
like($one->{data}, qr/^List-Unsubscribe: <mailto:ops-unsubscribe\@lists\.test>\r$/m, 'with a mailto List-Unsubscribe');
unlike($one->{data}, qr/^List-Unsubscribe-Post/m, 'and no one-click');
ok(settled(), 'settled');
($ok, $out) = tool('enable', 'dev@lists.test', 'carol@two.test');
is(sql("SELECT coalesce(disabled, 'enabled') || ' ' || bounce_score FROM pepsi.list_member WHERE address = 'carol\@two.test'"),
	'enabled 0', 'pepsi-list enable starts delivery to carol again');
is(sql("SELECT string_agg(DISTINCT action, ' ' ORDER BY action) FROM pepsi.event_log WHERE principal = 'operator'"),
	'list_configure list_create list_member_enable list_reject list_subscribe queue_release', 'every change by pepsi-list is audited');

stop_dispatcher($httpd);
list_stop();
done_testing();
