-- ---------------------------------------------------------------------------
-- Publishing and consuming rights (docs/security.md#publishing-rights,
-- #consuming-rights). A role may publish to an outbox, or consume from its
-- consumer groups, when it has the privileges of a grantee listed in
-- outbox_publish_grants or outbox_consume_grants (role membership with
-- INHERIT), of tide_admin, of the extension's owner, or is a superuser.
-- tide.outbox_publish and the consumer API check it in C
-- (src/outbox_rights.c) against the caller's identity; each backend caches
-- the answers until a grants table or a role membership changes. A relay
-- pipeline's consumer group is consumed by the relay alone unless its
-- config has "allow_other_consumers": true; the cache of the pipelines'
-- groups is cleared when relay_outbox_config changes.
-- ---------------------------------------------------------------------------

CREATE TABLE tide.outbox_publish_grants (
	outbox_name	text NOT NULL REFERENCES tide.tide_outbox_config (outbox_name) ON DELETE CASCADE,
	grantee		regrole NOT NULL,
	granted_by	regrole,
	granted_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (outbox_name, grantee)
);

COMMENT ON TABLE tide.outbox_publish_grants
	IS 'Per outbox: the roles (and, by inheritance, their members) that may publish to it';

SELECT pg_catalog.pg_extension_config_dump('tide.outbox_publish_grants', '');

CREATE TABLE tide.outbox_consume_grants (
	outbox_name	text NOT NULL REFERENCES tide.tide_outbox_config (outbox_name) ON DELETE CASCADE,
	grantee		regrole NOT NULL,
	granted_by	regrole,
	granted_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (outbox_name, grantee)
);

COMMENT ON TABLE tide.outbox_consume_grants
	IS 'Per outbox: the roles (and, by inheritance, their members) that may consume from its consumer groups';

SELECT pg_catalog.pg_extension_config_dump('tide.outbox_consume_grants', '');
