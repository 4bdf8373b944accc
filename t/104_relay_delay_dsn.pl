# Delay DSNs (RFC 3464, Action: delayed) from pepsi-stage-relay-to-internet
# once a message is older than DELAY_DSN_AFTER (0 here), on a simulated
# internet (TestDNS, t/bin/smtp-peer):
#   - recipients deferred (451) in a transaction that delivered to another
#     are split off for their retry, and those whose NOTIFY asks for DELAY
#     get one delay DSN listing them, with their own ORCPT; one that did not
#     ask is left out; their next deferral sends none again;
#   - a row whose recipients were all deferred gets one delay DSN for every
#     recipient that asked, not only the first.

use strict;
use warnings FATAL => 'all';

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use DeliveryTest;
use DispatchTest;
use PepsiTest;
use TestDNS;

my $node = delivery_node('relay_delay_dsn');
my $root = PostgreSQL::Test::Utils::tempdir();
my $sender = 'sender@local.test';
make_mailbox($root, $sender);
sub dsns { return maildir_files($root, $sender) }

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $peer = start_peer('--address', '127.0.0.16', '--port', $port,
	'--rcpt-first', 'busy|quiet@=2=451 4.2.1 mailbox busy, try later',
	'--rcpt-first', 'late=1=452 4.2.2 mailbox full for now');
my $dns = TestDNS->new(PostgreSQL::Test::Utils::tempdir());
$dns->zone(TestDNS::mx('delay.test', '127.0.0.16'));
my $config = delivery_config($node, maildir_root => $root, internet => $port,
	pepsi => { DNS_FORWARDER => $dns->forwarder },
	extra => { smarthost => "DELAY_DSN_AFTER = 0s\n" });
my $d = start_dispatcher($config);

sub delivered_to
{
	my ($rcpt) = @_;

	return scalar grep { $_->{env} =~ /RCPT TO:<\Q$rcpt\E>/ } peer_messages($peer);
}

# --- Deferred beside a delivered recipient: split off with a delay DSN -------
inject($node, to => [ 'a@delay.test', 'busy1@delay.test', 'busy2@delay.test', 'quiet@delay.test' ],
	headers => "From: <$sender>\r\nTo: <a\@delay.test>\r\nSubject: split\r\n",
	state => '{"dsn": {"envid": "env-split", "rcpt": [{"notify": "FAILURE"},'
	  . ' {"notify": "DELAY,FAILURE", "orcpt": "rfc822;busy1@delay.test"},'
	  . ' {"notify": "DELAY,FAILURE"}, {"notify": "FAILURE"}]}}');
ok(poll_until(sub { delivered_to('a@delay.test') == 1 }, 60), 'a@ was delivered at once');
ok(poll_until(sub { scalar(dsns()) == 1 }, 60), 'a delay DSN for the deferred recipients');
my $entity = parse_dsn(slurp((dsns())[0]));
my ($message, $recipients) = dsn_fields($entity);
is($message->{'original-envelope-id'}, 'env-split', 'with the message\'s ENVID');
is_deeply([ map { $_->{'final-recipient'} } @$recipients ],
	[ 'rfc822; busy1@delay.test', 'rfc822; busy2@delay.test' ],
	'about the two that asked for DELAY, not quiet@ (NOTIFY=FAILURE) nor the delivered a@');
is_deeply([ map { $_->{action} } @$recipients ], [ 'delayed', 'delayed' ], 'Action: delayed');
is_deeply([ map { $_->{status} } @$recipients ], [ '4.2.1', '4.2.1' ], 'with the remote status');
like($recipients->[0]{'diagnostic-code'} // '', qr/^smtp; 451 4\.2\.1 mailbox busy/, 'and the remote reply');
is($recipients->[0]{'original-recipient'}, 'rfc822; busy1@delay.test', 'busy1@\'s ORCPT');
ok(defined $recipients->[0]{'will-retry-until'}, 'and until when it is retried');
like($entity->head->get('Subject') // '', qr/delay/i, 'the subject says delayed');
ok(poll_until(sub { delivered_to('busy1@delay.test') == 1 && queue_count($node) == 0 }, 120),
	'the deferred recipients were delivered on a later retry');
cmp_ok(scalar(() = dispatcher_log($d) =~ /to=<busy1\@delay\.test>, [^\n]*status=deferred/g), '>=', 2,
	'after a second deferral');
is(scalar(dsns()), 1, 'which sent no second delay DSN');

# --- Every recipient deferred: one delay DSN about all who asked --------------
inject($node, to => [ 'late1@delay.test', 'late2@delay.test' ],
	headers => "From: <$sender>\r\nTo: <late1\@delay.test>\r\nSubject: all\r\n",
	state => '{"dsn": {"rcpt": [{"notify": "DELAY,FAILURE"}, {"notify": "DELAY"}]}}');
ok(poll_until(sub { scalar(dsns()) == 2 }, 60), 'a delay DSN for a row deferred whole');
($message, $recipients) = dsn_fields(parse_dsn(slurp((dsns())[1])));
is_deeply([ map { $_->{'final-recipient'} } @$recipients ],
	[ 'rfc822; late1@delay.test', 'rfc822; late2@delay.test' ], 'about both recipients');
is_deeply([ map { $_->{status} } @$recipients ], [ '4.2.2', '4.2.2' ], 'with the remote status');
ok(poll_until(sub { delivered_to('late2@delay.test') == 1 && queue_count($node) == 0 }, 120),
	'then both were delivered');
is(scalar(dsns()), 2, 'no other DSN');

is(stop_dispatcher($d), 0, 'the dispatcher stops cleanly');
done_testing();
