//! Environment grants (smart mode): which GPUs a process exec'd with an
//! offload request may open, decided exactly as the real loaders decide
//! which GPU the program will use.
//!
//! The kernel side (`gpuctl_exec` in bpf/gpuctl.bpf.c) does no parsing: it
//! looks each candidate `NAME=value` string of the new environment up in a
//! map of *accepted strings* that this module derives from the inventory,
//! and ORs the GPU masks it finds. The only rewrite it makes is
//! `DRI_PRIME=<decimal N ≥ 1>` → `DRI_PRIME=1` (Mesa's loader clamps N to
//! the GPUs present). [`grant_for`] is the same evaluation in Rust: the
//! table tests below run it, and `root::envgrant` (tests/it/root/envgrant.rs) proves the kernel agrees.
//!
//! What each loader selects (Mesa's `loader_get_user_preferred_fd` and
//! Vulkan device-select layer, NVIDIA's PRIME render offload, the Vulkan
//! loader):
//!
//! - `DRI_PRIME=N` (decimal, N ≥ 1; `atoi`): the N-th GPU other than the
//!   default one, N clamped to the GPUs present. The order is libdrm's
//!   `/dev/dri` readdir order, which nothing fixes, so every offload GPU.
//!   `0`, `00` and junk (`yes`) select the default GPU: nothing.
//! - `DRI_PRIME=pci-DDDD_BB_DD_F[!]`: that GPU (the `!` is the Vulkan
//!   layer's "expose only this one"). `DRI_PRIME=vid:did[!]` and
//!   `MESA_VK_DEVICE_SELECT=vid:did[!]` (`sscanf("%x:%x")`): the GPU with
//!   those ids. Nothing when it names the default GPU (GNOME's "Launch
//!   using Integrated Graphics" sets the iGPU's tag) or no GPU at all.
//! - `__NV_PRIME_RENDER_OFFLOAD=1`, `__VK_LAYER_NV_optimus=NVIDIA_only`:
//!   the offload GPUs bound to the `nvidia` driver.
//! - `VK_ICD_FILENAMES` / `VK_DRIVER_FILES` (a manifest path) and
//!   `VK_LOADER_DRIVERS_SELECT` (a manifest file name or glob): the offload
//!   GPUs of the Vulkan driver that manifest belongs to, when no default
//!   GPU uses that driver too (then it would select the default GPU).
//!
//! Not seen (documented limits): a variable set after exec (`setenv` in a
//! running program), Mesa's drirc `device_id`, lists of several manifests,
//! globs other than `name`, `stem*` and `*stem*`, and spellings other than
//! the canonical ones (`0x10de:0x25a2`, `10de:25a2junk`).

use std::collections::BTreeMap;

use crate::gpu::{Gpu, Inventory};

/// Longest accepted string, NUL included (`GPUCTL_ENV_KEY_LEN`).
pub const KEY_LEN: usize = 96;

/// The variable names the kernel side looks at (their first 8 bytes are
/// its cheap pre-filter: see `env_candidate` in the BPF source).
#[cfg(test)]
pub const NAMES: &[&str] = &[
    "DRI_PRIME",
    "MESA_VK_DEVICE_SELECT",
    "__NV_PRIME_RENDER_OFFLOAD",
    "__VK_LAYER_NV_optimus",
    "VK_LOADER_DRIVERS_SELECT",
    "VK_ICD_FILENAMES",
    "VK_DRIVER_FILES",
];

/// Where Vulkan ICD manifests are installed (the loader's search path).
const ICD_DIRS: &[&str] = &[
    "/usr/share/vulkan/icd.d",
    "/etc/vulkan/icd.d",
    "/usr/local/share/vulkan/icd.d",
];

/// The Vulkan driver of a kernel driver: (glob stem, manifest file names).
fn vulkan_icd(driver: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match driver {
        "nvidia" => (
            "nvidia",
            &[
                "nvidia_icd.json",
                "nvidia_icd.x86_64.json",
                "nvidia_icd.i686.json",
            ],
        ),
        "amdgpu" => (
            "radeon",
            &["radeon_icd.x86_64.json", "radeon_icd.i686.json"],
        ),
        "i915" | "xe" => (
            "intel",
            &[
                "intel_icd.x86_64.json",
                "intel_icd.i686.json",
                "intel_hasvk_icd.x86_64.json",
                "intel_hasvk_icd.i686.json",
            ],
        ),
        "nouveau" => (
            "nouveau",
            &["nouveau_icd.x86_64.json", "nouveau_icd.i686.json"],
        ),
        "virtio-pci" | "virtio_gpu" => (
            "virtio",
            &["virtio_icd.x86_64.json", "virtio_icd.i686.json"],
        ),
        _ => return None,
    })
}

fn bit(g: &Gpu) -> u32 {
    1u32.checked_shl(g.id).unwrap_or(0)
}

/// Mesa's tag of a PCI GPU: `pci-0000_01_00_0`.
pub fn pci_tag(g: &Gpu) -> String {
    format!(
        "pci-{:04x}_{:02x}_{:02x}_{}",
        g.pci.domain, g.pci.bus, g.pci.dev, g.pci.func
    )
}

/// Every accepted environment string and the GPUs (id bit mask) it grants,
/// for this inventory. Strings longer than [`KEY_LEN`] - 1 are left out
/// (the kernel could not match them).
pub fn accepted(inv: &Inventory) -> BTreeMap<String, u32> {
    let mut out: BTreeMap<String, u32> = BTreeMap::new();
    let mut add = |k: String, mask: u32| {
        if mask != 0 && k.len() < KEY_LEN {
            *out.entry(k).or_default() |= mask;
        }
    };
    let offload: Vec<&Gpu> = inv.gpus.iter().filter(|g| g.offload).collect();
    let defaults: Vec<&Gpu> = inv.gpus.iter().filter(|g| !g.offload).collect();

    // DRI_PRIME=N: every offload GPU with a node to open.
    let any = offload
        .iter()
        .filter(|g| !g.nodes.is_empty())
        .fold(0, |m, g| m | bit(g));
    add("DRI_PRIME=1".into(), any);

    // NVIDIA's PRIME render offload.
    let nv = offload
        .iter()
        .filter(|g| g.driver.as_deref() == Some("nvidia"))
        .fold(0, |m, g| m | bit(g));
    add("__NV_PRIME_RENDER_OFFLOAD=1".into(), nv);
    add("__VK_LAYER_NV_optimus=NVIDIA_only".into(), nv);

    for g in &offload {
        let b = bit(g);
        let tag = pci_tag(g);
        add(format!("DRI_PRIME={tag}"), b);
        add(format!("DRI_PRIME={tag}!"), b);
        // vid:did, unless the default GPU has the same ids (the loader
        // could pick it).
        let same_ids = defaults
            .iter()
            .any(|d| d.vendor_id == g.vendor_id && d.device_id == g.device_id);
        if !same_ids {
            let lower = format!("{}:{}", g.vendor_id, g.device_id);
            let upper = lower.to_uppercase();
            for name in ["DRI_PRIME", "MESA_VK_DEVICE_SELECT"] {
                for ids in [&lower, &upper] {
                    add(format!("{name}={ids}"), b);
                    add(format!("{name}={ids}!"), b);
                }
            }
        }
        // A Vulkan driver only offload GPUs use.
        let Some((stem, files)) = g.driver.as_deref().and_then(vulkan_icd) else {
            continue;
        };
        let shared = defaults
            .iter()
            .any(|d| d.driver.as_deref().and_then(vulkan_icd).map(|x| x.0) == Some(stem));
        if shared {
            continue;
        }
        for f in files {
            for dir in ICD_DIRS {
                add(format!("VK_ICD_FILENAMES={dir}/{f}"), b);
                add(format!("VK_DRIVER_FILES={dir}/{f}"), b);
            }
            add(format!("VK_LOADER_DRIVERS_SELECT={f}"), b);
        }
        add(format!("VK_LOADER_DRIVERS_SELECT={stem}*"), b);
        add(format!("VK_LOADER_DRIVERS_SELECT=*{stem}*"), b);
    }
    out
}

/// The key the kernel looks up for one environment string, or `None` when
/// it does not look at it: the name pre-filter, the length limit, and the
/// `DRI_PRIME=N` rewrite.
#[cfg(test)]
pub fn kernel_key(s: &str) -> Option<String> {
    let (name, value) = s.split_once('=')?;
    if !NAMES.contains(&name) || s.len() >= KEY_LEN {
        return None;
    }
    if name == "DRI_PRIME"
        && !value.is_empty()
        && value.bytes().all(|c| c.is_ascii_digit())
        && value.bytes().any(|c| c != b'0')
    {
        return Some("DRI_PRIME=1".into());
    }
    Some(s.to_string())
}

/// The GPUs (id mask) an exec with environment `env` is granted.
#[cfg(test)]
pub fn grant_for(table: &BTreeMap<String, u32>, env: &[&str]) -> u32 {
    env.iter()
        .filter_map(|s| kernel_key(s))
        .filter_map(|k| table.get(&k))
        .fold(0, |m, g| m | g)
}

/// `__NV_PRIME_RENDER_OFFLOAD_PROVIDER` for `gpuctl run --gpu` when several
/// NVIDIA GPUs are present: `NVIDIA-G<n>`, n the GPU's index among the
/// NVIDIA GPUs in device-minor order (the driver's probe order, which is
/// how its X driver numbers GPU screens), PCI order when a minor is
/// unknown. `None` with a single NVIDIA GPU (the variable is not needed).
pub fn nv_provider(inv: &Inventory, gpu: &Gpu) -> Option<String> {
    let mut nv: Vec<&Gpu> = inv
        .gpus
        .iter()
        .filter(|g| g.driver.as_deref() == Some("nvidia"))
        .collect();
    if nv.len() < 2 {
        return None;
    }
    nv.sort_by_key(|g| (g.nvidia_minor.unwrap_or(u32::MAX), g.pci));
    let n = nv.iter().position(|g| g.pci == gpu.pci)?;
    Some(format!("NVIDIA-G{n}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::DevNum;

    fn gpu(id: u32, pci: &str, ids: (&str, &str), driver: &str, default: bool) -> Gpu {
        let v = serde_json::json!({
            "id": id, "pci": pci, "vendor_id": ids.0, "device_id": ids.1,
            "vendor": null, "name": null, "driver": driver, "default": default,
            "offload": !default, "discrete": !default, "boot_vga": default,
            "card": null, "render": null, "nodes": [format!("226:{}", 128 + id)],
            "nvidia_minor": null, "power_state": null, "runtime_status": null,
            "displays": [], "blocked": null,
        });
        let mut g: Gpu = serde_json::from_value(v).unwrap();
        g.nodes = vec![DevNum::new(226, 128 + id)];
        g
    }

    /// Intel Alder Lake iGPU (default) + RTX 3050 (nvidia).
    fn two() -> Inventory {
        Inventory {
            gpus: vec![
                gpu(0, "0000:00:02.0", ("8086", "46a6"), "i915", true),
                gpu(1, "0000:01:00.0", ("10de", "25a2"), "nvidia", false),
            ],
            ..Default::default()
        }
    }

    /// AMD APU (default) + Radeon dGPU (both amdgpu) + NVIDIA eGPU.
    fn three() -> Inventory {
        Inventory {
            gpus: vec![
                gpu(0, "0000:c4:00.0", ("1002", "15bf"), "amdgpu", true),
                gpu(1, "0000:03:00.0", ("1002", "73ef"), "amdgpu", false),
                gpu(2, "0000:07:00.0", ("10de", "2684"), "nvidia", false),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn table_two_gpus() {
        let t = accepted(&two());
        let g = |env: &[&str]| grant_for(&t, env);
        let cases: &[(&[&str], u32)] = &[
            (&[], 0),
            (&["PATH=/usr/bin", "HOME=/root"], 0),
            (&["DRI_PRIME=1"], 0b10),
            (&["DRI_PRIME=2"], 0b10),  // clamped by Mesa's loader
            (&["DRI_PRIME=01"], 0b10), // atoi
            (&["DRI_PRIME=0"], 0),
            (&["DRI_PRIME=00"], 0),
            (&["DRI_PRIME="], 0),
            (&["DRI_PRIME=yes"], 0),
            (&["DRI_PRIME=-1"], 0),
            (&["DRI_PRIME=pci-0000_01_00_0"], 0b10),
            (&["DRI_PRIME=pci-0000_01_00_0!"], 0b10),
            (&["DRI_PRIME=pci-0000_00_02_0"], 0), // the iGPU: user's choice
            (&["DRI_PRIME=pci-0000_00_02_0!"], 0),
            (&["DRI_PRIME=pci-0000_05_00_0"], 0), // no such GPU
            (&["DRI_PRIME=10de:25a2"], 0b10),
            (&["DRI_PRIME=10DE:25A2!"], 0b10),
            (&["DRI_PRIME=8086:46a6"], 0), // the iGPU
            (&["MESA_VK_DEVICE_SELECT=10de:25a2"], 0b10),
            (&["MESA_VK_DEVICE_SELECT=10de:25a2!"], 0b10),
            (&["MESA_VK_DEVICE_SELECT=8086:46a6!"], 0),
            (&["MESA_VK_DEVICE_SELECT=list"], 0),
            (&["__NV_PRIME_RENDER_OFFLOAD=1"], 0b10),
            (&["__NV_PRIME_RENDER_OFFLOAD=0"], 0),
            (&["__VK_LAYER_NV_optimus=NVIDIA_only"], 0b10),
            (&["__VK_LAYER_NV_optimus=non_NVIDIA_only"], 0),
            (
                &["VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/nvidia_icd.json"],
                0b10,
            ),
            (&["VK_DRIVER_FILES=/etc/vulkan/icd.d/nvidia_icd.json"], 0b10),
            (
                &["VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/intel_icd.x86_64.json"],
                0,
            ),
            (&["VK_LOADER_DRIVERS_SELECT=nvidia*"], 0b10),
            (&["VK_LOADER_DRIVERS_SELECT=*nvidia*"], 0b10),
            (&["VK_LOADER_DRIVERS_SELECT=nvidia_icd.json"], 0b10),
            (&["VK_LOADER_DRIVERS_SELECT=intel*"], 0),
            // A name that only starts like one.
            (&["DRI_PRIMEX=1"], 0),
            // Combined: the loaders' selections add up.
            (&["DRI_PRIME=pci-0000_00_02_0", "HOME=/root"], 0),
        ];
        for (env, want) in cases {
            assert_eq!(g(env), *want, "{env:?}");
        }
    }

    #[test]
    fn table_three_gpus() {
        let t = accepted(&three());
        let g = |env: &[&str]| grant_for(&t, env);
        let cases: &[(&[&str], u32)] = &[
            // Nth non-default GPU in /dev/dri order: every offload GPU.
            (&["DRI_PRIME=1"], 0b110),
            (&["DRI_PRIME=2"], 0b110),
            (&["DRI_PRIME=pci-0000_03_00_0"], 0b010),
            (&["DRI_PRIME=pci-0000_07_00_0!"], 0b100),
            (&["DRI_PRIME=pci-0000_c4_00_0"], 0),
            (&["DRI_PRIME=1002:73ef"], 0b010),
            (&["DRI_PRIME=1002:15bf"], 0),
            (&["MESA_VK_DEVICE_SELECT=10de:2684!"], 0b100),
            (&["MESA_VK_DEVICE_SELECT=1002:15BF"], 0),
            (&["__NV_PRIME_RENDER_OFFLOAD=1"], 0b100),
            (&["__VK_LAYER_NV_optimus=NVIDIA_only"], 0b100),
            // RADV serves the default APU too: naming it selects nothing.
            (
                &["VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/radeon_icd.x86_64.json"],
                0,
            ),
            (&["VK_LOADER_DRIVERS_SELECT=radeon*"], 0),
            (
                &["VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/nvidia_icd.json"],
                0b100,
            ),
            (
                &["DRI_PRIME=pci-0000_03_00_0", "__NV_PRIME_RENDER_OFFLOAD=1"],
                0b110,
            ),
        ];
        for (env, want) in cases {
            assert_eq!(g(env), *want, "{env:?}");
        }
    }

    #[test]
    fn mux_in_dgpu_mode_grants_nothing_for_nvidia_offload() {
        // The NVIDIA GPU is the default: nothing to offload to.
        let mut inv = two();
        inv.gpus[0].default = false;
        inv.gpus[0].offload = true;
        inv.gpus[1].default = true;
        inv.gpus[1].offload = false;
        let t = accepted(&inv);
        assert_eq!(grant_for(&t, &["__NV_PRIME_RENDER_OFFLOAD=1"]), 0);
        assert_eq!(grant_for(&t, &["DRI_PRIME=1"]), 0b01);
    }

    #[test]
    fn keys_fit_the_kernel_map() {
        for inv in [two(), three()] {
            for k in accepted(&inv).keys() {
                assert!(k.len() < KEY_LEN, "{k}");
                let name = k.split('=').next().unwrap();
                assert!(NAMES.contains(&name), "{k}");
                // Every name's first 8 bytes are what the kernel filters on.
                assert!(name.len() >= 8, "{name}");
            }
        }
    }

    #[test]
    fn nv_provider_only_with_several_nvidia_gpus() {
        let inv = two();
        assert_eq!(nv_provider(&inv, &inv.gpus[1]), None);
        let mut inv = three();
        inv.gpus[1].driver = Some("nvidia".into());
        inv.gpus[1].nvidia_minor = Some(1);
        inv.gpus[2].nvidia_minor = Some(0);
        assert_eq!(
            nv_provider(&inv, &inv.gpus[2]).as_deref(),
            Some("NVIDIA-G0")
        );
        assert_eq!(
            nv_provider(&inv, &inv.gpus[1]).as_deref(),
            Some("NVIDIA-G1")
        );
    }
}
