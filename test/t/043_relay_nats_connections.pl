# The NATS sink's connections, against real nats-servers started here:
#  1. a server nobody listens on yet: the pipeline is held with class
#     connection, nothing is dead-lettered, and once a server starts on
#     that port everything arrives;
#  2. user and password: a wrong password is class auth (held, nothing
#     dead-lettered, nothing sent); the right one, read from an
#     {"env": "PG_TIDE_..."} reference, delivers everything; the password
#     is redacted in relay_list_configs and appears in no log;
#  3. a token;
#  4. TLS (tls:// with the server's CA): delivered; without the CA the
#     certificate is refused (class connection, held);
#  5. ordering "key" with many in flight: each key's messages in order;
#  6. a publish heard but never acknowledged: class timeout, retried, then
#     dead-lettered as exhausted;
#  7. servers that never answer (SYNs dropped): the connect does not hold
#     the worker, a file pipeline beside it delivers meanwhile; then held,
#     class connection.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode qw(tide_node wait_until unanswered_port);
use PgTide::NatsServer;
use JSON::PP;
use Time::HiRes qw(time usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new->canonical;
$ENV{PG_TIDE_NATS_PASSWORD} = 'pw-right-4f1c';
my $node = tide_node('nats_conn', "pg_tide.relay_naptime_ms = 200\n");
my @servers;

sub sqlv
{
	return $node->safe_psql('postgres', $_[0]);
}

# Sets pipeline $name (outbox of the same name) with the config keys given.
sub set_pipeline
{
	my ($name, $keys) = @_;
	my $cfg = $json->encode({ sink_type => 'nats', subject => "$name.x", batch_size => 50,
			retry => { base_ms => 100, cap_ms => 300 }, %$keys });
	sqlv("SELECT tide.relay_set_outbox('$name', '$name', '$name', '$cfg')");
}

# Publishes n messages to outbox $name; returns their ids.
sub publish
{
	my ($name, $n) = @_;
	return split /\n/, sqlv("SELECT tide.outbox_publish('$name', jsonb_build_object('n', g),
		   jsonb_build_object('k', 'key' || (g % 7)))
		   FROM generate_series(1, $n) g");
}

# The ids in the stream, in stream order.
sub stream_ids
{
	my ($nats, $stream) = @_;
	return map { ($_->{headers}{'tide-id'} // '') =~ /:(\d+)$/ ? $1 : () } $nats->messages($stream);
}

# Whether the stream holds exactly the ids, each once.
sub holds_exactly
{
	my ($nats, $stream, $ids) = @_;
	my @got = sort { $a <=> $b } stream_ids($nats, $stream);
	return "@got" eq join(' ', sort { $a <=> $b } @$ids);
}

# Waits until the pipeline's last error class is $class and it is held.
sub held_with
{
	my ($name, $class) = @_;
	return $node->poll_query_until('postgres',
		"SELECT last_error_class = '$class' AND health = 'held'
		   FROM tide.relay_pipeline_status WHERE pipeline = '$name'");
}

sub dead_letters
{
	return sqlv("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = '$_[0]'");
}

###########################################################################
# 1. No server yet on the port: held, class connection; then it starts.
###########################################################################
{
	sqlv("SELECT tide.outbox_create('late')");
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $nats = PgTide::NatsServer->new(dir => $dir, port => $port);
	push @servers, $nats;
	set_pipeline('late', { servers => $nats->url });
	my @ids = publish('late', 120);
	ok(held_with('late', 'connection'), 'test 1: nothing listening: the pipeline is held, class connection');
	like(sqlv("SELECT last_error FROM tide.relay_pipeline_status WHERE pipeline = 'late'"),
		qr/cannot connect to NATS/, 'test 1: the error says it cannot connect');
	cmp_ok(sqlv("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'late' AND error_class = 'connection'"),
		'>', 0, 'test 1: relay_attempts records the attempts with class connection');
	usleep(1_000_000);
	is(dead_letters('late'), '0', 'test 1: nothing is dead-lettered');
	$nats->start;
	$nats->create_stream('LATE', 'late.>', 120);
	ok(defined wait_until(sub { $nats->count('LATE') >= 120 }, 30), 'test 1: once the server is up, the messages arrive');
	ok(holds_exactly($nats, 'LATE', \@ids), 'test 1: each exactly once');
}

###########################################################################
# 2. User and password.
###########################################################################
{
	sqlv("SELECT tide.outbox_create('auth')");
	my $nats = PgTide::NatsServer->new(dir => $dir, user => 'tide', password => 'pw-right-4f1c');
	push @servers, $nats;
	$nats->start;
	$nats->create_stream('AUTH', 'auth.>', 120);
	set_pipeline('auth', { servers => $nats->url, auth => { username => 'tide', password => 'pw-wrong-9d2e' } });
	my @ids = publish('auth', 100);
	ok(held_with('auth', 'auth'), 'test 2: a wrong password: held, class auth');
	like(sqlv("SELECT last_error FROM tide.relay_pipeline_status WHERE pipeline = 'auth'"),
		qr/[Aa]uthoriz|[Aa]uthentic/, 'test 2: the error says authorisation was refused');
	usleep(1_000_000);
	is(dead_letters('auth'), '0', 'test 2: nothing is dead-lettered');
	is($nats->count('AUTH'), '0', 'test 2: nothing was sent');
	my $listed = sqlv("SELECT config FROM tide.relay_list_configs() WHERE pipeline = 'auth'");
	ok($listed !~ /pw-wrong/ && $listed =~ /"password": "\*+"/, 'test 2: relay_list_configs redacts the password');
	set_pipeline('auth', { servers => $nats->url,
			auth => { username => 'tide', password => { env => 'PG_TIDE_NATS_PASSWORD' } } });
	ok(defined wait_until(sub { $nats->count('AUTH') >= 100 }, 30),
		'test 2: the right password from an env reference: everything arrives');
	ok(holds_exactly($nats, 'AUTH', \@ids), 'test 2: each exactly once');
	# (the inline one is in the log of the statements this test ran)
	my @relay_lines = grep { /pg_tide relay/ } split /\n/, slurp_file($node->logfile);
	cmp_ok(scalar(@relay_lines), '>', 0, 'test 2: the relay logged about the pipeline');
	ok(!grep({ /pw-wrong-9d2e/ } @relay_lines) && slurp_file($node->logfile) !~ /pw-right-4f1c/,
		'test 2: no password is in a relay line of the server log, and the referenced one nowhere in it');
	is(sqlv("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'auth'
			   AND (error LIKE '%pw-%' OR response_snippet LIKE '%pw-%')"), '0',
		'test 2: nor in relay_attempts');
}

###########################################################################
# 3. A token.
###########################################################################
{
	sqlv("SELECT tide.outbox_create('tok')");
	my $nats = PgTide::NatsServer->new(dir => $dir, token => 'tok-7a61');
	push @servers, $nats;
	$nats->start;
	$nats->create_stream('TOK', 'tok.>', 120);
	set_pipeline('tok', { servers => $nats->url, auth => { token => 'tok-7a61' } });
	my @ids = publish('tok', 50);
	ok(defined wait_until(sub { $nats->count('TOK') >= 50 }, 30), 'test 3: with the token everything arrives');
	ok(holds_exactly($nats, 'TOK', \@ids), 'test 3: each exactly once');
	like(sqlv("SELECT config FROM tide.relay_list_configs() WHERE pipeline = 'tok'"), qr/"token": "\*+"/,
		'test 3: the token is redacted');
}

###########################################################################
# 4. TLS.
###########################################################################
{
	my ($cert, $key) = ("$dir/nats-cert.pem", "$dir/nats-key.pem");
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', $key,
			'-out', $cert, '-days', '1', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1' ],
		'<', \undef, '>', \$out, '2>', \$err) or die "openssl: $err";
	chmod 0644, $cert, $key;
	sqlv("SELECT tide.outbox_create('sec')");
	my $nats = PgTide::NatsServer->new(dir => $dir, tls_cert => $cert, tls_key => $key);
	push @servers, $nats;
	$nats->start;
	$nats->create_stream('SEC', 'sec.>', 120);
	set_pipeline('sec', { servers => $nats->url, tls => JSON::PP::true });
	my @ids = publish('sec', 30);
	ok(held_with('sec', 'connection'), 'test 4: a certificate not signed by a trusted CA: held, class connection');
	is(dead_letters('sec'), '0', 'test 4: nothing is dead-lettered');
	set_pipeline('sec', { servers => $nats->url, tls => { ca_file => $cert } });
	ok(defined wait_until(sub { $nats->count('SEC') >= 30 }, 30), 'test 4: with the server\'s CA everything arrives over TLS');
	ok(holds_exactly($nats, 'SEC', \@ids), 'test 4: each exactly once');
}

###########################################################################
# 5. Ordering "key": with 50 in flight, each key's messages in id order.
###########################################################################
{
	sqlv("SELECT tide.outbox_create('keyed')");
	my $nats = PgTide::NatsServer->new(dir => $dir);
	push @servers, $nats;
	$nats->start;
	$nats->create_stream('KEYED', 'keyed.>', 120);
	set_pipeline('keyed', { servers => $nats->url, ordering => 'key', ordering_key => 'k', max_in_flight => 50 });
	my @ids = publish('keyed', 700);
	ok(defined wait_until(sub { $nats->count('KEYED') >= 700 }, 30), 'test 5: all 700 arrive');
	my %last;
	my $out_of_order = 0;
	for my $m ($nats->messages('KEYED'))
	{
		my ($id) = $m->{headers}{'tide-id'} =~ /:(\d+)$/;
		my $k = $m->{headers}{k};
		$out_of_order++ if defined $last{$k} && $id < $last{$k};
		$last{$k} = $id;
	}
	is($out_of_order, 0, 'test 5: no key\'s messages out of order');
	is(scalar(keys %last), 7, 'test 5: seven keys');
}

###########################################################################
# 6. No acknowledgement: a core subscriber, not a stream, hears the subject.
###########################################################################
{
	sqlv("SELECT tide.outbox_create('slow')");
	my $nats = PgTide::NatsServer->new(dir => $dir);
	push @servers, $nats;
	$nats->start;
	my $silent = $nats->silent('slow.x');
	set_pipeline('slow', { servers => $nats->url, timeout_ms => 500,
			retry => { base_ms => 100, cap_ms => 200, max_attempts => 2 } });
	my ($id) = publish('slow', 1);
	ok($node->poll_query_until('postgres',
			"SELECT reason = 'exhausted' AND last_error_class = 'timeout'
			   FROM tide.relay_dlq WHERE pipeline_id = 'slow' AND message_id = $id"),
		'test 6: never acknowledged: class timeout, dead-lettered once retry.max_attempts ran out');
	is(sqlv("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'slow' AND message_id = $id
			   AND status = 'failed' AND error_class = 'timeout'"), '2',
		'test 6: two attempts, each a timeout');
	$silent->kill_kill;
}

$_->stop for @servers;
###########################################################################
# 7. Servers that never answer (unanswered_port: the kernel drops the
# relay's SYNs):
# the connect waits on a thread of its own, not in the worker's loop, so
# a file pipeline beside it, in the same worker, has delivered its
# messages before the NATS pipeline's connect has failed (four servers,
# two seconds each).
###########################################################################
{
	my @silent = map { [ unanswered_port() ] } 1 .. 4;
	my $file = "$dir/beside.jsonl";
	sqlv("SELECT tide.outbox_create('unanswered')");
	sqlv("SELECT tide.outbox_create('beside')");
	set_pipeline('unanswered', { servers => [ map { 'nats://127.0.0.1:' . $_->[0] } @silent ],
			timeout_ms => 15000 });
	publish('unanswered', 3);
	sqlv("SELECT tide.relay_set_outbox('beside', 'beside', 'beside',
		jsonb_build_object('sink_type', 'file', 'path', '$file'))");
	# the NATS pipeline's connect has begun when the file's messages come
	usleep(500_000);
	sqlv("SELECT tide.outbox_publish('beside', jsonb_build_object('n', g)) FROM generate_series(1, 10) g");
	my $lines = sub { open(my $fh, '<', $file) or return 0; my @l = <$fh>; return scalar @l };
	ok(defined wait_until(sub { $lines->() >= 10 }, 30, 20_000), 'test 7: the file pipeline delivers its 10 messages');
	is(sqlv("SELECT count(*) FROM tide.relay_attempts WHERE pipeline_id = 'unanswered'"), '0',
		'test 7: before the connect to the servers that never answer has failed');
	ok($node->poll_query_until('postgres',
			"SELECT health = 'held' AND last_error_class = 'connection' FROM tide.relay_pipeline_status
			  WHERE pipeline = 'unanswered'"),
		'test 7: the NATS pipeline is then held, class connection');
	is(sqlv("SELECT count(*) FROM tide.relay_dlq WHERE pipeline_id = 'unanswered'"), '0',
		'test 7: nothing is dead-lettered');
	sqlv("SELECT tide.relay_delete('unanswered')");
	sqlv("SELECT tide.relay_delete('beside')");
	$_->[1]->() for @silent;
}

$node->stop;
done_testing();
