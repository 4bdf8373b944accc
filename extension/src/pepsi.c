/*
 * pepsi.c: module entry point and configuration (GUCs).
 *
 * Loaded from shared_preload_libraries, it also registers the maintenance
 * worker (maint.c) for the database named by pepsi.database; loaded on
 * demand, the worker is started by pepsi.start_maintenance().
 */
#include "pepsi.h"

#include "miscadmin.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;

char *pepsi_database = NULL;
int	  pepsi_maintenance_interval_ms = 1000;
int	  pepsi_body_gc_interval_s = 60;
int	  pepsi_mail_log_retention_s = 7 * 24 * 3600;
int	  pepsi_snapshot_warning_s = 60;
char *pepsi_admin_account = NULL;
char *pepsi_admission_stage = NULL;
char *pepsi_admission_accounts = NULL;

void _PG_init(void);

void
_PG_init(void)
{
	DefineCustomStringVariable("pepsi.database",
							   "Database the preloaded maintenance worker connects to.",
							   "Read when the worker starts; pepsi.start_maintenance() uses the current database instead.",
							   &pepsi_database,
							   "postgres",
							   PGC_SIGHUP,
							   0,
							   NULL, NULL, NULL);
	DefineCustomIntVariable("pepsi.maintenance_interval",
							"Longest sleep of the maintenance worker between due-row scans.",
							"It wakes earlier when a paused row falls due sooner.",
							&pepsi_maintenance_interval_ms,
							1000, 10, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("pepsi.body_gc_interval",
							"How often the maintenance worker sweeps unreferenced message bodies.",
							NULL,
							&pepsi_body_gc_interval_s,
							60, 1, 24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomIntVariable("pepsi.mail_log_retention",
							"How long pepsi.mail_log rows are kept.",
							NULL,
							&pepsi_mail_log_retention_s,
							7 * 24 * 3600, 60, INT_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomIntVariable("pepsi.snapshot_warning",
							"How long a transaction may hold back the xmin horizon before the maintenance worker warns, naming it (0: never).",
							"While it lasts, the queue's dead row versions cannot be removed: its table and indexes grow.",
							&pepsi_snapshot_warning_s,
							60, 0, 24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomStringVariable("pepsi.admission_stage",
							   "The one stage members of pepsi_ingress may admit messages at.",
							   "pepsi-ingress and pepsi-sendmail face the outside world: they may put a message only where "
							   "the pipeline starts, never straight at a delivery stage.  Set it where the superuser sets "
							   "GUCs (ALTER DATABASE ... SET) when [ingress] INIT_STAGE is not \"init\".",
							   &pepsi_admission_stage,
							   "init",
							   PGC_SUSET,
							   0,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("pepsi.admission_accounts",
							   "The authenticated accounts members of pepsi_ingress may admit messages for.",
							   "A list of accounts, @domain (every account of that domain) or * (any); empty: "
							   "none.  A superuser sets it per login role (ALTER ROLE ... SET), so that an "
							   "ingress that offers no AUTH (port 25) cannot claim an account even when "
							   "compromised, and a submission ingress only its own domains'.",
							   &pepsi_admission_accounts,
							   "*",
							   PGC_SUSET,
							   GUC_LIST_INPUT,
							   NULL, NULL, NULL);
#if PG_VERSION_NUM >= 150000
	DefineCustomStringVariable("pepsi.admin_account",
							   "The administrator pepsi-httpd acts for, recorded in pepsi.event_log.",
							   "Honoured only for members of pepsi_httpd (see pepsi.event_principal()).",
							   &pepsi_admin_account,
							   "",
							   PGC_USERSET,
							   GUC_NOT_IN_SAMPLE,
							   NULL, NULL, NULL);
	MarkGUCPrefixReserved("pepsi");
#else
	EmitWarningsOnPlaceholders("pepsi");
#endif

	if (process_shared_preload_libraries_in_progress)
		maint_register_static_worker();
}
