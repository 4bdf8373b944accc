# The mailing lists' archive (issue 40, item 4): a post accepted through
# pepsi-ingress and pepsi-stage-list is archived once, as the archive's own
# copy, which outlives the queue's body (the body garbage collector takes
# that when the last delivery goes); replies join their thread, one that
# arrives before its parent joins when the parent comes; a post without a
# Message-Id and with broken MIME, and an attachment over the list's limit,
# are archived with the reason logged.  pepsi-archive imports a real mlmmj
# list's archive/ directory (mlmmj-receive feeding a list whose relay is
# smtp-sink) and threads it as MHonArc (Debian's mhonarc, run on the same
# messages as an mbox) does; search finds a word in a body and in a
# subject; export gives an mbox back; reindex rebuilds the same threads.

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use HTTP::Tiny;
use JSON::PP qw(encode_json);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use ListTest qw(list_setup list_start list_stop post rcpt_taken why_not);
use PepsiTest;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');
plan skip_all => 'mhonarc and mlmmj are needed' unless -x '/usr/bin/mhonarc' && -x '/usr/bin/mlmmj-receive';

my $db = 'postgres';
my $l = list_setup('archive');
my ($node, $tmp, $dns, $peer, $http_port, $config) = @$l{qw(node tmp dns peer http_port config)};
sub sql { return $node->safe_psql($db, shift) }

my $list = sql("SELECT pepsi.list_create('dev\@lists.test', 'owner\@lists.test', 'Developers')");
sql("SELECT pepsi.list_configure($list, 'posting_policy', 'open'), pepsi.list_member_add($list, 'bob\@one.test'),"
	  . " pepsi.list_member_add($list, 'carol\@two.test')");
sql("SELECT pepsi.archive_policy_set($list, 'max_attachment', '2000')");

list_start();
my $d = $l->{d};
# Ingress takes mail for lists.test's addresses it knows: the list's, once it has read them.
ok(poll_until(sub { rcpt_taken('dev@lists.test') }, 60), 'ingress knows the list');

# A post of $message to dev@lists.test through ingress: the reply to its DATA.
sub post_message { return (post(raw => $_[0]))[1] }
# Every row gone, a held one too (ListTest's settled leaves those).
sub drained { return poll_until(sub { queue_count($node) == 0 }, 60) }
sub message { my ($id, $subject, $extra, $text) = @_;
	return "From: Alice <alice\@client.test>\nTo: dev\@lists.test\nSubject: $subject\n"
	  . ($id ? "Message-ID: <$id>\n" : '') . ($extra // '') . "Date: Sun, 6 Dec 2026 12:00:00 +0000\n\n"
	  . ($text // "Hello.\n") }

# 1. Posts through the pipeline; the reply comes before its parent.
like(post_message(message('root@client.test', 'Quokka plans', '', "The wombat is ready.\n")), qr/^250 /, 'a post');
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.archive_message") eq '1' }, 60), 'it is archived') or why_not();
ok(drained(), 'delivered') or why_not();
is(sql("SELECT count(*) FROM pepsi.workqueue_body"), '0', 'the queue keeps no body once delivered');
sql("SELECT pepsi.workqueue_body_gc()");
my $archived = sql("SELECT convert_from(raw, 'UTF8') FROM pepsi.archive_message WHERE message_id = 'root\@client.test'");
like($archived, qr/The wombat is ready\./, 'the archive\'s own copy outlives the body collector');
like($archived, qr/^List-Id: .*dev\.lists\.test/m, 'the copy as the list sent it');
like(post_message(message('late@client.test', 'Re: Quokka plans',
	"In-Reply-To: <middle\@client.test>\nReferences: <root\@client.test> <middle\@client.test>\n")), qr/^250 /,
	'a reply to a reply not yet seen');
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.archive_message") eq '2' }, 60), 'archived') or why_not();
is(sql("SELECT parent_id = (SELECT id FROM pepsi.archive_message WHERE message_id = 'root\@client.test')"
		. " FROM pepsi.archive_message WHERE message_id = 'late\@client.test'"), 't', 'under the root for now');
post_message(message('middle@client.test', 'Re: Quokka plans',
	"In-Reply-To: <root\@client.test>\nReferences: <root\@client.test>\n"));
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.archive_message") eq '3' }, 60), 'the middle one comes')
  or why_not();
is(sql("SELECT p.message_id FROM pepsi.archive_message m JOIN pepsi.archive_message p ON p.id = m.parent_id"
		. " WHERE m.message_id = 'late\@client.test'"), 'middle@client.test', 'and adopts its reply');
is(sql("SELECT count(DISTINCT thread_id) || ' ' || max(t.message_count) FROM pepsi.archive_message m"
		. " JOIN pepsi.archive_thread t ON t.id = m.thread_id"), '1 3', 'one thread of three');
is(sql("SELECT count(*) FROM pepsi.archive_search($list, 'wombat')"), '1', 'search finds a word of a body');
is(sql("SELECT count(*) FROM pepsi.archive_search($list, 'quokka')"), '3', 'and of a subject');

# 2. Bad input: no Message-Id, broken MIME, an attachment over the limit.
my $big = ('A' x 76 . "\n") x 60;
like(post_message(message(undef, 'Broken', "MIME-Version: 1.0\nContent-Type: multipart/mixed\n", "no boundary here\n")),
	qr/^250 /, 'a post without Message-Id, its multipart without a boundary');
like(post_message(message('big@client.test', 'Big', "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"b\"\n",
	"--b\nContent-Type: text/plain\n\nsee attached\n--b\nContent-Type: text/html\nContent-Disposition: attachment;"
	  . " filename=\"a.html\"\nContent-Transfer-Encoding: base64\n\n$big--b--\n")), qr/^250 /, 'a post with a big attachment');
# The list stage holds a post with broken MIME for its moderators (its
# reason in pepsi.list_held); approved, it goes out and is archived as it
# came, its problem kept.
# (held once the stage's pause of its row is committed too: a decision
# on a row still running is refused)
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.list_held h WHERE h.subject = 'Broken' AND h.decision IS NULL"
		  . " AND NOT EXISTS (SELECT FROM pepsi.workqueue w WHERE w.id = h.workqueue_id AND w.status = 'running')") eq '1' }, 60),
	'the broken post is held for the moderators') or why_not();
sql("SELECT pepsi.list_decide((SELECT id FROM pepsi.list_held WHERE subject = 'Broken'), 'approve', NULL)");
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.archive_message") eq '5' }, 60), 'both archived') or why_not();
ok(drained(), 'and delivered') or why_not();
like(sql("SELECT array_to_string(problems, '; ') FROM pepsi.archive_message WHERE subject = 'Broken'"),
	qr/^broken MIME: a multipart\/mixed without a boundary$/, 'the reason is kept');
ok(file_shows($d->{log}, qr/the post from <alice\@client\.test> has no Message-ID: given one/),
	'the list stage gave the post a Message-Id');
like(sql("SELECT withheld FROM pepsi.archive_attachment"), qr/max_attachment \(2000 bytes\)/, 'the attachment withheld');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'archive_problem'"), '2', 'and logged');
is(sql("SELECT count(*) FROM pepsi.archive_search($list, 'boundary')"), '1', 'the broken post is searchable');

# 3. The pages (pepsi-httpd), in Chromium; an HTML attachment is a download.
like(post_message(message('att@client.test', 'Page', "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"b\"\n",
	"--b\nContent-Type: text/plain\n\nsee the page\n--b\nContent-Type: text/html\nContent-Disposition: attachment;"
	  . " filename=\"page.html\"\n\n<script>alert(1)</script>\n--b--\n")), qr/^250 /, 'a post with an HTML attachment');
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.archive_message") eq '6' }, 60), 'archived') or why_not();
my $httpd = start_dispatcher($config, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(poll_until(sub { file_shows("$tmp/httpd.log", qr/ready/) }, 60), 'pepsi-httpd starts');
my $base = "http://127.0.0.1:$http_port";
my $http = HTTP::Tiny->new(timeout => 30, max_redirect => 0);
my $att = sql("SELECT id FROM pepsi.archive_message WHERE message_id = 'att\@client.test'");
my $got = $http->get("$base/archive/dev\@lists.test/attachment/$att/1");
is($got->{status}, 200, 'the attachment is served');
is($got->{headers}{'content-type'}, 'text/html', 'with its type');
like($got->{headers}{'content-disposition'}, qr/^attachment; filename="page\.html"$/, 'as a download');
is($got->{headers}{'x-content-type-options'}, 'nosniff', 'never sniffed');
like($got->{headers}{'content-security-policy'}, qr/^sandbox/, 'and sandboxed');
my $big_id = sql("SELECT id FROM pepsi.archive_message WHERE message_id = 'big\@client.test'");
is($http->get("$base/archive/dev\@lists.test/attachment/$big_id/1")->{status}, 404, 'a withheld attachment is not served');
my $page = $http->get("$base/archive/dev\@lists.test/message/$big_id");
like($page->{content}, qr/not kept: over the list&#39;s max_attachment|not kept: over the list's max_attachment/,
	'its page says why');
like($http->get("$base/archive/dev\@lists.test/search?q=%3Cscript%3E")->{content}, qr/&lt;script&gt;/,
	'what a reader typed comes back escaped');
# A private archive: a login link mailed to a member, single use; an
# owner's moderation needs the session's CSRF token.
sql("SELECT pepsi.archive_policy_set($list, 'visibility', 'private'), pepsi.list_configure($list, 'posting_policy', 'moderated')");
is($http->get("$base/archive/dev\@lists.test/")->{status}, 403, 'a private archive needs a login');
like(post_message(message('held@client.test', 'Held for the owner')), qr/^250 /, 'a post to hold');
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.list_held WHERE decision IS NULL") eq '1' }, 60), 'held')
  or why_not();
sub login_link
{
	my ($who) = @_;
	my $links = sub {
		map { $_->{data} =~ m{^(http://\S+/login\?token=[0-9a-f]{64})\r?$}m ? $1 : () }
		  grep { $_->{env} =~ /RCPT TO:<\Q$who\E>/ } peer_messages($peer);
	};
	my $before = () = $links->();
	my $r = $http->post_form("$base/archive/dev\@lists.test/login", { address => $who });
	is($r->{status}, 200, "a login link asked for $who");
	my @all;
	poll_until(sub { @all = $links->(); @all > $before }, 60);
	return @all > $before ? $all[-1] : undef;
}
my $link = login_link('bob@one.test');
ok($link, 'the member is mailed a link') or why_not();
my ($token) = $link =~ /token=(\w+)/;
my $in = $http->post_form("$base/archive/dev\@lists.test/login", { token => $token });
is($in->{status}, 303, 'the link logs in');
my ($cookie) = ($in->{headers}{'set-cookie'} // '') =~ /^(pepsi_archive=[0-9a-f]{64});/;
like($in->{headers}{'set-cookie'}, qr/; Path=\/archive\/dev\@lists\.test\/; Max-Age=\d+; HttpOnly; SameSite=Strict$/,
	'a session cookie, HttpOnly, SameSite=Strict');
is($http->get("$base/archive/dev\@lists.test/", { headers => { cookie => $cookie } })->{status}, 200,
	'the member reads the private archive');
is($http->post_form("$base/archive/dev\@lists.test/login", { token => $token })->{status}, 403, 'the link works once');
is($http->get("$base/archive/dev\@lists.test/members", { headers => { cookie => $cookie } })->{status}, 403,
	'a member is not an owner');
$http->post_form("$base/archive/dev\@lists.test/login", { address => 'nobody@client.test' });
my $owner_link = login_link('owner@lists.test');
ok($owner_link, 'the owner is mailed a link');
my ($otoken) = $owner_link =~ /token=(\w+)/;
sql("SELECT 1");
my $oin = $http->post_form("$base/archive/dev\@lists.test/login", { token => $otoken });
my ($ocookie) = ($oin->{headers}{'set-cookie'} // '') =~ /^(pepsi_archive=[0-9a-f]{64});/;
my $held_id = sql("SELECT id FROM pepsi.list_held WHERE decision IS NULL");
is($http->post_form("$base/archive/dev\@lists.test/moderation", { held => $held_id, decision => 'approve', csrf => 'forged' },
	{ headers => { cookie => $ocookie } })->{status}, 403, 'a decision without the session\'s CSRF token is refused');
is(sql("SELECT count(*) FROM pepsi.list_held WHERE decision IS NULL"), '1', 'and changes nothing');
is(scalar(grep { $_->{env} =~ /RCPT TO:<nobody\@client\.test>/ } peer_messages($peer)), 0,
	'a non-member gets no link (and the page said the same)');
# The owner's link for the browser.
$owner_link = login_link('owner@lists.test') =~ s/^http:\/\/[^\/]+//r;
my $shots = $ENV{PEPSI_SCREENSHOTS} // "$PostgreSQL::Test::Utils::log_path/169_list_archive_screenshots";
make_path($shots);
my $node_path = `npm root -g 2>/dev/null`;
chomp $node_path;
SKIP:
{
	skip 'chromium, node or playwright-core is not installed (scripts/deps.sh installs them)', 1
	  unless -x '/usr/bin/chromium' && -x '/usr/bin/node' && -d "$node_path/playwright-core";
	my $expected = encode_json({ month_name => 'December 2026', thread_subject => 'Quokka plans',
		root_text => 'The wombat is ready.', attachment_message => $att, body_word => 'wombat',
		link => "$base$owner_link", member => 'carol@two.test' });
	my ($stdout, $stderr) = ('', '');
	{
		local $ENV{NODE_PATH} = $node_path;
		eval {
			IPC::Run::run([ '/usr/bin/node', dirname(abs_path(__FILE__)) . '/browser/archive.js', $base,
					'dev@lists.test', $shots, $expected ], '>', \$stdout, '2>', \$stderr, IPC::Run::timeout(300));
			1;
		} or diag "the browser script: $@";
	}
	my @steps = split /\n/, $stdout;
	for my $expected_step ('the months of the archive', 'a month lists its threads',
		'a thread shows its replies nested', 'a message shows its text, its sender obfuscated',
		'an attachment is a download, never a page', 'search finds a word of a body',
		'the mailed link logs the owner in', 'the members page lists the members',
		'the moderation page approves the held post',
		'no script error, nothing loaded from elsewhere, every page under the CSP')
	{
		my ($line) = grep { /^(ok|fail) \Q$expected_step\E(:|$)/ } @steps;
		is($line // "(not reached)", "ok $expected_step", "in the browser: $expected_step");
	}
	diag $stderr if grep { /^fail/ } @steps;
	ok(poll_until(sub { grep { $_->{data} =~ /^Subject: Held for the owner/m } peer_messages($peer) }, 60),
		'the approved post goes out');
	for my $view (qw(months month thread message attachment-message search login members moderation))
	{
		ok(-s "$shots/archive-$view.png", "a screenshot of the view $view ($shots)");
	}
}
stop_dispatcher($httpd);

# 4. A real mlmmj list's archive, imported, threads as MHonArc threads it.
my $sink_port = PostgreSQL::Test::Cluster::get_free_port();
my $sink = IPC::Run::start([ 'smtp-sink', ($> == 0 ? ('-u', 'nobody') : ()), "127.0.0.1:$sink_port", '50' ]);
my $spool = "$tmp/mlmmj";
make_path($spool);
my $made = "";
IPC::Run::run([ '/usr/bin/mlmmj-make-ml', '-L', 'old', '-s', $spool ], '<', \"lists.test\nowner\@lists.test\nN\nN\n",
	'>', \$made, '2>&1') or die "mlmmj-make-ml: $made";
my $ml = "$spool/old";
append_to_file("$ml/control/relayhost", "127.0.0.1\n");
append_to_file("$ml/control/smtpport", "$sink_port\n");
append_to_file("$ml/subscribers.d/s", "sub\@example.org\n");
# Out of order (a reply before its parent), a two-level fork, a reply
# naming only In-Reply-To, a reply whose parent never came, unrelated posts.
my @posts = (
	[ 'a1', 'Alpha', '', 'Alpha starts the ocelot talk' ],
	[ 'a3', 'Re: Alpha', 'a1 a2', 'deep reply' ],
	[ 'a2', 'Re: Alpha', 'a1', 'first reply' ],
	[ 'b1', 'Beta', '', 'beta root' ],
	[ 'a4', 'Re: Alpha', 'a1', 'second branch' ],
	[ 'b2', 'Re: Beta', 'b1', 'beta reply', 'irt' ],
	[ 'c2', 'Re: Gamma', 'c1', 'an orphan reply' ],
	[ 'd1', 'Delta', '', 'delta alone' ],
	[ 'a5', 'Re: Alpha', 'a1 a4', 'under the second branch' ]);
my $day = 1;
for my $p (@posts)
{
	my ($id, $subject, $refs, $text, $irt_only) = @$p;
	my @refs = map { "<$_\@old.test>" } split ' ', $refs;
	my $head = "Delivered-To: old\@lists.test\nReturn-Path: <x\@old.test>\nFrom: X <x\@old.test>\n"
	  . "To: old\@lists.test\nSubject: $subject\nMessage-Id: <$id\@old.test>\n"
	  . (@refs ? "In-Reply-To: $refs[-1]\n" . ($irt_only ? '' : "References: @refs\n") : '')
	  . sprintf("Date: Tue, %02d Dec 2026 10:00:00 +0000\n", $day++);
	IPC::Run::run([ '/usr/bin/mlmmj-receive', '-L', $ml ], '<', \"$head\n$text\n") or die "mlmmj-receive failed";
}
ok(poll_until(sub { my @f = glob("$ml/archive/*"); @f == @posts }, 60), 'mlmmj archived every post')
  or diag(join ' ', glob("$ml/archive/* $ml/queue/*"));
$sink->kill_kill;

my $old = sql("SELECT pepsi.list_create('old\@lists.test', 'owner\@lists.test')");
my @cli = (pepsi_bin('pepsi-archive'), '-C', $config);
my ($out, $err) = ('', '');
ok(IPC::Run::run([ @cli, 'import', 'old@lists.test', $ml ], '>', \$out, '2>', \$err), 'pepsi-archive imports it')
  or diag($err);
like($out, qr/^9 message\(s\) archived, 0 already there$/m, 'every message');
ok(IPC::Run::run([ @cli, 'import', 'old@lists.test', $ml ], '>', \$out, '2>', \$err), 'again');
like($out, qr/^0 message\(s\) archived, 9 already there$/m, 'each stored once');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'archive_import'"), '2', 'audited');

# The same messages as an mbox (as mlmmj archived them), through MHonArc.
my $mbox = "$tmp/old.mbox";
for my $n (1 .. @posts)
{
	my $m = slurp_file("$ml/archive/$n");
	$m =~ s/^(>*From )/>$1/mg;
	append_to_file($mbox, "From x\@old.test Tue Dec  1 10:00:00 2026\n$m\n");
}
my $rc = "$tmp/threads.mrc";
append_to_file($rc, "<TTOPBEG>\nTHREAD\nMSG \$MSGID\$\n</TTOPBEG>\n<TLITXT>\nMSG \$MSGID\$\n</TLITXT>\n<TSINGLETXT>\n"
	  . "THREAD\nMSG \$MSGID\$\n</TSINGLETXT>\n<TSUBLISTBEG>\nDOWN\n</TSUBLISTBEG>\n<TSUBLISTEND>\nUP\n</TSUBLISTEND>\n"
	  . "<TLINONE>\nMSG none\n</TLINONE>\n");
make_path("$tmp/mhonarc");
IPC::Run::run([ '/usr/bin/mhonarc', '-quiet', '-nosubjectthreads', '-rcfile', $rc, '-outdir', "$tmp/mhonarc", $mbox ],
	'>', \$out, '2>&1') or die "mhonarc: $out";

# Each message's parent as MHonArc's thread index nests them.
my (%mhonarc, @stack, $last);
for (split /\n/, slurp_file("$tmp/mhonarc/threads.html"))
{
	if (/^THREAD$/) { @stack = (); $last = undef }
	elsif (/^DOWN$/) { push @stack, $last }
	elsif (/^UP$/) { pop @stack }
	elsif (/^MSG (\S+)$/) { $last = $1; $mhonarc{$1} = $stack[-1] // '' if $1 ne 'none' }
}
is(scalar(keys %mhonarc), 9, 'MHonArc threads nine messages');
my %ours = map { split /\|/, $_, 2 } split /\n/, sql("SELECT m.message_id || '|' || coalesce(p.message_id, '')"
	. " FROM pepsi.archive_message m LEFT JOIN pepsi.archive_message p ON p.id = m.parent_id WHERE m.list_id = $old");
is_deeply(\%ours, \%mhonarc, 'each message has the parent MHonArc gives it');
is(sql("SELECT count(*) FROM pepsi.archive_thread WHERE list_id = $old"), '4', 'four threads (the orphan reply on its own)');

# 5. Search, export, reindex.
ok(IPC::Run::run([ @cli, 'count', 'old@lists.test', 'ocelot' ], '>', \$out, '2>', \$err), 'count');
is($out, "1\n", 'a body word');
ok(IPC::Run::run([ @cli, 'count', 'old@lists.test', 'delta' ], '>', \$out), 'count');
is($out, "1\n", 'a subject word');
ok(IPC::Run::run([ @cli, '--json', 'search', 'old@lists.test', 'beta' ], '>', \$out, '2>', \$err), 'search');
like($out, qr/«beta» reply/, 'with the words found marked');
ok(IPC::Run::run([ @cli, 'export', 'old@lists.test', "$tmp/out.mbox" ], '>', \$out, '2>', \$err), 'export')
  or diag($err);
is(scalar(() = slurp_file("$tmp/out.mbox") =~ /^From /mg), 9, 'an mbox of nine messages');
is(sql("SELECT count(*) FROM pepsi.event_log WHERE action = 'archive_export'"), '1', 'audited');
my $again = sql("SELECT pepsi.list_create('again\@lists.test', 'owner\@lists.test')");
ok(IPC::Run::run([ @cli, 'import', 'again@lists.test', "$tmp/out.mbox" ], '>', \$out, '2>', \$err), 'which imports')
  or diag($err);
is(sql("SELECT string_agg(m.message_id || '>' || coalesce(p.message_id, ''), ' ' ORDER BY m.message_id)"
		. " FROM pepsi.archive_message m LEFT JOIN pepsi.archive_message p ON p.id = m.parent_id WHERE m.list_id = $again"),
	join(' ', map { "$_>$mhonarc{$_}" } sort keys %mhonarc), 'to the same threads');
ok(IPC::Run::run([ @cli, 'reindex', 'old@lists.test' ], '>', \$out, '2>', \$err), 'reindex') or diag($err);
my %reindexed = map { split /\|/, $_, 2 } split /\n/, sql("SELECT m.message_id || '|' || coalesce(p.message_id, '')"
	. " FROM pepsi.archive_message m LEFT JOIN pepsi.archive_message p ON p.id = m.parent_id WHERE m.list_id = $old");
is_deeply(\%reindexed, \%mhonarc, 'the same threads after reindex');
append_to_file("$tmp/noid.mbox", "From x Tue Dec  1 10:00:00 2026\nFrom: x\@old.test\nSubject: no id\n\nanonymous\n");
ok(IPC::Run::run([ @cli, 'import', 'old@lists.test', "$tmp/noid.mbox" ], '>', \$out, '2>', \$err), 'a message without Message-Id')
  or diag($err);
like(sql("SELECT array_to_string(problems, '; ') FROM pepsi.archive_message WHERE subject = 'no id'"),
	qr/^no Message-Id: archived as <no-message-id\.[0-9a-f]{64}\@archive\.invalid>; no readable Date:/, 'imported, the reasons kept');
append_to_file("$tmp/bad.mbox", "not an mbox\n");
ok(!IPC::Run::run([ @cli, 'import', 'old@lists.test', "$tmp/bad.mbox" ], '>', \$out, '2>', \$err), 'a bad file');
like($err, qr/not an mbox: the first line is not a "From " line/, 'is refused, named');

list_stop();
$dns->stop;
done_testing();
