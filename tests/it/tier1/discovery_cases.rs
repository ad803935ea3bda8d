//! Tier 1: the discovery cases real machines got wrong (issue 10), each as
//! a fixture copy of such a machine read by `gpuctl list --json` with no
//! daemon. Runs unprivileged.

use std::process::Command;

use crate::common::fixture::{Builder, Func, Gpu, Machine, CLASS_DISPLAY_OTHER, CLASS_HDA};
use crate::common::harness::{describe, BIN};
use serde_json::{json, Value};

fn list(m: &Machine) -> Vec<Value> {
    let out = Command::new(BIN)
        .env("GPUCTL_SOCKET", m.root().join("no-daemon.sock"))
        .env("GPUCTL_SYSFS_ROOT", m.sysfs())
        .env("GPUCTL_PROCFS_ROOT", m.procfs())
        .args(["list", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}: {}", m.name(), describe(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["gpus"].as_array().unwrap().clone()
}

fn by_pci<'a>(gpus: &'a [Value], pci: &str) -> &'a Value {
    gpus.iter()
        .find(|g| g["pci"] == pci)
        .unwrap_or_else(|| panic!("no GPU {pci} in {gpus:#?}"))
}

fn f<'a>(addr: &'a str, parent: Option<&'a str>, id: (u16, u16), class: u32) -> Func<'a> {
    Func {
        parent,
        driver: Some(match class {
            CLASS_HDA => "snd_hda_intel",
            _ => "xhci_hcd",
        }),
        power_control: "auto",
        ..Func::new(addr, id.0, id.1, class)
    }
}

/// Pre-Zen APU (Beema, Radeon R5 at 00:01.0 with only its 0x1002 HDMI audio
/// beside it) + Radeon R7 M260 (Topaz, class 0x0380) behind a bridge.
fn prezen_apu_amd_dgpu() -> Machine {
    Builder::new()
        .name("prezen_apu_amd_dgpu")
        .pci_function(Func::new("0000:00:00.0", 0x1022, 0x1566, 0x060000))
        .gpu(Gpu {
            driver: Some("radeon"),
            boot_vga: Some(true),
            card: Some(0),
            render: Some(128),
            connectors: &[("eDP-1", true), ("HDMI-A-1", false)],
            ..Gpu::new("0000:00:01.0", 0x1002, 0x9851)
        })
        .pci_function(f("0000:00:01.1", None, (0x1002, 0x9902), CLASS_HDA))
        .pci_bridge("0000:00:02.1", None, 0x1022, 0x1439)
        .gpu(Gpu {
            parent: Some("0000:00:02.1"),
            class: CLASS_DISPLAY_OTHER,
            driver: Some("amdgpu"),
            card: Some(1),
            render: Some(129),
            power_state: "D3cold",
            runtime_status: "suspended",
            ..Gpu::new("0000:01:00.0", 0x1002, 0x6900)
        })
        .expect_default(Some("0000:00:01.0"))
        .build()
}

#[test]
fn prezen_amd_apu_is_integrated() {
    let m = prezen_apu_amd_dgpu();
    let g = list(&m);
    assert_eq!(g.len(), 2, "{g:#?}");
    let apu = by_pci(&g, "0000:00:01.0");
    assert_eq!(
        apu["discrete"], false,
        "an AMD GPU on the root bus is an APU"
    );
    assert_eq!(apu["default"], true);
    let dgpu = by_pci(&g, "0000:01:00.0");
    assert_eq!(dgpu["discrete"], true);
    assert_eq!(dgpu["offload"], true);
}

/// MacBook Pro 5,1: GeForce 9400M (MCP79 chipset GPU) drives the panel, the
/// GeForce 9600M GT is the discrete one.
#[test]
fn nvidia_chipset_gpu_is_integrated() {
    let m = Builder::new()
        .name("mcp79_9600m")
        .pci_function(Func::new("0000:00:00.0", 0x10de, 0x0a82, 0x060000))
        .pci_bridge("0000:00:10.0", None, 0x10de, 0x0aa0)
        .gpu(Gpu {
            parent: Some("0000:00:10.0"),
            driver: Some("nouveau"),
            boot_vga: Some(true),
            card: Some(0),
            render: Some(128),
            connectors: &[("LVDS-1", true), ("DP-1", false)],
            ..Gpu::new("0000:02:00.0", 0x10de, 0x0863)
        })
        .pci_bridge("0000:00:17.0", None, 0x10de, 0x0aa3)
        .gpu(Gpu {
            parent: Some("0000:00:17.0"),
            driver: Some("nouveau"),
            card: Some(1),
            render: Some(129),
            connectors: &[("DP-2", false)],
            ..Gpu::new("0000:03:00.0", 0x10de, 0x0647)
        })
        .build();
    let g = list(&m);
    assert_eq!(by_pci(&g, "0000:02:00.0")["discrete"], false, "9400M");
    assert_eq!(by_pci(&g, "0000:02:00.0")["default"], true);
    assert_eq!(by_pci(&g, "0000:03:00.0")["discrete"], true, "9600M GT");

    // MacBook Pro 7,1 (GeForce 320M only, MCP89) without boot_vga or a
    // connected panel: still integrated.
    let m = Builder::new()
        .name("mcp89")
        .gpu(Gpu {
            class: CLASS_DISPLAY_OTHER,
            driver: Some("nouveau"),
            card: Some(0),
            render: Some(128),
            ..Gpu::new("0000:02:00.0", 0x10de, 0x08a0)
        })
        .build();
    assert_eq!(list(&m)[0]["discrete"], false, "320M");
}

/// GM45 laptop: the iGPU's second display function (00:02.1, class 0x0380,
/// no driver, no nodes) is part of the GPU at 00:02.0.
#[test]
fn intel_second_display_function_is_not_a_gpu() {
    let m = Builder::new()
        .name("gm45")
        .gpu(Gpu {
            driver: Some("i915"),
            boot_vga: Some(true),
            card: Some(0),
            render: Some(128),
            connectors: &[("LVDS-1", true), ("VGA-1", false)],
            ..Gpu::new("0000:00:02.0", 0x8086, 0x2a42)
        })
        .gpu(Gpu {
            class: CLASS_DISPLAY_OTHER,
            ..Gpu::new("0000:00:02.1", 0x8086, 0x2a43)
        })
        .build();
    let g = list(&m);
    assert_eq!(g.len(), 1, "{g:#?}");
    assert_eq!(g[0]["pci"], "0000:00:02.0");
    assert_eq!(g[0]["functions"][0]["pci"], "0000:00:02.1");
    assert_eq!(g[0]["functions"][0]["class"], "0x038000");

    // A second display function *with* DRM nodes is a GPU of its own.
    let m = Builder::new()
        .name("two_heads")
        .gpu(Gpu {
            driver: Some("i915"),
            boot_vga: Some(true),
            card: Some(0),
            ..Gpu::new("0000:00:02.0", 0x8086, 0x2a42)
        })
        .gpu(Gpu {
            class: CLASS_DISPLAY_OTHER,
            driver: Some("i915"),
            card: Some(1),
            ..Gpu::new("0000:00:02.1", 0x8086, 0x2a43)
        })
        .build();
    assert_eq!(list(&m).len(), 2);
}

/// Dell AMD+NVIDIA laptop: the APU at c4:00.0 is not VGA-class (no
/// `boot_vga`), the NVIDIA dGPU at 01:00.0 has `boot_vga` 0, the panel is
/// off (lid closed): the APU is the default, not the lowest address.
#[test]
fn apu_above_nvidia_without_boot_vga_is_default() {
    let m = Builder::new()
        .name("dell_amd_nvidia")
        .pci_function(Func::new("0000:00:00.0", 0x1022, 0x14e8, 0x060000))
        .pci_bridge("0000:00:01.1", None, 0x1022, 0x14ed)
        .gpu(Gpu {
            parent: Some("0000:00:01.1"),
            driver: Some("nvidia"),
            boot_vga: Some(false),
            card: Some(1),
            render: Some(129),
            nvidia_minor: Some(0),
            ..Gpu::new("0000:01:00.0", 0x10de, 0x28e0)
        })
        .pci_function(f(
            "0000:01:00.1",
            Some("0000:00:01.1"),
            (0x10de, 0x22be),
            CLASS_HDA,
        ))
        .pci_bridge("0000:00:08.1", None, 0x1022, 0x14eb)
        .gpu(Gpu {
            parent: Some("0000:00:08.1"),
            class: CLASS_DISPLAY_OTHER,
            driver: Some("amdgpu"),
            card: Some(0),
            render: Some(128),
            connectors: &[("eDP-1", false), ("DP-1", false)],
            ..Gpu::new("0000:c4:00.0", 0x1002, 0x15bf)
        })
        .pci_function(f(
            "0000:c4:00.1",
            Some("0000:00:08.1"),
            (0x1002, 0x1640),
            CLASS_HDA,
        ))
        .pci_function(Func {
            parent: Some("0000:00:08.1"),
            driver: Some("ccp"),
            ..Func::new("0000:c4:00.2", 0x1022, 0x15c7, 0x108000)
        })
        .build();
    let g = list(&m);
    assert_eq!(g[0]["pci"], "0000:c4:00.0", "{g:#?}");
    assert_eq!(g[0]["default"], true);
    assert_eq!(g[0]["discrete"], false);
    assert_eq!(g[1]["pci"], "0000:01:00.0");
    assert_eq!(g[1]["offload"], true);
}

/// A writeback connector is not a display; an unreadable `status` is null.
#[test]
fn writeback_and_unreadable_connectors() {
    let m = Builder::new()
        .name("writeback")
        .gpu(Gpu {
            driver: Some("amdgpu"),
            boot_vga: Some(true),
            card: Some(0),
            render: Some(128),
            connectors: &[("eDP-1", true), ("Writeback-1", false), ("DP-1", false)],
            ..Gpu::new("0000:00:02.0", 0x8086, 0x46a6)
        })
        .build();
    std::fs::remove_file(m.sysfs().join("class/drm/card0-DP-1/status")).unwrap();
    let g = list(&m);
    assert_eq!(
        g[0]["displays"],
        json!([
            {"connector": "DP-1", "status": null},
            {"connector": "eDP-1", "status": "connected"},
        ])
    );
}

/// The dGPU's HD-audio function (01:00.1) and its ALSA nodes are listed as
/// the GPU's `functions`: holding them keeps the GPU awake.
#[test]
fn dgpu_audio_function_is_listed_with_its_sound_nodes() {
    let m = Builder::new()
        .name("nvidia_audio")
        .pci_bridge("0000:00:01.0", None, 0x8086, 0x460d)
        .gpu(Gpu {
            driver: Some("i915"),
            boot_vga: Some(true),
            card: Some(1),
            render: Some(128),
            connectors: &[("eDP-1", true)],
            ..Gpu::new("0000:00:02.0", 0x8086, 0x46a6)
        })
        .gpu(Gpu {
            parent: Some("0000:00:01.0"),
            driver: Some("nvidia"),
            boot_vga: Some(false),
            card: Some(0),
            render: Some(129),
            power_state: "D3cold",
            runtime_status: "suspended",
            nvidia_minor: Some(0),
            ..Gpu::new("0000:01:00.0", 0x10de, 0x25a2)
        })
        .pci_function(Func {
            power_state: "D3cold",
            runtime_status: "suspended",
            ..f(
                "0000:01:00.1",
                Some("0000:00:01.0"),
                (0x10de, 0x2291),
                CLASS_HDA,
            )
        })
        .sound_card("0000:01:00.1", 1)
        .pci_function(Func {
            driver: Some("nvidia-gpu"),
            ..Func::new("0000:01:00.3", 0x10de, 0x1ad9, 0x0c8000)
        })
        .build();
    let g = list(&m);
    let d = by_pci(&g, "0000:01:00.0");
    assert_eq!(
        d["functions"],
        json!([
            {"pci": "0000:01:00.1", "vendor_id": "10de", "device_id": "2291",
             "class": "0x040300", "driver": "snd_hda_intel", "power_state": "D3cold",
             "runtime_status": "suspended", "sound_nodes": ["116:8", "116:9", "116:10"]},
            {"pci": "0000:01:00.3", "vendor_id": "10de", "device_id": "1ad9",
             "class": "0x0c8000", "driver": "nvidia-gpu", "power_state": "D0",
             "runtime_status": "active", "sound_nodes": []},
        ])
    );
    // The iGPU's slot holds no other function; a bridge is never one.
    assert_eq!(by_pci(&g, "0000:00:02.0")["functions"], json!([]));
    // Discovery read no file that would wake the dGPU or its functions.
    if m.atime_tracking() {
        assert!(
            m.wake_risky_reads().is_empty(),
            "{:?}",
            m.wake_risky_reads()
        );
    }
}

/// AMD 760G desktop (issue 20, from a real dump): the RS780L IGP behind the
/// northbridge's bridge is the chipset's GPU, not a card; the add-in card
/// the firmware boots on is the default and the discrete one.
#[test]
fn amd_chipset_igp_is_integrated() {
    let m = crate::common::fixture::machine("amd_760g");
    let g = list(&m);
    assert_eq!(g.len(), 2, "{g:#?}");
    let igp = by_pci(&g, "0000:01:05.0");
    assert_eq!(igp["discrete"], false, "RS780L is the chipset's: {igp:#}");
    assert_eq!(igp["default"], false);
    assert_eq!(igp["offload"], true);
    let card = by_pci(&g, "0000:02:00.0");
    assert_eq!(card["discrete"], true);
    assert_eq!(card["default"], true, "boot_vga");
}

/// Linux 6.18+ `boot_display` names the boot display and wins over
/// `boot_vga` (and the heuristics) where a GPU has it.
#[test]
fn boot_display_is_preferred_to_boot_vga() {
    let m = crate::common::fixture::machine("amd_760g");
    m.write_sys("bus/pci/devices/0000:01:05.0/boot_display", "1\n");
    let g = list(&m);
    assert_eq!(by_pci(&g, "0000:01:05.0")["default"], true, "{g:#?}");
    assert_eq!(by_pci(&g, "0000:02:00.0")["default"], false);
    assert_eq!(by_pci(&g, "0000:02:00.0")["offload"], true);

    // A 3D-class GPU has no boot_vga; boot_display still names it.
    let m = Builder::new()
        .name("boot_display_3d")
        .pci_function(Func::new("0000:00:00.0", 0x8086, 0x4641, 0x060000))
        .pci_bridge("0000:00:01.0", None, 0x8086, 0x460d)
        .gpu(Gpu {
            driver: Some("i915"),
            boot_vga: Some(false),
            card: Some(1),
            render: Some(128),
            ..Gpu::new("0000:00:02.0", 0x8086, 0x46a6)
        })
        .gpu(Gpu {
            parent: Some("0000:00:01.0"),
            class: crate::common::fixture::CLASS_3D,
            driver: Some("nvidia"),
            card: Some(0),
            render: Some(129),
            ..Gpu::new("0000:01:00.0", 0x10de, 0x25a2)
        })
        .expect_default(Some("0000:00:02.0"))
        .build();
    let g = list(&m);
    assert_eq!(
        by_pci(&g, "0000:00:02.0")["default"],
        true,
        "boot_vga alone"
    );
    m.write_sys("bus/pci/devices/0000:01:00.0/boot_display", "1\n");
    let g = list(&m);
    assert_eq!(by_pci(&g, "0000:01:00.0")["default"], true, "{g:#?}");
    assert_eq!(by_pci(&g, "0000:00:02.0")["offload"], true);
}
