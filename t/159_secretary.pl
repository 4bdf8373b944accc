# The confirm-to-send secretary (pepsi-stage-check-whitelist) end to end,
# through pepsi-ingress (SPF checked against the tests' DNS server),
# pepsi-dispatch and the maildir writer, with swaks as the senders: an
# owner turns WHITELIST on; an unknown sender whose address SPF proves is
# held and gets exactly one challenge however many messages it sends;
# its reply with the token releases what was held (delivered to the
# owner's Maildir), whitelists it, and its later mail passes straight; a
# reused token releases nothing; the null sender and a message with
# List-Id are held without a challenge, and so is an unproven sender;
# held mail expires through the schedule's secretary_expire; a
# whitelisted sender's mail and mail to an owner without WHITELIST pass.
# An owner who lets senders pay instead (SECRETARY_PAYMENT, another
# scheme than taler): the proof in the sender's reply is judged by
# PAYMENT_VERIFY_COMMAND, a script standing in for the payment service,
# which gets the order, scheme, price and merchant as arguments and the
# proof on its standard input (never its command line): a good proof
# releases the held mail and whitelists the sender, once; a wrong one, a
# verifier that fails (exit 3) and one that hangs past
# PAYMENT_VERIFY_TIME_LIMIT (killed) release nothing, each with a log
# line, and the challenge stays open for the good proof that follows.
# A proof that names no open challenge of that recipient (an order never
# made, the challenge released) is not paid, says so in the log, and the
# verifier is never run for it; nor one that names the open challenge's
# id with a wrong order reference, or with none (the order names a
# reference of 128 random bits, so the sequential id is not enough).  A
# challenge opened before 0.13 has no reference, and its old order,
# pepsi-ID, still pays it.

use strict;
use warnings FATAL => 'all';

use HTTP::Tiny;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

plan skip_all => 'pepsi-ingress is not built' unless -x pepsi_bin('pepsi-ingress');

my $db = 'postgres';
my $node = delivery_node('secretary');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $owner = 'bob@local.test';
my $known = 'carol@sender.test';
my $stranger = 'dave@sender.test';
make_mailbox($root, $_)
  for $owner, 'alice@local.test', $known, $stranger, 'news@lists.test', 'eve@unproven.test';

sub sql { return $node->safe_psql($db, shift) }

# sender.test and lists.test send from 127.0.0.1 (SPF pass); unproven.test
# publishes no SPF record.
my $dns = TestDNS->new($tmp);
$dns->zone(<<'ZONE');
1.0.0.127.in-addr.arpa. 300 IN PTR mx.client.test.
mx.client.test. 300 IN A 127.0.0.1
sender.test. 300 IN TXT "v=spf1 ip4:127.0.0.1 -all"
lists.test. 300 IN TXT "v=spf1 ip4:127.0.0.1 -all"
ZONE

# The payment service's verifier: one known receipt per order is paid.
# It logs what it was given, and whether the proof was among its
# arguments; ~/verify-mode says whether it answers, fails or hangs.
my $verifier = "$tmp/verify";
{
	open my $fh, '>', $verifier or die "$verifier: $!";
	print $fh <<"PL";
#!$^X
use strict;
use warnings;
my \$proof = <STDIN>;
\$proof = '' unless defined \$proof;
chomp \$proof;
my \$in_argv = grep { \$proof ne '' && index(\$_, \$proof) >= 0 } \@ARGV;
open my \$log, '>>', '$tmp/verify.log' or exit 2;
print \$log join(' ', 'args:', \@ARGV, 'env:', map({ "\$_=\$ENV{\$_}" } sort grep { /^PEPSI_/ } keys %ENV),
	'proof:', \$proof, \$in_argv ? 'PROOF-IN-ARGV' : 'not-in-argv'), "\n";
close \$log;
open my \$m, '<', '$tmp/verify-mode' or exit 2;
my \$mode = <\$m>;
chomp \$mode;
if (\$mode eq 'fail') { print "the payment service is unreachable\n"; exit 3 }
if (\$mode eq 'hang')
{
	open my \$p, '>', '$tmp/verify-hang.pid' or exit 2;
	print \$p "\$\$\n";
	close \$p;
	sleep 600;
}
exit 0 if \$proof eq "receipt-for-\$ARGV[0]";
print "no such receipt\n";
exit 1;
PL
	close $fh;
	chmod 0755, $verifier;
}
sub verify_mode
{
	open my $fh, '>', "$tmp/verify-mode" or die $!;
	print $fh "$_[0]\n";
	close $fh;
}
verify_mode('answer');

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $http_port = PostgreSQL::Test::Cluster::get_free_port();
my $secret = 'web-secret';
$node->safe_psql($db, "CREATE ROLE web LOGIN PASSWORD '$secret' IN ROLE pepsi_httpd");
my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
my $config = delivery_config($node, maildir_root => $root,
	local_domains => 'local.test sender.test lists.test unproven.test',
	pepsi => { DNS_FORWARDER => $dns->forwarder, DNS_TIMEOUT => '4s' },
	extra => { init => "LOCAL_STAGE = secretary\n" },
	more_stages => {
		secretary => "PROGRAM = pepsi-stage-check-whitelist\nNEXT_STAGE = maildir\nREPLY_STAGE = init\n"
		  . "CONFIRM_URL = https://mx.pepsi.test/confirm\n"
		  . "PAYMENT_MERCHANT = pay.local.test/m\nPAYMENT_VERIFY_COMMAND = $verifier\n"
		  . "PAYMENT_VERIFY_TIME_LIMIT = 3s\n",
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
[httpd]
ADDRESS = 127.0.0.1
PORT = $http_port
CONNINFO = $conninfo user=web password=$secret
CONF
chmod 0600, $config or die "chmod $config: $!";

# Bob turns the secretary on, as the settings stage would on his confirmation.
sql("SELECT pepsi.settings_set('$owner', 'WHITELIST', 'yes')");
sql("SELECT pepsi.whitelist_add('$owner', '$known')");

my $ingress = start_ingress($config, $port, "$tmp/ingress.log");
my $d = start_dispatcher($config);

# Send from $from to $to with swaks; returns swaks' exit code.
my $n = 0;
sub send_mail
{
	my ($from, $to, %m) = @_;
	$n++;
	my $subject = $m{subject} // "message $n";
	my $headers = join('', map { "$_\r\n" } @{ $m{headers} // [] });
	my $data = "From: <" . ($m{header_from} // ($from || 'mailer-daemon@sender.test')) . ">\r\nTo: <$to>\r\n"
	  . "Subject: $subject\r\nMessage-ID: <m$n\@sender.test>\r\nDate: Sun, 6 Dec 2026 12:00:00 +0000\r\n$headers\r\n"
	  . ($m{body} // "Hello $n.\r\n");
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'swaks', '--server', '127.0.0.1', '--port', $port, '--ehlo', 'mx.client.test',
			'--from', $from eq '' ? '<>' : $from, '--to', $to, '--data', '-' ],
		'<', \$data, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	diag($out . $err) if $?;
	return $? >> 8;
}

sub settled { return poll_until(sub { queue_count($node) == sql("SELECT count(*) FROM pepsi.workqueue WHERE status = 'paused' AND timeout = 'infinity'") }, 60) }
sub held { return sql("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'secretary' AND status = 'paused' AND timeout = 'infinity'") }
sub challenges { my ($to) = @_; return grep { /^Subject: Please confirm your message to bob\@local\.test/m } map { slurp($_) } maildir_files($root, $to) }
sub delivered { return map { slurp($_) } maildir_files($root, $owner) }

# 1. A whitelisted sender passes straight.
is(send_mail($known, $owner), 0, 'the known sender\'s message is taken');
ok(poll_until(sub { scalar(delivered()) == 1 }, 60), 'and delivered at once')
  or diag(sql("SELECT string_agg(concat_ws(' ', id, stage, status, state::text), E'\n') FROM pepsi.workqueue"),
	"\n", dispatcher_log($d));

# 2. An unknown, proven sender: three messages held, one challenge.
is(send_mail($stranger, $owner, subject => "first from dave"), 0, 'a stranger\'s message') for 1;
is(send_mail($stranger, $owner), 0, 'a second') for 1;
is(send_mail($stranger, $owner), 0, 'a third') for 1;
ok(poll_until(sub { held() == 3 }, 60), 'all three are held')
  or diag(sql("SELECT string_agg(concat_ws(' ', id, stage, status, timeout, state::text), E'\n') FROM pepsi.workqueue"),
	"\n", dispatcher_log($d));
ok(poll_until(sub { scalar(challenges($stranger)) >= 1 }, 60), 'the stranger gets a challenge');
ok(settled(), 'settled');
is(scalar(challenges($stranger)), 1, 'exactly one, for three messages');
is(scalar(delivered()), 1, 'nothing held is delivered');
my ($challenge) = challenges($stranger);
like($challenge, qr/^From: <bob\@local\.test>\r$/m, 'from the owner\'s address');
like($challenge, qr/^Auto-Submitted: auto-replied\r$/m, 'an RFC 3834 auto-reply');
like($challenge, qr/^In-Reply-To: <m\d+\@sender\.test>\r$/m, 'in reply to the held message');
my ($token) = $challenge =~ /^Subject: Please confirm your message to bob\@local\.test \(([0-9a-f]{64})\)\r$/m;
ok($token, 'its Subject carries the token');
like($challenge, qr{https://mx\.pepsi\.test/confirm\?token=$token}, 'and its text the link');
is(sql("SELECT count(*) FROM pepsi.secretary_challenge WHERE token_hash = sha256(convert_to('$token', 'UTF8'))"), '1',
	'only the token\'s hash is kept');
is(sql("SELECT count(*) FROM pepsi.secretary_challenge WHERE encode(token_hash, 'escape') LIKE '%$token%'"), '0',
	'not the token');
is(sql("SELECT count(*) FROM pepsi.workqueue WHERE mail_from = '' AND 'dave\@sender.test' = ANY (rcpt_to)"), '0',
	'the challenge went from the null sender (delivered)');

# 3. The null sender, a list's message and an unproven sender: held, no challenge.
is(send_mail('', $owner, header_from => 'mailer-daemon@sender.test'), 0, 'a message from the null sender');
is(send_mail('news@lists.test', $owner, headers => ['List-Id: <news.lists.test>']), 0, 'a list\'s message');
is(send_mail('eve@unproven.test', $owner), 0, 'an unproven sender\'s message');
ok(poll_until(sub { held() == 6 }, 60), 'all three are held');
ok(settled(), 'settled');
ok(file_shows($d->{log}, qr/<bob\@local\.test>: held, from <eve\@unproven\.test>, not on the whitelist: not verified: no challenge: the sender's address is not proven/),
	'the unproven sender: held without a challenge, said why');
ok(file_shows($d->{log}, qr/held, from <news\@lists\.test>.*a mailing list's message \(List-Id\)/),
	'the list: the reason named');
is(scalar(challenges('news@lists.test')) + scalar(challenges('eve@unproven.test'))
	  + scalar(maildir_files($root, 'mailer-daemon@sender.test')), 0, 'none of them gets a challenge');

# 4. An unproven reply with the token releases nothing.
is(send_mail('eve@unproven.test', $owner, subject => "Re: Please confirm your message to bob\@local.test ($token)"), 0,
	'someone else replies with the token');
ok(poll_until(sub { held() == 7 }, 60), 'held too');
is(scalar(delivered()), 1, 'nothing released');

# 5. The stranger's reply releases the three messages and whitelists it.
is(send_mail($stranger, $owner, subject => "Re: Please confirm your message to bob\@local.test ($token)",
		body => "Yes, it was me.\r\n"), 0, 'the stranger replies');
ok(poll_until(sub { scalar(delivered()) == 4 }, 60), 'its three held messages are delivered')
  or diag(sql("SELECT string_agg(concat_ws(' ', id, stage, status, timeout, state::text), E'\n') FROM pepsi.workqueue"),
	"\n", dispatcher_log($d));
ok(grep({ /^Subject: first from dave\r$/m } delivered()), 'the held message itself');
ok(!grep({ /Yes, it was me/ } delivered()), 'the reply is not delivered to the owner');
is(sql("SELECT source FROM pepsi.whitelist WHERE owner = '$owner' AND sender = '$stranger'"), 'reply',
	'the stranger is on the whitelist');
is(send_mail($stranger, $owner, subject => 'later'), 0, 'later mail');
ok(poll_until(sub { scalar(delivered()) == 5 }, 60), 'passes straight');
is(scalar(challenges($stranger)), 1, 'and no new challenge');

# A reply whose Subject lost the token, but whose text quotes it, releases too.
my $grace = 'grace@sender.test';
make_mailbox($root, $grace);
is(send_mail($grace, $owner, subject => 'from grace'), 0, 'a third stranger writes');
ok(poll_until(sub { scalar(challenges($grace)) == 1 }, 60), 'and is challenged');
my ($grace_token) = (challenges($grace))[0] =~ /\(([0-9a-f]{64})\)\r$/m;
my ($grace_challenge_id) = (challenges($grace))[0] =~ /^Message-ID: (<[^>]+>)\r$/m;
is(send_mail($grace, $owner, subject => 'Re: your robot', headers => ["In-Reply-To: $grace_challenge_id"],
		body => "Fine.\r\n\r\n> secretary $grace_token\r\n"), 0,
	'it replies, with the token in its text only');
ok(poll_until(sub { grep({ /^Subject: from grace\r$/m } delivered()) == 1 }, 60), 'its message is delivered');
ok(!grep({ /your robot/ } delivered()), 'the reply is not');

# 6. The link: pepsi-httpd's page shows on GET and releases on POST, once.
my $httpd;
END { kill 'KILL', $httpd->{pid} if $httpd && !defined $httpd->{status} }
$httpd = start_dispatcher($config, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts');
my $http = HTTP::Tiny->new(timeout => 10, max_redirect => 0);
my $url = "http://127.0.0.1:$http_port/confirm";
my $frank = 'frank@sender.test';
make_mailbox($root, $frank);
is(send_mail($frank, $owner, subject => 'from frank'), 0, 'another stranger writes');
ok(poll_until(sub { scalar(challenges($frank)) == 1 }, 60), 'and is challenged');
my ($link_token) = (challenges($frank))[0] =~ m{/confirm\?token=([0-9a-f]{64})};
ok($link_token, 'the challenge has the link');
my $r = $http->get("$url?token=$link_token");
is($r->{status}, 200, 'GET shows the page');
like($r->{content}, qr{<form method="post" action="/confirm"><input type="hidden" name="token" value="$link_token">},
	'with a button that posts the token');
like($r->{content}, qr/bob\@local\.test takes mail only from senders it knows\.  1 message\(s\) from frank\@sender\.test wait/,
	'and what waits');
like($r->{headers}{'content-security-policy'}, qr/form-action 'self'/, 'its form may post back');
ok(settled(), 'settled');
is(held(), 5, 'a GET releases nothing (frank\'s message waits with four others)');
$r = $http->post_form($url, { token => $link_token });
is($r->{status}, 200, 'POST releases') or diag($r->{content});
like($r->{content}, qr/your mail is delivered/, 'and says so');
ok(poll_until(sub { grep({ /^Subject: from frank\r$/m } delivered()) == 1 }, 60), 'frank\'s message is delivered');
is(sql("SELECT source FROM pepsi.whitelist WHERE owner = '$owner' AND sender = '$frank'"), 'link',
	'frank is on the whitelist');
$r = $http->post_form($url, { token => $link_token });
is($r->{status}, 410, 'the token again: refused');
like($r->{content}, qr/Nothing was released: the link was already used/, 'with the reason');
$r = $http->get("$url?token=$link_token");
like($r->{content}, qr/This link was used already/, 'GET says it was used');
$r = $http->post_form($url, { token => $token });
is($r->{status}, 410, 'the token the reply used: refused too');
$r = $http->get("$url?token=" . ('0' x 64));
is($r->{status}, 404, 'an unknown token: not found');
stop_dispatcher($httpd);

# 7. Expiry: eve's held mail goes when its time is up, through the schedule.
sql("UPDATE pepsi.secretary_challenge SET expires_at = now() - interval '1 second' WHERE sender = 'eve\@unproven.test'");
sql("SELECT pepsi.schedule_add('secretary-expire', now(), interval '1 hour', function_name => 'secretary_expire')");
ok(poll_until(sub { held() == 2 }, 60), 'the unproven sender\'s two held messages expire');
like(sql("SELECT last_outcome FROM pepsi.schedule WHERE name = 'secretary-expire'"), qr/^ok: 2 held messages expired$/,
	'the schedule says so');
is(sql("SELECT count(*) FROM pepsi.secretary_challenge WHERE sender = 'eve\@unproven.test'"), '0', 'with its challenge');

# 8. Mail to an owner without WHITELIST, from the same stranger, is not screened.
is(send_mail('eve@unproven.test', 'alice@local.test'), 0, 'to alice');
ok(poll_until(sub { scalar(maildir_files($root, 'alice@local.test')) == 1 }, 60), 'delivered');

# 9. Paying instead of confirming, judged by PAYMENT_VERIFY_COMMAND.
my $payee = 'paula@local.test';
my $payer = 'henry@sender.test';
make_mailbox($root, $_) for $payee, $payer;
sql("SELECT pepsi.settings_set('$payee', 'WHITELIST', 'yes')");
sql("SELECT pepsi.settings_set('$payee', 'SECRETARY_PAYMENT', 'examplepay')");
sql("SELECT pepsi.settings_set('$payee', 'SECRETARY_PRICE', 'EUR:0.50')");
sub paula_held
{
	return sql("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'secretary' AND status = 'paused'"
		  . " AND timeout = 'infinity' AND '$payee' = ANY (rcpt_to) AND mail_from = '$payer'");
}
sub paula_mails { return map { slurp($_) } maildir_files($root, $payee) }
sub verifier_runs { return -e "$tmp/verify.log" ? split(/\n/, slurp("$tmp/verify.log")) : () }
is(send_mail($payer, $payee, subject => 'from henry'), 0, 'a stranger writes to an owner who takes payment');
my $pay_challenge;
ok(poll_until(sub { ($pay_challenge) = grep { /^Payment-Request: /m } map { slurp($_) } maildir_files($root, $payer); $pay_challenge }, 180),
	'it is challenged, with a payment request')
  or diag(dispatcher_log($d));
my ($pay_uri, $order, $pay_id, $pay_ref) = ($pay_challenge // "")
  =~ m{^Payment-Request: (examplepay://pay\.local\.test/m/(pepsi-(\d+)-([0-9a-f]{32}))\?amount=EUR:0\.50)\r$}m;
ok($order, 'the request is the scheme\'s URI of the order, at PAYMENT_MERCHANT, with the price')
  or diag($pay_challenge);
$pay_id //= 0;
$pay_ref //= '';
is(sql("SELECT order_ref FROM pepsi.secretary_challenge WHERE id = $pay_id AND owner = '$payee'"), $pay_ref,
	'the order names the challenge\'s id and its order reference, kept in its row');
like($pay_challenge, qr/^Payment-Amount: EUR:0\.50\r$/m, 'and says the amount');
my $receipt = "receipt-for-$order";
sub send_proof
{
	my ($proof, $subject, $from, $uri) = @_;
	return send_mail($from // $payer, $payee, subject => $subject, headers => ['Payment-Proof: ' . ($uri // $pay_uri) . " $proof"]);
}
sub no_open_challenge
{
	my ($order_named, $from) = @_;
	return qr/<\Q$payee\E>: a proof of payment for \Q$order_named\E from <\Q$from\E>, which is no open challenge of this recipient \(none such, released, expired, never sent, or not its order reference\): not paid, PAYMENT_VERIFY_COMMAND not run/;
}

# A proof that names no open challenge of paula's: the verifier is not
# run for it (it logs each run: no log).
(my $unknown_uri = $pay_uri) =~ s/pepsi-\d+-/pepsi-987654321-/;
is(send_proof("receipt-for-pepsi-987654321-$pay_ref", 'an order never made', undef, $unknown_uri), 0,
	'a proof of an order never made');
ok(file_shows($d->{log}, no_open_challenge("pepsi-987654321-$pay_ref", $payer), 180), 'not paid: no such challenge');
ok(!-e "$tmp/verify.log", 'the verifier was not run');
ok(poll_until(sub { paula_held() == 2 }, 180), 'the latter is held with henry\'s first message, as any mail of his');

# The open challenge's id, guessed, with a wrong reference (well formed,
# the service's receipt for that order even): not paid, the verifier not
# run.  And the id alone, the order of before 0.13: the same.
my $wrong_ref = $pay_ref eq ('0' x 32) ? ('1' x 32) : ('0' x 32);
(my $wrong_uri = $pay_uri) =~ s/-\Q$pay_ref\E/-$wrong_ref/;
is(send_proof("receipt-for-pepsi-$pay_id-$wrong_ref", 'the right id, a wrong reference', undef, $wrong_uri), 0,
	'a proof naming the open challenge\'s id with a wrong reference');
ok(file_shows($d->{log}, no_open_challenge("pepsi-$pay_id-$wrong_ref", $payer), 180), 'not paid: not its reference');
(my $bare_uri = $pay_uri) =~ s/-\Q$pay_ref\E//;
is(send_proof("receipt-for-pepsi-$pay_id", 'the right id, no reference', undef, $bare_uri), 0,
	'a proof naming the open challenge\'s id alone');
ok(file_shows($d->{log}, no_open_challenge("pepsi-$pay_id", $payer), 180), 'not paid: it has a reference');
ok(!-e "$tmp/verify.log", 'the verifier was run for neither');
ok(poll_until(sub { paula_held() == 4 }, 180), 'both are held with henry\'s mail');

# A proof the service does not know: not paid, nothing released.
is(send_proof('receipt-for-pepsi-1', 'a wrong proof'), 0, 'a wrong proof is sent');
ok(file_shows($d->{log},
		qr/<\Q$payee\E>: a proof of payment for \Q$order\E from <\Q$payer\E> that PAYMENT_VERIFY_COMMAND says is not paid: ignored \(no such receipt\)/, 180),
	'the verifier says not paid: logged');
ok(poll_until(sub { paula_held() == 5 }, 180), 'the held message stays held (and the replies with it)');

# A verifier that fails: it could not say; nothing released, the challenge stays open.
verify_mode('fail');
is(send_proof($receipt, 'a proof while the service is down'), 0, 'the good proof, while the verifier fails');
ok(file_shows($d->{log},
		qr/a proof of payment for \Q$order\E from <\Q$payer\E> could not be verified: \Q$verifier\E exited with status 3 .*: the payment service is unreachable; it counts for nothing, the held mail stays held and its challenge open/, 180),
	'exit 3: could not verify, logged with what it said');
ok(poll_until(sub { paula_held() == 6 }, 180), 'nothing is released');

# A verifier that hangs: killed at PAYMENT_VERIFY_TIME_LIMIT, nothing released.
verify_mode('hang');
is(send_proof($receipt, 'a proof while the verifier hangs'), 0, 'the good proof, while the verifier hangs');
ok(file_shows($d->{log},
		qr/for \Q$order\E from <\Q$payer\E> could not be verified: \Q$verifier\E ran longer than PAYMENT_VERIFY_TIME_LIMIT \(3s\) and was killed/, 180),
	'killed at the time limit, logged');
ok(poll_until(sub { paula_held() == 7 }, 180), 'nothing is released');
my $hung = -e "$tmp/verify-hang.pid" ? slurp("$tmp/verify-hang.pid") : 0;
chomp $hung;
ok($hung && poll_until(sub { !kill(0, $hung) }, 180), 'the hanging verifier is gone');
is(scalar(grep { /^Subject: from henry\r$/m } paula_mails()), 0, 'the held message is not delivered');

# The good proof: paid, the held mail released, the sender whitelisted.
verify_mode('answer');
is(send_proof($receipt, 'the good proof'), 0, 'the good proof, the verifier answering');
ok(poll_until(sub { grep({ /^Subject: from henry\r$/m } paula_mails()) == 1 }, 180), 'the held message is delivered')
  or diag(dispatcher_log($d));
ok(file_shows($d->{log}, qr/<\Q$payee\E>: paid EUR:0\.50 \(\Q$order\E\): held mail released \(\d+\), sender whitelisted/, 180),
	'logged');
is(sql("SELECT source FROM pepsi.whitelist WHERE owner = '$payee' AND sender = '$payer'"), 'reply',
	'the sender is on the whitelist');
is(sql("SELECT outcome || ' ' || currency || ':' || amount FROM pepsi.payment WHERE direction = 'in' AND address = '$payee'"),
	'received EUR:0.50', 'the payment is recorded');
ok(poll_until(sub { paula_held() == 0 }, 180), 'nothing of the sender\'s is held any more');
ok(!grep({ /^Subject: the good proof\r$/m } paula_mails()), 'the proof itself is not delivered');

# The same proof again: the challenge is released already, so it is not
# paid and the verifier is not run; nor for the three proofs held with
# the mail as they came back released.  Each is then mail like any other
# (from a sender now whitelisted: delivered).
is(send_proof($receipt, 'the good proof again'), 0, 'the good proof is sent again');
ok(poll_until(sub { my @done = slurp($d->{log}) =~ /${\ no_open_challenge($order, $payer)}/g; @done == 4 }, 180),
	'it is no open challenge: not paid (and so the three held with the mail)');
ok(settled(), 'settled');
ok(poll_until(sub { grep({ /^Subject: the good proof again\r$/m } paula_mails()) == 1 }, 180),
	'the proof sent again is delivered as any mail of a whitelisted sender');
is(sql("SELECT count(*) FROM pepsi.payment WHERE direction = 'in' AND address = '$payee'"), '1', 'no payment recorded for it');

# What the verifier was given: the order, scheme, price and merchant as
# arguments and environment, the proof on its standard input only.  It
# ran for each proof sent while the challenge was open (the wrong one,
# while failing, while hanging, the good one), and for nothing else.
my @runs = verifier_runs();
is(scalar(@runs), 4, 'the verifier ran for each proof of the open challenge, and for no other');
like($runs[0], qr/^args: \Q$order\E examplepay EUR:0\.50 pay\.local\.test\/m env: PEPSI_PAYMENT_MERCHANT=pay\.local\.test\/m PEPSI_PAYMENT_ORDER=\Q$order\E PEPSI_PAYMENT_PRICE=EUR:0\.50 PEPSI_PAYMENT_SCHEME=examplepay proof: receipt-for-pepsi-1 not-in-argv$/,
	'the order, scheme, price and merchant as arguments and in the environment, the proof on its standard input');
is(scalar(grep { /^args: \Q$order\E examplepay EUR:0\.50 pay\.local\.test\/m env: .* proof: (?:receipt-for-pepsi-1|\Q$receipt\E) not-in-argv$/ } @runs),
	4, 'so each time');
is(scalar(grep { /PROOF-IN-ARGV/ } @runs), 0, 'never on its command line');

# A challenge opened before 0.13 (as the update leaves one: no order
# reference) is still paid through the order its request named then,
# pepsi-ID, and through no order with a reference.
my $early = 'ivan@sender.test';
make_mailbox($root, $early);
is(send_mail($early, $payee, subject => 'from ivan'), 0, 'another stranger writes to paula');
ok(poll_until(sub { sql("SELECT count(*) FROM pepsi.secretary_challenge WHERE owner = '$payee' AND sender = '$early' AND challenged_at IS NOT NULL") == 1 }, 180),
	'and is challenged');
my ($early_id, $early_ref) = split(/\|/, sql("SELECT id, order_ref FROM pepsi.secretary_challenge WHERE owner = '$payee' AND sender = '$early'"));
sql("UPDATE pepsi.secretary_challenge SET order_ref = NULL WHERE id = $early_id");
(my $early_uri = $pay_uri) =~ s/pepsi-\d+-[0-9a-f]{32}/pepsi-$early_id-$early_ref/;
is(send_mail($early, $payee, subject => 'a reference it no longer has',
		headers => ["Payment-Proof: $early_uri receipt-for-pepsi-$early_id-$early_ref"]), 0, 'a proof naming a reference');
ok(file_shows($d->{log}, no_open_challenge("pepsi-$early_id-$early_ref", $early), 180),
	'not paid: a challenge of before 0.13 is named by its id alone');
is(scalar(verifier_runs()), 4, 'the verifier was not run');
(my $legacy_uri = $pay_uri) =~ s/pepsi-\d+-[0-9a-f]{32}/pepsi-$early_id/;
is(send_mail($early, $payee, subject => 'the old order', headers => ["Payment-Proof: $legacy_uri receipt-for-pepsi-$early_id"]),
	0, 'a proof naming the order of before 0.13');
ok(poll_until(sub { grep({ /^Subject: from ivan\r$/m } paula_mails()) == 1 }, 180), 'paid: the held message is delivered')
  or diag(dispatcher_log($d));
ok(file_shows($d->{log}, qr/<\Q$payee\E>: paid EUR:0\.50 \(pepsi-$early_id\): held mail released/, 180), 'logged');
is(scalar(grep { /^args: pepsi-$early_id examplepay / } verifier_runs()), 1, 'the verifier judged it, once');

# 10. The stage's role writes none of the tables itself.
my ($prc, $pout, $perr) = $node->psql($db,
	"SET ROLE pepsi_stage; INSERT INTO pepsi.whitelist VALUES ('bob\@local.test', 'x\@y.test', 'owner')");
like($perr, qr/permission denied for table whitelist/, 'pepsi_stage may not write pepsi.whitelist');

stop_process($ingress);
done_testing();
