/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Types shared by the BPF programs and the Rust loader (src/bpf.rs).
 * The Rust side gets them from the generated skeleton; keep both in step by
 * changing them here only.
 */
#ifndef GPUCTL_H
#define GPUCTL_H

/* Most GPUs one machine can have; a GPU's id indexes `denied`. */
#define GPUCTL_MAX_GPUS 32
/* Device numbers that can be blocked at once (cardN, renderDN, nvidiaN, nvidiactl). */
#define GPUCTL_MAX_NODES 256

enum gpuctl_log_level {
	GPUCTL_LOG_OFF = 0,
	GPUCTL_LOG_DENY = 1,
	GPUCTL_LOG_DEBUG = 2,
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

#endif /* GPUCTL_H */
