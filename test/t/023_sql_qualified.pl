# Every SQL statement in the extension's C code names its functions,
# operators and tables with their schema (and, in the publishing path, which
# runs in its caller's search_path, its types too), so that no object a
# database owner or caller creates can stand in for one of pg_catalog's.
# The relay worker also pins its search_path (relay/session.c,
# test/t/022_relay_worker_privileges.pl); this test keeps the second line of
# defence honest on its own.
#
# The statements are taken from the preprocessed sources (so macros and
# adjacent string literals are joined as the compiler joins them) and
# checked by test/sql_names (libpg_query: PostgreSQL's parser), which first
# shows that it finds each kind of unqualified name.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use IPC::Run qw(run);

my $root = "$FindBin::Bin/../..";
my $checker = "$root/test/sql_names";
plan skip_all => "$checker is missing: make test/sql_names (make installcheck builds it)"
  unless -x $checker;

# Runs the checker on statements (label => sql); returns its exit code and output.
sub check
{
	my ($types, %stmts) = @_;
	my $in = join("\0", map { "$_\n$stmts{$_}" } sort keys %stmts) . "\0";
	my $out = '';
	run([ $checker, $types ? ('--types') : () ], '<', \$in, '>', \$out);
	return ($? >> 8, $out);
}

# The checker finds what it must.
my %bad = (
	function => 'SELECT to_json(now())',
	aggregate => 'SELECT pg_catalog.count(*) FROM tide.t GROUP BY min(x)',
	operator => 'SELECT 1 FROM tide.t WHERE a = $1',
	any => 'SELECT 1 FROM tide.t WHERE a = ANY ($1)',
	in_list => 'SELECT 1 FROM tide.t WHERE a IN (1, 2)',
	in_query => 'DELETE FROM tide.t WHERE id IN (SELECT id FROM tide.t)',
	distinct => 'SELECT a IS NOT DISTINCT FROM b FROM tide.t',
	nullif => 'SELECT pg_catalog.nullif(a, 0), nullif(b, 0) FROM tide.t',
	case_arg => 'SELECT CASE a WHEN 1 THEN 2 END FROM tide.t',
	table => 'SELECT 1 FROM relay_outbox_config',
	update_op => 'UPDATE tide.t SET a = a + 1',
	nested => 'INSERT INTO tide.t SELECT x FROM pg_catalog.unnest($1) u(x) WHERE x OPERATOR(pg_catalog.>) length(x)',
);
for my $k (sort keys %bad)
{
	my ($rc, $out) = check(0, $k => $bad{$k});
	is($rc, 1, "the checker reports an unqualified name: $k") or diag($out);
}
my ($type_rc) = check(1, type => 'SELECT $1::text');
is($type_rc, 1, 'the checker reports an unqualified type with --types');
my ($parse_rc) = check(0, fragment => "SELECT a FROM tide.t WHERE");
is($parse_rc, 2, 'the checker fails on a statement that does not parse');
my ($good_rc, $good_out) = check(1, good =>
	  'WITH u AS (SELECT * FROM pg_catalog.unnest($1::pg_catalog.int8[]) AS u(id))'
	  . ' UPDATE tide.t SET a = u.id, b = pg_catalog.now() FROM u'
	  . ' WHERE t.id OPERATOR(pg_catalog.=) u.id AND t.x OPERATOR(pg_catalog.=) ANY ($2)'
	  . ' AND t.id OPERATOR(pg_catalog.=) ANY (SELECT c.id FROM tide.c)'
	  . ' AND coalesce(t.y, 0) OPERATOR(pg_catalog.<) greatest(1, 2)::bigint');
is($good_rc, 0, 'the checker passes a fully qualified statement') or diag($good_out);

# The SQL statements of one source file: its string literals, joined as
# the compiler joins adjacent ones, that begin with a statement keyword in
# capitals, as the project writes them, followed by more (a literal of one
# word, such as "update", is a name; a message beginning "With ..." is not SQL).
sub statements_of
{
	my ($file) = @_;
	# (an endpoint's files include their own directory's headers, and libpq's)
	my @cflags = ('-I' . `pg_config --includedir-server`, '-I' . `pg_config --includedir`,
		"-I$root/src", "-I$root/relay", '-I' . ($file =~ s{/[^/]*$}{}r));
	chomp @cflags;
	my $text = '';
	my $err = '';
	run([ $ENV{CC} // 'cc', '-E', '-P', @cflags, $file ], '>', \$text, '2>', \$err)
	  or BAIL_OUT("cannot preprocess $file: $err");
	my @stmts;
	my $run;
	while ($text =~ /\G(?:('(?:[^'\\\n]|\\.)*')|("(?:[^"\\\n]|\\.)*")|(\s+)|([^'"\s]+|.))/gs)
	{
		if (defined $2)
		{
			my $s = substr($2, 1, -1);
			$s =~ s/\\(x[0-9a-fA-F]{1,2}|[0-7]{1,3}|.)/unescape($1)/ge;
			$run = defined $run ? $run . $s : $s;
		}
		elsif (defined $3)
		{
			next;
		}
		else
		{
			push @stmts, $run if defined $run && $run =~ /^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b\s*\S/;
			undef $run;
		}
	}
	return @stmts;
}

# One C escape sequence's character.
sub unescape
{
	my ($e) = @_;
	return chr(hex(substr($e, 1))) if $e =~ /^x/;
	return chr(oct($e)) if $e =~ /^[0-7]/;
	return { n => "\n", t => "\t", r => "\r", '\\' => '\\', '"' => '"', "'" => "'" }->{$e} // $e;
}

# Files whose SQL runs in the caller's search_path: types are checked too.
my %caller_path = map { $_ => 1 } qw(src/outbox.c src/outbox_rights.c);

my $total = 0;
for my $file (sort(glob("$root/src/*.c"), glob("$root/relay/*.c"), glob("$root/relay/*/*.c"),
	glob("$root/relay/*/*/*.c")))
{
	(my $rel = $file) =~ s{^\Q$root\E/}{};
	my $source = slurp_file($file);
	my @stmts = statements_of($file);
	$total += @stmts;
	# A file that runs SQL must show it here, or its SQL went unchecked.
	if ($source =~ /SPI_execute\w*\(\s*"|TidePlan\(&\w+(\[\d\])?,/)
	{
		ok(@stmts > 0, "$rel: its SQL statements are found (" . scalar(@stmts) . ')');
	}
	next unless @stmts;
	# a table name spliced in as %s (quoted and qualified by the code) stands for one
	s/%s/tide.spliced/g for @stmts;
	my $i = 0;
	my ($rc, $out) = check($caller_path{$rel}, map { ("$rel#" . ++$i) => $_ } @stmts);
	is($rc, 0, "$rel: every function, operator and table is schema-qualified"
		  . ($caller_path{$rel} ? ' (types too)' : '')) or diag($out);
}
ok($total >= 30, "statements checked in all: $total");

done_testing();
