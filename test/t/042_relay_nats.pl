# The NATS JetStream sink against a real nats-server (started here on
# 127.0.0.1), read back by test/brokers/nats_tool, a nats.c client:
#  1. a backlog arrives whole, each message once, on the subject its
#     template names, with pg_tide's headers, Nats-Msg-Id and the payload as
#     the body; "envelope" sends the message's JSON object; the backlog
#     sent again (tide.relay_replay) is dropped by the stream as duplicates
#     (Nats-Msg-Id inside its window);
#  2. kill -9 of the postmaster mid-delivery loses nothing, and the stream
#     holds no duplicate (Nats-Msg-Id inside the duplicate window);
#  3. nats-server stopped and started again mid-stream: the pipeline is
#     held (class connection, nothing dead-lettered) and goes on by itself,
#     nothing lost, nothing twice;
#  4. refused messages are dead-lettered with their class (too_large from
#     the stream's max_msg_size and from the server's max_payload,
#     template, refused from a sealed stream and for a header NATS cannot
#     carry), unknown_destination for a subject no stream takes after
#     retry.max_attempts; a full stream (discard new) is a retryable broker
#     failure;
#  5. bad configs are refused by relay_set_outbox with 22023 and a hint.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until);
use PgTide::NatsServer;
use JSON::PP;
use Time::HiRes qw(time usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
my $nats = PgTide::NatsServer->new(dir => $dir);
$nats->start;
$nats->create_stream('ORDERS', 'orders.>', 120);

my $node = tide_node('nats',
	"pg_tide.relay_naptime_ms = 200\nrestart_after_crash = on\n"
	  . "pg_tide.max_payload_bytes = 4194304\n");
$node->safe_psql('postgres', "SELECT tide.outbox_create('orders')");

# Sets pipeline $name of outbox $outbox to NATS with the extra keys given as JSON.
sub set_pipeline
{
	my ($name, $outbox, $keys) = @_;
	my $cfg = $json->encode({ sink_type => 'nats', servers => $nats->url, %$keys });
	$node->safe_psql('postgres', "SELECT tide.relay_set_outbox('$name', '$outbox', '$name', '$cfg')");
}

# Publishes n messages to the outbox, 2,000 a transaction, type alternating;
# returns their ids.
sub publish
{
	my ($outbox, $n) = @_;
	my @ids;
	for (my $from = 1; $from <= $n; $from += 2000)
	{
		my $to = $from + 1999 > $n ? $n : $from + 1999;
		push @ids, split /\n/, $node->safe_psql('postgres',
			"SELECT tide.outbox_publish('$outbox', jsonb_build_object('n', g, 'text', 'é ' || g),
			   jsonb_build_object('type', CASE WHEN g % 2 = 0 THEN 'created' ELSE 'paid' END, 'h', 'v'))
			   FROM generate_series($from, $to) g");
	}
	return @ids;
}

# The stream's messages by outbox id: id => [messages].
sub by_id
{
	my ($stream) = @_;
	my %by;
	for my $m ($nats->messages($stream))
	{
		my ($id) = ($m->{headers}{'tide-id'} // '') =~ /:(\d+)$/;
		push @{ $by{ $id // 'none' } }, $m;
	}
	return \%by;
}

# Waits until the stream holds at least n messages; whether it did.
sub wait_count
{
	my ($stream, $n, $timeout) = @_;
	return defined wait_until(sub { $nats->count($stream) >= $n }, $timeout);
}

# The ids of @ids missing from the stream, and the sum of copies beyond the first.
sub missing_and_duplicates
{
	my ($stream, $ids) = @_;
	my $by = by_id($stream);
	my $missing = grep { !$by->{$_} } @$ids;
	my $dups = 0;
	$dups += @{ $by->{$_} } - 1 for keys %$by;
	return ($missing, $dups);
}

sub sqlv
{
	return $node->safe_psql('postgres', $_[0]);
}

###########################################################################
# 1. A backlog of 2,000 with a subject template; the envelope body.
###########################################################################
my @ids = publish('orders', 2000);
set_pipeline('to_nats', 'orders', { subject => 'orders.{type}', stream => 'ORDERS',
		batch_size => 100, max_in_flight => 64 });
ok(wait_count('ORDERS', 2000, 60), 'test 1: the backlog of 2,000 reaches the stream');
my ($missing, $dups) = missing_and_duplicates('ORDERS', \@ids);
is($missing, 0, 'test 1: no message is missing');
is($dups, 0, 'test 1: no message is in the stream twice');
my $by = by_id('ORDERS');
my $bad = 0;
for my $i (0 .. $#ids)
{
	my $m = $by->{ $ids[$i] }[0];
	my $g = $i + 1;
	my $type = $g % 2 == 0 ? 'created' : 'paid';
	my $body = eval { JSON::PP->new->decode($m->{body}) } // {};
	my $ok = $m->{subject} eq "orders.$type"
	  && $m->{headers}{'tide-id'} eq "outbox_orders:$ids[$i]"
	  && $m->{headers}{'Nats-Msg-Id'} eq "outbox_orders:$ids[$i]"
	  && $m->{headers}{'tide-outbox'} eq 'orders'
	  && ($m->{headers}{'tide-created-at'} // '') =~ /^\d{4}-\d\d-\d\d[ T]\d\d:\d\d/
	  && $m->{headers}{type} eq $type
	  && $m->{headers}{h} eq 'v'
	  && ($body->{n} // -1) == $g
	  && ($body->{text} // '') eq "\x{e9} $g";
	diag('not as expected: ' . $json->encode($m)) if !$ok && !$bad;
	$bad++ unless $ok;
}
is($bad, 0, 'test 1: every message has its subject, headers (tide-id, Nats-Msg-Id, tide-outbox, tide-created-at, its own) and its payload as the body');
my @seqs = map { $by->{$_}[0]{seq} } @ids;
is(scalar(grep { $seqs[$_] < $seqs[ $_ - 1 ] } 1 .. $#seqs), 0,
	'test 1: with max_in_flight 64 on one connection, the stream holds them in id order');
ok($node->poll_query_until('postgres',
		"SELECT last_change_id = $ids[-1] FROM tide.relay_consumer_offsets WHERE pipeline_id = 'to_nats'"),
	'test 1: the pipeline\'s offset is the last id');
is(sqlv("SELECT (config ->> 'attempt_log') || ' ' || (SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'to_nats')
		  FROM tide.relay_outbox_config WHERE name = 'to_nats'"),
	'failures 0', 'test 1: relay_attempts: failures only by default, and none failed');

# The same 2,000 sent again (tide.relay_replay, inside the stream's
# duplicate window of 120 s): each is acknowledged, the stream answers that
# it had it (the attempt's response "duplicate") and keeps one copy.
set_pipeline('to_nats', 'orders', { subject => 'orders.{type}', stream => 'ORDERS',
		batch_size => 100, max_in_flight => 64, attempt_log => JSON::PP::true });
is(sqlv("SELECT tide.relay_replay('to_nats', $ids[0], $ids[-1])"), '2000', 'test 1: 2,000 replayed');
ok($node->poll_query_until('postgres',
		"SELECT count(DISTINCT message_id) = 2000 FROM tide.relay_attempts
		  WHERE pipeline_id = 'to_nats' AND manual AND status = 'success'"),
	'test 1: the relay delivered each of them a second time');
is(sqlv("SELECT count(DISTINCT message_id) FROM tide.relay_attempts
	  WHERE pipeline_id = 'to_nats' AND manual AND status = 'success' AND response_snippet = 'duplicate'"),
	'2000', 'test 1: the stream answered each second copy as a duplicate');
($missing, $dups) = missing_and_duplicates('ORDERS', \@ids);
is("$missing $dups " . $nats->count('ORDERS'), '0 0 2000',
	'test 1: the stream still holds each message once (Nats-Msg-Id inside the duplicate window)');

$nats->create_stream('ENV', 'env.>', 120);
$node->safe_psql('postgres', "SELECT tide.outbox_create('env')");
my @env = split /\n/, sqlv("SELECT tide.outbox_publish('env', '{\"a\": 1}', '{\"k\": \"x\"}')");
set_pipeline('to_env', 'env', { subject => 'env.all', body => 'envelope' });
ok(wait_count('ENV', 1, 20), 'test 1: the envelope message arrives');
my ($em) = $nats->messages('ENV');
my $envelope = eval { JSON::PP->new->decode($em->{body}) } // {};
is_deeply([ $envelope->{id}, $envelope->{message_id}, $envelope->{payload}, $envelope->{headers}, $em->{headers}{k} ],
	[ "outbox_env:$env[0]", $env[0], { a => 1 }, { k => 'x' }, 'x' ],
	'test 1: body "envelope" is the message\'s JSON object, and the headers are NATS headers too');

###########################################################################
# 2. kill -9 of the postmaster while a backlog of 9,000 is delivered in
# batches of 10: nothing lost, and the stream drops what is sent again.
###########################################################################
{
	$nats->create_stream('KILL', 'kill.>', 120);
	$node->safe_psql('postgres', "SELECT tide.outbox_create('kill')");
	my @kids = publish('kill', 9000);
	set_pipeline('to_kill', 'kill', { subject => 'kill.{type}', batch_size => 10, max_in_flight => 10 });
	ok(wait_count('KILL', 500, 60), 'test 2: the backlog is being delivered');
	my ($postmaster) = split /\n/, slurp_file($node->data_dir . '/postmaster.pid');
	$node->kill9;
	my $at_kill = $nats->count('KILL');
	note("test 2: postmaster killed with $at_kill of 9,000 in the stream");
	cmp_ok($at_kill, '<', 9000, 'test 2: the kill came while messages were still undelivered');
	# the server starts again once the old postmaster is gone, and its
	# orphaned relay worker exits on its own
	wait_until(sub { !kill(0, $postmaster) }, 60);
	usleep(500_000);
	ok($node->start(fail_ok => 1), 'test 2: the node starts again after the crash');
	ok(wait_count('KILL', 9000, 90), 'test 2: after the restart all 9,000 are in the stream');
	($missing, $dups) = missing_and_duplicates('KILL', \@kids);
	is($missing, 0, 'test 2: none lost');
	is($dups, 0, 'test 2: the stream holds no duplicate: what was sent again was inside its duplicate window');
	is($nats->count('KILL'), '9000', 'test 2: exactly 9,000 messages in the stream');
}

###########################################################################
# 3. nats-server stopped and started again while a backlog is delivered.
###########################################################################
{
	$nats->create_stream('RESTART', 'restart.>', 120);
	$node->safe_psql('postgres', "SELECT tide.outbox_create('restart')");
	my @rids = publish('restart', 9000);
	set_pipeline('to_restart', 'restart', { subject => 'restart.x', batch_size => 20, max_in_flight => 20,
			timeout_ms => 3000, retry => { base_ms => 100, cap_ms => 500, max_attempts => 3 } });
	ok(wait_count('RESTART', 500, 60), 'test 3: the backlog is being delivered');
	$nats->stop;
	ok($node->poll_query_until('postgres',
			"SELECT last_error_class = 'connection' AND health <> 'healthy'
			   FROM tide.relay_pipeline_status WHERE pipeline = 'to_restart'"),
		'test 3: with the broker down the pipeline fails with class connection');
	ok($node->poll_query_until('postgres',
			"SELECT health = 'held' FROM tide.relay_pipeline_status WHERE pipeline = 'to_restart'"),
		'test 3: and is held');
	usleep(2_000_000);
	is(sqlv("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'to_restart'"), '0',
		'test 3: nothing is dead-lettered while the broker is down');
	$nats->start;
	ok(wait_count('RESTART', 9000, 90), 'test 3: once the broker is back, all 9,000 arrive without help');
	($missing, $dups) = missing_and_duplicates('RESTART', \@rids);
	is($missing, 0, 'test 3: none lost');
	is($dups, 0, 'test 3: none twice');
	ok($node->poll_query_until('postgres',
			"SELECT health = 'healthy' FROM tide.relay_pipeline_status WHERE pipeline = 'to_restart'"),
		'test 3: the pipeline is healthy again');
	is(sqlv("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'to_restart'"), '0',
		'test 3: nothing was dead-lettered');
}

###########################################################################
# 4. Refused messages: dead-lettered with their class; a full stream is
# retried.
###########################################################################
{
	$nats->create_stream('SMALL', 'small.>', 120, 1024);
	$nats->create_stream('FULL', 'full.>', 120, 0, 1);
	$nats->create_stream('SEALED', 'sealed.>', 120);
	$nats->tool('seal', 'SEALED');
	$node->safe_psql('postgres', "SELECT tide.outbox_create('refuse')");
	set_pipeline('to_refuse', 'refuse', { subject => '{dest}', batch_size => 10,
			retry => { base_ms => 100, cap_ms => 200, max_attempts => 2 } });
	my %id;
	my $pub = sub {
		my ($name, $payload, $dest, $more) = @_;
		my $h = defined $dest ? "jsonb_build_object('dest', '$dest')" : "'{}'::jsonb";
		$h .= " || '$more'::jsonb" if defined $more;
		($id{$name}) = split /\n/, sqlv("SELECT tide.outbox_publish('refuse', $payload, $h)");
	};
	$pub->('stream_max', "jsonb_build_object('pad', repeat('x', 2000))", 'small.big');
	$pub->('max_payload', "jsonb_build_object('pad', repeat('x', 1200000))", 'small.huge');
	$pub->('no_stream', "'{}'", 'nostream.x');
	$pub->('no_header', "'{}'", undef);
	$pub->('bad_subject', "'{}'", 'small.a b');
	$pub->('sealed', "'{}'", 'sealed.x');
	$pub->('bad_header', "'{}'", 'small.h', '{"bad name": 1}');
	$pub->('ok', "'{}'", 'small.ok');
	$pub->('full1', "'{}'", 'full.x');
	$pub->('full2', "'{}'", 'full.x');
	ok($node->poll_query_until('postgres',
			"SELECT count(*) = 8 FROM tide.relay_dlq WHERE pipeline_id = 'to_refuse'"),
		'test 4: eight refused messages are dead-lettered');
	my %dlq = map { my ($m, $r, $c) = split /\|/; ($m => "$r $c") } split /\n/,
	  sqlv("SELECT message_id, reason, last_error_class FROM tide.relay_dlq WHERE pipeline_id = 'to_refuse'");
	is($dlq{ $id{stream_max} }, 'permanent too_large', 'test 4: over the stream\'s max_msg_size: too_large, permanent');
	is($dlq{ $id{max_payload} }, 'permanent too_large', 'test 4: over the server\'s max_payload: too_large, permanent');
	is($dlq{ $id{no_stream} }, 'exhausted unknown_destination',
		'test 4: a subject no stream takes: unknown_destination, retried (a server shutting down answers the same) until retry.max_attempts');
	is($dlq{ $id{no_header} }, 'permanent template', 'test 4: a template header missing: template, permanent');
	is($dlq{ $id{bad_subject} }, 'permanent template', 'test 4: a subject with a space: template, permanent');
	is($dlq{ $id{sealed} }, 'permanent refused', 'test 4: a sealed stream: refused, permanent');
	is($dlq{ $id{bad_header} }, 'permanent refused', 'test 4: a header name NATS cannot carry: refused, permanent');
	is($dlq{ $id{full2} }, 'exhausted broker', 'test 4: a full stream (discard new): broker, retried until retry.max_attempts');
	is(sqlv("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'to_refuse' AND message_id = $id{full2}
		   AND status = 'failed' AND error_class = 'broker'"), '2',
		'test 4: the full stream\'s refusal was tried twice, each attempt of class broker');
	my $small = by_id('SMALL');
	my $full = by_id('FULL');
	ok($small->{ $id{ok} } && $full->{ $id{full1} } && !$small->{ $id{stream_max} },
		'test 4: the others were delivered, the refused ones not');
	like(sqlv("SELECT last_error FROM tide.relay_dlq WHERE message_id = $id{max_payload} AND pipeline_id = 'to_refuse'"),
		qr/max_payload/, 'test 4: the error names max_payload');
}

###########################################################################
# 5. Bad configs: 22023 with a hint, nothing written.
###########################################################################
{
	my $url = $nats->url;
	my @bad = (
		[ '{"sink_type": "nats", "subject": "a"}', 'config key "servers" is missing' ],
		[ '{"sink_type": "nats", "servers": "http://127.0.0.1:4222", "subject": "a"}', 'invalid server URL' ],
		[ '{"sink_type": "nats", "servers": "nats://u:p@127.0.0.1:4222", "subject": "a"}', 'must not contain a user name' ],
		[ '{"sink_type": "nats", "servers": [], "subject": "a"}', 'must not be an empty array' ],
		[ qq({"sink_type": "nats", "servers": "$url"}), 'config key "subject" is missing' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "orders.*"}), 'wildcards' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "orders..x"}), 'empty token' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "orders.{type"}), 'malformed placeholder' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "stream": "a.b"}), 'not a valid stream name' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "max_in_flight": 0}), 'max_in_flight' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "max_in_flight": 10001}), 'max_in_flight' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "timeout_ms": 5}), 'timeout_ms' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "auth": {"token": "t", "username": "u", "password": "p"}}), 'exactly one of' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "auth": {"username": "u"}}), 'needs both' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "auth": {"token": ""}}), 'must not be empty' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "auth": {"credentials_file": "x.creds"}}), 'absolute path' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "auth": {"secret": "x"}}), 'auth.secret' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "tls": {"cert_file": "/c.pem"}}), 'both "cert_file" and "key_file"' ],
		[ qq({"sink_type": "nats", "servers": "tls://127.0.0.1:4222", "subject": "a", "tls": false}), 'tls:// URL' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "body": "xml"}), 'body' ],
		[ qq({"sink_type": "nats", "servers": "$url", "subject": "a", "url": "x"}), 'url' ],
	);
	my $refused = 0;
	for my $b (@bad)
	{
		my ($cfg, $want) = @$b;
		my ($rc, $out, $err) = $node->psql('postgres',
			"\\set VERBOSITY verbose\nSELECT tide.relay_set_outbox('bad', 'orders', 'bad', '$cfg')");
		if ($rc != 0 && $err =~ /ERROR:  22023: .*\Q$want\E/ && $err =~ /HINT:  \S/)
		{
			$refused++;
		}
		else
		{
			diag("not refused as expected: $cfg: $err");
		}
	}
	is($refused, scalar(@bad), 'test 5: every bad config is refused with 22023, its message and a hint');
	is(sqlv("SELECT count(*) FROM tide.relay_outbox_config WHERE name = 'bad'"), '0', 'test 5: nothing was written');
	my $norm = sqlv("SELECT config FROM tide.relay_list_configs() WHERE pipeline = 'to_nats'");
	my $c = JSON::PP->new->decode($norm);
	is_deeply([ $c->{servers}, $c->{max_in_flight}, $c->{timeout_ms}, $c->{body}, $c->{tls} ? 1 : 0 ],
		[ [ $nats->url ], 64, 10000, 'payload', 0 ],
		'test 5: the normalised config has servers as a list and the defaults');
}

$nats->stop;
$node->stop;
done_testing();
