# cusim.mk: `make cusim` builds exl3kit's CUDA backend on cusim, the CPU
# emulator of tests/gpu/cusim, under tests/tmp/cusim/ (the normal build is
# untouched): kernels/*.cu compiled as host C++ by $(CXX) with -DX3K_SIM and
# cusim.h force-included, lib/gpu/*.c unchanged, and the emulated runtime,
# cuBLAS and cuSOLVER (tests/gpu/cusim/*.cpp), linked into
# tests/tmp/cusim/lib/libexl3kit-cuda.so: the same kind of object as the
# real backend, loaded the same way (dlopen, lib/common/device.h). The programs
# and the GPU unit tests are the normal build's, hard-linked into
# tests/tmp/cusim/{bin,tests/unit} so that they find that object (the
# programs next to their own directory, the unit tests through
# tests/unit/gpu-test.h); examples/ and pipelines/ are linked in, so that
# a shell test runs on it with ROOT=tests/tmp/cusim.
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
	-Wno-unknown-pragmas -I$(CUSIM_CUDA_INC) -Itests/gpu/cusim -Ikernels $(addprefix -Ilib/,$(LAYERS)) \
	-I/usr/include/x86_64-linux-gnu/openblas-pthread -fPIC
CUSIM_RT_OBJ := $(patsubst tests/gpu/cusim/%.cpp,$(CUSIM)/cusim/%.o,$(wildcard tests/gpu/cusim/*.cpp))
CUSIM_CU_OBJ := $(patsubst kernels/%.cu,$(CUSIM)/kernels/%.o,$(CU_SRC))
CUSIM_GPU_OBJ := $(patsubst lib/%.c,$(CUSIM)/lib/%.o,$(GPU_SRC))
CUSIM_BACKEND := $(CUSIM)/$(BACKEND)
CUSIM_UNIT := $(patsubst tests/unit/%.c,$(CUSIM)/tests/unit/%,$(wildcard tests/unit/t17*-gpu-*.c))
CUSIM_PROGS := $(patsubst bin/%,$(CUSIM)/bin/%,$(PROGS))

cusim: $(CUSIM_BACKEND) $(CUSIM_UNIT) $(CUSIM_PROGS) $(CUSIM)/selftest
	@ln -sfn ../../../examples $(CUSIM)/examples && ln -sfn ../../../pipelines $(CUSIM)/pipelines

# checks of the emulator itself (t1706 runs them)
$(CUSIM)/selftest: tests/gpu/cusim/selftest.cu $(CUSIM_RT_OBJ)
	$(call say,CXX,$@)$(CXX) $(CUSIM_CXXFLAGS) $(CUSIM_XFLAGS) -x c++ -DX3K_SIM \
		-include tests/gpu/cusim/cusim.h -o $@ $< -x none $(CUSIM_RT_OBJ) $(LDLIBS) -lstdc++

$(CUSIM)/cusim/%.o: tests/gpu/cusim/%.cpp $(wildcard tests/gpu/cusim/*.h)
	@mkdir -p $(@D)
	$(call say,CXX,$@)$(CXX) $(CUSIM_CXXFLAGS) $(CUSIM_XFLAGS) -c -o $@ $<

$(CUSIM)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.cuh) lib/gpu/gpu_kern.h $(wildcard tests/gpu/cusim/*.h)
	@mkdir -p $(@D)
	$(call say,CXX,$@)$(CXX) $(CUSIM_CXXFLAGS) $(CUSIM_XFLAGS) -x c++ -DX3K_SIM \
		-include tests/gpu/cusim/cusim.h -c -o $@ $<

$(CUSIM)/lib/%.o: lib/%.c
	@mkdir -p $(@D)
	$(call say,CC,$@)$(CC) $(CPPFLAGS) -DX3K_SIM -I$(CUSIM_CUDA_INC) $(X3_CFLAGS) $(CFLAGS) -fPIC \
		-MMD -MP -c -o $@ $<

# the emulated backend: like $(BACKEND), with the emulator for the CUDA
# libraries (which compute with OpenBLAS and LAPACKE)
$(CUSIM_BACKEND): $(CUSIM_GPU_OBJ) $(CUSIM_CU_OBJ) $(CUSIM_RT_OBJ) lib/gpu/gpu.map
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CXX) -shared $(LDFLAGS) -Wl,--version-script=lib/gpu/gpu.map -Wl,-z,defs \
		-o $@ $(CUSIM_GPU_OBJ) $(CUSIM_CU_OBJ) $(CUSIM_RT_OBJ) -llapacke -lopenblas -lm -pthread

# the normal build's programs and GPU unit tests, under another directory
$(CUSIM)/tests/unit/%: tests/unit/%
	@mkdir -p $(@D)
	@ln -f $< $@ 2>/dev/null || cp $< $@

$(CUSIM)/bin/%: bin/%
	@mkdir -p $(@D)
	@ln -f $< $@ 2>/dev/null || cp $< $@

cusim-clean:
	rm -rf $(CUSIM)

.PHONY: cusim cusim-clean
-include $(wildcard $(CUSIM)/lib/*/*.d)
