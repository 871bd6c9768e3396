# An endpoint that no file of pg_tide names (relay/endpoints/registry.c):
# test/endpoints/pg_tide_probe.so, put into a copy of the installation's
# $libdir, is found by its file name and its init symbol alone:
#  - a pipeline of sink type "probe" is accepted, and the relay worker
#    delivers through it;
#  - relay_get_config and relay_list_configs redact the key it declares
#    secret;
#  - its source, registered by the same init symbol, is found by the same
#    registry, and a reverse config is redacted by the same rules as a
#    sink's ("auth.*": the members of "auth" that carry a credential);
#  - the hint for an unknown sink type lists it after the types pg_tide was
#    built with;
#  - a pg_tide_<name>.so without the init symbol pg_tide_endpoint_<name> is
#    refused with 42704, saying so, and a type name that is not lower-case
#    letters, digits and "_", from a letter, names no file at all.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(installation_copy);
use File::Copy qw(copy);

my $probe = "$FindBin::Bin/../endpoints/pg_tide_probe.so";
-e $probe or BAIL_OUT("$probe is not built (make installcheck builds it)");
my ($install, $libdir) = installation_copy();
copy($probe, "$libdir/pg_tide_probe.so") or die "cannot copy $probe: $!";
# the same module under another name: it has no pg_tide_endpoint_nosymbol
copy($probe, "$libdir/pg_tide_nosymbol.so") or die "cannot copy $probe: $!";
# and under a name that cannot be a type's: it starts with a digit
copy($probe, "$libdir/pg_tide_9probe.so") or die "cannot copy $probe: $!";

my $node = PostgreSQL::Test::Cluster->new('endpoint', install_path => $install);
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'pg_tide'\npg_tide.relay_naptime_ms = 100\n");
$node->start;

sub sql { return $node->safe_psql('postgres', $_[0]) }

# The error of a statement, verbose (SQLSTATE, detail, hint).
sub error_of
{
	my ($ret, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\n$_[0]");
	return $err;
}

sql("CREATE EXTENSION pg_tide");
sql("SELECT tide.outbox_create('orders')");
sql("SELECT tide.relay_set_outbox('to_probe', 'orders', 'to_probe',
	'{\"sink_type\": \"probe\", \"secret_word\": \"swordfish\"}')");
is(sql("SELECT config ->> 'sink_type' FROM tide.relay_outbox_config WHERE name = 'to_probe'"),
	'probe', 'a pipeline of the type that only a module in $libdir provides is accepted');
is(sql("SELECT tide.relay_get_config('to_probe') ->> 'secret_word'"), '********',
	'relay_get_config redacts the key the module declares secret');
is(sql("SELECT config ->> 'secret_word' FROM tide.relay_list_configs() WHERE pipeline = 'to_probe'"),
	'********', 'and so does relay_list_configs');
is(sql("SELECT config ->> 'secret_word' FROM tide.relay_outbox_config WHERE name = 'to_probe'"),
	'swordfish', 'the table keeps the value');

my $last = sql("SELECT max(tide.outbox_publish('orders', jsonb_build_object('n', g)))
	FROM generate_series(1, 50) AS g");
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $last FROM tide.relay_consumer_offsets WHERE pipeline_id = 'to_probe'"),
	'the relay worker delivers all 50 messages through the module');

sql("SELECT tide.inbox_create('probe_in')");
is(sql("SELECT tide._relay_normalize_reverse_config('probe_in',
	'{\"source_type\": \"probe\", \"secret_word\": \"swordfish\"}') ->> 'source_type'"),
	'probe', 'a source type that only a module in $libdir provides is accepted');
is(sql("SELECT r ->> 'secret_word' || ' ' || (r -> 'auth' ->> 'password') || ' ' || (r -> 'auth' ->> 'user')
	  FROM tide._relay_redact_source('{\"source_type\": \"probe\", \"inbox\": \"probe_in\",
		\"secret_word\": \"swordfish\", \"auth\": {\"password\": \"hunter2\", \"user\": \"relay\"}}') AS r"),
	'******** ******** relay',
	'a reverse config hides the keys its source declares, "auth.*" as a sink\'s does');

my $err = error_of("SELECT tide._relay_normalize_config('orders', 'g', '{\"sink_type\": \"sqs\"}')");
like($err, qr/ERROR:\s+22023: invalid value "sqs" for config key "sink_type"/,
	'an unknown sink type is refused with 22023');
like($err, qr/HINT:.*one of: 'webhook', 'file', .*'nosymbol', 'probe'\./,
	'its hint lists the built types, then the modules found in $libdir');
unlike($err, qr/9probe/, 'but not a module whose name cannot be a type\'s');

$err = error_of("SELECT tide._relay_normalize_config('orders', 'g', '{\"sink_type\": \"nosymbol\"}')");
like($err, qr/ERROR:\s+42704: sink type "nosymbol" is not available on this server/,
	'a module without its init symbol is refused with 42704');
like($err, qr/DETAIL:\s+pg_tide_nosymbol\.so has no symbol pg_tide_endpoint_nosymbol/,
	'saying which symbol it lacks');
like($err, qr/HINT:.*postgresql-\d+-pg-tide-nosymbol/, 'and naming the package by convention');

$err = error_of("SELECT tide._relay_normalize_config('orders', 'g', '{\"sink_type\": \"../pg_tide_probe\"}')");
like($err, qr/ERROR:\s+22023: invalid value "\.\.\/pg_tide_probe"/,
	'a type name with a path in it names no file');

$node->stop;
done_testing();
