//! Power truth: does each offload GPU really sleep, and who woke it.
//!
//! The kernel side (`bpf/power.bpf.c`, loaded by [`crate::bpf::power`])
//! reports every settled runtime-PM transition of the watched devices (each
//! offload GPU function, its sibling functions, the bridge above it) with
//! the task that started each resume. This module turns them into `wake`,
//! `sleep` and `power` events, a bounded wake history, per-GPU wake counts
//! and top wakers, and reads residency from `power/runtime_suspended_time`
//! and `power/runtime_active_time` (readable while the GPU sleeps; reading
//! them wakes nothing). Nothing here polls: the daemon runs this code only
//! when the ring buffer has transitions or a client asks.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use crate::bpf::power::{PmEvent, PowerMon, Role, Waker, Watch, RPM_ACTIVE, RPM_SUSPENDED};
use crate::gpu::{Inventory, PciAddr};
use crate::proto::data::{
    self, ListGpu, PowerMonitor, ProgramStats, Residency, RuntimePm, StatusGpu, TopWaker, Wake,
    WakesData, WakesGpu, Watched,
};
use crate::proto::event::{Event, PowerEvent, SleepEvent};

/// Wakes kept (all GPUs together); older ones are dropped.
pub const HISTORY: usize = 256;
/// Distinct wakers counted per GPU; past it the rarest one is dropped.
const WAKER_NAMES: usize = 64;
/// Top wakers reported.
const TOP: usize = 5;

/// `power/runtime_suspended_time` and `runtime_active_time`, in ms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub suspended_ms: u64,
    pub active_ms: u64,
}

/// Time asleep and awake over a span (`proto::data::Residency`).
fn residency_of(c: Counters) -> Residency {
    let total = c.suspended_ms + c.active_ms;
    Residency {
        asleep_pct: (total > 0)
            .then(|| (c.suspended_ms as f64 * 1000.0 / total as f64).round() / 10.0),
        asleep_s: c.suspended_ms as f64 / 1000.0,
        awake_s: c.active_ms as f64 / 1000.0,
    }
}

/// The wire name of a watched device's role.
fn role(r: Role) -> data::Role {
    match r {
        Role::Gpu => data::Role::Gpu,
        Role::Sibling => data::Role::Sibling,
        Role::Bridge => data::Role::Bridge,
    }
}

/// Residency between `base` and `now`. Counters only grow while the device
/// exists; if either went down, the device was removed and added again
/// (hot unplug, driver rebind of a PM domain) and counts from zero: the span
/// is then `now` alone, and `true` says the base must be reset.
pub fn residency_since(base: Counters, now: Counters) -> (Residency, bool) {
    if now.suspended_ms < base.suspended_ms || now.active_ms < base.active_ms {
        return (residency_of(now), true);
    }
    (
        residency_of(Counters {
            suspended_ms: now.suspended_ms - base.suspended_ms,
            active_ms: now.active_ms - base.active_ms,
        }),
        false,
    )
}

pub fn read_counters(dev_dir: &Path) -> Option<Counters> {
    let n = |f: &str| {
        crate::safefile::read_attr(&dev_dir.join(f), true)?
            .parse::<u64>()
            .ok()
    };
    Some(Counters {
        suspended_ms: n("power/runtime_suspended_time")?,
        active_ms: n("power/runtime_active_time")?,
    })
}

fn op_of(syscall: Option<u32>) -> Option<&'static str> {
    Some(match syscall? {
        0 | 17 | 19 | 295 | 327 => "read",
        1 | 18 | 20 | 296 | 328 => "write",
        2 | 257 | 437 => "open",
        9 => "mmap",
        16 => "ioctl",
        _ => return None,
    })
}

/// A path from the names the kernel gave, leaf first, and the mount point
/// of their file system when the walk reached its root: a PCI function's
/// attribute becomes `/sys/bus/pci/devices/<pci>/<attr>`; `card1`, `dri`,
/// `/` mounted on `dev` becomes `/dev/dri/card1`; a walk that stopped short
/// of the root keeps `...` in front.
pub fn file_from_parts(parts: &[String], mnt: Option<&str>) -> Option<String> {
    parts.first()?;
    if let Some(i) = parts.iter().position(|p| p.parse::<PciAddr>().is_ok()) {
        if i > 0 {
            let rest: Vec<&str> = parts[..i].iter().rev().map(String::as_str).collect();
            return Some(format!(
                "/sys/bus/pci/devices/{}/{}",
                parts[i],
                rest.join("/")
            ));
        }
    }
    let mut rev: Vec<&str> = parts.iter().rev().map(String::as_str).collect();
    if rev.first() == Some(&"/") {
        rev.remove(0);
        let at = match mnt {
            Some(m) if m != "/" => format!("/{m}"),
            _ => String::new(),
        };
        return Some(format!("{at}/{}", rev.join("/")));
    }
    Some(format!(".../{}", rev.join("/")))
}

/// One wake, from the kernel's transition and the task that started it.
fn new_wake(e: &PmEvent, pci: &str, ts: f64) -> Wake {
    let w: Option<&Waker> = e.waker.as_ref();
    let op = w.and_then(|w| op_of(w.syscall)).map(str::to_string);
    let file = w.and_then(|w| {
        w.opened
            .clone()
            .filter(|s| !s.is_empty())
            .or_else(|| file_from_parts(&w.fd_path, w.mnt.as_deref()))
    });
    let what = match (&op, &file) {
        (Some(o), Some(f)) => Some(format!("{o} {f}")),
        (Some(o), None) => Some(o.clone()),
        (None, Some(f)) => Some(f.clone()),
        (None, None) => None,
    };
    Wake {
        gpu: e.gpu,
        pci: pci.to_string(),
        device: e.dev.clone(),
        role: role(e.role),
        ts: Some(ts),
        pid: w.map(|w| w.pid),
        tgid: w.map(|w| w.tgid),
        comm: w.map(|w| w.comm.clone()),
        uid: w.filter(|w| !w.kthread).map(|w| w.uid),
        what,
        op,
        file,
        kworker: w.is_some_and(|w| w.kthread),
        r#async: w.is_some_and(|w| w.r#async),
        awake_ms: None,
        count: 1,
        last_ts: Some(ts),
        first_of_uid: false,
        mono_ns: e.ts,
    }
}

/// One watched GPU.
struct GpuPower {
    pci: PciAddr,
    dir: PathBuf,
    base: Option<Counters>,
    /// Unix time the base was taken.
    since: f64,
    reset: bool,
    wakes: u64,
    awake_since_ns: Option<u64>,
    wakers: BTreeMap<(String, Option<u32>), u64>,
    watched: Vec<Watch>,
}

/// The daemon's power state. `mon` is `None` where the programs cannot load:
/// residency still works, attribution does not, and `status` says why.
pub struct Power {
    mon: Option<PowerMon>,
    error: Option<String>,
    sysfs: PathBuf,
    gpus: BTreeMap<u32, GpuPower>,
    /// Settled status of every watched device, as last reported.
    last: BTreeMap<String, u32>,
    history: VecDeque<Wake>,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn mono_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Unix seconds of a CLOCK_MONOTONIC ns stamp (ms precision).
fn to_unix(mono_ns: u64) -> f64 {
    let ago = mono_now_ns().saturating_sub(mono_ns) as f64 / 1e9;
    ((unix_now() - ago) * 1000.0).round() / 1000.0
}

/// The devices to watch for one GPU: its function, every other function of
/// its slot, and the PCI bridge above it.
fn watch_set(sysfs: &Path, gpu_id: u32, pci: PciAddr) -> Vec<Watch> {
    let devices = sysfs.join("bus/pci/devices");
    let status =
        |a: &str| crate::safefile::read_attr(&devices.join(a).join("power/runtime_status"), true);
    let mut out = vec![Watch {
        dev: pci.to_string(),
        gpu: gpu_id,
        role: Role::Gpu,
        status: status(&pci.to_string()),
    }];
    if let Ok(entries) = std::fs::read_dir(&devices) {
        let mut sib: Vec<PciAddr> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<PciAddr>().ok())
            .filter(|a| *a != pci && a.same_slot(&pci))
            .collect();
        sib.sort();
        out.extend(sib.into_iter().map(|a| Watch {
            dev: a.to_string(),
            gpu: gpu_id,
            role: Role::Sibling,
            status: status(&a.to_string()),
        }));
    }
    let bridge = std::fs::canonicalize(devices.join(pci.to_string()))
        .ok()
        .and_then(|p| p.parent()?.file_name()?.to_str()?.parse::<PciAddr>().ok());
    if let Some(b) = bridge {
        out.push(Watch {
            dev: b.to_string(),
            gpu: gpu_id,
            role: Role::Bridge,
            status: status(&b.to_string()),
        });
    }
    out
}

impl Power {
    /// Loads the runtime-PM programs; a failure is kept and reported, never
    /// fatal (blocking works without them).
    /// Residency only until [`Power::load`] loads the programs: the daemon
    /// does that after READY=1, since nothing the boot waits for needs
    /// them (they observe; they neither block nor grant).
    pub fn deferred(sysfs: &Path) -> Power {
        Power {
            mon: None,
            error: None,
            sysfs: sysfs.to_path_buf(),
            gpus: BTreeMap::new(),
            last: BTreeMap::new(),
            history: VecDeque::new(),
        }
    }

    /// Loads and attaches the runtime-PM programs (once); on failure the
    /// reason is kept for [`Power::error`] and residency goes on alone.
    pub fn load(&mut self) {
        if self.mon.is_some() || self.error.is_some() {
            return;
        }
        match PowerMon::load() {
            Ok(m) => self.mon = Some(m),
            Err(e) => self.error = Some(format!("{e:#}")),
        }
    }

    /// Why wake attribution is off, if it is.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The fd to poll, while the programs run.
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.mon.as_ref().map(PowerMon::fd)
    }

    /// Follows the inventory: watches every offload GPU (a new one gets its
    /// residency base now; a removed one is forgotten, its wakes stay in
    /// the history).
    pub fn sync(&mut self, inv: &Inventory) -> Result<(), String> {
        let offload: BTreeMap<u32, PciAddr> = inv
            .gpus
            .iter()
            .filter(|g| g.offload)
            .map(|g| (g.id, g.pci))
            .collect();
        self.gpus
            .retain(|id, g| offload.get(id).is_some_and(|p| *p == g.pci));
        for (id, pci) in &offload {
            if let Some(g) = self.gpus.get_mut(id) {
                g.watched = watch_set(&self.sysfs, *id, *pci);
                continue;
            }
            let dir = self.sysfs.join(format!("bus/pci/devices/{pci}"));
            self.gpus.insert(
                *id,
                GpuPower {
                    pci: *pci,
                    base: read_counters(&dir),
                    dir,
                    since: unix_now(),
                    reset: false,
                    wakes: 0,
                    awake_since_ns: None,
                    wakers: BTreeMap::new(),
                    watched: watch_set(&self.sysfs, *id, *pci),
                },
            );
        }
        let all: Vec<Watch> = self
            .gpus
            .values()
            .flat_map(|g| g.watched.iter().cloned())
            .collect();
        for w in &all {
            self.last
                .entry(w.dev.clone())
                .or_insert(match w.status.as_deref() {
                    Some("suspended") => RPM_SUSPENDED,
                    Some("active") => RPM_ACTIVE,
                    _ => u32::MAX,
                });
        }
        self.last.retain(|d, _| all.iter().any(|w| &w.dev == d));
        match &mut self.mon {
            Some(m) => m.watch(&all).map_err(|e| format!("{e:#}")),
            None => Ok(()),
        }
    }

    /// Drains the kernel's transitions; returns the events to stream.
    pub fn on_ready(&mut self) -> Vec<Event> {
        let events = match &mut self.mon {
            Some(m) => m.drain(),
            None => return Vec::new(),
        };
        let mut out = Vec::new();
        for e in events {
            let ts = to_unix(e.ts);
            out.extend(self.apply(&e, ts));
        }
        out
    }

    /// One transition: history, counts, and the events it makes.
    fn apply(&mut self, e: &PmEvent, ts: f64) -> Vec<Event> {
        let was = self.last.insert(e.dev.clone(), e.status);
        let Some(g) = self.gpus.get_mut(&e.gpu) else {
            return Vec::new();
        };
        let pci = g.pci.to_string();
        let mut out = Vec::new();
        let state = |dir: &Path| {
            (
                crate::safefile::read_attr(&dir.join("power_state"), true),
                crate::safefile::read_attr(&dir.join("power/runtime_status"), true),
            )
        };
        if e.status == RPM_ACTIVE && was == Some(RPM_SUSPENDED) {
            let wake = new_wake(e, &pci, ts);
            if e.role == Role::Gpu {
                g.wakes += 1;
                g.awake_since_ns = Some(e.ts);
                count_waker(&mut g.wakers, &wake);
            }
            out.push(Event::Wake(wake.clone()));
            remember(&mut self.history, wake);
        }
        if e.role == Role::Gpu && e.status == RPM_SUSPENDED {
            let awake_ms = g
                .awake_since_ns
                .take()
                .map(|t| e.ts.saturating_sub(t) / 1_000_000);
            if let Some(ms) = awake_ms {
                if let Some(w) = self
                    .history
                    .iter_mut()
                    .rev()
                    .find(|w| w.device == e.dev && w.awake_ms.is_none())
                {
                    w.awake_ms = Some(ms);
                }
            }
            let (ps, _) = state(&g.dir);
            out.push(Event::Sleep(SleepEvent {
                gpu: e.gpu,
                pci: pci.clone(),
                ts: Some(ts),
                awake_ms,
                power_state: ps,
            }));
        }
        if e.role == Role::Gpu {
            // The status the kernel settled in (sysfs may have moved on);
            // the D-state as sysfs says now.
            let (ps, _) = state(&g.dir);
            let rs = if e.status == RPM_ACTIVE {
                "active"
            } else {
                "suspended"
            };
            out.push(Event::Power(PowerEvent {
                gpu: e.gpu,
                pci,
                power_state: ps,
                runtime_status: rs.to_string(),
            }));
        }
        out
    }

    /// The `runtime_pm` object of one GPU (`None` for a GPU not watched),
    /// whole: the caller shows it through `for_viewer`.
    pub fn gpu_json(&mut self, id: u32) -> Option<RuntimePm> {
        let kernel_wakes = |dev: &str| self.mon.as_ref().map(|m| m.kernel_wakes(dev));
        let g = self.gpus.get(&id)?;
        // The kernel's count (complete even if the ring buffer overflowed).
        let wakes = kernel_wakes(&g.pci.to_string()).map(|k| k.unwrap_or(g.wakes));
        let g = self.gpus.get_mut(&id)?;
        let now = read_counters(&g.dir);
        let since_start = match (g.base, now) {
            (Some(b), Some(n)) => {
                let (r, reset) = residency_since(b, n);
                if reset {
                    g.base = Some(Counters::default());
                    g.reset = true;
                    g.since = unix_now() - (n.suspended_ms + n.active_ms) as f64 / 1000.0;
                }
                Some(r)
            }
            (None, Some(n)) => {
                // The counters appeared (driver bound later): start now.
                g.base = Some(n);
                g.since = unix_now();
                Some(residency_of(Counters::default()))
            }
            _ => None,
        };
        let mut top: Vec<(&(String, Option<u32>), &u64)> = g.wakers.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let top_wakers: Vec<TopWaker> = top
            .into_iter()
            .take(TOP)
            .map(|((comm, uid), n)| TopWaker {
                comm: Some(comm.clone()),
                uid: *uid,
                wakes: *n,
            })
            .collect();
        let pci = g.pci.to_string();
        let last_wake = self
            .history
            .iter()
            .rev()
            .find(|w| w.device == pci && w.role == data::Role::Gpu)
            .cloned();
        Some(RuntimePm {
            since: (g.since * 1000.0).round() / 1000.0,
            since_start,
            since_boot: now.map(residency_of),
            counters_reset: g.reset,
            wakes,
            awake_since: g.awake_since_ns.map(to_unix),
            last_wake,
            top_wakers,
            watched: g
                .watched
                .iter()
                .map(|w| Watched {
                    device: w.dev.clone(),
                    role: role(w.role),
                })
                .collect(),
        })
    }

    /// Adds `runtime_pm` to each GPU of a `list` answer.
    pub fn annotate_list(&mut self, gpus: &mut [ListGpu]) {
        for g in gpus {
            g.runtime_pm = Some(self.gpu_json(g.gpu.id));
        }
    }

    /// Adds `runtime_pm` to each GPU of a `status` answer.
    pub fn annotate_status(&mut self, gpus: &mut [StatusGpu]) {
        for g in gpus {
            g.runtime_pm = self.gpu_json(g.id);
        }
    }

    /// The top-level status fields, with each program's run count and
    /// total run time (non-zero only while `kernel.bpf_stats_enabled` is 1).
    pub fn status_json(&self) -> PowerMonitor {
        let programs = self.mon.as_ref().map(PowerMon::stats).unwrap_or_default();
        PowerMonitor {
            running: self.mon.is_some(),
            error: self.error.clone(),
            programs: programs
                .into_iter()
                .map(|(name, prog_id, run_cnt, run_time_ns)| ProgramStats {
                    name: name.to_string(),
                    prog_id,
                    run_cnt,
                    run_time_ns,
                })
                .collect(),
        }
    }

    /// The `wakes` request: the history (oldest first), for one GPU or
    /// all, whole (the caller shows it through `for_viewer`).
    pub fn wakes_json(&mut self, inv: &Inventory, arg: Option<&str>) -> Result<WakesData, String> {
        let only = match arg {
            Some(a) => Some(inv.find(a)?.id),
            None => None,
        };
        let wakes: Vec<Wake> = self
            .history
            .iter()
            .filter(|w| only.is_none_or(|id| w.gpu == id))
            .cloned()
            .collect();
        let ids: Vec<u32> = inv
            .gpus
            .iter()
            .filter(|g| g.offload && only.is_none_or(|id| g.id == id))
            .map(|g| g.id)
            .collect();
        let gpus: Vec<WakesGpu> = ids
            .into_iter()
            .map(|id| {
                let g = inv.gpus.iter().find(|g| g.id == id);
                WakesGpu {
                    id,
                    pci: g.map(|g| g.pci),
                    name: g.and_then(|g| g.name.clone()),
                    power_state: g.and_then(|g| g.power_state.clone()),
                    runtime_status: g.and_then(|g| g.runtime_status.clone()),
                    runtime_pm: self.gpu_json(id),
                }
            })
            .collect();
        Ok(WakesData {
            schema: data::SCHEMA,
            attributed: self.mon.is_some(),
            error: self.error.clone(),
            history_max: HISTORY as u64,
            gpus,
            wakes,
        })
    }
}

/// Whether two wakes have one cause (merged into one history row): the
/// same device, by the same command of the same uid, doing the same thing.
/// The pid is left out: a loop of short-lived readers is one cause.
fn same_cause(a: &Wake, b: &Wake) -> bool {
    (
        a.gpu, &a.device, a.role, a.uid, &a.comm, &a.what, a.kworker, a.r#async,
    ) == (
        b.gpu, &b.device, b.role, b.uid, &b.comm, &b.what, b.kworker, b.r#async,
    )
}

/// Adds a wake to the history, which no one uid can rewrite (issue 18,
/// F6): a repeated wake is merged into its row (counted, moved to the end,
/// pid and times of the latest), each uid's first row is kept, and when
/// the history is full the oldest other row of the uid holding the most
/// rows goes, so every uid keeps its share.
fn remember(history: &mut VecDeque<Wake>, wake: Wake) {
    if let Some(i) = history.iter().rposition(|w| same_cause(w, &wake)) {
        if let Some(mut row) = history.remove(i) {
            row.count = row.count.saturating_add(1);
            row.last_ts = wake.ts;
            row.pid = wake.pid;
            row.tgid = wake.tgid;
            row.mono_ns = wake.mono_ns;
            row.awake_ms = None;
            history.push_back(row);
        }
        return;
    }
    let mut wake = wake;
    wake.first_of_uid = !history.iter().any(|w| w.uid == wake.uid);
    history.push_back(wake);
    while history.len() > HISTORY {
        let mut rows: BTreeMap<Option<u32>, usize> = BTreeMap::new();
        for w in history.iter().filter(|w| !w.first_of_uid) {
            *rows.entry(w.uid).or_insert(0) += 1;
        }
        let heaviest = rows.iter().max_by_key(|(_, n)| **n).map(|(uid, _)| *uid);
        // Only first rows left (more uids than rows): the oldest goes.
        let victim = heaviest
            .and_then(|u| history.iter().position(|w| !w.first_of_uid && w.uid == u))
            .unwrap_or(0);
        history.remove(victim);
    }
}

fn count_waker(wakers: &mut BTreeMap<(String, Option<u32>), u64>, w: &Wake) {
    let key = (w.comm.clone().unwrap_or_else(|| "unknown".into()), w.uid);
    if !wakers.contains_key(&key) && wakers.len() >= WAKER_NAMES {
        if let Some(rarest) = wakers
            .iter()
            .min_by_key(|(_, n)| **n)
            .map(|(k, _)| k.clone())
        {
            wakers.remove(&rarest);
        }
    }
    *wakers.entry(key).or_insert(0) += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::redact::{Redact, Viewer};
    use serde_json::{json, Value};

    fn val<T: serde::Serialize>(v: T) -> Value {
        serde_json::to_value(v).unwrap()
    }

    fn vals(v: Vec<Event>) -> Vec<Value> {
        v.into_iter().map(val).collect()
    }
    use crate::bpf::power::Waker;

    fn c(s: u64, a: u64) -> Counters {
        Counters {
            suspended_ms: s,
            active_ms: a,
        }
    }

    #[test]
    fn residency_arithmetic() {
        let (r, reset) = residency_since(c(1000, 1000), c(98_800, 3_200));
        assert!(!reset);
        assert_eq!(r.asleep_pct, Some(97.8));
        assert_eq!((r.asleep_s, r.awake_s), (97.8, 2.2));
        // Nothing elapsed: no percentage rather than a division by zero.
        let (r, _) = residency_since(c(5, 5), c(5, 5));
        assert_eq!(r.asleep_pct, None);
        assert_eq!(residency_of(c(0, 0)).asleep_pct, None);
        assert_eq!(residency_of(c(1, 2)).asleep_pct, Some(33.3));
    }

    #[test]
    fn counter_reset_counts_from_zero() {
        // Hot unplug and re-plug: the new device's counters restart.
        let (r, reset) = residency_since(c(50_000, 10_000), c(3_000, 1_000));
        assert!(reset);
        assert_eq!(r.asleep_pct, Some(75.0));
        assert_eq!(r.asleep_s, 3.0);
        // One counter going down is enough.
        assert!(residency_since(c(100, 100), c(200, 50)).1);
    }

    fn ev(dev: &str, role: Role, status: u32, ts: u64, waker: Option<Waker>) -> PmEvent {
        PmEvent {
            ts,
            gpu: 1,
            role,
            status,
            dev: dev.into(),
            waker,
        }
    }

    fn lspci() -> Waker {
        Waker {
            ts: 0,
            pid: 4242,
            tgid: 4242,
            uid: 1000,
            comm: "lspci".into(),
            kthread: false,
            r#async: false,
            syscall: Some(17),
            opened: None,
            fd_path: vec![
                "config".into(),
                "0000:01:00.0".into(),
                "0000:00:01.0".into(),
            ],
            mnt: None,
        }
    }

    fn power_with_gpu() -> Power {
        let mut p = Power {
            mon: None,
            error: None,
            sysfs: PathBuf::from("/nonexistent"),
            gpus: BTreeMap::new(),
            last: BTreeMap::new(),
            history: VecDeque::new(),
        };
        p.gpus.insert(
            1,
            GpuPower {
                pci: "0000:01:00.0".parse().unwrap(),
                dir: PathBuf::from("/nonexistent"),
                base: None,
                since: 0.0,
                reset: false,
                wakes: 0,
                awake_since_ns: None,
                wakers: BTreeMap::new(),
                watched: Vec::new(),
            },
        );
        p.last.insert("0000:01:00.0".into(), RPM_SUSPENDED);
        p.last.insert("0000:00:01.0".into(), RPM_SUSPENDED);
        p
    }

    #[test]
    fn wake_then_sleep_makes_events_and_history() {
        let mut p = power_with_gpu();
        let out = vals(p.apply(
            &ev(
                "0000:00:01.0",
                Role::Bridge,
                RPM_ACTIVE,
                1_000_000_000,
                Some(lspci()),
            ),
            100.0,
        ));
        assert_eq!(out[0]["event"], "wake");
        assert_eq!(out[0]["role"], "bridge");
        let out = vals(p.apply(
            &ev(
                "0000:01:00.0",
                Role::Gpu,
                RPM_ACTIVE,
                1_000_000_000,
                Some(lspci()),
            ),
            100.0,
        ));
        let wake = &out[0];
        assert_eq!(wake["event"], "wake");
        assert_eq!(
            (
                wake["gpu"].clone(),
                wake["pci"].clone(),
                wake["comm"].clone()
            ),
            (json!(1), json!("0000:01:00.0"), json!("lspci"))
        );
        assert_eq!(
            wake["what"],
            "read /sys/bus/pci/devices/0000:01:00.0/config"
        );
        assert_eq!(
            (wake["pid"].clone(), wake["uid"].clone()),
            (json!(4242), json!(1000))
        );
        assert_eq!(wake["awake_ms"], Value::Null);
        assert_eq!(out[1]["event"], "power");
        let out = vals(p.apply(
            &ev(
                "0000:01:00.0",
                Role::Gpu,
                RPM_SUSPENDED,
                3_100_000_000,
                None,
            ),
            102.1,
        ));
        assert_eq!(out[0]["event"], "sleep");
        assert_eq!(out[0]["awake_ms"], 2100);
        let j = val(p.gpu_json(1));
        assert_eq!(j["wakes"], Value::Null, "no programs: the count is unknown");
        assert_eq!(j["last_wake"]["awake_ms"], 2100);
        assert_eq!(
            j["top_wakers"][0],
            json!({"comm": "lspci", "uid": 1000, "wakes": 1})
        );
        assert_eq!(p.gpus[&1].wakes, 1, "bridge wakes are not GPU wakes");
        assert_eq!(p.history.len(), 2);
        // A wake with no known cause still counts; active twice is one wake.
        let out = vals(p.apply(
            &ev("0000:01:00.0", Role::Gpu, RPM_ACTIVE, 4_000_000_000, None),
            103.0,
        ));
        assert_eq!(out[0]["event"], "wake");
        assert_eq!(out[0]["comm"], Value::Null);
        assert!(vals(p.apply(
            &ev("0000:01:00.0", Role::Gpu, RPM_ACTIVE, 4_100_000_000, None),
            103.1
        ))
        .iter()
        .all(|v| v["event"] != "wake"));
        assert_eq!(p.gpus[&1].wakes, 2);
    }

    #[test]
    fn plain_users_see_only_their_own_wakers() {
        let mut p = power_with_gpu();
        p.apply(
            &ev(
                "0000:01:00.0",
                Role::Gpu,
                RPM_ACTIVE,
                1_000_000_000,
                Some(lspci()),
            ),
            100.0,
        );
        let own = val(p.gpu_json(1).map(|j| j.for_viewer(Viewer::user(1000))));
        assert_eq!(own["last_wake"]["comm"], "lspci");
        let other = val(p.gpu_json(1).map(|j| j.for_viewer(Viewer::user(1001))));
        assert_eq!(other["last_wake"]["comm"], Value::Null);
        assert_eq!(other["last_wake"]["pid"], Value::Null);
        assert_eq!(other["last_wake"]["file"], Value::Null);
        assert_eq!(other["last_wake"]["op"], "read", "what was done stays");
        assert_eq!(
            other["top_wakers"][0],
            json!({"comm": null, "uid": null, "wakes": 1})
        );
        let mut k = p.history[0].clone();
        k.kworker = true;
        let k = val(k.for_viewer(Viewer::user(1001)));
        assert_eq!(k["comm"], "lspci", "kernel threads are nobody's secret");
    }

    /// A wake of the GPU by `comm` of `uid` reading `file`.
    fn wake_by(uid: u32, comm: &str, file: &str) -> Waker {
        let mut w = lspci();
        w.uid = uid;
        w.comm = comm.into();
        w.fd_path[0] = file.into();
        w
    }

    #[test]
    fn history_is_bounded() {
        let mut p = power_with_gpu();
        for i in 0..(HISTORY as u64 + 50) {
            // Each of another cause (the same one would be merged).
            let w = wake_by(1000, &format!("p{i}"), "config");
            p.apply(
                &ev("0000:01:00.0", Role::Gpu, RPM_ACTIVE, i * 10, Some(w)),
                0.0,
            );
            p.apply(
                &ev("0000:01:00.0", Role::Gpu, RPM_SUSPENDED, i * 10 + 5, None),
                0.0,
            );
        }
        assert_eq!(p.history.len(), HISTORY);
        assert_eq!(p.gpus[&1].wakes, HISTORY as u64 + 50);
        assert!(p.history.iter().all(|w| w.awake_ms == Some(0)));
    }

    /// Issue 18 (F6): 300 `config` reads by one user used to push root's
    /// wake out of the history. Repeated wakes merge into one counted row;
    /// a user varying the cause fills only its share, and each uid's first
    /// wake stays.
    #[test]
    fn one_user_cannot_rewrite_the_wake_history() {
        let mut p = power_with_gpu();
        let mut t = 0;
        let mut wake = |p: &mut Power, w: Waker, ts: f64| {
            t += 10;
            p.apply(&ev("0000:01:00.0", Role::Gpu, RPM_ACTIVE, t, Some(w)), ts);
            p.apply(
                &ev("0000:01:00.0", Role::Gpu, RPM_SUSPENDED, t + 5, None),
                ts,
            );
        };
        wake(&mut p, wake_by(0, "nvidia-smi", "resource0"), 1.0);
        for i in 0..300 {
            wake(&mut p, wake_by(1000, "cat", "config"), 2.0 + f64::from(i));
        }
        assert_eq!(p.history.len(), 2, "300 repeated wakes are one row");
        let row = &p.history[1];
        assert_eq!(
            (row.count, row.ts, row.last_ts),
            (300, Some(2.0), Some(301.0))
        );
        assert_eq!(row.awake_ms, Some(0));
        assert_eq!(p.history[0].comm.as_deref(), Some("nvidia-smi"));
        let j = val(p.gpu_json(1));
        assert_eq!(j["last_wake"]["comm"], "cat");
        assert_eq!(j["last_wake"]["count"], 300);

        // Another user's later wakes, then the attacker varying the cause
        // (a new command name each time) far past the history's size.
        wake(&mut p, wake_by(1001, "game", "card1"), 400.0);
        wake(&mut p, wake_by(1001, "game", "renderD128"), 401.0);
        for i in 0..(3 * HISTORY) {
            wake(&mut p, wake_by(1000, &format!("x{i}"), "config"), 500.0);
        }
        assert_eq!(p.history.len(), HISTORY);
        let of = |uid: u32| p.history.iter().filter(|w| w.uid == Some(uid)).count();
        assert_eq!(of(0), 1, "root's first wake stays");
        assert_eq!(of(1001), 2, "a user under its share keeps its rows");
        assert_eq!(of(1000), HISTORY - 3);
        assert!(
            p.history
                .iter()
                .any(|w| w.uid == Some(1000) && w.comm.as_deref() == Some("cat") && w.count == 300),
            "the attacker's own first row stays too"
        );
        assert_eq!(p.gpus[&1].wakes, 1 + 300 + 2 + 3 * HISTORY as u64);
    }

    #[test]
    fn waker_names_are_bounded() {
        let mut m = BTreeMap::new();
        let mut w = new_wake(&ev("x", Role::Gpu, RPM_ACTIVE, 0, Some(lspci())), "x", 0.0);
        for _ in 0..3 {
            count_waker(&mut m, &w);
        }
        for i in 0..200 {
            w.comm = Some(format!("p{i}"));
            count_waker(&mut m, &w);
        }
        assert!(m.len() <= WAKER_NAMES);
        assert_eq!(
            m[&("lspci".to_string(), Some(1000))],
            3,
            "the frequent one stays"
        );
    }

    #[test]
    fn files_from_kernel_names() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            file_from_parts(
                &v(&["control", "power", "0000:01:00.0", "0000:00:01.0"]),
                None
            )
            .unwrap(),
            "/sys/bus/pci/devices/0000:01:00.0/power/control"
        );
        assert_eq!(
            file_from_parts(&v(&["card1", "dri", "/"]), Some("dev")).unwrap(),
            "/dev/dri/card1"
        );
        assert_eq!(
            file_from_parts(&v(&["nvidia0", "/"]), Some("dev")).unwrap(),
            "/dev/nvidia0"
        );
        assert_eq!(
            file_from_parts(&v(&["x", "tmp", "/"]), Some("/")).unwrap(),
            "/tmp/x"
        );
        assert_eq!(
            file_from_parts(&v(&["a", "b", "c", "d"]), None).unwrap(),
            ".../d/c/b/a"
        );
        assert_eq!(file_from_parts(&[], None), None);
    }

    #[test]
    fn kworker_wakes_say_so() {
        let mut k = lspci();
        k.kthread = true;
        k.comm = "kworker/1:2".into();
        k.syscall = None;
        k.fd_path.clear();
        let w = new_wake(
            &ev("0000:01:00.0", Role::Gpu, RPM_ACTIVE, 0, Some(k)),
            "0000:01:00.0",
            0.0,
        );
        assert!(w.kworker);
        assert_eq!(w.uid, None);
        assert_eq!(w.what, None);
    }
}
