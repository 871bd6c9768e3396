# The relay worker runs as the bootstrap superuser in databases that other
# roles own. None of them may make it run code of theirs:
#  1. a database owner's public.to_json(timestamptz), an exact match for
#     the lease's to_json(created_at), where pg_catalog has only
#     to_json(anyelement);
#  2. the same function in a schema named after the worker's user ("$user"
#     comes first in the default search_path), made by a role that only has
#     CREATE on the database;
#  3. with no pipeline at all, a database owner's operator
#     public.*(integer, interval), an exact match for the attempt log's
#     trim, which runs on the worker's first pass;
#  4. the owner's ALTER DATABASE ... SET search_path, role,
#     session_authorization, default_transaction_read_only and
#     statement_timeout, which the worker's connection applies: it must
#     still deliver, as the superuser, in pg_catalog's names.
# Each trap makes its owner superuser when it runs with superuser rights,
# and notes that it ran; the test fails if any role gains the privilege or
# any trap ran.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use Time::HiRes qw(time usleep);

my $node = tide_node('worker_privileges', "pg_tide.relay_naptime_ms = 200\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $worker_user = $node->safe_psql('postgres', 'SELECT current_user');

# The body of every trap: superuser rights make $role superuser, and the
# call is noted in public.trap_calls (which $role owns) either way.
sub trap_body
{
	my ($role) = @_;
	return "BEGIN
		INSERT INTO public.trap_calls VALUES (pg_catalog.current_setting('is_superuser'));
		IF pg_catalog.current_setting('is_superuser') = 'on' THEN
			EXECUTE 'ALTER ROLE $role SUPERUSER';
		END IF;
	END;";
}

# A database with pg_tide, owned by $owner, and a table for trap calls.
sub make_database
{
	my ($db, $owner) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db OWNER $owner");
	$node->safe_psql($db, 'CREATE EXTENSION pg_tide');
	$node->safe_psql($db, "CREATE TABLE public.trap_calls (su text); ALTER TABLE public.trap_calls OWNER TO $owner");
}

# Sets a file pipeline on outbox orders of $db and publishes one message.
sub pipeline_and_message
{
	my ($db, $file) = @_;
	$node->safe_psql($db, "SELECT tide.outbox_create('orders')");
	$node->safe_psql($db,
		"SELECT tide.relay_set_outbox('to_file', 'orders', 'to_file',
		   jsonb_build_object('sink_type', 'file', 'path', '$file'))");
	$node->safe_psql($db, "SELECT tide.outbox_publish('orders', '{\"n\": 1}')");
}

# Waits (bounded) until the file has a line; true when it has.
sub wait_for_file
{
	my ($file) = @_;
	my $deadline = time() + 30;
	while (time() < $deadline)
	{
		return 1 if -s $file;
		usleep(100_000);
	}
	return 0;
}

# Waits until the database's relay worker has made $n passes after now.
sub wait_for_passes
{
	my ($db, $n) = @_;
	my $sql = "SELECT coalesce(sum(passes), 0) FROM tide.relay_workers() WHERE database = '$db'";
	my $start = $node->safe_psql($db, $sql);
	my $deadline = time() + 30;
	while (time() < $deadline)
	{
		return 1 if $node->safe_psql($db, $sql) >= $start + $n;
		usleep(100_000);
	}
	return 0;
}

# Whether $role is superuser now, and how often a trap in $db ran.
sub is_superuser
{
	my ($role) = @_;
	return $node->safe_psql('postgres', "SELECT rolsuper FROM pg_roles WHERE rolname = '$role'");
}

sub trap_calls
{
	my ($db) = @_;
	return $node->safe_psql($db, 'SELECT count(*) FROM public.trap_calls');
}

$node->safe_psql('postgres', 'CREATE ROLE dbo LOGIN; CREATE ROLE creator LOGIN; CREATE ROLE owner3 LOGIN; CREATE ROLE owner4 LOGIN');

# 1. The owner's public.to_json(timestamptz).
make_database('attack1', 'dbo');
$node->safe_psql('attack1', "GRANT CREATE ON SCHEMA public TO dbo");
$node->safe_psql('attack1', "SET ROLE dbo;
	CREATE FUNCTION public.to_json(timestamptz) RETURNS json LANGUAGE plpgsql AS \$\$"
	  . trap_body('dbo') =~ s/END;$/RETURN pg_catalog.to_json(\$1::text); END;/r . "\$\$");
pipeline_and_message('attack1', "$dir/attack1.jsonl");
ok(wait_for_file("$dir/attack1.jsonl"), 'attack 1: the message was leased and delivered');
wait_for_passes('attack1', 2);
is(is_superuser('dbo'), 'f', 'attack 1: the database owner did not become superuser');
is(trap_calls('attack1'), '0', 'attack 1: the worker never called public.to_json');

# 2. A schema named after the worker's user, by a role with only CREATE.
make_database('attack2', $worker_user);
$node->safe_psql('attack2', "GRANT CREATE ON DATABASE attack2 TO creator;
	ALTER TABLE public.trap_calls OWNER TO creator");
$node->safe_psql('attack2', "SET ROLE creator;
	CREATE SCHEMA \"$worker_user\";
	CREATE FUNCTION \"$worker_user\".to_json(timestamptz) RETURNS json LANGUAGE plpgsql AS \$\$"
	  . trap_body('creator') =~ s/END;$/RETURN pg_catalog.to_json(\$1::text); END;/r . "\$\$");
pipeline_and_message('attack2', "$dir/attack2.jsonl");
ok(wait_for_file("$dir/attack2.jsonl"), 'attack 2: the message was leased and delivered');
wait_for_passes('attack2', 2);
is(is_superuser('creator'), 'f', 'attack 2: a role with CREATE on the database did not become superuser');
is(trap_calls('attack2'), '0', 'attack 2: the worker never called the "$user" schema\'s to_json');

# 3. No pipeline: the owner's *(integer, interval), before the worker starts.
$node->safe_psql('postgres', 'CREATE DATABASE attack3 OWNER owner3');
$node->safe_psql('attack3', "GRANT CREATE ON SCHEMA public TO owner3;
	CREATE TABLE public.trap_calls (su text); ALTER TABLE public.trap_calls OWNER TO owner3");
$node->safe_psql('attack3', "SET ROLE owner3;
	CREATE FUNCTION public.trap_times(integer, interval) RETURNS interval LANGUAGE plpgsql AS \$\$"
	  . trap_body('owner3') =~ s/END;$/RETURN \$2 OPERATOR(pg_catalog.*) \$1::float8; END;/r . "\$\$;
	CREATE OPERATOR public.* (LEFTARG = integer, RIGHTARG = interval, FUNCTION = public.trap_times)");
# The worker starts with the extension; its first pass trims the attempt
# log, which evaluates the operator once it has a row to look at. A row of
# relay_outbox_config that delivers nothing (written with triggers off)
# keeps the worker for its later passes: a database without an enabled
# pipeline lets its worker go after the first (relay/on_demand.c).
$node->safe_psql('attack3', "BEGIN; CREATE EXTENSION pg_tide;
	INSERT INTO tide.relay_attempts (pipeline_id, outbox_name, message_id, attempt, status)
	VALUES ('p', 'orders', 1, 1, 'success');
	SET LOCAL session_replication_role = replica;
	INSERT INTO tide.relay_outbox_config (name, config) VALUES ('wake', '{}'); COMMIT");
ok(wait_for_passes('attack3', 3), 'attack 3: the worker made its passes, the first one trimming');
is(is_superuser('owner3'), 'f', 'attack 3: the database owner did not become superuser');
is(trap_calls('attack3'), '0', 'attack 3: the worker never used the owner\'s * operator');

# 4. Database settings written by the owner do not steer the worker.
$node->safe_psql('postgres', 'CREATE DATABASE attack4 OWNER owner4');
$node->safe_psql('attack4', "CREATE TABLE public.trap_calls (su text); ALTER TABLE public.trap_calls OWNER TO owner4;
	ALTER DATABASE attack4 SET session_replication_role = replica");
$node->safe_psql('attack4', "SET ROLE owner4;
	CREATE SCHEMA evil;
	CREATE FUNCTION evil.to_json(timestamptz) RETURNS json LANGUAGE plpgsql AS \$\$"
	  . trap_body('owner4') =~ s/END;$/RETURN pg_catalog.to_json(\$1::text); END;/r . "\$\$;
	ALTER DATABASE attack4 SET search_path = evil, public;
	ALTER DATABASE attack4 SET role = owner4;
	ALTER DATABASE attack4 SET session_authorization = owner4;
	ALTER DATABASE attack4 SET default_transaction_read_only = on;
	ALTER DATABASE attack4 SET statement_timeout = 1;
	ALTER DATABASE attack4 SET lock_timeout = 1;
	ALTER DATABASE attack4 SET default_transaction_isolation = serializable");
# The test's own sessions there override those settings at connection.
my $sane = $node->connstr('attack4')
  . " options='-c search_path=public -c role=none -c session_authorization=$worker_user"
  . ' -c default_transaction_read_only=off -c statement_timeout=0 -c lock_timeout=0'
  . " -c session_replication_role=origin'";
sub sane_psql { return $node->safe_psql('attack4', $_[0], connstr => $sane); }
# The worker connects after the settings were written: with the extension.
sane_psql("CREATE EXTENSION pg_tide; SELECT tide.outbox_create('orders');
	SELECT tide.relay_set_outbox('to_file', 'orders', 'to_file',
	  jsonb_build_object('sink_type', 'file', 'path', '$dir/attack4.jsonl'))");
sane_psql("SELECT tide.outbox_publish('orders', '{\"n\": 1}')");
ok(wait_for_file("$dir/attack4.jsonl"), 'attack 4: the worker delivers under the owner\'s database settings');
my $deadline = time() + 10;
my $offset = '';
while (time() < $deadline)
{
	$offset = sane_psql("SELECT coalesce(max(last_change_id), 0) FROM tide.relay_consumer_offsets WHERE pipeline_id = 'to_file'");
	last if $offset > 0;
	usleep(100_000);
}
ok($offset > 0, 'attack 4: and records the delivery: not read-only, not as the owner');
# pg_stat_activity keeps the user the worker connected as; that the
# worker's writes went through shows it runs as the superuser again.
is(sane_psql("SELECT has_table_privilege('owner4', 'tide.relay_consumer_offsets', 'INSERT')"),
	'f', 'attack 4: (the owner could not have written that offset)');
is(is_superuser('owner4'), 'f', 'attack 4: the database owner did not become superuser');
is(sane_psql('SELECT count(*) FROM public.trap_calls'), '0', 'attack 4: the worker never called evil.to_json');

# A reload makes the running worker apply the database's settings again
# (relay/worker_settings.c): its own settings still win over the owner's.
my $passes_sql = "SELECT coalesce(sum(passes), 0) FROM tide.relay_workers() WHERE database = 'attack4'";
my $passes = $node->safe_psql('postgres', $passes_sql);
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
$deadline = time() + 30;
usleep(100_000) while time() < $deadline && $node->safe_psql('postgres', $passes_sql) < $passes + 3;
cmp_ok($node->safe_psql('postgres', $passes_sql), '>=', $passes + 3, 'attack 4: passes after a reload');
sane_psql("SELECT tide.outbox_publish('orders', '{\"n\": 2}')");
my $reloaded_offset = $offset;
$deadline = time() + 10;
while (time() < $deadline)
{
	$reloaded_offset = sane_psql("SELECT coalesce(max(last_change_id), 0) FROM tide.relay_consumer_offsets WHERE pipeline_id = 'to_file'");
	last if $reloaded_offset > $offset;
	usleep(100_000);
}
cmp_ok($reloaded_offset, '>', $offset, 'attack 4: after a reload the worker still delivers and records');
is(is_superuser('owner4'), 'f', 'attack 4: after a reload the owner is still not superuser');
is(sane_psql('SELECT count(*) FROM public.trap_calls'), '0', 'attack 4: after a reload the worker never called evil.to_json');

# The traps are real: each resolves for an unqualified call in the search
# path the worker would have had, and runs (as its unprivileged owner).
$node->safe_psql('attack1', 'SET ROLE dbo; SET search_path = public; SELECT to_json(now())');
is(trap_calls('attack1'), '1', 'trap 1 resolves for to_json(timestamptz) in "$user", public');
$node->safe_psql('attack2', "SET ROLE creator; SET search_path = \"$worker_user\", public; SELECT to_json(now())");
is(trap_calls('attack2'), '1', 'trap 2 resolves for to_json(timestamptz) in "$user", public');
$node->safe_psql('attack3', "SET ROLE owner3; SET search_path = public; SELECT 2 * interval '1 second'");
is(trap_calls('attack3'), '1', 'trap 3 resolves for integer * interval in "$user", public');
$node->safe_psql('attack4', 'SELECT to_json(now())', connstr => $node->connstr('attack4')
	  . " options='-c statement_timeout=0 -c lock_timeout=0 -c default_transaction_read_only=off'");
is(sane_psql('SELECT count(*) FROM public.trap_calls'), '1', 'trap 4 resolves under the database\'s settings');
is($node->safe_psql('postgres', "SELECT string_agg(rolname, ',') FROM pg_roles WHERE rolsuper AND rolname <> '$worker_user'"),
	'', 'no role but the bootstrap superuser is superuser');

$node->stop;
done_testing();
