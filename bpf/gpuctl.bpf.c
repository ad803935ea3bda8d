// SPDX-License-Identifier: GPL-2.0
/*
 * gpuctl's kernel side: deny opens of a sleeping GPU's device nodes.
 *
 * Device nodes are matched by device number (major:minor), never by path, so
 * every path, bind mount and container view of a node is covered. The loader
 * (src/bpf/enforcer.rs) fills the maps from the plan and attaches programs only while
 * something is blocked; the smart-mode hooks only while the mode is smart.
 *
 * Two enforcement backends share the maps and the decision (`decide`):
 * - cgroup/dev (any cgroup-v2 system): a denied open fails with EPERM.
 * - lsm/file_open (BPF LSM active): a denied open fails with EPERM, and the
 *   blocked GPU's sysfs config/resource/rom files are denied too.
 *
 * Either way a blocked node is *present and unopenable*: stat, access(F_OK)
 * and bind mounts see it, only open fails. It cannot be made absent to
 * every call (access(F_OK) reaches only the inode_permission hook, which
 * runs on every path component of every lookup: ARCHITECTURE.md#enforcement rules it out),
 * and a node that stat hides but access shows breaks Flatpak (it binds
 * what access finds; bwrap then cannot stat it and aborts).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "gpuctl.h"

char LICENSE[] SEC("license") = "GPL";

/* Macros, not BTF: defined here (values from the kernel's UAPI headers). */
#define EPERM 1
#define S_IFMT 00170000
#define S_IFCHR 0020000
#define S_IFREG 0100000
#define SYSFS_MAGIC 0x62656572
/* fmode_t bit of a file opened for reading (include/linux/fs.h). */
#define FMODE_READ 0x1
#define MINORBITS 20
#define MINORMASK ((1U << MINORBITS) - 1)
/* NSEC_PER_SEC / USER_HZ: /proc/<pid>/stat counts start times in 1/100 s. */
#define NSEC_PER_USER_TICK 10000000ULL

/*
 * Load-time constants, set by the loader between open and load. Branches on
 * them are resolved by the verifier, so disabled logging costs nothing.
 */
const volatile __u32 log_level = GPUCTL_LOG_OFF;
/* The daemon's own tgid: it may always open every node. */
const volatile __u32 daemon_tgid = 0;

/*
 * Each plain uid's share of the grant map (issue 18; DESIGN-NOTES), set by
 * the loader from the map's size: a uid holds at most `grant_share` grants
 * from the fork/exec hooks; once they fill `grant_reserve_at` entries of the
 * map, a uid holding `grant_small` or more gets no more, so the rest is kept
 * for uids that hold few (and for `gpuctl run`, capped per uid by the daemon).
 */
const volatile __u32 grant_share = GPUCTL_MAX_GRANTS / 8;
const volatile __u32 grant_reserve_at = GPUCTL_MAX_GRANTS - GPUCTL_MAX_GRANTS / 4;
const volatile __u32 grant_small = GPUCTL_MAX_GRANTS / 128;

/* Run-time settings (GPUCTL_SMART_*, GPUCTL_EVENTS_ON), written by the daemon. */
__u32 smart_cfg = 0;
/* Grants refused because `grants` was full (the process was denied). */
__u64 grants_full = 0;
/* Grants from the fork/exec hooks in `grants` now, every uid's (root's too). */
__u64 grants_kernel = 0;
/* Grants refused because their uid held its share (the process was denied). */
__u64 grants_over_share = 0;
/*
 * The grant map's generation (issue 21): every change a hook makes to
 * `grants` (an entry stored, removed, or renamed at exec) adds one, with an
 * atomic add after the change. The daemon reads it before it walks the map
 * for `status` and keeps that walk's result until it moves (its own writes
 * to the map it tracks itself): a request when nothing changed walks nothing.
 */
__u64 grants_gen = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUCTL_MAX_NODES);
	__type(key, struct dev_key);
	__type(value, struct dev_rule);
} blocked_devs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUCTL_MAX_FILES);
	__type(key, struct file_key);
	__type(value, struct dev_rule);
} blocked_files SEC(".maps");

/* New nodes of a blocked GPU's major (struct node_guard), per GPUCTL_GUARD_*. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GPUCTL_GUARDS);
	__type(key, __u32);
	__type(value, struct node_guard);
} guards SEC(".maps");

/* Per-GPU count of denied opens; per-CPU so the hot path takes no lock. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GPUCTL_MAX_GPUS);
	__type(key, __u32);
	__type(value, __u64);
} denied SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUCTL_MAX_GRANTS);
	__type(key, __u32);
	__type(value, struct grant);
} grants SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUCTL_MAX_UIDS);
	__type(key, __u32);
	__type(value, struct uid_grants);
} uid_grants SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUCTL_MAX_APPS);
	__type(key, struct file_key);
	__type(value, struct app_rule);
} apps SEC(".maps");

/*
 * System programs with a role (GPUCTL_SVC_*), keyed like `apps` by the
 * kernel's identity of their executable: the daemon resolves systemd-udevd
 * and systemd-logind at start and again when a package upgrade replaces
 * them. A process is what its executable is, never what its name says.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUCTL_MAX_SERVICES);
	__type(key, struct file_key);
	__type(value, __u32);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

/* Never used: puts the ring-buffer record in BTF, so the skeleton has its type. */
struct deny_event _deny_event = {};

struct rate {
	__u64 window;
	__u64 count;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rate);
} event_rate SEC(".maps");

/*
 * Environment grants: every string an exec is granted for (DRI_PRIME=pci-…,
 * MESA_VK_DEVICE_SELECT=vid:did, __NV_PRIME_RENDER_OFFLOAD=1, …), with the
 * GPUs it grants. The daemon fills it from its inventory (src/envgrant.rs),
 * so the kernel parses nothing and grants exactly what the loaders select.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUCTL_MAX_ENV_KEYS);
	__type(key, struct env_key);
	__type(value, __u32);
} env_grants SEC(".maps");

struct env_buf {
	char s[GPUCTL_ENV_STR_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct env_buf);
} env_scratch SEC(".maps");

/*
 * The rule for a node that `blocked_devs` does not list: a node of a guarded
 * major that did not exist at the plan (a blocked GPU's driver made it since)
 * is denied as that GPU's. NULL for every other node. One array lookup
 * (inlined by the verifier), only for the DRM and NVIDIA majors.
 */
static __always_inline struct dev_rule *guarded(__u32 major, __u32 minor)
{
	struct node_guard *g;
	__u32 idx;

	if (major == GPUCTL_DRM_MAJOR)
		idx = GPUCTL_GUARD_DRM;
	else if (major == GPUCTL_NVIDIA_MAJOR)
		idx = GPUCTL_GUARD_NVIDIA;
	else
		return NULL;
	if (minor >= GPUCTL_GUARD_MINORS)
		return NULL;
	g = bpf_map_lookup_elem(&guards, &idx);
	if (!g || !g->on)
		return NULL;
	if (g->known[minor / 64] & (1ULL << (minor % 64)))
		return NULL;
	return &g->rule;
}

static __always_inline void count_denied(__u32 gpu)
{
	__u64 *cnt = bpf_map_lookup_elem(&denied, &gpu);

	if (cnt)
		*cnt += 1;
}

/*
 * The role (GPUCTL_SVC_*) of the current task's executable, 0 if none. Only
 * root's processes have one: a user can run (and LD_PRELOAD into) a copy of
 * logind's executable, but not as root.
 */
static __always_inline __u32 current_service(void)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct file_key k = {};
	struct mm_struct *mm = task->mm;
	struct file *exe;
	__u32 *svc;

	if ((bpf_get_current_uid_gid() & 0xffffffff) != 0)
		return 0;
	if (!mm)
		return 0;
	exe = mm->exe_file;
	if (!exe)
		return 0;
	k.dev = exe->f_inode->i_sb->s_dev;
	k.ino = exe->f_inode->i_ino;
	svc = bpf_map_lookup_elem(&services, &k);
	return svc ? *svc : 0;
}

/* Rate-limited (per CPU) denial event, only while someone listens. */
static __always_inline void emit_denied(struct task_struct *task, __u32 gpu, __u32 major,
					__u32 minor)
{
	struct deny_event *e;
	struct rate *r;
	__u32 zero = 0;
	__u64 now;

	if (!(smart_cfg & GPUCTL_EVENTS_ON))
		return;
	r = bpf_map_lookup_elem(&event_rate, &zero);
	if (!r)
		return;
	now = bpf_ktime_get_ns() / 1000000000ULL;
	if (r->window != now) {
		r->window = now;
		r->count = 0;
	}
	if (r->count >= GPUCTL_EVENTS_PER_SEC)
		return;
	r->count += 1;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return;
	e->pid = task->tgid;
	e->gpu = gpu;
	e->major = major;
	e->minor = minor;
	e->uid = bpf_get_current_uid_gid() & 0xffffffff;
	e->svc = current_service();
	BPF_CORE_READ_STR_INTO(&e->comm, task, comm);
	bpf_ringbuf_submit(e, 0);
}

/* The exec hook renames a grant with two aligned 8-byte stores. */
_Static_assert(__builtin_offsetof(struct grant, comm) % 8 == 0, "grant.comm is 8-byte aligned");
_Static_assert(sizeof(((struct grant *)0)->comm) == 16, "grant.comm is two words");

/* After a hook's change to `grants` (see `grants_gen`). */
static __always_inline void grants_changed(void)
{
	__sync_fetch_and_add(&grants_gen, 1);
}

/* A task's command name, into a grant (direct BTF loads, no helper call). */
static __always_inline void grant_comm(struct grant *g, struct task_struct *task)
{
	__builtin_memcpy(g->comm, task->comm, sizeof(g->comm));
}

/* A process's start time as /proc/<pid>/stat gives it (field 22). */
static __always_inline __u64 start_ticks(struct task_struct *task)
{
	return task->group_leader->start_boottime / NSEC_PER_USER_TICK;
}

/*
 * The grant of the current process, if it holds one: an entry for its tgid
 * that was made for this very process (a grant left by an exited process
 * whose pid was reused does not count).
 */
static __always_inline struct grant *current_grant(__u32 tgid)
{
	struct grant *g = bpf_map_lookup_elem(&grants, &tgid);

	if (g && g->start != start_ticks(bpf_get_current_task_btf()))
		return NULL;
	return g;
}

/* The audit session id of `task` (GPUCTL_NO_SESSION without CONFIG_AUDIT). */
static __always_inline __u32 task_session(struct task_struct *task)
{
	if (bpf_core_field_exists(task->sessionid))
		return task->sessionid;
	return GPUCTL_NO_SESSION;
}

/*
 * The active session of each seat, as logind says (`ACTIVE=` in its seat
 * files under /run/systemd/seats, the audit session id), written by the daemon when
 * a seat's file changes; 0 in an unused slot (audit session ids start at 1).
 */
__u32 seat_sessions[GPUCTL_MAX_SEATS] = {};

struct session_scan {
	__u32 bit;
	bool found;
};

/* Whether `session` is in front of a seat now. */
static __always_inline bool session_active(__u32 session)
{
	int i;

#pragma unroll
	for (i = 0; i < GPUCTL_MAX_SEATS; i++) {
		if (seat_sessions[i] == session)
			return true;
	}
	return false;
}

static long session_grant_cb(struct bpf_map *map, __u32 *tgid, struct grant *g,
			     struct session_scan *scan)
{
	if ((g->gpus & scan->bit) && g->session != GPUCTL_NO_SESSION && g->session != 0 &&
	    session_active(g->session)) {
		scan->found = true;
		return 1;
	}
	return 0;
}

/*
 * logind opens a GPU's node for a compositor (TakeDevice) in its own
 * context: the kernel cannot tell which session the open serves. It is let
 * through, in smart mode only, while a process of a seat's active session
 * holds a grant for that GPU (docs/DESIGN-NOTES.md, issue 22): the session
 * in front of the screen is the one whose compositor takes the card. Scans
 * `grants`, but only for logind's opens of a blocked node (a few per
 * session start).
 */
static __always_inline bool logind_for_granted_session(const struct dev_rule *rule)
{
	struct session_scan scan = {.bit = 1U << (rule->gpu & 31)};

	if (!(rule->flags & GPUCTL_RULE_GRANTABLE))
		return false;
	if (current_service() != GPUCTL_SVC_LOGIND)
		return false;
	bpf_for_each_map_elem(&grants, session_grant_cb, &scan, 0);
	return scan.found;
}

/*
 * The decision, once a blocked node matched: true to deny. The daemon is
 * exempt; in smart mode a grant for the node's GPU lets the process through;
 * a default-GPU node (ONLY_HIDE) is denied only to exclusive-grant trees.
 */
static __always_inline bool decide(const struct dev_rule *rule, __u32 tgid)
{
	struct grant *g;

	if (tgid == daemon_tgid)
		return false;
	if (!(rule->flags & (GPUCTL_RULE_GRANTABLE | GPUCTL_RULE_ONLY_HIDE)))
		return true;
	g = current_grant(tgid);
	if (rule->flags & GPUCTL_RULE_ONLY_HIDE)
		return g && (g->flags & GPUCTL_GRANT_ONLY) && !(g->gpus & (1U << (rule->gpu & 31)));
	return !(g && (g->gpus & (1U << (rule->gpu & 31))));
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
	struct task_struct *task;
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
		rule = guarded(key.major, key.minor);
	if (!rule)
		return 1;
	task = bpf_get_current_task_btf();
	if (!decide(rule, task->tgid))
		return 1;
	if (logind_for_granted_session(rule))
		return 1;

	count_denied(rule->gpu);
	emit_denied(task, rule->gpu, key.major, key.minor);
	if (log_level >= GPUCTL_LOG_DENY)
		bpf_printk("gpuctl: denied %u:%u", key.major, key.minor);
	return 0;
}

/*
 * LSM backend: the check of file_open. Returns the rule that denies `inode`
 * to the current task, or NULL. Anything that is not a char device or a
 * sysfs file leaves after one load. Fields are read with direct (BTF,
 * CO-RE-relocated) loads, not bpf_probe_read_kernel calls: this runs on
 * every open while something is blocked.
 */
static __always_inline struct dev_rule *lsm_check(struct file *file, struct dev_key *devkey)
{
	struct inode *inode = file->f_inode;
	umode_t mode = inode->i_mode;
	struct dev_rule *rule;
	__u32 tgid;

	if ((mode & S_IFMT) == S_IFCHR) {
		dev_t rdev = inode->i_rdev;

		devkey->major = rdev >> MINORBITS;
		devkey->minor = rdev & MINORMASK;
		rule = bpf_map_lookup_elem(&blocked_devs, devkey);
		if (!rule)
			rule = guarded(devkey->major, devkey->minor);
	} else if ((mode & S_IFMT) == S_IFREG) {
		struct super_block *sb = inode->i_sb;
		struct file_key fkey = {};

		if (sb->s_magic != SYSFS_MAGIC)
			return NULL;
		fkey.dev = sb->s_dev;
		fkey.ino = inode->i_ino;
		devkey->major = 0;
		devkey->minor = 0;
		rule = bpf_map_lookup_elem(&blocked_files, &fkey);
	} else {
		return NULL;
	}
	if (!rule)
		return NULL;
	tgid = bpf_get_current_pid_tgid() >> 32;
	if (!decide(rule, tgid))
		return NULL;
	if (rule->flags & GPUCTL_RULE_ENUM) {
		/* Writing `uevent` (udevadm trigger) only asks for an event. */
		if (!(file->f_mode & FMODE_READ))
			return NULL;
		/* udevd and its workers (forks, same executable) read it. */
		if (current_service() == GPUCTL_SVC_UDEV)
			return NULL;
		return rule;
	}
	if ((mode & S_IFMT) == S_IFCHR && logind_for_granted_session(rule))
		return NULL;
	return rule;
}

SEC("lsm/file_open")
int BPF_PROG(gpuctl_file_open, struct file *file)
{
	struct dev_key key;
	struct dev_rule *rule = lsm_check(file, &key);

	if (!rule)
		return 0;
	count_denied(rule->gpu);
	emit_denied(bpf_get_current_task_btf(), rule->gpu, key.major, key.minor);
	if (log_level >= GPUCTL_LOG_DENY)
		bpf_printk("gpuctl: denied open of %u:%u", key.major, key.minor);
	return -EPERM;
}

/*
 * Smart mode. A grant belongs to a thread group (tgid), is copied to every
 * new process at fork, survives exec, and is dropped when the last thread
 * exits. Decided here, at fork and exec, so no process runs before its
 * grant exists; the daemon does no work per launch.
 */

/*
 * Takes one grant of `uid`'s share: false when it holds its share, or holds
 * `grant_small` while the map is nearly full (the reserve). The counters are
 * changed with atomic adds (several CPUs fork at once); a loser of a race at
 * the limit gives its add back, so a uid never holds more than its share.
 */
static __always_inline bool charge(__u32 uid)
{
	struct uid_grants zero = {}, *u;
	__u64 had;

	if (uid != 0) {
		u = bpf_map_lookup_elem(&uid_grants, &uid);
		if (!u) {
			bpf_map_update_elem(&uid_grants, &uid, &zero, BPF_NOEXIST);
			u = bpf_map_lookup_elem(&uid_grants, &uid);
		}
		/* No room to count one more uid: nothing to count against. */
		if (!u) {
			__sync_fetch_and_add(&grants_over_share, 1);
			return false;
		}
		had = __sync_fetch_and_add(&u->held, 1);
		if (had >= grant_share ||
		    (had >= grant_small && grants_kernel >= grant_reserve_at)) {
			__sync_fetch_and_add(&u->held, -1);
			__sync_fetch_and_add(&u->refused, 1);
			__sync_fetch_and_add(&grants_over_share, 1);
			return false;
		}
	}
	__sync_fetch_and_add(&grants_kernel, 1);
	return true;
}

/* Gives back what `charge(uid)` took. */
static __always_inline void uncharge(__u32 uid)
{
	struct uid_grants *u;

	__sync_fetch_and_add(&grants_kernel, -1);
	if (uid == 0)
		return;
	u = bpf_map_lookup_elem(&uid_grants, &uid);
	if (u)
		__sync_fetch_and_add(&u->held, -1);
}

/* Removes the grant of `tgid`, if any, giving its count back. */
static __always_inline void drop_grant(__u32 tgid)
{
	struct grant *old = bpf_map_lookup_elem(&grants, &tgid);
	bool counted;
	__u32 uid;

	if (!old)
		return;
	counted = old->flags & GPUCTL_GRANT_KERNEL;
	uid = old->uid;
	/* Only the one that removed it gives the count back. */
	if (bpf_map_delete_elem(&grants, &tgid))
		return;
	grants_changed();
	if (counted)
		uncharge(uid);
}

/*
 * Stores a grant made by a hook for `tgid` (the current task's, or the child
 * it forks), counted against the current task's real uid. Replaces what
 * `tgid` had. Refused (the process stays denied, and what it had is kept)
 * when that uid holds its share or the map is full.
 */
static __always_inline void put_grant(__u32 tgid, struct grant *g)
{
	__u32 uid = bpf_get_current_uid_gid() & 0xffffffff;
	struct grant *old = bpf_map_lookup_elem(&grants, &tgid);

	g->flags |= GPUCTL_GRANT_KERNEL;
	g->uid = uid;
	if (old && (old->flags & GPUCTL_GRANT_KERNEL) && old->uid == uid) {
		/* Counted already: the count carries over. */
		if (bpf_map_update_elem(&grants, &tgid, g, BPF_EXIST) == 0)
			grants_changed();
		return;
	}
	if (!charge(uid))
		return;
	if (old)
		drop_grant(tgid);
	if (bpf_map_update_elem(&grants, &tgid, g, BPF_NOEXIST)) {
		uncharge(uid);
		__sync_fetch_and_add(&grants_full, 1);
		return;
	}
	grants_changed();
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(gpuctl_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid;
	__u32 ctgid = child->tgid;
	struct grant *g;

	/* A new thread joins its group's grant; only new processes copy it. */
	if (ptgid == ctgid)
		return 0;
	g = bpf_map_lookup_elem(&grants, &ptgid);
	if (g && g->start == start_ticks(parent)) {
		struct grant copy = *g;

		copy.start = start_ticks(child);
		copy.session = task_session(child);
		grant_comm(&copy, child);
		put_grant(ctgid, &copy);
	}
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(gpuctl_exit, struct task_struct *p)
{
	__u32 tgid = p->tgid;

	/* `live` is decremented before this tracepoint: 0 means last thread. */
	if (p->signal->live.counter == 0)
		drop_grant(tgid);
	return 0;
}

/* The first 8 bytes of a name, as one little-endian load sees them. */
#define NAME8(a, b, c, d, e, f, g, h)                                                              \
	((__u64)(a) | (__u64)(b) << 8 | (__u64)(c) << 16 | (__u64)(d) << 24 | (__u64)(e) << 32 |   \
	 (__u64)(f) << 40 | (__u64)(g) << 48 | (__u64)(h) << 56)

/*
 * Whether a string may be an offload request: its first 8 bytes against the
 * names the daemon accepts strings for (src/envgrant.rs NAMES). One load and
 * a few compares per environment string; a string shorter than 8 bytes has
 * its NUL in them and matches none.
 */
static __always_inline bool env_candidate(const char *s)
{
	__u64 w = *(const __u64 *)s;

	return w == NAME8('D', 'R', 'I', '_', 'P', 'R', 'I', 'M') ||
	       w == NAME8('M', 'E', 'S', 'A', '_', 'V', 'K', '_') ||
	       w == NAME8('_', '_', 'N', 'V', '_', 'P', 'R', 'I') ||
	       w == NAME8('_', '_', 'V', 'K', '_', 'L', 'A', 'Y') ||
	       w == NAME8('V', 'K', '_', 'L', 'O', 'A', 'D', 'E') ||
	       w == NAME8('V', 'K', '_', 'I', 'C', 'D', '_', 'F') ||
	       w == NAME8('V', 'K', '_', 'D', 'R', 'I', 'V', 'E');
}

/*
 * Bit 7 of each byte of the result: set where that byte of `w` is a digit
 * in ['0' + lo, '9'] (SWAR: every byte at once, no carry between bytes).
 */
static __always_inline __u64 swar_digits(__u64 w, __u64 lo)
{
	const __u64 ones = 0x0101010101010101ULL, high = ones * 0x80;
	__u64 low7 = w & ~high;
	/* Bit 7: low7 >= '0' + lo, and low7 <= '9', and the byte's bit 7 clear. */
	__u64 ge = (low7 | high) - ones * ('0' + lo);
	__u64 le = ones * ('9' | 0x80) - low7;

	return ge & le & ~w & high;
}

/* Bit 7 of each byte of the result: set where that byte of `w` is not 0. */
static __always_inline __u64 swar_nonzero(__u64 w)
{
	const __u64 ones = 0x0101010101010101ULL, high = ones * 0x80;

	return (((w & ~high) + ones * 0x7f) | w) & high;
}

/*
 * `DRI_PRIME=<decimal N ≥ 1>` (Mesa's atoi; N is clamped to the GPUs
 * present) becomes `DRI_PRIME=1`, the one such string the daemon accepts.
 * The digits are checked eight bytes at a time with no branch per byte
 * (the key is zero after its NUL): a per-digit loop cost the verifier
 * ~19 000 processed instructions, this a few hundred.
 */
static __always_inline void env_dri_prime_n(struct env_key *k)
{
	const __u64 high = 0x8080808080808080ULL;
	__u64 bad = 0, any = 0;
	int i;

	if (*(__u64 *)k->s != NAME8('D', 'R', 'I', '_', 'P', 'R', 'I', 'M') || k->s[8] != 'E' ||
	    k->s[9] != '=')
		return;
#pragma unroll
	for (i = 8; i < GPUCTL_ENV_KEY_LEN; i += 8) {
		__u64 w = *(__u64 *)(k->s + i);
		/* Bytes 8 and 9 ("E=", the low bytes of the first word) are not digits. */
		__u64 care = i == 8 ? high & ~0xffffULL : high;

		bad |= swar_nonzero(w) & ~swar_digits(w, 0) & care;
		any |= swar_digits(w, 1) & care;
	}
	if (bad || !any)
		return;
	__builtin_memset(k->s + 10, 0, GPUCTL_ENV_KEY_LEN - 10);
	k->s[10] = '1';
}

struct env_scan {
	__u64 p;
	__u64 end;
	__u32 gpus;
	bool cont;
};

static long env_step(__u32 i, void *data)
{
	struct env_scan *c = data;
	struct env_key key;
	struct env_buf *buf;
	__u32 zero = 0;
	__u32 *mask;
	long n;

	if (c->p >= c->end)
		return 1;
	buf = bpf_map_lookup_elem(&env_scratch, &zero);
	if (!buf)
		return 1;
	n = bpf_probe_read_user_str(buf->s, sizeof(buf->s), (const void *)c->p);
	if (n <= 0)
		return 1;
	/* Only whole strings short enough to be accepted are looked up. */
	if (!c->cont && n <= GPUCTL_ENV_KEY_LEN && env_candidate(buf->s)) {
		__builtin_memset(&key, 0, sizeof(key));
		bpf_probe_read_kernel(key.s, (__u32)n, buf->s);
		env_dri_prime_n(&key);
		mask = bpf_map_lookup_elem(&env_grants, &key);
		if (mask)
			c->gpus |= *mask;
	}
	/* A string longer than the buffer: continue it, not a new string. */
	c->cont = n == sizeof(buf->s);
	c->p += c->cont ? n - 1 : n;
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(gpuctl_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	__u32 tgid = p->tgid;
	struct file_key fkey = {};
	struct inode *inode;
	struct app_rule *app;
	struct env_scan scan = {};
	struct grant *granted;
	struct grant g = {};

	inode = bprm->file->f_inode;
	fkey.dev = inode->i_sb->s_dev;
	fkey.ino = inode->i_ino;
	app = bpf_map_lookup_elem(&apps, &fkey);
	if (app) {
		if (!app->allow) {
			drop_grant(tgid);
			return 0;
		}
		g.gpus = app->gpus;
		g.how = GPUCTL_GRANT_APP;
		g.start = start_ticks(p);
		g.session = task_session(p);
		grant_comm(&g, p);
		put_grant(tgid, &g);
		return 0;
	}
	/*
	 * Already granted (inherited or `gpuctl run`): the grant survives exec,
	 * under the new name (exec set `comm` before this tracepoint). Two
	 * 8-byte stores in place; a walk that runs meanwhile may copy half of
	 * it, and the next one, after the generation moved, the whole.
	 */
	granted = bpf_map_lookup_elem(&grants, &tgid);
	if (granted && granted->start == start_ticks(p)) {
		__u64 *now = (__u64 *)granted->comm;
		__u64 name[2];

		__builtin_memcpy(name, p->comm, sizeof(name));
		if (now[0] != name[0] || now[1] != name[1]) {
			now[0] = name[0];
			now[1] = name[1];
			grants_changed();
		}
		return 0;
	}
	if (!(smart_cfg & GPUCTL_SMART_ENV))
		return 0;

	scan.p = p->mm->env_start;
	scan.end = p->mm->env_end;
	bpf_loop(GPUCTL_ENV_MAX_STRINGS, env_step, &scan, 0);
	if (!scan.gpus)
		return 0;
	g.gpus = scan.gpus;
	g.how = GPUCTL_GRANT_ENV;
	g.start = start_ticks(p);
	g.session = task_session(p);
	grant_comm(&g, p);
	put_grant(tgid, &g);
	if (log_level >= GPUCTL_LOG_DEBUG)
		bpf_printk("gpuctl: env grant for %u", tgid);
	return 0;
}

/*
 * The kernel's identity of a file the daemon holds open: (s_dev, i_ino) as
 * exec sees them (stat's st_dev differs on btrfs subvolumes and overlayfs).
 * The daemon sets the filter, then reads this iterator once.
 */
__u32 iter_tgid = 0;
__u32 iter_fd = 0;

SEC("iter/task_file")
int gpuctl_file_id(struct bpf_iter__task_file *ctx)
{
	struct task_struct *task = ctx->task;
	struct file *file = ctx->file;
	struct file_key out = {};
	struct inode *inode;

	if (!task || !file)
		return 0;
	if (task->tgid != iter_tgid || ctx->fd != iter_fd)
		return 0;
	inode = file->f_inode;
	out.dev = inode->i_sb->s_dev;
	out.ino = inode->i_ino;
	bpf_seq_write(ctx->meta->seq, &out, sizeof(out));
	return 0;
}

/*
 * The holder scan (`gpuctl who`, the split-session guard; issue 18): every
 * process with a GPU node open for reading or writing, found in the kernel
 * so its cost does not grow with what users put in their fd tables in
 * userspace terms (no readlink, no stat per fd). The daemon fills
 * `holder_devs` (a node's device number -> its index, < 64) and resets the
 * two globals, then reads the iterator once. O_PATH descriptors (which wake
 * nothing and need no permission) and descriptors opened for neither
 * reading nor writing are not holders. One record per (process, node): the
 * iterator visits a process's files one after the other, so a bit mask of
 * the nodes seen in the current process is enough.
 */
#define FMODE_READ 0x1
#define FMODE_WRITE 0x2
#define FMODE_PATH 0x4000

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct dev_key);
	__type(value, __u32);
} holder_devs SEC(".maps");

/* Puts `struct holder_rec` in BTF for the skeleton (see `_deny_event`). */
struct holder_rec _holder_rec = {};
__u32 holder_tgid = 0;
__u64 holder_seen = 0;

SEC("iter/task_file")
int gpuctl_holders(struct bpf_iter__task_file *ctx)
{
	struct task_struct *task = ctx->task;
	struct file *file = ctx->file;
	struct holder_rec out = {};
	struct dev_key key;
	struct inode *inode;
	__u32 *idx;
	__u64 bit;
	dev_t rdev;

	if (!task || !file)
		return 0;
	if (file->f_mode & FMODE_PATH)
		return 0;
	if (!(file->f_mode & (FMODE_READ | FMODE_WRITE)))
		return 0;
	inode = file->f_inode;
	if (!inode || (inode->i_mode & S_IFMT) != S_IFCHR)
		return 0;
	rdev = inode->i_rdev;
	key.major = rdev >> MINORBITS;
	key.minor = rdev & MINORMASK;
	idx = bpf_map_lookup_elem(&holder_devs, &key);
	if (!idx)
		return 0;
	if (task->tgid != holder_tgid) {
		holder_tgid = task->tgid;
		holder_seen = 0;
	}
	bit = 1ULL << (*idx & 63);
	if (holder_seen & bit)
		return 0;
	holder_seen |= bit;
	out.tgid = task->tgid;
	out.fd = ctx->fd;
	out.major = key.major;
	out.minor = key.minor;
	__builtin_memcpy(out.comm, task->comm, sizeof(out.comm));
	bpf_seq_write(ctx->meta->seq, &out, sizeof(out));
	return 0;
}

/*
 * The grants `status` lists (issue 21): a walk of the grant map in the
 * kernel (`bpf_for_each_map_elem`, from a `syscall` program the daemon runs
 * with BPF_PROG_TEST_RUN) that keeps the GPUCTL_GRANTS_LISTED lowest pids
 * the caller may see (`grant_list_uid`: their uid, or GPUCTL_LIST_ALL) in
 * `grant_list`, and counts the entries (`grant_list_total`) and those the
 * caller may see (`grant_list_seen`). Nothing is copied to userspace but
 * what is kept, so a full map costs a walk, not a copy of 8 192 entries.
 * The daemon sets `grant_list_uid`, runs the program and reads the results
 * from `.bss`; it runs one walk at a time (its loop is single-threaded).
 * (An `iter/bpf_map_elem` iterator would do the same walk, but its load
 * was refused with EPERM, and no verifier message, on a 6.18 kernel.)
 */
__u32 grant_list_uid = 0;
/* Entries kept in `grant_list` (at most GPUCTL_GRANTS_LISTED). */
__u32 grant_list_n = 0;
/* Once full: the index in `grant_list` of its highest pid (the one to replace). */
__u32 grant_list_top = 0;
__u64 grant_list_total = 0;
__u64 grant_list_seen = 0;
/* Of those, the `gpuctl run` grants the daemon made (its per-uid cap counts them). */
__u64 grant_list_runs = 0;
struct grant_rec grant_list[GPUCTL_GRANTS_LISTED] = {};

/* The index of the highest pid in a full `grant_list`. */
static __always_inline __u32 grant_list_max(void)
{
	__u32 i, top = 0, top_pid = 0;

	for (i = 0; i < GPUCTL_GRANTS_LISTED; i++) {
		if (grant_list[i].pid > top_pid) {
			top_pid = grant_list[i].pid;
			top = i;
		}
	}
	return top;
}

static long grant_list_step(struct bpf_map *map, __u32 *key, struct grant *val, void *unused)
{
	__u32 pid = *key, i, n;

	grant_list_total++;
	if (grant_list_uid != GPUCTL_LIST_ALL && val->uid != grant_list_uid)
		return 0;
	grant_list_seen++;
	if (!(val->flags & GPUCTL_GRANT_KERNEL) && val->how == GPUCTL_GRANT_RUN)
		grant_list_runs++;
	n = grant_list_n;
	if (n < GPUCTL_GRANTS_LISTED) {
		i = n;
		grant_list_n = n + 1;
	} else {
		i = grant_list_top;
		if (i >= GPUCTL_GRANTS_LISTED || pid >= grant_list[i].pid)
			return 0;
	}
	grant_list[i].pid = pid;
	grant_list[i].grant = *val;
	if (grant_list_n == GPUCTL_GRANTS_LISTED)
		grant_list_top = grant_list_max();
	return 0;
}

SEC("syscall")
int gpuctl_grant_list(void *ctx)
{
	grant_list_n = 0;
	grant_list_top = 0;
	grant_list_total = 0;
	grant_list_seen = 0;
	grant_list_runs = 0;
	bpf_for_each_map_elem(&grants, grant_list_step, NULL, 0);
	return 0;
}
