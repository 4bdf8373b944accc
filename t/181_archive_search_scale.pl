# The archive's search and import at scale (issue 40): a phrase is found by
# its word pairs (exactly the messages with the words adjacent and in order,
# not apart, not reversed; three words too), the count agrees with the page,
# the planner takes the GIN index for a common word's count without any
# enable_* override (EXPLAIN: the plan's node, not a time), pepsi-httpd's
# search page shows archive_search_count's total, not the page's 100, and
# an import writes each message once (no UPDATE of archive_message) and
# leaves every thread's count right after a batch, a reply that came before
# its parent included; the word pairs themselves, at their edges; a
# result's excerpt (archive_excerpt, in C) at its edges, and as the search
# page shows it, escaped; the index's key (archive_search_key) and the
# addresses' obfuscation (archive_obfuscated), both in C, as the SQL they
# replace made them.

use strict;
use warnings FATAL => 'all';

use HTTP::Tiny;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

plan skip_all => 'pepsi-archive is not built' unless -x pepsi_bin('pepsi-archive');

my $db = 'postgres';
my $node = delivery_node('archive_scale');
my $tmp = PostgreSQL::Test::Utils::tempdir();
sub sql { return $node->safe_psql($db, shift) }

my $http_port = PostgreSQL::Test::Cluster::get_free_port();
my $secret = 'web-secret';
sql("CREATE ROLE web LOGIN PASSWORD '$secret' IN ROLE pepsi_httpd");
my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
my $config = write_config($node,
	pepsi => { HOSTNAME => 'mx.pepsi.test', LOCAL_DOMAINS => 'lists.test' },
	stages => <<"CONF");
[httpd]
ADDRESS = 127.0.0.1
PORT = $http_port
CONNINFO = $conninfo user=web password=$secret
CONF
chmod 0600, $config or die "chmod $config: $!";
my @cli = (pepsi_bin('pepsi-archive'), '-C', $config);
my $list = sql("SELECT pepsi.list_create('dev\@lists.test', 'owner\@lists.test')");

# An mbox of messages (id, subject, text, references), dated a minute apart.
my $minute = 0;
sub mbox
{
	my $text = '';
	for my $m (@_)
	{
		my ($id, $subject, $body, $refs) = @$m;
		my @refs = map { "<$_\@client.test>" } split ' ', $refs // '';
		$text .= "From x\@client.test Mon Dec  7 10:00:00 2026\nFrom: X <x\@client.test>\nTo: dev\@lists.test\n"
		  . "Subject: $subject\nMessage-Id: <$id\@client.test>\n"
		  . (@refs ? "In-Reply-To: $refs[-1]\nReferences: @refs\n" : '')
		  . sprintf("Date: Mon, 07 Dec 2026 %02d:%02d:00 +0000\n", 8 + int($minute / 60), $minute % 60)
		  . "\n$body\n\n";
		$minute++;
	}
	return $text;
}
sub import_mbox
{
	my ($name, $text) = @_;
	my ($out, $err) = ('', '');
	append_to_file("$tmp/$name.mbox", $text);
	ok(IPC::Run::run([ @cli, 'import', 'dev@lists.test', "$tmp/$name.mbox" ], '>', \$out, '2>', \$err),
		"pepsi-archive imports $name")
	  or diag($err);
	return $out;
}
sub updates { return sql("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'pepsi.archive_message'::regclass") }
sub inserts { return sql("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'pepsi.archive_message'::regclass") }

# 1. The phrases, 150 posts in threads of three with a common word (more
#    than a page) and 150 without it, imported in order: no message is
#    written twice.
my @phrases = (
	[ 'adjacent', 'Words', 'the quick brown fox jumps' ],
	[ 'reversed', 'Words', 'the brown quick fox jumps' ],
	[ 'apart', 'Words', 'quick and then brown fox' ],
	[ 'lines', 'Words', "a quick\nbrown dog" ],
	[ 'subject', 'Quick Brown', 'nothing more' ]);
my @walrus = map { [ "w$_", 'Walrus ' . int($_ / 3), "the walrus number $_ speaks",
		$_ % 3 ? join(' ', map { 'w' . $_ } (3 * int($_ / 3)) .. ($_ - 1)) : '' ] } 0 .. 149;
my @seal = map { [ "s$_", "Seal $_", "the seal number $_ barks" ] } 0 .. 149;
my ($inserted, $updated) = (inserts(), updates());
like(import_mbox('first', mbox(@phrases, @walrus, @seal)), qr/^305 message\(s\) archived, 0 already there$/m,
	'every message');
ok(poll_until(sub { inserts() >= $inserted + 305 }, 60), 'the import\'s counts are in the statistics');
is(updates() - $updated, 0, 'each message is written once, with its thread (no UPDATE of archive_message)');
is(sql("SELECT count(*) FROM pepsi.archive_thread WHERE list_id = $list AND subject LIKE 'Walrus%' AND message_count = 3"),
	'50', 'the threads counted once a batch: 50 threads of three');

sub found
{
	my ($query) = @_;
	return sql("SELECT string_agg(m.message_id, ' ' ORDER BY m.message_id) FROM pepsi.archive_search($list, '$query', 1000) s"
		  . " JOIN pepsi.archive_message m ON m.id = s.id");
}
is(found('"quick brown"'), 'adjacent@client.test lines@client.test subject@client.test',
	'a phrase finds the words adjacent and in order (across a line, in a subject), not apart or reversed');
is(sql("SELECT pepsi.archive_search_count($list, '\"quick brown\"')"), '3', 'its count agrees with the page');
is(found('"brown quick"'), 'reversed@client.test', 'the reverse phrase finds the reversed words only');
is(found('"quick brown fox"'), 'adjacent@client.test', 'a phrase of three words: all three in order');
is(sql("SELECT pepsi.archive_search_count($list, '\"quick brown fox\"')"), '1', 'counted alike');
is(found('"quick brown" -dog'), 'adjacent@client.test subject@client.test', 'a phrase with a word excluded');
is(sql("SELECT pepsi.archive_search_query($list, '\"quick brown\"')::text"), "'quick brown' & '#list$list'",
	'a two-word phrase is one lexeme of the index (its word pair)');
is(sql("SELECT pepsi.archive_search_count($list, 'walrus')"), '150', 'a common word\'s count');
is(sql("SELECT count(*) FROM pepsi.archive_search($list, 'walrus', 100)"), '100', 'its page holds 100');
like(sql("SELECT excerpt FROM pepsi.archive_search($list, 'fox', 100) s WHERE s.id ="
		  . " (SELECT id FROM pepsi.archive_message WHERE message_id = 'adjacent\@client.test')"),
	qr/«fox»/, 'the excerpt shows the word');

# 2. The planner alone takes the index: no enable_* in the functions, and
#    a common word's count (in 150 of 305 messages) is the GIN index's bitmap.
is(sql("SELECT string_agg(p.proname || ' ' || c, ', ') FROM pg_proc p, unnest(p.proconfig) c"
		  . " WHERE p.pronamespace = 'pepsi'::regnamespace AND p.proname LIKE 'archive%' AND c LIKE 'enable%'"),
	'archive_search_count enable_seqscan=off', 'no archive function overrides the planner but the count, its sequential scan');
is(sql("SELECT 'max_parallel_workers_per_gather=0' = ANY (proconfig) FROM pg_proc"
		  . " WHERE oid = 'pepsi.archive_search_count(bigint, text)'::regprocedure"), 't',
	'the count takes no parallel worker (its bitmap\'s rows are counted, not checked: a worker costs more)');
sql("ANALYZE pepsi.archive_message");
for my $q ('walrus', '"quick brown"', 'quick')
{
	my $plan = sql("EXPLAIN (COSTS OFF) SELECT count(*) FROM pepsi.archive_message m"
		  . " WHERE pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($list, '$q')");
	like($plan, qr/Bitmap Index Scan on archive_message_list_search/, "the count of $q is planned on the GIN index")
	  or diag($plan);
	unlike($plan, qr/Seq Scan/, 'not a sequential scan');
}
# A query nearly every message matches (a word excluded, two common
# words or'ed): the planner, left alone, scans the table for the first
# (it charges the bitmap the key's COST for each row too); the count
# takes the bitmap, counted without checking a row, and no sequential
# scan (the scans of its own transaction).
my $every = sql("EXPLAIN (COSTS OFF) SELECT count(*) FROM pepsi.archive_message m"
	  . " WHERE pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($list, '-zyzzyva')");
like($every, qr/Seq Scan/, 'left alone, the planner scans the table for a word excluded') or diag($every);
for my $q ('-zyzzyva', 'walrus or seal')
{
	is(sql("BEGIN; SELECT pepsi.archive_search_count($list, '$q');"
			  . " SELECT seq_scan || ' ' || idx_scan FROM pg_stat_xact_user_tables WHERE relid = 'pepsi.archive_message'::regclass;"
			  . " COMMIT"),
		($q eq '-zyzzyva' ? 305 : 300) . "\n0 1", "archive_search_count($q): the index, no sequential scan");
}

# The excerpts are made after the sort and the LIMIT (archive_excerpt's
# cost says it is dear), for the rows shown only, not for every match:
# the page's query as archive_search runs it, a phrase's matches sorted.
my $page_plan = sql("EXPLAIN (VERBOSE, COSTS OFF) SELECT m.id, pepsi.archive_excerpt(m.body_text,"
	  . " websearch_to_tsquery('simple', '\"quick brown\"')) FROM pepsi.archive_message m WHERE m.list_id = $list"
	  . " AND pepsi.archive_search_key(m.list_id, m.search) @@ pepsi.archive_search_query($list, '\"quick brown\"')"
	  . " ORDER BY m.sent_at DESC, m.id DESC LIMIT 10");
like($page_plan, qr/Limit\n\s+Output: [^\n]*\n\s+->  Result\n\s+Output: [^\n]*archive_excerpt/,
	'the excerpt is made above the LIMIT\'s input')
  or diag($page_plan);
unlike($page_plan =~ s/^.*?->  Result\n[^\n]*\n//sr, qr/archive_excerpt/, 'not for the rows the LIMIT leaves out')
  or diag($page_plan);

# 3. pepsi-httpd's search page shows the total, not the 100 it lists.
my $httpd = start_dispatcher($config, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(poll_until(sub { file_shows("$tmp/httpd.log", qr/ready/) }, 60), 'pepsi-httpd starts');
my $http = HTTP::Tiny->new(timeout => 30, max_redirect => 0);
my $page = $http->get("http://127.0.0.1:$http_port/archive/dev\@lists.test/search?q=walrus");
is($page->{status}, 200, 'the search page');
like($page->{content}, qr{<p id="found">150 found</p>}, 'shows the total found');
is(scalar(() = $page->{content} =~ /<li>/g), 100, 'and lists the newest 100');
like($http->get("http://127.0.0.1:$http_port/archive/dev\@lists.test/search?q=zyzzyva")->{content},
	qr{<p id="found">0 found</p>}, 'nothing found: 0');
stop_dispatcher($httpd);

# 4. A reply before its parent, in one batch: the parent adopts it, and the
#    thread's count is right at the end of the batch.
import_mbox('late', mbox([ 't3', 'Re: Late', 'third', 't1 t2' ], [ 't2', 'Re: Late', 'second', 't1' ],
		[ 't1', 'Late', 'first' ], [ 'u1', 'Other', 'alone' ]));
is(sql("SELECT string_agg(t.message_count || ' ' || t.subject, ', ' ORDER BY t.subject) FROM pepsi.archive_thread t"
		  . " WHERE t.subject IN ('Late', 'Other')"), '3 Late, 1 Other', 'the late parent\'s thread counts three');
is(sql("SELECT string_agg(m.message_id || '<' || coalesce(p.message_id, '-'), ' ' ORDER BY m.message_id)"
		  . " FROM pepsi.archive_message m LEFT JOIN pepsi.archive_message p ON p.id = m.parent_id"
		  . " WHERE m.message_id LIKE 't_\@client.test'"),
	't1@client.test<- t2@client.test<t1@client.test t3@client.test<t2@client.test', 'each under its parent');
is(sql("SELECT count(*) FROM pepsi.archive_thread t WHERE t.message_count <>"
		  . " (SELECT count(*) FROM pepsi.archive_message m WHERE m.thread_id = t.id)"), '0',
	'every thread\'s count is its messages');
is(sql("SELECT count(DISTINCT thread_id) FROM pepsi.archive_message WHERE message_id LIKE 't_\@client.test'"), '1',
	'one thread');

# 5. The word pairs (archive_word_pairs, in C): each two lexemes at adjacent
#    positions, once; of lexemes sharing a position, the last in lexeme
#    order pairs with the next position; a pair of 100 bytes or more left
#    out; past 400,000 bytes of pairs only the first 3,800 kept.
is(sql("SELECT pepsi.archive_word_pairs('a:1 b:2 c:2 d:3 e:5 f:6 a:7 b:8')::text"), "'a b' 'c d' 'e f' 'f a'",
	'adjacent positions pair, a gap does not, a repeated pair is one lexeme');
is(sql("SELECT pepsi.archive_word_pairs(NULL)::text"), '', 'no words, no pairs');
is(sql("SELECT pepsi.archive_word_pairs(to_tsvector('simple', repeat('x', 60) || ' ' || repeat('y', 40) || ' z'))::text"),
	"'" . ('y' x 40) . " z'", 'a pair of 100 bytes or more is left out');
is(sql("SELECT length(pepsi.archive_word_pairs(to_tsvector('simple',"
		  . " string_agg('word' || (i % 5000) || repeat('x', 40), ' ' ORDER BY i)))) FROM generate_series(1, 20000) i"),
	'3800', 'past 400,000 bytes, the first 3,800 pairs');

# 6. The excerpt (archive_excerpt, in C): the query's words marked « » in
#    any case, whole words only, at the text's start and end, in
#    multibyte text; the text's start when no word of the query is in it;
#    punctuation and markup kept as text; two fragments at most, joined by
#    " ... "; a long text cut at word boundaries, a long word at a
#    character's boundary; only the first 20,000 bytes looked at.
sub excerpt
{
	my ($body, $query, $fn) = @_;
	$fn //= 'websearch_to_tsquery';
	return sql("SELECT pepsi.archive_excerpt($body, $fn('simple', '$query'))");
}
is(excerpt("'The quick brown fox jumps over the lazy dog'", 'fox'),
	'The quick brown «fox» jumps over the lazy dog', 'a word marked in its sentence');
is(excerpt("'Fox at the start, foxes and fox-trot'", 'fox'), '«Fox» at the start, foxes and «fox»-trot',
	'at the start, in any case, whole words only (a hyphenated word by its parts)');
is(excerpt("E'at the end a FOX'", 'fox'), 'at the end a «FOX»', 'at the end');
is(excerpt("E'nothing\n\n  here\tat all'", 'fox'), 'nothing here at all',
	'no word of the query: the text\'s start, its white space one space');
is(excerpt("'<b>fox</b> & \"dog\". (fox)'", 'fox'), '<b>«fox»</b> & "dog". («fox»)',
	'punctuation and markup kept as text (the page escapes them)');
is(excerpt("'Grüße aus köln, grüßt älter'", 'grüßt'), 'Grüße aus köln, «grüßt» älter', 'multibyte words');
is(excerpt("'the quick brown fox'", '"quick brown" -dog'), 'the «quick» «brown» fox', 'a phrase\'s words');
is(excerpt("'the quick brown fox'", 'qui:*', 'to_tsquery'), 'the «quick» brown fox', 'a prefix');
is(excerpt("''", 'fox'), '', 'an empty text');
is(excerpt("'!!! --- ...'", 'fox'), '!!! --- ...', 'a text without words');
is(excerpt("(SELECT string_agg('a' || i, ' ') || ' fox ' || string_agg('b' || i, ' ') || ' fox end.'"
		  . " FROM generate_series(1, 60) i)", 'fox'),
	join(' ', map { "a$_" } 53 .. 60) . ' «fox» ' . join(' ', map { "b$_" } 1 .. 26) . ' ... '
	  . join(' ', map { "b$_" } 53 .. 60) . ' «fox» end.',
	'two fragments of 35 words from 8 before each word found, joined by " ... "');
is(excerpt("'a fox b ' || repeat('c ', 60) || 'fox'", 'fox'), 'a «fox» b ' . ('c ' x 31) . 'c ... ' . ('c ' x 8) . '«fox»',
	'the second fragment from the first word found past the first');
is(excerpt("'a fox b ' || repeat('c ', 40) || 'fox'", 'fox'), 'a «fox» b ' . ('c ' x 40) . '«fox»',
	'a second fragment that starts where the first ends goes on from it');
is(excerpt("'one fox two fox three'", 'fox'), 'one «fox» two «fox» three', 'one fragment holds both');
# a word of 'a' and 5,000 two-byte characters, none of the query's words:
# cut at 320 bytes, which in UTF-8 would split a character
my $utf8 = sql('SHOW server_encoding') eq 'UTF8';
my $cut = excerpt("'a' || repeat('é', 5000)", 'fox');
is(length($cut), $utf8 ? 319 : 320, 'a word of 10,001 bytes cut at 320 bytes' . ($utf8 ? ', before the character they would split' : ''))
  or diag($cut);
like($cut, qr/^a(?:é)+$/, 'its first characters, whole');
# the 20,000 bytes read end within a character (UTF-8): the word is its
# whole characters
is(excerpt("repeat('x', 19990) || ' ' || repeat('é', 100)", 'éé:*', 'to_tsquery'),
	$utf8 ? '«éééé»' : 'x' x 320, 'the text read ends at a character\'s boundary');
is(excerpt("repeat('word ', 10000) || 'fox'", 'fox'), join(' ', ('word') x 35),
	'only the first 20,000 bytes are searched: past them, the start');
is(sql("SELECT pepsi.archive_excerpt(NULL, websearch_to_tsquery('simple', 'fox')) IS NULL"), 't', 'no text, no excerpt');
# The words are read only as long as a word of the query may be left
# (its letters in any case, anywhere in the rest of the text): past that,
# the excerpt is what reading them all made.  A rare word's second
# occurrence far down, a word holding the query's and a prefix there too:
is(excerpt("'a fox b ' || repeat('c ', 3000) || 'fox d'", 'fox'),
	'a «fox» b ' . ('c ' x 31) . 'c ... ' . ('c ' x 8) . '«fox» d', 'a second word found 3,000 words on');
is(excerpt("'a fox b ' || repeat('c ', 3000) || 'foxes d'", 'fox'), 'a «fox» b ' . ('c ' x 31) . 'c',
	'a word that holds the query\'s is not it');
is(excerpt("'a fox b ' || repeat('c ', 3000) || 'FOXES d'", 'fox:*', 'to_tsquery'),
	'a «fox» b ' . ('c ' x 31) . 'c ... ' . ('c ' x 8) . '«FOXES» d', 'a prefix found far down, in upper case');
is(excerpt("repeat('c ', 34) || 'c. fox'", 'dog'), ('c ' x 34) . 'c.', 'no word found: the first 35 words, with their punctuation');
# The words are read from a few before the first place the query's
# letters are (its first fragment starts 8 words before the word found):
# as if all were read, the punctuation before the fragment's first word
# up to the end of the word before it; letters of the query only within
# other words: the text's start.
is(excerpt("repeat('c ', 3000) || 'y.(b c c c c c c c fox d'", 'fox'), '.(b c c c c c c c «fox» d',
	'a rare word far down: 8 words before it, the punctuation after the word before them');
is(excerpt("repeat('c ', 3000) || 'foxes d'", 'fox'), join(' ', ('c') x 35),
	'the query\'s letters only within another word: the text\'s start');
# Every excerpt of a hundred generated texts (up to 5,200 words, past the
# 20,000 bytes read; words of the query once, often or never, in any
# case, inside other words) for seven queries, as archive_excerpt made
# them when it read every word (0.13): a digest of them all, so that any
# change of any excerpt shows.
is(sql(<<'FINGERPRINT'), '700|174084|71d05f77b52d81fe00babd69795f62d4', 'the excerpts of generated texts, unchanged');
WITH texts AS (
    SELECT i, string_agg(
        CASE WHEN h % 1499 = 0 THEN 'quokka'
             WHEN h % 1801 = 0 THEN 'Quokkas'
             WHEN h % 2003 = 0 THEN 'QUOKKA.'
             WHEN h % 97 = 0 THEN E'\n\n'
             WHEN h % 89 = 0 THEN '(<b>w' || (h % 7) || '</b>)'
             ELSE 'w' || (h % 61) || CASE WHEN h % 13 = 0 THEN ',' ELSE '' END END,
        ' ' ORDER BY j) AS body
    FROM generate_series(1, 100) i, generate_series(1, (i * 97) % 5200 + 1) j,
         LATERAL (SELECT ('x' || left(md5(i || '-' || j), 8))::bit(32)::bigint AS h) x
    GROUP BY i),
queries AS (
    SELECT * FROM (VALUES (1, websearch_to_tsquery('simple', 'quokka')), (2, websearch_to_tsquery('simple', 'w3')),
                          (3, websearch_to_tsquery('simple', '"w3 w4"')), (4, websearch_to_tsquery('simple', 'zyzzyva')),
                          (5, to_tsquery('simple', 'quok:*')), (6, websearch_to_tsquery('simple', 'w60 or quokka')),
                          (7, websearch_to_tsquery('simple', 'w5 -w6'))) q(n, q))
SELECT count(*), sum(length(e)), md5(string_agg(e, '|' ORDER BY i, n))
FROM texts, queries, LATERAL (SELECT pepsi.archive_excerpt(body, q) AS e) x
FINGERPRINT

# The search page shows the excerpt escaped, its marks as they are.
import_mbox('markup', mbox([ 'markup', 'Markup', '<script>alert(1)</script> the narwhal & "friends"' ]));
my $web = start_dispatcher($config, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd2.log");
ok(poll_until(sub { file_shows("$tmp/httpd2.log", qr/ready/) }, 60), 'pepsi-httpd starts again');
my $markup = $http->get("http://127.0.0.1:$http_port/archive/dev\@lists.test/search?q=narwhal")->{content};
like($markup, qr{<blockquote>&lt;script&gt;alert\(1\)&lt;/script&gt; the «narwhal» &amp; &quot;friends&quot;</blockquote>},
	'the page escapes the excerpt and shows the word marked')
  or diag($markup);
unlike($markup, qr/<script>/, 'no markup of the text reaches the page');
stop_dispatcher($web);

# 7. The key the index is on (archive_search_key, in C) is the message's
#    tsvector and its list's lexeme, as the SQL expression it replaces made
#    it, positions and all; the obfuscation (archive_obfuscated, in C) is
#    what the regular expressions made: each address, leftmost then
#    longest, user at domain (at, and no policy), user@... (hide), as it
#    is (none).
is(sql("SELECT count(*) FROM pepsi.archive_message m WHERE pepsi.archive_search_key(m.list_id, m.search)::text"
		  . " IS DISTINCT FROM (m.search || array_to_tsvector(ARRAY['#list' || m.list_id]))::text"), '0',
	'the key of every archived message is its tsvector and its list\'s lexeme');
is(sql("SELECT pepsi.archive_search_key(42, 'b:2 zz:1 a:3A,4 x')::text"), "'#list42' 'a':3A,4 'b':2 'x' 'zz':1",
	'the list\'s lexeme in its place, the positions and weights kept');
is(sql("SELECT pepsi.archive_search_key(42, array_to_tsvector('{#list42,x}'))::text"), "'#list42' 'x'",
	'a tsvector that has the lexeme already is as it was');
is(sql("SELECT pepsi.archive_search_key(7, to_tsvector('simple', 'quick brown fox'))"
		  . " @@ (to_tsquery('simple', 'quick <-> brown') && '#list7'::tsquery)"),
	't', 'a phrase is checked on the key\'s positions');
my $addresses = 'Mail a.b+c@ex-ample.org.uk, x@y, @z.com, r@a.b.c1 u@x.com.y@z.org v@w.co+k@l.de é@x.org fin@e.fr';
sub obfuscated { return sql("SELECT pepsi.archive_obfuscated($_[0], '$addresses')") }
is(obfuscated("'at'"),
	'Mail a.b+c at ex-ample.org.uk, x@y, @z.com, r at a.b.c1 u at x.com.y@z.org v at w.co+k at l.de é@x.org fin at e.fr',
	'at: each address user at domain, the rest as it was');
is(obfuscated("'hide'"), 'Mail a.b+c@..., x@y, @z.com, r@...1 u@...@z.org v@...+k@... é@x.org fin@...', 'hide: user@...');
is(obfuscated("'none'"), $addresses, 'none: as it is');
is(obfuscated('NULL'), obfuscated("'at'"), 'no policy: at, as the default');
is(sql("SELECT pepsi.archive_obfuscated('at', NULL) IS NULL"), 't', 'no text, none');
is(sql("SELECT pepsi.archive_obfuscated('at', 'no address here')"), 'no address here', 'a text without an @');
# 3,000 texts of one to 40 pieces of an address's characters (md5 picks
# them: the same texts every run), some 500 of them with an address
is(sql(<<'SQL'), '0 496', '3,000 texts of addresses\' characters: what the regular expressions made');
WITH t AS (SELECT string_agg(substr('aZ9.@@-+_%=. x~@b.c.de-', 1 + get_byte(decode(md5(k || ':' || i), 'hex'), 0) % 24,
                                    1 + get_byte(decode(md5(k || ':' || i), 'hex'), 1) % 2), '' ORDER BY i) s
           FROM generate_series(1, 3000) k, generate_series(1, 1 + k % 40) i GROUP BY k)
SELECT count(*) FILTER (WHERE pepsi.archive_obfuscated(o.how, t.s) IS DISTINCT FROM CASE o.how
           WHEN 'hide' THEN regexp_replace(t.s, '([A-Za-z0-9._%+=-]+)@[A-Za-z0-9.-]+\.[A-Za-z]+', '\1@...', 'g')
           ELSE regexp_replace(t.s, '([A-Za-z0-9._%+=-]+)@([A-Za-z0-9.-]+\.[A-Za-z]+)', '\1 at \2', 'g') END)
       || ' ' || count(*) FILTER (WHERE o.how = 'at' AND pepsi.archive_obfuscated(o.how, t.s) <> t.s)
FROM t, (VALUES ('at'), ('hide')) o(how)
SQL
is(sql("SELECT count(*) FROM pg_proc WHERE pronamespace = 'pepsi'::regnamespace"
		  . " AND proname IN ('archive_search_pattern', 'archive_excerpt_window')"), '0',
	'the excerpt window\'s old functions are gone');

# 8. An import into a list the statistics do not know (a new list, or any
#    list during its first import): each message is looked up by its
#    Message-Id in the unique index, not found by reading every message of
#    the list in date order (archive_store_message's plans are generic;
#    custom plans read some 4,400 rows a message over a 50,000-message
#    import).  Two imports into one list that end together: their
#    recounts of the months take turns, where the second failed on
#    archive_month's key.
sql("ANALYZE pepsi.archive_message");
sub date_reads
{
	return sql("SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelid = 'pepsi.archive_message_list_sent'::regclass");
}
my $fresh = sql("SELECT pepsi.list_create('fresh\@lists.test', 'owner\@lists.test')");
my ($reads, $before) = (date_reads(), inserts());
append_to_file("$tmp/fresh.mbox", mbox(map { [ "f$_", "Fresh $_", "a fresh post number $_" ] } 0 .. 199));
my ($out, $err) = ('', '');
ok(IPC::Run::run([ @cli, 'import', 'fresh@lists.test', "$tmp/fresh.mbox" ], '>', \$out, '2>', \$err),
	'200 messages into a new list') or diag($err);
ok(poll_until(sub { inserts() >= $before + 200 }, 60), 'its counts are in the statistics');
cmp_ok(date_reads() - $reads, '<', 200, 'no message read the list\'s messages in date order to find its own');
{
	my $first = $node->background_psql($db);
	my $second = $node->background_psql($db);
	$first->query_safe('BEGIN');
	$first->query_safe("SELECT pepsi.archive_month_recount($fresh)");
	$second->query_safe('BEGIN');
	$second->query_until(qr/recounting/, "\\echo recounting\nSELECT pepsi.archive_month_recount($fresh);\n");
	$first->query_safe('COMMIT');
	ok(eval { $second->query_safe('COMMIT'); 1 }, 'a recount that waited for another ends without an error')
	  or diag($@);
	$first->quit;
	$second->quit;
}
is(sql("SELECT sum(messages) FROM pepsi.archive_month WHERE list_id = $fresh"), '200', 'the months count the list\'s messages');

done_testing();
