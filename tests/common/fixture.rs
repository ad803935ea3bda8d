//! Faithful copies of real machines' sysfs and procfs layouts, for discovery tests.
//!
//! A [`Machine`] is a temp dir holding `sys/` and `proc/` laid out exactly like the kernel
//! lays them out: PCI functions nested under their bridges in `sys/devices/pci0000:00/…`,
//! the real attribute files (`vendor` is `0x10de\n`, `boot_vga` exists only for VGA-class
//! functions, …), and relative symlinks spelled the way kernfs spells them (`driver`,
//! `subsystem`, `bus/pci/devices/*`, `class/drm/*`, `dev/char/*`, DRM `device`). Discovery
//! code written against a real `/sys` works on it unchanged.
//!
//! [`machine`] builds the named machines of [`MACHINES`]; [`Builder`] builds custom ones.
//! `examples/fixture.rs` (`make demo`) and `examples/bench.rs` (`make bench`) compile this
//! file too, by `#[path]`: keep it self-contained (std only, no `crate::`/`super::` paths).
//!
//! **Reads that would wake a GPU.** Every regular file is created with an access time of
//! [`SENTINEL_ATIME`] (2001) and a later modification time, so the first `read` of a file
//! moves its atime (on `relatime` and `strictatime` mounts alike, whatever the uid — root
//! ignores file modes, so modes alone cannot catch it). [`Machine::files_read`] lists every
//! file read since the build; [`Machine::wake_risky_reads`] the PCI `config`, `rom` and
//! `resourceN` files among them. `stat`/`readlink`/`read_dir` do not count. Check
//! [`Machine::atime_tracking`] first: on a `noatime` mount nothing is ever recorded.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, FileTimes};
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Every machine [`machine`] knows.
pub const MACHINES: &[&str] = &[
    "intel_nvidia",
    "amd_amd",
    "amd_nvidia",
    "mux_dgpu",
    "desktop_single",
    "desktop_monitor_dgpu",
    "egpu",
    "vm_virtio",
    "qemu_vga_virtio",
    "vfio",
    "nodriver",
    "none",
    "intel_nvidia_amd",
    "two_nvidia",
    "amd_760g",
];

/// Access time (seconds since the epoch) of every file of a fresh tree.
pub const SENTINEL_ATIME: i64 = 1_000_000_000;
const SENTINEL_MTIME: u64 = 1_100_000_000;

/// PCI class codes used below.
pub const CLASS_VGA: u32 = 0x030000;
pub const CLASS_3D: u32 = 0x030200;
pub const CLASS_DISPLAY_OTHER: u32 = 0x038000;
pub const CLASS_HDA: u32 = 0x040300;
pub const CLASS_BRIDGE: u32 = 0x060400;
pub const CLASS_HOST: u32 = 0x060000;

// ---------------------------------------------------------------------------------------
// Specs
// ---------------------------------------------------------------------------------------

/// One GPU PCI function and everything the kernel derives from it. One [`Builder::gpu`]
/// call writes the PCI function, its `driver`/`subsystem`/`bus/pci` links, its DRM nodes
/// and connectors with their `class/drm` and `dev/char` links, the `virtioN` child for
/// virtio GPUs, and `/proc/driver/nvidia/gpus/<addr>/` when `nvidia_minor` is set.
#[derive(Clone, Copy, Debug)]
pub struct Gpu<'a> {
    pub addr: &'a str,
    /// The bridge above it; `None` puts it on the root bus (`pci0000:00/<addr>`).
    pub parent: Option<&'a str>,
    pub vendor: u16,
    pub device: u16,
    pub subsys: (u16, u16),
    pub class: u32,
    pub revision: u8,
    /// The PCI driver (`virtio-pci` for virtio GPUs); `None` = no `driver` link.
    pub driver: Option<&'a str>,
    /// Value of `boot_vga`. The file exists iff the class is VGA (0x0300xx), as in the
    /// kernel: `None` there means `0`; `Some` on another class panics.
    pub boot_vga: Option<bool>,
    pub card: Option<u32>,
    pub render: Option<u32>,
    /// Connector names without the card prefix (`"eDP-1"` → `cardN-eDP-1`), connected?
    pub connectors: &'a [(&'a str, bool)],
    pub power_state: &'a str,
    pub runtime_status: &'a str,
    /// `power/control`: `auto` or `on`.
    pub power_control: &'a str,
    /// `Device Minor` in `/proc/driver/nvidia/gpus/<addr>/information` (driver `nvidia`).
    pub nvidia_minor: Option<u32>,
    /// DRM hangs under `<addr>/virtioN/` and the `virtioN` child is bound to `virtio_gpu`.
    pub virtio_index: Option<u32>,
    /// `removable` says `removable` (also implied below an external-facing port).
    pub removable: bool,
}

impl<'a> Gpu<'a> {
    /// A VGA-class function in D0/active with no driver, no DRM and no connectors.
    pub fn new(addr: &'a str, vendor: u16, device: u16) -> Self {
        Gpu {
            addr,
            parent: None,
            vendor,
            device,
            subsys: (vendor, device),
            class: CLASS_VGA,
            revision: 0,
            driver: None,
            boot_vga: None,
            card: None,
            render: None,
            connectors: &[],
            power_state: "D0",
            runtime_status: "active",
            power_control: "auto",
            nvidia_minor: None,
            virtio_index: None,
            removable: false,
        }
    }
}

/// A PCI function that is not a GPU (audio, USB, bridge, NIC, …).
#[derive(Clone, Copy, Debug)]
pub struct Func<'a> {
    pub addr: &'a str,
    pub parent: Option<&'a str>,
    pub vendor: u16,
    pub device: u16,
    pub subsys: (u16, u16),
    pub class: u32,
    pub revision: u8,
    pub driver: Option<&'a str>,
    pub power_state: &'a str,
    pub runtime_status: &'a str,
    pub power_control: &'a str,
    pub removable: bool,
}

impl<'a> Func<'a> {
    pub fn new(addr: &'a str, vendor: u16, device: u16, class: u32) -> Self {
        Func {
            addr,
            parent: None,
            vendor,
            device,
            subsys: (vendor, device),
            class,
            revision: 0,
            driver: None,
            power_state: "D0",
            runtime_status: "active",
            power_control: "on",
            removable: false,
        }
    }
}

/// What the fixture holds for one GPU, for comparing with discovery's inventory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub addr: String,
    pub vendor_id: u16,
    pub device_id: u16,
    pub class: u32,
    pub driver: Option<String>,
    /// `None` when the kernel creates no `boot_vga` file (non-VGA class).
    pub boot_vga: Option<bool>,
    pub card: Option<String>,
    pub render: Option<String>,
    /// `226:card`, `226:render`, `195:nvidia_minor`, in that order, those that exist.
    pub nodes: Vec<String>,
    pub nvidia_minor: Option<u32>,
    pub power_state: String,
    pub runtime_status: String,
    /// Full connector names (`card1-eDP-1`) and whether each is connected.
    pub connectors: Vec<(String, bool)>,
    pub removable: bool,
}

#[derive(Clone, Debug)]
struct PciRec {
    addr: String,
    parent: Option<String>,
    vendor: u16,
    device: u16,
    subsys: (u16, u16),
    class: u32,
    revision: u8,
    driver: Option<String>,
    power_state: String,
    runtime_status: String,
    power_control: String,
    removable: bool,
    external_facing: bool,
    gpu: Option<GpuRec>,
}

#[derive(Clone, Debug)]
struct GpuRec {
    boot_vga: Option<bool>,
    card: Option<u32>,
    render: Option<u32>,
    connectors: Vec<(String, bool)>,
    nvidia_minor: Option<u32>,
    virtio_index: Option<u32>,
}

// ---------------------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------------------

/// Collects PCI functions and DRM devices, then writes them in [`Builder::build`].
/// Parents must be added before their children.
#[derive(Default)]
pub struct Builder {
    pci: Vec<PciRec>,
    sound: Vec<(String, u32)>,
    simpledrm: Option<u32>,
    no_iommu: bool,
    name: String,
    expected_default: Option<String>,
}

impl Builder {
    pub fn new() -> Self {
        Builder {
            name: "custom".into(),
            ..Builder::default()
        }
    }

    /// A PCIe port (class 0x060400, driver `pcieport`).
    pub fn pci_bridge(self, addr: &str, parent: Option<&str>, vendor: u16, device: u16) -> Self {
        self.pci_function(Func {
            parent,
            driver: Some("pcieport"),
            power_control: "auto",
            ..Func::new(addr, vendor, device, CLASS_BRIDGE)
        })
    }

    /// Marks a port as external-facing (Thunderbolt/USB4): everything below it is
    /// `removable`, as `pci_set_removable()` decides.
    pub fn external_facing(mut self, addr: &str) -> Self {
        let rec = self.pci.iter_mut().find(|r| r.addr == addr);
        rec.unwrap_or_else(|| panic!("external_facing: no PCI function {addr}"))
            .external_facing = true;
        self
    }

    pub fn pci_function(mut self, f: Func) -> Self {
        self.pci.push(PciRec {
            addr: f.addr.into(),
            parent: f.parent.map(Into::into),
            vendor: f.vendor,
            device: f.device,
            subsys: f.subsys,
            class: f.class,
            revision: f.revision,
            driver: f.driver.map(Into::into),
            power_state: f.power_state.into(),
            runtime_status: f.runtime_status.into(),
            power_control: f.power_control.into(),
            removable: f.removable,
            external_facing: false,
            gpu: None,
        });
        self
    }

    pub fn gpu(mut self, g: Gpu) -> Self {
        assert!(
            g.boot_vga.is_none() || is_vga(g.class),
            "{}: the kernel creates boot_vga only for VGA-class (0x0300xx) functions",
            g.addr
        );
        assert!(
            g.nvidia_minor.is_none() || g.driver == Some("nvidia"),
            "{}: nvidia_minor without the nvidia driver",
            g.addr
        );
        self.pci.push(PciRec {
            addr: g.addr.into(),
            parent: g.parent.map(Into::into),
            vendor: g.vendor,
            device: g.device,
            subsys: g.subsys,
            class: g.class,
            revision: g.revision,
            driver: g.driver.map(Into::into),
            power_state: g.power_state.into(),
            runtime_status: g.runtime_status.into(),
            power_control: g.power_control.into(),
            removable: g.removable,
            external_facing: false,
            gpu: Some(GpuRec {
                boot_vga: is_vga(g.class).then_some(g.boot_vga.unwrap_or(false)),
                card: g.card,
                render: g.render,
                connectors: g
                    .connectors
                    .iter()
                    .map(|(n, c)| (n.to_string(), *c))
                    .collect(),
                nvidia_minor: g.nvidia_minor,
                virtio_index: g.virtio_index,
            }),
        });
        self
    }

    /// An ALSA card on an audio function added before: `<function>/sound/cardN/`
    /// with `controlCN`, `hwCND0` and `pcmCND3p` (major 116) and their
    /// `class/sound` and `dev/char` links, as snd_hda_intel registers them.
    pub fn sound_card(mut self, addr: &str, card: u32) -> Self {
        self.sound.push((addr.into(), card));
        self
    }

    /// `sys/devices/platform/simple-framebuffer.0/drm/cardN` (simpledrm), with its
    /// `cardN-Unknown-1` connector (connected, as simpledrm reports it).
    pub fn simpledrm(mut self, card: u32) -> Self {
        self.simpledrm = Some(card);
        self
    }

    /// No IOMMU (VMs): no `iommu_group` links, no `kernel/iommu_groups`.
    pub fn no_iommu(mut self) -> Self {
        self.no_iommu = true;
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    /// The default GPU per ARCHITECTURE.md#modes, as the fixture's author expects it.
    pub fn expect_default(mut self, addr: Option<&str>) -> Self {
        self.expected_default = addr.map(Into::into);
        self
    }

    pub fn build(self) -> Machine {
        let root = unique_dir();
        let t = Tree {
            sys: root.join("sys"),
            proc_: root.join("proc"),
        };
        for d in [
            "bus/pci/devices",
            "bus/pci/drivers",
            "class",
            "dev/char",
            "dev/block",
            "devices/system/cpu",
            "kernel",
            "module",
        ] {
            t.dir(d);
        }
        t.pdir("driver");

        // Paths, duplicates, removability, bridge power.
        let mut dirs: BTreeMap<String, String> = BTreeMap::new();
        let mut removable: BTreeMap<String, bool> = BTreeMap::new();
        for r in &self.pci {
            assert!(
                !dirs.contains_key(&r.addr),
                "two PCI functions at {}",
                r.addr
            );
            let (dir, rem) = match &r.parent {
                None => (format!("devices/pci{}/{}", &r.addr[..7], r.addr), false),
                Some(p) => {
                    let pdir = dirs.get(p).unwrap_or_else(|| {
                        panic!("{}: parent {p} must be added before it", r.addr)
                    });
                    let prec = self.pci.iter().find(|x| &x.addr == p).unwrap();
                    (
                        format!("{pdir}/{}", r.addr),
                        prec.external_facing || removable[p],
                    )
                }
            };
            dirs.insert(r.addr.clone(), dir);
            removable.insert(r.addr.clone(), rem || r.removable);
        }
        let recs: Vec<PciRec> = self
            .pci
            .iter()
            .map(|r| {
                let mut r = r.clone();
                if r.class >> 8 == CLASS_BRIDGE >> 8 {
                    let below: Vec<&PciRec> = self
                        .pci
                        .iter()
                        .filter(|x| {
                            x.class >> 8 != CLASS_BRIDGE >> 8
                                && dirs[&x.addr].starts_with(&format!("{}/", dirs[&r.addr]))
                        })
                        .collect();
                    if !below.is_empty() && below.iter().all(|x| x.runtime_status == "suspended") {
                        r.runtime_status = "suspended".into();
                        let cold = below.iter().all(|x| x.power_state == "D3cold");
                        r.power_state = if cold { "D3cold" } else { "D3hot" }.into();
                    }
                }
                r
            })
            .collect();

        // IOMMU groups: one per domain:bus:slot, in insertion order.
        let mut groups: BTreeMap<String, u32> = BTreeMap::new();
        for r in &recs {
            let n = groups.len() as u32;
            groups.entry(r.addr[..10].to_string()).or_insert(n);
        }

        let mut minors = BTreeSet::new();
        let mut gpus = Vec::new();
        let mut connector_id = 95;
        for (i, r) in recs.iter().enumerate() {
            let dir = &dirs[&r.addr];
            let group = (!self.no_iommu).then(|| groups[&r.addr[..10]]);
            write_pci(&t, r, dir, removable[&r.addr], group, i);
            let Some(g) = &r.gpu else { continue };
            let drm_parent = match g.virtio_index {
                Some(n) => write_virtio(&t, dir, n),
                None => dir.clone(),
            };
            let mut info = GpuInfo {
                addr: r.addr.clone(),
                vendor_id: r.vendor,
                device_id: r.device,
                class: r.class,
                driver: r.driver.clone(),
                boot_vga: g.boot_vga,
                card: g.card.map(|n| format!("card{n}")),
                render: g.render.map(|n| format!("renderD{n}")),
                nodes: vec![],
                nvidia_minor: g.nvidia_minor,
                power_state: r.power_state.clone(),
                runtime_status: r.runtime_status.clone(),
                connectors: vec![],
                removable: removable[&r.addr],
            };
            for (name, minor) in [(&info.card, g.card), (&info.render, g.render)] {
                let (Some(name), Some(minor)) = (name, minor) else {
                    continue;
                };
                assert!(minors.insert(minor), "DRM minor {minor} used twice");
                write_drm_minor(&t, &drm_parent, name, minor);
                info.nodes.push(format!("226:{minor}"));
            }
            if let Some(card) = &info.card {
                for (c, connected) in &g.connectors {
                    let full = format!("{card}-{c}");
                    write_connector(
                        &t,
                        &format!("{drm_parent}/drm/{card}"),
                        &full,
                        *connected,
                        connector_id,
                    );
                    connector_id += 1;
                    info.connectors.push((full, *connected));
                }
            }
            if let Some(minor) = g.nvidia_minor {
                write_nvidia_gpu(&t, r, minor, i);
                info.nodes.push(format!("195:{minor}"));
            }
            gpus.push(info);
        }
        for (addr, card) in &self.sound {
            let dir = dirs
                .get(addr)
                .unwrap_or_else(|| panic!("sound_card: no PCI function {addr}"));
            write_sound_card(&t, dir, *card);
        }
        if recs.iter().any(|r| r.driver.as_deref() == Some("nvidia")) {
            write_nvidia_module(
                &t,
                recs.iter().any(|r| {
                    r.driver.as_deref() == Some("nvidia")
                        && r.gpu.as_ref().is_some_and(|g| g.card.is_some())
                }),
            );
        }
        if let Some(card) = self.simpledrm {
            assert!(minors.insert(card), "DRM minor {card} used twice");
            write_simpledrm(&t, card, connector_id);
        }
        if !minors.is_empty() {
            t.file("class/drm/version", "drm 1.1.0 20060810\n", 0o444);
        }

        let sys = t.sys;
        let proc_ = t.proc_;
        Machine {
            root,
            sys,
            proc_,
            name: self.name,
            gpus,
            expected_default: self.expected_default,
        }
    }
}

fn is_vga(class: u32) -> bool {
    class >> 8 == 0x0300
}

// ---------------------------------------------------------------------------------------
// Writing the tree
// ---------------------------------------------------------------------------------------

struct Tree {
    sys: PathBuf,
    proc_: PathBuf,
}

impl Tree {
    fn dir(&self, rel: &str) {
        fs::create_dir_all(self.sys.join(rel)).unwrap();
    }
    fn pdir(&self, rel: &str) {
        fs::create_dir_all(self.proc_.join(rel)).unwrap();
    }
    fn file(&self, rel: &str, content: impl AsRef<[u8]>, mode: u32) {
        put(&self.sys.join(rel), content.as_ref(), mode);
    }
    fn pfile(&self, rel: &str, content: impl AsRef<[u8]>, mode: u32) {
        put(&self.proc_.join(rel), content.as_ref(), mode);
    }
    /// A symlink at `link` (relative to `sys`) to `target` (relative to `sys`), spelled as
    /// kernfs spells it: up to the nearest common ancestor of the link's directory and
    /// the *target's parent*, then down (`drm/card1/device` → `../../../0000:00:02.0`).
    fn link(&self, link: &str, target: &str) {
        let from: Vec<&str> = link.split('/').collect();
        let from = &from[..from.len() - 1];
        let to: Vec<&str> = target.split('/').collect();
        let common = from
            .iter()
            .zip(&to[..to.len() - 1])
            .take_while(|(a, b)| a == b)
            .count();
        let rel = format!(
            "{}{}",
            "../".repeat(from.len() - common),
            to[common..].join("/")
        );
        let path = self.sys.join(link);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        if fs::symlink_metadata(&path).is_ok() {
            fs::remove_file(&path).unwrap();
        }
        symlink(rel, path).unwrap();
    }
}

/// Writes a file with the sentinel times and a mode (rewrites an existing one).
fn put(path: &Path, content: &[u8], mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    if path.exists() {
        fs::set_permissions(path, fs::Permissions::from_mode(0o644)).unwrap();
    }
    let mut f = File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(content).unwrap();
    f.set_times(sentinel_times()).unwrap();
    drop(f);
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn sentinel_times() -> FileTimes {
    FileTimes::new()
        .set_accessed(UNIX_EPOCH + Duration::from_secs(SENTINEL_ATIME as u64))
        .set_modified(UNIX_EPOCH + Duration::from_secs(SENTINEL_MTIME))
}

/// Where trees go: `$GPUCTL_FIXTURE_DIR`, else `$TMPDIR`, else `/dev/shm` when writable
/// (tmpfs: building a machine there takes ~10 ms instead of ~500 ms on this VM's ext4
/// `/tmp`), else `std::env::temp_dir()`.
fn base_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GPUCTL_FIXTURE_DIR") {
        return d.into();
    }
    let shm = Path::new("/dev/shm");
    let shm_ok = std::env::var_os("TMPDIR").is_none()
        && fs::metadata(shm).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o002 != 0);
    if shm_ok {
        shm.into()
    } else {
        std::env::temp_dir()
    }
}

fn unique_dir() -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let dir = base_dir().join(format!(
        "gpuctl-fixture-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_pci(t: &Tree, r: &PciRec, dir: &str, removable: bool, group: Option<u32>, idx: usize) {
    let f = |name: &str, content: &str, mode: u32| t.file(&format!("{dir}/{name}"), content, mode);
    let bridge = r.class >> 8 == CLASS_BRIDGE >> 8;
    let display = r.class >> 16 == 0x03;
    let bound_enabled = r.driver.is_some() && r.driver.as_deref() != Some("vfio-pci");
    f("vendor", &format!("0x{:04x}\n", r.vendor), 0o444);
    f("device", &format!("0x{:04x}\n", r.device), 0o444);
    f(
        "subsystem_vendor",
        &format!("0x{:04x}\n", r.subsys.0),
        0o444,
    );
    f(
        "subsystem_device",
        &format!("0x{:04x}\n", r.subsys.1),
        0o444,
    );
    f("class", &format!("0x{:06x}\n", r.class), 0o444);
    f("revision", &format!("0x{:02x}\n", r.revision), 0o444);
    if is_vga(r.class) {
        let boot = r.gpu.as_ref().and_then(|g| g.boot_vga).unwrap_or(false);
        f("boot_vga", if boot { "1\n" } else { "0\n" }, 0o444);
    }
    f("power_state", &format!("{}\n", r.power_state), 0o444);
    f("power/control", &format!("{}\n", r.power_control), 0o644);
    f(
        "power/runtime_status",
        &format!("{}\n", r.runtime_status),
        0o444,
    );
    let enabled = if r.power_control == "on" {
        "forbidden"
    } else {
        "enabled"
    };
    f("power/runtime_enabled", &format!("{enabled}\n"), 0o444);
    f("power/runtime_active_time", "81234\n", 0o444);
    f("power/runtime_suspended_time", "4567890\n", 0o444);
    f("power/wakeup", "disabled\n", 0o644);
    f("d3cold_allowed", "1\n", 0o644);
    f("enable", if bound_enabled { "1\n" } else { "0\n" }, 0o644);
    f("irq", &format!("{}\n", 120 + idx), 0o444);
    f("numa_node", "-1\n", 0o644);
    f("local_cpus", "ffff\n", 0o444);
    f("local_cpulist", "0-15\n", 0o444);
    f("msi_bus", "1\n", 0o644);
    f("broken_parity_status", "0\n", 0o644);
    f("driver_override", "(null)\n", 0o644);
    f(
        "removable",
        if removable { "removable\n" } else { "fixed\n" },
        0o444,
    );
    for w in ["remove", "rescan", "reset"] {
        f(w, "", 0o200);
    }
    // resource: 13 lines for endpoints, 17 for bridges; BARs as a real GPU/function has.
    let n = idx as u64;
    let mut bars: Vec<(usize, u64, u64, u64)> = if display {
        vec![
            (0, 0xa000_0000 + n * 0x0200_0000, 0x100_0000, 0x40200),
            (1, 0x60_0000_0000 + n * 0x4000_0000, 0x1000_0000, 0x14220c),
            (3, 0x61_0000_0000 + n * 0x400_0000, 0x200_0000, 0x14220c),
            (5, 0x3000 + n * 0x100, 0x80, 0x40101),
            (6, 0xa100_0000 + n * 0x0200_0000, 0x8_0000, 0x46200),
        ]
    } else if bridge {
        vec![]
    } else {
        vec![(0, 0xb000_0000 + n * 0x10_0000, 0x4000, 0x40200)]
    };
    let lines = if bridge { 17 } else { 13 };
    let mut resource = String::new();
    for i in 0..lines {
        let (s, e, fl) = match bars.iter().find(|b| b.0 == i) {
            Some(&(_, start, size, fl)) => (start, start + size - 1, fl),
            None => (0, 0, 0),
        };
        resource.push_str(&format!("0x{s:016x} 0x{e:016x} 0x{fl:016x}\n"));
    }
    f("resource", &resource, 0o444);
    bars.retain(|b| b.0 < 6);
    for (i, _, _, fl) in &bars {
        f(&format!("resource{i}"), "", 0o600);
        if fl & 0x2000 != 0 {
            f(&format!("resource{i}_wc"), "", 0o600);
        }
    }
    if display {
        f("rom", "", 0o600);
    }
    t.file(&format!("{dir}/config"), [0u8; 256], 0o644);
    let modalias = format!(
        "pci:v{:08X}d{:08X}sv{:08X}sd{:08X}bc{:02X}sc{:02X}i{:02X}",
        r.vendor,
        r.device,
        r.subsys.0,
        r.subsys.1,
        r.class >> 16,
        (r.class >> 8) & 0xff,
        r.class & 0xff
    );
    f("modalias", &format!("{modalias}\n"), 0o444);
    let mut uevent = String::new();
    if let Some(d) = &r.driver {
        uevent.push_str(&format!("DRIVER={d}\n"));
    }
    uevent.push_str(&format!(
        "PCI_CLASS={:X}\nPCI_ID={:04X}:{:04X}\nPCI_SUBSYS_ID={:04X}:{:04X}\nPCI_SLOT_NAME={}\nMODALIAS={modalias}\n",
        r.class, r.vendor, r.device, r.subsys.0, r.subsys.1, r.addr
    ));
    f("uevent", &uevent, 0o644);

    t.link(&format!("{dir}/subsystem"), "bus/pci");
    t.link(&format!("bus/pci/devices/{}", r.addr), dir);
    if let Some(d) = &r.driver {
        let ddir = format!("bus/pci/drivers/{d}");
        t.link(&format!("{dir}/driver"), &ddir);
        t.link(&format!("{ddir}/{}", r.addr), dir);
        for w in ["bind", "unbind", "new_id", "remove_id"] {
            t.file(&format!("{ddir}/{w}"), "", 0o200);
        }
        t.file(&format!("{ddir}/uevent"), "", 0o200);
    }
    if let Some(g) = group {
        let gdir = format!("kernel/iommu_groups/{g}");
        t.link(&format!("{dir}/iommu_group"), &gdir);
        t.link(&format!("{gdir}/devices/{}", r.addr), dir);
        t.file(&format!("{gdir}/type"), "DMA-FQ\n", 0o644);
    }
}

/// The `virtioN` child of a virtio PCI function; returns its dir (DRM's parent).
fn write_virtio(t: &Tree, pci_dir: &str, n: u32) -> String {
    let dir = format!("{pci_dir}/virtio{n}");
    let modalias = "virtio:d00000010v00001AF4";
    t.file(&format!("{dir}/device"), "0x0010\n", 0o444);
    t.file(&format!("{dir}/vendor"), "0x1af4\n", 0o444);
    t.file(&format!("{dir}/status"), "0x0000000f\n", 0o444);
    t.file(
        &format!("{dir}/features"),
        "0100000000000000000000000000000010000000000000000000000000000000\n",
        0o444,
    );
    t.file(&format!("{dir}/modalias"), format!("{modalias}\n"), 0o444);
    t.file(
        &format!("{dir}/uevent"),
        format!("DRIVER=virtio_gpu\nMODALIAS={modalias}\n"),
        0o644,
    );
    t.file(&format!("{dir}/power/control"), "auto\n", 0o644);
    t.file(
        &format!("{dir}/power/runtime_status"),
        "unsupported\n",
        0o444,
    );
    t.link(&format!("{dir}/driver"), "bus/virtio/drivers/virtio_gpu");
    t.link(&format!("{dir}/subsystem"), "bus/virtio");
    t.link(&format!("bus/virtio/devices/virtio{n}"), &dir);
    t.link(&format!("bus/virtio/drivers/virtio_gpu/virtio{n}"), &dir);
    dir
}

/// `<parent>/drm/<name>` with `dev`, `uevent`, `device`, `subsystem`, and the
/// `class/drm/<name>` and `dev/char/226:<minor>` links.
fn write_drm_minor(t: &Tree, parent: &str, name: &str, minor: u32) {
    let dir = format!("{parent}/drm/{name}");
    t.file(&format!("{dir}/dev"), format!("226:{minor}\n"), 0o444);
    t.file(
        &format!("{dir}/uevent"),
        format!("MAJOR=226\nMINOR={minor}\nDEVNAME=dri/{name}\nDEVTYPE=drm_minor\n"),
        0o644,
    );
    t.file(&format!("{dir}/power/control"), "auto\n", 0o644);
    t.file(
        &format!("{dir}/power/runtime_status"),
        "unsupported\n",
        0o444,
    );
    t.link(&format!("{dir}/device"), parent);
    t.link(&format!("{dir}/subsystem"), "class/drm");
    t.link(&format!("class/drm/{name}"), &dir);
    t.link(&format!("dev/char/226:{minor}"), &dir);
}

/// `<function>/sound/cardN/{controlCN,hwCND0,pcmCND3p}` with `dev` (116:minor).
fn write_sound_card(t: &Tree, fn_dir: &str, card: u32) {
    let cdir = format!("{fn_dir}/sound/card{card}");
    t.file(&format!("{cdir}/id"), "NVidia\n", 0o444);
    t.file(&format!("{cdir}/number"), format!("{card}\n"), 0o444);
    t.link(&format!("{cdir}/device"), fn_dir);
    t.link(&format!("{cdir}/subsystem"), "class/sound");
    t.link(&format!("class/sound/card{card}"), &cdir);
    let nodes = [
        (format!("controlC{card}"), card * 8),
        (format!("hwC{card}D0"), card * 8 + 1),
        (format!("pcmC{card}D3p"), card * 8 + 2),
    ];
    for (name, minor) in nodes {
        let dir = format!("{cdir}/{name}");
        t.file(&format!("{dir}/dev"), format!("116:{minor}\n"), 0o444);
        t.file(
            &format!("{dir}/uevent"),
            format!("MAJOR=116\nMINOR={minor}\nDEVNAME=snd/{name}\n"),
            0o644,
        );
        t.link(&format!("{dir}/device"), &cdir);
        t.link(&format!("{dir}/subsystem"), "class/sound");
        t.link(&format!("class/sound/{name}"), &dir);
        t.link(&format!("dev/char/116:{minor}"), &dir);
    }
}

fn write_connector(t: &Tree, card_dir: &str, name: &str, connected: bool, id: u32) {
    let dir = format!("{card_dir}/{name}");
    let f = |n: &str, c: &[u8], mode: u32| t.file(&format!("{dir}/{n}"), c, mode);
    let (status, enabled, dpms, modes) = if connected {
        (
            "connected\n",
            "enabled\n",
            "On\n",
            "1920x1080\n1600x900\n1280x720\n",
        )
    } else {
        ("disconnected\n", "disabled\n", "Off\n", "")
    };
    let mut edid = Vec::new();
    if connected {
        edid = vec![0u8; 128];
        edid[..8].copy_from_slice(&[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]);
    }
    f("status", status.as_bytes(), 0o644);
    f("enabled", enabled.as_bytes(), 0o444);
    f("dpms", dpms.as_bytes(), 0o444);
    f("modes", modes.as_bytes(), 0o444);
    f("edid", &edid, 0o444);
    f("connector_id", format!("{id}\n").as_bytes(), 0o444);
    f("uevent", b"DEVTYPE=drm_connector\n", 0o644);
    f("power/control", b"auto\n", 0o644);
    f("power/runtime_status", b"unsupported\n", 0o444);
    t.link(&format!("{dir}/device"), card_dir);
    t.link(&format!("{dir}/subsystem"), "class/drm");
    t.link(&format!("class/drm/{name}"), &dir);
}

fn write_simpledrm(t: &Tree, card: u32, connector_id: u32) {
    let dir = "devices/platform/simple-framebuffer.0";
    let drv = "bus/platform/drivers/simple-framebuffer";
    t.file(&format!("{dir}/driver_override"), "(null)\n", 0o644);
    t.file(
        &format!("{dir}/modalias"),
        "platform:simple-framebuffer\n",
        0o444,
    );
    t.file(
        &format!("{dir}/uevent"),
        "DRIVER=simple-framebuffer\nMODALIAS=platform:simple-framebuffer\n",
        0o644,
    );
    t.file(&format!("{dir}/power/control"), "auto\n", 0o644);
    t.file(
        &format!("{dir}/power/runtime_status"),
        "unsupported\n",
        0o444,
    );
    t.link(&format!("{dir}/driver"), drv);
    t.link(&format!("{dir}/subsystem"), "bus/platform");
    t.link("bus/platform/devices/simple-framebuffer.0", dir);
    t.link(&format!("{drv}/simple-framebuffer.0"), dir);
    let name = format!("card{card}");
    write_drm_minor(t, dir, &name, card);
    write_connector(
        t,
        &format!("{dir}/drm/{name}"),
        &format!("{name}-Unknown-1"),
        true,
        connector_id,
    );
}

/// (marketing name the driver prints as `Model:`, VBIOS) by PCI device id.
fn nvidia_board(device: u16) -> (&'static str, &'static str) {
    match device {
        0x25a2 => ("NVIDIA GeForce RTX 3050 Laptop GPU", "94.07.3a.00.6d"),
        0x2520 => ("NVIDIA GeForce RTX 3060 Laptop GPU", "94.06.19.00.7b"),
        0x2860 => ("NVIDIA GeForce RTX 4070 Laptop GPU", "95.06.20.00.5b"),
        0x2684 => ("NVIDIA GeForce RTX 4090", "95.02.18.80.5f"),
        _ => ("NVIDIA Graphics Device", "??.??.??.??.??"),
    }
}

/// `/proc/driver/nvidia/gpus/<addr>/`, in nv-procfs.c's exact format. NB: the real
/// `information` read takes a dynamic-power reference (`rm_ref_dynamic_power`), which
/// powers up a runtime-suspended GPU.
fn write_nvidia_gpu(t: &Tree, r: &PciRec, minor: u32, idx: usize) {
    let dir = format!("driver/nvidia/gpus/{}", r.addr);
    let (model, vbios) = nvidia_board(r.device);
    let uuid = format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        0x5e1f_0000u32 + idx as u32,
        r.device,
        0x7c3d,
        0x9a21 + minor,
        0x0e4b_5d2c_1a00u64 + idx as u64
    );
    let info = format!(
        "Model: \t\t {model}\nIRQ:   \t\t {}\nGPU UUID: \t {uuid}\nVideo BIOS: \t {vbios}\n\
         Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n\
         Bus Location: \t {}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n",
        120 + idx,
        r.addr
    );
    t.pfile(&format!("{dir}/information"), info, 0o444);
    let vidmem = if r.runtime_status == "suspended" {
        "Off"
    } else {
        "Active"
    };
    let power = format!(
        "Runtime D3 status:          Enabled (fine-grained)\nVideo Memory:               {vidmem}\n\n\
         GPU Hardware Support:\n Video Memory Self Refresh: Supported\n Video Memory Off:          Supported\n\n\
         Power Limits:\n Default:                   N/A milliwatts\n GPU Boost:                 N/A milliwatts\n"
    );
    t.pfile(&format!("{dir}/power"), power, 0o444);
    t.pfile(&format!("{dir}/registry"), "Binary: \"\"\n", 0o644);
}

fn write_nvidia_module(t: &Tree, drm: bool) {
    t.pfile(
        "driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.120  Fri Sep 13 10:10:01 UTC 2024\n\
         GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n",
        0o444,
    );
    let mut params = String::new();
    for (k, v) in [
        ("ResmanDebugLevel", 4294967295u64),
        ("RmLogonRC", 1),
        ("ModifyDeviceFiles", 1),
        ("DeviceFileUID", 0),
        ("DeviceFileGID", 0),
        ("DeviceFileMode", 438),
        ("InitializeSystemMemoryAllocations", 1),
        ("UsePageAttributeTable", 4294967295),
        ("EnableMSI", 1),
        ("EnablePCIeGen3", 0),
        ("MemoryPoolSize", 0),
        ("KMallocHeapMaxSize", 0),
        ("VMallocHeapMaxSize", 0),
        ("IgnoreMMIOCheck", 0),
        ("EnableStreamMemOPs", 0),
        ("EnableUserNUMAManagement", 1),
        ("NvLinkDisable", 0),
        ("RmProfilingAdminOnly", 1),
        ("PreserveVideoMemoryAllocations", 0),
        ("EnableS0ixPowerManagement", 0),
        ("S0ixPowerManagementVideoMemoryThreshold", 256),
        ("DynamicPowerManagement", 3),
        ("DynamicPowerManagementVideoMemoryThreshold", 200),
        ("RegisterPCIDriver", 1),
        ("EnablePCIERelaxedOrderingMode", 0),
        ("EnableResizableBar", 0),
        ("EnableGpuFirmware", 18),
        ("EnableGpuFirmwareLogs", 2),
        ("EnableDbgBreakpoint", 0),
        ("OpenRmEnableUnsupportedGpus", 1),
        ("DmaRemapPeerMmio", 1),
    ] {
        params.push_str(&format!("{k}: {v}\n"));
    }
    for k in [
        "RegistryDwords",
        "RegistryDwordsPerDevice",
        "RmMsg",
        "GpuBlacklist",
        "TemporaryFilePath",
        "ExcludedGpus",
    ] {
        params.push_str(&format!("{k}: \"\"\n"));
    }
    t.pfile("driver/nvidia/params", params, 0o444);
    t.file("module/nvidia/version", "550.120\n", 0o444);
    if drm {
        t.file("module/nvidia_drm/parameters/modeset", "Y\n", 0o444);
        t.file("module/nvidia_drm/parameters/fbdev", "Y\n", 0o444);
    }
}

// ---------------------------------------------------------------------------------------
// Machine
// ---------------------------------------------------------------------------------------

/// A materialized tree; removed on drop (kept when `GPUCTL_KEEP_FIXTURE` is set).
pub struct Machine {
    root: PathBuf,
    sys: PathBuf,
    proc_: PathBuf,
    name: String,
    gpus: Vec<GpuInfo>,
    expected_default: Option<String>,
}

impl Drop for Machine {
    fn drop(&mut self) {
        if std::env::var_os("GPUCTL_KEEP_FIXTURE").is_some() {
            eprintln!("fixture {} kept at {}", self.name, self.root.display());
        } else {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

impl Machine {
    /// The `sys` root (`--sysfs-root`).
    pub fn sysfs(&self) -> &Path {
        &self.sys
    }
    /// The `proc` root (`--procfs-root`).
    pub fn procfs(&self) -> &Path {
        &self.proc_
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The GPUs as built, in insertion order.
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }
    pub fn gpu(&self, addr: &str) -> &GpuInfo {
        let g = self.gpus.iter().find(|g| g.addr == addr);
        g.unwrap_or_else(|| panic!("{}: no GPU at {addr}", self.name))
    }
    /// The default GPU per ARCHITECTURE.md#modes as the fixture's author reads the rule.
    pub fn expected_default(&self) -> Option<&str> {
        self.expected_default.as_deref()
    }
    /// `sys/bus/pci/devices/<addr>` (a symlink into `sys/devices`).
    pub fn pci_dev(&self, addr: &str) -> PathBuf {
        self.sys.join("bus/pci/devices").join(addr)
    }

    /// A DRM node made after the build, as a driver binding late makes it:
    /// `<function>/drm/<name>` with its `class/drm` and `dev/char` links.
    pub fn add_drm_minor(&self, addr: &str, name: &str, minor: u32) {
        let dev = fs::canonicalize(self.pci_dev(addr)).unwrap();
        let sys = fs::canonicalize(&self.sys).unwrap();
        let rel = dev
            .strip_prefix(&sys)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let t = Tree {
            sys: self.sys.clone(),
            proc_: self.proc_.clone(),
        };
        write_drm_minor(&t, &rel, name, minor);
    }

    /// Rewrites a file (path relative to the `sys` root), keeping its mode.
    pub fn write_sys(&self, rel: &str, content: &str) {
        let p = self.sys.join(rel);
        let mode = fs::metadata(&p).map(|m| m.mode() & 0o7777).unwrap_or(0o644);
        put(
            &fs::canonicalize(p.parent().unwrap())
                .unwrap()
                .join(p.file_name().unwrap()),
            content.as_bytes(),
            mode,
        );
    }
    /// Changes a PCI function's `power_state` and `power/runtime_status`.
    pub fn set_power(&self, addr: &str, power_state: &str, runtime_status: &str) {
        self.write_sys(
            &format!("bus/pci/devices/{addr}/power_state"),
            &format!("{power_state}\n"),
        );
        self.write_sys(
            &format!("bus/pci/devices/{addr}/power/runtime_status"),
            &format!("{runtime_status}\n"),
        );
    }
    /// Plugs or unplugs a connector (`"card1-eDP-1"`).
    pub fn set_connector(&self, connector: &str, connected: bool) {
        let s = if connected {
            "connected"
        } else {
            "disconnected"
        };
        self.write_sys(&format!("class/drm/{connector}/status"), &format!("{s}\n"));
        let e = if connected { "enabled" } else { "disabled" };
        self.write_sys(&format!("class/drm/{connector}/enabled"), &format!("{e}\n"));
    }

    /// Regular files (relative to [`Machine::root`]) whose contents were read since the
    /// build or their last rewrite.
    pub fn files_read(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        walk(&self.root, &mut |p, m| {
            if m.is_file() && m.atime() != SENTINEL_ATIME {
                out.push(p.strip_prefix(&self.root).unwrap().to_path_buf());
            }
        });
        out.retain(|p| p != Path::new(".atime-probe"));
        out
    }
    /// The reads among [`Machine::files_read`] that would wake a real GPU: PCI `config`,
    /// `rom`, `resourceN` (the files the LSM backend guards).
    pub fn wake_risky_reads(&self) -> Vec<PathBuf> {
        self.files_read()
            .into_iter()
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                p.starts_with("sys/devices")
                    && (n == "config"
                        || n == "rom"
                        || n.strip_prefix("resource")
                            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit())))
            })
            .collect()
    }
    /// Whether this file system records reads in atime (false on `noatime` mounts).
    pub fn atime_tracking(&self) -> bool {
        let p = self.root.join(".atime-probe");
        put(&p, b"probe", 0o644);
        let mut s = String::new();
        File::open(&p).unwrap().read_to_string(&mut s).unwrap();
        fs::metadata(&p).unwrap().atime() != SENTINEL_ATIME
    }
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path, &fs::Metadata)) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = fs::symlink_metadata(&p).unwrap();
        f(&p, &m);
        if m.is_dir() {
            walk(&p, f);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The machines
// ---------------------------------------------------------------------------------------

const SUSPENDED: (&str, &str) = ("D3cold", "suspended");
const ACTIVE: (&str, &str) = ("D0", "active");

/// A non-GPU function on a given parent, bound to `driver`, in a power state.
fn func<'a>(
    addr: &'a str,
    parent: Option<&'a str>,
    id: (u16, u16),
    class: u32,
    driver: &'a str,
    power: (&'a str, &'a str),
) -> Func<'a> {
    Func {
        parent,
        driver: Some(driver),
        power_state: power.0,
        runtime_status: power.1,
        power_control: "auto",
        ..Func::new(addr, id.0, id.1, class)
    }
}

fn host(b: Builder, vendor: u16, device: u16) -> Builder {
    b.pci_function(Func::new("0000:00:00.0", vendor, device, CLASS_HOST))
}

/// The six platform functions beside an AMD APU's iGPU at `<bus>:00.0`:
/// HDMI audio, PSP/CCP, two xHCI, ACP, HD audio. `ids` = (audio, psp, xhci, xhci).
fn apu_siblings(
    mut b: Builder,
    bus: &str,
    parent: &str,
    ids: [(u16, u16); 4],
    acp_drv: &str,
) -> Builder {
    let p = Some(parent);
    let fns: [(u8, (u16, u16), u32, &str); 6] = [
        (1, ids[0], CLASS_HDA, "snd_hda_intel"),
        (2, ids[1], 0x108000, "ccp"),
        (3, ids[2], 0x0c0330, "xhci_hcd"),
        (4, ids[3], 0x0c0330, "xhci_hcd"),
        (5, (0x1022, 0x15e2), 0x048000, acp_drv),
        (6, (0x1022, 0x15e3), CLASS_HDA, "snd_hda_intel"),
    ];
    for (fnum, id, class, drv) in fns {
        let addr = format!("0000:{bus}:00.{fnum}");
        b = b.pci_function(func(&addr, p, id, class, drv, ACTIVE));
    }
    b
}

/// Builds one of [`MACHINES`]. Panics on an unknown name.
pub fn machine(name: &str) -> Machine {
    let b = Builder::new();
    let (b, default): (Builder, Option<&str>) = match name {
        // Alder Lake-P laptop, Optimus: i915 drives the panel, the RTX 3050 sleeps.
        // simpledrm held card0 while i915 probed (card1, renderD128); nvidia-drm came later
        // and took the freed card0 and renderD129.
        "intel_nvidia" => (
            host(b, 0x8086, 0x4641)
                .pci_bridge("0000:00:01.0", None, 0x8086, 0x460d)
                .gpu(Gpu {
                    subsys: (0x1043, 0x1ccd),
                    revision: 0x0c,
                    driver: Some("i915"),
                    boot_vga: Some(true),
                    card: Some(1),
                    render: Some(128),
                    connectors: &[("eDP-1", true), ("DP-1", false), ("HDMI-A-1", false)],
                    ..Gpu::new("0000:00:02.0", 0x8086, 0x46a6)
                })
                .gpu(Gpu {
                    parent: Some("0000:00:01.0"),
                    subsys: (0x1043, 0x1ccd),
                    revision: 0xa1,
                    driver: Some("nvidia"),
                    boot_vga: Some(false),
                    card: Some(0),
                    render: Some(129),
                    connectors: &[("HDMI-A-2", false)],
                    power_state: SUSPENDED.0,
                    runtime_status: SUSPENDED.1,
                    nvidia_minor: Some(0),
                    ..Gpu::new("0000:01:00.0", 0x10de, 0x25a2)
                })
                .pci_function(func(
                    "0000:01:00.1",
                    Some("0000:00:01.0"),
                    (0x10de, 0x2291),
                    CLASS_HDA,
                    "snd_hda_intel",
                    SUSPENDED,
                ))
                .pci_function(func(
                    "0000:00:14.0",
                    None,
                    (0x8086, 0x51ed),
                    0x0c0330,
                    "xhci_hcd",
                    ACTIVE,
                )),
            Some("0000:00:02.0"),
        ),
        // ASUS Zephyrus G14 (2022): Rembrandt APU + Radeon RX 6800S behind its own switch.
        // simpledrm is kept as card0 on purpose (a non-PCI DRM device discovery must skip).
        "amd_amd" => (
            apu_siblings(
                host(b, 0x1022, 0x14b5)
                    .pci_bridge("0000:00:01.1", None, 0x1022, 0x14b8)
                    .pci_bridge("0000:01:00.0", Some("0000:00:01.1"), 0x1002, 0x1478)
                    .pci_bridge("0000:02:00.0", Some("0000:01:00.0"), 0x1002, 0x1479)
                    .gpu(Gpu {
                        parent: Some("0000:02:00.0"),
                        subsys: (0x1043, 0x1c22),
                        revision: 0xc3,
                        driver: Some("amdgpu"),
                        boot_vga: Some(false),
                        card: Some(2),
                        render: Some(129),
                        connectors: &[("HDMI-A-1", false)],
                        power_state: SUSPENDED.0,
                        runtime_status: SUSPENDED.1,
                        ..Gpu::new("0000:03:00.0", 0x1002, 0x73ef)
                    })
                    .pci_function(func(
                        "0000:03:00.1",
                        Some("0000:02:00.0"),
                        (0x1002, 0xab28),
                        CLASS_HDA,
                        "snd_hda_intel",
                        SUSPENDED,
                    ))
                    .pci_bridge("0000:00:08.1", None, 0x1022, 0x14b9)
                    .gpu(Gpu {
                        parent: Some("0000:00:08.1"),
                        subsys: (0x1043, 0x1c22),
                        revision: 0xc7,
                        driver: Some("amdgpu"),
                        boot_vga: Some(true),
                        card: Some(1),
                        render: Some(128),
                        connectors: &[("eDP-1", true), ("DP-1", false)],
                        ..Gpu::new("0000:08:00.0", 0x1002, 0x1681)
                    })
                    .simpledrm(0),
                "08",
                "0000:00:08.1",
                [
                    (0x1002, 0x1640),
                    (0x1022, 0x15c7),
                    (0x1022, 0x161d),
                    (0x1022, 0x161e),
                ],
                "snd_pci_acp6x",
            ),
            Some("0000:08:00.0"),
        ),
        // Cezanne APU + RTX 3060 Laptop. The dGPU is a 3D controller (0x030200): no
        // outputs wired to it, so no boot_vga file and no connectors.
        "amd_nvidia" => (
            apu_siblings(
                host(b, 0x1022, 0x1630)
                    .pci_bridge("0000:00:01.1", None, 0x1022, 0x1633)
                    .gpu(Gpu {
                        parent: Some("0000:00:01.1"),
                        subsys: (0x17aa, 0x3a5f),
                        class: CLASS_3D,
                        revision: 0xa1,
                        driver: Some("nvidia"),
                        card: Some(1),
                        render: Some(129),
                        power_state: SUSPENDED.0,
                        runtime_status: SUSPENDED.1,
                        nvidia_minor: Some(0),
                        ..Gpu::new("0000:01:00.0", 0x10de, 0x2520)
                    })
                    .pci_function(func(
                        "0000:01:00.1",
                        Some("0000:00:01.1"),
                        (0x10de, 0x228e),
                        CLASS_HDA,
                        "snd_hda_intel",
                        SUSPENDED,
                    ))
                    .pci_bridge("0000:00:08.1", None, 0x1022, 0x1635)
                    .gpu(Gpu {
                        parent: Some("0000:00:08.1"),
                        subsys: (0x17aa, 0x3a5f),
                        revision: 0xc5,
                        driver: Some("amdgpu"),
                        boot_vga: Some(true),
                        card: Some(0),
                        render: Some(128),
                        connectors: &[("eDP-1", true), ("HDMI-A-1", false)],
                        ..Gpu::new("0000:05:00.0", 0x1002, 0x1638)
                    }),
                "05",
                "0000:00:08.1",
                [
                    (0x1002, 0x1637),
                    (0x1022, 0x15df),
                    (0x1022, 0x1639),
                    (0x1022, 0x1639),
                ],
                "snd_rn_pci_acp3x",
            ),
            Some("0000:05:00.0"),
        ),
        // Raptor Lake-P laptop with a MUX switched to the dGPU: the firmware made the RTX
        // 4070 the boot VGA and the panel hangs off it; i915 registered no eDP.
        "mux_dgpu" => (
            host(b, 0x8086, 0xa706)
                .pci_bridge("0000:00:01.0", None, 0x8086, 0xa74d)
                .gpu(Gpu {
                    subsys: (0x17aa, 0x3c7c),
                    revision: 0x04,
                    driver: Some("i915"),
                    boot_vga: Some(false),
                    card: Some(1),
                    render: Some(128),
                    connectors: &[("DP-1", false), ("HDMI-A-1", false)],
                    ..Gpu::new("0000:00:02.0", 0x8086, 0xa7a0)
                })
                .gpu(Gpu {
                    parent: Some("0000:00:01.0"),
                    subsys: (0x17aa, 0x3c7c),
                    revision: 0xa1,
                    driver: Some("nvidia"),
                    boot_vga: Some(true),
                    card: Some(0),
                    render: Some(129),
                    connectors: &[("eDP-1", true), ("DP-2", false)],
                    nvidia_minor: Some(0),
                    ..Gpu::new("0000:01:00.0", 0x10de, 0x2860)
                })
                .pci_function(func(
                    "0000:01:00.1",
                    Some("0000:00:01.0"),
                    (0x10de, 0x22bd),
                    CLASS_HDA,
                    "snd_hda_intel",
                    ACTIVE,
                )),
            Some("0000:01:00.0"),
        ),
        // Ryzen desktop, one Radeon RX 6800 XT (behind the card's own switch), monitor on DP.
        "desktop_single" => (
            host(b, 0x1022, 0x1480)
                .pci_bridge("0000:00:01.1", None, 0x1022, 0x1483)
                .pci_bridge("0000:01:00.0", Some("0000:00:01.1"), 0x1002, 0x1478)
                .pci_bridge("0000:02:00.0", Some("0000:01:00.0"), 0x1002, 0x1479)
                .gpu(Gpu {
                    parent: Some("0000:02:00.0"),
                    revision: 0xc1,
                    driver: Some("amdgpu"),
                    boot_vga: Some(true),
                    card: Some(0),
                    render: Some(128),
                    connectors: &[("DP-1", true), ("DP-2", false), ("HDMI-A-1", false)],
                    ..Gpu::new("0000:03:00.0", 0x1002, 0x73bf)
                })
                .pci_function(func(
                    "0000:03:00.1",
                    Some("0000:02:00.0"),
                    (0x1002, 0xab28),
                    CLASS_HDA,
                    "snd_hda_intel",
                    ACTIVE,
                )),
            Some("0000:03:00.0"),
        ),
        // Alder Lake-S desktop: firmware primary is the iGPU (boot_vga 1, nothing plugged
        // in), the monitor is on the RTX 4090. nvidia-drm loaded from the initramfs first
        // (card0, renderD128, DP-1); i915 came second (card1, renderD129, DP-3).
        "desktop_monitor_dgpu" => (
            host(b, 0x8086, 0x4660)
                .pci_bridge("0000:00:01.0", None, 0x8086, 0x460d)
                .gpu(Gpu {
                    revision: 0x0c,
                    driver: Some("i915"),
                    boot_vga: Some(true),
                    card: Some(1),
                    render: Some(129),
                    connectors: &[("DP-3", false), ("HDMI-A-2", false)],
                    ..Gpu::new("0000:00:02.0", 0x8086, 0x4680)
                })
                .gpu(Gpu {
                    parent: Some("0000:00:01.0"),
                    revision: 0xa1,
                    driver: Some("nvidia"),
                    boot_vga: Some(false),
                    card: Some(0),
                    render: Some(128),
                    connectors: &[("DP-1", true), ("DP-2", false), ("HDMI-A-1", false)],
                    power_control: "on",
                    nvidia_minor: Some(0),
                    ..Gpu::new("0000:01:00.0", 0x10de, 0x2684)
                })
                .pci_function(func(
                    "0000:01:00.1",
                    Some("0000:00:01.0"),
                    (0x10de, 0x22ba),
                    CLASS_HDA,
                    "snd_hda_intel",
                    ACTIVE,
                )),
            Some("0000:00:02.0"),
        ),
        // Tiger Lake laptop + Radeon RX 6700 XT in a Thunderbolt enclosure (Maple Ridge
        // upstream/downstream ports), nothing plugged into the eGPU.
        "egpu" => (
            host(b, 0x8086, 0x9a14)
                .gpu(Gpu {
                    revision: 0x01,
                    driver: Some("i915"),
                    boot_vga: Some(true),
                    card: Some(0),
                    render: Some(128),
                    connectors: &[("eDP-1", true), ("DP-1", false), ("DP-2", false)],
                    ..Gpu::new("0000:00:02.0", 0x8086, 0x9a49)
                })
                .pci_bridge("0000:00:07.0", None, 0x8086, 0x9a23)
                .external_facing("0000:00:07.0")
                .pci_function(func(
                    "0000:00:0d.0",
                    None,
                    (0x8086, 0x9a13),
                    0x0c0330,
                    "xhci_hcd",
                    ACTIVE,
                ))
                .pci_function(func(
                    "0000:00:0d.2",
                    None,
                    (0x8086, 0x9a1b),
                    0x0c0340,
                    "thunderbolt",
                    ACTIVE,
                ))
                .pci_bridge("0000:05:00.0", Some("0000:00:07.0"), 0x8086, 0x1136)
                .pci_bridge("0000:06:01.0", Some("0000:05:00.0"), 0x8086, 0x1136)
                .gpu(Gpu {
                    parent: Some("0000:06:01.0"),
                    revision: 0xc1,
                    driver: Some("amdgpu"),
                    boot_vga: Some(false),
                    card: Some(1),
                    render: Some(129),
                    connectors: &[("DP-3", false), ("HDMI-A-1", false)],
                    removable: true,
                    ..Gpu::new("0000:07:00.0", 0x1002, 0x73df)
                })
                .pci_function(func(
                    "0000:07:00.1",
                    Some("0000:06:01.0"),
                    (0x1002, 0xab28),
                    CLASS_HDA,
                    "snd_hda_intel",
                    ACTIVE,
                )),
            Some("0000:00:02.0"),
        ),
        // QEMU q35 guest with two virtio-gpu-pci (class 0x038000: no boot_vga). Connector
        // ids are global per type, so the second card's is Virtual-2.
        "vm_virtio" => {
            let virtio = |addr, idx: u32, conn: &'static [(&'static str, bool)]| Gpu {
                subsys: (0x1af4, 0x1100),
                class: CLASS_DISPLAY_OTHER,
                revision: 0x01,
                driver: Some("virtio-pci"),
                card: Some(idx),
                render: Some(128 + idx),
                connectors: conn,
                power_control: "on",
                virtio_index: Some(idx),
                ..Gpu::new(addr, 0x1af4, 0x1050)
            };
            (
                host(b, 0x8086, 0x29c0)
                    .no_iommu()
                    .gpu(virtio("0000:00:02.0", 0, &[("Virtual-1", true)]))
                    .gpu(virtio("0000:00:03.0", 1, &[("Virtual-2", false)]))
                    .pci_function(func(
                        "0000:00:1f.0",
                        None,
                        (0x8086, 0x2918),
                        0x060100,
                        "lpc_ich",
                        ACTIVE,
                    ))
                    .pci_function(func(
                        "0000:00:1f.2",
                        None,
                        (0x8086, 0x2922),
                        0x010601,
                        "ahci",
                        ACTIVE,
                    ))
                    .pci_function(func(
                        "0000:00:1f.3",
                        None,
                        (0x8086, 0x2930),
                        0x0c0500,
                        "i801_smbus",
                        ACTIVE,
                    )),
                Some("0000:00:02.0"),
            )
        }
        // What tier 3 boots: qemu-system-x86_64 (i440fx) -nodefaults -device VGA
        // -device virtio-gpu-pci; modules bochs, virtio_pci, virtio-gpu in that order.
        // bochs has no render node. QEMU enables virtio-gpu's scanout 0, so its
        // connector reads connected.
        "qemu_vga_virtio" => (
            host(b, 0x8086, 0x1237)
                .no_iommu()
                .pci_function(Func::new("0000:00:01.0", 0x8086, 0x7000, 0x060100))
                .pci_function(func(
                    "0000:00:01.1",
                    None,
                    (0x8086, 0x7010),
                    0x010180,
                    "ata_piix",
                    ACTIVE,
                ))
                .pci_function(func(
                    "0000:00:01.3",
                    None,
                    (0x8086, 0x7113),
                    0x068000,
                    "piix4_smbus",
                    ACTIVE,
                ))
                .gpu(Gpu {
                    subsys: (0x1af4, 0x1100),
                    revision: 0x02,
                    driver: Some("bochs-drm"),
                    boot_vga: Some(true),
                    card: Some(0),
                    connectors: &[("Virtual-1", true)],
                    power_control: "on",
                    ..Gpu::new("0000:00:02.0", 0x1234, 0x1111)
                })
                .gpu(Gpu {
                    subsys: (0x1af4, 0x1100),
                    class: CLASS_DISPLAY_OTHER,
                    revision: 0x01,
                    driver: Some("virtio-pci"),
                    card: Some(1),
                    render: Some(128),
                    connectors: &[("Virtual-2", true)],
                    power_control: "on",
                    virtio_index: Some(0),
                    ..Gpu::new("0000:00:03.0", 0x1af4, 0x1050)
                }),
            Some("0000:00:02.0"),
        ),
        // Alder Lake-P laptop whose RTX 3060 is passed through: vfio-pci holds both
        // functions (runtime-suspended to D3hot), no DRM nodes, no nvidia module.
        "vfio" => (
            host(b, 0x8086, 0x4641)
                .pci_bridge("0000:00:01.0", None, 0x8086, 0x460d)
                .gpu(Gpu {
                    revision: 0x0c,
                    driver: Some("i915"),
                    boot_vga: Some(true),
                    card: Some(0),
                    render: Some(128),
                    connectors: &[("eDP-1", true), ("HDMI-A-1", false)],
                    ..Gpu::new("0000:00:02.0", 0x8086, 0x46a6)
                })
                .gpu(Gpu {
                    parent: Some("0000:00:01.0"),
                    revision: 0xa1,
                    driver: Some("vfio-pci"),
                    boot_vga: Some(false),
                    power_state: "D3hot",
                    runtime_status: "suspended",
                    ..Gpu::new("0000:01:00.0", 0x10de, 0x2520)
                })
                .pci_function(func(
                    "0000:01:00.1",
                    Some("0000:00:01.0"),
                    (0x10de, 0x228e),
                    CLASS_HDA,
                    "vfio-pci",
                    ("D3hot", "suspended"),
                )),
            Some("0000:00:02.0"),
        ),
        // Intel + RTX 3050 with no NVIDIA driver installed: no driver link, no DRM, D0,
        // runtime PM forbidden (power/control "on", the PCI default).
        "nodriver" => (
            host(b, 0x8086, 0x4641)
                .pci_bridge("0000:00:01.0", None, 0x8086, 0x460d)
                .gpu(Gpu {
                    revision: 0x0c,
                    driver: Some("i915"),
                    boot_vga: Some(true),
                    card: Some(0),
                    render: Some(128),
                    connectors: &[("eDP-1", true), ("HDMI-A-1", false)],
                    ..Gpu::new("0000:00:02.0", 0x8086, 0x46a6)
                })
                .gpu(Gpu {
                    parent: Some("0000:00:01.0"),
                    revision: 0xa1,
                    boot_vga: Some(false),
                    power_control: "on",
                    ..Gpu::new("0000:01:00.0", 0x10de, 0x25a2)
                })
                .pci_function(func(
                    "0000:01:00.1",
                    Some("0000:00:01.0"),
                    (0x10de, 0x2291),
                    CLASS_HDA,
                    "snd_hda_intel",
                    ACTIVE,
                )),
            Some("0000:00:02.0"),
        ),
        // Intel iGPU (default) + RTX 4090 (nvidia) + Radeon RX 6800 (amdgpu): three
        // loaders to select from (environment grants). The second root port is an ADL
        // x4 controller (463d).
        "intel_nvidia_amd" => (
            b.pci_bridge("0000:00:01.0", None, 0x8086, 0x460d)
                .pci_bridge("0000:00:01.1", None, 0x8086, 0x463d)
                .gpu(Gpu {
                    driver: Some("i915"),
                    boot_vga: Some(true),
                    card: Some(1),
                    render: Some(128),
                    connectors: &[("eDP-1", true)],
                    ..Gpu::new("0000:00:02.0", 0x8086, 0x4680)
                })
                .gpu(Gpu {
                    parent: Some("0000:00:01.0"),
                    driver: Some("nvidia"),
                    boot_vga: Some(false),
                    card: Some(0),
                    render: Some(129),
                    nvidia_minor: Some(0),
                    ..Gpu::new("0000:01:00.0", 0x10de, 0x2684)
                })
                .pci_function(Func {
                    parent: Some("0000:00:01.0"),
                    driver: Some("snd_hda_intel"),
                    ..Func::new("0000:01:00.1", 0x10de, 0x22ba, CLASS_HDA)
                })
                .gpu(Gpu {
                    parent: Some("0000:00:01.1"),
                    driver: Some("amdgpu"),
                    boot_vga: Some(false),
                    card: Some(2),
                    render: Some(130),
                    ..Gpu::new("0000:02:00.0", 0x1002, 0x73bf)
                }),
            Some("0000:00:02.0"),
        ),
        // Intel iGPU (default) + two RTX 4090s: nvidia's render offload needs a provider
        // name (NVIDIA-G<n>, in device-minor order).
        "two_nvidia" => (
            b.pci_bridge("0000:00:01.0", None, 0x8086, 0x460d)
                .pci_bridge("0000:00:01.1", None, 0x8086, 0x463d)
                .gpu(Gpu {
                    driver: Some("i915"),
                    boot_vga: Some(true),
                    card: Some(0),
                    render: Some(128),
                    connectors: &[("eDP-1", true)],
                    ..Gpu::new("0000:00:02.0", 0x8086, 0x4680)
                })
                .gpu(Gpu {
                    parent: Some("0000:00:01.0"),
                    driver: Some("nvidia"),
                    boot_vga: Some(false),
                    card: Some(1),
                    render: Some(129),
                    nvidia_minor: Some(0),
                    ..Gpu::new("0000:01:00.0", 0x10de, 0x2684)
                })
                .gpu(Gpu {
                    parent: Some("0000:00:01.1"),
                    driver: Some("nvidia"),
                    boot_vga: Some(false),
                    card: Some(2),
                    render: Some(130),
                    nvidia_minor: Some(1),
                    ..Gpu::new("0000:02:00.0", 0x10de, 0x2684)
                }),
            Some("0000:00:02.0"),
        ),
        // A desktop on an AMD 760G board (RS780L northbridge): its Radeon 3000 IGP at
        // 01:05.0 behind the northbridge's internal bridge (1022:9602), beside only its
        // HDMI audio, and a Radeon HD 5450 add-in card in the PCIe slot (00:02.0), which
        // the firmware boots on (a monitor on its DVI port). The IGP is the chipset's.
        "amd_760g" => (
            host(b, 0x1022, 0x9600)
                .pci_bridge("0000:00:01.0", None, 0x1022, 0x9602)
                .pci_bridge("0000:00:02.0", None, 0x1022, 0x9603)
                .gpu(Gpu {
                    parent: Some("0000:00:01.0"),
                    driver: Some("radeon"),
                    boot_vga: Some(false),
                    card: Some(1),
                    render: Some(129),
                    connectors: &[("VGA-2", false), ("HDMI-A-2", false)],
                    ..Gpu::new("0000:01:05.0", 0x1002, 0x9616)
                })
                .pci_function(func(
                    "0000:01:05.1",
                    Some("0000:00:01.0"),
                    (0x1002, 0x960f),
                    CLASS_HDA,
                    "snd_hda_intel",
                    ACTIVE,
                ))
                .gpu(Gpu {
                    parent: Some("0000:00:02.0"),
                    driver: Some("radeon"),
                    boot_vga: Some(true),
                    card: Some(0),
                    render: Some(128),
                    connectors: &[("DVI-I-1", true), ("HDMI-A-1", false), ("VGA-1", false)],
                    ..Gpu::new("0000:02:00.0", 0x1002, 0x68f9)
                })
                .pci_function(func(
                    "0000:02:00.1",
                    Some("0000:00:02.0"),
                    (0x1002, 0xaa68),
                    CLASS_HDA,
                    "snd_hda_intel",
                    ACTIVE,
                )),
            Some("0000:02:00.0"),
        ),
        // No GPU at all: a root port and an Intel I226-V NIC; no DRM, so no class/drm.
        "none" => (
            b.pci_bridge("0000:00:1c.0", None, 0x8086, 0x7a38)
                .pci_function(func(
                    "0000:01:00.0",
                    Some("0000:00:1c.0"),
                    (0x8086, 0x125c),
                    0x020000,
                    "igc",
                    ACTIVE,
                )),
            None,
        ),
        _ => panic!("unknown fixture machine {name:?}; known: {MACHINES:?}"),
    };
    b.name(name).expect_default(default).build()
}
