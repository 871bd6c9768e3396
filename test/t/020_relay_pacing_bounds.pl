# A pipeline config written by hand (as a superuser, with triggers off, so
# past the validator of tide.relay_set_outbox and of the row's trigger) with
# "rate_limit": {"per_second": 1e-20}: the wait for its next token, about
# 1e23 ms, once overflowed a long, so the worker woke up in the past and ran
# pass after pass (104,901 in 3 s at 96 % CPU). The wait is bounded
# (relay/pacing.c), and the worker now runs the validator on every row it
# reads, so such a row is passed over: over 3 s the worker makes a few
# passes and uses little CPU, the odd pipeline sends nothing, and a healthy
# pipeline in the same database still delivers at once.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;
use POSIX ();
use Time::HiRes qw(time usleep);

my $node = tide_node('pacing_bounds', "pg_tide.relay_naptime_ms = 500\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;

sub sql { return $node->safe_psql('postgres', $_[0]) }

# The requests answered 200 at a path.
sub delivered_at
{
	my ($path) = @_;
	return scalar(grep { $_->{path} eq $path && $_->{status} == 200 } $rcv->requests);
}

# The worker's CPU time so far, in seconds (utime + stime of /proc/<pid>/stat).
sub cpu_seconds
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/stat") or return undef;
	my $stat = <$fh>;
	close $fh;
	$stat =~ s/^.*\) //;
	my @f = split / /, $stat;
	return ($f[11] + $f[12]) / POSIX::sysconf(POSIX::_SC_CLK_TCK());
}

# Two pipelines: "healthy" (outbox orders) and "tiny" (outbox slow), both
# set the usual way, then tiny's rate written by hand.
sql("SELECT tide.outbox_create('orders')");
sql("SELECT tide.outbox_create('slow')");
sql("SELECT tide.relay_set_outbox('healthy', 'orders', 'healthy_group', jsonb_build_object(
	  'sink_type', 'webhook', 'url', '" . $rcv->url('/healthy') . "', 'allow_http', true,
	  'allow_private_network', true))");
sql("SELECT tide.relay_set_outbox('tiny', 'slow', 'tiny_group', jsonb_build_object(
	  'sink_type', 'webhook', 'url', '" . $rcv->url('/tiny') . "', 'allow_http', true,
	  'allow_private_network', true, 'batch_size', 10,
	  'rate_limit', jsonb_build_object('per_second', 1, 'burst', 1)))");
my $tiny = "UPDATE tide.relay_outbox_config
		SET config = jsonb_set(config, '{rate_limit,per_second}', '1e-20')
	  WHERE name = 'tiny'";
my ($rc, $out, $err) = $node->psql('postgres', $tiny);
like($err, qr/config key "rate_limit.per_second" is out of range: 1\.000e-20/,
	'the row\'s trigger refuses per_second 1e-20 written by hand');
sql("SET session_replication_role = replica; $tiny");
is(sql("SELECT config #>> '{rate_limit,per_second}' FROM tide.relay_outbox_config WHERE name = 'tiny'"),
	'0.00000000000000000001', 'with triggers off, the hand-written row holds per_second 1e-20');
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_workers() WHERE database = 'postgres'") eq '1' }, 10),
	'database postgres has a relay worker');
my $pid = sql("SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'");

# The worker passes the row over: none of its messages is sent. A row
# written with triggers off wakes no worker: it is read at the next reading
# (the naptime), so the messages are published once it has been read.
ok(defined wait_until(sub { sql("SELECT last_error FROM tide.relay_pipeline_status WHERE pipeline = 'tiny'")
	  =~ /rate_limit.per_second" is out of range/ }, 10),
	'the worker passes the odd row over, with the validator\'s message as its error');
sql("SELECT tide.outbox_publish('slow', jsonb_build_object('n', g)) FROM generate_series(1, 3) g");
usleep(500_000);

my $passes0 = sql("SELECT passes FROM tide.relay_workers() WHERE database = 'postgres'");
my $cpu0 = cpu_seconds($pid);
my $t0 = time();
usleep(3_000_000);
my $passes = sql("SELECT passes FROM tide.relay_workers() WHERE database = 'postgres'") - $passes0;
my $cpu = cpu_seconds($pid) - $cpu0;
my $elapsed = time() - $t0;
note(sprintf('over %.1f s: %d passes, %.2f s of CPU', $elapsed, $passes, $cpu));
cmp_ok($passes, '<=', 20, 'the worker does not spin: at most 20 passes in 3 s (naptime 500 ms)');
cmp_ok($cpu, '<', 0.3, 'the worker uses under 10 % of a CPU');
is(delivered_at('/tiny'), 0, 'the odd pipeline sent nothing');

# The healthy pipeline in the same database still delivers at once.
my $t_pub = time();
sql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, 5) g");
my $took = defined wait_until(sub { delivered_at('/healthy') >= 5 }, 10) ? time() - $t_pub : undef;
ok(defined $took && $took < 2, 'a healthy pipeline in the same database delivers within 2 s');
note(sprintf('healthy pipeline: 5 messages delivered %.2f s after the publishing psql started', $took))
  if defined $took;
is(sql("SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'"), $pid, 'by the same worker');

$rcv->stop;
$node->stop;
done_testing();
