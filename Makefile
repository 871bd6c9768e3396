# pg_tide: PGXS build of one pg_tide.so from src/ and relay/
EXTENSION = pg_tide
MODULE_big = pg_tide
OBJS = \
	src/pg_tide.o \
	src/names.o \
	src/spi_plans.o \
	src/tracker.o \
	src/wake.o \
	src/outbox.o \
	src/limits.o \
	src/outbox_rights.o \
	src/consumer.o \
	relay/backend.o \
	relay/launcher.o \
	relay/worker.o \
	relay/pipelines.o \
	relay/xact.o \
	relay/lease.o \
	relay/message.o \
	relay/sink_file.o \
	relay/sink_webhook.o relay/address.o relay/attempt_log.o \
	relay/filter.o relay/pacing.o relay/session.o relay/retention.o relay/signature.o relay/secrets.o \
	relay/clean_text.o

DATA = $(wildcard sql/pg_tide--*.sql)

PG_CPPFLAGS = -I$(srcdir)/src -I$(srcdir)/relay
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
SHLIB_LINK = -lcurl -lcjson -lcrypto

# pg_regress: every sql/<test>.sql that is not the install script
REGRESS = $(sort $(patsubst sql/%.sql,%,$(filter-out sql/pg_tide--%,$(wildcard sql/*.sql))))
REGRESS_OPTS = --inputdir=. --load-extension=pg_tide

# isolation: test/specs/<name>.spec against test/expected/<name>.out
ISOLATION = $(sort $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test --load-extension=pg_tide

# TAP: test/t/*.pl
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

# The webhook receiver the TAP tests start (test/receiver.c): built for
# installcheck, not part of the extension's all.
EXTRA_CLEAN = test/receiver test/sql_names

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# -Werror from PG_CFLAGS (as CI sets it) applies to the receiver too.
test/receiver: test/receiver.c
	$(CC) -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) -o $@ $< -lmicrohttpd -lcjson -lcrypto -lpthread

# The checker of the C code's SQL names (test/t/023_sql_qualified.pl).
test/sql_names: test/sql_names.c
	$(CC) -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) -o $@ $< -lpg_query -lcjson

installcheck: test/receiver test/sql_names

# PGXS tracks no header dependencies: every object is rebuilt when one of
# the project's headers changes (a changed struct must not leave stale objects).
$(OBJS): $(wildcard src/*.h relay/*.h)
