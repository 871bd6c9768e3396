# Idempotency keys across a crash (src/idempotency.c). The postmaster and
# the backends are killed with SIGKILL while one session has published with
# a key and not committed, and a second session waits on that key: after
# the restart the key is free, and a publish with it gets a new id. A key whose publish
# committed before the crash is still known after it: a publish with it
# gets the first id and writes nothing.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);

my $node = tide_node('idemcrash');
$node->safe_psql('postgres', q{SELECT tide.outbox_create('orders')});

# Committed before the crash.
my $committed_id = $node->safe_psql('postgres',
	q{SELECT tide.outbox_publish('orders', '{"n": "committed"}', NULL, 'key-committed')});

# The first publisher of 'key-open' has inserted and not committed; the
# second publishes the same key and waits for the first's outcome.
my $first = $node->background_psql('postgres');
my $first_pid = $first->query_safe('SELECT pg_backend_pid()');
chomp $first_pid;
my $open_id = $first->query_safe(
	q{BEGIN; SELECT tide.outbox_publish('orders', '{"n": "first"}', NULL, 'key-open')});
chomp $open_id;
my $second = $node->background_psql('postgres', on_error_stop => 0);
my $second_pid = $second->query_safe('SELECT pg_backend_pid()');
chomp $second_pid;
$second->query_until(qr/waiting/,
	qq{\\echo waiting\nSELECT tide.outbox_publish('orders', '{"n": "second"}', NULL, 'key-open');\n});
ok(defined wait_until(sub {
			$node->safe_psql('postgres',
				q{SELECT count(*) FROM pg_stat_activity
				   WHERE wait_event_type = 'Lock' AND query LIKE '%key-open%'}) eq '1';
		}, 30),
	'the second publisher of the key waits for the first');

# The two backends die with the postmaster, at once: a backend that outlived
# it would end its transaction, and the waiting one would then commit.
kill 'KILL', $first_pid, $second_pid;
$node->kill9;
$first->{run}->kill_kill;
$second->{run}->kill_kill;
# (a start fails while the old server's processes still hold its shared
# memory; the node then believes it runs, so it is told otherwise)
ok(defined wait_until(sub { $node->{_pid} = undef; $node->start(fail_ok => 1) }, 60, 500_000),
	'the server starts again after the crash');

is($node->safe_psql('postgres',
		q{SELECT count(*) FROM tide.outbox_idempotency_keys WHERE idempotency_key = 'key-open'}),
	'0', 'the uncommitted key is gone after the crash');
my $new_id = $node->safe_psql('postgres',
	q{SELECT tide.outbox_publish('orders', '{"n": "after"}', NULL, 'key-open')});
isnt($new_id, $open_id, 'a publish with the uncommitted key after the crash gets a new id');
is($node->safe_psql('postgres',
		q{SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM tide.tide_outbox_messages}),
	'committed,after', 'only the committed message and the one published after the crash are there');
is($node->safe_psql('postgres',
		q{SELECT tide.outbox_publish('orders', '{"n": "again"}', NULL, 'key-committed')}),
	$committed_id, 'a key committed before the crash still answers with its first id');
is($node->safe_psql('postgres',
		q{SELECT tide.outbox_publish('orders', '{"n": "again"}', NULL, 'key-open')}),
	$new_id, 'the key published after the crash answers with its id');
is($node->safe_psql('postgres', q{SELECT count(*) FROM tide.tide_outbox_messages}),
	'2', 'the repeated publishes wrote nothing');

$node->stop;
done_testing();
