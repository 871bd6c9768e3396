# META.json's version is the control file's default_version.
use strict;
use warnings;
use File::Basename qw(dirname);
use Test::More;

my $root = dirname(__FILE__) . '/../..';

sub slurp
{
	my ($path) = @_;
	open my $fh, '<', $path or die "could not open $path: $!";
	local $/;
	return <$fh>;
}

my ($control_version) = slurp("$root/pg_tide.control") =~ /^default_version\s*=\s*'([^']+)'/m;
my $meta = slurp("$root/META.json");
my ($meta_version) = $meta =~ /^  "version":\s*"([^"]+)"/m;
my ($provides_version) = $meta =~ /"provides".*?"version":\s*"([^"]+)"/s;

ok(defined $control_version, 'pg_tide.control has a default_version');
is($meta_version, $control_version, 'META.json version equals default_version');
is($provides_version, $control_version, 'META.json provides.pg_tide.version equals default_version');
ok(-f "$root/sql/pg_tide--$control_version.sql", "install script for $control_version exists");

done_testing();
