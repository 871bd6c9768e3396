# Many idle pipelines: the worker looks for work for all of them in one
# statement (relay/idle_look.c), and keeps the readings of unchanged
# pipelines. With an hour's naptime only a commit's wake-up can make a
# pipeline deliver, so a look that passed over a pipeline with a message
# would leave it undelivered for the whole test. 300 pipelines, one outbox
# and one file each; then messages committed one by one while the worker's
# looks run, each of which must reach its pipeline's file.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use JSON::PP;

my $pipelines = 300;
my $node = tide_node('idle_pipelines', "pg_tide.relay_naptime_ms = '1h'\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;

$node->safe_psql('postgres', qq{
	SELECT tide.outbox_create('o' || i) FROM generate_series(1, $pipelines) i;
	SELECT tide.relay_set_outbox('p' || i, 'o' || i, 'p' || i,
	         jsonb_build_object('sink_type', 'file', 'path', '$dir/o' || i || '.jsonl'))
	  FROM generate_series(1, $pipelines) i;
});

# The message ids in pipeline i's file.
sub delivered
{
	my ($i) = @_;
	my %ids;
	my $f = "$dir/o$i.jsonl";
	return \%ids unless -e $f;
	open(my $fh, '<', $f) or die "cannot open $f: $!";
	while (my $line = <$fh>)
	{
		my $m = eval { $json->decode($line) };
		$ids{ $m->{message_id} } = 1 if $m && $m->{outbox} eq "o$i";
	}
	close $fh;
	return \%ids;
}

# The worker serves all of them (its reading after the last change).
ok(defined wait_until(sub {
	$node->safe_psql('postgres', q{
		SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'pg_tide relay worker%'}) >= 1
	}, 30), 'a relay worker runs');
# Its first pass over the new pipelines (each looks at its retry queue
# then, on its own) is over: from now on idle pipelines look together.
sleep(3);

# One message to one pipeline among 300 idle ones reaches its file on commit.
my $id = $node->safe_psql('postgres', q{SELECT tide.outbox_publish('o150', '{"n": 1}')});
my $took = wait_until(sub { delivered(150)->{$id} }, 20);
ok(defined $took, 'a message to one of 300 idle pipelines is delivered on commit with an hour\'s naptime');
note(sprintf('commit to file: %.2f s', $took // -1));

# Messages committed one by one, 20 ms apart, to 60 pipelines in turn: the
# worker's looks run while they commit, and none may be passed over.
my %want;
my $script = '';
for my $k (1 .. 120)
{
	my $i = 1 + ($k * 7) % $pipelines;
	$script .= "SELECT $i AS pipeline, tide.outbox_publish('o$i', '{\"k\": $k}');\nSELECT pg_sleep(0.02);\n";
}
my $out = $node->safe_psql('postgres', $script);
for my $line (split /\n/, $out)
{
	next unless $line =~ /^(\d+)\|(\d+)$/;
	push @{ $want{$1} }, $2;
}
is(scalar(map { @$_ } values %want), 120, '120 messages published in their own transactions');
my $missing;
wait_until(sub {
	$missing = 0;
	for my $i (keys %want)
	{
		my $ids = delivered($i);
		$missing += grep { !$ids->{$_} } @{ $want{$i} };
	}
	return $missing == 0;
}, 30, 200_000);
is($missing, 0, 'every message committed while the looks ran reaches its pipeline\'s file');

# Nothing went to a pipeline that was not published to.
my $others = 0;
for my $i (1 .. $pipelines)
{
	next if $i == 150 || $want{$i};
	$others += scalar keys %{ delivered($i) };
}
is($others, 0, 'the idle pipelines delivered nothing');

$node->stop;
done_testing();
