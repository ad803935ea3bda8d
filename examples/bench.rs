//! gpuctl benchmarks (DESIGN.md §6 tier 4, §7 budget): `make bench`, or
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
//! The raw loops are the C harnesses in bench/ (openat, spawn, ready, bpfcal), built with
//! `$CC -O2` into the run's temp dir; this program orchestrates them, checks what every
//! open returned, and does the statistics.
//!
//! Knobs (environment): BENCH_ROUNDS (10) interleaved openat rounds, BENCH_ITER (100000)
//! openat calls per harness run, BENCH_LAUNCHES (2000) launches of `true` per mode, in
//! BENCH_LAUNCH_ROUNDS (40) rounds, BENCH_CTL_RUNS (50) runs per CLI command, BENCH_STARTS
//! (10) daemon starts, BENCH_CPU (the last CPU) the CPU measured processes run on,
//! BENCH_PM_READS (20000), BENCH_IDLE_S (30), CC (cc), BENCH_ALLOW_DRM (unset: refuse to
//! run where a DRM driver is loaded, see below).

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
        for _ in 0..2500 {
            if report.exists() || !matches!(ready.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let line = fs::read_to_string(&report).unwrap_or_default();
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

fn run(args: &[String], slot: &mut Option<Bench>) -> Result<bool> {
    let [_, bin_arg] = args else {
        return Err(usage(format!(
            "usage: {} PATH-TO-STATIC-GPUCTL",
            args.first().map_or("bench", |s| s)
        )));
    };
    let bin_arg = Path::new(bin_arg);
    if !bin_arg.is_file() || nix::unistd::access(bin_arg, nix::unistd::AccessFlags::X_OK).is_err() {
        return Err(usage(format!(
            "{} is not an executable file",
            bin_arg.display()
        )));
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
    if std::env::var_os("BENCH_ALLOW_DRM").is_none_or(|v| v.is_empty()) && drm {
        return Err(usage(
            "a DRM driver is loaded here (major 226 in /proc/devices): the bench would open \
             this machine's real GPU nodes 226:0 and 226:1 over a million times. Run it where \
             no DRM driver is loaded (CI, a VM), or set BENCH_ALLOW_DRM=1 to do it anyway.",
        ));
    }
    let bin_arg = fs::canonicalize(bin_arg)?;
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
    };
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let t_begin = Instant::now();
    let load0 = read_trim("/proc/loadavg")?
        .split(' ')
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");

    // -- set-up --
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
    let work = PathBuf::from(
        String::from_utf8(
            Command::new("mktemp")
                .args(["-d", "/tmp/gpuctl-bench.XXXXXX"])
                .output()
                .context("mktemp")?
                .stdout,
        )?
        .trim(),
    );
    let b = slot.insert(Bench {
        cfg,
        bin: work.join("gpuctl"),
        cg: PathBuf::from(format!("{cg2}/gpuctl-bench-{pid}")),
        // A sibling with nothing attached: the "off" arm of the in-process A/B figure.
        cg_off: PathBuf::from(format!("{cg2}/gpuctl-bench-{pid}-off")),
        // Our own cgroup: where a straggler goes back to before the bench cgroup is removed.
        my_cg: PathBuf::from(format!("{cg2}{own}")),
        work,
        daemon: None,
        stats_orig: None,
        broken: Vec::new(),
        last_ready_ns: f64::NAN,
        true_bin: which("true").context("no `true` in PATH")?,
        pad: "x".repeat(1900),
        sigint,
        sigterm,
    });
    if !b.work.is_dir() {
        bail!("mktemp -d failed");
    }
    fs::create_dir(&b.cg).with_context(|| format!("creating {}", b.cg.display()))?;
    fs::create_dir(&b.cg_off).with_context(|| format!("creating {}", b.cg_off.display()))?;
    // One binary for the whole run, even if a build replaces the original meanwhile.
    fs::copy(&bin_arg, &b.bin).context("copying the gpuctl binary")?;
    for tool in ["openat", "spawn", "ready", "bpfcal"] {
        let st = Command::new(&cc)
            .args(["-O2", "-Wall", "-o"])
            .arg(b.tool(tool))
            .arg(format!("{SRC}/{tool}.c"))
            .status()
            .with_context(|| format!("running {cc}"))?;
        if !st.success() {
            bail!("building bench/{tool}.c failed");
        }
    }
    // The fixture laptop: the dGPU's card0 (226:0) is blocked in integrated (and smart),
    // the iGPU's card1 (226:1) never.
    std::env::set_var("GPUCTL_FIXTURE_DIR", &b.work);
    let machine = fixture::machine("intel_nvidia");
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
    std::env::set_var("GPUCTL_SYSFS_ROOT", machine.sysfs());
    std::env::set_var("GPUCTL_PROCFS_ROOT", machine.procfs());
    std::env::set_var("GPUCTL_STATE_DIR", b.work.join("state"));
    std::env::set_var("GPUCTL_CONFIG", b.work.join("gpuctl.toml")); // absent: the defaults
    std::env::remove_var("NOTIFY_SOCKET");

    let tpath = |b: &Bench, t: &str| -> PathBuf {
        match t {
            "file" => b.work.join("file"),
            "null" => "/dev/null".into(),
            "allowed" => b.work.join("dev/card1"),
            _ => b.work.join("dev/card0"),
        }
    };

    // -- conditions, and which modes this build has --
    progress("conditions");
    b.daemon_start()?;
    b.set_mode("hybrid")?;
    let status = b.status()?;
    let mut v = Vec::new();
    json_all(&status, "backend", &mut v);
    let backend = v
        .iter()
        .find_map(|x| x.as_str())
        .unwrap_or("unknown")
        .to_string();
    let mut smart = false;
    let mut smart_why = "smart mode not in this build".to_string();
    let (ok, rc, _, out) = b.gpuctl(&["set", "smart"])?;
    if ok {
        smart = true;
        b.set_mode("hybrid")?;
    } else if rc != Some(2) {
        // 2 = bad usage (an unknown mode); anything else is a real refusal.
        smart_why = format!("gpuctl set smart: {}", out.trim_end().replace('\n', " "));
    }
    let na_smart = format!("n/a ({smart_why})");
    b.daemon_stop()?;

    let probe = b.openat(&tpath(b, "file"), 1000, false)?;
    let cpu = b.cfg.cpu;
    let pin = format!(
        "CPU {cpu} of {nproc}, SCHED_FIFO {}, samples mlock'ed: {}",
        if kv(&probe, "fifo") == Some("1") {
            "99"
        } else {
            "refused"
        },
        if kv(&probe, "mlock") == Some("1") {
            "yes"
        } else {
            "no"
        }
    );
    let clock_ns = kv(&probe, "clock_p50_ns").unwrap_or("?").to_string();

    // -- a. openat overhead: cases interleaved in rounds, rotated each round --
    // none2 is a second no-gpuctl case in every round (an A/A control): how far two
    // identical cases land apart is the resolution of this run.
    let mut cases = vec!["none", "hybrid", "none2", "integrated"];
    if smart {
        cases.push("smart");
    }
    let mut openat: Vec<OpenatRow> = Vec::new();
    let rounds = b.cfg.rounds;
    let iter = b.cfg.iter;
    for r in 0..rounds {
        progress(&format!("openat round {}/{rounds}", r + 1));
        for i in 0..cases.len() {
            let c = cases[(i + r) % cases.len()];
            // enter the case
            if c.starts_with("none") {
                b.daemon_stop()?;
            } else {
                if b.daemon.is_none() {
                    b.daemon_start()?;
                }
                b.set_mode(c)?;
                let want = c != "hybrid";
                let a = b.attached()?;
                if a != want {
                    b.broken(format!(
                        "mode {c}: status says attached={a}, expected {want}"
                    ));
                }
                // And from the kernel's side: the daemon holds no BPF link in hybrid.
                if c == "hybrid" {
                    let ids = b.attached_progs()?;
                    if !ids.is_empty() {
                        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
                        b.broken(format!(
                            "mode hybrid: the daemon holds a BPF link (program ids {})",
                            ids.join(" ")
                        ));
                    }
                }
            }
            for t in TARGETS {
                let line = b.openat(&tpath(b, t), iter, false)?;
                let res = kv(&line, "result").unwrap_or("");
                let want = expected(c, t);
                if res != want {
                    let msg = format!(
                        "openat {} with gpuctl {c} returned {res}, expected {want}",
                        tname(t)
                    );
                    b.broken(msg);
                }
                openat.push(OpenatRow {
                    case: c,
                    target: t,
                    p50: kvf(&line, "p50_ns")?,
                    p99: kvf(&line, "p99_ns")?,
                });
            }
        }
    }

    // a'. The same harness in A/B mode: one process hopping every 500 calls between the
    // bench cgroup (the daemon's program attached) and a sibling with nothing attached, so
    // both arms share every moment of the run. Its resolution does not depend on what the
    // rest of the machine does; hybrid is its A/A control.
    let mut ab_modes = vec!["hybrid", "integrated"];
    if smart {
        ab_modes.push("smart");
    }
    let mut abr: Vec<AbRow> = Vec::new();
    if b.daemon.is_none() {
        b.daemon_start()?;
    }
    for &m in &ab_modes {
        progress(&format!("openat A/B in one process, {m}"));
        b.set_mode(m)?;
        for t in TARGETS {
            for _ in 0..AB_REPS {
                let line = b.openat(&tpath(b, t), iter, true)?;
                for (arm, case) in [("off", "none"), ("on", m)] {
                    let want = expected(case, t);
                    let res = kv(&line, &format!("{arm}_result"))
                        .unwrap_or("")
                        .to_string();
                    if res != want {
                        let msg = format!(
                            "A/B openat {}, {m}, {arm} arm returned {res}, expected {want}",
                            tname(t)
                        );
                        b.broken(msg);
                    }
                }
                abr.push(AbRow {
                    mode: m,
                    target: t,
                    off50: kvf(&line, "off_p50_ns")?,
                    on50: kvf(&line, "on_p50_ns")?,
                    off99: kvf(&line, "off_p99_ns")?,
                    on99: kvf(&line, "on_p99_ns")?,
                });
            }
        }
    }
    // MODE TARGET: the medians over the repetitions of on − off (p50, ns), on / off (p50)
    // and on − off (p99, ns).
    let ab = |m: &str, t: &str| {
        let rows: Vec<&AbRow> = abr
            .iter()
            .filter(|r| r.mode == m && r.target == t)
            .collect();
        let col =
            |f: &dyn Fn(&AbRow) -> f64| median(&rows.iter().map(|r| f(r)).collect::<Vec<_>>());
        (
            col(&|r| r.on50 - r.off50),
            col(&|r| r.on50 / r.off50),
            col(&|r| r.on99 - r.off99),
        )
    };

    // -- b. per-program cost: bpf_stats_enabled, run_time_ns / run_cnt from fdinfo --
    b.stats_orig = Some(read_trim(STATS_FILE)?);
    fs::write(STATS_FILE, "1\n").context("enabling kernel.bpf_stats_enabled")?;
    if b.daemon.is_none() {
        b.daemon_start()?;
    }
    b.set_mode("hybrid")?;
    progress("per-program cost: the floor (an empty program)");
    let mut floor = Vec::new();
    for _ in 0..3 {
        let mut cmd = b.in_cg(&b.cg, &b.tool("bpfcal"))?;
        cmd.arg(&b.cg)
            .arg("/dev/null")
            .arg(iter.to_string())
            .arg(cpu.to_string());
        let line = b
            .harness(cmd, "bench/bpfcal")
            .context("bench/bpfcal failed")?;
        floor.push(kvf(&line, "ns_per_run")?);
    }
    let floor = min(&floor);

    let mut stats_modes = vec!["integrated"];
    if smart {
        stats_modes.push("smart");
    }
    let stats_iter = iter / 2;
    let mut progs: Vec<ProgRow> = Vec::new();
    for &m in &stats_modes {
        progress(&format!("per-program cost, {m}"));
        b.set_mode(m)?;
        let ids = b.attached_progs()?;
        if ids.is_empty() {
            b.broken(format!("mode {m}: no BPF program attached"));
        }
        let names = prog_names();
        for load in TARGETS.into_iter().chain(["launch"]) {
            for _ in 0..STATS_REPS {
                let before = b.prog_stats()?;
                let ops = if load == "launch" {
                    b.launches(STATS_LAUNCHES)?;
                    STATS_LAUNCHES
                } else {
                    b.openat(&tpath(b, load), stats_iter, false)?;
                    stats_iter
                };
                let after = b.prog_stats()?;
                for (id, (ty, rt, rc)) in after {
                    if !ids.contains(&id) {
                        continue;
                    }
                    let (_, rt0, rc0) = before.get(&id).copied().unwrap_or((ty, 0, 0));
                    progs.push(ProgRow {
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
    if let Some(orig) = b.stats_orig.take() {
        fs::write(STATS_FILE, format!("{orig}\n")).context("restoring bpf_stats_enabled")?;
    }

    // -- c + d. daemon CPU per launch and launch rate: modes interleaved in rounds --
    // hybrid2: hybrid again, the A/A control of the launch rate.
    let mut lmodes = vec!["hybrid", "integrated", "hybrid2"];
    if smart {
        lmodes.push("smart");
    }
    let lrounds = b.cfg.lrounds;
    let per_round = b.cfg.launches / lrounds;
    let mut lcpu: HashMap<&str, u64> = HashMap::new();
    let mut ln: HashMap<&str, u64> = HashMap::new();
    // (mode, round, launches per second)
    let mut launch: Vec<(&str, u64, f64)> = Vec::new();
    for r in 0..lrounds {
        if r % 10 == 0 {
            progress(&format!("launches round {}/{lrounds}", r + 1));
        }
        for i in 0..lmodes.len() {
            let m = lmodes[(i + r as usize) % lmodes.len()];
            b.set_mode(base_mode(m))?;
            b.sleep(Duration::from_millis(30))?; // let the daemon finish with the client first
            let c0 = b.daemon_cpu_ns()?;
            let line = b.launches(per_round)?;
            b.sleep(Duration::from_millis(30))?; // and with anything the launches queued for it
            let c1 = b.daemon_cpu_ns()?;
            if kv(&line, "fails") != Some("0") {
                let msg = format!("launching {} failed in mode {m}", b.true_bin.display());
                b.broken(msg);
            }
            *lcpu.entry(m).or_default() += c1.saturating_sub(c0);
            *ln.entry(m).or_default() += per_round;
            // The batch's rate from its median launch (one slow launch does not move it).
            launch.push((m, r, 1e9 / kvf(&line, "p50_ns")?));
        }
    }
    let lvals = |m: &str| -> Vec<f64> { launch.iter().filter(|x| x.0 == m).map(|x| x.2).collect() };
    // Per round, MODE's rate over hybrid's in the same round (the batches are ~40 ms
    // apart, so they share whatever else the machine is doing).
    let lratios = |m: &str| -> Vec<f64> {
        let base: HashMap<u64, f64> = launch
            .iter()
            .filter(|x| x.0 == "hybrid")
            .map(|x| (x.1, x.2))
            .collect();
        launch
            .iter()
            .filter(|x| x.0 == m)
            .filter_map(|x| base.get(&x.1).filter(|b| **b > 0.0).map(|b| x.2 / b))
            .collect()
    };

    // -- e. control path, start-up, memory, size --
    progress("control path");
    // N runs of CMD, one at a time: (median, best) wall time.
    let ctl_time = |b: &mut Bench, n: usize, args: &[&str]| -> Result<(f64, f64)> {
        let mut cmd = Command::new(b.tool("spawn"));
        cmd.arg(n.to_string()).arg("-1").arg(&b.bin).args(args);
        let line = b.harness(cmd, "bench/spawn")?;
        if kv(&line, "fails") != Some("0") {
            let msg = format!(
                "{} {} failed (status {})",
                b.bin.display(),
                args.join(" "),
                kv(&line, "first_fail").unwrap_or("?")
            );
            b.broken(msg);
        }
        Ok((kvf(&line, "p50_ns")?, kvf(&line, "min_ns")?))
    };
    b.set_mode("hybrid")?;
    let log_path = b.work.join("daemon.log");
    let log_mark = fs::read_to_string(&log_path)
        .unwrap_or_default()
        .lines()
        .count();
    let (mut set_int, mut set_hyb) = (Vec::new(), Vec::new());
    for _ in 0..b.cfg.ctl_runs {
        set_int.push(ctl_time(b, 1, &["set", "integrated"])?.0);
        set_hyb.push(ctl_time(b, 1, &["set", "hybrid"])?.0);
    }
    let (set_int, set_int_min, _) = summ(&set_int);
    let (set_hyb, set_hyb_min, _) = summ(&set_hyb);
    // The daemon's own time for those requests, when its log says (`… in 1.234ms`).
    let log = fs::read_to_string(&log_path).unwrap_or_default();
    let daemon_times: Vec<f64> = log
        .lines()
        .skip(log_mark)
        .filter(|l| l.contains("mode: \"integrated\""))
        .filter_map(|l| {
            let d = l.rsplit_once(" in ")?.1;
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
        })
        .collect();
    let set_int_daemon = median(&daemon_times);
    b.set_mode("integrated")?;
    let (list, list_min) = ctl_time(b, b.cfg.ctl_runs, &["list", "--json"])?;
    let (get, get_min) = ctl_time(b, b.cfg.ctl_runs, &["get"])?;
    let (version_t, version_min) = ctl_time(b, b.cfg.ctl_runs, &["--version"])?;
    let rss_end = b.daemon_rss_kib()?;
    b.daemon_stop()?;

    progress("daemon start-up");
    // The saved mode is integrated: every start loads, fills the map and attaches before
    // READY=1.
    let mut ready_ns = Vec::new();
    let mut rss_start = None;
    for _ in 0..b.cfg.starts {
        b.daemon_start()?;
        ready_ns.push(b.last_ready_ns);
        if rss_start.is_none() {
            rss_start = Some(b.daemon_rss_kib()?);
        }
        if !b.attached()? {
            b.broken("after a start with saved mode integrated nothing is attached".into());
        }
        b.daemon_stop()?;
    }
    let rss_start = rss_start.unwrap_or(f64::NAN);
    let (ready, ready_min, _) = summ(&ready_ns);
    let size = fs::metadata(&bin_arg)?.len();

    // -- f. runtime-PM programs (attached in every mode) and the idle daemon --
    progress("runtime-PM programs, idle daemon");
    let pm_reads = b.cfg.pm_reads;
    let idle_s = b.cfg.idle_s;
    b.daemon_start()?;
    b.set_mode("hybrid")?;
    // A PCI config read takes a runtime-PM reference on the function's parent (rpm_resume,
    // then rpm_return_int twice): this machine's devices are not watched (the daemon
    // watches the fixture's GPU), so this is the path every other device's runtime PM takes
    // on a laptop.
    let mut pci: Vec<PathBuf> = fs::read_dir("/sys/bus/pci/devices")
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.path().join("config")))
                .collect()
        })
        .unwrap_or_default();
    pci.sort();
    let pm_cfg = pci.into_iter().find(|p| p.exists());
    let mut pm_rows = Table(Vec::new());
    if let Some(cfgf) = &pm_cfg {
        b.stats_orig = Some(read_trim(STATS_FILE)?);
        fs::write(STATS_FILE, "1\n").context("enabling kernel.bpf_stats_enabled")?;
        let pm0 = b.pm_stats()?;
        let mut buf = [0u8; 64];
        let reads: io::Result<()> = (0..pm_reads).try_for_each(|_| {
            let _bytes = fs::File::open(cfgf)?.read(&mut buf)?;
            Ok(())
        });
        if reads.is_err() {
            b.broken(format!("reading {} failed", cfgf.display()));
        }
        let pm1 = b.pm_stats()?;
        if let Some(orig) = b.stats_orig.take() {
            fs::write(STATS_FILE, format!("{orig}\n")).context("restoring bpf_stats_enabled")?;
        }
        let dev = cfgf.parent().unwrap_or(cfgf).display();
        for (name, (c0, t0)) in &pm0 {
            let Some((_, (c1, t1))) = pm1.iter().find(|p| p.0 == *name) else {
                continue;
            };
            let (dc, dt) = (c1.saturating_sub(*c0), t1.saturating_sub(*t0));
            let figure = format!("BPF {name} (tp_btf), an unwatched device");
            if let Some(per) = dt.checked_div(dc) {
                pm_rows.row(
                    figure,
                    format!(
                        "{}/call, {dc} calls for {pm_reads} config reads of {dev}",
                        fmt_ns(per as f64)
                    ),
                    "< 1 µs per transition",
                    if per < 1000 { "ok" } else { "MISS" },
                );
            } else {
                pm_rows.row(
                    figure,
                    format!("0 calls for {pm_reads} config reads"),
                    "—",
                    "info",
                );
            }
        }
    }
    // Idle: no client, no GPU activity; the daemon must not wake at all (no polling).
    let (idle_c0, idle_t0) = (b.daemon_ctxsw()?, b.daemon_cpu_ns()?);
    b.sleep(Duration::from_secs(idle_s))?;
    let idle_cs = b.daemon_ctxsw()?.saturating_sub(idle_c0);
    let idle_cpu = b.daemon_cpu_ns()?.saturating_sub(idle_t0);
    b.daemon_stop()?;

    // -- the table --
    let mut tab = Table(Vec::new());
    let ovals = |c: &str, t: &str, p99: bool| -> Vec<f64> {
        openat
            .iter()
            .filter(|r| r.case == c && r.target == t)
            .map(|r| if p99 { r.p99 } else { r.p50 })
            .collect()
    };
    // Each figure is the best (lowest) of its rounds: noise on a shared machine only ever
    // adds time, so the minimum is the estimate least disturbed by it.
    // RES: this run's resolution, the widest A/A gap (none2 vs none) over the targets'
    // p50s, and never below 0.5 % (the clock steps by ~10 ns on a ~2 µs open).
    let mut res = 0.005f64;
    let mut aa = Vec::new();
    for t in TARGETS {
        let a = min(&ovals("none2", t, false)) / min(&ovals("none", t, false));
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
        let (_, b50, b50hi) = summ(&ovals("none", t, false));
        let b99 = min(&ovals("none", t, true));
        tab.row(
            format!("openat {}: no gpuctl", tname(t)),
            format!(
                "p50 {}, p99 {} (best of {rounds}; p50 up to {})",
                fmt_ns(b50),
                fmt_ns(b99),
                fmt_ns(b50hi)
            ),
            "—",
            "baseline",
        );
        for c in ["hybrid", "integrated", "smart"] {
            if c == "smart" && !smart {
                continue;
            }
            let (_, p50, p50hi) = summ(&ovals(c, t, false));
            let p99 = min(&ovals(c, t, true));
            let (r50, r99) = (p50 / b50, p99 / b99);
            let val = format!(
                "p50 {} ×{r50:.3}, p99 {} ×{r99:.3} (p50 up to {})",
                fmt_ns(p50),
                fmt_ns(p99),
                fmt_ns(p50hi)
            );
            let (budget, verdict) = if t == "file" && c == "hybrid" {
                // Identical: nothing attached (checked in every round, status and fdinfo),
                // and the p50s no further apart than the A/A control's.
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
    if !smart {
        tab.row(
            "openat, every target: smart",
            na_smart.clone(),
            "p50 within 2 % (regular file)",
            "n/a",
        );
    }

    // The A/B rows. Resolution: hybrid's A/B is an A/A (nothing attached anywhere).
    let mut res_ab = 0.005f64;
    let mut ab_aa = Vec::new();
    for t in TARGETS {
        let (d50, r50, _) = ab("hybrid", t);
        ab_aa.push(format!("{} {d50:+.0} ns", tname(t)));
        res_ab = res_ab.max((r50 - 1.0).abs());
    }
    let res_ab_pct = format!("{:.1}", res_ab * 100.0);
    tab.row(
        "openat A/B in one process: hybrid (A/A control)",
        format!(
            "p50 on − off: {} → resolution ±{res_ab_pct} %",
            ab_aa.join(", ")
        ),
        "—",
        "noise",
    );
    for m in ["integrated", "smart"] {
        if m == "smart" && !smart {
            continue;
        }
        let (d50, r50, d99) = ab(m, "file");
        tab.row(
            format!("openat A/B in one process: {m}, regular file"),
            format!("p50 {d50:+.0} ns ×{r50:.3}, p99 {d99:+.0} ns (median of {AB_REPS})"),
            "p50 within 2 %",
            within(1.02, r50, res_ab, &res_ab_pct),
        );
        let v: Vec<String> = ["null", "allowed", "blocked"]
            .iter()
            .map(|t| {
                let (d50, _, d99) = ab(m, t);
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

    tab.row(
        "BPF stats floor: an empty cgroup/dev program",
        format!(
            "{}/call, best of 3 (sched_clock bracket + call; inside every BPF figure)",
            fmt_ns(floor)
        ),
        "—",
        "calibration",
    );
    // MODE LOAD: per program, the best repetition (the lowest ns per call; 0 calls if it
    // never ran): (name, dt, dc, ops), by name.
    let bpf_best = |m: &str, load: &str| -> Vec<(String, f64, f64, f64)> {
        let mut best: BTreeMap<&str, (f64, f64, f64)> = BTreeMap::new();
        for r in progs.iter().filter(|r| r.mode == m && r.load == load) {
            let e = best.entry(&r.name).or_insert((0.0, 0.0, r.ops));
            if r.dc > 0.0 && (e.1 == 0.0 || r.dt / r.dc < e.0 / e.1) {
                *e = (r.dt, r.dc, r.ops);
            }
        }
        best.into_iter()
            .map(|(n, (dt, dc, ops))| (n.to_string(), dt, dc, ops))
            .collect()
    };
    // The A/A control of this method: in integrated mode, opening /dev/null and the allowed
    // node 226:1 run the same instructions (a map miss); their gap is noise.
    let bpf_per = |m: &str, load: &str| -> Option<f64> {
        bpf_best(m, load)
            .into_iter()
            .find(|r| r.0.contains("cgroup/dev") && r.2 > 0.0)
            .map(|r| r.1 / r.2)
    };
    let mut res_bpf = 5.0f64;
    if let (Some(a), Some(bb)) = (
        bpf_per("integrated", "null"),
        bpf_per("integrated", "allowed"),
    ) {
        res_bpf = res_bpf.max((a - bb).abs());
        tab.row(
            "BPF A/A control: integrated, /dev/null vs 226:1 (same path: a map miss)",
            format!(
                "{} vs {} → resolution ±{}",
                fmt_ns(a),
                fmt_ns(bb),
                fmt_ns(res_bpf)
            ),
            "—",
            "noise",
        );
    }
    for &m in &stats_modes {
        for load in TARGETS.into_iter().chain(["launch"]) {
            let mut shown = false;
            for (name, dt, dc, ops) in bpf_best(m, load) {
                // Programs this load does not run (the tracing hooks see other processes'
                // forks meanwhile) are not its cost.
                if dc / ops < 0.5 {
                    continue;
                }
                shown = true;
                let per = dt / dc;
                let val = format!(
                    "{}/call ({} above the floor), {:.2} calls per op, best of {STATS_REPS}",
                    fmt_ns(per),
                    fmt_ns(per - floor),
                    dc / ops
                );
                let (budget, verdict) = if load != "launch" && load != "file" {
                    let v = if per < 150.0 {
                        "ok".to_string()
                    } else if per > 150.0 + res_bpf {
                        "MISS".to_string()
                    } else {
                        format!("unresolved (±{} ns)", (res_bpf + 0.5).trunc() as i64)
                    };
                    ("< 150 ns per call", v)
                } else {
                    ("—", "info".to_string())
                };
                tab.row(
                    format!("BPF {name}, {m}, {}", loadname(load)),
                    val,
                    budget,
                    verdict,
                );
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
    if !smart {
        tab.row("BPF fork/exec hooks, smart", na_smart.clone(), "—", "n/a");
    }

    for (m, anchor, fixed) in [
        ("hybrid", "1 µs", "1 µs"),
        ("integrated", "433 µs", "1 µs"),
        ("smart", "543 µs", "95 µs"),
    ] {
        if m == "smart" && !smart {
            tab.row(
                "daemon CPU per launch of true: smart",
                format!("{na_smart}; cardwire 0.12.3: 543 µs, 95 µs with its log fix"),
                "< 1 µs",
                "n/a",
            );
            continue;
        }
        let (cpu_ns, n) = (
            lcpu.get(m).copied().unwrap_or(0),
            ln.get(m).copied().unwrap_or(0),
        );
        let per = cpu_ns as f64 / n as f64 / 1000.0;
        tab.row(
            format!("daemon CPU per launch of true: {m}"),
            format!(
                "{per:.3} µs ({cpu_ns} ns over {n} launches); cardwire 0.12.3: {anchor}, {fixed} \
                 with its log fix"
            ),
            "< 1 µs",
            under(per, 1.0),
        );
    }

    // Launch rates: medians over the rounds; ratios are the median of the per-round ratios
    // (paired batches), and hybrid2 / hybrid is their A/A control.
    let (hyb, hyblo, hybhi) = summ(&lvals("hybrid"));
    tab.row(
        "launch rate of true: hybrid",
        format!("{hyb:.0}/s (median of {lrounds} batches of {per_round}; {hyblo:.0}–{hybhi:.0})"),
        "—",
        "baseline",
    );
    let (laa, laalo, laahi) = summ(&lratios("hybrid2"));
    let lres = (laa - 1.0).abs().max(0.005);
    tab.row(
        "launch rate A/A control: hybrid vs hybrid",
        format!(
            "×{laa:.3} (batches ×{laalo:.2}–{laahi:.2}) → resolution ±{:.1} %",
            lres * 100.0
        ),
        "—",
        "noise",
    );
    for m in ["integrated", "smart"] {
        if m == "smart" && !smart {
            tab.row(
                "launch rate of true: smart",
                na_smart.clone(),
                "within 2 % of hybrid",
                "n/a",
            );
            continue;
        }
        let v = median(&lvals(m));
        let (rr, rlo, rhi) = summ(&lratios(m));
        let (budget, verdict) = if m == "smart" {
            let v = if rr >= 0.98 {
                "ok".to_string()
            } else if rr < 0.98 - lres {
                "MISS".to_string()
            } else {
                format!("unresolved (±{:.1} %)", lres * 100.0)
            };
            ("within 2 % of hybrid", v)
        } else {
            ("—", "info".to_string())
        };
        tab.row(
            format!("launch rate of true: {m}"),
            format!("{v:.0}/s ×{rr:.3} of hybrid (batches ×{rlo:.2}–{rhi:.2})"),
            budget,
            verdict,
        );
    }

    let ctl_runs = b.cfg.ctl_runs;
    let ctl = |p50: f64, best: f64| {
        format!(
            "{} (median of {ctl_runs}; best {})",
            fmt_ns(p50),
            fmt_ns(best)
        )
    };
    tab.row(
        "gpuctl set integrated (from hybrid)",
        ctl(set_int, set_int_min),
        "< 5 ms",
        under(set_int, 5e6),
    );
    if !set_int_daemon.is_nan() {
        tab.row(
            "  of which the daemon handling it (its log)",
            format!("{} (median)", fmt_ns(set_int_daemon)),
            "—",
            "info",
        );
    }
    tab.row(
        "gpuctl set hybrid (from integrated)",
        ctl(set_hyb, set_hyb_min),
        "—",
        "info",
    );
    tab.row(
        "gpuctl list --json",
        ctl(list, list_min),
        "< 5 ms",
        under(list, 5e6),
    );
    tab.row("gpuctl get", ctl(get, get_min), "—", "info");
    tab.row(
        "gpuctl --version (process start and exit only)",
        ctl(version_t, version_min),
        "—",
        "info",
    );
    tab.row(
        "daemon start to READY=1 (saved mode integrated)",
        format!(
            "{} (median of {}; best {})",
            fmt_ns(ready),
            b.cfg.starts,
            fmt_ns(ready_min)
        ),
        "< 100 ms",
        under(ready, 100e6),
    );
    tab.row(
        "daemon RSS after start",
        format!("{:.1} MiB", rss_start / 1024.0),
        "< 16 MiB",
        under(rss_start, 16.0 * 1024.0),
    );
    tab.row(
        "daemon RSS after the bench",
        format!("{:.1} MiB", rss_end / 1024.0),
        "< 16 MiB",
        under(rss_end, 16.0 * 1024.0),
    );
    tab.row(
        "static binary size",
        format!("{:.2} MiB ({size} bytes)", size as f64 / 1048576.0),
        "< 10 MiB",
        under(size as f64, 10.0 * 1048576.0),
    );
    tab.0.append(&mut pm_rows.0);
    if pm_cfg.is_none() {
        tab.row(
            "BPF runtime-PM programs",
            "no PCI device here to drive them",
            "—",
            "n/a",
        );
    }
    tab.row(
        format!("idle daemon over {idle_s} s (runtime-PM programs attached)"),
        format!(
            "{idle_cs} context switches, {} CPU",
            fmt_ns(idle_cpu as f64)
        ),
        "0 (no polling)",
        if idle_cs == 0 { "ok" } else { "MISS" },
    );

    // -- output: the table (Markdown), then the conditions --
    tab.print();
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(": "))
        .map_or("unknown", |(_, m)| m);
    let version = b.gpuctl(&["--version"])?.2;
    let ncases = cases.len();
    println!();
    println!("Conditions:");
    println!(
        "  kernel      {} ({}), clocksource {}",
        read_trim("/proc/sys/kernel/osrelease")?,
        std::env::consts::ARCH,
        read_trim("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_else(|_| "unknown".into())
    );
    println!(
        "  CPU         {cpu_model}, {nproc} CPUs online, load average before the run: {load0}"
    );
    println!("  gpuctl      {}, {}", version.trim(), bin_arg.display());
    println!(
        "  backend     {backend}: cgroup/dev on the bench cgroup only (--backend cgroup \
         --cgroup {})",
        b.cg.display()
    );
    println!(
        "  smart mode  {}",
        if smart {
            "available (its fork/exec hooks are global while it is on)"
        } else {
            &na_smart
        }
    );
    println!("  pinning     measured processes on {pin}; daemon and clients unpinned");
    println!(
        "  openat      {iter} calls per run, first 10 % dropped; {rounds} rounds × {ncases} \
         cases ({}; none2 = none again, the A/A control), order rotated each round; each \
         figure is the best round's, each ratio to the best no-gpuctl round; one timing pair \
         costs {clock_ns} ns (inside every sample)",
        cases.join(" ")
    );
    println!(
        "  A/B         the same harness hopping every 500 calls between the bench cgroup and \
         a sibling with nothing attached; {iter} calls ({} per arm) × {AB_REPS} per mode and \
         target, medians",
        iter / 2
    );
    println!(
        "  BPF cost    kernel.bpf_stats_enabled=1 for that phase only (restored to {}); \
         {STATS_REPS} × ({stats_iter} opens per target, {STATS_LAUNCHES} launches), best \
         repetition",
        read_trim(STATS_FILE)?
    );
    println!(
        "  launches    {} per mode of {} (fork+exec, a 2 KiB environment), {lrounds} rounds × \
         a batch of {per_round} per mode ({}; hybrid2 = hybrid again, the A/A control), order \
         rotated each round; a batch's rate is 1 / its median launch time",
        b.cfg.launches,
        b.true_bin.display(),
        lmodes.join(" ")
    );
    println!(
        "  control     {ctl_runs} runs per command (wall time from fork to exit), {} daemon \
         starts",
        b.cfg.starts
    );
    println!("  took        {} s", t_begin.elapsed().as_secs());
    drop(machine);

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
