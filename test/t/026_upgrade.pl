# ALTER EXTENSION pg_tide UPDATE from the released 0.1.0 to the current
# version, with data in every table:
#  - while the catalog is 0.1.0, the relay worker (this library) waits with
#    one LOG line naming ALTER EXTENSION pg_tide UPDATE and delivers nothing;
#  - after the update the updated database's extension equals a fresh
#    install: pg_dump of its objects (--binary-upgrade, which dumps an
#    extension's members; oids and xids left out), and for every function
#    its ACL, SECURITY DEFINER and configuration (search_path), and every
#    table's and sequence's ACL;
#  - every row of every table is still there, and the worker delivers;
#  - the pg_regress suite passes on a database that was updated from 0.1.0.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use File::Basename qw(basename);
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use Time::HiRes qw(time usleep);

my $root = "$FindBin::Bin/../..";
my $current = (slurp_file("$root/pg_tide.control") =~ /^default_version = '([^']+)'/m)[0];
my $node = tide_node('upgrade', "pg_tide.relay_naptime_ms = 200\nmax_prepared_transactions = 10\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
chmod 0777, $dir;

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q); }

is(sql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'pg_tide'"), $current,
	"a fresh install is version $current");

# The same data in a database of each version: the API as an application
# and an operator use it, and rows written where the relay would write
# them (retry queue, dead letters, attempts, health, inbox pipelines).
sub populate
{
	my ($db) = @_;
	sql($db, q{
		CREATE SCHEMA app;
		SELECT tide.outbox_create('orders');
		SELECT tide.outbox_create('events', 24, 500);
		SELECT tide.outbox_grant_publish('orders', 'upgrade_app');
		SELECT tide.outbox_grant_consume('orders', 'upgrade_app');
		SELECT tide.outbox_publish('orders', jsonb_build_object('n', g), '{"type": "order.paid"}')
		  FROM generate_series(1, 20) g;
		SELECT tide.outbox_publish('events', '{"e": 1}');
		SELECT tide.create_consumer_group('billing', 'orders');
		SELECT count(*) FROM tide.poll_outbox('billing', 'c1', 5, 3600);
		SELECT tide.commit_offset('billing', 'c1', (SELECT max(id) FROM tide.poll_outbox('billing', 'c1', 5, 3600)));
		SELECT count(*) FROM tide.poll_outbox('billing', 'c2', 3, 3600);
		SELECT tide.inbox_create('payments', 'app', 1);
		SELECT tide.inbox_receive('payments', 'evt-1', '{"amount": 1}');
		SELECT tide.inbox_receive('payments', 'evt-2', '{"amount": 2}');
		SELECT tide.inbox_receive('payments', 'evt-3', '{"amount": 3}');
		SELECT count(*) FROM tide.inbox_claim('payments', 2);
		SELECT tide.inbox_mark_processed('payments', 'evt-1');
		SELECT tide.inbox_mark_failed('payments', 'evt-2', 'handler failed');
		-- a reverse pipeline's row as 0.1.0 took it, unchecked: a later
		-- version's trigger refuses it, so it is written as a restore would
		SET session_replication_role = replica;
		INSERT INTO tide.relay_inbox_config (name, config) VALUES ('from_broker', '{"inbox": "payments"}');
		RESET session_replication_role;
		INSERT INTO tide.relay_retry_queue (pipeline_id, outbox_name, message_id, payload, created_at,
		                                    attempts, next_attempt_at, last_status, last_error_class, last_error)
		VALUES ('to_file', 'orders', 2, '{"n": 2}', now(), 1, now() + interval '1 day', 503, 'http_5xx', 'HTTP status 503');
		INSERT INTO tide.relay_dlq (pipeline_id, outbox_name, message_id, payload, created_at, attempts, reason,
		                            last_status, last_error_class, last_error, first_failed_at)
		VALUES ('to_file', 'orders', 3, '{"n": 3}', now(), 1, 'permanent', 400, 'http_4xx', 'HTTP status 400', now());
		INSERT INTO tide.relay_attempts (pipeline_id, outbox_name, message_id, attempt, status, response_code)
		VALUES ('to_file', 'orders', 3, 1, 'failed', 400);
		INSERT INTO tide.relay_pipeline_health (pipeline_id, consecutive_failures) VALUES ('to_file', 1);
		INSERT INTO tide.relay_consumer_offsets (relay_group_id, pipeline_id, outbox_name, last_change_id)
		VALUES ('hook_group', 'hook', 'events', 0);
	});
	sql($db, "SELECT tide.relay_set_outbox('to_file', 'orders', 'to_file',
		  jsonb_build_object('sink_type', 'file', 'path', '$dir/$db.jsonl'))");
	# Set and disabled in one transaction: enabled for a moment, it would
	# send the events outbox's message to example.com (an attempt logged in
	# one database and not the other).
	sql($db, "BEGIN;
		SELECT tide.relay_set_outbox('hook', 'events', 'hook_group',
		  '{\"sink_type\": \"webhook\", \"url\": \"https://example.com/hook\"}');
		SELECT tide.relay_disable('hook');
		COMMIT");
}

# Rows and a digest of every table of the extension and of the inbox, over
# the columns of $columns (table => column list; every column when not
# given, so that the columns an update adds do not change the digest);
# returns the states and the columns used.
sub table_states
{
	my ($db, $columns) = @_;
	my @tables = split /\n/, sql($db, q{
		SELECT c.oid::regclass FROM pg_class c
		 WHERE c.relnamespace IN ('tide'::regnamespace, 'app'::regnamespace) AND c.relkind = 'r'
		 ORDER BY 1::text});
	my (%state, %cols);
	for my $t (@tables)
	{
		$cols{$t} = $columns ? $columns->{$t} : sql($db, "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum)
		                      FROM pg_attribute WHERE attrelid = '$t'::regclass AND attnum > 0 AND NOT attisdropped");
		$state{$t} = sql($db, "SELECT count(*) || ' ' || coalesce(md5(string_agg(ROW($cols{$t})::text, ',' ORDER BY ROW($cols{$t})::text)), '')
		                         FROM $t t");
	}
	return (\%state, \%cols);
}

# The extension's objects as pg_dump --binary-upgrade shows them (it dumps
# an extension's members), without oids, xids and comments.
sub schema_dump
{
	my ($db) = @_;
	my ($out, $err) = ('', '');
	# The message table's child tables are made by the relay worker as ids
	# are handed out (src/partitions.c): like rows, they are not schema.
	IPC::Run::run([ 'pg_dump', '--schema-only', '--binary-upgrade',
			'--exclude-table=tide.tide_outbox_messages_[0-9]*', '-d', $node->connstr($db) ],
		'>', \$out, '2>', \$err) or die "pg_dump $db: $err";
	# A sequence's value is data (its table's rows are compared above), not schema.
	return join("\n", grep { !/binary_upgrade|^\\(un)?restrict|^--|^UPDATE pg_catalog\.pg_class|^SET relfrozenxid|^WHERE oid = |^SELECT pg_catalog\.setval|^$/ }
		  split /\n/, $out) . "\n";
}

# Each function's ACL, SECURITY DEFINER and settings; each relation's ACL.
sub privileges
{
	my ($db) = @_;
	return sql($db, q{
		SELECT p.oid::regprocedure || ' acl=' || coalesce(p.proacl::text, 'default')
		       || ' secdef=' || p.prosecdef || ' config=' || coalesce(p.proconfig::text, '')
		       || ' body=' || md5(p.prosrc)
		  FROM pg_proc p WHERE p.pronamespace = 'tide'::regnamespace
		UNION ALL
		SELECT c.oid::regclass || ' ' || c.relkind::text || ' acl=' || coalesce(c.relacl::text, 'default')
		  FROM pg_class c WHERE c.relnamespace = 'tide'::regnamespace
		   AND c.relname !~ '^tide_outbox_messages_[0-9]'
		ORDER BY 1});
}

# The fresh database, populated at the current version.
$node->safe_psql('postgres', 'CREATE ROLE upgrade_app LOGIN');
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
sql('fresh', 'CREATE EXTENSION pg_tide');
populate('fresh');

# The old database: 0.1.0, populated, then updated.
$node->safe_psql('postgres', 'CREATE DATABASE upgraded');
sql('upgraded', "CREATE EXTENSION pg_tide VERSION '0.1.0'");
populate('upgraded');
my ($before, $columns_before) = table_states('upgraded');
my @empty = grep { $before->{$_} =~ /^0 / } sort keys %$before;
is("@empty", '', 'every table has rows before the update');
ok(keys %$before >= 16, 'the tables looked at: ' . scalar(keys %$before));

# The library waits for the update and says so once.
ok(wait_until(sub { slurp_file($node->logfile) =~ /relay worker for database "upgraded" waits: its pg_tide catalog is version 0\.1\.0, the library's is \Q$current\E/ }, 10),
	'the worker logs that the 0.1.0 catalog waits for the update');
like(slurp_file($node->logfile), qr/HINT:  Run ALTER EXTENSION pg_tide UPDATE in that database/,
	'with a hint naming ALTER EXTENSION pg_tide UPDATE');
ok(wait_until(sub { -s "$dir/fresh.jsonl" }, 10), 'the fresh database delivers meanwhile');
usleep(1_000_000);
ok(!-e "$dir/upgraded.jsonl", 'the 0.1.0 database delivers nothing before the update');
my $waits = () = slurp_file($node->logfile) =~ /database "upgraded" waits/g;
is($waits, 1, 'the wait is logged once');

# The relay is switched off for the update, so that no worker writes while
# the rows are compared.
$node->append_conf('postgresql.conf', "pg_tide.relay_enabled = off\n");
$node->reload;
ok(wait_until(sub { sql('postgres', 'SELECT count(*) FROM tide.relay_workers()') == 0 }, 10),
	'the relay is off for the update');
sql('upgraded', 'ALTER EXTENSION pg_tide UPDATE');
is(sql('upgraded', "SELECT extversion FROM pg_extension WHERE extname = 'pg_tide'"), $current,
	"updated to $current");
my ($after) = table_states('upgraded', $columns_before);
for my $t (sort keys %$before)
{
	is($after->{$t}, $before->{$t}, "$t: every row kept");
}
# The columns 0.2.0 adds to rows that were there: no hold, no turn error.
is(sql('upgraded', q{SELECT string_agg(concat_ws(' ', pipeline_id, held_since, held_until, held_reason,
		turn_error, turn_error_since, turn_errors), ',') FROM tide.relay_pipeline_health}),
	'to_file 0', 'relay_pipeline_health: the new columns of an old row say no hold and no error');
# Every outbox keeps its inline_threshold, the 0.1.0 default (10000)
# included; only a new outbox has none unless given one.
is(sql('upgraded', q{SELECT string_agg(outbox_name || ' ' || coalesce(inline_threshold::text, 'none') || ' ' || backpressure_level, ','
		ORDER BY outbox_name) FROM tide.tide_outbox_config}),
	'events 500 0,orders 10000 0', 'tide_outbox_config: every outbox keeps its inline_threshold');
is(sql('fresh', q{SELECT string_agg(outbox_name || ' ' || coalesce(inline_threshold::text, 'none'), ','
		ORDER BY outbox_name) FROM tide.tide_outbox_config}),
	'events 500,orders none', 'a fresh install: no inline_threshold unless one is given');
sql('upgraded', "SELECT tide.outbox_create('after_update')");
is(sql('upgraded', "SELECT coalesce(inline_threshold::text, 'none') FROM tide.tide_outbox_config WHERE outbox_name = 'after_update'"),
	'none', 'an outbox created after the update has no inline_threshold either');
sql('upgraded', "SELECT tide.outbox_drop('after_update')");
# An old pipeline's owner is the extension's owner, whose rights it keeps.
is(sql('upgraded', q{SELECT string_agg(c.name || ' ' || (c.owner = r.rolname), ',' ORDER BY c.name)
		FROM tide.relay_outbox_config c, pg_extension e JOIN pg_roles r ON r.oid = e.extowner
	   WHERE e.extname = 'pg_tide'}),
	'hook true,to_file true', 'relay_outbox_config: an old pipeline is owned by the extension\'s owner');
# An old reverse pipeline is owned likewise; an old offset has no source position.
is(sql('upgraded', q{SELECT string_agg(c.name || ' ' || (c.owner = r.rolname), ',' ORDER BY c.name)
		FROM tide.relay_inbox_config c, pg_extension e JOIN pg_roles r ON r.oid = e.extowner
	   WHERE e.extname = 'pg_tide'}),
	'from_broker true', 'relay_inbox_config: an old pipeline is owned by the extension\'s owner');
is(sql('upgraded', q{SELECT string_agg(pipeline_id || ' ' || (source_position IS NULL), ',')
		FROM tide.relay_consumer_offsets}),
	'hook true', 'relay_consumer_offsets: an old offset has no source position');
# The schema: the updated extension is a fresh install.
is(schema_dump('upgraded'), schema_dump('fresh'),
	'pg_dump of the updated database equals that of a fresh install');
is(privileges('upgraded'), privileges('fresh'),
	'every function\'s ACL, SECURITY DEFINER, search_path and body, and every relation\'s ACL, as fresh');

# The relay on again only now, after the comparisons.
$node->append_conf('postgresql.conf', "pg_tide.relay_enabled = on\n");
$node->reload;

# The worker delivers after the update, everything committed before it.
ok(wait_until(sub { -e "$dir/upgraded.jsonl" && (() = slurp_file("$dir/upgraded.jsonl") =~ /\n/g) >= 20 }, 20),
	'after the update the worker delivers the 20 messages published before it');

# The 0.1.0 messages stay in the parent table; the worker makes child tables,
# and a message published now goes into one.
ok(wait_until(sub { sql('upgraded', 'SELECT count(*) FROM tide.tide_outbox_partitions') > 0 }, 20),
	'the worker makes child tables of tide_outbox_messages in the updated database');
is(sql('upgraded', "SELECT tide.outbox_publish('orders', '{\"after\": true}') IS NOT NULL;
		SELECT m.tableoid::regclass FROM tide.tide_outbox_messages m WHERE m.payload ? 'after'"),
	"t\n" . sql('upgraded', 'SELECT table_name::regclass FROM (SELECT \'tide.\' || p.table_name AS table_name
		FROM tide.tide_outbox_partitions p ORDER BY p.first_id LIMIT 1) x'),
	'a message published after the update goes into the first child table');
ok(sql('upgraded', 'SELECT count(*) FROM ONLY tide.tide_outbox_messages') > 0,
	'the messages of 0.1.0 are still in the parent table');

# The pg_regress suite on a database updated from 0.1.0, with the relay off
# as in the suite's own configuration.
$node->append_conf('postgresql.conf', "pg_tide.relay_enabled = off\n");
$node->reload;
$node->safe_psql('postgres', 'CREATE DATABASE contrib_regression');
sql('contrib_regression', "CREATE EXTENSION pg_tide VERSION '0.1.0'; ALTER EXTENSION pg_tide UPDATE");
for my $s ("lc_messages TO 'C'", "lc_monetary TO 'C'", "lc_numeric TO 'C'", "lc_time TO 'C'",
	"bytea_output TO 'hex'", "timezone_abbreviations TO 'Default'")
{
	sql('postgres', "ALTER DATABASE contrib_regression SET $s");
}
# catalog drops and creates the extension: it runs last.
my @tests = sort map { basename($_, '.sql') } glob("$root/test/sql/*.sql");
@tests = ((grep { $_ ne 'catalog' } @tests), 'catalog');
my $outdir = "$dir/regress";
mkdir $outdir;
my ($out, $err) = ('', '');
my $ok = IPC::Run::run([ $ENV{PG_REGRESS}, '--use-existing', '--dbname=contrib_regression',
	'--inputdir', "$root/test", '--outputdir', $outdir, '--bindir', '',
	'--host', $node->host, '--port', $node->port, @tests ], '>', \$out, '2>', \$err);
ok($ok, 'the pg_regress suite passes on a database updated from 0.1.0: ' . scalar(@tests) . ' tests')
  or diag($out . $err . (-e "$outdir/regression.diffs" ? slurp_file("$outdir/regression.diffs") : ''));

$node->stop;
done_testing();
