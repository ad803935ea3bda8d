//! Power-off of blocked GPUs that cannot sleep by themselves (issue 19).
//!
//! A GPU whose driver has no runtime D3 (pre-Turing NVIDIA on the
//! proprietary driver, a driver without runtime PM) stays in D0 while it
//! is bound, blocked or not. Unbinding the drivers of every function of
//! its slot lets the PCI core runtime-suspend the functions and then the
//! bridges above them; with `power/control = auto` on each and
//! `d3cold_allowed = 1`, the root port's `_PR3` power resource cuts the
//! rail (D3cold). Leaving the block binds the same drivers again and puts
//! back every attribute changed. Never PCI `remove`, never a module
//! unload, no hand-made ACPI call.
//!
//! The component owns its state (what it unbound, what it changed, what
//! each attempt gave) and the record of it in the state directory
//! (`poweroff.json`, written *before* anything is touched), so that a
//! daemon that dies (kill -9 included) leaves the next start, or the
//! unit's `ExecStopPost=gpuctl poweroff-restore`, enough to bind the
//! drivers again. Exit paths: docs/DESIGN-NOTES.md, "Issue 19".
//!
//! Driver writes (`unbind`, `bind`) run in a forked child with a
//! deadline: a driver that hangs in its remove leaves the child in the
//! kernel, never the daemon's loop.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::log::log;
use crate::gpu::{read_attr, DevNum, Gpu, Inventory, PciAddr};
use crate::proto::data::{PowerOffInfo, PowerOffState};

/// How long an `unbind` or `bind` may take before it counts as hung.
pub const DRIVER_DEADLINE: Duration = Duration::from_secs(5);
/// How soon a refused power-off (a holder) or a fresh one (waiting for the
/// kernel to suspend the slot) is looked at again.
pub const RECHECK: Duration = Duration::from_secs(2);
/// How long a blocked GPU that can sleep by its verdict may stay in D0,
/// nobody holding it, before it counts as unable to (runtime PM's
/// autosuspend delays are a few seconds; NVIDIA's idle timer too).
pub const STUCK_AFTER: Duration = Duration::from_secs(10);
/// How many times a fresh power-off's power state is read again.
pub const MAX_VERIFY: u32 = 5;
/// The record's file name in the state directory.
pub const RECORD_FILE: &str = "poweroff.json";

/// One sysfs attribute the power-off changed, and the value it had.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changed {
    pub path: PathBuf,
    pub was: String,
    pub set: String,
}

/// One function whose driver the power-off unbound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unbound {
    pub pci: PciAddr,
    pub driver: String,
}

/// What was done to one GPU's slot: enough to undo it, in a file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Attributes changed, in the order they were set (undone in reverse).
    pub changed: Vec<Changed>,
    /// Drivers unbound, in the order they were unbound (bound in reverse).
    pub unbound: Vec<Unbound>,
}

/// The steps for one GPU's slot, before anything is done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steps {
    /// `(attribute, value)` to set first: each function's and each bridge's
    /// `power/control = auto` and `d3cold_allowed = 1`.
    pub attrs: Vec<(PathBuf, &'static str)>,
    /// Functions to unbind, in order: audio first, other functions, then
    /// the GPU itself.
    pub unbind: Vec<Unbound>,
}

fn dev_dir(sysfs: &Path, pci: PciAddr) -> PathBuf {
    sysfs.join(format!("bus/pci/devices/{pci}"))
}

/// The bridges from the GPU's parent up to its root port: the parent
/// directories of the function's canonical path that are PCI addresses.
pub fn bridges(sysfs: &Path, gpu: PciAddr) -> Vec<PathBuf> {
    let dir = dev_dir(sysfs, gpu);
    let Ok(real) = std::fs::canonicalize(&dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut p = real.parent();
    while let Some(d) = p {
        let is_pci = d
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.parse::<PciAddr>().is_ok());
        if !is_pci {
            break;
        }
        out.push(d.to_path_buf());
        p = d.parent();
    }
    out
}

/// The steps that power off `gpu`'s slot (pure but for reading the bridge
/// path and each function's `driver` link): every function with a driver
/// bound now is unbound, audio (class 0x04)
/// first, the GPU last; `power/control` and `d3cold_allowed` are set on
/// each function and on every bridge up to the root port.
pub fn steps(sysfs: &Path, gpu: &Gpu) -> Steps {
    let mut funcs: Vec<(u8, PciAddr)> = gpu
        .functions
        .iter()
        .map(|f| {
            let rank = if f.class.starts_with("0x04") { 0 } else { 1 };
            (rank, f.pci)
        })
        .collect();
    funcs.sort();
    funcs.push((2, gpu.pci));
    let mut attrs = Vec::new();
    for (_, pci) in &funcs {
        let d = dev_dir(sysfs, *pci);
        attrs.push((d.join("power/control"), "auto"));
        attrs.push((d.join("d3cold_allowed"), "1"));
    }
    for b in bridges(sysfs, gpu.pci) {
        attrs.push((b.join("power/control"), "auto"));
        attrs.push((b.join("d3cold_allowed"), "1"));
    }
    // The driver bound now, read from sysfs, not the inventory's: a rebind
    // is seen (a runtime-PM turn) before the uevent that re-reads the
    // hardware, and an unbind must name the driver that is there.
    let unbind = funcs
        .into_iter()
        .filter_map(|(_, pci)| read_driver(sysfs, pci).map(|driver| Unbound { pci, driver }))
        .collect();
    Steps { attrs, unbind }
}

/// Why a GPU cannot sleep by itself, if it cannot: the can-it-sleep verdict
/// says no, or it is still awake (D0) `RECHECK` after the block with no
/// holder (`stuck`).
pub fn cannot_sleep(gpu: &Gpu, stuck: bool) -> Option<String> {
    if gpu.sleep.can_sleep == Some(false) {
        return Some(gpu.sleep.summary());
    }
    stuck.then(|| "still in D0 after the block with no holder left".to_string())
}

/// The NVIDIA proprietary driver's cases known to hang or fail on unbind;
/// `None` when none applies. `sysfs` is read for `nvidia_drm`'s modeset.
pub fn nvidia_refusal(sysfs: &Path, gpu: &Gpu) -> Option<String> {
    if gpu.driver.as_deref() != Some("nvidia") {
        return None;
    }
    let modeset = read_attr(&sysfs.join("module/nvidia_drm/parameters/modeset"));
    if modeset.as_deref() == Some("Y") {
        return Some(
            "nvidia-drm is loaded with modeset=1: unbinding the nvidia driver under a \
             modesetting DRM device is known to hang in remove (the DRM device is not \
             torn down first); unload nvidia_drm or boot with nvidia-drm.modeset=0"
                .into(),
        );
    }
    None
}

/// Whether the GPU should be powered off now (before the holder check).
pub fn wanted(gpu: &Gpu, blocked: bool, auto: bool, disabled: bool, stuck: bool) -> bool {
    auto && !disabled && blocked && !gpu.default && cannot_sleep(gpu, stuck).is_some()
}

/// `/dev/nvidia-modeset` (nvidia-modeset.ko's control node; held by a
/// compositor through nvidia-drm).
pub const NVIDIA_MODESET: DevNum = DevNum::new(crate::gpu::NVIDIA_MAJOR, 254);

/// Every node of the slot a holder could keep open: the GPU's nodes and
/// the other functions' sound nodes; for the NVIDIA proprietary driver
/// also `/dev/nvidiactl` and `/dev/nvidia-modeset`, which every NVIDIA
/// GPU shares: its remove waits for the driver's usage count, so an open
/// one (nvidia-persistenced, nvidia-powerd, Xwayland) hangs the unbind
/// ("NVRM: Attempting to remove device … with non-zero usage count").
pub fn slot_nodes(gpu: &Gpu) -> Vec<DevNum> {
    let mut n = gpu.nodes.clone();
    for f in &gpu.functions {
        n.extend(f.sound_nodes.iter().copied());
    }
    if gpu.driver.as_deref() == Some("nvidia") {
        n.extend([crate::gpu::NVIDIACTL, NVIDIA_MODESET]);
    }
    n
}

/// Who holds a node of the slot open, as `comm (pid N) on PATH`. The one
/// call the holder scan hides behind (issue 18 replaces the scan).
pub fn slot_holders(procfs: &Path, gpu: &Gpu) -> Vec<String> {
    let owners = slot_nodes(gpu).into_iter().map(|n| (n, gpu.id)).collect();
    crate::procs::holders(procfs, &owners)
        .into_iter()
        .map(|h| format!("{} (pid {}) on {}", h.comm, h.pid, h.path))
        .collect()
}

/// What one driver write gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Failed(String),
    /// It had not returned at the deadline; the child is left in the
    /// kernel (it cannot be killed there) and reaped later.
    Hung,
}

/// A driver write running in a forked child: its pid, and its pidfd (the
/// loop polls it: readable once the child exited), `None` where the kernel
/// has no `pidfd_open` (before 5.3: the loop looks again on a short timer).
pub struct Helper {
    child: nix::unistd::Pid,
    fd: Option<std::os::fd::OwnedFd>,
}

/// How often a helper without a pidfd is looked at.
pub const HELPER_POLL: Duration = Duration::from_millis(50);

impl Helper {
    /// Writes `value` to `path` in a forked child; returns at once. The
    /// child calls only `open`, `write` and `_exit`.
    pub fn spawn(path: &Path, value: &str) -> Result<Helper, String> {
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| "path has a NUL byte")?;
        let bytes = value.as_bytes().to_vec();
        // SAFETY: the child only calls async-signal-safe functions (open,
        // write, _exit) on memory prepared before the fork, then exits.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                // SAFETY: cpath is a valid NUL-terminated string; bytes is a
                // live buffer of bytes.len() bytes; _exit never returns.
                unsafe {
                    let fd = libc::open(cpath.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        libc::_exit(errno_code());
                    }
                    let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
                    libc::_exit(if n < 0 { errno_code() } else { 0 });
                }
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => Ok(Helper {
                child,
                fd: pidfd_open(child),
            }),
            Err(e) => Err(format!("fork: {e}")),
        }
    }

    /// The pidfd, for the poll set.
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// What the write gave, once the child exited (it is reaped); `None`
    /// while it runs. Never blocks.
    pub fn try_outcome(&self) -> Option<Outcome> {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        match waitpid(self.child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, 0)) => Some(Outcome::Done),
            Ok(WaitStatus::Exited(_, code)) => Some(Outcome::Failed(
                std::io::Error::from_raw_os_error(code).to_string(),
            )),
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                Some(Outcome::Failed(format!("helper killed by {sig}")))
            }
            Ok(_) => None,
            Err(e) => Some(Outcome::Failed(format!("waitpid: {e}"))),
        }
    }

    /// Past its deadline: SIGKILL, and left to the kernel. A child blocked
    /// in a driver's remove is in uninterruptible sleep (D state): the kill
    /// lands when (if) the driver returns, so it is never waited on, only
    /// reaped with `WNOHANG` by [`reap_hung`] once it has gone.
    pub fn abandon(self) -> Outcome {
        let _ = nix::sys::signal::kill(self.child, nix::sys::signal::Signal::SIGKILL);
        HUNG.with(|h| h.borrow_mut().push(self.child));
        Outcome::Hung
    }
}

/// `pidfd_open(2)` (Linux 5.3); `None` where it fails.
fn pidfd_open(pid: nix::unistd::Pid) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1;
    // no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    let fd = i32::try_from(fd).ok().filter(|f| *f >= 0)?;
    // SAFETY: fd was just returned by pidfd_open and is owned by nobody else.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Writes `value` to `path` in a forked child, waiting at most `deadline`
/// (the binds of a restore: the daemon is stopping, or leaving the block).
pub fn write_with_deadline(path: &Path, value: &str, deadline: Duration) -> Outcome {
    let h = match Helper::spawn(path, value) {
        Ok(h) => h,
        Err(e) => return Outcome::Failed(e),
    };
    let end = Instant::now() + deadline;
    loop {
        if let Some(o) = h.try_outcome() {
            return o;
        }
        if Instant::now() >= end {
            return h.abandon();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn errno_code() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(1)
        .clamp(1, 255)
}

thread_local! {
    /// Helpers that were still in the kernel at their deadline.
    static HUNG: std::cell::RefCell<Vec<nix::unistd::Pid>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Reaps helpers that hung and have returned since; how many are left.
pub fn reap_hung() -> usize {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    HUNG.with(|h| {
        let mut h = h.borrow_mut();
        h.retain(|p| {
            matches!(
                waitpid(*p, Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::StillAlive)
            )
        });
        h.len()
    })
}

/// Sets the attributes (recording each old value that differs) and unbinds
/// the drivers, recording each as it goes; `save` is called with the record
/// before each step, so a crash mid-way leaves what was done on disk.
/// Stops at the first driver write that fails or hangs. The blocking form
/// of the component's sequence ([`prepare`], then per function
/// [`unbind_file`] and [`unbind_done`]), which runs each unbind from the
/// loop without waiting.
#[cfg(test)]
pub fn power_off(
    sysfs: &Path,
    steps: &Steps,
    rec: &mut Record,
    deadline: Duration,
    save: &mut dyn FnMut(&Record),
) -> Result<(), String> {
    prepare(steps, rec, save)?;
    for u in &steps.unbind {
        rec.unbound.push(u.clone());
        save(rec);
        let o = write_with_deadline(&unbind_file(sysfs, u), &u.pci.to_string(), deadline);
        unbind_done(rec, u, o, deadline, save)?;
    }
    Ok(())
}

/// The attributes of the path (`power/control`, `d3cold_allowed`), each
/// old value that differs recorded (and saved) before it is written.
pub fn prepare(
    steps: &Steps,
    rec: &mut Record,
    save: &mut dyn FnMut(&Record),
) -> Result<(), String> {
    for (path, value) in &steps.attrs {
        let Some(was) = read_attr(path) else {
            continue; // not every bridge has d3cold_allowed
        };
        if was == *value {
            continue;
        }
        rec.changed.push(Changed {
            path: path.clone(),
            was,
            set: value.to_string(),
        });
        save(rec);
        if let Err(e) = std::fs::write(path, value) {
            rec.changed.pop();
            save(rec);
            return Err(format!("writing {value} to {}: {e}", path.display()));
        }
    }
    Ok(())
}

/// The file an unbind of `u` is written to.
pub fn unbind_file(sysfs: &Path, u: &Unbound) -> PathBuf {
    let unbind = dev_dir(sysfs, u.pci).join("driver/unbind");
    if unbind.exists() {
        unbind
    } else {
        sysfs.join(format!("bus/pci/drivers/{}/unbind", u.driver))
    }
}

/// Files what an unbind of `u` (already the last of `rec.unbound`) gave: a
/// failed one leaves the record; a hung one stays in it (a restore binds
/// it again).
pub fn unbind_done(
    rec: &mut Record,
    u: &Unbound,
    o: Outcome,
    deadline: Duration,
    save: &mut dyn FnMut(&Record),
) -> Result<(), String> {
    match o {
        Outcome::Done => Ok(()),
        Outcome::Failed(e) => {
            rec.unbound.pop();
            save(rec);
            Err(format!("unbinding {} from {}: {e}", u.pci, u.driver))
        }
        Outcome::Hung => Err(format!(
            "unbinding {} from {} did not return within {} s: the driver hangs in its \
             remove; left as it is",
            u.pci,
            u.driver,
            deadline.as_secs()
        )),
    }
}

/// Undoes a record: binds the drivers again (the GPU first: reverse order),
/// then puts back each attribute (reverse order). Returns what failed.
pub fn restore(sysfs: &Path, rec: &Record, deadline: Duration) -> Vec<String> {
    let mut errs = Vec::new();
    for u in rec.unbound.iter().rev() {
        // Already bound (someone else bound it, or the unbind never
        // happened): nothing to do.
        let link = dev_dir(sysfs, u.pci).join("driver");
        let bound_to = std::fs::read_link(&link)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        if bound_to.as_deref() == Some(u.driver.as_str()) {
            continue;
        }
        let bind = sysfs.join(format!("bus/pci/drivers/{}/bind", u.driver));
        match write_with_deadline(&bind, &u.pci.to_string(), deadline) {
            Outcome::Done => {}
            Outcome::Failed(e) => errs.push(format!("binding {} to {}: {e}", u.pci, u.driver)),
            Outcome::Hung => errs.push(format!(
                "binding {} to {} did not return within {} s",
                u.pci,
                u.driver,
                deadline.as_secs()
            )),
        }
    }
    for c in rec.changed.iter().rev() {
        if let Err(e) = std::fs::write(&c.path, &c.was) {
            errs.push(format!("restoring {} to {}: {e}", c.path.display(), c.was));
        }
    }
    errs
}

/// Reads the records (GPU PCI address → record); a missing file is none.
pub fn load(path: &Path) -> Result<BTreeMap<PciAddr, Record>, String> {
    match crate::safefile::read_capped(path, crate::safefile::MAX_FILE) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", path.display())),
        Err(crate::safefile::ReadError::Missing) => Ok(BTreeMap::new()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn save(path: &Path, recs: &BTreeMap<PciAddr, Record>) -> Result<(), String> {
    if recs.is_empty() {
        return match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("removing {}: {e}", path.display())),
        };
    }
    let body = serde_json::to_vec_pretty(recs).map_err(|e| e.to_string())?;
    super::state::write_atomic(path, &body).map_err(|e| format!("{e:#}"))
}

/// Binds back everything a record file says was unbound, and removes it
/// (daemon start, `gpuctl poweroff-restore`). Returns the log lines.
pub fn restore_file(sysfs: &Path, path: &Path) -> Vec<String> {
    let recs = match load(path) {
        Ok(r) => r,
        Err(e) => {
            return vec![format!(
                "power-off record unreadable ({e}); nothing restored"
            )]
        }
    };
    let mut out = Vec::new();
    for (gpu, rec) in &recs {
        let errs = restore(sysfs, rec, DRIVER_DEADLINE);
        if errs.is_empty() {
            out.push(format!(
                "power-off of {gpu} undone: {} driver(s) bound again, {} attribute(s) restored",
                rec.unbound.len(),
                rec.changed.len()
            ));
        } else {
            out.push(format!(
                "undoing the power-off of {gpu}: {}",
                errs.join("; ")
            ));
        }
    }
    if let Err(e) = save(path, &BTreeMap::new()) {
        out.push(e);
    }
    out
}

/// The component: records, what each GPU got, and the next recheck.
pub struct PowerOff {
    path: PathBuf,
    records: BTreeMap<PciAddr, Record>,
    /// The driver each unbound function had right after the power-off
    /// (`None` on a real sysfs): a later bound driver is a rebind.
    after: BTreeMap<PciAddr, Option<String>>,
    info: BTreeMap<PciAddr, PowerOffInfo>,
    /// When each blocked GPU was first seen blocked and awake.
    awake_since: BTreeMap<PciAddr, Instant>,
    /// GPUs whose driver hung: not tried again while this daemon runs.
    hung: Vec<PciAddr>,
    recheck: Option<Instant>,
    /// How many times each powered-off GPU's state was read again.
    verifies: BTreeMap<PciAddr, u32>,
    /// What the last sync saw (blocked set, each GPU's driver and power
    /// state, the setting): a turn that changed none of it and is not
    /// due does nothing (no holder scan on every request).
    last: Option<SyncKey>,
    /// The power-off whose unbind runs now (one at a time); its record is
    /// in `records` (and on disk) from the first step.
    flight: Option<Flight>,
}

/// A power-off in progress: the unbind running in a helper, and the rest.
struct Flight {
    gpu: Gpu,
    steps: Steps,
    /// The index in `steps.unbind` of the unbind running.
    step: usize,
    helper: Helper,
    /// After this, the step counts as hung.
    until: Instant,
}

type SyncKey = (
    Vec<u32>,
    Vec<(PciAddr, Option<String>, Option<String>)>,
    bool,
    bool,
);

/// The kernel command line's `gpuctl.disable` (issue 20 owns its meaning
/// for the rest of gpuctl): no power-off at all while it is given.
pub fn disabled_by_cmdline(procfs: &Path) -> bool {
    std::fs::read_to_string(procfs.join("cmdline")).is_ok_and(|c| {
        c.split_whitespace()
            .any(|w| w == "gpuctl.disable" || w == "gpuctl.disable=1")
    })
}

/// What the daemon passes in for one sync.
pub struct Inputs<'a> {
    pub sysfs: &'a Path,
    pub procfs: &'a Path,
    pub inventory: &'a Inventory,
    pub blocked: &'a std::collections::BTreeSet<u32>,
    pub auto: bool,
    /// The kernel command line's `gpuctl.disable` (issue 20's hook).
    pub disabled: bool,
    pub now: Instant,
}

impl PowerOff {
    /// Opens the component; first binds back anything a previous daemon
    /// left unbound (its record file), before anything else is applied.
    pub fn start(state_dir: &Path, sysfs: &Path) -> PowerOff {
        let path = state_dir.join(RECORD_FILE);
        if path.exists() {
            for l in restore_file(sysfs, &path) {
                log!("{l}");
            }
        }
        PowerOff {
            path,
            records: BTreeMap::new(),
            after: BTreeMap::new(),
            info: BTreeMap::new(),
            awake_since: BTreeMap::new(),
            hung: Vec::new(),
            recheck: None,
            verifies: BTreeMap::new(),
            last: None,
            flight: None,
        }
    }

    /// The running helper's pidfd, for the poll set (`Src::Helper`).
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.flight.as_ref().and_then(|f| f.helper.fd())
    }

    /// Whether an unbind is running.
    pub fn in_flight(&self) -> bool {
        self.flight.is_some()
    }

    /// When [`PowerOff::sync`] is due again (a refusal to retry, a fresh
    /// power-off to verify, a blocked GPU that may be stuck in D0).
    pub fn deadline(&self) -> Option<Instant> {
        let flight = self.flight.as_ref().map(|f| match f.helper.fd() {
            Some(_) => f.until,
            None => f.until.min(Instant::now() + HELPER_POLL),
        });
        self.recheck.into_iter().chain(flight).min()
    }

    /// What was done to a GPU and what it gave (`status`, `list`).
    pub fn info(&self, pci: PciAddr) -> Option<&PowerOffInfo> {
        self.info.get(&pci)
    }

    /// Brings each GPU's slot to what the block asks; returns the GPUs whose
    /// [`PowerOffInfo`] changed (for `events`).
    pub fn sync(&mut self, i: &Inputs) -> Vec<(u32, PciAddr, Option<PowerOffInfo>)> {
        let key: SyncKey = (
            i.blocked.iter().copied().collect(),
            i.inventory
                .gpus
                .iter()
                .map(|g| {
                    // Read now: a runtime-PM transition is a turn of its own
                    // (the power monitor), and the inventory is not re-read
                    // for it. Neither file wakes the GPU.
                    let dir = dev_dir(i.sysfs, g.pci);
                    let ps = read_attr(&dir.join("power_state"));
                    let rs = read_attr(&dir.join("power/runtime_status"));
                    (
                        g.pci,
                        g.driver.clone(),
                        ps.zip(rs).map(|(p, r)| format!("{p} {r}")),
                    )
                })
                .collect(),
            i.auto,
            i.disabled,
        );
        let mut changed = self.advance(i);
        let due = self.recheck.is_some_and(|t| i.now >= t);
        if self.last.as_ref() == Some(&key) && !due {
            return changed;
        }
        self.last = Some(key);
        reap_hung();
        self.recheck = None;
        for gpu in &i.inventory.gpus {
            let before = self.info.get(&gpu.pci).cloned();
            self.sync_one(i, gpu);
            let now = self.info.get(&gpu.pci).cloned();
            if now != before {
                changed.push((gpu.id, gpu.pci, now));
            }
        }
        // GPUs that went away: their records stay until restored.
        changed
    }

    fn sync_one(&mut self, i: &Inputs, gpu: &Gpu) {
        // Its unbind is running: [`PowerOff::advance`] continues it, and
        // what the block asks is looked at once it is done.
        if self.flight.as_ref().is_some_and(|f| f.gpu.pci == gpu.pci) {
            return;
        }
        let blocked = i.blocked.contains(&gpu.id);
        // Read now, not from the inventory (re-read only on uevents and
        // requests): a GPU that went to sleep since must not count as
        // stuck. These files never wake the GPU.
        let dir = dev_dir(i.sysfs, gpu.pci);
        let awake = read_attr(&dir.join("power_state")).as_deref() == Some("D0")
            && read_attr(&dir.join("power/runtime_status")).as_deref() != Some("suspended");
        // Awake since when, while blocked: seen asleep (or unblocked), the
        // count starts again.
        if blocked && awake && !self.records.contains_key(&gpu.pci) {
            self.awake_since.entry(gpu.pci).or_insert(i.now);
        } else {
            self.awake_since.remove(&gpu.pci);
        }
        let holders = || slot_holders(i.procfs, gpu);
        let stuck = self
            .awake_since
            .get(&gpu.pci)
            .is_some_and(|t| i.now.duration_since(*t) >= STUCK_AFTER);
        // Once powered off, the verdict no longer applies (an unbound GPU
        // reads as suspended): it stays off while the block stands.
        let want = if self.records.contains_key(&gpu.pci) {
            i.auto && !i.disabled && blocked && !gpu.default
        } else {
            wanted(gpu, blocked, i.auto, i.disabled, stuck)
        };
        if !want {
            if self.records.contains_key(&gpu.pci) {
                self.undo(i.sysfs, gpu);
            } else if blocked && awake && i.auto && !i.disabled && !gpu.default {
                // Maybe stuck in D0: look again once the grace is over.
                self.due(i.now + RECHECK);
            }
            self.info.remove(&gpu.pci);
            return;
        }
        if self.hung.contains(&gpu.pci) {
            return;
        }
        if let Some(rec) = self.records.get(&gpu.pci) {
            // Done already: a driver that came back on its own is unbound
            // again; otherwise the power truth is read.
            let back: Vec<&Unbound> = rec
                .unbound
                .iter()
                .filter(|u| {
                    let now = read_driver(i.sysfs, u.pci);
                    now.is_some() && now != self.after.get(&u.pci).cloned().flatten()
                })
                .collect();
            if back.is_empty() {
                // What is bound now is the baseline for the next look (the
                // kernel drops the link during the unbind).
                let now: Vec<(PciAddr, Option<String>)> = rec
                    .unbound
                    .iter()
                    .map(|u| (u.pci, read_driver(i.sysfs, u.pci)))
                    .collect();
                self.after.extend(now);
                self.verify(i, gpu);
                return;
            }
            log!(
                "{}: driver bound again by someone else ({}); powering off again",
                gpu.label(),
                back.iter()
                    .map(|u| u.pci.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if let Some(why) = nvidia_refusal(i.sysfs, gpu) {
            self.set_info(gpu, PowerOffState::Refused, Some(why), Vec::new());
            return;
        }
        let who = holders();
        if !who.is_empty() {
            self.set_info(
                gpu,
                PowerOffState::Refused,
                Some(format!("held open by {}", who.join(", "))),
                Vec::new(),
            );
            self.due(i.now + RECHECK);
            return;
        }
        // Another GPU's unbind is running: this one waits its turn.
        if self.flight.is_some() {
            return;
        }
        let steps = steps(i.sysfs, gpu);
        let mut rec = self.records.remove(&gpu.pci).unwrap_or_default();
        // A redo keeps the first record's old values; only new unbinds add.
        rec.unbound
            .retain(|u| !steps.unbind.iter().any(|s| s.pci == u.pci));
        let prepared = prepare(&steps, &mut rec, &mut |r| self.save_with(gpu.pci, r));
        self.records.insert(gpu.pci, rec);
        self.verifies.remove(&gpu.pci);
        match prepared {
            Ok(()) => self.start_step(i, gpu.clone(), steps, 0),
            Err(e) => self.finish(i, gpu, Err(e)),
        }
    }

    /// Saves the records with `rec` as the GPU's (before each step).
    fn save_with(&self, pci: PciAddr, rec: &Record) {
        let mut all = self.records.clone();
        all.insert(pci, rec.clone());
        if let Err(e) = save(&self.path, &all) {
            log!("saving the power-off record: {e}");
        }
    }

    /// Starts the unbind `step` of `steps` in a helper (its record saved
    /// first), or files the outcome when none is left.
    fn start_step(&mut self, i: &Inputs, gpu: Gpu, steps: Steps, step: usize) {
        let Some(u) = steps.unbind.get(step).cloned() else {
            return self.finish(i, &gpu, Ok(()));
        };
        let Some(mut rec) = self.records.remove(&gpu.pci) else {
            return;
        };
        // What is done so far (`unbound` while under way).
        let unbound = rec
            .unbound
            .iter()
            .map(|u| format!("{}={}", u.pci, u.driver))
            .collect();
        rec.unbound.push(u.clone());
        self.save_with(gpu.pci, &rec);
        match Helper::spawn(&unbind_file(i.sysfs, &u), &u.pci.to_string()) {
            Ok(helper) => {
                self.records.insert(gpu.pci, rec);
                self.set_info(
                    &gpu,
                    PowerOffState::PoweringOff,
                    Some(format!("unbinding {} from {}", u.pci, u.driver)),
                    unbound,
                );
                self.flight = Some(Flight {
                    gpu,
                    steps,
                    step,
                    helper,
                    until: i.now + DRIVER_DEADLINE,
                });
            }
            Err(e) => {
                let r = unbind_done(
                    &mut rec,
                    &u,
                    Outcome::Failed(e),
                    DRIVER_DEADLINE,
                    &mut |r| self.save_with(gpu.pci, r),
                );
                self.records.insert(gpu.pci, rec);
                self.finish(i, &gpu, r);
            }
        }
    }

    /// Continues the power-off in progress: the running unbind returned
    /// (next step, or the outcome), or is past its deadline (`failed`, the
    /// helper left to the kernel). Never waits. Returns what changed.
    fn advance(&mut self, i: &Inputs) -> Vec<(u32, PciAddr, Option<PowerOffInfo>)> {
        let Some(f) = self.flight.take() else {
            return Vec::new();
        };
        let before = self.info.get(&f.gpu.pci).cloned();
        let outcome = match f.helper.try_outcome() {
            Some(o) => o,
            None if i.now >= f.until => f.helper.abandon(),
            None => {
                self.flight = Some(f);
                return Vec::new();
            }
        };
        let Flight {
            gpu, steps, step, ..
        } = f;
        if let Some(mut rec) = self.records.remove(&gpu.pci) {
            let u = steps.unbind[step].clone();
            let r = unbind_done(&mut rec, &u, outcome, DRIVER_DEADLINE, &mut |r| {
                self.save_with(gpu.pci, r)
            });
            self.records.insert(gpu.pci, rec);
            match r {
                Ok(()) => self.start_step(i, gpu.clone(), steps, step + 1),
                Err(e) => self.finish(i, &gpu, Err(e)),
            }
        }
        // Done or not, the next sync looks at every GPU again.
        self.last = None;
        let now = self.info.get(&gpu.pci).cloned();
        if now != before {
            vec![(gpu.id, gpu.pci, now)]
        } else {
            Vec::new()
        }
    }

    fn unbound_of(&self, pci: PciAddr) -> Vec<String> {
        self.records
            .get(&pci)
            .map(|r| {
                r.unbound
                    .iter()
                    .map(|u| format!("{}={}", u.pci, u.driver))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Files the outcome of a power-off whose record is in `records`.
    fn finish(&mut self, i: &Inputs, gpu: &Gpu, result: Result<(), String>) {
        let Some(rec) = self.records.get(&gpu.pci) else {
            return;
        };
        let after: Vec<(PciAddr, Option<String>)> = rec
            .unbound
            .iter()
            .map(|u| (u.pci, read_driver(i.sysfs, u.pci)))
            .collect();
        self.after.extend(after);
        let done = describe(rec);
        let unbound = self.unbound_of(gpu.pci);
        if let Err(e) = save(&self.path, &self.records) {
            log!("saving the power-off record: {e}");
        }
        match result {
            Ok(()) => {
                log!(
                    "{}: drivers unbound ({done}), waiting for the rail",
                    gpu.label()
                );
                self.set_info(gpu, PowerOffState::Off, None, unbound);
                self.verify(i, gpu);
                self.due(i.now + RECHECK);
            }
            Err(e) => {
                log!("{}: power-off failed: {e}", gpu.label());
                if e.contains("did not return") {
                    self.hung.push(gpu.pci);
                }
                self.set_info(gpu, PowerOffState::Failed, Some(e), unbound);
            }
        }
    }

    /// Reads the GPU's power state now and files it; while it is not in
    /// D3 yet, looks again after [`RECHECK`] (at most [`MAX_VERIFY`] times:
    /// the kernel suspends an unbound slot within its autosuspend delay).
    fn verify(&mut self, i: &Inputs, gpu: &Gpu) {
        let ps = read_attr(&dev_dir(i.sysfs, gpu.pci).join("power_state"));
        let asleep = ps.as_deref().is_some_and(|p| p.starts_with("D3"));
        if let Some(info) = self.info.get_mut(&gpu.pci) {
            info.power_state = ps;
        }
        let n = self.verifies.entry(gpu.pci).or_insert(0);
        if !asleep && *n < MAX_VERIFY {
            *n += 1;
            self.due(i.now + RECHECK);
        }
    }

    fn undo(&mut self, sysfs: &Path, gpu: &Gpu) {
        let Some(rec) = self.records.remove(&gpu.pci) else {
            return;
        };
        let errs = restore(sysfs, &rec, DRIVER_DEADLINE);
        for u in &rec.unbound {
            self.after.remove(&u.pci);
        }
        if let Err(e) = save(&self.path, &self.records) {
            log!("saving the power-off record: {e}");
        }
        self.info.remove(&gpu.pci);
        if errs.is_empty() {
            log!("{}: drivers bound again ({})", gpu.label(), describe(&rec));
        } else {
            log!("{}: binding back: {}", gpu.label(), errs.join("; "));
        }
    }

    /// Daemon stop: every slot bound again, every attribute put back.
    pub fn restore_all(&mut self, sysfs: &Path) {
        // An unbind still running is left to the kernel (never waited on);
        // its function is in the record and bound back below.
        if let Some(f) = self.flight.take() {
            f.helper.abandon();
        }
        let recs = std::mem::take(&mut self.records);
        for (gpu, rec) in &recs {
            let errs = restore(sysfs, rec, DRIVER_DEADLINE);
            if errs.is_empty() {
                log!("{gpu}: drivers bound again ({})", describe(rec));
            } else {
                log!("{gpu}: binding back: {}", errs.join("; "));
            }
        }
        self.info.clear();
        if let Err(e) = save(&self.path, &self.records) {
            log!("saving the power-off record: {e}");
        }
    }

    fn set_info(
        &mut self,
        gpu: &Gpu,
        state: PowerOffState,
        reason: Option<String>,
        unbound: Vec<String>,
    ) {
        let same = self
            .info
            .get(&gpu.pci)
            .is_some_and(|o| o.state == state && o.reason == reason && o.unbound == unbound);
        if same {
            return;
        }
        self.info.insert(
            gpu.pci,
            PowerOffInfo {
                state,
                since: unix_now(),
                unbound,
                power_state: None,
                reason,
            },
        );
    }

    fn due(&mut self, t: Instant) {
        self.recheck = Some(self.recheck.map_or(t, |r| r.min(t)));
    }
}

fn describe(rec: &Record) -> String {
    rec.unbound
        .iter()
        .map(|u| format!("{} {}", u.pci, u.driver))
        .collect::<Vec<_>>()
        .join(", ")
}

fn read_driver(sysfs: &Path, pci: PciAddr) -> Option<String> {
    std::fs::read_link(dev_dir(sysfs, pci).join("driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The fixture machines (tests/common/fixture.rs) for the decision's tests.
#[cfg(test)]
#[path = "../../tests/common/fixture.rs"]
#[allow(dead_code)]
mod fixture;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{test_gpu, Function};
    use std::os::unix::fs::symlink;

    /// A fixture sysfs: root port 00:02.0 (under `pci0000:00`), GPU
    /// 01:00.0 bound to `gpudrv`, HDA 01:00.1 bound to `snd_hda_intel`;
    /// every `power/control` `on`, every `d3cold_allowed` `0`, the GPU in D0.
    fn machine(tag: &str) -> (PathBuf, Gpu) {
        let root = std::env::temp_dir().join(format!("gpuctl-po-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let port = root.join("devices/pci0000:00/0000:00:02.0");
        for (dir, drv) in [
            (port.clone(), "pcieport"),
            (port.join("0000:01:00.0"), "gpudrv"),
            (port.join("0000:01:00.1"), "snd_hda_intel"),
        ] {
            std::fs::create_dir_all(dir.join("power")).unwrap();
            std::fs::write(dir.join("power/control"), "on\n").unwrap();
            std::fs::write(dir.join("d3cold_allowed"), "0\n").unwrap();
            std::fs::write(dir.join("power_state"), "D0\n").unwrap();
            let d = root.join("bus/pci/drivers").join(drv);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("bind"), "").unwrap();
            std::fs::write(d.join("unbind"), "").unwrap();
            symlink(&d, dir.join("driver")).unwrap();
            let name = dir.file_name().unwrap().to_owned();
            std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
            symlink(&dir, root.join("bus/pci/devices").join(name)).unwrap();
        }
        let mut g = test_gpu(1, "0000:01:00.0", "10de", false);
        g.driver = Some("gpudrv".into());
        g.power_state = Some("D0".into());
        g.runtime_status = Some("active".into());
        g.sleep.can_sleep = Some(false);
        g.functions.push(Function {
            pci: "0000:01:00.1".parse().unwrap(),
            vendor_id: "10de".into(),
            device_id: "10fa".into(),
            class: "0x040300".into(),
            driver: Some("snd_hda_intel".into()),
            power_state: Some("D0".into()),
            runtime_status: Some("active".into()),
            sound_nodes: vec![DevNum::new(116, 7)],
        });
        (root, g)
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap()
    }

    #[test]
    fn steps_unbind_audio_first_and_prepare_the_path_to_the_root_port() {
        let (root, g) = machine("steps");
        let s = steps(&root, &g);
        let order: Vec<String> = s
            .unbind
            .iter()
            .map(|u| format!("{}={}", u.pci, u.driver))
            .collect();
        assert_eq!(order, ["0000:01:00.1=snd_hda_intel", "0000:01:00.0=gpudrv"]);
        let port = std::fs::canonicalize(root.join("devices/pci0000:00/0000:00:02.0")).unwrap();
        assert!(s.attrs.contains(&(port.join("power/control"), "auto")));
        assert!(s.attrs.contains(&(port.join("d3cold_allowed"), "1")));
        // The host bridge directory is not a PCI function: the walk stops.
        assert!(!s
            .attrs
            .iter()
            .any(|(p, _)| p.ends_with("pci0000:00/power/control")));
        assert_eq!(
            s.attrs.len(),
            6,
            "two functions and one port, two attributes each"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn which_gpus_are_powered_off() {
        let (root, mut g) = machine("wanted");
        assert!(
            wanted(&g, true, true, false, false),
            "blocked, cannot sleep"
        );
        assert!(!wanted(&g, false, true, false, false), "not blocked");
        assert!(!wanted(&g, true, false, false, false), "power_off = never");
        assert!(!wanted(&g, true, true, true, false), "gpuctl.disable");
        g.default = true;
        assert!(
            !wanted(&g, true, true, false, false),
            "the default GPU, never"
        );
        g.default = false;
        // A GPU that can sleep by itself is left alone, unless it stayed in D0.
        g.sleep.can_sleep = Some(true);
        assert!(!wanted(&g, true, true, false, false));
        assert!(
            wanted(&g, true, true, false, true),
            "stuck in D0 after the block"
        );
        g.sleep.can_sleep = None;
        assert!(
            !wanted(&g, true, true, false, false),
            "unknown: not on a guess"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn nvidia_with_modeset_is_refused() {
        let (root, mut g) = machine("nv");
        assert_eq!(nvidia_refusal(&root, &g), None, "not the nvidia driver");
        g.driver = Some("nvidia".into());
        assert_eq!(nvidia_refusal(&root, &g), None, "nvidia_drm not loaded");
        let m = root.join("module/nvidia_drm/parameters");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("modeset"), "Y\n").unwrap();
        assert!(nvidia_refusal(&root, &g).unwrap().contains("modeset=1"));
        std::fs::write(m.join("modeset"), "N\n").unwrap();
        assert_eq!(nvidia_refusal(&root, &g), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Drops the `driver` links, as the kernel does on unbind.
    fn kernel_unbinds(root: &Path) {
        for f in ["0000:01:00.0", "0000:01:00.1"] {
            let _ = std::fs::remove_file(root.join("bus/pci/devices").join(f).join("driver"));
        }
    }

    /// Puts the `driver` links back, as the kernel does on bind.
    fn kernel_binds(root: &Path) {
        for (f, d) in [
            ("0000:01:00.0", "gpudrv"),
            ("0000:01:00.1", "snd_hda_intel"),
        ] {
            let l = root.join("bus/pci/devices").join(f).join("driver");
            if std::fs::symlink_metadata(&l).is_err() {
                symlink(root.join("bus/pci/drivers").join(d), l).unwrap();
            }
        }
    }

    #[test]
    fn power_off_writes_in_order_and_restore_puts_everything_back() {
        let (root, g) = machine("order");
        let s = steps(&root, &g);
        let mut rec = Record::default();
        let mut saved = Vec::new();
        power_off(&root, &s, &mut rec, DRIVER_DEADLINE, &mut |r| {
            saved.push(r.clone())
        })
        .unwrap();
        let dev = |a: &str| root.join("bus/pci/devices").join(a);
        for a in ["0000:01:00.0", "0000:01:00.1", "0000:00:02.0"] {
            assert_eq!(read(&dev(a).join("power/control")), "auto");
            assert_eq!(read(&dev(a).join("d3cold_allowed")), "1");
        }
        assert_eq!(
            read(&root.join("bus/pci/drivers/snd_hda_intel/unbind")),
            "0000:01:00.1"
        );
        assert_eq!(
            read(&root.join("bus/pci/drivers/gpudrv/unbind")),
            "0000:01:00.0"
        );
        // The record was on disk before each step: the last save before an
        // unbind already names it.
        let before_gpu_unbind = &saved[saved.len() - 1];
        assert_eq!(before_gpu_unbind.unbound.len(), 2);
        assert_eq!(saved[0].changed.len(), 1, "saved before the first write");
        assert_eq!(rec.changed.len(), 6);
        assert_eq!(rec.changed[0].was, "on");

        kernel_unbinds(&root);
        let errs = restore(&root, &rec, DRIVER_DEADLINE);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(
            read(&root.join("bus/pci/drivers/gpudrv/bind")),
            "0000:01:00.0"
        );
        assert_eq!(
            read(&root.join("bus/pci/drivers/snd_hda_intel/bind")),
            "0000:01:00.1"
        );
        for a in ["0000:01:00.0", "0000:01:00.1", "0000:00:02.0"] {
            assert_eq!(read(&dev(a).join("power/control")), "on");
            assert_eq!(read(&dev(a).join("d3cold_allowed")), "0");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_driver_hanging_in_unbind_does_not_hang_the_caller() {
        let (root, g) = machine("hang");
        hang_unbind(&root);
        let s = steps(&root, &g);
        let mut rec = Record::default();
        let t = Instant::now();
        let err =
            power_off(&root, &s, &mut rec, Duration::from_millis(300), &mut |_| {}).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert!(err.contains("did not return"), "{err}");
        // The hung unbind stays in the record: a restore binds it again.
        assert_eq!(rec.unbound.len(), 2);
        // The helper was killed (a FIFO open is interruptible) and is reaped.
        assert_helpers_reaped();
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// The GPU's driver `unbind` becomes a FIFO nobody reads: open(O_WRONLY)
    /// blocks, like a driver's remove that never returns.
    fn hang_unbind(root: &Path) {
        let unbind = root.join("bus/pci/drivers/gpudrv/unbind");
        std::fs::remove_file(&unbind).unwrap();
        nix::unistd::mkfifo(&unbind, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    }

    /// The killed helpers (a FIFO open is interruptible) are reaped within 2 s.
    fn assert_helpers_reaped() {
        let end = Instant::now() + Duration::from_secs(2);
        while reap_hung() > 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(reap_hung(), 0);
    }

    #[test]
    fn a_failing_unbind_is_reported_and_not_recorded() {
        let (root, g) = machine("fail");
        std::fs::remove_file(root.join("bus/pci/drivers/gpudrv/unbind")).unwrap();
        std::fs::create_dir(root.join("bus/pci/drivers/gpudrv/unbind")).unwrap();
        let s = steps(&root, &g);
        let mut rec = Record::default();
        let err = power_off(&root, &s, &mut rec, DRIVER_DEADLINE, &mut |_| {}).unwrap_err();
        assert!(err.contains("unbinding 0000:01:00.0 from gpudrv"), "{err}");
        assert_eq!(rec.unbound.len(), 1, "only the audio function was unbound");
        std::fs::remove_dir_all(&root).unwrap();
    }

    fn inputs<'a>(
        root: &'a Path,
        procfs: &'a Path,
        inv: &'a Inventory,
        blocked: &'a std::collections::BTreeSet<u32>,
        now: Instant,
    ) -> Inputs<'a> {
        Inputs {
            sysfs: root,
            procfs,
            inventory: inv,
            blocked,
            auto: true,
            disabled: false,
            now,
        }
    }

    /// Syncs until no unbind runs (the loop's turns, as its helpers
    /// exit); the last sync's changes that were not empty.
    fn settle(po: &mut PowerOff, i: &Inputs) -> Vec<(u32, PciAddr, Option<PowerOffInfo>)> {
        let mut last = po.sync(i);
        let end = Instant::now() + Duration::from_secs(5);
        while po.in_flight() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
            let c = po.sync(i);
            if !c.is_empty() {
                last = c;
            }
        }
        assert!(!po.in_flight(), "the helpers returned");
        last
    }

    #[test]
    fn the_component_powers_off_refuses_on_a_holder_and_restores() {
        let (root, g) = machine("comp");
        let state = root.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let procfs = root.join("proc");
        // A process holding the HDA function's control node (116:7 is not
        // a real device here: use /dev/null's number for the holder).
        let mut g = g;
        g.functions[0].sound_nodes = vec![DevNum::new(1, 3)];
        let p = procfs.join("4242");
        std::fs::create_dir_all(p.join("fd")).unwrap();
        std::fs::write(p.join("comm"), "pipewire\n").unwrap();
        symlink("/dev/null", p.join("fd/3")).unwrap();
        let inv = Inventory {
            gpus: vec![g.clone()],
            ..Default::default()
        };
        let blocked = [1].into_iter().collect();
        let mut po = PowerOff::start(&state, &root);
        let t0 = Instant::now();
        let ch = po.sync(&inputs(&root, &procfs, &inv, &blocked, t0));
        assert_eq!(ch.len(), 1);
        assert_eq!(ch[0].2.as_ref().unwrap().state, PowerOffState::Refused);
        let why = ch[0].2.as_ref().unwrap().reason.clone().unwrap();
        assert!(why.contains("pipewire (pid 4242)"), "{why}");
        assert_eq!(
            read(&root.join("bus/pci/drivers/gpudrv/unbind")),
            "",
            "nothing touched"
        );
        assert!(po.deadline().is_some(), "looks again later");
        // Same inputs, not due: nothing (no scan).
        assert!(po
            .sync(&inputs(&root, &procfs, &inv, &blocked, t0))
            .is_empty());

        // The holder exits: at the recheck the power-off follows.
        std::fs::remove_dir_all(&p).unwrap();
        let ch = settle(
            &mut po,
            &inputs(&root, &procfs, &inv, &blocked, t0 + RECHECK),
        );
        assert_eq!(ch[0].2.as_ref().unwrap().state, PowerOffState::Off);
        assert_eq!(
            ch[0].2.as_ref().unwrap().unbound,
            ["0000:01:00.1=snd_hda_intel", "0000:01:00.0=gpudrv"]
        );
        assert_eq!(ch[0].2.as_ref().unwrap().power_state.as_deref(), Some("D0"));
        assert!(state.join(RECORD_FILE).exists(), "the record is on disk");
        kernel_unbinds(&root);

        // A daemon that died: the next start binds back from the record.
        let mut po2 = PowerOff::start(&state, &root);
        assert_eq!(
            read(&root.join("bus/pci/drivers/gpudrv/bind")),
            "0000:01:00.0"
        );
        assert!(!state.join(RECORD_FILE).exists());
        assert_eq!(
            read(&root.join("bus/pci/devices/0000:00:02.0/d3cold_allowed")),
            "0"
        );
        // Its own power-off, then the block is lifted: bound again.
        kernel_binds(&root);
        std::fs::write(root.join("bus/pci/drivers/gpudrv/bind"), "").unwrap();
        settle(&mut po2, &inputs(&root, &procfs, &inv, &blocked, t0));
        assert!(po2.info(g.pci).is_some());
        kernel_unbinds(&root);
        let none = Default::default();
        po2.sync(&inputs(&root, &procfs, &inv, &none, t0));
        assert_eq!(
            read(&root.join("bus/pci/drivers/gpudrv/bind")),
            "0000:01:00.0"
        );
        assert!(po2.info(g.pci).is_none());
        assert!(!state.join(RECORD_FILE).exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_hung_unbind_is_in_flight_without_waiting_and_failed_at_its_deadline() {
        let (root, g) = machine("flight");
        let state = root.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let procfs = root.join("proc");
        std::fs::create_dir_all(&procfs).unwrap();
        hang_unbind(&root);
        let inv = Inventory {
            gpus: vec![g.clone()],
            ..Default::default()
        };
        let blocked = [1].into_iter().collect();
        let mut po = PowerOff::start(&state, &root);
        let t0 = Instant::now();
        let t = Instant::now();
        // The turns before the deadline return at once, the step in flight.
        let mut i = 0;
        while po.info(g.pci).map(|x| x.reason.clone())
            != Some(Some("unbinding 0000:01:00.0 from gpudrv".into()))
        {
            po.sync(&inputs(&root, &procfs, &inv, &blocked, t0));
            std::thread::sleep(Duration::from_millis(5));
            i += 1;
            assert!(i < 1000, "{:?}", po.info(g.pci));
        }
        assert!(t.elapsed() < DRIVER_DEADLINE, "{:?}", t.elapsed());
        assert_eq!(po.info(g.pci).unwrap().state, PowerOffState::PoweringOff);
        assert!(po.in_flight());
        assert!(po.fd().is_some(), "the helper's pidfd is polled");
        assert_eq!(po.deadline(), Some(t0 + DRIVER_DEADLINE));
        // The record is on disk already, the hung function in it.
        let recs = load(&state.join(RECORD_FILE)).unwrap();
        assert_eq!(recs[&g.pci].unbound.len(), 2);
        // At the deadline: failed, the helper left to the kernel.
        let ch = po.sync(&inputs(
            &root,
            &procfs,
            &inv,
            &blocked,
            t0 + DRIVER_DEADLINE,
        ));
        let info = ch[0].2.as_ref().unwrap();
        assert_eq!(info.state, PowerOffState::Failed);
        assert!(
            info.reason.as_deref().unwrap().contains("did not return"),
            "{info:?}"
        );
        assert!(!po.in_flight());
        assert_helpers_reaped();
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_driver_bound_again_by_someone_else_is_unbound_again() {
        let (root, g) = machine("rebind");
        let state = root.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let procfs = root.join("proc");
        std::fs::create_dir_all(&procfs).unwrap();
        let inv = Inventory {
            gpus: vec![g.clone()],
            ..Default::default()
        };
        let blocked = [1].into_iter().collect();
        let mut po = PowerOff::start(&state, &root);
        let t0 = Instant::now();
        settle(&mut po, &inputs(&root, &procfs, &inv, &blocked, t0));
        kernel_unbinds(&root);
        let unbind = root.join("bus/pci/drivers/gpudrv/unbind");
        std::fs::write(&unbind, "").unwrap();
        // Rediscovered after the unbind: no driver. Not unbound again.
        let mut off = inv.clone();
        off.gpus[0].driver = None;
        off.gpus[0].functions[0].driver = None;
        // Unbound, the verdict reads differently: it stays off all the same.
        off.gpus[0].sleep.can_sleep = None;
        off.gpus[0].runtime_status = Some("suspended".into());
        po.sync(&inputs(&root, &procfs, &off, &blocked, t0 + RECHECK));
        assert_eq!(
            read(&root.join("bus/pci/drivers/gpudrv/bind")),
            "",
            "not undone"
        );
        assert_eq!(read(&unbind), "");
        // drivers_probe bound it again (the link is back).
        let dev = root.join("bus/pci/devices/0000:01:00.0");
        symlink(root.join("bus/pci/drivers/gpudrv"), dev.join("driver")).unwrap();
        // Seen before the uevent re-reads the hardware: the inventory still
        // says unbound; the link is what counts.
        settle(
            &mut po,
            &inputs(&root, &procfs, &off, &blocked, t0 + RECHECK * 2),
        );
        assert_eq!(read(&unbind), "0000:01:00.0");
        // The first record's old values are kept: a restore still puts `on` back.
        let recs = load(&state.join(RECORD_FILE)).unwrap();
        assert_eq!(recs[&g.pci].changed[0].was, "on");
        std::fs::remove_dir_all(&root).unwrap();
    }

    use super::fixture;

    fn discovered(m: &fixture::Machine) -> Inventory {
        crate::gpu::discover(&crate::gpu::Roots {
            sysfs: m.sysfs().to_path_buf(),
            procfs: m.procfs().to_path_buf(),
        })
        .unwrap()
    }

    #[test]
    fn on_every_fixture_machine_only_offload_gpus_that_cannot_sleep_are_chosen() {
        for name in fixture::MACHINES {
            let m = fixture::machine(name);
            let inv = discovered(&m);
            for g in &inv.gpus {
                let blocked = g.offload;
                let w = wanted(g, blocked, true, false, false);
                assert_eq!(
                    w,
                    blocked && g.sleep.can_sleep == Some(false),
                    "{name}: {} (sleep {:?})",
                    g.label(),
                    g.sleep
                );
                assert!(
                    !(g.default && w),
                    "{name}: the default GPU is never powered off"
                );
                let s = steps(m.sysfs(), g);
                // The GPU itself (when bound) is the last unbind; audio first.
                if g.driver.is_some() {
                    assert_eq!(s.unbind.last().map(|u| u.pci), Some(g.pci), "{name}");
                }
                let first_audio = s.unbind.iter().position(|u| {
                    g.functions
                        .iter()
                        .any(|f| f.pci == u.pci && f.class.starts_with("0x04"))
                });
                assert!(
                    first_audio.is_none_or(|i| i == 0),
                    "{name}: audio first: {:?}",
                    s.unbind
                );
                // Every bridge on the way is prepared, none above the root port.
                for b in bridges(m.sysfs(), g.pci) {
                    assert!(s.attrs.contains(&(b.join("d3cold_allowed"), "1")), "{name}");
                }
            }
        }
    }

    #[test]
    fn verdict_inputs_decide_nvidia_generations_and_firmware_without_pr3() {
        // intel_nvidia: the RTX 3050 (Ampere, fine-grained runtime D3) sleeps by itself.
        let m = fixture::machine("intel_nvidia");
        let dgpu = "0000:01:00.0";
        let pick = |inv: &Inventory| {
            inv.gpus
                .iter()
                .find(|g| g.pci.to_string() == dgpu)
                .cloned()
                .unwrap()
        };
        let g = pick(&discovered(&m));
        assert!(
            !wanted(&g, true, true, false, false),
            "Ampere sleeps: {:?}",
            g.sleep
        );
        // The same board on the 580 legacy branch (pre-Turing: no runtime D3),
        // awake (the driver's file is read only then).
        m.set_power(dgpu, "D0", "active");
        let p = m.procfs().join(format!("driver/nvidia/gpus/{dgpu}/power"));
        std::fs::write(&p, "Runtime D3 status:          Not supported\n").unwrap();
        let g = pick(&discovered(&m));
        assert_eq!(g.sleep.can_sleep, Some(false), "{:?}", g.sleep);
        assert!(wanted(&g, true, true, false, false));
        let s = steps(m.sysfs(), &g);
        assert_eq!(s.unbind.last().unwrap().driver, "nvidia");
        // With nvidia-drm modeset=1 it is refused, with the reason.
        let ms = m.sysfs().join("module/nvidia_drm/parameters");
        std::fs::create_dir_all(&ms).unwrap();
        std::fs::write(ms.join("modeset"), "Y\n").unwrap();
        assert!(nvidia_refusal(m.sysfs(), &g).unwrap().contains("hang"));

        // Firmware without _PR3 (d3cold_allowed 0, no power resource): the GPU
        // still runtime-suspends (D3hot), so it sleeps by itself: not chosen
        // on the verdict, only if it stays in D0 after the block.
        let m = fixture::machine("intel_nvidia");
        m.write_sys(&format!("bus/pci/devices/{dgpu}/d3cold_allowed"), "0\n");
        let g = pick(&discovered(&m));
        assert_eq!(g.sleep.d3cold, Some(false), "{:?}", g.sleep);
        assert!(!wanted(&g, true, true, false, false));
        assert!(wanted(&g, true, true, false, true), "stuck in D0: chosen");
        // power/control = on (runtime PM off): it never sleeps while bound.
        m.write_sys(&format!("bus/pci/devices/{dgpu}/power/control"), "on\n");
        let g = pick(&discovered(&m));
        assert_eq!(g.sleep.can_sleep, Some(false));
        assert!(wanted(&g, true, true, false, false));
    }

    #[test]
    fn a_blocked_gpu_that_sleeps_is_not_stuck_and_one_that_stays_in_d0_is() {
        let (root, mut g) = machine("stuck");
        g.sleep.can_sleep = Some(true);
        let state = root.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let procfs = root.join("proc");
        std::fs::create_dir_all(&procfs).unwrap();
        let dev = root.join("bus/pci/devices/0000:01:00.0");
        std::fs::write(dev.join("power/runtime_status"), "active\n").unwrap();
        let inv = Inventory {
            gpus: vec![g.clone()],
            ..Default::default()
        };
        let blocked = [1].into_iter().collect();
        let mut po = PowerOff::start(&state, &root);
        let t0 = Instant::now();
        po.sync(&inputs(&root, &procfs, &inv, &blocked, t0));
        assert!(po.deadline().is_some(), "looks again");
        // It went to sleep and woke again (a reader): the count starts over.
        std::fs::write(dev.join("power_state"), "D3cold\n").unwrap();
        po.sync(&inputs(&root, &procfs, &inv, &blocked, t0 + RECHECK));
        std::fs::write(dev.join("power_state"), "D0\n").unwrap();
        po.sync(&inputs(&root, &procfs, &inv, &blocked, t0 + STUCK_AFTER));
        assert_eq!(
            read(&root.join("bus/pci/drivers/gpudrv/unbind")),
            "",
            "not stuck"
        );
        assert!(po.info(g.pci).is_none());
        // Awake for STUCK_AFTER on end: powered off.
        let t1 = t0 + STUCK_AFTER;
        let mut t = t1;
        while t <= t1 + STUCK_AFTER {
            settle(&mut po, &inputs(&root, &procfs, &inv, &blocked, t));
            t += RECHECK;
        }
        assert_eq!(
            read(&root.join("bus/pci/drivers/gpudrv/unbind")),
            "0000:01:00.0"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
