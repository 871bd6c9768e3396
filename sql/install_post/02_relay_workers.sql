-- CREATE EXTENSION asks the launcher, at commit, to start this database's relay
-- worker (it runs in the install script only, not in updates).
SELECT tide._relay_notify_launcher();
