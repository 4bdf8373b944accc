# pepsi-stage-detect-language and pepsi-stage-block-language under
# pepsi-dispatch, with real workers: texts in ten languages, twenty each,
# taken from the translations Debian ships (the message catalogs under
# /usr/share/locale, t/bin/catalog-texts), sent as 8-bit UTF-8,
# quoted-printable, base64, in a legacy charset and as
# multipart/alternative, are told apart at least 18 times in 20; the
# verdict is in X-Pepsi-Language (a forged one is replaced) and in
# state.language.  Then, delivered into Maildirs: a recipient's owner
# blocks languages in pepsi.settings, and such mail is refused (the sender
# gets a DSN, another recipient of the same message still gets it), held
# (and delivered once released) or tagged.  A text
# too short or undecidable is "und" and never blocked, even when listed.
# pepsi-detect-language(1) is the same file under another name.

use strict;
use warnings FATAL => 'all';

use Encode qw(encode);
use File::Basename qw(dirname);
use IPC::Run;
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use MIME::QuotedPrint qw(encode_qp);
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my @languages = qw(de fr es pt nl sv pl cs fi ru);
my $per_language = 20;

# The texts, extracted now from the catalogs installed (coreutils, tar,
# dpkg, apt: scripts/deps.sh), never written into this file.
my $texts_dir = PostgreSQL::Test::Utils::tempdir();
my $extract = dirname(__FILE__) . '/bin/catalog-texts';
for my $lang (@languages)
{
	my ($out, $err) = run_command([ $extract, '-n', $per_language, '-m', 200, $lang, $texts_dir ]);
	is($out, $per_language, "$per_language texts of at least 200 characters in $lang from Debian's catalogs")
	  or diag($err);
}
sub text_of
{
	my ($lang, $n) = @_;
	open my $fh, '<:encoding(UTF-8)', sprintf('%s/%s-%02d.txt', $texts_dir, $lang, $n) or die "$lang $n: $!";
	local $/;
	my $text = <$fh>;
	chomp $text;
	return $text;
}

my $node = delivery_node('language');
my $root = PostgreSQL::Test::Utils::tempdir();
make_mailbox($root, $_) for qw(reader@local.test blocker@local.test holder@local.test tagger@local.test
  sender@local.test corpus@local.test);

# The owners' own settings.
$node->safe_psql('postgres', q{INSERT INTO pepsi.settings (address, option, value) VALUES
	('blocker@local.test', 'BLOCK_LANGUAGES', 'fr, und'),
	('holder@local.test', 'BLOCK_LANGUAGES', 'de'), ('holder@local.test', 'BLOCK_ACTION', 'hold'),
	('tagger@local.test', 'BLOCK_LANGUAGES', 'es pt'), ('tagger@local.test', 'BLOCK_ACTION', 'tag'),
	('corpus@local.test', 'BLOCK_LANGUAGES', 'de fr es pt nl sv pl cs fi ru'),
	('corpus@local.test', 'BLOCK_ACTION', 'hold')});

my $config = delivery_config($node, maildir_root => $root,
	extra => { init => "LOCAL_STAGE = detect\n" },
	more_stages => {
		detect => "PROGRAM = pepsi-stage-detect-language\nNEXT_STAGE = block\n",
		corpus => "PROGRAM = pepsi-stage-detect-language\nNEXT_STAGE = block\n",
		block => "PROGRAM = pepsi-stage-block-language\nNEXT_STAGE = maildir\nBOUNCE_STAGE = bounce\n",
	});
my $d = start_dispatcher($config);

# A message of $text (a Perl string) in one of five shapes.
my $n = 0;
sub send_text
{
	my ($text, %m) = @_;
	my $shape = $m{shape} // 'utf8';
	my $from = $m{from} // 'sender@local.test';
	my $to = $m{to} // ['reader@local.test'];
	$n++;
	my $headers = "From: <$from>\r\nTo: <$to->[0]>\r\nSubject: $m{subject}\r\nMessage-ID: <l$n\@local.test>\r\n"
	  . ($m{headers} // '');
	my $utf8 = encode('UTF-8', $text) =~ s/\r?\n/\r\n/gr;
	my $body;
	if ($shape eq 'utf8')
	{
		$headers .= "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n"
		  . "Content-Transfer-Encoding: 8bit\r\n";
		$body = "$utf8\r\n";
	}
	elsif ($shape eq 'qp')
	{
		$headers .= "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=\"UTF-8\"\r\n"
		  . "Content-Transfer-Encoding: quoted-printable\r\n";
		$body = encode_qp($utf8, "\r\n");
	}
	elsif ($shape eq 'base64')
	{
		$headers .= "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n"
		  . "Content-Transfer-Encoding: base64\r\n";
		$body = encode_base64($utf8, "\r\n");
	}
	elsif ($shape eq 'legacy')
	{
		# The language's legacy charset when the text fits it, else UTF-8.
		my %legacy = (pl => 'iso-8859-2', cs => 'iso-8859-2', ru => 'koi8-r');
		my $charset = $legacy{ $m{lang} } // 'iso-8859-15';
		my $octets = eval { encode($charset, $text, Encode::FB_CROAK) };
		($charset, $octets) = ('utf-8', encode('UTF-8', $text)) unless defined $octets;
		$headers .= "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=$charset\r\n"
		  . "Content-Transfer-Encoding: base64\r\n";
		$body = encode_base64($octets, "\r\n");
	}
	else
	{
		# multipart/alternative: the plain part quoted-printable, an HTML one besides, and an attachment.
		my $html = "<html><head><style>p { color: red }</style></head><body><p>"
		  . ($utf8 =~ s/&/&amp;/gr) . "</p></body></html>";
		$headers .= "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"outer\"\r\n";
		$body = "--outer\r\nContent-Type: multipart/alternative; boundary=inner\r\n\r\n"
		  . "--inner\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n"
		  . encode_qp($utf8, "\r\n") . "\r\n--inner\r\nContent-Type: text/html; charset=utf-8\r\n"
		  . "Content-Transfer-Encoding: base64\r\n\r\n" . encode_base64($html, "\r\n")
		  . "--inner--\r\n--outer\r\nContent-Type: text/plain; charset=us-ascii\r\n"
		  . "Content-Disposition: attachment; filename=notes.txt\r\n\r\n"
		  . ("the attachment is in English and is not read " x 20) . "\r\n--outer--\r\n";
	}
	# inject() passes text; the octets go through as they are.
	return inject($node, from => $from, to => $to, headers => $headers, body => $body) unless $m{stage};
	# Or the statement that adds it at that stage.
	for ($headers, $body) { $_ = DeliveryTest::escape($_ =~ s/'/''/gr) }
	return "SELECT pepsi.workqueue_add('$from', ARRAY['$to->[0]'], convert_to(E'$headers', 'UTF8'),"
	  . " convert_to(E'$body', 'UTF8'), '{}'::jsonb, stage => '$m{stage}');\n";
}
sub settled { return poll_until(sub { queue_count($node) == 0 }, 180) }
sub language_header
{
	my ($text) = @_;
	my ($value) = $text =~ /^X-Pepsi-Language: ([^\r\n]*)\r\n/m;
	return $value;
}
sub header_count { my ($text, $name) = @_; my @all = $text =~ /^\Q$name\E:/mgi; return scalar @all }

# Ten languages, twenty texts each, through the queue: added at
# [stage-corpus] (detect-language) together, for an address that holds
# mail in any of the ten (so that the held rows' headers and state can be
# read), which a wrong verdict delivers to its mailbox instead.
my @shapes = qw(utf8 qp base64 legacy multipart);
my $corpus = '';
for my $lang (@languages)
{
	for my $i (1 .. $per_language)
	{
		$corpus .= send_text(text_of($lang, $i), lang => $lang, shape => $shapes[ $i % @shapes ],
			subject => "text $lang-$i", stage => 'corpus', to => ['corpus@local.test'],
			headers => $i == 1 ? "X-Pepsi-Language: en; confidence=1.00\r\n" : '');
	}
}
$node->safe_psql('postgres', "BEGIN;\n${corpus}COMMIT;\nSELECT pepsi.notify_workqueue();");
my $total = @languages * $per_language;
my $held_sql = "FROM pepsi.workqueue WHERE stage = 'block' AND status = 'paused' AND rcpt_to = '{corpus\@local.test}'";
ok(poll_until(sub { $node->safe_psql('postgres', "SELECT count(*) $held_sql") + maildir_files($root, 'corpus@local.test') == $total },
		180),
	"all $total messages detected, and held or delivered");
my $parked = decode_json($node->safe_psql('postgres',
	"SELECT coalesce(json_agg(json_build_object('headers', convert_from(headers, 'UTF8'), 'state', state)), '[]') $held_sql"));
# A wrong verdict was delivered: its headers are in the file (its state is gone).
push @$parked, map { { headers => slurp($_) =~ s/\r\n\r\n.*//sr . "\r\n", delivered => 1 } } maildir_files($root, 'corpus@local.test');
my (%right, %wrong, $forged_kept, $one_header, $state_agrees);
for my $row (@$parked)
{
	my $text = $row->{headers};
	my ($lang, $i) = $text =~ /^Subject: text (\w+)-(\d+)\r\n/m or next;
	my $verdict = language_header($text) // '';
	my ($primary) = $verdict =~ /^([\w-]+);/;
	if (($primary // '') eq $lang)
	{
		$right{$lang}++;
	}
	else
	{
		push @{ $wrong{$lang} }, "$lang-$i ($shapes[$i % @shapes]): $verdict";
	}
	$state_agrees++ if $row->{delivered} || ($row->{state}{language}{primary} // '') eq ($primary // 'none');
	if ($i == 1)
	{
		$forged_kept++ if $text =~ /^X-Pepsi-Language: en; confidence=1\.00\r\n/m;
		$one_header++ if header_count($text, 'X-Pepsi-Language') == 1;
	}
}
for my $lang (@languages)
{
	cmp_ok($right{$lang} // 0, '>=', 18, "$lang: right on at least 18 of $per_language")
	  or diag(join "\n", @{ $wrong{$lang} // [] });
}
is($state_agrees // 0, $total, 'state.language.primary is the header\'s, for every message');
ok(!$forged_kept, 'an X-Pepsi-Language the message came with is not kept');
is($one_header // 0, scalar @languages, 'each message has one X-Pepsi-Language, ours');
like(language_header($parked->[0]{headers} // '') // '',
	qr/^[\w-]+; confidence=[01]\.\d\d; candidates=[\w-]+:[01]\.\d\d(?:,[\w-]+:[01]\.\d\d)*$/,
	'the header names the primary, its confidence and the candidates');
$node->safe_psql('postgres', "DELETE $held_sql");

# Refused: the sender gets a DSN, the blocker nothing, another recipient the message.
my $french = text_of('fr', 3);
send_text($french, to => [ 'blocker@local.test', 'reader@local.test' ], subject => 'refused', lang => 'fr');
ok(settled(), 'settled');
is(scalar(maildir_files($root, 'blocker@local.test')), 0, 'French refused for the blocker');
ok((grep { slurp($_) =~ /^Subject: refused\r\n/m } maildir_files($root, 'reader@local.test')),
	'and delivered to the other recipient of the same message');
my @dsns = maildir_files($root, 'sender@local.test');
is(scalar @dsns, 1, 'the sender gets one DSN');
my ($per_message, $per_rcpt) = dsn_fields(parse_dsn(slurp($dsns[0] // '') // ''));
is($per_rcpt->[0]{'final-recipient'} // '', 'rfc822; blocker@local.test', 'for the blocker');
is($per_rcpt->[0]{status} // '', '5.7.1', 'status 5.7.1');
like($per_rcpt->[0]{'diagnostic-code'} // '', qr/does not accept mail in this language/, 'with the diagnostic');
ok(file_shows($d->{log}, qr/refused: in fr, which <blocker\@local\.test> does not take/), 'logged');

# Held, with the verdict in state; delivered once released.
my $held = send_text(text_of('de', 5), to => ['holder@local.test'], subject => 'held', lang => 'de');
ok(poll_until(sub { $node->safe_psql('postgres', "SELECT status FROM pepsi.workqueue WHERE id = $held") eq 'paused' }, 60),
	'German held for the holder');
my $state = decode_json($node->safe_psql('postgres', "SELECT state FROM pepsi.workqueue WHERE id = $held"));
is($state->{language}{primary}, 'de', 'state.language.primary');
ok($state->{language}{confidence} > 0.5 && ref $state->{language}{candidates} eq 'ARRAY'
	  && $state->{language}{candidates}[0]{language} eq 'de', 'state.language: confidence and candidates');
is($state->{language_block}{recipient}, 'holder@local.test', 'state.language_block names the recipient');
is(scalar(maildir_files($root, 'holder@local.test')), 0, 'not delivered while held');
is($node->safe_psql('postgres', "SELECT pepsi.queue_release(ARRAY[$held]::bigint[])"), '1', 'released');
ok(settled(), 'settled');
is(scalar(maildir_files($root, 'holder@local.test')), 1, 'delivered once released');

# Tagged, and delivered; the other recipient's copy is not tagged.
send_text(text_of('es', 7), to => [ 'tagger@local.test', 'reader@local.test' ], subject => 'tagged', lang => 'es',
	shape => 'qp');
ok(settled(), 'settled');
my ($tagged) = maildir_files($root, 'tagger@local.test');
like(slurp($tagged // '') // '', qr/^X-Pepsi-Language-Blocked: es\r\n/m, 'Spanish tagged for the tagger');
my ($untagged) = grep { slurp($_) =~ /^Subject: tagged\r\n/m } maildir_files($root, 'reader@local.test');
ok($untagged && slurp($untagged) !~ /^X-Pepsi-Language-Blocked:/m, 'not for the other recipient');

# Too short, or undecidable: und, never blocked, though the blocker lists und.
send_text('Merci beaucoup !', to => ['blocker@local.test'], subject => 'short', lang => 'fr');
send_text(join(' ', map { substr('qxzvkwjhgfdplmnbtrcs' x 3, $_ % 17, 3 + $_ % 5) } 1 .. 80),
	to => ['blocker@local.test'], subject => 'undecidable', lang => 'und');
ok(settled(), 'settled');
my %blocker = map { my $t = slurp($_); ($t =~ /^Subject: (\w+)\r\n/m)[0] => $t } maildir_files($root, 'blocker@local.test');
like(language_header($blocker{short} // '') // '', qr/^und; confidence=0\.00; reason="too short"/,
	'a short text is und, and delivered');
like(language_header($blocker{undecidable} // '') // '', qr/^und; confidence=0\.00; reason="undecidable"/,
	'an undecidable text is und, and delivered');

# pepsi-detect-language(1): the same verdicts from a file or standard input.
my $cli = pepsi_bin('pepsi-detect-language');
ok(-l $cli, 'pepsi-detect-language is a link to the stage\'s file');
my ($out) = run_command([ $cli, '-t', sprintf('%s/de-02.txt', $texts_dir) ]);
like($out, qr/^de; confidence=/, 'pepsi-detect-language -t FILE');
IPC::Run::run([ $cli, '--json', '-' ], '<', \slurp((maildir_files($root, 'holder@local.test'))[0]), '>', \$out);
my $json = eval { decode_json($out) } // {};
is($json->{primary}, 'de', 'a message on standard input, --json');
my ($bad_out, $bad_err) = run_command([ $cli, '-t', "$texts_dir/missing.txt" ]);
like($bad_err, qr{missing\.txt}, 'an unreadable file is named');

stop_dispatcher($d);
done_testing();
