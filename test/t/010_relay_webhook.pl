# The relay delivers to a webhook (test/receiver on 127.0.0.1): every
# committed message arrives with webhook-id = Idempotency-Key =
# outbox_orders:<id>, Standard Webhooks signatures that verify (two secrets:
# both sign; checked here and by the receiver), the custom headers; batch
# mode sends arrays; 503s with Retry-After (seconds or an HTTP-date) are
# retried; the pg-tide signature verifies; a 400 dead-letters its message
# without holding back the others, and relay_dlq_retry delivers it again;
# retries run out into relay_dlq; ordering 'strict' holds the pipeline at
# a failing message instead; a 410 disables it; private addresses
# (127.0.0.1, localhost after resolution, the cloud metadata address)
# without allow_private_network are refused, when the pipeline is set if the
# URL holds the address, and by the worker (blocked_ssrf); a receiver that
# is down and comes back gets everything; a commit arrives at once with an
# hour's naptime, and so does a change of the pipeline.
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
use MIME::Base64 qw(decode_base64);
use Digest::SHA qw(hmac_sha256_base64 hmac_sha256_hex);
use Time::HiRes qw(time usleep);
use POSIX qw(strftime);

my $node = tide_node('webhook', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;
my @secrets = ('whsec_' . 'c2VjcmV0LW9uZS0xMjM0NTY3ODkw', 'whsec_' . 'YW5vdGhlci1zZWNyZXQ=');
my $rcv = PgTide::Receiver->new(dir => $dir);
my $port = $rcv->port;

# Starts the receiver, which checks the Standard Webhooks signatures too.
sub start_receiver
{
	$rcv->start;
	$rcv->control({ secrets => \@secrets });
}

sub stop_receiver { $rcv->stop }

# Tells the receiver how to answer.
sub control { $rcv->control(@_) }

# Every request the receiver logged.
sub requests { return $rcv->requests }

# The messages of a request's body (one object, or an array of them).
sub messages_of
{
	my ($req) = @_;
	my $b = $json->decode($req->{body});
	return ref $b eq 'ARRAY' ? @$b : ($b);
}

# id => times acknowledged (status 200) at the given path.
sub delivered
{
	my ($path) = @_;
	my %seen;
	for my $r (requests())
	{
		next unless $r->{status} == 200 && $r->{path} eq $path;
		$seen{ $_->{message_id} }++ for messages_of($r);
	}
	return \%seen;
}

# Waits (bounded) until every id was acknowledged at the path; the time taken.
sub wait_for_ids
{
	my ($ids, $timeout, $path) = @_;
	my $start = time();
	while (time() - $start < $timeout)
	{
		my $seen = delivered($path // '/hook');
		return time() - $start unless grep { !$seen->{$_} } @$ids;
		usleep(5_000);
	}
	return undef;
}

# Publishes n messages to an outbox in one transaction; returns their ids.
sub publish
{
	my ($n, $outbox) = @_;
	$outbox //= 'orders';
	return split /\n/, $node->safe_psql('postgres',
		"SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', g), '{\"h\": \"v\"}')
		   FROM generate_series(1, $n) g");
}

# Sets pipeline "hook" (outbox orders) with the given extra config.
sub set_hook
{
	my ($extra) = @_;
	my $cfg = {
		sink_type => 'webhook',
		url => "http://127.0.0.1:$port/hook",
		allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true,
		signing_secret => \@secrets,
		max_in_flight => 8,
		headers => { 'Authorization' => 'Bearer t0k', 'X-Custom' => 'yes' },
		retry => { base_ms => 100, cap_ms => 1000, max_attempts => 5 },
		%{ $extra // {} } };
	my $c = $json->encode($cfg);
	$node->safe_psql('postgres',
		"SELECT tide.relay_set_outbox('hook', 'orders', 'hook', '$c'::jsonb)");
}

# Whether a request's webhook-signature verifies with every secret.
sub signature_ok
{
	my ($r) = @_;
	my $h = $r->{headers};
	my %sigs = map { $_ => 1 } split / /, ($h->{'webhook-signature'} // '');
	for my $s (@secrets)
	{
		my $key = decode_base64(substr($s, 6));
		my $mac = hmac_sha256_base64("$h->{'webhook-id'}.$h->{'webhook-timestamp'}.$r->{body}", $key);
		$mac .= '=' while length($mac) % 4;
		return 0 unless $sigs{"v1,$mac"};
	}
	return 1;
}

# The pipeline's durable offset.
sub offset
{
	return $node->safe_psql('postgres',
		"SELECT last_change_id FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'");
}

my $t_start = time();
start_receiver();
$node->safe_psql('postgres', "SELECT tide.outbox_create('orders')");
$node->safe_psql('postgres', "SELECT tide.outbox_create('private')");
set_hook();

# 50 messages, single mode, several in flight.
my @ids = publish(50);
ok(defined wait_for_ids(\@ids, 20), 'all 50 messages arrive');
my @reqs = grep { $_->{path} eq '/hook' } requests();
my %want = map { $_ => 1 } @ids;
is(scalar(grep { my ($m) = messages_of($_);
			$_->{headers}{'webhook-id'} ne "outbox_orders:$m->{message_id}"
			  || $_->{headers}{'idempotency-key'} ne "outbox_orders:$m->{message_id}"
			  || $m->{id} ne "outbox_orders:$m->{message_id}" } @reqs),
	0, 'webhook-id = Idempotency-Key = body id = outbox_orders:<id>');
is(scalar(grep { !signature_ok($_) } @reqs), 0, 'every webhook-signature verifies, with both secrets');
is(scalar(grep { !$_->{sig} } @reqs), 0, 'the receiver verifies every webhook-signature too');
is(scalar(grep { ($_->{headers}{authorization} // '') ne 'Bearer t0k'
			  || ($_->{headers}{'x-custom'} // '') ne 'yes' } @reqs),
	0, 'the custom headers arrive');
like($reqs[0]{headers}{'webhook-timestamp'}, qr/^\d{10}$/, 'webhook-timestamp is unix seconds');
is($reqs[0]{headers}{'content-type'}, 'application/json', 'Content-Type is application/json');
my ($m0) = messages_of($reqs[0]);
is_deeply([ $m0->{outbox}, $m0->{headers} ], [ 'orders', { h => 'v' } ], 'the body carries outbox and headers');
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $ids[-1] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'"),
	'the offset ends at the last id');

# The attempt log has one row per request: attempt 1, success, 200, the
# latency and the answer's first bytes (control characters stripped).
is($node->safe_psql('postgres',
		"SELECT count(*) || ' ' || count(DISTINCT message_id) || ' ' || bool_and(attempt = 1 AND status = 'success'
		        AND response_code = 200 AND latency_ms > 0 AND response_snippet = 'ok' AND NOT manual
		        AND error_class IS NULL AND outbox_name = 'orders')
		   FROM tide.relay_attempts WHERE pipeline_id = 'hook' AND message_id BETWEEN $ids[0] AND $ids[-1]"),
	'50 50 true', 'relay_attempts: one successful attempt per message, with status, latency and answer');

# Two 503s with Retry-After: 1, then 200.
control({ fail => [ 503, 503 ], retry_after => 1 });
@ids = publish(5);
ok(defined wait_for_ids(\@ids, 15), 'after two 503s the messages still arrive');
is(scalar(grep { $_->{status} == 503 } requests()), 2, 'the receiver answered 503 twice');
is($node->safe_psql('postgres',
		"SELECT string_agg(attempt || ':' || status || ':' || coalesce(response_code::text, '-') || ':'
		                   || coalesce(error_class, '-'), ',' ORDER BY id)
		   FROM tide.relay_attempts WHERE pipeline_id = 'hook' AND message_id BETWEEN $ids[0] AND $ids[-1]
		    AND message_id IN (SELECT message_id FROM tide.relay_attempts WHERE status = 'failed')"),
	'1:failed:503:http_5xx,1:failed:503:http_5xx,2:success:200:-,2:success:200:-',
	'relay_attempts shows each retried message\'s failed first and successful second attempt');
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $ids[-1] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'"),
	'the offset ends at the last id after the retries');
control({ retry_after => undef });

# Batch mode: JSON arrays, webhook-id names the first and last id.
set_hook({ mode => 'batch', batch_size => 20 });
my $nreq = scalar(requests());
@ids = publish(30);
ok(defined wait_for_ids(\@ids, 15), 'batch mode: all 30 messages arrive');
my @batch = grep { $_->{path} eq '/hook' } (requests())[ $nreq .. scalar(requests()) - 1 ];
ok(@batch >= 1 && @batch < 30, 'batch mode sends fewer requests than messages (' . scalar(@batch) . ')');
is(scalar(grep { $_->{body} !~ /^\[/ } @batch), 0, 'every batch body is a JSON array');
my @multi = grep { (my @m = messages_of($_)) > 1 } @batch;
ok(@multi > 0, 'a batch holds several messages');
my @mm = messages_of($multi[0]);
is($multi[0]{headers}{'webhook-id'}, "outbox_orders:$mm[0]{message_id}-$mm[-1]{message_id}",
	'a batch\'s webhook-id names its first and last id');
is(scalar(grep { !signature_ok($_) } @batch), 0, 'batch signatures verify');
is(scalar(grep { !$_->{sig} } @batch), 0, 'the receiver verifies the batch signatures too');

# signature 'pg-tide': X-Pg-Tide-Signature, the first secret over the body
# (and "attempt_log": false: no rows in relay_attempts).
set_hook({ signature => 'pg-tide', attempt_log => JSON::PP::false });
$nreq = scalar(requests());
@ids = publish(2);
ok(defined wait_for_ids(\@ids, 10), 'pg-tide signature: the messages arrive');
my $key0 = decode_base64(substr($secrets[0], 6));
my @pgt = grep { $_->{path} eq '/hook' } (requests())[ $nreq .. scalar(requests()) - 1 ];
is(scalar(grep { ($_->{headers}{'x-pg-tide-signature'} // '') ne 'sha256=' . hmac_sha256_hex($_->{body}, $key0)
			  || exists $_->{headers}{'webhook-signature'} } @pgt),
	0, 'X-Pg-Tide-Signature is sha256=<hex HMAC of the body>, and no webhook-signature');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM tide.relay_attempts WHERE message_id BETWEEN $ids[0] AND $ids[-1]"),
	'0', 'with attempt_log false no attempt is logged');
set_hook();

# The ids of the pipeline's dead letters, and of its retry queue.
sub dead_letters
{
	return split /\n/, $node->safe_psql('postgres',
		"SELECT message_id FROM tide.relay_dlq_list('hook') ORDER BY message_id");
}

sub retry_queue
{
	return split /\n/, $node->safe_psql('postgres',
		"SELECT message_id FROM tide.relay_retry_queue WHERE pipeline_id = 'hook' ORDER BY message_id");
}

# Retry-After as an HTTP-date three seconds ahead: the retry waits for it
# (the backoff alone would retry after about 100 ms).
control({ fail => [503], retry_after => strftime('%a, %d %b %Y %H:%M:%S GMT', gmtime(time() + 3)) });
my $nreq0 = scalar(requests());
@ids = publish(1);
ok(defined wait_for_ids(\@ids, 15), 'after a 503 with an HTTP-date Retry-After the message arrives');
my @dated = (requests())[ $nreq0 .. scalar(requests()) - 1 ];
ok(@dated == 2 && $dated[1]{t} - $dated[0]{t} >= 1.5,
	sprintf('the retry waited for the HTTP-date (%.2f s after the 503)',
		@dated == 2 ? $dated[1]{t} - $dated[0]{t} : -1));
control({ retry_after => undef });

# A 400 dead-letters its message and holds back no other: the other two
# arrive, the offset passes all three, the dead letter keeps the message.
my $log_offset = -s $node->logfile;
control({ fail => [400] });
@ids = publish(3);
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM tide.relay_dlq WHERE pipeline_id = 'hook'"),
	'a 400 puts its message into relay_dlq');
my ($dead) = dead_letters();
ok((grep { $_ == $dead } @ids), 'the dead letter is one of the three');
ok(defined wait_for_ids([ grep { $_ != $dead } @ids ], 10), 'the other two arrive');
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $ids[-1] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'"),
	'the offset passes the dead letter');
is($node->safe_psql('postgres',
		"SELECT reason || ' ' || attempts || ' ' || last_status || ' ' || last_error_class || ' ' || (payload ->> 'n')
		   FROM tide.relay_dlq WHERE pipeline_id = 'hook'"),
	'permanent 1 400 http_4xx ' . ($dead - $ids[0] + 1), 'the dead letter records why, and the message');
like(slurp_file($node->logfile, $log_offset),
	qr/pipeline "hook" dead-lettered message $dead of outbox "orders" after 1 attempt: HTTP status 400/,
	'the log says it was dead-lettered');
is(delivered('/hook')->{$dead}, undef, 'the dead letter was not acknowledged');
$node->safe_psql('postgres', "SELECT tide.relay_dlq_retry(id) FROM tide.relay_dlq WHERE message_id = $dead");
ok(defined wait_for_ids([$dead], 10), 'relay_dlq_retry delivers it once the receiver accepts');
ok($node->poll_query_until('postgres',
		"SELECT NOT EXISTS (SELECT FROM tide.relay_dlq WHERE pipeline_id = 'hook')
		    AND NOT EXISTS (SELECT FROM tide.relay_retry_queue WHERE pipeline_id = 'hook')"),
	'after the retry, neither relay_dlq nor the retry queue holds it');
is($node->safe_psql('postgres',
		"SELECT string_agg(attempt || ':' || manual || ':' || status || ':' || coalesce(response_code::text, '-'),
		                   ',' ORDER BY id)
		   FROM tide.relay_attempts WHERE pipeline_id = 'hook' AND message_id = $dead"),
	'1:false:failed:400,1:true:success:200', 'the manual retry shows in relay_attempts as manual');

# 413 Payload Too Large is permanent, with its own error class.
control({ fail => [413] });
@ids = publish(1);
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM tide.relay_dlq WHERE message_id = $ids[0] AND last_error_class = 'too_large'"),
	'a 413 dead-letters the message with error class too_large');
$node->safe_psql('postgres', "SELECT tide.relay_dlq_purge(interval '0')");

# Retries run out: max_attempts 2 against a receiver answering 503.
set_hook({ retry => { base_ms => 50, cap_ms => 200, max_attempts => 2 } });
control({ always => 503 });
@ids = publish(1);
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM tide.relay_dlq WHERE message_id = $ids[0]"),
	'a message answered 503 every time goes to relay_dlq after max_attempts');
is($node->safe_psql('postgres', "SELECT reason || ' ' || attempts FROM tide.relay_dlq WHERE message_id = $ids[0]"),
	'exhausted 2', 'dead-lettered as exhausted after 2 attempts');
is(scalar(grep { $_->{status} == 503 && (messages_of($_))[0]{message_id} == $ids[0] } requests()), 2,
	'the receiver saw exactly 2 attempts');
is(scalar(retry_queue()), 0, 'the retry queue is empty');
control({ always => undef });
is($node->safe_psql('postgres', "SELECT tide.relay_dlq_retry_all('hook')"), '1', 'relay_dlq_retry_all queues it');
ok(defined wait_for_ids(\@ids, 10), 'and it arrives');
set_hook();

# ordering 'strict': the pipeline holds at the failing message (one in
# flight, so the order is the ids' order), nothing is dead-lettered, and
# the messages arrive in order once the receiver accepts.
set_hook({ ordering => 'strict', max_in_flight => 1, retry => { base_ms => 100, cap_ms => 500, max_attempts => 3 } });
$log_offset = -s $node->logfile;
$nreq0 = scalar(requests());
my $before = offset();
control({ always => 400 });
@ids = publish(3);
my $held = 0;
for (1 .. 100)
{
	$held = 1 if slurp_file($node->logfile, $log_offset) =~
	  /pipeline "hook" is held at message $ids[0]: HTTP status 400/;
	last if $held;
	usleep(100_000);
}
ok($held, 'strict: a 400 holds the pipeline at the message');
is(offset(), $before, 'strict: the offset stays before it');
is(scalar(dead_letters()), 0, 'strict: nothing is dead-lettered');
control({ always => undef });
ok(defined wait_for_ids(\@ids, 10), 'strict: once the receiver accepts, the held messages arrive');
my @order = map { (messages_of($_))[0]{message_id} }
  grep { $_->{status} == 200 } (requests())[ $nreq0 .. scalar(requests()) - 1 ];
is_deeply(\@order, \@ids, 'strict: they arrive in order, each once');
set_hook();

# 410 Gone disables the pipeline.
$log_offset = -s $node->logfile;
control({ always => 410 });
@ids = publish(1);
ok($node->poll_query_until('postgres',
		"SELECT NOT enabled FROM tide.relay_outbox_config WHERE name = 'hook'"),
	'a 410 disables the pipeline');
like(slurp_file($node->logfile, $log_offset), qr/pipeline "hook" is disabled: the receiver answered 410 Gone/,
	'the log says why the pipeline was disabled');
control({ always => undef });
$node->safe_psql('postgres', "SELECT tide.relay_enable('hook')");
ok(defined wait_for_ids(\@ids, 10), 'enabled again, the message arrives');

# Without allow_private_network, a URL written with a private address is
# refused when it is set, and when its row is written by hand (the row's
# trigger); a name is refused after resolution (localhost). A row written
# with triggers off is refused by the worker's own run of the validator.
$log_offset = -s $node->logfile;
my ($rc, $out, $err) = $node->psql('postgres',
	"SELECT tide.relay_set_outbox('private', 'private', 'private', jsonb_build_object(
	   'sink_type', 'webhook', 'url', 'http://127.0.0.1:$port/private', 'allow_http', true))");
like($err, qr/config key "url" points to a non-public address: "127\.0\.0\.1"/,
	'relay_set_outbox refuses 127.0.0.1 without allow_private_network');
for my $p (['private', "http://127.0.0.1:$port/private"],
	['metadata', 'http://169.254.169.254/latest/meta-data/'])
{
	$node->safe_psql('postgres',
		"SELECT tide.relay_set_outbox('$p->[0]', 'private', '$p->[0]', jsonb_build_object(
		   'sink_type', 'webhook', 'url', 'http://localhost:$port/private', 'allow_http', true, 'timeout_ms', 2000,
		   'retry', jsonb_build_object('base_ms', 100, 'cap_ms', 500)))");
	my $update = "UPDATE tide.relay_outbox_config SET config = jsonb_set(config, '{url}', to_jsonb('$p->[1]'::text))
		  WHERE name = '$p->[0]'";
	($rc, $out, $err) = $node->psql('postgres', $update);
	like($err, qr/config key "url" points to a non-public address/,
		"the row's trigger refuses $p->[0]'s address written by hand");
	$node->safe_psql('postgres', "SET session_replication_role = replica; $update");
}
$node->safe_psql('postgres',
	"SELECT tide.relay_set_outbox('named', 'private', 'named', jsonb_build_object(
	   'sink_type', 'webhook', 'url', 'http://localhost:$port/private', 'allow_http', true,
	   'retry', jsonb_build_object('base_ms', 100, 'cap_ms', 500)))");
publish(2, 'private');
my %blocked;
for (1 .. 100)
{
	my $log = slurp_file($node->logfile, $log_offset);
	$blocked{named} = 1 if $log =~ /pipeline "named" is held .*blocked_ssrf/;
	$blocked{$_} = 1
	  for grep { $log =~ /pipeline "$_" is passed over: config key "url" points to a non-public address/ }
	  qw(private metadata);
	last if keys %blocked == 3;
	usleep(100_000);
}
ok($blocked{private}, '127.0.0.1 without allow_private_network, written with triggers off, is passed over');
ok($blocked{named}, 'localhost (refused after resolution) is logged as blocked_ssrf');
ok($blocked{metadata}, 'the cloud metadata address, written with triggers off, is passed over');
is(scalar(grep { $_->{path} eq '/private' } requests()), 0, 'nothing reaches the receiver from it');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM tide.relay_consumer_offsets WHERE pipeline_id IN ('private', 'named', 'metadata')"),
	'0', 'the blocked pipelines record no offset');
$node->safe_psql('postgres', "SELECT tide.relay_delete(p) FROM unnest(ARRAY['private', 'named', 'metadata']) p");

# Commit-to-receipt latency with an hour's naptime: only a commit wakes it.
$node->safe_psql('postgres', "ALTER SYSTEM SET pg_tide.relay_naptime_ms = '1h'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
usleep(1_000_000);
my $t0 = time();
@ids = publish(1);
my $latency = wait_for_ids(\@ids, 15);
note(sprintf('commit-to-receipt latency (from before psql starts): %.1f ms',
		(defined $latency ? $latency : 999) * 1000));
ok(defined $latency && $latency < 10, 'a commit reaches the receiver within 10 s with an hour\'s naptime');

# A change takes effect at once, even with an hour's naptime and no
# enabled pipeline (the worker is then not woken by publishing commits).
$node->safe_psql('postgres', "SELECT tide.relay_disable('hook')");
usleep(500_000);
@ids = publish(1);
usleep(1_000_000);
is(delivered('/hook')->{ $ids[0] }, undef, 'a disabled pipeline delivers nothing');
$t0 = time();
$node->safe_psql('postgres', "SELECT tide.relay_enable('hook')");
my $enable_latency = wait_for_ids(\@ids, 15);
note(sprintf('relay_enable to receipt with an hour\'s naptime: %.0f ms', ($enable_latency // 99) * 1000));
ok(defined $enable_latency && $enable_latency < 1, 'relay_enable takes effect within a second');
$node->safe_psql('postgres', "ALTER SYSTEM SET pg_tide.relay_naptime_ms = '100'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');

# The receiver down (connection refused), then back: everything arrives.
stop_receiver();
@ids = publish(10);
usleep(2_000_000);
is(offset() < $ids[0] ? 1 : 0, 1, 'nothing is recorded while the receiver is down');
start_receiver();
ok(defined wait_for_ids(\@ids, 15), 'the receiver back, everything arrives');
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $ids[-1] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'"),
	'the offset ends at the last id');

# Retention of the attempt log: a worker deletes rows older than
# pg_tide.attempt_log_retention (its first pass trims; then once a minute).
$node->safe_psql('postgres',
	"INSERT INTO tide.relay_attempts (pipeline_id, outbox_name, message_id, attempt, status, attempted_at)
	 VALUES ('hook', 'orders', -1, 1, 'success', now() - interval '2 hours')");
my $recent = $node->safe_psql('postgres', "SELECT count(*) FROM tide.relay_attempts WHERE message_id > 0");
$node->safe_psql('postgres', "ALTER SYSTEM SET pg_tide.attempt_log_retention = '1h'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
$node->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'pg_tide relay worker'");
ok($node->poll_query_until('postgres', "SELECT NOT EXISTS (SELECT FROM tide.relay_attempts WHERE message_id = -1)"),
	'an attempt older than the retention is deleted');
is($node->safe_psql('postgres', "SELECT count(*) FROM tide.relay_attempts WHERE message_id > 0"), $recent,
	'the recent attempts stay');

note(sprintf('test took %.1f s', time() - $t_start));
stop_receiver();
$node->stop;
done_testing();
