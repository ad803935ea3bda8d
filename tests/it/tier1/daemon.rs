//! The daemon and its clients where no root is needed: a client with no
//! daemon to talk to, and a daemon on a kernel it cannot enforce on. The
//! daemon at work is in root::daemon.

use crate::common::fixture::machine;
use crate::common::harness::describe;

#[test]
fn client_without_daemon_exits_3() {
    let env_dir = std::env::temp_dir().join(format!("gpuctl-nodaemon-{}", std::process::id()));
    let out = std::process::Command::new(crate::common::harness::BIN)
        .env("GPUCTL_SOCKET", env_dir.join("none.sock"))
        .arg("get")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not running"));
}

/// A kernel gpuctl cannot enforce on is a permanent condition: the daemon
/// exits with 78 (EX_CONFIG), which the systemd unit does not restart.
#[test]
fn unsupported_kernel_exits_78_instead_of_crash_looping() {
    let m = machine("intel_nvidia");
    let dir = m.root().join("d");
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(crate::common::harness::BIN)
            .env("GPUCTL_SOCKET", dir.join("s.sock"))
            .env("GPUCTL_SYSFS_ROOT", m.sysfs())
            .env("GPUCTL_STATE_DIR", &dir)
            .env("GPUCTL_CONFIG", dir.join("c.toml"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["daemon", "--cgroup", "/nonexistent-cgroup"]);
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpuctl doctor"));
    // The fixture has no BPF LSM in its security/lsm list.
    let out = run(&["daemon", "--backend", "lsm"]);
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lsm="));
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/systemd/gpuctl.service"
    ))
    .unwrap();
    assert!(unit.contains("RestartPreventExitStatus=78"));
}
