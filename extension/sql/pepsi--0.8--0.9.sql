/*
 * pepsi 0.8 -> 0.9: the schema changes made since 0.8.
 *
 * 0.8 was released with auto-pay, the lists' archive and digests, S/MIME
 * and key discovery, and the telemetry tables; every schema change since
 * is a block here, placed before the final UPDATE of pepsi.schema_version,
 * and folded into pepsi--0.9.sql (new objects at its end).  An existing
 * 0.8 database reaches 0.9 with ALTER EXTENSION pepsi UPDATE; CREATE
 * EXTENSION pepsi installs pepsi--0.9.sql.  Both paths must end in the
 * same schema: t/003_extension_upgrade.pl compares their catalogs and
 * tests the upgrade with a filled queue.  The scheme (blocks, grants as
 * data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.9'" to load this file. \quit

-- ===========================================================================
-- Auto-pay's helper claims its payment (issue 39)
--
-- pepsi-helper-auto-pay (set-user-id root) used to pay whatever address
-- and amount its caller named: the limits were checked only here, by
-- auto_pay_reserve, which the stage calls, so anyone who could run the
-- helper (its group, the stage's user) could pay anything to anyone.  Now
-- the helper takes only a payment id, connects itself over the local
-- socket with peer authentication as a member of the group role
-- pepsi_autopay, and calls auto_pay_claim, which marks a payment that
-- auto_pay_reserve recorded pending (within the limits) as claimed, once,
-- and returns its address, amount and URI: what the wallet is asked to pay
-- comes from here, never from the helper's caller.  An unknown id, one
-- that was refused or finished, one claimed already, or one reserved more
-- than 10 minutes ago is refused with the reason.  pepsi_autopay may
-- execute auto_pay_claim and nothing else of the schema; pepsi_stage may
-- not execute it.
-- ===========================================================================
INSERT INTO pepsi.grant_role VALUES
    ('pepsi_autopay', 'Pepsi: pepsi-helper-auto-pay (set-user-id root, peer authentication): claims a reserved payment, once');
SELECT pepsi.grant_roles_create();

-- When pepsi-helper-auto-pay claimed the payment (auto_pay_claim).
ALTER TABLE pepsi.payment ADD COLUMN claimed_at timestamptz;

-- Claim pending payment id for the helper: {"pay": true, "address",
-- "amount" (CURRENCY:VALUE), "uri"}, the payment marked claimed, or
-- {"pay": false, "why": ...} with nothing changed.
CREATE FUNCTION pepsi.auto_pay_claim(id bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    p pepsi.payment;
BEGIN
    SELECT * INTO p FROM pepsi.payment q WHERE q.id = auto_pay_claim.id AND q.direction = 'out' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('pay', false, 'why', format('no payment %s was reserved', id));
    ELSIF p.claimed_at IS NOT NULL THEN
        RETURN jsonb_build_object('pay', false,
                                  'why', format('payment %s was claimed already, at %s', id, p.claimed_at));
    ELSIF p.outcome <> 'pending' THEN
        RETURN jsonb_build_object('pay', false,
                                  'why', format('payment %s is %s, not pending%s', id, p.outcome,
                                                coalesce(' (' || p.reason || ')', '')));
    ELSIF p.created_at < now() - interval '10 minutes' THEN
        RETURN jsonb_build_object('pay', false,
                                  'why', format('payment %s was reserved at %s, more than 10 minutes ago', id,
                                                p.created_at));
    END IF;
    UPDATE pepsi.payment q SET claimed_at = now() WHERE q.id = p.id;
    RETURN jsonb_build_object('pay', true, 'id', p.id, 'address', p.address,
                              'amount', p.currency || ':' || p.amount::text, 'uri', p.uri);
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_autopay', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_autopay', 'function', 'auto_pay_claim', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('auto_pay_claim');
SELECT pepsi.grant_apply();
-- end of auto-pay's helper claims its payment

UPDATE pepsi.schema_version SET version = '0.9';
