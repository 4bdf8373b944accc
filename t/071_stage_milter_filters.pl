# pepsi-stage-milter against stock filters from Debian, each started here
# as an unprivileged instance on a free loopback port with a private
# configuration: OpenDKIM in sign mode (the message comes out with a
# signature python3-dkim verifies against the published key), and
# rspamd's milter proxy (GTUBE rejected, a clean message gets its headers).

use strict;
use warnings FATAL => 'all';

use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use PepsiTest;
use PepsiStage;

my $node = stage_node('stage_milter_filters');
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $json = JSON::PP->new->canonical;

sub write_file
{
	my ($path, $text) = @_;
	open my $fh, '>', $path or die "cannot write $path: $!";
	print $fh $text;
	close $fh;
}

# A running row at stage filter; returns its id.
sub add_message
{
	my (%m) = @_;
	my $q = \&PepsiStage::quote_literal;
	my $id = $node->safe_psql('postgres',
		    'SELECT pepsi.workqueue_add(' . $q->($m{from}) . ', ARRAY[' . $q->($m{to}) . '],'
		  . ' convert_to(' . $q->($m{headers}) . ", 'UTF8'),"
		  . ' convert_to(' . $q->($m{body}) . ", 'UTF8'),"
		  . $q->($json->encode($m{state})) . "::jsonb, stage => 'filter')");
	set_running($node, $id);
	return $id;
}

# headers || CRLF || body, as the row stores the message.
sub raw_message
{
	my ($id) = @_;
	return $node->safe_psql('postgres',
		"SELECT encode(w.headers || '\\x0d0a'::bytea || b.body, 'escape') FROM pepsi.workqueue w"
		  . " JOIN pepsi.workqueue_body b ON b.id = w.body_id WHERE w.id = $id");
}

sub filter_config
{
	my ($name, $port) = @_;
	return stage_config($node, "$name.conf", <<"INI");
[pepsi]
HOSTNAME = mx.example.org

[stage-filter]
PROGRAM = pepsi-stage-milter
MILTERS = inet:127.0.0.1:$port
FINAL_TIMEOUT = 60s
NEXT_STAGE = filtered
BOUNCE_STAGE = bounce
INI
}

my $origin = { origin => { client_ip => '198.51.100.7', helo => 'client.example.net',
	listener => 'submission', auth => 'alice@example.org' } };

#
# OpenDKIM, sign mode: a message from an authenticated sender is signed.
#
{
	my $dir = "$tmp/opendkim";
	mkdir $dir;
	system('opendkim-genkey', '-D', $dir, '-d', 'example.org', '-s', 'pepsitest') == 0
	  or die 'opendkim-genkey failed';
	# The key sits under /tmp, which OpenDKIM would call unsafe (RequireSafeKeys).
	chmod 0600, "$dir/pepsitest.private";
	my $dkim = start_server('opendkim', sub {
		my ($port) = @_;
		write_file("$dir/opendkim.conf", <<"CONF");
Domain example.org
Selector pepsitest
KeyFile $dir/pepsitest.private
Mode s
Socket inet:$port\@127.0.0.1
PidFile $dir/opendkim.pid
Syslog no
LogWhy yes
RequireSafeKeys no
CONF
		return ('/usr/sbin/opendkim', '-f', '-x', "$dir/opendkim.conf");
	});
	my $conf = filter_config('opendkim', $dkim->{port});
	my $id = add_message(from => 'alice@example.org', to => 'bob@example.net', state => $origin,
		headers => "From: Alice <alice\@example.org>\r\nTo: bob\@example.net\r\n"
		  . "Subject: a signed message\r\n\twith a folded subject\r\nDate: Tue, 1 Dec 2026 12:00:00 +0000\r\n"
		  . "Message-ID: <signed\@example.org>\r\n",
		body => "Hello Bob,\r\n\r\nthis message is signed.\r\n");
	my $r = run_worker(worker_cmd('pepsi-stage-milter', $conf), "$id\n");
	is_deeply($r->{status}, ['0'], 'OpenDKIM: the worker reports success') or diag $r->{stderr};
	my $row = row_json($node, $id);
	is($row->{stage}, 'filtered', 'OpenDKIM: the message goes on');
	my $raw = raw_message($id);
	like($raw, qr/^DKIM-Signature: v=1; a=rsa-sha256;.*d=example\.org;\s+s=pepsitest;/s,
		'OpenDKIM added a DKIM-Signature at the top');

	# python3-dkim verifies it with the key OpenDKIM published in pepsitest.txt.
	my $txt = slurp("$dir/pepsitest.txt");
	my $record = join('', $txt =~ /"([^"]*)"/g);
	write_file("$dir/record", $record);
	write_file("$dir/message", $raw);
	my $verify = <<'PY';
import sys, dkim
record = open(sys.argv[1], 'rb').read()
message = open(sys.argv[2], 'rb').read()
def dnsfunc(name, timeout=5):
    return record if name in (b'pepsitest._domainkey.example.org.', 'pepsitest._domainkey.example.org.') else None
print('verified' if dkim.verify(message, dnsfunc=dnsfunc) else 'failed')
PY
	write_file("$dir/verify.py", $verify);
	my $out = `/usr/bin/python3 $dir/verify.py $dir/record $dir/message 2>&1`;
	is($out, "verified\n", 'python3-dkim verifies the signature against the published key');

	# The same message altered after signing does not verify: the check can fail.
	(my $tampered = $raw) =~ s/this message is signed/this message was changed/;
	write_file("$dir/message", $tampered);
	$out = `/usr/bin/python3 $dir/verify.py $dir/record $dir/message 2>&1`;
	is($out, "failed\n", '... and a tampered copy does not');
	stop_process($dkim);
}

#
# rspamd's milter proxy (self_scan: no separate scanner), with a private
# configuration over Debian's: its own ports and directories, no DNS
# beyond a dead local resolver, the headers a clean message gets.  And
# neither the public suffix list nor the language detector's trigrams:
# compiling the 9,628 suffixes and loading the 46 languages were nearly
# all of rspamd's start, 77 of 80 s at a load of 20, and past the 300 s
# this waits at a load of 30.  GTUBE and the headers need neither.
#
{
	my $dir = "$tmp/rspamd";
	mkdir $dir;
	mkdir "$dir/$_" for qw(local local/local.d local/override.d db run log languages);
	write_file("$dir/tld.dat", "com\nnet\norg\ntest\n");
	write_file("$dir/local/rspamd.conf.local", "lang_detection {\n  languages = \"$dir/languages\";\n}\n");
	my $rspamd = start_server('rspamd', sub {
		my ($port) = @_;
		my $normal = PostgreSQL::Test::Cluster::get_free_port();
		my $controller = PostgreSQL::Test::Cluster::get_free_port();
		write_file("$dir/local/override.d/worker-proxy.inc", <<"INC");
bind_socket = "127.0.0.1:$port";
milter = yes;
timeout = 120s;
count = 1;
upstream "local" {
  default = yes;
  self_scan = yes;
}
INC
		write_file("$dir/local/override.d/worker-normal.inc",
			"bind_socket = \"127.0.0.1:$normal\";\ncount = 1;\n");
		write_file("$dir/local/override.d/worker-controller.inc",
			"bind_socket = \"127.0.0.1:$controller\";\ncount = 1;\n");
		write_file("$dir/local/override.d/logging.inc", "type = \"console\";\nlevel = \"info\";\n");
		write_file("$dir/local/local.d/options.inc", <<"INC");
dns {
  nameserver = ["127.0.0.1:1"];
  timeout = 0.2s;
  retransmits = 1;
}
disable_hyperscan = true;
url_tld = "$dir/tld.dat";
INC
		write_file("$dir/local/local.d/milter_headers.conf", <<'INC');
use = ["x-spamd-result", "x-rspamd-queue-id"];
skip_local = false;
skip_authenticated = false;
INC
		return ('/usr/bin/rspamd', '-f', '-c', '/etc/rspamd/rspamd.conf',
			"--var=LOCAL_CONFDIR=$dir/local", "--var=DBDIR=$dir/db",
			"--var=RUNDIR=$dir/run", "--var=LOGDIR=$dir/log");
	}, 300);
	my $conf = filter_config('rspamd', $rspamd->{port});
	my $plain = { origin => { client_ip => '198.51.100.7', helo => 'client.example.net', listener => 'mx' } };
	my $headers = "From: <someone\@example.net>\r\nTo: <bob\@example.org>\r\n"
	  . "Date: Tue, 1 Dec 2026 12:00:00 +0000\r\nMessage-ID: <%s\@example.net>\r\nSubject: %s\r\n";
	my $gtube = add_message(from => 'someone@example.net', to => 'bob@example.org', state => $plain,
		headers => sprintf($headers, 'gtube', 'test'),
		body => "XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X\r\n");
	my $clean = add_message(from => 'someone@example.net', to => 'bob@example.org', state => $plain,
		headers => sprintf($headers, 'clean', 'lunch on friday'),
		body => "Shall we meet for lunch on Friday at noon?\r\n");
	my $r = run_worker(worker_cmd('pepsi-stage-milter', $conf), "$gtube\n$clean\n");
	is_deeply($r->{status}, [ '0', '0' ], 'rspamd: the worker reports success') or diag $r->{stderr};
	my $row = row_json($node, $gtube);
	is($row->{stage}, 'bounce', 'rspamd rejects GTUBE: the message is bounced');
	like($row->{state}{milter}{reply}, qr/^5\d\d /, '... with rspamd\'s 5xx reply') or diag explain $row->{state};
	$row = row_json($node, $clean);
	is($row->{stage}, 'filtered', 'a clean message goes on') or diag explain $row->{state};
	like(raw_message($clean), qr/^X-Spamd-Result: default: False/m, '... with rspamd\'s X-Spamd-Result header');
	stop_process($rspamd);
}

done_testing();
