# The Sender Rewriting Scheme against Mail::SRS (libmail-srs-perl), the
# reference implementation whose format libsrs2 and postsrsd share: what
# pepsi-stage-srs writes, Mail::SRS reverses with the same secret, and what
# Mail::SRS writes (SRS0, SRS1, with a rotated-out secret), pepsi-ingress
# reverses at RCPT and relays to the original sender, even for a client
# that may not relay.  A forged, expired or malformed SRS address is
# refused at RCPT with 550 5.1.1 and nothing is stored.

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
my $ours = Mail::SRS->new(Secret => [ 'new-secret', 'old-secret' ], MaxAge => 21);
my $old_only = Mail::SRS->new(Secret => ['old-secret']);
my $stranger = Mail::SRS->new(Secret => ['someone-elses-secret']);

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $conf = stage_config($node, 'srs.conf', <<"INI");
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

[listener-smtp]
ADDRESS = 127.0.0.1
PORT = $port
MAX_ERRORS = 100

[stage-srs]
PROGRAM = pepsi-stage-srs
NEXT_STAGE = sign
INI

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
like($remote->{mail_from}, qr/^SRS0=[A-Za-z0-9+\/]{4}=[A-Z2-7]{2}=remote\.example=alice\@\Q$srs_domain\E$/,
	'a remote sender becomes SRS0=hash=time=domain=local@SRS-DOMAIN');
is($ours->reverse($remote->{mail_from}), 'alice@remote.example', 'Mail::SRS reverses it with the same secret');
ok(!eval { $old_only->reverse($remote->{mail_from}); 1 }, 'it is signed with the first secret, not the old one');
is($remote->{state}{srs}{original_sender}, 'alice@remote.example', 'the original sender is kept in state.srs');
is($remote->{stage}, 'sign', 'and the message goes on to NEXT_STAGE');

is(row_json($node, $row{local})->{mail_from}, 'bob@example.org', 'a sender of a local domain keeps its address');
is(row_json($node, $row{null})->{mail_from}, '', 'the null sender stays null');

my $srs1 = row_json($node, $row{srs0})->{mail_from};
like($srs1, qr/^SRS1=[A-Za-z0-9+\/]{4}=hop1\.example==[A-Za-z0-9+\/]{4}=[A-Z2-7]{2}=orig\.example=carol\@\Q$srs_domain\E$/,
	'another forwarder\'s SRS0 address is wrapped in SRS1');
is($ours->reverse($srs1), $stranger->forward('carol@orig.example', 'hop1.example'),
	'Mail::SRS reverses our SRS1 to the first forwarder\'s SRS0 address');
my $srs1_again = row_json($node, $row{srs1})->{mail_from};
like($srs1_again, qr/^SRS1=[A-Za-z0-9+\/]{4}=hop1\.example==/, 'an SRS1 address keeps its first hop');
is($ours->reverse($srs1_again), $stranger->forward('dave@orig.example', 'hop1.example'),
	'and Mail::SRS reverses the re-signed SRS1 too');

#
# The reverse path at RCPT, for a client that may not relay.
#
my $log = "$tmp/ingress.log";
my $ingress = IPC::Run::start([ ($ENV{PEPSI_BIN} // 'build/bin') . '/pepsi-ingress', '-c', $conf ],
	'<', \undef, '>', $log, '2>', $log);
ok(file_shows($log, qr/database connection \d+ ready/), 'ingress starts');

sub rcpt
{
	my ($address) = @_;
	my $c = SmtpClient->new($port);

	$c->command('EHLO bouncer.test');
	$c->command('MAIL FROM:<>');
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
my ($id) = $data =~ /queued as (\d+)/;
ok($id, 'and the bounce is queued');
is($node->safe_psql($db, "SELECT array_to_string(rcpt_to, ',') FROM pepsi.workqueue WHERE id = " . ($id // 0)),
	'erin@far.example', 'its recipient is the original sender');

($ok, $data) = rcpt($old_only->forward('frank@far.example', $srs_domain));
like($ok, qr/^250/, 'an address signed with the older secret still reverses');
($id) = $data =~ /queued as (\d+)/;
is($node->safe_psql($db, "SELECT rcpt_to[1] FROM pepsi.workqueue WHERE id = " . ($id // 0)),
	'frank@far.example', 'to its original sender');

my $ours_srs1 = $ours->forward($stranger->forward('gina@orig.example', 'hop1.example'), $srs_domain);
($ok, $data) = rcpt($ours_srs1);
($id) = $data =~ /queued as (\d+)/;
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

$ingress->signal('TERM');
$ingress->finish;

#
# A secret file others can read is refused at start.
#
chmod 0644, "$tmp/secrets";
$r = run_worker(worker_cmd('pepsi-stage-srs', $conf), "$row{remote}\n");
isnt($r->{exit}, 0, 'a secret file readable by others: the worker refuses to start');
like($r->{stderr}, qr/SECRET_FILE \S+secrets must be a regular file of mode 0600 or 0400/, 'and says why');

done_testing();
