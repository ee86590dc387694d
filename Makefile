# exl3kit: one non-recursive Makefile. See README.md and config.mk.
#   make            build every program and lib/libexl3kit.a
#   make test       unit and command-line tests (ends with "N passed, N failed")
#   make bench      benchmarks (table + JSON in bench.json)
#   make check-asan the tests on an ASan+UBSan build in build-asan (ASAN_TESTS=patterns)
#   make fuzz       fuzz every parser (tests/fuzz; FUZZ_TIME seconds per target)
#   make deps       install the Debian packages the build and tests need
#   make install PREFIX=... DESTDIR=...
#   make cusim      the CUDA path on the CPU emulator (tests/gpu/cusim/cusim.mk)
#   V=1 shows the commands; CUDA=0 builds the CPU-only toolkit.
include config.mk

ifneq ($(V),1)
Q = @
say = @printf '  %-6s %s\n' $(1) $(2);
endif

LIB_SRC := $(sort $(wildcard lib/*.c))
LIB_OBJ := $(LIB_SRC:.c=.o)
CU_SRC := $(sort $(wildcard kernels/*.cu))
ifeq ($(CUDA),1)
CPPFLAGS += -DX3_CUDA=1 -I$(CUDA_HOME)/include
CU_OBJ := $(CU_SRC:.cu=.o)
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcusolver -lcudart -lstdc++
GENCODE := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a))
endif
BIN_UTIL := bin/util.o
PROGS := $(patsubst bin/%.c,bin/%,$(filter-out bin/util.c,$(sort $(wildcard bin/*.c))))
UNIT := $(patsubst %.c,%,$(sort $(wildcard tests/unit/t*.c)))
BENCH := $(patsubst %.c,%,$(sort $(wildcard tests/bench/*.c)))
FUZZ_SRC := $(sort $(wildcard tests/fuzz/*.c))
LIB := lib/libexl3kit.a

all: $(LIB) $(PROGS) $(UNIT) $(BENCH)

%.o: %.c
	$(call say,CC,$@)$(CC) $(CPPFLAGS) $(X3_CFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

kernels/%.o: kernels/%.cu
	$(call say,NVCC,$@)$(NVCC) $(GENCODE) $(NVCCFLAGS) -Ilib -DX3_CUDA=1 -c -o $@ $<
# nvcc writes no dependency files: every kernel depends on the shared headers
$(CU_OBJ): $(wildcard kernels/*.cuh) lib/gpu_kern.h

$(LIB): $(LIB_OBJ) $(CU_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

bin/%: bin/%.o $(BIN_UTIL) $(LIB)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) -o $@ $< $(BIN_UTIL) $(LIB) $(LDLIBS)

tests/unit/%: tests/unit/%.o $(LIB)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

tests/bench/%: tests/bench/%.o $(LIB)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

test: all
	@tests/run

bench: all
	@tests/bench/run

ASAN_TESTS ?=
check-asan:
	@tests/check-asan $(ASAN_TESTS)

FUZZ_TIME ?= 300
fuzz:
	@tests/fuzz/run $(FUZZ_TIME)

deps:
	@./.ci/deps

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(LIBEXECDIR)
	install -m 755 $(PROGS) $(DESTDIR)$(BINDIR)
	for p in pipelines/*; do [ -f "$$p" ] && install -m 755 "$$p" $(DESTDIR)$(BINDIR)/exl3-$$(basename $$p) || true; done
	install -m 644 man/*.1 $(DESTDIR)$(MANDIR)/man1
	install -m 644 man/*.5 $(DESTDIR)$(MANDIR)/man5

clean:
	rm -f lib/*.o lib/*.d bin/*.o bin/*.d kernels/*.o $(LIB) $(PROGS) \
	  tests/unit/*.o tests/unit/*.d $(UNIT) tests/bench/*.o tests/bench/*.d $(BENCH)
	rm -rf tests/fuzz/build build-asan

.PHONY: all test check-asan bench fuzz deps install clean
include tests/gpu/cusim/cusim.mk
include tests/fuzz/fuzz.mk
.SECONDARY:
-include $(wildcard lib/*.d bin/*.d tests/unit/*.d tests/bench/*.d)
