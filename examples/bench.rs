//! gpuctl benchmarks (ARCHITECTURE.md#test-tiers, #performance-budget): `make bench`, or
//!
//!     cargo build --example bench && target/debug/examples/bench PATH-TO-STATIC-GPUCTL
//!
//! Runs as root on this machine, against a fixture Intel+NVIDIA laptop (`intel_nvidia` of
//! tests/common/fixture.rs) and a bench-owned child cgroup that holds every measured
//! process, so nothing else on the machine is affected. Prints one table (figure | value |
//! budget | verdict) and the conditions it was measured under. A figure over budget is
//! reported, never fatal: the exit status is 0 unless something is actually broken (the
//! build of a harness, the daemon, a wrong open result), then 1; bad usage is 2; 130/143
//! after SIGINT/SIGTERM. docs/PERFORMANCE.md explains every figure and the method.
//!
//! The raw loops are the C harnesses in bench/ (openat, spawn, ready, bpfcal, client), built with
//! `$CC -O2` into the run's temp dir; this program orchestrates them, checks what every
//! open returned, and does the statistics.
//!
//! Knobs (environment): BENCH_ROUNDS (10) interleaved openat rounds, BENCH_ITER (100000)
//! openat calls per harness run, BENCH_LAUNCHES (2000) launches of `true` per mode, in
//! BENCH_LAUNCH_ROUNDS (40) rounds, BENCH_CTL_RUNS (50) runs per CLI command, BENCH_STARTS
//! (10) daemon starts, BENCH_CPU (the last CPU) the CPU measured processes run on,
//! BENCH_PM_READS (20000), BENCH_IDLE_S (30), CC (cc), BENCH_ALLOW_DRM (unset: refuse to
//! run where a DRM driver is loaded: its GPU nodes are 226:N too). The limits phase:
//! BENCH_UEVENTS (1000) unrelated uevents per sample, BENCH_BURST (100) PCI uevents per
//! burst, BENCH_PROCS (5000) extra processes, BENCH_LIMIT_ROUNDS (3), BENCH_BASELINE (unset;
//! a second gpuctl measured in the same interleaved rounds: before/after in one run),
//! BENCH_ONLY=limits (that phase alone). The boot phase: BENCH_BOOT_ROUNDS (5) interleaved
//! starts of the daemon and of bench/minload (the needed-only loader) per saved mode, and
//! BENCH_BUSY (the CPU count) busy loops for the start under load; BENCH_ONLY=boot (that
//! phase alone); BENCH_LIBBPF (the libbpf-sys build of `make static` under target/) the
//! directory with the libbpf.a and include/ bench/minload is linked with.

// Test and bench code: a failed step panics, which is how the harness reports it
// (the crate's unwrap/expect lints are for the shipped binary's runtime paths).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CString;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../tests/common/fixture.rs"]
#[allow(dead_code)]
mod fixture;

/// The C harnesses, next to this program in the source tree.
const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench");
const STATS_FILE: &str = "/proc/sys/kernel/bpf_stats_enabled";
const TARGETS: [&str; 4] = ["file", "null", "allowed", "blocked"];
const AB_REPS: usize = 3;
const STATS_LAUNCHES: u64 = 500;
const STATS_REPS: usize = 5;
/// Grants `status` lists at most (src/proto/data.rs `GRANTS_LISTED`).
const GRANTS_LISTED: u64 = 64;

/// What `status` cost in one state of the grant-map phase.
struct StatusCost {
    /// Median wall time of `gpuctl status --json`, and of `gpuctl get`
    /// (the control) alternated with it.
    wall: f64,
    get: f64,
    /// The daemon's CPU time per `status` (ns).
    cpu: f64,
    /// `status` requests timed.
    runs: u64,
    /// Runs of the grant map's walk meanwhile, and their ns (bpf_stats).
    walks: (u64, u64),
}

/// Why the run stopped early on a signal (exit status 128 + N).
#[derive(Debug)]
struct Interrupted(u8);
impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "interrupted")
    }
}
impl std::error::Error for Interrupted {}

/// Bad usage (exit status 2).
#[derive(Debug)]
struct Usage(String);
impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Usage {}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--fill") {
        return fill_grants(args.get(2).and_then(|n| n.parse().ok()).unwrap_or(0));
    }
    let mut bench = None;
    let r = run(&args, &mut bench);
    let code = match &r {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
            e.downcast_ref::<Interrupted>().map_or(1, |i| i.0)
        }
        Err(e) if e.downcast_ref::<Usage>().is_some() => {
            eprintln!("bench: {e}");
            2
        }
        Err(e) => {
            eprintln!("bench: {e:#}");
            if let Some(b) = &bench {
                b.log_tail();
            }
            1
        }
    };
    drop(bench); // the cleanup, on every path
    ExitCode::from(code)
}

/// `bench --fill N` (run under `gpuctl run` by the grant-map phase): forks N
/// children that inherit the grant and wait, says `ready`; for each line on
/// its stdin replaces its oldest child (kills and reaps it: the exit hook
/// removes its grant; forks another: the fork hook copies the grant into
/// the room that left) and says `ok`; when its stdin closes kills them (by
/// pid) and exits. (The oldest: the last ones forked into a full map hold
/// no grant, and replacing one of those would change nothing.)
fn fill_grants(n: usize) -> ExitCode {
    use std::io::{BufRead, Write};
    // A child that waits to be killed.
    fn waiter() -> Option<i32> {
        // SAFETY: fork(2); the child only calls pause(2) and _exit(2).
        match unsafe { libc::fork() } {
            0 => loop {
                // SAFETY: pause(2) has no preconditions.
                unsafe { libc::pause() };
            },
            pid if pid > 0 => Some(pid),
            _ => None,
        }
    }
    let mut kids = Vec::with_capacity(n);
    for _ in 0..n {
        match waiter() {
            Some(pid) => kids.push(pid),
            None => break,
        }
    }
    println!("ready {}", kids.len());
    for _ in io::stdin().lock().lines().map_while(Result::ok) {
        if !kids.is_empty() {
            let k = kids.remove(0);
            // SAFETY: kill(2) and waitpid(2) on our own child.
            unsafe {
                libc::kill(k, libc::SIGKILL);
                libc::waitpid(k, std::ptr::null_mut(), 0);
            }
        }
        kids.extend(waiter());
        println!("ok");
        let _ = io::stdout().flush();
    }
    for &k in &kids {
        // SAFETY: kill(2) and waitpid(2) on our own children.
        unsafe {
            libc::kill(k, libc::SIGKILL);
            libc::waitpid(k, std::ptr::null_mut(), 0);
        }
    }
    ExitCode::SUCCESS
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow!(Usage(msg.into()))
}

fn knob(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| usage(format!("{name}={v}: not a number"))),
    }
}

fn progress(msg: &str) {
    eprintln!("bench: {msg}");
}

// ---------------------------------------------------------------------------------------
// Statistics and formatting
// ---------------------------------------------------------------------------------------

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn median(v: &[f64]) -> f64 {
    let s = sorted(v);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// (median, min, max).
fn summ(v: &[f64]) -> (f64, f64, f64) {
    let s = sorted(v);
    match (s.first(), s.last()) {
        (Some(lo), Some(hi)) => (median(&s), *lo, *hi),
        _ => (f64::NAN, f64::NAN, f64::NAN),
    }
}

/// Rounds of (before, after) times: the median of the rounds' after ÷ before, and the cell
/// that shows it with the rounds' spread and the two medians.
fn before_after(v: &[(f64, f64)]) -> (f64, String) {
    let ratios: Vec<f64> = v.iter().map(|(e, f)| f / e).collect();
    let (m, lo, hi) = summ(&ratios);
    let e = median(&v.iter().map(|x| x.0).collect::<Vec<_>>());
    let f = median(&v.iter().map(|x| x.1).collect::<Vec<_>>());
    let cell = format!(
        "×{m:.2} (rounds ×{lo:.2}–×{hi:.2}; {} vs {})",
        fmt_ns(f),
        fmt_ns(e)
    );
    (m, cell)
}

fn min(v: &[f64]) -> f64 {
    summ(v).1
}

/// A duration for people.
fn fmt_ns(n: f64) -> String {
    if n < 10_000.0 {
        format!("{} ns", (n + 0.5).trunc() as i64)
    } else if n < 1_000_000.0 {
        format!("{:.1} µs", n / 1e3)
    } else {
        format!("{:.2} ms", n / 1e6)
    }
}

/// ok when VALUE < LIMIT, else MISS.
fn under(v: f64, limit: f64) -> String {
    if v < limit { "ok" } else { "MISS" }.into()
}

/// ok at or below LIMIT, MISS beyond LIMIT + RES, unresolved between.
fn within(limit: f64, r: f64, res: f64, res_pct: &str) -> String {
    if r <= limit {
        "ok".into()
    } else if r > limit + res {
        "MISS".into()
    } else {
        format!("unresolved (±{res_pct} %)")
    }
}

/// The value of KEY=value in a harness output line.
fn kv<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

fn kvf(line: &str, key: &str) -> Result<f64> {
    kv(line, key)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no number {key}= in the harness output {line:?}"))
}

/// Every value of KEY anywhere in a JSON document, in document order.
fn json_all<'a>(v: &'a Value, key: &str, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == key {
                    out.push(x);
                }
                json_all(x, key, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| json_all(x, key, out)),
        _ => {}
    }
}

/// Every JSON object anywhere in a document.
fn json_objects<'a>(v: &'a Value, out: &mut Vec<&'a serde_json::Map<String, Value>>) {
    match v {
        Value::Object(m) => {
            out.push(m);
            m.values().for_each(|x| json_objects(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| json_objects(x, out)),
        _ => {}
    }
}

fn read_trim(p: impl AsRef<Path>) -> Result<String> {
    let p = p.as_ref();
    Ok(fs::read_to_string(p)
        .with_context(|| format!("reading {}", p.display()))?
        .trim()
        .to_string())
}

/// The CPUs this process may run on (`nproc`).
fn nproc() -> usize {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            libc::CPU_COUNT(&set).max(1) as usize
        } else {
            1
        }
    }
}

/// `type -P NAME`.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

// ---------------------------------------------------------------------------------------
// The run: its set-up, and the cleanup that runs on every exit path (Drop)
// ---------------------------------------------------------------------------------------

struct Cfg {
    rounds: usize,
    iter: u64,
    launches: u64,
    lrounds: u64,
    ctl_runs: usize,
    starts: usize,
    cpu: usize,
    pm_reads: u64,
    idle_s: u64,
    nproc: usize,
    /// The binary measured (its size; the run itself uses a copy).
    bin_arg: PathBuf,
    /// The limits phase: unrelated uevents per sample, PCI uevents per
    /// burst, extra processes for `set integrated`, rounds.
    uevents: u64,
    burst: u64,
    procs: u64,
    limit_rounds: usize,
    /// A second gpuctl (e.g. main's `make static`) measured in the same
    /// rounds of the limits phase, interleaved: before/after in one run.
    baseline: Option<PathBuf>,
    /// The boot phase: rounds, busy loops for the start under load.
    boot_rounds: usize,
    busy: usize,
}

struct Daemon {
    ready: Child,
    pid: i32,
}

struct Bench {
    cfg: Cfg,
    work: PathBuf,
    bin: PathBuf,
    cg: PathBuf,
    cg_off: PathBuf,
    my_cg: PathBuf,
    daemon: Option<Daemon>,
    stats_orig: Option<String>,
    broken: Vec<String>,
    last_ready_ns: f64,
    true_bin: PathBuf,
    pad: String,
    sigint: Arc<AtomicBool>,
    sigterm: Arc<AtomicBool>,
    /// The fixture laptop (in the work dir, removed with it).
    machine: fixture::Machine,
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            // bench/ready forwards the signal to the daemon if it is not ready yet.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(d.pid),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = d.ready.wait();
        }
        if let Some(orig) = self.stats_orig.take() {
            let _ = fs::write(STATS_FILE, format!("{orig}\n"));
        }
        for cg in [&self.cg, &self.cg_off] {
            if !cg.is_dir() {
                continue;
            }
            if let Ok(procs) = fs::read_to_string(cg.join("cgroup.procs")) {
                for p in procs.lines() {
                    let _ = fs::write(self.my_cg.join("cgroup.procs"), p);
                }
            }
            for _ in 0..50 {
                if fs::remove_dir(cg).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if cg.is_dir() {
                eprintln!("bench: could not remove {}", cg.display());
            }
        }
        let _ = fs::remove_dir_all(&self.work);
    }
}

impl Bench {
    fn log_tail(&self) {
        let log = fs::read_to_string(self.work.join("daemon.log")).unwrap_or_default();
        if !log.is_empty() {
            eprintln!("--- daemon log (tail) ---");
            let lines: Vec<&str> = log.lines().collect();
            for l in &lines[lines.len().saturating_sub(20)..] {
                eprintln!("{l}");
            }
        }
    }

    fn broken(&mut self, msg: String) {
        eprintln!("bench: BROKEN: {msg}");
        self.broken.push(msg);
    }

    fn check_signals(&self) -> Result<()> {
        if self.sigint.load(Ordering::Relaxed) {
            bail!(Interrupted(130));
        }
        if self.sigterm.load(Ordering::Relaxed) {
            bail!(Interrupted(143));
        }
        Ok(())
    }

    /// A sleep that a signal cuts short.
    fn sleep(&self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        loop {
            self.check_signals()?;
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            std::thread::sleep((end - now).min(Duration::from_millis(50)));
        }
    }

    fn tool(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }

    /// A harness command that runs inside `cg` (the daemon's program governs it there).
    fn in_cg(&self, cg: &Path, prog: &Path) -> Result<Command> {
        let procs = CString::new(cg.join("cgroup.procs").as_os_str().as_bytes())?;
        let mut cmd = Command::new(prog);
        // SAFETY: between fork and exec the closure calls only async-signal-safe functions
        // (open, write, close) on memory prepared before the fork. Writing "0" to
        // cgroup.procs moves the writing process itself.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if n == 1 {
                    Ok(())
                } else {
                    Err(err)
                }
            });
        }
        Ok(cmd)
    }

    /// Measured processes get a fixed 2 KiB environment (what a desktop session typically
    /// passes; smart mode's exec hook scans it) and none of the offload variables that
    /// would grant them the dGPU in smart mode.
    fn clean_env<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/root")
            .env("LANG", "C.UTF-8")
            .env("BENCH_PAD", &self.pad)
    }

    /// Runs a harness; its one line of output (stderr passes through).
    fn harness(&self, mut cmd: Command, what: &str) -> Result<String> {
        let out = cmd
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("starting {what}"))?;
        self.check_signals()?;
        if !out.status.success() {
            bail!("{what} failed ({})", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The openat harness on PATH, in the bench cgroup, with the clean environment.
    fn openat(&self, path: &Path, n: u64, ab: bool) -> Result<String> {
        let mut cmd = self.in_cg(&self.cg, &self.tool("openat"))?;
        self.clean_env(&mut cmd)
            .arg(path)
            .arg(n.to_string())
            .arg(self.cfg.cpu.to_string());
        if ab {
            cmd.arg(&self.cg_off).arg(&self.cg);
        }
        let what = if ab {
            "the openat harness (A/B)"
        } else {
            "the openat harness"
        };
        self.harness(cmd, what)
    }

    /// N launches of `true` by the spawn harness, in the bench cgroup.
    fn launches(&self, n: u64) -> Result<String> {
        let mut cmd = self.in_cg(&self.cg, &self.tool("spawn"))?;
        self.clean_env(&mut cmd)
            .arg(n.to_string())
            .arg(self.cfg.cpu.to_string())
            .arg(&self.true_bin);
        self.harness(cmd, "bench/spawn")
    }

    /// gpuctl ARGS…: (success, exit code, stdout, stdout+stderr).
    fn gpuctl(&self, args: &[&str]) -> Result<(bool, Option<i32>, String, String)> {
        let out = Command::new(&self.bin)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running gpuctl {}", args.join(" ")))?;
        self.check_signals()?;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let both = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        Ok((out.status.success(), out.status.code(), stdout, both))
    }

    fn set_mode(&self, mode: &str) -> Result<()> {
        let (ok, _, _, out) = self.gpuctl(&["set", mode])?;
        if !ok {
            bail!("gpuctl set {mode} failed: {}", out.trim_end());
        }
        Ok(())
    }

    fn status(&self) -> Result<Value> {
        let (ok, _, out, _) = self.gpuctl(&["status", "--json"])?;
        if !ok {
            bail!("gpuctl status --json failed");
        }
        serde_json::from_str(&out).context("gpuctl status --json: not JSON")
    }

    fn attached(&self) -> Result<bool> {
        let s = self.status()?;
        let mut v = Vec::new();
        json_all(&s, "attached", &mut v);
        Ok(v.iter().any(|x| **x == Value::Bool(true)))
    }

    // -- the daemon, under bench/ready (our sd_notify supervisor) --

    fn daemon_start(&mut self) -> Result<()> {
        let report = self.work.join("ready.out");
        let _ = fs::remove_file(&report);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.work.join("daemon.log"))
            .context("opening the daemon log")?;
        let mut ready = Command::new(self.tool("ready"))
            .arg(self.work.join("notify.sock"))
            .arg(&report)
            .arg(&self.bin)
            .args(["daemon", "--backend", "cgroup", "--cgroup"])
            .arg(&self.cg)
            .stdin(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting bench/ready")?;
        let line = wait_report(&report, &mut ready, 2500, Duration::from_millis(10));
        let line = line.trim();
        let pid = kv(line, "pid").and_then(|p| p.parse().ok());
        let Some(pid) = pid else {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(ready.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = ready.wait();
            let line = if line.is_empty() { "no report" } else { line };
            bail!("the daemon did not become ready: {line}");
        };
        self.daemon = Some(Daemon { ready, pid });
        self.last_ready_ns = kvf(line, "ready_ns")?;
        Ok(())
    }

    fn daemon_stop(&mut self) -> Result<()> {
        let Some(mut d) = self.daemon.take() else {
            return Ok(());
        };
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(d.pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .context("stopping the daemon")?;
        let st = d.ready.wait().context("waiting for the daemon")?;
        if !st.success() {
            let rc = st.code().map_or(format!("{st}"), |c| c.to_string());
            self.broken(format!("the daemon exited with status {rc} after SIGTERM"));
        }
        Ok(())
    }

    fn daemon_pid(&self) -> Result<i32> {
        self.daemon
            .as_ref()
            .map(|d| d.pid)
            .context("the daemon is not running")
    }

    /// Sum of the daemon's CPU time (ns) over its threads: schedstat field 1.
    fn daemon_cpu_ns(&self) -> Result<u64> {
        let mut sum = 0;
        for t in fs::read_dir(format!("/proc/{}/task", self.daemon_pid()?))? {
            // A thread that just exited is skipped.
            let Ok(s) = fs::read_to_string(t?.path().join("schedstat")) else {
                continue;
            };
            sum += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
        Ok(sum)
    }

    /// Context switches (voluntary and not) of every daemon thread.
    fn daemon_ctxsw(&self) -> Result<u64> {
        let mut sum = 0;
        for t in fs::read_dir(format!("/proc/{}/task", self.daemon_pid()?))? {
            let Ok(s) = fs::read_to_string(t?.path().join("status")) else {
                continue;
            };
            for l in s.lines().filter(|l| l.contains("ctxt_switches")) {
                sum += l
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        Ok(sum)
    }

    fn daemon_rss_kib(&self) -> Result<f64> {
        let s = fs::read_to_string(format!("/proc/{}/status", self.daemon_pid()?))?;
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no VmRSS in the daemon's status")
    }

    /// The daemon's fdinfo files, as key → value maps.
    fn fdinfos(&self) -> Result<Vec<HashMap<String, String>>> {
        let mut out = Vec::new();
        for e in fs::read_dir(format!("/proc/{}/fdinfo", self.daemon_pid()?))? {
            let Ok(s) = fs::read_to_string(e?.path()) else {
                continue;
            };
            out.push(
                s.lines()
                    .filter_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        Some((k.trim().to_string(), v.trim().to_string()))
                    })
                    .collect(),
            );
        }
        Ok(out)
    }

    /// prog_id → (prog_type, run_time_ns, run_cnt) for every BPF program fd the daemon holds.
    fn prog_stats(&self) -> Result<HashMap<u32, (u32, u64, u64)>> {
        let mut out = HashMap::new();
        for f in self.fdinfos()? {
            let num = |k: &str| f.get(k).and_then(|v| v.parse::<u64>().ok());
            if let (Some(id), Some(rc)) = (num("prog_id"), num("run_cnt")) {
                let ty = num("prog_type").unwrap_or(0) as u32;
                out.insert(id as u32, (ty, num("run_time_ns").unwrap_or(0), rc));
            }
        }
        Ok(out)
    }

    /// (run_cnt, run_time_ns) of program `id` (`None`: (0, 0)).
    fn prog_run(&self, id: Option<u32>) -> Result<(u64, u64)> {
        let Some(id) = id else { return Ok((0, 0)) };
        Ok(self
            .prog_stats()?
            .get(&id)
            .map_or((0, 0), |&(_, ns, cnt)| (cnt, ns)))
    }

    /// Ids of the runtime-PM programs (attached in every mode; measured in f.).
    fn pm_prog_ids(&self) -> Result<BTreeSet<u32>> {
        let s = self.status()?;
        let mut v = Vec::new();
        json_all(&s, "prog_id", &mut v);
        Ok(v.iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect())
    }

    /// Ids of the blocking/smart programs behind the daemon's BPF links.
    fn attached_progs(&self) -> Result<BTreeSet<u32>> {
        let pm = self.pm_prog_ids()?;
        Ok(self
            .fdinfos()?
            .iter()
            .filter(|f| f.contains_key("link_type"))
            .filter_map(|f| f.get("prog_id")?.parse().ok())
            .filter(|id| !pm.contains(id))
            .collect())
    }

    /// (name, (run_cnt, run_time_ns)) of the runtime-PM programs (status --json), in the
    /// daemon's order.
    fn pm_stats(&self) -> Result<Vec<(String, (u64, u64))>> {
        let s = self.status()?;
        let mut objs = Vec::new();
        json_objects(&s, &mut objs);
        Ok(objs
            .iter()
            .filter_map(|o| {
                let name = o.get("name")?.as_str()?;
                name.starts_with("gpuctl_rpm_").then_some(())?;
                let c = o.get("run_cnt")?.as_u64()?;
                let t = o.get("run_time_ns")?.as_u64()?;
                Some((name.to_string(), (c, t)))
            })
            .collect())
    }
}

/// Every loaded BPF program's full name (from its BTF, as bpftool prints it; the kernel's
/// own name field stops at 15 characters).
fn prog_names() -> HashMap<u32, String> {
    use libbpf_rs::btf::{Btf, BtfType};
    use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
    let mut out = HashMap::new();
    for p in ProgInfoIter::with_query_opts(ProgInfoQueryOptions::default().include_func_info(true))
    {
        let short = p.name.to_string_lossy().to_string();
        let full = p.func_info.first().and_then(|fi| {
            let btf = Btf::from_prog_id(p.id).ok()?;
            let t: BtfType = btf.type_by_id(fi.type_id.into())?;
            Some(t.name()?.to_string_lossy().to_string())
        });
        out.insert(
            p.id,
            full.filter(|f| f.starts_with(&short)).unwrap_or(short),
        );
    }
    out
}

/// ID TYPE: the program's name and kind.
fn prog_label(names: &HashMap<u32, String>, id: u32, ty: u32) -> String {
    let t = match ty {
        15 => "cgroup/dev".to_string(),
        26 => "tracing".into(),
        29 => "lsm".into(),
        17 => "raw_tracepoint".into(),
        _ => format!("type {ty}"),
    };
    match names.get(&id).filter(|n| !n.is_empty()) {
        Some(n) => format!("{n} ({t})"),
        None => format!("prog {id} ({t})"),
    }
}

fn tname(t: &str) -> &'static str {
    match t {
        "file" => "regular file",
        "null" => "/dev/null",
        "allowed" => "allowed GPU node 226:1",
        _ => "blocked GPU node 226:0",
    }
}

/// CASE TARGET: what the open must return.
fn expected(case: &str, target: &str) -> &'static str {
    match target {
        "file" | "null" => "ok",
        "allowed" => "ENXIO",
        _ if case == "integrated" || case == "smart" => "EPERM",
        _ => "ENXIO",
    }
}

fn loadname(load: &str) -> String {
    match load {
        "launch" => "per launch of true".into(),
        t => format!("per open of {}", tname(t)),
    }
}

/// "integrated" for "integrated", "hybrid" for "hybrid2" (the A/A control's second case).
fn base_mode(m: &str) -> &str {
    m.strip_suffix('2').unwrap_or(m)
}

// ---------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------

struct OpenatRow {
    case: &'static str,
    target: &'static str,
    p50: f64,
    p99: f64,
}

struct AbRow {
    mode: &'static str,
    target: &'static str,
    off50: f64,
    on50: f64,
    off99: f64,
    on99: f64,
}

struct ProgRow {
    mode: &'static str,
    load: &'static str,
    name: String,
    dt: f64,
    dc: f64,
    ops: f64,
}

struct Table(Vec<[String; 4]>);
impl Table {
    fn row(&mut self, a: impl Into<String>, b: impl Into<String>, c: &str, d: impl Into<String>) {
        self.0.push([a.into(), b.into(), c.into(), d.into()]);
    }

    /// Markdown, column widths in characters (µ, ×, – and — are multi-byte).
    fn print(&self) {
        let head = ["figure", "value", "budget", "verdict"].map(String::from);
        let mut w = [0usize; 4];
        for r in std::iter::once(&head).chain(&self.0) {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |r: &[String; 4]| {
            let mut s = String::from("|");
            for (i, c) in r.iter().enumerate() {
                let _ = write!(s, " {c}{} |", " ".repeat(w[i] - c.chars().count()));
            }
            s
        };
        println!("{}", line(&head));
        println!("{}", line(&w.map(|n| "-".repeat(n))));
        for r in &self.0 {
            println!("{}", line(r));
        }
    }
}

/// Everything the phases measured, for the table.
#[derive(Default)]
struct Results {
    smart: bool,
    /// "n/a (why smart mode is not measured)".
    na_smart: String,
    backend: String,
    pin: String,
    clock_ns: String,
    cases: Vec<&'static str>,
    openat: Vec<OpenatRow>,
    ab: Vec<AbRow>,
    floor: f64,
    stats_modes: Vec<&'static str>,
    progs: Vec<ProgRow>,
    lmodes: Vec<&'static str>,
    per_round: u64,
    /// mode → (daemon CPU ns, launches)
    lcpu: HashMap<&'static str, (u64, u64)>,
    /// (mode, round, launches per second)
    launch: Vec<(&'static str, u64, f64)>,
    /// (median, best) wall times of the CLI commands
    set_int: (f64, f64),
    set_hyb: (f64, f64),
    set_int_daemon: f64,
    list: (f64, f64),
    get: (f64, f64),
    version_t: (f64, f64),
    ready: (f64, f64),
    rss_start: f64,
    rss_end: f64,
    size: u64,
    /// The PCI config file read in f., and (name, calls, ns) per runtime-PM program.
    pm_cfg: Option<PathBuf>,
    pm: Vec<(String, u64, u64)>,
    /// (context switches, CPU ns) of the idle daemon.
    idle: (u64, u64),
    /// The limits phase, per binary label ("this", "baseline"): (context
    /// switches, daemon CPU ns) per 1 000 unrelated uevents and per PCI
    /// burst, and (gpuctl get, C client) wall-time medians.
    uev: BTreeMap<String, Vec<(u64, u64)>>,
    burst: BTreeMap<String, Vec<(u64, u64)>>,
    get_c: BTreeMap<String, Vec<(f64, f64)>>,
    /// Start to READY=1 (saved mode integrated, ns) per binary label.
    ready_by: BTreeMap<String, Vec<f64>>,
    /// `set integrated` medians with no extra processes and with
    /// BENCH_PROCS of them, per round.
    set_procs: Vec<(f64, f64)>,
    /// `status --json` with an empty and a full grant map, per round, per binary.
    grant_status: BTreeMap<String, Vec<(f64, f64)>>,
    /// `status --json` with the empty map, and with the full one right after
    /// a change to it (one granted process replaced), per round, per binary.
    grant_changed: BTreeMap<String, Vec<(f64, f64)>>,
    /// The daemon's CPU time per `status` (ns): with the empty map, with
    /// [`GRANTS_LISTED`] grants, with the full map, and right after a
    /// change to it, per round, per binary.
    grant_cpu: BTreeMap<String, Vec<[f64; 4]>>,
    /// Runs of the walk (`gpuctl_grant_list`), their ns, and the `status`
    /// requests they served, summed over rounds, per binary, per state (as
    /// `grant_cpu`).
    grant_walks: BTreeMap<String, [(u64, u64, u64); 4]>,
    /// `status --json` with [`GRANTS_LISTED`] grants (all listed) and with
    /// the full map (the same ones listed), per round, per binary.
    grant_listed: BTreeMap<String, Vec<(f64, f64)>>,
    /// The kernel's verified instructions (fdinfo `verified_insns`) of the
    /// fork/exec/exit programs, per (binary, program).
    grant_insns: BTreeMap<(String, String), u64>,
    /// `get` (reads no grant) with an empty and a full map: the control.
    grant_get: BTreeMap<String, Vec<(f64, f64)>>,
    /// Grant entries when full, per binary.
    grant_fill: BTreeMap<String, u64>,
    /// (hook, launch kind) → ns per launch of the fork/exec/exit programs, per binary.
    grant_hooks: BTreeMap<(String, String, &'static str), Vec<f64>>,
    /// A PCI device's uevent file written for the burst; None: no PCI here.
    burst_dev: Option<PathBuf>,
    /// The boot phase: (case, binary label) → (daemon, needed-only loader)
    /// start to READY=1 per round, ns; or why bench/minload is missing.
    boot: BTreeMap<(String, String), Vec<(f64, f64)>>,
    boot_missing: Option<String>,
}

impl Results {
    /// Its smart-mode variant when this build has one.
    fn with_smart(&self, mut v: Vec<&'static str>) -> Vec<&'static str> {
        if self.smart {
            v.push("smart");
        }
        v
    }
}

fn run(args: &[String], slot: &mut Option<Bench>) -> Result<bool> {
    let [_, bin_arg] = args else {
        let me = args.first().map_or("bench", |s| s);
        return Err(usage(format!("usage: {me} PATH-TO-STATIC-GPUCTL")));
    };
    let bin_arg = Path::new(bin_arg);
    let exec = nix::unistd::access(bin_arg, nix::unistd::AccessFlags::X_OK).is_ok();
    if !bin_arg.is_file() || !exec {
        let shown = bin_arg.display();
        return Err(usage(format!("{shown} is not an executable file")));
    }
    if !nix::unistd::Uid::effective().is_root() {
        return Err(usage("needs root (BPF, cgroups, mknod, SCHED_FIFO)"));
    }
    // The harness opens 226:0 and 226:1 over a million times. Where a DRM driver is loaded
    // those are real GPU nodes, and opening them would wake a sleeping GPU.
    let devices = fs::read_to_string("/proc/devices").unwrap_or_default();
    let drm = devices
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("drm"));
    if drm && std::env::var_os("BENCH_ALLOW_DRM").is_none_or(|v| v.is_empty()) {
        return Err(usage(
            "a DRM driver is loaded here (major 226 in /proc/devices): the bench would open \
             this machine's real GPU nodes 226:0 and 226:1 over a million times. Run it where \
             no DRM driver is loaded (CI, a VM), or set BENCH_ALLOW_DRM=1 to do it anyway.",
        ));
    }
    let nproc = nproc();
    let cfg = Cfg {
        rounds: knob("BENCH_ROUNDS", 10)? as usize,
        iter: knob("BENCH_ITER", 100_000)?,
        launches: knob("BENCH_LAUNCHES", 2000)?,
        lrounds: knob("BENCH_LAUNCH_ROUNDS", 40)?.max(1),
        ctl_runs: knob("BENCH_CTL_RUNS", 50)? as usize,
        starts: knob("BENCH_STARTS", 10)? as usize,
        cpu: knob("BENCH_CPU", nproc as u64 - 1)? as usize,
        pm_reads: knob("BENCH_PM_READS", 20_000)?,
        idle_s: knob("BENCH_IDLE_S", 30)?,
        uevents: knob("BENCH_UEVENTS", 1000)?,
        burst: knob("BENCH_BURST", 100)?,
        procs: knob("BENCH_PROCS", 5000)?,
        limit_rounds: knob("BENCH_LIMIT_ROUNDS", 3)?.max(1) as usize,
        boot_rounds: knob("BENCH_BOOT_ROUNDS", 5)?.max(1) as usize,
        busy: knob("BENCH_BUSY", nproc as u64)? as usize,
        baseline: std::env::var_os("BENCH_BASELINE")
            .filter(|v| !v.is_empty())
            .map(|v| fs::canonicalize(&v))
            .transpose()
            .context("BENCH_BASELINE")?,
        nproc,
        bin_arg: fs::canonicalize(bin_arg)?,
    };
    let t_begin = Instant::now();
    let load0 = read_trim("/proc/loadavg")?
        .split(' ')
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");

    let b = Bench::setup(cfg, slot)?;
    let mut r = Results::default();
    // BENCH_ONLY=limits: the limits phase alone (e.g. for a before/after
    // with BENCH_BASELINE without the rest of the run).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let only_limits = only == "limits" || only == "grants" || only == "boot";
    if !only_limits {
        b.conditions(&mut r)?;
        b.openat_rounds(&mut r)?;
        b.openat_ab(&mut r)?;
        b.bpf_costs(&mut r)?;
        b.launch_rounds(&mut r)?;
        b.control_path(&mut r)?;
        b.startups(&mut r)?;
        b.pm_and_idle(&mut r)?;
    }
    if only != "grants" && only != "boot" {
        b.limits(&mut r)?;
    }
    if only != "boot" {
        b.grant_map(&mut r)?;
    }
    if only != "grants" {
        b.boot(&mut r)?;
    }

    let mut tab = Table(Vec::new());
    if !only_limits {
        r.openat_rows(&mut tab, &b.cfg);
        r.ab_rows(&mut tab);
        r.bpf_rows(&mut tab);
        r.launch_rows(&mut tab);
        r.control_rows(&mut tab, &b.cfg);
    }
    if only != "grants" && only != "boot" {
        r.limit_rows(&mut tab, &b.cfg);
    }
    if only != "boot" {
        r.grant_rows(&mut tab);
    }
    if only != "grants" {
        r.boot_rows(&mut tab);
    }
    tab.print();
    if !only_limits {
        b.print_conditions(&r, &load0, t_begin)?;
    }

    if !b.broken.is_empty() {
        println!();
        println!("BROKEN (the figures above are not trustworthy):");
        for m in &b.broken {
            println!("  - {m}");
        }
        return Ok(false);
    }
    Ok(true)
}

// ---------------------------------------------------------------------------------------
// The phases
// ---------------------------------------------------------------------------------------

impl Bench {
    /// The work dir, the two cgroups, the harnesses, the fixture laptop and its device
    /// nodes, and the environment every gpuctl process of the run gets.
    fn setup(cfg: Cfg, slot: &mut Option<Bench>) -> Result<&mut Bench> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
        let cg2 = mountinfo
            .lines()
            .find(|l| l.contains(" - cgroup2 "))
            .and_then(|l| l.split(' ').nth(4))
            .context("no cgroup-v2 hierarchy is mounted")?;
        let own = fs::read_to_string("/proc/self/cgroup")?;
        let own = own
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .context("no cgroup-v2 line in /proc/self/cgroup")?;
        let pid = std::process::id();
        let sigint = Arc::new(AtomicBool::new(false));
        let sigterm = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGINT, sigint.clone())?;
        signal_hook::flag::register(signal_hook::consts::SIGTERM, sigterm.clone())?;
        let mktemp = Command::new("mktemp")
            .args(["-d", "/tmp/gpuctl-bench.XXXXXX"])
            .output()
            .context("mktemp")?;
        let work = PathBuf::from(String::from_utf8(mktemp.stdout)?.trim());
        if !mktemp.status.success() || !work.is_dir() {
            bail!("mktemp -d failed");
        }
        // The fixture laptop: the dGPU's card0 (226:0) is blocked in integrated (and
        // smart), the iGPU's card1 (226:1) never.
        std::env::set_var("GPUCTL_FIXTURE_DIR", &work);
        let b = slot.insert(Bench {
            bin: work.join("gpuctl"),
            cg: PathBuf::from(format!("{cg2}/gpuctl-bench-{pid}")),
            // A sibling with nothing attached: the "off" arm of the in-process A/B figure.
            cg_off: PathBuf::from(format!("{cg2}/gpuctl-bench-{pid}-off")),
            // Our own cgroup: where a straggler goes back to before the bench cgroup is
            // removed.
            my_cg: PathBuf::from(format!("{cg2}{own}")),
            machine: fixture::machine("intel_nvidia"),
            work,
            cfg,
            daemon: None,
            stats_orig: None,
            broken: Vec::new(),
            last_ready_ns: f64::NAN,
            true_bin: which("true").context("no `true` in PATH")?,
            pad: "x".repeat(1900),
            sigint,
            sigterm,
        });
        fs::create_dir(&b.cg).with_context(|| format!("creating {}", b.cg.display()))?;
        fs::create_dir(&b.cg_off).with_context(|| format!("creating {}", b.cg_off.display()))?;
        // One binary for the whole run, even if a build replaces the original meanwhile.
        fs::copy(&b.cfg.bin_arg, &b.bin).context("copying the gpuctl binary")?;
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        for tool in ["openat", "spawn", "ready", "bpfcal", "client"] {
            // The C client is built as gpuctl is (static PIE): the two then
            // differ only in what they do after exec.
            let link: &[&str] = if tool == "client" {
                &["-static-pie"]
            } else {
                &[]
            };
            let st = Command::new(&cc)
                .args(["-O2", "-Wall"])
                .args(link)
                .arg("-o")
                .arg(b.tool(tool))
                .arg(format!("{SRC}/{tool}.c"))
                .status()
                .with_context(|| format!("running {cc}"))?;
            if !st.success() {
                bail!("building bench/{tool}.c failed");
            }
        }
        for d in ["dev", "state"] {
            fs::create_dir_all(b.work.join(d))?;
        }
        for (name, minor) in [("card0", 0), ("card1", 1)] {
            nix::sys::stat::mknod(
                &b.work.join("dev").join(name),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(226, minor),
            )
            .with_context(|| format!("mknod {name}"))?;
        }
        fs::write(b.work.join("file"), "gpuctl bench\n")?;
        std::env::set_var("GPUCTL_SOCKET", b.work.join("gpuctl.sock"));
        std::env::set_var("GPUCTL_SYSFS_ROOT", b.machine.sysfs());
        std::env::set_var("GPUCTL_PROCFS_ROOT", b.machine.procfs());
        std::env::set_var("GPUCTL_STATE_DIR", b.work.join("state"));
        std::env::set_var("GPUCTL_CONFIG", b.work.join("gpuctl.toml")); // absent: the defaults
        std::env::remove_var("NOTIFY_SOCKET");
        Ok(b)
    }

    fn tpath(&self, target: &str) -> PathBuf {
        match target {
            "file" => self.work.join("file"),
            "null" => "/dev/null".into(),
            "allowed" => self.work.join("dev/card1"),
            _ => self.work.join("dev/card0"),
        }
    }

    fn ensure_daemon(&mut self) -> Result<()> {
        if self.daemon.is_none() {
            self.daemon_start()?;
        }
        Ok(())
    }

    fn stats_on(&mut self) -> Result<()> {
        self.stats_orig = Some(read_trim(STATS_FILE)?);
        fs::write(STATS_FILE, "1\n").context("enabling kernel.bpf_stats_enabled")
    }

    fn stats_restore(&mut self) -> Result<()> {
        match self.stats_orig.take() {
            Some(orig) => fs::write(STATS_FILE, format!("{orig}\n"))
                .context("restoring kernel.bpf_stats_enabled"),
            None => Ok(()),
        }
    }

    /// Conditions, and which modes this build has.
    fn conditions(&mut self, r: &mut Results) -> Result<()> {
        progress("conditions");
        self.daemon_start()?;
        self.set_mode("hybrid")?;
        let mut v = Vec::new();
        let status = self.status()?;
        json_all(&status, "backend", &mut v);
        r.backend = v
            .iter()
            .find_map(|x| x.as_str())
            .unwrap_or("unknown")
            .into();
        let mut why = "smart mode not in this build".to_string();
        let (ok, rc, _, out) = self.gpuctl(&["set", "smart"])?;
        if ok {
            r.smart = true;
            self.set_mode("hybrid")?;
        } else if rc != Some(2) {
            // 2 = bad usage (an unknown mode); anything else is a real refusal.
            why = format!("gpuctl set smart: {}", out.trim_end().replace('\n', " "));
        }
        r.na_smart = format!("n/a ({why})");
        self.daemon_stop()?;

        let probe = self.openat(&self.tpath("file"), 1000, false)?;
        let fifo = if kv(&probe, "fifo") == Some("1") {
            "99"
        } else {
            "refused"
        };
        let mlock = if kv(&probe, "mlock") == Some("1") {
            "yes"
        } else {
            "no"
        };
        let (cpu, nproc) = (self.cfg.cpu, self.cfg.nproc);
        r.pin = format!("CPU {cpu} of {nproc}, SCHED_FIFO {fifo}, samples mlock'ed: {mlock}");
        r.clock_ns = kv(&probe, "clock_p50_ns").unwrap_or("?").into();
        Ok(())
    }

    /// a. openat overhead: cases interleaved in rounds, rotated each round. none2 is a
    /// second no-gpuctl case in every round (an A/A control): how far two identical cases
    /// land apart is the resolution of this run.
    fn openat_rounds(&mut self, r: &mut Results) -> Result<()> {
        r.cases = r.with_smart(vec!["none", "hybrid", "none2", "integrated"]);
        let rounds = self.cfg.rounds;
        for round in 0..rounds {
            progress(&format!("openat round {}/{rounds}", round + 1));
            for i in 0..r.cases.len() {
                let c = r.cases[(i + round) % r.cases.len()];
                self.enter_case(c)?;
                for t in TARGETS {
                    let line = self.openat(&self.tpath(t), self.cfg.iter, false)?;
                    let (res, want) = (kv(&line, "result").unwrap_or(""), expected(c, t));
                    if res != want {
                        let t = tname(t);
                        self.broken(format!(
                            "openat {t} with gpuctl {c} returned {res}, expected {want}"
                        ));
                    }
                    let (p50, p99) = (kvf(&line, "p50_ns")?, kvf(&line, "p99_ns")?);
                    r.openat.push(OpenatRow {
                        case: c,
                        target: t,
                        p50,
                        p99,
                    });
                }
            }
        }
        Ok(())
    }

    fn enter_case(&mut self, c: &str) -> Result<()> {
        if c.starts_with("none") {
            return self.daemon_stop();
        }
        self.ensure_daemon()?;
        self.set_mode(c)?;
        let want = c != "hybrid";
        let a = self.attached()?;
        if a != want {
            self.broken(format!(
                "mode {c}: status says attached={a}, expected {want}"
            ));
        }
        // And from the kernel's side: the daemon holds no BPF link in hybrid.
        if c == "hybrid" {
            let ids = self.attached_progs()?;
            if !ids.is_empty() {
                let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
                let ids = ids.join(" ");
                self.broken(format!(
                    "mode hybrid: the daemon holds a BPF link (program ids {ids})"
                ));
            }
        }
        Ok(())
    }

    /// a'. The same harness in A/B mode: one process hopping every 500 calls between the
    /// bench cgroup (the daemon's program attached) and a sibling with nothing attached, so
    /// both arms share every moment of the run. Its resolution does not depend on what the
    /// rest of the machine does; hybrid is its A/A control.
    fn openat_ab(&mut self, r: &mut Results) -> Result<()> {
        self.ensure_daemon()?;
        for m in r.with_smart(vec!["hybrid", "integrated"]) {
            progress(&format!("openat A/B in one process, {m}"));
            self.set_mode(m)?;
            for t in TARGETS {
                for _ in 0..AB_REPS {
                    let line = self.openat(&self.tpath(t), self.cfg.iter, true)?;
                    for (arm, case) in [("off", "none"), ("on", m)] {
                        let want = expected(case, t);
                        let res = kv(&line, &format!("{arm}_result")).unwrap_or("");
                        if res != want {
                            let t = tname(t);
                            self.broken(format!(
                                "A/B openat {t}, {m}, {arm} arm returned {res}, expected {want}"
                            ));
                        }
                    }
                    let f = |k: &str| kvf(&line, k);
                    r.ab.push(AbRow {
                        mode: m,
                        target: t,
                        off50: f("off_p50_ns")?,
                        on50: f("on_p50_ns")?,
                        off99: f("off_p99_ns")?,
                        on99: f("on_p99_ns")?,
                    });
                }
            }
        }
        Ok(())
    }

    /// b. per-program cost: bpf_stats_enabled, run_time_ns / run_cnt from fdinfo.
    fn bpf_costs(&mut self, r: &mut Results) -> Result<()> {
        self.stats_on()?;
        self.ensure_daemon()?;
        self.set_mode("hybrid")?;
        progress("per-program cost: the floor (an empty program)");
        let mut floor = Vec::new();
        for _ in 0..3 {
            let mut cmd = self.in_cg(&self.cg, &self.tool("bpfcal"))?;
            cmd.arg(&self.cg)
                .arg("/dev/null")
                .arg(self.cfg.iter.to_string())
                .arg(self.cfg.cpu.to_string());
            let line = self.harness(cmd, "bench/bpfcal")?;
            floor.push(kvf(&line, "ns_per_run")?);
        }
        r.floor = min(&floor);

        r.stats_modes = r.with_smart(vec!["integrated"]);
        let stats_iter = self.cfg.iter / 2;
        for &m in &r.stats_modes {
            progress(&format!("per-program cost, {m}"));
            self.set_mode(m)?;
            let ids = self.attached_progs()?;
            if ids.is_empty() {
                self.broken(format!("mode {m}: no BPF program attached"));
            }
            let names = prog_names();
            for load in TARGETS.into_iter().chain(["launch"]) {
                for _ in 0..STATS_REPS {
                    let before = self.prog_stats()?;
                    let ops = if load == "launch" {
                        self.launches(STATS_LAUNCHES)?;
                        STATS_LAUNCHES
                    } else {
                        self.openat(&self.tpath(load), stats_iter, false)?;
                        stats_iter
                    };
                    let after = self.prog_stats()?;
                    for (id, (ty, rt, rc)) in after.into_iter().filter(|p| ids.contains(&p.0)) {
                        let (_, rt0, rc0) = before.get(&id).copied().unwrap_or((ty, 0, 0));
                        r.progs.push(ProgRow {
                            mode: m,
                            load,
                            name: prog_label(&names, id, ty),
                            dt: rt.saturating_sub(rt0) as f64,
                            dc: rc.saturating_sub(rc0) as f64,
                            ops: ops as f64,
                        });
                    }
                }
            }
        }
        self.stats_restore()
    }

    /// c + d. daemon CPU per launch and launch rate: modes interleaved in rounds. hybrid2
    /// is hybrid again, the A/A control of the launch rate.
    fn launch_rounds(&mut self, r: &mut Results) -> Result<()> {
        r.lmodes = r.with_smart(vec!["hybrid", "integrated", "hybrid2"]);
        let lrounds = self.cfg.lrounds;
        r.per_round = self.cfg.launches / lrounds;
        for round in 0..lrounds {
            if round % 10 == 0 {
                progress(&format!("launches round {}/{lrounds}", round + 1));
            }
            for i in 0..r.lmodes.len() {
                let m = r.lmodes[(i + round as usize) % r.lmodes.len()];
                self.set_mode(base_mode(m))?;
                // Let the daemon finish with the client (close, log) first, and after the
                // batch with anything the launches queued for it.
                self.sleep(Duration::from_millis(30))?;
                let c0 = self.daemon_cpu_ns()?;
                let line = self.launches(r.per_round)?;
                self.sleep(Duration::from_millis(30))?;
                let c1 = self.daemon_cpu_ns()?;
                if kv(&line, "fails") != Some("0") {
                    let t = self.true_bin.display();
                    self.broken(format!("launching {t} failed in mode {m}"));
                }
                let e = r.lcpu.entry(m).or_default();
                *e = (e.0 + c1.saturating_sub(c0), e.1 + r.per_round);
                // The batch's rate from its median launch (one slow launch does not move it).
                r.launch.push((m, round, 1e9 / kvf(&line, "p50_ns")?));
            }
        }
        Ok(())
    }

    /// N runs of gpuctl ARGS, one at a time: (median, best) wall time.
    fn ctl_time(&mut self, n: usize, args: &[&str]) -> Result<(f64, f64)> {
        let mut cmd = Command::new(self.tool("spawn"));
        cmd.arg(n.to_string()).arg("-1").arg(&self.bin).args(args);
        let line = self.harness(cmd, "bench/spawn")?;
        if kv(&line, "fails") != Some("0") {
            let st = kv(&line, "first_fail").unwrap_or("?");
            let cmd = format!("{} {}", self.bin.display(), args.join(" "));
            self.broken(format!("{cmd} failed (status {st})"));
        }
        Ok((kvf(&line, "p50_ns")?, kvf(&line, "min_ns")?))
    }

    /// e. the control path and memory.
    fn control_path(&mut self, r: &mut Results) -> Result<()> {
        progress("control path");
        self.set_mode("hybrid")?;
        let log_path = self.work.join("daemon.log");
        let log_mark = fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .count();
        let (mut set_int, mut set_hyb) = (Vec::new(), Vec::new());
        for _ in 0..self.cfg.ctl_runs {
            set_int.push(self.ctl_time(1, &["set", "integrated"])?);
            set_hyb.push(self.ctl_time(1, &["set", "hybrid"])?);
        }
        let p50s = |v: &[(f64, f64)]| {
            let (p50, best, _) = summ(&v.iter().map(|x| x.0).collect::<Vec<_>>());
            (p50, best)
        };
        (r.set_int, r.set_hyb) = (p50s(&set_int), p50s(&set_hyb));
        // The daemon's own time for those requests, when its log says (`… in 1.234ms`).
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        let times: Vec<f64> = log
            .lines()
            .skip(log_mark)
            .filter(|l| l.contains("mode: \"integrated\""))
            .filter_map(|l| parse_duration_ns(l.rsplit_once(" in ")?.1))
            .collect();
        r.set_int_daemon = median(&times);
        self.set_mode("integrated")?;
        let n = self.cfg.ctl_runs;
        r.list = self.ctl_time(n, &["list", "--json"])?;
        r.get = self.ctl_time(n, &["get"])?;
        r.version_t = self.ctl_time(n, &["--version"])?;
        r.rss_end = self.daemon_rss_kib()?;
        self.daemon_stop()
    }

    /// e'. start-up: the saved mode is integrated, so every start loads, fills the map and
    /// attaches before READY=1. And the binary's size.
    fn startups(&mut self, r: &mut Results) -> Result<()> {
        progress("daemon start-up");
        let mut ready_ns = Vec::new();
        r.rss_start = f64::NAN;
        for i in 0..self.cfg.starts {
            self.daemon_start()?;
            ready_ns.push(self.last_ready_ns);
            if i == 0 {
                r.rss_start = self.daemon_rss_kib()?;
            }
            if !self.attached()? {
                self.broken("after a start with saved mode integrated nothing is attached".into());
            }
            self.daemon_stop()?;
        }
        let (ready, best, _) = summ(&ready_ns);
        r.ready = (ready, best);
        r.size = fs::metadata(&self.cfg.bin_arg)?.len();
        Ok(())
    }

    /// The binaries a before/after phase measures: this one (also returned
    /// alone), and with BENCH_BASELINE a copy of that one in the run's dir.
    fn measured_bins(&self) -> Result<(PathBuf, Vec<(String, PathBuf)>)> {
        let this = self.bin.clone();
        let mut bins = vec![("this".to_string(), this.clone())];
        if let Some(b) = &self.cfg.baseline {
            let copy = self.work.join("gpuctl-baseline");
            fs::copy(b, &copy).context("copying the baseline binary")?;
            bins.push(("baseline".to_string(), copy));
        }
        Ok((this, bins))
    }

    /// g. the limits (issue 21), each figure beside what it is measured
    /// against, in interleaved rounds; with BENCH_BASELINE, the same rounds
    /// also run that binary's daemon and CLI (before/after in one run).
    fn limits(&mut self, r: &mut Results) -> Result<()> {
        progress("limits: uevents, get vs a C client, set integrated with extra processes");
        let (this, bins) = self.measured_bins()?;
        // A real PCI device's uevent file: `change` on it is a real kernel
        // pci uevent (the daemon re-reads the fixture's GPUs for it).
        r.burst_dev = fs::read_dir("/sys/bus/pci/devices")
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.path().join("uevent"));
        let null = Path::new("/sys/class/mem/null/uevent");
        let sock = self.work.join("gpuctl.sock");
        let line = r#"{"type":"get","proto":1}"#;
        let n = self.cfg.ctl_runs;
        for _ in 0..self.cfg.limit_rounds {
            for (label, bin) in &bins {
                self.bin = bin.clone();
                self.set_saved_integrated()?;
                self.daemon_start()?;
                r.ready_by
                    .entry(label.clone())
                    .or_default()
                    .push(self.last_ready_ns);
                self.set_mode("integrated")?;
                self.sleep(Duration::from_millis(100))?;
                let (cs0, cpu0) = (self.daemon_ctxsw()?, self.daemon_cpu_ns()?);
                for _ in 0..self.cfg.uevents {
                    fs::write(null, "change").context("writing /sys/class/mem/null/uevent")?;
                    // Paced: an unfiltered daemon wakes for each one.
                    std::thread::sleep(Duration::from_micros(100));
                }
                self.sleep(Duration::from_millis(200))?;
                let (cs1, cpu1) = (self.daemon_ctxsw()?, self.daemon_cpu_ns()?);
                let scale = |v: u64| v * 1000 / self.cfg.uevents.max(1);
                r.uev
                    .entry(label.clone())
                    .or_default()
                    .push((scale(cs1 - cs0), scale(cpu1 - cpu0)));
                if let Some(dev) = &r.burst_dev {
                    for _ in 0..self.cfg.burst {
                        fs::write(dev, "change")
                            .with_context(|| format!("writing {}", dev.display()))?;
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    self.sleep(Duration::from_millis(300))?;
                    let (cs2, cpu2) = (self.daemon_ctxsw()?, self.daemon_cpu_ns()?);
                    r.burst
                        .entry(label.clone())
                        .or_default()
                        .push((cs2 - cs1, cpu2 - cpu1));
                }
                // Alternated in chunks of 5 (noise hits both alike); the
                // ratio of the two medians is this round's figure.
                let (mut gets, mut cs) = (Vec::new(), Vec::new());
                for _ in 0..n.div_ceil(5) {
                    gets.push(self.ctl_time(5, &["get"])?.0);
                    let mut cmd = Command::new(self.tool("spawn"));
                    cmd.arg("5")
                        .arg("-1")
                        .arg(self.tool("client"))
                        .arg(&sock)
                        .arg(line);
                    let out = self.harness(cmd, "bench/spawn of bench/client")?;
                    if kv(&out, "fails") != Some("0") {
                        self.broken(format!("bench/client failed: {out}"));
                    }
                    cs.push(kvf(&out, "p50_ns")?);
                }
                r.get_c
                    .entry(label.clone())
                    .or_default()
                    .push((median(&gets), median(&cs)));
                self.daemon_stop()?;
            }
        }
        self.bin = this;
        // `set integrated` scans every process's descriptors for holders
        // of the dGPU: with none but the fixture's and with BENCH_PROCS more
        // (each with stdin/out/err and a file open, as a desktop's are).
        self.daemon_start()?;
        let procfs = self.machine.procfs().to_path_buf();
        let nprocs = self.cfg.procs;
        let fill = |on: bool| -> Result<()> {
            for i in 0..nprocs {
                let dir = procfs.join((200_000 + i).to_string());
                if !on {
                    let _ = fs::remove_dir_all(&dir);
                    continue;
                }
                fs::create_dir_all(dir.join("fd"))?;
                fs::write(dir.join("comm"), "filler\n")?;
                for (fd, target) in [
                    ("0", "/dev/null"),
                    ("1", "/dev/null"),
                    ("2", "/dev/null"),
                    ("3", "/etc/hostname"),
                ] {
                    std::os::unix::fs::symlink(target, dir.join("fd").join(fd))?;
                }
            }
            Ok(())
        };
        let set_int = |b: &mut Bench| -> Result<f64> {
            let mut v = Vec::new();
            for _ in 0..10 {
                b.set_mode("hybrid")?;
                v.push(b.ctl_time(1, &["set", "integrated"])?.0);
            }
            Ok(median(&v))
        };
        for _ in 0..self.cfg.limit_rounds {
            let empty = set_int(self)?;
            fill(true).context("filling the fixture's procfs")?;
            let full = set_int(self);
            fill(false)?;
            r.set_procs.push((empty, full?));
        }
        self.daemon_stop()
    }

    /// h. the grant map (issues 18 and 21): `status --json` with an empty map
    /// and with a full one (root's `gpuctl run` of `bench --fill`: root's
    /// grants are not limited per uid), side by side in rounds, and the
    /// fork/exec/exit programs' cost per launch (bpf_stats) of a plain
    /// launch and of a launch from a granted parent (its fork copies the
    /// grant, its exit removes it). With BENCH_BASELINE, both binaries.
    fn grant_map(&mut self, r: &mut Results) -> Result<()> {
        progress("grant map: status with an empty and a full map, hook costs");
        let (this, bins) = self.measured_bins()?;
        let me = std::env::current_exe().context("the bench's own path")?;
        let fill_n = knob("BENCH_GRANTS", 8192)?;
        // (status, get) medians, alternated in chunks of 5, the daemon's
        // CPU time per `status` (schedstat: what the request path costs it,
        // whoever else wants the CPUs meanwhile), and the runs of the walk
        // (`gpuctl_grant_list`, bpf_stats: count and ns) those made.
        let status_t = |b: &mut Bench, walk: Option<u32>| -> Result<StatusCost> {
            let (mut v, mut g, mut cpu) = (Vec::new(), Vec::new(), 0);
            let w0 = b.prog_run(walk)?;
            for _ in 0..4 {
                let c0 = b.daemon_cpu_ns()?;
                v.push(b.ctl_time(5, &["status", "--json"])?.0);
                cpu += b.daemon_cpu_ns()?.saturating_sub(c0);
                g.push(b.ctl_time(5, &["get"])?.0);
            }
            let w1 = b.prog_run(walk)?;
            Ok(StatusCost {
                wall: median(&v),
                get: median(&g),
                cpu: cpu as f64 / 20.0,
                runs: 20,
                walks: (w1.0 - w0.0, w1.1 - w0.1),
            })
        };
        self.stats_on()?;
        for _ in 0..self.cfg.limit_rounds {
            for (label, bin) in &bins {
                self.bin = bin.clone();
                self.daemon_start()?;
                self.set_mode("smart")?;
                self.sleep(Duration::from_millis(100))?;
                let names = prog_names();
                let ids = self.attached_progs()?;
                for f in self.fdinfos()? {
                    let num = |k: &str| f.get(k).and_then(|v| v.parse::<u64>().ok());
                    let (Some(id), Some(insns)) = (num("prog_id"), num("verified_insns")) else {
                        continue;
                    };
                    let id = id as u32;
                    let ty = num("prog_type").unwrap_or(0) as u32;
                    let name = prog_label(&names, id, ty);
                    if ids.contains(&id)
                        && ["fork", "exec", "exit"].iter().any(|h| name.contains(h))
                    {
                        r.grant_insns.insert((label.clone(), name), insns);
                    }
                }
                for kind in ["plain", "granted"] {
                    let before = self.prog_stats()?;
                    if kind == "plain" {
                        self.launches(STATS_LAUNCHES)?;
                    } else {
                        // Not clean_env: the CLI needs the fixture's sysfs to find the GPU.
                        let mut cmd = self.in_cg(&self.cg, &self.bin)?;
                        cmd.arg("run")
                            .arg("--")
                            .arg(self.tool("spawn"))
                            .arg(STATS_LAUNCHES.to_string())
                            .arg(self.cfg.cpu.to_string())
                            .arg(&self.true_bin);
                        self.harness(cmd, "gpuctl run -- bench/spawn")?;
                    }
                    let after = self.prog_stats()?;
                    for (id, (ty, rt, _)) in after.into_iter().filter(|p| ids.contains(&p.0)) {
                        let name = prog_label(&names, id, ty);
                        if !["fork", "exec", "exit"].iter().any(|h| name.contains(h)) {
                            continue;
                        }
                        let rt0 = before.get(&id).map_or(0, |b| b.1);
                        r.grant_hooks
                            .entry((label.clone(), name, kind))
                            .or_default()
                            .push(rt.saturating_sub(rt0) as f64 / STATS_LAUNCHES as f64);
                    }
                }
                // The walk's program (loaded by now: the daemon loads the
                // rest of the object after READY=1).
                let walk = {
                    let names = prog_names();
                    self.prog_stats()?
                        .into_keys()
                        .find(|id| names.get(id).is_some_and(|n| n.contains("grant_list")))
                };
                let empty = status_t(self, walk)?;
                // `gpuctl run -- bench --fill N`, once it said `ready`.
                let fill = |b: &Bench, n: u64| -> Result<(Child, String)> {
                    let mut filler = Command::new(&b.bin)
                        .arg("run")
                        .arg("--")
                        .arg(&me)
                        .arg("--fill")
                        .arg(n.to_string())
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .spawn()
                        .context("starting gpuctl run -- bench --fill")?;
                    let mut line = String::new();
                    if let Some(out) = filler.stdout.as_mut() {
                        let mut one = [0u8; 1];
                        while out.read(&mut one).unwrap_or(0) == 1 && one[0] != b'\n' {
                            line.push(one[0] as char);
                        }
                    }
                    Ok((filler, line))
                };
                // First as many grants as `status` lists (the `run` and its
                // children: the lowest pids, so the same ones listed once
                // the map is full), then the rest of the fill.
                let (mut few, few_said) = fill(self, GRANTS_LISTED - 1)?;
                if few_said != format!("ready {}", GRANTS_LISTED - 1) {
                    self.broken(format!("bench --fill said {few_said:?}"));
                }
                let listed = status_t(self, walk);
                let (mut filler, line) = fill(self, fill_n.saturating_sub(GRANTS_LISTED))?;
                let s = self.status()?;
                let shown = s["grants"].as_array().map_or(0, Vec::len) as u64;
                let held = shown + s["grants_not_listed"].as_u64().unwrap_or(0);
                r.grant_fill.insert(label.clone(), held);
                let kernel = s["grant_share"]["kernel_grants"].as_u64();
                if kernel.is_some_and(|k| held < k) {
                    self.broken(format!(
                        "status counts {held} grants, the kernel {kernel:?} from its hooks"
                    ));
                }
                progress(&format!(
                    "{label}: {held} grants held, {} refused (map full), share {}",
                    s["grants_refused_map_full"], s["grant_share"]
                ));
                let full = status_t(self, walk);
                // The first `status` after a change to the map (a granted
                // process replaced: its exit and a fork), one at a time.
                let changed = (|| -> Result<StatusCost> {
                    let (mut v, mut cpu) = (Vec::new(), Vec::new());
                    let w0 = self.prog_run(walk)?;
                    for _ in 0..20 {
                        let input = filler.stdin.as_mut().context("bench --fill's stdin")?;
                        io::Write::write_all(input, b"c\n")
                            .context("asking bench --fill for a change")?;
                        let mut ok = String::new();
                        if let Some(out) = filler.stdout.as_mut() {
                            let mut one = [0u8; 1];
                            while out.read(&mut one).unwrap_or(0) == 1 && one[0] != b'\n' {
                                ok.push(one[0] as char);
                            }
                        }
                        if ok != "ok" {
                            bail!("bench --fill said {ok:?} to a change");
                        }
                        let c0 = self.daemon_cpu_ns()?;
                        v.push(self.ctl_time(1, &["status", "--json"])?.0);
                        cpu.push(self.daemon_cpu_ns()?.saturating_sub(c0) as f64);
                    }
                    let w1 = self.prog_run(walk)?;
                    Ok(StatusCost {
                        wall: median(&v),
                        get: 0.0,
                        cpu: median(&cpu),
                        runs: 20,
                        walks: (w1.0 - w0.0, w1.1 - w0.1),
                    })
                })();
                drop(filler.stdin.take());
                let _ = filler.wait();
                drop(few.stdin.take());
                let _ = few.wait();
                let full = full?;
                let changed = changed?;
                let listed = listed?;
                match line
                    .strip_prefix("ready ")
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    Some(n) if n + GRANTS_LISTED >= fill_n => {}
                    Some(n) => progress(&format!(
                        "bench --fill forked {n} of {fill_n} (fork failed: a task limit?)"
                    )),
                    None => self.broken(format!("bench --fill said {line:?}")),
                }
                r.grant_status
                    .entry(label.clone())
                    .or_default()
                    .push((empty.wall, full.wall));
                r.grant_changed
                    .entry(label.clone())
                    .or_default()
                    .push((empty.wall, changed.wall));
                r.grant_cpu.entry(label.clone()).or_default().push([
                    empty.cpu,
                    listed.cpu,
                    full.cpu,
                    changed.cpu,
                ]);
                let w = r.grant_walks.entry(label.clone()).or_default();
                for (i, c) in [&empty, &listed, &full, &changed].into_iter().enumerate() {
                    w[i].0 += c.walks.0;
                    w[i].1 += c.walks.1;
                    w[i].2 += c.runs;
                }
                r.grant_listed
                    .entry(label.clone())
                    .or_default()
                    .push((listed.wall, full.wall));
                r.grant_get
                    .entry(label.clone())
                    .or_default()
                    .push((empty.get, full.get));
                self.daemon_stop()?;
            }
        }
        self.bin = this;
        self.stats_restore()
    }

    /// The saved mode is integrated (the next start loads, fills and
    /// attaches before READY=1): one start and `set integrated`.
    fn set_saved_integrated(&mut self) -> Result<()> {
        self.set_saved("integrated")
    }

    fn set_saved(&mut self, mode: &str) -> Result<()> {
        self.daemon_start()?;
        self.set_mode(mode)?;
        self.daemon_stop()
    }

    /// bench/minload (the needed-only loader) and the object it loads:
    /// bpf/gpuctl.bpf.c compiled and linked as libbpf-cargo does for the
    /// skeleton, and the loader linked with `make static`'s libbpf build
    /// (static PIE, as gpuctl). Err: why not (the boot rows say it).
    fn build_minload(&self) -> Result<()> {
        let lb = match std::env::var_os("BENCH_LIBBPF").filter(|v| !v.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => {
                let build = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("target/x86_64-unknown-linux-gnu/release/build");
                let mut found: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(&build)
                    .with_context(|| format!("reading {}", build.display()))?
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().starts_with("libbpf-sys-"))
                    .map(|e| e.path().join("out"))
                    .filter(|d| d.join("libbpf.a").is_file())
                    .filter_map(|d| {
                        Some((fs::metadata(d.join("libbpf.a")).ok()?.modified().ok()?, d))
                    })
                    .collect();
                found.sort();
                found.pop().map(|(_, d)| d).with_context(|| {
                    format!(
                        "no libbpf-sys build with a libbpf.a under {}",
                        build.display()
                    )
                })?
            }
        };
        let inc = lb.join("include");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let st = Command::new(&cc)
            .args(["-O2", "-Wall", "-static-pie", "-I"])
            .arg(&inc)
            .arg("-o")
            .arg(self.tool("minload"))
            .arg(format!("{SRC}/minload.c"))
            .arg(lb.join("libbpf.a"))
            .args(["-lelf", "-lz"])
            .status()
            .with_context(|| format!("running {cc}"))?;
        if !st.success() {
            bail!("building bench/minload.c against {} failed", lb.display());
        }
        let clang = std::env::var("BPF_CLANG").unwrap_or_else(|_| "clang".into());
        let raw = self.work.join("gpuctl.raw.bpf.o");
        let st = Command::new(&clang)
            .args([
                "-Wall",
                "-Werror",
                "-fno-stack-protector",
                "-D__TARGET_ARCH_x86",
            ])
            .arg(format!("-I{}/../bpf", SRC))
            .arg("-I")
            .arg(&inc)
            .args(["-g", "-O2", "-target", "bpf", "-c"])
            .arg(format!("{SRC}/../bpf/gpuctl.bpf.c"))
            .arg("-o")
            .arg(&raw)
            .status()
            .with_context(|| format!("running {clang}"))?;
        if !st.success() {
            bail!("compiling bpf/gpuctl.bpf.c failed");
        }
        // Linked, as libbpf-cargo links the skeleton's object (which drops
        // the DWARF): the same bytes to parse.
        let mut l = libbpf_rs::Linker::new(self.work.join("gpuctl.bpf.o"))?;
        l.add_file(&raw)?;
        l.link()?;
        Ok(())
    }

    /// Start to READY=1 of bench/minload loading what `mode` needs (the
    /// enforcer's first instance with the cgroup backend, as the daemon is
    /// started here; keep in step with `first_instance` in
    /// src/bpf/enforcer.rs): integrated loads the cgroup/dev program and
    /// the file-identity iterator and attaches the first; hybrid loads the
    /// iterator.
    fn minload_ready(&self, mode: &str) -> Result<f64> {
        let report = self.work.join("minload.out");
        let _ = fs::remove_file(&report);
        let mut cmd = Command::new(self.tool("ready"));
        cmd.arg(self.work.join("notify.sock"))
            .arg(&report)
            .arg(self.tool("minload"))
            .arg(self.work.join("gpuctl.bpf.o"))
            .arg("8192"); // config.rs: the default max_grants
        match mode {
            "integrated" => {
                cmd.arg(&self.cg)
                    .args(["gpuctl_cgroup_dev", "gpuctl_cgroup_dev", "gpuctl_file_id"])
            }
            _ => cmd.args(["-", "-", "gpuctl_file_id"]),
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .spawn()
            .context("starting bench/minload")?;
        let line = wait_report(&report, &mut child, 2000, Duration::from_millis(5));
        let pid = kv(line.trim(), "pid").and_then(|p| p.parse::<i32>().ok());
        let target = pid.unwrap_or(child.id() as i32);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(target),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = child.wait();
        if pid.is_none() {
            bail!("bench/minload did not become ready: {}", line.trim());
        }
        kvf(line.trim(), "ready_ns")
    }

    /// h. the boot (issue 21): start to READY=1 of the daemon against the
    /// needed-only loader, per saved mode, interleaved (the first of the
    /// pair alternates), and both again under BENCH_BUSY busy loops.
    fn boot(&mut self, r: &mut Results) -> Result<()> {
        progress("boot: start to READY=1 vs the needed-only loader");
        if let Err(e) = self.build_minload() {
            r.boot_missing = Some(format!("{e:#}"));
            return Ok(());
        }
        let (this, bins) = self.measured_bins()?;
        let busy_case = format!("integrated, {} busy loops", self.cfg.busy);
        for round in 0..self.cfg.boot_rounds {
            for (case, mode, busy) in [
                ("integrated".to_string(), "integrated", 0),
                ("hybrid".to_string(), "hybrid", 0),
                (busy_case.clone(), "integrated", self.cfg.busy),
            ] {
                for (label, bin) in &bins {
                    self.bin = bin.clone();
                    self.set_saved(mode)?;
                    let mut loops = Vec::new();
                    for _ in 0..busy {
                        loops.push(
                            Command::new("sh")
                                .args(["-c", "while :; do :; done"])
                                .stdin(Stdio::null())
                                .spawn()
                                .context("starting a busy loop")?,
                        );
                    }
                    if busy > 0 {
                        self.sleep(Duration::from_millis(200))?;
                    }
                    let pair = |b: &mut Bench, first_daemon: bool| -> Result<(f64, f64)> {
                        let (mut d, mut m) = (f64::NAN, f64::NAN);
                        for step in 0..2 {
                            if (step == 0) == first_daemon {
                                b.daemon_start()?;
                                d = b.last_ready_ns;
                                b.daemon_stop()?;
                            } else {
                                m = b.minload_ready(mode)?;
                            }
                        }
                        Ok((d, m))
                    };
                    let res = pair(self, round % 2 == 0);
                    for mut l in loops {
                        let _ = l.kill();
                        let _ = l.wait();
                    }
                    r.boot
                        .entry((case.clone(), label.clone()))
                        .or_default()
                        .push(res?);
                }
            }
        }
        self.bin = this;
        Ok(())
    }

    /// f. runtime-PM programs (attached in every mode) and the idle daemon.
    fn pm_and_idle(&mut self, r: &mut Results) -> Result<()> {
        progress("runtime-PM programs, idle daemon");
        self.daemon_start()?;
        self.set_mode("hybrid")?;
        // A PCI config read takes a runtime-PM reference on the function's parent
        // (rpm_resume, then rpm_return_int twice): this machine's devices are not watched
        // (the daemon watches the fixture's GPU), so this is the path every other device's
        // runtime PM takes on a laptop.
        let mut pci: Vec<PathBuf> = fs::read_dir("/sys/bus/pci/devices")
            .map(|d| {
                d.filter_map(|e| Some(e.ok()?.path().join("config")))
                    .collect()
            })
            .unwrap_or_default();
        pci.sort();
        r.pm_cfg = pci.into_iter().find(|p| p.exists());
        if let Some(cfgf) = r.pm_cfg.clone() {
            self.stats_on()?;
            let pm0 = self.pm_stats()?;
            let mut buf = [0u8; 64];
            let reads: io::Result<()> = (0..self.cfg.pm_reads).try_for_each(|_| {
                let _bytes = fs::File::open(&cfgf)?.read(&mut buf)?;
                Ok(())
            });
            if reads.is_err() {
                self.broken(format!("reading {} failed", cfgf.display()));
            }
            let pm1 = self.pm_stats()?;
            self.stats_restore()?;
            for (name, (c0, t0)) in pm0 {
                if let Some((_, (c1, t1))) = pm1.iter().find(|p| p.0 == name) {
                    r.pm.push((name, c1.saturating_sub(c0), t1.saturating_sub(t0)));
                }
            }
        }
        // Idle: no client, no GPU activity; the daemon must not wake at all (no polling).
        let (c0, t0) = (self.daemon_ctxsw()?, self.daemon_cpu_ns()?);
        self.sleep(Duration::from_secs(self.cfg.idle_s))?;
        let (c1, t1) = (self.daemon_ctxsw()?, self.daemon_cpu_ns()?);
        r.idle = (c1.saturating_sub(c0), t1.saturating_sub(t0));
        self.daemon_stop()
    }

    fn print_conditions(&self, r: &Results, load0: &str, t_begin: Instant) -> Result<()> {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(": "))
            .map_or("unknown", |(_, m)| m);
        let clocksource = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
        let c = &self.cfg;
        let (iter, rounds, lrounds, per_round) = (c.iter, c.rounds, c.lrounds, r.per_round);
        println!();
        println!("Conditions:");
        println!(
            "  kernel      {} ({}), clocksource {}",
            read_trim("/proc/sys/kernel/osrelease")?,
            std::env::consts::ARCH,
            read_trim(clocksource).unwrap_or_else(|_| "unknown".into())
        );
        println!(
            "  CPU         {cpu_model}, {} CPUs online, load average before the run: {load0}",
            c.nproc
        );
        let version = self.gpuctl(&["--version"])?.2;
        println!("  gpuctl      {}, {}", version.trim(), c.bin_arg.display());
        println!(
            "  backend     {}: cgroup/dev on the bench cgroup only (--backend cgroup --cgroup \
             {})",
            r.backend,
            self.cg.display()
        );
        let smart = if r.smart {
            "available (its fork/exec hooks are global while it is on)"
        } else {
            &r.na_smart
        };
        println!("  smart mode  {smart}");
        println!(
            "  pinning     measured processes on {}; daemon and clients unpinned",
            r.pin
        );
        println!(
            "  openat      {iter} calls per run, first 10 % dropped; {rounds} rounds × {} \
             cases ({}; none2 = none again, the A/A control), order rotated each round; each \
             figure is the best round's, each ratio to the best no-gpuctl round; one timing \
             pair costs {} ns (inside every sample)",
            r.cases.len(),
            r.cases.join(" "),
            r.clock_ns
        );
        println!(
            "  A/B         the same harness hopping every 500 calls between the bench cgroup \
             and a sibling with nothing attached; {iter} calls ({} per arm) × {AB_REPS} per \
             mode and target, medians",
            iter / 2
        );
        println!(
            "  BPF cost    kernel.bpf_stats_enabled=1 for that phase only (restored to {}); \
             {STATS_REPS} × ({} opens per target, {STATS_LAUNCHES} launches), best repetition",
            read_trim(STATS_FILE)?,
            iter / 2
        );
        println!(
            "  launches    {} per mode of {} (fork+exec, a 2 KiB environment), {lrounds} \
             rounds × a batch of {per_round} per mode ({}; hybrid2 = hybrid again, the A/A \
             control), order rotated each round; a batch's rate is 1 / its median launch time",
            c.launches,
            self.true_bin.display(),
            r.lmodes.join(" ")
        );
        println!(
            "  control     {} runs per command (wall time from fork to exit), {} daemon starts",
            c.ctl_runs, c.starts
        );
        println!("  took        {} s", t_begin.elapsed().as_secs());
        Ok(())
    }
}

/// `157.9µs`, `1.234ms`, `2s`, `800ns` (a Duration's Debug form) in ns.
fn parse_duration_ns(d: &str) -> Option<f64> {
    let split = d.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = d.split_at(split);
    let f = match unit {
        "ns" => 1.0,
        "µs" | "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return None,
    };
    Some(num.parse::<f64>().ok()? * f)
}

// ---------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------

impl Results {
    fn ovals(&self, c: &str, t: &str, p99: bool) -> Vec<f64> {
        let rows = self.openat.iter().filter(|r| r.case == c && r.target == t);
        rows.map(|r| if p99 { r.p99 } else { r.p50 }).collect()
    }

    /// Each figure is the best (lowest) of its rounds: noise on a shared machine only ever
    /// adds time, so the minimum is the estimate least disturbed by it.
    fn openat_rows(&self, tab: &mut Table, cfg: &Cfg) {
        // RES: this run's resolution, the widest A/A gap (none2 vs none) over the targets'
        // p50s, and never below 0.5 % (the clock steps by ~10 ns on a ~2 µs open).
        let mut res = 0.005f64;
        let mut aa = Vec::new();
        for t in TARGETS {
            let a = min(&self.ovals("none2", t, false)) / min(&self.ovals("none", t, false));
            aa.push(format!("{} ×{a:.3}", tname(t)));
            res = res.max((a - 1.0).abs());
        }
        let res_pct = format!("{:.1}", res * 100.0);
        tab.row(
            "openat A/A control: no gpuctl vs no gpuctl (p50)",
            format!("{} → resolution ±{res_pct} %", aa.join(", ")),
            "—",
            "noise",
        );
        for t in TARGETS {
            let (_, b50, b50hi) = summ(&self.ovals("none", t, false));
            let b99 = min(&self.ovals("none", t, true));
            let (b50s, b99s, his) = (fmt_ns(b50), fmt_ns(b99), fmt_ns(b50hi));
            let rounds = cfg.rounds;
            tab.row(
                format!("openat {}: no gpuctl", tname(t)),
                format!("p50 {b50s}, p99 {b99s} (best of {rounds}; p50 up to {his})"),
                "—",
                "baseline",
            );
            for c in self.with_smart(vec!["hybrid", "integrated"]) {
                let (_, p50, p50hi) = summ(&self.ovals(c, t, false));
                let p99 = min(&self.ovals(c, t, true));
                let (r50, r99) = (p50 / b50, p99 / b99);
                let (p50s, p99s, his) = (fmt_ns(p50), fmt_ns(p99), fmt_ns(p50hi));
                let val = format!("p50 {p50s} ×{r50:.3}, p99 {p99s} ×{r99:.3} (p50 up to {his})");
                let (budget, verdict) = if t == "file" && c == "hybrid" {
                    // Identical: nothing attached (checked in every round, status and
                    // fdinfo), and the p50s no further apart than the A/A control's.
                    let v = if (r50 - 1.0).abs() <= res {
                        "ok"
                    } else {
                        "MISS"
                    };
                    ("identical (nothing attached)", v.to_string())
                } else if t == "file" {
                    ("p50 within 2 %", within(1.02, r50, res, &res_pct))
                } else {
                    ("—", "info".to_string())
                };
                tab.row(format!("openat {}: {c}", tname(t)), val, budget, verdict);
            }
        }
        if !self.smart {
            let budget = "p50 within 2 % (regular file)";
            tab.row("openat, every target: smart", &self.na_smart, budget, "n/a");
        }
    }

    /// MODE TARGET: the medians over the repetitions of on − off (p50, ns), on / off (p50)
    /// and on − off (p99, ns).
    fn ab(&self, m: &str, t: &str) -> (f64, f64, f64) {
        let rows: Vec<&AbRow> = self
            .ab
            .iter()
            .filter(|r| r.mode == m && r.target == t)
            .collect();
        let col = |f: fn(&AbRow) -> f64| median(&rows.iter().map(|r| f(r)).collect::<Vec<_>>());
        (
            col(|r| r.on50 - r.off50),
            col(|r| r.on50 / r.off50),
            col(|r| r.on99 - r.off99),
        )
    }

    /// The A/B rows. Resolution: hybrid's A/B is an A/A (nothing attached anywhere).
    fn ab_rows(&self, tab: &mut Table) {
        let mut res = 0.005f64;
        let mut aa = Vec::new();
        for t in TARGETS {
            let (d50, r50, _) = self.ab("hybrid", t);
            aa.push(format!("{} {d50:+.0} ns", tname(t)));
            res = res.max((r50 - 1.0).abs());
        }
        let res_pct = format!("{:.1}", res * 100.0);
        tab.row(
            "openat A/B in one process: hybrid (A/A control)",
            format!("p50 on − off: {} → resolution ±{res_pct} %", aa.join(", ")),
            "—",
            "noise",
        );
        for m in self.with_smart(vec!["integrated"]) {
            let (d50, r50, d99) = self.ab(m, "file");
            tab.row(
                format!("openat A/B in one process: {m}, regular file"),
                format!("p50 {d50:+.0} ns ×{r50:.3}, p99 {d99:+.0} ns (median of {AB_REPS})"),
                "p50 within 2 %",
                within(1.02, r50, res, &res_pct),
            );
            let v: Vec<String> = ["null", "allowed", "blocked"]
                .iter()
                .map(|t| {
                    let (d50, _, d99) = self.ab(m, t);
                    format!("{} {d50:+.0} ns (p99 {d99:+.0})", tname(t))
                })
                .collect();
            tab.row(
                format!("openat A/B in one process: {m}, char devices (p50 on − off)"),
                v.join(", "),
                "—",
                "info",
            );
        }
    }

    /// MODE LOAD: per program, the best repetition (the lowest ns per call; 0 calls if it
    /// never ran): (name, dt, dc, ops), by name.
    fn bpf_best(&self, m: &str, load: &str) -> Vec<(String, f64, f64, f64)> {
        let mut best: BTreeMap<&str, (f64, f64, f64)> = BTreeMap::new();
        for r in self.progs.iter().filter(|r| r.mode == m && r.load == load) {
            let e = best.entry(&r.name).or_insert((0.0, 0.0, r.ops));
            if r.dc > 0.0 && (e.1 == 0.0 || r.dt / r.dc < e.0 / e.1) {
                *e = (r.dt, r.dc, r.ops);
            }
        }
        let rows = best.into_iter();
        rows.map(|(n, (dt, dc, ops))| (n.to_string(), dt, dc, ops))
            .collect()
    }

    fn bpf_rows(&self, tab: &mut Table) {
        let floor = self.floor;
        tab.row(
            "BPF stats floor: an empty cgroup/dev program",
            format!(
                "{}/call, best of 3 (sched_clock bracket + call; inside every BPF figure)",
                fmt_ns(floor)
            ),
            "—",
            "calibration",
        );
        // The A/A control of this method: in integrated mode, opening /dev/null and the
        // allowed node 226:1 run the same instructions (a map miss); their gap is noise.
        let per = |load: &str| {
            let rows = self.bpf_best("integrated", load).into_iter();
            rows.filter(|r| r.0.contains("cgroup/dev") && r.2 > 0.0)
                .map(|r| r.1 / r.2)
                .next()
        };
        let mut res = 5.0f64;
        if let (Some(a), Some(b)) = (per("null"), per("allowed")) {
            res = res.max((a - b).abs());
            let (a, b, n) = (fmt_ns(a), fmt_ns(b), fmt_ns(res));
            tab.row(
                "BPF A/A control: integrated, /dev/null vs 226:1 (same path: a map miss)",
                format!("{a} vs {b} → resolution ±{n}"),
                "—",
                "noise",
            );
        }
        for &m in &self.stats_modes {
            for load in TARGETS.into_iter().chain(["launch"]) {
                let mut shown = false;
                for (name, dt, dc, ops) in self.bpf_best(m, load) {
                    // Programs this load does not run (the tracing hooks see other
                    // processes' forks meanwhile) are not its cost.
                    if dc / ops < 0.5 {
                        continue;
                    }
                    shown = true;
                    let per = dt / dc;
                    let (p, above, calls) = (fmt_ns(per), fmt_ns(per - floor), dc / ops);
                    let val = format!(
                        "{p}/call ({above} above the floor), {calls:.2} calls per op, best of \
                         {STATS_REPS}"
                    );
                    let (budget, verdict) = if load != "launch" && load != "file" {
                        let v = if per < 150.0 {
                            "ok".to_string()
                        } else if per > 150.0 + res {
                            "MISS".to_string()
                        } else {
                            format!("unresolved (±{} ns)", (res + 0.5).trunc() as i64)
                        };
                        ("< 150 ns per call", v)
                    } else {
                        ("—", "info".to_string())
                    };
                    let figure = format!("BPF {name}, {m}, {}", loadname(load));
                    tab.row(figure, val, budget, verdict);
                }
                if !shown {
                    tab.row(
                        format!("BPF, {m}, {}", loadname(load)),
                        "no gpuctl program runs (0 calls per op)",
                        "—",
                        "info",
                    );
                }
            }
        }
        tab.row(
            "BPF programs, hybrid",
            "none attached (status: attached=false, every round)",
            "nothing attached",
            "ok",
        );
        if !self.smart {
            tab.row("BPF fork/exec hooks, smart", &self.na_smart, "—", "n/a");
        }
    }

    fn lvals(&self, m: &str) -> Vec<f64> {
        let rows = self.launch.iter().filter(|x| x.0 == m);
        rows.map(|x| x.2).collect()
    }

    /// Per round, MODE's rate over hybrid's in the same round (the batches are ~40 ms
    /// apart, so they share whatever else the machine is doing).
    fn lratios(&self, m: &str) -> Vec<f64> {
        let base: HashMap<u64, f64> = self
            .launch
            .iter()
            .filter(|x| x.0 == "hybrid")
            .map(|x| (x.1, x.2))
            .collect();
        let rows = self.launch.iter().filter(|x| x.0 == m);
        rows.filter_map(|x| base.get(&x.1).filter(|b| **b > 0.0).map(|b| x.2 / b))
            .collect()
    }

    /// Daemon CPU per launch, then launch rates: medians over the rounds; ratios are the
    /// median of the per-round ratios (paired batches), and hybrid2 / hybrid is their A/A
    /// control.
    fn launch_rows(&self, tab: &mut Table) {
        for (m, anchor, fixed) in [
            ("hybrid", "1 µs", "1 µs"),
            ("integrated", "433 µs", "1 µs"),
            ("smart", "543 µs", "95 µs"),
        ] {
            let cardwire = format!("cardwire 0.12.3: {anchor}, {fixed} with its log fix");
            let figure = format!("daemon CPU per launch of true: {m}");
            if m == "smart" && !self.smart {
                let v = format!("{}; {cardwire}", self.na_smart);
                tab.row(figure, v, "< 1 µs", "n/a");
                continue;
            }
            let (cpu_ns, n) = self.lcpu.get(m).copied().unwrap_or((0, 0));
            let per = cpu_ns as f64 / n as f64 / 1000.0;
            let v = format!("{per:.3} µs ({cpu_ns} ns over {n} launches); {cardwire}");
            tab.row(figure, v, "< 1 µs", under(per, 1.0));
        }

        let (hyb, lo, hi) = summ(&self.lvals("hybrid"));
        let (n, per) = (self.launch.len() / self.lmodes.len().max(1), self.per_round);
        tab.row(
            "launch rate of true: hybrid",
            format!("{hyb:.0}/s (median of {n} batches of {per}; {lo:.0}–{hi:.0})"),
            "—",
            "baseline",
        );
        let (aa, lo, hi) = summ(&self.lratios("hybrid2"));
        let res = (aa - 1.0).abs().max(0.005);
        let pct = res * 100.0;
        tab.row(
            "launch rate A/A control: hybrid vs hybrid",
            format!("×{aa:.3} (batches ×{lo:.2}–{hi:.2}) → resolution ±{pct:.1} %"),
            "—",
            "noise",
        );
        for m in ["integrated", "smart"] {
            let figure = format!("launch rate of true: {m}");
            if m == "smart" && !self.smart {
                tab.row(figure, &self.na_smart, "within 2 % of hybrid", "n/a");
                continue;
            }
            let v = median(&self.lvals(m));
            let (rr, lo, hi) = summ(&self.lratios(m));
            let (budget, verdict) = if m == "smart" {
                let v = if rr >= 0.98 {
                    "ok".to_string()
                } else if rr < 0.98 - res {
                    "MISS".to_string()
                } else {
                    format!("unresolved (±{pct:.1} %)")
                };
                ("within 2 % of hybrid", v)
            } else {
                ("—", "info".to_string())
            };
            let val = format!("{v:.0}/s ×{rr:.3} of hybrid (batches ×{lo:.2}–{hi:.2})");
            tab.row(figure, val, budget, verdict);
        }
    }

    /// Control path, start-up, memory, size, runtime-PM programs, the idle daemon.
    fn limit_rows(&self, tab: &mut Table, cfg: &Cfg) {
        let med_u = |v: &[(u64, u64)], i: usize| {
            median(
                &v.iter()
                    .map(|x| if i == 0 { x.0 } else { x.1 } as f64)
                    .collect::<Vec<_>>(),
            )
        };
        for (label, v) in &self.uev {
            let (cs, cpu) = (med_u(v, 0), med_u(v, 1));
            tab.row(
                format!("daemon wake-ups per 1 000 unrelated uevents ({label})"),
                format!(
                    "{cs:.0} wake-ups, {} CPU (median of {})",
                    fmt_ns(cpu),
                    v.len()
                ),
                "0 (filtered in the kernel)",
                if cs < 10.0 { "ok" } else { "MISS" },
            );
        }
        match &self.burst_dev {
            None => tab.row(
                "daemon per PCI uevent burst",
                "no PCI device here",
                "—",
                "n/a",
            ),
            Some(dev) => {
                for (label, v) in &self.burst {
                    let (cs, cpu) = (med_u(v, 0), med_u(v, 1));
                    tab.row(
                        format!("daemon per burst of {} PCI uevents ({label})", cfg.burst),
                        format!("{cs:.0} wake-ups, {} CPU ({})", fmt_ns(cpu), dev.display()),
                        "2 re-reads (the first at once, one at the window's end)",
                        "info",
                    );
                }
            }
        }
        for (label, v) in &self.ready_by {
            let (m, lo, hi) = summ(v);
            tab.row(
                format!("daemon start to READY=1, saved mode integrated ({label})"),
                format!(
                    "{} (median of {}; {}–{})",
                    fmt_ns(m),
                    v.len(),
                    fmt_ns(lo),
                    fmt_ns(hi)
                ),
                "—",
                "info",
            );
        }
        for (label, v) in &self.get_c {
            let ratios: Vec<f64> = v.iter().map(|(g, c)| g / c).collect();
            let (m, lo, hi) = summ(&ratios);
            let (g, c) = (
                median(&v.iter().map(|x| x.0).collect::<Vec<_>>()),
                median(&v.iter().map(|x| x.1).collect::<Vec<_>>()),
            );
            tab.row(
                format!("gpuctl get ÷ a minimal C client, same line ({label})"),
                format!(
                    "×{m:.2} (rounds ×{lo:.2}–×{hi:.2}; {} vs {})",
                    fmt_ns(g),
                    fmt_ns(c)
                ),
                "≤ ×1.5",
                if m <= 1.5 { "ok" } else { "MISS" },
            );
        }
        if !self.set_procs.is_empty() {
            let (_, cell) = before_after(&self.set_procs);
            tab.row(
                format!(
                    "gpuctl set integrated, {} extra processes ÷ none",
                    cfg.procs
                ),
                cell,
                "—",
                "info (holder scan: issue 18)",
            );
        }
    }

    fn grant_rows(&self, tab: &mut Table) {
        for (label, v) in &self.grant_status {
            let (m, cell) = before_after(v);
            let n = self.grant_fill.get(label).copied().unwrap_or(0);
            tab.row(
                format!("gpuctl status --json, full grant map ({n} grants) ÷ empty ({label})"),
                cell,
                "about ×1",
                if m <= 1.5 { "ok" } else { "MISS" },
            );
        }
        for (label, v) in &self.grant_listed {
            let (m, cell) = before_after(v);
            tab.row(
                format!(
                    "gpuctl status --json, full grant map ÷ {GRANTS_LISTED} grants (the same \
                     {GRANTS_LISTED} listed; {label})"
                ),
                cell,
                "about ×1",
                if m <= 1.5 { "ok" } else { "MISS" },
            );
        }
        for (label, v) in &self.grant_cpu {
            let col = |i: usize| median(&v.iter().map(|x| x[i]).collect::<Vec<_>>());
            let ratios: Vec<f64> = v.iter().map(|x| x[2] / x[0]).collect();
            let (m, lo, hi) = summ(&ratios);
            tab.row(
                format!(
                    "daemon CPU per status: full map ÷ empty ({label}; empty / {GRANTS_LISTED} \
                     grants / full / full after a change)"
                ),
                format!(
                    "×{m:.2} (rounds ×{lo:.2}–×{hi:.2}; {} / {} / {} / {})",
                    fmt_ns(col(0)),
                    fmt_ns(col(1)),
                    fmt_ns(col(2)),
                    fmt_ns(col(3))
                ),
                "about ×1",
                if m <= 1.5 { "ok" } else { "MISS" },
            );
        }
        for (label, w) in &self.grant_walks {
            let cell = |(n, ns, reqs): (u64, u64, u64)| {
                let per = if n > 0 {
                    fmt_ns(ns as f64 / n as f64)
                } else {
                    "—".into()
                };
                format!("{n}/{reqs} ({per})")
            };
            tab.row(
                format!(
                    "walks of the grant map per status (ns each; {label}; empty / \
                     {GRANTS_LISTED} grants / full / full after a change)"
                ),
                w.iter().map(|c| cell(*c)).collect::<Vec<_>>().join(" / "),
                "—",
                "info",
            );
        }
        for (label, v) in &self.grant_changed {
            let (_, cell) = before_after(v);
            tab.row(
                format!(
                    "gpuctl status --json, full grant map, first after a change ÷ empty ({label})"
                ),
                cell,
                "—",
                "info (the walk: issue 21)",
            );
        }
        for (label, v) in &self.grant_get {
            let ratios: Vec<f64> = v.iter().map(|(e, f)| f / e).collect();
            let (m, lo, hi) = summ(&ratios);
            tab.row(
                format!("gpuctl get, full grant map ÷ empty ({label}; control: reads no grant)"),
                format!("×{m:.2} (rounds ×{lo:.2}–×{hi:.2})"),
                "—",
                "info",
            );
        }
        for ((label, name, kind), v) in &self.grant_hooks {
            tab.row(
                format!("{name} per {kind} launch, smart ({label})"),
                format!("{} (median of {})", fmt_ns(median(v)), v.len()),
                "—",
                "info",
            );
        }
        for ((label, name), n) in &self.grant_insns {
            tab.row(
                format!("{name} verified instructions ({label})"),
                n.to_string(),
                "—",
                "info",
            );
        }
    }

    fn boot_rows(&self, tab: &mut Table) {
        if let Some(why) = &self.boot_missing {
            tab.row(
                "daemon start to READY=1 ÷ the needed-only loader",
                format!("not measured: {why}"),
                "≤ ×1.5",
                "n/a",
            );
        }
        for ((case, label), v) in &self.boot {
            let ratios: Vec<f64> = v.iter().map(|(d, m)| d / m).collect();
            let (m, lo, hi) = summ(&ratios);
            let d = median(&v.iter().map(|x| x.0).collect::<Vec<_>>());
            let l = median(&v.iter().map(|x| x.1).collect::<Vec<_>>());
            tab.row(
                format!("start to READY=1 ÷ needed-only loader, saved mode {case} ({label})"),
                format!(
                    "×{m:.2} (rounds ×{lo:.2}–×{hi:.2}; {} vs {}, medians of {})",
                    fmt_ns(d),
                    fmt_ns(l),
                    v.len()
                ),
                "≤ ×1.5",
                if m <= 1.5 { "ok" } else { "MISS" },
            );
        }
    }

    fn control_rows(&self, tab: &mut Table, cfg: &Cfg) {
        let ctl = |(p50, best): (f64, f64)| {
            let (n, p, b) = (cfg.ctl_runs, fmt_ns(p50), fmt_ns(best));
            format!("{p} (median of {n}; best {b})")
        };
        let (si, sh, l) = (self.set_int, self.set_hyb, self.list);
        tab.row(
            "gpuctl set integrated (from hybrid)",
            ctl(si),
            "< 5 ms",
            under(si.0, 5e6),
        );
        if !self.set_int_daemon.is_nan() {
            tab.row(
                "  of which the daemon handling it (its log)",
                format!("{} (median)", fmt_ns(self.set_int_daemon)),
                "—",
                "info",
            );
        }
        tab.row("gpuctl set hybrid (from integrated)", ctl(sh), "—", "info");
        tab.row("gpuctl list --json", ctl(l), "< 5 ms", under(l.0, 5e6));
        tab.row("gpuctl get", ctl(self.get), "—", "info");
        let figure = "gpuctl --version (process start and exit only)";
        tab.row(figure, ctl(self.version_t), "—", "info");
        let (ready, best) = self.ready;
        let (n, p, b) = (cfg.starts, fmt_ns(ready), fmt_ns(best));
        tab.row(
            "daemon start to READY=1 (saved mode integrated)",
            format!("{p} (median of {n}; best {b})"),
            "< 100 ms",
            under(ready, 100e6),
        );
        for (figure, kib) in [
            ("daemon RSS after start", self.rss_start),
            ("daemon RSS after the bench", self.rss_end),
        ] {
            let v = format!("{:.1} MiB", kib / 1024.0);
            tab.row(figure, v, "< 16 MiB", under(kib, 16.0 * 1024.0));
        }
        let (size, mib) = (self.size, self.size as f64 / 1048576.0);
        tab.row(
            "static binary size",
            format!("{mib:.2} MiB ({size} bytes)"),
            "< 10 MiB",
            under(size as f64, 10.0 * 1048576.0),
        );
        let reads = cfg.pm_reads;
        match &self.pm_cfg {
            None => tab.row(
                "BPF runtime-PM programs",
                "no PCI device here to drive them",
                "—",
                "n/a",
            ),
            Some(cfgf) => {
                let dev = cfgf.parent().unwrap_or(cfgf).display();
                for (name, dc, dt) in &self.pm {
                    let figure = format!("BPF {name} (tp_btf), an unwatched device");
                    match dt.checked_div(*dc) {
                        Some(per) => tab.row(
                            figure,
                            format!(
                                "{}/call, {dc} calls for {reads} config reads of {dev}",
                                fmt_ns(per as f64)
                            ),
                            "< 1 µs per transition",
                            if per < 1000 { "ok" } else { "MISS" },
                        ),
                        None => tab.row(
                            figure,
                            format!("0 calls for {reads} config reads"),
                            "—",
                            "info",
                        ),
                    }
                }
            }
        }
        let (cs, cpu) = self.idle;
        tab.row(
            format!(
                "idle daemon over {} s (runtime-PM programs attached)",
                cfg.idle_s
            ),
            format!("{cs} context switches, {} CPU", fmt_ns(cpu as f64)),
            "0 (no polling)",
            if cs == 0 { "ok" } else { "MISS" },
        );
    }
}

/// Waits (at most `tries` × `step`) until a harness wrote its `report` file
/// or exited, and returns the report ("" if none).
fn wait_report(report: &Path, child: &mut Child, tries: u32, step: Duration) -> String {
    for _ in 0..tries {
        if report.exists() || !matches!(child.try_wait(), Ok(None)) {
            break;
        }
        std::thread::sleep(step);
    }
    fs::read_to_string(report).unwrap_or_default()
}
