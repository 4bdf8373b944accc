# pepsi-httpd against a real cluster: /metrics parsed by the Prometheus
# project's own parser (python3-prometheus-client) and checked against the
# SQL views; the API's authentication (tokens: missing, wrong, revoked;
# sessions: login, CSRF, cross-site), actions recorded in event_log with the
# administrator's name, bad requests of every kind answered 4xx with JSON,
# and SIGHUP: a new certificate for new connections, a bad file refused.
# Host must name the server (DNS rebinding): [httpd] SERVER_NAMES, or the
# address the connection came in on, else 421.  Failed logins are
# throttled per client and per account; a database failure during login
# answers 503 and is not counted as a failed login.

use strict;
use warnings FATAL => 'all';

use File::Copy qw(copy);
use HTTP::Tiny;
use IO::Socket::INET;
use IO::Socket::SSL;
use IPC::Run;
use MIME::Base64;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use DispatchTest;
use PepsiTest;

my $node = dispatch_node('httpd');
my $db = 'postgres';
my $tmp = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();

# pepsi-httpd's own login role: a member of pepsi_httpd and nothing else.
$node->safe_psql($db, 'CREATE ROLE web LOGIN IN ROLE pepsi_httpd');

my $conninfo = 'host=' . $node->host . ' port=' . $node->port . " dbname=$db";
sub write_conf
{
	my ($path, $extra) = @_;
	open my $fh, '>', $path or die "$path: $!";
	print $fh "[database]\nCONNINFO = $conninfo\n[httpd]\nADDRESS = 127.0.0.1\nPORT = $port\n"
	  . "CONNINFO = $conninfo user=web\n" . ($extra // '');
	close $fh;
}
my $conf = "$tmp/pepsi.conf";
write_conf($conf);

# Credentials: an administrator, a token, a revoked token.
sub httpd_command
{
	my ($input, @args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ pepsi_bin('pepsi-httpd'), '-c', $conf, @args ], '<', \$input, '>', \$out, '2>', \$err);
	return ($? >> 8, $out, $err);
}
my ($rc, $out, $err) = httpd_command("correct horse battery\n", 'passwd', 'admin');
is($rc, 0, 'pepsi-httpd passwd sets an administrator') or diag $err;
like($node->safe_psql($db, "SELECT password_hash FROM pepsi.admin_account WHERE name = 'admin'"),
	qr/^\$argon2id\$v=19\$m=19456,t=2,p=1\$/, 'only an Argon2id hash of the password is stored');
($rc, $out, $err) = httpd_command("short\n", 'passwd', 'admin');
isnt($rc, 0, 'a password under 8 characters is refused');
like($err, qr/at least 8 characters/, '... saying why');
(undef, my $token) = httpd_command('', 'token', 'ci');
chomp $token;
like($token, qr/^pepsi_[0-9a-f]{96}$/, 'pepsi-httpd token prints a new token once');
(undef, my $revoked) = httpd_command('', 'token', 'old');
chomp $revoked;
$node->safe_psql($db, "SELECT pepsi.api_token_revoke('old')");
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.api_token WHERE digest = sha256(convert_to('$token', 'UTF8'))"),
	'1', 'the token is stored as its SHA-256 digest');
($rc, undef, $err) = httpd_command('', 'token', 'ci');
like($err, qr/exists already/, 'a second token of the same name is refused');

# Some mail: two stages, one row held.
my @init = add_rows($node, 3, quiet => 1);
my @later = add_rows($node, 2, stage => 'relay', quiet => 1, sender => '192.0.2.7');

# A test that dies leaves no server behind.
my $httpd;
END { kill 'KILL', $httpd->{pid} if $httpd && !defined $httpd->{status} }
$httpd = start_dispatcher($conf, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd.log");
ok(file_shows("$tmp/httpd.log", qr/ready/), 'pepsi-httpd starts');

my $base = "http://127.0.0.1:$port";
my $http = HTTP::Tiny->new(timeout => 10, max_redirect => 0);
sub json_of { my $r = shift; return eval { decode_json($r->{content}) } }

# /metrics, parsed by prometheus_client.
sub scrape
{
	my $r = $http->get("$base/metrics");
	is($r->{status}, 200, '/metrics answers 200');
	like($r->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4}, '... in the text format 0.0.4');
	my ($ok, $samples) = prometheus_samples($r->{content});
	ok($ok, 'the Prometheus parser accepts the whole exposition') or diag $samples;
	return $ok ? %$samples : ();
}
my %m = scrape();
my $summary = $node->safe_psql($db,
	"SELECT string_agg(stage || '/' || status || '=' || messages, ' ' ORDER BY stage, status) FROM pepsi.queue_summary");
my $from_metrics = join ' ', map { /^pepsi_queue_messages\{stage=(.*),status=(.*)\}$/ ? "$1/$2=" . int($m{$_}) : () }
  sort grep { /^pepsi_queue_messages\{/ } keys %m;
is($from_metrics, $summary, 'pepsi_queue_messages matches pepsi.queue_summary') or diag explain \%m;
ok(exists $m{'pepsi_dispatch_messages_failed_total{}'}, 'the dispatcher counters are there');
ok(exists $m{'pepsi_dns_addresses{}'}, 'and the DNS cache size');

# A change shows at the next scrape (a small queue is counted live).
$node->safe_psql($db, "SELECT pepsi.queue_hold(ARRAY[$init[0]]::bigint[])");
%m = scrape();
is(int($m{'pepsi_queue_held_messages{stage=init,status=paused}'} // -1), 1, 'a hold shows at once');

# The API: who may ask.
my $r = $http->get("$base/api/summary");
is($r->{status}, 401, 'no credential: 401');
like(json_of($r)->{error}, qr/log in/, '... with a JSON error');
$r = $http->get("$base/api/summary", { headers => { Authorization => 'Bearer pepsi_nonsense' } });
is($r->{status}, 401, 'a wrong token: 401');
$r = $http->get("$base/api/summary", { headers => { Authorization => "Bearer $revoked" } });
is($r->{status}, 401, 'a revoked token: 401');
my %bearer = (Authorization => "Bearer $token");
$r = $http->get("$base/api/summary", { headers => \%bearer });
is($r->{status}, 200, 'a valid token: 200');
is(scalar @{ json_of($r) }, 3, 'the summary lists init/pending, init/paused and relay/pending');

$r = $http->get("$base/api/queue?stage=relay", { headers => \%bearer });
is_deeply([ sort map { $_->{id} } @{ json_of($r) } ], [ sort @later ], 'the queue filtered by stage');
is_deeply([ sort map { $_->{queue_id} } @{ json_of($r) } ], [ sort @later ],
	'... each with its queue id (a row admitted without one: its row id)');
$node->safe_psql($db, "UPDATE pepsi.workqueue SET state = state || '{\"queue_id\": \"4Yj3Rb0Wg1p9000\"}' WHERE id = $init[1]");
$r = $http->get("$base/api/queue/$init[1]", { headers => \%bearer });
is(json_of($r)->{mail_from}, 'sender@example.org', 'one message');
is(json_of($r)->{queue_id}, '4Yj3Rb0Wg1p9000', '... with its queue id');
is(MIME::Base64::decode_base64(json_of($r)->{headers_base64}), 'Subject: test', '... with its headers');
$r = $http->get("$base/api/queue?stage=init", { headers => \%bearer });
is((grep { $_->{id} == $init[1] } @{ json_of($r) })[0]{queue_id}, '4Yj3Rb0Wg1p9000', '... in the list too');
$r = $http->get("$base/api/queue/999999", { headers => \%bearer });
is($r->{status}, 404, 'an unknown message: 404');
$r = $http->get("$base/api/queue?status=lost", { headers => \%bearer });
is($r->{status}, 400, 'a status that does not exist: 400');
like(json_of($r)->{error}, qr/invalid input value for enum/, '... naming the problem');

# An action with a token, audited with the token's name.
$r = $http->post("$base/api/queue/hold",
	{ headers => { %bearer, 'Content-Type' => 'application/json' }, content => encode_json({ ids => [ 0 + $later[0] ] }) });
is($r->{status}, 200, 'hold through the API') or diag $r->{content};
is(json_of($r)->{count}, 1, '... one message held');
is($node->safe_psql($db, "SELECT timeout = 'infinity' FROM pepsi.workqueue WHERE id = $later[0]"), 't',
	'the row is on hold');
is($node->safe_psql($db, "SELECT principal FROM pepsi.event_log WHERE action = 'queue_hold' ORDER BY id DESC LIMIT 1"),
	'web:token:ci', 'event_log names the token');

# A browser session.
$r = $http->post("$base/api/login", { headers => { 'Content-Type' => 'application/json' },
	content => encode_json({ name => 'admin', password => 'wrong password' }) });
is($r->{status}, 401, 'a wrong password: 401');
$r = $http->post("$base/api/login", { headers => { 'Content-Type' => 'application/x-www-form-urlencoded' },
	content => 'name=admin&password=correct+horse+battery' });
is($r->{status}, 415, 'a form post cannot log in (only JSON)');
$r = $http->post("$base/api/login", { headers => { 'Content-Type' => 'application/json', Origin => 'http://evil.example' },
	content => encode_json({ name => 'admin', password => 'correct horse battery' }) });
is($r->{status}, 403, 'a login from another origin is refused');
$r = $http->post("$base/api/login", { headers => { 'Content-Type' => 'application/json' },
	content => encode_json({ name => 'admin', password => 'correct horse battery' }) });
is($r->{status}, 200, 'the right password logs in');
my $set_cookie = $r->{headers}{'set-cookie'};
like($set_cookie, qr/^pepsi_session=[0-9a-f]{64}; Path=\/; Max-Age=\d+; HttpOnly; SameSite=Strict$/,
	'the session cookie is HttpOnly and SameSite=Strict');
my ($cookie) = $set_cookie =~ /^(pepsi_session=[0-9a-f]+)/;
my $csrf = json_of($r)->{csrf};
is($node->safe_psql($db, 'SELECT count(*) FROM pepsi.admin_session'), '1', 'one session row');
(my $secret = $cookie) =~ s/^pepsi_session=//;
is($node->safe_psql($db, "SELECT count(*) FROM pepsi.admin_session WHERE digest = sha256('$secret'::bytea)"),
	'1', '... holding the digest of the cookie, not the cookie');

my %browser = (Cookie => $cookie, 'Content-Type' => 'application/json');
$r = $http->get("$base/api/session", { headers => \%browser });
is(json_of($r)->{account}, 'admin', 'the session knows its administrator');
my $release = encode_json({ ids => [ 0 + $later[0] ] });
$r = $http->post("$base/api/queue/release", { headers => \%browser, content => $release });
is($r->{status}, 403, 'a change without the CSRF token is refused');
like(json_of($r)->{error}, qr/X-CSRF-Token/, '... naming the header');
$r = $http->post("$base/api/queue/release", { headers => { %browser, 'X-CSRF-Token' => $csrf, Origin => 'http://evil.example' },
	content => $release });
is($r->{status}, 403, 'a cross-site POST is refused even with the token');
$r = $http->post("$base/api/queue/release", { headers => { %browser, 'X-CSRF-Token' => $csrf, 'Sec-Fetch-Site' => 'cross-site' },
	content => $release });
is($r->{status}, 403, '... and so is one the browser marks cross-site');
$r = $http->post("$base/api/queue/release", { headers => { %browser, 'X-CSRF-Token' => $csrf, Origin => $base },
	content => $release });
is($r->{status}, 200, 'a same-origin change with the token is done');
is($node->safe_psql($db, "SELECT principal FROM pepsi.event_log WHERE action = 'queue_release' ORDER BY id DESC LIMIT 1"),
	'web:admin', 'event_log names the administrator');

# The configuration overlay, audited too.
$r = $http->post("$base/api/config", { headers => { %browser, 'X-CSRF-Token' => $csrf },
	content => encode_json({ section => 'dispatch', option => 'POLL_INTERVAL', value => '3s' }) });
is($r->{status}, 200, 'config set through the API') or diag $r->{status}, $r->{content};
is($node->safe_psql($db, "SELECT updated_by FROM pepsi.config_override WHERE option = 'POLL_INTERVAL'"),
	'web:admin', 'the override names who set it');
$r = $http->get("$base/api/config?section=dispatch&option=POLL_INTERVAL", { headers => \%browser });
is(json_of($r)->{value}, '3s', 'config get');
$r = $http->post("$base/api/config", { headers => { %browser, 'X-CSRF-Token' => $csrf },
	content => encode_json({ section => 'dispatch', option => 'POLL_INTERVAL', value => 'soon' }) });
is($r->{status}, 400, 'a bad value: 400');
$r = $http->post("$base/api/config", { headers => { %browser, 'X-CSRF-Token' => $csrf },
	content => encode_json({ section => 'httpd', option => 'PORT', value => '80' }) });
is($r->{status}, 400, '[httpd] cannot be overridden from the database');

# The role pepsi-httpd runs as can do nothing else.
my ($ok, $stderr) = ('', '');
$node->psql($db, 'SELECT count(*) FROM pepsi.workqueue', stdout => \$ok, stderr => \$stderr,
	extra_params => [ '-U', 'web' ]);
like($stderr, qr/permission denied/, 'the pepsi_httpd role cannot read the queue table itself');
$node->psql($db, "INSERT INTO pepsi.api_token (name, digest) VALUES ('x', sha256('x'))", stderr => \$stderr,
	extra_params => [ '-U', 'web' ]);
like($stderr, qr/permission denied/, '... nor mint itself a token');

# Bad requests: 4xx with a JSON error, and the server stays up.
$r = $http->post("$base/api/queue/hold", { headers => { %bearer, 'Content-Type' => 'application/json' }, content => '{"ids": [1,' });
is($r->{status}, 400, 'bad JSON: 400');
like(json_of($r)->{error}, qr/bad JSON/, '... saying so');
$r = $http->post("$base/api/queue/hold", { headers => { %bearer, 'Content-Type' => 'application/json' }, content => '{"ids": ["1; DROP TABLE x"]}' });
is($r->{status}, 400, 'an id that is not a number: 400');
$r = $http->post("$base/api/queue/hold", { headers => { %bearer, 'Content-Type' => 'application/json' },
	content => '{"ids": [' . join(',', (1) x 40000) . ']}' });
is($r->{status}, 413, 'a body over 64 KB: 413') or diag $r->{status}, $r->{content};
$r = $http->request('DELETE', "$base/metrics");
is($r->{status}, 405, 'a wrong method: 405');
like($r->{headers}{allow} // '', qr/GET/, '... with Allow');
$r = $http->get("$base/api/nothing", { headers => \%bearer });
is($r->{status}, 404, 'an unknown API: 404');
for my $path ('/../../../../etc/passwd', '/%2e%2e/%2e%2e/etc/passwd', '//etc/passwd', '/app.js/../../pepsi.conf')
{
	my $raw = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die;
	print $raw "GET $path HTTP/1.0\r\n\r\n";
	my $reply = join '', <$raw>;
	like($reply, qr{^HTTP/1\.[01] 404}, "path traversal $path: 404");
	unlike($reply, qr/root:|CONNINFO/, '... and nothing leaks');
}
{
	my $raw = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die;
	print $raw "GET / HTTP/1.1\r\nHost: x\r\n" . ("X-Filler: " . ('a' x 1000) . "\r\n") x 64 . "\r\n";
	my $reply = join '', <$raw>;
	like($reply, qr{^HTTP/1\.[01] 4\d\d}, 'headers over the memory limit: 4xx');
}
{
	my $raw = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die;
	print $raw "BLAH\x00\x01 / GARBAGE\r\n\r\n";
	my $reply = join '', <$raw>;
	like($reply, qr{^HTTP/1\.[01] 4\d\d|^$}, 'a malformed request line: 4xx or closed');
}
$r = $http->get("$base/");
is($r->{status}, 200, 'the page is served after all that');
like($r->{content}, qr{<script src="/app.js" defer></script>}, '... with its script');
like($r->{headers}{'content-security-policy'}, qr/script-src 'self'/, '... under a CSP');

# Logout ends the session.
$r = $http->request('DELETE', "$base/api/session", { headers => { %browser, 'X-CSRF-Token' => $csrf } });
is($r->{status}, 200, 'logout');
$r = $http->get("$base/api/session", { headers => \%browser });
is($r->{status}, 401, 'the cookie is worthless afterwards');

# Host must name this server: a page whose name was rebound to 127.0.0.1
# sends its own name.  (HTTP::Tiny will not send another Host: a raw request.)
sub status_with_host
{
	my ($host, $path, $socket) = @_;
	$socket //= IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or die;
	print $socket "GET " . ($path // '/api/summary') . " HTTP/1.1\r\nHost: $host\r\n"
	  . "Authorization: Bearer $token\r\nConnection: close\r\n\r\n";
	my $reply = join '', <$socket>;
	my ($status) = $reply =~ m{^HTTP/1\.[01] (\d+)};
	return wantarray ? ($status // 0, $reply) : $status // 0;
}
is(status_with_host("127.0.0.1:$port"), 200, 'Host: the address the connection came in on');
is(status_with_host("localhost:$port"), 200, 'Host: localhost');
is(status_with_host('localhost.'), 200, 'Host: localhost. (the root\'s dot), without a port');
my ($host_status, $host_reply) = status_with_host("rebound.evil.example:$port");
is($host_status, 421, 'Host: a name that is not ours gets 421');
like($host_reply, qr/rebound\.evil\.example.*SERVER_NAMES/, '... naming the Host and the option');
is(status_with_host("rebound.evil.example:$port", '/metrics'), 421, '... on /metrics too');
is(status_with_host("127.0.0.2:$port"), 421, 'Host: another address gets 421');
is(status_with_host("[::1]:$port"), 421, '... as does ::1 on an IPv4 connection');

# Failed logins are throttled per client address.
sub login_from
{
	my ($address, $name, $password) = @_;
	my $client = HTTP::Tiny->new(timeout => 10, local_address => $address);
	return $client->post("$base/api/login", { headers => { 'Content-Type' => 'application/json' },
		content => encode_json({ name => $name, password => $password }) });
}

# A database that fails during login: 503, and no failure counted.
$node->safe_psql($db, 'REVOKE pepsi_httpd FROM web');
my @statuses = map { login_from('127.0.0.6', 'admin', "guess $_")->{status} } 1 .. 6;
is("@statuses", '503 503 503 503 503 503', 'a database failure during login answers 503, not 401');
is($http->get("$base/api/summary", { headers => \%bearer })->{status}, 503,
	'... and while checking a token, 503, not 401');
$node->safe_psql($db, 'GRANT pepsi_httpd TO web');
is(login_from('127.0.0.6', 'admin', 'correct horse battery')->{status}, 200,
	'... and was not counted as a failed login');

for (1 .. 5)
{
	$http->post("$base/api/login", { headers => { 'Content-Type' => 'application/json' },
		content => encode_json({ name => 'admin', password => "guess $_" }) });
}
$r = $http->post("$base/api/login", { headers => { 'Content-Type' => 'application/json' },
	content => encode_json({ name => 'admin', password => 'correct horse battery' }) });
is($r->{status}, 429, 'after five failures even the right password must wait');
like(json_of($r)->{error}, qr/from 127\.0\.0\.1/, '... saying from where');
is(login_from('127.0.0.2', 'admin', 'correct horse battery')->{status}, 200,
	'another client is not held back by them');

# ... and per account: ten failures from clients none of which is blocked.
@statuses = map { my $client = $_; map { login_from($client, 'admin', "guess $_")->{status} } 1 .. 4 }
  '127.0.0.3', '127.0.0.4';
push @statuses, map { login_from('127.0.0.5', 'admin', "guess $_")->{status} } 1 .. 2;
is("@statuses", join(' ', ('401') x 10), 'ten failures for one account from three clients');
$r = login_from('127.0.0.7', 'admin', 'correct horse battery');
is($r->{status}, 429, 'then the account waits, even from a new client with the right password');
like(json_of($r)->{error}, qr/for this account/, '... saying so');

stop_dispatcher($httpd);

# TLS, and SIGHUP with a new certificate.
sub make_cert
{
	my ($name) = @_;
	system('openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', "/CN=$name",
		'-keyout', "$tmp/$name.key", '-out', "$tmp/$name.crt", '-quiet') == 0
	  or system('openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', "/CN=$name",
		'-keyout', "$tmp/$name.key", '-out', "$tmp/$name.crt") == 0 or die 'openssl req failed';
}
make_cert('first');
make_cert('second');
copy("$tmp/first.crt", "$tmp/live.crt");
copy("$tmp/first.key", "$tmp/live.key");
chmod 0600, "$tmp/live.key";
write_conf($conf, "CERTIFICATE = $tmp/live.crt\nKEY = $tmp/live.key\nSERVER_NAMES = admin.example\n");
$httpd = start_dispatcher($conf, program => [ pepsi_bin('pepsi-httpd') ], log => "$tmp/httpd-tls.log");
ok(file_shows("$tmp/httpd-tls.log", qr/ready \(TLS\)/), 'pepsi-httpd starts with TLS');
sub tls_socket
{
	my $socket = IO::Socket::SSL->new(PeerAddr => "127.0.0.1:$port", SSL_verify_mode => SSL_VERIFY_NONE)
	  or die "TLS connection: $!";
	return $socket;
}
is(status_with_host('admin.example', undef, tls_socket()), 200, 'Host: a name of SERVER_NAMES');
is(status_with_host('ADMIN.example:443', undef, tls_socket()), 200, '... in any case, with a port');
is(status_with_host('localhost', undef, tls_socket()), 421, 'localhost is not one once SERVER_NAMES is set');
is(status_with_host("127.0.0.1:$port", undef, tls_socket()), 200, 'the address still is');

sub peer_cn
{
	my $s = IO::Socket::SSL->new(PeerAddr => "127.0.0.1:$port", SSL_verify_mode => SSL_VERIFY_NONE) or return '';
	my $cn = $s->peer_certificate('cn');
	return ($cn, $s);
}
my ($cn, $old) = peer_cn();
is($cn, 'first', 'the first certificate is served');
my $https = HTTP::Tiny->new(timeout => 10, verify_SSL => 0);
$r = $https->get("https://127.0.0.1:$port/api/summary", { headers => \%bearer });
is($r->{status}, 200, 'the API over TLS');
$r = $https->post("https://127.0.0.1:$port/api/login", { headers => { 'Content-Type' => 'application/json' },
	content => encode_json({ name => 'admin', password => 'correct horse battery' }) });
# (the throttle is per process: this server has not seen the failures)
like($r->{headers}{'set-cookie'} // '', qr/; Secure$/, 'under TLS the cookie is Secure');

# A request under way on an old connection (its headers half sent) while
# the server reloads: it is still answered, by the old settings' server.
print $old "GET /metrics HTTP/1.0\r\n";
copy("$tmp/second.crt", "$tmp/live.crt");
copy("$tmp/second.key", "$tmp/live.key");
kill 'HUP', $httpd->{pid};
ok(file_shows("$tmp/httpd-tls.log", qr/new connections get the new settings/), 'SIGHUP reloads');
($cn) = peer_cn();
is($cn, 'second', 'a new connection gets the new certificate');
print $old "\r\n";
like(join('', <$old>), qr{^HTTP/1\.[01] 200}, 'a request under way during the reload is still answered');
ok(file_shows("$tmp/httpd-tls.log", qr/reloaded/), 'the reload completes once it is');

open my $bad, '>', $conf or die;
print $bad "[httpd]\nSESSION_LIFETIME = forever\n";
close $bad;
kill 'HUP', $httpd->{pid};
ok(file_shows("$tmp/httpd-tls.log", qr/reload refused: .*SESSION_LIFETIME/), 'a bad file is refused on SIGHUP');
write_conf($conf, "CERTIFICATE = $tmp/live.crt\nKEY = $tmp/missing.key\n");
kill 'HUP', $httpd->{pid};
ok(file_shows("$tmp/httpd-tls.log", qr/reload refused: .*missing\.key/), 'a missing key is refused, naming the file');
chmod 0644, "$tmp/live.key";
write_conf($conf, "CERTIFICATE = $tmp/live.crt\nKEY = $tmp/live.key\n");
kill 'HUP', $httpd->{pid};
ok(file_shows("$tmp/httpd-tls.log", qr/reload refused: .*live\.key: a private key others may access.*0644/),
	'a key others may read is refused, with its mode');
chmod 0600, "$tmp/live.key";
write_conf($conf, "CERTIFICATE = $tmp/live.crt\nKEY = $tmp/live.key\nSERVER_NAMES = admin.example\n");
my $moved = PostgreSQL::Test::Utils::slurp_file($conf);
$moved =~ s/^PORT = \d+$/'PORT = ' . ($port + 1)/me or die 'no PORT line';
open my $fh, '>', $conf or die;
print $fh $moved;
close $fh;
kill 'HUP', $httpd->{pid};
ok(file_shows("$tmp/httpd-tls.log", qr/reload refused: \[httpd\] PORT changed .*only a restart/),
	'a new PORT refuses the reload, saying a restart applies it');
($cn) = peer_cn();
is($cn, 'second', 'the old settings keep serving');
stop_dispatcher($httpd);

done_testing();
