# Before-queue milters: a listener's MILTERS makes pepsi-ingress show the
# transaction to its filters at the end of DATA and answer their verdict
# in the session, as Postfix's smtpd_milters.  Real filters: the scripted
# python3-milter filter (t/bin/scripted-milter), t/bin/bad-milter for a
# filter that answers garbage, and rspamd's milter proxy for GTUBE.
#
# A reject is the client's 5xx and nothing is stored; a tempfail is 451;
# a discard is 250 and nothing is stored; a quarantine stores the row
# held; header, body and recipient edits are in the stored row.  A filter
# that hangs or answers garbage is answered per default_action within its
# timeout, while another client's session goes on meanwhile: the event
# loop does not wait for a filter.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IO::Select;
use IO::Socket::INET;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiTest;
use SmtpClient;

my $db = 'postgres';
my $here = dirname(__FILE__);
my $bin = ($ENV{PEPSI_BIN} // "$here/../build/bin") . '/pepsi-ingress';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $json = JSON::PP->new->canonical;

my $node = pepsi_node('ingress_milter', extension => 1);

sub write_file
{
	my ($path, $text) = @_;
	open my $fh, '>', $path or die "cannot write $path: $!";
	print $fh $text;
	close $fh;
}

# rspamd's milter proxy, self-scanning, with a configuration of its own:
# no rules but its core, where GTUBE is caught, and a list of four public
# suffixes instead of Debian's 9,600 (compiling those takes a loaded
# machine a minute and more).  Started first, not waited for until its
# part at the end.
my $rdir = "$tmp/rspamd";
mkdir $rdir;
mkdir "$rdir/$_" for qw(db run log);
my $rspamd_port = PostgreSQL::Test::Cluster::get_free_port();
write_file("$rdir/tld.dat", "org\nnet\ncom\ntest\n");
write_file("$rdir/rspamd.conf", <<"CONF");
options {
  pidfile = "$rdir/run/rspamd.pid";
  dns { nameserver = ["127.0.0.1:1"]; timeout = 0.2s; retransmits = 1; }
  disable_hyperscan = true;
  url_tld = "$rdir/tld.dat";
}
logging { type = "console"; level = "info"; }
worker "rspamd_proxy" {
  bind_socket = "127.0.0.1:$rspamd_port";
  milter = yes;
  timeout = 120s;
  count = 1;
  upstream "local" { default = yes; self_scan = yes; }
}
CONF
my @rspamd = ('/usr/bin/rspamd', '-f', '-c', "$rdir/rspamd.conf", "--var=DBDIR=$rdir/db",
	"--var=RUNDIR=$rdir/run", "--var=LOGDIR=$rdir/log");
my $rspamd_pid = fork // die "fork: $!";
if ($rspamd_pid == 0)
{
	open STDOUT, '>>', "$rdir/rspamd.out";
	open STDERR, '>&', \*STDOUT;
	exec @rspamd or die "exec: $!";
}

my $scripted_log = "$tmp/scripted.jsonl";
my $scripted = start_server('scripted-milter',
	sub { ('/usr/bin/python3', "$here/bin/scripted-milter", $_[0], $scripted_log) })->{port};
# The filter the hanging listeners ask, apart: another instance of the scripted filter.
my $hanger = start_server('scripted-milter',
	sub { ('/usr/bin/python3', "$here/bin/scripted-milter", $_[0], "$tmp/hanger.jsonl") })->{port};
# A third instance refuses every client at CONNECT.
my $gatekeeper = start_server('scripted-milter',
	sub { ('/usr/bin/python3', "$here/bin/scripted-milter", $_[0], "$tmp/gatekeeper.jsonl", 'reject-connect') })
  ->{port};
my $bad = start_server('bad-milter',
	sub { ('/usr/bin/python3', "$here/bin/bad-milter", $_[0], "$tmp/bad.log", 'malformed') })->{port};
my $closing = start_server('bad-milter',
	sub { ('/usr/bin/python3', "$here/bin/bad-milter", $_[0], "$tmp/closing.log", 'close-mid') })->{port};

my %port = map { $_ => PostgreSQL::Test::Cluster::get_free_port() }
  qw(mx plain connect_reject hang_accept hang_tempfail garbage_accept garbage_tempfail closing rspamd);
my $conf = "$tmp/pepsi.conf";
my $listener = sub {
	my ($name, $milters) = @_;
	return "[listener-$name]\nADDRESS = 127.0.0.1\nPORT = $port{$name}\nMIN_DATA_RATE = 0\n"
	  . ($milters ? "MILTERS = $milters\n" : '');
};
write_file($conf, <<"CONF"
[pepsi]
HOSTNAME = mx.test
LOCAL_DOMAINS = example.org
[database]
CONNINFO = host=@{[ $node->host ]} port=@{[ $node->port ]} dbname=$db
[ingress]
DISPATCH_WAKE_INTERVAL = 20ms
TRUSTED_NETWORKS = 127.0.0.0/8
CONF
	  . $listener->('mx', "inet:127.0.0.1:$scripted")
	  . $listener->('plain')
	  . $listener->('connect_reject', "inet:127.0.0.1:$gatekeeper")
	  . $listener->('hang_accept', "{ inet:127.0.0.1:$hanger, final_timeout=4s, default_action=accept }")
	  . $listener->('hang_tempfail', "{ inet:127.0.0.1:$hanger, final_timeout = 4s }")
	  . $listener->('garbage_accept', "{ inet:127.0.0.1:$bad, default_action=accept }")
	  . $listener->('garbage_tempfail', "inet:127.0.0.1:$bad")
	  . $listener->('closing', "{ inet:127.0.0.1:$closing, default_action=tempfail }")
	  . $listener->('rspamd', "inet:127.0.0.1:$rspamd_port"));

my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ $bin, '-c', $conf ], '<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection 0 ready/), 'ingress starts with listeners that have MILTERS')
  or diag slurp($log);

sub rows { return $node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue'); }

# The stored row of a queue id ("250 2.0.0 Ok: queued as ID").
sub row_of
{
	my ($reply) = @_;
	my ($id) = $reply =~ /queued as (\S+)/ or return undef;
	my $row = $node->safe_psql($db,
		"SELECT row_to_json(r) FROM (SELECT w.status, w.timeout, w.rcpt_to, w.mail_from, w.state,"
		  . " convert_from(w.headers, 'UTF8') AS headers, convert_from(b.body, 'UTF8') AS body"
		  . " FROM pepsi.workqueue w JOIN pepsi.workqueue_body b ON b.id = w.body_id"
		  . " WHERE w.state ->> 'queue_id' = '$id') r");
	return $row ? $json->decode($row) : undef;
}

# A transaction up to its content, not yet ended; or the first refusal
# of MAIL, RCPT or DATA, the filters answering each at its step.
sub open_data
{
	my ($name, %m) = @_;
	my $c = SmtpClient->new($port{$name});

	$c->command('EHLO client.test');
	for my $command ('MAIL FROM:<' . ($m{from} // 'sender@client.test') . '>',
		(map { "RCPT TO:<$_>" } @{ $m{rcpt} // ['alice@example.org'] }), 'DATA')
	{
		my $reply = $c->command($command);
		next if $reply =~ /^[23]/;
		$c->{refused} = $reply;
		return $c;
	}
	$c->send("From: <sender\@client.test>\r\nTo: <alice\@example.org>\r\nSubject: $m{subject}\r\n"
		  . "X-Remove: going\r\n\r\n" . ($m{body} // "Hello.\r\n") . ".\r\n");
	return $c;
}

# A whole transaction; the reply to its content, or the refusal before it.
sub transaction
{
	my $c = open_data(@_);
	my $reply = $c->{refused} // $c->reply(30);

	$c->close;
	return $reply;
}

#
# Verdicts answered in the session.
#
my $before = rows();
like(transaction('mx', subject => 'hello', from => 'reject-me@client.test'),
	qr/^550 5\.7\.1 sender reject-me\@client\.test refused by the scripted filter/,
	'a filter rejecting the sender: the client hears 550 with its text');
like(transaction('mx', subject => 'please reject'), qr/^554 5\.7\.1 rejected by the scripted filter/,
	'a filter rejecting the content at end of message: its 5xx');
like(transaction('mx', subject => 'please tempfail'), qr/^451 4\.7\.1 try again later, says the scripted filter/,
	'a filter tempfailing: 451 with its text');
like(transaction('mx', subject => 'please discard'), qr/^250 /, 'a discard: the client hears 250');
is(rows(), $before, 'nothing of the rejected, tempfailed or discarded messages is stored');
ok(file_shows($log, qr/milter-reject: END-OF-MESSAGE from unknown\[127\.0\.0\.1\]: 554 5\.7\.1 rejected by the scripted filter;/),
	'the refusal is logged as Postfix logs a milter-reject');
like(transaction('mx', subject => 'hello', rcpt => [ 'reject-bob@example.org' ]),
	qr/^550 5\.1\.1 no such user reject-bob\@example\.org/, 'a recipient refused at RCPT: its reply');
is(rows(), $before, 'and nothing is stored');

#
# Each step answered at its own SMTP step, as Postfix's smtpd_milters:
# a sender refused at MAIL, one recipient refused at its RCPT while the
# other is taken and stored, a client refused at CONNECT answered at its
# MAIL (Postfix answers HELO and EHLO with 250 whatever a filter said at
# CONNECT or HELO, but for 421, and the filter's reply to every MAIL).
#
{
	my $c = SmtpClient->new($port{mx});
	$c->command('EHLO client.test');
	like($c->command('MAIL FROM:<reject-early@client.test>'),
		qr/^550 5\.7\.1 sender reject-early\@client\.test refused by the scripted filter/,
		'a filter rejecting the sender: answered to MAIL, before DATA');
	like($c->command('RCPT TO:<alice@example.org>'), qr/^503 /, '... and no transaction was started');
	like($c->command('MAIL FROM:<sender@client.test>'), qr/^250 /, 'another sender in the session is taken');
	like($c->command('RCPT TO:<reject-dave@example.org>'), qr/^550 5\.1\.1 no such user reject-dave\@example\.org/,
		'a filter rejecting one recipient: answered to its RCPT');
	like($c->command('RCPT TO:<alice@example.org>'), qr/^250 /, '... another recipient is taken');
	like($c->command('DATA'), qr/^354 /, '... and the transaction goes on to DATA');
	$c->send("From: <sender\@client.test>\r\nTo: <alice\@example.org>\r\nSubject: steps\r\n\r\nHi.\r\n.\r\n");
	my $stored = $c->reply(30);
	like($stored, qr/^250 /, '... and its message is taken');
	$c->command('QUIT');
	$c->close;
	my $r = row_of($stored);
	is_deeply($r ? $r->{rcpt_to} : undef, ['alice@example.org'], 'stored for the taken recipient only')
	  or diag $stored;
	# The filter's record of the message (written at its end of message).
	my ($seen) = grep { ($_->{subject} // '') eq 'steps' } map { $json->decode($_) } split /\n/,
	  slurp($scripted_log);
	is_deeply($seen ? $seen->{rcpts} : undef, ['alice@example.org'],
		'the filter was told of the message for the taken recipient');
	is($seen ? $seen->{message_in_connection} : undef, 2,
		'one filter connection for the session: the refused MAIL, SMFIC_ABORT, then this transaction');

	$c = SmtpClient->new($port{connect_reject});
	like($c->command('EHLO client.test'), qr/^250[ -]/, 'a filter rejecting at CONNECT: EHLO still 250, as Postfix');
	like($c->command('MAIL FROM:<sender@client.test>'),
		qr/^550 5\.7\.1 client 127\.0\.0\.1 refused at connect by the scripted filter/,
		'... and its refusal answered to MAIL');
	like($c->command('RCPT TO:<alice@example.org>'), qr/^503 /, '... so no transaction starts');
	like($c->command('MAIL FROM:<other@client.test>'), qr/^550 5\.7\.1 client 127\.0\.0\.1 refused at connect/,
		'... and to every MAIL after it');
	$c->close;
}

#
# Edits and quarantine reach the stored row.
#
my $reply = transaction('mx', subject => 'edit-headers add-rcpt del-rcpt replace-body',
	rcpt => [ 'alice@example.org', 'carol@example.org' ]);
like($reply, qr/^250 /, 'a message the filter edits is taken');
my $row = row_of($reply);
ok($row, 'and stored') or diag $reply;
like($row->{headers}, qr/^X-First: inserted at the top\r$/m, 'an inserted header is in the stored row');
like($row->{headers}, qr/^X-Scripted: added at the end\r$/m, 'an added header too');
like($row->{headers}, qr/^Subject: edited subject\r$/m, 'a changed header is changed');
unlike($row->{headers}, qr/^X-Remove:/m, 'a header changed to nothing is gone');
is($row->{body}, "This body was replaced by the filter.\r\n", 'the replaced body is stored');
is_deeply([ sort @{ $row->{rcpt_to} } ], [ 'added@example.org', 'carol@example.org' ],
	'recipients: the deleted one out, the added one in') or diag explain $row->{rcpt_to};
is($row->{status}, 'pending', 'the edited message waits for its first stage');

$reply = transaction('mx', subject => 'quarantine');
like($reply, qr/^250 /, 'a quarantined message is taken');
$row = row_of($reply);
is($row->{status}, 'paused', 'and stored held') or diag explain $row;
like($row->{timeout} // '', qr/infinity/, '... until the operator releases it (pepsi.queue_hold\'s hold)');
is($row->{state}{milter}{quarantine}, 'held by the scripted filter', 'the reason is in state.milter');

$reply = transaction('plain', subject => 'please reject');
like($reply, qr/^250 /, 'a listener without MILTERS asks no filter');

#
# A filter that hangs (never answers end of message) and one that answers
# garbage: answered per default_action within final_timeout, while a
# second client's session on the same listener goes on meanwhile.
#
$before = rows();
my $hang_accept = open_data('hang_accept', subject => 'never-answer');
my $hang_tempfail = open_data('hang_tempfail', subject => 'never-answer');
my $other = transaction('mx', subject => 'meanwhile');
like($other, qr/^250 /, 'meanwhile another client\'s transaction is filtered and taken');
ok(!IO::Select->new($hang_accept->{socket})->can_read(0)
	  && !IO::Select->new($hang_tempfail->{socket})->can_read(0),
	'... before the hanging filters were answered: the event loop did not wait for them');
like($hang_accept->reply(30), qr/^250 /, 'a hanging filter, default_action=accept: 250 after final_timeout');
like($hang_tempfail->reply(30), qr/^451 4\.7\.1 /, 'a hanging filter, default_action tempfail: 451');
$hang_accept->close;
$hang_tempfail->close;
is(rows(), $before + 2, 'the other message and the fail-open one are stored, the tempfailed one is not');
ok(file_shows($log, qr/milter inet:127\.0\.0\.1:$hanger unavailable \(no answer within the timeout/),
	'the hanging filter is logged as unavailable');

$before = rows();
like(transaction('garbage_accept', subject => 'hello'), qr/^250 /,
	'a filter answering garbage, default_action=accept: 250');
like(transaction('garbage_tempfail', subject => 'hello'), qr/^451 4\.7\.1 /,
	'a filter answering garbage, default_action tempfail: 451');
like(transaction('closing', subject => 'hello'), qr/^451 4\.7\.1 /,
	'a filter closing the connection mid-message, default_action=tempfail: 451');
is(rows(), $before + 1, 'only the fail-open message is stored');
ok(file_shows($log, qr/milter inet:127\.0\.0\.1:$closing unavailable \(the filter closed the connection/),
	'the closing filter is logged as unavailable, saying so');

#
# rspamd refuses GTUBE before the queue.
#
ok(poll_until(sub {
			my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$rspamd_port", Timeout => 1);
			$s->close if $s;
			return $s;
		}, 300), 'rspamd listens');
$before = rows();
$reply = transaction('rspamd', subject => 'test',
	body => "XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X\r\n");
like($reply, qr/^5\d\d .*gtube/i, 'rspamd: GTUBE is refused in the session, with rspamd\'s reply') or diag $reply;
is(rows(), $before, 'and not stored');
like(transaction('rspamd', subject => 'lunch on friday', body => "Shall we meet for lunch at noon?\r\n"),
	qr/^250 /, 'rspamd: a clean message is taken');

#
# A reload (SIGHUP) gives a listener its MILTERS, for new transactions,
# and a MILTERS that does not parse is refused, naming it.
#
my $text = slurp($conf);
(my $broken = $text) =~ s/(\[listener-plain\]\n)/$1MILTERS = { inet:127.0.0.1:$scripted, final_timeout=soon }\n/;
write_file($conf, $broken);
$ingress->signal('HUP');
ok(file_shows($log, qr/reload refused: .*\[listener-plain\] MILTERS: final_timeout=soon for inet:127\.0\.0\.1:$scripted: /),
	'a reload with a MILTERS that does not parse is refused, naming the setting');
like(transaction('plain', subject => 'please reject'), qr/^250 /, '... and the listener goes on without filters');
(my $reloaded = $text) =~ s/(\[listener-plain\]\n)/$1MILTERS = inet:127.0.0.1:$scripted\n/;
write_file($conf, $reloaded);
$ingress->signal('HUP');
ok(file_shows($log, qr/reloaded .*pepsi\.conf/), 'a reload giving a listener MILTERS is taken');
like(transaction('plain', subject => 'please reject'), qr/^554 5\.7\.1 rejected by the scripted filter/,
	'... and its filter answers the next transaction');

kill 'TERM', $rspamd_pid;
waitpid($rspamd_pid, 0);
$ingress->signal('TERM');
$ingress->finish;
done_testing();
