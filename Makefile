# exl3kit: one non-recursive Makefile. See README.md and config.mk.
#   make            build every program and lib/libexl3kit.a
#   make test       unit and command-line tests (ends with "N passed, N failed")
#   make check      the fast tier: the tests tests/fast lists (under 3 minutes)
#                   (TEST_JOBS=N runs N tests at a time; tests/README.md)
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

# ---- the library ----------------------------------------------------------
# lib/ is layered: one folder per layer, listed bottom to top in lib/layers
# with the layers each may include (lib/README.md says what goes where;
# tests/t0930-layers.sh fails on an #include that points up a layer, into
# another folder's *_impl.h, or from bin/ into the library's insides).
# Headers keep flat names ("frame.h"): one -I per layer folder. Every layer
# but gpu goes into lib/libexl3kit.a.
LAYERS := $(filter-out bin,$(shell awk '/^[a-z]/ { print $$1 }' lib/layers))
CPPFLAGS += $(addprefix -Ilib/,$(LAYERS))
# lib/gpu/*.c and kernels/*.cu are the GPU backend: a shared object that the
# library dlopens for --device cuda|auto (lib/common/device.h); nothing else
# links CUDA, so the programs are the same with CUDA=0 and CUDA=1.
LIB_SRC := $(sort $(wildcard $(patsubst %,lib/%/*.c,$(filter-out gpu,$(LAYERS)))))
LIB_OBJ := $(LIB_SRC:.c=.o)
GPU_SRC := $(sort $(wildcard lib/gpu/*.c))
CU_SRC := $(sort $(wildcard kernels/*.cu))
BACKEND := lib/libexl3kit-cuda.so
ifeq ($(CUDA),1)
GPU_OBJ := $(GPU_SRC:.c=.o)
CU_OBJ := $(CU_SRC:.cu=.o)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcusolver -lcudart -lstdc++
GENCODE := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a))
BACKEND_OUT := $(BACKEND)
endif
# ---- the programs ---------------------------------------------------------
# bin/util.o: what every program needs. bin/util-device.o (--device) and
# bin/util-quant.o (the quantizers' Hessian cache and frame output: quant.o,
# and with it LAPACK, BLAS and OpenMP) go only into the programs that use
# them: the others then load none of those at start-up (-Wl,--as-needed).
BIN_UTIL := bin/util.o
BIN_EXTRA := bin/util-device.o bin/util-quant.o bin/util-check.o
PROGS := $(patsubst bin/%.c,bin/%,$(filter-out bin/util%.c,$(sort $(wildcard bin/*.c))))
UNIT := $(patsubst %.c,%,$(sort $(wildcard tests/unit/t*.c)))
# tests/bench/gpu calls the kernels themselves: built with CUDA only
BENCH := $(patsubst %.c,%,$(sort $(wildcard tests/bench/*.c)))
ifneq ($(CUDA),1)
BENCH := $(filter-out tests/bench/gpu,$(BENCH))
endif
FUZZ_SRC := $(sort $(wildcard tests/fuzz/*.c))
LIB := lib/libexl3kit.a
# the pipelines under the names they are installed and documented as
# (exl3-convert(1), ...): with bin/ on PATH the tree runs them as installed
PIPE_LINKS := $(patsubst pipelines/%,bin/exl3-%,$(wildcard pipelines/convert pipelines/validate pipelines/plot-kl))

all: $(LIB) $(PROGS) $(PIPE_LINKS) $(UNIT) $(BENCH) $(BACKEND_OUT)

$(PIPE_LINKS): bin/exl3-%: pipelines/%
	$(call say,LN,$@)ln -sfn ../pipelines/$* $@

%.o: %.c
	$(call say,CC,$@)$(CC) $(CPPFLAGS) $(X3_CFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

# where an installed program finds the backend (device.c), rebuilt when
# LIBEXECDIR changes
lib/common/device.o: CPPFLAGS += -DX3_LIBEXECDIR='"$(LIBEXECDIR)"'
lib/common/device.o: lib/.libexecdir
lib/.libexecdir: FORCE
	@echo '$(LIBEXECDIR)' | cmp -s - $@ || echo '$(LIBEXECDIR)' > $@

$(GPU_OBJ): lib/%.o: lib/%.c
	$(call say,CC,$@)$(CC) $(CPPFLAGS) -I$(CUDA_HOME)/include $(X3_CFLAGS) $(CFLAGS) -fPIC -MMD -MP -c -o $@ $<

kernels/%.o: kernels/%.cu
	$(call say,NVCC,$@)$(NVCC) $(GENCODE) $(NVCCFLAGS) -Xcompiler -fPIC -Ilib/gpu -c -o $@ $<
# nvcc writes no dependency files: every kernel depends on the shared headers
$(CU_OBJ): $(wildcard kernels/*.cuh) lib/gpu/gpu_kern.h

# the backend object exports x3_gpu_backend only (lib/gpu/gpu.map) and needs
# nothing of libexl3kit (-z defs)
$(BACKEND): $(GPU_OBJ) $(CU_OBJ) lib/gpu/gpu.map
	$(call say,LINK,$@)$(CC) -shared $(LDFLAGS) -Wl,--version-script=lib/gpu/gpu.map -Wl,-z,defs \
		-o $@ $(GPU_OBJ) $(CU_OBJ) $(CUDA_LIBS) -lm

$(LIB): $(LIB_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

bin/exl3-matmul bin/had-rotate bin/hessian-capture bin/model-eval bin/trellis-encode: bin/util-device.o
bin/had-rotate bin/trellis-encode: bin/util-quant.o
bin/exl3-info: bin/util-check.o
bin/%: bin/%.o $(BIN_UTIL) $(LIB)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) -o $@ $< $(filter $(BIN_EXTRA),$^) $(BIN_UTIL) $(LIB) $(LDLIBS)

# tests/unit/synth.c: the helpers the unit tests share (synth.h)
tests/unit/%: tests/unit/%.o tests/unit/synth.o $(LIB)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) -o $@ $< tests/unit/synth.o $(LIB) $(LDLIBS)

tests/bench/%: tests/bench/%.o $(LIB)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) -o $@ $< $(LIB) $(LDLIBS)

# the backend's own benchmark: its functions linked in, not loaded
tests/bench/gpu.o: CPPFLAGS += -I$(CUDA_HOME)/include
tests/bench/gpu: tests/bench/gpu.o $(filter-out lib/gpu/gpu_entry.o,$(GPU_OBJ)) $(CU_OBJ) $(LIB)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS)

TEST_JOBS ?= 1
test: all
	@tests/run -j $(TEST_JOBS)

check: all
	@tests/run -j $(TEST_JOBS) @tests/fast

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
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man7 \
	  $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(DATADIR)
	install -m 755 $(PROGS) $(DESTDIR)$(BINDIR)
	for p in $(PIPE_LINKS:bin/exl3-%=pipelines/%); do \
	  sed 's|@DATADIR@|$(DATADIR)|g' "$$p" > $(DESTDIR)$(BINDIR)/exl3-$${p#pipelines/} && \
	  chmod 755 $(DESTDIR)$(BINDIR)/exl3-$${p#pipelines/} || exit 1; done
	install -m 644 pipelines/*.mk $(DESTDIR)$(DATADIR)
	install -m 644 man/*.1 $(DESTDIR)$(MANDIR)/man1
	install -m 644 man/*.5 $(DESTDIR)$(MANDIR)/man5
	install -m 644 man/*.7 $(DESTDIR)$(MANDIR)/man7
	$(if $(BACKEND_OUT),install -m 755 $(BACKEND) $(DESTDIR)$(LIBEXECDIR))

clean:
	rm -f lib/*/*.o lib/*/*.d bin/*.o bin/*.d kernels/*.o $(LIB) $(BACKEND) lib/.libexecdir $(PROGS) $(PIPE_LINKS) \
	  tests/unit/*.o tests/unit/*.d $(UNIT) tests/bench/*.o tests/bench/*.d $(BENCH)
	rm -rf tests/fuzz/build build-asan

.PHONY: all test check check-asan bench fuzz deps install clean FORCE
include tests/gpu/cusim/cusim.mk
include tests/fuzz/fuzz.mk
.SECONDARY:
-include $(wildcard lib/*/*.d bin/*.d tests/unit/*.d tests/bench/*.d)
