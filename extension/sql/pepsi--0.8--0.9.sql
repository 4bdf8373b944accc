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
-- than 10 minutes ago is refused with the reason.  The helper then
-- records what the wallet did itself (auto_pay_settle), and auto_pay_finish
-- (the stage's) no longer touches a claimed payment: a caller that is not
-- the helper cannot record a payment made as failed, which would free its
-- amount under the limits again.  pepsi_autopay may execute these two and
-- nothing else of the schema; pepsi_stage may execute neither.
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

-- What became of payment id, which the helper claimed: 'paid' or
-- 'failed', with the reason.  True when it was recorded (a payment not
-- claimed, or settled already, is left as it is).
CREATE FUNCTION pepsi.auto_pay_settle(id bigint, outcome text, reason text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF outcome NOT IN ('paid', 'failed') THEN
        RAISE EXCEPTION 'invalid outcome "%"', outcome USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pepsi.payment p SET outcome = auto_pay_settle.outcome, reason = auto_pay_settle.reason, finished_at = now()
    WHERE p.id = auto_pay_settle.id AND p.direction = 'out' AND p.outcome = 'pending' AND p.claimed_at IS NOT NULL;
    RETURN FOUND;
END
$$;

-- What became of pending payment id: 'paid' or 'failed', with the reason.
-- Not of one pepsi-helper-auto-pay claimed (auto_pay_claim): that one is
-- the helper's to settle (auto_pay_settle), which alone knows what the
-- wallet did.
CREATE OR REPLACE FUNCTION pepsi.auto_pay_finish(id bigint, outcome text, reason text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    IF outcome NOT IN ('paid', 'failed') THEN
        RAISE EXCEPTION 'invalid outcome "%"', outcome USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE pepsi.payment p SET outcome = auto_pay_finish.outcome, reason = auto_pay_finish.reason, finished_at = now()
    WHERE p.id = auto_pay_finish.id AND p.outcome = 'pending' AND p.claimed_at IS NULL;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_autopay', 'schema', 'pepsi', '{USAGE}'),
    ('pepsi_autopay', 'function', 'auto_pay_claim', '{EXECUTE}'),
    ('pepsi_autopay', 'function', 'auto_pay_settle', '{EXECUTE}');
INSERT INTO pepsi.grant_definer (name) VALUES ('auto_pay_claim'), ('auto_pay_settle');
SELECT pepsi.grant_apply();
-- end of auto-pay's helper claims its payment

-- ===========================================================================
-- keydisc_release finds the parked rows by an index (issue 41)
--
-- keydisc_release resumes the rows parked for an address
-- (state.encrypt.waiting_for); it scanned every row of the queue for them.
-- workqueue_keydisc_waiting indexes the address of the paused rows that
-- wait for a key only, so it stays small and the lookup is an index scan.
-- Its predicate names index_status, not status, like the queue's other
-- indexes: the claim, which changes only status, stays a HOT update.
-- ===========================================================================
CREATE OR REPLACE FUNCTION pepsi.keydisc_release(address text, found boolean, negative_seconds integer DEFAULT 86400,
                                      methods_replied text[] DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    a text := lower(keydisc_release.address);
    ids bigint[];
BEGIN
    IF found THEN
        DELETE FROM pepsi.key_request r WHERE r.address = a;
    ELSE
        UPDATE pepsi.key_request r SET settled_at = now(),
               methods_replied = coalesce(keydisc_release.methods_replied, '{}'),
               negative_until = now() + make_interval(secs => greatest(negative_seconds, 1))
         WHERE r.address = a;
    END IF;
    -- index_status, not status: workqueue_keydisc_waiting's predicate (paused either way).
    SELECT array_agg(w.id) INTO ids FROM pepsi.workqueue w
     WHERE w.index_status = 'paused' AND w.state -> 'encrypt' ->> 'waiting_for' = a;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    RETURN pepsi.workqueue_resume(ids);
END
$$;
CREATE INDEX workqueue_keydisc_waiting ON pepsi.workqueue (((state -> 'encrypt') ->> 'waiting_for'))
    WHERE index_status = 'paused' AND ((state -> 'encrypt') ->> 'waiting_for') IS NOT NULL;
-- end of keydisc_release finds the parked rows by an index

UPDATE pepsi.schema_version SET version = '0.9';
