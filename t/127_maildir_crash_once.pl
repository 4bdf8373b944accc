# pepsi-stage-relay-to-maildir delivers each message once even when its
# worker is killed between the helper putting a batch's files into new/
# and the rows' commit.  The killed batch's oldest row comes back marked
# by the crash (state.crash) and the helper looks for its stable name in
# new/ and cur/ first; the rest of the batch comes back unmarked, and
# their stable names, already in new/, are not published twice.  A file a
# reader moved into cur/ (":2,S") before the crashed row's retry is found
# there.
#
# The kills are exact, not timed: a MAILDIR_WRITER wrapper passes the
# helper's replies on to the stage, and when the gate file is there it
# first takes it and SIGKILLs the stage worker (its parent), so the worker
# dies after the files are in new/ and before any row commits.  Having
# killed its worker, the wrapper stops at once: were it to read the
# batch's further replies, it could take the next wave's gate (the test
# makes it as soon as the dispatcher has logged the kill) and "kill" a
# worker already dead, so that the wave would see no kill of its own.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-helper-maildir-writer is not built' unless -x pepsi_bin('pepsi-helper-maildir-writer');

my $db = 'postgres';
my $node = delivery_node('maildir_crash_once');
my $base = PostgreSQL::Test::Utils::tempdir();
my $root = "$base/mail";
mkdir $root;
my @mailboxes = qw(alice@local.test bob@local.test carol@local.test dave@local.test);
make_mailbox($root, $_) for @mailboxes;

my $gate = "$base/gate";
my $fired = "$base/gate.fired";
my $writer = "$base/writer";
open my $fh, '>', $writer or die "cannot write $writer: $!";
print $fh "#!/bin/sh\nstage=\$PPID\n'"
  . pepsi_bin('pepsi-helper-maildir-writer')
  . "' \"\$@\" | while IFS= read -r line; do\n"
  . "\tif /bin/mv '$gate' '$fired' 2>/dev/null; then kill -9 \$stage; exit 0; fi\n"
  . "\tprintf '%s\\n' \"\$line\"\ndone\n";
close $fh;
chmod 0755, $writer or die "cannot chmod $writer: $!";

my $config = delivery_config(
	$node,
	maildir_root => $root,
	dispatch => { CRASH_LIMIT => 20, CRASH_RETRY_DELAY => '3s' },
	extra => { maildir => "MAILDIR_WRITER = $writer\nPARALLELISM = 2\n" });
my $d = start_dispatcher($config);

# Every message file of the mailboxes (new/ and cur/): the number each carries in its body.
sub delivered
{
	my @numbers;
	for my $mailbox (@mailboxes)
	{
		for my $sub (qw(new cur))
		{
			opendir my $dh, "$root/$mailbox/$sub" or die "$root/$mailbox/$sub: $!";
			for my $name (grep { !/^\./ } readdir $dh)
			{
				my $text = slurp("$root/$mailbox/$sub/$name");
				push @numbers, $text =~ /^message (\d+)\r?$/m ? $1 : "?$name";
			}
			closedir $dh;
		}
	}
	return @numbers;
}

sub kills
{
	my $log = dispatcher_log($d);
	my $n = () = $log =~ /paused for a retry: stage maildir: worker killed by signal 9/g;
	return $n;
}

# Messages $first .. $first + $count - 1, to the first three mailboxes in turn (or to $to).
sub add_messages
{
	my ($first, $count, $to) = @_;
	my $rcpt = $to ? "'$to'" : "(ARRAY['alice\@local.test', 'bob\@local.test', 'carol\@local.test'])[1 + g % 3]";
	$node->safe_psql($db,
		    "SELECT pepsi.workqueue_add('sender\@example.org', ARRAY[$rcpt],"
		  . " 'Subject: once'::bytea, convert_to('message ' || g || E'\\r\\n', 'UTF8'),"
		  . " stage => 'maildir') FROM generate_series($first, $first + $count - 1) g");
	$node->safe_psql($db, 'SELECT pepsi.notify_workqueue()');
}

# The queue's drain: its pace is the machine's, so bounded by a stall (no
# row concluded for a minute), not by a total.
sub queue_empty
{
	return poll_drained(sub { scalar_query($node, 'SELECT count(*) FROM pepsi.workqueue') });
}

#
# Five workers killed during batches, one in each of five waves of 60
# messages: each delivered once.
#
my $wave = 60;
my $want_kills = 5;
my $messages = $wave * $want_kills;
for my $kill (1 .. $want_kills)
{
	open $fh, '>', $gate or die;
	close $fh;
	add_messages($wave * ($kill - 1) + 1, $wave);
	ok(poll_until(sub { -e $fired && kills() >= $kill }, 60), "kill $kill: a worker killed after its batch reached new/")
	  or last;
	unlink $fired;
}
ok(queue_empty(), 'every row concluded') or diag(dispatcher_log($d));
my @numbers = delivered();
my %seen;
$seen{$_}++ for @numbers;
is(scalar(keys %seen), $messages, "each of the $messages messages delivered");
is(scalar(grep { /^\?/ } @numbers), 0, 'each file is one of them');
is(scalar(@numbers) - scalar(keys %seen), 0, 'no message delivered twice')
  or diag(join ' ', map { "$_ x$seen{$_}" } grep { $seen{$_} > 1 } sort { $a <=> $b } keys %seen);
ok(kills() >= $want_kills, "the kills were made: $want_kills at least");
is(scalar(grep { $_ ne '.' && $_ ne '..' } map { glob("$root/$_/tmp/*") } @mailboxes),
	0, 'nothing left in tmp/');

#
# A reader moves the file into cur/ before the crashed row's retry: the
# retry finds it there and writes nothing.
#
my $before_kills = kills();
open $fh, '>', $gate or die;
close $fh;
add_messages($messages + 1, 1, 'dave@local.test');
ok(poll_until(sub { -e $fired }, 60), 'the worker of the single message is killed after its file reached new/');
my $mailbox = "$root/dave\@local.test";
my @new;
ok(poll_until(sub { @new = glob("$mailbox/new/*"); scalar(@new) > 0 }), 'its file is in new/');
for my $path (@new)
{
	my ($name) = $path =~ m{/([^/]+)$};
	rename $path, "$mailbox/cur/$name:2,S" or die "rename $path: $!";
}
ok(poll_until(sub { kills() > $before_kills }, 30), 'its row is paused for a retry after the crash');
ok(queue_empty(), 'and concluded by the retry');
@numbers = grep { $_ == $messages + 1 } delivered();
is(scalar(@numbers), 1, 'the message moved into cur/ is not delivered again');
is(scalar(my @left = glob("$mailbox/new/*")), 0, 'nothing new in new/');

done_testing();
