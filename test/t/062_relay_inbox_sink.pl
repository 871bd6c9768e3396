# The inbox sink (relay/endpoints/inbox, docs/sinks/inbox.md): an outbox's
# messages go into an inbox of the same database in the transaction that
# moves the pipeline's offset.
#
# 1. Exactly once under crashes: 5,000 messages are published in rounds
#    while the test kills, at a random moment of each round, the relay
#    worker with -9 (the postmaster then restarts every process: the
#    worker dies in the middle of whatever it was doing), the postmaster
#    with -9 or the relay worker with SIGTERM. Afterwards the inbox holds
#    every published message once, under event id outbox_orders:<id>, and
#    nothing else. The inbox's event ids would hide a second write
#    (ON CONFLICT DO NOTHING), so a BEFORE INSERT trigger logs every row the
#    relay tried to write, in the writing transaction: a write that
#    committed apart from the offset, then was written again after a crash,
#    shows in that log twice. A trigger makes the durable offset move
#    20 ms after the rows are written, so that most kills fall between.
# 2. A message the inbox's table refuses (a CHECK) is dead-lettered with
#    error class record, the others go in; once the CHECK is gone,
#    relay_dlq_retry writes it through the same path. A header names the
#    event id: a repeated id changes nothing, a message without it is
#    dead-lettered.
# 3. The relay writes as the pipeline's owner, never as the superuser it
#    is: a trigger of the inbox sees the owner; when the owner loses the
#    right to write the inbox, or the inbox is dropped, the pipeline is held
#    (nothing written, nothing dead-lettered) and goes on once it is back.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until exited);
use Time::HiRes qw(usleep time);

my $node = tide_node('inbox_sink',
	"pg_tide.relay_naptime_ms = 200\nrestart_after_crash = on\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

# The pid of the database's relay worker, or ''.
sub worker_pid
{
	return sql("SELECT coalesce(max(pid), 0) FROM tide.relay_workers() WHERE database = 'postgres'");
}

# Waits until the server answers again after a crash, with a relay worker
# other than $old; true when it does within 60 s.
sub back_after_crash
{
	my ($old) = @_;
	return defined wait_until(
		sub {
			my ($rc, $out) = $node->psql('postgres',
				"SELECT count(*) FROM tide.relay_workers() WHERE database = 'postgres' AND pid <> $old");
			return $rc == 0 && $out eq '1';
		},
		60, 100_000);
}

# Kills the postmaster with -9, waits for every process of it to exit, and
# starts the node again.
sub crash_and_restart
{
	my %procs = map { $_ => 1 } split /\n/,
	  sql("SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()");
	my ($postmaster) = split /\n/, slurp_file($node->data_dir . '/postmaster.pid');
	$node->kill9;
	wait_until(sub { !grep { !exited($_) } keys %procs }, 30);
	wait_until(sub { !kill(0, $postmaster) }, 30);
	$node->start;
}

sql(q{
	SELECT tide.outbox_create('orders');
	SELECT tide.inbox_create('ledger');
	CREATE TABLE public.writes (event_id text, xid xid8 DEFAULT pg_current_xact_id());
	CREATE FUNCTION public.log_write() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO public.writes (event_id) VALUES (NEW.event_id);
		RETURN NEW;
	END $$;
	CREATE TRIGGER log_write BEFORE INSERT ON tide.ledger_inbox
		FOR EACH ROW EXECUTE FUNCTION public.log_write();
	-- The durable offset moves 20 ms after the inbox rows were written:
	-- a kill at a random moment mostly falls between the two, where rows
	-- committed apart from the offset would be written again.
	CREATE FUNCTION public.slow_offset() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM pg_sleep(0.02);
		RETURN NEW;
	END $$;
	CREATE TRIGGER slow_offset BEFORE INSERT OR UPDATE ON tide.relay_consumer_offsets
		FOR EACH ROW EXECUTE FUNCTION public.slow_offset();
	SELECT tide.relay_set_outbox('to_ledger', 'orders', 'to_ledger',
		'{"sink_type": "inbox", "inbox": "ledger", "batch_size": 50}');
});

###########################################################################
# 1. 5,000 messages, ten rounds of 500, each ended by a kill at a random
# moment: -9 to the worker, -9 to the postmaster, SIGTERM to the worker, in
# turn.
###########################################################################
my $rounds = 10;
my $per_round = 500;
my $backlog_kills = 0;
my $t0 = time();
srand(62);
for my $round (1 .. $rounds)
{
	my $start = $round * 100_000;
	wait_until(sub { worker_pid() != 0 }, 30);
	my $pid = worker_pid();
	sql("SELECT tide.outbox_publish_batch('orders',
		ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series($start + 1, $start + $per_round) g))");
	usleep(int(rand(400_000)));
	my $in = sql('SELECT count(*) FROM tide.ledger_inbox');
	$backlog_kills++ if $in < $round * $per_round;
	my $how = ('worker -9', 'postmaster -9', 'worker SIGTERM')[ ($round - 1) % 3 ];
	if ($how eq 'worker -9')
	{
		kill 'KILL', $pid if $pid;
		ok(back_after_crash($pid), "round $round: the server is back after the worker's crash");
	}
	elsif ($how eq 'postmaster -9')
	{
		crash_and_restart();
	}
	else
	{
		kill 'TERM', $pid if $pid;
	}
	note("round $round: $how with $in of " . ($round * $per_round) . " in the inbox");
}
my $total = $rounds * $per_round;
ok(defined wait_until(sub { sql('SELECT count(*) FROM tide.ledger_inbox') >= $total }, 90, 100_000),
	"all $total messages reach the inbox after the kills");
note(sprintf('%.1f s for the rounds and the rest; %d of %d kills came with messages not yet in the inbox',
		time() - $t0, $backlog_kills, $rounds));
cmp_ok($backlog_kills, '>=', 3, 'at least three kills came while the relay was writing a backlog');

is( sql(q{SELECT count(*) FROM tide.tide_outbox_messages m
		  FULL JOIN tide.ledger_inbox i ON i.event_id = 'outbox_orders:' || m.id
		 WHERE m.id IS NULL OR i.id IS NULL}),
	'0', 'the inbox holds exactly the published messages, by event id outbox_orders:<id>: none skipped, none foreign');
is( sql(q{SELECT count(*) || ' ' || count(DISTINCT event_id) FROM public.writes}),
	"$total $total", 'every message was written once in a committed transaction: never again after a crash');
is( sql(q{SELECT count(*) FROM tide.ledger_inbox i JOIN tide.tide_outbox_messages m
		    ON i.event_id = 'outbox_orders:' || m.id
		 WHERE i.payload = m.payload AND i.source = 'to_ledger' AND i.processed_at IS NULL}),
	$total, 'each with its payload, the pipeline as its source, pending');
is( sql(q{SELECT (SELECT max(last_change_id) FROM tide.relay_consumer_offsets WHERE pipeline_id = 'to_ledger')
		     = (SELECT max(id) FROM tide.tide_outbox_messages)}),
	't', 'the offset is at the last message');
is(sql(q{SELECT count(*) FROM tide.relay_dlq}), '0', 'nothing dead-lettered');
sql('SELECT tide.relay_delete(\'to_ledger\')');

###########################################################################
# 2. A message the inbox's table refuses; an event id from a header.
###########################################################################
sql(q{
	SELECT tide.outbox_create('checked');
	SELECT tide.inbox_create('strict_in');
	ALTER TABLE tide.strict_in_inbox ADD CONSTRAINT no_poison CHECK (payload->>'n' <> 'poison');
	SELECT tide.relay_set_outbox('to_strict', 'checked', 'to_strict', '{"sink_type": "inbox", "inbox": "strict_in"}');
	SELECT tide.outbox_publish_batch('checked',
		ARRAY(SELECT jsonb_build_object('n', CASE WHEN g = 5 THEN 'poison' ELSE g::text END)
				FROM generate_series(1, 10) g));
});
ok( defined wait_until(sub { sql(q{SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'to_strict'}) == 1 }, 30),
	'the refused message is dead-lettered');
is( sql(q{SELECT last_error_class || ' ' || (payload->>'n') FROM tide.relay_dlq WHERE pipeline_id = 'to_strict'}),
	'record poison', 'with error class record');
like(sql(q{SELECT last_error FROM tide.relay_dlq WHERE pipeline_id = 'to_strict'}),
	qr/no_poison/, 'its error names the CHECK');
ok(defined wait_until(sub { sql('SELECT count(*) FROM tide.strict_in_inbox') == 9 }, 30),
	'the nine others are in the inbox');
is( sql(q{SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM tide.strict_in_inbox}),
	'1,2,3,4,6,7,8,9,10', 'in their order');
sql(q{ALTER TABLE tide.strict_in_inbox DROP CONSTRAINT no_poison;
	  SELECT tide.relay_dlq_retry(id) FROM tide.relay_dlq WHERE pipeline_id = 'to_strict'});
ok( defined wait_until(sub { sql(q{SELECT count(*) FROM tide.strict_in_inbox WHERE payload->>'n' = 'poison'}) == 1 }, 30),
	'retried once the CHECK is gone, it goes in through the same path');
is(sql(q{SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'to_strict'}), '0', 'and leaves the dead letters');

sql(q{
	SELECT tide.outbox_create('headed');
	SELECT tide.relay_set_outbox('to_strict_h', 'headed', 'to_strict_h',
		'{"sink_type": "inbox", "inbox": "strict_in", "event_id_header": "event-id"}');
	SELECT tide.outbox_publish('headed', '{"n": "first"}', '{"event-id": "ev-1"}');
	SELECT tide.outbox_publish('headed', '{"n": "again"}', '{"event-id": "ev-1"}');
	SELECT tide.outbox_publish('headed', '{"n": "headless"}');
	SELECT tide.outbox_publish('headed', '{"n": "second"}', '{"event-id": "ev-2"}');
});
ok(defined wait_until(sub { sql(q{SELECT count(*) FROM tide.strict_in_inbox WHERE event_id = 'ev-2'}) == 1 }, 30),
	'messages with the header go in under its value');
is(sql(q{SELECT string_agg(payload->>'n', ',') FROM tide.strict_in_inbox WHERE event_id = 'ev-1'}),
	'first', 'a repeated event id changes nothing');
is( sql(q{SELECT last_error_class || ' ' || (payload->>'n') FROM tide.relay_dlq WHERE pipeline_id = 'to_strict_h'}),
	'record headless', 'a message without the header is dead-lettered');
like(sql(q{SELECT last_error FROM tide.relay_dlq WHERE pipeline_id = 'to_strict_h'}),
	qr/has no event id in header "event-id"/, 'saying why');

###########################################################################
# 3. The owner's rights.
###########################################################################
sql(q{
	CREATE ROLE inbox_admin IN ROLE tide_admin;
	SELECT tide.outbox_create('owned');
	SELECT tide.inbox_create('owned_in');
	CREATE TABLE public.writers (who text);
	GRANT INSERT ON public.writers TO inbox_admin;
	CREATE FUNCTION public.note_writer() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO public.writers VALUES (current_user);
		RETURN NEW;
	END $$;
	CREATE TRIGGER note_writer BEFORE INSERT ON tide.owned_in_inbox
		FOR EACH ROW EXECUTE FUNCTION public.note_writer();
	SET ROLE inbox_admin;
	SELECT tide.relay_set_outbox('to_owned', 'owned', 'to_owned', '{"sink_type": "inbox", "inbox": "owned_in"}');
	RESET ROLE;
	SELECT tide.outbox_publish('owned', '{"n": 1}');
});
ok(defined wait_until(sub { sql('SELECT count(*) FROM tide.owned_in_inbox') == 1 }, 30), 'the owner\'s pipeline writes');
is(sql('SELECT string_agg(who, \',\') FROM public.writers'), 'inbox_admin',
	'as the owner: the inbox\'s trigger runs as inbox_admin, not as the superuser');

my $log_at = -s $node->logfile;
sql(q{REVOKE INSERT ON tide.owned_in_inbox FROM tide_admin;
	  SELECT tide.outbox_publish('owned', '{"n": 2}')});
ok( defined wait_until(
		sub {
			slurp_file($node->logfile, $log_at) =~
			  /pipeline "to_owned" .*the owner of pipeline "to_owned" may not write inbox "owned_in"/;
		},
		30),
	'a revoked right holds the pipeline, saying why');
is( sql(q{SELECT (SELECT count(*) FROM tide.owned_in_inbox) || ' ' ||
		  (SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'to_owned')}),
	'1 0', 'nothing written, nothing dead-lettered');
sql('GRANT INSERT ON tide.owned_in_inbox TO tide_admin');
ok(defined wait_until(sub { sql('SELECT count(*) FROM tide.owned_in_inbox') == 2 }, 60),
	'the message goes in once the right is back');

$log_at = -s $node->logfile;
sql(q{SELECT tide.inbox_drop('owned_in');
	  SELECT tide.outbox_publish('owned', '{"n": 3}')});
ok( defined wait_until(
		sub { slurp_file($node->logfile, $log_at) =~ /pipeline "to_owned" .*inbox "owned_in" does not exist/ },
		30),
	'a dropped inbox holds the pipeline, saying why');
is(sql(q{SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'to_owned'}), '0', 'nothing dead-lettered');
sql(q{SELECT tide.inbox_create('owned_in')});
ok( defined wait_until(sub { sql(q{SELECT count(*) FROM tide.owned_in_inbox WHERE payload->>'n' = '3'}) == 1 }, 60),
	'the message goes in once the inbox is back');

$node->stop;
done_testing();
