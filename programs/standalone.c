/*
 * standalone.c: the main of a per-program development build.  Compiled
 * once per program with PROGRAM_MAIN naming its entry point; it installs
 * no stage registry, so fusion is inert here (docs/architecture.md 3.4).
 */
int PROGRAM_MAIN(int argc, char **argv);

int main(int argc, char **argv);

int
main(int argc, char **argv)
{
	return PROGRAM_MAIN(argc, argv);
}
