# Mailing lists, the rest of issue 40 (pepsi-stage-list): the fan-out
# is one call (a commit that fails twice at it, then runs again, sends
# no copy twice); digests, MIME (multipart/digest) and plain (RFC 1153),
# from the schedule, to digest members only; an accepted post is
# ARC-sealed before the signer and a p=reject author's post wrapped in a
# message from the list, both verifying (python3-dkim's DKIM and ARC
# verifiers, Mail::DKIM); bad input: a list as its own member, two lists
# subscribed to each other, broken MIME, a post over max_post_size, a
# subscription never confirmed: each with its reason logged, nothing
# sent twice.

use strict;
use warnings FATAL => 'all';

use FindBin;
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
use SmtpClient;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');

my $db = 'postgres';
my $l = list_setup('lists_more', arc_seal => 1);
my ($node, $root, $tmp, $peer, $port, $http_port, $config) = @$l{qw(node root tmp peer port http_port config)};
my %zone = %{ $l->{zone} };

sub sql { return $node->safe_psql($db, shift) }

my $list = sql("SELECT pepsi.list_create('dev\@lists.test', 'owner\@local.test', 'Developers')");
sql("SELECT pepsi.list_member_add($list, 'alice\@client.test'), pepsi.list_member_add($list, 'bob\@one.test'),"
	  . " pepsi.list_member_add($list, 'dig\@one.test', 'digest'), pepsi.list_member_add($list, 'nom\@two.test', 'nomail')");

list_start();
my $d = $l->{d};

sub logged { my ($re) = @_; return poll_until(sub { file_shows($d->{log}, $re) }, 30) }

ok(poll_until(sub { (post(to => 'dev-request@lists.test', raw => "Subject: help\r\n\r\nhelp\r\n"))[0] =~ /^250/ }, 30),
	'ingress knows the list') or diag(slurp("$tmp/ingress.log"));
ok(settled(), 'settled');

# 1. Fan-out atomicity: the fan-out's commit fails (the worker's commit
# and its retry on a new session), which leaves the post failed at the
# list stage; an operator resumes it and it runs again.  The subscribers'
# rows and the post's end are one call: nothing of the failed attempt was
# sent, and each subscriber gets the post once.
sql(q{CREATE SEQUENCE public.fanout_failures;
CREATE FUNCTION public.fail_fanout() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF nextval('public.fanout_failures') <= 2 THEN
        RAISE EXCEPTION 'injected failure at the fan-out''s commit';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER fail_fanout BEFORE DELETE ON pepsi.workqueue FOR EACH ROW
    WHEN (OLD.state -> 'list' ->> 'phase' = 'fanout') EXECUTE FUNCTION public.fail_fanout();});
my ($rcpt, $data) = post(subject => 'atomic');
like($data, qr/^250 /, 'a post while the fan-out\'s commit fails');
ok(poll_until(sub { sql("SELECT status FROM pepsi.workqueue WHERE state -> 'list' ->> 'phase' = 'fanout'") eq 'failed' }, 60),
	'the post fails at its fan-out') or why_not();
ok(file_shows($d->{log}, qr/injected failure at the fan-out's commit/), 'the failed commit is logged');
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.workqueue WHERE status <> 'failed'") eq '0' }, 60),
	'nothing else is left to run');
my $sent_meanwhile = scalar(received('bob@one.test', 'atomic'));
sql('DROP TRIGGER fail_fanout ON pepsi.workqueue');
sql("SELECT pepsi.workqueue_resume(array_agg(id)) FROM pepsi.workqueue WHERE status = 'failed'");
ok(poll_until(sub { scalar(received('bob@one.test', 'atomic')) >= 1 && scalar(received('alice@client.test', 'atomic')) >= 1 }, 60),
	'resumed, it goes out') or why_not();
ok(settled(), 'settled');
is($sent_meanwhile, 0, 'nothing of the failed fan-out was sent');
is(scalar(received('bob@one.test', 'atomic')), 1, 'bob got it once');
is(scalar(received('alice@client.test', 'atomic')), 1, 'alice got it once');
is(scalar(received('nom@two.test', 'atomic')), 0, 'the nomail member nothing');
is(scalar(received('dig@one.test', 'atomic')), 0, 'the digest member not the post itself');
is(sql("SELECT count(*) FROM pepsi.list_digest"), '1', 'the post is kept once for the digest');

# 2. Digests.  A second post, then the schedule's row: a MIME digest of
# both to the digest member only.
post(subject => 'second');
ok(poll_until(sub { scalar(received('bob@one.test', 'second')) == 1 }, 60), 'a second post') or why_not();
ok(settled(), 'settled');
is(sql("SELECT count(*) FROM pepsi.list_digest"), '2', 'both wait for the digest');
sql(q{SELECT pepsi.schedule_add('dev-digest', now(), interval '1 day', 'init', ARRAY['dev@lists.test'], NULL,
                                '{"list_digest": true}')});
ok(poll_until(sub { scalar(received('dig@one.test', 'Digest')) == 1 }, 60), 'the schedule sends the digest')
  or why_not();
ok(settled(), 'settled');
my ($digest) = received('dig@one.test', 'Digest');
like($digest->{data}, qr/^Subject: dev Digest, Issue 1 \(2 messages\)\r$/m, 'its subject');
like($digest->{env}, qr/^MAIL FROM:<dev-bounces\@lists\.test>/m, 'from the list\'s bounce address');
like($digest->{data}, qr/^Content-Type: multipart\/mixed; boundary="([^"]+)"/m, 'MIME');
like($digest->{data}, qr/^Content-Type: multipart\/digest; boundary=/m, 'with a multipart/digest part');
like($digest->{data}, qr/Today's Topics:\r\n\r\n +1\. \[?.*atomic.*\r\n +2\. .*second/, 'a table of contents');
my $entity = parse_dsn($digest->{data});
my ($digest_part) = grep { $_->mime_type eq 'multipart/digest' } $entity->parts;
ok($digest_part, 'MIME-tools finds the digest part');
is(join(',', map { $_->mime_type } $digest_part ? $digest_part->parts : ()), 'message/rfc822,message/rfc822',
	'two message/rfc822 parts');
my $verdict = verify_message(\%zone, $digest->{data});
is($verdict->{'python-dkim'}[0], 'pass', 'the digest is signed by the list (python3-dkim)') or diag($verdict->{output});
is(scalar(received('nom@two.test')), 0, 'the nomail member got nothing at all');
is(scalar(received('bob@one.test', 'Digest')), 0, 'a member taking each message no digest');
is(sql("SELECT count(*) FROM pepsi.list_digest"), '0', 'the posts taken');
is(sql("SELECT pepsi.list_digest_send($list, 'sign')->>'posts'"), '0', 'a second send finds nothing: none twice');

# The plain (RFC 1153) form.
sql("SELECT pepsi.list_configure($list, 'digest_format', 'plain')");
post(subject => 'third', text => "Plain words.\r\n");
ok(poll_until(sub { scalar(received('bob@one.test', 'third')) == 1 }, 60), 'a third post') or why_not();
ok(settled(), 'settled');
sql(q{SELECT pepsi.schedule_add('dev-digest-2', now(), NULL, 'init', ARRAY['dev@lists.test'], NULL, '{"list_digest": true}')});
ok(poll_until(sub { scalar(received('dig@one.test', 'Issue 2')) == 1 }, 60), 'the plain digest') or why_not();
($digest) = received('dig@one.test', 'Issue 2');
like($digest->{data}, qr/^Content-Type: text\/plain; charset=utf-8\r$/m, 'is text/plain');
like($digest->{data}, qr/\r\n\r\nToday's Topics:\r\n\r\n +1\. .*third.*\r\n\r\n-{70}\r\n\r\nDate: .*\r\nFrom: .*\r\nSubject: .*third\r\nMessage-ID: .*\r\n\r\nPlain words\.\r\n(?:.*\r\n)*\r\n-{30}\r\n\r\nEnd of dev Digest, Issue 2\r\n\*+\r\n$/,
	'in RFC 1153\'s layout');
ok(settled(), 'settled');

# 3. ARC sealing and the DMARC wrap: a p=reject author's post is wrapped.
sql("SELECT pepsi.list_configure($list, 'dmarc_mitigation', 'wrap'), pepsi.list_member_add($list, 'sam\@strict.test')");
($rcpt, $data) = post(from => 'sam@strict.test', from_field => 'Sam <sam@strict.test>', subject => 'wrapped', sign => 1,
	text => "Signed words.\r\n");
like($data, qr/^250 /, 'a signed post from a p=reject domain');
ok(poll_until(sub { scalar(received('bob@one.test', 'wrapped')) == 1 }, 60), 'it goes out') or why_not();
my ($copy) = received('bob@one.test', 'wrapped');
like($copy->{data}, qr/^From: "Sam via dev" <dev\@lists\.test>\r$/m, 'from the list');
like($copy->{data}, qr/^Reply-To: Sam <sam\@strict\.test>\r$/m, 'Reply-To: the author');
like($copy->{data}, qr/^Content-Type: multipart\/mixed; boundary=/m, 'a wrapper');
like($copy->{data}, qr/^Content-Type: message\/rfc822\r$/m, 'carrying the post as message/rfc822');
like($copy->{data}, qr/^ARC-Seal: i=1; a=rsa-sha256; t=\d+; cv=none;\r\n\td=lists\.test; s=s1;/m, 'ARC-sealed by the list (i=1, cv=none)');
like($copy->{data}, qr/^ARC-Authentication-Results: i=1; mx\.pepsi\.test;.*dkim=pass/ms, 'recording the author\'s DKIM pass');
$verdict = verify_message(\%zone, $copy->{data});
is($verdict->{'python-dkim'}[0], 'pass', 'python3-dkim verifies the list\'s signature') or diag($verdict->{output});
like($verdict->{'mail-dkim'}[0] // '', qr/^pass/, 'Mail::DKIM too');
like($verdict->{arc} // '', qr/^pass/, 'python3-dkim\'s arc_verify passes the seal') or diag($verdict->{output});
my ($boundary) = $copy->{data} =~ /boundary="(wrap-[^"]+)"/;
my ($inner_text) = $copy->{data} =~ /^Content-Type: message\/rfc822\r\nContent-Disposition: inline\r\n\r\n(.*?)^--\Q$boundary\E--/ms;
$inner_text //= '';
like($inner_text, qr/^From: Sam <sam\@strict\.test>\r$/m, 'the post inside keeps its From:');
$verdict = verify_message(\%zone, $inner_text);
is($verdict->{'python-dkim'}[0], 'pass', 'and its author\'s signature verifies (python3-dkim)') or diag($verdict->{output});
# Pepsi's own verifier: the copy, sent on to a mailbox here, passes
# ingress's ARC check (its Authentication-Results).
make_mailbox($root, 'arc@local.test');
sql("INSERT INTO pepsi.virtual_mailbox (address) VALUES ('arc\@local.test')");
ok(poll_until(sub { rcpt_taken('arc@local.test') }, 30), 'ingress takes the new mailbox');
(my $onward = $copy->{data}) =~ s/^\./../mg;
my $c = SmtpClient->new($port);
$c->command('EHLO mx.client.test');
$c->command('MAIL FROM:<dev-bounces@lists.test>');
$c->command('RCPT TO:<arc@local.test>');
$c->command('DATA');
$c->send("$onward\r\n.\r\n");
like($c->reply(60), qr/^250 /, 'the sealed copy is sent on to a local mailbox');
$c->command('QUIT');
$c->close;
ok(poll_until(sub { scalar(maildir_files($root, 'arc@local.test')) == 1 }, 60), 'delivered') or why_not();
my ($arrived) = map { slurp($_) } maildir_files($root, 'arc@local.test');
like($arrived, qr/^Authentication-Results: mx\.pepsi\.test;(?:[^\r]|\r\n[ \t])*\barc=pass\b/m,
	'pepsi-ingress\'s ARC verifier passes the chain');
ok(file_shows($d->{log}, qr/the post from <sam\@strict\.test> is wrapped in a message from the list \(its domain's DMARC policy is reject\)/),
	'logged');
ok(settled(), 'settled');

# 4. Bad input.
# A list cannot be its own member.
my ($out, $err) = ('', '');
$node->psql($db, "SELECT pepsi.list_member_add($list, 'dev-request\@lists.test')", stdout => \$out, stderr => \$err);
like($err, qr/dev-request\@lists\.test is an address of list \d+ itself: a list cannot be its own member/,
	'a list\'s own address is refused as its member');
# Two lists subscribed to each other: a post goes round once and stops.
my $la = sql("SELECT pepsi.list_create('a\@lists.test', 'owner\@local.test')");
my $lb = sql("SELECT pepsi.list_create('b\@lists.test', 'owner\@local.test')");
sql("SELECT pepsi.list_member_add($la, 'b\@lists.test'), pepsi.list_member_add($la, 'x\@one.test'),"
	  . " pepsi.list_member_add($lb, 'a\@lists.test'), pepsi.list_member_add($lb, 'y\@two.test')");
ok(poll_until(sub { rcpt_taken('b@lists.test') }, 30), 'ingress knows the new lists');
post(from => 'owner@local.test', to => 'a@lists.test', subject => 'round');
# The peer stands for the network: what it got for a list address goes back to ingress.
sub bounce_back
{
	my ($to) = @_;
	my ($m) = received($to, 'round');
	return 0 unless $m;
	(my $text = $m->{data}) =~ s/^\./../mg;
	my $c = SmtpClient->new($port);
	$c->command('EHLO mx.client.test');
	$c->command('MAIL FROM:<' . ($m->{env} =~ /^MAIL FROM:<([^>]*)>/m)[0] . '>');
	$c->command("RCPT TO:<$to>");
	$c->command('DATA');
	$c->send("$text\r\n.\r\n");
	my $reply = $c->reply(60);
	$c->command('QUIT');
	$c->close;
	return $reply =~ /^250/;
}
ok(poll_until(sub { scalar(received('b@lists.test', 'round')) == 1 }, 60), 'list a sends to list b') or why_not();
ok(bounce_back('b@lists.test'), 'which gets it');
ok(poll_until(sub { scalar(received('a@lists.test', 'round')) == 1 }, 60), 'list b sends to list a') or why_not();
ok(bounce_back('a@lists.test'), 'which gets it back');
ok(logged(qr/<a\@lists\.test>: a loop: its X-Loop names this list: dropped/), 'and drops it as a loop') or why_not();
ok(settled(), 'settled');
is(scalar(received('x@one.test', 'round')), 1, 'x got it once');
is(scalar(received('y@two.test', 'round')), 1, 'y got it once');

# Broken MIME: held for the moderators, with the reason.
my $held_before = sql("SELECT count(*) FROM pepsi.list_held");
post(subject => 'no boundary', headers => "MIME-Version: 1.0\r\nContent-Type: multipart/mixed\r\n");
post(subject => 'lost boundary', headers => "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"zz\"\r\n",
	text => "--zz\r\nContent-Type: text/plain\r\n\r\nunclosed\r\n");
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.list_held") == $held_before + 2 }, 60), 'broken MIME is held')
  or why_not();
is(sql("SELECT string_agg(reason, ' | ' ORDER BY id) FROM pepsi.list_held WHERE subject IN ('no boundary', 'lost boundary')"),
	'broken MIME: a multipart Content-Type without a boundary parameter | broken MIME: its parts are never closed (no "--zz--" line)',
	'for the reasons given');
ok(logged(qr/the post from <alice\@client\.test> is held \(broken MIME: a multipart Content-Type without a boundary parameter\)/),
	'logged');
# A post over max_post_size: held; its moderator may still send it, once.
sql("SELECT pepsi.list_configure($list, 'max_post_size', '100000')");
my $attachment = encode_base64('x' x 200000);
post(subject => 'huge', headers => "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"hh\"\r\n",
	text => "--hh\r\nContent-Type: text/plain\r\n\r\nSee attached.\r\n--hh\r\nContent-Type: application/octet-stream\r\n"
	  . "Content-Transfer-Encoding: base64\r\n\r\n$attachment\r\n--hh--\r\n");
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.list_held WHERE subject = 'huge'") eq '1' }, 60), 'a huge post is held')
  or why_not();
like(sql("SELECT reason FROM pepsi.list_held WHERE subject = 'huge'"),
	qr/^the post is \d+ bytes, over the list's max_post_size of 100000$/, 'naming the size and the setting');
is(scalar(received('bob@one.test', 'huge')), 0, 'and not sent');
sql("SELECT pepsi.list_decide((SELECT id FROM pepsi.list_held WHERE subject = 'huge'), 'approve', NULL)");
ok(poll_until(sub { scalar(received('bob@one.test', 'huge')) == 1 }, 60), 'approved, it goes out') or why_not();
ok(settled(), 'settled');
# A subscription never confirmed: its token expires, the request goes, logged.
post(from => 'zed@client.test', to => 'dev-subscribe@lists.test', subject => 'join');
post(from => 'yan@client.test', to => 'dev-subscribe@lists.test', subject => 'join');
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.list_pending") eq '2' }, 60), 'two requests wait') or why_not();
ok(poll_until(sub { scalar(received('zed@client.test', 'Confirm')) == 1 }, 60), 'zed is asked to confirm');
my ($zed) = received('zed@client.test', 'Confirm');
my ($ztoken) = $zed->{data} =~ /^Subject: Confirm ([0-9a-f]{64})/m;
sql("UPDATE pepsi.list_pending SET expires_at = now() - interval '1 minute'");    # their time passes
post(from => 'zed@client.test', to => 'dev-request@lists.test', subject => "Re: Confirm $ztoken (subscribe dev\@lists.test)");
ok(logged(qr/confirmation by <zed\@client\.test> refused: the token has expired: ask again/), 'a late confirmation is refused')
  or why_not();
sql(q{SELECT pepsi.schedule_add('dev-digest-3', now(), NULL, 'init', ARRAY['dev@lists.test'], NULL, '{"list_digest": true}')});
ok(logged(qr/1 request\(s\) expired unconfirmed: dropped/), 'the next digest run drops the other one') or why_not();
is(sql("SELECT detail->>'address' FROM pepsi.event_log WHERE action = 'list_request_expired'"), 'yan@client.test',
	'audited');
is(sql("SELECT count(*) FROM pepsi.list_member WHERE address IN ('zed\@client.test', 'yan\@client.test')"), '0',
	'neither is a member');
ok(settled(), 'settled');

# 5. The web forms (pepsi-httpd), in Chromium: subscribe, the mailed
# link confirms; unsubscribe the same way.  A forged POST is refused.
my $base = "http://127.0.0.1:$http_port";
sql("SELECT pepsi.list_configure($list, 'unsubscribe_url', '$base/list/unsubscribe')");
my $httpd = start_dispatcher($config, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(poll_until(sub { file_shows("$tmp/httpd.log", qr/ready/) }, 60), 'pepsi-httpd starts');
my $http = HTTP::Tiny->new(timeout => 30);
my $form = $http->get("$base/list/form/subscribe?l=dev\@lists.test");
is($form->{status}, 200, 'the subscribe form');
like($form->{headers}{'content-security-policy'} // '',
	qr/default-src 'none'; script-src 'self'; style-src 'self';.*form-action 'self'; frame-ancestors 'none'/,
	'with a strict CSP');
unlike($form->{content}, qr/<script|<style|\sstyle=|\son[a-z]+=/i, 'no inline script or style');
like($form->{headers}{'set-cookie'} // '', qr/^pepsi_list_form=[0-9a-f]{64}; Path=\/list\/form\/; HttpOnly; SameSite=Strict/,
	'its CSRF cookie: HttpOnly, SameSite=Strict');
my ($csrf) = $form->{content} =~ /name="csrf" value="([0-9a-f]{64})"/;
my $forged = $http->request('POST', "$base/list/form/subscribe",
	{ headers => { 'content-type' => 'application/x-www-form-urlencoded' },
	  content => "l=dev%40lists.test&address=forged%40client.test&csrf=$csrf" });
is($forged->{status}, 403, 'a POST with the token but not its cookie (another site\'s form) is refused');
my $chromium = '/usr/bin/chromium';
my $node_path = `npm root -g 2>/dev/null`;
chomp $node_path;
SKIP:
{
	skip 'chromium, node or playwright-core is not installed (scripts/deps.sh installs them)', 14
	  unless -x $chromium && -x '/usr/bin/node' && -d "$node_path/playwright-core";
	my $shots = PostgreSQL::Test::Utils::tempdir();
	my $script = "$FindBin::RealBin/browser/list_forms.js";
	# One Chromium for the file (its start was most of the file's CPU:
	# about 5 s a run), each run its "ok"/"fail" lines in a context of its
	# own (list_forms.js serve).  Each run's bound is the suite's for
	# liveness (PG_TEST_TIMEOUT_DEFAULT, 180 s unless set, as
	# poll_until's): a run took about 86 s at a load of 40, close to the
	# 120 s this had, whose timer, once overrun, kills the whole file
	# ("IPC::Run: timeout on timer") after the last assertion it printed.
	# A run that still overruns is a failed step, said as such, and the
	# runs after it fail too.
	my ($b_in, $b_out, $b_err) = ('', '', '');
	my $b_timer = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
	my $b_run = do {
		local $ENV{NODE_PATH} = $node_path;
		IPC::Run::start([ '/usr/bin/node', $script, 'serve', $shots ],
			'<', \$b_in, '>', \$b_out, '2>', \$b_err, $b_timer);
	};
	my $browser = sub {
		my ($mode, $url, $address) = @_;
		my $out = '';
		eval {
			die "the browser is gone\n" unless $b_run->pumpable;
			$b_timer->start($PostgreSQL::Test::Utils::timeout_default);
			$b_in .= "$mode $url $address\n";
			$b_run->pump until $b_out =~ /^done\n/m;
			1;
		} or $out = "\nfail the browser did not finish: $@";
		($out) = ($b_out =~ /\A(.*?)^done\n/ms) if $out eq '';
		$b_out =~ s/\A.*?^done\n//ms;
		my $err = $b_err;
		$b_err = '';
		return $out . $err;
	};
	sub confirm_link
	{
		my ($verb) = @_;
		my ($m) = grep { $_->{data} =~ /^Subject: Confirm [0-9a-f]{64} \(\Q$verb\E dev\@lists\.test\)/m }
		  received('web@client.test');
		return $m && ($m->{data} =~ m{(http://127\.0\.0\.1:\d+/list/form/confirm\?\S+)})[0];
	}
	my $out = $browser->('form', "$base/list/form/subscribe?l=dev\@lists.test", 'web@client.test');
	unlike($out, qr/^fail/m, 'Chromium: the subscribe form is sent') or diag($out);
	ok(poll_until(sub { confirm_link('subscribe') }, 60), 'a confirmation mail with a link comes') or why_not();
	my $link = confirm_link('subscribe');
	is(sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'web\@client.test'"), '0', 'not a member yet');
	is($http->get($link)->{status}, 200, 'a GET of the link (a link scanner)');
	is(sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'web\@client.test'"), '0', 'changes nothing');
	$out = $browser->('confirm', $link, '-');
	unlike($out, qr/^fail/m, 'Chromium: the link\'s button confirms') or diag($out);
	like($out, qr/^ok no console error/m, 'without a CSP violation');
	is(sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'web\@client.test'"), '1', 'a member now');
	$out = $browser->('confirm', $link, '-');
	like($out, qr/^fail the button confirms/m, 'the link works once');
	$out = $browser->('form', "$base/list/form/unsubscribe?l=dev\@lists.test", 'web@client.test');
	unlike($out, qr/^fail/m, 'Chromium: the unsubscribe form is sent') or diag($out);
	ok(poll_until(sub { confirm_link('unsubscribe') }, 60), 'a confirmation mail comes') or why_not();
	is(sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'web\@client.test'"), '1', 'still a member');
	$out = $browser->('confirm', confirm_link('unsubscribe'), '-');
	unlike($out, qr/^fail/m, 'Chromium: its link confirms') or diag($out);
	is(sql("SELECT count(*) FROM pepsi.list_member WHERE address = 'web\@client.test'"), '0', 'unsubscribed');
	eval { $b_run->finish; 1 } or eval { $b_run->kill_kill };
}
ok(settled(), 'settled');

my %seen;
$seen{ ($_->{env} =~ /RCPT TO:<([^>]+)>/)[0] . ' ' . (($_->{data} =~ /^Subject: (.*)\r$/m)[0] // '') }++
  for peer_messages($peer);
is(join(',', grep { $seen{$_} > 1 } sort keys %seen), '', 'no one got any message twice');

stop_dispatcher($httpd);
list_stop();
done_testing();
