//! Tier 2: environment grants decided in the kernel match what the loaders
//! select (issue 10), on a two-GPU and a three-GPU machine, as root. Each
//! case execs a shell with one environment and opens each offload GPU's
//! render node: ENXIO (no driver here) means the kernel let it through,
//! EPERM that it was denied. The same table runs without the kernel in
//! src/envgrant.rs; this proves the BPF side agrees.

use std::process::{Command, Stdio};

use crate::common::fixture::{machine, Machine};
use crate::common::harness::{describe, join_cgroup_before_exec, require_root, Env, ENXIO, EPERM};
use crate::tier1::envgrant::run_env;

const OPEN: &str = r#"exec 3<>"$0""#;

/// errno of opening `node` from `sh` exec'd with exactly `envs` (plus PATH).
fn open_with(env: &Env, node: &str, envs: &[(&str, &str)]) -> i32 {
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", OPEN, node])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    join_cgroup_before_exec(&mut cmd, &env.cgroup);
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Operation not permitted") {
        EPERM
    } else if err.contains("No such device or address") {
        ENXIO
    } else {
        panic!("{envs:?}: {}", describe(&out))
    }
}

fn smart(m: Machine) -> Env {
    let mut env = Env::new(m);
    env.start();
    let out = env.gpuctl(&["set", "smart"]);
    assert!(out.status.success(), "{}", describe(&out));
    env
}

/// An environment, and whether each offload node opens under it.
type Case<'a> = (&'a [(&'a str, &'a str)], &'a [bool]);

/// Checks every case: `want[i]` is whether offload node `nodes[i]` opens.
fn check(env: &Env, nodes: &[String], cases: &[Case]) {
    for (envs, want) in cases {
        for (node, ok) in nodes.iter().zip(want.iter()) {
            let want_errno = if *ok { ENXIO } else { EPERM };
            assert_eq!(open_with(env, node, envs), want_errno, "{envs:?} {node}");
        }
    }
}

#[test]
#[ignore = "root"]
fn two_gpus_grant_what_the_loaders_select() {
    require_root(module_path!());
    // intel_nvidia: i915 iGPU 00:02.0 (8086:46a6, default), RTX 3050 01:00.0.
    let env = smart(machine("intel_nvidia"));
    let nv = env.mknod(226, 129).to_string_lossy().into_owned();
    let nodes = [nv];
    let y: &[bool] = &[true];
    let n: &[bool] = &[false];
    let icd = "/usr/share/vulkan/icd.d/nvidia_icd.json";
    let cases: &[Case] = &[
        (&[], n),
        (&[("DRI_PRIME", "1")], y),
        (&[("DRI_PRIME", "3")], y),
        (&[("DRI_PRIME", "0")], n),
        (&[("DRI_PRIME", "00")], n),
        (&[("DRI_PRIME", "yes")], n),
        // The digits are checked eight bytes at a time in the kernel: a
        // digit in every byte position and word, and anything else in one.
        (&[("DRI_PRIME", "9")], y),
        (&[("DRI_PRIME", "0010")], y),
        (&[("DRI_PRIME", "000000000000000000000007")], y),
        (&[("DRI_PRIME", &"0".repeat(85))], n),
        (&[("DRI_PRIME", &format!("{}1", "0".repeat(84)))], y),
        (&[("DRI_PRIME", "")], n),
        (&[("DRI_PRIME", "1a")], n),
        (&[("DRI_PRIME", "1 ")], n),
        (&[("DRI_PRIME", "-1")], n),
        (&[("DRI_PRIME", "12345:")], n),
        (&[("DRI_PRIME", "1234567/")], n),
        (&[("DRI_PRIME", "1\u{b1}")], n),
        (&[("DRI_PRIME", "pci-0000_01_00_0")], y),
        (&[("DRI_PRIME", "pci-0000_01_00_0!")], y),
        (&[("DRI_PRIME", "pci-0000_00_02_0")], n),
        (&[("DRI_PRIME", "8086:46a6")], n),
        (&[("DRI_PRIME", "10de:25a2")], y),
        (&[("MESA_VK_DEVICE_SELECT", "10de:25a2!")], y),
        (&[("MESA_VK_DEVICE_SELECT", "8086:46a6")], n),
        (&[("__NV_PRIME_RENDER_OFFLOAD", "1")], y),
        (&[("__VK_LAYER_NV_optimus", "NVIDIA_only")], y),
        (&[("VK_ICD_FILENAMES", icd)], y),
        (&[("VK_DRIVER_FILES", icd)], y),
        (&[("VK_LOADER_DRIVERS_SELECT", "nvidia*")], y),
        (
            &[(
                "VK_ICD_FILENAMES",
                "/usr/share/vulkan/icd.d/intel_icd.x86_64.json",
            )],
            n,
        ),
        (&[("DRI_PRIMEX", "1")], n),
    ];
    check(&env, &nodes, cases);
}

#[test]
#[ignore = "root"]
fn three_gpus_grant_only_the_selected_one() {
    require_root(module_path!());
    let env = smart(machine("intel_nvidia_amd"));
    let nv = env.mknod(226, 129).to_string_lossy().into_owned();
    let amd = env.mknod(226, 130).to_string_lossy().into_owned();
    let nodes = [nv, amd];
    let cases: &[Case] = &[
        (&[], &[false, false]),
        (&[("DRI_PRIME", "1")], &[true, true]),
        (&[("DRI_PRIME", "2")], &[true, true]),
        (&[("DRI_PRIME", "pci-0000_01_00_0")], &[true, false]),
        (&[("DRI_PRIME", "pci-0000_02_00_0!")], &[false, true]),
        (&[("DRI_PRIME", "pci-0000_00_02_0")], &[false, false]),
        (&[("DRI_PRIME", "1002:73BF")], &[false, true]),
        (&[("MESA_VK_DEVICE_SELECT", "10de:2684!")], &[true, false]),
        (&[("MESA_VK_DEVICE_SELECT", "8086:4680")], &[false, false]),
        (&[("__NV_PRIME_RENDER_OFFLOAD", "1")], &[true, false]),
        (&[("__VK_LAYER_NV_optimus", "NVIDIA_only")], &[true, false]),
        (&[("VK_LOADER_DRIVERS_SELECT", "*radeon*")], &[false, true]),
        (
            &[
                ("DRI_PRIME", "pci-0000_02_00_0"),
                ("__NV_PRIME_RENDER_OFFLOAD", "1"),
            ],
            &[true, true],
        ),
        // The string is found after a long environment too.
        (
            &[
                ("AAA_BIG", &"x".repeat(10_000)),
                ("DRI_PRIME", "pci-0000_01_00_0"),
            ],
            &[true, false],
        ),
    ];
    check(&env, &nodes, cases);
}
/// `gpuctl run --gpu` through the daemon, on a machine with two NVIDIA GPUs,
/// names the provider (tier1::envgrant checks it without a daemon).
#[test]
#[ignore = "root"]
fn run_names_the_nvidia_provider_with_several_nvidia_gpus() {
    require_root(module_path!());
    let env = smart(machine("two_nvidia"));
    let vars = run_env(&env.machine, &env.socket(), "2");
    assert!(
        vars.contains("__NV_PRIME_RENDER_OFFLOAD_PROVIDER=NVIDIA-G1"),
        "{vars}"
    );
}
