# Host name lookups of the Redis and MQTT sinks, which hiredis and
# libmosquitto would make inside the worker's loop (getaddrinfo in their
# connect): the sinks look the name up on a thread of their own and
# connect to the address.
#
#  1. Redis and MQTT pipelines to "localhost" deliver every message, to
#     real brokers read back by their own clients; a name that does not
#     resolve holds the pipeline with class connection and says so.
#  2. A name server that never answers: a second cluster runs in a user,
#     mount and network namespace of its own, whose /etc/resolv.conf names
#     a server on its 127.0.0.1 that takes every query and answers none
#     (options timeout:20). Redis and MQTT pipelines to a name there wait
#     on the lookup; a file pipeline of the same worker delivers meanwhile,
#     each message within 3 s; the broker pipelines' batches end at their
#     timeout_ms (class timeout, held, nothing dead-lettered). Where user
#     namespaces cannot be made (a chroot, a kernel that refuses them) this
#     part is skipped, and says why.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Redis;
use PgTide::Mosquitto;
use JSON::PP;
use Time::HiRes qw(time usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;

###########################################################################
# 1. "localhost" is looked up and delivered to; a name that is not found
###########################################################################
my $redis = PgTide::Redis->new(dir => $dir);
$redis->start;
my $mq = PgTide::Mosquitto->new(dir => $dir);
$mq->start;
my $node = tide_node('lookups', "pg_tide.relay_naptime_ms = 100\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

sub set_pipeline
{
	my ($n, $name, $cfg) = @_;
	my $c = $json->encode($cfg);
	$n->safe_psql('postgres', "SELECT tide.outbox_create('$name');
		SELECT tide.relay_set_outbox('$name', '$name', '$name', '$c'::jsonb)");
}

sub publish
{
	my ($n, $outbox, $count) = @_;
	return split /\n/, $n->safe_psql('postgres',
		"SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', g)) FROM generate_series(1, $count) g");
}

{
	my $port = $redis->port;
	set_pipeline($node, 'rlocal', { sink_type => 'redis', url => "redis://localhost:$port", stream => 'rlocal' });
	publish($node, 'rlocal', 50);
	ok(defined wait_until(sub { ($redis->cli('XLEN', 'rlocal') // 0) == 50 }, 30),
		'redis to "localhost": the 50 messages are in the stream');

	my $sub = $mq->subscribe('mlocal');
	set_pipeline($node, 'mlocal', { sink_type => 'mqtt', host => 'localhost', port => $mq->port, topic => 'mlocal' });
	my @ids = publish($node, 'mlocal', 50);
	ok($mq->wait_for_ids($sub, \@ids, 0, 30), 'mqtt to "localhost": the 50 messages reached the subscriber');

	# (".invalid" never resolves, RFC 6761)
	set_pipeline($node, 'rnone', { sink_type => 'redis', url => 'redis://no-such-host.invalid:6379', stream => 's' });
	set_pipeline($node, 'mnone', { sink_type => 'mqtt', host => 'no-such-host.invalid', topic => 't' });
	publish($node, $_, 3) for qw(rnone mnone);
	for my $p (qw(rnone mnone))
	{
		ok($node->poll_query_until('postgres',
				"SELECT health = 'held' AND last_error_class = 'connection' FROM tide.relay_pipeline_status
				  WHERE pipeline = '$p'"),
			"$p: a name that is not found holds the pipeline, class connection");
		like(sql("SELECT last_error FROM tide.relay_pipeline_status WHERE pipeline = '$p'"),
			qr/could not look up "no-such-host\.invalid"/, "$p: the error says the name was not found");
		is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$p'"), '0', "$p: nothing is dead-lettered");
	}
}
$node->stop;
$mq->shutdown;

###########################################################################
# 2. A name server that never answers
###########################################################################
# Whether user, mount and network namespaces can be made here.
sub namespaces_work
{
	return 0 unless grep { -x "$_/unshare" } split /:/, $ENV{PATH};
	return 0 unless grep { -x "$_/ip" } split(/:/, $ENV{PATH}), '/usr/sbin', '/sbin';
	return system('unshare --user --map-root-user --mount --net true >/dev/null 2>&1') == 0;
}

SKIP:
{
	skip 'user, mount and network namespaces cannot be made here (unshare --user --mount --net fails: '
	  . 'a chroot, or a kernel that refuses unprivileged user namespaces), nor then a name server of the test\'s own', 8
	  unless namespaces_work();

	my $ip = (grep { -x "$_/ip" } split(/:/, $ENV{PATH}), '/usr/sbin', '/sbin')[0] . '/ip';
	my $resolv = "$dir/resolv.conf";
	open(my $fh, '>', $resolv) or die;
	print $fh "nameserver 127.0.0.1\noptions timeout:20 attempts:1\n";
	close $fh;
	# the name server: takes every query on 127.0.0.1:53 and answers none
	# (and ends by itself after 10 minutes, should the test die first)
	my $silent = "$dir/silent_dns.pl";
	open($fh, '>', $silent) or die;
	print $fh 'alarm 600; use IO::Socket::INET; my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:53", Proto => "udp")'
	  . ' or die "cannot bind 127.0.0.1:53: $!"; my $b; 1 while defined $s->recv($b, 4096);' . "\n";
	close $fh;

	my $ns = PostgreSQL::Test::Cluster->new('lookups_ns');
	$ns->init;
	$ns->append_conf('postgresql.conf', "shared_preload_libraries = 'pg_tide'\npg_tide.relay_naptime_ms = 100\n");
	# Started inside the namespaces: as root of the outer user namespace
	# (lo up, resolv.conf bound over, the name server started), then as a
	# user other than root in an inner one, as PostgreSQL must run.
	my $pgdata = $ns->data_dir;
	my $log = $ns->logfile;
	my $name_server_pid = "$dir/silent_dns.pid";
	{
		local %ENV = $ns->_get_env(PGAPPNAME => undef);
		my $script = "set -e; $ip link set lo up; mount --bind '$resolv' /etc/resolv.conf;"
		  . " perl '$silent' & echo \$! > '$name_server_pid';"
		  . " exec unshare --user --map-user=1000 --map-group=1000"
		  . " pg_ctl -w -D '$pgdata' -l '$log' -o '--cluster-name=lookups_ns' start";
		is(system('unshare', '--user', '--map-root-user', '--mount', '--net', 'sh', '-c', $script), 0,
			'the cluster starts in namespaces of its own');
	}
	$ns->_update_pid(1);
	$ns->safe_psql('postgres', 'CREATE EXTENSION pg_tide');

	my $file = "$dir/beside.jsonl";
	set_pipeline($ns, 'rslow', { sink_type => 'redis', url => 'redis://broker.tide-test.example:6379', stream => 's',
			timeout_ms => 8000 });
	set_pipeline($ns, 'mslow', { sink_type => 'mqtt', host => 'broker.tide-test.example', topic => 't',
			timeout_ms => 8000 });
	set_pipeline($ns, 'beside', { sink_type => 'file', path => $file });
	publish($ns, $_, 3) for qw(rslow mslow);
	# their lookups have begun when the file's messages come
	usleep(500_000);
	my $lines = sub { open(my $fh, '<', $file) or return 0; my @l = <$fh>; return scalar @l };
	my $slowest = 0;
	for my $k (1 .. 5)
	{
		my $t0 = time();
		publish($ns, 'beside', 1);
		my $took = wait_until(sub { $lines->() >= $k }, 30, 20_000) // 30;
		$slowest = $took if $took > $slowest;
	}
	note(sprintf('the file pipeline: slowest message %.3f s', $slowest));
	cmp_ok($slowest, '<', 3, 'while both lookups wait on the name server, each file message is delivered within 3 s');
	is($ns->safe_psql('postgres', "SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id IN ('rslow', 'mslow')"), '0',
		'the lookups had not ended then (no attempt of either broker pipeline yet)');
	for my $p (qw(rslow mslow))
	{
		ok($ns->poll_query_until('postgres',
				"SELECT health = 'held' AND last_error_class = 'timeout' FROM tide.relay_pipeline_status
				  WHERE pipeline = '$p'"),
			"$p: the batch ends at its timeout_ms, class timeout, the pipeline held");
		like($ns->safe_psql('postgres', "SELECT error FROM tide.relay_attempts WHERE pipeline_id = '$p' ORDER BY attempted_at LIMIT 1"),
			qr/host name was not looked up within the batch's timeout_ms/, "$p: the error says the lookup had not ended");
	}
	is($ns->safe_psql('postgres', "SELECT count(*) FROM tide.relay_dlq"), '0', 'nothing is dead-lettered');

	$ns->stop('immediate');
	open($fh, '<', $name_server_pid) and kill 'KILL', (<$fh> =~ /(\d+)/);
}

$redis->stop;
done_testing();
