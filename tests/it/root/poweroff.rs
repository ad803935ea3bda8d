//! The power-off of a blocked GPU that cannot sleep (issue 19) through the
//! daemon, on a fixture sysfs: the unbind/bind writes land in the fixture's
//! `drivers/*/unbind` and `bind` files, the attributes in its files. The
//! kernel's part (the `driver` link going away on unbind, the rail) is the
//! QEMU tier's (tests/vm/poweroff-tests.sh); here the test drops the link
//! itself where the kernel would.

use crate::common::fixture::machine;
use crate::common::harness::{describe, require_root, Env};

const DGPU: &str = "bus/pci/devices/0000:01:00.0";
const MODESET: &str = "module/nvidia_drm/parameters/modeset";

fn read(env: &Env, rel: &str) -> String {
    let p = env.machine.sysfs().join(rel);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

/// Clears the fixture's driver files, so the next write is seen alone.
fn clear(env: &Env, driver: &str) {
    for w in ["bind", "unbind"] {
        env.machine
            .write_sys(&format!("bus/pci/drivers/{driver}/{w}"), "");
    }
}

/// What the kernel does on unbind: the function's `driver` link goes.
fn kernel_unbinds(env: &Env, addr: &str) {
    let l = env.machine.pci_dev(addr).join("driver");
    std::fs::remove_file(&l).unwrap_or_else(|e| panic!("{}: {e}", l.display()));
}

/// `status --json` once no unbind is under way (the power-off runs its
/// unbinds in helpers, continued by the loop as each returns).
fn settled_status(env: &Env) -> serde_json::Value {
    for _ in 0..200 {
        let s = env.json(&["status"]);
        if s["gpus"][1]["power_off"]["state"] != "powering_off" {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("the power-off stayed under way");
}

#[test]
#[ignore = "root"]
fn a_hung_unbind_does_not_stall_other_clients() {
    require_root("a_hung_unbind_does_not_stall_other_clients");
    let m = machine("intel_nvidia");
    m.write_sys(&format!("{DGPU}/power/control"), "on\n");
    m.write_sys(MODESET, "N\n");
    // A FIFO nobody reads stands in for a driver hanging in its remove:
    // the helper's open blocks.
    let unbind = m.sysfs().join("bus/pci/drivers/nvidia/unbind");
    std::fs::remove_file(&unbind).unwrap();
    nix::unistd::mkfifo(&unbind, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut env = Env::new(m);
    env.start();
    let out = env.gpuctl(&["set", "integrated"]);
    assert!(out.status.success(), "{}", describe(&out));
    // Another client is answered while the unbind is still in flight
    // (before its 5 s deadline: after it, the state is `failed`).
    let mut seen = None;
    for _ in 0..100 {
        let s = env.json(&["status"]);
        let p = s["gpus"][1]["power_off"].clone();
        if p["state"] == "powering_off" && p["reason"] == "unbinding 0000:01:00.0 from nvidia" {
            seen = Some(s);
            break;
        }
        assert_ne!(
            p["state"], "failed",
            "answered only after the deadline: {s:#}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let s = seen.expect("the unbind was seen in flight");
    assert_eq!(
        s["gpus"][1]["power_off"]["unbound"],
        serde_json::json!(["0000:01:00.1=snd_hda_intel"]),
        "{s:#}"
    );
    let human = String::from_utf8_lossy(&env.gpuctl(&["status"]).stdout).into_owned();
    assert!(human.contains("powering off: unbinding"), "{human}");
    // At the deadline: failed, saying so.
    let s = settled_status(&env);
    let p = &s["gpus"][1]["power_off"];
    assert_eq!(p["state"], "failed", "{s:#}");
    assert!(
        p["reason"].as_str().unwrap().contains("did not return"),
        "{s:#}"
    );
    // `list` says it too; a stranger gets the state without the reason.
    let l = env.json(&["list"]);
    assert_eq!(l["gpus"][1]["power_off"]["state"], "failed", "{l:#}");
    assert_eq!(l["gpus"][1]["power_off"]["reason"], p["reason"], "{l:#}");
    assert_eq!(l["gpus"][0]["power_off"], serde_json::Value::Null, "{l:#}");
    let out = env.gpuctl_as(Some(65534), &["list", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let l: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(l["gpus"][1]["power_off"]["state"], "failed", "{l:#}");
    assert_eq!(
        l["gpus"][1]["power_off"]["reason"],
        serde_json::Value::Null,
        "{l:#}"
    );
    env.stop();
}

#[test]
#[ignore = "root"]
fn integrated_unbinds_a_gpu_that_cannot_sleep_and_hybrid_binds_it_back() {
    require_root("integrated_unbinds_a_gpu_that_cannot_sleep_and_hybrid_binds_it_back");
    let m = machine("intel_nvidia");
    // Runtime PM off on the dGPU: the verdict says it cannot sleep.
    m.write_sys(&format!("{DGPU}/power/control"), "on\n");
    m.write_sys(MODESET, "N\n");
    let mut env = Env::new(m);
    env.start();
    let port = std::fs::canonicalize(env.machine.pci_dev("0000:01:00.0"))
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let port_attr = |a: &str| {
        std::fs::read_to_string(port.join(a))
            .unwrap()
            .trim()
            .to_string()
    };
    let port_control0 = port_attr("power/control");

    let out = env.gpuctl(&["set", "integrated"]);
    assert!(out.status.success(), "{}", describe(&out));
    let s = settled_status(&env);
    let p = &s["gpus"][1]["power_off"];
    assert_eq!(p["state"], "off", "{s:#}");
    assert_eq!(read(&env, "bus/pci/drivers/nvidia/unbind"), "0000:01:00.0");
    assert_eq!(read(&env, &format!("{DGPU}/power/control")), "auto");
    assert_eq!(read(&env, &format!("{DGPU}/d3cold_allowed")), "1");
    assert_eq!(port_attr("power/control"), "auto");
    assert_eq!(port_attr("d3cold_allowed"), "1");
    assert!(env.state_dir().join("poweroff.json").exists());
    let human = String::from_utf8_lossy(&env.gpuctl(&["status"]).stdout).into_owned();
    assert!(
        human.contains("powered off by gpuctl: drivers unbound"),
        "{human}"
    );
    let l = env.json(&["list"]);
    assert_eq!(l["gpus"][1]["power_off"], *p, "list says it as status does");
    let human = String::from_utf8_lossy(&env.gpuctl(&["list"]).stdout).into_owned();
    assert!(
        human.contains("power-off: GPU 1: powered off by gpuctl: drivers unbound"),
        "{human}"
    );
    kernel_unbinds(&env, "0000:01:00.0");

    let out = env.gpuctl(&["set", "hybrid"]);
    assert!(out.status.success(), "{}", describe(&out));
    let s = env.json(&["status"]);
    assert_eq!(s["gpus"][1]["power_off"], serde_json::Value::Null, "{s:#}");
    assert_eq!(read(&env, "bus/pci/drivers/nvidia/bind"), "0000:01:00.0");
    assert_eq!(
        read(&env, &format!("{DGPU}/power/control")),
        "on",
        "restored"
    );
    assert_eq!(port_attr("power/control"), port_control0, "restored");
    assert!(!env.state_dir().join("poweroff.json").exists());
    let log = env.stop();
    assert!(log.contains("drivers bound again"), "{log}");
}

#[test]
#[ignore = "root"]
fn power_off_never_only_blocks_and_kill_9_is_undone_by_poweroff_restore() {
    require_root("power_off_never_only_blocks_and_kill_9_is_undone_by_poweroff_restore");
    let m = machine("intel_nvidia");
    m.write_sys(&format!("{DGPU}/power/control"), "on\n");
    let mut env = Env::new(m);
    env.start();
    let out = env.gpuctl(&["config", "power_off", "never"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.gpuctl(&["set", "integrated"]);
    assert!(out.status.success(), "{}", describe(&out));
    let s = env.json(&["status"]);
    assert_eq!(s["gpus"][1]["blocked"], true);
    assert_eq!(s["gpus"][1]["power_off"], serde_json::Value::Null, "{s:#}");
    assert_eq!(
        read(&env, "bus/pci/drivers/nvidia/unbind"),
        "",
        "never: untouched"
    );

    // auto, live, with nvidia-drm modeset=1 (the fixture's): refused, saying why.
    let out = env.gpuctl(&["config", "power_off", "auto"]);
    assert!(out.status.success(), "{}", describe(&out));
    let s = env.json(&["status"]);
    let p = &s["gpus"][1]["power_off"];
    assert_eq!(p["state"], "refused", "{s:#}");
    assert!(p["reason"].as_str().unwrap().contains("modeset=1"), "{s:#}");
    assert_eq!(
        read(&env, "bus/pci/drivers/nvidia/unbind"),
        "",
        "refused: untouched"
    );
    // modeset=0: powered off at the next look; then the daemon dies without a word.
    env.machine.write_sys(MODESET, "N\n");
    let out = env.gpuctl(&["config", "power_off", "never"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.gpuctl(&["config", "power_off", "auto"]);
    assert!(out.status.success(), "{}", describe(&out));
    let s = settled_status(&env);
    assert_eq!(s["gpus"][1]["power_off"]["state"], "off", "{s:#}");
    kernel_unbinds(&env, "0000:01:00.0");
    clear(&env, "nvidia");
    env.signal(libc::SIGKILL);
    assert!(
        env.state_dir().join("poweroff.json").exists(),
        "the record outlives it"
    );
    let out = env.gpuctl(&["poweroff-restore"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("bound again"),
        "{}",
        describe(&out)
    );
    assert_eq!(read(&env, "bus/pci/drivers/nvidia/bind"), "0000:01:00.0");
    assert_eq!(read(&env, &format!("{DGPU}/power/control")), "on");
    assert!(!env.state_dir().join("poweroff.json").exists());
}
