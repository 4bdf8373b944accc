# The Sender Rewriting Scheme against Mail::SRS (libmail-srs-perl), the
# reference implementation whose format libsrs2 and postsrsd share: what
# pepsi-stage-srs writes, Mail::SRS reverses with the same secret, and what
# Mail::SRS writes (SRS0, SRS1, with a rotated-out secret), pepsi-ingress
# reverses at RCPT and relays to the original sender, even for a client
# that may not relay, but only for a bounce (MAIL FROM:<>).  A forged,
# expired or malformed SRS address is refused at RCPT with 550 5.1.1 and
# nothing is stored; so is a hash shorter than HASH_LENGTH (8 at least:
# about 40 bits, SRS comparing hashes without case), and an SRS1 address
# whose SRS0 part does not check.  A client's SRS failures are throttled
# like its failed AUTH: the SRS_FAILURE_LIMIT-th closes its session, and
# its SRS addresses get 450 until SRS_FAILURE_WINDOW passes.

use strict;
use warnings FATAL => 'all';

use File::Basename qw(dirname);
use IPC::Run;
use Mail::SRS;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use PepsiStage;
use PepsiTest;
use SmtpClient;

my $node = stage_node('srs');
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $db = 'postgres';
my $srs_domain = 'srs.example.org';

# Two secrets: the first signs, both verify (a rotation in progress).
PostgreSQL::Test::Utils::append_to_file("$tmp/secrets", "# rotated 2026-12-01\nnew-secret\nold-secret\n");
chmod 0600, "$tmp/secrets";
my $ours = Mail::SRS->new(Secret => [ 'new-secret', 'old-secret' ], MaxAge => 21, HashLength => 8);
my $old_only = Mail::SRS->new(Secret => ['old-secret'], HashLength => 8);
my $stranger = Mail::SRS->new(Secret => ['someone-elses-secret']);
# Mail::SRS's default of 4 characters (24 bits, fewer without case): too short now.
my $short = Mail::SRS->new(Secret => ['new-secret']);

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf_text = <<"INI";
[pepsi]
HOSTNAME = mx.example.org
LOCAL_DOMAINS = example.org

[srs]
DOMAIN = $srs_domain
SECRET_FILE = $tmp/secrets

[ingress]
DISPATCH_WAKE_INTERVAL = 20ms
DATABASE_CONNECTIONS = 1
TRUSTED_NETWORKS = none
SRS_FAILURE_LIMIT = 100

[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
MAX_ERRORS = 100

[stage-srs]
PROGRAM = pepsi-stage-srs
NEXT_STAGE = sign
INI
my $conf = stage_config($node, 'srs.conf', $conf_text);

#
# The forward rewrite, reversed by Mail::SRS.
#
my %row = (
	remote => add_row($node, 'srs', from => 'alice@remote.example'),
	local => add_row($node, 'srs', from => 'bob@example.org'),
	null => add_row($node, 'srs', from => ''),
	srs0 => add_row($node, 'srs', from => $stranger->forward('carol@orig.example', 'hop1.example')),
	srs1 => add_row($node, 'srs',
		from => $stranger->forward($stranger->forward('dave@orig.example', 'hop1.example'), 'hop2.example')),
);
my $r = run_worker(worker_cmd('pepsi-stage-srs', $conf), join('', map { "$row{$_}\n" } sort keys %row));
is_deeply($r->{status}, [ ('0') x 5 ], 'the stage rewrites five senders') or diag($r->{stderr});

my $remote = row_json($node, $row{remote});
like($remote->{mail_from}, qr/^SRS0=[A-Za-z0-9+\/]{8}=[A-Z2-7]{2}=remote\.example=alice\@\Q$srs_domain\E$/,
	'a remote sender becomes SRS0=hash=time=domain=local@SRS-DOMAIN, 8 characters of hash by default');
is($ours->reverse($remote->{mail_from}), 'alice@remote.example', 'Mail::SRS reverses it with the same secret');
ok(!eval { $old_only->reverse($remote->{mail_from}); 1 }, 'it is signed with the first secret, not the old one');
is($remote->{state}{srs}{original_sender}, 'alice@remote.example', 'the original sender is kept in state.srs');
is($remote->{stage}, 'sign', 'and the message goes on to NEXT_STAGE');

is(row_json($node, $row{local})->{mail_from}, 'bob@example.org', 'a sender of a local domain keeps its address');
is(row_json($node, $row{null})->{mail_from}, '', 'the null sender stays null');

my $srs1 = row_json($node, $row{srs0})->{mail_from};
like($srs1, qr/^SRS1=[A-Za-z0-9+\/]{8}=hop1\.example==[A-Za-z0-9+\/]{4}=[A-Z2-7]{2}=orig\.example=carol\@\Q$srs_domain\E$/,
	'another forwarder\'s SRS0 address is wrapped in SRS1');
is($ours->reverse($srs1), $stranger->forward('carol@orig.example', 'hop1.example'),
	'Mail::SRS reverses our SRS1 to the first forwarder\'s SRS0 address');
my $srs1_again = row_json($node, $row{srs1})->{mail_from};
like($srs1_again, qr/^SRS1=[A-Za-z0-9+\/]{8}=hop1\.example==/, 'an SRS1 address keeps its first hop');
is($ours->reverse($srs1_again), $stranger->forward('dave@orig.example', 'hop1.example'),
	'and Mail::SRS reverses the re-signed SRS1 too');

#
# The reverse path at RCPT, for a client that may not relay.
#
my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ ($ENV{PEPSI_BIN} // 'build/bin') . '/pepsi-ingress', '-c', $conf ],
	'<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection \d+ ready/), 'ingress starts');

# RCPT TO:<address> in a bounce (or from opts{sender}), from opts{client}.
sub rcpt
{
	my ($address, %opts) = @_;
	my $c = SmtpClient->new($port, from => $opts{client} // '127.0.0.1');

	$c->command('EHLO bouncer.test');
	$c->command('MAIL FROM:<' . ($opts{sender} // '') . '>');
	my $reply = $c->command("RCPT TO:<$address>");
	my $data = '';
	if ($reply =~ /^250/)
	{
		$c->command('DATA');
		$data = $c->command("From: MAILER-DAEMON\@bouncer.test\r\nSubject: bounce\r\n\r\nbounced\r\n.");
	}
	$c->close;
	return ($reply, $data);
}

sub rows { return $node->safe_psql($db, 'SELECT count(*) FROM pepsi.workqueue') }

my ($reply) = rcpt('someone@gmail.example');
like($reply, qr/^554 5\.7\.1/, 'this client may not relay to other domains');

my ($ok, $data) = rcpt($ours->forward('erin@far.example', $srs_domain));
like($ok, qr/^250 2\.1\.5/, 'a Mail::SRS SRS0 address of our domain is taken at RCPT');
my $id = queued_row($node, $data);
ok($id, 'and the bounce is queued');
is($node->safe_psql($db, "SELECT array_to_string(rcpt_to, ',') FROM pepsi.workqueue WHERE id = " . ($id // 0)),
	'erin@far.example', 'its recipient is the original sender');

($ok, $data) = rcpt($old_only->forward('frank@far.example', $srs_domain));
like($ok, qr/^250/, 'an address signed with the older secret still reverses');
$id = queued_row($node, $data);
is($node->safe_psql($db, "SELECT rcpt_to[1] FROM pepsi.workqueue WHERE id = " . ($id // 0)),
	'frank@far.example', 'to its original sender');

my $ours_srs1 = $ours->forward($stranger->forward('gina@orig.example', 'hop1.example'), $srs_domain);
($ok, $data) = rcpt($ours_srs1);
$id = queued_row($node, $data);
like($node->safe_psql($db, "SELECT rcpt_to[1] FROM pepsi.workqueue WHERE id = " . ($id // 0)),
	qr/^SRS0=[^@]+=orig\.example=gina\@hop1\.example$/, 'an SRS1 address goes back to the first forwarder');

my $before = rows();
my $good = $ours->forward('hank@far.example', $srs_domain);
(my $forged = $good) =~ s/^SRS0=(....)/'SRS0=' . ($1 eq 'AAAA' ? 'BBBB' : 'AAAA')/e;
($reply) = rcpt($forged);
like($reply, qr/^550 5\.1\.1 .*invalid or expired SRS address/, 'a forged hash: 550 5.1.1');
($reply) = rcpt($stranger->forward('ivy@far.example', $srs_domain));
like($reply, qr/^550 5\.1\.1/, 'another secret\'s address: 550 5.1.1');

# Thirty days ago, hashed with our secret: expired after MAX_AGE (21).
my $day = int(time() / 86400) - 30;
my $ts = join('', map { ('A' .. 'Z', '2' .. '7')[$_] } (($day >> 5) & 31, $day & 31));
my $hash = $ours->hash_create($ts, 'far.example', 'jack');
($reply) = rcpt("SRS0=$hash=$ts=far.example=jack\@$srs_domain");
like($reply, qr/^550 5\.1\.1/, 'an expired address (30 days, MAX_AGE 21): 550 5.1.1');
$day += 25;
$ts = join('', map { ('A' .. 'Z', '2' .. '7')[$_] } (($day >> 5) & 31, $day & 31));
$hash = $ours->hash_create($ts, 'far.example', 'jack');
($reply) = rcpt("SRS0=$hash=$ts=far.example=jack\@$srs_domain");
like($reply, qr/^250/, 'the same five days old: taken');
$before = rows();
($reply) = rcpt("SRS0=garbage\@$srs_domain");
like($reply, qr/^550 5\.1\.1/, 'a malformed SRS address: 550 5.1.1');
is(rows(), $before, 'nothing stored for the refused ones');
ok(file_shows($log, qr/refused RCPT <SRS0=garbage\@\Q$srs_domain\E>: malformed SRS address/),
	'the refusal is logged with the reason');

# Guessing: a hash of Mail::SRS's default 4 characters, and the first 4
# of a good 8, are refused (HASH_LENGTH 8 by default).
($reply) = rcpt($short->forward('kim@far.example', $srs_domain));
like($reply, qr/^550 5\.1\.1/, 'a 4-character hash with our secret: 550 5.1.1');
my $good8 = $ours->forward('kim@far.example', $srs_domain);
(my $prefix = $good8) =~ s/^SRS0=(....)..../SRS0=$1/;
($reply) = rcpt($prefix);
like($reply, qr/^550 5\.1\.1/, 'the first 4 characters of a good hash: 550 5.1.1');
(my $smashed = $good8) =~ s/^SRS0=([^=]+)/'SRS0=' . lc($1)/e;
($reply) = rcpt($smashed);
like($reply, qr/^250/, 'a good hash whose case a mail system smashed still reverses');
$before = rows();

# Only a bounce is relayed back: a good address with a sender is refused.
($reply) = rcpt($good8, sender => 'spammer@far.example');
like($reply, qr/^550 5\.7\.1 .*only bounces \(MAIL FROM:<>\)/,
	'a good SRS address with a non-null sender: 550 5.7.1, only bounces');

# An SRS1 address is reversed only when the SRS0 part inside it checks.
my $fresh_ts = join('', map { ('A' .. 'Z', '2' .. '7')[$_] } ((int(time() / 86400) >> 5) & 31, int(time() / 86400) & 31));
my $old_ts = join('', map { ('A' .. 'Z', '2' .. '7')[$_] } (((int(time() / 86400) - 30) >> 5) & 31, (int(time() / 86400) - 30) & 31));
sub srs1_of
{
	my ($inner) = @_;
	return 'SRS1=' . $ours->hash_create('hop1.example', $inner) . "=hop1.example=$inner\@$srs_domain";
}
($reply) = rcpt(srs1_of("=AbCd=$fresh_ts=orig.example=lena"));
like($reply, qr/^250/, 'an SRS1 address whose SRS0 part checks: taken');
$before = rows();
($reply) = rcpt(srs1_of("=AbCd=$old_ts=orig.example=lena"));
like($reply, qr/^550 5\.1\.1/, 'an SRS1 address around an expired SRS0 part: 550 5.1.1');
($reply) = rcpt(srs1_of('=garbage'));
like($reply, qr/^550 5\.1\.1/, 'an SRS1 address around a malformed SRS0 part: 550 5.1.1');
is(rows(), $before, 'nothing stored for the refused ones');
ok(file_shows($log, qr/refused RCPT <SRS1=[^>]+>: malformed SRS address/),
	'the SRS1 refusal is logged');

$ingress->signal('TERM');
$ingress->finish;

#
# SRS failures throttled per client: SRS_FAILURE_LIMIT = 3.
#
(my $throttled = $conf_text) =~ s/SRS_FAILURE_LIMIT = 100/SRS_FAILURE_LIMIT = 3\nSRS_FAILURE_WINDOW = 1h/;
my $conf2 = stage_config($node, 'srs_throttle.conf', $throttled);
$log = "$tmp/ingress2.log";
$ingress = IPC::Run::start([ ($ENV{PEPSI_BIN} // 'build/bin') . '/pepsi-ingress', '-c', $conf2 ],
	'<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection \d+ ready/), 'ingress starts with SRS_FAILURE_LIMIT = 3');
{
	my $c = SmtpClient->new($port, from => '127.0.0.7');
	$c->command('EHLO guesser.test');
	$c->command('MAIL FROM:<>');
	like($c->command("RCPT TO:<$forged>"), qr/^550 5\.1\.1/, 'a first guess: 550');
	like($c->command("RCPT TO:<$forged>"), qr/^550 5\.1\.1/, 'a second: 550');
	like($c->command("RCPT TO:<$forged>"), qr/^421 4\.7\.0 .*SRS/, 'the third closes the session: 421');
	is($c->reply(5), '', 'and the connection is closed');
}
($reply) = rcpt($good8, client => '127.0.0.7');
like($reply, qr/^450 4\.7\.1 .*SRS/, 'that client\'s next SRS address, even a good one, gets 450');
($reply) = rcpt('someone@example.org', client => '127.0.0.7');
like($reply, qr/^250/, 'its mail to other addresses is taken as before');
($reply) = rcpt($good8, client => '127.0.0.8');
like($reply, qr/^250/, 'another client\'s good SRS address is taken');
ok(file_shows($log, qr/127\.0\.0\.7: refused RCPT .*\(3 invalid SRS addresses from 127\.0\.0\.7, SRS_FAILURE_LIMIT 3: closing/),
	'the log names the limit and the option');
$ingress->signal('TERM');
$ingress->finish;

#
# A secret file others can read is refused at start.
#
chmod 0644, "$tmp/secrets";
$r = run_worker(worker_cmd('pepsi-stage-srs', $conf), "$row{remote}\n");
isnt($r->{exit}, 0, 'a secret file readable by others: the worker refuses to start');
like($r->{stderr}, qr/SECRET_FILE \S+secrets must be a regular file of mode 0600 or 0400/, 'and says why');
chmod 0600, "$tmp/secrets";

#
# HASH_LENGTH below 8 is refused, naming the option and the minimum.
#
(my $short_text = $conf_text) =~ s/^(SECRET_FILE = .*)$/$1\nHASH_LENGTH = 4/m;
my $short_conf = stage_config($node, 'srs_short.conf', $short_text);
$r = run_worker(worker_cmd('pepsi-stage-srs', $short_conf), "$row{remote}\n");
isnt($r->{exit}, 0, 'HASH_LENGTH = 4: the worker refuses to start');
like($r->{stderr}, qr/HASH_LENGTH is a whole number from 8 to 27/, 'naming the option and the minimum');
my $out = '';
IPC::Run::run([ ($ENV{PEPSI_BIN} // 'build/bin') . '/pepsi-ingress', '-c', $short_conf ],
	'<', \undef, '>&', \$out, IPC::Run::timeout(30));
isnt($? >> 8, 0, 'and so does pepsi-ingress');
like($out, qr/HASH_LENGTH is a whole number from 8 to 27/, 'with the same words');

done_testing();
