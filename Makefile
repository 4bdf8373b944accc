# Pepsi: a mail transfer agent whose queue is a PostgreSQL table.
#
#   make          build everything
#   make install  install the extension (where pg_config says)
#   make run      start Pepsi on a private PostgreSQL cluster under ./run/
#   make stop     stop it
#   make check    build with -Werror, install, run every test suite
#   make bench    run the benchmarks in bench/

PG_CONFIG ?= $(firstword $(wildcard /usr/lib/postgresql/15/bin/pg_config) pg_config)
export PG_CONFIG

.PHONY: all install deps check run stop bench clean

all:
	$(MAKE) -C extension

install: all
	$(MAKE) -C extension install

deps:
	@scripts/deps.sh

# Warnings are errors here, so everything is rebuilt with -Werror.
check: deps
	$(MAKE) -C extension clean
	$(MAKE) -C extension PEPSI_WERROR=-Werror
	$(MAKE) -C extension install
	scripts/check.sh

run: deps install
	scripts/run.sh start

stop:
	scripts/run.sh stop

bench: deps install
	bench/run-all.sh

clean:
	$(MAKE) -C extension clean
