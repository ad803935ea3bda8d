//! Tier 2: the daemon and the cgroup backend on this machine, as root.
//! Every block is checked by a real open(2) from a process in a test-owned
//! cgroup: ENXIO means allowed (no driver here), EPERM means blocked.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::common::fixture::{machine, Builder, Func, Gpu, Machine};
use crate::common::harness::{
    describe, open_in_cgroup, raw_exchange, read_line, require_root, Env, ENXIO, EPERM,
};

macro_rules! root_test {
    () => {
        require_root(module_path!())
    };
}

// intel_nvidia: Intel iGPU card1 (226:1) + renderD128; NVIDIA card0 (226:0),
// renderD129, nvidia0 (195:0); nvidiactl 195:255.
const IGPU: [(u32, u32); 2] = [(226, 1), (226, 128)];
const DGPU: [(u32, u32); 4] = [(226, 0), (226, 129), (195, 0), (195, 255)];

fn assert_opens(env: &Env, nodes: &[(u32, u32)], want: i32, ctx: &str) {
    for &(maj, min) in nodes {
        assert_eq!(
            env.open_errno(maj, min),
            want,
            "{ctx}: open of {maj}:{min} (want errno {want})"
        );
    }
}

fn ok(env: &Env, args: &[&str]) -> String {
    let out = env.gpuctl(args);
    assert!(out.status.success(), "gpuctl {args:?}: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "root"]
fn mode_transitions_block_and_allow_real_opens() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();

    // Hybrid: nothing blocked, nothing attached.
    assert_opens(&env, &IGPU, ENXIO, "hybrid");
    assert_opens(&env, &DGPU, ENXIO, "hybrid");
    let st = env.json(&["status"]);
    assert_eq!(st["attached"], false);
    assert_eq!(st["mode"], "hybrid");

    // Integrated: the NVIDIA GPU's nodes (and the sole NVIDIA GPU's
    // nvidiactl) are denied, the default iGPU is untouched.
    ok(&env, &["set", "integrated"]);
    assert_opens(&env, &DGPU, EPERM, "integrated");
    assert_opens(&env, &IGPU, ENXIO, "integrated");
    let list = env.json(&["list"]);
    assert_eq!(list["mode"], "integrated");
    assert_eq!(list["backend"], "cgroup");
    let gpus = list["gpus"].as_array().unwrap();
    assert_eq!(gpus[0]["blocked"], false);
    assert_eq!(gpus[1]["blocked"], true);
    let st = env.json(&["status"]);
    assert_eq!(st["attached"], true);
    assert_eq!(st["gpus"][1]["denied_opens"], 4, "{st}");
    assert_eq!(st["gpus"][0]["denied_opens"], 0);
    let human = ok(&env, &["status"]);
    assert!(human.contains("integrated"), "{human}");

    // A process outside the governed cgroup is not affected.
    let node = env.mknod(226, 0);
    assert_eq!(
        open_in_cgroup(env.cgroup.parent().unwrap(), &node, None),
        ENXIO
    );

    // Back to hybrid: allowed again, programs detached.
    ok(&env, &["set", "hybrid"]);
    assert_opens(&env, &DGPU, ENXIO, "hybrid again");
    assert_eq!(env.json(&["status"])["attached"], false);
    assert_eq!(ok(&env, &["get"]).trim(), "hybrid");
}

#[test]
#[ignore = "root"]
fn manual_blocks_persist_across_restart_and_default_is_refused() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();

    let out = ok(&env, &["block", "01:00.0"]);
    assert!(out.contains("GPU 1"), "{out}");
    assert_opens(&env, &DGPU, EPERM, "manual block");
    assert_eq!(env.json(&["get"])["mode"], "manual");

    // The default GPU is never blocked: refused, exit 4, one sentence.
    let out = env.gpuctl(&["block", "0"]);
    assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("default GPU"));
    let out = env.gpuctl(&["block", "7"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert_opens(&env, &IGPU, ENXIO, "default never blocked");

    // Restart: the saved manual block is in force by READY=1.
    env.stop();
    assert_opens(&env, &DGPU, ENXIO, "daemon stopped: fail-open");
    env.start();
    assert_opens(&env, &DGPU, EPERM, "after restart");
    assert_eq!(env.json(&["get"])["mode"], "manual");

    ok(&env, &["unblock", "1"]);
    assert_opens(&env, &DGPU, ENXIO, "unblocked");
    assert_eq!(env.json(&["status"])["attached"], false);
}

#[test]
#[ignore = "root"]
fn integrated_restored_before_ready_and_sigkill_fails_open() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    ok(&env, &["set", "integrated"]);
    env.stop();
    env.start();
    assert_opens(&env, &DGPU, EPERM, "restored at start");
    // SIGKILL: no cleanup runs, yet the kernel drops the unpinned link.
    env.signal(libc::SIGKILL);
    assert_opens(&env, &DGPU, ENXIO, "after SIGKILL");
    // A stale socket file does not stop the next start.
    env.start();
    assert_opens(&env, &DGPU, EPERM, "restarted after SIGKILL");
}

#[test]
#[ignore = "root"]
fn display_driving_gpu_needs_force() {
    root_test!();
    // The monitor is plugged into the NVIDIA card; the iGPU is the boot GPU.
    let mut env = Env::new(machine("desktop_monitor_dgpu"));
    env.start();
    let list = env.json(&["list"]);
    let dgpu = &list["gpus"][1];
    let card: u32 = dgpu["card"].as_str().unwrap()[4..].parse().unwrap();

    let out = env.gpuctl(&["set", "integrated"]);
    assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("connected display") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(env.open_errno(226, card), ENXIO);
    assert_eq!(
        env.json(&["get"])["mode"],
        "hybrid",
        "a refused change changes nothing"
    );

    ok(&env, &["set", "integrated", "--force"]);
    assert_eq!(env.open_errno(226, card), EPERM);
}

#[test]
#[ignore = "root"]
fn mux_laptop_in_dgpu_mode_refuses_integrated() {
    root_test!();
    let mut env = Env::new(machine("mux_dgpu"));
    env.start();
    let out = env.gpuctl(&["set", "integrated"]);
    assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("MUX"));
}

#[test]
#[ignore = "root"]
fn non_root_client_reads_but_cannot_change() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    let nobody = 65534;
    let out = env.gpuctl_as(Some(nobody), &["get"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.gpuctl_as(Some(nobody), &["list", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.gpuctl_as(Some(nobody), &["set", "integrated"]);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpuctl` group"));
    assert_opens(&env, &DGPU, ENXIO, "refused change");

    // A member of the configured group may change it.
    std::fs::write(env.dir.join("gpuctl.toml"), "group = \"nogroup\"\n").unwrap();
    env.stop();
    env.start();
    let nogroup = 65534; // Debian: nogroup's gid
    let out = env.gpuctl_as(Some(nogroup), &["set", "integrated"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_opens(&env, &DGPU, EPERM, "group member's change");
}

#[test]
#[ignore = "root"]
fn bad_clients_get_errors_and_do_not_stall_others() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();

    // A silent client, and one that sent half a line.
    let _silent = env.connect();
    let mut half = env.connect();
    half.write_all(br#"{"type":"li"#).unwrap();

    let t0 = Instant::now();
    assert_eq!(env.json(&["get"])["mode"], "hybrid");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "stalled: {:?}",
        t0.elapsed()
    );

    let mut c = env.connect();
    let r = raw_exchange(&mut c, b"this is not json\n");
    assert_eq!(r["ok"], false);
    assert_eq!(r["error"]["code"], "bad_request");
    // The connection survives a bad line.
    let r = raw_exchange(&mut c, b"{\"type\":\"get\"}\n");
    assert_eq!(r["ok"], true);
    assert_eq!(r["data"]["mode"], "hybrid");
    let r = raw_exchange(&mut c, b"{\"type\":\"reboot\"}\n");
    assert_eq!(r["error"]["code"], "bad_request");
    let r = raw_exchange(&mut c, b"{\"type\":\"get\",\"proto\":42}\n");
    assert_eq!(r["error"]["code"], "unsupported_version");

    // Over 64 KiB without a newline: refused, connection closed.
    let mut big = env.connect();
    let r = raw_exchange(&mut big, &vec![b'x'; 70 * 1024]);
    assert_eq!(r["error"]["code"], "too_large");

    // The silent client is told it timed out.
    let mut silent = env.connect();
    let r = read_line(&mut silent);
    assert_eq!(r["error"]["code"], "timeout");

    // A client that disconnects mid-line costs nothing.
    drop(half);
    assert_eq!(env.json(&["get"])["mode"], "hybrid");
    let log = env.stop();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
#[ignore = "root"]
fn corrupt_state_file_falls_back_to_hybrid() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    std::fs::create_dir_all(env.state_dir()).unwrap();
    std::fs::write(env.state_file(), b"{\"version\":1,\"mode\":\"integ").unwrap();
    std::fs::write(env.dir.join("gpuctl.toml"), "group = [\n").unwrap();
    env.start();
    assert_eq!(env.json(&["get"])["mode"], "hybrid");
    assert!(env.state_dir().join("state.json.bad").exists());
    assert!(env.dir.join("gpuctl.toml.bad").exists());
    // And it still works.
    ok(&env, &["set", "integrated"]);
    assert_opens(&env, &DGPU, EPERM, "after corrupt state");
    // A new, valid state file replaces the bad one: stopping right after
    // the answer (as a reboot would) keeps the mode.
    let log = env.stop();
    assert!(log.contains("corrupt"), "{log}");
    assert!(log.contains("invalid"), "{log}");
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.state_file()).unwrap()).unwrap();
    assert_eq!(saved["mode"], "integrated");
    env.start();
    assert_opens(&env, &DGPU, EPERM, "restarted after recovery");
}

/// A uevent (here: a display plugged into the dGPU) re-plans at once, with
/// no client request in between.
#[test]
#[ignore = "root"]
fn uevents_replan_without_a_request() {
    root_test!();
    let _quiet = crate::common::harness::machine_events();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    ok(&env, &["set", "integrated"]);
    assert_opens(&env, &DGPU, EPERM, "integrated");

    env.machine.set_connector("card0-HDMI-A-2", true);
    // Any PCI uevent makes the daemon re-read the GPUs; synthesize one on a
    // real device of this machine.
    let dev = std::fs::read_dir("/sys/bus/pci/devices")
        .unwrap()
        .next()
        .expect("a PCI device")
        .unwrap()
        .path();
    std::fs::write(dev.join("uevent"), "change").unwrap();

    let deadline = Instant::now() + Duration::from_secs(5);
    while env.open_errno(226, 0) != ENXIO {
        assert!(Instant::now() < deadline, "no re-plan after the uevent");
        std::thread::sleep(Duration::from_millis(20));
    }
    // It now drives a display: left alone, and status says why.
    let st = env.json(&["status"]);
    assert!(
        st["note"].as_str().unwrap().contains("connected display"),
        "{st}"
    );
    let log = env.stop();
    assert!(log.contains("GPUs changed"), "{log}");
}

/// Uevents of subsystems the daemon does not read (here 300 `change`
/// events of /dev/null, real kernel uevents) are dropped by its socket
/// filter in the kernel: they do not wake it. Counted by the scheduler
/// (schedstat's run count), so the check holds however slow the machine.
#[test]
#[ignore = "root"]
fn unrelated_uevents_do_not_wake_the_daemon() {
    root_test!();
    let _quiet = crate::common::harness::machine_events();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    ok(&env, &["set", "integrated"]);
    let pid = env.daemon.as_ref().unwrap().id();
    let runs = || -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
        s.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    let before = runs();
    for _ in 0..300 {
        std::fs::write("/sys/class/mem/null/uevent", "change").unwrap();
        // Paced, so that an unfiltered daemon would wake for each one.
        std::thread::sleep(Duration::from_micros(500));
    }
    let woken = runs() - before;
    eprintln!("daemon woken {woken} time(s) by 300 unrelated uevents");
    assert!(
        woken < 30,
        "the daemon woke {woken} times for 300 unrelated uevents"
    );
    // Still serving, and still enforcing.
    assert_opens(&env, &DGPU, EPERM, "after the storm");
    env.stop();
}

/// An Optimus laptop at boot before the NVIDIA driver bound: the iGPU has
/// its nodes (card1, renderD128) or, with `igpu_nodes` false, none yet
/// either; the dGPU has none; simpledrm's card2 stands for a DRM node of
/// no GPU.
fn driver_not_bound_yet(igpu_nodes: bool) -> Machine {
    Builder::new()
        .name("driver_not_bound_yet")
        .pci_function(Func::new("0000:00:00.0", 0x8086, 0x4641, 0x060000))
        .gpu(Gpu {
            driver: igpu_nodes.then_some("i915"),
            boot_vga: Some(true),
            card: igpu_nodes.then_some(1),
            render: igpu_nodes.then_some(128),
            ..Gpu::new("0000:00:02.0", 0x8086, 0x46a6)
        })
        .gpu(Gpu {
            boot_vga: Some(false),
            ..Gpu::new("0000:01:00.0", 0x10de, 0x25a2)
        })
        .simpledrm(2)
        .build()
}

/// The bug the booted Debian showed (distro tier, "display manager cannot
/// open the dGPU"): the daemon planned before the dGPU's driver made its
/// nodes, so it blocked no number, and the node the driver made was open
/// to everyone until the re-plan its uevent caused. Now every DRM and
/// NVIDIA minor that did not exist at the plan is denied as the blocked
/// GPU's; the default GPU's and other existing nodes stay open.
#[test]
#[ignore = "root"]
fn nodes_a_blocked_gpu_makes_after_the_plan_are_denied_at_once() {
    root_test!();
    let mut env = Env::new(driver_not_bound_yet(true));
    env.start();
    ok(&env, &["set", "integrated"]);
    // The nodes nvidia-drm and nvidia would make; none exists in sysfs.
    let new = [(226, 0), (226, 129), (195, 0), (195, 255)];
    assert_opens(&env, &new, EPERM, "nodes made after the plan");
    assert_opens(&env, &[(226, 1), (226, 128)], ENXIO, "the default GPU");
    assert_opens(&env, &[(226, 2)], ENXIO, "simpledrm's node");
    assert_opens(&env, &[(195, 254)], ENXIO, "nvidia-modeset");
    let st = env.json(&["status"]);
    assert_eq!(st["gpus"][1]["denied_opens"], 4, "{st}");

    // The driver binds: the re-plan names its nodes, the rest stays guarded.
    env.machine.add_drm_minor("0000:01:00.0", "card0", 0);
    env.machine.add_drm_minor("0000:01:00.0", "renderD129", 129);
    // The fixture sends no uevent: a read re-reads sysfs once the shared
    // read window (250 ms) of the last one is over.
    std::thread::sleep(Duration::from_millis(300));
    let list = env.json(&["list"]);
    assert_eq!(list["gpus"][1]["card"], "card0", "{list}");
    assert_opens(&env, &[(226, 0), (226, 129), (226, 3)], EPERM, "bound");
    assert_opens(&env, &[(226, 1), (226, 2)], ENXIO, "bound");

    // Nothing blocked, nothing guarded.
    ok(&env, &["set", "hybrid"]);
    assert_opens(&env, &new, ENXIO, "hybrid");
    let log = env.stop();
    assert!(
        log.contains("new nodes of major 195, 226 denied until known"),
        "{log}"
    );
}

/// The guard does not wait on the default GPU: while it has no DRM node
/// yet (both drivers still loading at boot), new DRM minors are guarded
/// too, and each one the kernel announces outside a blocked GPU is let
/// through on its uevent, before any discovery (the fixture sends no
/// kernel uevent: that part is `core::tests` and the QEMU tier's).
#[test]
#[ignore = "root"]
fn without_the_default_gpus_node_new_drm_minors_are_guarded_too() {
    root_test!();
    let mut env = Env::new(driver_not_bound_yet(false));
    env.start();
    ok(&env, &["set", "integrated"]);
    assert_opens(&env, &[(226, 0), (226, 1), (195, 0)], EPERM, "new nodes");
    assert_opens(&env, &[(226, 2)], ENXIO, "simpledrm's node");
    let log = env.stop();
    assert!(log.contains("let through on their uevent"), "{log}");
}

/// Smart mode: a process granted the GPU opens the node its driver made
/// after the plan, as it opens the known ones.
#[test]
#[ignore = "root"]
fn a_granted_process_opens_a_node_made_after_the_plan() {
    root_test!();
    let mut env = Env::new(driver_not_bound_yet(true));
    env.start();
    ok(&env, &["set", "smart"]);
    let node = env.mknod(226, 0);
    let node = node.to_str().unwrap();
    let (open, errno) = (super::smart::OPEN, |argv: &[&str]| {
        super::smart::open_via(&env, argv, &[])
    });
    assert_eq!(errno(&["/bin/sh", "-c", open, node]), EPERM, "not granted");
    let bin = crate::common::harness::BIN;
    assert_eq!(
        errno(&[bin, "run", "--gpu", "1", "--", "/bin/sh", "-c", open, node]),
        ENXIO,
        "granted"
    );
}
