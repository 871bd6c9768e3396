# A pipeline whose delivered batch cannot be recorded: the record
# transaction fails with an ERROR, as it does when the disk is full ("could
# not extend file ...: No space left on device", SQLSTATE 53100). Here a
# trigger on tide.relay_attempts raises that error, which is what a full
# tablespace under that table did in a manual run (see docs/relay.md, "Disk
# full and out of connections").
#
#  - The pipeline is held after each such error, 1 s and doubling, so the
#    batch it sent but could not record is sent again a few times, not on
#    every pass (100 ms here: about 40 times in the same 4 s). The first
#    error is logged, the next ones not within the minute, and the end of
#    them once the error is gone.
#  - The offset does not move; nothing is lost.
#  - Another pipeline of the same worker goes on meanwhile.
#  - Once the error is gone, the batch is recorded and the pipeline goes on.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node disk_full);
use PgTide::Receiver;
use JSON::PP;
use Time::HiRes qw(time usleep);

my $t_start = time();
my $node = tide_node('errors', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;

# path => { message id => requests answered 200 }.
sub delivered
{
	my %seen;
	for my $r ($rcv->requests)
	{
		next unless $r->{status} == 200;
		$seen{ $r->{path} }{ $json->decode($r->{body})->{message_id} }++;
	}
	return \%seen;
}

# Waits until the sub returns true, at most $timeout seconds.
sub wait_until
{
	my ($cond, $timeout) = @_;
	my $deadline = time() + $timeout;
	while (time() < $deadline)
	{
		return 1 if $cond->();
		usleep(50_000);
	}
	return 0;
}

# Sets a webhook pipeline from an outbox to a path of the receiver.
sub set_pipeline
{
	my ($name, $outbox, $path, %extra) = @_;
	my $cfg = $json->encode({
		sink_type => 'webhook',
		url => $rcv->url($path),
		allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true,
		batch_size => 5,
		%extra });
	$node->safe_psql('postgres', "SELECT tide.relay_set_outbox('$name', '$outbox', '$name', '$cfg'::jsonb)");
}

# Publishes n messages; their ids.
sub publish
{
	my ($outbox, $n) = @_;
	return split /\n/, $node->safe_psql('postgres',
		"SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', g)) FROM generate_series(1, $n) g");
}

$node->safe_psql('postgres', "SELECT tide.outbox_create('orders'), tide.outbox_create('other')");
set_pipeline('hook', 'orders', '/hook');
# No attempt log: its records do not touch the failing table.
set_pipeline('other', 'other', '/other', attempt_log => JSON::PP::false);

disk_full($node, 'tide.relay_attempts');

my $log_offset = -s $node->logfile;
my @ids = publish('orders', 5);
ok(wait_until(sub { my $s = delivered()->{'/hook'} // {}; !grep { !$s->{$_} } @ids }, 10),
	'the batch is sent although it cannot be recorded');
my $t_first = time();
my @other = publish('other', 3);
ok(wait_until(sub { my $s = delivered()->{'/other'} // {}; !grep { !$s->{$_} } @other }, 10),
	'another pipeline of the same worker delivers meanwhile');
usleep(int(1_000_000 * (4 - (time() - $t_first)))) if time() - $t_first < 4;

my $seen = delivered()->{'/hook'};
my ($most) = sort { $b <=> $a } map { $seen->{$_} // 0 } @ids;
note("while the record fails, each message was sent at most $most times in 4 s");
cmp_ok($most, '<=', 4, 'held after each error: each message sent at most 4 times in 4 s (not on every pass)');
cmp_ok($most, '>=', 2, 'and sent again after the hold');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'"),
	'0', 'the offset does not move while the batch cannot be recorded');
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/pipeline "hook" stopped this pass after an error: could not extend file: No space left on device\n.*DETAIL:  The pipeline is tried again in 1000 ms \(error 1 in a row\)/,
	'the log says the pipeline is held for 1 s after the first error');
# The later errors are not logged within the minute (relay/log_repeat.c);
# relay_pipeline_health still shows each, with its hold: 1 s, doubling.
unlike($log, qr/error 2 in a row/, 'the second error is not logged within a minute of the first');
my ($errors, $hold) = split /\|/, $node->safe_psql('postgres', q{
	SELECT turn_errors, round(extract(epoch FROM held_until - updated_at))
	  FROM tide.relay_pipeline_health WHERE pipeline_id = 'hook'});
cmp_ok($errors, '>=', 2, 'relay_pipeline_health counts the errors in a row');
is($hold, 2**($errors - 1), "and the hold after error $errors is 2^($errors - 1) s");

$node->safe_psql('postgres', 'DROP TRIGGER disk_full ON tide.relay_attempts');
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $ids[-1] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'"),
	'the error gone, the batch is recorded');
like(slurp_file($node->logfile, $log_offset),
	qr/pipeline "hook" works again: its last step ended without an error\n.*DETAIL:  Since .*: \d+ steps in a row ended in an error\./,
	'the log says the errors are over, and how many there were');
my @more = publish('orders', 5);
ok(wait_until(sub { my $s = delivered()->{'/hook'} // {}; !grep { !$s->{$_} } @more }, 10),
	'and the pipeline goes on');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'hook' AND message_id BETWEEN $ids[0] AND $ids[-1]"),
	'5', 'the recorded batch has its attempt rows');

note(sprintf('test took %.1f s', time() - $t_start));
$rcv->stop;
$node->stop;
done_testing();
