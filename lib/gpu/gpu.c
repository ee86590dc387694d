/* gpu.c: host side of the CUDA path: device queries, memory, and the
 * checked wrappers of the codec kernels (Viterbi, decode, reconstruct,
 * Hadamard) and of the EXL3 linear (fused GEMV or reconstruct + cuBLAS
 * GEMM). Part of the backend object (device.h); see gpu_impl.h. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <cublas_v2.h>

#include "codec.h"
#include "gpu_impl.h"
#include "gpu_kern.h"

#define RSQRT128 0.08838834764831845f

static int check_kcb(const char *what, int K, int cb)
{
	if (K < 1 || K > 8)
		return x3_err(X3_EINVAL, "%s: K=%d out of range 1..8", what, K);
	if (cb < 0 || cb >= X3_CB_COUNT)
		return x3_err(X3_EINVAL, "%s: bad codebook id %d", what, cb);
	return X3_OK;
}


int x3_gpu_cuerr(int e, const char *what)
{
	if (e == cudaSuccess)
		return X3_OK;
	(void)cudaGetLastError();   /* clear a non-sticky error */
	const char *why = cudaGetErrorString((cudaError_t)e);
	if (e == cudaErrorMemoryAllocation)
		return x3_err(X3_ENOMEM, "cuda: %s: %s", what, why);
	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
		return x3_err(X3_EUNSUP, "cuda: %s: %s", what, why);
	return x3_err(X3_EIO, "cuda: %s: %s", what, why);
}

int x3_gpu_blaserr(int s, const char *what)
{
	if (s == CUBLAS_STATUS_SUCCESS)
		return X3_OK;
	if (s == CUBLAS_STATUS_ALLOC_FAILED)
		return x3_err(X3_ENOMEM, "cublas: %s: out of memory", what);
	return x3_err(X3_EIO, "cublas: %s: status %d", what, (int)s);
}

int x3_gpu_dev_available(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		x3_err(X3_EUNSUP, "no usable CUDA device: %s", cudaGetErrorString(e));
		return 0;
	}
	if (n < 1) {
		x3_err(X3_EUNSUP, "no CUDA device found");
		return 0;
	}
	return 1;
}

int x3_gpu_describe(char *buf, size_t len)
{
	if (!x3_gpu_dev_available())
		return X3_EUNSUP;
	int dev = 0;
	struct cudaDeviceProp p;
	int rc = x3_gpu_cuerr(cudaGetDevice(&dev), "get device");
	if (!rc)
		rc = x3_gpu_cuerr(cudaGetDeviceProperties(&p, dev), "device properties");
	if (rc)
		return rc;
	snprintf(buf, len, "%s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB", p.name, p.major, p.minor,
	         p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30), p.l2CacheSize >> 20);
	return X3_OK;
}

static int need_device(void)
{
	return x3_gpu_dev_available() ? X3_OK : X3_EUNSUP;
}

int x3_gpu_alloc(void **p, size_t bytes)
{
	*p = NULL;
	if (bytes == 0)
		bytes = 1;
	return x3_gpu_cuerr(cudaMalloc(p, bytes), "allocate device memory");
}

void x3_gpu_free(void *p)
{
	if (p)
		cudaFree(p);
}

int x3_gpu_upload(void *dst_d, const void *src, size_t bytes)
{
	return bytes ? x3_gpu_cuerr(cudaMemcpy(dst_d, src, bytes, cudaMemcpyHostToDevice), "upload") : X3_OK;
}

int x3_gpu_download(void *dst, const void *src_d, size_t bytes)
{
	return bytes ? x3_gpu_cuerr(cudaMemcpy(dst, src_d, bytes, cudaMemcpyDeviceToHost), "download") : X3_OK;
}

int x3_gpu_memset(void *dst_d, int byte, size_t bytes)
{
	return bytes ? x3_gpu_cuerr(cudaMemset(dst_d, byte, bytes), "memset") : X3_OK;
}

int x3_gpu_sync(void)
{
	return x3_gpu_cuerr(cudaDeviceSynchronize(), "synchronize");
}

int x3_gpu_meminfo(size_t *free_b, size_t *total_b)
{
	return x3_gpu_cuerr(cudaMemGetInfo(free_b, total_b), "memory info");
}

/* ---- Viterbi ----------------------------------------------------------- */

struct vrun {
	int K, cb, nblocks;
	void *scratch;
	unsigned long long *bad;
	size_t scratch_bytes;
};

/* Plan and allocate scratch for up to max_tiles tiles per launch. */
static int vrun_init(struct vrun *v, int K, int cb, int64_t max_tiles, size_t max_scratch)
{
	memset(v, 0, sizeof *v);
	v->K = K;
	v->cb = cb;
	struct x3k_viterbi_plan p;
	int rc = x3_gpu_cuerr(x3k_viterbi_plan(K, cb, &p), "viterbi plan");
	if (rc)
		return rc;
	int dev, sms;
	rc = x3_gpu_cuerr(cudaGetDevice(&dev), "get device");
	if (!rc)
		rc = x3_gpu_cuerr(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
	if (rc)
		return rc;
	if (!max_scratch) {
		size_t fr, tot;
		rc = x3_gpu_meminfo(&fr, &tot);
		if (rc)
			return rc;
		max_scratch = fr / 4;
		if (max_scratch > ((size_t)2 << 30))
			max_scratch = (size_t)2 << 30;
		/* a quarter is a target, not a limit: one block when it fits */
		if (max_scratch < p.scratch_per_block && fr > p.scratch_per_block + ((size_t)1 << 20))
			max_scratch = p.scratch_per_block;
	}
	int64_t nb = (int64_t)p.blocks_per_sm * sms;
	if (nb > max_tiles)
		nb = max_tiles;
	if ((size_t)nb * p.scratch_per_block > max_scratch)
		nb = (int64_t)(max_scratch / p.scratch_per_block);
	if (nb < 1)
		return x3_err(X3_ENOMEM, "viterbi: scratch limit %zu bytes is below one block's %zu",
		              max_scratch, p.scratch_per_block);
	v->nblocks = (int)nb;
	v->scratch_bytes = (size_t)nb * p.scratch_per_block;
	rc = x3_gpu_alloc(&v->scratch, v->scratch_bytes);
	if (!rc)
		rc = x3_gpu_alloc((void **)&v->bad, sizeof *v->bad);
	return rc;
}

static void vrun_free(struct vrun *v)
{
	x3_gpu_free(v->scratch);
	x3_gpu_free(v->bad);
	v->scratch = v->bad = NULL;
}

/* Encode ntiles tiles at x_d; base: index of the first tile for messages. */
static int vrun_go(struct vrun *v, const float *x_d, int64_t ntiles, uint16_t *st_d,
                   float *val_d, int64_t base)
{
	if (ntiles <= 0)
		return X3_OK;
	int rc = x3_gpu_memset(v->bad, 0xff, sizeof *v->bad);
	if (rc)
		return rc;
	rc = x3_gpu_cuerr(x3k_viterbi(v->K, v->cb, x_d, ntiles, st_d, val_d, v->scratch, v->nblocks,
	                       v->bad, NULL), "viterbi launch");
	if (!rc)
		rc = x3_gpu_cuerr(cudaDeviceSynchronize(), "viterbi");
	unsigned long long bad = 0;
	if (!rc)
		rc = x3_gpu_download(&bad, v->bad, sizeof bad);
	if (rc)
		return rc;
	if (bad != ~0ull) {
		float xv = NAN;
		x3_gpu_download(&xv, x_d + bad, sizeof xv);
		return x3_err(X3_ENUM, "viterbi: tile %lld position %d: target %g is not finite or "
		              "exceeds 1e16", (long long)(base + (int64_t)(bad / 256)), (int)(bad % 256),
		              (double)xv);
	}
	return X3_OK;
}

int x3_gpu_viterbi_encode_d(int K, int cb, const float *x_d, int64_t ntiles,
                            uint16_t *states_d, float *values_d, size_t max_scratch,
                            size_t *scratch_used)
{
	int rc = check_kcb("viterbi", K, cb);
	if (rc)
		return rc;
	if (ntiles < 0 || (ntiles > 0 && !x_d))
		return x3_err(X3_EINVAL, "viterbi: bad tile count or NULL input");
	if (scratch_used)
		*scratch_used = 0;
	if (ntiles == 0)
		return X3_OK;
	if ((rc = need_device()))
		return rc;
	struct vrun v;
	rc = vrun_init(&v, K, cb, ntiles, max_scratch);
	if (!rc)
		rc = vrun_go(&v, x_d, ntiles, states_d, values_d, 0);
	if (scratch_used)
		*scratch_used = v.scratch_bytes + sizeof *v.bad;
	vrun_free(&v);
	return rc;
}

#define VBATCH 65536   /* tiles per upload (64 MiB of targets) */

/* x3_gpu_viterbi_encode's device buffers, kept between calls: LDLQ calls
 * it once per 16-row block with the same K, codebook and about the same
 * tile count (896 times for an 8B down_proj; fewer where a block has equal
 * tiles, which are encoded once), and each call had allocated and freed
 * its targets, states, values and scratch (cudaFree synchronizes) and read
 * the free memory. The targets/states/values grow to the largest batch;
 * the scratch is planned anew (vrun_init) when K or the codebook changes
 * or the batch outgrows the plan, after the old one is freed. A smaller
 * batch runs on the plan of a larger one: the grid is persistent over the
 * tiles, so blocks beyond the tiles return at once and each tile's codes
 * are the same. One call at a time. Freed with the process. */
static struct {
	pthread_mutex_t mu;
	float *x_d, *val_d;
	uint16_t *st_d;
	int64_t cap;      /* tiles that x_d, st_d and val_d hold */
	struct vrun v;    /* scratch planned for (v.K, v.cb, batch) */
	int64_t batch;    /* 0: no scratch */
} vc = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void vc_free_io(void)
{
	x3_gpu_free(vc.x_d), x3_gpu_free(vc.st_d), x3_gpu_free(vc.val_d);
	vc.x_d = vc.val_d = NULL, vc.st_d = NULL, vc.cap = 0;
}

static void vc_free_scratch(void)
{
	vrun_free(&vc.v);
	vc.batch = 0;
}

/* the buffers for batch tiles at (K, cb), under vc.mu */
static int vc_get(int K, int cb, int64_t batch)
{
	int rc = X3_OK;
	if (vc.batch && (vc.v.K != K || vc.v.cb != cb || vc.batch < batch))
		vc_free_scratch();
	if (batch > vc.cap) {
		vc_free_io();
		rc = x3_gpu_alloc((void **)&vc.x_d, (size_t)batch * 256 * sizeof(float));
		if (!rc)
			rc = x3_gpu_alloc((void **)&vc.st_d, (size_t)batch * 256 * sizeof(uint16_t));
		if (!rc)
			rc = x3_gpu_alloc((void **)&vc.val_d, (size_t)batch * 256 * sizeof(float));
		if (!rc)
			vc.cap = batch;
	}
	if (!rc && !vc.batch) {
		rc = vrun_init(&vc.v, K, cb, batch, 0);
		if (!rc)
			vc.batch = batch;
	}
	if (rc)
		vc_free_io(), vc_free_scratch();   /* nothing half-made kept; the error stands */
	return rc;
}

int x3_gpu_viterbi_encode(int K, int cb, const float *x, int64_t ntiles, uint16_t *states,
                          float *values)
{
	int rc = check_kcb("viterbi", K, cb);
	if (rc)
		return rc;
	if (ntiles < 0 || (ntiles > 0 && !x))
		return x3_err(X3_EINVAL, "viterbi: bad tile count or NULL input");
	if (ntiles == 0)
		return X3_OK;
	if ((rc = need_device()))
		return rc;
	const int64_t batch = ntiles < VBATCH ? ntiles : VBATCH;
	pthread_mutex_lock(&vc.mu);
	rc = vc_get(K, cb, batch);
	for (int64_t t0 = 0; !rc && t0 < ntiles; t0 += batch) {
		const int64_t nt = ntiles - t0 < batch ? ntiles - t0 : batch;
		rc = x3_gpu_upload(vc.x_d, x + t0 * 256, (size_t)nt * 256 * sizeof(float));
		if (!rc)
			rc = vrun_go(&vc.v, vc.x_d, nt, states ? vc.st_d : NULL, values ? vc.val_d : NULL, t0);
		if (!rc && states)
			rc = x3_gpu_download(states + t0 * 256, vc.st_d, (size_t)nt * 256 * sizeof(uint16_t));
		if (!rc && values)
			rc = x3_gpu_download(values + t0 * 256, vc.val_d, (size_t)nt * 256 * sizeof(float));
	}
	pthread_mutex_unlock(&vc.mu);
	return rc;
}

/* ---- decode / reconstruct ------------------------------------------------ */

static int check_shape(const char *what, int64_t k, int64_t n, int64_t mult)
{
	if (k <= 0 || n <= 0 || k % mult || n % mult)
		return x3_err(X3_EINVAL, "%s: shape %lldx%lld is not a positive multiple of %lld", what,
		              (long long)k, (long long)n, (long long)mult);
	return X3_OK;
}

int x3_gpu_trellis_decode_d(int K, int cb, const uint16_t *trellis_d, int64_t k, int64_t n,
                            void *w_d, int out_f16)
{
	int rc = check_kcb("decode", K, cb);
	if (!rc)
		rc = check_shape("decode", k, n, 16);
	if (rc)
		return rc;
	if (!trellis_d || !w_d)
		return x3_err(X3_EINVAL, "decode: NULL pointer");
	if ((rc = need_device()))
		return rc;
	rc = x3_gpu_cuerr(x3k_decode(K, cb, trellis_d, k, n, w_d, out_f16 != 0, NULL), "decode launch");
	return rc ? rc : x3_gpu_cuerr(cudaDeviceSynchronize(), "decode");
}

int x3_gpu_trellis_decode(int K, int cb, const uint16_t *trellis, int64_t k, int64_t n, float *w)
{
	int rc = check_kcb("decode", K, cb);
	if (!rc)
		rc = check_shape("decode", k, n, 16);
	if (rc)
		return rc;
	if (!trellis || !w)
		return x3_err(X3_EINVAL, "decode: NULL pointer");
	if ((rc = need_device()))
		return rc;
	const size_t tb = (size_t)(k / 16) * (size_t)(n / 16) * 16 * (size_t)K * 2;
	uint16_t *t_d = NULL;
	float *w_d = NULL;
	rc = x3_gpu_alloc((void **)&t_d, tb);
	if (!rc)
		rc = x3_gpu_alloc((void **)&w_d, (size_t)(k * n) * sizeof(float));
	if (!rc)
		rc = x3_gpu_upload(t_d, trellis, tb);
	if (!rc)
		rc = x3_gpu_trellis_decode_d(K, cb, t_d, k, n, w_d, 0);
	if (!rc)
		rc = x3_gpu_download(w, w_d, (size_t)(k * n) * sizeof(float));
	x3_gpu_free(t_d);
	x3_gpu_free(w_d);
	return rc;
}

static int upload_f16_as_f32(float **dst_d, const uint16_t *h, int64_t n)
{
	float *tmp = malloc((size_t)n * sizeof(float));
	if (!tmp)
		return x3_err(X3_ENOMEM, "out of memory");
	for (int64_t i = 0; i < n; i++)
		tmp[i] = x3_f16_to_f32(h[i]);
	int rc = x3_gpu_alloc((void **)dst_d, (size_t)n * sizeof(float));
	if (!rc)
		rc = x3_gpu_upload(*dst_d, tmp, (size_t)n * sizeof(float));
	free(tmp);
	return rc;
}

int x3_gpu_reconstruct(int K, int cb, const uint16_t *trellis, const uint16_t *suh,
                       const uint16_t *svh, int64_t k, int64_t n, float *w)
{
	int rc = check_kcb("reconstruct", K, cb);
	if (!rc)
		rc = check_shape("reconstruct", k, n, 128);
	if (rc)
		return rc;
	if (!trellis || !suh || !svh || !w)
		return x3_err(X3_EINVAL, "reconstruct: NULL pointer");
	if ((rc = need_device()))
		return rc;
	const size_t tb = (size_t)(k / 16) * (size_t)(n / 16) * 16 * (size_t)K * 2;
	uint16_t *t_d = NULL;
	float *w_d = NULL, *su_d = NULL, *sv_d = NULL;
	rc = x3_gpu_alloc((void **)&t_d, tb);
	if (!rc)
		rc = x3_gpu_alloc((void **)&w_d, (size_t)(k * n) * sizeof(float));
	if (!rc)
		rc = x3_gpu_upload(t_d, trellis, tb);
	if (!rc)
		rc = upload_f16_as_f32(&su_d, suh, k);
	if (!rc)
		rc = upload_f16_as_f32(&sv_d, svh, n);
	if (!rc)
		rc = x3_gpu_cuerr(x3k_reconstruct(K, cb, t_d, su_d, sv_d, k, n, w_d, 0, NULL),
		           "reconstruct launch");
	if (!rc)
		rc = x3_gpu_cuerr(cudaDeviceSynchronize(), "reconstruct");
	if (!rc)
		rc = x3_gpu_download(w, w_d, (size_t)(k * n) * sizeof(float));
	x3_gpu_free(t_d);
	x3_gpu_free(w_d);
	x3_gpu_free(su_d);
	x3_gpu_free(sv_d);
	return rc;
}

/* ---- Hadamard -------------------------------------------------------------- */

static int had_host(float *x, int64_t rows, int64_t cols, int along_cols)
{
	if (rows < 0 || cols < 0 || (along_cols ? rows % 128 : cols % 128))
		return x3_err(X3_EINVAL, "hadamard: %s %lld is not a multiple of 128",
		              along_cols ? "rows" : "cols", (long long)(along_cols ? rows : cols));
	if (rows == 0 || cols == 0)
		return X3_OK;
	if (!x)
		return x3_err(X3_EINVAL, "hadamard: NULL pointer");
	int rc = need_device();
	if (rc)
		return rc;
	float *x_d = NULL;
	const size_t b = (size_t)(rows * cols) * sizeof(float);
	rc = x3_gpu_alloc((void **)&x_d, b);
	if (!rc)
		rc = x3_gpu_upload(x_d, x, b);
	if (!rc)
		rc = x3_gpu_cuerr(along_cols ? x3k_had128_cols(x_d, rows, cols, NULL, NULL, RSQRT128, NULL)
		                      : x3k_had128_rows(x_d, x_d, rows, cols, NULL, NULL, NULL, RSQRT128,
		                                        NULL), "hadamard launch");
	if (!rc)
		rc = x3_gpu_download(x, x_d, b);
	x3_gpu_free(x_d);
	return rc;
}

int x3_gpu_had128_rows(float *x, int64_t rows, int64_t cols) { return had_host(x, rows, cols, 0); }
int x3_gpu_had128_cols(float *x, int64_t rows, int64_t cols) { return had_host(x, rows, cols, 1); }

/* ---- EXL3 linear ------------------------------------------------------------ */

struct x3_gpu_linear {
	int K, cb, sms;
	int64_t k, n;
	uint16_t *trellis_d;
	float *suh_d, *svh_d, *bias_d;     /* (k), (n), (n) or NULL */
	float *y1_d;                       /* fused GEMV: y' (16, n) scratch, kept zero */
	int *cnt_d;                        /* fused GEMV: (n / 128) arrival counters, kept zero */
	int dirty;                         /* a fused forward failed: re-zero y1_d, cnt_d */
	float *xh_d, *y1u_d;               /* unfused GEMV (made on first use): x' (16, k), y' (16, n) */
	uint16_t *w16_d;                   /* GEMM: reconstructed W (k, n) fp16 */
	uint16_t *x16_d;                   /* GEMM: x (m, k) fp16 */
	int64_t x16_rows;
	float *hx_d, *hy_d;                /* host forward staging */
	int64_t h_rows;
	cublasHandle_t blas;
	size_t bytes;
};

void x3_gpu_linear_free(x3_gpu_linear *L)
{
	if (!L)
		return;
	x3_gpu_free(L->trellis_d);
	x3_gpu_free(L->suh_d);
	x3_gpu_free(L->svh_d);
	x3_gpu_free(L->bias_d);
	x3_gpu_free(L->xh_d);
	x3_gpu_free(L->y1_d);
	x3_gpu_free(L->y1u_d);
	x3_gpu_free(L->cnt_d);
	x3_gpu_free(L->w16_d);
	x3_gpu_free(L->x16_d);
	x3_gpu_free(L->hx_d);
	x3_gpu_free(L->hy_d);
	if (L->blas)
		cublasDestroy(L->blas);
	free(L);
}

static int upload_f32(float **dst_d, const float *h, int64_t n)
{
	int rc = x3_gpu_alloc((void **)dst_d, (size_t)n * sizeof(float));
	return rc ? rc : x3_gpu_upload(*dst_d, h, (size_t)n * sizeof(float));
}

int x3_gpu_linear_create_f32(int K, int cb, int64_t k, int64_t n, const uint16_t *trellis,
                             const float *suh, const float *svh, const float *bias,
                             x3_gpu_linear **out)
{
	*out = NULL;
	int rc = check_kcb("linear", K, cb);
	if (!rc)
		rc = check_shape("linear", k, n, 128);
	if (rc)
		return rc;
	if (!trellis || !suh || !svh)
		return x3_err(X3_EINVAL, "linear: NULL trellis or scales");
	if ((rc = need_device()))
		return rc;
	x3_gpu_linear *L = calloc(1, sizeof *L);
	if (!L)
		return x3_err(X3_ENOMEM, "out of memory");
	L->K = K;
	L->cb = cb;
	L->k = k;
	L->n = n;
	int dev;
	const size_t tb = (size_t)(k / 16) * (size_t)(n / 16) * 16 * (size_t)K * 2;
	rc = x3_gpu_cuerr(cudaGetDevice(&dev), "get device");
	if (!rc)
		rc = x3_gpu_cuerr(cudaDeviceGetAttribute(&L->sms, cudaDevAttrMultiProcessorCount, dev), "SMs");
	if (!rc)
		rc = x3_gpu_alloc((void **)&L->trellis_d, tb);
	if (!rc)
		rc = x3_gpu_upload(L->trellis_d, trellis, tb);
	if (!rc)
		rc = upload_f32(&L->suh_d, suh, k);
	if (!rc)
		rc = upload_f32(&L->svh_d, svh, n);
	if (!rc && bias)
		rc = upload_f32(&L->bias_d, bias, n);
	if (!rc)
		rc = x3_gpu_alloc((void **)&L->y1_d, (size_t)(X3K_GEMV_MAX_M * n) * sizeof(float));
	if (!rc)
		rc = x3_gpu_memset(L->y1_d, 0, (size_t)(X3K_GEMV_MAX_M * n) * sizeof(float));
	if (!rc)
		rc = x3_gpu_alloc((void **)&L->cnt_d, (size_t)(n / 128) * sizeof(int));
	if (!rc)
		rc = x3_gpu_memset(L->cnt_d, 0, (size_t)(n / 128) * sizeof(int));
	if (!rc)
		rc = x3_gpu_blaserr(cublasCreate(&L->blas), "create handle");
	if (rc) {
		x3_gpu_linear_free(L);
		return rc;
	}
	L->bytes = tb + (size_t)(k + 2 * n) * 4 + (size_t)X3K_GEMV_MAX_M * (size_t)n * 4 +
	           (size_t)(n / 128) * sizeof(int);
	*out = L;
	return X3_OK;
}

static float *f16_to_f32_array(const uint16_t *h, int64_t n)
{
	float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
	if (f)
		for (int64_t i = 0; i < n; i++)
			f[i] = x3_f16_to_f32(h[i]);
	return f;
}

int x3_gpu_linear_create(int K, int cb, int64_t k, int64_t n, const uint16_t *trellis,
                         const uint16_t *suh, const uint16_t *svh, const uint16_t *bias,
                         x3_gpu_linear **out)
{
	*out = NULL;
	int rc = check_kcb("linear", K, cb);
	if (!rc)
		rc = check_shape("linear", k, n, 128);
	if (rc)
		return rc;
	if (!trellis || !suh || !svh)
		return x3_err(X3_EINVAL, "linear: NULL trellis or scales");
	float *su = f16_to_f32_array(suh, k), *sv = f16_to_f32_array(svh, n);
	float *b = bias ? f16_to_f32_array(bias, n) : NULL;
	if (!su || !sv || (bias && !b))
		rc = x3_err(X3_ENOMEM, "out of memory");
	else
		rc = x3_gpu_linear_create_f32(K, cb, k, n, trellis, su, sv, b, out);
	free(su), free(sv), free(b);
	return rc;
}

size_t x3_gpu_linear_bytes(const x3_gpu_linear *L)
{
	return L ? L->bytes : 0;
}

/* The fused GEMV (kernels/gemv.cu): one launch for the whole exl3(5) §6.2 formula.
 * y1_d and cnt_d are zero between calls (the kernel's last block of each
 * 128-column group re-zeroes them); after a failed forward they may not
 * be, so the next call clears them first. One x3_gpu_linear is not
 * reentrant: two forwards on it must not run at once (they share y1_d and
 * cnt_d; everything here is on the default stream). */
static int lin_gemv(x3_gpu_linear *L, const float *x_d, int m, float *y_d, int use_mma)
{
	int rc = X3_OK;
	if (L->dirty) {
		rc = x3_gpu_memset(L->y1_d, 0, (size_t)(X3K_GEMV_MAX_M * L->n) * sizeof(float));
		if (!rc)
			rc = x3_gpu_memset(L->cnt_d, 0, (size_t)(L->n / 128) * sizeof(int));
		if (rc)
			return rc;
		L->dirty = 0;
	}
	const int ksplit = x3k_gemv_ksplit(L->k, L->n);
	return x3_gpu_cuerr(x3k_gemv_fused(L->K, L->cb, L->trellis_d, L->k, L->n, x_d, m, L->suh_d,
	                                   L->svh_d, L->bias_d, y_d, L->y1_d, L->cnt_d, ksplit,
	                                   use_mma, NULL), "fused gemv launch");
}

/* The unfused GEMV (paths 4, 5): input Hadamard, memset, GEMV, output
 * Hadamard (4 launches), on buffers of its own made on first use. */
static int lin_gemv_unfused(x3_gpu_linear *L, const float *x_d, int m, float *y_d, int use_mma)
{
	int rc = X3_OK;
	if (!L->xh_d) {
		rc = x3_gpu_alloc((void **)&L->xh_d, (size_t)(X3K_GEMV_MAX_M * L->k) * sizeof(float));
		if (!rc)
			rc = x3_gpu_alloc((void **)&L->y1u_d, (size_t)(X3K_GEMV_MAX_M * L->n) * sizeof(float));
		if (rc) {
			x3_gpu_free(L->xh_d);
			L->xh_d = NULL;
			return rc;
		}
		L->bytes += (size_t)X3K_GEMV_MAX_M * (size_t)(L->k + L->n) * 4;
	}
	const int ksplit = x3k_gemv_ksplit(L->k, L->n);
	rc = x3_gpu_cuerr(x3k_had128_rows(x_d, L->xh_d, m, L->k, L->suh_d, NULL, NULL, RSQRT128, NULL),
	                  "input hadamard");
	if (!rc)
		rc = x3_gpu_cuerr(cudaMemsetAsync(L->y1u_d, 0, (size_t)(m * L->n) * sizeof(float), NULL),
		                  "memset");
	if (!rc)
		rc = x3_gpu_cuerr(x3k_gemv(L->K, L->cb, L->trellis_d, L->k, L->n, L->xh_d, m, L->y1u_d,
		                           ksplit, use_mma, NULL), "gemv launch");
	if (!rc)
		rc = x3_gpu_cuerr(x3k_had128_rows(L->y1u_d, y_d, m, L->n, NULL, L->svh_d, L->bias_d,
		                                  RSQRT128, NULL), "output hadamard");
	return rc;
}

static int lin_gemm(x3_gpu_linear *L, const float *x_d, int64_t m, float *y_d)
{
	int rc = X3_OK;
	if (!L->w16_d) {
		rc = x3_gpu_alloc((void **)&L->w16_d, (size_t)(L->k * L->n) * 2);
		if (rc)
			return rc;
		L->bytes += (size_t)(L->k * L->n) * 2;
	}
	if (m > L->x16_rows) {
		x3_gpu_free(L->x16_d);
		L->x16_d = NULL;
		L->x16_rows = 0;
		rc = x3_gpu_alloc((void **)&L->x16_d, (size_t)(m * L->k) * 2);
		if (rc)
			return rc;
		L->x16_rows = m;
	}
	rc = x3_gpu_cuerr(x3k_reconstruct(L->K, L->cb, L->trellis_d, L->suh_d, L->svh_d, L->k, L->n,
	                           L->w16_d, 1, NULL), "reconstruct launch");
	if (!rc)
		rc = x3_gpu_cuerr(x3k_f32_to_f16(x_d, L->x16_d, m * L->k, NULL), "convert launch");
	if (rc)
		return rc;
	/* row-major Y (m, n) = X (m, k) W (k, n) is column-major
	 * Y^T (n, m) = W^T (n, k) X^T (k, m) */
	const float one = 1.0f, zero = 0.0f;
	rc = x3_gpu_blaserr(cublasGemmEx(L->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)L->n, (int)m, (int)L->k,
	                          &one, L->w16_d, CUDA_R_16F, (int)L->n, L->x16_d, CUDA_R_16F,
	                          (int)L->k, &zero, y_d, CUDA_R_32F, (int)L->n, CUBLAS_COMPUTE_32F,
	                          CUBLAS_GEMM_DEFAULT), "gemm");
	for (int64_t i = 0; !rc && L->bias_d && i < m; i++)
		rc = x3_gpu_cuerr(x3k_add(y_d + i * L->n, L->bias_d, L->n, NULL), "bias launch");
	return rc;
}

int x3_gpu_linear_forward_d(x3_gpu_linear *L, const float *x_d, int64_t m, float *y_d, int path)
{
	if (!L || !x_d || !y_d)
		return x3_err(X3_EINVAL, "linear: NULL argument");
	if (m < 0 || m > (int64_t)1 << 30 || path < 0 || path > 5)
		return x3_err(X3_EINVAL, "linear: bad row count %lld or path %d", (long long)m, path);
	if (m == 0)
		return X3_OK;
	if (path != 0 && path != 2 && m > X3K_GEMV_MAX_M)
		return x3_err(X3_EINVAL, "linear: the GEMV takes at most %d rows, not %lld",
		              X3K_GEMV_MAX_M, (long long)m);
	/* the fused GEMV writes y while other blocks still read x */
	const int overlap = (const char *)y_d < (const char *)(x_d + m * L->k) &&
	                    (const char *)x_d < (const char *)(y_d + m * L->n);
	if (overlap && (path == 1 || path == 3))
		return x3_err(X3_EINVAL, "linear: the fused GEMV needs y apart from x (path 4/5 or 0 "
		              "work in place)");
	if (path == 0)
		path = m > X3K_GEMV_MAX_M ? 2 : overlap ? 4 : 1;
	int rc;
	if (path == 1 || path == 3) {
		rc = lin_gemv(L, x_d, (int)m, y_d, path == 1);
		if (!rc)
			rc = x3_gpu_cuerr(cudaDeviceSynchronize(), "linear forward");
		if (rc)
			L->dirty = 1;
		return rc;
	}
	if (path == 4 || path == 5)
		rc = lin_gemv_unfused(L, x_d, (int)m, y_d, path == 4);
	else
		rc = lin_gemm(L, x_d, m, y_d);
	return rc ? rc : x3_gpu_cuerr(cudaDeviceSynchronize(), "linear forward");
}

int x3_gpu_linear_forward(x3_gpu_linear *L, const float *x, int64_t m, float *y)
{
	if (!L || !x || !y)
		return x3_err(X3_EINVAL, "linear: NULL argument");
	if (m < 0 || m > (int64_t)1 << 30)
		return x3_err(X3_EINVAL, "linear: bad row count %lld", (long long)m);
	if (m == 0)
		return X3_OK;
	int rc = X3_OK;
	if (m > L->h_rows) {
		x3_gpu_free(L->hx_d);
		x3_gpu_free(L->hy_d);
		L->hx_d = L->hy_d = NULL;
		L->h_rows = 0;
		rc = x3_gpu_alloc((void **)&L->hx_d, (size_t)(m * L->k) * sizeof(float));
		if (!rc)
			rc = x3_gpu_alloc((void **)&L->hy_d, (size_t)(m * L->n) * sizeof(float));
		if (rc)
			return rc;
		L->h_rows = m;
	}
	rc = x3_gpu_upload(L->hx_d, x, (size_t)(m * L->k) * sizeof(float));
	if (!rc)
		rc = x3_gpu_linear_forward_d(L, L->hx_d, m, L->hy_d, 0);
	if (!rc)
		rc = x3_gpu_download(y, L->hy_d, (size_t)(m * L->n) * sizeof(float));
	return rc;
}

int x3_gpu_linear_weight(x3_gpu_linear *L, int inner, float *w)
{
	if (!L || !w)
		return x3_err(X3_EINVAL, "linear: NULL argument");
	float *w_d = NULL;
	int rc = x3_gpu_alloc((void **)&w_d, (size_t)(L->k * L->n) * sizeof(float));
	if (!rc)
		rc = x3_gpu_cuerr(inner ? x3k_decode(L->K, L->cb, L->trellis_d, L->k, L->n, w_d, 0, NULL)
		                 : x3k_reconstruct(L->K, L->cb, L->trellis_d, L->suh_d, L->svh_d, L->k,
		                                   L->n, w_d, 0, NULL), "weight launch");
	if (!rc)
		rc = x3_gpu_download(w, w_d, (size_t)(L->k * L->n) * sizeof(float));
	x3_gpu_free(w_d);
	return rc;
}

int x3_gpu_gemv_ksplit(int64_t k, int64_t n)
{
	return x3k_gemv_ksplit(k, n);
}
