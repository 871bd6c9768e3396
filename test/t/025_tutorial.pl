# docs/tutorial.md runs as written: every ```sql block of it, in order, each
# in a psql session of its own with ON_ERROR_STOP, in a fresh database of a
# node with pg_tide preloaded, with the tutorial's receiver URL
# (http://127.0.0.1:8080/hook, the one placeholder) replaced by the URL of a
# started test/receiver that knows the tutorial's signing secret. Then the
# outcome: the webhook got the paid order's message with a valid Standard
# Webhooks signature (checked by the receiver and here), the tutorial
# received the message into its inbox twice (inbox_receive true, then
# false), and the inbox processed it exactly once (one shipment, one
# processed event, no failure). A block that errors fails the test.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::Bin/../perl";
use PgTide::TestNode;
use PgTide::Receiver;
use PgTide::Docs qw(fenced_blocks);
use JSON::PP;
use MIME::Base64 qw(decode_base64);
use Digest::SHA qw(hmac_sha256_base64);

my $tutorial = "$FindBin::Bin/../../docs/tutorial.md";
my $placeholder = 'http://127.0.0.1:8080/hook';

# The ```sql blocks of the tutorial, in order: [first line number, text].
my ($blocks, $closed) = fenced_blocks($tutorial, 'sql');
my @blocks = @$blocks;
ok($closed, 'every ```sql block of the tutorial is closed');
cmp_ok(scalar @blocks, '>=', 5, 'the tutorial has its sql blocks (' . scalar(@blocks) . ')');

my $text = PostgreSQL::Test::Utils::slurp_file($tutorial);
ok((grep { index($_->[1], $placeholder) >= 0 } @blocks), "an sql block names the receiver as $placeholder");

# The signing secret: one, the same in the SQL and in the receiver's set-up.
my %secrets = map { $_ => 1 } $text =~ /(whsec_[A-Za-z0-9+\/=]+)/g;
is(scalar keys %secrets, 1, 'the tutorial uses one signing secret throughout');
my ($secret) = keys %secrets;

my $dir = PostgreSQL::Test::Utils::tempdir;
my $rcv = PgTide::Receiver->new(dir => $dir);
$rcv->start;
$rcv->control({ secrets => [$secret] });
my $url = $rcv->url('/hook');

my $node = tide_node('tutorial');
$node->safe_psql('postgres', 'CREATE DATABASE shop');

my $json = JSON::PP->new;
my @received;    # what each inbox_receive of the tutorial returned, in order
my $all_ran = 1;
for my $i (0 .. $#blocks)
{
	my ($lineno, $sql) = @{ $blocks[$i] };
	$sql =~ s/\Q$placeholder\E/$url/g;
	my ($out, $err) = ('', '');
	my $ret = $node->psql('shop', $sql, on_error_stop => 1, stdout => \$out, stderr => \$err);
	my $ran = ok($ret == 0 && $err !~ /\bERROR:/,
		'sql block ' . ($i + 1) . " (docs/tutorial.md line $lineno) runs");
	unless ($ran)
	{
		diag("psql exited with $ret:\n$err");
		$all_ran = 0;
		last;
	}

	# psql -At: a receive prints "<id>|t" or "<id>|f"
	push @received, $out =~ /^\d+\|([tf])$/mg if $sql =~ /tide\.inbox_receive\s*\(/;

	# The relay delivers after the publishing commit: the next blocks look at it.
	if ($sql =~ /tide\.outbox_publish\s*\(/)
	{
		ok($rcv->wait_for(sub { grep { $_->{status} == 200 } @{ $_[0] } }, 60),
			'the webhook got a request after the publishing block');
	}
}
ok($all_ran, 'every sql block of the tutorial ran');

# The message the tutorial published.
my $msg = $node->safe_psql('shop',
	q{SELECT id || '|' || (payload->>'order_id') || '|' || (headers->>'type')
	    FROM tide.tide_outbox_messages WHERE outbox_name = 'orders'});
like($msg, qr/^\d+\|42\|order\.paid$/, 'the tutorial published one order.paid message for order 42');
my ($id) = split /\|/, $msg;
$id //= -1;

# The webhook got it, signed, and the signature verifies.
my @reqs = grep { $_->{path} eq '/hook' } $rcv->requests;
cmp_ok(scalar @reqs, '>=', 1, 'the webhook received the message');
my $key = decode_base64(substr($secret, length 'whsec_'));
for my $r (@reqs)
{
	my $body = eval { $json->decode($r->{body}) } // {};
	my $h = $r->{headers};
	is($h->{'webhook-id'}, "outbox_orders:$id", 'webhook-id is the message identity');
	is($body->{message_id}, $id, 'the body is the published message');
	is($body->{payload}{order_id}, 42, 'the body carries order 42');
	ok($r->{sig}, 'the receiver verified the signature with the tutorial\'s secret');
	my $expected = hmac_sha256_base64("$h->{'webhook-id'}.$h->{'webhook-timestamp'}.$r->{body}", $key);
	$expected .= '=' while length($expected) % 4;
	ok((grep { $_ eq "v1,$expected" } split / /, $h->{'webhook-signature'} // ''),
		'webhook-signature is the HMAC-SHA256 of id.timestamp.body');
	is($r->{status}, 200, 'the webhook acknowledged it');
}
is($rcv->stats->{sig_bad}, 0, 'no request had a bad signature');

# Received twice, stored once, processed once.
is_deeply(\@received, [ 't', 'f' ],
	'the tutorial received the message into the inbox twice: new, then a duplicate');
is( $node->safe_psql('shop',
		q{SELECT count(*) || '|' || count(processed_at) || '|' || coalesce(max(retry_count), -1)
		         || '|' || coalesce(max(event_id), '')
		    FROM shipping.orders_inbox}),
	"1|1|0|outbox_orders:$id",
	'the inbox holds the event once, processed, never failed');
is($node->safe_psql('shop', q{SELECT string_agg(order_id::text, ',') FROM shipping.shipments}),
	'42', 'the handler ran once: one shipment, for order 42');
is($node->safe_psql('shop', q{SELECT status FROM shop.orders WHERE id = 42}),
	'paid', 'the order is paid');
is( $node->safe_psql('shop',
		q{SELECT count(*) FROM tide.relay_attempts
		   WHERE pipeline_id = 'orders_to_billing' AND status = 'success'}),
	scalar(grep { $_->{status} == 200 } @reqs),
	'the attempt log has the delivery');

$rcv->stop;
$node->stop;
done_testing();
