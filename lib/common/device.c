/* device.c: the --device values, and the loader of the GPU backend object
 * (device.h): dlopen on first use, one table of function pointers. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"

/* ---- device selection ------------------------------------------------ */

int x3_device_parse(const char *s, int *dev)
{
	if (!s)
		return x3_err(X3_EINVAL, "missing device name (cpu, cuda or auto)");
	if (!strcmp(s, "cpu"))
		*dev = X3_DEVICE_CPU;
	else if (!strcmp(s, "cuda") || !strcmp(s, "gpu"))
		*dev = X3_DEVICE_CUDA;
	else if (!strcmp(s, "auto"))
		*dev = X3_DEVICE_AUTO;
	else
		return x3_err(X3_EINVAL, "unknown device '%s' (cpu, cuda or auto)", s);
	return X3_OK;
}

const char *x3_device_name(int dev)
{
	return dev == X3_DEVICE_CPU ? "cpu" : dev == X3_DEVICE_CUDA ? "cuda" :
	       dev == X3_DEVICE_AUTO ? "auto" : "?";
}

int x3_device_resolve(int want, int *dev)
{
	switch (want) {
	case X3_DEVICE_CPU:
		*dev = X3_DEVICE_CPU;
		return X3_OK;
	case X3_DEVICE_CUDA:
		if (!x3_gpu_available())
			return x3_errprefix(X3_EUNSUP, "device cuda");
		*dev = X3_DEVICE_CUDA;
		return X3_OK;
	case X3_DEVICE_AUTO:
		*dev = x3_gpu_available() ? X3_DEVICE_CUDA : X3_DEVICE_CPU;
		return X3_OK;
	default:
		return x3_err(X3_EINVAL, "bad device id %d", want);
	}
}

int x3_device_select(const char *s, int *dev)
{
	int want, rc = x3_device_parse(s, &want);
	return rc ? rc : x3_device_resolve(want, dev);
}

/* ---- the backend object -------------------------------------------------- */

#define OBJECT "libexl3kit-cuda.so"
#ifndef X3_LIBEXECDIR
#define X3_LIBEXECDIR "/usr/local/libexec/exl3kit"
#endif

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const x3_gpu *table;        /* the loaded table, or NULL */
static char load_path[PATH_MAX];   /* the object tried (loaded if table) */
static char load_msg[1024];        /* why not, if not */

static const struct x3_gpu_host host = {
	.abi = X3_GPU_ABI,
	.err = x3_err,
	.errprefix = x3_errprefix,
	.f16_to_f32 = x3_f16_to_f32,
};

/* dlopen path and take its table; else the reason into load_msg */
static void open_object(const char *path)
{
	snprintf(load_path, sizeof load_path, "%s", path);
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		/* dlerror names the object itself, or the library it lacks */
		const char *why = dlerror();
		if (!why)
			why = "dlopen failed";
		if (!strncmp(why, path, strlen(path)))
			snprintf(load_msg, sizeof load_msg, "no CUDA backend: %s", why);
		else
			snprintf(load_msg, sizeof load_msg, "no CUDA backend: %s: %s", path, why);
		return;
	}
	x3_gpu_entry_fn entry;
	*(void **)&entry = dlsym(h, X3_GPU_ENTRY);
	const x3_gpu *g = entry ? entry(&host) : NULL;
	if (!entry)
		snprintf(load_msg, sizeof load_msg, "no CUDA backend: %s: no function %s (not an "
		         "exl3kit backend)", path, X3_GPU_ENTRY);
	else if (!g)
		snprintf(load_msg, sizeof load_msg, "no CUDA backend: %s: %s() refused this program "
		         "(ABI %d)", path, X3_GPU_ENTRY, X3_GPU_ABI);
	else if (g->abi != X3_GPU_ABI || g->size != sizeof *g)
		snprintf(load_msg, sizeof load_msg, "no CUDA backend: %s: ABI %d with a %zu-byte table, "
		         "this program wants ABI %d with %zu bytes (rebuild one of them)", path, g->abi,
		         g->size, X3_GPU_ABI, sizeof *g);
	else {
		table = g;
		return;
	}
	dlclose(h);
}

static void load(void)
{
	const char *env = getenv("EXL3KIT_BACKEND");
	if (env && *env) {
		open_object(env);
		return;
	}
	char cand[2][PATH_MAX], exe[PATH_MAX];
	int nc = 0;
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n > 0) {
		exe[n] = 0;
		char *slash = strrchr(exe, '/');
		if (slash) {
			*slash = 0;
			snprintf(cand[nc++], PATH_MAX, "%s/../lib/" OBJECT, exe);
		}
	}
	snprintf(cand[nc++], PATH_MAX, "%s/" OBJECT, X3_LIBEXECDIR);
	for (int i = 0; i < nc; i++) {
		char *real = realpath(cand[i], NULL);   /* NULL: not there */
		if (real) {
			open_object(real);
			free(real);
			return;
		}
	}
	if (nc == 2)
		snprintf(load_msg, sizeof load_msg, "no CUDA backend: neither %s nor %s exists (a build "
		         "without CUDA; EXL3KIT_BACKEND may name one)", cand[0], cand[1]);
	else
		snprintf(load_msg, sizeof load_msg, "no CUDA backend: %s does not exist (a build "
		         "without CUDA; EXL3KIT_BACKEND may name one)", cand[0]);
}

int x3_gpu_load(const x3_gpu **g)
{
	pthread_once(&load_once, load);
	*g = table;
	return table ? X3_OK : x3_err(X3_EUNSUP, "%s", load_msg);
}

const char *x3_gpu_path(void)
{
	return table ? load_path : "";
}

int x3_gpu_open(const x3_gpu **g)
{
	int rc = x3_gpu_load(g);
	if (rc)
		return rc;
	if (!(*g)->available()) {
		char why[1024];
		snprintf(why, sizeof why, "%s", x3_errmsg());
		*g = NULL;
		return x3_err(X3_EUNSUP, "%s (backend %s)", why, load_path);
	}
	return X3_OK;
}

int x3_gpu_available(void)
{
	const x3_gpu *g;
	return x3_gpu_open(&g) == X3_OK;
}
