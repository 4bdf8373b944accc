/*
 * forward_file.h: the ~/.forward syntax of sendmail and Postfix local(8),
 * parsed by pepsi-helper-dot-forward as the file's owner.
 *
 * Entries are separated by commas or newlines; a line whose first
 * non-blank character is "#" is a comment; an entry may be in double
 * quotes (needed for a command with commas).  An entry is an address
 * (user@domain, or a bare user, which takes the recipient's domain),
 * "\user" (deliver to user's own mailbox, bypassing .forward: the way to
 * keep a local copy), "|command" (run the command with the message on its
 * standard input), "/path" (append the message to a mailbox file) or
 * ":include:/path" (the entries of another file, which the helper reads
 * with the same checks as the .forward itself).  What cannot be
 * understood is a bad entry, kept with its line number and the reason,
 * never a guess.
 */
#ifndef PEPSI_FORWARD_FILE_H
#define PEPSI_FORWARD_FILE_H

#include <stddef.h>

/* Longest line, newline excluded, and most entries of one file. */
#define FORWARD_MAX_LINE 4096
#define FORWARD_MAX_ENTRIES 1000
/* Longest address (RFC 5321 path limit). */
#define FORWARD_MAX_ADDRESS 254
/* :include: files within :include: files, at most. */
#define FORWARD_MAX_INCLUDE_DEPTH 5

enum forward_kind
{
	FORWARD_ADDRESS,
	FORWARD_LOCAL,
	FORWARD_PIPE,
	FORWARD_FILE,
	FORWARD_INCLUDE, /* value: the file's absolute path */
	FORWARD_BAD		 /* value: why */
};

struct forward_entry
{
	enum forward_kind kind;
	int				  line;
	char			 *value;
};

struct forward_list
{
	struct forward_entry *entries;
	size_t				  count;
};

/* Parse the text of a .forward (len bytes, NULs included). */
void forward_parse(const char *text, size_t len, struct forward_list *list);
void forward_list_free(struct forward_list *list);
/*
 * Add an entry (value: taken over) to list, within FORWARD_MAX_ENTRIES:
 * the last place left is a bad entry saying the rest is ignored.
 */
void forward_list_append(struct forward_list *list, enum forward_kind kind, int line, char *value);
/* The word the helper's protocol uses for kind: address, local, pipe, file, include, bad. */
const char *forward_kind_name(enum forward_kind kind);

#endif
