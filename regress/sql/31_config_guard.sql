--
-- The database cannot run code or redirect mail: the options read from
-- pepsi.conf only, PROGRAM as a program's name, one line per value, refused
-- by pepsi.config_set and, for a direct write (here by the owner), by the
-- table's trigger and constraints.  common/config/config.c refuses the same rows.
--
\set SHOW_CONTEXT never

SELECT pepsi.config_set('global', 'stage-smarthost', 'SMARTHOST', 'evil.example:25');
SELECT pepsi.config_set('global', 'stage-smarthost', 'TLS', 'none');
SELECT pepsi.config_set('domain:example.org', 'stage-aliases', 'ALIASES_FILE', '/tmp/aliases');
SELECT pepsi.config_set('global', 'stage-maildir', 'MAILDIR_ROOT', '/');
SELECT pepsi.config_set('global', 'stage-smarthost', 'PROGRAM', '/bin/sh');
INSERT INTO pepsi.config_override (scope, section, option, value)
VALUES ('global', 'ingress', 'TRUSTED_NETWORKS', '0.0.0.0/0');
INSERT INTO pepsi.config_override (scope, section, option, value)
VALUES ('global', 'stage-x', 'PROGRAM', '../../bin/sh');
INSERT INTO pepsi.config_override (scope, section, option, value)
VALUES ('global', 'stage-x', 'AUTH_PASSWORD_FILE', '/etc/shadow');
\set VERBOSITY terse
INSERT INTO pepsi.config_override (scope, section, option, value)
VALUES ('global', 'stage-x', 'NOTE', E'one\r\ntwo');
\set VERBOSITY default

-- A program's name is fine, and who set it is the caller.
SELECT pepsi.config_set('global', 'stage-x', 'PROGRAM', 'pepsi-stage-discard');
SELECT option, value, updated_by = current_user AS by_me FROM pepsi.config_override
WHERE section = 'stage-x';
SELECT pepsi.config_unset('global', 'stage-x', 'PROGRAM');
