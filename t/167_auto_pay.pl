# Auto-pay both ways, end to end through pepsi-ingress and the real
# stages, with pepsi-stage-auto-pay set-group-id and pepsi-helper-auto-pay
# set-user-id root as make install lays them out, pepsi-dispatch running
# as an unprivileged user.  Our user ann (a system user of local.test)
# writes to addresses of shop.test whose secretary asks a payment instead
# of a confirmation: the challenge carries a taler://pay/ request, is
# DKIM-signed by shop.test (pepsi-stage-dkim-sign) and comes back in
# through the SMTP listener, which verifies the signature; auto-pay
# matches it to ann's message and pays it within her limits through her
# ~/.pepsi-wallet (a script, run as ann), the proof goes back as a reply,
# and the secretary checks it (HMAC of the order under the shared
# PAYMENT_SECRET) and releases her message.  Paid once; over the limit
# per message: not paid; a forged request (no DKIM): not paid; a wallet
# that fails or hangs: nothing paid, the request delivered unpaid, a log
# line.  Each payment and refusal a row of pepsi.payment.  Needs root
# (RootTest).

use strict;
use warnings FATAL => 'all';

use RootTest;

use File::Basename qw(dirname);
use File::Temp ();
use IO::Socket::INET;
use IPC::Run ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use SignTest;
use TestDNS;

$ENV{PATH} = "$ENV{PATH}:/usr/sbin:/sbin";
my $build_bin = dirname(pepsi_bin('pepsi-dispatch'));

my $db = 'postgres';
my $node = delivery_node('auto_pay');
my $shared = shared_dir();
my $homes = "$shared/home";
my $root = "$shared/maildir";
my $tag = $$ % 1000000;
my $group = "pepsi-ap$tag";
my $user = "ap${tag}ann";
my $ann = "$user\@local.test";
my ($bob, $carl, $dan, $erin) = map { "$_\@shop.test" } qw(bob carl dan erin);
my ($frank, $gina, $harry, $ivan, $jack, $kim) = map { "$_\@shop.test" } qw(frank gina harry ivan jack kim);
my $zoe = "ap${tag}zoe\@local.test";
my $vic = 'vic@virt.test';
my $wallet_user = "ap${tag}w";
my $secret = 'shared-with-the-payment-service';
# The helper's own login role (a member of pepsi_autopay), and a member of
# the helper's group who is not the stage.
my $claimer = "ap${tag}claim";
my $member = "ap${tag}m";

mkdir $homes;
mkdir $root;
add_system_group($group);
add_system_user($user, $homes);
add_system_user($wallet_user, $homes);
add_system_user($member, $homes);
system('usermod', '-a', '-G', $group, $member) == 0 or die 'usermod';
my ($uid, $ugid, $home) = (getpwnam($user))[ 2, 3, 7 ];
my ($wuid, $whome) = (getpwnam($wallet_user))[ 2, 7 ];
make_mailbox($root, $_) for $ann, $bob, $carl, $dan, $erin, $frank, $gina, $harry, $ivan, $jack, $kim, $zoe, $vic;
system('chown', '-R', cluster_user() . ':', $root) == 0 or die 'chown';
my $bin = "$shared/bin";
install_privileged($build_bin, $bin, $group, 'pepsi-helper-auto-pay', 'pepsi-stage-auto-pay');

sub sql { return $node->safe_psql($db, shift) }
sql("CREATE ROLE $claimer LOGIN IN ROLE pepsi_autopay");

# ann's wallet: the payment service's part too (it knows the shared secret
# and hands out the proof: HMAC-SHA256 of the order).  ~/wallet-mode says
# whether it pays, fails or hangs; ~/wallet.log has one line per payment.
sub write_file_as
{
	my ($path, $text, $mode) = @_;
	open my $fh, '>', $path or die "$path: $!";
	print $fh $text;
	close $fh;
	chown $uid, $ugid, $path;
	chmod $mode, $path;
}
write_file_as("$home/.pepsi-wallet", <<"SH", 0755);
#!/bin/sh
mode=\$(cat "\$HOME/wallet-mode")
[ "\$mode" = fail ] && { echo "insufficient funds" >&2; exit 3; }
[ "\$mode" = hang ] && exec sleep 120
order=\$(printf '%s' "\$2" | sed -n 's|.*/\\(pepsi-[0-9][-0-9a-f]*\\)/.*|\\1|p')
echo "\$(id -u) \$1 \$2 \$3 \$PEPSI_PAYER" >> "\$HOME/wallet.log"
printf '%s' "\$order" | openssl dgst -sha256 -hmac '$secret' | sed 's/^.* //'
SH
sub wallet_mode { write_file_as("$home/wallet-mode", "$_[0]\n", 0644) }
sub wallet_log { return -e "$home/wallet.log" ? slurp("$home/wallet.log") : '' }
wallet_mode('pay');

# shop.test signs its mail (the secretary's challenges); local.test and
# shop.test send from 127.0.0.1 (SPF pass).
my $etc = File::Temp::tempdir('pepsi-ap-XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $etc;
my ($key, $record) = make_key($etc, 'shop', 'rsa-sha256');
chown((getpwnam(cluster_user()))[ 2, 3 ], $key);
my $dns = TestDNS->new($shared);
$dns->zone("1.0.0.127.in-addr.arpa. 300 IN PTR mx.client.test.\nmx.client.test. 300 IN A 127.0.0.1\n"
	  . "local.test. 300 IN TXT \"v=spf1 ip4:127.0.0.1 -all\"\n"
	  . "shop.test. 300 IN TXT \"v=spf1 ip4:127.0.0.1 -all\"\n"
	  . "virt.test. 300 IN TXT \"v=spf1 ip4:127.0.0.1 -all\"\n"
	  . TestDNS::txt('s1._domainkey.shop.test.', $record));

# The shared secret, in secrets.d beside the configuration: root's,
# readable by the pipeline's group.
mkdir "$etc/secrets.d";
chmod 0755, "$etc/secrets.d";
{
	my $fragment = "$etc/secrets.d/payment.conf";
	open my $fh, '>', $fragment or die $!;
	print $fh "[stage-secretary]\nPAYMENT_SECRET = $secret\n";
	close $fh;
	chown 0, (getpwnam(cluster_user()))[3], $fragment;
	chmod 0640, $fragment;
}

# The virtual domain virt.test's wallet: WALLET_DIR/virt.test, root's,
# run as WALLET_USER; one line per payment in WALLET_USER's ~/wallet.log.
mkdir "$etc/wallet.d";
chmod 0755, "$etc/wallet.d";
{
	open my $fh, '>', "$etc/wallet.d/virt.test" or die $!;
	print $fh <<"SH";
#!/bin/sh
order=\$(printf '%s' "\$2" | sed -n 's|.*/\\(pepsi-[0-9][-0-9a-f]*\\)/.*|\\1|p')
echo "\$(id -u) \$1 \$2 \$3 \$PEPSI_PAYER" >> "\$HOME/wallet.log"
printf '%s' "\$order" | openssl dgst -sha256 -hmac '$secret' | sed 's/^.* //'
SH
	close $fh;
	chmod 0755, "$etc/wallet.d/virt.test";
}
sub virtual_wallet_log { return -e "$whome/wallet.log" ? slurp("$whome/wallet.log") : '' }

# WALLET_TIME_LIMIT is 15 s, not the 3 s a hung wallet needs to show: on a
# loaded machine (load 20 and more on 2 cores) a paying wallet, a shell
# script that runs two programs, took longer than 3 s to start and was
# killed before it wrote anything.  The hung wallet's case costs the wait.
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $config = delivery_config($node, maildir_root => $root, local_domains => 'local.test shop.test virt.test',
	path => "$etc/pepsi.conf",
	pepsi => { DNS_FORWARDER => $dns->forwarder, DNS_TIMEOUT => '4s', LOCAL_DOMAINS => 'local.test shop.test virt.test' },
	extra => { init => "LOCAL_STAGE = autopay\n" },
	more_stages => {
		autopay => "PROGRAM = $bin/pepsi-stage-auto-pay\nNEXT_STAGE = secretary\nREPLY_STAGE = init\n"
		  . "WALLET_TIME_LIMIT = 15s\nSYSTEM_DOMAINS = local.test\n"
		  . "WALLET_DIR = $etc/wallet.d\nWALLET_USER = $wallet_user\n"
		  . sprintf("HELPER_CONNINFO = host=%s port=%d dbname=%s user=%s\n", $node->host, $node->port, $db, $claimer),
		secretary => "PROGRAM = pepsi-stage-check-whitelist\nNEXT_STAGE = maildir\nREPLY_STAGE = sign\n"
		  . "PAYMENT_MERCHANT = pay.shop.test/instances/mail\n",
		sign => "PROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = loop\nKEYS = shop\n"
		  . "HEADERS = from:to:subject:date:message-id:in-reply-to:references:payment-request:payment-amount\n",
		loop => "PROGRAM = pepsi-stage-relay-to-smarthost\nSMARTHOST = 127.0.0.1:$port\nTLS = none\n"
		  . "TIMEOUT = 10s\nCONNECT_TIMEOUT = 5s\nRETRY_BASE = 1s\nRETRY_MAX = 2s\n",
	},
	sections => <<"CONF");
[dkim-key-shop]
DOMAIN = shop.test
SELECTOR = s1
KEY_FILE = $key
[ingress]
AUTHSERV_ID = mx.pepsi.test
DISPATCH_WAKE_INTERVAL = 10ms
DNS_MESSAGE_BUDGET = 8s
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
MESSAGE_AUTHENTICATION = on
TRUSTED_MESSAGE_AUTHENTICATION = on
CONF
chmod 0644, $config;

# bob, carl, dan and erin of shop.test ask a payment; ann's limits.
for ([ $bob, 'EUR:0.50' ], [ $carl, 'EUR:5' ], [ $dan, 'EUR:0.50' ], [ $erin, 'EUR:0.50' ], [ $frank, 'EUR:0.40' ],
	[ $gina, 'EUR:0.40' ], [ $harry, 'EUR:0.40' ], [ $ivan, 'EUR:0.10' ], [ $jack, 'EUR:0.10' ], [ $kim, 'EUR:0.50' ])
{
	sql("SELECT pepsi.settings_set('$_->[0]', 'WHITELIST', 'yes')");
	sql("SELECT pepsi.settings_set('$_->[0]', 'SECRETARY_PAYMENT', 'taler')");
	sql("SELECT pepsi.settings_set('$_->[0]', 'SECRETARY_PRICE', '$_->[1]')");
}
sql("SELECT pepsi.settings_set('$ann', 'AUTO_PAY_PER_MESSAGE', 'EUR:1')");
sql("SELECT pepsi.settings_set('$ann', 'AUTO_PAY_PER_DAY', 'EUR:10')");
sql("SELECT pepsi.settings_set('$vic', 'AUTO_PAY_PER_MESSAGE', 'EUR:1')");
sql("SELECT pepsi.settings_set('$vic', 'AUTO_PAY_PER_DAY', 'EUR:10')");

my $ingress_log = "$shared/ingress.log";
my $ingress = start_dispatcher($config, program => [ as_cluster_user(pepsi_bin('pepsi-ingress')) ],
	log => $ingress_log);
poll_until(sub {
	my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 1);
	$s->close if $s;
	return $s;
}, 60) or die "pepsi-ingress did not start:\n" . slurp($ingress_log);
my $d = start_dispatcher($config, log => "$shared/dispatch.log",
	program => [ as_cluster_user(pepsi_bin('pepsi-dispatch')) ]);

my $n = 0;
sub send_mail
{
	my ($from, $to, %m) = @_;
	$n++;
	my $headers = join('', map { "$_\r\n" } @{ $m{headers} // [] });
	my $data = "From: <" . ($m{header_from} // $from) . ">\r\nTo: <$to>\r\nSubject: " . ($m{subject} // "message $n")
	  . "\r\nMessage-ID: <m$n.$tag\@local.test>\r\nDate: Sun, 6 Dec 2026 12:00:00 +0000\r\n$headers\r\n"
	  . "Hello $n.\r\n";
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'swaks', '--server', '127.0.0.1', '--port', $port, '--ehlo', 'mx.client.test',
			'--from', $from, '--to', $to, '--data', '-' ],
		'<', \$data, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	diag($out . $err) if $?;
	return ($? >> 8, "m$n.$tag\@local.test");
}
sub mails { return map { slurp($_) } maildir_files($root, $_[0]) }
sub requests { return grep { /^Payment-Request: taler:/m } mails($ann) }
sub request_from { my ($who) = @_; return grep { /^Subject: Please confirm your message to \Q$who\E/m } requests() }
sub payments
{
	return sql("SELECT string_agg(concat_ws(' ', outcome, peer, currency || ':' || amount::text), ',' ORDER BY id)"
		  . " FROM pepsi.payment WHERE direction = 'out'");
}
sub queue_dump
{
	return sql("SELECT string_agg(concat_ws(' ', id, stage, status, mail_from, rcpt_to::text), E'\n') FROM pepsi.workqueue");
}

# 1. Within the limits: paid once, and the secretary releases ann's message.
my ($rc, $first) = send_mail($ann, $bob, subject => 'to bob');
is($rc, 0, 'ann writes to bob');
ok(poll_until(sub { sql("SELECT sender FROM pepsi.outbound_message WHERE message_id = '$first'") eq $ann }, 60),
	'its Message-Id is recorded');
ok(poll_until(sub { grep({ /^Subject: to bob\r$/m } mails($bob)) == 1 }, 90),
	'bob\'s secretary released it, on the proof of payment')
  or diag(queue_dump(), "\n", slurp("$shared/dispatch.log"), slurp($ingress_log));
my ($request) = requests();
like($request, qr{^Payment-Request: taler://pay/pay\.shop\.test/instances/mail/pepsi-\d+-[0-9a-f]{32}/\r$}m,
	'the challenge carried a taler://pay/ request');
like($request, qr/^DKIM-Signature:.*d=shop\.test/ms, 'signed by shop.test');
like($request, qr/^Authentication-Results: mx\.pepsi\.test;.*dkim=pass/ms, 'verified as it came in');
is(payments(), "paid $bob EUR:0.50", 'one payment, paid, to bob');
my @calls = split /\n/, wallet_log();
is(scalar(@calls), 1, 'the wallet ran once');
like($calls[0], qr{^$uid pay taler://pay/pay\.shop\.test/instances/mail/pepsi-\d+-[0-9a-f]{32}/ EUR:0\.50 \Q$ann\E$},
	'as ann, with the request, the amount and the payer');
is(sql("SELECT source FROM pepsi.whitelist WHERE owner = '$bob' AND sender = '$ann'"), 'reply',
	'ann is on bob\'s whitelist');
is(sql("SELECT outcome || ' ' || amount FROM pepsi.payment WHERE direction = 'in' AND address = '$bob'"),
	'received 0.50', 'bob\'s side recorded what it received');
ok(file_shows("$shared/dispatch.log", qr/<\Q$ann\E>: paid EUR:0\.50 to <\Q$bob\E> for taler:/), 'logged');

# 2. Over the limit per message: not paid, carl's message stays held.
($rc) = send_mail($ann, $carl, subject => 'to carl');
ok(poll_until(sub { payments() =~ /refused \Q$carl\E EUR:5/ }, 90), 'carl\'s EUR:5 is refused')
  or diag(queue_dump());
ok(poll_until(sub { scalar(request_from($carl)) == 1 }, 60), 'the request is delivered to ann, unpaid');
ok(file_shows("$shared/dispatch.log", qr/not paid: EUR:5 is over the limit per message, EUR:1 \(AUTO_PAY_PER_MESSAGE\)/),
	'logged with the reason and the option');
is(scalar(split /\n/, wallet_log()), 1, 'the wallet did not run');
is(scalar(mails($carl)), 0, 'carl\'s message is held');

# 3. A forged request: From bob, answering ann's message, no signature.
($rc) = send_mail('bob@shop.test', $ann, subject => 'pay me', header_from => $bob,
	headers => [ "In-Reply-To: <$first>", 'Payment-Request: taler://pay/evil.test/x/', 'Payment-Amount: EUR:0.10' ]);
is($rc, 0, 'a forged request is taken');
ok(poll_until(sub { grep({ /^Subject: pay me\r$/m } mails($ann)) == 1 }, 60), 'and delivered');
like(payments(), qr/refused \Q$bob\E EUR:0\.10/, 'refused');
ok(file_shows("$shared/dispatch.log", qr/for EUR:0\.10 not paid: no passing DKIM signature of the requester's domain/),
	'for want of a DKIM signature');
is(scalar(split /\n/, wallet_log()), 1, 'the wallet did not run');

# 4. A wallet that fails, then one that hangs: nothing paid, delivered unpaid.
wallet_mode('fail');
send_mail($ann, $dan, subject => 'to dan');
ok(poll_until(sub { payments() =~ /failed \Q$dan\E/ }, 90), 'dan\'s request: the wallet failed') or diag(queue_dump());
ok(file_shows("$shared/dispatch.log", qr/<\Q$dan\E> for EUR:0\.50 not paid: the wallet: the wallet exited with status 3/),
	'logged');
wallet_mode('hang');
send_mail($ann, $erin, subject => 'to erin');
ok(poll_until(sub { payments() =~ /failed \Q$erin\E/ }, 90), 'erin\'s request: the wallet hung') or diag(queue_dump());
ok(file_shows("$shared/dispatch.log", qr/not paid: the wallet: the wallet ran longer than 15 s and was killed/),
	'killed at WALLET_TIME_LIMIT, logged');
ok(poll_until(sub { scalar(request_from($dan)) + scalar(request_from($erin)) == 2 }, 60),
	'both requests are delivered to ann, unpaid');
is(sql("SELECT count(*) FROM pepsi.payment WHERE direction = 'out' AND outcome = 'paid'"), '1',
	'still one payment made');
is(scalar(mails($dan)) + scalar(mails($erin)), 0, 'dan\'s and erin\'s messages stay held');

# 5. The limit per day: ann's payments of the last day (EUR:0.50 to bob)
# may reach EUR:1; frank's EUR:0.40 fits, gina's EUR:0.40 would cross it.
wallet_mode('pay');
sql("SELECT pepsi.settings_set('$ann', 'AUTO_PAY_PER_DAY', 'EUR:1')");
send_mail($ann, $frank, subject => 'to frank');
ok(poll_until(sub { payments() =~ /paid \Q$frank\E EUR:0\.40/ }, 90), 'frank\'s EUR:0.40 is paid, within the day\'s EUR:1')
  or diag(queue_dump());
ok(poll_until(sub { grep({ /^Subject: to frank\r$/m } mails($frank)) == 1 }, 90), 'and frank\'s secretary released it');
send_mail($ann, $gina, subject => 'to gina');
ok(poll_until(sub { payments() =~ /refused \Q$gina\E EUR:0\.40/ }, 90), 'gina\'s EUR:0.40 is refused')
  or diag(queue_dump());
is(sql("SELECT reason FROM pepsi.payment WHERE direction = 'out' AND peer = '$gina'"),
	"EUR:0.40 would bring the last day's payments to EUR:1.30, over the limit per day, EUR:1 (AUTO_PAY_PER_DAY)",
	'the audit row says why');
ok(file_shows("$shared/dispatch.log", qr/<\Q$gina\E> for EUR:0\.40 not paid: .*over the limit per day, EUR:1 \(AUTO_PAY_PER_DAY\)/),
	'logged');
ok(poll_until(sub { scalar(request_from($gina)) == 1 }, 60), 'the request is delivered to ann, unpaid');
is(scalar(split /\n/, wallet_log()), 2, 'the wallet ran for frank only');
is(scalar(mails($gina)), 0, 'gina\'s message is held');

# 6. The limit per recipient domain: shop.test has had EUR:0.90 of the
# day's EUR:1.20; harry's EUR:0.40 would cross it (the day's limit would
# not), ivan's EUR:0.10 fits.
sql("SELECT pepsi.settings_set('$ann', 'AUTO_PAY_PER_DAY', 'EUR:10')");
sql("SELECT pepsi.settings_set('$ann', 'AUTO_PAY_PER_DOMAIN', 'EUR:1.20')");
send_mail($ann, $harry, subject => 'to harry');
ok(poll_until(sub { payments() =~ /refused \Q$harry\E EUR:0\.40/ }, 90), 'harry\'s EUR:0.40 is refused')
  or diag(queue_dump());
is(sql("SELECT reason FROM pepsi.payment WHERE direction = 'out' AND peer = '$harry'"),
	"EUR:0.40 would bring the last day's payments to shop.test to EUR:1.30, over the limit per recipient domain,"
	  . " EUR:1.20 (AUTO_PAY_PER_DOMAIN)",
	'the audit row says why');
ok(file_shows("$shared/dispatch.log", qr/<\Q$harry\E> for EUR:0\.40 not paid: .*\(AUTO_PAY_PER_DOMAIN\)/), 'logged');
send_mail($ann, $ivan, subject => 'to ivan');
ok(poll_until(sub { payments() =~ /paid \Q$ivan\E EUR:0\.10/ }, 90), 'ivan\'s EUR:0.10 fits, paid') or diag(queue_dump());
is(scalar(split /\n/, wallet_log()), 3, 'the wallet ran for ivan, not harry');
is(scalar(mails($harry)), 0, 'harry\'s message is held');

# 7. A request, signed by shop.test, answering a message ann sent to
# local.test only: not paid, not even recorded (it is no request of hers).
my ($zrc, $to_zoe) = send_mail($ann, $zoe, subject => 'to zoe');
ok(poll_until(sub { grep({ /^Subject: to zoe\r$/m } mails($zoe)) == 1 }, 90), 'ann writes to zoe at local.test');
{
	require Mail::DKIM::Signer;
	require Mail::DKIM::TextWrap;
	my $msg = "From: <$bob>\r\nTo: <$ann>\r\nSubject: pay for zoe\r\nMessage-ID: <z.$tag\@shop.test>\r\n"
	  . "Date: Sun, 6 Dec 2026 12:00:00 +0000\r\nIn-Reply-To: <$to_zoe>\r\n"
	  . "Payment-Request: taler://pay/pay.shop.test/instances/mail/pepsi-999999/\r\nPayment-Amount: EUR:0.10\r\n"
	  . "\r\nPay me.\r\n";
	my $signer = Mail::DKIM::Signer->new(Algorithm => 'rsa-sha256', Method => 'relaxed', Domain => 'shop.test',
		Selector => 's1', KeyFile => $key,
		Headers => 'from:to:subject:message-id:date:in-reply-to:payment-request:payment-amount');
	$signer->PRINT($msg);
	$signer->CLOSE;
	my $data = $signer->signature->as_string . "\r\n" . $msg;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'swaks', '--server', '127.0.0.1', '--port', $port, '--ehlo', 'mx.client.test',
			'--from', $bob, '--to', $ann, '--data', '-' ],
		'<', \$data, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	is($?, 0, 'a signed request for the message to zoe is taken') or diag($out . $err);
}
ok(poll_until(sub { grep({ /^Subject: pay for zoe\r$/m } mails($ann)) == 1 }, 60), 'and delivered');
like((grep { /^Subject: pay for zoe\r$/m } mails($ann))[0], qr/^Authentication-Results: mx\.pepsi\.test;.*dkim=pass/ms,
	'its signature passed');
ok(file_shows("$shared/dispatch.log",
		qr/<\Q$bob\E> for EUR:0\.10 not paid: it answers no message this address sent to that domain/),
	'not paid: logged');
is(sql("SELECT count(*) FROM pepsi.payment WHERE direction = 'out' AND uri LIKE '%pepsi-999999%'"), '0',
	'no payment row');
is(scalar(split /\n/, wallet_log()), 3, 'the wallet did not run');

# 8. No limit set by the owner: nothing paid, the audit says why.
sql("SELECT pepsi.settings_unset('$ann', 'AUTO_PAY_PER_DAY')");
sql("SELECT pepsi.settings_unset('$ann', 'AUTO_PAY_PER_DOMAIN')");
send_mail($ann, $jack, subject => 'to jack');
ok(poll_until(sub { payments() =~ /refused \Q$jack\E EUR:0\.10/ }, 90), 'without AUTO_PAY_PER_DAY jack\'s EUR:0.10 is refused')
  or diag(queue_dump());
is(sql("SELECT reason FROM pepsi.payment WHERE direction = 'out' AND peer = '$jack'"),
	'no limit is set (AUTO_PAY_PER_MESSAGE and AUTO_PAY_PER_DAY)', 'the audit row says why');
is(scalar(split /\n/, wallet_log()), 3, 'the wallet did not run');

# 9. A virtual user: vic of virt.test pays through WALLET_DIR/virt.test,
# run as WALLET_USER, within vic's limits.
send_mail($vic, $kim, subject => 'to kim');
ok(poll_until(sub { payments() =~ /paid \Q$kim\E EUR:0\.50/ }, 90), 'vic\'s request from kim is paid')
  or diag(queue_dump(), "\n", slurp("$shared/dispatch.log"));
is(sql("SELECT address FROM pepsi.payment WHERE direction = 'out' AND peer = '$kim'"), $vic, 'by vic');
like(virtual_wallet_log(), qr{^$wuid pay taler://pay/pay\.shop\.test/instances/mail/pepsi-\d+-[0-9a-f]{32}/ EUR:0\.50 \Q$vic\E$},
	'through WALLET_DIR/virt.test, as WALLET_USER, with the payer');
ok(poll_until(sub { grep({ /^Subject: to kim\r$/m } mails($kim)) == 1 }, 90), 'kim\'s secretary released it');
is(scalar(split /\n/, wallet_log()), 3, 'ann\'s wallet did not run');

# 10. The record is bounded: the schedule prunes it.
sql("UPDATE pepsi.outbound_message SET sent_at = now() - interval '40 days'");
sql("SELECT pepsi.schedule_add('outbound-prune', now(), interval '1 day', function_name => 'outbound_message_prune',"
	  . " arguments => '{\"older_than\": \"30 days\"}')");
ok(poll_until(sub { sql('SELECT count(*) FROM pepsi.outbound_message') eq '0' }, 60), 'the schedule prunes it');

# 11. The helper pays only what the database reserved within the limits,
# once: a member of its group (who may run it) calling it directly with a
# made-up payment id, an id paid already, an id refused over the limit, or
# an address and an amount of its own choosing, gets a refusal that says
# why, and the wallet does not run.
my $member_gid = (getgrnam($group))[2];
my ($muid, $mgid) = (getpwnam($member))[ 2, 3 ];
sub helper_as_member
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'setpriv', "--reuid=$muid", "--regid=$mgid", "--groups=$member_gid",
			"$bin/pepsi-helper-auto-pay", '-c', "$etc/pepsi.conf", '-s', 'stage-autopay', @_ ],
		'<', \undef, '>', \$out, '2>', \$err, IPC::Run::timeout(60));
	return ($? >> 8, $out, $err);
}
my $before_ann = wallet_log();
my $before_vic = virtual_wallet_log();
my $paid_before = sql("SELECT count(*) FROM pepsi.payment WHERE direction = 'out' AND outcome = 'paid'");
my $paid_id = sql("SELECT id FROM pepsi.payment WHERE direction = 'out' AND peer = '$bob' AND outcome = 'paid'");
my $refused_id = sql("SELECT id FROM pepsi.payment WHERE direction = 'out' AND peer = '$carl' AND outcome = 'refused'");
my $unknown_id = sql("SELECT coalesce(max(id), 0) + 1000 FROM pepsi.payment");
my ($hrc, $hout, $herr) = helper_as_member('pay', $unknown_id, '5');
is($hout, "failed refused: no payment $unknown_id was reserved\n", 'a made-up payment id is refused, with the reason')
  or diag($herr);
($hrc, $hout, $herr) = helper_as_member('pay', $paid_id, '5');
like($hout, qr/^failed refused: payment $paid_id was claimed already, at /, 'a replayed payment id is refused')
  or diag($herr);
($hrc, $hout, $herr) = helper_as_member('pay', $refused_id, '5');
is($hout,
	"failed refused: payment $refused_id is refused, not pending (EUR:5 is over the limit per message, EUR:1 (AUTO_PAY_PER_MESSAGE))\n",
	'a payment refused over the limit is refused, with the limit') or diag($herr);
($hrc, $hout, $herr) = helper_as_member('pay', $ann, '5', 'EUR:100', 'taler://pay/evil.test/x/');
is($hrc, 64, 'an address and an amount of the caller\'s own are not an argument the helper takes');
like($herr, qr/usage: pepsi-helper-auto-pay .* pay PAYMENT-ID SECONDS/, 'it says how it is called');
($hrc, $hout, $herr) = helper_as_member('pay', 'x1', '5');
like($herr, qr/refused: "x1" is not a payment id/, 'an id that is not a number is refused');
# A payment reserved but claimed by nobody yet, too long ago: expired.
sql("INSERT INTO pepsi.payment (direction, address, peer, peer_domain, uri, currency, amount, outcome, created_at)"
	  . " VALUES ('out', '$ann', '$bob', 'shop.test', 'taler://pay/old/', 'EUR', 0.1, 'pending', now() - interval '1 hour')");
my $old_id = sql("SELECT id FROM pepsi.payment WHERE uri = 'taler://pay/old/'");
($hrc, $hout, $herr) = helper_as_member('pay', $old_id, '5');
like($hout, qr/^failed refused: payment $old_id was reserved at .*, more than 10 minutes ago$/,
	'a payment reserved too long ago is refused');
is(wallet_log(), $before_ann, 'ann\'s wallet ran for none of them');
is(virtual_wallet_log(), $before_vic, 'nor the virtual domain\'s');
is(sql("SELECT count(*) FROM pepsi.payment WHERE direction = 'out' AND outcome = 'paid'"), $paid_before,
	'and nothing more was paid');
my ($crc, $cout, $cerr) = $node->psql($db, "SET ROLE pepsi_stage; SELECT pepsi.auto_pay_claim($old_id)");
like($cerr, qr/permission denied for function auto_pay_claim/, 'the stage\'s role may not claim a payment itself');

# A payment the database reserved is paid once, whoever asks first, and
# recorded by the helper: the stage (or anyone who is not the helper) can
# no longer record it failed, which would free its amount under the limits.
wallet_mode('pay');
sql("INSERT INTO pepsi.payment (direction, address, peer, peer_domain, uri, currency, amount, outcome)"
	  . " VALUES ('out', '$ann', '$bob', 'shop.test', 'taler://pay/early/pepsi-1/', 'EUR', 0.20, 'pending')");
my $early_id = sql("SELECT id FROM pepsi.payment WHERE uri = 'taler://pay/early/pepsi-1/'");
($hrc, $hout, $herr) = helper_as_member('pay', $early_id, '5');
like($hout, qr/^paid [0-9a-f]{64}$/, 'a reserved payment is paid, whoever asks for it first') or diag($herr);
like(wallet_log(), qr{^$uid pay taler://pay/early/pepsi-1/ EUR:0\.20 \Q$ann\E$}m,
	'as ann, with the amount and the URI the database holds');
is(sql("SELECT outcome || ' ' || (claimed_at IS NOT NULL) FROM pepsi.payment WHERE id = $early_id"), 'paid true',
	'the helper recorded it paid');
($hrc, $hout, $herr) = helper_as_member('pay', $early_id, '5');
like($hout, qr/^failed refused: payment $early_id was claimed already/, 'and it is not paid twice');
$node->safe_psql($db, "SET ROLE pepsi_stage; SELECT pepsi.auto_pay_finish($early_id, 'failed', 'it was not')");
is(sql("SELECT outcome FROM pepsi.payment WHERE id = $early_id"), 'paid',
	'the stage\'s role cannot record a claimed payment failed');
($crc, $cout, $cerr) = $node->psql($db, "SET ROLE pepsi_stage; SELECT pepsi.auto_pay_settle($early_id, 'failed', 'x')");
like($cerr, qr/permission denied for function auto_pay_settle/, 'nor settle it as the helper does');

# The stage's role writes neither table itself.
my ($prc, $pout, $perr) = $node->psql($db,
	"SET ROLE pepsi_stage; INSERT INTO pepsi.outbound_message VALUES ('x\@y', 'a\@b.test')");
like($perr, qr/permission denied for table outbound_message/, 'pepsi_stage may not write pepsi.outbound_message');

stop_dispatcher($d);
stop_dispatcher($ingress);
done_testing();
