/*
 * standalone.c: the main of a per-program development build.  Compiled
 * once per program with PROGRAM_MAIN naming its entry point and
 * PROGRAM_NAME its name; it installs no stage registry, so fusion is
 * inert here (docs/architecture.md 3.4).  --version is answered here, as
 * the multi-call main answers it (cli.h).
 */
#include "process/cli.h"

int PROGRAM_MAIN(int argc, char **argv);

int main(int argc, char **argv);

int
main(int argc, char **argv)
{
	if (cli_version_option(PROGRAM_NAME, argc, argv))
		return 0;
	return PROGRAM_MAIN(argc, argv);
}
