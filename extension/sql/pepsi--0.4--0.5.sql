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
-- setup tasks: pepsi.setup_task, the intent queue pepsi-setup(8) apply
-- drains as root, and pepsi.setup_task_log, the lines each task wrote.
--
-- Setting a mail server up is privileged (writing /etc/pepsi, secrets.d,
-- roles, keys) and pepsi-httpd runs unprivileged, so the web setup does not
-- act: it writes a row saying what should be true, of one of a closed set
-- of eleven kinds, and the applier decides how, validating the parameters
-- of each kind strictly (cli/setup/tasks.c; docs/pepsi-setup.8.md names
-- them).  Root is reached through a table, never through a socket.
-- written_by is forced from current_user by the BEFORE INSERT trigger,
-- whatever the row says, and the applier refuses a row not written by a
-- member of pepsi_config; only pepsi_config may INSERT (nobody UPDATEs or
-- DELETEs but the owner, which the applier connects as), pepsi_config and
-- pepsi_httpd may read both.  No role that handles mail touches them.
-- ===========================================================================
CREATE TABLE pepsi.setup_task (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('config_file', 'secret', 'database_role', 'grant_policy',
                                              'pg_hba_line', 'dkim_key', 'srs_secret', 'certificate',
                                              'reload', 'admin_account', 'dns_check')),
    params      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(params) = 'object'),
    written_by  name NOT NULL DEFAULT current_user,
    status      text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'running', 'done', 'unchanged', 'refused', 'failed')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX setup_task_pending ON pepsi.setup_task (id) WHERE status = 'pending';

CREATE TABLE pepsi.setup_task_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id     bigint NOT NULL REFERENCES pepsi.setup_task (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT now(),
    line        text NOT NULL
);
CREATE INDEX setup_task_log_task ON pepsi.setup_task_log (task_id, id);

-- Who wrote a request is a fact about the connection, not a claim of the
-- payload: the trigger runs as the inserting role (it is no definer).  A
-- new row is pending, stamped now, whatever it says.
CREATE FUNCTION pepsi.setup_task_stamp() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pepsi, pg_temp AS $$
BEGIN
    NEW.written_by := current_user;
    NEW.status := 'pending';
    NEW.created_at := now();
    NEW.started_at := NULL;
    NEW.finished_at := NULL;
    RETURN NEW;
END
$$;
CREATE TRIGGER setup_task_stamp BEFORE INSERT ON pepsi.setup_task
    FOR EACH ROW EXECUTE FUNCTION pepsi.setup_task_stamp();

SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task_log', '');
SELECT pg_catalog.pg_extension_config_dump('pepsi.setup_task_log_id_seq', '');

INSERT INTO pepsi.grant_rule (role, object_kind, object_name, privileges) VALUES
    ('pepsi_config', 'table', 'setup_task', '{SELECT,INSERT}'),
    ('pepsi_config', 'table', 'setup_task_log', '{SELECT}'),
    ('pepsi_httpd', 'table', 'setup_task', '{SELECT}'),
    ('pepsi_httpd', 'table', 'setup_task_log', '{SELECT}');
SELECT pepsi.grant_apply();
-- end of setup tasks

UPDATE pepsi.schema_version SET version = '0.5';
