// SPDX-License-Identifier: GPL-2.0
/*
 * Runs a command N times, one after the other, and times each run.
 *
 *   spawn N CPU CMD [ARGS…]
 *
 * Each run is fork() + execv(CMD) + waitpid(), timed from just before the
 * fork to just after the wait with CLOCK_MONOTONIC: the wall time a shell
 * user sees for one command, process creation included. CMD must be a path
 * (no PATH search, so the loop does not time lookups). The child's stdin,
 * stdout and stderr are /dev/null. CPU >= 0 pins this process (and so every
 * child) to that CPU; -1 leaves scheduling alone.
 *
 * Prints one line: spawn n=… fails=… first_fail=… total_ns=… p50_ns=… min_ns=… max_ns=…
 * followed, with SPAWN_ALL=1 in the environment, by one line per run (ns).
 * `fails` counts runs that did not exit 0. Exit status 0, or 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s N CPU CMD [ARGS...]\n", argv[0]);
		return 2;
	}
	char *end;
	long n = strtol(argv[1], &end, 10);

	if (*end || n < 1 || n > 10000000) {
		fprintf(stderr, "spawn: N must be 1..10000000\n");
		return 2;
	}
	long cpu = strtol(argv[2], &end, 10);
	if (*end || cpu < -1) {
		fprintf(stderr, "spawn: bad CPU %s\n", argv[2]);
		return 2;
	}
	if (cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET((int)cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set) != 0) {
			fprintf(stderr, "spawn: pinning to CPU %ld: %s\n", cpu, strerror(errno));
			return 2;
		}
	}
	char **cmd = argv + 3;
	if (access(cmd[0], X_OK) != 0) {
		fprintf(stderr, "spawn: %s: %s\n", cmd[0], strerror(errno));
		return 2;
	}
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (devnull < 0) {
		fprintf(stderr, "spawn: /dev/null: %s\n", strerror(errno));
		return 2;
	}
	uint64_t *d = calloc((size_t)n, sizeof(*d));
	if (!d) {
		fprintf(stderr, "spawn: out of memory\n");
		return 2;
	}

	long fails = 0;
	int first_fail = 0;
	uint64_t total = 0;
	for (long i = 0; i < n; i++) {
		uint64_t t0 = now_ns();
		pid_t pid = fork();
		if (pid == 0) {
			dup2(devnull, 0);
			dup2(devnull, 1);
			dup2(devnull, 2);
			execve(cmd[0], cmd, environ);
			_exit(127);
		}
		if (pid < 0) {
			fprintf(stderr, "spawn: fork: %s\n", strerror(errno));
			return 2;
		}
		int st;
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		uint64_t t1 = now_ns();
		d[i] = t1 - t0;
		total += d[i];
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			if (!fails)
				first_fail = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
			fails++;
		}
	}

	const char *all = getenv("SPAWN_ALL");
	if (all && strcmp(all, "1") == 0)
		for (long i = 0; i < n; i++)
			printf("%llu\n", (unsigned long long)d[i]);
	uint64_t *s = malloc((size_t)n * sizeof(*s));
	if (!s)
		return 2;
	memcpy(s, d, (size_t)n * sizeof(*s));
	qsort(s, (size_t)n, sizeof(*s), cmp_u64);
	printf("spawn n=%ld fails=%ld first_fail=%d total_ns=%llu p50_ns=%llu min_ns=%llu "
	       "max_ns=%llu\n",
	       n, fails, first_fail, (unsigned long long)total, (unsigned long long)s[(n - 1) / 2],
	       (unsigned long long)s[0], (unsigned long long)s[n - 1]);
	return 0;
}
