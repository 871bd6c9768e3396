# A worker waiting on a batch that a receiver does not answer (timeout_ms
# 20 s) still hears what is asked of it:
#
#  1. A reload that leaves the relay on (a new relay_naptime_ms) is taken
#     while it waits and does not abandon the batch: the same worker gets
#     the answer (3 s late) and records it, once.
#  2. pg_tide.relay_enabled = off and a reload: the worker is gone within
#     2 s (tide.relay_workers() and pg_stat_activity), not when the 20 s
#     are over, and nothing is recorded for the abandoned batch (no offset,
#     attempt, retry or dead letter). On again, with the receiver healthy,
#     the message is delivered (its lease hands it to the new worker).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;
use JSON::PP;
use Time::HiRes qw(time usleep);

my $node = tide_node('off_while_waiting', "pg_tide.relay_naptime_ms = 200\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;

sub sql { return $node->safe_psql('postgres', $_[0]) }

# Sets a server setting and reloads.
sub set_conf
{
	my ($name, $value) = @_;
	sql("ALTER SYSTEM SET $name = '$value'");
	sql('SELECT pg_reload_conf()');
}

# The pid of database postgres's relay worker: tide.relay_workers() and
# pg_stat_activity joined by '/', '' for each that shows none.
sub worker
{
	return sql("SELECT coalesce((SELECT pid::text FROM tide.relay_workers() WHERE database = 'postgres'), '')
				   || '/' || coalesce((SELECT string_agg(pid::text, ',') FROM pg_stat_activity
										WHERE backend_type = 'pg_tide relay worker'
										  AND datname = 'postgres'), '')");
}

# The requests at a path that carried message $id, answered with $status.
sub requests_for
{
	my ($path, $id, $status) = @_;
	return grep {
		$_->{path} eq $path
		  && ($_->{headers}{'webhook-id'} // '') eq "outbox_orders:$id"
		  && (!defined $status || $_->{status} == $status)
	} $rcv->requests;
}

# What the relay recorded for message $id of pipeline p: whether the offset
# passed it (1 or 0), its attempts, retries and dead letters.
sub recorded
{
	my ($id) = @_;
	return sql("SELECT (SELECT (coalesce(max(last_change_id), 0) >= $id)::int FROM tide.relay_consumer_offsets
						 WHERE pipeline_id = 'p')
				   || ' ' || (SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'p' AND message_id = $id)
				   || ' ' || (SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = 'p' AND message_id = $id)
				   || ' ' || (SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'p' AND message_id = $id)");
}

sql("SELECT tide.outbox_create('orders')");
sql("SELECT tide.relay_set_outbox('p', 'orders', 'p_group', jsonb_build_object(
	  'sink_type', 'webhook', 'url', '" . $rcv->url('/slow') . "', 'allow_http', true,
	  'allow_private_network', true, 'batch_size', 1, 'max_in_flight', 1, 'timeout_ms', 20000))");
ok(defined wait_until(sub { worker() =~ /^\d+\/\d+$/ }, 10), 'database postgres has a relay worker');

###########################################################################
# 1. A reload while the worker waits, the relay left on: taken, and the
# batch is not abandoned.
###########################################################################
{
	$rcv->control({ delay_ms => 3000 });
	my $pid = worker();
	my ($id) = split /\n/, sql("SELECT tide.outbox_publish('orders', '{\"n\": 1}')");
	ok(defined wait_until(sub { requests_for('/slow', $id) }, 10),
		'test 1: the request reached the receiver, which answers after 3 s');
	set_conf('pg_tide.relay_naptime_ms', '300');
	ok(defined wait_until(sub { recorded($id) eq '1 1 0 0' }, 10),
		'test 1: the answer is recorded: offset moved, one attempt, nothing queued or dead');
	is(worker(), $pid, 'test 1: by the same worker, which did not leave on the reload');
	is(scalar(requests_for('/slow', $id)), 1, 'test 1: the message was sent once');
	$rcv->control({ delay_ms => 0 });
}

###########################################################################
# 2. relay_enabled = off while the worker waits on a receiver that holds
# the request for a minute (timeout_ms 20 s).
###########################################################################
{
	$rcv->control({ delay_ms => 60000 });
	my ($pid) = split m{/}, worker();
	my ($id) = split /\n/, sql("SELECT tide.outbox_publish('orders', '{\"n\": 2}')");
	ok(defined wait_until(sub { requests_for('/slow', $id) }, 10),
		'test 2: the request reached the receiver, which holds it');
	ok(defined wait_until(sub {
				sql("SELECT query FROM pg_stat_activity WHERE pid = $pid") eq 'pg_tide relay: delivering a batch'
			}, 5),
		'test 2: the worker waits on the batch');
	my $t_off = time();
	set_conf('pg_tide.relay_enabled', 'off');
	my $gone = wait_until(sub { worker() eq '/' }, 25, 10_000);
	ok(defined $gone && $gone < 2,
		'test 2: relay_enabled = off and a reload: the worker is gone within 2 s');
	note(sprintf('test 2: the worker was gone %.2f s after the reload', $gone)) if defined $gone;
	ok(!kill(0, $pid), 'test 2: its process has exited');
	is(recorded($id), '0 0 0 0', 'test 2: nothing recorded for the abandoned batch');

	# Requests received from now on are answered at once.
	$rcv->control({ delay_ms => 0 });
	my $t_on = time();
	set_conf('pg_tide.relay_enabled', 'on');
	my $took = wait_until(sub { grep { $_->{t} > $t_on } requests_for('/slow', $id, 200) }, 15, 50_000);
	ok(defined $took, 'test 2: relay_enabled = on: the message is delivered again');
	note(sprintf('test 2: delivered %.2f s after relay_enabled = on', $took)) if defined $took;
	ok(defined wait_until(sub { recorded($id) eq '1 1 0 0' }, 10),
		'test 2: and recorded: offset moved, one attempt (the abandoned one left none)');
}

my $log = slurp_file($node->logfile);
unlike($log, qr/PANIC|terminated by signal|exited abnormally/,
	'no PANIC, "terminated by signal" or "exited abnormally" in the server log');

$rcv->stop;
$node->stop;
done_testing();
