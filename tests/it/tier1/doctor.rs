//! `gpuctl doctor` and `gpuctl who` against fixture machines.

use std::process::Command;

use crate::common::fixture::{machine, Machine};
use crate::common::harness::BIN;

pub(crate) fn gpuctl(m: &Machine, args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .env("GPUCTL_SOCKET", m.root().join("no-daemon.sock"))
        .env("GPUCTL_SYSFS_ROOT", m.sysfs())
        .env("GPUCTL_PROCFS_ROOT", m.procfs())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn put(m: &Machine, rel: &str, content: &str) {
    let p = m.sysfs().join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

#[test]
fn doctor_says_how_to_fix_what_is_missing() {
    let m = machine("intel_nvidia");
    put(
        &m,
        "kernel/security/lsm",
        "lockdown,capability,landlock,yama,apparmor\n",
    );
    put(
        &m,
        "kernel/security/lockdown",
        "none [integrity] confidentiality\n",
    );
    m.write_sys("bus/pci/devices/0000:01:00.0/power/control", "on\n");
    let (code, out) = gpuctl(&m, &["doctor"]);
    assert_eq!(code, 1, "no BTF in the fixture is a failure: {out}");
    assert!(out.contains("BPF LSM not active"), "{out}");
    assert!(
        out.contains("lsm=lockdown,landlock,yama,apparmor,bpf"),
        "{out}"
    );
    assert!(
        out.contains("echo auto > /sys/bus/pci/devices/0000:01:00.0/power/control"),
        "{out}"
    );
    assert!(out.contains("kernel lockdown: integrity"), "{out}");
    assert!(
        out.contains("NVIDIA dynamic power management: driver default"),
        "{out}"
    );
    assert!(out.contains("daemon is not running"), "{out}");
    // The default GPU's power settings are not the user's concern.
    assert!(!out.contains("0000:00:02.0/power/control"), "{out}");
}

#[test]
fn doctor_all_good() {
    let m = machine("amd_amd");
    put(&m, "kernel/security/lsm", "capability,landlock,yama,bpf\n");
    put(&m, "kernel/btf/vmlinux", "");
    let (code, out) = gpuctl(&m, &["doctor"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("[ok  ] BPF LSM active"), "{out}");
    assert!(out.contains("D3cold allowed"), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
}

/// The desktop's own switcheroo-control keeps offering the blocked GPU in
/// integrated mode: doctor names it and says what to change (issue 22).
#[test]
fn doctor_names_the_desktops_switcheroo_control() {
    let m = machine("intel_nvidia");
    let (_, out) = gpuctl(&m, &["doctor"]);
    assert!(!out.contains("switcheroo-control"), "{out}");
    let dir = m.procfs().join("4242");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("comm"), "switcheroo-cont\n").unwrap();
    let (_, out) = gpuctl(&m, &["doctor"]);
    assert!(
        out.contains("the desktop's switcheroo-control is running (pid 4242)"),
        "{out}"
    );
    assert!(
        out.contains("systemctl disable --now switcheroo-control.service"),
        "{out}"
    );
    assert!(
        out.contains("systemctl enable --now gpuctl-switcheroo.service"),
        "{out}"
    );
}

/// The boot-time rescue (issue 20): doctor tells how to use it, and says
/// when this boot's command line carries a word.
#[test]
fn doctor_tells_the_rescue_words() {
    let m = machine("intel_nvidia");
    let (_, out) = gpuctl(&m, &["doctor"]);
    assert!(
        out.contains("a black screen after choosing a mode"),
        "{out}"
    );
    assert!(out.contains("gpuctl.mode=hybrid"), "{out}");
    assert!(out.contains("gpuctl.disable"), "{out}");
    assert!(!out.contains("this boot:"), "{out}");
    std::fs::write(m.procfs().join("cmdline"), "ro quiet gpuctl.mode=hybrid\n").unwrap();
    let (_, out) = gpuctl(&m, &["doctor"]);
    assert!(out.contains("this boot: gpuctl.mode=hybrid"), "{out}");
    std::fs::write(m.procfs().join("cmdline"), "ro gpuctl.disable\n").unwrap();
    let (_, out) = gpuctl(&m, &["doctor"]);
    assert!(out.contains("this boot: gpuctl.disable"), "{out}");
    std::fs::write(m.procfs().join("cmdline"), "ro gpuctl.mode=dgpu\n").unwrap();
    let (_, out) = gpuctl(&m, &["doctor"]);
    assert!(out.contains("unknown mode \"dgpu\""), "{out}");
}
