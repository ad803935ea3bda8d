//! Processes that hold a GPU's nodes open (`gpuctl who`): they keep it awake.
//!
//! Reads `<procfs>/<pid>/fd/*` and `stat`s each link: `stat` follows the
//! link to the inode without opening the device, so this never wakes a GPU.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::gpu::{DevNum, Inventory};

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
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let mut comm = None;
        for fd in fds.flatten() {
            // Device nodes live under /dev in every mount namespace
            // (containers and Flatpak bind-mount /dev/dri). Only those are
            // stat'ed: stat follows the link to the file's filesystem, and
            // a hung network mount would stall the daemon's loop.
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
            let Some(&gpu) = owners.get(&node) else {
                continue;
            };
            let comm = comm
                .get_or_insert_with(|| {
                    std::fs::read_to_string(p.path().join("comm"))
                        .map(|s| s.trim().to_string())
                        .unwrap_or_default()
                })
                .clone();
            let path = target.to_string_lossy().into_owned();
            let uid = p.metadata().map(|m| m.uid()).unwrap_or(0);
            out.push(Holder {
                gpu,
                pid,
                comm,
                path,
                node,
                uid,
            });
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdev_encoding() {
        // makedev(226, 129) and makedev(195, 255) as glibc encodes them.
        assert_eq!(split_rdev((226 << 8) | 129), DevNum::new(226, 129));
        assert_eq!(split_rdev((195 << 8) | 255), DevNum::new(195, 255));
        // A minor above 255 uses the high bits.
        let rdev = (226u64 << 8) | (0x12u64 << 20) | 0x34;
        assert_eq!(split_rdev(rdev), DevNum::new(226, 0x1234));
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
        let inv = Inventory { gpus: vec![gpu] };
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
