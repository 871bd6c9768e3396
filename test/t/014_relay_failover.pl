# The relay across a failover to a streaming standby: a primary publishes
# continuously while its relay delivers to a webhook (test/receiver); the
# standby, with pg_tide preloaded and the same settings, runs no relay
# while it is in recovery; the primary is stopped abruptly (immediate)
# mid-delivery with a backlog, the standby is promoted, its launcher starts
# without a restart, and the new primary delivers to the same receiver:
#
#  - every message whose commit returned success arrives at least once
#    (none is missing), and what was undelivered at the failover arrives
#    from the new primary;
#  - duplicates are bounded by what was in flight: one batch;
#  - each message keeps one identity (webhook-id outbox_orders:<id>), and
#    the new primary gives no id twice: no webhook-id names two messages.
#
# Replication is synchronous (synchronous_standby_names = '*', commits
# wait for the standby to flush), so a commit that returned success is on
# the standby, and no other session, the relay included, sees a commit
# before the standby has it. With asynchronous replication a failover
# loses the commits not yet streamed: that is the database's contract, not
# the relay's, and this test could not tell such a loss from a relay bug.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use PgTide::Receiver;
use IPC::Run;
use JSON::PP;
use Time::HiRes qw(time usleep);

my $t_start = time();
my $batch_size = 20;
my $primary = tide_node('primary', <<CONF, allows_streaming => 1);
pg_tide.relay_naptime_ms = 100
shared_buffers = 16MB
max_connections = 20
CONF
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
# The backup carries the primary's settings, pg_tide preloaded included.
$standby->start;
# Synchronous from now on (set on the primary alone: once promoted, the
# standby has no standby of its own, and commits there must not wait).
$primary->safe_psql('postgres', "ALTER SYSTEM SET synchronous_standby_names = '*'");
$primary->reload;
ok($primary->poll_query_until('postgres',
		"SELECT EXISTS (SELECT FROM pg_stat_replication WHERE sync_state = 'sync')"),
	'the standby streams, as a synchronous standby');

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;

# Every request the receiver logged; the lines read before are kept.
my @logged;
my $log_pos = 0;
sub all_requests
{
	my $file = $rcv->logfile;
	return @logged unless -e $file;
	open(my $fh, '<', $file) or die "cannot open $file: $!";
	seek($fh, $log_pos, 0);
	while (my $l = <$fh>)
	{
		last unless $l =~ /\n\z/;	# a line still being written is read next time
		my $r = $json->decode($l);
		my $b = $json->decode($r->{body});
		$r->{msg} = $b;
		push @logged, $r;
		$log_pos += length($l);
	}
	close $fh;
	return @logged;
}

# id => number of requests answered 200.
sub delivered
{
	my %seen;
	$seen{ $_->{msg}{message_id} }++ for grep { $_->{status} == 200 } all_requests();
	return \%seen;
}

# Waits until the sub returns true, at most $timeout seconds; the time
# taken, or undef.
sub wait_until
{
	my ($cond, $timeout) = @_;
	my $start = time();
	while (time() - $start < $timeout)
	{
		return time() - $start if $cond->();
		usleep(50_000);
	}
	return undef;
}

# The relay's processes on a node, from pg_stat_activity: "launcher,worker".
sub relay_procs
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE backend_type = 'pg_tide launcher') || ','
		     || count(*) FILTER (WHERE backend_type = 'pg_tide relay worker')
		   FROM pg_stat_activity");
}

$primary->safe_psql('postgres', "SELECT tide.outbox_create('orders')");
my $cfg = $json->encode({
	sink_type => 'webhook',
	url => $rcv->url('/hook'),
	allow_http => JSON::PP::true,
	allow_private_network => JSON::PP::true,
	batch_size => $batch_size,
	max_in_flight => 1,
	retry => { base_ms => 100, cap_ms => 1000, max_attempts => 10 } });
$primary->safe_psql('postgres', "SELECT tide.relay_set_outbox('hook', 'orders', 'hook', '$cfg'::jsonb)");

###########################################################################
# 1. A warm-up: 20 messages arrive from the primary. The standby has the
# pipeline and the messages, and still runs no relay: the receiver saw
# exactly the requests in the primary's attempt log, no more.
###########################################################################
my @warm = split /\n/, $primary->safe_psql('postgres',
	"SELECT tide.outbox_publish('orders', jsonb_build_object('n', -g)) FROM generate_series(1, 20) g");
ok(defined wait_until(sub { my $s = delivered(); !grep { !$s->{$_} } @warm }, 20),
	'warm-up: 20 messages arrive from the primary');
ok($primary->poll_query_until('postgres',
		"SELECT last_change_id = $warm[-1] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'"),
	'warm-up: the offset is recorded');
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres',
		"SELECT pg_is_in_recovery() || ' ' || (SELECT count(*) FROM tide.relay_outbox_config WHERE enabled)
		     || ' ' || (SELECT count(*) FROM tide.tide_outbox_messages WHERE id <= $warm[-1])"),
	'true 1 20', 'the standby is in recovery and has the enabled pipeline and the messages');
is(scalar(all_requests()),
	$primary->safe_psql('postgres', "SELECT count(*) FROM tide.relay_attempts"),
	'the receiver saw exactly the requests the primary logged');
is(relay_procs($standby), '0,0', 'the standby runs no pg_tide launcher and no relay worker');
is($standby->safe_psql('postgres', 'SELECT count(*) FROM tide.relay_workers()'), '0',
	'tide.relay_workers() on the standby is empty');
is(relay_procs($primary), '1,1', 'the primary runs the launcher and a worker');

###########################################################################
# 2. Publish continuously (psql, one transaction of 5 messages at a time;
# a transaction's rows are printed only once its commit returned) while
# the relay delivers to a slowed receiver (20 ms an answer, one request in
# flight), so a backlog builds. Meanwhile the standby is watched.
###########################################################################
$rcv->control({ delay_ms => 20 });
my $script = "$dir/publish.sql";
open(my $sf, '>', $script) or die "cannot write $script: $!";
for my $i (0 .. 599)
{
	printf $sf "SELECT n, tide.outbox_publish('orders', jsonb_build_object('n', n))"
	  . " FROM pg_sleep(0.01), generate_series(%d, %d) n;\n", $i * 5 + 1, $i * 5 + 5;
}
close $sf;
my ($pub_out, $pub_err) = ("$dir/publish.out", "$dir/publish.err");
my $pub = IPC::Run::start(
	[ 'psql', '-X', '-At', '-v', 'ON_ERROR_STOP=1', '-d', $primary->connstr('postgres'), '-f', $script ],
	'<', \undef, '>', $pub_out, '2>', $pub_err, IPC::Run::timeout(120));

my $standby_log_offset = 0;
my ($standby_max_procs, $standby_looks) = (0, 0);
my $backlog_ok = wait_until(
	sub {
		my ($l, $w) = split /,/, relay_procs($standby);
		$standby_max_procs = $l + $w if $l + $w > $standby_max_procs;
		$standby_looks++;
		my ($published, $max_id, $offset) = split /\|/, $primary->safe_psql('postgres',
			"SELECT count(*), max(id),
			        (SELECT last_change_id FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook')
			   FROM tide.tide_outbox_messages WHERE id > $warm[-1]");
		my $arrived = grep { $_ > $warm[-1] } keys %{ delivered() };
		return $published >= 300 && $arrived >= 40 && $max_id - $offset >= 100;
	},
	30);
ok(defined $backlog_ok, 'publishing while the relay delivers builds a backlog of 100 (within 30 s)');
is($standby_max_procs, 0, "the standby ran no pg_tide process meanwhile ($standby_looks looks)");
unlike(slurp_file($standby->logfile), qr/pg_tide launcher started/,
	'the standby\'s log shows no launcher start while it is in recovery');

###########################################################################
# 3. Failover: the primary stopped abruptly mid-delivery, the standby
# promoted. What has arrived by then is all the old primary delivered:
# the receiver logs a request when its body has arrived, and the stopped
# server's processes are gone.
###########################################################################
$primary->stop('immediate');
my $t_kill = time();
eval { $pub->finish };
my %committed;	# n => id, for every transaction whose commit returned
for my $line (split /\n/, slurp_file($pub_out))
{
	$committed{$1} = $2 if $line =~ /^(\d+)\|(\d+)$/;
}
my @committed_ids = sort { $a <=> $b } values %committed;
my $seen_at_kill = delivered();
my @missing_at_kill = grep { !$seen_at_kill->{$_} } @committed_ids;
my $requests_at_kill = scalar(all_requests());
note(sprintf('failover: %d messages committed while publishing, %d of them undelivered at the stop',
		scalar(@committed_ids), scalar(@missing_at_kill)));
like(slurp_file($pub_err), qr/server closed the connection|terminating connection|connection to server/,
	'the publisher lost its connection at the stop');
cmp_ok(scalar(@committed_ids), '>=', 300, 'at least 300 commits returned before the stop');
cmp_ok(scalar(@missing_at_kill), '>', 0, 'committed messages were still undelivered at the stop');

$rcv->control({ delay_ms => 0 });
$standby_log_offset = -s $standby->logfile;
my $t_promoted = time();
$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'), 'the standby is promoted');
is(scalar(grep { $_->{t} < $t_promoted } all_requests()), $requests_at_kill,
	'nothing was delivered between the stop and the promotion');

ok(defined wait_until(sub { relay_procs($standby) eq '1,1' }, 20),
	'the new primary starts the launcher and a relay worker, without a restart');
like(slurp_file($standby->logfile, $standby_log_offset), qr/pg_tide launcher started/,
	'its log shows the launcher start after the promotion');

###########################################################################
# 4. Every committed message arrives; the ones missing at the stop came
# from the new primary; duplicates are at most one batch; identities are
# unique.
###########################################################################
my $took = wait_until(sub { my $s = delivered(); !grep { !$s->{$_} } @committed_ids }, 40);
ok(defined $took, 'every committed message arrives after the failover (within 40 s)');
note(sprintf('failover: the backlog had arrived %.1f s after the promotion began', time() - $t_promoted))
  if defined $took;
my $seen = delivered();
my @missing = grep { !$seen->{$_} } @committed_ids;
is(scalar(@missing), 0, 'no committed message is missing')
  or diag('missing ids: ' . join(' ', @missing[ 0 .. ($#missing < 19 ? $#missing : 19) ]));

my @after = grep { $_->{t} >= $t_promoted && $_->{status} == 200 } all_requests();
my %after_ids = map { $_->{msg}{message_id} => 1 } @after;
is(scalar(grep { !$after_ids{$_} } @missing_at_kill), 0,
	'every message undelivered at the stop arrived after the promotion');
cmp_ok($standby->safe_psql('postgres',
		sprintf("SELECT count(*) FROM tide.relay_attempts
		          WHERE status = 'success' AND attempted_at >= to_timestamp(%.6f)", $t_promoted)),
	'>=', scalar(@missing_at_kill), 'the new primary\'s attempt log has those deliveries');

my $dups = 0;
my @dup_ids = grep { $seen->{$_} > 1 } keys %$seen;
$dups += $seen->{$_} - 1 for @dup_ids;
note(sprintf('failover: %d duplicate deliveries (ids %s)', $dups,
		@dup_ids ? join(' ', (sort { $a <=> $b } @dup_ids)[ 0, -1 ]) : 'none'));
cmp_ok($dups, '<=', $batch_size, "duplicates are at most one batch ($batch_size)");
is(scalar(grep { !$seen_at_kill->{$_} } @dup_ids), 0,
	'only messages the old primary had sent were delivered twice (what was in flight at the stop)');

# One identity per message: a webhook-id names one message (payload n),
# and each committed message arrived under the id its publish returned.
my (%ns_of_wid, %wids_of_n);
for my $r (grep { $_->{status} == 200 } all_requests())
{
	my $wid = $r->{headers}{'webhook-id'} // '';
	my $n = $r->{msg}{payload}{n};
	$ns_of_wid{$wid}{$n} = 1;
	$wids_of_n{$n}{$wid} = 1;
}
is(scalar(grep { keys %{ $ns_of_wid{$_} } != 1 } keys %ns_of_wid), 0, 'no webhook-id names two messages');
is(scalar(grep { join(',', keys %{ $wids_of_n{$_} // {} }) ne "outbox_orders:$committed{$_}" }
		  keys %committed),
	0, 'every committed message arrived under the one webhook-id of the id its publish returned');

###########################################################################
# 5. Publishing goes on at the new primary: new ids, above every old one,
# delivered by its relay; the offset reaches the end.
###########################################################################
my ($old_max) = sort { $b <=> $a } (@committed_ids, keys %$seen);
my @new = split /\n/, $standby->safe_psql('postgres',
	"SELECT tide.outbox_publish('orders', jsonb_build_object('n', 100000 + g)) FROM generate_series(1, 20) g");
is(scalar(grep { $_ <= $old_max } @new), 0, 'the new primary gives ids above every id of the old one');
ok(defined wait_until(sub { my $s = delivered(); !grep { !$s->{$_} } @new }, 20),
	'messages published at the new primary arrive');
ok($standby->poll_query_until('postgres',
		"SELECT last_change_id = $new[-1] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'hook'"),
	'the new primary\'s offset reaches the last id');

note(sprintf('test took %.1f s', time() - $t_start));
$rcv->stop;
$standby->stop;
done_testing();
