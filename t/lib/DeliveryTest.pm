# Helpers for the delivery TAP tests (t/050_delivery*.pl): a cluster with
# the extension and the maintenance worker (it requeues paused rows when
# they fall due), the delivery graph as a pepsi.conf, the real peers
# (Postfix's smtp-sink, t/bin/smtp-peer), messages admitted with
# pepsi.workqueue_add, and reading Maildirs and DSNs back.

package DeliveryTest;

use strict;
use warnings FATAL => 'all';

use Cwd qw(abs_path);
use Exporter 'import';
use File::Basename qw(dirname);
use File::Path qw(make_path);
use IO::Socket::INET;
use POSIX ();
use MIME::Parser;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes ();

use DispatchTest;
use PepsiTest;

our @EXPORT = qw(
  delivery_node delivery_config start_peer start_server start_sink start_sink_on stop_process inject
  maildir_files slurp parse_dsn dsn_fields pepsi_bin peer_messages peer_count make_mailbox start_ingress
  recording_maildir_writer operator_config
);

my $db = 'postgres';
# The test programs of t/bin/ (smtp-peer).
my $bin = dirname(abs_path(__FILE__)) . '/../bin';
my $parent = $$;
my @started;    # peers and sinks

# When a test dies half-way its children (peers, sinks, the dispatcher,
# ingress) must not outlive it: a dispatcher would try to reconnect to the
# stopped cluster for ever.
END
{
	if ($$ == $parent)
	{
		my @children;
		if (opendir my $proc, '/proc')
		{
			for my $pid (grep { /^\d+$/ } readdir $proc)
			{
				open my $fh, '<', "/proc/$pid/stat" or next;
				my $stat = <$fh> // '';
				close $fh;
				push @children, $pid if $stat =~ /\)\s+\S\s+(\d+)/ && $1 == $parent;
			}
			closedir $proc;
		}
		kill 'TERM', @children, grep { $_ } map { $_->{pid} } @started;
	}
}

# A cluster that preloads pepsi (the maintenance worker requeues paused rows).
sub delivery_node
{
	my ($name) = @_;
	my $node = pepsi_node($name, preload => 1, extension => 1,
		conf => "pepsi.database = '$db'\npepsi.maintenance_interval = '100ms'\n");

	return $node;
}

# The delivery graph: init routes LOCAL_DOMAINS to maildir, the rest to
# smarthost; both bounce to bounce, whose DSNs take their own route to
# dsn-maildir / dsn-smarthost (which have no BOUNCE_STAGE: a DSN is never
# bounced).  %o: maildir_root, smarthost (host:port or undef), extra
# (hash of section => "OPTION = value\n..." appended), local_domains,
# pepsi (hash of [pepsi] options beside HOSTNAME), internet (the MX hosts'
# port: smarthost and dsn-smarthost are then pepsi-stage-relay-to-internet),
# more_stages (hash of further section name => its text: an lmtp stage,
# say, which init's LOCAL_STAGE is pointed at through extra), sections
# (text appended: [listener-*] sections, say).
sub delivery_config
{
	my ($node, %o) = @_;
	my $root = $o{maildir_root};
	my $domains = $o{local_domains} // 'local.test';
	my %extra = %{ $o{extra} // {} };
	my $smarthost = defined $o{smarthost} ? "SMARTHOST = $o{smarthost}\n" : '';
	my $retry = "RETRY_BASE = 1s\nRETRY_MAX = 2s\n";
	my $internet = "PROGRAM = pepsi-stage-relay-to-internet\nSMTP_PORT = "
	  . ($o{internet} // 25) . "\nTIMEOUT = 10s\nCONNECT_TIMEOUT = 5s\n$retry";
	my %sections = (
		init => "PROGRAM = pepsi-stage-route\nLOCAL_DOMAINS = $domains\n"
		  . "LOCAL_STAGE = maildir\nREMOTE_STAGE = smarthost\n",
		maildir => "PROGRAM = pepsi-stage-relay-to-maildir\nMAILDIR_ROOT = $root\n"
		  . "BOUNCE_STAGE = bounce\nORIGINATE_SUCCESS_DSN = yes\n$retry",
		smarthost => "PROGRAM = pepsi-stage-relay-to-smarthost\n$smarthost"
		  . "TLS = none\nBOUNCE_STAGE = bounce\nORIGINATE_SUCCESS_DSN = yes\n"
		  . "TIMEOUT = 10s\nCONNECT_TIMEOUT = 5s\n$retry",
		# A short wait for sibling failures keeps the tests' retry timings apart.
		bounce => "PROGRAM = pepsi-stage-bounce\nNEXT_STAGE = dsn-route\nGATHER_WINDOW = 1s\n",
		'dsn-route' => "PROGRAM = pepsi-stage-route\nLOCAL_DOMAINS = $domains\n"
		  . "LOCAL_STAGE = dsn-maildir\nREMOTE_STAGE = dsn-smarthost\n",
		'dsn-maildir' => "PROGRAM = pepsi-stage-relay-to-maildir\nMAILDIR_ROOT = $root\n$retry",
		'dsn-smarthost' => "PROGRAM = pepsi-stage-relay-to-smarthost\n$smarthost"
		  . "TLS = none\nTIMEOUT = 10s\nCONNECT_TIMEOUT = 5s\n$retry",
	);
	if ($o{internet})
	{
		$sections{smarthost} = "$internet"
		  . "BOUNCE_STAGE = bounce\nORIGINATE_SUCCESS_DSN = yes\n";
		$sections{'dsn-smarthost'} = $internet;
	}
	my $stages = '';
	for my $name (qw(init maildir smarthost bounce dsn-route dsn-maildir dsn-smarthost))
	{
		# An option in %extra replaces the default of the same name.
		my @lines = split /\n/, $sections{$name} . ($extra{$name} // '');
		my (%last, @order);
		for my $line (@lines)
		{
			my ($option) = $line =~ /^\s*(\w+)\s*=/ or next;
			push @order, $option unless exists $last{$option};
			$last{$option} = $line;
		}
		$stages .= "[stage-$name]\n" . join('', map { "$last{$_}\n" } @order);
	}
	my %more = %{ $o{more_stages} // {} };
	$stages .= "[stage-$_]\n$more{$_}" for sort keys %more;
	$stages .= $o{sections} // '';
	return write_config($node,
		pepsi => { HOSTNAME => 'mx.pepsi.test', %{ $o{pepsi} // {} } },
		dispatch => { WORKER_IDLE_TIMEOUT => '30s', %{ $o{dispatch} // {} } },
		stages => $stages,
		($o{path} ? (path => $o{path}) : ()));
}

# The pipeline's configuration $config with [database] CONFIG_CONNINFO
# naming the login role $user (a member of pepsi_config), for an operator
# tool beside the pipeline; returns the new file's path.
sub operator_config
{
	my ($node, $config, $user) = @_;
	my $path = "$config.$user";

	open my $fh, '>', $path or die "$path: $!";
	print $fh slurp($config)
	  . sprintf("[database]\nCONFIG_CONNINFO = host=%s port=%d dbname=%s user=%s\n",
		$node->host, $node->port, $db, $user);
	close $fh;
	return $path;
}

# Start pepsi-ingress -c $config, its output appended to $log, and wait
# until it listens on $port; returns { pid }.
sub start_ingress
{
	my ($config, $port, $log) = @_;
	my $pid = fork;

	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDIN, '<', '/dev/null';
		open STDOUT, '>>', $log;
		open STDERR, '>&', \*STDOUT;
		exec pepsi_bin('pepsi-ingress'), '-c', $config or die "exec: $!";
	}
	PepsiTest::poll_until(sub {
		my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 1);
		$s->close if $s;
		return $s;
	}, 60) or die "pepsi-ingress did not start:\n" . (slurp($log) // '');
	return { pid => $pid };
}

# Start t/bin/smtp-peer with @args; returns { pid, dir, port }.
sub start_peer
{
	my (@args) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my $pid = fork;

	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDOUT, '>>', "$dir/peer.log";
		open STDERR, '>&', \*STDOUT;
		exec $^X, "$bin/smtp-peer", '--dir', $dir, @args or die "exec: $!";
	}
	poll_until(sub { -e "$dir/port" }, 60) or die "smtp-peer did not start";
	my $port = slurp("$dir/port");
	chomp $port;
	push @started, { pid => $pid, dir => $dir, port => $port };
	return $started[-1];
}

# A server on a free port: $command->($port, $dir) gives the command line;
# its output goes to $dir/$name.log.  Returns { pid, dir, port } once a
# connection to the port succeeds (within $seconds, 60 by default: a
# deadline for a server that cannot start, not a measure).  $at
# ("address:port") names where it listens instead of 127.0.0.1 and a free port.
sub start_server
{
	my ($name, $command, $seconds, $at) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my ($address, $port) = $at ? split(/:/, $at) : ('127.0.0.1', PostgreSQL::Test::Cluster::get_free_port());
	my @cmd = $command->($port, $dir);
	my $pid = fork;

	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		open STDOUT, '>>', "$dir/$name.log";
		open STDERR, '>&', \*STDOUT;
		exec @cmd or die "exec: $!";
	}
	# A server that exits (a bad configuration, a port taken) says so at
	# once, with its log, rather than at the end of the wait.
	my ($listening, $exited);
	poll_until(
		sub {
			my $s = IO::Socket::INET->new(PeerAddr => "$address:$port", Timeout => 1);
			$listening = $s;
			$s->close if $s;
			$exited = waitpid($pid, POSIX::WNOHANG()) == $pid unless $s;
			return $listening || $exited;
		},
		$seconds // 60);
	if (!$listening)
	{
		kill 'KILL', $pid unless $exited;
		die "$name " . ($exited ? "exited (status $?) before listening" : "did not start in time")
		  . " on $address:$port; its log ends:\n" . substr(slurp("$dir/$name.log") // '', -2000);
	}
	push @started, { pid => $pid, dir => $dir, port => $port };
	return $started[-1];
}

# Postfix's smtp-sink on a free port, dumping each transaction into a
# directory (-d); returns { pid, dir, port }.  @args go before the address.
sub start_sink
{
	my (@args) = @_;

	return start_server('sink',
		sub {
			my ($port, $dir) = @_;
			return ('/usr/sbin/smtp-sink', '-d', "$dir/mail/%M.", @args, "127.0.0.1:$port", '128');
		});
}

# smtp-sink listening on $address:$port (an MX host of the simulated internet).
sub start_sink_on
{
	my ($address, $port, @args) = @_;

	return start_server('sink',
		sub {
			my (undef, $dir) = @_;
			return ('/usr/sbin/smtp-sink', '-d', "$dir/mail/%M.", @args, "$address:$port", '128');
		},
		60, "$address:$port");
}

sub stop_process
{
	my ($p) = @_;

	return unless $p && $p->{pid};
	kill 'TERM', $p->{pid};
	waitpid($p->{pid}, 0);
	$p->{pid} = 0;
}

# Admit a message (headers and body as text, CRLF line ends) at stage init;
# $state is JSON text.  Wakes the dispatcher unless quiet.  Returns the row
# id, or in list context the row id and the body id.
sub inject
{
	my ($node, %m) = @_;
	my $from = $m{from} // 'sender@local.test';
	my $rcpts = join(',', map { "'$_'" } @{ $m{to} });
	my $state = $m{state} // '{}';
	my $headers = $m{headers} // "From: <$from>\r\nTo: <$m{to}[0]>\r\nSubject: test\r\n";
	my $body = $m{body} // "hello\r\n";

	for ($state, $headers, $body) { s/'/''/g }
	my $add = "SELECT pepsi.workqueue_add('$from', ARRAY[$rcpts]::text[],"
	  . " convert_to(E'" . escape($headers) . "', 'UTF8'),"
	  . " convert_to(E'" . escape($body) . "', 'UTF8'), '$state'::jsonb)";
	# The body id is read before the row commits: no worker can have taken
	# it yet.  The wake, once it has committed, in the same psql.
	my $out = $node->safe_psql($db,
		"BEGIN;\n$add AS id \\gset\n"
		  . "SELECT :id || ' ' || body_id FROM pepsi.workqueue WHERE id = :id;\nCOMMIT;"
		  . ($m{quiet} ? '' : "\nSELECT pepsi.notify_workqueue();"));
	my ($id, $body_id) = split / /, (split /\n/, $out)[0];
	return wantarray ? ($id, $body_id) : $id;
}

sub escape
{
	my ($s) = @_;

	$s =~ s/\\/\\\\/g;
	$s =~ s/\r/\\r/g;
	$s =~ s/\n/\\n/g;
	return $s;
}

sub slurp
{
	my ($path) = @_;

	open my $fh, '<', $path or return undef;
	binmode $fh;
	local $/;
	my $text = <$fh>;
	close $fh;
	return $text;
}

# The files in a mailbox's new/, oldest first.
sub maildir_files
{
	my ($root, $address) = @_;
	my $dir = "$root/" . lc($address) . '/new';

	my @paths;

	# An array, so that scalar(maildir_files(...)) is a count, 0 for no mailbox.
	opendir my $dh, $dir or return @paths;
	# By modification time: names order by time only to the second.
	@paths = map { $_->[1] }
	  sort { $a->[0] <=> $b->[0] || $a->[1] cmp $b->[1] }
	  map { [ (Time::HiRes::stat($_))[9], $_ ] }
	  map { "$dir/$_" } grep { !/^\./ } readdir $dh;
	closedir $dh;
	return @paths;
}

sub make_mailbox
{
	my ($root, $address) = @_;

	make_path(map { "$root/" . lc($address) . "/$_" } qw(tmp new cur));
}

# pepsi-helper-maildir-writer behind a copy of what it is sent, in $dir:
# returns its path (for MAILDIR_WRITER) and a sub that says how many
# requests it was sent and how many of them held the answer for more
# ("sent/held": a batch's requests but its last say "hold yes",
# relay-to-maildir's maildir_writer_send).
sub recording_maildir_writer
{
	my ($dir) = @_;
	my $requests = "$dir/requests";
	my $writer = "$dir/writer";

	open my $fh, '>', $writer or die "cannot write $writer: $!";
	print $fh "#!/bin/sh\ntee -a '$requests' | exec '" . pepsi_bin('pepsi-helper-maildir-writer') . "' \"\$@\"\n";
	close $fh;
	chmod 0755, $writer or die "cannot chmod $writer: $!";
	return ($writer, sub {
		my $text = slurp($requests) // '';
		my $sent = () = $text =~ /^recipient /mg;
		my $held = () = $text =~ /^hold yes$/mg;
		return "$sent/$held";
	});
}

# How many messages smtp-peer accepted, as scalar(peer_messages($peer))
# counts them (msg-1 on, up to the first not yet stored) without reading
# them: a poll for hundreds of messages would read them all each time.
sub peer_count
{
	my ($peer) = @_;
	my $n = 0;

	$n++ while -e "$peer->{dir}/msg-" . ($n + 1) . '.eml';
	return $n;
}

# The messages smtp-peer accepted: [{ data, env }], in order.
sub peer_messages
{
	my ($peer) = @_;
	my @messages;

	for (my $n = 1; -e "$peer->{dir}/msg-$n.eml"; $n++)
	{
		push @messages, { data => slurp("$peer->{dir}/msg-$n.eml"),
			env => slurp("$peer->{dir}/msg-$n.env") };
	}
	return @messages;
}

# Parse a DSN (the text of a message file) with MIME-tools.  Returns the
# MIME::Entity; dsn_fields gives the delivery-status part's fields.
sub parse_dsn
{
	my ($text) = @_;
	my $parser = MIME::Parser->new;

	$parser->output_to_core(1);
	$parser->decode_bodies(1);
	return $parser->parse_data($text);
}

# The fields of the message/delivery-status part: (per-message hash,
# [per-recipient hashes]); field names lower-cased.
sub dsn_fields
{
	my ($entity) = @_;
	my ($status) = grep { lc($_->effective_type) eq 'message/delivery-status' } $entity->parts;

	return () unless $status;
	my $text = $status->bodyhandle ? $status->bodyhandle->as_string : join('', @{ $status->body });
	$text =~ s/\r\n/\n/g;
	my @blocks = split /\n\s*\n/, $text;
	my @parsed;
	for my $block (@blocks)
	{
		my %f;
		$block =~ s/\n[ \t]+/ /g;
		for my $line (split /\n/, $block)
		{
			$f{ lc $1 } = $2 if $line =~ /^([\w-]+):\s*(.*)$/;
		}
		push @parsed, \%f if %f;
	}
	my $message = shift @parsed;
	return ($message, \@parsed);
}

1;
