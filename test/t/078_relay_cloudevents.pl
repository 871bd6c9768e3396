# "format": "cloudevents" end to end (relay/cloudevents.c), each binding read
# back by a receiver that parses CloudEvents:
#  - webhook, structured mode: the body is an application/cloudevents+json
#    event with id, source (default /pg_tide/<database>/<outbox>), type (the
#    "type" header), time (created_at), subject (the ordering key),
#    datacontenttype, specversion, data (the payload) and the trace context
#    attributes; mode "batch" sends application/cloudevents-batch+json, an
#    array of events;
#  - webhook, binary mode: the payload as the body, each attribute in a
#    ce-* header (percent-encoded), type and source from the config, id from
#    the header "id_header" names, subject from "subject_header";
#  - every format carries the W3C traceparent and tracestate given at
#    publish as HTTP headers (the native format too);
#  - Kafka (librdkafka's mock cluster, read by a librdkafka consumer):
#    structured mode with the content-type header, binary mode with ce_*
#    headers and content-type application/json, and the traceparent header;
#  - RabbitMQ (read by a rabbitmq-c client): content_type, and in binary
#    mode cloudEvents_* application properties (the AMQP binding);
#  - MQTT 5 (read by mosquitto_sub): the content type property, and in
#    binary mode each attribute a user property; MQTT 3.1.1 structured;
#  - NATS JetStream (read by a nats.c client): content-type, and in binary
#    mode ce-* headers;
#  - Redis Streams (read by a hiredis client): structured mode, the event in
#    the entry's field "message".
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;
use PgTide::KafkaMock;
use PgTide::RabbitMQ;
use PgTide::Mosquitto;
use PgTide::NatsServer;
use PgTide::Redis;
use JSON::PP;
use Encode qw(encode);

my $json = JSON::PP->new->canonical;
my $node = tide_node('cloudevents', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;
my $kafka = PgTide::KafkaMock->new;

sub sql { return $node->safe_psql('postgres', $_[0]) }

sub set_pipeline
{
	my ($name, $outbox, $cfg) = @_;
	sql("SELECT tide.relay_set_outbox('$name', '$outbox', '$name', '" . $json->encode($cfg) . "'::jsonb)");
}

# Publishes a message; returns its id and its created_at as to_json gives it.
sub publish
{
	my ($outbox, $payload, $headers) = @_;
	# as UTF-8 bytes, whatever the Perl string's inner form (psql reads bytes)
	my $id = sql("SELECT tide.outbox_publish('$outbox', '" . encode('UTF-8', $json->encode($payload)) . "', '"
		  . encode('UTF-8', $json->encode($headers)) . "')");
	my $time = sql("SELECT to_json(created_at) #>> '{}' FROM tide.tide_outbox_messages WHERE id = $id");
	return ($id, $time);
}

# The attributes of message $id of $outbox published at $time, with the
# default source, and %more; each name after $prefix (a binding's).
sub attributes
{
	my ($prefix, $outbox, $id, $time, %more) = @_;
	my %a = (specversion => '1.0', id => "outbox_$outbox:$id", source => "/pg_tide/postgres/$outbox",
		time => $time, %more);
	return { map { ($prefix . $_ => $a{$_}) } keys %a };
}

# The structured event of such a message.
sub event
{
	my ($outbox, $id, $time, %more) = @_;
	return attributes('', $outbox, $id, $time, datacontenttype => 'application/json', %more);
}

# The receiver's requests to a path, once $n of them have arrived (20 s).
sub requests_to
{
	my ($path, $n) = @_;
	my $got = sub { [ grep { $_->{path} eq $path } @{ $_[0] } ] };
	$rcv->wait_for(sub { @{ $got->($_[0]) } >= $n }, 20);
	return @{ $got->([ $rcv->requests ]) };
}

my %hook = (sink_type => 'webhook', allow_http => JSON::PP::true,
	allow_private_network => JSON::PP::true);
my $trace = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
my $tracestate = 'congo=t61rcWkgMzE, rojo=00f067aa0ba902b7';
for my $o (qw(ce_structured ce_binary ce_batch ce_native ce_kafka ce_amqp ce_mqtt ce_nats ce_redis))
{
	sql("SELECT tide.outbox_create('$o')");
}

# 1. Webhook, structured mode, ordering by key: subject is the key.
set_pipeline('hook_structured', 'ce_structured', { %hook, url => $rcv->url('/structured'),
	ordering => 'key', ordering_key => 'customer', format => 'cloudevents' });
my ($sid, $stime) = publish('ce_structured', { total => 42, items => [ 1, 2 ] },
	{ type => 'order.created', customer => 'c-7', traceparent => $trace, tracestate => $tracestate });
my ($s) = requests_to('/structured', 1);
my $event = $s ? eval { $json->decode($s->{body}) } : undef;
is($s && $s->{headers}{'content-type'}, 'application/cloudevents+json; charset=utf-8',
	'structured: Content-Type application/cloudevents+json');
is_deeply($event, event('ce_structured', $sid, $stime, type => 'order.created', subject => 'c-7',
		traceparent => $trace, tracestate => $tracestate, data => { total => 42, items => [ 1, 2 ] }),
	'structured: every attribute mapped, the payload as data')
  or diag($s ? $s->{body} : 'no request');
like($stime, qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/, 'time is RFC 3339');
is($s && $s->{headers}{traceparent}, $trace, 'structured: the traceparent header');
is($s && $s->{headers}{tracestate}, $tracestate, 'structured: the tracestate header');

# 2. Webhook, binary mode: attributes from the config and named headers.
set_pipeline('hook_binary', 'ce_binary', { %hook, url => $rcv->url('/binary'), format => 'cloudevents',
	cloudevents => { mode => 'binary', source => 'https://shop.example/orders', type => 'com.example.order',
		type_header => 'kind', id_header => 'event_id', subject_header => 'order' } });
my ($bid, $btime) = publish('ce_binary', { total => 7 },
	{ event_id => 'evt-1', order => "ord 9 \x{e9}%", traceparent => $trace });
my ($b2id) = publish('ce_binary', { total => 8 }, { kind => 'com.example.refund' });
my @b = sort { $a->{body} cmp $b->{body} } requests_to('/binary', 2);
my %h = $b[0] ? %{ $b[0]{headers} } : ();
is_deeply({ map { $_ => $h{$_} } grep { /^ce-/ } keys %h }, {
		'ce-specversion' => '1.0', 'ce-id' => 'evt-1', 'ce-source' => 'https://shop.example/orders',
		'ce-type' => 'com.example.order', 'ce-time' => $btime, 'ce-subject' => 'ord%209%20%C3%A9%25' },
	'binary: every attribute in a ce-* header, the subject percent-encoded');
is($h{'content-type'}, 'application/json', 'binary: Content-Type is the datacontenttype');
is_deeply($b[0] ? $json->decode($b[0]{body}) : undef, { total => 7 }, 'binary: the payload is the body');
is($h{traceparent}, $trace, 'binary: the traceparent header');
my %h2 = $b[1] ? %{ $b[1]{headers} } : ();
is(join(' ', map { $h2{$_} // 'none' } qw(ce-id ce-type ce-subject traceparent)),
	"outbox_ce_binary:$b2id com.example.refund none none",
	'binary: without the headers, the id is the identity, the type the header "kind", no subject');

# 3. Webhook, structured, mode batch: an array of events.
set_pipeline('hook_batch', 'ce_batch', { %hook, url => $rcv->url('/batch'), mode => 'batch',
	format => 'cloudevents' });
sql("BEGIN; SELECT tide.outbox_publish('ce_batch', '{\"n\": 1}'); SELECT tide.outbox_publish('ce_batch', '{\"n\": 2}'); COMMIT");
my @batch = requests_to('/batch', 1);
my $events = @batch ? eval { $json->decode($batch[0]{body}) } : undef;
is($batch[0] && $batch[0]{headers}{'content-type'}, 'application/cloudevents-batch+json; charset=utf-8',
	'batch: Content-Type application/cloudevents-batch+json');
is(join(' ', map { "$_->{type}:$_->{data}{n}" } @{ $events // [] }),
	'pg_tide.ce_batch:1 pg_tide.ce_batch:2', 'batch: one event per message, the default type');

# 4. The native format carries the trace context too.
set_pipeline('hook_native', 'ce_native', { %hook, url => $rcv->url('/native') });
publish('ce_native', { n => 1 }, { traceparent => $trace, tracestate => "a=1\nb" });
my ($n) = requests_to('/native', 1);
is($n && $n->{headers}{traceparent}, $trace, 'native: the traceparent header');
ok($n && !exists $n->{headers}{tracestate}, 'native: a tracestate with a line break is not passed on');
ok($n && !grep({ /^ce-/ } keys %{ $n->{headers} }), 'native: no ce-* header');

# 5. Kafka: structured and binary, read back by a librdkafka consumer.
$kafka->command('create ce_structured 1');
$kafka->command('create ce_binary 1');
my %k = (sink_type => 'kafka', bootstrap_servers => $kafka->bootstrap, format => 'cloudevents');
set_pipeline('kafka_structured', 'ce_kafka', { %k, topic => 'ce_structured' });
set_pipeline('kafka_binary', 'ce_kafka', { %k, topic => 'ce_binary', cloudevents => { mode => 'binary' } });
my ($kid, $ktime) = publish('ce_kafka', { sku => 'a' }, { type => 'stock.moved', traceparent => $trace });
my (@ks, @kb);
wait_until(sub { @ks = $kafka->consume('ce_structured'); @ks > 0 }, 30, 300);
wait_until(sub { @kb = $kafka->consume('ce_binary'); @kb > 0 }, 30, 300);
my $kevent = @ks ? eval { $json->decode($ks[0]{body}) } : undef;
is($ks[0] && $ks[0]{headers}{'content-type'}, 'application/cloudevents+json; charset=utf-8',
	'kafka structured: the content-type header');
is_deeply($kevent, event('ce_kafka', $kid, $ktime, type => 'stock.moved', traceparent => $trace,
		data => { sku => 'a' }),
	'kafka structured: the event is the body')
  or diag($ks[0] ? $ks[0]{body} : 'nothing');
my %kh = $kb[0] ? %{ $kb[0]{headers} } : ();
is_deeply({ map { $_ => $kh{$_} } grep { /^ce_/ || $_ eq 'content-type' } keys %kh },
	{ %{ attributes('ce_', 'ce_kafka', $kid, $ktime, type => 'stock.moved') }, 'content-type' => 'application/json' },
	'kafka binary: every attribute in a ce_* header, content-type the datacontenttype');
is($kb[0] && $kb[0]{body}, '{"sku": "a"}', 'kafka binary: the payload is the body');
is($kh{traceparent}, $trace, 'kafka: the traceparent header');

# 6. RabbitMQ: the AMQP binding.
my $rmq = PgTide::RabbitMQ->new(dir => $dir, password => 'rmq-pw');
ok($rmq->start, 'rabbitmq-server runs') or BAIL_OUT('rabbitmq-server did not start');
$rmq->amqp('queue', 'q_structured');
$rmq->amqp('queue', 'q_binary');
my %r = (sink_type => 'rabbitmq', host => '127.0.0.1', port => $rmq->port, vhost => 'tide',
	auth => { username => 'tide', password => 'rmq-pw' }, format => 'cloudevents');
set_pipeline('amqp_structured', 'ce_amqp', { %r, routing_key => 'q_structured' });
set_pipeline('amqp_binary', 'ce_amqp', { %r, routing_key => 'q_binary', cloudevents => { mode => 'binary' } });
my ($aid, $atime) = publish('ce_amqp', { n => 1 }, { type => 'amqp.test', traceparent => $trace });
my (@as, @ab);
wait_until(sub { push @as, map { $json->decode($_) } grep { /^\{/ } split /\n/, $rmq->amqp('read', 'q_structured', 300, 1); @as > 0 }, 30, 100);
wait_until(sub { push @ab, map { $json->decode($_) } grep { /^\{/ } split /\n/, $rmq->amqp('read', 'q_binary', 300, 1); @ab > 0 }, 30, 100);
is($as[0] && $as[0]{properties}{content_type}, 'application/cloudevents+json; charset=utf-8',
	'amqp structured: content_type application/cloudevents+json');
is_deeply($as[0] ? $json->decode($as[0]{body}) : undef,
	event('ce_amqp', $aid, $atime, type => 'amqp.test', traceparent => $trace, data => { n => 1 }),
	'amqp structured: the event is the body');
my %ah = $ab[0] ? %{ $ab[0]{headers} } : ();
is_deeply({ map { $_ => $ah{$_} } grep { /^cloudEvents_/ } keys %ah },
	attributes('cloudEvents_', 'ce_amqp', $aid, $atime, type => 'amqp.test'),
	'amqp binary: every attribute a cloudEvents_ application property');
is($ab[0] && $ab[0]{properties}{content_type}, 'application/json', 'amqp binary: content_type the datacontenttype');
is($ab[0] && $ab[0]{body}, '{"n": 1}', 'amqp binary: the payload is the body');
is($ah{traceparent}, $trace, 'amqp: the traceparent property');
$rmq->stop;

# 7. MQTT 5 and 3.1.1.
my $mq = PgTide::Mosquitto->new(dir => $dir);
$mq->start;
my $sub = $mq->subscribe('ce/#');
my %m = (sink_type => 'mqtt', host => '127.0.0.1', port => $mq->port, format => 'cloudevents');
set_pipeline('mqtt_structured', 'ce_mqtt', { %m, topic => 'ce/structured' });
set_pipeline('mqtt_binary', 'ce_mqtt', { %m, topic => 'ce/binary', cloudevents => { mode => 'binary' } });
set_pipeline('mqtt_311', 'ce_mqtt', { %m, topic => 'ce/v311', protocol => '3.1.1' });
my ($mid, $mtime) = publish('ce_mqtt', { n => 2 }, { type => 'mqtt.test', traceparent => $trace });
my %mm;
wait_until(sub { %mm = map { $_->{topic} => $_ } $mq->messages($sub); keys %mm == 3 }, 30, 100);
my $mevent = event('ce_mqtt', $mid, $mtime, type => 'mqtt.test', traceparent => $trace, data => { n => 2 });
my $ms = $mm{'ce/structured'};
is($ms && $ms->{content_type}, 'application/cloudevents+json; charset=utf-8',
	'mqtt 5 structured: the content type property');
is_deeply($ms ? $json->decode($ms->{payload}) : undef, $mevent, 'mqtt 5 structured: the event is the body');
my $mb = $mm{'ce/binary'};
my %up = $mb ? %{ $mb->{props} } : ();
is_deeply({ map { $_ => $up{$_} } qw(specversion id source type time traceparent) },
	attributes('', 'ce_mqtt', $mid, $mtime, type => 'mqtt.test', traceparent => $trace),
	'mqtt 5 binary: every attribute a user property, and the traceparent');
is($mb && $mb->{content_type}, 'application/json', 'mqtt 5 binary: the content type the datacontenttype');
is($mb && $mb->{payload}, '{"n": 2}', 'mqtt 5 binary: the payload is the body');
my $m3 = $mm{'ce/v311'};
is_deeply($m3 ? $json->decode($m3->{payload}) : undef, $mevent, 'mqtt 3.1.1 structured: the event is the body');
$mq->stop;

# 8. NATS JetStream: the NATS binding.
my $nats = PgTide::NatsServer->new(dir => $dir);
$nats->start;
# a stream each: both pipelines send the message with the same Nats-Msg-Id
$nats->create_stream('CE_S', 'ce.structured', 120);
$nats->create_stream('CE_B', 'ce.binary', 120);
my %nc = (sink_type => 'nats', servers => $nats->url, format => 'cloudevents');
set_pipeline('nats_structured', 'ce_nats', { %nc, subject => 'ce.structured' });
set_pipeline('nats_binary', 'ce_nats', { %nc, subject => 'ce.binary', cloudevents => { mode => 'binary' } });
my ($nid, $ntime) = publish('ce_nats', { n => 3 }, { type => 'nats.test', traceparent => $trace });
my %nm;
wait_until(sub { %nm = map { $_->{subject} => $_ } $nats->messages('CE_S'), $nats->messages('CE_B'); keys %nm == 2 },
	30, 100);
# a header's value, or its first when the reader gives a list
my $hv = sub { my ($m, $name) = @_; my $v = $m ? $m->{headers}{$name} : undef; ref $v ? $v->[0] : $v };
my $ns = $nm{'ce.structured'};
is($hv->($ns, 'content-type'), 'application/cloudevents+json; charset=utf-8', 'nats structured: content-type');
is_deeply($ns ? $json->decode($ns->{body}) : undef,
	event('ce_nats', $nid, $ntime, type => 'nats.test', traceparent => $trace, data => { n => 3 }),
	'nats structured: the event is the body');
my $nb = $nm{'ce.binary'};
is_deeply({ map { $_ => $hv->($nb, $_) } qw(ce-specversion ce-id ce-source ce-type ce-time content-type traceparent) },
	{ %{ attributes('ce-', 'ce_nats', $nid, $ntime, type => 'nats.test') }, 'content-type' => 'application/json',
	  traceparent => $trace },
	'nats binary: every attribute a ce- header, content-type the datacontenttype, the traceparent');
is($nb && $nb->{body}, '{"n": 3}', 'nats binary: the payload is the body');
$nats->stop;

# 9. Redis Streams: structured only.
my $redis = PgTide::Redis->new(dir => $dir);
$redis->start;
set_pipeline('redis_structured', 'ce_redis', { sink_type => 'redis', url => $redis->url, stream => 'ce',
	format => 'cloudevents' });
my ($rid, $rtime) = publish('ce_redis', { n => 4 }, { type => 'redis.test' });
my @re;
wait_until(sub { @re = $redis->entries('ce'); @re > 0 }, 30, 100);
is(join(' ', map { "$_=" . ($re[0] ? $re[0]{fields}{$_} // 'none' : 'none') } qw(tide-id content-type)),
	"tide-id=outbox_ce_redis:$rid content-type=application/cloudevents+json; charset=utf-8",
	'redis structured: the fields tide-id and content-type');
is_deeply($re[0] ? $json->decode($re[0]{fields}{message}) : undef,
	event('ce_redis', $rid, $rtime, type => 'redis.test', data => { n => 4 }),
	'redis structured: the event in the field "message"');
$redis->stop;

is(sql("SELECT count(*) FROM tide.relay_dlq"), '0', 'nothing was dead-lettered');
$rcv->stop;
$kafka->stop;
done_testing();
