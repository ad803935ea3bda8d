//! Everything that touches BPF: the two embedded objects and their loaders.
//!
//! - [`enforcer`]: `bpf/gpuctl.bpf.c`, which applies a plan (denies opens).
//! - [`power`]: `bpf/power.bpf.c`, which reports runtime-PM transitions.
//! - `abi`: the only code that turns map keys, map values and ring-buffer
//!   records into bytes and back, through the types the skeletons generate
//!   from `bpf/gpuctl.h` and `bpf/power.h` (the one definition of the ABI).
//!
//! Kernel feature probes (LSM list, cgroup-v2 mount, BTF) are not here but in
//! [`crate::kernel`]: reading them needs no BPF.

mod abi;
mod enforcer;
pub mod power;
mod share;

pub use abi::{MAX_GPUS, MAX_SEATS};
pub use enforcer::{
    init_logging, Backend, DenyEvent, Enforcer, Grant, GrantHow, KernelHolder, LogLevel, Options,
    Preload, Service,
};
pub use share::{GrantShare, ShareCounts};

/// The skeletons libbpf-cargo generates in `build.rs`, one module per object.
/// Generated code: its own lints are not ours.
// Generated code: the crate's restriction lints (Cargo.toml [lints]) are ours, not
// libbpf-cargo's.
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks,
    clippy::unwrap_used,
    clippy::expect_used,
    unsafe_op_in_unsafe_fn,
    non_camel_case_types
)]
mod skel {
    pub mod gpuctl {
        include!(concat!(env!("OUT_DIR"), "/gpuctl.skel.rs"));
    }
    pub mod power {
        include!(concat!(env!("OUT_DIR"), "/power.skel.rs"));
    }
}

/// Unit tests that load BPF carry `#[ignore = "root"]` (run them with
/// `cargo test -- --ignored` as root); run without root they fail here
/// instead of passing without having tested anything.
#[cfg(test)]
pub(crate) fn require_root(test: &str) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "{test} loads BPF programs and needs root (it is #[ignore = \"root\"]: run it as root)"
    );
}
