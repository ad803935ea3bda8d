//! The can-it-sleep verdict without a daemon: `gpuctl list` names what keeps
//! a GPU from runtime suspend or D3cold, and the fix. Unprivileged; the
//! daemon's power truth is in root::power.

use std::process::Command;

use crate::common::fixture::{machine, Machine};
use crate::common::harness::BIN;

const DGPU: &str = "bus/pci/devices/0000:01:00.0";

#[test]
fn list_says_when_a_gpu_cannot_sleep() {
    let m = machine("intel_nvidia");
    m.write_sys(&format!("{DGPU}/power/control"), "on\n");
    m.write_sys(&format!("{DGPU}/d3cold_allowed"), "0\n");
    let run = |json: bool| {
        let mut c = Command::new(BIN);
        c.env("GPUCTL_SOCKET", m.root().join("no-daemon.sock"))
            .env("GPUCTL_SYSFS_ROOT", m.sysfs())
            .env("GPUCTL_PROCFS_ROOT", m.procfs())
            .arg("list");
        if json {
            c.arg("--json");
        }
        c.output().unwrap()
    };
    let out = run(true);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sleep = &v["gpus"][1]["sleep"];
    assert_eq!(sleep["can_sleep"], false, "{sleep:#}");
    assert_eq!(sleep["d3cold"], false);
    let effects: Vec<&str> = sleep["blockers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["effect"].as_str())
        .collect();
    assert_eq!(effects, ["no_sleep", "no_d3cold"], "{sleep:#}");
    assert_eq!(v["gpus"][0]["sleep"]["can_sleep"], true, "the iGPU is fine");
    let text = String::from_utf8_lossy(&run(false).stdout).into_owned();
    assert!(
        text.contains("GPU 1 can sleep: no: runtime power management off (power/control = on)"),
        "{text}"
    );
    assert!(
        text.contains("fix: echo auto > /sys/bus/pci/devices/0000:01:00.0/power/control"),
        "{text}"
    );
    assert!(
        text.contains("fix: echo 1 > /sys/bus/pci/devices/0000:01:00.0/d3cold_allowed"),
        "{text}"
    );

    // Fixed: nothing to say.
    m.write_sys(&format!("{DGPU}/power/control"), "auto\n");
    m.write_sys(&format!("{DGPU}/d3cold_allowed"), "1\n");
    let text = String::from_utf8_lossy(&run(false).stdout).into_owned();
    assert!(!text.contains("can sleep"), "{text}");
}

#[test]
fn a_bridge_without_runtime_pm_blocks_d3cold_only_without_a_gpu_power_resource() {
    let m = machine("intel_nvidia");
    m.write_sys("bus/pci/devices/0000:00:01.0/power/control", "on\n");
    let sleep = |m: &Machine| {
        let out = Command::new(BIN)
            .env("GPUCTL_SOCKET", m.root().join("no-daemon.sock"))
            .env("GPUCTL_SYSFS_ROOT", m.sysfs())
            .env("GPUCTL_PROCFS_ROOT", m.procfs())
            .args(["list", "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["gpus"][1]["sleep"].clone()
    };
    let s = sleep(&m);
    assert_eq!(
        (s["can_sleep"].clone(), s["d3cold"].clone()),
        (true.into(), false.into()),
        "{s:#}"
    );
    assert!(
        s["blockers"][0]["problem"]
            .as_str()
            .unwrap()
            .starts_with("the bridge above it (0000:00:01.0) has runtime PM off"),
        "{s:#}"
    );
    // The GPU has its own power resource (_PR3): it powers off without the bridge.
    let pr3 = m
        .sysfs()
        .join(format!("{DGPU}/firmware_node/power_resources_D3hot"));
    std::fs::create_dir_all(pr3).unwrap();
    let s = sleep(&m);
    assert_eq!(s["d3cold"], true, "{s:#}");
    assert_eq!(s["blockers"], serde_json::json!([]), "{s:#}");
}

#[test]
fn the_audio_function_keeping_the_slot_up_is_named_with_its_fix() {
    let m = machine("intel_nvidia");
    let list = |m: &Machine| {
        let out = Command::new(BIN)
            .env("GPUCTL_SOCKET", m.root().join("no-daemon.sock"))
            .env("GPUCTL_SYSFS_ROOT", m.sysfs())
            .env("GPUCTL_PROCFS_ROOT", m.procfs())
            .arg("list")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    m.write_sys("bus/pci/devices/0000:01:00.1/power/control", "on\n");
    let text = list(&m);
    assert!(
        text.contains(
            "GPU 1 can sleep: D3hot only: its audio function 0000:01:00.1 has runtime PM off"
        ),
        "{text}"
    );
    assert!(
        text.contains("fix: echo auto > /sys/bus/pci/devices/0000:01:00.1/power/control"),
        "{text}"
    );
    // Runtime PM on, but the HDA driver never lets it power down.
    m.write_sys("bus/pci/devices/0000:01:00.1/power/control", "auto\n");
    std::fs::create_dir_all(m.sysfs().join("module/snd_hda_intel/parameters")).unwrap();
    m.write_sys("module/snd_hda_intel/parameters/power_save", "0\n");
    let text = list(&m);
    assert!(
        text.contains("never powers down (snd_hda_intel power_save = 0)")
            && text.contains("fix: echo 1 > /sys/module/snd_hda_intel/parameters/power_save"),
        "{text}"
    );
    m.write_sys("module/snd_hda_intel/parameters/power_save", "1\n");
    assert!(!list(&m).contains("can sleep"));
}
