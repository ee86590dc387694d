/* linear.h: the linear layers the model forward multiplies with: either a
 * dense weight (HF orientation (out, in), F32/F16/BF16 in a safetensors
 * file, converted to F32) or an EXL3-quantized linear (lib/codec/exl3.h) read
 * from an EXL3 model directory. Both compute Y = X·Wᵀ (+ bias). */
#ifndef X3_LINEAR_H
#define X3_LINEAR_H

#include "x3.h"
#include "safetensors.h"

typedef struct x3_linear x3_linear;

/* Open "<key>.weight" (dense) or the EXL3 group "<key>.trellis/suh/svh"
 * from st, checking it against in_features x out_features; with bias set,
 * "<key>.bias" (out) must exist. check_only: validate and return with
 * *out untouched (out may be NULL). Errors name the tensor. */
int x3_linear_open(x3_st *st, const char *key, int64_t in, int64_t out,
                   int bias, int check_only, x3_linear **lin);
/* As x3_linear_open, for a linear that a fused checkpoint stores as rows
 * [row0, row0 + out) of SRC.weight (src_rows, in) (and of SRC.bias with
 * bias; arch.h x3_row_slice): those rows, unless st holds KEY's own EXL3
 * tensors or KEY.weight (a converted or a split checkpoint), which are
 * opened as x3_linear_open does. src NULL or KEY: x3_linear_open. Where
 * st has no SRC.weight but a 3-D tensor SRC (experts, rows, in), the
 * experts of a layer fused (arch.h x3_fused_expert), its (experts * rows,
 * in) view is the source (no bias). */
int x3_linear_open_rows(x3_st *st, const char *key, const char *src, int64_t row0, int64_t src_rows,
                        int64_t in, int64_t out, int bias, int check_only, x3_linear **lin);
/* y (rows, out) = x (rows, in) · Wᵀ (+ bias). An EXL3 linear multiplies
 * small batches from the packed trellis and larger ones through a dense
 * reconstruction made on first use (so l is not const). On the CPU the
 * rows are segments of seg rows (the tokens of one sequence; 0: one
 * segment) and a row's result depends on its place in its segment alone,
 * not on the other rows (blas.h x3_gemm_xwt). */
int x3_linear_apply(x3_linear *l, const float *x, int64_t rows, int64_t seg, float *y);
int x3_linear_is_exl3(const x3_linear *l);
/* Where x3_linear_on_use's linears make their F32 weights: one buffer
 * kept from use to use and grown to the largest, so that a use neither
 * maps fresh pages (which the kernel zeroes, a fault each 4 KiB) nor
 * returns them; a capture of 64 x 2048 tokens in chunks of 4096 uses
 * each linear 32 times. One use at a time: a use while it is taken
 * allocates its own. Zero-initialized; x3_wbuf_free releases the memory
 * (the linears that use it must not be used after). */
typedef struct {
	float *p;
	size_t cap;     /* floats */
	int busy;
} x3_wbuf;
void x3_wbuf_free(x3_wbuf *b);
/* A dense linear on the CPU keeps no F32 weight of its own:
 * each x3_linear_apply converts it from the checkpoint (still open) into
 * buf (NULL: a buffer allocated and freed per call) and lets it go after
 * the product (and drops the mapped pages it read), so a forward holds
 * one linear's F32 weight at a time instead of a layer's; the products
 * are the same bits. Costs a conversion per call. Nothing for an EXL3
 * linear or one on the device. */
int x3_linear_on_use(x3_linear *l, x3_wbuf *buf);
/* Where x3_linear_apply runs: X3_DEVICE_CPU (the default, the reference)
 * or X3_DEVICE_CUDA (resolved, not auto): a dense weight is uploaded now
 * and multiplied by cuBLAS SGEMM (device.h dense_*); an EXL3 linear is
 * uploaded (x3_exl3_upload) and multiplies batches of up to 16
 * rows with the fp32 fused GEMV, larger ones with its dense reconstruction
 * made on the device. Either way the result equals the CPU's up to F32
 * rounding (summation order). X3_EUNSUP without a device. */
int x3_linear_set_device(x3_linear *l, int dev);
void x3_linear_free(x3_linear *l);

#endif
