# config.mk: build knobs for exl3kit. Override on the command line:
#   make CC=clang, make CUDA=0, make CUDA_ARCH="80 90", make PREFIX=/opt/x3
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBEXECDIR ?= $(PREFIX)/libexec/exl3kit
MANDIR ?= $(PREFIX)/share/man
DATADIR ?= $(PREFIX)/share/exl3kit
DESTDIR ?=

CC ?= cc
OPT ?= -O2
CFLAGS ?= $(OPT) -g
WARN = -Wall -Wextra -Wno-unused-parameter
# gcc's truncation heuristics flag every bounded snprintf of a path; we check
# lengths where it matters. (Probed so that clang, which lacks it, stays quiet.)
WARN += $(shell $(CC) -Werror -Wno-format-truncation -c -x c /dev/null -o /dev/null 2>/dev/null && echo -Wno-format-truncation)
CPPFLAGS += -D_GNU_SOURCE -I/usr/include/x86_64-linux-gnu/openblas-pthread
# -ffp-contract=off: no multiply-add fusion where the source has none, so
# the fixed-order loops (proxy error, Hessian finalization) round the same on
# every compiler and x86-64 (gcc's -std=c11 default; clang's is "on").
X3_CFLAGS = -std=c11 $(WARN) -ffp-contract=off -fopenmp -pthread
# --as-needed: a program records only the libraries it uses (tensor-ls
# loads no OpenBLAS, LAPACK or OpenMP at start-up)
LDLIBS = -Wl,--as-needed -lzstd -lxxhash -ljansson -lpcre2-8 -llapacke -lopenblas -lm -ldl -fopenmp -pthread

# CUDA: auto-detected (nvcc on PATH or in /usr/local/cuda/bin); CUDA=1 (which
# requires nvcc) builds the GPU backend object lib/libexl3kit-cuda.so, CUDA=0
# does not. The programs are the same either way (they dlopen the object).
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(origin CUDA), undefined)
CUDA := $(if $(NVCC),1,0)
endif
CUDA_ARCH ?= 80 89 90
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS ?= -O3 -std=c++17 --expt-relaxed-constexpr -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
