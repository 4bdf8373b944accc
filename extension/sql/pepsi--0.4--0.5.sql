/*
 * pepsi 0.4 -> 0.5: the schema changes made since 0.4.
 *
 * 0.4 was released with the claim tokens, the queue id and the web page's
 * history; every schema change since is a block here, placed before the
 * final UPDATE of pepsi.schema_version, and folded into pepsi--0.5.sql (new
 * objects at its end).  An existing 0.4 database reaches 0.5 with ALTER
 * EXTENSION pepsi UPDATE; CREATE EXTENSION pepsi installs pepsi--0.5.sql.
 * Both paths must end in the same schema: t/003_extension_upgrade.pl
 * compares their catalogs and tests the upgrade with a filled queue.  The
 * scheme (blocks, grants as data, every statement safe on a live queue) is
 * the one pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.5'" to load this file. \quit

-- ===========================================================================
-- Greylisting (pepsi-ingress, a listener's GREYLIST): a triplet (the
-- client's network, an IPv4 /24 or an IPv6 /64; the sender; the
-- recipient) is deferred until it comes back after GREYLIST_DELAY; a
-- client that came back is let through whole for GREYLIST_AUTO_WHITELIST.
-- In the database, so that every ingress host sharing it agrees.
-- ===========================================================================
CREATE TABLE pepsi.greylist (
    client text NOT NULL,
    sender text NOT NULL,
    recipient text NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now(),
    last_seen timestamptz NOT NULL DEFAULT now(),
    passed boolean NOT NULL DEFAULT false,
    PRIMARY KEY (client, sender, recipient)
);
CREATE TABLE pepsi.greylist_client (
    client text PRIMARY KEY,
    until timestamptz NOT NULL
);

-- True: let the recipient through.  A triplet first seen, or seen again
-- before delay, is deferred; one not retried within expire starts over.
CREATE FUNCTION pepsi.greylist_check(client text, sender text, recipient text, delay interval,
                                     expire interval, auto_whitelist interval)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    t pepsi.greylist;
BEGIN
    IF EXISTS (SELECT FROM pepsi.greylist_client c
               WHERE c.client = greylist_check.client AND c.until > now()) THEN
        RETURN true;
    END IF;
    INSERT INTO pepsi.greylist AS g (client, sender, recipient)
    VALUES (greylist_check.client, greylist_check.sender, greylist_check.recipient)
    ON CONFLICT ON CONSTRAINT greylist_pkey DO UPDATE
        SET last_seen = now(),
            first_seen = CASE WHEN NOT g.passed AND g.first_seen < now() - greylist_check.expire
                              THEN now() ELSE g.first_seen END
    RETURNING * INTO t;
    IF t.passed OR (t.last_seen > t.first_seen AND t.first_seen <= now() - delay) THEN
        IF NOT t.passed THEN
            UPDATE pepsi.greylist g SET passed = true
            WHERE g.client = t.client AND g.sender = t.sender AND g.recipient = t.recipient;
        END IF;
        INSERT INTO pepsi.greylist_client AS c (client, until)
        VALUES (greylist_check.client, now() + auto_whitelist)
        ON CONFLICT ON CONSTRAINT greylist_client_pkey DO UPDATE SET until = EXCLUDED.until;
        RETURN true;
    END IF;
    RETURN false;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'greylist_check', '{EXECUTE}'),
    ('pepsi_config', 'table', 'greylist', '{SELECT}'),
    ('pepsi_config', 'table', 'greylist_client', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('greylist_check');

SELECT pg_catalog.pg_extension_config_dump('pepsi.greylist', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.greylist_client', '');
SELECT pepsi.grant_apply();
-- end of greylisting

-- ===========================================================================
-- Senders bound to their login (pepsi-ingress, [ingress] SENDER_LOGIN_MAPS
-- "sql", SEND_LIMIT_MESSAGES, SEND_LIMIT_RECIPIENTS): the addresses each
-- account may use (a mailbox, or "@domain" for all of one), and what each
-- account sent per hour, counted here so that every ingress host sharing
-- the database enforces the same limits.
-- ===========================================================================
CREATE TABLE pepsi.sender_login (
    address text NOT NULL CHECK (address = lower(address) AND position('@' IN address) > 0),
    account text NOT NULL,
    PRIMARY KEY (account, address)
);
CREATE TABLE pepsi.send_count (
    account text NOT NULL,
    hour timestamptz NOT NULL,
    messages integer NOT NULL DEFAULT 0,
    recipients integer NOT NULL DEFAULT 0,
    PRIMARY KEY (account, hour)
);

CREATE FUNCTION pepsi.sender_login_addresses(account text) RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT l.address FROM pepsi.sender_login l WHERE l.account = sender_login_addresses.account
$$;

-- One recipient (the transaction's first also counts a message) taken
-- from the account's hour: false, and nothing counted, past a limit (0: none).
CREATE FUNCTION pepsi.send_count_take(account text, new_message boolean, max_messages integer,
                                      max_recipients integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
DECLARE
    c pepsi.send_count;
BEGIN
    INSERT INTO pepsi.send_count AS s (account, hour)
    VALUES (send_count_take.account, date_trunc('hour', now()))
    ON CONFLICT ON CONSTRAINT send_count_pkey DO UPDATE SET messages = s.messages
    RETURNING * INTO c;
    IF (max_recipients > 0 AND c.recipients >= max_recipients)
       OR (new_message AND max_messages > 0 AND c.messages >= max_messages) THEN
        RETURN false;
    END IF;
    UPDATE pepsi.send_count s
    SET recipients = s.recipients + 1,
        messages = s.messages + CASE WHEN new_message THEN 1 ELSE 0 END
    WHERE s.account = c.account AND s.hour = c.hour;
    DELETE FROM pepsi.send_count s
    WHERE s.account = send_count_take.account AND s.hour < date_trunc('hour', now());
    RETURN true;
END
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'sender_login_addresses', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'send_count_take', '{EXECUTE}'),
    ('pepsi_config', 'table', 'sender_login', '{SELECT}'),
    ('pepsi_config', 'table', 'send_count', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('sender_login_addresses'), ('send_count_take');

SELECT pg_catalog.pg_extension_config_dump('pepsi.sender_login', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.send_count', '');
SELECT pepsi.grant_apply();
-- end of senders bound to their login

-- ===========================================================================
-- Connection-level verdicts (pepsi-ingress, [ingress] DNSBL_SITES and a
-- listener's PREGREET_WAIT): a client's verdict (its DNSBL score's, the
-- pre-greeting test's, a protocol violation's) kept per address until it expires, so that its next
-- sessions, on any ingress host sharing the database, are not tested again.
-- ===========================================================================
CREATE TABLE pepsi.screen_verdict (
    client text PRIMARY KEY,
    verdict text NOT NULL CHECK (verdict IN ('pass', 'allowed', 'listed', 'pregreet', 'pipelining',
                                             'bare newline')),
    list text,
    expires timestamptz NOT NULL
);

-- The client's verdict, if one is kept and has not expired.
CREATE FUNCTION pepsi.screen_verdict_get(client text, OUT verdict text, OUT list text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    SELECT v.verdict, v.list FROM pepsi.screen_verdict v
    WHERE v.client = screen_verdict_get.client AND v.expires > now()
$$;

-- Keep a verdict for ttl; a pre-greeting verdict is not overwritten by a
-- DNSBL one before it expires.  Expired rows of other clients go too.
CREATE FUNCTION pepsi.screen_verdict_put(client text, verdict text, list text, ttl interval)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pepsi, pg_temp AS $$
    DELETE FROM pepsi.screen_verdict v WHERE v.expires <= now();
    INSERT INTO pepsi.screen_verdict AS v (client, verdict, list, expires)
    VALUES (screen_verdict_put.client, screen_verdict_put.verdict, screen_verdict_put.list,
            now() + screen_verdict_put.ttl)
    ON CONFLICT ON CONSTRAINT screen_verdict_pkey DO UPDATE
        SET verdict = EXCLUDED.verdict, list = EXCLUDED.list, expires = EXCLUDED.expires
        WHERE v.verdict <> 'pregreet' OR EXCLUDED.verdict = 'pregreet';
$$;

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_ingress', 'function', 'screen_verdict_get', '{EXECUTE}'),
    ('pepsi_ingress', 'function', 'screen_verdict_put', '{EXECUTE}'),
    ('pepsi_config', 'table', 'screen_verdict', '{SELECT}');
INSERT INTO pepsi.grant_definer (name) VALUES ('screen_verdict_get'), ('screen_verdict_put');

SELECT pg_catalog.pg_extension_config_dump('pepsi.screen_verdict', '');
SELECT pepsi.grant_apply();
-- end of connection-level verdicts

UPDATE pepsi.schema_version SET version = '0.5';
