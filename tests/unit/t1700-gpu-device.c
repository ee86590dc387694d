/* t1700-gpu-device: --device parsing and resolution, loading the backend
 * object (device.h), and the behaviour of its entry points without a
 * device (X3_EUNSUP, no crash) or of the loader without the object (a
 * message naming it). Runs everywhere; on a machine with a GPU it also
 * checks that "auto" picks it and that a trivial round trip through
 * device memory works. */
#include <math.h>
#include "gpu-test.h"

int main(void)
{
	int dev = -1;
	CHECK_OK(x3_device_parse("cpu", &dev), "parse cpu");
	CHECK(dev == X3_DEVICE_CPU, "cpu -> X3_DEVICE_CPU");
	CHECK_OK(x3_device_parse("cuda", &dev), "parse cuda");
	CHECK(dev == X3_DEVICE_CUDA, "cuda -> X3_DEVICE_CUDA");
	CHECK_OK(x3_device_parse("auto", &dev), "parse auto");
	CHECK(dev == X3_DEVICE_AUTO, "auto -> X3_DEVICE_AUTO");
	CHECK(x3_device_parse("tpu", &dev) == X3_EINVAL && strstr(x3_errmsg(), "'tpu'"),
	      "unknown device refused, message names it (%s)", x3_errmsg());
	CHECK(!strcmp(x3_device_name(X3_DEVICE_CUDA), "cuda"), "device name");

	gpu_test_backend_env();
	const int loaded = x3_gpu_load(&G) == X3_OK;
	if (loaded)
		CHECK(strstr(x3_gpu_path(), "libexl3kit-cuda.so") && G->abi == X3_GPU_ABI &&
		      G->size == sizeof *G, "backend %s loaded (%s, ABI %d)", x3_gpu_path(), G->name,
		      G->abi);
	else
		CHECK(strstr(x3_errmsg(), "no CUDA backend") && strstr(x3_errmsg(), "libexl3kit-cuda.so"),
		      "no backend object: the message names it (%s)", x3_errmsg());
	const int avail = x3_gpu_available();
	printf("# x3_gpu_available() = %d%s%s\n", avail, avail ? "" : ": ", avail ? "" : x3_errmsg());
	CHECK_OK(x3_device_resolve(X3_DEVICE_CPU, &dev), "resolve cpu");
	CHECK(dev == X3_DEVICE_CPU, "cpu stays cpu");
	CHECK_OK(x3_device_resolve(X3_DEVICE_AUTO, &dev), "resolve auto");
	CHECK(dev == (avail ? X3_DEVICE_CUDA : X3_DEVICE_CPU), "auto -> %s", x3_device_name(dev));
	int rc = x3_device_resolve(X3_DEVICE_CUDA, &dev);
	if (avail)
		CHECK(rc == X3_OK && dev == X3_DEVICE_CUDA, "resolve cuda with a device");
	else
		CHECK(rc == X3_EUNSUP && strstr(x3_errmsg(), "cuda"),
		      "cuda without a device -> X3_EUNSUP (%s)", x3_errmsg());
	CHECK(x3_device_select("bogus", &dev) == X3_EINVAL, "select refuses a bad name");

	if (!loaded) {
		const x3_gpu *g = (const x3_gpu *)1;
		CHECK(x3_gpu_open(&g) == X3_EUNSUP && g == NULL, "open without the object: X3_EUNSUP");
		CHECK(x3_gpu_load(&g) == X3_EUNSUP && strstr(x3_errmsg(), "libexl3kit-cuda.so"),
		      "a second load gives the same answer (%s)", x3_errmsg());
		TEST_DONE();
	}
	char desc[256];
	rc = G->describe(desc, sizeof desc);
	CHECK(avail ? rc == X3_OK : rc == X3_EUNSUP, "describe: %s", avail ? desc : "no device");

	if (!avail) {
		const x3_gpu *g = (const x3_gpu *)1;
		CHECK(x3_gpu_open(&g) == X3_EUNSUP && g == NULL && strstr(x3_errmsg(), x3_gpu_path()),
		      "open without a device: X3_EUNSUP naming the backend (%s)", x3_errmsg());
		float x[256] = {0};
		uint16_t st[256];
		CHECK(G->viterbi_encode(2, 0, x, 1, st, NULL) == X3_EUNSUP,
		      "viterbi without a device -> X3_EUNSUP (%s)", x3_errmsg());
		uint16_t tr[16 * 2] = {0};
		float w[256];
		CHECK(G->trellis_decode(2, 0, tr, 16, 16, w) == X3_EUNSUP,
		      "decode without a device -> X3_EUNSUP");
		x3_gpu_linear *L = (x3_gpu_linear *)1;
		uint16_t h[128] = {0};
		CHECK(G->linear_create(2, 0, 128, 128, tr, h, h, NULL, &L) != X3_OK && L == NULL,
		      "linear without a device fails cleanly (%s)", x3_errmsg());
		x3_gpu_hessian *H = (x3_gpu_hessian *)1;
		CHECK(G->hessian_create(128, &H) == X3_EUNSUP && H == NULL,
		      "hessian without a device -> X3_EUNSUP");
		void *p = (void *)1;
		CHECK(G->alloc(&p, 16) != X3_OK && p == NULL, "alloc without a device fails");
		TEST_DONE();
	}

	float a[1000], b[1000];
	for (int i = 0; i < 1000; i++)
		a[i] = (float)i * 0.5f - 7.0f;
	void *d = NULL;
	CHECK_OK(G->alloc(&d, sizeof a), "alloc");
	CHECK_OK(G->upload(d, a, sizeof a), "upload");
	memset(b, 0, sizeof b);
	CHECK_OK(G->download(b, d, sizeof b), "download");
	CHECK(!memcmp(a, b, sizeof a), "round trip through device memory");
	G->free(d);
	size_t fr = 0, tot = 0;
	CHECK_OK(G->meminfo(&fr, &tot), "meminfo");
	CHECK(tot > 0 && fr <= tot, "meminfo %zu of %zu bytes free", fr, tot);
	float x[256] = {0};
	uint16_t st[256];
	CHECK(G->viterbi_encode(9, 0, x, 1, st, NULL) == X3_EINVAL, "K=9 refused");
	CHECK(G->viterbi_encode(2, 3, x, 1, st, NULL) == X3_EINVAL, "codebook 3 refused");
	float w[256];
	CHECK(G->trellis_decode(2, 0, (uint16_t *)x, 16, 24, w) == X3_EINVAL,
	      "decode of 16x24 refused (%s)", x3_errmsg());
	TEST_DONE();
}
