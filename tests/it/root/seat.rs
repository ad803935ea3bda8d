//! Tier 2: the person at the seat may switch (issue 20). A fixture logind
//! state (`--run-root`, here `GPUCTL_RUN_ROOT`) says which session is in
//! front of seat0; the daemon reads it when a client connects. Active and
//! local: the mode and blocks may change; remote, inactive, on another
//! seat, or described by files that are not root's alone: refused.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::fixture::machine;
use crate::common::harness::{describe, require_root, Env};

/// The user at the seat in these tests (nobody: no group, no root).
const USER: u32 = 65534;

const LOCAL: &str = "# This is private data. Do not parse.\nUID=65534\nUSER=nobody\nACTIVE=1\n\
                     IS_DISPLAY=1\nSTATE=active\nREMOTE=0\nTYPE=wayland\nORIGINAL_TYPE=wayland\n\
                     CLASS=user\nSCOPE=session-2.scope\nSEAT=seat0\nVTNR=2\nLEADER=1234\n";

fn run_root(env: &Env) -> PathBuf {
    env.dir.join("run")
}

/// Writes logind's files: seat0's active session, and session 2.
fn logind(run: &Path, seat0_active: &str, session: &str) {
    for d in ["systemd/seats", "systemd/sessions", "systemd/users"] {
        std::fs::create_dir_all(run.join(d)).unwrap();
        std::fs::set_permissions(run.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(run, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(run.join("systemd"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let seat = format!(
        "IS_SEAT0=1\nCAN_MULTI_SESSION=1\nACTIVE={seat0_active}\nACTIVE_UID={USER}\nSESSIONS=2\n"
    );
    write(&run.join("systemd/seats/seat0"), &seat);
    write(&run.join("systemd/sessions/2"), session);
}

fn write(p: &Path, text: &str) {
    let _ = std::fs::remove_file(p);
    std::fs::write(p, text).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn start(seat_may_change: Option<bool>) -> Env {
    require_root("root::seat");
    let mut env = Env::new(machine("intel_nvidia"));
    let run = run_root(&env);
    logind(&run, "2", LOCAL);
    if let Some(v) = seat_may_change {
        std::fs::write(
            env.dir.join("gpuctl.toml"),
            format!("seat_may_change = {v}\n"),
        )
        .unwrap();
    }
    env.extra_env
        .push(("GPUCTL_RUN_ROOT".into(), run.to_string_lossy().into_owned()));
    env.start();
    env
}

/// Whether USER's `set MODE` is done; asserts a refusal says why.
fn may_set(env: &Env, mode: &str) -> bool {
    let out = env.gpuctl_as(Some(USER), &["set", mode]);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("needs root"), "{}", describe(&out));
    }
    out.status.success()
}

fn may_change_in_status(env: &Env) -> bool {
    let out = env.gpuctl_as(Some(USER), &["status", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["may_change"].as_bool().unwrap()
}

#[test]
#[ignore = "root"]
fn the_active_local_session_may_switch_and_block() {
    let mut env = start(None);
    assert!(may_change_in_status(&env));
    assert!(
        may_set(&env, "integrated"),
        "the seat's user sets integrated"
    );
    assert_eq!(env.json(&["get"])["mode"], "integrated");
    let out = env.gpuctl_as(Some(USER), &["unblock", "1"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.gpuctl_as(Some(USER), &["block", "1"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(may_set(&env, "hybrid"));
    // Not the config or the app rules: those stay with root and the group.
    let out = env.gpuctl_as(Some(USER), &["config", "env_grants", "false"]);
    assert!(!out.status.success(), "{}", describe(&out));
    let out = env.gpuctl_as(Some(USER), &["app", "allow", "/usr/bin/true"]);
    assert!(!out.status.success(), "{}", describe(&out));
    // Another uid is not the seat's user.
    let out = env.gpuctl_as(Some(65533), &["set", "integrated"]);
    assert!(!out.status.success(), "{}", describe(&out));
    let log = env.stop();
    assert!(log.contains("uid 65534"), "the change is audited: {log}");
}

#[test]
#[ignore = "root"]
fn remote_inactive_and_other_seat_sessions_may_not() {
    let env = start(None);
    let run = run_root(&env);
    assert!(may_set(&env, "integrated"));
    let cases: &[(&str, String)] = &[
        ("remote (ssh)", LOCAL.replace("REMOTE=0", "REMOTE=1")),
        ("inactive", LOCAL.replace("ACTIVE=1", "ACTIVE=0")),
        ("closing", LOCAL.replace("STATE=active", "STATE=closing")),
        ("another seat", LOCAL.replace("SEAT=seat0", "SEAT=seat1")),
        ("a greeter", LOCAL.replace("CLASS=user", "CLASS=greeter")),
    ];
    for (what, session) in cases {
        logind(&run, "2", session);
        assert!(!may_set(&env, "hybrid"), "{what} may not switch");
        assert!(!may_change_in_status(&env), "{what}");
    }
    // The seat shows another session (ours is in the background).
    logind(&run, "3", LOCAL);
    assert!(!may_set(&env, "hybrid"), "a background session may not");
    // No seat file at all (no logind).
    std::fs::remove_file(run.join("systemd/seats/seat0")).unwrap();
    assert!(
        !may_set(&env, "hybrid"),
        "without logind nobody is at the seat"
    );
    // And back: allowed again, read at each connect.
    logind(&run, "2", LOCAL);
    assert!(may_set(&env, "hybrid"));
}

#[test]
#[ignore = "root"]
fn the_config_key_turns_it_off() {
    let env = start(Some(false));
    assert!(!may_set(&env, "integrated"));
    assert!(!may_change_in_status(&env));
}

/// A user who writes logind's files where they can write is refused: only
/// root-owned state counts.
#[test]
#[ignore = "root"]
fn faked_session_files_are_refused() {
    let env = start(None);
    let run = run_root(&env);
    let chown = |p: &Path, uid: u32| std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
    let session = run.join("systemd/sessions/2");

    // The session file owned by the user.
    chown(&session, USER);
    assert!(!may_set(&env, "integrated"), "a user-owned session file");
    chown(&session, 0);
    assert!(may_set(&env, "integrated"), "control: root's file counts");

    // Root's file, but writable by anyone.
    std::fs::set_permissions(&session, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(!may_set(&env, "hybrid"), "a world-writable session file");
    std::fs::set_permissions(&session, std::fs::Permissions::from_mode(0o644)).unwrap();

    // A directory the user may write (they could swap the file).
    let dir = run.join("systemd/sessions");
    chown(&dir, USER);
    assert!(!may_set(&env, "hybrid"), "a user-owned sessions directory");
    chown(&dir, 0);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(
        !may_set(&env, "hybrid"),
        "a world-writable sessions directory"
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();

    // A symlink to a file the user wrote elsewhere (root-owned link).
    let fake = env.dir.join("fake-session");
    std::fs::write(&fake, LOCAL).unwrap();
    chown(&fake, USER);
    std::fs::remove_file(&session).unwrap();
    std::os::unix::fs::symlink(&fake, &session).unwrap();
    assert!(!may_set(&env, "hybrid"), "a symlinked session file");
    std::fs::remove_file(&session).unwrap();

    // The seat file owned by the user, naming their fake session.
    write(&session, LOCAL);
    let seat = run.join("systemd/seats/seat0");
    chown(&seat, USER);
    assert!(!may_set(&env, "hybrid"), "a user-owned seat file");
    chown(&seat, 0);

    // A session id that walks out of the directory.
    write(&env.dir.join("x"), LOCAL);
    write(&seat, "ACTIVE=../../x\n");
    assert!(!may_set(&env, "hybrid"), "a path for a session id");
    write(&seat, "ACTIVE=2\n");
    assert!(may_set(&env, "hybrid"), "control: allowed again");
}
