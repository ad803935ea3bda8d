/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Minimal kernel type declarations for gpuctl's BPF programs.
 *
 * This is deliberately NOT a full bpftool-generated vmlinux.h. It declares only
 * the UAPI types and the kernel struct fields gpuctl reads. Every kernel struct
 * carries `preserve_access_index`, so each field access is a CO-RE relocation
 * that libbpf resolves against the running kernel's BTF at load time: one object
 * loads on every kernel from 6.1 on, whatever the real struct layouts are.
 *
 * Where the names came from: Linux UAPI headers (include/uapi/linux/bpf.h) for
 * the map/program enums and `struct bpf_cgroup_dev_ctx` (fixed ABI), and the
 * kernel's BTF (`bpftool btf dump file /sys/kernel/btf/vmlinux format c`) for the
 * struct and field names. To add a field: check its name in that dump on the
 * oldest supported kernel (6.1) and add it below; never copy offsets.
 */
#ifndef GPUCTL_VMLINUX_H
#define GPUCTL_VMLINUX_H

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef short __s16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __s32 s32;
typedef __u64 u64;
typedef __s64 s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
enum { false = 0, true = 1 };
typedef __u32 dev_t;
typedef __u16 umode_t;
typedef int pid_t;
typedef long long loff_t;

/* UAPI: include/uapi/linux/bpf.h (stable ABI values). */
enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

enum {
	BPF_F_NO_PREALLOC = 1,
};

/* UAPI: the context of BPF_PROG_TYPE_CGROUP_DEVICE (ABI, not CO-RE). */
struct bpf_cgroup_dev_ctx {
	/* (access << 16) | type */
	__u32 access_type;
	__u32 major;
	__u32 minor;
};

enum {
	BPF_DEVCG_ACC_MKNOD = (1ULL << 0),
	BPF_DEVCG_ACC_READ = (1ULL << 1),
	BPF_DEVCG_ACC_WRITE = (1ULL << 2),
};

enum {
	BPF_DEVCG_DEV_BLOCK = (1ULL << 0),
	BPF_DEVCG_DEV_CHAR = (1ULL << 1),
};

/* Kernel structs: field names only; offsets come from the kernel's BTF. */
typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	atomic_t live;
} __attribute__((preserve_access_index));

struct mm_struct {
	unsigned long env_start;
	unsigned long env_end;
	struct file *exe_file;
} __attribute__((preserve_access_index));

struct task_struct {
	pid_t pid;
	pid_t tgid;
	char comm[16];
	struct mm_struct *mm;
	struct signal_struct *signal;
	struct task_struct *group_leader;
	__u64 start_boottime;
	/* CONFIG_AUDIT only: read under bpf_core_field_exists. */
	unsigned int sessionid;
} __attribute__((preserve_access_index));

struct super_block {
	dev_t s_dev;
	unsigned long s_magic;
} __attribute__((preserve_access_index));

struct inode {
	umode_t i_mode;
	dev_t i_rdev;
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct dentry {
	struct inode *d_inode;
} __attribute__((preserve_access_index));

struct path {
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;

	/* fmode_t: FMODE_READ, FMODE_WRITE, FMODE_PATH (the holder scan). */
	unsigned int f_mode;
} __attribute__((preserve_access_index));

struct linux_binprm {
	struct file *file;
} __attribute__((preserve_access_index));

struct seq_file;
struct bpf_map;

struct bpf_iter_meta {
	struct seq_file *seq;
	__u64 session_id;
	__u64 seq_num;
} __attribute__((preserve_access_index));

struct bpf_iter__task_file {
	union {
		struct bpf_iter_meta *meta;
	};
	union {
		struct task_struct *task;
	};
	u32 fd;
	union {
		struct file *file;
	};
} __attribute__((preserve_access_index));

#endif /* GPUCTL_VMLINUX_H */
