# The fenced code blocks of a documentation page, for the TAP tests that
# run a page as written (test/t/025, 059).
#
#   my ($blocks, $closed) = PgTide::Docs::fenced_blocks($path, 'sql');
#   # $blocks: [first line number, text] for each ```sql block, in order;
#   # $closed: false when the page ends inside a block
package PgTide::Docs;

use strict;
use warnings;
use Exporter 'import';

our @EXPORT_OK = qw(fenced_blocks);

# The ```$lang blocks of the file, in order, and whether every one is closed.
sub fenced_blocks
{
	my ($path, $lang) = @_;
	open my $fh, '<', $path or die "could not open $path: $!";
	my (@blocks, $cur);
	while (my $line = <$fh>)
	{
		if (!defined $cur && $line =~ /^```\Q$lang\E\s*$/)
		{
			$cur = [ $. + 1, '' ];
		}
		elsif (defined $cur && $line =~ /^```\s*$/)
		{
			push @blocks, $cur;
			$cur = undef;
		}
		elsif (defined $cur)
		{
			$cur->[1] .= $line;
		}
	}
	close $fh;
	return (\@blocks, !defined $cur);
}

1;
