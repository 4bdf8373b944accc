/*
 * pepsi 0.5 -> 0.6: the schema changes made since 0.5.
 *
 * 0.5 was released with the schedule, the failure bouncer, DMARC
 * aggregates, setup tasks and the MX defences' tables; every schema change
 * since is a block here, placed before the final UPDATE of
 * pepsi.schema_version, and folded into pepsi--0.6.sql (new objects at its
 * end).  An existing 0.5 database reaches 0.6 with ALTER EXTENSION pepsi
 * UPDATE; CREATE EXTENSION pepsi installs pepsi--0.6.sql.  Both paths must
 * end in the same schema: t/003_extension_upgrade.pl compares their
 * catalogs and tests the upgrade with a filled queue.  The scheme (blocks,
 * grants as data, every statement safe on a live queue) is the one
 * pepsi--0.1--0.2.sql describes and docs/upgrading.md explains.
 */

\echo Use "ALTER EXTENSION pepsi UPDATE TO '0.6'" to load this file. \quit

-- ===========================================================================
-- The dispatcher's role: claiming and recovering rows
--
-- Claiming rows (workqueue_claim, workqueue_claim_tokens) and putting back
-- the rows of a worker that died (workqueue_crashed, workqueue_recover,
-- workqueue_reset_orphans, which also refuse a session without the
-- one-dispatcher advisory lock) are pepsi-dispatch's alone.  Granted to
-- pepsi_stage, any member could claim rows itself, or take the
-- dispatcher's lock while no dispatcher ran and recover rows other
-- workers hold.  They go to pepsi_dispatch, a member of pepsi_stage with
-- these rights besides; the stage workers' functions (commit, pause, split
-- with their claim token) stay pepsi_stage's.  The role is created if the
-- cluster lacks it; a login role of that name (as make run and pepsi-setup
-- made it) is kept, and becomes the dispatcher's.
-- ===========================================================================
INSERT INTO pepsi.grant_role VALUES
    ('pepsi_dispatch', 'Pepsi: the dispatcher (pepsi-dispatch): pepsi_stage, and claims and recovers rows');
SELECT pepsi.grant_roles_create();
INSERT INTO pepsi.grant_membership VALUES ('pepsi_dispatch', 'pepsi_stage');
UPDATE pepsi.grant_rule SET role = 'pepsi_dispatch'
WHERE role = 'pepsi_stage' AND object_kind = 'function'
  AND object_name IN ('workqueue_claim', 'workqueue_claim_tokens', 'workqueue_crashed',
                      'workqueue_recover', 'workqueue_reset_orphans');
SELECT pepsi.grant_apply();
-- end of the dispatcher's role

UPDATE pepsi.schema_version SET version = '0.6';
