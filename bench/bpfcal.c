// SPDX-License-Identifier: GPL-2.0
/*
 * The floor of bpf_stats on this machine: what `run_time_ns / run_cnt` says
 * for a cgroup/dev program that does nothing (`r0 = 1; exit`).
 *
 *   bpfcal CGROUP_DIR PATH ITERATIONS CPU
 *
 * Loads that two-instruction program, links it to CGROUP_DIR (a bpf_link:
 * it is detached when this process exits, however it exits), pins itself to
 * CPU and opens PATH (a char device, so the program runs) ITERATIONS times
 * with the raw syscall, then prints the program's own counters:
 *
 *   bpfcal run_cnt=… run_time_ns=… ns_per_run=…
 *
 * Run it inside CGROUP_DIR with kernel.bpf_stats_enabled=1. The figure is
 * the cost of the kernel's stats bracket (two sched_clock() reads and the
 * counter update) plus an empty program's call: a gpuctl program's
 * run_time_ns/run_cnt minus this is what its own instructions cost.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static long sys_bpf(int cmd, union bpf_attr *attr)
{
	return syscall(SYS_bpf, cmd, attr, sizeof(*attr));
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s CGROUP_DIR PATH ITERATIONS CPU\n", argv[0]);
		return 2;
	}
	long n = strtol(argv[3], NULL, 10);
	int cpu = atoi(argv[4]);
	struct bpf_insn insns[] = {
	    {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = 1},
	    {.code = BPF_JMP | BPF_EXIT},
	};
	union bpf_attr a;

	memset(&a, 0, sizeof(a));
	a.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
	a.expected_attach_type = BPF_CGROUP_DEVICE;
	a.insns = (uintptr_t)insns;
	a.insn_cnt = 2;
	a.license = (uintptr_t) "GPL";
	strcpy(a.prog_name, "bench_empty");
	int prog = (int)sys_bpf(BPF_PROG_LOAD, &a);
	if (prog < 0) {
		fprintf(stderr, "bpfcal: loading the empty program: %s\n", strerror(errno));
		return 2;
	}
	int cg = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cg < 0) {
		fprintf(stderr, "bpfcal: %s: %s\n", argv[1], strerror(errno));
		return 2;
	}
	memset(&a, 0, sizeof(a));
	a.link_create.prog_fd = (__u32)prog;
	a.link_create.target_fd = (__u32)cg;
	a.link_create.attach_type = BPF_CGROUP_DEVICE;
	int link = (int)sys_bpf(BPF_LINK_CREATE, &a);
	if (link < 0) {
		fprintf(stderr, "bpfcal: attaching to %s: %s\n", argv[1], strerror(errno));
		return 2;
	}

	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
	for (long i = 0; i < n; i++) {
		long fd = syscall(SYS_openat, AT_FDCWD, argv[2], O_RDONLY);
		if (fd >= 0)
			close((int)fd);
	}

	struct bpf_prog_info info;
	memset(&info, 0, sizeof(info));
	memset(&a, 0, sizeof(a));
	a.info.bpf_fd = (__u32)prog;
	a.info.info_len = sizeof(info);
	a.info.info = (uintptr_t)&info;
	if (sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &a) != 0) {
		fprintf(stderr, "bpfcal: reading the program's info: %s\n", strerror(errno));
		return 2;
	}
	printf("bpfcal run_cnt=%llu run_time_ns=%llu ns_per_run=%.1f\n",
	       (unsigned long long)info.run_cnt, (unsigned long long)info.run_time_ns,
	       info.run_cnt ? (double)info.run_time_ns / (double)info.run_cnt : 0.0);
	return 0;
}
