# Pepsi's log read by Debian's pflogsumm, the summary postmasters run on
# Postfix's: a known mix of messages goes through the real daemons
# (swaks -> pepsi-ingress -> pepsi-dispatch and its stages), delivered to a
# Maildir, over LMTP to Dovecot and over SMTP to Postfix's smtp-sink,
# deferred and bounced by a scripted peer, and pflogsumm must count what
# was received, delivered, deferred and bounced.  The lines are tagged
# <SYSLOG_NAME>/<service> (smtpd, qmgr, smtp, lmtp, local) and name the
# message by its one queue id: the 250 reply's, the Received header's, on
# every row split from it.  The daemons log to stderr (PEPSI_LOG=stderr,
# as every test); the test puts in front of each line the time and host a
# syslog daemon would, and nothing else.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use DovecotTest;
use PepsiTest;

my $pflogsumm = '/usr/sbin/pflogsumm';
plan skip_all => 'pflogsumm is not installed (scripts/deps.sh check installs it)' unless -x $pflogsumm;

my $node = delivery_node('pflogsumm');
my $root = PostgreSQL::Test::Utils::tempdir();
my $tmp = PostgreSQL::Test::Utils::tempdir();
make_mailbox($root, $_) for qw(alice@local.test sender@local.test frank@local.test);
my $syslog_name = 'pepsi-mx';

# The ingress listener of a configuration.
# With $untrusted, a second listener where 127.0.0.1 may not relay.
sub with_listener
{
	my ($config, $port, $untrusted) = @_;
	PostgreSQL::Test::Utils::append_to_file($config, <<"CONF");
[ingress]
AUTHSERV_ID = mx.pepsi.test
DISPATCH_WAKE_INTERVAL = 10ms
[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
CONF
	PostgreSQL::Test::Utils::append_to_file($config,
		"[listener-untrusted]\nADDRESS = 127.0.0.1\nPORT = $untrusted\nTRUSTED_NETWORKS = 127.0.0.2\n")
	  if $untrusted;
	return $config;
}

# swaks to the listener: the 250 reply's queue id, or undef.
sub send_message
{
	my ($port, $from, @to) = @_;
	my $out = '';

	IPC::Run::run([ 'swaks', '--server', "127.0.0.1:$port", '--ehlo', 'client.test', '--from', $from,
			'--to', join(',', @to), '--header', 'Subject: mix' ],
		'<', \undef, '>', \$out, '2>&1', IPC::Run::timeout(60));
	return $out =~ /<[-~]  250 2\.0\.0 Ok: queued as (\S+)/ ? $1 : undef;
}

# pepsi-sendmail, as a local program (cron, a web application) runs it: its
# exit status and its stderr (PEPSI_LOG=stderr puts its log lines there).
sub local_submission
{
	my ($config, $log, @args) = @_;
	my $input = "$tmp/local-submission";
	PostgreSQL::Test::Utils::append_to_file($input, "Subject: from cron\n\nthe nightly report\n");
	my $out = '';
	IPC::Run::run([ pepsi_bin('pepsi-sendmail'), '-C', $config, '-i', @args ], '<', $input,
		'>', \$out, '2>>', $log, IPC::Run::timeout(60));
	return $? >> 8;
}

sub pepsi_queue
{
	my ($config, @args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-queue'), '-C', $config, @args ], '>', \$out, '2>', \$err);
	return ($? >> 8, $out . $err);
}

sub queue_ids_in
{
	my ($log, $rcpt) = @_;
	return map { /\]: (\S+): to=<\Q$rcpt\E>/ ? $1 : () } split /\n/, slurp($log) // '';
}

#
# Phase 1: a Maildir and smtp-sink.
#
my $sink = start_sink('-c');
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $untrusted = PostgreSQL::Test::Cluster::get_free_port();
my $config = with_listener(delivery_config($node, maildir_root => $root,
	smarthost => "127.0.0.1:$sink->{port}", pepsi => { SYSLOG_NAME => $syslog_name, MAIL_LOG => 'yes' }),
	$port, $untrusted);
my $ingress = start_ingress($config, $port, "$tmp/ingress-1.log");
my $d = start_dispatcher($config, log => "$tmp/dispatch-1.log");

my $local = send_message($port, 'someone@remote.test', 'alice@local.test');
like($local // '', qr/^[0-9B-DF-HJ-NP-TV-Zb-df-hj-np-tv-z]{15}$/,
	'the 250 reply names a queue id shaped as Postfix\'s long ones');
my $two = send_message($port, 'someone@remote.test', 'carol@remote.test', 'dave@remote.test');
my $split = send_message($port, 'someone@remote.test', 'alice@local.test', 'erin@remote.test');
ok(!send_message($untrusted, 'spammer@remote.test', 'victim@remote.test'),
	'a client that may not relay is refused at RCPT');
is(local_submission($config, "$tmp/sendmail-1.log", '-f', 'cron@local.test', 'frank@local.test'), 0,
	'a local program hands a message to pepsi-sendmail');
ok(poll_until(sub { queue_count($node) == 0 }), 'phase 1: every message delivered');
stop_dispatcher($d);
stop_process($ingress);
stop_process($sink);

my @alice = maildir_files($root, 'alice@local.test');
is(scalar @alice, 2, 'alice has her two messages');
like(slurp($alice[0]), qr/^Received: from client\.test .*\r\n\tby mx\.pepsi\.test \(Pepsi\) with ESMTP id \Q$local\E\r\n/m,
	'the Received header names the queue id of the 250 reply');
is_deeply([ queue_ids_in("$tmp/dispatch-1.log", 'alice@local.test') ], [ $local, $split ],
	'so do the delivery lines');
like(slurp("$tmp/dispatch-1.log"), qr/^\Q$syslog_name\E\/local\[\d+\]: \Q$local\E: to=<alice\@local\.test>, relay=local, .*, row=\d+$/m,
	'... under the local tag, with the row id beside it');
my ($erin) = grep { /to=<erin\@remote\.test>/ } split /\n/, slurp("$tmp/dispatch-1.log");
like($erin // '', qr/^\Q$syslog_name\E\/smtp\[\d+\]: \Q$split\E: to=<erin\@remote\.test>, /,
	'the row split off for the remote recipient keeps the message\'s queue id, under the smtp tag');
my ($alice_row) = slurp("$tmp/dispatch-1.log") =~ /\Q$split\E: to=<alice\@local\.test>.*, row=(\d+)$/m;
my ($erin_row) = ($erin // '') =~ /, row=(\d+)$/;
ok(defined $alice_row && defined $erin_row && $alice_row != $erin_row, '... and its own row id');
my ($rc, $out) = pepsi_queue($config, 'log', $split);
is($rc, 0, 'pepsi-queue log QUEUE-ID');
is(join(' ', sort map { /^\S+ \S+\s+\Q$split\E\s+(\d+)\s+delivery\s+sent\s+(\S+)/ ? "$1:$2" : () } split /\n/, $out),
	join(' ', sort ("$alice_row:alice\@local.test", "$erin_row:erin\@remote.test")),
	'... shows the deliveries of both rows of the split message, each with its row id');
my ($picked_up) = slurp("$tmp/sendmail-1.log") =~ /^\Q$syslog_name\E\/pickup\[\d+\]: (\S+): uid=\d+ from=<cron\@local\.test>$/m;
ok($picked_up, 'pepsi-sendmail logs uid= and from= under the pickup tag, as Postfix\'s pickup does')
	or diag slurp("$tmp/sendmail-1.log");
is_deeply([ queue_ids_in("$tmp/dispatch-1.log", 'frank@local.test') ], [ $picked_up // 'none' ],
	'... naming the queue id its delivery line names');
like(slurp("$tmp/ingress-1.log"), qr/^\Q$syslog_name\E\/smtpd\[\d+\]: \Q$two\E: client=unknown\[127\.0\.0\.1\]$/m,
	'ingress logs client= under the smtpd tag');
like(slurp("$tmp/ingress-1.log"),
	qr/^\Q$syslog_name\E\/smtpd\[\d+\]: NOQUEUE: reject: RCPT from unknown\[127\.0\.0\.1\]: 554 5\.7\.1 <victim\@remote\.test>: Relay access denied .*; from=<spammer\@remote\.test> to=<victim\@remote\.test> proto=ESMTP helo=<client\.test>$/m,
	'the refusal is logged as Postfix\'s smtpd logs it (NOQUEUE: reject:)');
like(slurp("$tmp/ingress-1.log"),
	qr/^\Q$syslog_name\E\/qmgr\[\d+\]: \Q$two\E: from=<someone\@remote\.test>, size=\d+, nrcpt=2 \(queue active, row \d+\)$/m,
	'... and from=, size=, nrcpt= under the qmgr tag');

#
# Phase 2: Dovecot over LMTP; a peer that defers one recipient and refuses another.
#
my $dovecot = start_dovecot(users => { bob => {} });
my $peer = start_peer('--rcpt', 'slow@=451 4.3.0 try again later',
	'--rcpt', 'gone@=550 5.1.1 <gone@remote.test>: no such user');
$port = PostgreSQL::Test::Cluster::get_free_port();
$config = with_listener(delivery_config($node, maildir_root => $root,
	smarthost => "127.0.0.1:$peer->{port}", pepsi => { SYSLOG_NAME => $syslog_name, MAIL_LOG => 'yes' },
	extra => { init => "LOCAL_STAGE = lmtp\n", smarthost => "RETRY_BASE = 1h\nRETRY_MAX = 1h\n" },
	more_stages => { lmtp => "PROGRAM = pepsi-stage-relay-to-lmtp\nSERVER = $dovecot->{socket}\n"
		  . "BOUNCE_STAGE = bounce\nTIMEOUT = 10s\n" }), $port);
$ingress = start_ingress($config, $port, "$tmp/ingress-2.log");
$d = start_dispatcher($config, log => "$tmp/dispatch-2.log");
ok(send_message($port, 'someone@remote.test', 'bob@local.test'), 'a message for Dovecot');
ok(send_message($port, 'someone@remote.test', 'slow@remote.test'), 'one to be deferred');
my $gone = send_message($port, 'sender@local.test', 'gone@remote.test');
ok($gone, 'one to be bounced');
ok(poll_until(sub { scalar(dovecot_messages($dovecot, 'bob')) == 1 }), 'Dovecot has bob\'s');
ok(poll_until(sub { scalar(maildir_files($root, 'sender@local.test')) == 1 }), 'the DSN reached the sender');
ok(poll_until(sub { scalar(queue_ids_in("$tmp/dispatch-2.log", 'slow@remote.test')) == 1 }),
	'the deferral is logged');
my $slow = $node->safe_psql('postgres', "SELECT state ->> 'queue_id' FROM pepsi.workqueue");
($rc, $out) = pepsi_queue($config, 'list');
like($out, qr/^\d+\s+\Q$slow\E\s+.*slow\@remote\.test/m, 'pepsi-queue list shows the deferred message\'s queue id');
stop_dispatcher($d);
stop_process($ingress);
stop_process($peer);
like(slurp("$tmp/dispatch-2.log"), qr/^\Q$syslog_name\E\/lmtp\[\d+\]: \S+: to=<bob\@local\.test>, .*status=sent/m,
	'the LMTP delivery under the lmtp tag');
like(slurp("$tmp/dispatch-2.log"), qr/^\Q$syslog_name\E\/bounce\[\d+\]: \Q$gone\E: sender non-delivery notification: (\S+) /m,
	'the bounce stage names the DSN\'s own queue id, as Postfix\'s bounce daemon does');

#
# pflogsumm on the whole log, each line as a syslog daemon writes it.
#
my $prefix = POSIX::strftime('%b %e %H:%M:%S', localtime) . ' mx ';
my $syslog = '';
for my $log (map { "$tmp/$_.log" } qw(ingress-1 sendmail-1 dispatch-1 ingress-2 dispatch-2))
{
	$syslog .= join('', map { "$prefix$_\n" } split /\n/, slurp($log));
}
PostgreSQL::Test::Utils::append_to_file("$tmp/maillog", $syslog);
my $err = '';
$out = '';
IPC::Run::run([ $pflogsumm, "--syslog-name=$syslog_name", "$tmp/maillog" ], '>', \$out, '2>', \$err);
is($? >> 8, 0, 'pflogsumm reads the log') or diag $err;
my %count = map { /^\s*(\d+)\s+(received|delivered|deferred|bounced|rejected)\b/ ? ($2 => $1) : () } split /\n/, $out;
# Received: the six sent with swaks and the one handed to pepsi-sendmail
# (the DSN is made, not received, as in Postfix).  Delivered, one count
# per recipient: alice, carol, dave, alice and erin of the split message,
# frank's from pepsi-sendmail, bob over LMTP, and the DSN to
# sender@local.test.
# Rejected: the relay refused at RCPT.
is_deeply(\%count, { received => 7, delivered => 8, deferred => 1, bounced => 1, rejected => 1 },
	'pflogsumm counts 7 received (one by pickup), 8 delivered, 1 deferred, 1 bounced, 1 rejected')
  or diag $out;
like($out, qr/message reject detail\n-+\n\s+RCPT\n\s+Relay access denied .*\(total: 1\)\n\s+1\s+127\.0\.0\.1/,
	'... and its reject report names the command, the reason and the client') or diag $out;

#
# A bad SYSLOG_NAME is refused, naming the option.
#
$config = delivery_config($node, maildir_root => $root, pepsi => { SYSLOG_NAME => 'pepsi/mx' });
$d = start_dispatcher($config, log => "$tmp/bad.log");
isnt(dispatcher_exit($d, 20), 0, 'a SYSLOG_NAME with a "/" stops the dispatcher');
like(slurp("$tmp/bad.log"), qr/\[pepsi\] SYSLOG_NAME = pepsi\/mx: SYSLOG_NAME is a name: 1 to 64 letters, digits/,
	'... saying which option and why');

done_testing();
