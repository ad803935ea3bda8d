//! Tier 2, as root: each uid's share of the grant map (issue 18 F3). One
//! plain user's fork bomb of a granted program must not take the grants of
//! everyone else: the fork hook stops copying that user's grant at its share,
//! and another uid's `gpuctl run`, `DRI_PRIME=1` exec grant and inherited
//! grant still work.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::fixture::machine;
use crate::common::harness::{describe, join_cgroup_before_exec, require_root, Env, BIN};

/// These tests run one at a time: every smart-mode daemon's exec hook grants
/// any process exec'd with the offload variables `gpuctl run` sets, so one
/// test's fork bomb puts entries in the other tests' (small) maps too.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Root only: a smart-mode daemon of `intel_nvidia` with a grant map of
/// `max_grants` entries, started while this test holds the others off
/// (the guard is dropped after the daemon).
fn smart_daemon(max_grants: u32) -> (std::sync::MutexGuard<'static, ()>, Env) {
    require_root(module_path!());
    let serial = one_at_a_time();
    let mut env = Env::new(machine("intel_nvidia"));
    std::fs::write(
        env.dir.join("gpuctl.toml"),
        format!("max_grants = {max_grants}\n"),
    )
    .unwrap();
    env.start();
    let out = env.gpuctl(&["set", "smart"]);
    assert!(out.status.success(), "{}", describe(&out));
    (serial, env)
}

/// The fork-bombing user, and the one who must still get grants.
const ATTACKER: u32 = 60011;
const VICTIM: u32 = 60012;
/// The grant map's size in these tests (the default 8192 works the same,
/// slower): the attacker forks more children than it holds.
const MAP: u32 = 256;
const CHILDREN: u32 = 320;

/// Drops to `uid` (gid `uid`, no supplementary groups) in the forked child,
/// after anything added to `cmd` before (joining the test cgroup as root).
fn as_user(cmd: &mut Command, uid: u32) {
    // SAFETY: async-signal-safe credential calls in the forked child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The attacker: `gpuctl run` of a shell that forks CHILDREN sleepers (each
/// inherits the grant at fork), says `forked`, and when its stdin closes
/// kills them by pid ([`stop`]).
fn fork_bomb(env: &Env) -> Child {
    forker(env, ATTACKER, CHILDREN)
}

/// `gpuctl run` as `uid` of a shell that forks `n` sleepers (see [`fork_bomb`]).
fn forker(env: &Env, uid: u32, n: u32) -> Child {
    let script = format!(
        "p=; i=0; while [ $i -lt {n} ]; do /bin/sleep 30 & p=\"$p $!\"; i=$((i+1)); done; \
         echo forked; read x; kill $p; wait"
    );
    let mut cmd = Command::new(BIN);
    cmd.env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .args(["run", "--", "/bin/sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if uid != 0 {
        as_user(&mut cmd, uid);
    }
    let mut c = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "forked", "the fork bomb did not start");
    c
}

/// Ends the fork bomb: its shell kills its children and exits.
fn stop(mut bomb: Child) {
    drop(bomb.stdin.take());
    let _ = bomb.wait();
}

/// Runs `sh -c SCRIPT NODE` as VICTIM in the test cgroup (through `gpuctl
/// run` when `run`, else with exactly `envs`), and returns its output.
fn victim(env: &Env, run: bool, envs: &[(&str, &str)], script: &str, node: &Path) -> Output {
    let mut cmd = Command::new(if run { BIN } else { "/bin/sh" });
    if run {
        cmd.env("GPUCTL_SOCKET", env.socket())
            .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
            .args(["run", "--", "/bin/sh"]);
    } else {
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(envs.iter().copied());
    }
    cmd.args(["-c", script]).arg(node);
    join_cgroup_before_exec(&mut cmd, &env.cgroup);
    as_user(&mut cmd, VICTIM);
    cmd.output().unwrap()
}

/// Each line of `out`'s stderr that reports an open: allowed (ENXIO, no
/// driver here) or denied (EPERM).
fn opens(out: &Output) -> (usize, usize) {
    let err = String::from_utf8_lossy(&out.stderr);
    let allowed = err.matches("No such device or address").count();
    let denied = err.matches("Operation not permitted").count();
    (allowed, denied)
}

#[test]
#[ignore = "root"]
fn one_users_fork_bomb_leaves_grants_for_the_others() {
    let (_serial, mut env) = smart_daemon(MAP);
    let node = env.mknod(226, 128);
    // Opened for writing by the plain victim (the harness's umask took w).
    std::fs::set_permissions(&node, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();

    let bomb = fork_bomb(&env);
    let status = env.json(&["status"]);
    let status = format!(
        "grant_share {} / refused_map_full {}",
        status["grant_share"], status["grants_refused_map_full"]
    );

    // The victim's `gpuctl run`: the shell it execs opens the node, and so
    // does a shell that shell forks (an inherited grant).
    let run = victim(
        &env,
        true,
        &[],
        r#"/bin/sh -c 'exec 3<>"$0"' "$0"; exec 3<>"$0""#,
        &node,
    );
    // The victim's exec with DRI_PRIME=1 (an environment grant).
    let prime = victim(&env, false, &[("DRI_PRIME", "1")], r#"exec 3<>"$0""#, &node);

    stop(bomb);
    assert_eq!(
        opens(&run),
        (2, 0),
        "gpuctl run: {} / {status}",
        describe(&run)
    );
    assert_eq!(
        opens(&prime),
        (1, 0),
        "DRI_PRIME=1: {} / {status}",
        describe(&prime)
    );
    env.stop();
}

/// The accounting, seen through `status`: the attacker holds its share of
/// inherited grants and no more, the children over it are counted as
/// refused (the user can see why they were denied), and every count goes
/// back to zero when the processes exit (nothing leaks).
#[test]
#[ignore = "root"]
fn inherited_grants_are_counted_per_uid_and_given_back_at_exit() {
    let (_serial, mut env) = smart_daemon(MAP);

    let bomb = fork_bomb(&env);
    let out = env.gpuctl_as(Some(ATTACKER), &["status", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let mine: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let share = mine["grant_share"]["share"].as_u64().unwrap();
    assert_eq!(share, u64::from(MAP / 8), "{mine}");
    let uids = mine["grant_share"]["uids"].as_array().unwrap();
    // A plain user sees their own uid's row only.
    assert_eq!(uids.len(), 1, "{mine}");
    assert_eq!(uids[0]["uid"], ATTACKER, "{mine}");
    assert_eq!(uids[0]["inherited"].as_u64().unwrap(), share, "{mine}");
    let refused = uids[0]["refused"].as_u64().unwrap();
    // Every child past the share, at its fork (and again at its exec of
    // sleep: `gpuctl run` set the offload variables, an environment grant).
    assert!(refused >= u64::from(CHILDREN) - share, "{mine}");
    // The CLI says why the children were denied.
    let out = env.gpuctl_as(Some(ATTACKER), &["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("over this user's share"), "{text}");

    stop(bomb);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = env.json(&["status"]);
        let held: u64 = s["grant_share"]["uids"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|u| u["uid"] == ATTACKER)
            .map(|u| u["inherited"].as_u64().unwrap())
            .sum();
        if held == 0 && s["grant_share"]["kernel_grants"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "counts not given back: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    env.stop();
}

/// `status` counts the whole map however many entries it holds (a batch
/// reader that stopped at the first short batch showed 1 023 of 8 191; the
/// kernel's walk of issue 21 counts them all), lists 64 and counts the
/// rest; root's forks are not limited.
#[test]
#[ignore = "root"]
fn status_counts_every_grant_of_a_big_map() {
    let (_serial, mut env) = smart_daemon(2048);
    let n = 1500;
    let bomb = forker(&env, 0, n);
    let s = env.json(&["status"]);
    stop(bomb);
    let listed = s["grants"].as_array().unwrap().len() as u64;
    let total = listed + s["grants_not_listed"].as_u64().unwrap();
    assert_eq!(listed, 64, "{}", s["grants_not_listed"]);
    // The shell's own `run` grant and each child's inherited one (other
    // tests' processes are not this daemon's to grant).
    assert!(total > u64::from(n), "{total} of {n}");
    // (Other tests' DRI_PRIME execs are granted by every smart daemon's
    // hooks, and come and go: no exact equality.)
    let kernel = s["grant_share"]["kernel_grants"].as_u64().unwrap();
    assert!(kernel >= u64::from(n), "{}", s["grant_share"]);
    assert_eq!(s["grant_share"]["refused"], 0);
    env.stop();
}

/// The reserve: once the hooks' grants fill three quarters of the map, a
/// uid under its share but holding `small` or more gets no more. On a
/// 128-entry map (share 16, reserve at 96, small 1), six greedy uids fill 96;
/// a seventh then gets one inherited grant at most, though its share is 16,
/// and what is left stays free for the others (and for `run`).
#[test]
#[ignore = "root"]
fn the_last_quarter_is_kept_for_uids_that_hold_few() {
    let (_serial, mut env) = smart_daemon(128);
    let greedy: Vec<Child> = (0..6).map(|i| forker(&env, 60021 + i, 20)).collect();
    let late = forker(&env, 60027, 3);
    let s = env.json(&["status"]);
    stop(late);
    for g in greedy {
        stop(g);
    }
    let share = &s["grant_share"];
    assert_eq!(
        (&share["share"], &share["reserve_at"], &share["small"]),
        (
            &serde_json::json!(16),
            &serde_json::json!(96),
            &serde_json::json!(1)
        ),
        "{share}"
    );
    let row = |uid: u32| {
        share["uids"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["uid"] == uid)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {uid}: {share}"))
    };
    for uid in 60021..60027 {
        assert!(row(uid)["inherited"].as_u64().unwrap() <= 16, "{share}");
    }
    assert!(share["kernel_grants"].as_u64().unwrap() >= 96, "{share}");
    let late = row(60027);
    assert!(late["inherited"].as_u64().unwrap() <= 1, "{share}");
    assert!(late["refused"].as_u64().unwrap() >= 2, "{share}");
    env.stop();
}

/// The per-uid cap of `gpuctl run` (256 for a plain user), counted by the
/// kernel's walk of the grant map since issue 21 (before: a copy of the
/// whole map on every `run`): the 256th grant is made, the 257th refused
/// saying why, and a grant given back (its process exits) makes room.
#[test]
#[ignore = "root"]
fn a_plain_users_run_grants_stop_at_the_cap() {
    const RUNNER: u32 = 60013;
    let (_serial, mut env) = smart_daemon(1024);
    // 256 `gpuctl run -- sleep` of the user's, from a shell that is not
    // granted; one after the other (a user's connections are limited), each
    // once the one before has exec'd its sleep (granted) or exited.
    let script = format!(
        "p=; i=0; while [ $i -lt 256 ]; do {BIN} run -- /bin/sleep 30 & p=\"$p $!\"; \
         while [ -e /proc/$! ] && [ \"$(cat /proc/$!/comm 2>/dev/null)\" != sleep ]; do :; done; \
         i=$((i+1)); done; echo started; read x; kill $p; wait"
    );
    let mut cmd = Command::new("/bin/sh");
    cmd.env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    as_user(&mut cmd, RUNNER);
    let mut runs = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(runs.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "started");
    let held = |env: &Env| {
        let out = env.gpuctl_as(Some(RUNNER), &["status", "--json"]);
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        s["grants"].as_array().unwrap().len() as u64 + s["grants_not_listed"].as_u64().unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while held(&env) < 256 {
        assert!(
            Instant::now() < deadline,
            "{} of 256 grants made",
            held(&env)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = env.gpuctl_as(Some(RUNNER), &["run", "--", "/bin/true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the 257th was granted: {}",
        describe(&out)
    );
    assert!(
        err.contains(&format!(
            "uid {RUNNER} already holds 256 grants from `gpuctl run`"
        )),
        "{err}"
    );
    // Their processes exit: the kernel removes the entries, and the next is made.
    stop(runs);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = env.gpuctl_as(Some(RUNNER), &["run", "--", "/bin/true"]);
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused: {}",
            describe(&out)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    env.stop();
}

/// `gpuctl run -- /bin/sh -c SCRIPT` as `uid`, stdin and stdout piped (the
/// test steps the script through its `read`s and reads what it says).
fn run_script(env: &Env, uid: u32, script: &str) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .args(["run", "--", "/bin/sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    as_user(&mut cmd, uid);
    cmd.spawn().unwrap()
}

/// The next line the script says, trimmed.
fn said(out: &mut BufReader<std::process::ChildStdout>) -> String {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    line.trim().to_string()
}

/// Lets the script go on past its next `read`.
fn step(c: &mut Child) {
    use std::io::Write;
    c.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
}

/// The names `status --json` (asked by `uid`; `None`: root) gives the
/// grants it lists, by pid.
fn listed_names(env: &Env, uid: Option<u32>) -> Vec<(u64, Option<String>)> {
    let out = env.gpuctl_as(uid, &["status", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    s["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let comm = g["comm"].as_str().map(str::to_string);
            (g["pid"].as_u64().unwrap(), comm)
        })
        .collect()
}

/// The name `status` gives the grant of `pid`, or why there is none.
fn name_of(listed: &[(u64, Option<String>)], pid: u32) -> Result<Option<String>, String> {
    listed
        .iter()
        .find(|(p, _)| *p == u64::from(pid))
        .map(|(_, c)| c.clone())
        .ok_or_else(|| format!("pid {pid} is not listed: {listed:?}"))
}

/// Polls `status` as `uid` until `ok` holds for its listing (5 s at most).
fn until_listed(
    env: &Env,
    uid: Option<u32>,
    what: &str,
    ok: impl Fn(&[(u64, Option<String>)]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let l = listed_names(env, uid);
        if ok(&l) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {l:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 21, item 3: `status` names a grant from the grant itself, as of
/// the holder's last exec or fork (no `/proc` read per grant), and follows
/// every change however its listing is kept between requests: a granted
/// shell that renames itself (`/proc/PID/comm`) is still listed as `sh`
/// (before: as `renamed`, read from `/proc` at each request); its forked
/// child is listed once it has exec'd `sleep` (the fork and exec hooks'
/// changes), not after it exited (the exit hook's); the shell is listed as
/// `sleep` once it exec'd it (the exec hook renames the grant in place);
/// after a switch out of smart mode and back (the daemon empties the map)
/// nothing is listed; a new `gpuctl run` (the daemon's own insert) is.
#[test]
#[ignore = "root"]
fn status_names_grants_as_of_their_last_exec_and_follows_every_change() {
    const OWNER: u32 = 60014;
    let (_serial, mut env) = smart_daemon(256);
    let mut sh = run_script(
        &env,
        OWNER,
        "printf renamed > /proc/$$/comm; echo renamed; read x; \
         /bin/sleep 30 & c=$!; echo $c; read x; \
         kill $c; wait $c; echo reaped; read x; exec /bin/sleep 30",
    );
    let pid = sh.id();
    let mut out = BufReader::new(sh.stdout.take().unwrap());
    assert_eq!(said(&mut out), "renamed");
    let me = Some(OWNER);
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "renamed", "the shell renamed itself");
    let l = listed_names(&env, me);
    assert_eq!(
        name_of(&l, pid),
        Ok(Some("sh".into())),
        "named as of its exec"
    );
    // Root's view (every uid) names it the same, when it lists it: other
    // tests' processes with lower pids may hold this daemon's grants too
    // (every smart daemon grants an exec with the offload variables).
    let all = listed_names(&env, None);
    if all.len() < 64 || name_of(&all, pid).is_ok() {
        assert_eq!(name_of(&all, pid), Ok(Some("sh".into())));
    }

    step(&mut sh);
    let child: u32 = said(&mut out).parse().unwrap();
    until_listed(&env, me, "the forked child, after its exec", |l| {
        name_of(l, child) == Ok(Some("sleep".into()))
    });
    step(&mut sh);
    assert_eq!(said(&mut out), "reaped");
    // Reaped: its exit hook has run, so no request may list it.
    let l = listed_names(&env, me);
    assert!(name_of(&l, child).is_err(), "the exited child: {l:?}");
    assert_eq!(name_of(&l, pid), Ok(Some("sh".into())));

    step(&mut sh);
    until_listed(&env, me, "the shell, after its exec of sleep", |l| {
        name_of(l, pid) == Ok(Some("sleep".into()))
    });

    // The daemon's own changes: leaving smart mode empties the map (no
    // hook runs), coming back starts with none; a `gpuctl run` is listed.
    for mode in ["integrated", "smart"] {
        let out = env.gpuctl(&["set", mode]);
        assert!(out.status.success(), "{}", describe(&out));
        let l = listed_names(&env, me);
        assert!(l.is_empty(), "after set {mode}: {l:?}");
    }
    let mut run = run_script(&env, OWNER, "echo started; read x");
    let run_pid = run.id();
    let mut run_out = BufReader::new(run.stdout.take().unwrap());
    assert_eq!(said(&mut run_out), "started");
    let l = listed_names(&env, me);
    assert_eq!(name_of(&l, run_pid), Ok(Some("sh".into())), "{l:?}");
    step(&mut run);
    let _ = run.wait();
    let _ = sh.kill();
    let _ = sh.wait();
    env.stop();
}

/// Issue 21, item 3: a `status` does no `/proc` work per grant. With 100
/// processes granted (a granted shell's children, which never connect), the
/// daemon, traced, opens none of their `/proc/PID/comm` while it answers
/// three `status` requests (before: one for each of the 64 it listed).
#[test]
#[ignore = "root"]
fn status_reads_nothing_from_proc_per_grant() {
    let serial = one_at_a_time();
    require_root(module_path!());
    let env = Env::new(machine("intel_nvidia"));
    std::fs::write(env.dir.join("gpuctl.toml"), "max_grants = 256\n").unwrap();
    let trace = env.dir.join("strace.log");
    let mut daemon = super::hostile::traced_daemon(&env, &trace, "trace=openat");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(env.socket()).is_err() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not listen: {}",
            std::fs::read_to_string(env.dir.join("daemon.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = env.gpuctl(&["set", "smart"]);
    assert!(out.status.success(), "{}", describe(&out));
    let bomb = forker(&env, 0, 100);
    let shell = bomb.id();
    let mut listed = Vec::new();
    for _ in 0..3 {
        listed = listed_names(&env, None);
    }
    stop(bomb);
    let log = super::hostile::stop_traced(
        std::os::unix::net::UnixStream::connect(env.socket()).unwrap(),
        &mut daemon,
        &trace,
    );
    drop(serial);
    // The shell connected (`gpuctl run`): its name was read at accept.
    let children: Vec<u64> = listed
        .iter()
        .map(|(p, _)| *p)
        .filter(|&p| p != u64::from(shell))
        .collect();
    assert!(children.len() >= 63, "{listed:?}");
    let read: Vec<&str> = log
        .lines()
        .filter(|l| {
            children
                .iter()
                .any(|p| l.contains(&format!("\"/proc/{p}/comm\"")))
        })
        .collect();
    assert!(
        read.is_empty(),
        "{} opens of the {} listed grants' /proc/PID/comm, e.g. {:?}",
        read.len(),
        children.len(),
        read.first()
    );
    // And every listed grant is named, from the grant (the children:
    // `sleep`, or `sh` for one caught between its fork and its exec; other
    // tests' processes this daemon granted for their offload variables may
    // be listed too, by their own names).
    assert!(listed.iter().all(|(_, c)| c.is_some()), "{listed:?}");
    assert!(
        listed.iter().any(|(_, c)| c.as_deref() == Some("sleep")),
        "{listed:?}"
    );
}
