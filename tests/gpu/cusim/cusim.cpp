/* cusim.cpp: the execution core of cusim (see cusim.h and
 * tests/gpu/README.md): kernel launches run block by block, each block's
 * threads as fibers of the calling OS thread.
 *
 * Scheduling. A block's threads run in a chosen order (X3SIM_ORDER=fwd,
 * rev or rand[:seed]; rand draws a new permutation at every barrier) until
 * each reaches __syncthreads or exits; then all are released. Warp
 * collectives are warp barriers: each lane deposits its value and waits
 * until every lane named in the mask has arrived, then reads. Atomics are
 * plain read-modify-writes (one OS thread, switches only at barriers).
 * Running the same test under two orders finds order-dependent races
 * (results that depend on which thread writes first between two barriers),
 * not all races: two threads that both run between the same barriers in
 * every order, or a missing barrier between a write and a read of the same
 * thread order, go unnoticed. Blocks run one at a time, in index order or
 * (X3SIM_BLOCKS=rev or rand[:seed]) reversed or shuffled per launch, so
 * that code which picks "the last block to finish" (the fused GEMV) gets
 * a different finisher.
 *
 * __syncthreads semantics: threads that have exited count as arrived (as
 * on sm_70 and later). All waiting threads must be at the same
 * __syncthreads (same file and line), else "barrier divergence". A warp
 * collective whose mask names a lane that exited, or lanes at different
 * collectives, is an error; threads waiting forever are a deadlock.
 *
 * Errors a GPU would report (cudaError_t, sticky like on a device; the
 * emulator also prints one line to stderr saying where): out-of-bounds
 * accesses that hit the guard page after each cudaMalloc allocation or
 * after the dynamic shared memory (cudaErrorIllegalAddress), stack
 * overflow of an emulated thread (guard page, cudaErrorIllegalAddress),
 * barrier divergence, deadlock and misused warp collectives
 * (cudaErrorLaunchFailure). */
#include <cuda_runtime.h>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include "cusim.h"
#include "cusim_rt.h"

extern char __start_x3sim_shared[] __attribute__((weak));
extern char __stop_x3sim_shared[] __attribute__((weak));

namespace cusim {

Thread *cur;
uint3 cur_block;
dim3 cur_bdim, cur_gdim;
void *dyn_smem;

enum { T_READY, T_BAR, T_WARP, T_EXIT };

struct Fiber {
	Thread t;
	int state;
	const char *site_file;
	int site_line;
#if defined(__x86_64__)
	void *sp;
#else
	ucontext_t uc;
#endif
	char *stack;   /* lowest usable byte (a guard page below) */
};

struct Warp {
	uint64_t slot[2][32];
	int waiting;             /* lanes at the current warp barrier */
	unsigned mask;
	const char *file, *what;
	int line;
};

static size_t page;
static size_t stack_bytes = 64 * 1024;
static char *stack_area;
static size_t stack_area_bytes;
static Fiber *fibers;
static Warp warps[32];
static int nthreads;
static std::vector<int> order, queue;
static size_t qhead;
static void (*body_fn)(void *);
static void *body_ctx;
static sigjmp_buf launch_jb;
static int launch_err;
static std::string launch_msg;
static bool in_kernel;
static int order_mode;   /* 0 fwd, 1 rev, 2 rand */
static uint64_t rng_state;
static char *smem_buf;   /* dynamic shared memory mapping */
static size_t smem_map_bytes;
static uint64_t n_switch;

#if defined(__x86_64__)
static void *main_sp;
extern "C" void cusim_switch(void **save_sp, void *to_sp);
extern "C" void cusim_trampoline();
/* save the callee-saved registers, MXCSR and the x87 control word on the
 * current stack, store rsp in *save_sp, load to_sp and restore */
asm(".text\n"
    ".globl cusim_switch\n"
    ".type cusim_switch,@function\n"
    "cusim_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cusim_switch,.-cusim_switch\n"
    ".globl cusim_trampoline\n"
    ".type cusim_trampoline,@function\n"
    "cusim_trampoline:\n"
    "  andq $-16, %rsp\n  call cusim_fiber_main@PLT\n  ud2\n"
    ".size cusim_trampoline,.-cusim_trampoline\n");
static uint32_t init_csr[2];
#else
static ucontext_t main_uc;
#endif

static inline void to_main(Fiber *f)
{
	n_switch++;
#if defined(__x86_64__)
	cusim_switch(&f->sp, main_sp);
#else
	swapcontext(&f->uc, &main_uc);
#endif
}

static inline void to_fiber(Fiber *f)
{
	cur = &f->t;
#if defined(__x86_64__)
	cusim_switch(&main_sp, f->sp);
#else
	swapcontext(&main_uc, &f->uc);
#endif
}

extern "C" void cusim_fiber_main()
{
	Fiber *f = (Fiber *)cur;   /* t is the first member */
	body_fn(body_ctx);
	f->state = T_EXIT;
	to_main(f);
	abort();   /* never resumed */
}

#if !defined(__x86_64__)
static void fiber_entry_uc() { cusim_fiber_main(); }
#endif

static void fiber_init(Fiber *f)
{
#if defined(__x86_64__)
	uint64_t *sp = (uint64_t *)(f->stack + stack_bytes);
	*--sp = 0;                                  /* alignment */
	*--sp = (uint64_t)(uintptr_t)cusim_trampoline;   /* ret */
	for (int i = 0; i < 6; i++)
		*--sp = 0;                              /* rbp rbx r12 r13 r14 r15 */
	*--sp = (uint64_t)init_csr[0] | (uint64_t)init_csr[1] << 32;   /* mxcsr, fpu cw */
	f->sp = sp;
#else
	getcontext(&f->uc);
	f->uc.uc_stack.ss_sp = f->stack;
	f->uc.uc_stack.ss_size = stack_bytes;
	f->uc.uc_link = NULL;
	makecontext(&f->uc, fiber_entry_uc, 0);
#endif
}

/* ---- errors ---------------------------------------------------------------- */

static std::string where()
{
	char b[160];
	if (!cur)
		return "";
	snprintf(b, sizeof b, "block (%u,%u,%u) thread (%u,%u,%u)", cur_block.x, cur_block.y,
	         cur_block.z, cur->tid.x, cur->tid.y, cur->tid.z);
	return b;
}

[[noreturn]] static void abort_launch(int code, const std::string &msg)
{
	launch_err = code;
	launch_msg = msg;
	siglongjmp(launch_jb, 1);
}

void fail(int code, const char *fmt, ...)
{
	char b[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b, sizeof b, fmt, ap);
	va_end(ap);
	if (!in_kernel) {
		fprintf(stderr, "cusim: %s\n", b);
		abort();
	}
	abort_launch(code, std::string(b) + " (" + where() + ")");
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	char *a = (char *)si->si_addr;
	if (!in_kernel) {   /* not ours: the default action */
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	std::string what;
	if (stack_area && a >= stack_area && a < stack_area + stack_area_bytes &&
	    (size_t)(a - stack_area) % (stack_bytes + page) < page)
		what = "stack overflow of an emulated thread (X3SIM_STACK=" +
		       std::to_string(stack_bytes / 1024) + "K)";
	else if (smem_buf && a >= smem_buf + smem_map_bytes - page && a < smem_buf + smem_map_bytes)
		what = "access beyond the requested dynamic shared memory";
	else
		what = rt_describe_address(a);
	char b[96];
	snprintf(b, sizeof b, "illegal address %p: ", (void *)a);
	abort_launch(cudaErrorIllegalAddress, b + what + " (" + where() + ")");
}

/* ---- barriers -------------------------------------------------------------- */

static uint64_t rng_next()
{
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static void make_order()
{
	order.resize(nthreads);
	for (int i = 0; i < nthreads; i++)
		order[i] = order_mode == 1 ? nthreads - 1 - i : i;
	if (order_mode == 2)
		for (int i = nthreads - 1; i > 0; i--) {
			int j = (int)(rng_next() % (uint64_t)(i + 1));
			std::swap(order[i], order[j]);
		}
}

void bar_sync(const char *file, int line)
{
	Fiber *f = (Fiber *)cur;
	f->state = T_BAR;
	f->site_file = file;
	f->site_line = line;
	to_main(f);
}

const uint64_t *warp_exchange(unsigned mask, uint64_t mine, const char *what, const char *file,
                              int line)
{
	Fiber *f = (Fiber *)cur;
	Thread &t = f->t;
	Warp &w = warps[t.warp];
	const int b = t.wseq++ & 1;
	if (!(mask >> t.lane & 1))
		fail(cudaErrorLaunchFailure, "%s at %s:%d: the calling lane %d is not in mask %#x", what,
		     file, line, t.lane, mask);
	w.slot[b][t.lane] = mine;
	if (w.waiting == 0) {
		w.mask = mask;
		w.file = file;
		w.line = line;
		w.what = what;
	} else if (w.mask != mask || w.line != line || strcmp(w.file, file))
		fail(cudaErrorLaunchFailure, "warp divergence: lane %d at %s (%s:%d, mask %#x) while "
		     "other lanes are at %s (%s:%d, mask %#x)", t.lane, what, file, line, mask, w.what,
		     w.file, w.line, w.mask);
	/* lanes the mask names must exist and be alive */
	int need = 0;
	const int base = t.warp * 32;
	for (int l = 0; l < 32; l++)
		if (mask >> l & 1) {
			if (base + l >= nthreads)
				fail(cudaErrorLaunchFailure, "%s at %s:%d: mask %#x names lane %d, which the "
				     "block does not have", what, file, line, mask, l);
			if (fibers[base + l].state == T_EXIT)
				fail(cudaErrorLaunchFailure, "%s at %s:%d: mask %#x names lane %d, which has "
				     "exited", what, file, line, mask, l);
			need++;
		}
	if (++w.waiting < need) {
		f->state = T_WARP;
		to_main(f);
	} else {
		/* the last lane: release the others (in the block's order) */
		w.waiting = 0;
		for (int i : order)
			if (i / 32 == t.warp && fibers[i].state == T_WARP && (mask >> (i & 31) & 1)) {
				fibers[i].state = T_READY;
				queue.push_back(i);
			}
	}
	return w.slot[b];
}

/* ---- launch ---------------------------------------------------------------- */

static bool order_chosen;

bool set_order(const char *o)
{
	order_chosen = true;
	if (!o || !*o || !strcmp(o, "fwd"))
		order_mode = 0;
	else if (!strcmp(o, "rev"))
		order_mode = 1;
	else if (!strncmp(o, "rand", 4) && (o[4] == 0 || o[4] == ':')) {
		order_mode = 2;
		rng_state = o[4] == ':' ? strtoull(o + 5, NULL, 0) : 1;
	} else
		return false;
	return true;
}

static void setup_once()
{
	static bool done;
	if (done)
		return;
	done = true;
	page = (size_t)sysconf(_SC_PAGESIZE);
	if (const char *s = getenv("X3SIM_STACK")) {
		char *end;
		unsigned long v = strtoul(s, &end, 10);
		if (*end == 'K' || *end == 'k')
			v *= 1024;
		if (v >= 16 * 1024)
			stack_bytes = (v + page - 1) / page * page;
	}
	if (!order_chosen && !set_order(getenv("X3SIM_ORDER"))) {
		fprintf(stderr, "cusim: X3SIM_ORDER=%s: expected fwd, rev or rand[:SEED]\n",
		        getenv("X3SIM_ORDER"));
		exit(2);
	}
	stack_area_bytes = 1024 * (stack_bytes + page);
	stack_area = (char *)mmap(NULL, stack_area_bytes, PROT_READ | PROT_WRITE,
	                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (stack_area == MAP_FAILED) {
		perror("cusim: mmap thread stacks");
		abort();
	}
	for (int i = 0; i < 1024; i++)
		mprotect(stack_area + (size_t)i * (stack_bytes + page), page, PROT_NONE);
	fibers = new Fiber[1024];
	for (int i = 0; i < 1024; i++)
		fibers[i].stack = stack_area + (size_t)i * (stack_bytes + page) + page;
	static char altstack[64 * 1024];
	stack_t ss = {};
	ss.ss_sp = altstack;
	ss.ss_size = sizeof altstack;
	sigaltstack(&ss, NULL);
	struct sigaction sa = {};
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);
#if defined(__x86_64__)
	asm volatile("stmxcsr %0" : "=m"(init_csr[0]));
	asm volatile("fnstcw %0" : "=m"(init_csr[1]));
	init_csr[1] &= 0xffff;
#endif
}

/* dynamic shared memory: `bytes` at the end of a mapping, a guard page after */
static void smem_setup(size_t bytes)
{
	const size_t need = (bytes + page - 1) / page * page + page;
	if (need > smem_map_bytes) {
		if (smem_buf)
			munmap(smem_buf, smem_map_bytes);
		smem_buf = (char *)mmap(NULL, need, PROT_READ | PROT_WRITE,
		                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (smem_buf == MAP_FAILED) {
			perror("cusim: mmap shared memory");
			abort();
		}
		smem_map_bytes = need;
		mprotect(smem_buf + need - page, page, PROT_NONE);
	}
	const size_t rounded = (bytes + 15) / 16 * 16;
	dyn_smem = smem_buf + smem_map_bytes - page - rounded;
}

static void run_block()
{
	const uint3 bd = {cur_bdim.x, cur_bdim.y, cur_bdim.z};
	for (int i = 0; i < nthreads; i++) {
		Fiber &f = fibers[i];
		f.t.tid = {(unsigned)i % bd.x, (unsigned)i / bd.x % bd.y, (unsigned)i / (bd.x * bd.y)};
		f.t.lin = i;
		f.t.lane = i & 31;
		f.t.warp = i >> 5;
		f.t.wseq = 0;
		f.state = T_READY;
		f.site_file = NULL;
		f.site_line = 0;
		fiber_init(&f);
	}
	memset(warps, 0, sizeof warps);
	/* shared memory is not initialized: poison it (NaN floats) */
	char *s0 = __start_x3sim_shared, *s1 = __stop_x3sim_shared;
	if (s0 && s1 > s0)
		memset(s0, 0xff, (size_t)(s1 - s0));
	if (dyn_smem)
		memset(dyn_smem, 0xff, (size_t)(smem_buf + smem_map_bytes - page - (char *)dyn_smem));
	make_order();
	queue.assign(order.begin(), order.end());
	qhead = 0;
	for (;;) {
		while (qhead < queue.size()) {
			Fiber *f = &fibers[queue[qhead++]];
			to_fiber(f);
		}
		queue.clear();
		qhead = 0;
		int live = 0, at_warp = -1;
		const Fiber *site = NULL;
		for (int i = 0; i < nthreads; i++) {
			const Fiber &f = fibers[i];
			if (f.state == T_EXIT)
				continue;
			live++;
			if (f.state == T_WARP && at_warp < 0)
				at_warp = i;
			if (f.state == T_BAR && !site)
				site = &f;
		}
		if (!live)
			return;
		if (at_warp >= 0) {
			cur = &fibers[at_warp].t;
			const Warp &w = warps[at_warp >> 5];
			fail(cudaErrorLaunchFailure, "deadlock: lane waits at %s (%s:%d, mask %#x) for lanes "
			     "that are at __syncthreads or exited", w.what, w.file, w.line, w.mask);
		}
		for (int i = 0; i < nthreads; i++) {
			const Fiber &f = fibers[i];
			if (f.state == T_BAR && (f.site_line != site->site_line ||
			                         strcmp(f.site_file, site->site_file))) {
				cur = (Thread *)&f.t;
				fail(cudaErrorLaunchFailure, "barrier divergence: __syncthreads at %s:%d while "
				     "thread (%u,%u,%u) waits at %s:%d", f.site_file, f.site_line,
				     site->t.tid.x, site->t.tid.y, site->t.tid.z, site->site_file,
				     site->site_line);
			}
		}
		if (order_mode == 2)
			make_order();
		for (int i : order)
			if (fibers[i].state == T_BAR) {
				fibers[i].state = T_READY;
				queue.push_back(i);
			}
	}
}

/* Block order (X3SIM_BLOCKS=fwd|rev|rand[:SEED], read at every launch so
 * that a test may setenv it between launches): blocks still run one after
 * another, in linear index order, reversed, or a new random permutation
 * per launch (from its own generator, independent of X3SIM_ORDER). */
static int border_mode;   /* 0 fwd, 1 rev, 2 rand */
static uint64_t border_rng;
static std::string border_env;
static std::vector<uint64_t> border;

static void block_order_setup(uint64_t nb)
{
	const char *e = getenv("X3SIM_BLOCKS");
	const std::string v = e ? e : "";
	if (v != border_env) {
		border_env = v;
		if (v.empty() || v == "fwd")
			border_mode = 0;
		else if (v == "rev")
			border_mode = 1;
		else if (!strncmp(v.c_str(), "rand", 4) && (v.size() == 4 || v[4] == ':')) {
			border_mode = 2;
			border_rng = v.size() > 5 ? strtoull(v.c_str() + 5, NULL, 0) : 1;
		} else {
			fprintf(stderr, "cusim: X3SIM_BLOCKS=%s: expected fwd, rev or rand[:SEED]\n",
			        v.c_str());
			exit(2);
		}
	}
	if (border_mode != 2)
		return;
	border.resize(nb);
	for (uint64_t i = 0; i < nb; i++)
		border[i] = i;
	for (uint64_t i = nb; i > 1; i--) {
		uint64_t z = (border_rng += 0x9E3779B97F4A7C15ull);
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
		z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
		z ^= z >> 31;
		std::swap(border[i - 1], border[z % i]);
	}
}

bool arg_ok(const void *p) { return rt_is_device(p, 0); }

void arg_error(const char *name, int i, const void *p)
{
	std::lock_guard<std::recursive_mutex> lock(rt_lock());
	char b[512];
	snprintf(b, sizeof b, "%s: argument %d (%p) is not device memory", name, i + 1, p);
	fprintf(stderr, "cusim: %s\n", b);
	rt_set_sticky(cudaErrorIllegalAddress, b);
}

int launch(const void *func, const char *name, dim3 grid, dim3 block, size_t smem,
           cudaStream_t stream, void (*body)(void *), void *ctx)
{
	std::lock_guard<std::recursive_mutex> lock(rt_lock());
	setup_once();
	int rc = rt_check_launch(func, grid, block, smem, stream);
	if (rc)
		return rc;
	if (rt_sticky())   /* a device with a sticky error runs nothing */
		return 0;
	const uint64_t nb = (uint64_t)grid.x * grid.y * grid.z;
	nthreads = (int)(block.x * block.y * block.z);
	body_fn = body;
	body_ctx = ctx;
	cur_bdim = block;
	cur_gdim = grid;
	dyn_smem = NULL;
	if (smem)
		smem_setup(smem);
	block_order_setup(nb);
	in_kernel = true;
	launch_err = 0;
	if (sigsetjmp(launch_jb, 1) == 0) {
		for (uint64_t bi = 0; bi < nb; bi++) {
			const uint64_t b = border_mode == 0 ? bi : border_mode == 1 ? nb - 1 - bi : border[bi];
			cur_block = {(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
			             (unsigned)(b / ((uint64_t)grid.x * grid.y))};
			run_block();
		}
	}
	in_kernel = false;
	cur = NULL;
	if (launch_err) {
		std::string m = std::string(name) + ": " + launch_msg;
		fprintf(stderr, "cusim: %s\n", m.c_str());
		rt_set_sticky(launch_err, m.c_str());
	}
	return 0;
}

uint64_t switches() { return n_switch; }

} /* namespace cusim */
