# Pepsi: a mail transfer agent whose queue is a PostgreSQL table.
#
#   make          build the extension and every program (and the unit
#                 tests when cmocka is installed)
#   make install  install the extension (where pg_config says), the
#                 multi-call binary in $(PREFIX)/libexec/pepsi, one
#                 symlink per program in $(PREFIX)/bin and the man pages
#                 in $(PREFIX)/share/man; needs neither cmocka nor the tests
#                 (SENDMAIL_LINKS=yes: $(PREFIX)/sbin/sendmail, mailq, newaliases too)
#                 (and $(PREFIX)/lib/sysusers.d, tmpfiles.d, /etc/pepsi/pepsi.conf
#                 when absent; as root the accounts and the privileged
#                 programs' bits of debian/pepsi.postinst's table)
#   make uninstall  remove what make install installed (pepsi.conf stays)
#   make deb      the Debian packages (dpkg-buildpackage), in build/deb/
#   make deb-check  make deb, lintian, an install into a scratch root, and
#                 the package's files and modes against make install's
#   make run      install what running needs and start Pepsi on a private
#                 PostgreSQL cluster under ./run/
#   make stop     stop everything make run started (its pid files in ./run/pids/)
#   make check    check the C layout, build with -Werror, install, run every test suite
#   make sanitize the unit tests and the daemons' TAP tests against
#                 programs built with ASan and UBSan (build/san/)
#   make man      the man pages, from docs/*.[1-8].md (pandoc), in build/man/
#   make options-page  rewrite pepsi.conf(5)'s option reference from schema/options.def
#   make format   reformat the C sources with clang-format (.clang-format)
#   make format-check  fail if clang-format would change a C source
#   make bench    run the benchmarks in bench/
#
# Programs are found by directory: daemons/X builds pepsi-X, stages/X
# builds pepsi-stage-X, cli/X builds pepsi-X, and the unprivileged
# helpers/X pepsi-helper-X.  Each defines
# <name>_main (dashes as underscores); a stage also defines <name>_stage.
# Every program is built standalone (build/bin/) and linked into the
# multi-call binary build/bin/pepsi.

PG_CONFIG ?= $(firstword $(wildcard /usr/lib/postgresql/15/bin/pg_config) pg_config)
# Asked once per make run (:=), not once per compiler command.
PG_CONFIG := $(PG_CONFIG)
export PG_CONFIG
PG_INCLUDEDIR := $(shell $(PG_CONFIG) --includedir)
PG_LIBDIR := $(shell $(PG_CONFIG) --libdir)
PREFIX ?= /usr/local

CC ?= cc
CFLAGS ?= -O2 -g
WARNINGS = -Wall -Wextra -Wstrict-prototypes -Wmissing-prototypes -Wshadow \
           -Wpointer-arith -Wcast-qual -Wsign-compare -Wno-unused-parameter
# -I$(B): the generated headers (programs.h) of this build directory only,
# so that a second build (B=build/san) never picks up the first one's.
PEPSI_CFLAGS = -std=gnu11 $(WARNINGS) $(PEPSI_WERROR) -Icommon -Ischema -I$(B) \
               -I$(PG_INCLUDEDIR) -D_GNU_SOURCE
# Every compiler command also writes the headers it read (-MMD) into a .d
# file beside its output, included below, so that a changed header rebuilds
# exactly what includes it; -MP keeps a deleted header from breaking make.
DEPFLAGS = -MMD -MP -MF $@.d -MT $@
# libunbound runs its thread on libevent, and libev exports libevent's names too
# (event_set...): libevent must come first so libunbound binds to the real one.
LDLIBS = -L$(PG_LIBDIR) -lpq -ljansson -linih -lunbound -lidn2 -lopendkim -lpsl -Wl,--push-state,--no-as-needed -l:libevent-2.1.so.7 -Wl,--pop-state -lev -lmicrohttpd -largon2 -lsystemd -lcurl -lssl -lcrypto -lcrypt -lz -lm

B = build
# common/ is grouped in subfolders (docs/architecture.md names each);
# schema/ holds what the extension compiles too (the option schema).
COMMON_GROUPS = auth base config delivery dns local message process runtime setup smtp
COMMON_OBJS = $(patsubst %.c,$(B)/%.o,$(wildcard $(addprefix common/,$(addsuffix /*.c,$(COMMON_GROUPS))) schema/*.c))

# A directory of SEPARATE_PROGRAM_DIRS builds a multi-call binary of its own
# (below), not a program of the shared one.
SEPARATE_PROGRAM_DIRS = stages/detect-language/
# The helpers a timer runs, with no permission bit of their own (libpq,
# libcurl, jansson as any program), are programs of the multi-call binary
# too, named pepsi-helper-X; the set-id helpers are not (Privileged programs).
UNPRIVILEGED_HELPER_DIRS = helpers/token-refresh/
program_dirs = $(filter-out $(SEPARATE_PROGRAM_DIRS),$(wildcard daemons/*/) $(wildcard stages/*/) $(wildcard cli/*/)) \
               $(UNPRIVILEGED_HELPER_DIRS)
program_name = $(if $(findstring stages/,$(1)),pepsi-stage-$(notdir $(1:/=)),$(if $(findstring helpers/,$(1)),pepsi-helper-$(notdir $(1:/=)),pepsi-$(notdir $(1:/=))))
program_ident = $(subst -,_,$(call program_name,$(1)))
PROGRAMS = $(foreach d,$(program_dirs),$(call program_name,$(d)))
program_objs = $(patsubst %.c,$(B)/%.o,$(wildcard $(1)*.c))
ALL_PROGRAM_OBJS = $(foreach d,$(program_dirs),$(call program_objs,$(d)))
# Programs kept out of the multi-call binary (spec 22.2): pepsi-setup's
# one-off provisioning code would otherwise sit in every process's binary.
STANDALONE_PROGRAMS = pepsi-setup pepsi-keys pepsi-stage-encrypt pepsi-stage-decrypt pepsi-stage-autocrypt-learn
standalone_dirs = cli/setup/ cli/keys/ stages/encrypt/ stages/decrypt/ stages/autocrypt-learn/
# pepsi-telemetry, the telemetry collector, runs on another host from its
# own package (debian/pepsi-telemetry.install): not in the shared binary.
STANDALONE_PROGRAMS += pepsi-telemetry
standalone_dirs += daemons/telemetry/
# pepsi-keydisc (key discovery) links pepsi-crypto too.
STANDALONE_PROGRAMS += pepsi-keydisc
standalone_dirs += cli/keydisc/
# pepsi-crypto (common/crypto/): OpenPGP through GPGME, S/MIME through
# OpenSSL CMS, the key-encryption key.  Linked only into the programs that
# use the key store (STANDALONE_OBJS_/STANDALONE_LIBS_<program>), so that
# GPGME is in no other process.
CRYPTO_OBJS = $(patsubst %.c,$(B)/%.o,$(filter-out common/crypto/rnp_session.c,$(wildcard common/crypto/*.c)))
CRYPTO_LIBS = -lgpgme
# librnp: pepsi-stage-encrypt's OpenPGP encryption and signing in process
# (common/crypto/rnp_session.c says why), in that program only.
RNP_OBJS = $(B)/common/crypto/rnp_session.o
RNP_LIBS = $(shell pkg-config --libs librnp 2>/dev/null || echo -lrnp)
STANDALONE_OBJS_pepsi-keys = $(CRYPTO_OBJS)
STANDALONE_LIBS_pepsi-keys = $(CRYPTO_LIBS)
STANDALONE_OBJS_pepsi-stage-encrypt = $(CRYPTO_OBJS) $(RNP_OBJS)
STANDALONE_LIBS_pepsi-stage-encrypt = $(CRYPTO_LIBS) $(RNP_LIBS)
STANDALONE_OBJS_pepsi-stage-decrypt = $(CRYPTO_OBJS)
STANDALONE_LIBS_pepsi-stage-decrypt = $(CRYPTO_LIBS)
STANDALONE_OBJS_pepsi-stage-autocrypt-learn = $(CRYPTO_OBJS)
STANDALONE_LIBS_pepsi-stage-autocrypt-learn = $(CRYPTO_LIBS)
STANDALONE_OBJS_pepsi-keydisc = $(CRYPTO_OBJS)
STANDALONE_LIBS_pepsi-keydisc = $(CRYPTO_LIBS)
# The set-group-id stages (see Privileged programs below), and their code.
PRIVILEGED_STAGES = pepsi-stage-dot-forward pepsi-stage-auto-pay
privileged_stage_dirs = $(foreach s,$(PRIVILEGED_STAGES),stages/$(s:pepsi-stage-%=%)/)
PRIVILEGED_STAGE_OBJS = $(foreach d,$(privileged_stage_dirs),$(call program_objs,$(d)))

UNIT_TESTS = $(patsubst %.c,$(B)/%,$(wildcard common/tests/test_*.c stages/*/tests/test_*.c \
                                             daemons/*/tests/test_*.c))
# Data-driven tests find their data/ beside their source from anywhere.
TEST_CFLAGS = -DPEPSI_SOURCE_TOP='"$(CURDIR)"'
TEST_PROGRAMS = $(B)/bin/pepsi-test-probe $(B)/bin/pepsi-test-resolve $(B)/bin/pepsi-test-spf-suite \
                $(B)/bin/pepsi-test-pgconn

# The unit tests need cmocka; a build for installation does not.
HAVE_CMOCKA := $(shell pkg-config --exists cmocka 2>/dev/null && echo yes)

.PHONY: all programs test-programs extension install install-programs install-man install-systemd uninstall \
	deps deps-run check run stop bench fuzz fuzz-targets fuzz-replay clean unit-tests sanitize sanitize-build man man-check \
	format format-check options-page options-page-check

all: extension programs test-programs $(if $(HAVE_CMOCKA),unit-tests)

extension:
	$(MAKE) -C extension

programs: $(B)/bin/pepsi $(addprefix $(B)/bin/,$(PROGRAMS))

test-programs: $(TEST_PROGRAMS)

# (programs.h is order-only: the .d files name the objects that include it.)
$(B)/%.o: %.c | $(B)/programs.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(PEPSI_CFLAGS) $(DEPFLAGS) -I$(dir $<) -c -o $@ $<

# pepsi-httpd's page is built into it (.incbin): rebuild when it changes.
$(B)/daemons/httpd/www.o: $(wildcard daemons/httpd/www/* daemons/httpd/www/vendor/*)

# The version every program's --version prints and /metrics reports
# (pepsi_build_info): META.json's, compiled into cli.o only.
PEPSI_VERSION := $(shell sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' META.json | head -n 1)
$(B)/common/process/cli.o: PEPSI_CFLAGS += -DPEPSI_VERSION='"$(PEPSI_VERSION)"'
$(B)/common/process/cli.o: META.json

# The option schema is compiled into options.o (and the extension's config_schema.o).
$(B)/schema/options.o: schema/options.def

$(B)/libpepsi.a: $(COMMON_OBJS)
	rm -f $@
	ar rcs $@ $^

# The multi-call table: PROGRAM(ident, name) or STAGE(ident, name) per
# program, and FUSED_STAGE(ident, name) per privileged stage (below): in
# the stage registry, for the rows it passes on, but not a program of the
# multi-call binary.
$(B)/programs.h: $(program_dirs) $(privileged_stage_dirs) Makefile
	@mkdir -p $(B)
	@{ $(foreach d,$(program_dirs),echo '$(if $(findstring stages/,$(d)),STAGE,PROGRAM)($(call program_ident,$(d)), "$(call program_name,$(d))")';) \
	   $(foreach d,$(privileged_stage_dirs),echo 'FUSED_STAGE($(call program_ident,$(d)), "$(call program_name,$(d))")';) } > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp

# programs/names.c: the names sendmail, mailq and newaliases (install SENDMAIL_LINKS).
$(B)/bin/pepsi: $(B)/programs/pepsi.o $(B)/programs/names.o $(ALL_PROGRAM_OBJS) $(PRIVILEGED_STAGE_OBJS) $(B)/libpepsi.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(B)/programs/pepsi.o $(B)/programs/names.o $(ALL_PROGRAM_OBJS) $(PRIVILEGED_STAGE_OBJS) $(B)/libpepsi.a $(LDLIBS)

define standalone_rule
$(B)/bin/$(call program_name,$(1)): $(call program_objs,$(1)) $(STANDALONE_OBJS_$(call program_name,$(1))) $(B)/libpepsi.a programs/standalone.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CPPFLAGS) $$(CFLAGS) $$(LDFLAGS) $$(PEPSI_CFLAGS) $$(DEPFLAGS) -DPROGRAM_MAIN=$(call program_ident,$(1))_main \
		-DPROGRAM_NAME='"$(call program_name,$(1))"' \
		-o $$@ programs/standalone.c $(call program_objs,$(1)) $(STANDALONE_OBJS_$(call program_name,$(1))) $(B)/libpepsi.a \
		$$(LDLIBS) $(STANDALONE_LIBS_$(call program_name,$(1)))
endef
$(foreach d,$(program_dirs),$(eval $(call standalone_rule,$(d))))

# ---- pepsi-stage-detect-language: a multi-call binary of its own ------------
# It links libexttextcat and its models, which nothing else uses, so it is
# kept out of the shared binary (spec 22.2): one file answering to
# pepsi-stage-detect-language and pepsi-detect-language (a symlink to it),
# by stages/detect-language/main.c.
LANGUAGE_PROGRAMS = pepsi-stage-detect-language pepsi-detect-language
LANGUAGE_OBJS = $(call program_objs,stages/detect-language/)
LANGUAGE_CFLAGS := $(shell pkg-config --cflags libexttextcat 2>/dev/null || echo -I/usr/include/libexttextcat)
LANGUAGE_LIBS := $(shell pkg-config --libs libexttextcat 2>/dev/null || echo -lexttextcat-2.0)
$(LANGUAGE_OBJS): PEPSI_CFLAGS += $(LANGUAGE_CFLAGS)

$(B)/bin/pepsi-stage-detect-language: $(LANGUAGE_OBJS) $(B)/libpepsi.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(LANGUAGE_OBJS) $(B)/libpepsi.a $(LANGUAGE_LIBS) $(LDLIBS)

$(B)/bin/pepsi-detect-language: $(B)/bin/pepsi-stage-detect-language
	ln -sf pepsi-stage-detect-language $@

programs: $(addprefix $(B)/bin/,$(LANGUAGE_PROGRAMS))

# The file goes beside the shared binary, where pepsi-dispatch looks for a
# stage it does not hold (daemons/dispatch/pool.c), with a $(PREFIX)/bin
# symlink per name.
install-language: programs
	install -d $(DESTDIR)$(PREFIX)/libexec/pepsi $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(B)/bin/pepsi-stage-detect-language $(DESTDIR)$(PREFIX)/libexec/pepsi/pepsi-stage-detect-language
	for p in $(LANGUAGE_PROGRAMS); do \
		ln -sf ../libexec/pepsi/pepsi-stage-detect-language $(DESTDIR)$(PREFIX)/bin/$$p; done
install-programs: install-language

uninstall-language:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(LANGUAGE_PROGRAMS))
	rm -f $(DESTDIR)$(PREFIX)/libexec/pepsi/pepsi-stage-detect-language
uninstall: uninstall-language

.PHONY: install-language uninstall-language
# ---- end of pepsi-stage-detect-language ------------------------------------

# ---- Privileged programs (spec 22.2, docs/architecture.md) ------------------
# helpers/X builds pepsi-helper-X: a setuid-root helper, a standalone
# program linked only to helpers/X/*.c and the few common/ files named in
# HELPER_COMMON (libc only: no libpq, no jansson), with the configuration
# loader for those that read root's pepsi.conf (HELPER_COMMON_<helper>).
# A symlink to the multi-call binary could not carry its bit without
# lending it to every program, so neither the helpers nor PRIVILEGED_STAGES
# (the setgid stages that run them) are programs of the multi-call binary:
# those stages are built standalone.  Their code is linked into it all the
# same, for the stage registry only (FUSED_STAGE), so that a row such a
# stage would only pass on runs fused in its predecessor's worker, which
# needs no privilege for it (stage.h fuses_passing_on).  Their owners,
# groups and modes (the helper root:GROUP 4750, so only its stage can run
# it, and the stage root:GROUP 2755) are debian/pepsi.postinst's table,
# which make install reads too (install-privileged, below).
HELPER_COMMON = common/base/log common/base/xalloc common/process/privilege common/process/child_run
# pepsi-helper-mailbox-scan carries no bit: pepsi-whitelist execs it by
# name from its own directory, as the real user (spec 22.2); built like the
# set-id helpers (libc only), installed 0755 (install-mailbox-scan).
PLAIN_HELPER_DIRS = helpers/mailbox-scan/
helper_dirs = $(filter-out $(UNPRIVILEGED_HELPER_DIRS) $(PLAIN_HELPER_DIRS),$(wildcard helpers/*/))
HELPERS = $(foreach d,$(helper_dirs),pepsi-helper-$(notdir $(d:/=)))
# Per helper: its stage; the further common/
# files (HELPER_COMMON_<helper>) and libraries (HELPER_LIBS_<helper>) it
# links.
PRIVILEGED_CALLER_pepsi-helper-dot-forward = pepsi-stage-dot-forward
# The Maildir writer reads pepsi.conf (config, options: libinih) and writes
# with common/delivery/maildir.c.  Its stage stays in the multi-call binary too, so
# that a development tree fuses its successors; installed, the set-group-id
# file is the one pepsi-dispatch runs (daemons/dispatch/pool.c).
PRIVILEGED_CALLER_pepsi-helper-maildir-writer = pepsi-stage-relay-to-maildir
HELPER_COMMON_pepsi-helper-maildir-writer = common/delivery/maildir common/base/buf common/config/config common/config/config_secrets \
                                            common/config/config_route schema/options
HELPER_LIBS_pepsi-helper-maildir-writer = -linih
# The .forward helper reads ALLOW_FORWARD_PIPES and ALLOW_FORWARD_FILES from
# root's pepsi.conf itself.
HELPER_COMMON_pepsi-helper-dot-forward = common/config/config common/config/config_secrets common/config/config_route schema/options
HELPER_LIBS_pepsi-helper-dot-forward = -linih
# The auto-pay helper reads SYSTEM_DOMAINS, WALLET_DIR and WALLET_USER from
# root's pepsi.conf itself, and links libpq: it claims the payment its
# caller names from the database as its own role (pepsi.auto_pay_claim),
# so that what it pays is never its caller's to say.
PRIVILEGED_CALLER_pepsi-helper-auto-pay = pepsi-stage-auto-pay
HELPER_COMMON_pepsi-helper-auto-pay = common/config/config common/config/config_secrets common/config/config_route schema/options
HELPER_LIBS_pepsi-helper-auto-pay = -linih -L$(PG_LIBDIR) -lpq

define helper_rule
$(B)/bin/pepsi-helper-$(notdir $(1:/=)): $(patsubst %.c,$(B)/%.o,$(wildcard $(1)*.c)) \
		$(patsubst %,$(B)/%.o,$(HELPER_COMMON) $(HELPER_COMMON_pepsi-helper-$(notdir $(1:/=))))
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$(LDFLAGS) -o $$@ $$^ $(HELPER_LIBS_pepsi-helper-$(notdir $(1:/=)))
endef
$(foreach d,$(helper_dirs),$(eval $(call helper_rule,$(d))))
$(foreach d,$(PLAIN_HELPER_DIRS),$(eval $(call helper_rule,$(d))))
PLAIN_HELPERS = $(foreach d,$(PLAIN_HELPER_DIRS),pepsi-helper-$(notdir $(d:/=)))
programs: $(addprefix $(B)/bin/,$(PLAIN_HELPERS))
install-mailbox-scan: programs
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(addprefix $(B)/bin/,$(PLAIN_HELPERS)) $(DESTDIR)$(PREFIX)/bin/
uninstall-mailbox-scan:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(PLAIN_HELPERS))
install-programs: install-mailbox-scan
uninstall: uninstall-mailbox-scan
.PHONY: install-mailbox-scan uninstall-mailbox-scan

programs: $(addprefix $(B)/bin/,$(HELPERS))

# Set-group-id stages that run no helper: their group's files are what
# they read.  relay-to-smarthost reads the OAuth access tokens of group
# pepsi-token (spec: the setgid pepsi-stage-relay-to-smarthost), which
# pepsi-helper-token-refresh writes.  It stays in the multi-call binary,
# where a password-authenticated smarthost runs fused after route; with a
# token it never fuses (its can_fuse), so its rows reach this file.
SETGID_STAGES = pepsi-stage-relay-to-smarthost
SETGID_GROUP_pepsi-stage-relay-to-smarthost = pepsi-token

# The set-id programs make install installs (the helpers' callers and the
# set-group-id stages): the one list, which the code gets as
# PEPSI_SETID_PROGRAMS (common/process/privilege.c): pepsi-dispatch runs
# no other set-id file it finds.
# The set-user-id stages: the crypto stages run as pepsi-crypto (and its
# group, which reads the KEK's secrets.d fragment), because PostgreSQL's
# peer authentication keys off the effective uid and that role alone reads
# the private keys (docs/pepsi-stage-encrypt.8.md).  Built standalone.
SETUID_STAGES = pepsi-stage-encrypt pepsi-stage-decrypt
# pepsi-quota recount runs the Maildir writer (pepsi-quota(8)): set-group-id
# to the writer's caller group, as its stage; pepsi.quota's other commands
# need no privilege.
SETGID_TOOLS = pepsi-quota
# pepsi-whitelist is set-user-id pepsi-whitelist: that account's peer
# authentication is the one way into the role pepsi_whitelist, and the
# program acts only for its real user (cli/whitelist/whitelist.c).
SETUID_TOOLS = pepsi-whitelist
SETID_PROGRAMS = $(foreach h,$(HELPERS),$(PRIVILEGED_CALLER_$(h))) $(SETGID_STAGES) $(SETUID_STAGES) $(SETGID_TOOLS) $(SETUID_TOOLS)
$(B)/setid_programs.h: Makefile
	@mkdir -p $(B)
	@echo '#define PEPSI_SETID_PROGRAMS $(foreach p,$(SETID_PROGRAMS),"$(p)",)' > $@.tmp
	@cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp
$(B)/common/process/privilege.o: | $(B)/setid_programs.h

# The standalone rules above are made; from here on program_dirs (read by
# the recipes of programs.h, the multi-call binary, install and uninstall
# when they run) leaves the privileged stages out.
program_dirs := $(filter-out $(privileged_stage_dirs) $(standalone_dirs),$(program_dirs))

# The owner, group and mode of each privileged program: the table of
# debian/pepsi.postinst (the one list of what is set, which the package's
# postinst applies), "NAME OWNER GROUP MODE" per line.  make install sets
# them as root: make install on a real install (no DESTDIR) first makes
# the accounts of dist/sysusers.d/pepsi.conf; a staged one (DESTDIR) makes
# none on this host; a program whose owner or group this host lacks is
# installed without its bit, saying so.  Not as root, or with SETID=no (the package's build:
# its postinst sets them), every one is installed 0755 without a bit.  A
# helper or set-id stage the table lacks, or a line naming a program not
# built, stops the install.  PRIVILEGED_GROUP_<helper>=GROUP on the command
# line gives that helper and its stage another group (the tests' own).
PRIVILEGED_TABLE = debian/pepsi.postinst
privileged_group_overrides = $(foreach h,$(HELPERS),$(if $(PRIVILEGED_GROUP_$(h)),$(h)=$(PRIVILEGED_GROUP_$(h)) $(PRIVILEGED_CALLER_$(h))=$(PRIVILEGED_GROUP_$(h)))) \
                             $(if $(PRIVILEGED_GROUP_pepsi-helper-maildir-writer),pepsi-quota=$(PRIVILEGED_GROUP_pepsi-helper-maildir-writer))
privileged_rows = sed -n '/^\# BEGIN PRIVILEGED/,/^\# END PRIVILEGED/s/^\(pepsi-[a-z-]*\)  *\([a-z][a-z-]*\)  *\([a-z][a-z-]*\)  *\([0-7]\{4\}\)$$/\1 \2 \3 \4/p' $(PRIVILEGED_TABLE)
install-privileged: programs
	install -d $(DESTDIR)$(PREFIX)/bin
	@for p in $(HELPERS) $(SETID_PROGRAMS); do \
		$(privileged_rows) | grep -q "^$$p " || { \
			echo "$$p is built but not in $(PRIVILEGED_TABLE)'s table of privileged programs" >&2; exit 1; }; \
	done
	@$(privileged_rows) | while read -r name owner group mode; do \
		[ -f $(B)/bin/$$name ] || { echo "$(PRIVILEGED_TABLE) names $$name, which is not built" >&2; exit 1; }; \
		for o in $(privileged_group_overrides); do case $$o in $$name=*) group=$${o#*=};; esac; done; \
		if [ "$(SETID)" = no ]; then \
			install -m 755 $(B)/bin/$$name $(DESTDIR)$(PREFIX)/bin/$$name || exit 1; \
		elif [ "$$(id -u)" -ne 0 ]; then \
			install -m 755 $(B)/bin/$$name $(DESTDIR)$(PREFIX)/bin/$$name || exit 1; \
			echo "warning: not root: $$name installed without its bit ($$owner:$$group $$mode)"; \
		elif ! getent passwd $$owner >/dev/null || ! getent group $$group >/dev/null; then \
			install -m 755 $(B)/bin/$$name $(DESTDIR)$(PREFIX)/bin/$$name || exit 1; \
			echo "warning: no user $$owner or group $$group on this host: $$name installed without its bit ($$owner:$$group $$mode)"; \
		else \
			echo "install -o $$owner -g $$group -m $$mode $(B)/bin/$$name $(DESTDIR)$(PREFIX)/bin/$$name"; \
			install -o $$owner -g $$group -m $$mode $(B)/bin/$$name $(DESTDIR)$(PREFIX)/bin/$$name || exit 1; \
		fi; \
	done
install-programs: install-privileged

# The table's lines, for scripts/deb.sh.
privileged-table:
	@$(privileged_rows)

# The accounts of dist/sysusers.d/pepsi.conf, on this host (make install
# as root, no DESTDIR; not make install-privileged alone): by
# systemd-sysusers, else by groupadd and useradd.
install-accounts-create:
	if command -v systemd-sysusers >/dev/null; then \
		systemd-sysusers dist/sysusers.d/pepsi.conf; \
	else \
		grep -E '^[ug] ' dist/sysusers.d/pepsi.conf | while read -r kind name rest; do \
			getent group $$name >/dev/null || groupadd --system $$name || exit 1; \
			[ $$kind = g ] || getent passwd $$name >/dev/null || \
				useradd --system --gid $$name --no-create-home \
					--home-dir "$$(echo "$$rest" | awk '{ print $$(NF - 1) }')" \
					--shell /usr/sbin/nologin $$name || exit 1; \
		done; \
	fi

uninstall-privileged:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(HELPERS) $(PRIVILEGED_STAGES))
uninstall: uninstall-privileged

.PHONY: install-privileged uninstall-privileged install-accounts-create privileged-table
# ---- end of privileged programs -------------------------------------------

# Unit tests (cmocka): one binary per test file, linked with the code of
# its directory's parent (common/ or the stage, less its main.c) and
# libpepsi.  scripts/check.sh runs every build/**/tests/test_* it finds.
$(B)/common/tests/%: common/tests/%.c $(B)/libpepsi.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PEPSI_CFLAGS) $(TEST_CFLAGS) $(DEPFLAGS) -o $@ $< $(B)/libpepsi.a $(LDLIBS) -lcmocka

# stages/X/tests/test_Y.c -> stages/X/ (the same spelling as program_dirs,
# so its objects are the very targets the programs are built from), less
# its main.o.  A daemon's files share its main's globals, so
# daemons/X/tests/test_Y.c links only daemons/X/Y.o, the file it tests, and
# what test_extra_test_Y names of its neighbours.
test_program_dir = $(patsubst %/tests/,%/,$(dir $(1)))
test_objs = $(if $(findstring daemons/,$(1)),\
	$(B)/$(call test_program_dir,$(1))$(patsubst test_%.c,%.o,$(notdir $(1))) \
	$(test_extra_$(basename $(notdir $(1)))),\
	$(filter-out %/main.o,$(call program_objs,$(call test_program_dir,$(1)))))
# auth_worker.c hands the password checks to auth.c.
test_extra_test_auth_worker = $(B)/daemons/ingress/auth.o
define program_test_rule
$(B)/$(1:.c=): $(1) $(call test_objs,$(1)) $(B)/libpepsi.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$(PEPSI_CFLAGS) $$(TEST_CFLAGS) $$(DEPFLAGS) -I$(call test_program_dir,$(1)) -o $$@ $$(filter %.c %.o %.a,$$^) $$(LDLIBS) -lcmocka
endef
$(foreach t,$(wildcard stages/*/tests/test_*.c daemons/*/tests/test_*.c),$(eval $(call program_test_rule,$(t))))

# The TAP tests' own stage (t/probe/): built beside the programs so the
# tests find it in PEPSI_BIN; neither installed nor in the multi-call binary.
$(B)/bin/pepsi-test-probe: t/probe/probe.c $(B)/libpepsi.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PEPSI_CFLAGS) $(DEPFLAGS) -o $@ $< $(B)/libpepsi.a $(LDLIBS)

# The resolver layer driven from the command line (t/dns/), and the SPF
# evaluator over the RFC 7208 test suite (t/spf/), likewise.
$(B)/bin/pepsi-test-resolve: t/dns/resolve.c $(B)/libpepsi.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PEPSI_CFLAGS) $(DEPFLAGS) -o $@ $< $(B)/libpepsi.a $(LDLIBS)

$(B)/bin/pepsi-test-spf-suite: t/spf/spf_suite.c $(B)/libpepsi.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PEPSI_CFLAGS) $(DEPFLAGS) -o $@ $< $(B)/libpepsi.a $(LDLIBS)

# common/runtime/pgconn.c driven from the command line (t/pgconn/), likewise.
$(B)/bin/pepsi-test-pgconn: t/pgconn/pgconn_driver.c $(B)/libpepsi.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PEPSI_CFLAGS) $(DEPFLAGS) -o $@ $< $(B)/libpepsi.a $(LDLIBS)

# The headers each object and program read (see DEPFLAGS).
-include $(wildcard $(B)/*/*.d $(B)/*/*/*.d $(B)/*/*/*/*.d)

# (The extension's module is installed 0644 as a Debian package has it:
# PGXS installs it executable.)
install: extension programs man
	$(MAKE) -C extension install
	chmod 644 $(DESTDIR)$(shell $(PG_CONFIG) --pkglibdir)/pepsi.so
	@if [ "$(SETID)" != no ] && [ "$$(id -u)" -eq 0 ] && [ -z "$(DESTDIR)" ]; then $(MAKE) --no-print-directory install-accounts-create; fi
	$(MAKE) install-programs install-man
	$(MAKE) install-systemd install-accounts install-config install-telemetry
	$(if $(filter yes,$(SENDMAIL_LINKS)),$(MAKE) install-sendmail-links)

# make install SENDMAIL_LINKS=yes: $(PREFIX)/sbin/sendmail, mailq and
# newaliases as links to the multi-call binary (programs/names.c), for
# cron, PHP, logwatch.  A file there that is not such a link (another
# MTA's) is never replaced: the install stops and says so.
SENDMAIL_NAMES = sendmail mailq newaliases
install-sendmail-links: install-programs
	install -d $(DESTDIR)$(PREFIX)/sbin
	for n in $(SENDMAIL_NAMES); do \
		l=$(DESTDIR)$(PREFIX)/sbin/$$n; \
		if [ -e "$$l" ] || [ -L "$$l" ]; then \
			[ "$$(readlink "$$l")" = ../libexec/pepsi/pepsi ] && continue; \
			echo "$$l exists and is not a link to Pepsi: left alone; move it away and run make install-sendmail-links" >&2; \
			exit 1; \
		fi; \
		ln -s ../libexec/pepsi/pepsi "$$l" || exit 1; \
	done
.PHONY: install-sendmail-links

install-programs: programs
	install -d $(DESTDIR)$(PREFIX)/libexec/pepsi $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(B)/bin/pepsi $(DESTDIR)$(PREFIX)/libexec/pepsi/pepsi
	for p in $(filter-out $(SETID_PROGRAMS) $(STANDALONE_PROGRAMS),$(PROGRAMS)); do \
		ln -sf ../libexec/pepsi/pepsi $(DESTDIR)$(PREFIX)/bin/$$p; done
	install -m 755 $(addprefix $(B)/bin/,$(filter-out $(SETID_PROGRAMS),$(STANDALONE_PROGRAMS))) $(DESTDIR)$(PREFIX)/bin/

# The service units (dist/systemd), with this installation's paths; then
# systemctl daemon-reload and systemctl enable --now pepsi-dispatch
# pepsi-ingress pepsi-httpd (docs/pepsi-httpd.8.md, "Running as a service"),
# and pepsi-failure-bouncer.timer, pepsi-dmarc-report.timer,
# pepsi-tlsrpt.timer, pepsi-keydisc.timer and pepsi-secure-link-expire.timer
# if wanted.
SYSCONFDIR ?= /etc
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
install-systemd:
	install -d $(DESTDIR)$(SYSTEMD_UNIT_DIR)
	for u in dist/systemd/*.service.in dist/systemd/*.timer.in; do \
		sed -e 's|@BINDIR@|$(PREFIX)/bin|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' $$u \
			> $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$(basename $$u .in) && \
		chmod 644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$(basename $$u .in) || exit 1; \
	done

# The system accounts and directories (dist/sysusers.d, dist/tmpfiles.d),
# for systemd-sysusers and systemd-tmpfiles on an installation without the
# Debian package (whose postinst reads the same sysusers.d file).
SYSUSERS_DIR ?= $(PREFIX)/lib/sysusers.d
TMPFILES_DIR ?= $(PREFIX)/lib/tmpfiles.d
install-accounts:
	install -d $(DESTDIR)$(SYSUSERS_DIR) $(DESTDIR)$(TMPFILES_DIR)
	install -m 644 dist/sysusers.d/pepsi.conf $(DESTDIR)$(SYSUSERS_DIR)/pepsi.conf
	install -m 644 dist/sysusers.d/pepsi-telemetry.conf $(DESTDIR)$(SYSUSERS_DIR)/pepsi-telemetry.conf
	install -m 644 dist/tmpfiles.d/pepsi.conf $(DESTDIR)$(TMPFILES_DIR)/pepsi.conf

# $(SYSCONFDIR)/pepsi/pepsi.conf: dist/pepsi.conf, a short file that says
# where the settings are (pepsi-setup init writes them to the drop-in
# pepsi.conf.d/setup.conf, so that this file, the package's conffile, is
# never rewritten).  An existing one is never replaced.  The package ships
# the same file.  docs/pepsi.conf.sample is the commented whole, for a host
# set up by hand.
install-config:
	install -d $(DESTDIR)$(SYSCONFDIR)/pepsi
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/pepsi/pepsi.conf ]; then \
		echo "$(DESTDIR)$(SYSCONFDIR)/pepsi/pepsi.conf exists: left as it is"; \
	else \
		install -m 644 dist/pepsi.conf $(DESTDIR)$(SYSCONFDIR)/pepsi/pepsi.conf.tmp && \
		mv $(DESTDIR)$(SYSCONFDIR)/pepsi/pepsi.conf.tmp $(DESTDIR)$(SYSCONFDIR)/pepsi/pepsi.conf && \
		echo "$(DESTDIR)$(SYSCONFDIR)/pepsi/pepsi.conf: from dist/pepsi.conf"; \
	fi
.PHONY: install-accounts install-config

# The telemetry collector's schema and its own file (pepsi-telemetry(8)),
# which the pepsi-telemetry package ships; an existing file is never replaced.
install-telemetry:
	install -d $(DESTDIR)$(PREFIX)/share/pepsi-telemetry $(DESTDIR)$(SYSCONFDIR)/pepsi-telemetry
	install -m 644 daemons/telemetry/telemetry.sql $(DESTDIR)$(PREFIX)/share/pepsi-telemetry/telemetry.sql
	@[ -e $(DESTDIR)$(SYSCONFDIR)/pepsi-telemetry/pepsi-telemetry.conf ] || \
		install -m 644 dist/pepsi-telemetry.conf $(DESTDIR)$(SYSCONFDIR)/pepsi-telemetry/pepsi-telemetry.conf
uninstall-telemetry:
	rm -f $(DESTDIR)$(PREFIX)/share/pepsi-telemetry/telemetry.sql $(DESTDIR)$(SYSUSERS_DIR)/pepsi-telemetry.conf
	-rmdir $(DESTDIR)$(PREFIX)/share/pepsi-telemetry
uninstall: uninstall-telemetry
.PHONY: install-telemetry uninstall-telemetry

# Man pages: docs/NAME.SECTION.md, the one format of docs/, converted by
# pandoc; the page's first heading, "NAME(SECTION)", is its title.
MANDIR = $(PREFIX)/share/man
MAN_SOURCES = $(wildcard docs/*.[1-8].md)
MAN_PAGES = $(patsubst docs/%.md,$(B)/man/%,$(MAN_SOURCES))
man_section = $(subst .,,$(suffix $(1)))
PANDOC ?= pandoc

man: $(MAN_PAGES)

PANDOC_MAN = $(PANDOC) --standalone --from markdown-smart --to man --shift-heading-level-by=-1 \
	-M hyphenate=false -M footer=Pepsi -M header="Pepsi Manual"

$(B)/man/%: docs/%.md
	@mkdir -p $(dir $@)
	$(PANDOC_MAN) -M date="$$(git log -1 --format=%cs -- $< 2>/dev/null)" -o $@ $<

# pepsi.conf(5)'s option reference is made from schema/options.def
# (scripts/options-page.c), and the man page from what it makes, so the
# installed page cannot drift; options-page-check (make check) fails when
# the committed docs/pepsi.conf.5.md differs, make options-page rewrites it.
$(B)/options-page: scripts/options-page.c schema/options.c schema/options.h schema/options.def
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PEPSI_CFLAGS) -o $@ scripts/options-page.c schema/options.c

$(B)/pepsi.conf.5.md: docs/pepsi.conf.5.md $(B)/options-page
	$(B)/options-page <docs/pepsi.conf.5.md >$@.tmp && mv $@.tmp $@

$(B)/man/pepsi.conf.5: $(B)/pepsi.conf.5.md
	@mkdir -p $(dir $@)
	$(PANDOC_MAN) -M date="$$(git log -1 --format=%cs -- docs/pepsi.conf.5.md schema/options.def 2>/dev/null)" -o $@ $<

options-page: $(B)/pepsi.conf.5.md
	cp $(B)/pepsi.conf.5.md docs/pepsi.conf.5.md

options-page-check: $(B)/pepsi.conf.5.md
	@diff -u docs/pepsi.conf.5.md $(B)/pepsi.conf.5.md >/dev/null || { \
		diff -u docs/pepsi.conf.5.md $(B)/pepsi.conf.5.md | head -40; \
		echo "docs/pepsi.conf.5.md differs from schema/options.def: run make options-page"; exit 1; }
	@echo "docs/pepsi.conf.5.md: as schema/options.def makes it"

# Every page renders with man(1), with no undefined macro, bad escape or
# unknown character (tables too wide for 80 columns, and a table cell too
# long to break, are only layout).
man-check: man options-page-check
	@for page in $(MAN_PAGES); do \
		problems=$$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings=mac,escape,input,char,font,syntax \
				-l $$page 2>&1 >/dev/null \
			| grep -v -e 'table wider than line width' -e 'table text block will not fit' \
				-e 'cannot adjust line' -e "can't break line" -e "^warning: file '<standard input>', around line"); \
		if [ -n "$$problems" ]; then echo "$$page: $$problems"; exit 1; fi; \
	done; echo "man pages: $(words $(MAN_PAGES)) render with man -l"

install-man: man
	for page in $(MAN_PAGES); do \
		section=$${page##*.}; \
		install -d $(DESTDIR)$(MANDIR)/man$$section; \
		install -m 644 $$page $(DESTDIR)$(MANDIR)/man$$section/; \
	done

uninstall:
	$(MAKE) -C extension uninstall
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(PROGRAMS))
	for n in $(SENDMAIL_NAMES); do l=$(DESTDIR)$(PREFIX)/sbin/$$n; \
		[ "$$(readlink "$$l")" = ../libexec/pepsi/pepsi ] && rm -f "$$l"; done; true
	rm -f $(DESTDIR)$(PREFIX)/libexec/pepsi/pepsi
	-rmdir $(DESTDIR)$(PREFIX)/libexec/pepsi
	rm -f $(foreach page,$(MAN_PAGES),$(DESTDIR)$(MANDIR)/man$(call man_section,$(page))/$(notdir $(page)))
	rm -f $(addprefix $(DESTDIR)$(SYSTEMD_UNIT_DIR)/,$(notdir $(basename $(wildcard dist/systemd/*.service.in dist/systemd/*.timer.in))))
	rm -f $(DESTDIR)$(SYSUSERS_DIR)/pepsi.conf $(DESTDIR)$(TMPFILES_DIR)/pepsi.conf

deps:
	@scripts/deps.sh check

# The Debian packages (debian/): dpkg-buildpackage from a copy of the tree,
# the packages in build/deb/.  deb-check (as root) builds them, runs
# lintian, installs them into a scratch root (dpkg --root) and checks the
# privileged programs' bits against debian/pepsi.postinst's table and the
# packages' files and modes against make install's (scripts/deb.sh).
DEB_DIR = $(B)/deb
deb:
	@scripts/deps.sh deb
	scripts/deb.sh build $(DEB_DIR)

deb-check:
	@scripts/deps.sh deb
	scripts/deb.sh check $(DEB_DIR)
.PHONY: deb deb-check

# What running needs only: no test peer (Postfix, Dovecot, rspamd, nsd,
# OpenDKIM, Chromium, npm) is installed or started by make run.
deps-run:
	@scripts/deps.sh run

# Warnings are errors here, so everything is rebuilt with -Werror, once,
# the builds (and the layout's check) two jobs at a time (CHECK_JOBS).  The fuzz targets replay
# their corpora (fuzz-replay); bench/fuzz/run.sh fuzzes.  PEPSI_NO_SKIP:
# a test file that skips fails (scripts/check.sh).
CHECK_JOBS ?= 2
check: deps
	$(MAKE) clean
	$(MAKE) -j$(CHECK_JOBS) PEPSI_WERROR=-Werror format-check all fuzz-targets sanitize-build man
	$(MAKE) -C extension install
	$(MAKE) fuzz-replay
	$(MAKE) man-check
	PEPSI_NO_SKIP=1 scripts/check.sh

unit-tests: $(UNIT_TESTS)

# The unit tests and the programs again, built with AddressSanitizer and
# UBSan into build/san/.  scripts/check.sh runs every unit test binary
# under build/, and the daemons' TAP tests of $(SANITIZE_TAP) against
# build/san/bin instead of build/bin (but for those of its TAP_OPTIMISED,
# which drain thousands of rows, against the optimised build); any sanitizer report
# fails them.  make check runs both; make sanitize only these.
SANITIZE_B = build/san
SANITIZE_CFLAGS = -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
export SANITIZE_TAP ?= $(wildcard t/03?_ingress*.pl t/04?_dispatch*.pl)

# Only the programs those tests run are linked (the objects are all
# compiled, for the multi-call binary): the daemons, the stages their
# configurations name (t/lib/DispatchTest.pm, t/lib/DeliveryTest.pm), the
# helpers and the test stage.  A sanitized test that runs another program
# names it here.
SANITIZE_PROGRAMS = pepsi pepsi-dispatch pepsi-ingress pepsi-status pepsi-keys \
                    pepsi-stage-discard pepsi-stage-if pepsi-stage-route pepsi-stage-bounce \
                    pepsi-stage-relay-to-internet pepsi-stage-relay-to-maildir pepsi-stage-relay-to-smarthost \
                    $(HELPERS) pepsi-test-probe
# The mailing lists' programs (t/165_lists.pl).
SANITIZE_PROGRAMS += pepsi-httpd pepsi-list pepsi-stage-list pepsi-stage-dkim-sign
# The crypto stages (t/163_crypto.pl).
SANITIZE_PROGRAMS += pepsi-stage-encrypt pepsi-stage-decrypt pepsi-stage-autocrypt-learn
# The telemetry client and collector (t/172_telemetry.pl).
SANITIZE_PROGRAMS += pepsi-telemetry-client pepsi-telemetry
# The secure-link portal's tool (t/178_secure_link.pl).
SANITIZE_PROGRAMS += pepsi-secure-link

sanitize-build:
	$(MAKE) B=$(SANITIZE_B) PEPSI_WERROR=-Werror CFLAGS="$(SANITIZE_CFLAGS)" \
		$(addprefix $(SANITIZE_B)/bin/,$(SANITIZE_PROGRAMS)) unit-tests

sanitize: sanitize-build
	$(MAKE) -C extension install
	PEPSI_UNIT_DIR=$(SANITIZE_B) PEPSI_SKIP="regress tap" scripts/check.sh

# C style: .clang-format (PostgreSQL's layout: tabs of 4, braces on their
# own lines, the return type of a definition on its own line).
CLANG_FORMAT ?= clang-format
FORMAT_SOURCES = $(shell find common schema daemons stages cli programs helpers extension/src t scripts -name '*.[ch]' | sort)

format:
	$(CLANG_FORMAT) -i $(FORMAT_SOURCES)

format-check:
	$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_SOURCES)

run: deps-run all
	$(MAKE) -C extension install
	scripts/run.sh start

# Stops everything make run started (its pid files), from any terminal.
stop:
	scripts/run.sh stop

bench: deps all
	$(MAKE) -C extension install
	bench/run-all.sh

# Fuzz targets (libFuzzer with ASan and UBSan) for the parsers that face
# the network, seeded from their corpus in the repository; what a run
# finds new is kept under build/.  FUZZ_TIME seconds per target.
FUZZ_CC ?= clang
FUZZ_TIME ?= 60
FUZZ_CFLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
              -std=gnu11 -D_GNU_SOURCE -Icommon -Ischema

# Each source is compiled once, into $(B)/fuzz/obj/, and the objects are
# shared by the targets that link it (common/ is in most of them).  A
# harness in X/fuzz/ includes X's headers.
$(B)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(DEPFLAGS) -I$(dir $<) -I$(patsubst %/fuzz/,%,$(dir $<)) -I$(PG_INCLUDEDIR) -c -o $@ $<
fuzz_objs = $(patsubst %.c,$(B)/fuzz/obj/%.o,$(1))
FUZZ_BASE = common/base/base64.c common/base/buf.c common/base/log.c common/base/xalloc.c
FUZZ_CONFIG = common/config/config.c common/config/config_secrets.c common/config/config_route.c schema/options.c
FUZZ_SMTP_CLIENT = common/smtp/smtp_client.c common/smtp/smtp_client_io.c common/smtp/smtp_transaction.c \
                   common/smtp/smtp_auth.c common/message/mime_downgrade.c common/message/mime.c \
                   common/smtp/tls_policy.c common/message/message.c \
                   common/message/header.c common/dns/dns.c common/smtp/mta_sts.c \
                   common/dns/public_address.c
# (the link: libFuzzer's main and the sanitizers' runtimes)
fuzz_link = $(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $^ $(LDLIBS) -lpthread

$(B)/fuzz/fuzz_smtp: $(call fuzz_objs,daemons/ingress/fuzz/fuzz_smtp.c daemons/ingress/smtp.c daemons/ingress/smtp_envelope_cmds.c daemons/ingress/smtp_session_cmds.c daemons/ingress/smtp_content.c \
                     daemons/ingress/smtp_syntax.c daemons/ingress/envelope.c daemons/ingress/relay_control.c \
                     daemons/ingress/auth_throttle.c common/message/message.c common/local/local.c common/local/aliases.c \
                     common/message/header.c common/auth/results.c common/smtp/smtp_address.c $(FUZZ_BASE) $(FUZZ_CONFIG))
	$(fuzz_link)

$(B)/fuzz/fuzz_auth: $(call fuzz_objs,common/auth/fuzz/fuzz_auth.c $(wildcard common/auth/*.c) common/dns/dns.c \
                     common/message/srs.c $(FUZZ_BASE) $(FUZZ_CONFIG))
	$(fuzz_link)

$(B)/fuzz/fuzz_milter: $(call fuzz_objs,stages/milter/fuzz/fuzz_milter.c common/message/milter.c common/message/milter_message.c \
                       common/base/buf.c common/base/log.c common/base/xalloc.c)
	$(fuzz_link)

$(B)/fuzz/fuzz_smtp_client: $(call fuzz_objs,common/fuzz/fuzz_smtp_client.c $(FUZZ_SMTP_CLIENT) $(FUZZ_BASE) $(FUZZ_CONFIG))
	$(fuzz_link)

$(B)/fuzz/fuzz_canon: $(call fuzz_objs,common/auth/fuzz/fuzz_canon.c common/auth/canon.c $(FUZZ_BASE))
	$(fuzz_link)

$(B)/fuzz/fuzz_mime: $(call fuzz_objs,common/fuzz/fuzz_mime.c common/message/mime_downgrade.c common/message/mime.c common/message/message.c \
                     common/message/header.c $(FUZZ_BASE))
	$(fuzz_link)

$(B)/fuzz/fuzz_dsn: $(call fuzz_objs,common/fuzz/fuzz_dsn.c common/message/dsn.c $(FUZZ_SMTP_CLIENT) $(FUZZ_BASE) $(FUZZ_CONFIG))
	$(fuzz_link)

$(B)/fuzz/fuzz_forward: $(call fuzz_objs,helpers/dot-forward/fuzz/fuzz_forward.c helpers/dot-forward/forward_file.c $(FUZZ_BASE))
	$(fuzz_link)

$(B)/fuzz/fuzz_aliases: $(call fuzz_objs,common/fuzz/fuzz_aliases.c common/local/aliases.c common/local/local.c \
                        $(FUZZ_BASE) $(FUZZ_CONFIG))
	$(fuzz_link)

$(B)/fuzz/fuzz_config: $(call fuzz_objs,common/fuzz/fuzz_config.c $(FUZZ_BASE) $(FUZZ_CONFIG))
	$(fuzz_link)

# (fuzz_api.c includes api.c, for its static functions)
$(B)/fuzz/fuzz_api: $(call fuzz_objs,daemons/httpd/fuzz/fuzz_api.c $(FUZZ_BASE))
	$(fuzz_link)

# (fuzz_dns.c includes dns.c, for its static functions)
$(B)/fuzz/fuzz_dns: $(call fuzz_objs,common/fuzz/fuzz_dns.c common/smtp/tls_policy.c common/smtp/mta_sts.c common/dns/public_address.c \
                    $(FUZZ_BASE) $(FUZZ_CONFIG))
	$(fuzz_link)

# The telemetry collector's allow-list of a report (daemons/telemetry/validate.c).
$(B)/fuzz/fuzz_telemetry: $(call fuzz_objs,daemons/telemetry/fuzz/fuzz_report.c daemons/telemetry/validate.c $(FUZZ_BASE))
	$(fuzz_link)

# The headers (and, for fuzz_api and fuzz_dns, the .c) each fuzz object read.
-include $(wildcard $(B)/fuzz/obj/*/*.d $(B)/fuzz/obj/*/*/*.d $(B)/fuzz/obj/*/*/*/*.d)

FUZZ_TARGETS = $(B)/fuzz/fuzz_smtp \
               $(B)/fuzz/fuzz_auth \
               $(B)/fuzz/fuzz_milter \
               $(B)/fuzz/fuzz_smtp_client \
               $(B)/fuzz/fuzz_canon \
               $(B)/fuzz/fuzz_mime \
               $(B)/fuzz/fuzz_dsn \
               $(B)/fuzz/fuzz_forward \
               $(B)/fuzz/fuzz_aliases \
               $(B)/fuzz/fuzz_config \
               $(B)/fuzz/fuzz_api \
               $(B)/fuzz/fuzz_dns \
               $(B)/fuzz/fuzz_telemetry
fuzz-targets: $(FUZZ_TARGETS)

# Every input of the corpora once (-runs=0: no new ones), as make check
# does: a parser change that crashes on a known input fails here.
fuzz-replay: $(FUZZ_TARGETS)
	$(B)/fuzz/fuzz_smtp -runs=0 -max_len=4096 daemons/ingress/fuzz/corpus
	$(B)/fuzz/fuzz_auth -runs=0 -max_len=4096 common/auth/fuzz/corpus
	$(B)/fuzz/fuzz_milter -runs=0 -max_len=4096 stages/milter/fuzz/corpus
	$(B)/fuzz/fuzz_smtp_client -runs=0 -max_len=4096 common/fuzz/corpus/smtp-client
	$(B)/fuzz/fuzz_canon -runs=0 -max_len=4096 common/auth/fuzz/corpus-canon
	$(B)/fuzz/fuzz_mime -runs=0 -max_len=4096 common/fuzz/corpus/mime
	$(B)/fuzz/fuzz_dsn -runs=0 -max_len=4096 common/fuzz/corpus/dsn
	$(B)/fuzz/fuzz_forward -runs=0 -max_len=4096 helpers/dot-forward/fuzz/corpus
	$(B)/fuzz/fuzz_aliases -runs=0 -max_len=4096 common/fuzz/corpus/aliases
	$(B)/fuzz/fuzz_config -runs=0 -max_len=4096 common/fuzz/corpus/config
	$(B)/fuzz/fuzz_api -runs=0 -max_len=4096 daemons/httpd/fuzz/corpus
	$(B)/fuzz/fuzz_dns -runs=0 -max_len=4096 common/fuzz/corpus/dns
	$(B)/fuzz/fuzz_telemetry -runs=0 -max_len=16384 daemons/telemetry/fuzz/corpus

fuzz: $(FUZZ_TARGETS)
	@mkdir -p $(B)/fuzz/corpus-smtp $(B)/fuzz/corpus-auth $(B)/fuzz/corpus-milter $(B)/fuzz/corpus-smtp-client $(B)/fuzz/corpus-canon $(B)/fuzz/corpus-mime $(B)/fuzz/corpus-dsn $(B)/fuzz/corpus-forward $(B)/fuzz/corpus-aliases $(B)/fuzz/corpus-config $(B)/fuzz/corpus-api $(B)/fuzz/corpus-dns
	$(B)/fuzz/fuzz_smtp -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-smtp daemons/ingress/fuzz/corpus
	$(B)/fuzz/fuzz_auth -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-auth common/auth/fuzz/corpus
	$(B)/fuzz/fuzz_milter -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-milter stages/milter/fuzz/corpus
	$(B)/fuzz/fuzz_smtp_client -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-smtp-client common/fuzz/corpus/smtp-client
	$(B)/fuzz/fuzz_canon -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-canon common/auth/fuzz/corpus-canon
	$(B)/fuzz/fuzz_mime -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-mime common/fuzz/corpus/mime
	$(B)/fuzz/fuzz_dsn -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-dsn common/fuzz/corpus/dsn
	$(B)/fuzz/fuzz_forward -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-forward helpers/dot-forward/fuzz/corpus
	$(B)/fuzz/fuzz_aliases -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-aliases common/fuzz/corpus/aliases
	$(B)/fuzz/fuzz_config -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-config common/fuzz/corpus/config
	$(B)/fuzz/fuzz_api -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-api daemons/httpd/fuzz/corpus
	$(B)/fuzz/fuzz_dns -max_total_time=$(FUZZ_TIME) -max_len=4096 -print_final_stats=1 \
		$(B)/fuzz/corpus-dns common/fuzz/corpus/dns
	@mkdir -p $(B)/fuzz/corpus-telemetry
	$(B)/fuzz/fuzz_telemetry -max_total_time=$(FUZZ_TIME) -max_len=16384 -print_final_stats=1 \
		$(B)/fuzz/corpus-telemetry daemons/telemetry/fuzz/corpus

clean:
	$(MAKE) -C extension clean
	rm -rf $(B)
