# cusim.mk: `make cusim` builds exl3kit's CUDA path on cusim, the CPU
# emulator of tests/gpu/cusim, under tests/tmp/cusim/ (the normal build is
# untouched): kernels/*.cu compiled as host C++ by $(CXX) with -DX3K_SIM and
# cusim.h force-included, lib/gpu*.c with -DX3_CUDA=1, the other library
# objects of the normal build, and the emulated runtime, cuBLAS and
# cuSOLVER (tests/gpu/cusim/*.cpp). Programs and the GPU unit tests are
# linked against that library (no CUDA libraries); examples/ and pipelines/
# are linked in, so that a shell test runs on it with ROOT=tests/tmp/cusim.
# Needs the CUDA headers
# (CUSIM_CUDA_INC, default $(CUDA_HOME)/include or /usr/local/cuda/include)
# and no GPU. Included by the Makefile.
CUSIM := tests/tmp/cusim
CUSIM_CUDA_INC ?= $(if $(CUDA_HOME),$(CUDA_HOME)/include,/usr/local/cuda/include)
CUSIM_CXXFLAGS ?= -O3 -g
# F16C and FMA instructions where this machine has them (fast fp16
# conversions and fmaf); no contraction of a*b+c: every fma is explicit
CUSIM_ARCH ?= $(shell grep -qw f16c /proc/cpuinfo 2>/dev/null && echo -mf16c) \
	$(shell grep -qw fma /proc/cpuinfo 2>/dev/null && echo -mfma)
CUSIM_XFLAGS = -std=c++17 $(CUSIM_ARCH) -ffp-contract=off -fno-strict-aliasing -Wall -Wextra -Wno-unused-parameter \
	-Wno-unknown-pragmas -I$(CUSIM_CUDA_INC) -Itests/gpu/cusim -Ikernels -Ilib \
	-I/usr/include/x86_64-linux-gnu/openblas-pthread
CUSIM_RT_OBJ := $(patsubst tests/gpu/cusim/%.cpp,$(CUSIM)/cusim/%.o,$(wildcard tests/gpu/cusim/*.cpp))
CUSIM_CU_OBJ := $(patsubst kernels/%.cu,$(CUSIM)/kernels/%.o,$(CU_SRC))
CUSIM_GPU_SRC := $(filter lib/gpu%.c,$(LIB_SRC))
CUSIM_GPU_OBJ := $(patsubst lib/%.c,$(CUSIM)/lib/%.o,$(CUSIM_GPU_SRC))
CUSIM_LIB := $(CUSIM)/libexl3kit.a
CUSIM_UNIT := $(patsubst tests/unit/%.c,$(CUSIM)/tests/unit/%,$(wildcard tests/unit/t17*-gpu-*.c))
CUSIM_PROGS := $(patsubst bin/%,$(CUSIM)/bin/%,$(PROGS))
CUSIM_LDLIBS = $(filter-out -lcublas -lcusolver -lcudart -lstdc++ -L% -Wl%,$(LDLIBS)) -lstdc++

cusim: $(CUSIM_LIB) $(CUSIM_UNIT) $(CUSIM_PROGS) $(CUSIM)/selftest
	@ln -sfn ../../../examples $(CUSIM)/examples && ln -sfn ../../../pipelines $(CUSIM)/pipelines

# checks of the emulator itself (t1706 runs them)
$(CUSIM)/selftest: tests/gpu/cusim/selftest.cu $(CUSIM_LIB)
	$(call say,CXX,$@)$(CXX) $(CUSIM_CXXFLAGS) $(CUSIM_XFLAGS) -x c++ -DX3K_SIM \
		-include tests/gpu/cusim/cusim.h -o $@ $< -x none $(CUSIM_LIB) $(CUSIM_LDLIBS)

$(CUSIM)/cusim/%.o: tests/gpu/cusim/%.cpp $(wildcard tests/gpu/cusim/*.h)
	@mkdir -p $(@D)
	$(call say,CXX,$@)$(CXX) $(CUSIM_CXXFLAGS) $(CUSIM_XFLAGS) -c -o $@ $<

$(CUSIM)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.cuh) lib/gpu_kern.h $(wildcard tests/gpu/cusim/*.h)
	@mkdir -p $(@D)
	$(call say,CXX,$@)$(CXX) $(CUSIM_CXXFLAGS) $(CUSIM_XFLAGS) -x c++ -DX3K_SIM \
		-include tests/gpu/cusim/cusim.h -c -o $@ $<

$(CUSIM)/lib/%.o: lib/%.c
	@mkdir -p $(@D)
	$(call say,CC,$@)$(CC) $(CPPFLAGS) -DX3_CUDA=1 -I$(CUSIM_CUDA_INC) $(X3_CFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

$(CUSIM_LIB): $(filter-out $(CUSIM_GPU_SRC:.c=.o),$(LIB_OBJ)) $(CUSIM_GPU_OBJ) $(CUSIM_CU_OBJ) $(CUSIM_RT_OBJ)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

$(CUSIM)/tests/unit/%: tests/unit/%.c $(CUSIM_LIB)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CC) $(CPPFLAGS) -DX3_CUDA=1 -I$(CUSIM_CUDA_INC) $(X3_CFLAGS) $(CFLAGS) \
		$(LDFLAGS) -o $@ $< $(CUSIM_LIB) $(CUSIM_LDLIBS)

$(CUSIM)/bin/%: bin/%.o $(BIN_UTIL) $(CUSIM_LIB)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) -o $@ $< $(BIN_UTIL) $(CUSIM_LIB) $(CUSIM_LDLIBS)

cusim-clean:
	rm -rf $(CUSIM)

.PHONY: cusim cusim-clean
-include $(wildcard $(CUSIM)/lib/*.d)
