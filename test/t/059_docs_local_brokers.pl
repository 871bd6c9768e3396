# docs/sinks/local.md runs as written: every ```sh block of it, in order, in
# one bash (set -e: a failing command fails the test), the way a reader
# types them into one shell at the top of the checkout, with psql reaching
# a node with pg_tide preloaded through PGHOST, PGPORT and PGDATABASE. Two
# kinds of substitution only: the page's directory /tmp/tide-brokers
# becomes a directory of the test, and each of the page's broker ports a
# free port (other tests may run brokers at the same time). The package
# line (sudo apt install ...) is not run: each package it names must be
# installed and listed in test/lib.sh, so a fresh machine gets it. Then:
#  - each broker's own client (kcat, the NATS tool, redis-cli, amqp-consume,
#    mosquitto_sub) printed the message the page published for it, and no
#    other broker's;
#  - the page's last block stopped every broker it started (each process
#    named by a pid file is gone) and deleted its pipelines.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node);
use PgTide::Docs qw(fenced_blocks);
use IPC::Run;
use Cwd qw(abs_path);

my $top = abs_path("$FindBin::Bin/../..");
my $page = "$top/docs/sinks/local.md";
my $base = '/tmp/tide-brokers';
# the page's ports: Redis, NATS, RabbitMQ's AMQP, epmd and distribution, MQTT
my @page_ports = (16379, 14222, 15682, 14369, 25682, 11883);
my %readers = (
	kafka => qr/\bkcat\b.*\s-C\s/,
	nats => qr/\bnats_tool\b.*\sdump\s/,
	redis => qr/\bredis-cli\b.*\bXREAD\b/,
	rabbitmq => qr/\bamqp-consume\b/,
	mqtt => qr/\bmosquitto_sub\b/);

# The ```sh blocks of the page, in order: [first line number, text].
my ($blocks, $closed) = fenced_blocks($page, 'sh');
my @blocks = @$blocks;
ok($closed, 'every ```sh block of the page is closed');
cmp_ok(scalar @blocks, '>=', 10, 'the page has its sh blocks (' . scalar(@blocks) . ')');
my $all = join '', map { $_->[1] } @blocks;
for my $port (@page_ports)
{
	like($all, qr/\b$port\b/, "the page uses port $port (substituted here)");
}
for my $broker (sort keys %readers)
{
	is(scalar(grep { $_->[1] =~ $readers{$broker} } @blocks), 1,
		"one block reads the $broker message back with the broker's client");
}

# The package line: not run, but every package it names is installed and
# in test/lib.sh's lists.
my @apt = $all =~ /^sudo apt(?:-get)? install (.*)$/mg;
is(scalar @apt, 1, 'the page names its Debian packages on one apt line');
my $lib = slurp_file("$top/test/lib.sh");
my ($listed) = $lib =~ /tide_broker_packages\(\)\s*\{(.*?)\n\}/s;
$listed //= '';
for my $pkg (map { split ' ' } @apt)
{
	next if $pkg =~ /^-/;
	my $status = `dpkg-query -W -f='\${Status}' $pkg 2>/dev/null`;
	like($status, qr/install ok installed/, "Debian package $pkg is installed");
	like($listed, qr/(?:^|\s)\Q$pkg\E(?:\s|$)/, "$pkg is in test/lib.sh's tide_broker_packages");
}

my $dir = PostgreSQL::Test::Utils::tempdir;
my $brokers = "$dir/brokers";
my %port_of = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } @page_ports;
mkdir "$dir/home";

my $node = tide_node('local_brokers', "pg_tide.relay_naptime_ms = 100\n");

# What the page starts, stopped by pid whatever happens (the page's own
# last block stops them when it gets there).
sub stop_leftovers
{
	for my $pidfile ("$brokers/nats.pid", "$brokers/redis.pid", "$brokers/mosquitto.pid",
		"$brokers/rabbitmq/pid")
	{
		next unless -s $pidfile;
		my ($pid) = slurp_file($pidfile) =~ /(\d+)/;
		next unless $pid && kill(0, $pid);
		kill 'TERM', $pid;
		for (1 .. 50) { last unless kill(0, $pid); select(undef, undef, undef, 0.1) }
		kill 'KILL', $pid if kill(0, $pid);
	}
	system("ERL_EPMD_PORT=$port_of{14369} ERL_EPMD_RELAXED_COMMAND_CHECK=1 epmd -kill >/dev/null 2>&1");
}
END
{
	local $?;
	stop_leftovers() if defined $brokers;
}

# The page as one script, each block opened by a marker on both outputs.
my $script = "set -eo pipefail\n";
for my $i (0 .. $#blocks)
{
	my ($lineno, $text) = @{ $blocks[$i] };
	$text = join "\n", grep { !/^sudo apt(?:-get)? install / } split /\n/, $text;
	$text =~ s/\Q$base\E/$brokers/g;
	$text =~ s/\b$_\b/$port_of{$_}/g for @page_ports;
	$script .= "echo '\@\@block $i line $lineno'; echo '\@\@block $i line $lineno' >&2\n$text\n";
}
$script .= "echo '\@\@end'\n";
PostgreSQL::Test::Utils::append_to_file("$dir/page.sh", $script);

local $ENV{PGHOST} = $node->host;
local $ENV{PGPORT} = $node->port;
local $ENV{PGDATABASE} = 'postgres';
local $ENV{HOME} = "$dir/home";    # RabbitMQ's Erlang cookie goes there
my ($out, $err) = ("$dir/page.out", "$dir/page.err");
chdir $top or die "could not chdir to $top: $!";
my $ran = eval {
	IPC::Run::run([ 'bash', "$dir/page.sh" ], '<', '/dev/null', '>', $out, '2>', $err,
		IPC::Run::timeout(240));
};
my $stdout = -f $out ? slurp_file($out) : '';
my $stderr = -f $err ? slurp_file($err) : '';
my ($last) = $stdout =~ /.*^\@\@(block \d+ line \d+|end)$/ms;
my $ran_all = $ran && $stdout =~ /^\@\@end$/m;
ok($ran_all, 'every sh block of the page ran')
  or diag("stopped in " . ($last // 'no block') . ($@ ? " ($@)" : '') . ":\n"
	  . substr($stderr, -4000));

# Each block's standard output, by block index.
my %block_out;
for my $part (split /^(?=\@\@block )/m, $stdout)
{
	$block_out{$1} = $part if $part =~ /^\@\@block (\d+) /;
}
for my $broker (sort keys %readers)
{
	my ($i) = grep { $blocks[$_][1] =~ $readers{$broker} } 0 .. $#blocks;
	my $got = defined $i ? $block_out{$i} // '' : '';
	like($got, qr/sent_to\\?"\s*:\s*\\?"\Q$broker\E\\?"/,
		"$broker: the broker's own client read the message the page published for it");
	my @others = grep { $_ ne $broker && $got =~ /sent_to\\?"\s*:\s*\\?"\Q$_\E\\?"/ } keys %readers;
	is("@others", '', "$broker: it read no other broker's message");
}

# The last block stopped what the page started (when the page got there).
for my $pidfile ("$brokers/nats.pid", "$brokers/redis.pid", "$brokers/mosquitto.pid",
	"$brokers/rabbitmq/pid")
{
	my ($pid) = -s $pidfile ? slurp_file($pidfile) =~ /(\d+)/ : ();
	ok($ran_all && (!$pid || PgTide::TestNode::wait_until(sub { !kill(0, $pid) }, 30, 100_000)),
		"the page stopped the broker of $pidfile");
}
is($node->safe_psql('postgres', 'SELECT count(*) FROM tide.relay_outbox_config'),
	'0', 'the page deleted its pipelines');

$node->stop;
done_testing();
