// SPDX-License-Identifier: GPL-2.0
/*
 * openat latency harness (ARCHITECTURE.md#performance-budget; the method of Navin Srinivasan's
 * eBPF LSM hook profiling, seed 001).
 *
 *   openat PATH ITERATIONS [CPU [CGROUP_OFF CGROUP_ON]]
 *
 * Opens PATH (O_RDONLY) ITERATIONS times with the raw syscall (no libc
 * wrapper), closing each fd that opens, and times every call alone with
 * clock_gettime(CLOCK_MONOTONIC) (vDSO: no syscall of its own). Samples go to
 * a buffer that is mmap'd with MAP_POPULATE, mlock'ed and written once before
 * the loop, so no page fault lands inside it; nothing is printed until the
 * end. The first 10 % of the samples are dropped (warm-up). The process pins
 * itself to one CPU (CPU, default the last one) and asks for SCHED_FIFO 99;
 * where that is refused it runs on and says so.
 *
 * Prints one line of key=value pairs (path last):
 *   openat n=90000 result=EPERM p50_ns=… p90_ns=… p99_ns=… mean_ns=… min_ns=…
 *          clock_p50_ns=… cpu=1 fifo=1 mlock=1 path=/dev/null
 * `result` is what every open returned (ok, an errno name, or mixed);
 * `clock_p50_ns` is the median cost of one empty timing pair, already
 * included in every sample (the reader may subtract it).
 *
 * A/B mode (CGROUP_OFF and CGROUP_ON, two cgroup-v2 directories, gpuctl's
 * program attached to ON only): the same loop, but the process moves itself
 * (cgroup.procs, outside the timed region) between OFF and ON every 500
 * calls, so both arms share every moment of the run and whatever else the
 * machine does at that moment. The first 10 % of each arm is dropped. Prints
 *   openat_ab n=<per arm> off_result=… on_result=… off_p50_ns=… off_p90_ns=…
 *          off_p99_ns=… off_mean_ns=… on_p50_ns=… … clock_p50_ns=… cpu=… fifo=…
 *          mlock=… path=…
 * Exit status: 0, or 2 on bad usage / a setup failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted s[0..n). */
static uint32_t pct(const uint32_t *s, size_t n, double p)
{
	size_t k = (size_t)(p / 100.0 * (double)n + 0.999999);

	if (k < 1)
		k = 1;
	if (k > n)
		k = n;
	return s[k - 1];
}

/* One arm's samples and results. */
struct arm {
	uint32_t *d;
	size_t n;
	unsigned long long ok;
	int err, mixed;
};

static void record(struct arm *a, long fd, int e, uint32_t ns)
{
	if (fd >= 0) {
		a->ok++;
	} else if (a->err != e) {
		a->mixed |= a->err != 0;
		a->err = e;
	}
	a->d[a->n++] = ns;
}

/*
 * One measured call: raw openat between two clock reads, close outside the
 * timed window. Always inlined, so both the plain loop and the A/B loop time
 * exactly the same instructions.
 */
static inline __attribute__((always_inline)) void timed_open(struct arm *a, const char *path)
{
	uint64_t t0 = now_ns();
	long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
	uint64_t t1 = now_ns();
	int e = errno;

	if (fd >= 0)
		close((int)fd);
	record(a, fd, e, (uint32_t)(t1 - t0));
}

static const char *errname(int e)
{
	switch (e) {
	case EPERM:
		return "EPERM";
	case ENOENT:
		return "ENOENT";
	case ENXIO:
		return "ENXIO";
	case EACCES:
		return "EACCES";
	case ENODEV:
		return "ENODEV";
	default:
		return "other";
	}
}

static const char *result(const struct arm *a)
{
	if (a->mixed || (a->ok && a->err))
		return "mixed";
	return a->ok ? "ok" : errname(a->err);
}

/* Drops the first 10 %, sorts the rest; prints PREFIXp50_ns=… p90, p99, mean, min. */
static void report(const char *prefix, struct arm *a)
{
	size_t skip = a->n / 10, m = a->n - skip;
	uint32_t *s = a->d + skip;
	double sum = 0;

	for (size_t i = 0; i < m; i++)
		sum += s[i];
	qsort(s, m, sizeof(*s), cmp_u32);
	printf("%sp50_ns=%u %sp90_ns=%u %sp99_ns=%u %smean_ns=%.0f %smin_ns=%u ", prefix,
	       pct(s, m, 50), prefix, pct(s, m, 90), prefix, pct(s, m, 99), prefix, sum / (double)m,
	       prefix, s[0]);
}

static int open_procs(const char *cg)
{
	char p[4096];
	int fd;

	if (snprintf(p, sizeof(p), "%s/cgroup.procs", cg) >= (int)sizeof(p))
		return -1;
	fd = open(p, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		fprintf(stderr, "openat: %s: %s\n", p, strerror(errno));
	return fd;
}

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4 && argc != 6) {
		fprintf(stderr, "usage: %s PATH ITERATIONS [CPU [CGROUP_OFF CGROUP_ON]]\n",
			argv[0]);
		return 2;
	}
	const char *path = argv[1];
	char *end;
	unsigned long long n = strtoull(argv[2], &end, 10);

	if (*end || n < 10 || n > 100000000ull) {
		fprintf(stderr, "openat: ITERATIONS must be 10..100000000\n");
		return 2;
	}
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	long cpu = argc >= 4 ? strtol(argv[3], &end, 10) : ncpu - 1;

	if (argc >= 4 && (*end || cpu < 0)) {
		fprintf(stderr, "openat: bad CPU %s\n", argv[3]);
		return 2;
	}
	int ab = argc == 6;
	int cg_fd[2] = {-1, -1};
	char pid[32];
	int pid_len = snprintf(pid, sizeof(pid), "%d", (int)getpid());
	enum { BLOCK = 500 };

	if (ab) {
		cg_fd[0] = open_procs(argv[4]);
		cg_fd[1] = open_procs(argv[5]);
		if (cg_fd[0] < 0 || cg_fd[1] < 0)
			return 2;
		if (n < 4 * BLOCK) {
			fprintf(stderr, "openat: A/B needs at least %d iterations\n", 4 * BLOCK);
			return 2;
		}
		n -= n % (2 * BLOCK);
	}

	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET((int)cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0) {
		fprintf(stderr, "openat: pinning to CPU %ld: %s\n", cpu, strerror(errno));
		return 2;
	}
	struct sched_param sp = {.sched_priority = 99};
	int fifo = sched_setscheduler(0, SCHED_FIFO, &sp) == 0;

	size_t bytes = (size_t)n * sizeof(uint32_t);
	uint32_t *d = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (d == MAP_FAILED) {
		fprintf(stderr, "openat: mmap %zu bytes: %s\n", bytes, strerror(errno));
		return 2;
	}
	int locked = mlock(d, bytes) == 0;
	memset(d, 0xff, bytes); /* touch every page once */

	/* The cost of one empty timing pair (already inside every sample). */
	enum { NCLK = 10000 };
	static uint32_t clk[NCLK];
	for (int i = 0; i < NCLK; i++) {
		uint64_t t0 = now_ns();
		uint64_t t1 = now_ns();
		clk[i] = (uint32_t)(t1 - t0);
	}

	/* Arm 0 (OFF) fills the first half of the buffer, arm 1 (ON) the second. */
	struct arm arms[2] = {{.d = d}, {.d = d + n / 2}};
	if (!ab) {
		struct arm *a = &arms[0];
		for (unsigned long long i = 0; i < n; i++) {
			timed_open(a, path);
		}
	} else {
		for (unsigned long long b = 0; b < n / BLOCK; b++) {
			struct arm *a = &arms[b & 1];
			if (write(cg_fd[b & 1], pid, (size_t)pid_len) != pid_len) {
				fprintf(stderr, "openat: moving to %s: %s\n", argv[4 + (b & 1)],
					strerror(errno));
				return 2;
			}
			for (int i = 0; i < BLOCK; i++) {
				timed_open(a, path);
			}
		}
	}

	/* Back to normal scheduling before the (slow) reporting. */
	sp.sched_priority = 0;
	sched_setscheduler(0, SCHED_OTHER, &sp);
	qsort(clk, NCLK, sizeof(*clk), cmp_u32);

	if (!ab) {
		printf("openat n=%zu result=%s ", arms[0].n - arms[0].n / 10, result(&arms[0]));
		report("", &arms[0]);
	} else {
		printf("openat_ab n=%zu off_result=%s on_result=%s ", arms[0].n - arms[0].n / 10,
		       result(&arms[0]), result(&arms[1]));
		report("off_", &arms[0]);
		report("on_", &arms[1]);
	}
	printf("clock_p50_ns=%u cpu=%ld fifo=%d mlock=%d path=%s\n", pct(clk, NCLK, 50), cpu, fifo,
	       locked, path);
	return 0;
}
