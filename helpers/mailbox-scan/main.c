/*
 * pepsi-helper-mailbox-scan: the addresses a user has written to, from
 * the messages of a Maildir folder (the sent folder: pepsi-whitelist
 * seed), one per line on standard output, lower case, each once.
 *
 *   pepsi-helper-mailbox-scan [--max-size BYTES] FOLDER
 *
 * FOLDER is a Maildir folder (its cur/ and new/ are read; tmp/ never).
 * The To:, Cc: and Bcc: fields of each message's header section are
 * read (folded lines joined; display names, comments, groups and quoted
 * strings taken apart), and every mailbox of them printed.  It carries no
 * permission bit: pepsi-whitelist execs it by name from its own directory
 * with every id dropped back to the user's, so it opens nothing the user
 * could not.  A standalone program of libc only (no libpq, no
 * configuration): whatever a message says, it can only print lines.
 *
 * Bad input: a folder that is missing or not a Maildir, or a message
 * larger than --max-size ([whitelist] SEED_MAX_SIZE), ends it with a
 * sentence naming the file and exit status 65, having printed nothing;
 * a field entry that is not an address is named on standard error and
 * left out.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SCAN_PROGRAM "pepsi-helper-mailbox-scan"
/* The header section read of a message: beyond it a field is not looked for. */
#define SCAN_HEADER_MAX (256 * 1024)
#define SCAN_ADDRESS_MAX 320
#define SCAN_EX_DATAERR 65
#define SCAN_EX_USAGE 64
#define SCAN_EX_OSERR 71

struct scan_set
{
	char **items;
	size_t count, size;
};

static void *
scan_alloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);

	if (q == NULL)
	{
		fprintf(stderr, SCAN_PROGRAM ": out of memory\n");
		exit(SCAN_EX_OSERR);
	}
	return q;
}

static void
scan_set_add(struct scan_set *set, const char *address)
{
	if (set->count == set->size)
	{
		set->size = set->size ? set->size * 2 : 64;
		set->items = scan_alloc(set->items, set->size * sizeof(*set->items));
	}
	set->items[set->count] = scan_alloc(NULL, strlen(address) + 1);
	strcpy(set->items[set->count++], address);
}

/* local@domain: printable ASCII without space, one '@' with text on both sides, a dot-free-or-dotted domain. */
static bool
scan_address_ok(const char *a)
{
	const char *at = strrchr(a, '@');
	size_t		len = strlen(a);

	if (at == NULL || at == a || at[1] == '\0' || len > SCAN_ADDRESS_MAX)
		return false;
	for (const char *p = a; *p; p++)
		if ((unsigned char) *p <= ' ' || (unsigned char) *p >= 0x7f || *p == '<' || *p == '>' || *p == ','
			|| *p == ';' || *p == '(' || *p == ')' || *p == '\\' || *p == '[' || *p == ']')
			return false;
	for (const char *p = at + 1; *p; p++)
		if (!(isalnum((unsigned char) *p) || *p == '-' || *p == '.'))
			return false;
	return at[1] != '.' && a[len - 1] != '.' && strchr(a, '@') == at;
}

/* One entry of an address list ("Name <a@b>", "a@b (comment)"): its address, checked, into set. */
static void
scan_entry(struct scan_set *set, const char *file, const char *field, char *entry)
{
	char   address[SCAN_ADDRESS_MAX + 2];
	char  *lt = NULL, *gt = NULL;
	char  *colon;
	size_t n = 0;
	int	   depth = 0;
	bool   quoted = false;

	/* A group's name ("team: a@b, c@d;") is no address. */
	for (char *p = entry; *p; p++)
	{
		if (*p == '"' && (p == entry || p[-1] != '\\'))
			quoted = !quoted;
		else if (!quoted && *p == '<')
			lt = p;
		else if (!quoted && *p == '>' && lt)
			gt = p;
	}
	colon = lt ? NULL : strchr(entry, ':');
	if (colon)
		entry = colon + 1;
	if (lt && gt && gt > lt)
	{
		*gt = '\0';
		entry = lt + 1;
	}
	quoted = false;
	for (char *p = entry; *p; p++)
	{
		if (*p == '"')
			quoted = !quoted;
		if (!quoted && *p == '(')
			depth++;
		else if (!quoted && *p == ')' && depth > 0)
			depth--;
		else if (depth == 0 && !isspace((unsigned char) *p) && n <= SCAN_ADDRESS_MAX)
			address[n++] = (char) tolower((unsigned char) *p);
	}
	address[n] = '\0';
	if (n == 0 || (lt && gt && n == 0))
		return; /* an empty entry, "<>" or an empty group */
	if (!scan_address_ok(address))
	{
		fprintf(stderr, SCAN_PROGRAM ": %s: %s: \"%.80s\" is not an address: left out\n", file, field, address);
		return;
	}
	scan_set_add(set, address);
}

/* A field's unfolded value: its entries, split at commas and semicolons outside quotes, <> and comments. */
static void
scan_field(struct scan_set *set, const char *file, const char *field, char *value)
{
	char *start = value;
	int	  depth = 0;
	bool  quoted = false, angle = false;

	for (char *p = value;; p++)
	{
		if (*p == '\0' || (!quoted && !angle && depth == 0 && (*p == ',' || *p == ';')))
		{
			bool end = *p == '\0';

			*p = '\0';
			scan_entry(set, file, field, start);
			if (end)
				break;
			start = p + 1;
		}
		else if (*p == '\\' && p[1])
			p++;
		else if (*p == '"' && depth == 0)
			quoted = !quoted;
		else if (!quoted && *p == '(')
			depth++;
		else if (!quoted && *p == ')' && depth > 0)
			depth--;
		else if (!quoted && depth == 0 && *p == '<')
			angle = true;
		else if (!quoted && depth == 0 && *p == '>')
			angle = false;
	}
}

/* The message at path: its To, Cc and Bcc into set.  False (said why) when it cannot be read or is too large. */
static bool
scan_message(struct scan_set *set, const char *path, long long max_size)
{
	char	   *header;
	size_t		n = 0;
	int			fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	ssize_t		got;
	size_t		end;
	char	   *line, *next;
	char		field[8];

	if (fd < 0)
	{
		if (errno == ENOENT)
			return true; /* moved by the user's mail client meanwhile */
		fprintf(stderr, SCAN_PROGRAM ": %s: %s\n", path, strerror(errno));
		return false;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
	{
		close(fd);
		return true; /* not a message file */
	}
	if (max_size > 0 && st.st_size > max_size)
	{
		fprintf(stderr, SCAN_PROGRAM ": %s: %lld bytes is larger than the limit of %lld (--max-size, [whitelist] SEED_MAX_SIZE)\n",
				path, (long long) st.st_size, max_size);
		close(fd);
		return false;
	}
	header = scan_alloc(NULL, SCAN_HEADER_MAX + 1);
	while (n < SCAN_HEADER_MAX && (got = read(fd, header + n, SCAN_HEADER_MAX - n)) > 0)
		n += (size_t) got;
	close(fd);
	header[n] = '\0';
	/* The header section ends at the first empty line. */
	for (end = 0; end < n; end++)
		if (header[end] == '\n' && (end + 1 == n || header[end + 1] == '\n' || (header[end + 1] == '\r' && end + 2 < n && header[end + 2] == '\n')))
			break;
	header[end < n ? end + 1 : n] = '\0';
	/* Unfold: a line break followed by white space is white space. */
	for (char *p = header; *p; p++)
		if ((*p == '\r' || *p == '\n') && (p[1] == ' ' || p[1] == '\t' || (p[1] == '\n' && (p[2] == ' ' || p[2] == '\t'))))
			*p = ' ';
	for (line = header; line && *line; line = next)
	{
		char  *colon;
		size_t len;

		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		line[strcspn(line, "\r")] = '\0';
		colon = strchr(line, ':');
		len = colon ? (size_t) (colon - line) : 0;
		if (len < 2 || len > 3)
			continue;
		memcpy(field, line, len);
		field[len] = '\0';
		if (strcasecmp(field, "to") == 0 || strcasecmp(field, "cc") == 0 || strcasecmp(field, "bcc") == 0)
			scan_field(set, path, field, colon + 1);
	}
	free(header);
	return true;
}

static int
scan_compare(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

int
main(int argc, char **argv)
{
	struct scan_set set = {0};
	long long		max_size = 10LL * 1024 * 1024;
	const char	   *folder;
	const char	   *subdirs[] = {"cur", "new"};
	int				i = 1;

	if (argc > 2 && strcmp(argv[1], "--max-size") == 0)
	{
		char *end;

		errno = 0;
		max_size = strtoll(argv[2], &end, 10);
		if (errno || *end || max_size < 0)
		{
			fprintf(stderr, SCAN_PROGRAM ": --max-size: \"%s\" is not a number of bytes\n", argv[2]);
			return SCAN_EX_USAGE;
		}
		i = 3;
	}
	if (argc != i + 1 || argv[i][0] == '\0')
	{
		fprintf(stderr, "usage: " SCAN_PROGRAM " [--max-size BYTES] MAILDIR-FOLDER\n");
		return SCAN_EX_USAGE;
	}
	folder = argv[i];
	for (size_t s = 0; s < 2; s++)
	{
		char		   path[PATH_MAX];
		DIR			  *dir;
		struct dirent *e;

		snprintf(path, sizeof(path), "%s/%s", folder, subdirs[s]);
		if ((dir = opendir(path)) == NULL)
		{
			fprintf(stderr, SCAN_PROGRAM ": %s: %s (is %s a Maildir folder?)\n", path, strerror(errno), folder);
			return SCAN_EX_DATAERR;
		}
		while ((e = readdir(dir)) != NULL)
		{
			char file[PATH_MAX];

			if (e->d_name[0] == '.')
				continue;
			if ((size_t) snprintf(file, sizeof(file), "%s/%s", path, e->d_name) >= sizeof(file))
				continue;
			if (!scan_message(&set, file, max_size))
			{
				closedir(dir);
				return SCAN_EX_DATAERR;
			}
		}
		closedir(dir);
	}
	qsort(set.items, set.count, sizeof(*set.items), scan_compare);
	for (size_t k = 0; k < set.count; k++)
		if (k == 0 || strcmp(set.items[k], set.items[k - 1]) != 0)
			printf("%s\n", set.items[k]);
	if (fflush(stdout) != 0 || ferror(stdout))
	{
		fprintf(stderr, SCAN_PROGRAM ": cannot write the addresses: %s\n", strerror(errno));
		return SCAN_EX_OSERR;
	}
	return 0;
}
