# The postgres sink: a forward pipeline writing an outbox into the inbox of
# another pg_tide database over libpq (relay/endpoints/postgres/), with two
# real clusters, the remote reached over TCP on 127.0.0.1 as a role that
# authenticates with a password (SCRAM), given as a secret reference.
#
#  1. Delivery: every message is in the remote inbox once, its event id the
#     message's identity outbox_<outbox>:<id>, its source the pipeline's
#     name, payload and headers as published; batch after batch on one
#     connection.
#  2. The remote down (stopped): the pipeline is held with class
#     connection, nothing is dead-lettered or queued for retry, the log
#     gets a line when it starts, not one per attempt; once the remote is
#     back everything arrives by itself.
#  3. Exactly once under faults: thousands of messages while the test
#     kills -9 the local postmaster, kills -9 the remote one and
#     terminates the relay worker (SIGTERM), at random moments: afterwards
#     every message is in the remote inbox, once, and nothing else is.
#  4. A message's own refusal: event_id_header names a header some
#     messages lack, and the remote refuses payloads over its
#     pg_tide.max_payload_bytes; those messages alone are dead-lettered
#     (classes refused and too_large), the others of their batch arrive.
#  5. A remote that does not ask for the password (trust) is refused with
#     class auth: the relay never connects as someone without the password.
#  6. The remote ends the relay's session while a batch is in flight: the
#     error says what the remote said, and the message arrives after all.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Remote;
use JSON::PP;
use Time::HiRes qw(time usleep);

my $t0 = time();
my $json = JSON::PP->new->canonical;

# The remote: TCP on 127.0.0.1, role relay with a password, inbox payments;
# role trusted logs in without one.
my $remote = remote_node('remote', "pg_tide.max_payload_bytes = 2000\nlog_connections = on\n",
	'host all trusted 127.0.0.1/32 trust');
my $rport = $remote->port;
$remote->safe_psql('postgres', q{
	SELECT tide.inbox_create('payments');
	SELECT tide.inbox_create('refusals');
	SELECT tide.inbox_create('trusting')});

# The local node reads the password from its environment.
my $node = local_node('local', "pg_tide.relay_naptime_ms = 100\nrestart_after_crash = on\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }
sub rsql { return $remote->safe_psql('postgres', $_[0]) }

my $retry = { base_ms => 20, cap_ms => 500, max_attempts => 100 };

sub set_pipeline
{
	my ($name, $inbox, %cfg) = @_;
	my $c = $json->encode({ sink_type => 'postgres', inbox => $inbox,
		connection => "host=127.0.0.1 port=$rport dbname=postgres user=relay",
		password => { env => 'PG_TIDE_REMOTE_PASSWORD' },
		connect_timeout_ms => 2000, statement_timeout_ms => 5000, retry => $retry, %cfg });
	sql("SELECT tide.outbox_create('$name')");
	sql("SELECT tide.relay_set_outbox('$name', '$name', '$name', '$c'::jsonb)");
}

sub publish
{
	my ($outbox, $n, $node_) = @_;
	return split /\n/, ($node_ // $node)->safe_psql('postgres',
		"SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', g), '{\"type\": \"t\"}') FROM generate_series(1, $n) g");
}

# Ids of outbox $outbox in inbox $inbox of the remote => times present.
sub received { return inbox_ids($remote, $_[0], $_[1]) }

sub rcount { return rsql("SELECT count(*) FROM tide.$_[0]_inbox WHERE source = '$_[1]'") }

sub health { return error_class($node, $_[0]) }

###########################################################################
# 1. Delivery
###########################################################################
{
	set_pipeline('p1', 'payments');
	my @ids = publish('p1', 300);
	ok(defined wait_until(sub { rcount('payments', 'p1') >= 300 }, 30, 50_000), 'test 1: 300 messages arrive');
	my $seen = received('payments', 'p1');
	is(scalar(grep { ($seen->{$_} // 0) != 1 } @ids), 0, 'test 1: each message once, its event id outbox_p1:<id>');
	is(rsql("SELECT count(DISTINCT payload ->> 'n') FROM tide.payments_inbox
			  WHERE source = 'p1' AND headers = '{\"type\": \"t\"}' AND (payload ->> 'n')::int BETWEEN 1 AND 300"), '300',
		'test 1: payloads and headers as published, source the pipeline');
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'p1'"), '0', 'test 1: nothing is dead-lettered');

	# one connection serves batch after batch, though the pipeline is
	# opened again at each reading (its password is a secret reference)
	my $log_at = -s $remote->logfile;
	for (1 .. 10)
	{
		push @ids, publish('p1', 10);
		usleep(100_000);
	}
	ok(defined wait_until(sub { rcount('payments', 'p1') >= 400 }, 30, 50_000), 'test 1: 100 more arrive in 10 batches or more');
	my $connections = () = slurp_file($remote->logfile, $log_at) =~ /connection authorized: user=relay/g;
	cmp_ok($connections, '<=', 1, "test 1: they take at most one new connection ($connections)");
}

###########################################################################
# 2. The remote down
###########################################################################
{
	$remote->stop('immediate');
	my $log_at = -s $node->logfile;
	my @ids = publish('p1', 200);
	ok(defined wait_until(sub { health('p1') eq 'connection' }, 20), 'test 2: the remote down is class connection');
	like(sql("SELECT last_error FROM tide.relay_pipeline_health WHERE pipeline_id = 'p1'"),
		qr/^connection: (could not connect to the remote database: .*refused|the connection to the remote database was lost: .*(server|terminat))/i,
		'test 2: the error says what libpq said');
	isnt(sql("SELECT coalesce(held_reason, '') FROM tide.relay_pipeline_health WHERE pipeline_id = 'p1'"), '',
		'test 2: the pipeline is held');
	my $attempts0 = sql("SELECT consecutive_failures FROM tide.relay_pipeline_health WHERE pipeline_id = 'p1'");
	usleep(4_000_000);
	my $attempts = sql("SELECT consecutive_failures FROM tide.relay_pipeline_health WHERE pipeline_id = 'p1'");
	cmp_ok($attempts, '>', $attempts0, "test 2: it kept trying ($attempts0 then $attempts failures)");
	my $log = slurp_file($node->logfile, $log_at);
	my $lines = () = $log =~ /relay pipeline "p1"/g;
	note("test 2: $lines log lines about the pipeline during $attempts failures");
	cmp_ok($lines, '<=', 2, 'test 2: the log is not flooded: the hold is logged when it starts');
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'p1'"), '0', 'test 2: nothing is dead-lettered');
	is(sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 'p1'"), '0', 'test 2: nothing is queued for retry');
	$remote->start;
	ok(defined wait_until(sub { rcount('payments', 'p1') >= 600 }, 30, 100_000), 'test 2: once the remote is back everything arrives');
	my $seen = received('payments', 'p1');
	is(scalar(grep { !$seen->{$_} } @ids), 0, 'test 2: none lost');
	ok(defined wait_until(sub { sql("SELECT held_reason IS NULL FROM tide.relay_pipeline_health WHERE pipeline_id = 'p1'") eq 't' }, 20),
		'test 2: the pipeline is no longer held');
}

###########################################################################
# 3. Exactly once under kills on both sides and worker restarts
###########################################################################
{
	set_pipeline('p3', 'payments', batch_size => 200);
	my @ids;
	my $faults = random_faults(25, 62, sub { push @ids, publish('p3', 250) }, $node, $remote);
	note(sprintf('test 3: %d messages, faults: %d local kill -9, %d remote kill -9, %d worker SIGTERM',
		scalar(@ids), @$faults{qw(local remote worker)}));
	cmp_ok(scalar(@ids), '>=', 1000, 'test 3: thousands of messages published among the faults');
	ok(defined wait_until(sub { rcount('payments', 'p3') >= @ids }, 60, 200_000), 'test 3: everything arrives after the faults');
	my $seen = received('payments', 'p3');
	is(scalar(grep { ($seen->{$_} // 0) != 1 } @ids), 0, 'test 3: every message is in the remote inbox once');
	is(rcount('payments', 'p3'), scalar(@ids), 'test 3: and nothing else');
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'p3'"), '0', 'test 3: nothing is dead-lettered');
}

###########################################################################
# 4. A message's own refusal
###########################################################################
{
	set_pipeline('p4', 'refusals', event_id_header => 'eid', retry => { base_ms => 20, cap_ms => 100, max_attempts => 2 });
	my @ok = split /\n/, sql("SELECT tide.outbox_publish('p4', jsonb_build_object('n', g), jsonb_build_object('eid', 'ev-' || g))
							   FROM generate_series(1, 20) g");
	my ($no_header) = split /\n/, sql("SELECT tide.outbox_publish('p4', '{\"n\": 0}', '{\"other\": 1}')");
	my ($too_large) = split /\n/, sql("SELECT tide.outbox_publish('p4', jsonb_build_object('big', repeat('x', 3000)), '{\"eid\": \"ev-big\"}')");
	my @more = split /\n/, sql("SELECT tide.outbox_publish('p4', jsonb_build_object('n', g), jsonb_build_object('eid', 'ev-' || g))
								FROM generate_series(21, 30) g");
	ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'p4'") == 2 }, 30),
		'test 4: two messages are dead-lettered');
	ok(defined wait_until(sub { rcount('refusals', 'p4') == 30 }, 20), 'test 4: the 30 others arrive');
	is(rsql("SELECT string_agg(event_id, ',' ORDER BY split_part(event_id, '-', 2)::int) FROM tide.refusals_inbox"),
		join(',', map { "ev-$_" } 1 .. 30), 'test 4: with the event ids their header gives');
	is(sql("SELECT string_agg(message_id || ':' || last_error_class, ',' ORDER BY message_id) FROM tide.relay_dlq WHERE pipeline_id = 'p4'"),
		"$no_header:refused,$too_large:too_large", 'test 4: the one without the header refused, the large one too_large');
}

###########################################################################
# 5. A remote that does not ask for the password
###########################################################################
{
	rsql("CREATE ROLE trusted LOGIN PASSWORD 'x' IN ROLE tide_consumer");
	set_pipeline('p5', 'trusting', connection => "host=127.0.0.1 port=$rport dbname=postgres user=trusted");
	publish('p5', 3);
	ok(defined wait_until(sub { health('p5') eq 'auth' }, 20), 'test 5: a server that did not ask for the password is class auth');
	like(sql("SELECT last_error FROM tide.relay_pipeline_health WHERE pipeline_id = 'p5'"), qr/did not ask for the configured password/,
		'test 5: the error says why');
	is(rsql("SELECT count(*) FROM tide.trusting_inbox"), '0', 'test 5: nothing is written as that role');
}

###########################################################################
# 6. The remote session ends while a batch is in flight
###########################################################################
{
	# the remote's inserts take a while, and its session is ended meanwhile
	rsql(q{CREATE FUNCTION public.slow() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$;
		CREATE TRIGGER slow BEFORE INSERT ON tide.payments_inbox FOR EACH STATEMENT EXECUTE FUNCTION public.slow()});
	my $failed_before = sql("SELECT coalesce(last_failure_at::text, '') FROM tide.relay_pipeline_health WHERE pipeline_id = 'p1'");
	my @ids = publish('p1', 1);
	ok(defined wait_until(sub { rsql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_tide relay'
									   AND query LIKE '%inbox_receive_batch%' AND state = 'active'") > 0 }, 20),
		'test 6: the batch is in flight on the remote');
	rsql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pg_tide relay'");
	ok(defined wait_until(sub { sql("SELECT coalesce(last_failure_at::text, '') FROM tide.relay_pipeline_health WHERE pipeline_id = 'p1'")
		  ne $failed_before }, 20), 'test 6: the batch fails');
	like(sql("SELECT last_error FROM tide.relay_pipeline_health WHERE pipeline_id = 'p1'"),
		qr/^connection: the connection to the remote database was lost: .*terminating connection due to administrator command/,
		'test 6: the error says what the remote said');
	rsql("DROP TRIGGER slow ON tide.payments_inbox");
	ok(defined wait_until(sub { received('payments', 'p1')->{ $ids[0] } }, 20), 'test 6: the message arrives after all');
}

note(sprintf('took %.1f s', time() - $t0));
done_testing();
