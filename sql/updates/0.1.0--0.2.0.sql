-- State changes from 0.1.0 to 0.2.0, run before the functions, views and
-- privileges (which the update script re-creates from the same files as a
-- fresh install). A new table, column or index of 0.2.0 is written here
-- once, and into sql/install/ for fresh installs.

-- tide.relay_workers() returns two more columns (worker_index, pipelines):
-- a new return type, so the function is re-created.
DROP FUNCTION tide.relay_workers();
