# Sinks that connect to a broker which accepts TCP connections and never
# answers: no connect, TLS handshake, login or channel set-up of any sink
# may block the worker's loop, so a healthy pipeline of the same worker
# keeps its speed.
#
#  1. A healthy webhook pipeline's commit-to-receipt wait, 40 messages
#     50 ms apart: its p50 alone.
#  2. Beside it, one pipeline of each sink type (RabbitMQ, Redis, NATS,
#     Kafka, MQTT, webhook, and the TLS variants of RabbitMQ, NATS, MQTT
#     and the webhook) to a silent listener on 127.0.0.1: a socket that
#     listens and never reads, so the kernel completes every connection
#     and nothing ever answers. Two of each RabbitMQ kind, since
#     rabbitmq-c's connect steps were made in the loop, and four of the
#     TLS webhook, whose CA bundle was read in the loop for each new
#     connection. The same 40
#     messages: p50 beside stays within 3 times alone, p90 within
#     alone + 250 ms.
#  3. Every silent pipeline ends up failing with class timeout or
#     connection, and nothing reached the healthy receiver twice.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Receiver;
use IO::Socket::INET;
use JSON::PP;
use Time::HiRes qw(time);

my $node = tide_node('silent', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;

sub sql { return $node->safe_psql('postgres', $_[0]) }

my $healthy = PgTide::Receiver->new(dir => $dir);
$healthy->start;
my $silent = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1024, ReuseAddr => 1)
  or die "cannot listen: $!";
my $port = $silent->sockport;

sub set_pipeline
{
	my ($name, $cfg) = @_;
	my $c = $json->encode($cfg);
	sql("SELECT tide.relay_set_outbox('$name', 'orders', '$name', '$c'::jsonb)");
}

# The commit-to-receipt waits (seconds, sorted) of 40 messages published
# 50 ms apart, one commit each, in one session.
sub waits { return $healthy->commit_waits($node, 'orders', $_[0], 40, 0.05) }

sub p50 { my ($w) = @_; return $w->[ int(@$w / 2) ] }
sub p90 { my ($w) = @_; return $w->[ int(@$w * 9 / 10) ] }

sql("SELECT tide.outbox_create('orders')");
set_pipeline('healthy', { sink_type => 'webhook', url => $healthy->url, allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true });

###########################################################################
# 1. alone
###########################################################################
my $alone = waits('alone');
ok(defined $alone, 'alone: the healthy pipeline delivers the 40 messages');
BAIL_OUT('the healthy pipeline does not deliver') unless defined $alone;

###########################################################################
# 2. beside a silent broker of every sink type
###########################################################################
my %common = (timeout_ms => 3000, retry => { base_ms => 100, cap_ms => 1000 });
my $no_verify = { verify => JSON::PP::false };
my %silent = (
	rabbitmq1 => { sink_type => 'rabbitmq', host => '127.0.0.1', port => $port, routing_key => 'r' },
	rabbitmq2 => { sink_type => 'rabbitmq', host => '127.0.0.1', port => $port, routing_key => 'r' },
	rabbitmq_tls1 => { sink_type => 'rabbitmq', host => '127.0.0.1', port => $port, routing_key => 'r', tls => $no_verify },
	rabbitmq_tls2 => { sink_type => 'rabbitmq', host => '127.0.0.1', port => $port, routing_key => 'r', tls => $no_verify },
	redis => { sink_type => 'redis', url => "redis://127.0.0.1:$port", stream => 's' },
	nats => { sink_type => 'nats', servers => "nats://127.0.0.1:$port", subject => 's' },
	nats_tls => { sink_type => 'nats', servers => "nats://127.0.0.1:$port", subject => 's', tls => $no_verify },
	kafka => { sink_type => 'kafka', bootstrap_servers => "127.0.0.1:$port", topic => 't' },
	mqtt => { sink_type => 'mqtt', host => '127.0.0.1', port => $port, topic => 't' },
	mqtt_tls => { sink_type => 'mqtt', host => '127.0.0.1', port => $port, topic => 't', tls => $no_verify },
	webhook => { sink_type => 'webhook', url => "http://127.0.0.1:$port/hook", allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true },
	map { ("webhook_tls$_" => { sink_type => 'webhook', url => "https://127.0.0.1:$port/hook$_",
		allow_private_network => JSON::PP::true }) } 1 .. 4);
set_pipeline($_, { %{ $silent{$_} }, %common }) for sort keys %silent;

my $beside = waits('beside');
ok(defined $beside, 'beside the silent brokers: the healthy pipeline delivers the 40 messages');
if (defined $beside)
{
	my ($a, $b) = (p50($alone), p50($beside));
	note(sprintf('healthy pipeline: p50 alone %.1f ms, beside the silent brokers %.1f ms; p90 %.1f and %.1f ms; max %.1f ms beside',
			$a * 1000, $b * 1000, p90($alone) * 1000, p90($beside) * 1000, $beside->[-1] * 1000));
	# three times alone, with a floor of alone + 30 ms: on a loaded two-core
	# machine a p50 of a few milliseconds alone varies by more than 3 times
	my $bound = $a * 3 > $a + 0.030 ? $a * 3 : $a + 0.030;
	cmp_ok($b, '<=', $bound, 'p50 beside the silent brokers is within max(3 x alone, alone + 30 ms)');
	# a stall of the loop once per pipeline (a TLS connection's CA bundle
	# read in the loop) delays a run of messages: the p90 shows it
	cmp_ok(p90($beside), '<=', p90($alone) + 0.250, 'p90 beside the silent brokers is within p90 alone + 250 ms');
}

###########################################################################
# 3. the silent pipelines fail, as timeout or connection
###########################################################################
my $names = join(', ', map { "'$_'" } sort keys %silent);
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_pipeline_status
		  WHERE pipeline IN ($names) AND last_error_class IN ('timeout', 'connection')") == keys %silent }, 30, 200_000),
	'every silent pipeline failed with class timeout or connection')
  or diag(sql("SELECT pipeline, health, last_error_class, last_error FROM tide.relay_pipeline_status
				WHERE pipeline IN ($names) ORDER BY 1"));
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id IN ($names)"), '0',
	'nothing of theirs is dead-lettered');

my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal/, 'no server process crashed');

$healthy->stop;
close $silent;
done_testing();
