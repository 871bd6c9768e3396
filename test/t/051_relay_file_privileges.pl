# The server files a pipeline's config names (relay/config_files.c), with
# the relay on:
#  1. a role with tide_admin alone may name a file inside
#     pg_tide.secrets_directory, and nothing else: not a file outside it
#     (the same error for an existing 0600 file and a missing one), not one
#     reached through "..", not one reached through a symbolic link inside
#     the directory that points out of it;
#  2. a NATS pipeline set by a role that had pg_read_server_files, whose
#     right was revoked in the same transaction: the worker, which checks
#     again with the pipeline's owner's rights, does not open it, shows the
#     error in relay_pipeline_status (class config), and never connects to
#     the server the config names (a TCP listener of the test's that counts
#     connections);
#  3. the right granted again, the worker opens the pipeline and connects
#     (so the listener would have seen a connection in 2); revoked while it
#     is open, the worker closes it and shows the error again; a row
#     without an owner (written with triggers off) has no rights.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use IO::Socket::INET;
use Time::HiRes qw(usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
my $secrets = "$dir/secrets";
my $elsewhere = "$dir/elsewhere";
mkdir $_ or die "mkdir $_: $!" for $secrets, $elsewhere;
# a tenant's credentials outside the secrets directory, readable by the server only
my $creds = "$elsewhere/tenant.creds";
PostgreSQL::Test::Utils::append_to_file($creds,
	"-----BEGIN NATS USER JWT-----\neyJhbGciOiJlZDI1NTE5In0.e30.c2ln\n------END NATS USER JWT------\n");
chmod 0600, $creds;
PostgreSQL::Test::Utils::append_to_file("$secrets/ours.creds", "ours\n");
chmod 0600, "$secrets/ours.creds";
symlink($creds, "$secrets/link.creds") or die "symlink: $!";

my $node = tide_node('file_privileges',
	"pg_tide.relay_naptime_ms = 200\npg_tide.secrets_directory = '$secrets'\n");
$node->safe_psql('postgres', qq{
	SELECT tide.outbox_create('orders');
	CREATE ROLE bob IN ROLE tide_admin;
	CREATE ROLE alice IN ROLE tide_admin, pg_read_server_files;
});

# A TCP listener that counts the connections made to it; nothing is answered.
my $listener = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 16,
	ReuseAddr => 1, Blocking => 0) or die "listen: $!";
my $port = $listener->sockport;
my @accepted;

# Accepts what is waiting; returns the number of connections so far.
sub connections
{
	while (my $c = $listener->accept) { push @accepted, $c; }
	return scalar @accepted;
}

# The config of a NATS pipeline to the listener naming credentials file $file.
sub nats_config
{
	my ($file) = @_;
	return qq{{"sink_type": "nats", "servers": "nats://127.0.0.1:$port", "subject": "orders.x",
			   "timeout_ms": 1000, "auth": {"credentials_file": "$file"}}};
}

# relay_set_outbox of pipeline $name as $role: its error, or "ok".
sub set_as
{
	my ($role, $name, $file) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', qq{
		BEGIN;
		SET ROLE $role;
		SELECT tide.relay_set_outbox('$name', 'orders', '$name', '@{[nats_config($file)]}');
		RESET ROLE;
		SELECT tide.relay_disable('$name');
		COMMIT});
	return $rc == 0 ? 'ok' : $err =~ s/\Q$file\E/<file>/r;
}

# 1. What a role with tide_admin alone may name.
is(set_as('bob', 'inside', "$secrets/ours.creds"), 'ok',
	'tide_admin may name a file inside pg_tide.secrets_directory');
my $outside = set_as('bob', 'outside', $creds);
like($outside, qr/ERROR:  config key "auth.credentials_file" names a file the relay may not read for role "bob": "<file>"/,
	'tide_admin may not name an existing 0600 file outside it');
is(set_as('bob', 'outside', "$elsewhere/missing.creds"), $outside,
	'and gets the very same error for a missing file: no oracle');
is(set_as('bob', 'outside', "$secrets/missing.creds"), $outside,
	'or for a missing file inside the directory');
is(set_as('bob', 'outside', "$secrets/../elsewhere/tenant.creds"), $outside,
	'a path that leaves the directory through ".." is refused');
is(set_as('bob', 'outside', "$secrets/link.creds"), $outside,
	'a symbolic link inside the directory to a file outside it is refused');
is(set_as('alice', 'outside', $creds), 'ok',
	'a role with pg_read_server_files may name the file outside');
$node->safe_psql('postgres', "SELECT tide.relay_delete(p) FROM unnest(ARRAY['inside', 'outside']) p");

# 2. Set with the right, which is revoked before the worker sees the pipeline.
$node->safe_psql('postgres', qq{
	BEGIN;
	SET ROLE alice;
	SELECT tide.relay_set_outbox('tenant', 'orders', 'tenant', '@{[nats_config($creds)]}');
	RESET ROLE;
	REVOKE pg_read_server_files FROM alice;
	SELECT tide.outbox_publish('orders', '{"n": 1}');
	COMMIT});
is($node->safe_psql('postgres', "SELECT owner FROM tide.relay_outbox_config WHERE name = 'tenant'"),
	'alice', 'the pipeline records its owner');

# The pipeline's error as relay_pipeline_status shows it.
sub status_error
{
	return $node->safe_psql('postgres',
		"SELECT coalesce(last_error_class, '') || ': ' || coalesce(last_error, '')
		   FROM tide.relay_pipeline_status WHERE pipeline = 'tenant'");
}
my $refused = qr/^config: config key "auth.credentials_file" names a file the relay may not read for role "alice"/;
ok(defined wait_until(sub { status_error() =~ $refused }, 30, 100_000),
	'the worker refuses the pipeline of an owner without the right and shows why')
  or diag(status_error());
# a few more passes of the worker (naptime 200 ms)
usleep(2_000_000);
is(connections(), 0, 'and never connects to the server the config names');
is($node->safe_psql('postgres', "SELECT count(*) FROM tide.relay_consumer_offsets WHERE pipeline_id = 'tenant' AND last_change_id > 0"),
	'0', 'nothing was delivered');

# 3. The right granted again: the worker opens the pipeline and connects.
$node->safe_psql('postgres', 'GRANT pg_read_server_files TO alice');
ok(defined wait_until(sub { connections() > 0 }, 30, 100_000),
	'with the right back, the worker opens the pipeline and connects to the listener');
ok(defined wait_until(sub { status_error() !~ $refused }, 30, 100_000), 'and clears the error');
$node->safe_psql('postgres', 'REVOKE pg_read_server_files FROM alice');
ok(defined wait_until(sub { status_error() =~ $refused }, 30, 100_000),
	'revoked while the pipeline is open, the worker closes it and shows the error again')
  or diag(status_error());

# A row without an owner (written with triggers off) has no rights.
$node->safe_psql('postgres', qq{
	GRANT pg_read_server_files TO alice;
	SET session_replication_role = replica;
	UPDATE tide.relay_outbox_config SET owner = NULL WHERE name = 'tenant'});
ok(defined wait_until(sub { status_error() =~ /names a file the relay may not read for a pipeline without an owner/ },
		30, 100_000),
	'a pipeline without an owner may not name the file either')
  or diag(status_error());

my $log = slurp_file($node->logfile);
unlike($log, qr/TRAP|server process .* was terminated/, 'no crash');
$node->stop;
done_testing();
