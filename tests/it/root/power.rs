//! Power truth through the daemon (tier 2, root; the can-it-sleep verdict
//! without it is in tier1::power). Runtime PM itself needs a real device (the QEMU tier
//! has one: tests/vm/power-tests.sh); here the daemon loads the runtime-PM
//! programs on this kernel, and residency is read from the fixture's
//! `power/runtime_*_time` files, which the tests change the way the kernel
//! does (growth, and a restart from zero after hot unplug).

use crate::common::fixture::{machine, Machine};
use crate::common::harness::{describe, require_root, Env};

const DGPU: &str = "bus/pci/devices/0000:01:00.0";

fn counters(m: &Machine, suspended: u64, active: u64) {
    m.write_sys(
        &format!("{DGPU}/power/runtime_suspended_time"),
        &format!("{suspended}\n"),
    );
    m.write_sys(
        &format!("{DGPU}/power/runtime_active_time"),
        &format!("{active}\n"),
    );
}

#[test]
#[ignore = "root"]
fn daemon_reports_residency_and_wakes() {
    require_root("daemon_reports_residency_and_wakes");
    let m = machine("intel_nvidia");
    counters(&m, 90_000, 10_000);
    let mut env = Env::new(m);
    env.start();

    let s = env.json(&["status"]);
    assert_eq!(s["power_monitor"]["running"], true, "{s:#}");
    assert_eq!(
        s["attached"], false,
        "hybrid: the enforcer attaches nothing"
    );
    let names: Vec<&str> = s["power_monitor"]["programs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "gpuctl_rpm_resume",
            "gpuctl_rpm_suspend",
            "gpuctl_rpm_return_int"
        ]
    );
    assert_eq!(
        s["gpus"][0]["runtime_pm"],
        serde_json::Value::Null,
        "the default GPU is not watched"
    );
    let p = &s["gpus"][1]["runtime_pm"];
    assert_eq!(p["since_boot"]["asleep_pct"], 90.0, "{p:#}");
    assert_eq!(p["since_start"]["asleep_s"], 0.0, "{p:#}");
    assert_eq!(p["wakes"], 0);
    let watched: Vec<&str> = p["watched"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["device"].as_str())
        .collect();
    assert_eq!(watched[0], "0000:01:00.0", "{p:#}");

    // 10 s asleep, 0.5 s awake since the daemon started.
    counters(&env.machine, 100_000, 10_500);
    let s = env.json(&["status"]);
    let p = &s["gpus"][1]["runtime_pm"];
    assert_eq!(p["since_start"]["asleep_s"], 10.0, "{p:#}");
    assert_eq!(p["since_start"]["awake_s"], 0.5, "{p:#}");
    assert_eq!(p["since_start"]["asleep_pct"], 95.2, "{p:#}");
    assert_eq!(p["counters_reset"], false);
    let human = env.gpuctl(&["status"]);
    let text = String::from_utf8_lossy(&human.stdout).into_owned();
    assert!(
        text.contains("GPU 1: asleep 95.2 % since ") && text.contains("· 0 wakes"),
        "{text}"
    );

    // Hot unplug and re-plug: the counters restart from zero.
    counters(&env.machine, 3_000, 1_000);
    let s = env.json(&["list"]);
    let p = &s["gpus"][1]["runtime_pm"];
    assert_eq!(p["counters_reset"], true, "{p:#}");
    assert_eq!(p["since_start"]["asleep_pct"], 75.0, "{p:#}");

    let w = env.json(&["wakes"]);
    assert_eq!(w["wakes"], serde_json::json!([]));
    assert_eq!(w["attributed"], true);
    assert_eq!(w["gpus"][0]["id"], 1);
    let out = env.gpuctl(&["wakes", "9"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let out = env.gpuctl(&["wakes"]);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("No wakes recorded since the daemon started."),
        "{}",
        describe(&out)
    );
    env.stop();
}
