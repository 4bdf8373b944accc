/*
 * standalone.c: the main of a per-program development build.  Compiled
 * once per program with PROGRAM_MAIN naming its entry point; it installs
 * no stage registry, so fusion is inert here (as in the spec).
 */
int			PROGRAM_MAIN(int argc, char **argv);

int			main(int argc, char **argv);

int
main(int argc, char **argv)
{
	return PROGRAM_MAIN(argc, argv);
}
