# The postgres source: a reverse pipeline reading a consumer group of
# another pg_tide database's outbox over libpq into a local inbox
# (relay/flow_reverse.c, relay/endpoints/postgres/source.c), with two real
# clusters, the remote reached over TCP on 127.0.0.1 as a role that
# authenticates with a password (SCRAM) and was granted the outbox.
#
#  1. Delivery: every message is in the local inbox once, its event id
#     outbox_<outbox>:<id>, its source the pipeline's name; the stored
#     position is the last id, and the remote group's committed offset
#     reaches it (acknowledged after the local commit).
#  2. Woken promptly: with the worker's naptime at 10 s, a message published
#     on the remote is in the local inbox within a second or two
#     (tide.wait_for_messages on the remote), each time.
#  3. The remote down: the pipeline is held with class connection, the log
#     says so once, not per attempt; once the remote is back it goes on by
#     itself.
#  4. Exactly once under faults: thousands of messages published on the
#     remote while the test kills -9 the local postmaster, kills -9 the
#     remote one and terminates the relay worker (SIGTERM), at random
#     moments: afterwards every message is in the local inbox, once, and
#     nothing else.
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

my $remote = remote_node('remote');
remote_outbox($remote, 'orders', 'to_local');

my $node = local_node('local', "pg_tide.relay_naptime_ms = 10000\nrestart_after_crash = on\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }
sub rsql { return $remote->safe_psql('postgres', $_[0]) }

sub set_pipeline
{
	my ($name, $inbox, $group, %cfg) = @_;
	my $c = $json->encode(remote_source_config($remote, outbox => 'orders', consumer_group => $group, %cfg));
	sql("SELECT tide.inbox_create('$inbox')");
	sql("SELECT tide.relay_set_inbox('$name', '$inbox', '$c'::jsonb)");
}

sub publish
{
	return split /\n/, rsql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', g), '{\"type\": \"t\"}')
							FROM generate_series(1, $_[0]) g");
}

# Ids in the local inbox $inbox => times present.
sub received { return inbox_ids($node, $_[0], 'orders') }

sub count { return sql("SELECT count(*) FROM tide.$_[0]_inbox") }

sub health { return error_class($node, $_[0]) }

###########################################################################
# 1. Delivery
###########################################################################
my @ids;
{
	set_pipeline('from_remote', 'incoming', 'to_local', batch_size => 100);
	@ids = publish(500);
	ok(defined wait_until(sub { count('incoming') >= 500 }, 30, 50_000), 'test 1: 500 messages arrive');
	my $seen = received('incoming');
	is(scalar(grep { ($seen->{$_} // 0) != 1 } @ids), 0, 'test 1: each once, its event id outbox_orders:<id>');
	is(sql("SELECT count(*) FROM tide.incoming_inbox WHERE source = 'from_remote' AND headers = '{\"type\": \"t\"}'
			  AND (payload ->> 'n')::int BETWEEN 1 AND 500"), '500', 'test 1: payloads, headers, the source the pipeline');
	ok(defined wait_until(sub {
		sql("SELECT source_position ->> 'id' FROM tide.relay_consumer_offsets
			  WHERE relay_group_id = 'reverse' AND pipeline_id = 'from_remote' AND outbox_name = 'incoming'") eq $ids[-1] }, 10),
		'test 1: the stored position is the last id');
	ok(defined wait_until(sub {
		rsql("SELECT max(committed_offset) FROM tide.tide_consumer_offsets WHERE group_name = 'to_local'") eq $ids[-1] }, 20),
		'test 1: the remote group committed up to it');
}

###########################################################################
# 2. Woken promptly
###########################################################################
{
	my @lat;
	for my $i (1 .. 5)
	{
		usleep(300_000);
		my $before = count('incoming');
		my $t = time();
		push @ids, publish(1);
		wait_until(sub { count('incoming') > $before }, 15, 10_000);
		push @lat, time() - $t;
	}
	my ($max) = sort { $b <=> $a } @lat;
	note(sprintf('test 2: publish to arrival %s s', join(', ', map { sprintf('%.3f', $_) } @lat)));
	cmp_ok($max, '<', 2.5, 'test 2: each message arrives within 2.5 s, with a naptime of 10 s and a wait of 5 s');
}

###########################################################################
# 3. The remote down
###########################################################################
{
	my $log_at = -s $node->logfile;
	$remote->stop('immediate');
	ok(defined wait_until(sub { health('from_remote') eq 'connection' }, 30), 'test 3: the remote down is class connection');
	isnt(sql("SELECT coalesce(held_reason, '') FROM tide.relay_pipeline_health WHERE pipeline_id = 'from_remote'"), '',
		'test 3: the pipeline is held');
	usleep(4_000_000);
	my $lines = () = slurp_file($node->logfile, $log_at) =~ /relay pipeline "from_remote"/g;
	ok($lines >= 1 && $lines <= 2, "test 3: the hold is logged when it starts, not at each attempt ($lines lines)");
	$remote->start;
	push @ids, publish(100);
	ok(defined wait_until(sub { count('incoming') >= @ids }, 40, 100_000), 'test 3: once the remote is back everything arrives');
	ok(defined wait_until(sub { sql("SELECT held_reason IS NULL FROM tide.relay_pipeline_health WHERE pipeline_id = 'from_remote'") eq 't' }, 20),
		'test 3: the pipeline is no longer held');
	my $seen = received('incoming');
	is(scalar(grep { ($seen->{$_} // 0) != 1 } @ids), 0, 'test 3: every message once');
}

###########################################################################
# 4. Exactly once under kills on both sides and worker restarts
###########################################################################
{
	# a group of its own that starts after what is there
	rsql("SELECT tide.create_consumer_group('to_local_4', 'orders', 'latest')");
	set_pipeline('from_remote_4', 'incoming4', 'to_local_4', batch_size => 200);
	my @ids4;
	my $faults = random_faults(25, 69, sub { push @ids4, publish(250) }, $node, $remote);
	note(sprintf('test 4: %d messages, faults: %d local kill -9, %d remote kill -9, %d worker SIGTERM',
		scalar(@ids4), @$faults{qw(local remote worker)}));
	cmp_ok(scalar(@ids4), '>=', 1000, 'test 4: thousands of messages published among the faults');
	ok(defined wait_until(sub { count('incoming4') >= @ids4 }, 60, 200_000), 'test 4: everything arrives after the faults');
	my $seen = received('incoming4');
	is(scalar(grep { ($seen->{$_} // 0) != 1 } @ids4), 0, 'test 4: every message is in the local inbox once');
	is(count('incoming4'), scalar(@ids4), 'test 4: and nothing else');
	ok(defined wait_until(sub {
		rsql("SELECT max(committed_offset) FROM tide.tide_consumer_offsets WHERE group_name = 'to_local_4'") eq $ids4[-1] }, 30),
		'test 4: the remote group committed up to the last');
}

note(sprintf('took %.1f s', time() - $t0));
done_testing();
