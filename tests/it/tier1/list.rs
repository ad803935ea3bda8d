//! Tier 1: `gpuctl list` against fixture copies of real machines, with no
//! daemon. Asserts what a script reads from `--json` and what a person reads
//! in the table. Runs unprivileged.

use std::process::Command;

use crate::common::fixture::{machine, Builder, Gpu, Machine, MACHINES};
use crate::common::harness::{describe, BIN};
use serde_json::Value;

fn list(m: &Machine, json: bool) -> (Value, String) {
    let mut cmd = Command::new(BIN);
    cmd.env("GPUCTL_SOCKET", m.root().join("no-daemon.sock"))
        .env("GPUCTL_SYSFS_ROOT", m.sysfs())
        .env("GPUCTL_PROCFS_ROOT", m.procfs())
        .arg("list");
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}: {}", m.name(), describe(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let v = if json {
        serde_json::from_str(&text).unwrap()
    } else {
        Value::Null
    };
    (v, text)
}

/// Every fact of every GPU in the JSON agrees with what the fixture holds.
fn check_machine(m: &Machine) {
    let (v, _) = list(m, true);
    assert_eq!(v["schema"], 1);
    assert_eq!(v["mode"], Value::Null, "no daemon: mode unknown");
    assert_eq!(v["backend"], Value::Null);
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), m.gpus().len(), "{}: {v:#}", m.name());

    // Ids: the default GPU is 0, then PCI address order.
    let mut expected_order: Vec<&str> = m.gpus().iter().map(|g| g.addr.as_str()).collect();
    expected_order.sort();
    if let Some(d) = m.expected_default() {
        expected_order.retain(|a| *a != d);
        expected_order.insert(0, d);
    }
    let got_order: Vec<&str> = gpus.iter().map(|g| g["pci"].as_str().unwrap()).collect();
    assert_eq!(got_order, expected_order, "{}", m.name());

    for (i, g) in gpus.iter().enumerate() {
        let ctx = format!("{} GPU {}", m.name(), g["pci"]);
        let f = m.gpu(g["pci"].as_str().unwrap());
        assert_eq!(g["id"], i, "{ctx}");
        assert_eq!(g["vendor_id"], format!("{:04x}", f.vendor_id), "{ctx}");
        assert_eq!(g["device_id"], format!("{:04x}", f.device_id), "{ctx}");
        assert_eq!(g["driver"].as_str(), f.driver.as_deref(), "{ctx}");
        assert_eq!(g["boot_vga"].as_bool(), f.boot_vga, "{ctx}");
        assert_eq!(g["card"].as_str(), f.card.as_deref(), "{ctx}");
        assert_eq!(g["render"].as_str(), f.render.as_deref(), "{ctx}");
        let nodes: Vec<&str> = g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        assert_eq!(nodes, f.nodes, "{ctx}");
        assert_eq!(
            g["nvidia_minor"].as_u64(),
            f.nvidia_minor.map(u64::from),
            "{ctx}"
        );
        assert_eq!(
            g["power_state"].as_str(),
            Some(f.power_state.as_str()),
            "{ctx}"
        );
        assert_eq!(
            g["runtime_status"].as_str(),
            Some(f.runtime_status.as_str()),
            "{ctx}"
        );
        let want_default = m.expected_default() == Some(f.addr.as_str());
        assert_eq!(g["default"], want_default, "{ctx}");
        assert_eq!(g["offload"], !want_default, "{ctx}");
        assert_eq!(g["blocked"], Value::Null, "{ctx}: no daemon");
        // Connectors, named without the card prefix, with their status.
        let displays: Vec<(String, bool)> = g["displays"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["connector"].as_str().unwrap().to_string(),
                    d["status"] == "connected",
                )
            })
            .collect();
        let mut want: Vec<(String, bool)> = f
            .connectors
            .iter()
            .map(|(c, on)| (c.split_once('-').unwrap().1.to_string(), *on))
            .collect();
        want.sort();
        let mut got = displays.clone();
        got.sort();
        assert_eq!(got, want, "{ctx}");
        // Names come from the PCI ID database; unknown ids are null.
        let db = pci_ids::Device::from_vid_pid(f.vendor_id, f.device_id);
        assert_eq!(g["name"].as_str(), db.map(|d| d.name()), "{ctx}");
        if db.is_some() {
            assert!(g["vendor"].is_string(), "{ctx}");
        }
    }

    // Discovery never read a file that wakes a GPU.
    if m.atime_tracking() {
        let risky = m.wake_risky_reads();
        assert!(risky.is_empty(), "{}: read {risky:?}", m.name());
    }
}

#[test]
fn every_fixture_lists_correctly() {
    for name in MACHINES {
        check_machine(&machine(name));
    }
}

fn gpus(name: &str) -> Vec<Value> {
    let m = machine(name);
    list(&m, true).0["gpus"].as_array().unwrap().clone()
}

#[test]
fn intel_nvidia_laptop() {
    let g = gpus("intel_nvidia");
    assert_eq!(g[0]["pci"], "0000:00:02.0");
    assert_eq!(g[0]["vendor"], "Intel");
    assert_eq!(g[0]["discrete"], false);
    assert_eq!(g[1]["pci"], "0000:01:00.0");
    assert_eq!(g[1]["vendor"], "NVIDIA");
    assert_eq!(g[1]["name"], "GA107M [GeForce RTX 3050 Mobile]");
    assert_eq!(g[1]["driver"], "nvidia");
    assert_eq!(g[1]["discrete"], true);
    assert_eq!(g[1]["offload"], true);
    assert_eq!(g[1]["power_state"], "D3cold");
    assert_eq!(g[1]["runtime_status"], "suspended");
    assert_eq!(
        g[1]["nodes"],
        serde_json::json!(["226:0", "226:129", "195:0"])
    );
    assert_eq!(g[1]["nvidia_minor"], 0);
}

#[test]
fn amd_apu_is_integrated_and_simpledrm_is_not_a_gpu() {
    let g = gpus("amd_amd");
    assert_eq!(
        g.len(),
        2,
        "simpledrm and the HD-audio functions are not GPUs"
    );
    assert_eq!(g[0]["discrete"], false, "APU: {}", g[0]);
    assert_eq!(g[1]["discrete"], true);
    assert_eq!(g[1]["nvidia_minor"], Value::Null);
}

#[test]
fn mux_in_dgpu_mode_makes_nvidia_the_default() {
    let g = gpus("mux_dgpu");
    assert_eq!(g[0]["vendor"], "NVIDIA");
    assert_eq!(g[0]["default"], true);
    assert_eq!(g[1]["vendor"], "Intel");
    assert_eq!(g[1]["offload"], true);
}

#[test]
fn virtio_vm_without_boot_vga() {
    let g = gpus("vm_virtio");
    assert_eq!(g.len(), 2);
    for x in &g {
        assert_eq!(x["boot_vga"], Value::Null, "no boot_vga file: null");
        assert_eq!(x["driver"], "virtio-pci");
        assert_eq!(x["discrete"], Value::Null);
    }
    // No boot_vga: the GPU with a connected internal panel, else the lowest
    // PCI address. Virtual-1 is not an internal panel.
    assert_eq!(g[0]["pci"], "0000:00:02.0");
    assert_eq!(g[0]["card"], "card0");
    assert_eq!(g[1]["card"], "card1");
}

#[test]
fn vfio_and_driverless_gpus_are_listed_without_nodes() {
    for name in ["vfio", "nodriver"] {
        let g = gpus(name);
        assert_eq!(g.len(), 2, "{name}");
        let dgpu = &g[1];
        assert_eq!(dgpu["nodes"], serde_json::json!([]), "{name}");
        assert_eq!(dgpu["card"], Value::Null, "{name}");
        assert_eq!(dgpu["nvidia_minor"], Value::Null, "{name}");
        let want = if name == "vfio" {
            Value::from("vfio-pci")
        } else {
            Value::Null
        };
        assert_eq!(dgpu["driver"], want, "{name}");
    }
}

#[test]
fn egpu_is_discrete_offload() {
    let g = gpus("egpu");
    let e = g.iter().find(|x| x["vendor_id"] == "1002").unwrap();
    assert_eq!(e["discrete"], true);
    assert_eq!(e["offload"], true);
}

#[test]
fn internal_panel_decides_without_boot_vga() {
    // Two GPUs without boot_vga; the second drives the laptop panel.
    let m = Builder::new()
        .name("panel_rule")
        .gpu(Gpu {
            driver: Some("virtio-pci"),
            card: Some(0),
            render: Some(128),
            virtio_index: Some(0),
            connectors: &[("Virtual-1", true)],
            class: 0x038000,
            ..Gpu::new("0000:00:02.0", 0x1af4, 0x1050)
        })
        .gpu(Gpu {
            driver: Some("virtio-pci"),
            card: Some(1),
            render: Some(129),
            virtio_index: Some(1),
            connectors: &[("eDP-1", true)],
            class: 0x038000,
            ..Gpu::new("0000:00:03.0", 0x1af4, 0x1050)
        })
        .build();
    let (v, _) = list(&m, true);
    assert_eq!(v["gpus"][0]["pci"], "0000:00:03.0");
    assert_eq!(v["gpus"][0]["default"], true);
}

#[test]
fn table_for_people() {
    let m = machine("intel_nvidia");
    let (_, t) = list(&m, false);
    let lines: Vec<&str> = t.lines().collect();
    assert!(lines[0].contains("daemon is not running"), "{t}");
    assert!(lines[1].starts_with("ID"), "{t}");
    assert!(
        lines[2].starts_with("0 ") && lines[2].contains("0000:00:02.0"),
        "{t}"
    );
    assert!(
        lines[2].contains("default") && lines[2].contains("eDP-1"),
        "{t}"
    );
    assert!(
        lines[3].contains("GA107M") && lines[3].contains("D3cold (suspended)"),
        "{t}"
    );
    assert!(lines[3].contains("card0 renderD129 nvidia0"), "{t}");
    // Columns line up: every row starts its PCI column at the same place.
    let col = lines[1].find("PCI").unwrap();
    assert_eq!(&lines[2][col..col + 4], "0000");
    assert_eq!(&lines[3][col..col + 4], "0000");

    let none = machine("none");
    let (_, t) = list(&none, false);
    assert!(t.contains("No GPU found."), "{t}");
}

#[test]
fn unknown_sysfs_root_is_no_gpu_not_a_crash() {
    let out = Command::new(BIN)
        .env("GPUCTL_SOCKET", "/nonexistent/gpuctl.sock")
        .args(["--sysfs-root", "/nonexistent", "list", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gpus"], serde_json::json!([]));
}

#[test]
fn suspended_nvidia_gpu_is_not_woken_for_its_minor() {
    let m = machine("intel_nvidia");
    let info = m
        .procfs()
        .join("driver/nvidia/gpus/0000:01:00.0/information");
    let text = std::fs::read_to_string(&info).unwrap();
    // procfs files are read-only (0444); an unprivileged test must open it up.
    std::fs::set_permissions(&info, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    // Make the file say something only a real read could learn.
    std::fs::write(
        &info,
        text.replace("Device Minor: \t 0", "Device Minor: \t 3"),
    )
    .unwrap();
    assert!(std::fs::read_to_string(&info)
        .unwrap()
        .contains("Device Minor: \t 3"));

    // Suspended: the driver would resume the GPU to answer, so the file is
    // not read; the sole NVIDIA GPU's minor is 0 (probe order).
    let (v, _) = list(&m, true);
    assert_eq!(v["gpus"][1]["runtime_status"], "suspended");
    assert_eq!(v["gpus"][1]["nvidia_minor"], 0);

    // Awake: the file is the source.
    m.set_power("0000:01:00.0", "D0", "active");
    let (v, _) = list(&m, true);
    assert_eq!(v["gpus"][1]["nvidia_minor"], 3);
    assert_eq!(v["gpus"][1]["nodes"][2], "195:3");
}
