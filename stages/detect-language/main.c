/*
 * main.c: the multi-call main of this directory's own binary.  It links
 * libexttextcat, which nothing else uses, so it is kept out of the shared
 * multi-call binary (docs/architecture.md); installed as
 * $PREFIX/bin/pepsi-stage-detect-language with pepsi-detect-language a
 * symlink to it, and main dispatches on the name it was run by.
 */
#include <stdio.h>
#include <string.h>

#include "process/cli.h"

int pepsi_stage_detect_language_main(int argc, char **argv);
int pepsi_detect_language_main(int argc, char **argv);
int main(int argc, char **argv);

int
main(int argc, char **argv)
{
	const char *name = argc > 0 ? strrchr(argv[0], '/') : NULL;

	name = name ? name + 1 : (argc > 0 ? argv[0] : "pepsi-stage-detect-language");
	if (strcmp(name, "pepsi-detect-language") == 0)
	{
		if (cli_version_option(name, argc, argv))
			return 0;
		return pepsi_detect_language_main(argc, argv);
	}
	if (strcmp(name, "pepsi-stage-detect-language") == 0)
	{
		if (cli_version_option(name, argc, argv))
			return 0;
		return pepsi_stage_detect_language_main(argc, argv);
	}
	fprintf(stderr, "%s: run this file as pepsi-stage-detect-language or pepsi-detect-language (a link to it)\n",
			name);
	return 64;
}
