//! Tier 2: the boot-time rescue (issue 20): `gpuctl.mode=` and
//! `gpuctl.disable` on a fixture kernel command line (the procfs root's
//! `cmdline`), read when the daemon starts. The saved state is untouched;
//! a start without the word is back in the saved mode.

use crate::common::fixture::machine;
use crate::common::harness::{describe, join_cgroup_before_exec, require_root, Env, ENXIO, EPERM};

fn cmdline(env: &Env, text: &str) {
    std::fs::write(env.machine.procfs().join("cmdline"), format!("{text}\n")).unwrap();
}

fn saved_mode(env: &Env) -> String {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.state_file()).unwrap()).unwrap();
    v["mode"].as_str().unwrap().to_string()
}

fn ok(env: &Env, args: &[&str]) {
    let out = env.gpuctl(args);
    assert!(out.status.success(), "gpuctl {args:?}: {}", describe(&out));
}

/// errno of opening `node` from the test cgroup.
fn open_errno(env: &Env, node: &str) -> i32 {
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.args(["-c", r#"exec 3<>"$0""#, node]);
    join_cgroup_before_exec(&mut cmd, &env.cgroup);
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Operation not permitted") {
        EPERM
    } else if err.contains("No such device or address") {
        ENXIO
    } else {
        panic!("{}", describe(&out))
    }
}

#[test]
#[ignore = "root"]
fn the_command_line_mode_holds_this_boot_only() {
    require_root(module_path!());
    let mut env = Env::new(machine("intel_nvidia"));
    let nv = env.mknod(226, 129).to_string_lossy().into_owned();
    cmdline(&env, "BOOT_IMAGE=/vmlinuz ro quiet");
    env.start();
    ok(&env, &["set", "integrated"]);
    env.stop();
    assert_eq!(saved_mode(&env), "integrated");

    // The rescue boot: hybrid, the dGPU opens, integrated stays saved.
    cmdline(
        &env,
        "BOOT_IMAGE=/vmlinuz ro quiet gpuctl.mode=hybrid splash",
    );
    env.start();
    let get = env.json(&["get"]);
    assert_eq!(get["mode"], "hybrid", "{get}");
    assert!(
        get["note"]
            .as_str()
            .unwrap_or("")
            .contains("kernel command line"),
        "{get}"
    );
    assert_eq!(
        open_errno(&env, &nv),
        ENXIO,
        "the dGPU opens in the rescue boot"
    );
    // An app rule saved meanwhile keeps the saved mode.
    ok(&env, &["app", "allow", "/usr/bin/true"]);
    let log = env.stop();
    assert!(log.contains("gpuctl.mode=hybrid"), "{log}");
    assert_eq!(
        saved_mode(&env),
        "integrated",
        "the saved state is untouched"
    );

    // The next boot, without the word: the saved mode is back.
    cmdline(&env, "BOOT_IMAGE=/vmlinuz ro quiet");
    env.start();
    assert_eq!(env.json(&["get"])["mode"], "integrated");
    assert_eq!(open_errno(&env, &nv), EPERM);
    env.stop();

    // A `gpuctl set` during a rescue boot is the user's choice: saved.
    cmdline(&env, "gpuctl.mode=hybrid");
    env.start();
    ok(&env, &["set", "smart"]);
    let get = env.json(&["get"]);
    assert!(get["note"].is_null(), "{get}");
    env.stop();
    assert_eq!(saved_mode(&env), "smart");
}

#[test]
#[ignore = "root"]
fn disable_blocks_nothing_and_refuses_changes() {
    require_root(module_path!());
    let mut env = Env::new(machine("intel_nvidia"));
    let nv = env.mknod(226, 129).to_string_lossy().into_owned();
    env.start();
    ok(&env, &["set", "integrated"]);
    assert_eq!(open_errno(&env, &nv), EPERM);
    env.stop();

    cmdline(&env, "quiet gpuctl.disable");
    env.start();
    assert_eq!(open_errno(&env, &nv), ENXIO, "nothing is blocked");
    let get = env.json(&["get"]);
    assert_eq!(get["blocked"], serde_json::json!([]), "{get}");
    assert!(
        get["note"]
            .as_str()
            .unwrap_or("")
            .contains("gpuctl.disable"),
        "{get}"
    );
    let out = env.gpuctl(&["set", "integrated"]);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("gpuctl.disable"),
        "{}",
        describe(&out)
    );
    assert_eq!(open_errno(&env, &nv), ENXIO);
    env.stop();
    assert_eq!(saved_mode(&env), "integrated");

    // Without the word: blocking again.
    cmdline(&env, "quiet");
    env.start();
    assert_eq!(open_errno(&env, &nv), EPERM);
}

#[test]
#[ignore = "root"]
fn a_bad_word_is_logged_and_the_saved_mode_applies() {
    require_root(module_path!());
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    ok(&env, &["set", "integrated"]);
    env.stop();
    cmdline(&env, "gpuctl.mode=dgpu");
    env.start();
    assert_eq!(env.json(&["get"])["mode"], "integrated");
    let log = env.stop();
    assert!(log.contains("gpuctl.mode: unknown mode \"dgpu\""), "{log}");
}
