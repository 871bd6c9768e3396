# The relay delivers end to end to a file sink: every committed message
# appears in the file at least once, nothing that was rolled back appears,
# the pipeline's offsets follow, a commit is delivered at once (wake on
# commit, with an hour's naptime), kill -9 of the relay worker in the middle
# of a backlog loses nothing and repeats at most a few batches, and a file that
# cannot be opened is a failed delivery, retried, not a dead worker.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use JSON::PP;
use Time::HiRes qw(time usleep);

my $node = tide_node('file_sink',
	"pg_tide.relay_naptime_ms = 200\nrestart_after_crash = on\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $path = "$dir/orders.jsonl";
my $json = JSON::PP->new;

# Every id published and committed, and every id that was rolled back.
my %published;
my %rolled_back;

# Sets the file pipeline "to_file" of outbox orders.
sub set_pipeline
{
	my ($file, $batch_size) = @_;
	$node->safe_psql('postgres',
		"SELECT tide.relay_set_outbox('to_file', 'orders', 'to_file',
		   jsonb_build_object('sink_type', 'file', 'path', '$file', 'batch_size', $batch_size))");
}

# Publishes n messages in one transaction; returns their ids.
sub publish
{
	my ($n) = @_;
	my @ids = split /\n/, $node->safe_psql('postgres',
		"SELECT tide.outbox_publish('orders', jsonb_build_object('n', g), '{\"h\": \"v\"}')
		   FROM generate_series(1, $n) g");
	$published{$_} = 1 for @ids;
	return @ids;
}

# Reads the files: a hash id => times delivered, and the number of lines
# that are not a well-formed message line (torn by a crash).
sub read_files
{
	my %seen;
	my $bad = 0;
	for my $f (@_)
	{
		next unless -e $f;
		open(my $fh, '<', $f) or die "cannot open $f: $!";
		while (my $line = <$fh>)
		{
			my $m = eval { $json->decode($line) };
			if (!$m || !defined $m->{message_id}
				|| $m->{id} ne "outbox_orders:$m->{message_id}"
				|| $m->{outbox} ne 'orders')
			{
				$bad++;
				next;
			}
			$seen{ $m->{message_id} }++;
		}
		close $fh;
	}
	return (\%seen, $bad);
}

# Waits (bounded) until every given id is in the files; returns the time taken.
sub wait_for_ids
{
	my ($ids, $timeout, @files) = @_;
	my $start = time();
	while (time() - $start < $timeout)
	{
		my ($seen) = read_files(@files);
		return time() - $start unless grep { !$seen->{$_} } @$ids;
		usleep(5_000);
	}
	return undef;
}

$node->safe_psql('postgres', "SELECT tide.outbox_create('orders')");
set_pipeline($path, 100);

# 1, 100 and 1000 messages, and one rolled back.
my @all;
for my $n (1, 100, 1000)
{
	push @all, publish($n);
	my $rb = $node->safe_psql('postgres',
		"BEGIN; SELECT tide.outbox_publish('orders', '{\"rolled\": \"back\"}'); ROLLBACK;");
	$rolled_back{$rb} = 1 if $rb =~ /^\d+$/;
	ok(defined wait_for_ids(\@all, 20, $path), "all of $n published messages reach the file");
}

my ($seen, $bad) = read_files($path);
is($bad, 0, 'every line is a message line with id outbox_orders:<message_id>');
is(scalar(grep { !$published{$_} } keys %$seen), 0,
	'no id in the file that was not published and committed');
is(scalar(grep { $seen->{$_} } keys %rolled_back), 0, 'rolled-back messages are not delivered');
is(scalar(keys %rolled_back), 3, 'three rolled-back ids were noted');

my $last = (sort { $b <=> $a } @all)[0];
ok($node->poll_query_until('postgres',
		"SELECT committed_offset = $last FROM tide.consumer_lag WHERE group_name = 'to_file'"),
	'the consumer group position is the last id');
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $last FROM tide.relay_consumer_offsets WHERE pipeline_id = 'to_file'"),
	'relay_consumer_offsets.last_change_id is the last id');

# Wake on commit: with an hour's naptime only a commit can wake the worker.
$node->safe_psql('postgres', "ALTER SYSTEM SET pg_tide.relay_naptime_ms = '1h'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
usleep(1_000_000);
my $size0 = -s $path;
my $t0 = time();
my ($one) = publish(1);
my $latency;
while (time() - $t0 < 15)
{
	if (-s $path > $size0)
	{
		$latency = time() - $t0;
		last;
	}
	usleep(1_000);
}
ok(defined wait_for_ids([$one], 1, $path), 'the line that appeared is the new message');
ok(defined $latency && $latency < 10, 'a single commit reaches the file within 10 s with an hour\'s naptime');
my $t1 = time();
$node->safe_psql('postgres', 'SELECT 1');
note(sprintf('commit-to-file latency (from before psql starts): %.1f ms; '
	  . 'a psql run of SELECT 1 alone takes %.1f ms',
		(defined $latency ? $latency : 999) * 1000, (time() - $t1) * 1000));
my ($lines) = read_files($path);
my $msg = do
{
	open(my $fh, '<', $path) or die;
	my ($l) = grep { /"message_id": $one,/ } <$fh>;
	$json->decode($l);
};
is_deeply([ $msg->{payload}, $msg->{headers} ], [ { n => 1 }, { h => 'v' } ],
	'the line carries payload and headers');
like($msg->{created_at}, qr/^\d{4}-\d\d-\d\dT/, 'the line carries created_at');
push @all, $one;

# The payload, headers and created_at of a line are byte for byte the text
# PostgreSQL gives them (payload::text, headers::text,
# to_json(created_at)::text): strings that need every escape, unicode,
# numbers of every form, nesting, empty containers, null headers.
my @texts = (
	'{"s": "quote \\" backslash \\\\ slash / tab \\t nl \\n cr \\r bs \\b ff \\f"}',
	'{"ctl": "\\u0001\\u001f\\u007f", "uni": "é中😀", "empty": ""}',
	'{"n": [0, -0, 1.50, -2.5e-3, 1e100, 12345678901234567890, 0.000001, 100.0]}',
	'{"deep": {"a": [[], {}, [{"b": null}], true, false], "c": {"d": {"e": [1, [2, [3]]]}}}}',
	'{}',
	'{"k with space": 1, "ü": {"x": "y"}}');
my @text_ids;
for my $i (0 .. $#texts)
{
	my $headers = $i % 2 ? "NULL" : "'{\"trace\": \"t\\\\n$i\", \"list\": [1, \"two\"]}'";
	push @text_ids, $node->safe_psql('postgres',
		"SELECT tide.outbox_publish('orders', '$texts[$i]'::jsonb, $headers)");
}
$published{$_} = 1 for @text_ids;
ok(defined wait_for_ids(\@text_ids, 15, $path), 'the messages of every JSON form arrive');
{
	open(my $fh, '<:raw', $path) or die;
	my @lines = <$fh>;
	for my $id (@text_ids)
	{
		my $want = $node->safe_psql('postgres',
			"SELECT payload::text || E'\\x01' || coalesce(headers::text, 'null') || E'\\x01'
			        || pg_catalog.to_json(created_at)::text
			   FROM tide.tide_outbox_messages WHERE id = $id");
		my ($payload, $headers, $created_at) = split /\x01/, $want;
		my ($line) = grep { /"message_id": $id,/ } @lines;
		ok(defined $line && index($line, "\"payload\": $payload, \"headers\": $headers, ") >= 0,
			"message $id: payload and headers are the text of their jsonb");
		ok(defined $line && index($line, "\"created_at\": $created_at") >= 0,
			"message $id: created_at is to_json's text");
	}
}
push @all, @text_ids;

# A crash of the relay worker in the middle of a backlog: small batches, so
# the backlog takes a while; kill -9 once part of it is written. The
# postmaster then restarts every process and recovers, as after any crash.
$node->safe_psql('postgres', "ALTER SYSTEM SET pg_tide.relay_naptime_ms = '200'");
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
my $batch = 10;
set_pipeline($path, $batch);
my ($before) = read_files($path);
my $before_count = 0;
$before_count += $_ for values %$before;
my $worker = $node->safe_psql('postgres',
	"SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'");
my @backlog = publish(5000);
push @all, @backlog;
my $size_before = -s $path;
my $start = time();
while (time() - $start < 20)
{
	last if -s $path >= $size_before + 20_000;	# about 150 lines
	usleep(1_000);
}
kill 'KILL', $worker;
my ($at_kill) = read_files($path);
note(sprintf("relay worker killed with %d of 5000 backlog messages in the file",
		scalar(grep { $at_kill->{$_} } @backlog)));
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM tide.relay_workers() WHERE database = 'postgres' AND pid <> $worker"),
	'a new relay worker runs after the crash');
ok(defined wait_for_ids(\@all, 30, $path), 'after the crash every message is in the file');
($seen, $bad) = read_files($path);
my $dups = 0;
$dups += $seen->{$_} - 1 for grep { $seen->{$_} > 1 } @backlog;
note("duplicates after the crash: $dups (batch size $batch), torn lines: $bad");
cmp_ok($dups, '<=', 3 * $batch, 'duplicates are at most a few batches');
cmp_ok($bad, '<=', 1, 'at most one line torn by the crash');
is(scalar(grep { !$published{$_} } keys %$seen), 0,
	'still no id in the file that was not published and committed');

# A file that cannot be opened: logged, retried, the worker lives on; once
# the directory exists, delivery resumes.
my $missing = "$dir/later/orders.jsonl";
my $pid = $node->safe_psql('postgres',
	"SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'");
my $log_offset = -s $node->logfile;
set_pipeline($missing, 100);
my @later = publish(3);
usleep(1_500_000);
is($node->safe_psql('postgres',
		"SELECT pid FROM tide.relay_workers() WHERE database = 'postgres'"),
	$pid, 'the worker survives a file that cannot be opened');
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/could not open file "\Q$missing\E"/, 'the server log shows the error');
mkdir "$dir/later" or die "mkdir: $!";
ok(defined wait_for_ids(\@later, 10, $missing), 'delivery resumes once the directory exists');
($seen) = read_files($missing);
is(scalar(keys %$seen), 3, 'the new file holds just the three waiting messages');

$node->stop;
done_testing();
