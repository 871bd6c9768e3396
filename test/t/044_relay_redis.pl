# The redis sink (pg_tide_redis.so) against a real Redis server on
# 127.0.0.1, read back by a real client (test/brokers/redis_read, hiredis):
#
#  1. Bad configs are refused by relay_set_outbox with 22023, a message
#     and a hint, and write nothing; a password never appears in the
#     listed config.
#  2. A backlog of 1,000 messages arrives whole, once each, in id order
#     per stream, each in the stream its "type" header names, with the
#     fields tide-id, tide-outbox, tide-created-at, headers and payload;
#     each attempt records the entry id Redis answered; ordering 'key'
#     with many in flight.
#  3. maxlen trims the stream (MAXLEN ~); body 'envelope' sends the
#     message's JSON object in one field.
#  4. A message Redis refuses for good (its stream key holds a string:
#     WRONGTYPE) is dead-lettered with class refused, one whose template
#     lacks its header with class template; the others are delivered. A
#     field over proto-max-bulk-len is dead-lettered as too_large.
#  5. Authentication (an ACL file): no AUTH (NOAUTH), a wrong password
#     (WRONGPASS) and a user without the right on the key (NOPERM) hold
#     the pipeline with class auth and dead-letter nothing; the right
#     password (from an environment variable) and the ACL user deliver.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::Redis;
use JSON::PP;

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;

# The server inherits it from the test's environment.
$ENV{PG_TIDE_REDIS_PW} = 'def4ultpw';

my $redis = PgTide::Redis->new(dir => $dir);
$redis->start;
my $node = tide_node('redis', "pg_tide.relay_naptime_ms = 100\n");

sub sql { return $node->safe_psql('postgres', $_[0]) }

# Sets a redis pipeline on an outbox of the same name.
sub set_pipeline
{
	my ($name, $cfg) = @_;
	my $c = $json->encode({ sink_type => 'redis', %$cfg });
	sql("SELECT tide.relay_set_outbox('$name', '$name', '$name', '$c'::jsonb)");
}

# Publishes n messages to an outbox in one transaction, headers from
# $headers->(i); returns their ids.
sub publish
{
	my ($outbox, $n, $headers) = @_;
	my @ids;
	my $values = join(', ', map {
		my $h = $headers ? $json->encode($headers->($_)) : undef;
		"($_, " . (defined $h ? "'$h'::jsonb" : 'NULL::jsonb') . ')'
	} 1 .. $n);
	return split /\n/, sql("SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', v.n, 'text', 'é \"q\"'), v.h)
		FROM (VALUES $values) v(n, h) ORDER BY v.n");
}

###########################################################################
# 1. Bad configs
###########################################################################
sql("SELECT tide.outbox_create('orders')");
my @bad = (
	[ { stream => 'o' }, qr/config key "url" is missing/ ],
	[ { url => 'redis://:pw@127.0.0.1:1/0', stream => 'o' },
		qr/config key "url" must not contain a user name or password.*HINT:.*auth/s ],
	[ { url => 'http://127.0.0.1:1', stream => 'o' }, qr/not a valid Redis URL: it does not start with redis/ ],
	[ { url => 'redis://127.0.0.1:70000', stream => 'o' }, qr/its port is not a number from 1 to 65535/ ],
	[ { url => 'redis://127.0.0.1/x', stream => 'o' }, qr/not a database number/ ],
	[ { url => 'rediss://127.0.0.1', stream => 'o' }, qr/asks for TLS/ ],
	[ { url => $redis->url, stream => 'o', tls => JSON::PP::true },
		qr/config key "tls" is not supported by the redis sink.*HINT:.*hiredis \d+\.\d+ without its TLS library/s ],
	[ { url => $redis->url }, qr/config key "stream" is missing/ ],
	[ { url => $redis->url, stream => 'o.{type' }, qr/config key "stream" has a malformed placeholder/ ],
	[ { url => $redis->url, stream => '' }, qr/config key "stream" must not be empty/ ],
	[ { url => $redis->url, stream => 'o', maxlen => 0 }, qr/config key "maxlen" is out of range/ ],
	[ { url => $redis->url, stream => 'o', max_in_flight => 10001 }, qr/config key "max_in_flight" is out of range/ ],
	[ { url => $redis->url, stream => 'o', timeout_ms => 50 }, qr/config key "timeout_ms" is out of range/ ],
	[ { url => $redis->url, stream => 'o', body => 'raw' }, qr/config key "body"/ ],
	[ { url => $redis->url, stream => 'o', auth => { username => 'u' } }, qr/config key "auth.password" is missing/ ],
	[ { url => $redis->url, stream => 'o', auth => { password => 'p', token => 'x' } }, qr/auth\.token/ ],
	[ { url => $redis->url, stream => 'o', auth => { password => '' } }, qr/config key "auth.password" must not be empty/ ],
	[ { url => $redis->url, stream => 'o', auth => { password => { env => 'HOME' } } }, qr/PG_TIDE_/ ],
	[ { url => $redis->url, stream => 'o', topic => 'x' }, qr/topic/ ],
);
for my $b (@bad)
{
	my $c = $json->encode({ sink_type => 'redis', %{ $b->[0] } });
	my ($rc, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSELECT tide.relay_set_outbox('bad', 'orders', 'bad', '$c'::jsonb)");
	like($err, qr/ERROR:  22023: /, "refused with 22023: $c");
	like($err, $b->[1], "the message says why: $c");
	like($err, qr/HINT:  \S/, "with a hint: $c");
}
is(sql("SELECT count(*) FROM tide.relay_outbox_config"), '0', 'no bad config was stored');

###########################################################################
# 2. A backlog of 1,000 messages, its stream from the "type" header,
# ordering 'key' by the "acct" header with 50 in flight.
###########################################################################
my @types = ('created', 'paid');
my @ids = publish('orders', 1000, sub { { type => $types[ $_[0] % 2 ], acct => 'a' . ($_[0] % 7), n => $_[0] } });
set_pipeline('orders', { url => $redis->url, stream => 'orders.{type}', batch_size => 200,
	max_in_flight => 50, ordering => 'key', ordering_key => 'acct', attempt_log => JSON::PP::true });

my $all = sub { scalar($redis->entries('orders.created', 'orders.paid')) >= 1000 };
ok(defined wait_until($all, 60, 100_000), 'the backlog of 1,000 arrives');
my @entries = $redis->entries('orders.created', 'orders.paid');
is(scalar(@entries), 1000, 'each message once');
my %msg = map { $_->[0] => $_ } map { [ split /\|/ ] } split /\n/,
  sql("SELECT id, headers::text, payload::text, to_json(created_at)#>>'{}' FROM tide.tide_outbox_messages WHERE outbox_name = 'orders'");
my ($bad_fields, $bad_stream, $bad_order) = (0, 0, 0);
my %last_per_stream;
for my $e (@entries)
{
	my $f = $e->{fields};
	my ($id) = ($f->{'tide-id'} // '') =~ /^outbox_orders:(\d+)$/;
	my $m = defined $id ? $msg{$id} : undef;
	if (!$m || $f->{'tide-outbox'} ne 'orders'
		|| $f->{'tide-created-at'} ne $m->[3]
		|| !eq_json($f->{headers}, $m->[1]) || !eq_json($f->{payload}, $m->[2])
		|| join(',', sort keys %$f) ne 'headers,payload,tide-created-at,tide-id,tide-outbox')
	{
		diag('unexpected entry: ' . $json->encode($e)) if $bad_fields++ < 3;
		next;
	}
	$bad_stream++ unless $e->{stream} eq 'orders.' . $json->decode($m->[1])->{type};
	$bad_order++ if ($last_per_stream{ $e->{stream} } // 0) > $id;
	$last_per_stream{ $e->{stream} } = $id;
}
is($bad_fields, 0, 'every entry has the fields, identity, created_at, headers and payload of its message');
is($bad_stream, 0, 'every message is in the stream its "type" header names');
is($bad_order, 0, 'ids ascend in each stream');
is(join(',', sort { $a <=> $b } map { $_->{fields}{'tide-id'} =~ /(\d+)$/ } @entries),
	join(',', sort { $a <=> $b } @ids), 'the delivered ids are the published ids');
my ($eid, $stream0) = ($entries[0]{entry}, $entries[0]{stream});
my ($mid0) = $entries[0]{fields}{'tide-id'} =~ /(\d+)$/;
is(sql("SELECT response_snippet FROM tide.relay_attempts WHERE pipeline_id = 'orders' AND message_id = $mid0 AND status = 'success'"),
	$eid, 'the attempt records the entry id Redis answered');

sub eq_json
{
	my ($a, $b) = @_;
	my ($x, $y) = eval { ($json->decode($a), $json->decode($b)) };
	return defined $x && $json->encode($x) eq $json->encode($y);
}

###########################################################################
# 3. maxlen and body 'envelope'
###########################################################################
sql("SELECT tide.outbox_create('capped'); SELECT tide.outbox_create('env')");
set_pipeline('capped', { url => $redis->url, stream => 'capped', maxlen => 10, batch_size => 500 });
set_pipeline('env', { url => $redis->url('/3'), stream => 'env', body => 'envelope' });
my @capped = publish('capped', 2000);
my @env_ids = publish('env', 3, sub { { type => 'x' } });
ok(defined wait_until(sub { sql("SELECT coalesce(max(last_change_id), 0) FROM tide.relay_consumer_offsets WHERE pipeline_id = 'capped'") == $capped[-1] }, 30),
	'maxlen: all 2,000 acknowledged');
# a broker sink logs failed attempts only, unless its config asks for every attempt
is(sql("SELECT (config ->> 'attempt_log') || ' ' || (SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'capped')
		  FROM tide.relay_outbox_config WHERE name = 'capped'"), 'failures 0',
	'attempt_log: "failures" by default, and no row for the 2,000 successes');
my $xlen = $redis->cli('XLEN', 'capped');
cmp_ok($xlen, '<', 1000, "maxlen: the stream is trimmed (XLEN $xlen)");
cmp_ok($xlen, '>=', 10, 'maxlen: at least maxlen entries are kept');
ok(defined wait_until(sub { $redis->cli('-n', 3, 'XLEN', 'env') == 3 }, 30), 'envelope: the messages arrive in database 3');
is($redis->cli('XLEN', 'env'), '0', 'envelope: not in database 0');
{
	my $out = $redis->cli('-n', 3, '--raw', 'XRANGE', 'env', '-', '+', 'COUNT', '1');
	my @l = split /\n/, $out;
	is_deeply([ @l[ 1, 3 ] ], [ 'tide-id', 'message' ], 'envelope: the fields are tide-id and message');
	my $m = $json->decode($l[4]);
	is($m->{id}, "outbox_env:$env_ids[0]", 'envelope: the message holds its identity');
	is_deeply([ $m->{payload}{n}, $m->{headers}{type}, $m->{outbox} ], [ 1, 'x', 'env' ],
		'envelope: the message holds its payload, headers and outbox');
}

###########################################################################
# 4. Refused for good: WRONGTYPE, and a template without its header
###########################################################################
sql("SELECT tide.outbox_create('typed')");
$redis->cli('SET', 'typed.bad', 'a string, not a stream');
set_pipeline('typed', { url => $redis->url, stream => 'typed.{type}', retry => { base_ms => 20, cap_ms => 100, max_attempts => 3 } });
my ($good, $wrong, $none) = publish('typed', 3, sub { $_[0] == 1 ? { type => 'good' } : $_[0] == 2 ? { type => 'bad' } : { other => 1 } });
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'typed'") == 2 }, 30),
	'the two refused messages are dead-lettered');
is(sql("SELECT string_agg(message_id || ':' || reason || ':' || last_error_class, ',' ORDER BY message_id) FROM tide.relay_dlq WHERE pipeline_id = 'typed'"),
	"$wrong:permanent:refused,$none:permanent:template", 'WRONGTYPE is refused, a missing header is template, both permanent');
like(sql("SELECT last_error FROM tide.relay_dlq WHERE message_id = $wrong"), qr/WRONGTYPE/, 'the error is Redis\'s');
is($redis->cli('XLEN', 'typed.good'), '1', 'the good message is delivered');

# A field over Redis's proto-max-bulk-len (1 MB, its least), which the
# sink learns with CONFIG GET on each new connection: that message is
# never sent (Redis would answer it with a protocol error and close the
# connection) and is dead-lettered as too_large; the others arrive.
$redis->cli('CONFIG', 'SET', 'proto-max-bulk-len', '1mb');
sql("SELECT tide.outbox_create('sized')");
# (pg_tide.max_payload_bytes, 1 MB by default, is raised for it)
my @sized = split /\n/, sql(q{SET pg_tide.max_payload_bytes = 4194304; SELECT tide.outbox_publish('sized',
	jsonb_build_object('n', g, 'pad', CASE WHEN g = 3 THEN repeat('x', 1200000) ELSE 'small' END))
	FROM generate_series(1, 8) g});
set_pipeline('sized', { url => $redis->url, stream => 'sized', retry => { base_ms => 20, cap_ms => 100, max_attempts => 100 } });
# the pg_tide ids in stream "sized", each once
my $sized_ids = sub { my %seen = map { (/:(\d+)$/)[0] => 1 } $redis->field_values('tide-id', 'sized'); [ sort { $a <=> $b } keys %seen ] };
ok(defined wait_until(sub { sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'sized'") == 1
		&& @{ $sized_ids->() } >= 7 }, 30),
	'a message over proto-max-bulk-len is dead-lettered, the others arrive');
is(sql("SELECT message_id || ':' || reason || ':' || last_error_class FROM tide.relay_dlq WHERE pipeline_id = 'sized'"),
	"$sized[2]:permanent:too_large", 'it is dead-lettered as too_large, permanent');
like(sql("SELECT last_error FROM tide.relay_dlq WHERE pipeline_id = 'sized'"), qr/over Redis's proto-max-bulk-len \(1048576\)/,
	'the error says why, with Redis\'s limit');
is(join(',', @{ $sized_ids->() }), join(',', @sized[0, 1, 3 .. 7]), 'the seven others are in the stream, the large one is not');
$redis->cli('CONFIG', 'SET', 'proto-max-bulk-len', '512mb');

###########################################################################
# 5. Authentication: an ACL file with the default user's password, an
# admin, and a user "tide" that may write keys allowed.* only.
###########################################################################
my @acl_lines = (
	'user default on >def4ultpw ~* &* +@all',
	'user admin on >adminpw ~* &* +@all',
	'user tide on >tidepw ~allowed.* +@all');
mkdir "$dir/acl";
my $acl = PgTide::Redis->new(dir => "$dir/acl", aclfile => \@acl_lines);
$acl->start;
my $health = "SELECT last_error_class FROM tide.relay_pipeline_health WHERE pipeline_id = '%s'";
my %cases = (
	# Redis answers an unauthenticated client's XADD of more than 10
	# arguments with a protocol error and closes the connection
	noauth => [ {}, 'allowed.a', qr/NOAUTH|unauthenticated/ ],
	wrongpass => [ { password => 'wr0ngpw' }, 'allowed.b', qr/WRONGPASS|invalid/ ],
	noperm => [ { username => 'tide', password => 'tidepw' }, 'denied', qr/NOPERM/ ],
);
for my $name (sort keys %cases)
{
	my ($auth, $stream, $err) = @{ $cases{$name} };
	sql("SELECT tide.outbox_create('$name')");
	publish($name, 5);
	set_pipeline($name, { url => $acl->url, stream => $stream, %$auth ? (auth => $auth) : () });
}
for my $name (sort keys %cases)
{
	my ($auth, $stream, $err) = @{ $cases{$name} };
	ok(defined wait_until(sub { sql(sprintf($health, $name)) eq 'auth' }, 30), "$name: the pipeline fails with class auth");
	like(sql("SELECT last_error FROM tide.relay_pipeline_health WHERE pipeline_id = '$name'"), $err, "$name: Redis's error is recorded");
	like(sql("SELECT held_reason FROM tide.relay_pipeline_health WHERE pipeline_id = '$name'") // '', qr/./, "$name: the pipeline is held");
	is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$name'"), '0', "$name: nothing is dead-lettered");
	is(sql("SELECT count(*) FROM tide.relay_retry_queue WHERE pipeline_id = '$name'"), '0', "$name: nothing waits in the retry queue");
	is($acl->cli('XLEN', $stream), '0', "$name: nothing is in the stream");
}
unlike(sql("SELECT config::text FROM tide.relay_list_configs() WHERE pipeline = 'wrongpass'"), qr/wr0ngpw/,
	'the password is redacted in relay_list_configs');
like(sql("SELECT config::text FROM tide.relay_list_configs() WHERE pipeline = 'wrongpass'"), qr/\*{8}/, 'it shows as ********');
unlike(join('', grep { !/LOG:  statement: / } split /^/, slurp_file($node->logfile)),
	qr/wr0ngpw|tidepw|def4ultpw/, 'no password is in the server log (but for the test\'s own statements)');

# Fixed: the default user's password from the environment, the ACL user on its keys.
set_pipeline('noauth', { url => $acl->url, stream => 'allowed.a', auth => { password => { env => 'PG_TIDE_REDIS_PW' } } });
set_pipeline('wrongpass', { url => $acl->url, stream => 'allowed.b', auth => { username => 'tide', password => 'tidepw' } });
set_pipeline('noperm', { url => $acl->url, stream => 'allowed.c', auth => { username => 'tide', password => 'tidepw' } });
for my $p ([ 'noauth', 'allowed.a' ], [ 'wrongpass', 'allowed.b' ], [ 'noperm', 'allowed.c' ])
{
	ok(defined wait_until(sub { $acl->cli('XLEN', $p->[1]) == 5 }, 30), "$p->[0]: with the right credentials every held message arrives");
}
is(sql("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id IN ('noauth', 'wrongpass', 'noperm')"), '0', 'still nothing dead-lettered');

done_testing();
