# The batches that finish in the same turn of a worker's loop are recorded
# in one transaction, each pipeline's record in a subtransaction of its own
# (relay/xact.c), a transaction per 64 records. A record that fails with an
# ERROR for one pipeline must lose nothing of the others recorded with it:
# 71 file pipelines of one outbox take the same messages in the same turn
# (more than 64: the group commits on the way); a trigger on
# tide.relay_attempts refuses the rows of one of them ('bad'), so its
# batch's record fails. The 70 others must have recorded their batches
# once: every message in their files exactly once (a lost record would send
# its batch again), their offsets at the last message, one attempt row per
# message. 'bad' records its batch again message by message
# (relay/record_each.c): each message whose record fails is dead-lettered
# with class record and its offset moves on, so it is not held and sends
# nothing twice; once the trigger is gone it records as before.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use JSON::PP;

my $node = tide_node('records_together', "pg_tide.relay_naptime_ms = 200\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;
my @good = map { sprintf('good%02d', $_) } 1 .. 70;
my @all = (@good, 'bad');

sub sql { return $node->safe_psql('postgres', $_[0]) }

# message id => how many times it is in the pipeline's file.
sub delivered
{
	my ($name) = @_;
	my %ids;
	my $f = "$dir/$name.jsonl";
	return \%ids unless -e $f;
	open(my $fh, '<', $f) or die "cannot open $f: $!";
	while (my $line = <$fh>)
	{
		my $m = eval { $json->decode($line) };
		$ids{ $m->{message_id} }++ if $m;
	}
	close $fh;
	return \%ids;
}

# The pipeline's durable offset, or 0.
sub offset
{
	my ($name) = @_;
	return sql("SELECT coalesce(max(last_change_id), 0) FROM tide.relay_consumer_offsets
				 WHERE pipeline_id = '$name'");
}

sql("SELECT tide.outbox_create('orders')");
sql(qq{
	CREATE FUNCTION public.refuse_bad() RETURNS trigger LANGUAGE plpgsql AS \$\$
	BEGIN
		IF NEW.pipeline_id = 'bad' THEN
			RAISE EXCEPTION 'the test refuses the attempts of pipeline bad';
		END IF;
		RETURN NEW;
	END \$\$;
	CREATE TRIGGER refuse_bad BEFORE INSERT ON tide.relay_attempts
		FOR EACH ROW EXECUTE FUNCTION public.refuse_bad();
});
# Disabled while they are made, then enabled in one commit: their first
# batches are leased in the same pass and finish in the same turn.
sql("BEGIN; "
	  . join('',
		map {
			"SELECT tide.relay_set_outbox('$_', 'orders', '$_',
			   jsonb_build_object('sink_type', 'file', 'path', '$dir/$_.jsonl', 'batch_size', 100));
			 SELECT tide.relay_disable('$_');"
		} @all)
	  . " COMMIT;");
my @ids = split /\n/,
  sql("SELECT tide.outbox_publish('orders', jsonb_build_object('n', g)) FROM generate_series(1, 40) g");
my $last = $ids[-1];
sql("BEGIN; " . join('', map { "SELECT tide.relay_enable('$_');" } @all) . " COMMIT;");

ok( defined wait_until(sub { !grep { offset($_) < $last } @good }, 60),
	'the 70 good pipelines recorded up to the last message');
ok(defined wait_until(sub { offset('bad') >= $last }, 60),
	'bad\'s offset moved over the messages whose records failed');
is(sql("SELECT count(*) || ' ' || count(DISTINCT message_id) || ' ' || string_agg(DISTINCT last_error_class, ',')
		FROM tide.relay_dlq WHERE pipeline_id = 'bad'"),
	scalar(@ids) . ' ' . scalar(@ids) . ' record', 'each of bad\'s messages is dead-lettered once, class record');
my (@missing, @twice);
for my $p (@good)
{
	my $got = delivered($p);
	push @missing, $p if grep { !$got->{$_} } @ids;
	push @twice, $p if grep { $got->{$_} > 1 } @ids;
}
is(join(' ', @missing), '', 'every good pipeline has every message');
is(join(' ', @twice), '', 'no good pipeline has a message twice, though bad\'s records failed beside theirs');
is( sql("SELECT count(*) FROM (SELECT pipeline_id FROM tide.relay_attempts
		  WHERE pipeline_id LIKE 'good%' AND status = 'success'
		  GROUP BY pipeline_id
		 HAVING count(*) = " . scalar(@ids) . " AND count(DISTINCT message_id) = " . scalar(@ids) . ") x"),
	scalar(@good), 'each good pipeline logged one attempt per message');
like(
	PostgreSQL::Test::Utils::slurp_file($node->logfile),
	qr/pipeline "bad" could not record the outcome of message \d+ of outbox "orders": .*the test refuses/,
	'the log names the trigger\'s error');
my $got = delivered('bad');
is(scalar(grep { !$got->{$_} } @ids) . ' ' . scalar(grep { $got->{$_} > 1 } @ids), '0 0',
	'bad has every message once: its batch was not sent again');

sql('DROP TRIGGER refuse_bad ON tide.relay_attempts');
my $next = sql("SELECT tide.outbox_publish('orders', '{\"n\": 41}')");
ok(defined wait_until(sub { offset('bad') >= $next }, 60), 'bad records as before once the trigger is gone');
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'bad'"), scalar(@ids), 'and dead-letters nothing more');
@twice = grep { my $g = delivered($_); grep { $g->{$_} > 1 } @ids } @good;
is(join(' ', @twice), '', 'still no good pipeline has a message twice');

done_testing();
