-- CREATE EXTENSION on a server that did not preload the library says so in
-- a WARNING now, not at the first publish (it runs in the install script
-- only).
SELECT tide._warn_unless_preloaded();
