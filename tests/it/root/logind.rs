//! Tier 2: a compositor's card, opened by logind (`TakeDevice`) on behalf of
//! a granted session in front of a seat (issue 22). logind is recognised by
//! the kernel's identity of its executable: here a copy of `sh` the daemon
//! is told is systemd-logind (`--logind`), so each check is a real open(2)
//! by "logind" in the test cgroup (cgroup backend). Which session is in
//! front of the seat comes from a fixture of logind's seat files
//! (`GPUCTL_RUN_ROOT`), written as logind writes them (a temporary file
//! renamed over the seat's).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::fixture::machine;
use crate::common::harness::{
    describe, join_cgroup_before_exec, require_root, Env, BIN, ENXIO, EPERM,
};

/// Opens NODE ($0) read-write, as logind opens a DRM node.
const OPEN: &str = r#"exec 3<>"$0""#;

/// The errno of `prog -c OPEN node` run in the test cgroup (0: opened).
fn open_as(env: &Env, prog: &str, node: &str) -> i32 {
    open_with(env, prog, &[], node)
}

/// The errno of `prog ARGS -c OPEN node` run in the test cgroup (0: opened).
fn open_with(env: &Env, prog: &str, args: &[&str], node: &str) -> i32 {
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .args(["-c", OPEN, node])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    join_cgroup_before_exec(&mut cmd, &env.cgroup);
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => 0,
        _ if err.contains("Operation not permitted") => EPERM,
        _ if err.contains("No such device or address") => ENXIO,
        _ => panic!("{prog}: {}", describe(&out)),
    }
}

/// `gpuctl run -- sleep 60` from a process that first starts a new login
/// (audit) session, as a user's compositor runs in its logind session.
/// `None` where this machine cannot start one (loginuid immutable).
fn granted_in_new_session(env: &Env) -> Option<Child> {
    let probe = Command::new("sh")
        .args(["-c", "echo 0 > /proc/self/loginuid"])
        .output()
        .unwrap();
    if !probe.status.success() {
        return None;
    }
    let script = format!(r#"echo 0 > /proc/self/loginuid && exec "{BIN}" run -- sleep 60"#);
    let child = Command::new("sh")
        .args(["-c", &script])
        .env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .env("GPUCTL_PROCFS_ROOT", env.machine.procfs())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Some(child)
}

/// Waits until "logind" opens `node` (the grant is in), or 10 s.
fn wait_opened(env: &Env, logind: &str, node: &str) -> i32 {
    wait_open_is(env, logind, node, ENXIO)
}

/// Waits until "logind"'s open of `node` gives `want`, or 10 s; what it gave last.
fn wait_open_is(env: &Env, logind: &str, node: &str, want: i32) -> i32 {
    let t0 = Instant::now();
    loop {
        let r = open_as(env, logind, node);
        if r == want || t0.elapsed() > Duration::from_secs(10) {
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The fixture run root for logind's seat files (the daemon's `GPUCTL_RUN_ROOT`),
/// with `systemd/` only: the seats' directory appears later, as at boot.
fn run_root(env: &mut Env) -> PathBuf {
    let run = env.dir.join("run");
    std::fs::create_dir_all(run.join("systemd")).unwrap();
    for d in [&run, &run.join("systemd")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    env.extra_env
        .push(("GPUCTL_RUN_ROOT".into(), run.to_string_lossy().into_owned()));
    run
}

/// Writes `seat`'s file as logind does (a temporary file renamed over it),
/// saying `active` is the session in front of it ("" for none).
fn seat(run: &Path, seat: &str, active: &str) {
    let dir = run.join("systemd/seats");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tmp = dir.join(format!(".#{seat}Xy12z"));
    std::fs::write(
        &tmp,
        format!("# This is private data. Do not parse.\nIS_SEAT0=1\nCAN_MULTI_SESSION=1\nACTIVE={active}\n"),
    )
    .unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&tmp, dir.join(seat)).unwrap();
}

/// The audit session id of `pid` once it has left ours (it writes its
/// loginuid first), or panics after 5 s.
fn session_of(pid: u32) -> String {
    let ours = std::fs::read_to_string("/proc/self/sessionid").unwrap();
    let t0 = Instant::now();
    loop {
        let theirs = std::fs::read_to_string(format!("/proc/{pid}/sessionid")).unwrap_or_default();
        if !theirs.is_empty() && theirs != ours {
            return theirs.trim().to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "pid {pid} started no new session"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A smart-mode daemon told that a copy of `sh` is systemd-logind, with a
/// fixture run root for logind's seat files (no seats yet), environment
/// grants off; with that copy's path and the run root.
fn logind_daemon() -> (Env, String, PathBuf) {
    require_root(module_path!());
    let mut env = Env::new(machine("intel_nvidia"));
    let logind = env.dir.join("systemd-logind");
    std::fs::copy("/bin/sh", &logind).unwrap();
    std::fs::set_permissions(&logind, std::fs::Permissions::from_mode(0o755)).unwrap();
    let logind = logind.to_string_lossy().into_owned();
    env.extra_daemon_args = vec!["--logind".into(), logind.clone()];
    let run = run_root(&mut env);
    env.start();
    // Only this test's grants: another test's `gpuctl run` child carries
    // DRI_PRIME strings this daemon's exec hook would grant too.
    let out = env.gpuctl(&["config", "env_grants", "false"]);
    assert!(out.status.success(), "{}", describe(&out));
    let out = env.gpuctl(&["set", "smart"]);
    assert!(out.status.success(), "{}", describe(&out));
    (env, logind, run)
}

#[test]
#[ignore = "root"]
fn logind_opens_the_card_only_for_a_granted_session_in_smart_mode() {
    let (env, logind, run) = logind_daemon();
    let dgpu = env.mknod(226, 0).to_string_lossy().into_owned();

    assert_eq!(
        open_as(&env, &logind, &dgpu),
        EPERM,
        "no session holds a grant: logind's open is refused"
    );
    let Some(mut granted) = granted_in_new_session(&env) else {
        eprintln!("skipped: /proc/self/loginuid cannot be written here (no new session)");
        return;
    };
    let session = session_of(granted.id());
    // The grant is in before the seat says anything.
    let t0 = Instant::now();
    while env.json(&["status"])["grants"]
        .as_array()
        .map_or(0, Vec::len)
        == 0
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "no grant listed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        open_as(&env, &logind, &dgpu),
        EPERM,
        "a granted session that no seat has in front (logind not started yet): refused"
    );
    // logind starts: its seats' directory appears, seat0 with no session yet.
    seat(&run, "seat0", "");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        open_as(&env, &logind, &dgpu),
        EPERM,
        "a granted session that is not the seat's active one: refused"
    );
    seat(&run, "seat0", &session);
    assert_eq!(
        wait_opened(&env, &logind, &dgpu),
        ENXIO,
        "the seat's active session holds a grant: logind opens the card for it"
    );
    // Another session comes to the front (a VT switch): its compositor
    // would get the card on this session's grant.
    seat(&run, "seat0", "4000000");
    assert_eq!(
        wait_open_is(&env, &logind, &dgpu, EPERM),
        EPERM,
        "another session in front of the seat: refused"
    );
    // The granted session in front of a second seat counts too.
    seat(&run, "seat1", &session);
    assert_eq!(
        wait_opened(&env, &logind, &dgpu),
        ENXIO,
        "in front of seat1"
    );
    std::fs::remove_file(run.join("systemd/seats/seat1")).unwrap();
    assert_eq!(
        wait_open_is(&env, &logind, &dgpu, EPERM),
        EPERM,
        "seat1 gone: refused"
    );
    seat(&run, "seat0", &session);
    assert_eq!(wait_opened(&env, &logind, &dgpu), ENXIO, "in front again");
    assert_eq!(
        open_as(&env, "/bin/sh", &dgpu),
        EPERM,
        "only logind's executable is let through, not every process"
    );
    // A user can run (and LD_PRELOAD into) logind's executable, but not as root.
    std::fs::set_permissions(&dgpu, std::fs::Permissions::from_mode(0o666)).unwrap();
    let as_nobody = [
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        logind.as_str(),
    ];
    assert_eq!(
        open_with(&env, "setpriv", &as_nobody, &dgpu),
        EPERM,
        "logind's executable run by a plain user is not logind"
    );

    // An upgrade renames a new file over logind's: the daemon re-resolves it
    // (inotify), and the new inode is logind.
    let new = format!("{logind}.new");
    std::fs::copy("/bin/sh", &new).unwrap();
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&new, &logind).unwrap();
    assert_eq!(
        wait_opened(&env, &logind, &dgpu),
        ENXIO,
        "the replaced logind executable is re-resolved"
    );

    // The granted process exits: its grant goes, and logind's open with it.
    granted.kill().unwrap();
    granted.wait().unwrap();
    let t0 = Instant::now();
    while open_as(&env, &logind, &dgpu) != EPERM {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the grant's process exited: logind's open must be refused"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Integrated, with a granted session alive and in front: nothing is grantable.
    let mut granted = granted_in_new_session(&env).unwrap();
    seat(&run, "seat0", &session_of(granted.id()));
    assert_eq!(wait_opened(&env, &logind, &dgpu), ENXIO, "granted again");
    let out = env.gpuctl(&["set", "integrated"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(open_as(&env, &logind, &dgpu), EPERM, "integrated mode");
    granted.kill().unwrap();
    granted.wait().unwrap();
}

/// A compositor refused through logind is named for what it is in `events`
/// (`via: logind`, a `why` that says so), not as logind's own open.
#[test]
#[ignore = "root"]
fn events_say_logind_was_refused_for_a_compositor() {
    let (env, logind, _run) = logind_daemon();
    let dgpu = env.mknod(226, 129).to_string_lossy().into_owned();
    let mut child = Command::new(BIN)
        .env("GPUCTL_SOCKET", env.socket())
        .args(["events", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while env.json(&["status"])["events"] != true {
        assert!(t0.elapsed() < Duration::from_secs(5), "no subscriber seen");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(open_as(&env, &logind, &dgpu), EPERM);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["event"], "denied", "{v}");
    assert_eq!(v["via"], "logind", "{v}");
    let why = v["why"].as_str().unwrap_or_default();
    assert!(
        why.contains("compositor") && why.contains("gpuctl run") && why.contains("GPU 1"),
        "{v}"
    );
}
