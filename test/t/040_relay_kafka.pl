# The Kafka sink against librdkafka's mock cluster (test/brokers/kafka_mock),
# read back by a real librdkafka consumer (test/brokers/kafka_consume):
#  - bad configs are refused by relay_set_outbox with 22023 and a hint, the
#    password is redacted in every output;
#  - a backlog of 600 messages arrives, each on the topic its "type" header
#    names (topic "orders.{type}"), keyed by its ordering key (so one key
#    stays on one partition, in id order), with pg_tide's headers and its
#    own as Kafka headers, the payload as the body; body "envelope" sends
#    the message's JSON object;
#  - refused messages are dead-lettered with their class: too_large (over
#    message.max.bytes), unknown_destination (a topic that does not exist,
#    auto-create off), template (a header the topic template needs is
#    missing), and the others of the batch are delivered;
#  - a server without pg_tide_kafka.so still runs pg_tide, and refuses a
#    kafka pipeline with 42704 and the package to install.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until installation_copy);
use PgTide::KafkaMock;
use JSON::PP;

my $json = JSON::PP->new->canonical;
my $kafka = PgTide::KafkaMock->new;
my $node = tide_node('kafka', "pg_tide.relay_naptime_ms = 100\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

# relay_set_outbox with this config; returns (SQLSTATE, hint) of its error, or ('', '').
sub set_error
{
	my ($name, $cfg) = @_;
	my ($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSELECT tide.relay_set_outbox('$name', 'orders', '$name', '"
		  . $json->encode($cfg) . "'::jsonb)");
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	my ($hint) = $err =~ /HINT:\s+(.*)/;
	return ($state // '', $hint // '', $err);
}

sub set_pipeline
{
	my ($name, $cfg) = @_;
	sql("SELECT tide.relay_set_outbox('$name', 'orders', '$name', '" . $json->encode($cfg) . "'::jsonb)");
}

sql("SELECT tide.outbox_create('orders')");
my $bs = $kafka->bootstrap;

# 1. Bad configs: each refused with 22023 and a hint, nothing written.
my %base = (sink_type => 'kafka', bootstrap_servers => $bs, topic => 'orders');
my @bad = (
	[ 'no bootstrap_servers', { sink_type => 'kafka', topic => 'orders' }, qr/bootstrap_servers/ ],
	[ 'bootstrap_servers without a port', { %base, bootstrap_servers => 'localhost' }, qr/host:port/ ],
	[ 'bootstrap_servers port 0', { %base, bootstrap_servers => 'a:0' }, qr/port/ ],
	[ 'no topic', { sink_type => 'kafka', bootstrap_servers => $bs }, qr/topic/ ],
	[ 'topic with a space', { %base, topic => 'my orders' }, qr/topic/ ],
	[ 'malformed template', { %base, topic => 'orders.{type' }, qr/topic/ ],
	[ 'max_in_flight 0', { %base, max_in_flight => 0 }, qr/max_in_flight/ ],
	[ 'timeout_ms 10', { %base, timeout_ms => 10 }, qr/timeout_ms/ ],
	[ 'body xml', { %base, body => 'xml' }, qr/body/ ],
	[ 'compression brotli', { %base, compression => 'brotli' }, qr/compression/ ],
	[ 'auth without password', { %base, auth => { mechanism => 'PLAIN', username => 'u' } }, qr/auth/ ],
	[ 'auth mechanism GSSAPI', { %base, auth => { mechanism => 'GSSAPI', username => 'u', password => 'p' } }, qr/mechanism/ ],
	[ 'auth password env not PG_TIDE_', { %base, auth => { mechanism => 'PLAIN', username => 'u', password => { env => 'HOME' } } }, qr/PG_TIDE_/ ],
	[ 'tls relative ca_file', { %base, tls => { ca_file => 'ca.pem' } }, qr/absolute/ ],
	[ 'tls cert without key', { %base, tls => { cert_file => '/c.pem' } }, qr/key_file/ ],
	[ 'producer acks', { %base, producer => { acks => '1' } }, qr/producer/ ],
	[ 'producer enable.idempotence', { %base, producer => { 'enable.idempotence' => 'false' } }, qr/producer/ ],
	[ 'producer bad value', { %base, producer => { 'message.max.bytes' => 'lots' } }, qr/librdkafka|kafka/ ],
	[ 'unknown key', { %base, url => 'https://x' }, qr/url|key/ ],
);
for my $b (@bad)
{
	my ($what, $cfg, $hint_re) = @$b;
	my ($state, $hint, $err) = set_error('bad', $cfg);
	ok($state eq '22023' && $hint ne '' && "$err" =~ $hint_re, "refused: $what")
	  or diag("state '$state', hint '$hint': $err");
}
is(sql("SELECT count(*) FROM tide.relay_outbox_config"), '0', 'no bad config was written');

# A good config with a password: stored, and redacted in every output.
set_pipeline('secret', { %base, auth => { mechanism => 'SCRAM-SHA-512', username => 'relay',
	password => 'hunter2-kafka' } });
sql("SELECT tide.relay_disable('secret')");
my $shown = sql("SELECT tide.relay_get_config('secret')::text")
  . sql("SELECT string_agg(to_jsonb(s)::text, '') FROM tide.relay_pipeline_status s");
ok($shown =~ /relay/ && $shown !~ /hunter2/, 'the password is redacted in relay_get_config and status');
sql("SELECT tide.relay_delete('secret')");

# 2. A backlog: types created and paid, 20 customers as the ordering key.
$kafka->command("create orders.created 3");
$kafka->command("create orders.paid 3");
my $n = 600;
my @ids = split /\n/, sql(
	"SELECT tide.outbox_publish('orders', jsonb_build_object('n', g, 'customer', 'c' || (g % 20)),
	   jsonb_build_object('type', CASE WHEN g % 3 = 0 THEN 'paid' ELSE 'created' END, 'source', 'shop'))
	   FROM generate_series(1, $n) g");
my %want = map { $ids[ $_ - 1 ] => $_ } 1 .. $n;
set_pipeline('to_kafka', { %base, topic => 'orders.{type}', batch_size => 100, max_in_flight => 100,
	ordering => 'key', ordering_key => '/customer', timeout_ms => 5000 });

my (%seen, @bad_msgs);
my $done = wait_until(sub {
	%seen = ();
	@bad_msgs = ();
	for my $topic ('orders.created', 'orders.paid')
	{
		for my $m ($kafka->consume($topic))
		{
			my ($id) = ($m->{headers}{'tide-id'} // '') =~ /^outbox_orders:(\d+)$/;
			push @{ $seen{ $id // 'none' } }, $m;
		}
	}
	return scalar(grep { $seen{$_} } keys %want) == $n;
}, 60, 500);
ok(defined $done, "all $n messages arrived");

my ($wrong_topic, $wrong_key, $wrong_headers, $wrong_body) = (0, 0, 0, 0);
my %partition_of;
my %last_n;
my $out_of_order = 0;
for my $id (sort { $a <=> $b } keys %want)
{
	my $g = $want{$id};
	for my $m (@{ $seen{$id} // [] })
	{
		my $type = $g % 3 == 0 ? 'paid' : 'created';
		$wrong_topic++ if $m->{topic} ne "orders.$type";
		$wrong_key++ if ($m->{key} // '') ne 'c' . ($g % 20);
		my @names = map { $_->[0] } @{ $m->{header_list} };
		$wrong_headers++
		  unless join(',', @names) eq 'tide-id,tide-outbox,tide-created-at,type,source'
		  && $m->{headers}{'tide-outbox'} eq 'orders'
		  && $m->{headers}{type} eq $type && $m->{headers}{source} eq 'shop'
		  && $m->{headers}{'tide-created-at'} =~ /^\d{4}-\d\d-\d\dT/;
		my $body = eval { $json->decode($m->{body}) };
		$wrong_body++ unless $body && $body->{n} == $g && $body->{customer} eq 'c' . ($g % 20)
		  && keys %$body == 2;
		$partition_of{ $m->{key} }{"$m->{topic}/$m->{partition}"} = 1;
	}
}
is($wrong_topic, 0, 'each message is on the topic its type header names');
is($wrong_key, 0, 'each message is keyed by its ordering key');
is($wrong_headers, 0, "pg_tide's headers and the message's own are Kafka headers, in order");
is($wrong_body, 0, 'the body is the payload');
is(scalar(grep { keys %{ $partition_of{$_} } > 2 } keys %partition_of), 0,
	'a key stays on one partition of each topic');
# within a key (one partition of a topic), the first copy of each message comes in id order
for my $topic ('orders.created', 'orders.paid')
{
	my %last;
	for my $m ($kafka->consume($topic))
	{
		my ($id) = $m->{headers}{'tide-id'} =~ /(\d+)$/;
		$out_of_order++ if defined $last{ $m->{key} } && $id < $last{ $m->{key} };
		$last{ $m->{key} } = $id if !defined $last{ $m->{key} } || $id > $last{ $m->{key} };
	}
}
is($out_of_order, 0, 'each key arrives in id order');
is(sql("SELECT count(*) FROM tide.relay_dlq"), '0', 'nothing was dead-lettered');
is(sql("SELECT (config ->> 'attempt_log') || ' ' || (SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'to_kafka')
		  FROM tide.relay_outbox_config WHERE name = 'to_kafka'"), 'failures 0',
	'relay_attempts: failures only by default, and none failed');

# 3. body "envelope": the message's JSON object.
$kafka->command("create envelope 1");
set_pipeline('to_kafka', { %base, topic => 'envelope', body => 'envelope' });
my ($env_id) = split /\n/, sql("SELECT tide.outbox_publish('orders', '{\"e\": 1}', '{\"type\": \"x\"}')");
my @env;
wait_until(sub { @env = $kafka->consume('envelope'); @env > 0 }, 30, 300);
my $envelope = @env ? eval { $json->decode($env[0]{body}) } : undef;
ok($envelope && $envelope->{id} eq "outbox_orders:$env_id" && $envelope->{payload}{e} == 1
	  && $envelope->{headers}{type} eq 'x' && !defined $env[0]{key},
	'body "envelope" is the message\'s JSON object, without a key when there is no ordering key')
  or diag($env[0]{body} // 'nothing');

# 4. Refused messages are dead-lettered with their class; the rest arrive.
$kafka->command("create refusals 1");
# the mock creates any topic it is asked about: this one it says does not exist
$kafka->command("topic_error no_such_topic 3");
set_pipeline('to_kafka', { %base, topic => '{dest}', batch_size => 10, timeout_ms => 4000,
	producer => { 'message.max.bytes' => 2000, 'allow.auto.create.topics' => JSON::PP::false } });
my $big = 'x' x 3000;
my @r = split /\n/, sql(
	"SELECT tide.outbox_publish('orders', p::jsonb, h::jsonb) FROM (VALUES
	   (1, '{\"ok\": 1}', '{\"dest\": \"refusals\"}'),
	   (2, '{\"big\": \"$big\"}', '{\"dest\": \"refusals\"}'),
	   (3, '{\"ok\": 3}', '{\"dest\": \"no_such_topic\"}'),
	   (4, '{\"ok\": 4}', '{\"other\": \"refusals\"}'),
	   (5, '{\"ok\": 5}', '{\"dest\": \"refusals\"}')) v (i, p, h) ORDER BY i");
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'to_kafka'") eq '3' }, 40, 200),
	'three refused messages are dead-lettered')
  or diag(sql("SELECT string_agg(message_id || ' ' || status || ' ' || coalesce(error_class, '') || ' ' || coalesce(error, ''), E'\\n') FROM tide.relay_attempts WHERE pipeline_id = 'to_kafka' AND status = 'failed'"));
is(sql("SELECT string_agg(message_id || ':' || last_error_class, ',' ORDER BY message_id) FROM tide.relay_dlq
	  WHERE pipeline_id = 'to_kafka'"),
	"$r[1]:too_large,$r[2]:unknown_destination,$r[3]:template",
	'too large, unknown topic and a missing template header each have their class');
my @ok = $kafka->consume('refusals');
is(join(',', map { $json->decode($_->{body})->{ok} } @ok), '1,5', 'the others of the batch arrived');
is(sql("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'to_kafka' AND status = 'failed'
	  AND error_class = 'too_large' AND message_id = $r[1]"), '1', 'relay_attempts records the class');

# 5. A server without pg_tide_kafka.so: pg_tide runs, a kafka pipeline is
# refused with 42704 and the package to install. Its installation is a
# copy of this one without the module.
my ($install, $libdir) = installation_copy();
ok(-e "$libdir/pg_tide.so" && unlink("$libdir/pg_tide_kafka.so"),
	'the copied installation has pg_tide.so and no pg_tide_kafka.so');
my $bare = PostgreSQL::Test::Cluster->new('no_kafka', install_path => $install);
$bare->init;
$bare->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_tide'\n");
$bare->start;
$bare->safe_psql('postgres', 'CREATE EXTENSION pg_tide');
$bare->safe_psql('postgres', "SELECT tide.outbox_create('orders')");
my ($ret, $o, $e) = $bare->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT tide.relay_set_outbox('k', 'orders', 'k', '"
	  . $json->encode(\%base) . "'::jsonb)");
ok($e =~ /ERROR:\s+42704:.*sink type "kafka" is not available/ && $e =~ /HINT:.*librdkafka1/
	  && $e =~ /pg_tide_kafka\.so is not installed/,
	'without pg_tide_kafka.so a kafka pipeline is refused with 42704, naming the package')
  or diag($e);
$bare->safe_psql('postgres',
	"SELECT tide.relay_set_outbox('f', 'orders', 'f', jsonb_build_object('sink_type', 'file', 'path', '"
	  . PostgreSQL::Test::Utils::tempdir . "/f.jsonl'))");
is($bare->safe_psql('postgres', "SELECT count(*) FROM tide.relay_outbox_config"), '1',
	'and pg_tide serves other sinks there');
$bare->stop;

$node->stop;
$kafka->stop;
done_testing();
