/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared by the runtime-PM programs (bpf/power.bpf.c) and their loader
 * (src/bpf/power.rs). This header is the only definition of their layout: the
 * Rust side reads and writes the structs the skeleton generates from them, by
 * field name (src/bpf/abi.rs).
 */
#ifndef GPUCTL_POWER_H
#define GPUCTL_POWER_H

/* Devices watched at once: each GPU function, its siblings, the bridge above. */
#define GPUCTL_PM_MAX_DEVS 128
/* Longest device name kept (a PCI address is 12 characters). */
#define GPUCTL_PM_NAME 16
/* Path components of a touched file reported per wake (file, its parents). */
#define GPUCTL_PM_PATH_PARTS 4
#define GPUCTL_PM_PART 32
/* What a wake reports as the opened path (openat's argument). */
#define GPUCTL_PM_WHAT 64

/* pm_dev.role */
enum {
	GPUCTL_PM_GPU = 0,
	GPUCTL_PM_SIBLING = 1,
	GPUCTL_PM_BRIDGE = 2,
};

/* The kernel's enum rpm_status (include/linux/pm.h; ABI since 2.6). */
enum {
	GPUCTL_RPM_ACTIVE = 0,
	GPUCTL_RPM_RESUMING = 1,
	GPUCTL_RPM_SUSPENDED = 2,
	GPUCTL_RPM_SUSPENDING = 3,
};

/* pm_waker.flags */
enum {
	/* The resume ran in a kernel thread (a kworker resuming for a driver). */
	GPUCTL_WAKER_KTHREAD = 1,
	/* The resume was an asynchronous request (RPM_ASYNC). */
	GPUCTL_WAKER_ASYNC = 2,
	/* `path` holds a file the task had open (fd argument of its syscall). */
	GPUCTL_WAKER_FD = 4,
	/* `what` holds the path argument of open/openat. */
	GPUCTL_WAKER_OPEN = 8,
};

/* Key of `pm_devs`: a device name (`0000:01:00.0`), zero-padded. */
struct pm_key {
	char name[GPUCTL_PM_NAME];
};

/* Who started a resume of a suspended device. */
struct pm_waker {
	__u64 ts;
	__u32 pid;
	__u32 tgid;
	__u32 uid;
	__u32 flags;
	/* Syscall number the task was in (x86-64), or -1. */
	__s32 syscall;
	__s32 fd;
	char comm[16];
	/* openat's path argument. */
	char what[GPUCTL_PM_WHAT];
	/* The fd's file, then its parent directories' names (sysfs: config, 0000:01:00.0). */
	char path[GPUCTL_PM_PATH_PARTS][GPUCTL_PM_PART];
	/* When `path` reached its file system's root: the name of the mount point (`dev`). */
	char mnt[GPUCTL_PM_PART];
};

/* Value of `pm_devs`. The daemon writes gpu/role/status; the programs keep the rest. */
struct pm_dev {
	__u32 gpu;
	__u32 role;
	/* Last runtime status seen (GPUCTL_RPM_*). */
	__u32 status;
	/* A resume of this suspended device has started; `waker` says who. */
	__u32 pending;
	/* Completed resumes (suspended -> active) since the entry was written. */
	__u64 wakes;
	struct pm_waker waker;
};

/* One runtime-PM transition of a watched device, for the daemon's ring buffer. */
struct pm_event {
	/* bpf_ktime_get_ns() (CLOCK_MONOTONIC) of the transition. */
	__u64 ts;
	__u32 gpu;
	__u32 role;
	/* The new status (GPUCTL_RPM_ACTIVE: a wake; SUSPENDED: asleep). */
	__u32 status;
	/* 1 when `waker` is filled (a wake with a known cause). */
	__u32 has_waker;
	char dev[GPUCTL_PM_NAME];
	struct pm_waker waker;
};

#endif /* GPUCTL_POWER_H */
