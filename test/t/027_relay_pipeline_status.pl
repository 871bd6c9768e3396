# relay_pipeline_status tells what the worker does with a pipeline, with a
# running worker and the real receiver:
#  - held: a webhook pipeline whose destination refuses connections (the
#    receiver's port has no listener yet) is 'held', with held_until in the
#    future, the reason, and next_attempt_at at the hold's end; healthy once
#    the receiver is up and the messages are delivered;
#  - error: a turn that ends in an ERROR (its record fails as on a full
#    disk, as in 017) makes it 'error' with the message and since when;
#    healthy again once a turn ends without one; an error that cannot be
#    recorded either is logged and the worker goes on;
#  - stopped: pg_tide.relay_enabled turned off with pg_reload_conf() makes
#    every enabled pipeline 'stopped' with the reason; a new worker clears
#    the holds an earlier one recorded.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until disk_full);
use PgTide::Receiver;
use JSON::PP;
use Time::HiRes qw(time);

my $t_start = time();
my $node = tide_node('status', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
# Not started: nothing listens on its port yet.
my $rcv = PgTide::Receiver->new(dir => $dir);

sub sql { return $node->safe_psql('postgres', $_[0]); }

# The pipeline's row of relay_pipeline_status, columns joined with '|'.
sub status
{
	my ($cols) = @_;
	return sql("SELECT concat_ws('|', $cols) FROM tide.relay_pipeline_status WHERE pipeline = 'hook'");
}

# Waits until status($cols) matches $re; true when it did within $timeout s.
sub wait_status
{
	my ($cols, $re, $timeout) = @_;
	return defined wait_until(sub { status($cols) =~ $re }, $timeout, 50_000);
}

# Publishes n messages to orders; their ids.
sub publish
{
	my ($n) = @_;
	return split /\n/, sql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, $n) g");
}

# Ids of the messages the receiver answered 200.
sub delivered
{
	my %seen;
	$seen{ $json->decode($_->{body})->{message_id} } = 1
	  for grep { $_->{status} == 200 } $rcv->requests;
	return \%seen;
}

sql("SELECT tide.outbox_create('orders')");
my $cfg = $json->encode({
	sink_type => 'webhook',
	url => $rcv->url('/hook'),
	allow_http => JSON::PP::true,
	allow_private_network => JSON::PP::true,
	batch_size => 10,
	retry => { base_ms => 3000, cap_ms => 6000 } });
sql("SELECT tide.relay_set_outbox('hook', 'orders', 'hook', '$cfg'::jsonb)");
ok(wait_status('health', qr/^healthy$/, 10), 'a served pipeline with nothing to do is healthy')
  or diag(status('health, reason'));

# held: connection refused holds the pipeline at its first message.
my @ids = publish(3);
ok(wait_status('health, held_until > now(), next_attempt_at = held_until, reason',
		qr/^held\|t\|t\|the destination failed at message $ids[0]: conn_refused: /, 10),
	'refused connections: held, held_until in the future, next_attempt_at the hold\'s end, the reason')
  or diag(status('health, held_until, next_attempt_at, reason, now()'));
my $held_since = sql("SELECT held_since FROM tide.relay_pipeline_status WHERE pipeline = 'hook'");
ok(wait_status('health, held_since', qr/^held\|\Q$held_since\E$/, 1) &&
	wait_until(sub { sql("SELECT held_until > '$held_since'::timestamptz + interval '4 s' FROM tide.relay_pipeline_health") eq 't' }, 12),
	'held again after the next attempt, since the first hold, and longer')
  or diag(status('health, held_since, held_until'));
is(sql("SELECT count(*) FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook' AND last_change_id >= $ids[0]"),
	'0', 'nothing is acknowledged while held');

$rcv->start;
ok(wait_status('health, held_until IS NULL, reason IS NULL, offset_id', qr/^healthy\|t\|t\|$ids[-1]$/, 15),
	'the receiver up: healthy, no hold, every message delivered')
  or diag(status('health, held_until, reason, offset_id'));
my $got = delivered();
is(scalar(grep { $got->{$_} } @ids), 3, 'the receiver answered 200 for the 3 messages');
is(sql("SELECT held_until IS NULL AND held_reason IS NULL FROM tide.relay_pipeline_health WHERE pipeline_id = 'hook'"),
	't', 'the recorded batch ended the hold in relay_pipeline_health');

# error: the record transaction fails, as on a full disk (017).
disk_full($node, 'tide.relay_attempts');
my $before_error = sql('SELECT now()');
my @more = publish(2);
ok(wait_status("health, reason, turn_error_since >= '$before_error', next_attempt_at > now() - interval '100 ms'",
		qr/^error\|could not extend file: No space left on device\|t\|t$/, 10),
	'a turn that ends in an ERROR: error, the message, since when, the next attempt')
  or diag(status('health, reason, turn_error_since, next_attempt_at, now()'));
my $error_since = sql("SELECT turn_error_since FROM tide.relay_pipeline_status WHERE pipeline = 'hook'");
ok(wait_until(sub { sql("SELECT turn_errors >= 2 FROM tide.relay_pipeline_health") eq 't' }, 10),
	'the error again after the hold');
is(status('health, turn_error_since'), "error|$error_since", 'still error, since the first one');
# The error cannot be recorded either: logged, and the worker goes on.
my $pid = sql('SELECT pid FROM tide.relay_workers()');
my $log_offset = -s $node->logfile;
disk_full($node, 'tide.relay_pipeline_health', 'INSERT OR UPDATE');
ok(defined wait_until(sub { slurp_file($node->logfile, $log_offset) =~
		  /pg_tide relay could not record the error of pipeline "hook": could not extend file: No space left on device/ }, 10),
	'an error that cannot be recorded is logged');
# Held, tried again (the batch is sent again), the same error: not logged
# again within the minute (relay/log_repeat.c).
my $sent = sub { scalar grep { $json->decode($_->{body})->{message_id} == $more[0] } $rcv->requests };
my $sent_before = $sent->();
ok(defined wait_until(sub { $sent->() > $sent_before }, 15)
	  && sql('SELECT pid FROM tide.relay_workers()') eq $pid,
	'and the same worker goes on: held, tried again');
is(scalar(() = slurp_file($node->logfile, $log_offset) =~ /could not record the error of pipeline "hook"/g), 1,
	'the same failure again is not logged again within the minute');
sql('DROP TRIGGER disk_full ON tide.relay_pipeline_health');
sql('DROP TRIGGER disk_full ON tide.relay_attempts');
ok(wait_status('health, turn_error IS NULL, reason IS NULL, offset_id', qr/^healthy\|t\|t\|$more[-1]$/, 15),
	'the cause gone: healthy, the error cleared, the batch recorded')
  or diag(status('health, turn_error, reason, offset_id'));
like(slurp_file($node->logfile, $log_offset),
	qr/pg_tide relay records the [a-z ]+ of pipeline "hook" again\n.*DETAIL:  Recording failed \d+ times? since/,
	'the log says that its state is recorded again');

# stopped: the relay switched off.
$rcv->stop;
my @last = publish(1);
ok(wait_status('health', qr/^held$/, 10), 'the receiver down again: held');
sql('ALTER SYSTEM SET pg_tide.relay_enabled = off');
sql('SELECT pg_reload_conf()');
ok(wait_status('health, reason, next_attempt_at IS NULL', qr/^stopped\|pg_tide\.relay_enabled is off\|t$/, 10),
	'relay_enabled off: stopped, the reason, no next attempt')
  or diag(status('health, reason, next_attempt_at'));
ok(defined wait_until(sub { sql('SELECT count(*) FROM tide.relay_workers()') eq '0' }, 10),
	'the worker has left');
is(sql("SELECT held_until > now() FROM tide.relay_pipeline_health WHERE pipeline_id = 'hook'"), 't',
	'its last hold is still recorded');
# Disabled while no worker runs: the next worker never reads it, so only
# its start can clear the hold.
sql("SELECT tide.relay_disable('hook')");
sql('ALTER SYSTEM RESET pg_tide.relay_enabled');
sql('SELECT pg_reload_conf()');
ok(defined wait_until(sub { sql("SELECT held_until IS NULL FROM tide.relay_pipeline_health WHERE pipeline_id = 'hook'") eq 't' }, 15),
	'a new worker clears the holds an earlier one recorded');
is(status('health'), 'disabled', 'disabled comes first');
$rcv->start;
sql("SELECT tide.relay_enable('hook')");
ok(wait_status('health, offset_id', qr/^healthy\|$last[-1]$/, 15), 'enabled again: healthy, delivered')
  or diag(status('health, reason, offset_id'));

note(sprintf('test took %.1f s', time() - $t_start));
$rcv->stop;
$node->stop;
done_testing();
