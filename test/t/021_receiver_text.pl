# Text from a receiver is stored valid in the database encoding, whatever
# the receiver sent: a latin-1 body, and a UTF-8 body with a two-byte
# character across byte 120 (where the error text cuts the body) and
# another across byte 2047 (where the sink stops keeping it). With 4xx
# answers (dead-lettered at once) and 5xx (retried), relay_dlq,
# relay_attempts, relay_retry_queue and relay_pipeline_health hold valid
# UTF-8 (the cut characters dropped, invalid bytes as '?', line breaks as
# spaces); relay_dlq_list() works under client_encoding LATIN1; and a
# pg_dump of the database restores with every dead letter and attempt.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use PgTide::Receiver;
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use Time::HiRes qw(time usleep);

my $node = tide_node('texts', "pg_tide.relay_naptime_ms = 100\n");
my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;
my $rcv = PgTide::Receiver->new(dir => $dir, log => 0);
$rcv->start;

# A UTF-8 database whatever the cluster's default encoding (SQL_ASCII
# would take any bytes).
$node->safe_psql('postgres',
	q{CREATE DATABASE texts ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$node->safe_psql('texts', q{
	CREATE EXTENSION pg_tide;
	SELECT tide.outbox_create('orders');
	-- whether a text is valid in the database encoding (convert_to checks)
	CREATE FUNCTION public.valid_text(t text) RETURNS boolean LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM convert_to(t, 'UTF8');
		RETURN true;
	EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
		RETURN false;
	END
	$$;
});
my $cfg = $json->encode({
	sink_type => 'webhook',
	url => $rcv->url('/hook'),
	allow_http => JSON::PP::true,
	allow_private_network => JSON::PP::true,
	retry => { base_ms => 50, cap_ms => 200, max_attempts => 100 } });
$node->safe_psql('texts', "SELECT tide.relay_set_outbox('hook', 'orders', 'hook', '$cfg'::jsonb)");

# Bodies as raw bytes. "\xc3\xa9" is é in UTF-8.
my $latin1 = "Fehler: ung\xfcltige Gr\xf6\xdfe, caf\xe9\n";
my $utf8 = ('a' x 119) . "\xc3\xa9" . ('b' x 1925) . "\xc3\xa9" . " tail\n";
is(length($utf8), 2054, 'the UTF-8 body: é at bytes 120-121 and 2047-2048');

# What the cleaned texts are.
my $latin1_clean = 'Fehler: ung?ltige Gr??e, caf?';
my $utf8_error = ('a' x 119);    # the é cut at byte 120 is dropped
my $utf8_snippet = ('a' x 119) . "\xc3\xa9" . ('b' x 1925);    # and the one at 2047

# Polls a query in database texts until it returns the value (10 s).
sub wait_value
{
	my ($query, $want, $timeout) = @_;
	my $deadline = time() + ($timeout // 10);
	my $got;
	while (time() < $deadline)
	{
		$got = $node->safe_psql('texts', $query);
		return $got if $got eq $want;
		usleep(50_000);
	}
	return $got;
}

# Every text a receiver's answer may reach, with whether it is valid.
my $all_texts = q{
	SELECT 'dlq', last_error FROM tide.relay_dlq
	UNION ALL SELECT 'attempts', error FROM tide.relay_attempts
	UNION ALL SELECT 'attempts', response_snippet FROM tide.relay_attempts
	UNION ALL SELECT 'queue', last_error FROM tide.relay_retry_queue
	UNION ALL SELECT 'health', last_error FROM tide.relay_pipeline_health
};
sub invalid_texts
{
	return $node->safe_psql('texts',
		"SELECT coalesce(string_agg(DISTINCT t.w, ','), 'none')
		   FROM ($all_texts) t (w, v) WHERE v IS NOT NULL AND NOT public.valid_text(v)");
}

# 1. 4xx: permanent, dead-lettered at once, with each body.
my @dead;
for my $case ([ 'latin-1', $latin1, 422 ], [ 'UTF-8', $utf8, 400 ])
{
	my ($name, $body, $code) = @$case;
	$rcv->control({ always => $code, fail_body => encode_base64($body, '') });
	my $id = $node->safe_psql('texts', q{SELECT tide.outbox_publish('orders', '{"n": 1}')});
	push @dead, $id;
	is(wait_value("SELECT count(*) FROM tide.relay_dlq WHERE message_id = $id", '1'), '1',
		"$code with a $name body: dead-lettered");
}
is($node->safe_psql('texts', "SELECT last_error FROM tide.relay_dlq WHERE message_id = $dead[0]"),
	"HTTP status 422, response: $latin1_clean",
	'latin-1: the invalid bytes are ? in the error, the line break is gone');
is($node->safe_psql('texts', "SELECT response_snippet FROM tide.relay_attempts WHERE message_id = $dead[0]"),
	$latin1_clean, 'latin-1: the same in the snippet');
is($node->safe_psql('texts', "SELECT last_error FROM tide.relay_dlq WHERE message_id = $dead[1]"),
	"HTTP status 400, response: $utf8_error",
	'UTF-8: the error is cut before the character that byte 120 fell in');
is($node->safe_psql('texts', "SELECT error FROM tide.relay_attempts WHERE message_id = $dead[1]"),
	"HTTP status 400, response: $utf8_error", 'UTF-8: the same error in the attempt log');
is($node->safe_psql('texts', "SELECT response_snippet FROM tide.relay_attempts WHERE message_id = $dead[1]"),
	$utf8_snippet, 'UTF-8: the snippet is cut before the character that byte 2047 fell in');
is(invalid_texts(), 'none', 'after the 4xx: every stored text is valid UTF-8');

# 2. 5xx: retried; the retry queue and the health row keep the last error.
$rcv->control({ always => 503, fail_body => encode_base64($latin1, '') });
my $retried = $node->safe_psql('texts', q{SELECT tide.outbox_publish('orders', '{"n": 2}')});
is(wait_value("SELECT last_error FROM tide.relay_retry_queue WHERE message_id = $retried AND attempts >= 2",
		"HTTP status 503, response: $latin1_clean"),
	"HTTP status 503, response: $latin1_clean", '503 with a latin-1 body: queued with a valid error');
is(wait_value(q{SELECT last_error FROM tide.relay_pipeline_health WHERE pipeline_id = 'hook'},
		"HTTP status 503, response: $latin1_clean"),
	"HTTP status 503, response: $latin1_clean", 'and the health row');
is(invalid_texts(), 'none', 'every stored text is valid UTF-8');
$rcv->control({ fail_body => encode_base64($utf8, '') });
is(wait_value("SELECT last_error FROM tide.relay_retry_queue WHERE message_id = $retried",
		"HTTP status 503, response: $utf8_error"),
	"HTTP status 503, response: $utf8_error", '503 with the UTF-8 body: queued with the error cut whole');
is(wait_value(q{SELECT last_error FROM tide.relay_pipeline_health WHERE pipeline_id = 'hook'},
		"HTTP status 503, response: $utf8_error"),
	"HTTP status 503, response: $utf8_error", 'and the health row');
is(invalid_texts(), 'none', 'every stored text is valid UTF-8');

# 3. A client that converts: LATIN1 has é but not the bytes of a cut one.
my ($rc, $out, $err) = $node->psql('texts',
	q{SET client_encoding = 'LATIN1';
	  \o /dev/null
	  SELECT * FROM tide.relay_dlq_list();
	  SELECT * FROM tide.relay_attempts;
	  SELECT * FROM tide.relay_pipeline_health;
	  SELECT * FROM tide.relay_retry_queue;
	  \o
	  SELECT count(*) FROM tide.relay_dlq_list();
	  SELECT count(*) FROM tide.relay_retry_queue;});
is($rc, 0, 'client_encoding LATIN1: relay_dlq_list() and the tables can be read');
is($err, '', 'without an error');
is($out, "2\n1", 'every row');

# 4. pg_dump and restore: every dead letter and attempt is there.
$rcv->control({ always => undef });
is(wait_value("SELECT count(*) FROM tide.relay_retry_queue", '0'), '0', 'the retried message is delivered');
$node->safe_psql('texts', q{SELECT tide.relay_disable('hook')});
my $attempts = $node->safe_psql('texts', 'SELECT count(*) FROM tide.relay_attempts');
cmp_ok($attempts, '>=', 6, "$attempts attempts logged");
my $dump = "$dir/texts.sql";
$node->command_ok([ 'pg_dump', '-d', $node->connstr('texts'), '-f', $dump ], 'pg_dump');
$node->safe_psql('postgres',
	q{CREATE DATABASE texts_restored ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0});
$node->command_ok(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('texts_restored'), '-f', $dump ],
	'the dump restores');
my $contents = q{
	SELECT (SELECT count(*) || ':' || md5(string_agg(message_id || last_error, ',' ORDER BY id)) FROM tide.relay_dlq),
		   (SELECT count(*) || ':' || md5(string_agg(message_id || coalesce(error, '') || coalesce(response_snippet, ''), ',' ORDER BY id))
			  FROM tide.relay_attempts),
		   (SELECT string_agg(last_error, ',') FROM tide.relay_pipeline_health)
};
my $restored = $node->safe_psql('texts_restored', $contents);
is($restored, $node->safe_psql('texts', $contents), 'the dead letters, attempts and health are restored');
like($restored, qr/\A2:/, 'both dead letters');

$rcv->stop;
$node->stop;
done_testing();
