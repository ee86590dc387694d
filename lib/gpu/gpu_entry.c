/* gpu_entry.c: the one exported symbol of the backend object,
 * x3_gpu_backend (device.h X3_GPU_ENTRY): the table of the functions of
 * gpu.c, gpu_dense.c and gpu_quant.c, and the host services they use. The
 * object links nothing of libexl3kit: x3_err, x3_errprefix and
 * x3_f16_to_f32 here pass through to the program's own (struct
 * x3_gpu_host), so messages land in its x3_errmsg(). */
#include <stdarg.h>
#include <stdio.h>

#include "gpu_impl.h"

static const struct x3_gpu_host *host;

/* as in x3.c: at most this many bytes of message */
#define MSG_MAX 2048

int x3_err(int code, const char *fmt, ...)
{
	char m[MSG_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	return host->err(code, "%s", m);
}

int x3_errprefix(int code, const char *fmt, ...)
{
	char m[MSG_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	return host->errprefix(code, "%s", m);
}

float x3_f16_to_f32(uint16_t h)
{
	return host->f16_to_f32(h);
}

static const struct x3_gpu table = {
	.abi = X3_GPU_ABI,
	.size = sizeof(struct x3_gpu),
#ifdef X3K_SIM
	.name = "cusim",
#else
	.name = "cuda",
#endif
	.available = x3_gpu_dev_available,
	.describe = x3_gpu_describe,
	.alloc = x3_gpu_alloc,
	.free = x3_gpu_free,
	.upload = x3_gpu_upload,
	.download = x3_gpu_download,
	.memset = x3_gpu_memset,
	.sync = x3_gpu_sync,
	.meminfo = x3_gpu_meminfo,
	.viterbi_encode = x3_gpu_viterbi_encode,
	.viterbi_encode_d = x3_gpu_viterbi_encode_d,
	.trellis_decode = x3_gpu_trellis_decode,
	.trellis_decode_d = x3_gpu_trellis_decode_d,
	.reconstruct = x3_gpu_reconstruct,
	.had128_rows = x3_gpu_had128_rows,
	.had128_cols = x3_gpu_had128_cols,
	.linear_create = x3_gpu_linear_create,
	.linear_create_f32 = x3_gpu_linear_create_f32,
	.linear_free = x3_gpu_linear_free,
	.linear_bytes = x3_gpu_linear_bytes,
	.linear_forward = x3_gpu_linear_forward,
	.linear_forward_d = x3_gpu_linear_forward_d,
	.linear_weight = x3_gpu_linear_weight,
	.gemv_ksplit = x3_gpu_gemv_ksplit,
	.dense_create = x3_gpu_dense_create,
	.dense_free = x3_gpu_dense_free,
	.dense_bytes = x3_gpu_dense_bytes,
	.dense_forward = x3_gpu_dense_forward,
	.dense_forward_d = x3_gpu_dense_forward_d,
	.hessian_create = x3_gpu_hessian_create,
	.hessian_free = x3_gpu_hessian_free,
	.hessian_add = x3_gpu_hessian_add,
	.hessian_add_d = x3_gpu_hessian_add_d,
	.hessian_get = x3_gpu_hessian_get,
	.block_ldl = x3_gpu_block_ldl,
	.block_ldl_retry = x3_gpu_block_ldl_retry,
	.ldlq = x3_gpu_ldlq,
};

__attribute__((visibility("default")))
const struct x3_gpu *x3_gpu_backend(const struct x3_gpu_host *h)
{
	if (!h || h->abi != X3_GPU_ABI)
		return NULL;
	host = h;
	return &table;
}
