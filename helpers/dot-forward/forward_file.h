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
 * standard input) or "/path" (append the message to a mailbox file).
 * ":include:" is not supported.  What cannot be understood is a bad entry,
 * kept with its line number and the reason, never a guess.
 */
#ifndef PEPSI_FORWARD_FILE_H
#define PEPSI_FORWARD_FILE_H

#include <stddef.h>

/* Longest line, newline excluded, and most entries of one file. */
#define FORWARD_MAX_LINE 4096
#define FORWARD_MAX_ENTRIES 1000
/* Longest address (RFC 5321 path limit). */
#define FORWARD_MAX_ADDRESS 254

enum forward_kind
{
	FORWARD_ADDRESS,
	FORWARD_LOCAL,
	FORWARD_PIPE,
	FORWARD_FILE,
	FORWARD_BAD /* value: why */
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
/* The word the helper's protocol uses for kind: address, local, pipe, file, bad. */
const char *forward_kind_name(enum forward_kind kind);

#endif
