//! Processes that hold a GPU's nodes open (`gpuctl who`): they keep it awake.
//!
//! Reads `<procfs>/<pid>/fd/*` and `stat`s each link: `stat` follows the
//! link to the inode without opening the device, so this never wakes a GPU.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::gpu::{DevNum, DisplayHolder, Inventory};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Holder {
    pub gpu: u32,
    pub pid: u32,
    pub comm: String,
    /// The node as the process opened it (`/dev/dri/card1`).
    pub path: String,
    pub node: DevNum,
    /// The owner of `/proc/<pid>` (the process's effective uid; root for
    /// a non-dumpable process): who may see this holder's pid and name.
    pub uid: u32,
    /// What the holder is when it is not a program using the GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<HolderRole>,
}

/// A holder that is not a program using the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderRole {
    /// PID 1 (systemd) keeps the descriptor in a unit's file-descriptor
    /// store (`FDSTORE=1`): systemd-logind stores every device it opened
    /// for a session there, so the session survives a logind restart.
    /// It is a copy of the compositor's descriptor, not a user of the GPU.
    FdStore,
}

impl HolderRole {
    /// The role of the holder with process id `pid`: systemd itself never
    /// opens a GPU node, so PID 1's descriptors of one are fd-store copies.
    pub fn of(pid: u32) -> Option<HolderRole> {
        (pid == 1).then_some(HolderRole::FdStore)
    }
}

impl Holder {
    /// `comm (pid N)`, or for an fd-store copy what it is.
    pub fn describe(&self) -> String {
        match self.role {
            Some(HolderRole::FdStore) => format!(
                "{} (pid {}, fd store: a stored copy, as systemd-logind keeps a session's devices)",
                self.comm, self.pid
            ),
            None => format!("{} (pid {})", self.comm, self.pid),
        }
    }
}

fn split_rdev(rdev: u64) -> DevNum {
    DevNum::from_userspace(rdev)
}

/// Who holds the GPUs of `inv` open: every GPU, or only the one `gpu`
/// names (an id or PCI address; an unknown one is an error message).
pub fn holders_of(
    inv: &Inventory,
    procfs: &Path,
    gpu: Option<&str>,
) -> Result<Vec<Holder>, String> {
    let only = gpu.map(|a| inv.find(a).map(|g| g.id)).transpose()?;
    let mut owners = crate::gpu::node_owners(inv);
    owners.retain(|_, id| only.is_none_or(|o| o == *id));
    Ok(holders(procfs, &owners))
}

/// Every open file descriptor, in any process, of a node in `owners`
/// (device number → GPU id). Processes we may not inspect are skipped.
pub fn holders(procfs: &Path, owners: &BTreeMap<DevNum, u32>) -> Vec<Holder> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir(procfs) else {
        return out;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Ok(pid) = name.to_string_lossy().parse::<u32>() else {
            continue;
        };
        let mut found = holders_of_pid(&p.path(), pid, "", owners);
        if found.is_empty() {
            continue;
        }
        // The name and owner are read only for processes that hold a GPU.
        let comm = crate::gpu::read_attr(&p.path().join("comm")).unwrap_or_default();
        let uid = p.metadata().map(|m| m.uid()).unwrap_or(0);
        for h in &mut found {
            h.comm.clone_from(&comm);
            h.uid = uid;
        }
        out.extend(found);
    }
    out.sort();
    out.dedup();
    out
}

/// Process names (`comm`, at most 15 bytes) of display servers, and of
/// `systemd-logind`, which opens the primary node for a compositor
/// (`TakeDevice`) and keeps its own descriptor.
pub const DISPLAY_SERVERS: &[&str] = &[
    "Xorg",
    "X",
    "Xorg.bin",
    "gnome-shell",
    "mutter",
    "kwin_wayland",
    "kwin_x11",
    "sway",
    "weston",
    "Hyprland",
    "labwc",
    "wayfire",
    "river",
    "niri",
    "cage",
    "gamescope",
    "cosmic-comp",
    "enlightenment",
    "systemd-logind",
];

/// Where logind describes its sessions (one file per session).
pub const LOGIND_SESSIONS: &str = "/run/systemd/sessions";

/// The owners of logind's graphical sessions (`TYPE=x11`, `wayland` or
/// `mir`, not closing): the users whose compositor may hold a GPU.
pub fn graphical_session_uids(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        // Regular files only, opened without blocking: logind keeps a FIFO
        // per session here (`N.ref`), and a read of it waits for the
        // session to end.
        let Ok(bytes) = crate::safefile::read_capped(&e.path(), 64 << 10) else {
            continue;
        };
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
        };
        let graphical = matches!(get("TYPE"), Some("x11" | "wayland" | "mir"));
        let closing = get("STATE") == Some("closing");
        if let (true, false, Some(uid)) =
            (graphical, closing, get("UID").and_then(|u| u.parse().ok()))
        {
            out.push(uid);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Display servers holding one of `primary` (a GPU's primary nodes:
/// `cardN`, and `nvidiaN` for NVIDIA's Xorg driver; device number → GPU
/// id) open for reading or writing, by GPU: `comm (pid N)`. A display
/// server is known by what it is, not only by its name (issue 18): named
/// like one, run by root or by the owner of a graphical logind session
/// (`seat_uids`), from a root-owned executable. Reads one `comm` per
/// process, stats `/proc/<pid>` and its `exe` for those named like one,
/// and scans the descriptors of the few that pass: cheap on a busy
/// desktop, and a plain user's processes named `Xorg` cost one stat each.
pub fn display_holders(
    procfs: &Path,
    primary: &BTreeMap<DevNum, u32>,
) -> BTreeMap<u32, DisplayHolder> {
    display_holders_for(
        procfs,
        primary,
        &graphical_session_uids(Path::new(LOGIND_SESSIONS)),
    )
}

/// [`display_holders`] with the graphical sessions' owners given.
pub fn display_holders_for(
    procfs: &Path,
    primary: &BTreeMap<DevNum, u32>,
    seat_uids: &[u32],
) -> BTreeMap<u32, DisplayHolder> {
    let mut out: Vec<Holder> = Vec::new();
    if primary.is_empty() {
        return BTreeMap::new();
    }
    let Ok(procs) = std::fs::read_dir(procfs) else {
        return BTreeMap::new();
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Ok(pid) = name.to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Some(comm) = read_comm(&p.path()) else {
            continue;
        };
        if !DISPLAY_SERVERS.contains(&comm.as_str()) {
            continue;
        }
        let Ok(uid) = p.metadata().map(|m| m.uid()) else {
            continue;
        };
        if uid != 0 && !seat_uids.contains(&uid) {
            continue;
        }
        // `exe` followed: the executable's owner (a user's own copy of a
        // binary, or one they could rewrite, is not a display server).
        if std::fs::metadata(p.path().join("exe"))
            .ok()
            .map(|m| m.uid())
            != Some(0)
        {
            continue;
        }
        out.extend(holders_of_pid(&p.path(), pid, &comm, primary));
    }
    display_servers_among(&out)
}

/// `<procfs>/<pid>/comm` in one read(2) into a stack buffer (comm is at
/// most 15 bytes): this runs for every process on a mode change, so no
/// fstat, no growing buffer.
fn read_comm(dir: &Path) -> Option<String> {
    use std::io::Read;
    let mut buf = [0u8; 32];
    let n = std::fs::File::open(dir.join("comm"))
        .ok()?
        .read(&mut buf)
        .ok()?;
    let s = std::str::from_utf8(&buf[..n]).ok()?;
    Some(s.trim_end_matches('\n').to_string())
}

/// The descriptors of one process (`<procfs>/<pid>`) that are nodes in
/// `owners`. Device nodes live under /dev in every mount namespace
/// (containers and Flatpak bind-mount /dev/dri). Only those are stat'ed:
/// stat follows the link to the file's filesystem, and a hung network mount
/// would stall the daemon's loop.
fn holders_of_pid(dir: &Path, pid: u32, comm: &str, owners: &BTreeMap<DevNum, u32>) -> Vec<Holder> {
    let mut out = Vec::new();
    let Ok(fds) = std::fs::read_dir(dir.join("fd")) else {
        return out;
    };
    for fd in fds.flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        if !target.starts_with("/dev/") {
            continue;
        }
        let Ok(meta) = std::fs::metadata(fd.path()) else {
            continue;
        };
        if !meta.file_type().is_char_device() {
            continue;
        }
        let node = split_rdev(meta.rdev());
        if let Some(&gpu) = owners.get(&node) {
            if !opened_for_io(dir, &fd.file_name()) {
                continue;
            }
            out.push(Holder {
                gpu,
                pid,
                comm: comm.to_string(),
                path: target.to_string_lossy().into_owned(),
                node,
                uid: 0,
                role: HolderRole::of(pid),
            });
        }
    }
    out
}

/// Whether descriptor `fd` of the process at `dir` was opened for reading or
/// writing: an `O_PATH` descriptor (`flags:` in `fdinfo`, octal) needs no
/// permission, wakes nothing and is no holder. A missing `fdinfo` (a fixture
/// procfs) counts as opened.
fn opened_for_io(dir: &Path, fd: &std::ffi::OsStr) -> bool {
    const O_PATH: u32 = 0o10_000_000;
    let Ok(info) = std::fs::read_to_string(dir.join("fdinfo").join(fd)) else {
        return true;
    };
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_none_or(|f| f & O_PATH == 0)
}

/// The display servers among `holders` (of primary nodes), by GPU:
/// `comm (pid N)`, the compositor named rather than logind, its helper.
pub fn display_servers_among(holders: &[Holder]) -> BTreeMap<u32, DisplayHolder> {
    let mut out: BTreeMap<u32, DisplayHolder> = BTreeMap::new();
    for h in holders {
        if !DISPLAY_SERVERS.contains(&h.comm.as_str()) {
            continue;
        }
        let held = DisplayHolder {
            comm: h.comm.clone(),
            pid: h.pid,
            uid: h.uid,
        };
        match out.get(&h.gpu) {
            Some(e) if e.comm != "systemd-logind" => {}
            _ => {
                out.insert(h.gpu, held);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// logind keeps a FIFO per session next to its state file
    /// (`/run/systemd/sessions/N.ref`, the session's end is the writers'
    /// close): reading the directory must not open it as a file. Opening
    /// it blocked the daemon's loop for as long as the session lived (the
    /// display-server walk of every `set` that blocks a GPU, and the start
    /// with a saved mode that does; found in the distro tier once alice's
    /// autologin session was active).
    #[test]
    fn graphical_session_uids_skips_logind_s_session_fifos() {
        let dir = std::env::temp_dir().join(format!("gpuctl-sessions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("2"), "UID=1000\nTYPE=wayland\nSTATE=active\n").unwrap();
        let fifo =
            std::ffi::CString::new(dir.join("2.ref").as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        // A writer holds it, as the session's pam_systemd does.
        let writer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("2.ref"))
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.clone();
        std::thread::spawn(move || {
            let _ = tx.send(graphical_session_uids(&d));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(5));
        drop(writer);
        assert_eq!(
            got,
            Ok(vec![1000]),
            "reading the sessions blocked on the FIFO"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rdev_encoding() {
        // makedev(226, 129) and makedev(195, 255) as glibc encodes them.
        assert_eq!(split_rdev((226 << 8) | 129), DevNum::new(226, 129));
        assert_eq!(split_rdev((195 << 8) | 255), DevNum::new(195, 255));
        // A minor above 255 uses the high bits.
        let rdev = (226u64 << 8) | (0x12u64 << 20) | 0x34;
        assert_eq!(split_rdev(rdev), DevNum::new(226, 0x1234));
    }

    /// A fake procfs: each pid with a comm and fds pointing at real
    /// device nodes (/dev/null 1:3, /dev/zero 1:5 stand in for GPU nodes).
    fn fake_proc(tag: &str, procs: &[(u32, &str, &[&str])]) -> std::path::PathBuf {
        let root = std::env::temp_dir().join(format!("gpuctl-procs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (pid, comm, fds) in procs {
            let d = root.join(pid.to_string());
            std::fs::create_dir_all(d.join("fd")).unwrap();
            std::fs::write(d.join("comm"), format!("{comm}\n")).unwrap();
            std::os::unix::fs::symlink("/bin/sh", d.join("exe")).unwrap();
            for (i, t) in fds.iter().enumerate() {
                std::os::unix::fs::symlink(t, d.join(format!("fd/{}", i + 3))).unwrap();
            }
        }
        root
    }

    #[test]
    fn display_holders_names_the_compositor_not_other_programs() {
        let owners = BTreeMap::from([(DevNum::new(1, 3), 1), (DevNum::new(1, 5), 2)]);
        let root = fake_proc(
            "ds",
            &[
                (10, "systemd-logind", &["/dev/null"]),
                (20, "gnome-shell", &["/dev/null", "/etc/hostname"]),
                (30, "glxgears", &["/dev/zero"]),
                (40, "systemd-logind", &["/dev/zero"]),
            ],
        );
        let h = display_holders(&root, &owners);
        let shown = |g: u32| h.get(&g).map(ToString::to_string);
        assert_eq!(shown(1).as_deref(), Some("gnome-shell (pid 20)"));
        // Only logind holds GPU 2 (for a compositor): it is named.
        assert_eq!(shown(2).as_deref(), Some("systemd-logind (pid 40)"));
        // A plain program holding a GPU is not a display server.
        let root2 = fake_proc("plain", &[(30, "glxgears", &["/dev/null"])]);
        assert!(display_holders(&root2, &owners).is_empty());
        assert!(display_holders(&root, &BTreeMap::new()).is_empty());
        // `who` still lists every holder.
        let all = holders(&root, &owners);
        assert_eq!(all.len(), 4, "{all:?}");
        assert!(all.iter().any(|h| h.comm == "glxgears" && h.gpu == 2));
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::remove_dir_all(&root2).unwrap();
    }

    #[test]
    fn names_holders_of_a_gpu_function_sound_node() {
        // A GPU whose HD-audio function's ALSA node is (here) /dev/null.
        let f = std::fs::File::open("/dev/null").unwrap();
        let gpu: crate::gpu::Gpu = serde_json::from_value(serde_json::json!({
            "id": 1, "pci": "0000:01:00.0", "vendor_id": "10de", "device_id": "25a2",
            "vendor": null, "name": null, "driver": "nvidia", "default": false,
            "offload": true, "discrete": true, "boot_vga": false, "card": null,
            "render": null, "nodes": [], "nvidia_minor": null, "power_state": null,
            "runtime_status": null, "displays": [], "blocked": null,
            "functions": [{"pci": "0000:01:00.1", "vendor_id": "10de",
                "device_id": "2291", "class": "0x040300", "driver": "snd_hda_intel",
                "power_state": null, "runtime_status": null, "sound_nodes": ["1:3"]}]
        }))
        .unwrap();
        let inv = Inventory {
            gpus: vec![gpu],
            ..Default::default()
        };
        let h = holders_of(&inv, Path::new("/proc"), Some("1")).unwrap();
        let me = std::process::id();
        assert!(
            h.iter()
                .any(|h| h.pid == me && h.gpu == 1 && h.path == "/dev/null"),
            "{h:?}"
        );
        drop(f);
    }

    #[test]
    fn finds_this_process_holding_dev_null() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let owners = BTreeMap::from([(DevNum::new(1, 3), 7)]);
        let h = holders(Path::new("/proc"), &owners);
        let me = std::process::id();
        assert!(
            h.iter()
                .any(|h| h.pid == me && h.gpu == 7 && h.path == "/dev/null"),
            "{h:?}"
        );
        drop(f);
    }
}
