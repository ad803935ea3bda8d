//! `gpuctl who` finds the processes holding a GPU open by the device number
//! of the node their fd links point at (root: it `mknod`s under /dev).

use crate::common::fixture::machine;
use crate::common::harness::require_root;
use crate::tier1::doctor::gpuctl;

#[test]
#[ignore = "root"]
fn who_finds_holders_by_device_number() {
    require_root("who_finds_holders_by_device_number");
    let m = machine("intel_nvidia");
    // A process of the fixture's procfs holding the NVIDIA card open: its
    // fd link points at a node with the card's device number (226:0),
    // under a name that says nothing about it.
    // Under /dev (as real device nodes are: `who` only follows fd links
    // into /dev), with a name that says nothing about the GPU.
    let node = std::path::PathBuf::from(format!("/dev/shm/gpuctl-who-{}", std::process::id()));
    let _ = std::fs::remove_file(&node);
    let c = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
    // SAFETY: valid path; plain mknod(2).
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(226, 0)) };
    assert_eq!(r, 0);
    let fd_dir = m.procfs().join("4242/fd");
    std::fs::create_dir_all(&fd_dir).unwrap();
    std::os::unix::fs::symlink(&node, fd_dir.join("7")).unwrap();
    std::fs::write(m.procfs().join("4242/comm"), "nvtop\n").unwrap();

    let (code, out) = gpuctl(&m, &["who", "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let h = &v["holders"][0];
    assert_eq!(h["pid"], 4242);
    assert_eq!(h["comm"], "nvtop");
    assert_eq!(h["gpu"], 1);
    assert_eq!(h["node"], "226:0");
    let (_, table) = gpuctl(&m, &["who", "1"]);
    assert!(table.contains("nvtop") && table.contains("4242"), "{table}");
    let (_, none) = gpuctl(&m, &["who", "0"]);
    assert!(none.contains("No process holds a GPU open"), "{none}");
    let (code, out) = gpuctl(&m, &["who", "9"]);
    assert_eq!(code, 2, "{}", out);
    let (_, doc) = gpuctl(&m, &["doctor"]);
    assert!(doc.contains("nvtop (pid 4242) holds"), "{doc}");
    // A link outside /dev is not followed (it could be a hung network mount).
    std::fs::remove_file(fd_dir.join("7")).unwrap();
    let elsewhere = std::path::PathBuf::from(format!("/tmp/gpuctl-who-{}", std::process::id()));
    let _ = std::fs::remove_file(&elsewhere);
    let c2 = std::ffi::CString::new(elsewhere.to_str().unwrap()).unwrap();
    // SAFETY: valid path; plain mknod(2).
    let r = unsafe { libc::mknod(c2.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(226, 0)) };
    assert_eq!(r, 0);
    std::os::unix::fs::symlink(&elsewhere, fd_dir.join("7")).unwrap();
    let (_, none) = gpuctl(&m, &["who", "1"]);
    assert!(none.contains("No process holds a GPU open"), "{none}");
    std::fs::remove_file(&node).unwrap();
    std::fs::remove_file(&elsewhere).unwrap();
}

/// Issue 22: while a compositor holds the card through logind, PID 1 holds a
/// copy (logind's fd store): `who` names it for what it is, not as another
/// user of the GPU.
#[test]
#[ignore = "root"]
fn who_names_pid_1s_copy_as_the_fd_store() {
    require_root("who_names_pid_1s_copy_as_the_fd_store");
    let m = machine("intel_nvidia");
    let node = std::path::PathBuf::from(format!("/dev/shm/gpuctl-who-fds-{}", std::process::id()));
    let _ = std::fs::remove_file(&node);
    let c = std::ffi::CString::new(node.to_str().unwrap()).unwrap();
    // SAFETY: valid path; plain mknod(2).
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(226, 0)) };
    assert_eq!(r, 0);
    for (pid, comm) in [("1", "systemd"), ("4243", "weston")] {
        let fd_dir = m.procfs().join(pid).join("fd");
        std::fs::create_dir_all(&fd_dir).unwrap();
        std::os::unix::fs::symlink(&node, fd_dir.join("9")).unwrap();
        std::fs::write(m.procfs().join(pid).join("comm"), format!("{comm}\n")).unwrap();
    }
    let (code, out) = gpuctl(&m, &["who", "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let hs = v["holders"].as_array().unwrap();
    let by_pid = |p: u64| {
        hs.iter()
            .find(|h| h["pid"] == p)
            .unwrap_or_else(|| panic!("{v}"))
    };
    assert_eq!(by_pid(1)["role"], "fd_store", "{v}");
    assert!(by_pid(4243).get("role").is_none(), "{v}");
    let (_, table) = gpuctl(&m, &["who"]);
    assert!(table.contains("systemd (fd store)"), "{table}");
    let (_, doc) = gpuctl(&m, &["doctor"]);
    assert!(doc.contains("systemd (pid 1, fd store"), "{doc}");
    assert!(doc.contains("weston (pid 4243) holds"), "{doc}");
    std::fs::remove_file(&node).unwrap();
}
