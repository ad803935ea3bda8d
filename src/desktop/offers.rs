//! What `gpuctl switcheroo` offers the desktop: the GPUs a launch may use
//! now, as switcheroo-control 3.x describes them (`Name`, `Environment`,
//! `Default`, `Discrete`). Pure: built from the daemon's `list` and
//! `status`, tested without a bus.
//!
//! The rules:
//! - the default GPU is always offered, first (switcherooctl and GNOME
//!   treat the first `Default` entry as "the integrated one");
//! - another GPU is offered when launching on it works: it is not blocked,
//!   or the mode is smart and the daemon's exec hook grants environments
//!   (`env_grants`). In integrated mode (or a manual block) it is left out,
//!   so desktops hide "Launch using Discrete Graphics Card" instead of
//!   launching into a denial;
//! - each GPU's `Environment` is what switcheroo-control sets for it, and
//!   for an offload GPU every variable gpuctl's kernel grant looks at is
//!   one `envgrant::accepted` grants that GPU for (the unit test below
//!   checks this on every fixture machine).

use crate::envgrant;
use crate::gpu::{Gpu, Inventory};
use crate::policy::Mode;
use crate::proto::data::{ListData, StatusData};

/// One GPU as the desktop sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    pub name: String,
    /// `[NAME, value, NAME, value, …]`.
    pub environment: Vec<String>,
    pub default: bool,
    pub discrete: bool,
}

/// The user-facing name: vendor and model, as switcheroo-control joins
/// its hwdb's vendor and product names.
fn name(g: &Gpu) -> String {
    match (&g.vendor, &g.name) {
        (Some(v), Some(n)) => format!("{v} {n}"),
        (None, Some(n)) => n.clone(),
        (Some(v), None) => format!("{v} {}:{}", g.vendor_id, g.device_id),
        (None, None) => format!("GPU {}:{}", g.vendor_id, g.device_id),
    }
}

/// switcheroo-control's environment for a GPU: NVIDIA's PRIME render
/// offload variables for a GPU on the `nvidia` driver (with the provider
/// when several NVIDIA GPUs are present, as `gpuctl run --gpu` sets it),
/// Mesa's `DRI_PRIME=pci-…` tag for any other.
pub fn environment(inv: &Inventory, g: &Gpu) -> Vec<String> {
    let mut env: Vec<String> = Vec::new();
    if g.driver.as_deref() == Some("nvidia") {
        for (k, v) in [
            ("__GLX_VENDOR_LIBRARY_NAME", "nvidia"),
            ("__NV_PRIME_RENDER_OFFLOAD", "1"),
            ("__VK_LAYER_NV_optimus", "NVIDIA_only"),
        ] {
            env.push(k.into());
            env.push(v.into());
        }
        if let Some(p) = envgrant::nv_provider(inv, g) {
            env.push("__NV_PRIME_RENDER_OFFLOAD_PROVIDER".into());
            env.push(p);
        }
    } else {
        env.push("DRI_PRIME".into());
        env.push(envgrant::pci_tag(g));
    }
    env
}

/// Whether a launch on `g` works now.
fn usable(g: &Gpu, status: &StatusData) -> bool {
    if g.default {
        return true;
    }
    let blocked = status
        .gpus
        .iter()
        .find(|s| s.id == g.id)
        .and_then(|s| s.blocked)
        .or(g.blocked)
        .unwrap_or(false);
    !blocked || (status.mode == Mode::Smart && status.env_grants)
}

/// The GPUs to offer, the default first, then by id.
pub fn offers(list: &ListData, status: &StatusData) -> Vec<Offer> {
    let inv = Inventory {
        gpus: list.gpus.iter().map(|l| l.gpu.clone()).collect(),
        ..Default::default()
    };
    let mut gpus: Vec<&Gpu> = inv.gpus.iter().filter(|g| usable(g, status)).collect();
    gpus.sort_by_key(|g| (!g.default, g.id));
    gpus.iter()
        .map(|g| Offer {
            name: name(g),
            environment: environment(&inv, g),
            default: g.default,
            discrete: g.discrete.unwrap_or(!g.default),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::data::{ListGpu, StatusGpu};

    fn gpu(id: u32, pci: &str, driver: &str, default: bool) -> Gpu {
        let vendor = if driver == "nvidia" { "10de" } else { "1002" };
        let v = serde_json::json!({
            "id": id, "pci": pci, "vendor_id": vendor,
            "device_id": format!("{:04x}", 0x1000 + id),
            "vendor": "Vendor", "name": format!("Model {id}"), "driver": driver,
            "default": default, "offload": !default, "discrete": !default,
            "boot_vga": default, "card": null, "render": null,
            "nodes": [format!("226:{}", 128 + id)],
            "nvidia_minor": null, "power_state": null, "runtime_status": null,
            "displays": [], "blocked": null,
        });
        let mut g: Gpu = serde_json::from_value(v).unwrap();
        g.nodes = vec![crate::gpu::DevNum::new(226, 128 + id)];
        g
    }

    fn data(gpus: &[Gpu], mode: Mode, blocked: &[u32], env_grants: bool) -> (ListData, StatusData) {
        let list = ListData {
            mode: Some(mode),
            gpus: gpus
                .iter()
                .map(|g| ListGpu {
                    gpu: g.clone(),
                    runtime_pm: None,
                    power_off: None,
                })
                .collect(),
            ..ListData::default()
        };
        let status = StatusData {
            mode,
            env_grants,
            gpus: gpus
                .iter()
                .map(|g| StatusGpu {
                    id: g.id,
                    default: g.default,
                    blocked: Some(blocked.contains(&g.id)),
                    ..StatusGpu::default()
                })
                .collect(),
            ..StatusData::default()
        };
        (list, status)
    }

    fn two() -> Vec<Gpu> {
        vec![
            gpu(1, "0000:01:00.0", "nvidia", false),
            gpu(0, "0000:00:02.0", "i915", true),
        ]
    }

    #[test]
    fn hybrid_offers_both_default_first() {
        let (l, s) = data(&two(), Mode::Hybrid, &[], true);
        let o = offers(&l, &s);
        assert_eq!(o.len(), 2);
        assert!(o[0].default && !o[0].discrete);
        assert_eq!(o[0].environment, ["DRI_PRIME", "pci-0000_00_02_0"]);
        assert_eq!(o[0].name, "Vendor Model 0");
        assert!(!o[1].default && o[1].discrete);
        assert_eq!(
            o[1].environment,
            [
                "__GLX_VENDOR_LIBRARY_NAME",
                "nvidia",
                "__NV_PRIME_RENDER_OFFLOAD",
                "1",
                "__VK_LAYER_NV_optimus",
                "NVIDIA_only"
            ]
        );
    }

    #[test]
    fn integrated_hides_the_blocked_gpu() {
        let (l, s) = data(&two(), Mode::Integrated, &[1], true);
        let o = offers(&l, &s);
        assert_eq!(o.len(), 1);
        assert!(o[0].default);
    }

    #[test]
    fn smart_offers_it_only_with_env_grants() {
        let (l, s) = data(&two(), Mode::Smart, &[1], true);
        assert_eq!(offers(&l, &s).len(), 2);
        let (l, s) = data(&two(), Mode::Smart, &[1], false);
        assert_eq!(offers(&l, &s).len(), 1);
    }

    #[test]
    fn manual_block_hides_only_the_blocked_one() {
        let gpus = vec![
            gpu(0, "0000:00:02.0", "i915", true),
            gpu(1, "0000:01:00.0", "nvidia", false),
            gpu(2, "0000:02:00.0", "amdgpu", false),
        ];
        let (l, s) = data(&gpus, Mode::Manual, &[1], true);
        let o = offers(&l, &s);
        assert_eq!(o.len(), 2);
        assert_eq!(o[1].environment, ["DRI_PRIME", "pci-0000_02_00_0"]);
    }

    #[test]
    fn two_nvidia_gpus_name_the_provider() {
        let mut a = gpu(1, "0000:01:00.0", "nvidia", false);
        a.nvidia_minor = Some(0);
        let mut b = gpu(2, "0000:02:00.0", "nvidia", false);
        b.nvidia_minor = Some(1);
        let gpus = vec![gpu(0, "0000:00:02.0", "i915", true), a, b];
        let (l, s) = data(&gpus, Mode::Hybrid, &[], true);
        let o = offers(&l, &s);
        assert_eq!(
            o[2].environment[6..],
            ["__NV_PRIME_RENDER_OFFLOAD_PROVIDER", "NVIDIA-G1"]
        );
    }

    /// Every offered offload GPU's environment is granted that GPU by the
    /// kernel's table: a desktop launch in smart mode opens it.
    #[test]
    fn every_offload_environment_is_granted() {
        let machines = [
            two(),
            vec![
                gpu(0, "0000:00:02.0", "i915", true),
                gpu(1, "0000:01:00.0", "nvidia", false),
                gpu(2, "0000:02:00.0", "amdgpu", false),
            ],
            vec![
                gpu(0, "0000:06:00.0", "amdgpu", true),
                gpu(1, "0000:01:00.0", "amdgpu", false),
            ],
        ];
        for gpus in machines {
            let inv = Inventory {
                gpus: gpus.clone(),
                ..Default::default()
            };
            let table = envgrant::accepted(&inv);
            for g in gpus.iter().filter(|g| g.offload) {
                let env = environment(&inv, g);
                let pairs: Vec<String> = env.chunks(2).map(|p| p.join("=")).collect();
                let refs: Vec<&str> = pairs.iter().map(String::as_str).collect();
                let mask = envgrant::grant_for(&table, &refs);
                assert_eq!(mask & (1 << g.id), 1 << g.id, "{pairs:?} for GPU {}", g.id);
            }
        }
    }
}
