//! PCI functions, read from `<sysfs>/bus/pci/devices/*` (symlinks into
//! `devices/pci…/`). Only cached attributes are read: `vendor`, `device`,
//! `class`, `boot_vga`, `power_state`, `power/runtime_status`, `removable`
//! and the `driver` link. Never `config`, `resource*` or `rom`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::read_attr;

/// A PCI address: `dddd:bb:dd.f`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddr {
    pub domain: u32,
    pub bus: u8,
    pub dev: u8,
    pub func: u8,
}

impl PciAddr {
    /// Accepts `0000:01:00.0` and the short `01:00.0` (domain 0).
    pub fn parse_lenient(s: &str) -> Result<Self> {
        if s.matches(':').count() == 1 {
            return format!("0000:{s}").parse();
        }
        s.parse()
    }

    /// Same domain, bus and slot: functions of one physical device.
    pub fn same_slot(&self, other: &PciAddr) -> bool {
        (self.domain, self.bus, self.dev) == (other.domain, other.bus, other.dev)
    }
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.dev, self.func
        )
    }
}

impl FromStr for PciAddr {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || format!("{s:?} is not a PCI address like 0000:01:00.0");
        let (domain, rest) = s.split_once(':').with_context(bad)?;
        let (bus, rest) = rest.split_once(':').with_context(bad)?;
        let (dev, func) = rest.split_once('.').with_context(bad)?;
        if domain.len() != 4 || bus.len() != 2 || dev.len() != 2 || func.len() != 1 {
            bail!(bad());
        }
        let hex = |v: &str| u32::from_str_radix(v, 16).with_context(bad);
        let (dev, func) = (hex(dev)?, hex(func)?);
        if dev > 0x1f || func > 7 {
            bail!(bad());
        }
        Ok(PciAddr {
            domain: hex(domain)?,
            bus: hex(bus)? as u8,
            dev: dev as u8,
            func: func as u8,
        })
    }
}

impl Serialize for PciAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What discovery knows about one PCI function.
#[derive(Clone, Debug)]
pub struct PciFunction {
    pub addr: PciAddr,
    /// Canonical path of the function's directory under `devices/`.
    pub path: PathBuf,
    pub vendor: u16,
    pub device: u16,
    pub class: u32,
    pub driver: Option<String>,
    pub boot_vga: Option<bool>,
    /// `boot_display` (Linux 6.18+): present, as `1`, on the device the
    /// firmware showed the boot screen on, whatever its class (a 3D or
    /// display-class GPU has no `boot_vga`). Preferred to `boot_vga`.
    pub boot_display: Option<bool>,
    pub power_state: Option<String>,
    pub runtime_status: Option<String>,
    pub removable: Option<bool>,
}

impl PciFunction {
    /// Display controllers: PCI base class 0x03 (VGA, XGA, 3D, other).
    pub fn is_gpu(&self) -> bool {
        self.class >> 16 == 0x03
    }
}

const VENDOR_NVIDIA: u16 = 0x10de;
const VENDOR_INTEL: u16 = 0x8086;
const VENDOR_AMD_GPU: u16 = 0x1002;
const VENDOR_AMD_PLATFORM: u16 = 0x1022;

/// NVIDIA GPUs built into a chipset (nForce/MCP integrated graphics:
/// C51 GeForce 6100/6150, MCP61/67/68/73 GeForce 7xxx, MCP77/78/79
/// GeForce 8200/9300/9400(M)/ION, MCP89 GeForce 320M). They are the
/// integrated GPU of the machine (a MacBook's 9400M or 320M), not a card.
const NVIDIA_CHIPSET_GPUS: &[(u16, u16)] = &[
    (0x0240, 0x0247), // C51
    (0x03d0, 0x03d6), // MCP61
    (0x0530, 0x053e), // MCP67/68
    (0x07e0, 0x07e5), // MCP73
    (0x0840, 0x084f), // MCP77/78
    (0x0860, 0x087f), // MCP79/7A
    (0x08a0, 0x08a5), // MCP89
];

/// AMD/ATI GPUs built into a northbridge (RS690 Radeon X1200/X1250, RS740
/// Radeon 2100, RS780 Radeon HD 3000/3100/3200/3300, RS880 Radeon HD
/// 4200/4250/4290: the 690G/740G/760G/780G/785G/790GX/880G boards). They
/// sit behind the northbridge's internal PCI bridge (`01:05.0` behind the
/// 0x1022 bridge at `00:01.0`) with only their own HDMI audio beside them,
/// so the bus rule below would call them cards.
const AMD_CHIPSET_GPUS: &[(u16, u16)] = &[
    (0x791e, 0x791f), // RS690
    (0x796c, 0x796f), // RS740
    (0x9610, 0x9616), // RS780
    (0x9710, 0x9715), // RS880
];

/// Whether an AMD device id is a chipset (integrated) GPU.
pub fn is_amd_chipset_gpu(device: u16) -> bool {
    AMD_CHIPSET_GPUS
        .iter()
        .any(|&(lo, hi)| (lo..=hi).contains(&device))
}

/// Whether an NVIDIA device id is a chipset (integrated) GPU.
pub fn is_nvidia_chipset_gpu(device: u16) -> bool {
    NVIDIA_CHIPSET_GPUS
        .iter()
        .any(|&(lo, hi)| (lo..=hi).contains(&device))
}

/// Whether a GPU is a discrete one; `None` where sysfs does not tell
/// (virtual GPUs, BMC graphics, unknown vendors). A guess from PCI facts:
/// the policy never refuses a mode on it alone.
///
/// - Removable (Thunderbolt/USB4 eGPU): discrete.
/// - NVIDIA: discrete, except the chipset GPUs of nForce/MCP chipsets.
/// - Intel: integrated GPUs are on the root bus (00:02.0); Arc cards are not.
/// - AMD: the northbridge GPUs of RS690 to RS880 chipsets are integrated;
///   a GPU on the root bus is an APU's (pre-Zen APUs, Llano to
///   Stoney/Kabini, sit at 00:01.0 beside only 0x1002 functions); so is one
///   whose slot also holds platform functions of AMD's chipset vendor id
///   0x1022 (USB, crypto, audio co-processor: Zen APUs behind a bridge). A
///   Radeon card sits behind a bridge and its slot holds only its own
///   functions (vendor 0x1002).
pub fn is_discrete(gpu: &PciFunction, all: &[PciFunction]) -> Option<bool> {
    if gpu.removable == Some(true) {
        return Some(true);
    }
    match gpu.vendor {
        VENDOR_NVIDIA => Some(!is_nvidia_chipset_gpu(gpu.device)),
        VENDOR_INTEL => Some(gpu.addr.bus != 0),
        VENDOR_AMD_GPU => {
            if gpu.addr.bus == 0 || is_amd_chipset_gpu(gpu.device) {
                return Some(false);
            }
            let apu = all.iter().any(|f| {
                f.addr != gpu.addr && f.addr.same_slot(&gpu.addr) && f.vendor == VENDOR_AMD_PLATFORM
            });
            Some(!apu)
        }
        _ => None,
    }
}

fn hex_attr(dir: &Path, name: &str) -> Option<u32> {
    let v = read_attr(&dir.join(name))?;
    u32::from_str_radix(v.trim_start_matches("0x"), 16).ok()
}

fn link_name(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// The function's sysfs files whose reads reach the hardware and so wake a
/// sleeping GPU: `config` (lspci reads it), the BAR files `resourceN` and
/// `resourceN_wc`, and `rom`. Identified by `lstat`, which reads nothing.
/// The text file `resource` (the BAR table, kept in memory) is not one.
pub fn wake_files(dir: &Path) -> Vec<super::FileId> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<super::FileId> = entries
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n == "config"
                || n == "rom"
                || n.strip_prefix("resource").is_some_and(|r| {
                    let r = r.strip_suffix("_wc").unwrap_or(r);
                    !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit())
                })
        })
        .filter_map(|e| std::fs::symlink_metadata(e.path()).ok())
        .filter(|m| m.is_file())
        .map(|m| super::FileId {
            dev: super::DevNum::from_userspace(m.dev()),
            ino: m.ino(),
        })
        .collect();
    out.sort();
    out
}

/// The function's sysfs files that enumerators read to find a GPU but that
/// nothing needs from a blocked one: `uevent` (libdrm's `drmGetDevices2`
/// reads `PCI_SLOT_NAME` from it and skips a device whose read fails — what
/// Mesa's loader, the Vulkan drivers, Xorg and compositors call). With the
/// lsm backend a blocked GPU is thus skipped by libdrm without an error,
/// while its nodes stay present for `access`/`stat`/`bwrap --dev-bind`.
pub fn enum_files(dir: &Path) -> Vec<super::FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir.join("uevent"))
        .ok()
        .filter(|m| m.is_file())
        .map(|m| super::FileId {
            dev: super::DevNum::from_userspace(m.dev()),
            ino: m.ino(),
        })
        .into_iter()
        .collect()
}

/// The ALSA device nodes of an audio function: `dev` of every entry of
/// `<function>/sound/cardN/` (`controlC1`, `hwC1D0`, `pcmC1D3p`, …).
pub fn sound_nodes(dir: &Path) -> Vec<super::DevNum> {
    let mut out = Vec::new();
    let Ok(cards) = std::fs::read_dir(dir.join("sound")) else {
        return out;
    };
    for card in cards.flatten() {
        let Ok(entries) = std::fs::read_dir(card.path()) else {
            continue;
        };
        for e in entries.flatten() {
            if let Some(d) = read_attr(&e.path().join("dev")).and_then(|d| d.parse().ok()) {
                out.push(d);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Reads one PCI function's directory.
fn read_function(addr: PciAddr, path: PathBuf) -> Option<PciFunction> {
    Some(PciFunction {
        addr,
        vendor: hex_attr(&path, "vendor")? as u16,
        device: hex_attr(&path, "device")? as u16,
        class: hex_attr(&path, "class")?,
        driver: link_name(&path.join("driver")),
        boot_vga: read_attr(&path.join("boot_vga")).map(|v| v == "1"),
        boot_display: read_attr(&path.join("boot_display")).map(|v| v == "1"),
        power_state: read_attr(&path.join("power_state")),
        runtime_status: read_attr(&path.join("power/runtime_status")),
        removable: read_attr(&path.join("removable")).and_then(|v| match v.as_str() {
            "removable" => Some(true),
            "fixed" => Some(false),
            _ => None,
        }),
        path,
    })
}

/// Every PCI function of the machine. A missing `bus/pci/devices` directory
/// is a machine without PCI (or without sysfs): no functions, no error.
pub fn scan(sysfs: &Path) -> Result<Vec<PciFunction>> {
    let dir = sysfs.join("bus/pci/devices");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let name = entry.file_name();
        let Ok(addr) = name.to_string_lossy().parse::<PciAddr>() else {
            continue;
        };
        // A device can disappear between readdir and here (hot unplug).
        let Ok(path) = entry.path().canonicalize() else {
            continue;
        };
        if let Some(f) = read_function(addr, path) {
            out.push(f);
        }
    }
    out.sort_by_key(|f| f.addr);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn func(addr: &str, vendor: u16, class: u32) -> PciFunction {
        PciFunction {
            addr: addr.parse().unwrap(),
            path: PathBuf::new(),
            vendor,
            device: 0,
            class,
            driver: None,
            boot_vga: None,
            boot_display: None,
            power_state: None,
            runtime_status: None,
            removable: None,
        }
    }

    #[test]
    fn addr_parse_and_print() {
        let a: PciAddr = "0000:01:00.0".parse().unwrap();
        assert_eq!(a.to_string(), "0000:01:00.0");
        assert_eq!(PciAddr::parse_lenient("01:00.0").unwrap(), a);
        assert_eq!(PciAddr::parse_lenient("0000:c1:00.0").unwrap().bus, 0xc1);
        for bad in [
            "",
            "1",
            "01:00",
            "0000:01:00.8",
            "0000:01:20.0",
            "zz:00.0",
            "0:1:0.0",
        ] {
            assert!(PciAddr::parse_lenient(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn discrete_rules() {
        let igpu = func("0000:00:02.0", VENDOR_INTEL, 0x030000);
        let arc = func("0000:03:00.0", VENDOR_INTEL, 0x030000);
        let nv = func("0000:01:00.0", VENDOR_NVIDIA, 0x030200);
        let apu = func("0000:05:00.0", VENDOR_AMD_GPU, 0x030000);
        let apu_usb = func("0000:05:00.3", VENDOR_AMD_PLATFORM, 0x0c0330);
        let radeon = func("0000:03:00.0", VENDOR_AMD_GPU, 0x030000);
        let radeon_audio = func("0000:03:00.1", VENDOR_AMD_GPU, 0x040300);
        let virtio = func("0000:00:02.0", 0x1af4, 0x038000);
        let all = vec![apu.clone(), apu_usb, radeon.clone(), radeon_audio];
        assert_eq!(is_discrete(&igpu, &[]), Some(false));
        assert_eq!(is_discrete(&arc, &[]), Some(true));
        assert_eq!(is_discrete(&nv, &[]), Some(true));
        assert_eq!(is_discrete(&apu, &all), Some(false));
        assert_eq!(is_discrete(&radeon, &all), Some(true));
        assert_eq!(is_discrete(&virtio, &[]), None);
        let mut egpu = func("0000:07:00.0", 0x1234, 0x030000);
        egpu.removable = Some(true);
        assert_eq!(is_discrete(&egpu, &[]), Some(true));
        // Pre-Zen APU (Kabini) on the root bus, its HDMI audio its only sibling.
        let kabini = func("0000:00:01.0", VENDOR_AMD_GPU, 0x030000);
        let kabini_audio = func("0000:00:01.1", VENDOR_AMD_GPU, 0x040300);
        assert_eq!(
            is_discrete(&kabini, &[kabini.clone(), kabini_audio]),
            Some(false)
        );
        // GeForce 9400M (MCP79) and 320M (MCP89): chipset GPUs.
        let mut mcp79 = func("0000:02:00.0", VENDOR_NVIDIA, 0x030000);
        mcp79.device = 0x0863;
        assert_eq!(is_discrete(&mcp79, &[]), Some(false));
        mcp79.device = 0x08a0;
        assert_eq!(is_discrete(&mcp79, &[]), Some(false));
        mcp79.device = 0x0a29; // GT 330M, the MacBook Pro's discrete one
        assert_eq!(is_discrete(&mcp79, &[]), Some(true));
        // AMD 760G: the RS780L Radeon 3000 behind the northbridge's bridge,
        // beside only its HDMI audio (0x1002): the chipset's, not a card.
        let mut rs780 = func("0000:01:05.0", VENDOR_AMD_GPU, 0x030000);
        let rs780_audio = func("0000:01:05.1", VENDOR_AMD_GPU, 0x040300);
        for id in [0x791e, 0x791f, 0x796e, 0x9610, 0x9616, 0x9710, 0x9715] {
            rs780.device = id;
            let all = [rs780.clone(), rs780_audio.clone()];
            assert_eq!(is_discrete(&rs780, &all), Some(false), "{id:04x}");
        }
        // Its neighbours in the id space are cards (Radeon HD 4650 9498,
        // HD 5450 68f9), and RS780's HDMI audio id (960f) is not a GPU id.
        for id in [0x9498, 0x68f9, 0x9617, 0x9716] {
            rs780.device = id;
            assert_eq!(is_discrete(&rs780, &[]), Some(true), "{id:04x}");
        }
    }
}
