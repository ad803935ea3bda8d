//! Tier 2: smart mode on this machine (cgroup backend + tp_btf hooks), as
//! root. Grants are decided in the kernel at fork/exec; every check is a
//! real open(2) from a process in the test cgroup, started the way a user
//! starts it (`gpuctl run`, an environment variable, an app rule).

use std::process::{Command, Stdio};

use crate::common::fixture::machine;
use crate::common::harness::{
    describe, join_cgroup_before_exec, require_root, Env, BIN, ENXIO, EPERM,
};

macro_rules! root_test {
    () => {
        require_root(module_path!())
    };
}

/// `sh -c 'exec 3<>NODE'`: opens NODE read-write; the shell reports errors
/// with strerror text.
pub(super) const OPEN: &str = r#"exec 3<>"$0""#;

/// Runs `argv` (then `sh -c OPEN NODE` appended by the caller) from a
/// process that first joins the test cgroup; returns the errno of the open
/// (0: opened).
pub(super) fn open_via(env: &Env, argv: &[&str], envs: &[(&str, &str)]) -> i32 {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .env("GPUCTL_PROCFS_ROOT", env.machine.procfs())
        .env_remove("DRI_PRIME")
        .env_remove("__NV_PRIME_RENDER_OFFLOAD")
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    join_cgroup_before_exec(&mut cmd, &env.cgroup);
    // A freshly copied executable can be briefly "busy": another test
    // thread's fork may still hold the copy's write fd until it execs.
    let mut tries = 0;
    let out = loop {
        match cmd.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    let err = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => 0,
        _ if err.contains("Operation not permitted") => EPERM,
        _ if err.contains("No such device or address") => ENXIO,
        _ => panic!("{argv:?}: {}", describe(&out)),
    }
}

fn node_arg(env: &Env, maj: u32, min: u32) -> String {
    env.mknod(maj, min).to_string_lossy().into_owned()
}

fn smart_env() -> Env {
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    let out = env.gpuctl(&["set", "smart"]);
    assert!(out.status.success(), "{}", describe(&out));
    env
}

#[test]
#[ignore = "root"]
fn plain_processes_denied_granted_trees_allowed() {
    root_test!();
    let env = smart_env();
    let dgpu = node_arg(&env, 226, 0);
    let igpu = node_arg(&env, 226, 1);
    let st = env.json(&["status"]);
    assert_eq!(st["smart_hooks"], true);
    assert_eq!(st["attached"], true);

    // A plain process: denied the offload GPU, allowed the default one.
    assert_eq!(open_via(&env, &["/bin/sh", "-c", OPEN, &dgpu], &[]), EPERM);
    assert_eq!(open_via(&env, &["/bin/sh", "-c", OPEN, &igpu], &[]), ENXIO);

    // `gpuctl run`: the process itself, after exec.
    let run = [BIN, "run", "--"];
    let direct = [&run[..], &["/bin/sh", "-c", OPEN, &dgpu]].concat();
    assert_eq!(open_via(&env, &direct, &[]), ENXIO);
    // A grandchild (fork, fork).
    let grandchild = r#"/bin/sh -c "/bin/sh -c 'exec 3<>\"\$1\"' x \"\$1\"" x "$0"; exit $?"#;
    let nested = [&run[..], &["/bin/sh", "-c", grandchild, &dgpu]].concat();
    assert_eq!(open_via(&env, &nested, &[]), ENXIO);
    // An exec chain: sh execs sh execs the opener.
    let chain = r#"exec /bin/sh -c 'exec /bin/sh -c "exec 3<>\"\$1\"" x "$1"' x "$0""#;
    let execs = [&run[..], &["/bin/sh", "-c", chain, &dgpu]].concat();
    assert_eq!(open_via(&env, &execs, &[]), ENXIO);

    // `--only`: that tree loses the default GPU; everyone else keeps it.
    let only = [
        &[BIN, "run", "--only", "--"][..],
        &["/bin/sh", "-c", OPEN, &igpu],
    ]
    .concat();
    assert_eq!(open_via(&env, &only, &[]), EPERM);
    let only_dgpu = [
        &[BIN, "run", "--only", "--"][..],
        &["/bin/sh", "-c", OPEN, &dgpu],
    ]
    .concat();
    assert_eq!(open_via(&env, &only_dgpu, &[]), ENXIO);
    assert_eq!(open_via(&env, &["/bin/sh", "-c", OPEN, &igpu], &[]), ENXIO);

    // The environment `gpuctl run` sets is the vendor's offload variables.
    let out = Command::new(BIN)
        .env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .args(["run", "--", "/usr/bin/env"])
        .output()
        .unwrap();
    let vars = String::from_utf8_lossy(&out.stdout);
    assert!(vars.contains("__NV_PRIME_RENDER_OFFLOAD=1"), "{vars}");
    assert!(vars.contains("__GLX_VENDOR_LIBRARY_NAME=nvidia"), "{vars}");
    assert!(vars.contains("__VK_LAYER_NV_optimus=NVIDIA_only"), "{vars}");

    // Grants die with their process: nothing of this test's is left once
    // all exited. (This daemon's hooks also grant other tests' concurrent
    // `gpuctl run` launches, by their environment: those live in other
    // cgroups and are not this test's.)
    let st = env.json(&["status"]);
    let cg = env
        .cgroup
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let mine: Vec<&serde_json::Value> = st["grants"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| {
            std::fs::read_to_string(format!("/proc/{}/cgroup", g["pid"]))
                .is_ok_and(|c| c.contains(&cg))
        })
        .collect();
    assert!(mine.is_empty(), "{st}");
}

#[test]
#[ignore = "root"]
fn offload_environment_conventions_grant() {
    root_test!();
    let mut env = smart_env();
    let dgpu = node_arg(&env, 226, 129);
    let sh = ["/bin/sh", "-c", OPEN, dgpu.as_str()];
    assert_eq!(open_via(&env, &sh, &[("DRI_PRIME", "1")]), ENXIO);
    assert_eq!(
        open_via(&env, &sh, &[("DRI_PRIME", "pci-0000_01_00_0")]),
        ENXIO
    );
    assert_eq!(
        open_via(&env, &sh, &[("__NV_PRIME_RENDER_OFFLOAD", "1")]),
        ENXIO
    );
    assert_eq!(open_via(&env, &sh, &[("DRI_PRIME", "0")]), EPERM);
    assert_eq!(open_via(&env, &sh, &[("DRI_PRIME", "")]), EPERM);
    assert_eq!(
        open_via(&env, &sh, &[("__NV_PRIME_RENDER_OFFLOAD", "0")]),
        EPERM
    );
    assert_eq!(open_via(&env, &sh, &[("XDRI_PRIME", "1")]), EPERM);
    // A long environment before the variable is still scanned.
    let big = "x".repeat(10_000);
    assert_eq!(
        open_via(&env, &sh, &[("AAA_BIG", &big), ("DRI_PRIME", "1")]),
        ENXIO
    );

    // The setting turns it off.
    std::fs::write(env.dir.join("gpuctl.toml"), "env_grants = false\n").unwrap();
    env.stop();
    env.start();
    assert_eq!(env.json(&["get"])["mode"], "smart");
    assert_eq!(open_via(&env, &sh, &[("DRI_PRIME", "1")]), EPERM);
}

#[test]
#[ignore = "root"]
fn app_rules_grant_that_binary_only() {
    root_test!();
    let mut env = smart_env();
    let dgpu = node_arg(&env, 226, 0);
    // A private copy of the shell: its own inode, so the rule is its own.
    let mysh = env.dir.join("mysh");
    std::fs::copy("/bin/sh", &mysh).unwrap();
    let mysh = mysh.to_str().unwrap().to_string();

    assert_eq!(open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[]), EPERM);
    let out = env.gpuctl(&["app", "allow", &mysh]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[]), ENXIO);
    assert_eq!(open_via(&env, &["/bin/sh", "-c", OPEN, &dgpu], &[]), EPERM);
    let list = env.json(&["app", "list"]);
    assert_eq!(list["apps"][0]["path"], mysh.as_str());
    assert_eq!(list["apps"][0]["allow"], true);

    // Persisted: a restarted daemon re-installs it.
    env.stop();
    env.start();
    assert_eq!(open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[]), ENXIO);

    // A package upgrade renames a new file (a new inode) over it: the rule
    // follows the path, re-resolved from an inotify event.
    let staged = env.dir.join("mysh.dpkg-new");
    std::fs::copy("/bin/sh", &staged).unwrap();
    std::fs::rename(&staged, &mysh).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[]) != ENXIO {
        assert!(
            std::time::Instant::now() < deadline,
            "the replaced executable was not re-resolved"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // Deny overrides the environment convention.
    assert!(env.gpuctl(&["app", "deny", &mysh]).status.success());
    assert_eq!(
        open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[("DRI_PRIME", "1")]),
        EPERM
    );

    // Forget removes it.
    assert!(env.gpuctl(&["app", "forget", &mysh]).status.success());
    assert_eq!(open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[]), EPERM);
    assert_eq!(env.json(&["app", "list"])["apps"], serde_json::json!([]));

    // A FIFO cannot stall the daemon (a plain open would block forever).
    let fifo = env.dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid path; plain mkfifo(3).
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let out = env.gpuctl(&["app", "allow", fifo.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
    assert_eq!(env.json(&["get"])["mode"], "smart");

    // A #! script gets a note: exec runs its interpreter.
    let script = env.dir.join("launch.sh");
    std::fs::write(&script, "#!/bin/sh\nexec true\n").unwrap();
    let out = env.gpuctl(&["app", "allow", script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("interpreter (/bin/sh)"));
}

/// Issue 18 (F6): the packaged unit hides `/home` and `/tmp` from the
/// daemon (`ProtectHome=`, `PrivateTmp=`). `app allow` of a program there
/// passes the program as a descriptor; the rule holds across a restart
/// (by the identity saved with it) and `forget` removes it.
#[test]
#[ignore = "root"]
fn app_rules_for_programs_the_daemon_cannot_see() {
    root_test!();
    let mut env = smart_env();
    let home = env.dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mysh = home.join("mysh");
    std::fs::copy("/bin/sh", &mysh).unwrap();
    let mysh = mysh.to_str().unwrap().to_string();
    env.stop();
    env.hidden = vec![home.clone()];
    env.start();
    let dgpu = node_arg(&env, 226, 0);

    assert_eq!(open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[]), EPERM);
    let out = env.gpuctl(&["app", "allow", &mysh]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[]), ENXIO);
    let list = env.json(&["app", "list"]);
    assert_eq!(list["apps"][0]["path"], mysh.as_str());
    assert_eq!(list["apps"][0]["error"], serde_json::Value::Null);

    // A restarted daemon still cannot see it: the saved identity holds.
    env.stop();
    env.start();
    assert_eq!(open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[]), ENXIO);

    // Deny, then forget, work the same way.
    assert!(env.gpuctl(&["app", "deny", &mysh]).status.success());
    assert_eq!(
        open_via(&env, &[&mysh, "-c", OPEN, &dgpu], &[("DRI_PRIME", "1")]),
        EPERM
    );
    assert!(env.gpuctl(&["app", "forget", &mysh]).status.success());
    assert_eq!(env.json(&["app", "list"])["apps"], serde_json::json!([]));

    // A FIFO passed as the program is refused with a clear error.
    let fifo = home.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid path; plain mkfifo(3).
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let out = env.gpuctl(&["app", "allow", fifo.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
    env.stop();
}

#[test]
#[ignore = "root"]
fn run_outside_smart_mode() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();
    let dgpu = node_arg(&env, 226, 0);
    // Hybrid: nothing blocked, `run` only sets the environment.
    let cmd = [BIN, "run", "--", "/bin/sh", "-c", OPEN, &dgpu];
    assert_eq!(open_via(&env, &cmd, &[]), ENXIO);
    // Integrated: refused, and it says what to do.
    assert!(env.gpuctl(&["set", "integrated"]).status.success());
    let out = env.gpuctl(&["run", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpuctl set smart"));
    // Unknown GPU: usage error.
    let out = env.gpuctl(&["run", "--gpu", "9", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    // Leaving smart mode clears its grants and detaches its hooks.
    assert!(env.gpuctl(&["set", "smart"]).status.success());
    assert!(env.gpuctl(&["set", "hybrid"]).status.success());
    assert_eq!(env.json(&["status"])["smart_hooks"], false);
    env.stop();
}

#[test]
#[ignore = "root"]
fn events_stream_denials() {
    root_test!();
    let env = smart_env();
    let dgpu = node_arg(&env, 226, 129);
    let mut child = Command::new(BIN)
        .env("GPUCTL_SOCKET", env.socket())
        .args(["events", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the subscription is in place.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while env.json(&["status"])["events"] != true {
        assert!(std::time::Instant::now() < deadline, "no subscriber seen");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(open_via(&env, &["/bin/sh", "-c", OPEN, &dgpu], &[]), EPERM);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["event"], "denied");
    assert_eq!(v["node"], "226:129");
    assert_eq!(v["gpu"], 1);
    assert_eq!(v["comm"], "sh");
    let why = v["why"].as_str().unwrap_or_default();
    assert!(why.contains("GPU 1") && why.contains("no grant"), "{v}");
    assert!(v["via"].is_null(), "{v}");
}

/// The daemon does no work per process launch: its CPU time over 2 000
/// launches of `true` in smart mode (the hooks run in the kernel).
#[test]
#[ignore = "root"]
fn daemon_does_no_work_per_launch() {
    root_test!();
    let _quiet = crate::common::harness::machine_events();
    let env = smart_env();
    let pid = env.daemon.as_ref().unwrap().id();
    let cpu_ns = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
        s.split_whitespace().next().unwrap().parse().unwrap()
    };
    let before = cpu_ns(pid);
    for _ in 0..2000 {
        let st = Command::new("/bin/true").status().unwrap();
        assert!(st.success());
    }
    let after = cpu_ns(pid);
    let per_launch_ns = (after - before) as f64 / 2000.0;
    eprintln!(
        "daemon CPU per launch in smart mode: {per_launch_ns:.1} ns (anchor: 95 000 ns in its smart mode)"
    );
    // One userspace wake-up per launch would cost microseconds; the daemon
    // must not be woken at all.
    assert!(
        after - before < 2_000_000,
        "the daemon used {} ns of CPU for 2000 launches",
        after - before
    );
}

#[test]
#[ignore = "root"]
fn config_changes_apply_live_and_keep_comments() {
    root_test!();
    let env = smart_env();
    let dgpu = node_arg(&env, 226, 0);
    let sh = ["/bin/sh", "-c", OPEN, dgpu.as_str()];
    let cfg = env.dir.join("gpuctl.toml");
    std::fs::write(&cfg, "# site policy\nenv_grants = true\n").unwrap();
    assert_eq!(open_via(&env, &sh, &[("DRI_PRIME", "1")]), ENXIO);

    // Readable by anyone, changeable by root/the group only.
    let out = env.gpuctl_as(Some(65534), &["config", "env_grants"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "true");
    let out = env.gpuctl_as(Some(65534), &["config", "env_grants", "false"]);
    assert_eq!(out.status.code(), Some(5), "{}", describe(&out));

    let out = env.gpuctl(&["config", "env_grants", "false"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        open_via(&env, &sh, &[("DRI_PRIME", "1")]),
        EPERM,
        "applied without restart"
    );
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.starts_with("# site policy\n") && text.contains("env_grants = false"),
        "{text}"
    );

    let out = env.gpuctl(&["config", "bpf_log", "debug"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("restart"),
        "{}",
        describe(&out)
    );
    let out = env.gpuctl(&["config", "bpf_log", "loud"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let out = env.gpuctl(&["config", "colour", "red"]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let all = env.json(&["config"]);
    assert_eq!(all["config"]["env_grants"], false);
    assert_eq!(all["config"]["bpf_log"], "debug");
}

/// The grant map is bounded (max_grants). When it is full a new grant is
/// refused: the process is denied, nothing crashes, and status counts it.
#[test]
#[ignore = "root"]
fn full_grant_map_denies_and_counts() {
    root_test!();
    let mut env = Env::new(machine("intel_nvidia"));
    // env_grants off: other tests' concurrent `gpuctl run` launches carry
    // the offload environment, and this daemon's exec hook would take the
    // single slot for them.
    std::fs::write(
        env.dir.join("gpuctl.toml"),
        "max_grants = 1\nenv_grants = false\n",
    )
    .unwrap();
    env.start();
    assert!(env.gpuctl(&["set", "smart"]).status.success());
    let dgpu = node_arg(&env, 226, 0);

    // `gpuctl run` takes the only slot; the shell's forked subshell cannot
    // inherit the grant (map full), so its open is denied.
    let subshell = r#"(exec 3<>"$0")"#;
    let cmd = [BIN, "run", "--", "/bin/sh", "-c", subshell, &dgpu];
    assert_eq!(open_via(&env, &cmd, &[]), EPERM);
    let st = env.json(&["status"]);
    assert!(st["grants_refused_map_full"].as_u64().unwrap() >= 1, "{st}");

    // While one process holds the slot, the daemon refuses a second grant.
    let mut holder = Command::new(BIN)
        .env("GPUCTL_SOCKET", env.socket())
        .env("GPUCTL_SYSFS_ROOT", env.machine.sysfs())
        .args(["run", "--", "/bin/sleep", "10"])
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while env.json(&["status"])["grants"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(std::time::Instant::now() < deadline, "holder never granted");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = env.gpuctl(&["run", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_grants"));
    let _ = holder.kill();
    let _ = holder.wait();
    // The daemon is fine.
    assert_eq!(env.json(&["get"])["mode"], "smart");
}
