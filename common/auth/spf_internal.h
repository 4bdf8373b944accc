/*
 * spf_internal.h: what the SPF evaluator's files share (not for callers,
 * who see only spf.h).  spf_parse.c checks the syntax of records and of
 * macro-strings, spf_expand.c expands macros against a check's values,
 * spf.c evaluates a check over the resolver.
 */
#ifndef PEPSI_AUTH_SPF_INTERNAL_H
#define PEPSI_AUTH_SPF_INTERNAL_H

#include <ctype.h>
#include <stdbool.h>
#include <stddef.h>

#include "auth/spf.h"

#define SPF_LOOKUP_LIMIT 10 /* RFC 7208 4.6.4 */
#define SPF_VOID_LIMIT 2
#define SPF_MX_LIMIT 10
#define SPF_PTR_LIMIT 10
#define SPF_NAME_MAX 253
#define SPF_DEPTH_MAX (SPF_LOOKUP_LIMIT + 2)

enum spf_mechanism
{
	SPF_MECH_ALL,
	SPF_MECH_INCLUDE,
	SPF_MECH_A,
	SPF_MECH_MX,
	SPF_MECH_PTR,
	SPF_MECH_IP4,
	SPF_MECH_IP6,
	SPF_MECH_EXISTS
};

struct spf_term
{
	enum spf_mechanism mechanism;
	enum spf_result	   qualifier;	/* the result when it matches */
	char			  *domain_spec; /* NULL: the current domain */
	int				   cidr4;
	int				   cidr6;
	unsigned char	   network[16];
	char			  *text; /* as written, for the logs */
};

struct spf_record
{
	struct spf_term *terms;
	size_t			 count;
	char			*redirect;
	char			*exp;
};

struct spf_ip
{
	int			  family; /* 4 or 6; an IPv4-mapped IPv6 address is 4 */
	unsigned char addr[16];
};

enum spf_frame_kind
{
	SPF_FRAME_TOP,
	SPF_FRAME_INCLUDE
};

struct spf_frame
{
	enum spf_frame_kind kind;
	bool				redirected; /* reached through redirect= */
	char			   *domain;
	bool				parsed;
	struct spf_record	record;
	size_t				next; /* the term being evaluated */
};

/* What the check waits for from the DNS. */
enum spf_wait
{
	SPF_WAIT_NOTHING,
	SPF_WAIT_RECORD,	  /* TXT of the frame's domain */
	SPF_WAIT_A,			  /* a: the target's addresses */
	SPF_WAIT_MX,		  /* mx: the target's MX */
	SPF_WAIT_MX_ADDRESS,  /* mx: one exchange's addresses */
	SPF_WAIT_PTR,		  /* ptr: the client's names */
	SPF_WAIT_PTR_ADDRESS, /* ptr: one name's addresses */
	SPF_WAIT_EXISTS,	  /* exists: any A record */
	SPF_WAIT_P_PTR,		  /* %{p}: the client's names */
	SPF_WAIT_P_ADDRESS,	  /* %{p}: one name's addresses */
	SPF_WAIT_EXP		  /* exp=: the explanation's TXT */
};

struct spf_check
{
	struct dns_resolver *resolver;
	struct dns_budget	*budget;
	struct dns_query	*query;
	ev_timer			 finish_timer;
	spf_done_fn			 done;
	void				*arg;

	struct spf_ip ip;
	char		 *ip_text;
	char		 *sender;
	char		 *local_part;
	char		 *sender_domain;
	char		 *helo;
	char		 *receiver;

	struct spf_frame frames[SPF_DEPTH_MAX];
	size_t			 depth;
	unsigned		 lookups;
	unsigned		 voids;

	enum spf_wait wait;
	char		 *target; /* the current mechanism's domain */
	char		**names;  /* exchanges or PTR names to go through */
	size_t		  name_count;
	size_t		  name_index;
	bool		  any_match; /* ptr: a validated name fits */

	char  *p_value; /* %{p}, once known */
	char **p_names;
	size_t p_count;
	size_t p_index;
	char  *p_found; /* best validated name so far */
	int	   p_rank;

	bool  explaining; /* looking up exp= after a fail */
	char *exp_text;	  /* the explanation found, to expand */
	char  fail_reason[256];

	struct spf_verdict verdict;
	char			  *explanation;
	char			   reason[256];
};

enum spf_expand_status
{
	SPF_EXPAND_OK,
	SPF_EXPAND_NEED_P /* %{p} must be looked up first */
};

static inline bool
spf_is_alnum(char ch)
{
	return isascii((unsigned char) ch) && isalnum((unsigned char) ch);
}

/* spf_parse.c */
bool spf_macro_valid(const char *s, const char *end, bool explanation, char *reason,
					 size_t reasonlen);
bool spf_is_record(const char *text, size_t len);
bool spf_parse(const char *text, size_t len, struct spf_record *r, char *reason, size_t reasonlen);
void spf_record_free(struct spf_record *r);

/* spf_expand.c */
enum spf_expand_status spf_expand(const struct spf_check *c, const char *spec, const char *domain,
								  char **out);
void				   spf_truncate_name(char *name);

/* spf.c */
bool spf_ip_parse(const char *text, struct spf_ip *ip);

#endif
