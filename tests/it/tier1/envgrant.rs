//! `gpuctl run --gpu` without a daemon: the environment it sets for the
//! loaders (root::envgrant proves the kernel grants what they select).

use std::process::Command;

use crate::common::fixture::{machine, Machine};
use crate::common::harness::{describe, BIN};

/// `gpuctl run --gpu GPU -- env`'s output.
pub(crate) fn run_env(m: &Machine, socket: &std::path::Path, gpu: &str) -> String {
    let out = Command::new(BIN)
        .env("GPUCTL_SOCKET", socket)
        .env("GPUCTL_SYSFS_ROOT", m.sysfs())
        .env("GPUCTL_PROCFS_ROOT", m.procfs())
        .args(["run", "--gpu", gpu, "--", "/usr/bin/env"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `gpuctl run --gpu` on a machine with two NVIDIA GPUs names the provider
/// (NVIDIA-G<n>, n in device-minor order), without a daemon.
#[test]
fn run_names_the_nvidia_provider_with_several_nvidia_gpus() {
    let m = machine("two_nvidia");
    let none = m.root().join("no-daemon.sock");
    let vars = run_env(&m, &none, "2");
    assert!(
        vars.contains("__NV_PRIME_RENDER_OFFLOAD_PROVIDER=NVIDIA-G1"),
        "{vars}"
    );
    assert!(vars.contains("__NV_PRIME_RENDER_OFFLOAD=1"), "{vars}");
    let vars = run_env(&m, &none, "01:00.0");
    assert!(
        vars.contains("__NV_PRIME_RENDER_OFFLOAD_PROVIDER=NVIDIA-G0"),
        "{vars}"
    );
    // One NVIDIA GPU: no provider (the driver's default is right).
    let one = machine("intel_nvidia");
    let vars = run_env(&one, &none, "1");
    assert!(vars.contains("__NV_PRIME_RENDER_OFFLOAD=1"), "{vars}");
    assert!(!vars.contains("PROVIDER"), "{vars}");
}
