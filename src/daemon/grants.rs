//! Grants bound to live processes (smart mode).
//!
//! A grant is keyed by tgid in the kernel's map and carries the process's
//! start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`); the
//! BPF side ignores an entry whose start time is not the current holder's of
//! that pid, so a grant never passes to a process that reuses the pid.
//!
//! - `gpuctl run` grants the connecting process only: the daemon holds a
//!   pidfd of it from accept (`SO_PEERPIDFD`, or `pidfd_open`), reads its
//!   start time while the pidfd shows it alive (so the pid is still its), and
//!   checks again after the insert (an exit in between removes the entry).
//! - **Exit**: the kernel's exit hook removes a process's entry when its
//!   last thread exits, so the map holds live processes' grants. Nothing on
//!   a request's path reads `/proc` per grant (issue 21): the kernel walks
//!   the map for `status` and hands back only the grants it lists (the
//!   lowest pids the caller may see) and the counts, each grant with its
//!   holder's name (`comm`, as of its last exec or fork: the hooks write it,
//!   the daemon from `/proc/<pid>/stat` when it grants); and only when the
//!   map changed since the last walk ([`Enforcer::grant_list`]).
//! - **Sweep**: an entry the daemon made (`run`, a restore) whose process
//!   exited before it was written is left behind; such entries are removed
//!   when a `run` finds the map full or its uid at its cap (at most once a
//!   second), and at a clean stop. Entries the kernel's hooks made are
//!   theirs to remove (they are counted, see below).
//! - **Per uid**: one uid holds at most [`PER_UID_RUN_GRANTS`] grants made by
//!   `gpuctl run` (root: no cap), counted by the kernel's walk of the map
//!   (each entry names its uid); the grants the kernel's hooks make (inherited at fork,
//!   `DRI_PRIME`, app rules) are counted apart, in the kernel, against each
//!   uid's share of the map ([`crate::bpf::GrantShare`]; issue 18).
//! - **Restart**: on a clean stop the grants are saved with the boot id; the
//!   next daemon re-installs those whose process still runs with the same
//!   start time, and grants the processes they forked while no daemon ran.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::proto::data::{GrantGpus, GrantShareView, GrantView, UidGrants, GRANTS_LISTED};
use crate::proto::redact::Viewer;
use serde::{Deserialize, Serialize};

use super::auth::{self, Peer};
use super::log::log;
use super::reject::Rejection;
use crate::bpf::{self, Enforcer, Grant, GrantHow};
use crate::policy::Mode;
use crate::safefile::{self, ReadError};

/// `gpuctl run` grants one non-root uid may hold at once.
pub const PER_UID_RUN_GRANTS: usize = 256;
/// Sweeps triggered by grant requests run at most this often.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Facts of a live process from `/proc/<pid>/stat` and its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    pub ppid: u32,
    /// Clock ticks since boot.
    pub start: u64,
    pub uid: u32,
    /// Its command name (the kernel's `comm`): stored in its grant, so
    /// `status` names grants without reading `/proc` (issue 21).
    pub comm: String,
}

/// Parses `/proc/<pid>/stat`: `pid (comm) state ppid … starttime(22) …`,
/// into (ppid, start time, comm). The comm can hold spaces and
/// parentheses: it runs from the first '(' to the last ')', and the fields
/// count from there.
pub fn parse_stat(stat: &str) -> Option<(u32, u64, &str)> {
    let close = stat.rfind(')')?;
    let comm = stat.get(stat.find('(')? + 1..close)?;
    let rest = &stat[close + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): field N is f[N - 3].
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?, comm))
}

/// The process `pid` as `/proc` shows it now (`None`: no such process).
pub fn proc_info(pid: u32) -> Option<ProcInfo> {
    use std::os::unix::fs::MetadataExt;
    let dir = Path::new("/proc").join(pid.to_string());
    let stat = safefile::read_capped(&dir.join("stat"), 4096).ok()?;
    let stat = String::from_utf8_lossy(&stat);
    let (ppid, start, comm) = parse_stat(&stat)?;
    let uid = std::fs::metadata(&dir).ok()?.uid();
    Some(ProcInfo {
        ppid,
        start,
        uid,
        comm: comm.to_string(),
    })
}

/// The kernel's boot id (grants saved under another boot mean nothing).
fn boot_id() -> Option<String> {
    let b = safefile::read_capped(Path::new("/proc/sys/kernel/random/boot_id"), 64).ok()?;
    Some(String::from_utf8_lossy(&b).trim().to_string())
}

/// Now, in clock ticks since boot (the unit of process start times).
fn now_ticks() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for clock_gettime to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 100 + t.tv_nsec as u64 / 10_000_000
}

#[derive(Serialize, Deserialize)]
struct SavedGrants {
    boot_id: String,
    /// When they were saved (clock ticks since boot).
    saved: u64,
    grants: Vec<Grant>,
}

/// Grants to re-install after a restart: the saved ones whose process still
/// runs with the same start time, and for every process started since the
/// save what the fork and exec hooks would have given it while no daemon
/// ran: its nearest granted ancestor's grant (fork), unless its executable
/// has an app rule (exec): `deny` takes the grant away (from its children
/// too), `allow` grants its GPUs. `exe_rule(pid)` is the app rule of the
/// process's executable now, as `(allow, gpus)` (only the last exec is
/// known: DESIGN-NOTES). `procs` is every live process (pid → facts).
pub fn restorable(
    saved: &[Grant],
    saved_at: u64,
    procs: &BTreeMap<u32, ProcInfo>,
    exe_rule: &mut dyn FnMut(u32) -> Option<(bool, u32)>,
) -> Vec<Grant> {
    // Re-installed by the daemon: counted in no uid's kernel share (that
    // count started again with the new map), owned by the process's uid.
    let live: BTreeMap<u32, Grant> = saved
        .iter()
        .filter_map(|g| {
            let p = procs.get(&g.pid).filter(|p| p.start == g.start)?;
            let g = Grant {
                uid: p.uid,
                inherited: false,
                comm: p.comm.clone(),
                ..g.clone()
            };
            Some((g.pid, g))
        })
        .collect();
    // What each process started since the save got (None: no grant).
    let mut decided: BTreeMap<u32, Option<Grant>> = BTreeMap::new();
    for (&pid, info) in procs {
        if live.contains_key(&pid) || info.start < saved_at || decided.contains_key(&pid) {
            continue;
        }
        // Walk up while the ancestors are themselves new (bounded: a chain
        // longer than the process count is a loop), down to the grant the
        // oldest new one inherited.
        let mut chain = vec![pid];
        let mut inherited: Option<Grant> = None;
        let (mut cur, mut child_start) = (info.ppid, info.start);
        for _ in 0..procs.len() {
            let Some(p) = procs.get(&cur) else { break };
            // A parent must have started before its child: otherwise the pid
            // was reused and the chain is broken.
            if p.start > child_start {
                break;
            }
            if let Some(g) = live.get(&cur) {
                inherited = Some(g.clone());
                break;
            }
            if let Some(d) = decided.get(&cur) {
                inherited = d.clone();
                break;
            }
            if p.start < saved_at {
                break;
            }
            chain.push(cur);
            child_start = p.start;
            cur = p.ppid;
        }
        // Then down the chain, as fork and exec did it.
        let mut g = inherited;
        for &c in chain.iter().rev() {
            let (start, uid, comm) = procs
                .get(&c)
                .map_or((0, 0, ""), |p| (p.start, p.uid, p.comm.as_str()));
            g = match exe_rule(c) {
                Some((false, _)) => None,
                Some((true, gpus)) => Some(Grant {
                    pid: c,
                    gpus,
                    how: GrantHow::App,
                    only: false,
                    start,
                    uid,
                    inherited: false,
                    comm: comm.to_string(),
                }),
                None => g.map(|g| Grant {
                    pid: c,
                    start,
                    uid,
                    comm: comm.to_string(),
                    ..g
                }),
            };
            decided.insert(c, g.clone());
        }
    }
    let mut by_pid = live;
    by_pid.extend(decided.into_iter().filter_map(|(pid, g)| Some((pid, g?))));
    by_pid.into_values().collect()
}

/// Every live process, from `/proc`.
fn all_procs() -> BTreeMap<u32, ProcInfo> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, proc_info(pid)?)))
        .collect()
}

/// The grants' own state; the grants themselves are in the kernel's map
/// (the enforcer's).
pub struct Grants {
    /// `grants.json`: the grants a clean stop saved for the next daemon.
    path: PathBuf,
    /// When grants were last checked against live processes.
    last_sweep: Option<Instant>,
    /// The kernel's walk of the map failed and the log said so (once: the
    /// copy answers instead, every time).
    walk_failed: bool,
}

impl Grants {
    pub fn new(state_dir: &Path) -> Grants {
        Grants {
            path: state_dir.join("grants.json"),
            last_sweep: None,
            walk_failed: false,
        }
    }

    /// Removes the entries the daemon made whose process is gone or whose
    /// pid now belongs to another process (one `/proc` read each; the
    /// kernel's own entries are not looked at: its exit hook removes them).
    fn sweep(&mut self, enforcer: &mut Enforcer) {
        self.last_sweep = Some(Instant::now());
        for g in enforcer.grants().into_iter().filter(|g| !g.inherited) {
            if proc_info(g.pid).is_none_or(|p| p.start != g.start) {
                if let Err(e) = enforcer.revoke(g.pid) {
                    log!("{e:#}");
                }
            }
        }
    }

    /// A sweep, unless one ran less than [`SWEEP_EVERY`] ago.
    fn sweep_if_due(&mut self, enforcer: &mut Enforcer) {
        if self.last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
            self.sweep(enforcer);
        }
    }

    /// `gpuctl run`: grants the caller's own process (the one that
    /// connected, held as a pidfd) access to `gpu`.
    /// `max_grants` is the map's size (from the config), for the message
    /// when it is full.
    pub fn grant_peer(
        &mut self,
        enforcer: &mut Enforcer,
        max_grants: u32,
        peer: &Peer,
        gpu: &crate::gpu::Gpu,
        only: bool,
    ) -> Result<(), Rejection> {
        let gone = || {
            Rejection::Refused(
                "refused: the process that asked for the grant has exited (a grant belongs to a \
                 live process, never to a pid number)"
                    .into(),
            )
        };
        let (Some(pidfd), Ok(pid)) = (&peer.pidfd, u32::try_from(peer.pid)) else {
            return Err(gone());
        };
        // Read while the pidfd shows the process alive: the pid is still
        // its, so the start time read is its (and its name, which the
        // grant keeps for `status`: read once here, never per request).
        let info = proc_info(pid);
        let Some(info) = info.filter(|_| auth::alive(pidfd)) else {
            return Err(gone());
        };
        self.cap(enforcer, peer.uid)?;
        let g = Grant {
            pid,
            gpus: 1 << gpu.id,
            how: GrantHow::Run,
            only,
            start: info.start,
            uid: peer.uid,
            inherited: false,
            comm: info.comm,
        };
        let mut stored = enforcer.grant(&g)?;
        if !stored {
            // Full: drop what the dead left, then try once more.
            self.sweep_if_due(enforcer);
            stored = enforcer.grant(&g)?;
        }
        if !stored {
            return Err(Rejection::Refused(format!(
                "refused: {max_grants} processes already hold a grant (max_grants in the \
                 config); this one stays denied"
            )));
        }
        // It may have exited between the read and the insert: then the
        // exit hook found nothing to remove, and the entry must go.
        if !auth::alive(pidfd) {
            let _ = enforcer.revoke(pid);
            return Err(gone());
        }
        Ok(())
    }

    /// Before a grant: refuses a plain user who already holds
    /// [`PER_UID_RUN_GRANTS`] grants from `gpuctl run`, counted from the
    /// map's entries (each names its uid; no `/proc` read), by the kernel's
    /// walk of the map (no copy of it; a copy if the walk cannot run). At
    /// the cap, a due sweep first drops entries of processes that are gone.
    fn cap(&mut self, enforcer: &mut Enforcer, uid: u32) -> Result<(), Rejection> {
        if uid == 0 {
            return Ok(());
        }
        let mut n = self.run_grants(enforcer, uid);
        if n >= PER_UID_RUN_GRANTS {
            self.sweep_if_due(enforcer);
            n = self.run_grants(enforcer, uid);
        }
        if n >= PER_UID_RUN_GRANTS {
            return Err(Rejection::Refused(format!(
                "refused: uid {uid} already holds {n} grants from `gpuctl run` (at most \
                 {PER_UID_RUN_GRANTS} per user)"
            )));
        }
        Ok(())
    }

    /// The `gpuctl run` grants `uid` holds: the kernel's walk counts them;
    /// a copy of the map if the walk cannot run.
    fn run_grants(&mut self, enforcer: &mut Enforcer, uid: u32) -> usize {
        match enforcer.grant_list(Some(uid)) {
            Ok(l) => usize::try_from(l.runs).unwrap_or(usize::MAX),
            Err(e) => {
                self.say_walk_failed(&e);
                run_grants_of(&enforcer.grants(), uid)
            }
        }
    }

    /// Says once that the kernel's walk of the map failed.
    fn say_walk_failed(&mut self, e: &anyhow::Error) {
        if !self.walk_failed {
            self.walk_failed = true;
            log!("{e:#}; reading the whole grant map instead (said once)");
        }
    }

    /// On a clean stop: saves the grants for the next daemon (smart mode).
    pub fn save(&mut self, enforcer: &Enforcer, mode: Mode) {
        let path = self.path.clone();
        if mode != Mode::Smart {
            let _ = std::fs::remove_file(&path);
            return;
        }
        // At a stop, not on a request: one /proc read per grant is fine.
        let grants: Vec<Grant> = enforcer
            .grants()
            .into_iter()
            .filter(|g| proc_info(g.pid).is_some_and(|p| p.start == g.start))
            .collect();
        let Some(boot_id) = boot_id() else {
            return;
        };
        let saved = SavedGrants {
            boot_id,
            saved: now_ticks(),
            grants,
        };
        let n = saved.grants.len();
        let res = serde_json::to_vec(&saved)
            .map_err(anyhow::Error::from)
            .and_then(|b| Ok(safefile::write_atomic(&path, &b, 0o600)?));
        match res {
            Ok(()) if n > 0 => log!("saved {n} grant(s) for the next start"),
            Ok(()) => {}
            Err(e) => log!("saving grants to {} failed: {e:#}", path.display()),
        }
    }

    /// At start, after the saved mode and the app rules are in force:
    /// re-installs the grants a previous daemon saved (see [`restorable`]),
    /// with `apps` (kernel identity of an executable → `(allow, gpus)`)
    /// applied to the processes started since. The file is consumed.
    pub fn restore(
        &mut self,
        enforcer: &mut Enforcer,
        mode: Mode,
        apps: &BTreeMap<crate::gpu::FileId, (bool, u32)>,
    ) {
        let path = self.path.clone();
        let bytes = match safefile::read_own(&path) {
            Ok(b) => b,
            Err(ReadError::Missing) => return,
            Err(e) => {
                log!("ignoring saved grants {}: {e}", path.display());
                let _ = std::fs::remove_file(&path);
                return;
            }
        };
        let _ = std::fs::remove_file(&path);
        let saved: SavedGrants = match serde_json::from_slice(&bytes) {
            Ok(s) => s,
            Err(e) => {
                log!("ignoring saved grants {}: {e}", path.display());
                return;
            }
        };
        if mode != Mode::Smart || Some(&saved.boot_id) != boot_id().as_ref() {
            return;
        }
        let mut ruled = 0;
        let mut exe_rule = |pid: u32| {
            if apps.is_empty() {
                return None;
            }
            // O_PATH: the executable itself, whatever mount namespace or
            // permission hides its path (the daemon has CAP_SYS_PTRACE).
            let exe = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                .open(format!("/proc/{pid}/exe"))
                .ok()?;
            let rule = apps.get(&enforcer.kernel_file_id(&exe).ok()?).copied();
            ruled += usize::from(rule.is_some());
            rule
        };
        let restore = restorable(&saved.grants, saved.saved, &all_procs(), &mut exe_rule);
        if ruled > 0 {
            log!("{ruled} process(es) started while no daemon ran run a program with an app rule: applied");
        }
        let mut n = 0;
        for g in &restore {
            match enforcer.grant(g) {
                Ok(true) => n += 1,
                Ok(false) => log!("grant map full: pid {} not restored", g.pid),
                Err(e) => log!("{e:#}"),
            }
        }
        // `restore` holds the saved grants whose process still runs and the
        // children those forked while no daemon ran (issue 18: the line
        // counted both as "saved").
        let kept = restore.iter().filter(|g| saved.grants.contains(g)).count();
        log!(
            "restored {n} of {} grant(s): {kept} of {} saved, {} of children forked while no \
             daemon ran ({} dropped: process gone)",
            restore.len(),
            saved.grants.len(),
            restore.len() - kept,
            saved.grants.len().saturating_sub(kept)
        );
    }

    /// Grants as `status` shows them: everything to root and the group; a
    /// plain user sees their own processes and the number of the others.
    /// At most [`GRANTS_LISTED`] are listed (the lowest pids; the third
    /// value counts the rest), named as their grants say (the name as of
    /// the holder's last exec or fork: nothing is read from `/proc`). The
    /// kernel picks them in a walk of the map ([`Enforcer::grant_list`]),
    /// only when the map changed since the last one (issue 21).
    pub fn view(&mut self, enforcer: &mut Enforcer, viewer: Viewer) -> (Vec<GrantView>, u64, u64) {
        let (shown, seen, total) = match enforcer.grant_list(viewer.0) {
            Ok(l) => (l.listed, l.seen, l.total),
            Err(e) => {
                self.say_walk_failed(&e);
                Self::pick(enforcer.grants(), viewer)
            }
        };
        let hidden = total.saturating_sub(seen);
        let not_listed = seen.saturating_sub(shown.len() as u64);
        let views = shown
            .into_iter()
            .map(|g| GrantView {
                comm: Some(g.comm).filter(|c| !c.is_empty()),
                pid: g.pid,
                uid: Some(g.uid),
                how: Some(g.how),
                only: g.only,
                gpus: if g.gpus == u32::MAX {
                    GrantGpus::All
                } else {
                    GrantGpus::Ids(
                        (0..bpf::MAX_GPUS)
                            .filter(|i| g.gpus & (1 << i) != 0)
                            .collect(),
                    )
                },
            })
            .collect();
        (views, hidden, not_listed)
    }

    /// What [`Enforcer::grant_list`] finds, from a copy of the whole map
    /// (when the kernel's walk cannot be made): the [`GRANTS_LISTED`]
    /// lowest pids `viewer` sees, by pid, the number it sees, the total.
    fn pick(all: Vec<Grant>, viewer: Viewer) -> (Vec<Grant>, u64, u64) {
        let total = all.len() as u64;
        let mut shown: Vec<Grant> = all
            .into_iter()
            .filter(|g| viewer.sees(Some(g.uid)))
            .collect();
        let seen = shown.len() as u64;
        if shown.len() > GRANTS_LISTED {
            shown.select_nth_unstable_by_key(GRANTS_LISTED, |g| g.pid);
            shown.truncate(GRANTS_LISTED);
        }
        shown.sort_unstable_by_key(|g| g.pid);
        (shown, seen, total)
    }

    /// The kernel's per-uid counts and the limits (`status`; redacted for
    /// the viewer by the caller). `None` if the counters cannot be read.
    pub fn share_view(enforcer: &mut Enforcer, max_grants: u32) -> Option<GrantShareView> {
        let c = match enforcer.share_counts() {
            Ok(c) => c,
            Err(e) => {
                log!("{e:#}");
                return None;
            }
        };
        let s = bpf::GrantShare::for_map(max_grants);
        let mut uids: Vec<UidGrants> = c
            .uids
            .into_iter()
            .filter(|&(_, held, refused)| held > 0 || refused > 0)
            .map(|(uid, inherited, refused)| UidGrants {
                uid,
                inherited,
                refused,
            })
            .collect();
        uids.sort_by_key(|u| u.uid);
        Some(GrantShareView {
            share: s.share,
            reserve_at: s.reserve_at,
            small: s.small,
            kernel_grants: c.kernel_grants,
            refused: c.refused,
            uids,
        })
    }
}

/// `gpuctl run` grants of `uid` among `grants` (the kernel's own entries,
/// inherited ones included, are counted apart, against its share).
fn run_grants_of(grants: &[Grant], uid: u32) -> usize {
    grants
        .iter()
        .filter(|g| !g.inherited && g.how == GrantHow::Run && g.uid == uid)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_hostile_comm() {
        let s = "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 1 2\n";
        assert_eq!(parse_stat(s), Some((1, 98765, "a) b) (c")));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 )x( S 0"), None);
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        let (ppid, _, comm) = parse_stat(&me).unwrap();
        assert_eq!(
            comm,
            std::fs::read_to_string("/proc/self/comm")
                .unwrap()
                .trim_end()
        );
        // SAFETY: getppid has no preconditions.
        assert_eq!(ppid as i32, unsafe { libc::getppid() });
    }

    fn g(pid: u32, start: u64) -> Grant {
        Grant {
            pid,
            gpus: 2,
            how: GrantHow::Run,
            only: false,
            start,
            uid: 0,
            inherited: false,
            comm: "saved".into(),
        }
    }

    fn p(ppid: u32, start: u64) -> ProcInfo {
        ProcInfo {
            ppid,
            start,
            uid: 1000,
            comm: format!("p{start}"),
        }
    }

    #[test]
    fn restores_live_grants_and_gap_children_only() {
        let saved = [g(100, 50), g(200, 60), g(300, 70)];
        let procs = BTreeMap::from([
            (1, p(0, 0)),
            (100, p(1, 50)),     // alive, same process: restored
            (200, p(1, 999)),    // pid reused by another process: not restored
            (101, p(100, 150)),  // forked by 100 after the save: inherits
            (102, p(101, 160)),  // its child: inherits too
            (103, p(100, 90)),   // forked before the save, not in the map: it had exec'd
            (400, p(1, 170)),    // unrelated new process
            (201, p(200, 1000)), // child of the reused pid: no grant
        ]);
        let r = restorable(&saved, 100, &procs, &mut |_| None);
        let got: Vec<(u32, u64)> = r.iter().map(|g| (g.pid, g.start)).collect();
        assert_eq!(got, vec![(100, 50), (101, 150), (102, 160)]);
        assert!(r.iter().all(|x| x.gpus == 2 && x.how == GrantHow::Run));
        // Owned by the live process's uid, and the daemon's (not counted in
        // a kernel share), whatever the saved file said; named as the
        // process is named now (what `status` shows from the grant).
        assert!(r.iter().all(|x| x.uid == 1000 && !x.inherited));
        let names: Vec<&str> = r.iter().map(|g| g.comm.as_str()).collect();
        assert_eq!(names, ["p50", "p150", "p160"]);
    }

    #[test]
    fn the_run_cap_counts_run_grants_only() {
        let mk = |uid, how, inherited| Grant {
            uid,
            how,
            inherited,
            ..g(1, 1)
        };
        let grants = [
            mk(1000, GrantHow::Run, false),
            mk(1000, GrantHow::Run, false),
            // Inherited from a `run` grant: the kernel's, in its share.
            mk(1000, GrantHow::Run, true),
            mk(1000, GrantHow::Env, true),
            mk(1000, GrantHow::App, true),
            mk(1001, GrantHow::Run, false),
        ];
        assert_eq!(run_grants_of(&grants, 1000), 2);
        assert_eq!(run_grants_of(&grants, 1001), 1);
        assert_eq!(run_grants_of(&grants, 0), 0);
    }

    /// Issue 18 (F6): the exec hook's app rules, applied to the processes
    /// started in the restart gap: `deny` takes the grant from the process
    /// and its children, `allow` grants one whose parent had none.
    #[test]
    fn app_rules_apply_to_gap_children() {
        let saved = [g(100, 50)];
        let procs = BTreeMap::from([
            (1, p(0, 0)),
            (100, p(1, 50)),    // granted, alive
            (101, p(100, 150)), // forked in the gap, exec'd a denied program
            (102, p(101, 160)), // its child (no rule): nothing to inherit
            (103, p(100, 155)), // forked in the gap, no rule: inherits
            (400, p(1, 170)),   // plain parent's gap child, allowed program
            (401, p(400, 180)), // its child: inherits the app grant
        ]);
        let mut rule = |pid: u32| match pid {
            101 => Some((false, 0)),
            400 => Some((true, 4)),
            _ => None,
        };
        let r = restorable(&saved, 100, &procs, &mut rule);
        let got: Vec<(u32, u32, GrantHow)> = r.iter().map(|g| (g.pid, g.gpus, g.how)).collect();
        assert_eq!(
            got,
            vec![
                (100, 2, GrantHow::Run),
                (103, 2, GrantHow::Run),
                (400, 4, GrantHow::App),
                (401, 4, GrantHow::App)
            ]
        );
    }
}
