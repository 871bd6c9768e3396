# Secrets given as references: a pipeline whose signing secrets come from an
# environment variable of the server and from a file in
# pg_tide.secrets_directory, and whose headers come from both, delivers
# webhooks signed with both secrets (verified here and by the receiver);
# an unset variable, a missing file and a symbolic link in the directory are
# the pipeline's error in relay_pipeline_status and the server log, and the
# relay goes on with the other pipelines; setting the file later heals it.
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
use MIME::Base64 qw(decode_base64);
use Digest::SHA qw(hmac_sha256_base64);
use Time::HiRes qw(time usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
my $secrets_dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;
my @secrets = ('whsec_' . 'ZW52LXNlY3JldC0xMjM0NTY=', 'whsec_' . 'ZmlsZS1zZWNyZXQtNjU0MzIx');

# The server inherits these from the test's environment.
$ENV{PG_TIDE_HOOK_SECRET} = $secrets[0];
$ENV{PG_TIDE_HEADER} = 'from-env';
delete $ENV{PG_TIDE_MISSING};
sub write_file
{
	my ($name, $content) = @_;
	open(my $fh, '>', "$secrets_dir/$name") or die "cannot write $name: $!";
	print $fh $content;
	close $fh;
}
write_file('hook.secret', "$secrets[1]\n");
write_file('token.txt', "Bearer fr0m-file\n");
symlink('/etc/hostname', "$secrets_dir/link.secret") or die "cannot symlink: $!";

my $node = tide_node('secret_refs',
	"pg_tide.relay_naptime_ms = 100\npg_tide.secrets_directory = '$secrets_dir'\n");
my $rcv = PgTide::Receiver->new(dir => $dir);
my $port = $rcv->port;
$rcv->start;
$rcv->control({ secrets => \@secrets });

sub set_pipeline
{
	my ($name, $extra) = @_;
	my $cfg = $json->encode({
		sink_type => 'webhook',
		url => "http://127.0.0.1:$port/$name",
		allow_http => JSON::PP::true,
		allow_private_network => JSON::PP::true,
		retry => { base_ms => 100, cap_ms => 500, max_attempts => 3 },
		%$extra });
	$node->safe_psql('postgres',
		"SELECT tide.relay_set_outbox('$name', 'orders', '${name}_group', '$cfg'::jsonb)");
}

# Polls a query until it returns the wanted value; true when it did in time.
sub wait_until
{
	my ($sql, $want, $timeout) = @_;
	my $deadline = time() + $timeout;
	while (time() < $deadline)
	{
		return 1 if $node->safe_psql('postgres', $sql) eq $want;
		usleep(100_000);
	}
	return 0;
}

sub signature_ok
{
	my ($r) = @_;
	my $h = $r->{headers};
	my %sigs = map { $_ => 1 } split / /, ($h->{'webhook-signature'} // '');
	for my $s (@secrets)
	{
		my $key = decode_base64(substr($s, 6));
		my $mac = hmac_sha256_base64("$h->{'webhook-id'}.$h->{'webhook-timestamp'}.$r->{body}", $key);
		$mac .= '=' while length($mac) % 4;
		return 0 unless $sigs{"v1,$mac"};
	}
	return 1;
}

$node->safe_psql('postgres', "SELECT tide.outbox_create('orders')");
set_pipeline('hook', {
	signing_secret => [ { env => 'PG_TIDE_HOOK_SECRET' }, { file => 'hook.secret' } ],
	headers => { 'Authorization' => { file => 'token.txt' }, 'X-From-Env' => { env => 'PG_TIDE_HEADER' } } });
set_pipeline('no_env', { signing_secret => { env => 'PG_TIDE_MISSING' } });
set_pipeline('no_file', { headers => { 'X-Token' => { file => 'absent.secret' } } });
set_pipeline('via_link', { signing_secret => { file => 'link.secret' } });

$node->safe_psql('postgres',
	"SELECT tide.outbox_publish('orders', jsonb_build_object('n', i)) FROM generate_series(1, 5) i");

ok($rcv->wait_for(sub { (grep { $_->{status} == 200 && $_->{path} eq '/hook' } @{ $_[0] }) >= 5 }, 30),
	'the five messages arrive through the pipeline whose secrets are references');
my @reqs = grep { $_->{path} eq '/hook' } $rcv->requests;
is(scalar(grep { !signature_ok($_) } @reqs), 0, 'every signature verifies with the secret from the environment and the one from the file');
is(scalar(grep { !$_->{sig} } @reqs), 0, 'the receiver verifies every signature too');
is(scalar(grep { ($_->{headers}{authorization} // '') ne 'Bearer fr0m-file'
			  || ($_->{headers}{'x-from-env'} // '') ne 'from-env' } @reqs),
	0, 'the headers from the file (trailing newline removed) and the environment arrive');

ok(wait_until("SELECT health || ' ' || last_error FROM tide.relay_pipeline_status WHERE pipeline = 'no_env'",
			  'failing environment variable "PG_TIDE_MISSING" is not set in the server\'s environment', 30),
	'an unset environment variable is the pipeline\'s error');
ok(wait_until("SELECT health || ' ' || (last_error LIKE 'could not open secret file \"%/absent.secret\": No such file%') FROM tide.relay_pipeline_status WHERE pipeline = 'no_file'",
			  'failing true', 30),
	'a missing file is the pipeline\'s error');
ok(wait_until("SELECT health || ' ' || (last_error LIKE 'could not open secret file \"%/link.secret\": Too many levels of symbolic links') FROM tide.relay_pipeline_status WHERE pipeline = 'via_link'",
			  'failing true', 30),
	'a symbolic link in the secrets directory is refused');
is($node->safe_psql('postgres',
	"SELECT string_agg(pipeline || '=' || last_error_class, ',' ORDER BY pipeline) FROM tide.relay_pipeline_status WHERE last_error_class IS NOT NULL"),
	'no_env=secret_reference,no_file=secret_reference,via_link=secret_reference',
	'the error class is secret_reference');
is(scalar(grep { $_->{path} ne '/hook' } $rcv->requests), 0, 'nothing was sent without its secret');
my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile);
like($log, qr/pg_tide relay pipeline "no_env" is passed over: environment variable "PG_TIDE_MISSING" is not set/,
	'the server log names the pipeline and the reference');
is(scalar(() = $log =~ /pipeline "no_env" is passed over/g), 1, 'logged once, not on every pass');

# The file appears: the pipeline heals at its next pass and delivers.
write_file('absent.secret', "t0ken\n");
$node->safe_psql('postgres', "SELECT tide.outbox_publish('orders', '{\"n\": 6}')");
ok($rcv->wait_for(sub { (grep { $_->{status} == 200 && $_->{path} eq '/no_file' } @{ $_[0] }) >= 6 }, 30),
	'once the file exists, the pipeline delivers everything');
is((grep { $_->{path} eq '/no_file' } $rcv->requests)[0]{headers}{'x-token'}, 't0ken', 'with the header from the file');
ok(wait_until("SELECT health FROM tide.relay_pipeline_status WHERE pipeline = 'no_file'", 'healthy', 30),
	'and is healthy again');

$rcv->stop;
$node->stop;
done_testing();
