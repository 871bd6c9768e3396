# A message can never stop its pipeline: whatever values a publisher puts
# in it, every other message of the pipeline is delivered, and the message
# itself is delivered or dead-lettered with an error class.
#
#  1. "ordering": "key", a message whose key has 8,000 characters, answered
#     503 once, with 200 messages behind it: its retry is recorded (the
#     retry queue's index holds a hash of the key), it is delivered on its
#     next attempt, and so are the 200.
#  2. A message whose outcome cannot be recorded (here a trigger on
#     tide.relay_attempts refuses its row, SQLSTATE P0001) is dead-lettered
#     with error class "record" and the error's text (without its payload
#     and attempt row, since a dead letter with them fails too); the 20
#     messages behind it are delivered and the offset passes all of them.
#  3. Hostile values, each in a message of its own among ordinary ones:
#     a long ordering key, a key of control characters, quotes,
#     backslashes, a right-to-left mark and the highest code points, 10,000
#     headers, a large payload. Into a webhook (answering 503 to the first
#     request of each hostile message), a file, Kafka (the mock cluster),
#     NATS (JetStream), Redis, RabbitMQ (to a queue through the default
#     exchange) and MQTT, each with ordering relaxed, strict
#     and key (a file takes no ordering). The sizes for the brokers stay
#     under their own limits (Kafka's and NATS's 1 MB): a 200 kB key, a
#     512 kB payload. A webhook and a file also take a 1 MB key and a 64 MB
#     payload (pg_tide.max_payload_bytes raised to 64 MB), ordering key
#     and relaxed.
#     Each pipeline's offset passes every message (but NATS's and
#     RabbitMQ's with ordering strict, which hold at the message with
#     10,000 headers: NATS takes 64 kB of headers, AMQP a frame of 128 kB,
#     so it is too_large, and strict dead-letters nothing), none of the
#     ordinary
#     ones is dead-lettered or left in the retry queue, and the hostile
#     ones are delivered or dead-lettered with a class; the webhook's and
#     the file's ordinary messages are checked on arrival.
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
use PgTide::NatsServer;
use PgTide::Redis;
use PgTide::Mosquitto;
use PgTide::RabbitMQ;
use JSON::PP;
use Time::HiRes qw(time);

my $t_start = time();
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
my $node = tide_node('poison',
	"pg_tide.relay_naptime_ms = 100\npg_tide.max_payload_bytes = 67108864\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;

# Message ids answered 200 on a path of the receiver. The log's lines are
# read by their start and end, not decoded: some hold 64 MB bodies.
sub delivered
{
	my ($path) = @_;
	my %seen;
	open(my $fh, '<', $rcv->logfile) or die $rcv->logfile . ": $!";
	while (my $l = <$fh>)
	{
		last unless $l =~ /\n\z/;
		my $head = substr($l, 0, 5000);
		next unless $head =~ /^\{"method":"POST","path":"\Q$path\E"/;
		next unless substr($l, -200) =~ /"status":200\b/;
		$seen{$1}++ if $head =~ /\\"message_id\\": (\d+)/;
	}
	close($fh);
	return \%seen;
}

# Message ids in a file a file pipeline writes, read by the start of each line.
sub in_file
{
	my ($file) = @_;
	my %seen;
	open(my $fh, '<', $file) or die "$file: $!";
	while (my $line = <$fh>)
	{
		$seen{$1}++ if substr($line, 0, 300) =~ /"message_id": (\d+)/;
	}
	close($fh);
	return \%seen;
}

my %webhook = (sink_type => 'webhook', allow_http => JSON::PP::true,
	allow_private_network => JSON::PP::true);
my %retry = (retry => { base_ms => 20, cap_ms => 200, max_attempts => 3 });

# Sets pipeline $name (its consumer group of the same name) on an outbox.
sub set_pipeline
{
	my ($name, $outbox, %cfg) = @_;
	my $c = $json->encode(\%cfg);
	$c =~ s/'/''/g;
	sql("SELECT tide.relay_set_outbox('$name', '$outbox', '$name', '$c'::jsonb)");
}

# The pipeline's durable offset reaches $last within $timeout seconds.
sub offset_reaches
{
	my ($name, $last, $timeout) = @_;
	return defined wait_until(sub {
		sql("SELECT coalesce((SELECT last_change_id FROM tide.relay_consumer_offsets"
			  . " WHERE pipeline_id = '$name'), 0) >= $last") eq 't' }, $timeout, 100_000);
}

# Keys that do not compress (a btree entry of a key that does would fit):
# md5 hex digits, 8,000 and 1 MB of them.
my $key8000 = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 250) g)";
my $key1m = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 32768) g)";

# --- 1. The 8,000-character key, answered 503 once.
sql("SELECT tide.outbox_create('repro')");
# One request at a time, in id order: the receiver's first answer, the 503,
# goes to the message with the long key (in parallel, to whichever came first).
set_pipeline('repro', 'repro', %webhook, url => $rcv->url('/repro'), ordering => 'key',
	ordering_key => '/k', batch_size => 100, max_in_flight => 1, %retry);
$rcv->control({ fail => [503] });
my @repro = split /\n/, sql(
	"SELECT tide.outbox_publish('repro', jsonb_build_object('k', $key8000, 'n', 0));"
	  . " SELECT tide.outbox_publish('repro', jsonb_build_object('k', 'key' || g, 'n', g))"
	  . " FROM generate_series(1, 200) g");
ok(offset_reaches('repro', $repro[-1], 30),
	'1: the offset passes the message with the 8,000-character key and the 200 behind it');
my $seen = delivered('/repro');
is(scalar(grep { !$seen->{$_} } @repro[1 .. $#repro]), 0, '1: all 200 messages behind it arrive');
ok($seen->{ $repro[0] }, '1: the message with the long key arrives on its next attempt');
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'repro'"), '0',
	'1: nothing is dead-lettered');
is(sql("SELECT string_agg(attempt || ' ' || status || ' ' || response_code, ', ' ORDER BY attempt)"
		  . " FROM tide.relay_attempts WHERE pipeline_id = 'repro' AND message_id = $repro[0]"),
	'1 failed 503, 2 success 200', '1: its failed attempt and its retry were recorded');
unlike(slurp_file($node->logfile), qr/pipeline "repro" stopped this pass after an error/,
	'1: no record of the pipeline failed');
is(sql("SELECT turn_error IS NULL FROM tide.relay_pipeline_status WHERE pipeline = 'repro'"), 't',
	'1: the pipeline reports no error');

# --- 2. A message whose outcome cannot be recorded.
sql(q{CREATE TABLE public.refused (message_id bigint PRIMARY KEY);
	CREATE FUNCTION public.refuse_attempt() RETURNS trigger LANGUAGE plpgsql
	  SET search_path = pg_catalog AS $$
	  BEGIN
		IF EXISTS (SELECT FROM public.refused r WHERE r.message_id = NEW.message_id) THEN
			RAISE EXCEPTION 'refused by a trigger';
		END IF;
		RETURN NEW;
	  END $$;
	CREATE TRIGGER refuse_attempt BEFORE INSERT ON tide.relay_attempts
	  FOR EACH ROW EXECUTE FUNCTION public.refuse_attempt();
	SELECT tide.outbox_create('refused')});
set_pipeline('refused', 'refused', %webhook, url => $rcv->url('/refused'), batch_size => 100,
	%retry);
my ($refused) = split /\n/, sql(
	"BEGIN; INSERT INTO public.refused SELECT tide.outbox_publish('refused', '{\"n\": 0}') RETURNING message_id;"
	  . " COMMIT");
my @after = split /\n/, sql(
	"SELECT tide.outbox_publish('refused', jsonb_build_object('n', g)) FROM generate_series(1, 20) g");
ok(offset_reaches('refused', $after[-1], 30),
	'2: the offset passes the message whose outcome cannot be recorded and the 20 behind it');
$seen = delivered('/refused');
is(scalar(grep { !$seen->{$_} } @after), 0, '2: all 20 messages behind it arrive');
like(sql("SELECT last_error_class || ' ' || last_error FROM tide.relay_dlq"
		  . " WHERE pipeline_id = 'refused' AND message_id = $refused"),
	qr/^record record: refused by a trigger$/,
	'2: it is dead-lettered with error class "record" and the error');
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'refused'"), '1',
	'2: and it alone');
is(sql("SELECT payload::text || ' ' || (headers IS NULL) FROM tide.relay_dlq WHERE pipeline_id = 'refused'"),
	'null true', '2: without its payload and headers: its dead letter with them logs the refused attempt too');
sql('DROP TRIGGER refuse_attempt ON tide.relay_attempts');

# --- 3. Hostile values into every sink with every ordering.
my $kafka = PgTide::KafkaMock->new;
my $nats = PgTide::NatsServer->new(dir => $dir);
$nats->start;
$nats->create_stream('HOSTILE', 'hostile.>', 120);
my $redis = PgTide::Redis->new(dir => $dir);
$redis->start;
my $mq = PgTide::Mosquitto->new(dir => $dir);
$mq->start;
my $rmq = PgTide::RabbitMQ->new(dir => $dir);
$rmq->start or BAIL_OUT('rabbitmq-server did not start');
$rmq->amqp('queue', "q_rabbitmq_$_") for ('relaxed', 'strict', 'key');

my %sinks = (
	webhook => sub { (%webhook, url => $rcv->url("/$_[0]")) },
	kafka => sub { (sink_type => 'kafka', bootstrap_servers => $kafka->bootstrap, topic => 'hostile') },
	nats => sub { (sink_type => 'nats', servers => $nats->url, subject => "hostile.$_[0]",
		stream => 'HOSTILE') },
	redis => sub { (sink_type => 'redis', url => $redis->url, stream => $_[0]) },
	mqtt => sub { (sink_type => 'mqtt', host => '127.0.0.1', port => $mq->port, topic => "hostile/$_[0]") },
	rabbitmq => sub { (sink_type => 'rabbitmq', host => '127.0.0.1', port => $rmq->port, vhost => 'tide',
		auth => { username => 'tide', password => $rmq->password }, routing_key => "q_$_[0]") },
);
my @pipelines;
sql("SELECT tide.outbox_create('hostile'), tide.outbox_create('huge')");
for my $sink (sort keys %sinks)
{
	for my $ordering ('relaxed', 'strict', 'key')
	{
		my $name = "${sink}_$ordering";
		set_pipeline($name, 'hostile', $sinks{$sink}->($name), batch_size => 10, timeout_ms => 10000,
			%retry, ordering => $ordering, ($ordering eq 'key' ? (ordering_key => '/k') : ()));
		push @pipelines, $name;
	}
}
set_pipeline('file', 'hostile', sink_type => 'file', path => "$dir/hostile.jsonl");
push @pipelines, 'file';
set_pipeline('huge_webhook', 'huge', $sinks{webhook}->('huge_webhook'), batch_size => 10,
	timeout_ms => 30000, %retry, ordering => 'key', ordering_key => '/k');
set_pipeline('huge_file', 'huge', sink_type => 'file', path => "$dir/huge.jsonl");

# The hostile messages first, in a commit of their own, so that the first
# requests of each webhook pipeline are theirs: those are answered 503.
my $odd = q{"\u0001\u001f\t\n\\\\\"%00\\\\x00\u202e\uffff\udbff\udfff"};
my $headers = 'SELECT jsonb_object_agg(\'h\' || g, g) FROM generate_series(1, 10000) g';
my @hostile = split /\n/, sql(qq{
	SELECT tide.outbox_publish('hostile', jsonb_build_object('k', left($key1m, 200000), 'n', 'long key'));
	SELECT tide.outbox_publish('hostile', jsonb_build_object('k', '$odd'::jsonb, 'n', 'odd key'));
	SELECT tide.outbox_publish('hostile', '{"k": "h", "n": "headers"}', ($headers));
	SELECT tide.outbox_publish('hostile', jsonb_build_object('k', 'p', 'big', repeat('p', 512 * 1024)));});
$rcv->control({ fail => [ (503) x 12 ] });
my @huge = split /\n/, sql(qq{
	SELECT tide.outbox_publish('huge', jsonb_build_object('k', $key1m, 'n', 'long key'));
	SELECT tide.outbox_publish('huge', jsonb_build_object('k', '$odd'::jsonb, 'n', 'odd key'));
	SELECT tide.outbox_publish('huge', '{"k": "h", "n": "headers"}', ($headers));
	SELECT tide.outbox_publish('huge', jsonb_build_object('k', 'p', 'big', repeat('p', 64 * 1024 * 1024 - 64)));});
ok(defined wait_until(sub { ($rcv->stats->{status}{503} // 0) >= 12 }, 30, 100_000),
	'3: the webhook answered 503 to the first attempt of hostile messages');
my @ordinary = split /\n/, sql(
	"SELECT tide.outbox_publish('hostile', jsonb_build_object('k', 'key' || (g % 5), 'n', g))"
	  . " FROM generate_series(1, 30) g");
my @huge_ordinary = split /\n/, sql(
	"SELECT tide.outbox_publish('huge', jsonb_build_object('k', 'key' || (g % 5), 'n', g))"
	  . " FROM generate_series(1, 10) g");

my %last = map { $_ => $ordinary[-1] } @pipelines;
$last{huge_webhook} = $last{huge_file} = $huge_ordinary[-1];
for my $name (@pipelines, 'huge_webhook', 'huge_file')
{
	my ($ids, $bad) = $name =~ /^huge/ ? (\@huge_ordinary, \@huge) : (\@ordinary, \@hostile);
	my $bad_list = join(',', @$bad);
	my $ok_list = join(',', @$ids);
	if ($name eq 'nats_strict' || $name eq 'rabbitmq_strict')
	{
		# NATS takes at most 64 kB of headers, AMQP a frame of 128 kB, and
		# with ordering strict nothing is dead-lettered: held at that
		# message, as documented
		ok(offset_reaches($name, $hostile[2] - 1, 60) && defined wait_until(sub {
			sql("SELECT last_error_class FROM tide.relay_pipeline_health WHERE pipeline_id = '$name'")
			  eq 'too_large' }, 30, 100_000),
			"3: $name: the offset passes every message before the one with 10,000 headers, held there as too_large");
		next;
	}
	ok(offset_reaches($name, $last{$name}, 60), "3: $name: the offset passes every message");
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$name' AND message_id IN ($ok_list)"),
		'0', "3: $name: no ordinary message is dead-lettered");
	ok(defined wait_until(sub {
		sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = '$name'") eq '0' }, 30, 100_000),
		"3: $name: nothing is left in the retry queue");
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$name'"
		  . " AND message_id IN ($bad_list) AND last_error_class IS NULL"),
		'0', "3: $name: a hostile message dead-lettered has an error class");
	note("$name: dead-lettered: " . sql("SELECT string_agg(message_id || ' ' || last_error_class || ': '"
		  . " || left(last_error, 80), '; ') FROM tide.relay_dlq WHERE pipeline_id = '$name'"));
}
for my $name (grep { /webhook/ } @pipelines, 'huge_webhook')
{
	my ($ids) = $name =~ /^huge/ ? (\@huge_ordinary) : (\@ordinary);
	my $got = delivered("/$name");
	is(scalar(grep { !$got->{$_} } @$ids), 0, "3: $name: every ordinary message arrives");
}
for my $file ('hostile', 'huge')
{
	my $in_file = in_file("$dir/$file.jsonl");
	my $ids = $file eq 'huge' ? [ @huge, @huge_ordinary ] : [ @hostile, @ordinary ];
	is(scalar(grep { !$in_file->{$_} } @$ids), 0, "3: the $file file holds every message, hostile ones too");
}

note(sprintf('test took %.1f s', time() - $t_start));
$mq->stop;
$rmq->stop;
$redis->stop;
$nats->stop;
$kafka->stop;
$rcv->stop;
$node->stop;
done_testing();
