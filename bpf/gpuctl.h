/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared by the BPF programs and the Rust loader (src/bpf/enforcer.rs).
 * This header is the only definition of their layout: the Rust side reads and
 * writes the structs the skeleton generates from them, by field name
 * (src/bpf/abi.rs). Enum values and #defines the loader needs are mirrored
 * there by hand and checked against this text by a test.
 */
#ifndef GPUCTL_H
#define GPUCTL_H

/* Most GPUs one machine can have; a GPU's id indexes `denied` and grant masks. */
#define GPUCTL_MAX_GPUS 32
/* Device numbers that can be blocked at once (cardN, renderDN, nvidiaN, nvidiactl). */
#define GPUCTL_MAX_NODES 256
/* Protected sysfs files (config, resource*, rom of blocked GPUs). */
#define GPUCTL_MAX_FILES 256
/* Processes holding a grant at once; past this a new grant is refused (denied). */
#define GPUCTL_MAX_GRANTS 8192
/* Uids whose grants from the fork/exec hooks are counted at once (root is not). */
#define GPUCTL_MAX_UIDS 1024
/* Executables with an app policy. */
#define GPUCTL_MAX_APPS 1024
/* Longest environment string the exec scan copies in one step. */
#define GPUCTL_ENV_STR_MAX 4096
/* Most environment strings the exec scan looks at. */
#define GPUCTL_ENV_MAX_STRINGS 512
/* Longest accepted environment string (NAME=value), NUL included. */
#define GPUCTL_ENV_KEY_LEN 96
/* Accepted environment strings (the daemon derives them from its inventory). */
#define GPUCTL_MAX_ENV_KEYS 1024
/* Denial events per CPU per second, at most. */
#define GPUCTL_EVENTS_PER_SEC 64
/* Minors a node guard knows about (0 .. GPUCTL_GUARD_MINORS-1); higher ones are never guarded. */
#define GPUCTL_GUARD_MINORS 1024
/* Index of `guards`: the DRM major (226), the NVIDIA major (195). */
#define GPUCTL_GUARD_DRM 0
#define GPUCTL_GUARD_NVIDIA 1
#define GPUCTL_GUARDS 2
#define GPUCTL_DRM_MAJOR 226
#define GPUCTL_NVIDIA_MAJOR 195
/* Grants `status` lists at most (the lowest pids the caller may see). */
#define GPUCTL_GRANTS_LISTED 64
/* `grant_list_uid` for a caller who sees every uid's grants. */
#define GPUCTL_LIST_ALL 0xffffffffU

enum gpuctl_log_level {
	GPUCTL_LOG_OFF = 0,
	GPUCTL_LOG_DENY = 1,
	GPUCTL_LOG_DEBUG = 2,
};

/* dev_rule.flags */
enum {
	/* Smart mode: a grant for this GPU lets the process through. */
	GPUCTL_RULE_GRANTABLE = 1,
	/* The default GPU's node: denied only to trees with an exclusive grant. */
	GPUCTL_RULE_ONLY_HIDE = 2,
	/*
	 * A sysfs file only enumerators read (the function's `uevent`): udevd
	 * reads it, and a write-only open (`udevadm trigger`) is never denied.
	 */
	GPUCTL_RULE_ENUM = 4,
};

/* Value of `services`: what a system program is, by its executable. */
enum {
	/* systemd-udevd and its workers: may read a blocked GPU's `uevent`. */
	GPUCTL_SVC_UDEV = 1,
	/*
	 * systemd-logind: may open a blocked GPU's nodes in smart mode while a
	 * process of a seat's active login (audit) session holds a grant for
	 * that GPU (compositors open the card through logind's TakeDevice).
	 */
	GPUCTL_SVC_LOGIND = 2,
};

/* System programs with a role (udevd, logind), by executable. */
#define GPUCTL_MAX_SERVICES 16
/* The audit session id of a task in no login session. */
#define GPUCTL_NO_SESSION 0xffffffffU
/* Seats whose active session logind's opens may serve (`seat_sessions`). */
#define GPUCTL_MAX_SEATS 8

/* grant.how */
enum {
	GPUCTL_GRANT_RUN = 1,
	GPUCTL_GRANT_ENV = 2,
	GPUCTL_GRANT_APP = 3,
};

/* grant.flags */
enum {
	/* `gpuctl run --only`: the tree sees only its granted GPUs. */
	GPUCTL_GRANT_ONLY = 1,
	/*
	 * Made by the fork or exec hook (inherited, DRI_PRIME, app rule) and
	 * counted in `uid_grants[grant.uid]`; the hook that removes it gives
	 * the count back. `gpuctl run` grants (made by the daemon) are not.
	 */
	GPUCTL_GRANT_KERNEL = 2,
};

/* smart_cfg bits (.bss, changed at run time) */
enum {
	/* Grant processes exec'd with DRI_PRIME / __NV_PRIME_RENDER_OFFLOAD. */
	GPUCTL_SMART_ENV = 1,
	/* Emit denial events to the ring buffer (someone listens). */
	GPUCTL_EVENTS_ON = 2,
};

/* Key of `blocked_devs`: a character device number as the kernel sees it. */
struct dev_key {
	__u32 major;
	__u32 minor;
};

/* Value of `blocked_devs`. */
struct dev_rule {
	/* gpuctl id of the GPU that owns the node; indexes `denied`. */
	__u32 gpu;
	__u32 flags;
};

/*
 * Value of `guards`: while a GPU is blocked, a node of its major that did not
 * exist when the plan was made (its driver created it since: a late module
 * load, a rebind) is denied as that GPU's until the daemon has re-planned
 * (docs/DESIGN-NOTES.md, "New nodes of a blocked GPU"). `known` holds every
 * minor that existed then and is not blocked; they stay open.
 */
struct node_guard {
	/* The rule a new node gets (the blocked GPU's id and flags). */
	struct dev_rule rule;
	/* 0: off (no GPU of this major blocked, or the default GPU has no node yet). */
	__u32 on;
	__u32 pad;
	__u64 known[GPUCTL_GUARD_MINORS / 64];
};

/* Key of `blocked_files` and `apps`: a file as the kernel identifies it. */
struct file_key {
	/* Kernel dev_t of the superblock: major << 20 | minor. */
	__u32 dev;
	__u32 pad;
	__u64 ino;
};

/*
 * Value of `grants` (key: tgid). A grant is bound to one process, not to a
 * pid number: `start` is the process's start time in clock ticks since boot
 * (USER_HZ, as field 22 of /proc/<pid>/stat), and a grant whose `start` is
 * not the current holder's of that tgid is ignored (the pid was reused).
 */
struct grant {
	/* Bit N: GPU id N may be opened. */
	__u32 gpus;
	__u16 how;
	__u16 flags;
	__u64 start;
	/*
	 * The holder's audit session id (`/proc/<pid>/sessionid`, the logind
	 * session on systems with audit), GPUCTL_NO_SESSION if none.
	 */
	__u32 session;
	/*
	 * The real uid the grant was made for: the one it is counted against
	 * (GPUCTL_GRANT_KERNEL), and the owner `status` shows.
	 */
	__u32 uid;
	/*
	 * The holder's command name as of its last exec or fork (issue 21):
	 * the hooks write it (the exec hook renames a granted process in
	 * place), the daemon from /proc/<pid>/stat when it grants. `status`
	 * names the grants it lists from here, with no /proc read per grant.
	 */
	char comm[16];
};

/*
 * Value of `uid_grants` (key: uid): one uid's share of the grant map
 * (issue 18). Root has none: its grants are not limited.
 */
struct uid_grants {
	/* Grants from the fork/exec hooks this uid holds now. */
	__u64 held;
	/* Grants refused to it because it held its share (those processes were denied). */
	__u64 refused;
};

/* Value of `apps`. */
struct app_rule {
	__u32 gpus;
	/* 1: grant at exec; 0: never grant (and drop an inherited grant). */
	__u32 allow;
};

/* Key of `env_grants`: one environment string, zero-padded. Value: GPU mask. */
struct env_key {
	char s[GPUCTL_ENV_KEY_LEN];
};

/* A denied open, for `gpuctl events`. */
struct deny_event {
	__u32 pid;
	__u32 gpu;
	__u32 major;
	__u32 minor;
	char comm[16];
	/* The task's real uid (who may see its pid and comm). */
	__u32 uid;
	/* The task's role (GPUCTL_SVC_*: logind opening for a compositor), 0 if none. */
	__u32 svc;
};

/*
 * One grant `status` lists (the grant-list iterator, issue 21): the map's
 * key and value, kept in `.bss` (`grant_list`) for the daemon to read.
 */
struct grant_rec {
	__u32 pid;
	__u32 pad;
	struct grant grant;
};

/*
 * One record of the holder scan (`iter/task_file`, issue 18): a process with
 * a GPU node open for reading or writing. At most one per (process, node).
 */
struct holder_rec {
	__u32 tgid;
	__u32 fd;
	__u32 major;
	__u32 minor;
	char comm[16];
};

#endif /* GPUCTL_H */
