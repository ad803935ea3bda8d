// SPDX-License-Identifier: GPL-2.0
/*
 * gpuctl's kernel side: deny opens of a sleeping GPU's device nodes.
 *
 * Device nodes are matched by device number (major:minor), never by path, so
 * every path, bind mount and container view of a node is covered. The loader
 * (src/bpf.rs) fills `blocked_devs` from the plan and attaches a program only
 * while something is blocked.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "gpuctl.h"

char LICENSE[] SEC("license") = "GPL";

/*
 * Load-time constants, set by the loader between open and load. Branches on
 * them are resolved by the verifier, so disabled logging costs nothing.
 */
const volatile __u32 log_level = GPUCTL_LOG_OFF;
/* The daemon's own tgid: it may always open every node. */
const volatile __u32 daemon_tgid = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUCTL_MAX_NODES);
	__type(key, struct dev_key);
	__type(value, struct dev_rule);
} blocked_devs SEC(".maps");

/* Per-GPU count of denied opens; per-CPU so the hot path takes no lock. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GPUCTL_MAX_GPUS);
	__type(key, __u32);
	__type(value, __u64);
} denied SEC(".maps");

static __always_inline bool is_daemon(void)
{
	struct task_struct *task = bpf_get_current_task_btf();

	return task->tgid == daemon_tgid;
}

static __always_inline void count_denied(const struct dev_rule *rule)
{
	__u32 gpu = rule->gpu;
	__u64 *cnt = bpf_map_lookup_elem(&denied, &gpu);

	if (cnt)
		*cnt += 1;
}

/*
 * cgroup backend. Runs for device accesses of every task in the cgroup subtree
 * it is attached to (the cgroup-v2 root in production). Returns 1 to allow,
 * 0 to deny (the open then fails with EPERM).
 */
SEC("cgroup/dev")
int gpuctl_cgroup_dev(struct bpf_cgroup_dev_ctx *ctx)
{
	__u32 type = ctx->access_type & 0xffff;
	__u32 access = ctx->access_type >> 16;
	struct dev_key key;
	struct dev_rule *rule;

	if (type != BPF_DEVCG_DEV_CHAR)
		return 1;
	/* Only opens for read or write; access(F_OK) and mknod stay allowed. */
	if (!(access & (BPF_DEVCG_ACC_READ | BPF_DEVCG_ACC_WRITE)))
		return 1;

	key.major = ctx->major;
	key.minor = ctx->minor;
	rule = bpf_map_lookup_elem(&blocked_devs, &key);
	if (!rule)
		return 1;
	if (is_daemon())
		return 1;

	count_denied(rule);
	if (log_level >= GPUCTL_LOG_DEBUG)
		bpf_printk("gpuctl: denied %u:%u", key.major, key.minor);
	return 0;
}
