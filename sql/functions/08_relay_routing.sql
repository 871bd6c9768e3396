-- ---------------------------------------------------------------------------
-- Routing (relay/filter.c). A pipeline's "types" (patterns matched against
-- the message's "type" header) and "filter" (a content filter on payload
-- and headers) choose the messages it delivers; the relay passes the others
-- over without delivery (see docs/relay.md#routing). Validation and
-- tide.relay_filter_matches use the compiler and evaluator the relay uses.
-- ---------------------------------------------------------------------------

-- Raises 22023 when "types" or "filter" is invalid; NULL: the key is absent.
CREATE OR REPLACE FUNCTION tide._relay_routing_check(p_types jsonb, p_filter jsonb)
RETURNS void
AS 'MODULE_PATHNAME', 'tide_relay_routing_check'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
REVOKE ALL ON FUNCTION tide._relay_routing_check(jsonb,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide._relay_routing_check(jsonb,jsonb) TO tide_admin;

CREATE OR REPLACE FUNCTION tide.relay_filter_matches(p_config jsonb, p_payload jsonb, p_headers jsonb DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'tide_relay_filter_matches'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION tide.relay_filter_matches(jsonb, jsonb, jsonb)
	IS 'whether a message with this payload and headers passes the "types" and "filter" of a pipeline config';
REVOKE ALL ON FUNCTION tide.relay_filter_matches(jsonb,jsonb,jsonb) FROM PUBLIC, tide_admin, tide_publisher, tide_consumer, tide_reader;
GRANT EXECUTE ON FUNCTION tide.relay_filter_matches(jsonb,jsonb,jsonb) TO tide_admin;
