# The multi-call binary under the names mail programs call it by, through
# symlinks as `make install SENDMAIL_LINKS=yes` makes them: sendmail
# admits a message (what cron, PHP and logwatch do with /usr/sbin/sendmail),
# mailq and sendmail -bp list the queue as pepsi-queue list does,
# newaliases and sendmail -bi check the aliases files, naming file:line of
# an error and exiting non-zero on a broken one.

use strict;
use warnings FATAL => 'all';

use IPC::Run qw(run);
use PostgreSQL::Test::Utils;
use Test::More;

use DispatchTest;
use PepsiTest;

my $node = pepsi_node('sendmail_names', extension => 1);
my $dir = PostgreSQL::Test::Utils::tempdir();
for my $name (qw(sendmail mailq newaliases))
{
	symlink(pepsi_bin('pepsi'), "$dir/$name") or die "cannot link $dir/$name: $!";
}

my $aliases = "$dir/aliases";
my $stage_aliases = "$dir/stage-aliases";
sub write_file
{
	my ($path, $text) = @_;
	open my $fh, '>', $path or die "$path: $!";
	print $fh $text;
	close $fh;
}
write_file($aliases, "postmaster: root\nroot: alice\@example.org\n");
write_file($stage_aliases, "team: alice, bob\n");
my $conf = "$dir/pepsi.conf";
write_file($conf,
	sprintf("[pepsi]\nHOSTNAME = host.example.org\nALIASES_FILE = %s\n[database]\nCONNINFO = host=%s port=%d dbname=postgres\n"
		  . "[sendmail]\nINIT_STAGE = submit\n[stage-aliases]\nPROGRAM = pepsi-stage-aliases\nALIASES_FILE = %s\n",
		$aliases, $node->host, $node->port, $stage_aliases));

sub call
{
	my ($name, $input, @args) = @_;
	my ($out, $err) = ('', '');
	write_file("$dir/stdin", $input);
	run([ "$dir/$name", @args ], '<', "$dir/stdin", '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}

# sendmail: a message admitted, as pepsi-sendmail admits it.
my ($rc, $out, $err) = call('sendmail', "Subject: cron\n\nthe job ran\n", '-C', $conf, '-i', 'root@example.org');
is($rc, 0, 'sendmail: the message is admitted') or diag($err);
unlike($err, qr/no program named/, 'sendmail: a name the binary answers to');
is($node->safe_psql('postgres', "SELECT stage || ' ' || array_to_string(rcpt_to, ',') FROM pepsi.workqueue"),
	'submit root@example.org', 'sendmail: the row at INIT_STAGE, for its recipient');

# mailq and sendmail -bp: the queue listing of pepsi-queue list (its AGE column aside, a clock's).
sub no_age
{
	my ($text) = @_;
	$text =~ s/\b\d+:\d\d:\d\d\b/AGE/g;
	return $text;
}
my $listing = '';
run([ pepsi_bin('pepsi-queue'), '-C', $conf, 'list' ], '<', \undef, '>', \$listing, '2>', \$err);
$listing = no_age($listing);
($rc, $out, $err) = call('mailq', '', '-C', $conf);
is($rc, 0, 'mailq: exit 0') or diag($err);
like($out, qr/root\@example\.org/, 'mailq: the queued message is listed');
is(no_age($out), $listing, 'mailq: what pepsi-queue list prints');
($rc, $out, $err) = call('sendmail', '', '-bp', '-C', $conf);
is(no_age($out), $listing, 'sendmail -bp: the same listing');

# newaliases and sendmail -bi: both files checked.
($rc, $out, $err) = call('newaliases', '', '-C', $conf);
is($rc, 0, 'newaliases: good files, exit 0') or diag($err);
like($out, qr/\Q$aliases\E: 2 aliases/, 'newaliases: [pepsi] ALIASES_FILE checked');
like($out, qr/\Q$stage_aliases\E: 1 aliases/, 'newaliases: the stage\'s ALIASES_FILE checked');
write_file($stage_aliases, "team: alice, bob\nthis line is wrong\n");
($rc, $out, $err) = call('newaliases', '', '-C', $conf);
isnt($rc, 0, 'newaliases: a broken file, a non-zero exit');
like($err, qr/\Q$stage_aliases\E:2: /, 'newaliases: the error names file:line');
($rc, $out, $err) = call('sendmail', '', '-bi', '-C', $conf);
isnt($rc, 0, 'sendmail -bi: the same check');
like($err, qr/\Q$stage_aliases\E:2: /, 'sendmail -bi: the same error');

done_testing();
