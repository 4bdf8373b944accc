int pepsi_stage_decrypt_main(int argc, char **argv);
int
pepsi_stage_decrypt_main(int argc, char **argv)
{
	(void) argc;
	(void) argv;
	return 64;
}
