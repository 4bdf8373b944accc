/*
 * pepsi 0.13 -> 0.14: the schema changes made since 0.13.
 *
 * 0.13 was released with an unguessable order reference for each
 * challenge and the archive's search key in C; every schema change since
 * is a block here, placed before the final UPDATE of pepsi.schema_version,
 * and folded into pepsi--0.14.sql (new objects at its end).  An existing
 * 0.13 database reaches 0.14 with ALTER EXTENSION pepsi UPDATE; CREATE
 * EXTENSION pepsi installs pepsi--0.14.sql.  Both paths must end in the
 * same schema: t/003_extension_upgrade.pl compares their catalogs and
 * tests the upgrade with a filled queue.  The scheme (blocks, grants as
 * data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.14'" to load this file. \quit

-- ===========================================================================
-- A list's VERP fan-out grouped by destination domain (issue 40)
--
-- pepsi.list_fanout gave a VERP post's groups (one row per subscriber) in
-- address order, which spreads a domain's subscribers over the whole
-- fan-out: consecutive rows went to different domains, so a relay
-- worker's batch of them needed a session and a destination slot each.
-- By domain, then address: a domain's rows come together.
-- ===========================================================================
-- The split groups (pepsi.workqueue_split) of a post to list, for stage:
-- with VERP one per subscriber, sent from list-bounces+user=domain@ with
-- its own List-Unsubscribe (RFC 8058 one-click when the list has an
-- unsubscribe_url); without, one per destination domain from
-- list-bounces@.  Only subscribers who take each message.  The VERP
-- groups keep a domain's subscribers together (by domain, then address),
-- so that the rows made of them, claimed in that order, reach a relay
-- worker's batch together: one session, one kept destination slot.
CREATE OR REPLACE FUNCTION pepsi.list_fanout(list bigint, stage text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    l pepsi.mailing_list;
    local text;
    domain text;
BEGIN
    SELECT * INTO l FROM pepsi.mailing_list m WHERE m.id = list;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no mailing list %', list USING ERRCODE = 'no_data_found';
    END IF;
    local := split_part(l.address, '@', 1);
    domain := split_part(l.address, '@', 2);
    IF l.verp THEN
        RETURN coalesce((SELECT jsonb_agg(jsonb_build_object(
                'rcpt_to', jsonb_build_array(m.address), 'stage', stage,
                'mail_from', local || '-bounces+' || replace(m.address, '@', '=') || '@' || domain,
                'prepend_headers', CASE WHEN l.unsubscribe_url IS NOT NULL THEN
                    'List-Unsubscribe: <' || l.unsubscribe_url || '?l=' || l.id || '&a='
                    || replace(replace(m.address, '%', '%25'), '+', '%2B') || '&t='
                    || left(encode(sha256(l.secret || convert_to(m.address, 'UTF8')), 'hex'), 32)
                    || '>, <mailto:' || local || '-unsubscribe@' || domain || '>' || E'\r\n'
                    || E'List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n'
                  ELSE 'List-Unsubscribe: <mailto:' || local || '-unsubscribe@' || domain || E'>\r\n' END)
                ORDER BY split_part(m.address, '@', 2), m.address)
            FROM pepsi.list_member m
            WHERE m.list_id = list AND m.delivery = 'each' AND m.disabled IS NULL), '[]');
    END IF;
    RETURN coalesce((SELECT jsonb_agg(jsonb_build_object(
            'rcpt_to', g.rcpt, 'stage', stage, 'mail_from', local || '-bounces@' || domain,
            'prepend_headers', 'List-Unsubscribe: <mailto:' || local || '-unsubscribe@' || domain || E'>\r\n')
            ORDER BY g.dom)
        FROM (SELECT split_part(m.address, '@', 2) AS dom, jsonb_agg(m.address ORDER BY m.address) AS rcpt
              FROM pepsi.list_member m
              WHERE m.list_id = list AND m.delivery = 'each' AND m.disabled IS NULL
              GROUP BY 1) g), '[]');
END
$$;
-- end of a list's VERP fan-out grouped by destination domain

-- ===========================================================================
-- destination_begin: the TLS result recorded, and whether each message
-- must ask (issue 40)
--
-- A relay worker wrote a delivery's TLS result (tls_policy, tls_outcome)
-- with destination_end, a round trip of its own, unless it had written
-- the same for the domain itself: with many workers and many domains,
-- most deliveries of a list's fan-out were a worker's first to their
-- domain, and each paid a destination_end (and waited on the others'
-- writes of the same row).  destination_begin, which reads the row
-- anyway, now gives what is recorded; a worker that got the same keeps
-- its slot as after any healthy delivery.  And per_message: whether each
-- message must ask for its turn (a rate limit, or a slow destination's
-- share of the workers); when not, a worker delivers the rest of its
-- batch's messages to the domain under the slot it holds.  New OUT
-- columns change the function's type: dropped and made again, its
-- grants applied again.
-- ===========================================================================
DROP FUNCTION IF EXISTS pepsi.destination_begin(text, integer, text[], text, integer, text, inet,
    double precision, double precision, integer, double precision, text);
-- (As in pepsi--0.14.sql.)
CREATE FUNCTION pepsi.destination_begin(domain text, default_concurrency integer,
    hosts text[] DEFAULT NULL, previous_domain text DEFAULT NULL, previous_slot integer DEFAULT NULL,
    previous_host text DEFAULT NULL, previous_address inet DEFAULT NULL,
    previous_seconds double precision DEFAULT NULL,
    slow_seconds double precision DEFAULT NULL, slow_limit integer DEFAULT NULL,
    handoff_seconds double precision DEFAULT NULL, stage text DEFAULT NULL,
    OUT slot integer, OUT wait_seconds double precision, OUT reason text,
    OUT contended boolean, OUT addresses jsonb, OUT sts_policy_id text, OUT sts_policy text,
    OUT tls_policy text, OUT tls_outcome text, OUT per_message boolean)
AS 'MODULE_PATHNAME', 'destination_begin' LANGUAGE C;

SELECT pepsi.grant_apply();
-- end of destination_begin: the TLS result recorded, and whether each message must ask

UPDATE pepsi.schema_version SET version = '0.14';
