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
	src/idempotency.o \
	src/payload_schema.o \
	src/direct_insert.o \
	src/admission_cache.o \
	src/backpressure.o \
	src/partitions.o \
	src/limits.o \
	src/catalog_version.o \
	src/outbox_rights.o \
	src/consumer.o \
	src/commit.o \
	src/capture.o \
	src/capture_row.o \
	src/capture_options.o \
	src/capture_admin.o \
	src/capture_backfill.o \
	src/schedule.o \
	relay/backend.o \
	relay/launcher.o \
	relay/worker.o \
	relay/engine.o \
	relay/units.o \
	relay/flows.o \
	relay/flow_forward.o \
	relay/flow_reverse.o \
	relay/flow_handler.o \
	relay/flow_schedule.o \
	relay/pipelines.o \
	relay/xact.o \
	relay/lease.o \
	relay/message.o \
	relay/cloudevents.o \
	relay/events.o \
	relay/json_text.o \
	relay/config_read.o \
	relay/endpoints/registry.o relay/endpoints/redact.o \
	relay/address.o relay/attempt_log.o \
	relay/endpoints/source_types.o relay/reverse_config.o relay/pipeline_names.o \
	relay/filter.o relay/pacing.o relay/session.o relay/retention.o relay/signature.o relay/secrets.o \
	relay/clean_text.o relay/ownership.o relay/worker_settings.o \
	relay/config_value.o relay/config_files.o relay/config_limits.o relay/pipeline_config.o \
	relay/serving.o relay/pipeline_state.o relay/ordering.o relay/idle_look.o relay/record_each.o relay/error_class.o \
	relay/broker.o relay/connector.o relay/send_window.o relay/host_lookup.o relay/worker_memory.o \
	relay/log_repeat.o relay/extension_lock.o relay/restore.o relay/on_demand.o relay/worker_slots.o \
	src/inbox_wake.o relay/inbox_handler.o relay/inbox_handler_rules.o

# The endpoints (CONTRIBUTING.md, "Add a sink or a source"): one folder
# each, relay/endpoints/<name>/, all of whose .c files are the endpoint's
# code, and whose endpoint.mk says the rest:
#	<name>.module = <pkg-config name> <Debian -dev package> <Debian library package>
#		the endpoint is a module of its own, pg_tide_<name>.so, linked with
#		that client library (below); without it, it is part of pg_tide.so
#	<name>.provides = sink, source or both (default: sink)
#	<name>.order = two digits: its place in the lists of types that hints
#		give (default 90)
# Nothing else names an endpoint: relay/endpoints/known.h, made from these,
# tells pg_tide.so the types and packages there are, for its hints.
ENDPOINT_FOUND := $(sort $(notdir $(patsubst %/,%,$(dir $(wildcard relay/endpoints/*/*.c)))))
include $(wildcard $(foreach e,$(ENDPOINT_FOUND),relay/endpoints/$(e)/endpoint.mk))
ENDPOINTS := $(foreach o,$(sort $(foreach e,$(ENDPOINT_FOUND),$(or $($(e).order),90)-$(e))),$(lastword $(subst -, ,$(o))))
ENDPOINT_MODULES := $(foreach e,$(ENDPOINTS),$(if $($(e).module),$(e)))
ENDPOINT_BUILTIN := $(filter-out $(ENDPOINT_MODULES),$(ENDPOINTS))
endpoint_objs = $(patsubst %.c,%.o,$(wildcard relay/endpoints/$(1)/*.c))
OBJS += $(foreach e,$(ENDPOINT_BUILTIN),$(call endpoint_objs,$(e)))

# The SQL (CONTRIBUTING.md): the install script of the current version and
# the update script from the release before it are made from the source
# files under sql/; released versions' scripts are kept as they shipped.
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(srcdir)/pg_tide.control)
SQL_INSTALL = $(sort $(wildcard $(srcdir)/sql/install/*.sql))
SQL_FUNCTIONS = $(sort $(wildcard $(srcdir)/sql/functions/*.sql))
SQL_INSTALL_POST = $(sort $(wildcard $(srcdir)/sql/install_post/*.sql))
SQL_TAIL = $(srcdir)/sql/views.sql $(srcdir)/sql/privileges.sql
SQL_UPDATE = $(wildcard $(srcdir)/sql/updates/*--$(EXTVERSION).sql)
PREVVERSION = $(patsubst $(srcdir)/sql/updates/%--$(EXTVERSION).sql,%,$(SQL_UPDATE))
SQL_UPDATE_POST = $(wildcard $(srcdir)/sql/updates/$(PREVVERSION)--$(EXTVERSION).post.sql)

DATA_built = sql/pg_tide--$(EXTVERSION).sql sql/pg_tide--$(PREVVERSION)--$(EXTVERSION).sql
DATA = $(filter-out $(addprefix $(srcdir)/,$(DATA_built)),$(wildcard $(srcdir)/sql/pg_tide--*.sql))

PG_CPPFLAGS = -I$(srcdir)/src -I$(srcdir)/relay -DTIDE_CATALOG_VERSION='"$(EXTVERSION)"'
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
SHLIB_LINK = -lcurl -lcjson -lcrypto

# pg_regress: every test/sql/<test>.sql against test/expected/<test>.out
REGRESS = $(sort $(patsubst test/sql/%.sql,%,$(wildcard test/sql/*.sql)))
REGRESS_OPTS = --inputdir=test --load-extension=pg_tide

# isolation: test/specs/<name>.spec against test/expected/<name>.out
ISOLATION = $(sort $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test --load-extension=pg_tide

# TAP: test/t/*.pl
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

# The webhook receiver the TAP tests start (test/receiver.c): built for
# installcheck, not part of the extension's all.
EXTRA_CLEAN = test/receiver test/sql_names pg_tide_*$(DLSUFFIX) $(BROKER_OBJS) relay/endpoints/known.h \
	test/brokers/kafka_mock test/brokers/kafka_consume bench/brokers/kafka_client \
	test/brokers/rabbitmq_read \
	test/brokers/nats_tool

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The install script: state created once, the functions, the state that
# needs the functions (triggers, a default), views, privileges.
sql/pg_tide--$(EXTVERSION).sql: $(SQL_INSTALL) $(SQL_FUNCTIONS) $(SQL_INSTALL_POST) $(SQL_TAIL) $(srcdir)/pg_tide.control
	{ echo "-- pg_tide $(EXTVERSION), made by make from sql/ (see CONTRIBUTING.md): do not edit"; \
	  printf '%s\n' '\echo Use "CREATE EXTENSION pg_tide" to load this file. \quit'; \
	  for f in $(SQL_INSTALL) $(SQL_FUNCTIONS) $(SQL_INSTALL_POST) $(SQL_TAIL); do \
	    printf '\n-- %s\n' "$${f#$(srcdir)/}"; cat "$$f"; done; } > $@

# The update script from the previous release: that release's state
# changes, then the same functions, views and privileges.
sql/pg_tide--$(PREVVERSION)--$(EXTVERSION).sql: $(SQL_UPDATE) $(SQL_FUNCTIONS) $(SQL_UPDATE_POST) $(SQL_TAIL)
	{ echo "-- pg_tide $(PREVVERSION) to $(EXTVERSION), made by make from sql/ (see CONTRIBUTING.md): do not edit"; \
	  printf '%s\n' '\echo Use "ALTER EXTENSION pg_tide UPDATE TO '"'"'$(EXTVERSION)'"'"'" to load this file. \quit'; \
	  for f in $(SQL_UPDATE) $(SQL_FUNCTIONS) $(SQL_UPDATE_POST) $(SQL_TAIL); do \
	    printf '\n-- %s\n' "$${f#$(srcdir)/}"; cat "$$f"; done; } > $@

all: $(DATA_built)

# -Werror from PG_CFLAGS (as CI sets it) applies to the receiver too.
test/receiver: test/receiver.c
	$(CC) -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) -o $@ $< -lmicrohttpd -lcjson -lcrypto -lpthread

# The checker of the C code's SQL names (test/t/023_sql_qualified.pl).
test/sql_names: test/sql_names.c
	$(CC) -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) -o $@ $< -lpg_query -lcjson

installcheck: test/receiver test/sql_names

# The RabbitMQ client of test/t/046_relay_rabbitmq.pl (rabbitmq-c).
test/brokers/rabbitmq_read: test/brokers/rabbitmq_read.c test/brokers/rabbitmq_amqp.h
	$(CC) -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) -o $@ $< $(shell pkg-config --cflags --libs librabbitmq) -lcjson
installcheck: test/brokers/rabbitmq_read

# PGXS tracks no header dependencies: every object is rebuilt when one of
# the project's headers changes (a changed struct must not leave stale objects).
$(OBJS): $(wildcard src/*.h relay/*.h relay/endpoints/*.h relay/endpoints/*/*.h)
# TIDE_CATALOG_VERSION comes from the control file.
relay/worker.o relay/serving.o relay/on_demand.o: pg_tide.control

# The known endpoints, for pg_tide.so's hints (relay/endpoints/registry.c):
# made from the endpoint folders, so that no source file lists them.
relay/endpoints/known.h: Makefile $(wildcard relay/endpoints/*/endpoint.mk)
	{ echo '/* made by make from relay/endpoints/<name>/endpoint.mk (Makefile): do not edit */'; \
	  $(foreach e,$(ENDPOINTS),echo '{"$(e)", $(if $(filter sink,$(or $($(e).provides),sink)),true,false), $(if $(filter source,$($(e).provides)),true,false), $(if $($(e).module),"$(word 3,$($(e).module))"$(comma) "$(word 2,$($(e).module))",NULL$(comma) NULL)},';) } > $@
comma := ,
relay/endpoints/registry.o: relay/endpoints/known.h

# Endpoint modules (relay/broker.h): pg_tide_<name>.so from the .c files of
# relay/endpoints/<name>/, linked with the client library its endpoint.mk
# names and built only where that library's pkg-config file (from its
# Debian -dev package) is installed, so that pg_tide.so never needs a
# broker library; relay/endpoints/registry.c loads a module when a pipeline
# names its type. BROKER_SINKS= from the environment builds none.
BROKER_SINKS ?= $(ENDPOINT_MODULES)
PKG_CONFIG ?= pkg-config
broker_pc = $(word 1,$($(1).module))
broker_dev = $(word 2,$($(1).module))
# Without pkg-config (Debian's pkgconf) no broker library is found at all.
HAVE_PKG_CONFIG := $(shell command -v $(PKG_CONFIG) >/dev/null 2>&1 && echo y)
# the modules whose library is installed
BROKER_BUILT := $(foreach b,$(filter $(ENDPOINT_MODULES),$(BROKER_SINKS)),$(if $(HAVE_PKG_CONFIG),$(if $(shell $(PKG_CONFIG) --exists $(call broker_pc,$(b)) && echo y),$(b))))
BROKER_SKIPPED := $(filter-out $(BROKER_BUILT),$(filter $(ENDPOINT_MODULES),$(BROKER_SINKS)))
BROKER_MODULES = $(patsubst %,pg_tide_%$(DLSUFFIX),$(BROKER_BUILT))
BROKER_OBJS = $(foreach b,$(BROKER_BUILT),$(call endpoint_objs,$(b)))

all: $(BROKER_MODULES) broker-sinks-report
install: install-broker-sinks

# Why module $(1) is not built, for its warning.
broker_skip_reason = $(if $(HAVE_PKG_CONFIG),its client library's headers are not installed ($(PKG_CONFIG) finds no $(call broker_pc,$(1)).pc): install Debian's $(call broker_dev,$(1)),$(PKG_CONFIG) is not installed: install Debian's pkgconf and $(call broker_dev,$(1)))

.PHONY: broker-sinks-report install-broker-sinks
# One line of what was built, and a warning on stderr for each module skipped:
# a server without a module refuses that type's pipelines.
broker-sinks-report:
	@echo "pg_tide: broker sinks built: $(or $(strip $(BROKER_BUILT)),none); skipped: $(or $(strip $(BROKER_SKIPPED)),none)"
	@$(foreach b,$(BROKER_SKIPPED),echo "WARNING: pg_tide: the $(b) sink (pg_tide_$(b)$(DLSUFFIX)) is not built: $(call broker_skip_reason,$(b))" >&2;) true

install-broker-sinks: $(BROKER_MODULES)
	$(if $(BROKER_MODULES),$(INSTALL_SHLIB) $(BROKER_MODULES) '$(DESTDIR)$(pkglibdir)/')

# Each module's objects, with its library's headers, and the module.
$(BROKER_OBJS): $(wildcard src/*.h relay/*.h relay/endpoints/*.h relay/endpoints/*/*.h)
define endpoint_module_rules
$(call endpoint_objs,$(1)): override CPPFLAGS += $$(shell $$(PKG_CONFIG) --cflags $(call broker_pc,$(1)) 2>/dev/null)
pg_tide_$(1)$$(DLSUFFIX): $(call endpoint_objs,$(1))
	$$(CC) $$(CFLAGS) $$^ $$(LDFLAGS) $$(LDFLAGS_SL) -shared -o $$@ $$(shell $$(PKG_CONFIG) --libs $(call broker_pc,$(1)))
endef
$(foreach b,$(BROKER_BUILT),$(eval $(call endpoint_module_rules,$(b))))

# The redis sink's tests read streams with a real client (test/brokers/redis_read.c).
test/brokers/redis_read: test/brokers/redis_read.c
	$(CC) -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) -o $@ $< $(shell pkg-config --cflags --libs hiredis) -lcjson
installcheck: test/brokers/redis_read
EXTRA_CLEAN += test/brokers/redis_read

# The Kafka sink's tests: librdkafka's mock cluster on 127.0.0.1 and a
# consumer that prints what the topic holds (test/t/040, 041); the bench's
# baseline producer (bench/broker_kafka.sh).
test/brokers/kafka_mock bench/brokers/kafka_client: %: %.c
	$(CC) -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) $(shell pkg-config --cflags rdkafka) -o $@ $< $(shell pkg-config --libs rdkafka)
test/brokers/kafka_consume: test/brokers/kafka_consume.c
	$(CC) -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) $(shell pkg-config --cflags rdkafka) -o $@ $< $(shell pkg-config --libs rdkafka) -lcjson
installcheck: test/brokers/kafka_mock test/brokers/kafka_consume

# A sink module that no file of pg_tide names (test/t/075): found by its
# file name and init symbol alone. Built for installcheck, never installed.
test/endpoints/pg_tide_probe$(DLSUFFIX): test/endpoints/probe.o
	$(CC) $(CFLAGS) $^ $(LDFLAGS) $(LDFLAGS_SL) -shared -o $@
installcheck: test/endpoints/pg_tide_probe$(DLSUFFIX)
EXTRA_CLEAN += test/endpoints/probe.o test/endpoints/pg_tide_probe$(DLSUFFIX)

# The JetStream client of the NATS sink's tests (test/t/042, 043).
test/brokers/nats_tool: test/brokers/nats_tool.c
	$(CC) -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) -o $@ $< $(shell pkg-config --cflags --libs libnats) -lcjson
installcheck: $(if $(filter nats,$(BROKER_BUILT)),test/brokers/nats_tool)

# The JSON Schema module (src/jsonschema/jsonschema.h): pg_tide-jsonschema.so,
# C++ over valijson (header-only, Debian's libvalijson-dev) and nlohmann-json
# (nlohmann-json3-dev), built only where both headers are installed, so that
# pg_tide.so needs no C++; src/payload_schema.c loads it when an outbox has a
# payload schema. Its name has a hyphen: every $libdir/pg_tide_<name>.so is
# an endpoint module to the relay (relay/endpoints/registry.c), and this is
# none. JSONSCHEMA= from the environment builds none.
JSONSCHEMA_INCLUDE ?= /usr/include
JSONSCHEMA ?= $(if $(and $(wildcard $(JSONSCHEMA_INCLUDE)/valijson/validator.hpp),$(wildcard $(JSONSCHEMA_INCLUDE)/nlohmann/json.hpp)),y)
# valijson throws (instead of aborting the backend) in every file that includes it.
# Its visitor's template and constructor differ between 1.0 (Debian 12) and
# later versions (templated on a regex engine): jsonb_check.cpp refines 1.0's.
JSONSCHEMA_VALIJSON_1_0 := $(if $(shell grep -s 'class ValidatorT' $(JSONSCHEMA_INCLUDE)/valijson/validator.hpp),,-DTIDE_VALIJSON_1_0=1)
JSONSCHEMA_CXX = $(CXX) -std=c++17 -fPIC -O2 -Wall -Wextra $(filter -Werror%,$(PG_CFLAGS)) -DVALIJSON_USE_EXCEPTIONS=1 \
	$(JSONSCHEMA_VALIJSON_1_0) -Isrc/jsonschema
JSONSCHEMA_OBJS = src/jsonschema/schema.o src/jsonschema/module.o src/jsonschema/jsonb_check.o \
	src/jsonschema/jsonb_reader.o src/jsonschema/magic.o
src/jsonschema/schema.o src/jsonschema/module.o src/jsonschema/jsonb_check.o: %.o: %.cpp \
		src/jsonschema/schema.hpp src/jsonschema/jsonschema.h src/jsonschema/jsonb_adapter.hpp \
		src/jsonschema/jsonb_reader.h
	$(JSONSCHEMA_CXX) -c $< -o $@
src/jsonschema/jsonb_reader.o: src/jsonschema/jsonb_reader.h
pg_tide-jsonschema$(DLSUFFIX): $(JSONSCHEMA_OBJS)
	$(CXX) $(CFLAGS) $^ $(LDFLAGS) $(LDFLAGS_SL) -shared -o $@
ifeq ($(JSONSCHEMA),y)
all: pg_tide-jsonschema$(DLSUFFIX)
install: install-jsonschema
installcheck: test/jsonschema/conformance
else
all: jsonschema-report
endif
.PHONY: install-jsonschema jsonschema-report
install-jsonschema: pg_tide-jsonschema$(DLSUFFIX)
	$(INSTALL_SHLIB) $< '$(DESTDIR)$(pkglibdir)/'
# Without the module, setting a payload schema is refused.
jsonschema-report:
	@echo "WARNING: pg_tide: the JSON Schema module (pg_tide-jsonschema$(DLSUFFIX)) is not built: install Debian's libvalijson-dev and nlohmann-json3-dev" >&2

# The runner of the official JSON-Schema-Test-Suite (test/t/077_payload_schema.pl).
test/jsonschema/conformance: test/jsonschema/conformance.cpp src/jsonschema/schema.cpp src/jsonschema/schema.hpp
	$(JSONSCHEMA_CXX) -o $@ test/jsonschema/conformance.cpp src/jsonschema/schema.cpp
EXTRA_CLEAN += $(JSONSCHEMA_OBJS) pg_tide-jsonschema$(DLSUFFIX) test/jsonschema/conformance
