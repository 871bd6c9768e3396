# The attack of a consumer on a webhook pipeline: a login role with only
# tide_consumer (and even one granted the outbox) polls the pipeline's
# consumer group while the pipeline is disabled, reads the payloads and
# commits; the webhook would then get none of them, with nothing in the
# attempt log or the dead letters. Consuming from a pipeline's group is
# refused to everyone but the relay (a superuser too), so the webhook
# receives every message once the pipeline runs; the role still consumes
# from a group of its own when it has the right, and from none without it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use PgTide::Receiver;
use JSON::PP;
use Time::HiRes qw(time sleep);

my $node = tide_node('consume_rights', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;

sub sql { return $node->safe_psql('postgres', $_[0]) }

# Runs SQL as login role thief: (exit code, stdout, stderr).
sub as_thief
{
	my ($query) = @_;
	my ($out, $err) = ('', '');
	my $rc = $node->psql('postgres', $query, stdout => \$out, stderr => \$err,
		extra_params => [ '-U', 'thief' ]);
	return ($rc, $out, $err);
}

# Message ids acknowledged (200) at /hook.
sub delivered
{
	my %seen;
	for my $r ($rcv->requests)
	{
		next unless $r->{status} == 200 && $r->{path} eq '/hook';
		my $b = $json->decode($r->{body});
		$seen{ $_->{message_id} }++ for (ref $b eq 'ARRAY' ? @$b : ($b));
	}
	return \%seen;
}

sql("SELECT tide.outbox_create('orders')");
sql("SELECT tide.relay_set_outbox('hook', 'orders', 'hook', jsonb_build_object(
	  'sink_type', 'webhook', 'url', '" . $rcv->url('/hook') . "',
	  'allow_http', true, 'allow_private_network', true))");
sql("SELECT tide.create_consumer_group('thief_group', 'orders')");
sql("CREATE ROLE thief LOGIN IN ROLE tide_consumer");

# The pipeline is disabled while the messages wait: the consumer has all
# the time it wants.
sql("SELECT tide.relay_disable('hook')");
my @ids = split /\n/, sql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', g))
							 FROM generate_series(1, 5) g");
is(scalar(@ids), 5, 'five messages wait for the disabled pipeline');

# Without a grant: refused on every group of the outbox, and a group that
# does not exist looks the same.
my ($rc, $out, $err) = as_thief("SELECT count(*) FROM tide.poll_outbox('thief_group', 'thief')");
isnt($rc, 0, 'without a grant the consumer cannot poll its own group');
like($err, qr/permission denied to consume from consumer group "thief_group"/, '... 42501 message');
($rc, $out, $err) = as_thief("SELECT count(*) FROM tide.poll_outbox('no_such_group', 'thief')");
like($err, qr/permission denied to consume from consumer group "no_such_group"/,
	'an unknown group gives the same error');

# Granted the outbox: its own group works, the pipeline's does not.
sql("SELECT tide.outbox_grant_consume('orders', 'thief')");
($rc, $out, $err) = as_thief("SELECT count(*) FROM tide.poll_outbox('thief_group', 'thief', 100)");
is("$rc $out", '0 5', 'with a grant the consumer polls its own group');

for my $call ("SELECT payload FROM tide.poll_outbox('hook', 'thief', 100)",
	"SELECT payload FROM tide.poll_outbox('hook', 'relay:hook', 100)",
	"SELECT tide.wait_for_messages('hook', 0)",
	"SELECT tide.commit_offset('hook', 'relay:hook', $ids[-1])",
	"SELECT tide.consumer_heartbeat('hook', 'relay:hook')",
	"SELECT tide.extend_lease('hook', 'relay:hook', 60)",
	"SELECT tide.release_lease('hook', 'relay:hook')")
{
	($rc, $out, $err) = as_thief($call);
	ok($rc != 0 && $out eq ''
		  && $err =~ /permission denied to consume from consumer group "hook"/
		  && $err =~ /HINT:.*"allow_other_consumers": true/,
		"the pipeline's group is refused: $call")
	  or diag("rc $rc, out '$out', err '$err'");
}
my ($src, $sout, $serr) = ('', '', '');
$src = $node->psql('postgres', "SELECT count(*) FROM tide.poll_outbox('hook', 'thief', 100)",
	stdout => \$sout, stderr => \$serr);
ok($src != 0 && $serr =~ /only the relay consumes from it/, 'and so it is to a superuser');
is(sql("SELECT count(*) FROM tide.tide_consumer_offsets WHERE group_name = 'hook'"), '0',
	'nobody joined the pipeline\'s group');

# The pipeline runs: the webhook receives every message.
sql("SELECT tide.relay_enable('hook')");
my $deadline = time() + 20;
sleep 0.1 while time() < $deadline && grep { !delivered()->{$_} } @ids;
is_deeply([ sort { $a <=> $b } keys %{ delivered() } ], [ sort { $a <=> $b } @ids ],
	'the webhook receives every message');
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $ids[-1] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'"),
	'the pipeline\'s offset ends at the last id');
is(sql("SELECT count(*) FILTER (WHERE status = 'success') || ' ' || count(*)
		  FROM tide.relay_attempts WHERE pipeline_id = 'hook'")
	  . ' ' . sql("SELECT count(*) FROM tide.relay_dlq"),
	'5 5 0', 'five successful attempts, no dead letter');
is(sql("SELECT string_agg(consumer_id, ',') FROM tide.tide_consumer_offsets WHERE group_name = 'hook'"),
	'relay:hook', 'the relay alone consumes from the pipeline\'s group');

$rcv->stop;
$node->stop;
done_testing();
