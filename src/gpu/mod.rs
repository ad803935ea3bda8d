//! GPU discovery: a pure read of a sysfs root and a procfs root.
//!
//! Discovery follows the real kernel layout (the `bus/pci/devices` symlinks,
//! `class/drm`, `driver` links), so a fixture tree that copies a real machine
//! is read exactly like the machine itself. It never opens a device node and
//! never reads PCI `config`: either would wake the GPU gpuctl protects.

mod drm;
mod names;
mod nvidia;
mod pci;
pub mod sleep;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub use pci::PciAddr;

/// A character device number as userspace writes it (`226:1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    pub const fn new(major: u32, minor: u32) -> Self {
        DevNum { major, minor }
    }

    /// From a userspace `st_rdev`/`st_dev` (glibc's encoding, not the
    /// kernel-internal `major << 20 | minor`).
    pub fn from_userspace(dev: u64) -> Self {
        let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff);
        let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff);
        DevNum::new(major as u32, minor as u32)
    }
}

/// A file as the kernel identifies it: its superblock's device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FileId {
    pub dev: DevNum,
    pub ino: u64,
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl FromStr for DevNum {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let (maj, min) = s
            .split_once(':')
            .with_context(|| format!("device number {s:?} is not MAJOR:MINOR"))?;
        Ok(DevNum {
            major: maj.parse().with_context(|| format!("bad major in {s:?}"))?,
            minor: min.parse().with_context(|| format!("bad minor in {s:?}"))?,
        })
    }
}

impl Serialize for DevNum {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DevNum {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The major number of the NVIDIA proprietary driver's nodes.
pub const NVIDIA_MAJOR: u32 = 195;
/// The DRM character major (`/dev/dri/cardN`, `renderDN`).
pub const DRM_MAJOR: u32 = 226;
/// `/dev/nvidiactl`, shared by every NVIDIA GPU.
pub const NVIDIACTL: DevNum = DevNum::new(NVIDIA_MAJOR, 255);

/// A DRM connector of a GPU and whether something is plugged into it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Display {
    /// Connector name without the card prefix: `eDP-1`, `HDMI-A-1`.
    pub connector: String,
    /// `connected`, `disconnected` or `unknown`, as the kernel reports it;
    /// `None` (`null`) when the `status` file cannot be read.
    pub status: Option<String>,
}

impl Display {
    pub fn connected(&self) -> bool {
        self.status.as_deref() == Some("connected")
    }
    /// Internal panels: the display a laptop's default GPU drives.
    pub fn internal(&self) -> bool {
        ["eDP", "LVDS", "DSI"]
            .iter()
            .any(|p| self.connector.starts_with(p))
    }
}

/// One GPU, with every fact of the `list --json` contract (ARCHITECTURE.md#interfaces).
/// A fact that could not be read is `None` (`null`), never invented.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub id: u32,
    pub pci: PciAddr,
    pub vendor_id: String,
    pub device_id: String,
    pub vendor: Option<String>,
    pub name: Option<String>,
    pub driver: Option<String>,
    pub default: bool,
    pub offload: bool,
    pub discrete: Option<bool>,
    pub boot_vga: Option<bool>,
    pub card: Option<String>,
    pub render: Option<String>,
    /// Device numbers of every node of this GPU: card, render, then nvidiaN.
    pub nodes: Vec<DevNum>,
    pub nvidia_minor: Option<u32>,
    pub power_state: Option<String>,
    pub runtime_status: Option<String>,
    pub displays: Vec<Display>,
    /// Whether runtime PM can put it to sleep at all, and what stops it
    /// (`sleep` in `list --json`).
    #[serde(default)]
    pub sleep: sleep::Sleep,
    /// The device's other PCI functions (HD audio `.1`, USB-C `.2`, UCSI
    /// `.3`, a second display function): runtime-PM consumers of the GPU,
    /// so touching them can wake it.
    #[serde(default)]
    pub functions: Vec<Function>,
    /// Sysfs files whose reads wake the GPU (`config`, `resourceN`, `rom`),
    /// its other functions' included, for the lsm backend. Not part of the
    /// JSON contract.
    #[serde(skip)]
    pub wake_files: Vec<FileId>,
    /// Sysfs files only enumerators read (the function's `uevent`: libdrm),
    /// denied with the GPU by the lsm backend so `drmGetDevices2` skips a
    /// blocked GPU. Not part of the JSON contract.
    #[serde(skip)]
    pub enum_files: Vec<FileId>,
    /// Filled in by the daemon; `None` when no daemon answers.
    pub blocked: Option<bool>,
    /// A display server (or logind on its behalf) holding this GPU's
    /// primary node open, as `comm (pid N)`: blocking the GPU would leave
    /// it advertising a GPU its clients cannot open. Filled in by the
    /// daemon before it plans a block (a procfs scan), never by discovery.
    #[serde(skip)]
    pub display_holder: Option<DisplayHolder>,
}

/// A display server (or logind on its behalf) holding a GPU's primary
/// node: what a skip names, typed (issue 18, F2), shown as `comm (pid N)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DisplayHolder {
    pub comm: String,
    pub pid: u32,
    /// The owner of `/proc/<pid>`: who may see its pid and name.
    pub uid: u32,
}

impl fmt::Display for DisplayHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (pid {})", self.comm, self.pid)
    }
}

impl Gpu {
    /// Whether the GPU drives a connected display.
    pub fn drives_display(&self) -> bool {
        self.displays.iter().any(Display::connected)
    }
    pub fn is_nvidia(&self) -> bool {
        self.vendor_id == "10de"
    }
    /// The short label a person reads: `1 (0000:01:00.0, GA107M …)`.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("GPU {} ({}, {})", self.id, self.pci, n),
            None => format!("GPU {} ({})", self.id, self.pci),
        }
    }
}

/// Another PCI function of a GPU's device (same domain, bus and slot).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Function {
    pub pci: PciAddr,
    pub vendor_id: String,
    pub device_id: String,
    /// The PCI class code, `0x040300` (HD audio), `0x0c0330` (xHCI), …
    pub class: String,
    pub driver: Option<String>,
    pub power_state: Option<String>,
    pub runtime_status: Option<String>,
    /// Its ALSA nodes (`116:7`), for an audio function: a process holding
    /// one keeps the function, and so the GPU, awake.
    #[serde(default)]
    pub sound_nodes: Vec<DevNum>,
}

/// Every GPU of the machine, ids assigned (default GPU 0, then PCI order).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub gpus: Vec<Gpu>,
    /// DRM nodes that belong to no GPU of the list (`simpledrm`, `vkms`,
    /// DisplayLink): never blocked, but known, so that the guard on new
    /// nodes of a blocked GPU's major leaves them open
    /// ([`crate::policy::Guard`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_nodes: Vec<DevNum>,
}

impl Inventory {
    pub fn default_gpu(&self) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.default)
    }

    /// Resolves a user's GPU argument: an id (`1`), or a PCI address
    /// (`0000:01:00.0` or `01:00.0`).
    pub fn find(&self, arg: &str) -> Result<&Gpu, String> {
        let arg = arg.trim();
        if let Ok(id) = arg.parse::<u32>() {
            return self
                .gpus
                .iter()
                .find(|g| g.id == id)
                .ok_or_else(|| format!("no GPU with id {id} (see `gpuctl list`)"));
        }
        let addr = PciAddr::parse_lenient(arg)
            .map_err(|_| format!("{arg:?} is neither a GPU id nor a PCI address"))?;
        self.gpus
            .iter()
            .find(|g| g.pci == addr)
            .ok_or_else(|| format!("no GPU at PCI address {addr} (see `gpuctl list`)"))
    }
}

impl Inventory {
    /// The GPU `gpuctl run` uses: `arg` if given, else the first offload
    /// GPU that has device nodes.
    pub fn run_target(&self, arg: Option<&str>) -> Result<&Gpu, String> {
        match arg {
            Some(a) => self.find(a),
            None => self
                .gpus
                .iter()
                .find(|g| g.offload && !g.nodes.is_empty())
                .ok_or_else(|| "this machine has no offload GPU to run on".to_string()),
        }
    }
}

impl Gpu {
    /// The environment that makes GL and Vulkan programs render on this
    /// GPU: NVIDIA's PRIME render offload variables for the proprietary
    /// driver, Mesa's `DRI_PRIME` and Vulkan device selection otherwise.
    /// With several NVIDIA GPUs, `__NV_PRIME_RENDER_OFFLOAD_PROVIDER` names
    /// this one (`inv` is the machine's inventory).
    pub fn offload_env(&self, inv: &Inventory) -> Vec<(&'static str, String)> {
        if self.driver.as_deref() == Some("nvidia") {
            let mut env = vec![
                ("__NV_PRIME_RENDER_OFFLOAD", "1".into()),
                ("__GLX_VENDOR_LIBRARY_NAME", "nvidia".into()),
                ("__VK_LAYER_NV_optimus", "NVIDIA_only".into()),
            ];
            if let Some(p) = crate::envgrant::nv_provider(inv, self) {
                env.push(("__NV_PRIME_RENDER_OFFLOAD_PROVIDER", p));
            }
            env
        } else {
            let pci = self.pci.to_string().replace([':', '.'], "_");
            vec![
                ("DRI_PRIME", format!("pci-{pci}")),
                (
                    "MESA_VK_DEVICE_SELECT",
                    format!("{}:{}", self.vendor_id, self.device_id),
                ),
            ]
        }
    }
}

/// Where discovery reads from.
#[derive(Clone, Debug)]
pub struct Roots {
    pub sysfs: PathBuf,
    pub procfs: PathBuf,
}

/// A GPU as read from sysfs, before the machine-wide rules (ids, default).
struct Found {
    pci: pci::PciFunction,
    drm: drm::DrmNodes,
    nvidia_minor: Option<u32>,
}

/// Reads every GPU of the machine.
pub fn discover(roots: &Roots) -> Result<Inventory> {
    let functions = pci::scan(&roots.sysfs)?;
    let drm = drm::scan(&roots.sysfs)?;
    let nvidia_bound = functions
        .iter()
        .filter(|f| f.is_gpu() && f.driver.as_deref() == Some("nvidia"))
        .count();
    let mut found: Vec<Found> = functions
        .iter()
        .filter(|f| f.is_gpu())
        .map(|f| Found {
            pci: f.clone(),
            drm: drm::nodes_of(&drm, &f.path),
            nvidia_minor: None,
        })
        .collect();
    // A display-class function without DRM nodes beside a GPU at function
    // 0 of the same slot is part of that GPU (an old Intel iGPU's second
    // display function, 00:02.1, class 0x0380, no driver), not a GPU.
    let heads: Vec<PciAddr> = found
        .iter()
        .filter(|f| f.pci.addr.func == 0)
        .map(|f| f.pci.addr)
        .collect();
    found.retain(|f| {
        let a = f.pci.addr;
        let nodeless = f.drm.card.is_none() && f.drm.render.is_none();
        !(a.func != 0 && nodeless && heads.iter().any(|h| h.same_slot(&a)))
    });
    for f in &mut found {
        if f.pci.driver.as_deref() == Some("nvidia") {
            f.nvidia_minor = nvidia::device_minor(&roots.procfs, &f.pci, nvidia_bound);
        }
    }
    found.sort_by_key(|f| f.pci.addr);

    let default_idx = choose_default(&found, &functions);
    let gpu_addrs: Vec<PciAddr> = found.iter().map(|f| f.pci.addr).collect();
    let mut gpus: Vec<Gpu> = found
        .into_iter()
        .enumerate()
        .map(|(i, f)| to_gpu(f, Some(i) == default_idx, &functions, &gpu_addrs, roots))
        .collect();
    // Stable ids: the default GPU is 0, the rest follow in PCI order.
    gpus.sort_by_key(|g| (!g.default, g.pci));
    for (id, g) in gpus.iter_mut().enumerate() {
        g.id = id as u32;
    }
    let mut other_nodes: Vec<DevNum> = drm::all_devs(&drm)
        .into_iter()
        .filter(|d| !gpus.iter().any(|g| g.nodes.contains(d)))
        .collect();
    other_nodes.sort();
    Ok(Inventory { gpus, other_nodes })
}

/// ARCHITECTURE.md#modes: `boot_display == 1` (Linux 6.18+), else `boot_vga == 1`; without them, the GPU driving a connected
/// internal panel; else the lowest PCI address among the GPUs that are not
/// discrete (an AMD APU at `c4:00.0` above an NVIDIA dGPU at `01:00.0`
/// without `boot_vga`: Dell AMD+NVIDIA laptops), then among the rest.
/// `found` is in PCI order.
fn choose_default(found: &[Found], all: &[pci::PciFunction]) -> Option<usize> {
    // Linux 6.18+: `boot_display` names the boot display whatever its
    // class; where any GPU has it, it decides.
    if let Some(i) = found.iter().position(|f| f.pci.boot_display == Some(true)) {
        return Some(i);
    }
    if let Some(i) = found.iter().position(|f| f.pci.boot_vga == Some(true)) {
        return Some(i);
    }
    if let Some(i) = found
        .iter()
        .position(|f| f.drm.displays.iter().any(|d| d.internal() && d.connected()))
    {
        return Some(i);
    }
    // Integrated first, unknown (virtual, BMC) next, discrete last; the
    // sort is stable, so each class keeps PCI order.
    let rank = |f: &Found| match pci::is_discrete(&f.pci, all) {
        Some(false) => 0,
        None => 1,
        Some(true) => 2,
    };
    (0..found.len()).min_by_key(|&i| rank(&found[i]))
}

/// The other PCI functions of `gpu`'s device: same slot, not a GPU of
/// their own.
fn functions_of(
    gpu: &pci::PciFunction,
    all: &[pci::PciFunction],
    gpus: &[PciAddr],
) -> Vec<Function> {
    all.iter()
        .filter(|f| f.addr != gpu.addr && f.addr.same_slot(&gpu.addr) && !gpus.contains(&f.addr))
        .map(|f| Function {
            pci: f.addr,
            vendor_id: format!("{:04x}", f.vendor),
            device_id: format!("{:04x}", f.device),
            class: format!("0x{:06x}", f.class),
            driver: f.driver.clone(),
            power_state: f.power_state.clone(),
            runtime_status: f.runtime_status.clone(),
            sound_nodes: pci::sound_nodes(&f.path),
        })
        .collect()
}

fn to_gpu(
    f: Found,
    default: bool,
    all: &[pci::PciFunction],
    gpus: &[PciAddr],
    roots: &Roots,
) -> Gpu {
    let mut nodes: Vec<DevNum> = [f.drm.card_dev, f.drm.render_dev]
        .into_iter()
        .flatten()
        .collect();
    if let Some(minor) = f.nvidia_minor {
        nodes.push(DevNum::new(NVIDIA_MAJOR, minor));
    }
    let discrete = pci::is_discrete(&f.pci, all);
    // Every function of the slot shares the device's power state: reading
    // one's `config` wakes the GPU, so the lsm backend guards them all.
    let functions = functions_of(&f.pci, all, gpus);
    let mut wake_files = pci::wake_files(&f.pci.path);
    for func in all
        .iter()
        .filter(|x| functions.iter().any(|g| g.pci == x.addr))
    {
        wake_files.extend(pci::wake_files(&func.path));
    }
    wake_files.sort();
    let enum_files = pci::enum_files(&f.pci.path);
    Gpu {
        id: 0,
        pci: f.pci.addr,
        vendor_id: format!("{:04x}", f.pci.vendor),
        device_id: format!("{:04x}", f.pci.device),
        vendor: names::vendor(f.pci.vendor),
        name: names::device(f.pci.vendor, f.pci.device),
        driver: f.pci.driver.clone(),
        default,
        offload: !default,
        discrete,
        boot_vga: f.pci.boot_vga,
        card: f.drm.card,
        render: f.drm.render,
        nodes,
        nvidia_minor: f.nvidia_minor,
        power_state: f.pci.power_state.clone(),
        runtime_status: f.pci.runtime_status.clone(),
        displays: f.drm.displays,
        sleep: sleep::verdict(&roots.sysfs, &roots.procfs, &f.pci, all),
        functions,
        wake_files,
        enum_files,
        blocked: None,
        display_holder: None,
    }
}

/// A plain GPU for unit tests: `id` at `pci`, vendor `vendor_id`, one node
/// 226:`id`, the default one or an offload (discrete) one; no names, no
/// power facts, no displays. Tests adjust the fields they care about.
#[cfg(test)]
pub fn test_gpu(id: u32, pci: &str, vendor_id: &str, default: bool) -> Gpu {
    Gpu {
        id,
        pci: pci.parse().expect("a PCI address"),
        vendor_id: vendor_id.into(),
        device_id: "0000".into(),
        vendor: None,
        name: None,
        driver: Some("x".into()),
        default,
        offload: !default,
        discrete: Some(!default),
        boot_vga: Some(default),
        card: None,
        render: None,
        nodes: vec![DevNum::new(226, id)],
        nvidia_minor: None,
        power_state: None,
        runtime_status: None,
        displays: Vec::new(),
        sleep: Default::default(),
        functions: Vec::new(),
        wake_files: Vec::new(),
        enum_files: Vec::new(),
        blocked: None,
        display_holder: None,
    }
}

/// Reads a small sysfs attribute, trimmed; `None` when absent or unreadable
/// ([`crate::safefile::read_attr`], following symlinks as the kernfs
/// layouts of fixtures may).
pub(crate) fn read_attr(path: &Path) -> Option<String> {
    crate::safefile::read_attr(path, false)
}

/// The device numbers that keep a GPU awake while held open: its own nodes
/// and its other functions' sound nodes, keyed for membership tests.
pub fn node_owners(inv: &Inventory) -> BTreeMap<DevNum, u32> {
    inv.gpus
        .iter()
        .flat_map(|g| {
            let sound = g.functions.iter().flat_map(|f| f.sound_nodes.iter());
            g.nodes.iter().chain(sound).map(move |n| (*n, g.id))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Discovery runs in the daemon's loop: a FIFO where an attribute should
    /// be (a fixture, a hostile tree under `--sysfs-root`) is no attribute,
    /// and never hangs it (it blocked in open(2) with `read_to_string`).
    #[test]
    fn an_attribute_that_is_a_fifo_is_absent_at_once() {
        let d = std::env::temp_dir().join(format!("gpuctl-attr-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let fifo = d.join("power_state");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || tx.send(read_attr(&f)).unwrap());
        let got = rx.recv_timeout(std::time::Duration::from_secs(5));
        if got.is_err() {
            // Let the stuck reader go, so the test process can end.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        assert_eq!(got, Ok(None));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn devnum_round_trip() {
        let d: DevNum = "226:129\n".parse().unwrap();
        assert_eq!(d, DevNum::new(226, 129));
        assert_eq!(d.to_string(), "226:129");
        assert!("226".parse::<DevNum>().is_err());
        assert!("a:b".parse::<DevNum>().is_err());
    }

    /// The lsm backend guards the dGPU's other functions' `config` too:
    /// `lspci` reading the HD-audio function's wakes the GPU.
    #[test]
    fn wake_files_include_the_other_functions() {
        use std::os::unix::fs::MetadataExt;
        let root = std::env::temp_dir().join(format!("gpuctl-wake-{}", std::process::id()));
        let sys = root.join("sys");
        let mut inodes = Vec::new();
        for (addr, class) in [("0000:01:00.0", "0x030000"), ("0000:01:00.1", "0x040300")] {
            let dir = sys.join("devices/pci0000:00").join(addr);
            std::fs::create_dir_all(&dir).unwrap();
            for (n, v) in [("vendor", "0x10de"), ("device", "0x25a2"), ("class", class)] {
                std::fs::write(dir.join(n), v).unwrap();
            }
            std::fs::write(dir.join("config"), [0u8; 64]).unwrap();
            inodes.push(std::fs::metadata(dir.join("config")).unwrap().ino());
            std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
            std::os::unix::fs::symlink(&dir, sys.join("bus/pci/devices").join(addr)).unwrap();
        }
        let inv = discover(&Roots {
            sysfs: sys,
            procfs: root.join("proc"),
        })
        .unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(inv.gpus.len(), 1);
        let got: Vec<u64> = inv.gpus[0].wake_files.iter().map(|f| f.ino).collect();
        for ino in inodes {
            assert!(got.contains(&ino), "{got:?}");
        }
        assert_eq!(inv.gpus[0].functions[0].pci.to_string(), "0000:01:00.1");
    }

    #[test]
    fn internal_panels() {
        let d = |c: &str, s: &str| Display {
            connector: c.into(),
            status: Some(s.into()),
        };
        assert!(d("eDP-1", "connected").internal());
        assert!(d("LVDS-1", "connected").internal());
        assert!(d("DSI-1", "connected").internal());
        assert!(!d("HDMI-A-1", "connected").internal());
        assert!(!d("eDP-1", "disconnected").connected());
    }
}
