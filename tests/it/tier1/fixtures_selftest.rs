//! Self-tests of the fixture builder (tests/common/fixture.rs), not of gpuctl's discovery.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::common::fixture::{machine, Builder, Gpu, Machine, MACHINES};

fn all() -> impl Iterator<Item = Machine> {
    MACHINES.iter().map(|n| machine(n))
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    match fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.unwrap().path()).collect(),
        Err(_) => vec![],
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for p in entries(dir) {
        let m = fs::symlink_metadata(&p).unwrap();
        out.push(p.clone());
        if m.is_dir() {
            walk(&p, out);
        }
    }
}

fn is_pci_addr(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| [4, 7, 10].contains(&i) || c.is_ascii_hexdigit())
}

fn is_pci_function(dir: &Path) -> bool {
    let name = dir.file_name().unwrap().to_string_lossy();
    is_pci_addr(&name) && dir.join("vendor").is_file() && dir.join("class").is_file()
}

fn hex(p: &Path) -> u32 {
    let s = read(p);
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap()
}

fn uevent_value(p: &Path, key: &str) -> Option<String> {
    read(p)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}

#[test]
fn every_machine_builds_with_unique_name() {
    let names: BTreeSet<_> = MACHINES.iter().collect();
    assert_eq!(names.len(), MACHINES.len());
    for m in all() {
        assert!(m.sysfs().join("bus/pci/devices").is_dir(), "{}", m.name());
        assert!(m.procfs().is_dir());
        assert!(m.sysfs().starts_with(m.root()) && m.procfs().starts_with(m.root()));
        assert!(
            m.files_read().is_empty(),
            "{}: building read files",
            m.name()
        );
    }
}

#[test]
#[should_panic(expected = "unknown fixture machine")]
fn unknown_machine_panics() {
    machine("no_such_machine");
}

#[test]
fn every_symlink_is_relative_and_resolves_inside_the_tree() {
    for m in all() {
        let mut paths = vec![];
        walk(m.root(), &mut paths);
        let root = fs::canonicalize(m.root()).unwrap();
        let mut links = 0;
        for p in paths {
            if !fs::symlink_metadata(&p).unwrap().file_type().is_symlink() {
                continue;
            }
            links += 1;
            let text = fs::read_link(&p).unwrap();
            assert!(
                text.is_relative(),
                "{}: absolute link {}",
                p.display(),
                text.display()
            );
            let target = fs::canonicalize(&p)
                .unwrap_or_else(|e| panic!("{}: {} dangles: {e}", m.name(), p.display()));
            assert!(
                target.starts_with(&root),
                "{} escapes the tree",
                p.display()
            );
        }
        assert!(links > 0, "{}", m.name());
    }
}

#[test]
fn bus_pci_devices_resolve_to_consistent_functions() {
    for m in all() {
        let devs = entries(&m.sysfs().join("bus/pci/devices"));
        assert!(!devs.is_empty(), "{}", m.name());
        for link in devs {
            let addr = link.file_name().unwrap().to_string_lossy().to_string();
            let dir = fs::canonicalize(&link).unwrap();
            assert_eq!(dir.file_name().unwrap().to_string_lossy(), addr);
            assert!(dir.starts_with(fs::canonicalize(m.sysfs().join("devices")).unwrap()));
            assert!(is_pci_function(&dir), "{}", dir.display());
            for f in [
                "device",
                "subsystem_vendor",
                "subsystem_device",
                "revision",
                "power_state",
                "power/runtime_status",
                "power/control",
                "d3cold_allowed",
                "enable",
                "irq",
                "numa_node",
                "local_cpus",
                "resource",
                "modalias",
                "removable",
            ] {
                assert!(dir.join(f).is_file(), "{}: no {f}", dir.display());
            }
            assert_eq!(fs::metadata(dir.join("config")).unwrap().len(), 256);
            let uevent = dir.join("uevent");
            assert_eq!(
                uevent_value(&uevent, "PCI_SLOT_NAME").as_deref(),
                Some(addr.as_str())
            );
            let id = format!(
                "{:04X}:{:04X}",
                hex(&dir.join("vendor")),
                hex(&dir.join("device"))
            );
            assert_eq!(uevent_value(&uevent, "PCI_ID"), Some(id));
            assert_eq!(
                fs::canonicalize(dir.join("subsystem")).unwrap(),
                fs::canonicalize(m.sysfs().join("bus/pci")).unwrap()
            );
            // The parent directory is a bridge or the host bridge's pciDDDD:BB.
            let parent = dir.parent().unwrap();
            let pname = parent.file_name().unwrap().to_string_lossy();
            if pname.starts_with("pci") {
                assert_eq!(parent.parent().unwrap().file_name().unwrap(), "devices");
            } else {
                assert_eq!(hex(&parent.join("class")) >> 8, 0x0604, "{}", dir.display());
            }
            match uevent_value(&uevent, "DRIVER") {
                Some(drv) => {
                    let d = fs::canonicalize(dir.join("driver")).unwrap();
                    assert_eq!(
                        d,
                        fs::canonicalize(m.sysfs().join("bus/pci/drivers").join(&drv)).unwrap()
                    );
                    assert_eq!(
                        fs::canonicalize(d.join(&addr)).unwrap(),
                        dir,
                        "driver back-link"
                    );
                }
                None => assert!(fs::symlink_metadata(dir.join("driver")).is_err()),
            }
        }
    }
}

#[test]
fn no_two_pci_functions_share_an_address() {
    for m in all() {
        let mut paths = vec![];
        walk(&m.sysfs().join("devices"), &mut paths);
        let fns: Vec<String> = paths
            .iter()
            .filter(|p| fs::symlink_metadata(p).unwrap().is_dir() && is_pci_function(p))
            .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        let unique: BTreeSet<_> = fns.iter().collect();
        assert_eq!(unique.len(), fns.len(), "{}", m.name());
        assert_eq!(fns.len(), entries(&m.sysfs().join("bus/pci/devices")).len());
    }
}

#[test]
fn boot_vga_exists_only_for_vga_class() {
    for m in all() {
        for link in entries(&m.sysfs().join("bus/pci/devices")) {
            let vga = hex(&link.join("class")) >> 8 == 0x0300;
            assert_eq!(link.join("boot_vga").exists(), vga, "{}", link.display());
        }
    }
}

#[test]
fn drm_entries_have_dev_numbers_and_resolve_to_their_device() {
    for m in all() {
        let class = m.sysfs().join("class/drm");
        if m.name() == "none" {
            assert!(!class.exists(), "no DRM loaded on a machine with no GPU");
            continue;
        }
        assert_eq!(read(&class.join("version")), "drm 1.1.0 20060810\n");
        for e in entries(&class) {
            let name = e.file_name().unwrap().to_string_lossy().to_string();
            if name == "version" {
                continue;
            }
            let dir = fs::canonicalize(&e).unwrap();
            let dev = e.join("dev");
            if dev.exists() {
                assert_eq!(
                    dir.parent().unwrap().file_name().unwrap(),
                    "drm",
                    "{}",
                    dir.display()
                );
                let text = read(&dev);
                let (maj, min) = text.trim_end().split_once(':').expect("MAJ:MIN");
                let (maj, min): (u32, u32) = (maj.parse().unwrap(), min.parse().unwrap());
                assert_eq!(maj, 226);
                let n: u32 = name
                    .trim_start_matches("card")
                    .trim_start_matches("renderD")
                    .parse()
                    .unwrap();
                assert_eq!(n, min, "{name}");
                assert_eq!(
                    fs::canonicalize(m.sysfs().join(format!("dev/char/226:{min}"))).unwrap(),
                    dir
                );
                assert_eq!(
                    uevent_value(&e.join("uevent"), "DEVNAME"),
                    Some(format!("dri/{name}"))
                );
                // device: a PCI function, a virtio child of one, or a platform device.
                let owner = fs::canonicalize(e.join("device")).unwrap();
                assert_eq!(owner, dir.parent().unwrap().parent().unwrap());
                let oname = owner.file_name().unwrap().to_string_lossy().to_string();
                if oname.starts_with("virtio") {
                    assert!(is_pci_function(owner.parent().unwrap()));
                    assert!(fs::canonicalize(owner.join("driver"))
                        .unwrap()
                        .ends_with("bus/virtio/drivers/virtio_gpu"));
                    let pdrv = fs::canonicalize(owner.parent().unwrap().join("driver")).unwrap();
                    assert!(pdrv.ends_with("bus/pci/drivers/virtio-pci"));
                } else if owner.parent().unwrap().ends_with("devices/platform") {
                    assert_eq!(oname, "simple-framebuffer.0");
                } else {
                    assert!(is_pci_function(&owner), "{}", owner.display());
                }
            } else {
                // A connector: cardN-TYPE-K under cardN.
                let card = fs::canonicalize(e.join("device")).unwrap();
                let cname = card.file_name().unwrap().to_string_lossy().to_string();
                assert!(name.starts_with(&format!("{cname}-")), "{name}");
                assert_eq!(
                    dir.parent().unwrap().parent().unwrap(),
                    card.parent().unwrap()
                );
                let status = read(&e.join("status"));
                assert!(
                    status == "connected\n" || status == "disconnected\n",
                    "{status:?}"
                );
            }
        }
    }
}

#[test]
fn gpu_info_matches_the_tree() {
    for m in all() {
        for g in m.gpus() {
            let pci = fs::canonicalize(m.pci_dev(&g.addr)).unwrap();
            for node in g.card.iter().chain(&g.render) {
                let dir = fs::canonicalize(m.sysfs().join("class/drm").join(node)).unwrap();
                assert!(dir.starts_with(&pci), "{node} not under {}", g.addr);
            }
            let drm_nodes = g.nodes.iter().filter(|n| n.starts_with("226:")).count();
            assert_eq!(drm_nodes, g.card.iter().count() + g.render.iter().count());
            for (c, connected) in &g.connectors {
                let s = read(&m.sysfs().join("class/drm").join(c).join("status"));
                assert_eq!(s == "connected\n", *connected);
            }
            let info = m
                .procfs()
                .join(format!("driver/nvidia/gpus/{}/information", g.addr));
            assert_eq!(info.exists(), g.nvidia_minor.is_some(), "{}", g.addr);
            assert_eq!(g.boot_vga.is_some(), pci.join("boot_vga").exists());
        }
        // The expected default is one of the GPUs; a boot_vga GPU wins when there is one.
        match m.expected_default() {
            None => assert!(m.gpus().is_empty(), "{}", m.name()),
            Some(d) => {
                m.gpu(d);
                if let Some(b) = m.gpus().iter().find(|g| g.boot_vga == Some(true)) {
                    assert_eq!(b.addr, d, "{}", m.name());
                }
            }
        }
    }
}

#[test]
fn nvidia_proc_entries_match_bound_functions() {
    for m in all() {
        for dir in entries(&m.procfs().join("driver/nvidia/gpus")) {
            let addr = dir.file_name().unwrap().to_string_lossy().to_string();
            let info = read(&dir.join("information"));
            let field = |k: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(|v| v.trim_start_matches(':').trim().to_string())
                    .unwrap_or_else(|| panic!("no {k} in {info}"))
            };
            assert_eq!(field("Bus Location"), addr);
            assert_eq!(field("Bus Type"), "PCIe");
            assert_eq!(field("GPU Excluded"), "No");
            assert!(field("GPU UUID").starts_with("GPU-"));
            let minor: u32 = field("Device Minor").parse().unwrap();
            assert_eq!(m.gpu(&addr).nvidia_minor, Some(minor));
            let drv = fs::canonicalize(m.pci_dev(&addr).join("driver")).unwrap();
            assert!(drv.ends_with("bus/pci/drivers/nvidia"));
            assert!(m.procfs().join("driver/nvidia/params").is_file());
        }
    }
}

#[test]
fn pci_ids_are_real() {
    for m in all() {
        for link in entries(&m.sysfs().join("bus/pci/devices")) {
            let (v, d) = (
                hex(&link.join("vendor")) as u16,
                hex(&link.join("device")) as u16,
            );
            let dev = pci_ids::Device::from_vid_pid(v, d);
            if (v, d) == (0x1234, 0x1111) {
                // QEMU's stdvga: vendor 1234 is not in the PCI ID database.
                assert!(dev.is_none());
            } else {
                assert!(
                    dev.is_some(),
                    "{}: {v:04x}:{d:04x} not in pci.ids",
                    m.name()
                );
            }
        }
    }
    assert_eq!(
        pci_ids::Device::from_vid_pid(0x10de, 0x25a2)
            .unwrap()
            .name(),
        "GA107M [GeForce RTX 3050 Mobile]"
    );
}

#[test]
fn links_are_spelled_like_the_kernel() {
    let m = machine("intel_nvidia");
    let s = m.sysfs();
    let link = |p: &str| {
        fs::read_link(s.join(p))
            .unwrap()
            .to_string_lossy()
            .to_string()
    };
    let igpu = "devices/pci0000:00/0000:00:02.0";
    let dgpu = "devices/pci0000:00/0000:00:01.0/0000:01:00.0";
    assert_eq!(
        link(&format!("{igpu}/driver")),
        "../../../bus/pci/drivers/i915"
    );
    assert_eq!(link(&format!("{igpu}/subsystem")), "../../../bus/pci");
    assert_eq!(
        link(&format!("{dgpu}/driver")),
        "../../../../bus/pci/drivers/nvidia"
    );
    assert_eq!(
        link("bus/pci/devices/0000:01:00.0"),
        format!("../../../{dgpu}")
    );
    assert_eq!(
        link("bus/pci/drivers/nvidia/0000:01:00.0"),
        format!("../../../../{dgpu}")
    );
    assert_eq!(
        link(&format!("{igpu}/drm/card1/device")),
        "../../../0000:00:02.0"
    );
    assert_eq!(
        link(&format!("{igpu}/drm/card1/subsystem")),
        "../../../../../class/drm"
    );
    assert_eq!(link("class/drm/card1"), format!("../../{igpu}/drm/card1"));
    assert_eq!(
        link("class/drm/card1-eDP-1"),
        format!("../../{igpu}/drm/card1/card1-eDP-1")
    );
    assert_eq!(
        link(&format!("{igpu}/drm/card1/card1-eDP-1/device")),
        "../../card1"
    );
    assert_eq!(
        link("dev/char/226:129"),
        format!("../../{dgpu}/drm/renderD129")
    );
    assert_eq!(read(&s.join(format!("{dgpu}/vendor"))), "0x10de\n");
    assert_eq!(read(&s.join(format!("{dgpu}/class"))), "0x030000\n");
    assert_eq!(read(&s.join(format!("{dgpu}/power_state"))), "D3cold\n");
    assert_eq!(
        uevent_value(&s.join(format!("{dgpu}/uevent")), "MODALIAS").unwrap(),
        "pci:v000010DEd000025A2sv00001043sd00001CCDbc03sc00i00"
    );

    let v = machine("vm_virtio");
    let vl = |p: &str| {
        fs::read_link(v.sysfs().join(p))
            .unwrap()
            .to_string_lossy()
            .to_string()
    };
    let d = "devices/pci0000:00/0000:00:03.0";
    assert_eq!(
        vl(&format!("{d}/driver")),
        "../../../bus/pci/drivers/virtio-pci"
    );
    assert_eq!(
        vl(&format!("{d}/virtio1/driver")),
        "../../../../bus/virtio/drivers/virtio_gpu"
    );
    assert_eq!(
        vl(&format!("{d}/virtio1/drm/card1/device")),
        "../../../virtio1"
    );
    assert_eq!(
        vl("class/drm/renderD129"),
        format!("../../{d}/virtio1/drm/renderD129")
    );
    assert!(!v.sysfs().join(format!("{d}/boot_vga")).exists());

    let a = machine("amd_amd");
    let al = |p: &str| {
        fs::read_link(a.sysfs().join(p))
            .unwrap()
            .to_string_lossy()
            .to_string()
    };
    assert_eq!(
        al("class/drm/card0"),
        "../../devices/platform/simple-framebuffer.0/drm/card0"
    );
    assert_eq!(
        al("devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0/driver"),
        "../../../../../../bus/pci/drivers/amdgpu"
    );
}

#[test]
fn power_and_removable_follow_the_topology() {
    let m = machine("egpu");
    let rem = |a: &str| read(&m.pci_dev(a).join("removable"));
    assert_eq!(rem("0000:00:07.0"), "fixed\n");
    for a in [
        "0000:05:00.0",
        "0000:06:01.0",
        "0000:07:00.0",
        "0000:07:00.1",
    ] {
        assert_eq!(rem(a), "removable\n", "{a}");
    }
    assert_eq!(rem("0000:00:02.0"), "fixed\n");
    assert!(m.gpu("0000:07:00.0").removable);

    let m = machine("intel_nvidia");
    let bridge = m.pci_dev("0000:00:01.0");
    assert_eq!(read(&bridge.join("power/runtime_status")), "suspended\n");
    assert_eq!(read(&bridge.join("power_state")), "D3cold\n");
    m.set_power("0000:01:00.0", "D0", "active");
    assert_eq!(read(&m.pci_dev("0000:01:00.0").join("power_state")), "D0\n");
    m.set_connector("card0-HDMI-A-2", true);
    assert_eq!(
        read(&m.sysfs().join("class/drm/card0-HDMI-A-2/status")),
        "connected\n"
    );
}

#[test]
fn reads_are_recorded_and_risky_ones_flagged() {
    let m = machine("intel_nvidia");
    if !m.atime_tracking() {
        eprintln!("atime not tracked on this file system (noatime?): skipped");
        return;
    }
    assert!(m.files_read().is_empty());
    read(&m.pci_dev("0000:01:00.0").join("vendor"));
    assert!(m.wake_risky_reads().is_empty());
    assert_eq!(m.files_read().len(), 1);
    fs::read(m.pci_dev("0000:01:00.0").join("config")).unwrap();
    let risky = m.wake_risky_reads();
    assert_eq!(risky.len(), 1);
    assert!(risky[0].ends_with("0000:01:00.0/config"), "{risky:?}");
}

#[test]
fn custom_builder_and_drop() {
    let m = Builder::new()
        .pci_bridge("0000:00:01.0", None, 0x8086, 0x460d)
        .gpu(Gpu {
            parent: Some("0000:00:01.0"),
            driver: Some("nouveau"),
            boot_vga: Some(true),
            card: Some(0),
            render: Some(128),
            connectors: &[("LVDS-1", true)],
            ..Gpu::new("0000:01:00.0", 0x10de, 0x25a2)
        })
        .build();
    let g = m.gpu("0000:01:00.0");
    assert_eq!(g.nodes, ["226:0", "226:128"]);
    assert_eq!(g.connectors, [("card0-LVDS-1".to_string(), true)]);
    assert_eq!(read(&m.pci_dev("0000:01:00.0").join("boot_vga")), "1\n");
    let root = m.root().to_path_buf();
    assert!(root.is_dir());
    drop(m);
    assert!(!root.exists());
}
