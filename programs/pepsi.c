/*
 * pepsi.c: the multi-call binary.  Installed once as
 * $PREFIX/libexec/pepsi/pepsi with a $PREFIX/bin symlink per program, so
 * every worker of every stage, the dispatcher and ingress run one file:
 * its text is read from disk once and shared in memory.  main dispatches
 * on the basename of argv[0] (or on argv[1] when invoked as "pepsi").
 *
 * It also installs the stage registry, which is what makes fusion
 * possible: a worker can run a successor stage in-process only when the
 * successor's code is linked into the same binary.
 */
#include <stdio.h>
#include <string.h>

#include "process/cli.h"
#include "runtime/stage.h"

#define PROGRAM(ident, name) int ident##_main(int argc, char **argv);
#define STAGE(ident, name)                                               \
	int								ident##_main(int argc, char **argv); \
	extern const struct pepsi_stage ident##_stage;
#define FUSED_STAGE(ident, name) extern const struct pepsi_stage ident##_stage;
#include "programs.h"
#undef PROGRAM
#undef STAGE
#undef FUSED_STAGE

/* sendmail, mailq and newaliases: programs/names.c. */
int pepsi_sendmail_names_main(int argc, char **argv);

struct program
{
	const char *name;
	int (*main)(int argc, char **argv);
	const struct pepsi_stage *stage;
};

static const struct program programs[] = {
#define PROGRAM(ident, name) {name, ident##_main, NULL},
#define STAGE(ident, name) {name, ident##_main, &ident##_stage},
/*
 * A privileged stage (Makefile PRIVILEGED_STAGES): its code is here for
 * fusion only.  It is no program of this binary, which must not be given
 * its set-id bit: run as itself, it is its own standalone file.
 */
#define FUSED_STAGE(ident, name) {name, NULL, &ident##_stage},
#include "programs.h"
#undef PROGRAM
#undef STAGE
#undef FUSED_STAGE
};

#define NPROGRAMS (sizeof(programs) / sizeof(programs[0]))

static const struct pepsi_stage *
registry_lookup(const char *program)
{
	for (size_t i = 0; i < NPROGRAMS; i++)
		if (programs[i].stage && strcmp(programs[i].name, program) == 0)
			return programs[i].stage;
	return NULL;
}

/* The usage on out; 0 when asked for (--help, on stdout), else 64. */
static int
usage(FILE *out)
{
	fprintf(out, "usage: pepsi PROGRAM [ARGS...], or run it through a symlink named PROGRAM\n"
				 "programs:");
	for (size_t i = 0; i < NPROGRAMS; i++)
		if (programs[i].main != NULL)
			fprintf(out, " %s", programs[i].name);
	fprintf(out, " sendmail mailq newaliases\n");
	return out == stdout ? 0 : 64;
}

int
main(int argc, char **argv)
{
	const char *name = argc > 0 ? strrchr(argv[0], '/') : NULL;

	name = name ? name + 1 : (argc > 0 ? argv[0] : "pepsi");
	if (strcmp(name, "pepsi") == 0)
	{
		if (cli_version_option("pepsi", argc, argv))
			return 0;
		if (argc >= 2 && cli_is_help(argv[1]))
			return usage(stdout);
		if (argc < 2)
			return usage(stderr);
		argv++;
		argc--;
		name = argv[0];
	}
	pepsi_registry_install(registry_lookup);
	for (size_t i = 0; i < NPROGRAMS; i++)
		if (programs[i].main != NULL && strcmp(programs[i].name, name) == 0)
		{
			/* every program's --version, in one place (cli.h) */
			if (cli_version_option(name, argc, argv))
				return 0;
			return programs[i].main(argc, argv);
		}
	/* The names mail programs call (a /usr/sbin/sendmail symlink): argv[0] tells them apart. */
	if (strcmp(name, "sendmail") == 0 || strcmp(name, "mailq") == 0 || strcmp(name, "newaliases") == 0)
		return pepsi_sendmail_names_main(argc, argv);
	fprintf(stderr, "pepsi: no program named \"%s\"\n", name);
	return usage(stderr);
}
