# A reverse pipeline and an event its inbox refuses (relay/flow_reverse.c):
# one event never stops the pipeline. A remote pg_tide database's outbox
# (a second cluster, reached over TCP on 127.0.0.1) is read into a local
# inbox whose table has a CHECK constraint one message violates.
#
#  1. The poison event: every other message is in the inbox once; the one
#     refused is in tide.relay_dlq once, with class record, the error and
#     its remote id; the stored position and the remote group's committed
#     offset reach the last message; the pipeline is not held, and goes on
#     with later messages.
#     Retrying its dead letter (tide.relay_dlq_retry): while the CHECK
#     still refuses it, an ERROR with the CHECK's SQLSTATE and nothing
#     written; by a tide_admin who may not insert into the inbox, 42501;
#     once the CHECK is dropped, the event is in the inbox once, under the
#     event id the pipeline gives it, and the dead letter is gone; retried
#     again, 42704 and still once.
#  2. A dropped inbox is the pipeline's condition, not a message's: the
#     pipeline is held, nothing is dead-lettered, the position stays; an
#     inbox of that name created again receives the messages.
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
use Time::HiRes qw(time);

my $t0 = time();
my $json = JSON::PP->new->canonical;

my $remote = remote_node('remote');
remote_outbox($remote, 'orders', 'to_local');
remote_outbox($remote, 'parcels', 'to_parcels');

my $node = local_node('local', "pg_tide.relay_naptime_ms = 1000\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }
sub rsql { return $remote->safe_psql('postgres', $_[0]) }

sub set_pipeline
{
	my ($name, $inbox, $outbox, $group) = @_;
	my $c = $json->encode(remote_source_config($remote, outbox => $outbox, consumer_group => $group, batch_size => 50));
	sql("SELECT tide.relay_set_inbox('$name', '$inbox', '$c'::jsonb)");
}

sub publish
{
	my ($outbox, $from, $to) = @_;
	return split /\n/, rsql("SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', g), '{\"type\": \"t\"}')
							FROM generate_series($from, $to) g ORDER BY g");
}

sub count { return sql("SELECT count(*) FROM tide.$_[0]_inbox") }

sub position
{
	return sql("SELECT coalesce(source_position ->> 'id', '') FROM tide.relay_consumer_offsets
				 WHERE relay_group_id = 'reverse' AND pipeline_id = '$_[0]'");
}

sub committed
{
	return rsql("SELECT coalesce(max(committed_offset), 0) FROM tide.tide_consumer_offsets WHERE group_name = '$_[0]'");
}

###########################################################################
# 1. The poison event
###########################################################################
{
	sql("SELECT tide.inbox_create('incoming')");
	sql(q{ALTER TABLE tide.incoming_inbox ADD CONSTRAINT not_seven CHECK ((payload ->> 'n')::int <> 7)});
	my @ids = publish('orders', 1, 120);
	set_pipeline('from_remote', 'incoming', 'orders', 'to_local');
	ok(defined wait_until(sub { count('incoming') >= 119 && position('from_remote') eq $ids[-1] }, 30, 50_000),
		'test 1: the other 119 messages arrive and the position moves past the last');
	is(sql(q{SELECT count(*) FILTER (WHERE c = 1) || ' ' || count(*) || ' ' || count(*) FILTER (WHERE n = 7)
			   FROM (SELECT (payload ->> 'n')::int AS n, count(*) AS c FROM tide.incoming_inbox GROUP BY 1) s}),
		'119 119 0', 'test 1: each other message once, the refused one not');
	is(sql("SELECT pipeline_id || ' ' || outbox_name || ' ' || message_id || ' ' || reason || ' '
				|| last_error_class || ' ' || (payload ->> 'n') || ' ' || (headers ->> 'type') || ' ' || attempts
			  FROM tide.relay_dlq"),
		"from_remote incoming $ids[6] permanent record 7 t 1",
		'test 1: the refused message is dead-lettered once, class record, with its remote id and values');
	like(sql("SELECT last_error FROM tide.relay_dlq"), qr/not_seven/, 'test 1: with the error that refused it');
	like(sql("SELECT last_error FROM tide.relay_dead_letters WHERE pipeline = 'from_remote'"), qr/not_seven/,
		'test 1: tide.relay_dead_letters shows it');
	ok(defined wait_until(sub { committed('to_local') eq $ids[-1] }, 20), 'test 1: the remote group committed up to the last');
	is(sql("SELECT coalesce(held_reason, '') || '|' || coalesce(turn_error, '') || '|' || dead_lettered
			  FROM tide.relay_pipeline_health WHERE pipeline_id = 'from_remote'"), '||1',
		'test 1: the pipeline is not held, and its health counts the dead letter');

	# its retry: the event id the pipeline gave the others, and the state
	# that must not change while the retry is refused
	my $dead = sql("SELECT id FROM tide.relay_dlq");
	my $event_id = sql("SELECT event_id FROM tide.relay_dlq");
	is($event_id,
		sql("SELECT regexp_replace(event_id, '[0-9]+\$', '$ids[6]') FROM tide.incoming_inbox WHERE payload ->> 'n' = '6'"),
		'test 1: the dead letter keeps the event id the pipeline gives its events');
	my $state = sub {
		return sql("SELECT (SELECT count(*) FROM tide.incoming_inbox) || ' ' || (SELECT count(*) FROM tide.relay_dlq)");
	};
	my $retry = sub {
		my ($role) = @_;
		my ($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\n"
			. ($role ? "SET ROLE $role;\n" : '') . "SELECT tide.relay_dlq_retry($dead)");
		return $rc == 0 ? 'ok' : $err;
	};
	like($retry->(), qr/ERROR:  23514: inbox "incoming" still refuses dead letter $dead: .*not_seven/,
		'test 1: retried while the CHECK refuses it: the CHECK\'s SQLSTATE and error');
	is($state->(), '119 1', 'test 1: and nothing is written, the dead letter kept');
	sql("CREATE ROLE dlq_ops; GRANT tide_admin TO dlq_ops; REVOKE INSERT ON tide.incoming_inbox FROM tide_admin;
		 ALTER TABLE tide.incoming_inbox DROP CONSTRAINT not_seven");
	like($retry->('dlq_ops'), qr/ERROR:  42501: permission denied to store dead letter $dead in inbox "incoming"/,
		'test 1: a tide_admin who may not insert into the inbox is refused');
	is($state->(), '119 1', 'test 1: and nothing is written, the dead letter kept');
	sql("GRANT INSERT ON tide.incoming_inbox TO tide_admin");
	is($retry->('dlq_ops'), 'ok', 'test 1: the CHECK dropped, the retry succeeds');
	is(sql("SELECT count(*) || ' ' || min(event_id) || ' ' || min(source) || ' ' || min(headers ->> 'type')
			  FROM tide.incoming_inbox WHERE payload ->> 'n' = '7'"),
		"1 $event_id from_remote t", 'test 1: the event is in the inbox once, under its event id, from the pipeline, with its headers');
	is($state->(), '120 0', 'test 1: and the dead letter is gone');
	like($retry->(), qr/ERROR:  42704: dead letter $dead does not exist/, 'test 1: retried again, it is gone');
	is(sql("SELECT count(*) FROM tide.incoming_inbox WHERE payload ->> 'n' = '7'"), '1', 'test 1: and the event is still there once');
	my @more = publish('orders', 121, 130);
	ok(defined wait_until(sub { count('incoming') >= 130 }, 20, 50_000), 'test 1: and it goes on with later messages');
}

###########################################################################
# 2. A dropped inbox holds the pipeline
###########################################################################
{
	sql("SELECT tide.inbox_create('parcels_in')");
	my @ids = publish('parcels', 1, 10);
	set_pipeline('parcels_remote', 'parcels_in', 'parcels', 'to_parcels');
	ok(defined wait_until(sub { count('parcels_in') >= 10 }, 30, 50_000), 'test 2: the first messages arrive');
	sql("SELECT tide.inbox_drop('parcels_in')");
	my @later = publish('parcels', 11, 20);
	# Which notices first decides where the error shows: a step storing into
	# the dropped inbox holds the pipeline (held_reason, turn_error); a
	# reading of the pipelines passes it over (last_error). Either way its
	# health names the inbox, and below nothing moves.
	my $health_error = "SELECT concat_ws(' | ', nullif(held_reason, ''), nullif(turn_error, ''), nullif(last_error, ''))
						  FROM tide.relay_pipeline_health WHERE pipeline_id = 'parcels_remote'";
	ok(defined wait_until(sub { sql($health_error) =~ /parcels_in/ }, 20),
		'test 2: the pipeline is held or passed over');
	like(sql($health_error), qr/inbox "parcels_in" does not exist/, 'test 2: its error names the inbox');
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'parcels_remote'"), '0', 'test 2: nothing is dead-lettered');
	is(position('parcels_remote'), $ids[-1], 'test 2: the position stays');
	sql("SELECT tide.inbox_create('parcels_in')");
	ok(defined wait_until(sub { count('parcels_in') >= 10 }, 30, 50_000), 'test 2: an inbox created again receives the messages');
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'parcels_remote'"), '0', 'test 2: and still nothing is dead-lettered');
}

note(sprintf('took %.1f s', time() - $t0));
done_testing();
