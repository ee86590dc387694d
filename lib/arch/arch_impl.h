/* arch_impl.h: what the architecture files (arch*.c) share and nothing
 * outside lib/arch/ sees: the list of the families (arch_tables.c), which
 * the engine (arch.c) searches. */
#ifndef X3_ARCH_IMPL_H
#define X3_ARCH_IMPL_H

#include "arch.h"

/* every family the toolkit converts, in the order x3_arch_get numbers
 * them and tensor-ls --architectures lists them */
extern const x3_arch_desc x3_archs[];
extern const int x3_narchs;

#endif
