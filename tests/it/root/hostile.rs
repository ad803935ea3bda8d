//! Tier 2, as root: a hostile local user against the daemon's control plane.
//! Each test reproduces one attack of the hardening review (issue 9) with the
//! real daemon, the cgroup backend and real processes, and checks the
//! outcome a user (or an attacker) would see.

use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::fixture::machine;
use crate::common::harness::{describe, raw_exchange, require_root, Env, BIN, ENXIO, EPERM};

macro_rules! root_test {
    () => {
        require_root(module_path!())
    };
}

/// An unprivileged attacker's uid/gid (no group membership).
const ATTACKER: u32 = 60001;
/// A member of the configured group (`nogroup`, gid 65534 on Debian).
const MEMBER: u32 = 60002;
const NOGROUP: u32 = 65534;

/// Connects to `socket` from a forked child running as `uid` (primary gid
/// `uid`, no supplementary groups), which exits right after `connect(2)`.
/// The parent keeps the connection (the same open file description): the
/// daemon's SO_PEERCRED names the dead child. Returns it and the child's pid.
fn connect_then_exit(socket: &Path, uid: u32) -> (UnixStream, i32) {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let p = socket.to_str().unwrap().as_bytes();
    for (d, s) in addr.sun_path.iter_mut().zip(p) {
        *d = *s as libc::c_char;
    }
    // SAFETY: the child calls only async-signal-safe functions (setgroups,
    // setgid, setuid, connect, _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                libc::_exit(10);
            }
            let r = libc::connect(
                fd,
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            libc::_exit(if r == 0 { 0 } else { 11 });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(status, 0, "the connecting child failed ({status:#x})");
    // SAFETY: `fd` is ours and open; the stream takes ownership.
    let s = unsafe { UnixStream::from_raw_fd(fd) };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (s, pid)
}

/// Starts `sleep 60` as `uid` with supplementary group `group`, trying to
/// make it get pid `pid` (via /proc/sys/kernel/ns_last_pid). Other test
/// threads fork too, so it retries; panics if the pid cannot be had.
fn spawn_with_pid(pid: i32, uid: u32, group: u32) -> Child {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let mut cmd = Command::new("/bin/sleep");
        cmd.arg("60");
        // SAFETY: async-signal-safe credential calls in the forked child.
        unsafe {
            cmd.pre_exec(move || {
                let groups = [group];
                if libc::setgroups(1, groups.as_ptr()) != 0
                    || libc::setgid(uid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut c = cmd.spawn().unwrap();
        if c.id() as i32 == pid {
            return c;
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    panic!("could not get pid {pid} back");
}

fn send(s: &mut UnixStream, line: &str) -> serde_json::Value {
    raw_exchange(s, format!("{line}\n").as_bytes())
}

fn ok(env: &Env, args: &[&str]) {
    let out = env.gpuctl(args);
    assert!(out.status.success(), "gpuctl {args:?}: {}", describe(&out));
}

fn timed_root_set(env: &Env, mode: &str) -> Duration {
    let t0 = Instant::now();
    ok(env, &["set", mode]);
    t0.elapsed()
}

#[test]
#[ignore = "root"]
fn pid_reuse_by_a_group_member_grants_nothing() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    std::fs::write(env.dir.join("gpuctl.toml"), "group = \"nogroup\"\n").unwrap();
    env.start();
    let (mut conn, pid) = connect_then_exit(&env.socket(), ATTACKER);
    // A group member's process now has the attacker's connect-time pid.
    let mut member = spawn_with_pid(pid, MEMBER, NOGROUP);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains(&format!("{NOGROUP}")), "{status}");
    let r = send(&mut conn, r#"{"type":"set","mode":"integrated"}"#);
    assert_eq!(r["error"]["code"], "permission_denied", "{r}");
    let r = send(
        &mut conn,
        r#"{"type":"config","key":"group","value":"attackers"}"#,
    );
    assert_eq!(r["error"]["code"], "permission_denied", "{r}");
    assert_eq!(env.json(&["get"])["mode"], "hybrid");
    let _ = member.kill();
    let _ = member.wait();
    // The member itself, connecting, may.
    let out = Command::new(BIN)
        .env("GPUCTL_SOCKET", env.socket())
        .args(["set", "integrated"])
        .uid(MEMBER)
        .gid(NOGROUP)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    env.stop();
}

#[test]
#[ignore = "root"]
fn a_dead_process_cannot_be_granted_nor_pass_a_grant_on() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    ok(&env, &["set", "smart"]);
    let (mut conn, pid) = connect_then_exit(&env.socket(), ATTACKER);
    let r = send(&mut conn, r#"{"type":"grant"}"#);
    assert_eq!(r["error"]["code"], "refused", "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("exited"));
    let grants = env.json(&["status"])["grants"].clone();
    assert!(
        !grants.as_array().unwrap().iter().any(|g| g["pid"] == pid),
        "{grants}"
    );
    // Whoever gets that pid next is not granted. (Other tests' smart-mode
    // launches are granted by this daemon's hooks too: look at this pid.)
    let mut next = spawn_with_pid(pid, ATTACKER, ATTACKER);
    let grants = env.json(&["status"])["grants"].clone();
    assert!(
        !grants.as_array().unwrap().iter().any(|g| g["pid"] == pid),
        "{grants}"
    );
    let _ = next.kill();
    let _ = next.wait();
    env.stop();
}

#[test]
#[ignore = "root"]
fn one_user_cannot_lock_out_root() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    // 64 event subscribers and slowloris clients from one user…
    let mut hogs = Vec::new();
    let mut refused = 0;
    for i in 0..64 {
        let (mut s, _) = connect_then_exit(&env.socket(), ATTACKER);
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        if i % 2 == 0 {
            let _ = s.write_all(b"{\"type\":\"events\"}\n");
            let mut line = String::new();
            let _ = BufReader::new(&s).read_line(&mut line);
            if line.contains("\"busy\"") {
                refused += 1;
            }
        } else {
            let _ = s.write_all(b"{\"type\":");
        }
        hogs.push(s);
    }
    assert!(refused > 0, "no subscriber was refused");
    // …and from 60 other users, one slowloris each: the shared slots fill.
    for uid in 0..60 {
        let (mut s, _) = connect_then_exit(&env.socket(), 61000 + uid);
        let _ = s.write_all(b"{");
        hogs.push(s);
    }
    // Root is still served at once.
    let t = timed_root_set(&env, "integrated");
    assert!(t < Duration::from_secs(1), "root set took {t:?}");
    // A plain user refused a slot gets a clear message and exit code 75.
    let out = env.gpuctl_as(Some(ATTACKER), &["get"]);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("busy"));
    drop(hogs);
    env.stop();
}

#[test]
#[ignore = "root"]
fn a_pipeline_of_4000_requests_does_not_stall_root() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    let (s, _) = connect_then_exit(&env.socket(), ATTACKER);
    let line = b"{\"type\":\"who\"}\n".repeat(4000);
    let writer = std::thread::spawn(move || {
        let mut s = s;
        // Blocks once the daemon stops reading (backpressure): fine.
        let _ = s.write_all(&line);
        s
    });
    std::thread::sleep(Duration::from_millis(200));
    let t = timed_root_set(&env, "integrated");
    assert!(t < Duration::from_secs(1), "root set took {t:?}");
    let s = writer.join().unwrap();
    drop(s);
    env.stop();
}

#[test]
#[ignore = "root"]
fn a_fifo_swapped_in_during_app_allow_does_not_hang_the_daemon() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    ok(&env, &["set", "smart"]);
    let path = env.dir.join("app");
    let fifo = env.dir.join("app.fifo");
    let file = env.dir.join("app.file");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (path, fifo, file, stop) = (path.clone(), fifo.clone(), file.clone(), stop.clone());
        std::thread::spawn(move || {
            let c = CString::new(fifo.to_str().unwrap()).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write(&file, b"#!/bin/sh\n").unwrap();
                std::fs::rename(&file, &path).unwrap();
                // SAFETY: valid NUL-terminated path.
                unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
                std::fs::rename(&fifo, &path).unwrap();
            }
        })
    };
    let p = path.to_str().unwrap();
    for _ in 0..300 {
        let mut cmd = Command::new(BIN);
        cmd.env("GPUCTL_SOCKET", env.socket())
            .args(["app", "allow", p])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = cmd.status();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    let t0 = Instant::now();
    assert_eq!(env.json(&["get"])["mode"], "smart");
    assert!(t0.elapsed() < Duration::from_secs(1));
    env.stop();
}

#[test]
#[ignore = "root"]
fn odd_state_files_are_moved_aside_and_the_daemon_starts() {
    root_test!();
    for kind in ["fifo", "dev-zero"] {
        let mut env = Env::new(machine("intel_nvidia"));
        std::fs::create_dir_all(env.state_dir()).unwrap();
        let state = env.state_file();
        match kind {
            "fifo" => {
                let c = CString::new(state.to_str().unwrap()).unwrap();
                // SAFETY: valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            }
            _ => std::os::unix::fs::symlink("/dev/zero", &state).unwrap(),
        }
        let t0 = Instant::now();
        env.start();
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "{kind}: start took {:?}",
            t0.elapsed()
        );
        assert_eq!(env.json(&["get"])["mode"], "hybrid", "{kind}");
        assert!(
            std::fs::symlink_metadata(env.state_dir().join("state.json.bad")).is_ok(),
            "{kind}: not moved aside"
        );
        // The next change writes a regular file in its place.
        ok(&env, &["set", "integrated"]);
        let log = env.stop();
        assert!(std::fs::metadata(&state).unwrap().is_file(), "{log}");
        assert!(log.contains("state.json.bad"), "{log}");
    }
}

/// `gpuctl run -- sh -c 'wait for FLAG; open NODE'`, in the test cgroup.
fn granted_opener(env: &Env, flag: &Path, node: &Path) -> Child {
    // Bounded (10 s): a failed test leaves no process spinning behind it.
    let script = r#"i=0; while [ ! -e "$0" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done; exec 3<>"$1""#;
    let mut cmd = Command::new(BIN);
    cmd.env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .args(["run", "--", "/bin/sh", "-c", script])
        .arg(flag)
        .arg(node)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    crate::common::harness::join_cgroup_before_exec(&mut cmd, &env.cgroup);
    cmd.spawn().unwrap()
}

fn open_errno_of(child: Child) -> i32 {
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("No such device or address") {
        ENXIO
    } else if err.contains("Operation not permitted") {
        EPERM
    } else {
        panic!("{}", describe(&out))
    }
}

#[test]
#[ignore = "root"]
fn grants_survive_a_restart_and_dead_ones_do_not_come_back() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    ok(&env, &["set", "smart"]);
    let node = env.mknod(226, 0);
    let (flag_a, flag_b) = (env.dir.join("go-a"), env.dir.join("go-b"));
    let a = granted_opener(&env, &flag_a, &node);
    let mut b = granted_opener(&env, &flag_b, &node);
    // (Other tests' smart-mode launches are granted by this daemon's hooks
    // too: look at these two pids only.)
    let pids_granted = |env: &Env| -> Vec<u64> {
        env.json(&["status"])["grants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["pid"].as_u64().unwrap())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids_granted(&env).contains(&u64::from(a.id()))
        || !pids_granted(&env).contains(&u64::from(b.id()))
    {
        assert!(Instant::now() < deadline, "grants not made");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = env.stop();
    let saved: usize = log
        .lines()
        .find_map(|l| l.split("saved ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no `saved N grant(s)` line: {log}"));
    // b dies while no daemon runs: its grant must not come back.
    let b_pid = b.id();
    let _ = b.kill();
    let _ = b.wait();
    env.start();
    let pids = pids_granted(&env);
    assert!(pids.contains(&u64::from(a.id())), "{pids:?}");
    assert!(!pids.contains(&u64::from(b_pid)), "{pids:?}");
    // The restored grant is real: a's next open (after the restart) works.
    std::fs::write(&flag_a, b"").unwrap();
    assert_eq!(open_errno_of(a), ENXIO);
    // A plain process is still denied.
    assert_eq!(env.open_errno(226, 0), EPERM);
    // The restore line counts what was saved (issue 18: it said "of M
    // saved" with M the grants restorable, gap children included).
    let log = env.stop();
    assert!(log.contains(&format!(" of {saved} saved,")), "{log}");
}

/// Issue 18 (F6): children forked while no daemon ran get what the exec
/// hook would have given them. A granted process forks a program with a
/// `deny` rule during the restart gap: on main the restored daemon gave it
/// its parent's grant (a denied program got the GPU). A plain process
/// forks an `allow`ed program: it is granted.
#[test]
#[ignore = "root"]
fn app_rules_apply_to_children_forked_during_a_restart_gap() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    ok(&env, &["set", "smart"]);
    let node = env.mknod(226, 0);
    let (denied, allowed) = (env.dir.join("dsh"), env.dir.join("ash"));
    std::fs::copy("/bin/sh", &denied).unwrap();
    std::fs::copy("/bin/sh", &allowed).unwrap();
    ok(&env, &["app", "deny", denied.to_str().unwrap()]);
    ok(&env, &["app", "allow", allowed.to_str().unwrap()]);
    let child = env.dir.join("child.sh");
    std::fs::write(
        &child,
        "i=0; while [ ! -e \"$1\" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done\n\
         exec 3<>\"$2\"\n",
    )
    .unwrap();
    let (gap, go) = (env.dir.join("gap"), env.dir.join("go"));
    // Waits for `gap`, then forks PROGRAM child.sh go NODE.
    let parent = r#"i=0; while [ ! -e "$0" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done; "$2" "$3" "$4" "$1""#;
    let spawn = |granted: bool, prog: &Path| {
        let mut cmd = Command::new(if granted { BIN } else { "/bin/sh" });
        if granted {
            cmd.env("GPUCTL_SOCKET", env.socket())
                .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
                .args(["run", "--", "/bin/sh"]);
        }
        cmd.args(["-c", parent])
            .arg(&gap)
            .arg(&node)
            .arg(prog)
            .arg(&child)
            .arg(&go)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        crate::common::harness::join_cgroup_before_exec(&mut cmd, &env.cgroup);
        cmd.spawn().unwrap()
    };
    let granted_parent = spawn(true, &denied);
    let plain_parent = spawn(false, &allowed);
    let pid = u64::from(granted_parent.id());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !env.json(&["status"])["grants"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["pid"].as_u64() == Some(pid))
    {
        assert!(Instant::now() < deadline, "grant not made");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = env.stop();
    assert!(log.contains("saved "), "{log}");
    // The gap: both parents fork their program now.
    std::fs::write(&gap, b"").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    env.start();
    std::fs::write(&go, b"").unwrap();
    assert_eq!(
        open_errno_of(granted_parent),
        EPERM,
        "a denied program forked in the gap got its parent's grant"
    );
    assert_eq!(
        open_errno_of(plain_parent),
        ENXIO,
        "an allowed program forked in the gap was not granted"
    );
    let log = env.stop();
    assert!(log.contains("app rule: applied"), "{log}");
}

#[test]
#[ignore = "root"]
fn one_daemon_per_state_dir_and_the_socket_comes_back() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    // The socket file is deleted: the daemon listens on a new one.
    std::fs::remove_file(env.socket()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !env.socket().exists() {
        assert!(Instant::now() < deadline, "socket not re-created");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(env.json(&["get"])["mode"], "hybrid");
    // A second daemon is refused, even on another socket path.
    std::fs::remove_file(env.socket()).unwrap();
    let out = Command::new(BIN)
        .env("GPUCTL_SOCKET", env.dir.join("other.sock"))
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .env("GPUCTL_PROCFS_ROOT", env.machine.procfs())
        .env("GPUCTL_STATE_DIR", env.state_dir())
        .env("GPUCTL_CONFIG", env.dir.join("gpuctl.toml"))
        .args(["daemon", "--cgroup"])
        .arg(&env.cgroup)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another gpuctl daemon is running"),
        "{}",
        describe(&out)
    );
    env.stop();
}

#[test]
#[ignore = "root"]
fn sighup_reloads_and_stray_signals_do_not_stop_the_daemon() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    assert_eq!(env.json(&["status"])["env_grants"], true);
    std::fs::write(env.dir.join("gpuctl.toml"), "env_grants = false\n").unwrap();
    let pid = env.daemon.as_ref().unwrap().id() as i32;
    for sig in [
        libc::SIGHUP,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGPIPE,
        libc::SIGQUIT,
    ] {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, sig) };
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while env.json(&["status"])["env_grants"] != false {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload the config"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(env.daemon.as_mut().unwrap().try_wait().unwrap().is_none());
    let log = env.stop();
    assert!(log.contains("reloaded"), "{log}");
}

#[test]
#[ignore = "root"]
fn out_of_range_max_grants_is_reported_not_fatal() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    std::fs::write(env.dir.join("gpuctl.toml"), "max_grants = 0\n").unwrap();
    env.start();
    assert_eq!(env.json(&["config", "max_grants"])["value"], 8192);
    let log = env.stop();
    assert!(log.contains("out of range"), "{log}");
}

#[test]
#[ignore = "root"]
fn plain_users_see_only_their_own_processes() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    ok(&env, &["set", "smart"]);
    let mut root_run = Command::new(BIN)
        .env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .args(["run", "--", "/bin/sleep", "30"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while env.json(&["status"])["grants"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "grant not made");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = env.gpuctl_as(Some(ATTACKER), &["status", "--json"]);
    assert!(out.status.success(), "{}", describe(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every grant is a root process's (this one's, and other tests'):
    // counted, not shown.
    assert_eq!(v["grants"], serde_json::json!([]), "{v}");
    assert!(v["grants_hidden"].as_u64().unwrap() >= 1, "{v}");
    let root_view = env.json(&["status"]);
    assert!(root_view["grants"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["pid"] == root_run.id()));
    let _ = root_run.kill();
    let _ = root_run.wait();

    // Events: a plain user sees that root's open was denied, not who.
    let mut events = Command::new(BIN)
        .env("GPUCTL_SOCKET", env.socket())
        .args(["events", "--json"])
        .uid(ATTACKER)
        .gid(ATTACKER)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while env.json(&["status"])["events"] != true {
        assert!(Instant::now() < deadline, "no subscriber seen");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(env.open_errno(226, 0), EPERM);
    let mut line = String::new();
    BufReader::new(events.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = events.kill();
    let _ = events.wait();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["event"], "denied", "{v}");
    assert_eq!(v["node"], "226:0", "{v}");
    assert_eq!(v["pid"], serde_json::Value::Null, "{v}");
    assert_eq!(v["comm"], serde_json::Value::Null, "{v}");
    env.stop();
}

#[test]
#[ignore = "root"]
fn the_watchdog_is_fed_when_systemd_asks() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    // The harness reads READY=1 from its notify socket; WATCHDOG=1 follows
    // on the same socket.
    env.extra_env = vec![("WATCHDOG_USEC".into(), "200000".into())];
    env.start();
    let rx = env.notify_rx.take().expect("notify socket kept");
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 64];
    let n = rx.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"WATCHDOG=1");
    env.stop();
}

/// Starts `sleep 60` as `uid` holding `n` O_PATH descriptors of /dev/null
/// (opened before dropping root, past the test's descriptor limit).
fn spawn_with_o_path_fds(uid: u32, n: u32) -> Child {
    let mut cmd = Command::new("/bin/sleep");
    cmd.arg("60");
    let null = CString::new("/dev/null").unwrap();
    // SAFETY: setrlimit, open and the credential calls are async-signal-safe;
    // `null` was made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            // Room for the descriptors the (parallel) test process has open
            // at the fork, too.
            let lim = libc::rlimit {
                rlim_cur: u64::from(n) + 1024,
                rlim_max: u64::from(n) + 1024,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for _ in 0..n {
                if libc::open(null.as_ptr(), libc::O_PATH) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// Issue 18, F1: an unprivileged user's processes with many O_PATH
/// descriptors of /dev/null, and 8 of their connections asking `who` without
/// pause, must not make root wait: the holders are found in the kernel, one
/// scan serves everyone for a while and each uid starts one at most every
/// 2 s. Before, every `who` walked every descriptor in userspace (readlink
/// and stat each), stamped its result when it started, and root's `get`
/// waited behind them (seconds here; 22 s at 320 000 descriptors).
#[test]
#[ignore = "root"]
fn many_o_path_descriptors_do_not_stall_root_or_the_watchdog() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    // The real /proc: the kernel scan serves it (a fixture root is walked).
    env.extra_env = vec![
        ("GPUCTL_PROCFS_ROOT".into(), "/proc".into()),
        ("WATCHDOG_USEC".into(), "2000000".into()),
    ];
    env.start();
    let rx = env.notify_rx.take().expect("notify socket kept");
    let mut hogs: Vec<Child> = (0..16)
        .map(|_| spawn_with_o_path_fds(ATTACKER, 10_000))
        .collect();
    // Each hog holds its descriptors once it sleeps (its fd table is full).
    let deadline = Instant::now() + Duration::from_secs(30);
    for h in &hogs {
        let dir = format!("/proc/{}/fd", h.id());
        while std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0) < 10_000 {
            assert!(
                Instant::now() < deadline,
                "hog {} never opened its descriptors",
                h.id()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let askers: Vec<_> = (0..8)
        .map(|_| {
            let (mut s, _) = connect_then_exit(&env.socket(), ATTACKER);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let v = send(&mut s, r#"{"type":"who"}"#);
                    assert_eq!(v["ok"], true, "{v}");
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut root = env.connect();
    let mut took = Vec::new();
    let t_end = Instant::now() + Duration::from_secs(4);
    while Instant::now() < t_end {
        let t0 = Instant::now();
        let v = send(&mut root, r#"{"type":"get"}"#);
        assert_eq!(v["ok"], true, "{v}");
        took.push(t0.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    took.sort();
    let (median, worst) = (took[took.len() / 2], took[took.len() - 1]);
    // The watchdog pings every WATCHDOG_USEC/2 (1 s): none may be late.
    let mut buf = [0u8; 64];
    rx.set_nonblocking(true).unwrap();
    while rx.recv(&mut buf).is_ok() {}
    rx.set_nonblocking(false).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut pings = 0;
    for _ in 0..2 {
        let n = rx
            .recv(&mut buf)
            .expect("a watchdog ping within 1.5 s during the attack");
        assert_eq!(&buf[..n], b"WATCHDOG=1");
        pings += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered: u32 = askers.into_iter().map(|a| a.join().unwrap()).sum();
    for h in &mut hogs {
        let _ = h.kill();
        let _ = h.wait();
    }
    assert!(answered > 0 && pings == 2);
    // The median meets the 100 ms target; the worst is bounded loosely, as
    // the parallel suite on a loaded machine can delay any one request.
    assert!(
        median < Duration::from_millis(100) && worst < Duration::from_secs(1),
        "root's get took {median:?} (median), up to {worst:?}, during the attack"
    );
    env.stop();
}

/// Starts `sleep 60` (as root) holding `path` open with `flags`.
fn spawn_holding(path: &str, flags: i32) -> Child {
    let c = CString::new(path).unwrap();
    let mut cmd = Command::new("/bin/sleep");
    cmd.arg("60");
    // SAFETY: open(2) is async-signal-safe; `c` was made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::open(c.as_ptr(), flags) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// Issue 18, F1/F2: the kernel's holder scan on the real /proc finds a
/// process with a GPU node open for reading and writing, and does not count
/// one holding it by an O_PATH descriptor (no permission needed, wakes
/// nothing: before, such a descriptor made a holder, and a process named
/// like a display server vetoed blocks with one). The NVIDIA GPU's audio
/// function gets an ALSA node with /dev/full's number, so a real process can
/// hold a node the GPU owns.
#[test]
#[ignore = "root"]
fn who_counts_read_write_holders_not_o_path_ones() {
    root_test!();
    let m = machine("intel_nvidia");
    let audio = std::fs::read_dir(m.sysfs().join("bus/pci/devices"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name() == "0000:01:00.1")
        .expect("the fixture's NVIDIA audio function")
        .path();
    let ctl = audio.join("sound/card9/controlC9");
    std::fs::create_dir_all(&ctl).unwrap();
    std::fs::write(ctl.join("dev"), "1:7\n").unwrap();
    let mut env = Env::new(m);
    env.extra_env = vec![("GPUCTL_PROCFS_ROOT".into(), "/proc".into())];
    env.start();
    let mut rw = spawn_holding("/dev/full", libc::O_RDWR);
    let mut path_only = spawn_holding("/dev/full", libc::O_PATH);
    let deadline = Instant::now() + Duration::from_secs(10);
    let holders = loop {
        // Past the shared window, so the scan is new.
        std::thread::sleep(Duration::from_millis(300));
        let v = env.json(&["who"]);
        let h = v["holders"].as_array().unwrap().clone();
        if h.iter().any(|h| h["pid"] == rw.id()) || Instant::now() > deadline {
            break (h, v["age_ms"].clone());
        }
    };
    let (holders, age) = holders;
    let _ = rw.kill();
    let _ = path_only.kill();
    let _ = rw.wait();
    let _ = path_only.wait();
    let mine: Vec<_> = holders
        .iter()
        .filter(|h| h["pid"] == rw.id() || h["pid"] == path_only.id())
        .collect();
    assert_eq!(mine.len(), 1, "{holders:?}");
    assert_eq!(mine[0]["pid"], rw.id());
    assert_eq!(mine[0]["gpu"], 1);
    assert_eq!(mine[0]["node"], "1:7");
    assert_eq!(mine[0]["path"], "/dev/full");
    assert_eq!(mine[0]["comm"], "sleep");
    assert_eq!(mine[0]["uid"], 0);
    assert!(age.as_u64().is_some_and(|a| a < 250), "age_ms {age}");
    env.stop();
}

/// Issue 18, F2: processes named like a display server holding the dGPU's
/// card node by an O_PATH descriptor (no permission needed, wakes nothing)
/// do not veto a block: one run by a plain user (not the owner of a
/// graphical session), and one run by root (O_PATH is no holder). Before,
/// either made `set integrated` refuse without `--force`.
#[test]
#[ignore = "root"]
fn a_fake_display_server_does_not_veto_a_block() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.extra_env = vec![("GPUCTL_PROCFS_ROOT".into(), "/proc".into())];
    env.start();
    let tag = std::process::id();
    let node = format!("/dev/shm/gpuctl-fakexorg-{tag}");
    let _ = std::fs::remove_file(&node);
    let c = CString::new(node.as_str()).unwrap();
    // SAFETY: valid path; plain mknod(2) of the NVIDIA card's number.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(226, 0)) };
    assert_eq!(r, 0);
    let dir = std::env::temp_dir().join(format!("gpuctl-fakexorg-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let xorg = dir.join("Xorg");
    let _ = std::fs::remove_file(&xorg);
    std::os::unix::fs::symlink("/bin/sleep", &xorg).unwrap();
    let spawn = |uid: u32| {
        let c = CString::new(node.as_str()).unwrap();
        let mut cmd = Command::new(&xorg);
        cmd.arg("60");
        // SAFETY: open(2) and the credential calls are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                if libc::open(c.as_ptr(), libc::O_PATH) < 0
                    || (uid != 0
                        && (libc::setgroups(0, std::ptr::null()) != 0
                            || libc::setgid(uid) != 0
                            || libc::setuid(uid) != 0))
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().unwrap()
    };
    let mut fakes = [spawn(ATTACKER), spawn(0)];
    // Both run, named Xorg, holding the node.
    for f in &fakes {
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(format!("/proc/{}/comm", f.id())).unwrap_or_default()
            != "Xorg\n"
        {
            assert!(
                Instant::now() < deadline,
                "fake Xorg {} not running",
                f.id()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let out = env.gpuctl(&["set", "integrated"]);
    for f in &mut fakes {
        let _ = f.kill();
        let _ = f.wait();
    }
    std::fs::remove_file(&node).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "a fake Xorg vetoed the block: {}",
        describe(&out)
    );
    assert_eq!(env.json(&["status"])["mode"], "integrated");
    assert_eq!(env.open_errno(226, 0), EPERM);
    env.stop();
}

/// Issue 18, F4: a process named with a terminal escape sequence holding a
/// GPU node: root's `who` table shows the sequence escaped (before, it
/// reached the terminal as is and retitled it), the JSON keeps the exact
/// name.
#[test]
#[ignore = "root"]
fn a_hostile_process_name_reaches_the_terminal_escaped() {
    root_test!();
    let m = machine("intel_nvidia");
    let audio = std::fs::read_dir(m.sysfs().join("bus/pci/devices"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name() == "0000:01:00.1")
        .expect("the fixture's NVIDIA audio function")
        .path();
    let ctl = audio.join("sound/card9/controlC9");
    std::fs::create_dir_all(&ctl).unwrap();
    std::fs::write(ctl.join("dev"), "1:7\n").unwrap();
    let mut env = Env::new(m);
    env.extra_env = vec![("GPUCTL_PROCFS_ROOT".into(), "/proc".into())];
    env.start();
    let name = "ev\x1b]0;pwned\x07";
    let dir = env.dir.join("names");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    std::os::unix::fs::symlink("/bin/sleep", &exe).unwrap();
    let full = CString::new("/dev/full").unwrap();
    let mut cmd = Command::new(&exe);
    cmd.arg("60");
    // SAFETY: open(2) is async-signal-safe; `full` was made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::open(full.as_ptr(), libc::O_RDWR) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut holder = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let json = loop {
        std::thread::sleep(Duration::from_millis(300));
        let v = env.json(&["who"]);
        if v["holders"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["pid"] == holder.id())
            || Instant::now() > deadline
        {
            break v;
        }
    };
    std::thread::sleep(Duration::from_millis(300));
    let table = env.gpuctl(&["who"]);
    let _ = holder.kill();
    let _ = holder.wait();
    let h = json["holders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["pid"] == holder.id())
        .cloned()
        .unwrap_or_else(|| panic!("holder not found: {json}"));
    assert_eq!(h["comm"], name, "the JSON keeps the exact name");
    let out = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{}", describe(&table));
    assert!(!out.contains('\x1b') && !out.contains('\x07'), "{out:?}");
    assert!(out.contains("ev\\x1b]0;pwned\\x07"), "{out:?}");
    env.stop();
}

/// Issue 18, F6: the socket gets its mode (0666) at bind from the umask;
/// the daemon never chmods it by path (a chmod after bind follows whatever
/// the path names by then). Checked with strace on a daemon's start.
#[test]
#[ignore = "root"]
fn the_socket_mode_is_set_at_bind_not_by_chmod() {
    root_test!();
    let env = Env::new(machine("intel_nvidia"));
    let trace = env.dir.join("strace.log");
    let mut daemon = traced_daemon(&env, &trace, "trace=chmod,fchmodat,fchmod");
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(env.socket()).is_err() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not listen: {}",
            std::fs::read_to_string(env.dir.join("daemon.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(env.socket()).unwrap().permissions(),
    );
    // Stop the daemon itself (strace's child; strace exits with it).
    let log = stop_traced(
        UnixStream::connect(env.socket()).unwrap(),
        &mut daemon,
        &trace,
    );
    assert_eq!(mode & 0o777, 0o666, "socket mode {mode:o}");
    let sock = env.socket().to_string_lossy().into_owned();
    assert!(
        !log.lines().any(|l| l.contains(&sock)),
        "the socket was chmod'ed by path: {log}"
    );
}

/// The socket path appears only once the socket listens: it is bound under
/// a temporary name and renamed into place. Before, a client that saw the
/// file between bind(2) and listen(2) got ECONNREFUSED (seen as a flaky
/// `one_daemon_per_state_dir_and_the_socket_comes_back`). Checked with strace
/// on a start and on a re-creation after the file is deleted. Every
/// `inotify_add_watch` is delayed by 300 ms: the socket's directory must be
/// watched before its path appears, or a deletion right after the start is
/// missed and the socket never comes back (seen under load, before the fix).
#[test]
#[ignore = "root"]
fn the_socket_path_appears_only_when_it_listens() {
    root_test!();
    let env = Env::new(machine("intel_nvidia"));
    let trace = env.dir.join("strace.log");
    let mut daemon = traced_daemon(
        &env,
        &trace,
        "trace=bind,rename,renameat,renameat2,inotify_add_watch inject=inotify_add_watch:delay_enter=300000",
    );
    let connect = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if env.socket().exists() {
                // Once the path is there, it answers.
                return UnixStream::connect(env.socket())
                    .unwrap_or_else(|e| panic!("{what}: the socket file refuses: {e}"));
            }
            assert!(
                Instant::now() < deadline,
                "{what}: no socket: {}",
                std::fs::read_to_string(env.dir.join("daemon.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    drop(connect("start"));
    std::fs::remove_file(env.socket()).unwrap();
    let log = stop_traced(connect("re-created"), &mut daemon, &trace);
    let sock = env.socket().to_string_lossy().into_owned();
    let binds: Vec<&str> = log.lines().filter(|l| l.contains("bind(")).collect();
    assert!(
        binds.len() >= 2,
        "a bind at start and one after the deletion: {log}"
    );
    for l in &binds {
        assert!(
            !l.contains(&format!("sun_path=\"{sock}\"")),
            "bound at the final path (a window before listen): {l}"
        );
    }
    let renames = log
        .lines()
        .filter(|l| l.contains("rename") && l.contains(&format!("\"{sock}\"")))
        .count();
    assert!(
        renames >= 2,
        "moved into place at start and after the deletion: {log}"
    );
}

/// A daemon of `env` run under `strace -f -e FILTER -o TRACE` (the
/// daemon's stderr in daemon.log); strace exits with it.
pub(super) fn traced_daemon(
    env: &Env,
    trace: &std::path::Path,
    filter: &str,
) -> std::process::Child {
    // `filter` may hold several `-e` expressions, separated by spaces.
    let mut args = vec!["-f", "-qq", "-s", "256"];
    for f in filter.split(' ') {
        args.extend(["-e", f]);
    }
    Command::new("strace")
        .args(args)
        .arg("-o")
        .arg(trace)
        .arg(BIN)
        .args(["daemon", "--cgroup"])
        .arg(&env.cgroup)
        .env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .env("GPUCTL_PROCFS_ROOT", env.machine.procfs())
        .env("GPUCTL_STATE_DIR", env.state_dir())
        .env("GPUCTL_CONFIG", env.dir.join("gpuctl.toml"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(env.dir.join("daemon.log")).unwrap())
        .spawn()
        .expect("strace (make deps installs it)")
}

/// Stops a [`traced_daemon`] through `s`, a connection to it (its pid from
/// `ping`; strace exits with it), and returns the trace.
pub(super) fn stop_traced(
    mut s: UnixStream,
    daemon: &mut std::process::Child,
    trace: &std::path::Path,
) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let pid = send(&mut s, r#"{"type":"ping"}"#)["data"]["pid"]
        .as_i64()
        .expect("the daemon's pid");
    // SAFETY: plain kill(2) of the daemon this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = daemon.wait();
    std::fs::read_to_string(trace).unwrap()
}

/// Sends `line` in one `sendmsg(2)` with `fds` attached (SCM_RIGHTS) and
/// returns the daemon's answer.
fn send_with_fds(s: &mut UnixStream, line: &str, fds: &[i32]) -> serde_json::Value {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd;
    let iov = [std::io::IoSlice::new(line.as_bytes())];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let n = sendmsg::<()>(s.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).unwrap();
    assert_eq!(n, line.len());
    crate::common::harness::read_line(s)
}

/// The daemon's descriptors, as what each names.
fn open_fds(pid: u32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .filter(|p| !p.starts_with("socket:") && !p.starts_with("anon_inode:"))
        .collect();
    v.sort();
    v
}

/// Issue 18 (F6): descriptors passed over the socket are capped and
/// checked, and closed on every path: two at once, one with a request that
/// takes none, a non-regular file, and `"fd": true` without one each get a
/// clear `bad_request`, and the daemon holds no more descriptors after a
/// hundred of them than before.
#[test]
#[ignore = "root"]
fn passed_descriptors_are_capped_checked_and_closed() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    let pid = env.daemon.as_ref().unwrap().id();
    let prog = env.dir.join("prog");
    std::fs::copy("/bin/true", &prog).unwrap();
    let f = std::fs::File::open(&prog).unwrap();
    let dir = std::fs::File::open(&env.dir).unwrap();
    use std::os::fd::AsRawFd;
    let (fd, dirfd) = (f.as_raw_fd(), dir.as_raw_fd());
    let allow = |p: &Path| {
        format!(
            r#"{{"type":"app","action":"allow","path":"{}","fd":true}}"#,
            p.display()
        ) + "\n"
    };
    let code = |v: &serde_json::Value| v["error"]["code"].as_str().unwrap_or("").to_string();
    let msg = |v: &serde_json::Value| v["error"]["message"].as_str().unwrap_or("").to_string();
    // Warm up (the first request may open files the daemon keeps).
    let _ = env.json(&["status"]);
    let before = open_fds(pid);
    for _ in 0..25 {
        let mut s = env.connect();
        let r = send_with_fds(&mut s, &allow(&prog), &[fd, fd]);
        assert_eq!(code(&r), "bad_request", "{r}");
        assert!(msg(&r).contains("at most 1 descriptor"), "{r}");

        let mut s = env.connect();
        let r = send_with_fds(&mut s, "{\"type\":\"get\"}\n", &[fd]);
        assert_eq!(code(&r), "bad_request", "{r}");
        assert!(msg(&r).contains("takes none"), "{r}");

        let mut s = env.connect();
        let r = send_with_fds(&mut s, &allow(&env.dir), &[dirfd]);
        assert_eq!(code(&r), "bad_request", "{r}");
        assert!(msg(&r).contains("not a regular file"), "{r}");

        let mut s = env.connect();
        let r = raw_exchange(&mut s, allow(&prog).as_bytes());
        assert_eq!(code(&r), "bad_request", "{r}");
        assert!(msg(&r).contains("no descriptor came"), "{r}");
    }
    // A passed program whose path names another file is refused.
    let other = env.dir.join("other");
    std::fs::copy("/bin/true", &other).unwrap();
    let mut s = env.connect();
    let r = send_with_fds(&mut s, &allow(&other), &[fd]);
    assert!(msg(&r).contains("names another file"), "{r}");
    // And a good one goes in, under the path it was sent with.
    let mut s = env.connect();
    let r = send_with_fds(&mut s, &allow(&prog), &[fd]);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["data"]["path"], prog.to_str().unwrap());
    drop(s);
    // Connections come and go, and so do pidfds (sockets and anonymous
    // inodes are left out): no file passed stays open. The daemon's own
    // reads (a sysfs `power_state` it opens and closes within a turn) may
    // be caught open by one look: a descriptor that stays is a leak, so
    // look until the set is the one from before, for at most 2 s.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut now = open_fds(pid);
    while now != before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        now = open_fds(pid);
    }
    assert_eq!(now, before);
    assert_eq!(env.json(&["get"])["mode"], "hybrid");
    env.stop();
}
