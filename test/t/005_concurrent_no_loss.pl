# Under concurrent publishers (with transactions of random length, some of
# them rolled back) and concurrent consumers of two groups, every committed
# message reaches every group, none is skipped and none from a rolled-back
# transaction appears. Bounded: a few seconds of pgbench.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use IPC::Run;

my $node = tide_node('concurrent', "max_connections = 40\nfsync = off");
$node->safe_psql('postgres', q{
	SELECT tide.outbox_create('orders', 24, 1000000);
	SELECT tide.outbox_create('noise', 24, 1000000);
	SELECT tide.create_consumer_group('g1', 'orders');
	SELECT tide.create_consumer_group('g2', 'orders');
	CREATE TABLE received (group_name text, consumer text, id bigint);
	-- What a consumer does: poll, record, acknowledge.
	CREATE FUNCTION consume(g text, c text) RETURNS int LANGUAGE plpgsql AS $$
	DECLARE
		n int;
		last_id bigint;
	BEGIN
		INSERT INTO received SELECT g, c, p.id FROM tide.poll_outbox(g, c, 50) p;
		GET DIAGNOSTICS n = ROW_COUNT;
		IF n > 0 THEN
			SELECT max(r.id) INTO last_id FROM received r WHERE r.group_name = g AND r.consumer = c;
			PERFORM tide.commit_offset(g, c, last_id);
		END IF;
		RETURN n;
	END $$;
});

my $dir = PostgreSQL::Test::Utils::tempdir;
my %scripts = (
	'publish.sql' => q{
\set n random(1, 3)
\set pause random(0, 20)
\set fate random(1, 10)
BEGIN;
SELECT tide.outbox_publish('orders', jsonb_build_object('client', :client_id, 'fate', :fate));
SELECT pg_sleep(:pause / 1000.0);
SELECT tide.outbox_publish_batch('orders', ARRAY(SELECT jsonb_build_object('client', :client_id, 'fate', :fate) FROM generate_series(1, :n)));
SELECT tide.outbox_publish('noise', '{}');
\if :fate = 1
ROLLBACK;
\else
COMMIT;
\endif
},
	'consume_g1.sql' => q{
\set c random(1, 3)
SELECT consume('g1', 'c' || :c);
},
	'consume_g2.sql' => q{
\set c random(1, 2)
SELECT consume('g2', 'c' || :c);
});
foreach my $name (keys %scripts)
{
	open my $fh, '>', "$dir/$name" or die $!;
	print $fh $scripts{$name};
	close $fh;
}

my @connect = ('-h', $node->host, '-p', $node->port, 'postgres');
my @runs;
foreach my $job (['publish.sql', 6], ['consume_g1.sql', 3], ['consume_g2.sql', 2])
{
	my ($script, $clients) = @$job;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ 'pgbench', '-n', '-T', '6', '-c', $clients, '-f', "$dir/$script", @connect ],
		'>', \$out, '2>', \$err);
	push @runs, [ $script, $h, \$out, \$err ];
}
foreach my $run (@runs)
{
	my ($script, $h, $out, $err) = @$run;
	$h->finish;
	is($h->result(0), 0, "pgbench $script ran") or diag($$err);
	my ($tx) = $$out =~ /number of transactions actually processed: (\d+)/;
	note("$script: $tx transactions");
}

# Drain both groups after the publishers stopped.
foreach my $g ('g1', 'g2')
{
	$node->safe_psql('postgres', qq{
		DO \$\$ BEGIN
			FOR i IN 1 .. 10000 LOOP
				EXIT WHEN consume('$g', 'drain') = 0 AND consume('$g', 'c1') = 0
					AND consume('$g', 'c2') = 0 AND consume('$g', 'c3') = 0;
			END LOOP;
		END \$\$;
	});
}

my $published = $node->safe_psql('postgres', q{SELECT count(*) FROM tide.tide_outbox_messages WHERE outbox_name = 'orders'});
cmp_ok($published, '>', 100, "publishers committed $published messages");
is($node->safe_psql('postgres', q{SELECT count(*) FROM tide.tide_outbox_messages WHERE (payload->>'fate')::int = 1}),
	'0', 'no message of a rolled-back transaction exists');

foreach my $g ('g1', 'g2')
{
	my $missing = $node->safe_psql('postgres', qq{
		SELECT count(*) FROM tide.tide_outbox_messages m
		 WHERE m.outbox_name = 'orders'
		   AND NOT EXISTS (SELECT 1 FROM received r WHERE r.group_name = '$g' AND r.id = m.id)});
	is($missing, '0', "group $g received every committed message");
	my $foreign = $node->safe_psql('postgres', qq{
		SELECT count(*) FROM received r
		 WHERE r.group_name = '$g'
		   AND NOT EXISTS (SELECT 1 FROM tide.tide_outbox_messages m WHERE m.id = r.id AND m.outbox_name = 'orders')});
	is($foreign, '0', "group $g received nothing that was not published to its outbox");
	my $twice = $node->safe_psql('postgres', qq{
		SELECT count(*) FROM (SELECT id FROM received WHERE group_name = '$g' GROUP BY id HAVING count(*) > 1) d});
	is($twice, '0', "group $g: no message leased to two consumers (no lease expired in this run)");
	is($node->safe_psql('postgres', qq{SELECT pending FROM tide.consumer_lag WHERE group_name = '$g'}),
		'0', "group $g has nothing pending");
}

$node->stop;
done_testing();
