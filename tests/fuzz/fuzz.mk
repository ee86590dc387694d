# tests/fuzz/fuzz.mk: the libFuzzer targets (included by the Makefile; run
# by tests/fuzz/run). The library is built a second time into FUZZ_B with
# clang's coverage instrumentation, ASan and UBSan, so the normal objects
# stay as they are.
FUZZ_CC ?= clang
FUZZ_B ?= tests/fuzz/build
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS := -g -O1 -std=c11 -fopenmp -pthread $(FUZZ_SAN)
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(FUZZ_SRC))
# The Viterbi is left out: no target reaches it, and its unrolled kernels
# alone took 209 s to compile with this instrumentation on a 2-core host
# (the rest of the library 6 s), most of the fuzz smoke test's time in CI.
# A target that comes to need it fails to link: take it off this list.
FUZZ_LIB_SKIP := $(wildcard lib/codec/viterbi*.c)
FUZZ_LIB_OBJ := $(patsubst lib/%.c,$(FUZZ_B)/lib/%.o,$(filter-out $(FUZZ_LIB_SKIP),$(LIB_SRC)))

$(FUZZ_B)/lib/%.o: lib/%.c
	@mkdir -p $(@D)
	$(call say,FUZZCC,$@)$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<
$(FUZZ_B)/libx3fuzz.a: $(FUZZ_LIB_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^
$(FUZZ_B)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_B)/libx3fuzz.a
	$(call say,FUZZLD,$@)$(FUZZ_CC) $(CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_B)/libx3fuzz.a $(LDLIBS)
fuzz-targets: $(addprefix $(FUZZ_B)/,$(FUZZ_TARGETS))
.PHONY: fuzz-targets
-include $(wildcard $(FUZZ_B)/lib/*/*.d)
