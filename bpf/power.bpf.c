// SPDX-License-Identifier: GPL-2.0
/*
 * gpuctl's power truth: runtime-PM transitions of the watched devices (each
 * GPU function, its sibling functions, the bridge above it) and who caused
 * each wake. A separate object from the enforcer (bpf/gpuctl.bpf.c): these
 * programs stay attached in every mode, whatever the backend.
 *
 * The rpm_* tracepoints fire for every runtime-PM call in the system; each
 * program leaves after one string read and one hash lookup unless the device
 * is watched (`pm_devs`, keyed by device name, filled by the daemon). A wake
 * is a watched device seen leaving RPM_SUSPENDED: rpm_resume records who asked
 * (the task, its syscall, the file or path it touched), rpm_return_int sees
 * the new status and emits one event. Nothing is polled; the daemon sleeps
 * until an event is submitted.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "power.h"

char LICENSE[] SEC("license") = "GPL";

#define PF_KTHREAD 0x00200000
#define NSEC_PER_SEC 1000000000ULL
/* RPM_ASYNC in include/linux/pm_runtime.h. */
#define RPM_ASYNC 0x01

/* x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl). */
#define NR_READ 0
#define NR_WRITE 1
#define NR_OPEN 2
#define NR_MMAP 9
#define NR_IOCTL 16
#define NR_PREAD64 17
#define NR_PWRITE64 18
#define NR_READV 19
#define NR_WRITEV 20
#define NR_OPENAT 257
#define NR_PREADV 295
#define NR_PWRITEV 296
#define NR_PREADV2 327
#define NR_PWRITEV2 328
#define NR_OPENAT2 437

/* Kernel types beyond bpf/vmlinux.h, as CO-RE flavors (`___p` is ignored by libbpf). */
struct kobject___p {
	const char *name;
} __attribute__((preserve_access_index));

/* CO-RE matches an enum field only with an enum of the same name. */
enum rpm_status___p {
	RPM_STATUS_P_ACTIVE = 0,
};

struct dev_pm_info___p {
	enum rpm_status___p runtime_status;
} __attribute__((preserve_access_index));

struct device___p {
	struct kobject___p kobj;
	struct dev_pm_info___p power;
} __attribute__((preserve_access_index));

struct pt_regs {
	unsigned long di;
	unsigned long si;
	unsigned long r8;
	unsigned long orig_ax;
} __attribute__((preserve_access_index));

struct qstr___p {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry___p {
	struct dentry___p *d_parent;
	struct qstr___p d_name;
} __attribute__((preserve_access_index));

struct vfsmount___p {
	struct dentry___p *mnt_root;
} __attribute__((preserve_access_index));

/* fs/mount.h: a vfsmount is embedded in its struct mount. */
struct mount___p {
	struct dentry___p *mnt_mountpoint;
	struct vfsmount___p mnt;
} __attribute__((preserve_access_index));

struct path___p {
	struct vfsmount___p *mnt;
	struct dentry___p *dentry;
} __attribute__((preserve_access_index));

struct file___p {
	struct path___p f_path;
} __attribute__((preserve_access_index));

struct fdtable___p {
	unsigned int max_fds;
	struct file___p **fd;
} __attribute__((preserve_access_index));

struct files_struct___p {
	struct fdtable___p *fdt;
} __attribute__((preserve_access_index));

struct task_struct___p {
	unsigned int flags;
	pid_t pid;
	pid_t tgid;
	char comm[16];
	struct files_struct___p *files;
} __attribute__((preserve_access_index));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GPUCTL_PM_MAX_DEVS);
	__type(key, struct pm_key);
	__type(value, struct pm_dev);
} pm_devs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} pm_events SEC(".maps");

/* Never used: puts the ring-buffer record in BTF, so the skeleton has its type. */
struct pm_event _pm_event = {};

/* The watched entry of `dev`, or NULL (the common case: leave at once). */
static __always_inline struct pm_dev *watched(struct device___p *dev)
{
	struct pm_key k = {};
	const char *name = BPF_CORE_READ(dev, kobj.name);

	if (bpf_probe_read_kernel_str(k.name, sizeof(k.name), name) <= 0)
		return NULL;
	return bpf_map_lookup_elem(&pm_devs, &k);
}

/* The file behind `fd` of `task`, as up to GPUCTL_PM_PATH_PARTS names, leaf first. */
static __always_inline bool fd_path(struct task_struct___p *task, int fd, struct pm_waker *w)
{
	struct fdtable___p *fdt = BPF_CORE_READ(task, files, fdt);
	struct file___p **fds;
	struct file___p *f = NULL;
	struct dentry___p *d;

	if (!fdt || fd < 0 || (unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return false;
	fds = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return false;
	d = BPF_CORE_READ(f, f_path.dentry);
	for (int i = 0; i < GPUCTL_PM_PATH_PARTS && d; i++) {
		struct dentry___p *up = BPF_CORE_READ(d, d_parent);

		bpf_probe_read_kernel_str(w->path[i], GPUCTL_PM_PART,
					  BPF_CORE_READ(d, d_name.name));
		if (up == d)
			break;
		d = up;
	}
	return true;
}

/* Records the current task as the waker of `d`, with what it was doing. */
static __always_inline void note_waker(struct pm_dev *d, int rpmflags, __u64 now)
{
	struct task_struct___p *task = (void *)bpf_get_current_task_btf();
	struct pm_waker *w = &d->waker;
	struct pt_regs *regs;
	unsigned long nr;

	w->ts = now;
	w->pid = task->pid;
	w->tgid = task->tgid;
	w->uid = (__u32)bpf_get_current_uid_gid();
	w->flags = (rpmflags & RPM_ASYNC) ? GPUCTL_WAKER_ASYNC : 0;
	w->syscall = -1;
	w->fd = -1;
	w->what[0] = 0;
	for (int i = 0; i < GPUCTL_PM_PATH_PARTS; i++)
		w->path[i][0] = 0;
	w->mnt[0] = 0;
	bpf_probe_read_kernel_str(w->comm, sizeof(w->comm), task->comm);
	if (task->flags & PF_KTHREAD) {
		w->flags |= GPUCTL_WAKER_KTHREAD;
		return;
	}
	regs = (struct pt_regs *)bpf_task_pt_regs((struct task_struct *)task);
	if (!regs)
		return;
	nr = BPF_CORE_READ(regs, orig_ax);
	w->syscall = (__s32)nr;
	switch (nr) {
	case NR_OPEN:
		bpf_probe_read_user_str(w->what, sizeof(w->what),
					(const void *)BPF_CORE_READ(regs, di));
		w->flags |= GPUCTL_WAKER_OPEN;
		break;
	case NR_OPENAT:
	case NR_OPENAT2:
		bpf_probe_read_user_str(w->what, sizeof(w->what),
					(const void *)BPF_CORE_READ(regs, si));
		w->flags |= GPUCTL_WAKER_OPEN;
		break;
	case NR_MMAP:
		w->fd = (int)BPF_CORE_READ(regs, r8);
		break;
	case NR_READ:
	case NR_WRITE:
	case NR_IOCTL:
	case NR_PREAD64:
	case NR_PWRITE64:
	case NR_READV:
	case NR_WRITEV:
	case NR_PREADV:
	case NR_PWRITEV:
	case NR_PREADV2:
	case NR_PWRITEV2:
		w->fd = (int)BPF_CORE_READ(regs, di);
		break;
	default:
		break;
	}
	if (w->fd >= 0 && fd_path(task, w->fd, w))
		w->flags |= GPUCTL_WAKER_FD;
}

/* Emits an event when `dev` is seen in a new settled status (active or suspended). */
static __always_inline void transition(struct device___p *dev, struct pm_dev *d, int status,
				       __u64 now)
{
	struct pm_event *e;
	struct pm_key k = {};

	if (status != GPUCTL_RPM_ACTIVE && status != GPUCTL_RPM_SUSPENDED)
		return;
	__u32 was = d->status;

	if ((__u32)status == was)
		return;
	d->status = status;
	if (status == GPUCTL_RPM_ACTIVE && was == GPUCTL_RPM_SUSPENDED)
		d->wakes += 1;
	e = bpf_ringbuf_reserve(&pm_events, sizeof(*e), 0);
	if (e) {
		e->ts = now;
		e->gpu = d->gpu;
		e->role = d->role;
		e->status = status;
		e->has_waker = status == GPUCTL_RPM_ACTIVE && d->pending;
		bpf_probe_read_kernel_str(k.name, sizeof(k.name), BPF_CORE_READ(dev, kobj.name));
		__builtin_memcpy(e->dev, k.name, sizeof(e->dev));
		if (e->has_waker)
			__builtin_memcpy(&e->waker, &d->waker, sizeof(e->waker));
		bpf_ringbuf_submit(e, 0);
	}
	if (status == GPUCTL_RPM_ACTIVE)
		d->pending = 0;
}

SEC("tp_btf/rpm_resume")
int BPF_PROG(gpuctl_rpm_resume, struct device___p *dev, int flags)
{
	struct pm_dev *d = watched(dev);
	__u64 now;
	int status;

	if (!d)
		return 0;
	status = BPF_CORE_READ(dev, power.runtime_status);
	now = bpf_ktime_get_ns();
	if (status == GPUCTL_RPM_ACTIVE) {
		/* Already awake (a get on an active device): only catch up on a missed change. */
		transition(dev, d, status, now);
		return 0;
	}
	/*
	 * A resume of a sleeping device starts. Keep a fresh waker unless this one
	 * says more: a task beats the kworker that finishes its async request.
	 */
	if (d->pending && now - d->waker.ts < NSEC_PER_SEC) {
		struct task_struct___p *task = (void *)bpf_get_current_task_btf();

		if (!(d->waker.flags & GPUCTL_WAKER_KTHREAD) || (task->flags & PF_KTHREAD))
			return 0;
	}
	note_waker(d, flags, now);
	d->pending = 1;
	return 0;
}

SEC("tp_btf/rpm_suspend")
int BPF_PROG(gpuctl_rpm_suspend, struct device___p *dev, int flags)
{
	struct pm_dev *d = watched(dev);

	if (d)
		transition(dev, d, BPF_CORE_READ(dev, power.runtime_status), bpf_ktime_get_ns());
	return 0;
}

SEC("tp_btf/rpm_return_int")
int BPF_PROG(gpuctl_rpm_return_int, struct device___p *dev, unsigned long ip, int ret)
{
	struct pm_dev *d = watched(dev);

	if (d)
		transition(dev, d, BPF_CORE_READ(dev, power.runtime_status), bpf_ktime_get_ns());
	return 0;
}
