# Options through the schema at run time: a domain-scoped override of
# MAX_LIFETIME bounces a message to that domain sooner while one to
# another domain keeps retrying, and ORIGINATE_SUCCESS_DSN = on (a boolean
# the start-up check always accepted) originates the success DSN at run
# time too.  Where mail goes and who may relay are the file's: a
# config_set of MILTERS (a filter may add recipients), DANE, MTA_STS,
# ARC_TRUSTED_SEALERS or LOCAL_DOMAINS is refused, naming the option.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;

my $node = delivery_node('scoped_options');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);

sub dsns { return maildir_files($root, $sender) }

sub attempts
{
	my ($id) = @_;

	return $node->safe_psql('postgres',
		"SELECT coalesce(state->>'attempts', '0') FROM pepsi.workqueue WHERE id = $id") || 0;
}

#
# MAX_LIFETIME per domain: the file gives an hour, short.test three seconds.
#
my $failure = '{"dsn":{"rcpt":[{"notify":"FAILURE"}]}}';
my $peer = start_peer('--rcpt', 'stuck@=452 4.2.2 mailbox full');
my $config = delivery_config($node, maildir_root => $root,
	smarthost => "127.0.0.1:$peer->{port}",
	extra => { smarthost => "MAX_LIFETIME = 1h\nRETRY_BASE = 1s\nRETRY_MAX = 1s\n" });
$node->safe_psql('postgres',
	"SELECT pepsi.config_set('domain:short.test', 'stage-smarthost', 'MAX_LIFETIME', '3s')");
my $d = start_dispatcher($config);
my $short = inject($node, to => ['stuck@short.test'], state => $failure);
my $long = inject($node, to => ['stuck@long.test'], state => $failure);

ok(poll_until(sub { scalar(dsns()) == 1 && queue_count($node, "id = $short") == 0 }),
	'domain:short.test MAX_LIFETIME = 3s: its message bounces after retrying');
my ($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
like($recipients->[0]{'final-recipient'}, qr/stuck\@short\.test/, 'the DSN is for short.test\'s recipient');
is($recipients->[0]{status}, '4.2.2', 'with the last temporary failure as its status');
like($recipients->[0]{'diagnostic-code'}, qr/gave up after \d+ attempts/, 'saying it gave up');

# The other domain's message is as old and has failed as often, but its
# lifetime is the file's hour: it is retried, not bounced.
ok(poll_until(sub { attempts($long) >= 5 }), 'long.test: retried past three seconds');
is($node->safe_psql('postgres', "SELECT status FROM pepsi.workqueue WHERE id = $long"), 'paused',
	'long.test: still queued under the file\'s MAX_LIFETIME');
is(scalar(dsns()), 1, 'long.test: no DSN');
is(stop_dispatcher($d), 0, 'the dispatcher stops');
stop_process($peer);
$node->safe_psql('postgres', "SELECT pepsi.queue_delete(ARRAY[$long])");

#
# ORIGINATE_SUCCESS_DSN = on: a success DSN for NOTIFY=SUCCESS, as "yes" gives.
#
make_mailbox($root, 'user@local.test');
$config = delivery_config($node, maildir_root => $root,
	extra => { maildir => "ORIGINATE_SUCCESS_DSN = on\n" });
$d = start_dispatcher($config);
my $id = inject($node, to => ['user@local.test'], state => '{"dsn":{"rcpt":[{"notify":"SUCCESS"}]}}');
ok(poll_until(sub { scalar(dsns()) == 2 && queue_count($node) == 0 }),
	'ORIGINATE_SUCCESS_DSN = on: delivered, and a success DSN sent');
($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[-1])));
is($recipients->[0]{action}, 'delivered', 'Action: delivered');
is(scalar(maildir_files($root, 'user@local.test')), 1, 'the message itself is in the mailbox');
is(stop_dispatcher($d), 0, 'the dispatcher stops');

#
# The file's alone: the SQL guard (options.def, compiled into the extension) refuses them.
#
for my $case ([ 'stage-filter', 'MILTERS', 'inet:192.0.2.1:11332' ], [ 'stage-internet', 'DANE', 'no' ],
	[ 'stage-internet', 'MTA_STS', 'no' ], [ 'ingress', 'ARC_TRUSTED_SEALERS', 'evil.example' ],
	[ 'pepsi', 'LOCAL_DOMAINS', 'evil.example' ], [ 'stage-route', 'LOCAL_DOMAINS', 'evil.example' ])
{
	my ($section, $option, $value) = @$case;
	my ($rc, $out, $err) = $node->psql('postgres',
		"SELECT pepsi.config_set('global', '$section', '$option', '$value')");
	isnt($rc, 0, "config_set of [$section] $option is refused");
	like($err, qr/option \Q$option\E of \[\Q$section\E\] cannot be overridden/, '... naming the option');
}
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pepsi.config_override WHERE option IN ('MILTERS', 'DANE', 'MTA_STS', "
		  . "'ARC_TRUSTED_SEALERS', 'LOCAL_DOMAINS')"), '0', 'and nothing of them is stored');

done_testing();
