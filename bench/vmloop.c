// SPDX-License-Identifier: GPL-2.0
/*
 * vmloop PATH N [stat]: open+close (or stat) PATH N times with raw syscalls,
 * then print "vmloop PATH N ok=K errno=E ns_per_call=T". A load generator
 * for bench/vm-lsm.sh, which reads the BPF programs' own counters; the
 * wall time it prints is TCG time, not a hardware figure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct timespec t0, t1;
	long n, ok = 0, i;
	int last = 0, use_stat;

	if (argc < 3) {
		fprintf(stderr, "usage: %s PATH N [stat]\n", argv[0]);
		return 2;
	}
	n = strtol(argv[2], NULL, 10);
	use_stat = argc > 3 && strcmp(argv[3], "stat") == 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < n; i++) {
		if (use_stat) {
			struct stat st;

			if (stat(argv[1], &st) == 0)
				ok++;
			else
				last = errno;
		} else {
			long fd = syscall(SYS_openat, AT_FDCWD, argv[1], O_RDONLY | O_NONBLOCK);

			if (fd >= 0) {
				ok++;
				close((int)fd);
			} else {
				last = errno;
			}
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("vmloop %s %ld ok=%ld errno=%d ns_per_call=%ld\n", argv[1], n, ok, last,
	       ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec)) / (n ? n : 1));
	return 0;
}
