/*
 * config_internal.h: what config.c shares with config_secrets.c, which
 * reads the pepsi.conf.d and secrets.d fragments into the configuration
 * being loaded.
 */
#ifndef PEPSI_CONFIG_INTERNAL_H
#define PEPSI_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stdio.h>

#include "config/config.h"

/*
 * Parsing state: libinih reads line by line through config_read_line.
 * libinih goes on after a refused line, so only the first refusal is kept
 * (with its own line number); the reader takes whole lines itself, since
 * libinih's fixed buffer would otherwise cut a long line in two and parse
 * its tail as a line of its own.
 */
struct config_parse
{
	struct pepsi_config *cfg;
	const char			*name;		  /* the file read, for messages */
	const char			*fragment;	  /* NULL: pepsi.conf; else the fragment's path (in cfg) */
	bool				 dropin;	  /* the fragment is one of pepsi.conf.d, not of secrets.d */
	FILE				*file;		  /* or */
	const char			*text;		  /* the rest of a string */
	char				*line_buffer; /* getline's, for the file */
	size_t				 line_capacity;
	int					 line;
	bool				 indented; /* the current line starts with white space */
	char				*err;
	size_t				 errlen;
	bool				 failed;
	int					 error_line;
};

/* Read one file (p->file) or string into p->cfg; false when refused (p->err says why). */
bool config_read(struct config_parse *p);
/* The fragments of secrets.d beside p->cfg's file, in name order; none when it does not exist. */
bool config_read_secrets(struct config_parse *p);
/* The same of the drop-in directory (pepsi.conf.d), whose fragments others may read. */
bool config_read_dropins(struct config_parse *p);

#endif
