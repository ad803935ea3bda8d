//! "Can this GPU sleep at all?": a verdict from sysfs (and, for NVIDIA, the
//! driver's procfs file while the GPU is awake), with the fix for each
//! problem. Blocking a GPU saves power only if runtime PM can then suspend
//! it; these are the settings that stop it. Reads only files that do not
//! wake the GPU.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::pci::{PciAddr, PciFunction};
use super::read_attr;

/// What a problem costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The GPU never runtime-suspends: blocking it saves nothing.
    NoSleep,
    /// It can suspend, but its slot cannot power off (D3hot, not D3cold).
    NoD3cold,
}

/// One setting that keeps the GPU (or its slot) powered, and its fix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocker {
    pub effect: Effect,
    pub problem: String,
    pub fix: String,
}

/// The verdict for one GPU (`sleep` in `list --json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sleep {
    /// Whether runtime PM can suspend it when idle; `null` when sysfs does not say.
    pub can_sleep: Option<bool>,
    /// Whether it can reach D3cold; `null` when unknown.
    pub d3cold: Option<bool>,
    pub blockers: Vec<Blocker>,
}

impl Sleep {
    /// One line for people: `yes`, `D3hot only: …`, `no: …`.
    pub fn summary(&self) -> String {
        let first = |e: Effect| {
            self.blockers
                .iter()
                .find(|b| b.effect == e)
                .map(|b| b.problem.clone())
        };
        match (self.can_sleep, self.d3cold) {
            (Some(false), _) => format!("no: {}", first(Effect::NoSleep).unwrap_or_default()),
            (Some(true), Some(false)) => {
                format!(
                    "D3hot only: {}",
                    first(Effect::NoD3cold).unwrap_or_default()
                )
            }
            (Some(true), _) => "yes".to_string(),
            (None, _) => "unknown".to_string(),
        }
    }
}

fn dev_dir(sysfs: &Path, addr: PciAddr) -> std::path::PathBuf {
    sysfs.join(format!("bus/pci/devices/{addr}"))
}

/// The PCI bridge above a function (its parent directory), if it is one.
pub fn bridge_of(f: &PciFunction) -> Option<PciAddr> {
    f.path.parent()?.file_name()?.to_string_lossy().parse().ok()
}

/// The verdict for GPU function `gpu`; `all` is every PCI function.
pub fn verdict(sysfs: &Path, procfs: &Path, gpu: &PciFunction, all: &[PciFunction]) -> Sleep {
    let mut v = Sleep::default();
    let dir = &gpu.path;
    let addr = gpu.addr;
    let control = read_attr(&dir.join("power/control"));
    let status = gpu.runtime_status.as_deref();
    let mut no = |effect, problem: String, fix: String| {
        v.blockers.push(Blocker {
            effect,
            problem,
            fix,
        })
    };
    if control.as_deref() == Some("on") {
        no(
            Effect::NoSleep,
            "runtime power management off (power/control = on): it never sleeps, blocked or not"
                .into(),
            format!(
                "echo auto > /sys/bus/pci/devices/{addr}/power/control\n\
                 (persistently: a udev rule ATTR{{power/control}}=\"auto\" for it, or TLP/power-profiles)"
            ),
        );
    }
    if status == Some("unsupported") {
        no(
            Effect::NoSleep,
            "runtime PM is disabled for this device (power/runtime_status = unsupported)".into(),
            "bind a driver that supports runtime PM (NVIDIA: NVreg_DynamicPowerManagement=0x02)"
                .into(),
        );
    }
    if gpu.driver.as_deref() == Some("nvidia") && status != Some("suspended") {
        // Reading the driver's file takes a runtime-PM reference: only
        // while the GPU is awake anyway.
        let p = procfs.join(format!("driver/nvidia/gpus/{addr}/power"));
        if let Some(d3) = std::fs::read_to_string(p)
            .ok()
            .as_deref()
            .and_then(nvidia_runtime_d3)
        {
            let lower = d3.to_ascii_lowercase();
            if lower.starts_with("disabled") || lower.starts_with("not supported") {
                no(
                    Effect::NoSleep,
                    format!("the NVIDIA driver reports Runtime D3 status: {d3}"),
                    "options nvidia NVreg_DynamicPowerManagement=0x02\n\
                     (in /etc/modprobe.d/nvidia-pm.conf, then rebuild the initramfs and reboot; \
                     Turing and newer notebook GPUs support it)"
                        .into(),
                );
            }
        }
    }
    if read_attr(&dir.join("d3cold_allowed")).as_deref() == Some("0") {
        no(
            Effect::NoD3cold,
            "D3cold not allowed: it can only reach D3hot (more power)".into(),
            format!("echo 1 > /sys/bus/pci/devices/{addr}/d3cold_allowed"),
        );
    }
    for s in all
        .iter()
        .filter(|f| f.addr != addr && f.addr.same_slot(&addr))
    {
        let sdir = dev_dir(sysfs, s.addr);
        let what = if s.class >> 8 == 0x0403 {
            "audio function"
        } else {
            "sibling function"
        };
        if read_attr(&sdir.join("power/control")).as_deref() == Some("on") {
            no(
                Effect::NoD3cold,
                format!(
                    "its {what} {} has runtime PM off (power/control = on): it keeps the slot \
                     powered",
                    s.addr
                ),
                format!("echo auto > /sys/bus/pci/devices/{}/power/control", s.addr),
            );
        } else if s.driver.as_deref() == Some("snd_hda_intel")
            && read_attr(&sysfs.join("module/snd_hda_intel/parameters/power_save")).as_deref()
                == Some("0")
        {
            no(
                Effect::NoD3cold,
                format!(
                    "its {what} {} never powers down (snd_hda_intel power_save = 0): it keeps \
                     the slot powered",
                    s.addr
                ),
                "echo 1 > /sys/module/snd_hda_intel/parameters/power_save\n\
                 (persistently: options snd_hda_intel power_save=1)"
                    .into(),
            );
        }
    }
    // ACPI systems: D3cold needs a power resource (_PR3), on the GPU's own
    // node or on its bridge; sysfs shows it as firmware_node/power_resources_D3hot.
    let fw = |d: &Path| d.join("firmware_node").exists();
    let pr3 = |d: &Path| d.join("firmware_node/power_resources_D3hot").exists();
    let bridge = bridge_of(gpu);
    let bdir = bridge.map(|b| dev_dir(sysfs, b));
    let own_pr3 = pr3(dir);
    if let (Some(b), Some(bd)) = (bridge, &bdir) {
        // With its own power resource the GPU powers off by itself; else
        // the slot's power goes with the bridge, which must suspend.
        if !own_pr3 && read_attr(&bd.join("power/control")).as_deref() == Some("on") {
            no(
                Effect::NoD3cold,
                format!(
                    "the bridge above it ({b}) has runtime PM off (power/control = on): the slot \
                     cannot power off"
                ),
                format!("echo auto > /sys/bus/pci/devices/{b}/power/control"),
            );
        }
    }
    if fw(dir) && !own_pr3 && !bdir.as_deref().is_some_and(pr3) {
        no(
            Effect::NoD3cold,
            "the firmware gives it no power resource (_PR3 on the GPU or its bridge): it can \
             reach D3hot, not D3cold (unless its driver cuts power another way, e.g. AMD's \
             older ATPX)"
                .into(),
            "none from Linux: a firmware (BIOS) setting or update (e.g. hybrid/Optimus mode)"
                .into(),
        );
    }

    let known = control.is_some() || status.is_some();
    v.can_sleep = known.then(|| !v.blockers.iter().any(|b| b.effect == Effect::NoSleep));
    v.d3cold = match v.can_sleep {
        Some(true) => Some(!v.blockers.iter().any(|b| b.effect == Effect::NoD3cold)),
        Some(false) => Some(false),
        None => None,
    };
    v
}

/// `Runtime D3 status:` of `/proc/driver/nvidia/gpus/<pci>/power`.
fn nvidia_runtime_d3(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == "Runtime D3 status")
        .map(|(_, v)| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nvidia_power_file() {
        let text = "Runtime D3 status:          Enabled (fine-grained)\n\
                    Video Memory:               Active\n";
        assert_eq!(
            nvidia_runtime_d3(text).as_deref(),
            Some("Enabled (fine-grained)")
        );
        assert_eq!(nvidia_runtime_d3("Video Memory: Off\n"), None);
    }

    #[test]
    fn summary_names_the_first_problem() {
        let b = |effect, p: &str| Blocker {
            effect,
            problem: p.into(),
            fix: "x".into(),
        };
        let mut s = Sleep {
            can_sleep: Some(true),
            d3cold: Some(true),
            blockers: vec![],
        };
        assert_eq!(s.summary(), "yes");
        s.d3cold = Some(false);
        s.blockers.push(b(Effect::NoD3cold, "audio"));
        assert_eq!(s.summary(), "D3hot only: audio");
        s.can_sleep = Some(false);
        s.blockers.push(b(Effect::NoSleep, "control on"));
        assert_eq!(s.summary(), "no: control on");
        assert_eq!(Sleep::default().summary(), "unknown");
    }
}
