//! Split sessions (issue 10, item 8): a display server that holds a GPU's
//! primary node keeps advertising that GPU to its clients; blocking it then
//! gives them black windows. Before a plan blocks a GPU that is not blocked
//! yet, the daemon looks for a display server holding its primary node and
//! records it on the GPU, so `policy` refuses (or, for the automatic rules,
//! skips) it with the holder's name, exactly like a connected display.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::log::log;
use crate::bpf::{Enforcer, KernelHolder};
use crate::gpu::{DevNum, DisplayHolder, Inventory};
use crate::policy::{self, Choice, Plan, Refusal};
use crate::procs::{self, Holder};

/// Every process holding one of `owners`' nodes (device number → GPU id)
/// open for reading or writing. On the real `/proc` the kernel finds them
/// (the enforcer's `iter/task_file` scan: no readlink or stat per
/// descriptor, so a user who opens a million descriptors costs the daemon
/// the kernel's walk of them, not a million system calls); only the few
/// holders found are looked up in procfs (path, owner). A fixture procfs
/// root (tests) is walked as before. If the kernel scan fails the walk is
/// the fallback, logged: a missed display server would be blocked.
pub fn scan(enforcer: &mut Enforcer, procfs: &Path, owners: &BTreeMap<DevNum, u32>) -> Vec<Holder> {
    if procfs != Path::new("/proc") {
        return procs::holders(procfs, owners);
    }
    let nodes: Vec<DevNum> = owners.keys().copied().collect();
    match enforcer.kernel_holders(&nodes) {
        Ok(found) => resolve(found, procfs, owners),
        Err(e) => {
            log!("the kernel holder scan failed ({e:#}); walking /proc instead");
            procs::holders(procfs, owners)
        }
    }
}

/// The kernel's records as holders: GPU, path as the process opened it and
/// owner, from procfs (a few calls per holder, none per other descriptor).
fn resolve(found: Vec<KernelHolder>, procfs: &Path, owners: &BTreeMap<DevNum, u32>) -> Vec<Holder> {
    let mut out: Vec<Holder> = found
        .into_iter()
        .filter_map(|k| {
            let gpu = *owners.get(&k.node)?;
            let dir = procfs.join(k.pid.to_string());
            // Device nodes: the link leads into devtmpfs, never a network
            // mount. A process gone since the scan is gone.
            let path = std::fs::read_link(dir.join("fd").join(k.fd.to_string()))
                .ok()?
                .to_string_lossy()
                .into_owned();
            let uid = std::fs::metadata(&dir).ok()?.uid();
            Some(Holder {
                gpu,
                pid: k.pid,
                comm: k.comm,
                path,
                node: k.node,
                uid,
                role: procs::HolderRole::of(k.pid),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The holders of GPU `gpu` (every node it owns), found by [`scan`]: what
/// the split-session guard and anything else that must know "who keeps
/// this GPU open" asks. Stable signature: issue 19's power-off component
/// calls it (not merged yet, hence the allow).
#[allow(dead_code)]
pub fn holders_of_gpu(
    enforcer: &mut Enforcer,
    procfs: &Path,
    inv: &Inventory,
    gpu: u32,
) -> Vec<Holder> {
    let mut owners = crate::gpu::node_owners(inv);
    owners.retain(|_, id| *id == gpu);
    scan(enforcer, procfs, &owners)
}

/// One scan serves every `who` for this long after it ended.
pub const SCAN_SHARED: Duration = Duration::from_millis(250);
/// A plain user's uid starts a new scan at most this often; meanwhile it is
/// served the last result, with its age.
pub const SCAN_PER_UID: Duration = Duration::from_secs(2);

/// The `who` scans: the last result (stamped when the scan *ended*), when
/// each uid last started one, and the one running. On the real `/proc` a
/// scan runs on the enforcer's scan thread and the loop goes on: a `who`
/// is answered at once with the last result and its age (only the very
/// first waits for one). One scan at a time.
#[derive(Default)]
pub struct Scans {
    last: Option<(Instant, Vec<Holder>)>,
    by_uid: HashMap<u32, Instant>,
    /// The nodes → GPU map of the scan running, if one is.
    running: Option<BTreeMap<DevNum, u32>>,
}

impl Scans {
    /// Every holder of every GPU (`owners`) for a `who` from `uid`, and the
    /// result's age. A new scan starts when the last result is older than
    /// [`SCAN_SHARED`], none runs, and `uid` (root excepted) started none
    /// within [`SCAN_PER_UID`].
    pub fn who(
        &mut self,
        uid: u32,
        enforcer: &mut Enforcer,
        procfs: &Path,
        owners: &BTreeMap<DevNum, u32>,
    ) -> (Vec<Holder>, Duration) {
        // A result the split-session guard collected (it waits for a
        // running scan) or one whose wake-up is not served yet.
        if self.running.is_some() {
            self.finish(enforcer, procfs);
        }
        let now = Instant::now();
        let fresh = self
            .last
            .as_ref()
            .is_some_and(|(t, _)| now.duration_since(*t) < SCAN_SHARED);
        let limited = uid != 0
            && self.last.is_some()
            && self
                .by_uid
                .get(&uid)
                .is_some_and(|t| now.duration_since(*t) < SCAN_PER_UID);
        if !fresh && !limited && self.running.is_none() {
            self.by_uid
                .retain(|_, t| now.duration_since(*t) < SCAN_PER_UID);
            self.by_uid.insert(uid, now);
            let background = procfs == Path::new("/proc") && self.last.is_some();
            let nodes: Vec<DevNum> = owners.keys().copied().collect();
            match background.then(|| enforcer.holder_scan_start(&nodes)) {
                Some(Ok(true)) => self.running = Some(owners.clone()),
                Some(Ok(false)) => {}
                Some(Err(e)) => log!("starting a holder scan failed: {e:#}"),
                // A fixture root, or no result yet: scan here.
                None => {
                    let found = scan(enforcer, procfs, owners);
                    self.last = Some((Instant::now(), found));
                }
            }
        }
        match &self.last {
            Some((t, h)) => (h.clone(), Instant::now().duration_since(*t)),
            None => (Vec::new(), Duration::ZERO),
        }
    }

    /// The running scan has finished (its fd is readable): keep its result,
    /// stamped now.
    pub fn finish(&mut self, enforcer: &mut Enforcer, procfs: &Path) {
        let Some(r) = enforcer.holder_scan_take() else {
            return;
        };
        let owners = self.running.take().unwrap_or_default();
        match r {
            Ok(found) => self.last = Some((Instant::now(), resolve(found, procfs, &owners))),
            Err(e) => log!("the holder scan failed: {e:#}"),
        }
    }
}

/// The plan for `choice`, with the split-session rule: a GPU that `choice`
/// would newly block (not in `blocked` now) and whose primary node a
/// display server holds is planned with that holder recorded on it, so
/// `policy` refuses (or skips) it. The procfs scan runs only when such a
/// GPU exists and the choice is not forced: switching to hybrid, or
/// re-applying a plan that blocks the same GPUs, costs nothing, and
/// `policy::plan` runs a second time only when a holder was found.
pub fn plan(
    inv: &Inventory,
    procfs: &Path,
    choice: &Choice,
    blocked: &BTreeSet<u32>,
) -> Result<Plan, Refusal> {
    let first = policy::plan(inv, choice)?;
    if choice.force && choice.mode != policy::Mode::Manual {
        return Ok(first);
    }
    let newly: Vec<u32> = first.blocked.difference(blocked).copied().collect();
    if newly.is_empty() {
        return Ok(first);
    }
    // Not the kernel's scan of every descriptor: only processes that can
    // be display servers are looked at (see `procs::display_holders`).
    let held = procs::display_holders(procfs, &primary_nodes(inv, &newly));
    if held.is_empty() {
        // Discovery never fills `display_holder`: the inventory with no
        // holder recorded is `inv` itself, and so is its plan.
        return Ok(first);
    }
    let mut out = inv.clone();
    for g in &mut out.gpus {
        g.display_holder = held.get(&g.id).cloned();
    }
    policy::plan(&out, choice)
}

/// The primary nodes (node → GPU id) of the GPUs `ids`.
fn primary_nodes(inv: &Inventory, ids: &[u32]) -> BTreeMap<DevNum, u32> {
    inv.gpus
        .iter()
        .filter(|g| ids.contains(&g.id))
        .flat_map(|g| {
            g.nodes
                .iter()
                .filter(|n| is_primary(**n))
                .map(move |n| (*n, g.id))
        })
        .collect()
}

/// A forced choice waives the split-session rule: the display servers
/// that hold GPUs it blocks (GPU id → holder), for `status`'s note (issue
/// 22: after `set integrated --force` the holder is still named, so the
/// black windows it causes have an explanation).
///
/// No walk per re-plan: a GPU blocked before and now keeps the holder
/// recorded for it (`known`) while that process still runs under its name
/// (one `comm` read per recorded holder); only the GPUs newly blocked
/// (not in `was_blocked`) are looked at, with the same display-server walk
/// the split-session rule runs for an unforced choice. Empty for a choice
/// that is not forced.
pub fn forced_over(
    inv: &Inventory,
    procfs: &Path,
    choice: &Choice,
    plan: &Plan,
    known: &BTreeMap<u32, DisplayHolder>,
    was_blocked: &BTreeSet<u32>,
) -> BTreeMap<u32, DisplayHolder> {
    if !choice.force || choice.mode == policy::Mode::Manual {
        return BTreeMap::new();
    }
    let mut out: BTreeMap<u32, DisplayHolder> = known
        .iter()
        .filter(|(id, h)| {
            plan.blocked.contains(id) && was_blocked.contains(id) && still_runs(procfs, h)
        })
        .map(|(id, h)| (*id, h.clone()))
        .collect();
    let look: Vec<u32> = plan.blocked.difference(was_blocked).copied().collect();
    if !look.is_empty() {
        out.extend(procs::display_holders(procfs, &primary_nodes(inv, &look)));
    }
    out
}

/// The note for [`forced_over`]'s holders, `None` when there are none.
pub fn forced_note(inv: &Inventory, held: &BTreeMap<u32, DisplayHolder>) -> Option<String> {
    let parts: Vec<String> = held
        .iter()
        .filter_map(|(id, holder)| {
            let g = inv.gpus.iter().find(|g| g.id == *id)?;
            Some(format!(
                "{} is blocked with --force while the display server {holder} holds it open \
                 (that session's programs cannot open it)",
                g.label()
            ))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The recorded holder's process still runs under the same name (a pid
/// reused by another program is not it). An exited one not yet reaped (a
/// zombie) keeps its name and its procfs entry, and its pidfd is readable:
/// counting it would re-plan in a loop until its parent reaps it.
fn still_runs(procfs: &Path, h: &DisplayHolder) -> bool {
    let dir = procfs.join(h.pid.to_string());
    let same =
        std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim_end_matches('\n') == h.comm);
    // `pid (comm) S …`: the state follows the last `)`.
    let exited = std::fs::read_to_string(dir.join("stat"))
        .ok()
        .and_then(|st| {
            st.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
        })
        .unwrap_or(false);
    same && !exited
}

/// [`plan`] for a change that is made or refused as a whole
/// (`policy::check`'s rule: a GPU it would skip refuses it).
pub fn check(
    inv: &Inventory,
    procfs: &Path,
    choice: &Choice,
    blocked: &BTreeSet<u32>,
) -> Result<Plan, Refusal> {
    policy::refuse_skips(plan(inv, procfs, choice, blocked)?)
}

/// The pids of the display servers a plan skipped GPUs for (each skip's
/// typed `holder`): the daemon watches them (pidfds) and plans again when
/// they exit, instead of waiting for a hardware event.
pub fn skipped_holder_pids(plan: &Plan) -> Vec<u32> {
    let mut out: Vec<u32> = plan
        .skipped
        .iter()
        .filter_map(|s| s.holder.as_ref().map(|h| h.pid))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// A primary node: DRM `cardN` (226, minor < 64 on every kernel gpuctl
/// supports; render nodes start at 128), or `/dev/nvidiaN` (195, below
/// `nvidiactl`'s 255), which NVIDIA's Xorg driver holds.
fn is_primary(n: DevNum) -> bool {
    (n.major == 226 && n.minor < 128) || (n.major == 195 && n.minor < 255)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_holder_pids_are_read_from_the_skips() {
        let plan = Plan {
            skipped: vec![
                policy::Skip {
                    gpu: 1,
                    reason: "GPU 1 is held open by the display server gnome-shell (pid 4321)"
                        .into(),
                    holder: Some(crate::gpu::DisplayHolder {
                        comm: "gnome-shell".into(),
                        pid: 4321,
                        uid: 1000,
                    }),
                },
                policy::Skip {
                    gpu: 2,
                    reason: "GPU 2 drives a display (pid 99)".into(),
                    holder: None,
                },
            ],
            ..Plan::default()
        };
        assert_eq!(skipped_holder_pids(&plan), vec![4321]);
        assert!(skipped_holder_pids(&Plan::default()).is_empty());
    }

    #[test]
    fn primary_nodes() {
        assert!(is_primary(DevNum::new(226, 1)));
        assert!(!is_primary(DevNum::new(226, 129)));
        assert!(is_primary(DevNum::new(195, 0)));
        assert!(!is_primary(DevNum::new(195, 255)));
        assert!(!is_primary(DevNum::new(1, 3)));
    }

    /// Issue 22: a forced choice's note keeps the holder recorded when the
    /// GPU became blocked; a re-plan reads one `comm` per recorded holder
    /// and walks nothing (the fixture has no descriptors: a walk would find
    /// no holder), a reused pid is dropped, and a newly blocked GPU is
    /// looked at afresh.
    #[test]
    fn a_forced_choice_keeps_the_recorded_holder_without_a_walk() {
        let root = std::env::temp_dir().join(format!("gpuctl-forced-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("20")).unwrap();
        std::fs::write(root.join("20/comm"), "weston\n").unwrap();
        let inv = Inventory {
            gpus: vec![
                crate::gpu::test_gpu(0, "0000:00:02.0", "8086", true),
                crate::gpu::test_gpu(1, "0000:01:00.0", "10de", false),
            ],
            ..Default::default()
        };
        let forced = Choice {
            mode: policy::Mode::Integrated,
            force: true,
            ..Choice::default()
        };
        let plan = Plan {
            blocked: BTreeSet::from([1]),
            ..Plan::default()
        };
        let weston = DisplayHolder {
            comm: "weston".into(),
            pid: 20,
            uid: 0,
        };
        let known = BTreeMap::from([(1, weston.clone())]);
        let was = BTreeSet::from([1]);
        let kept = forced_over(&inv, &root, &forced, &plan, &known, &was);
        assert_eq!(kept.get(&1), Some(&weston));
        let note = forced_note(&inv, &kept).unwrap();
        assert!(
            note.contains("weston (pid 20)") && note.contains("--force"),
            "{note}"
        );
        // Newly blocked: looked at afresh (no descriptor of it here).
        assert!(forced_over(&inv, &root, &forced, &plan, &known, &BTreeSet::new()).is_empty());
        // Not forced: no note.
        let plain = Choice {
            force: false,
            ..forced.clone()
        };
        assert!(forced_over(&inv, &root, &plain, &plan, &known, &was).is_empty());
        // It exited and is not reaped yet (a zombie keeps its name).
        std::fs::write(root.join("20/stat"), "20 (weston) Z 1 20 20 0 -1\n").unwrap();
        assert!(forced_over(&inv, &root, &forced, &plan, &known, &was).is_empty());
        std::fs::write(root.join("20/stat"), "20 (weston) S 1 20 20 0 -1\n").unwrap();
        assert_eq!(
            forced_over(&inv, &root, &forced, &plan, &known, &was).len(),
            1
        );
        // The pid now runs another program.
        std::fs::write(root.join("20/comm"), "bash\n").unwrap();
        assert!(forced_over(&inv, &root, &forced, &plan, &known, &was).is_empty());
        assert_eq!(forced_note(&inv, &BTreeMap::new()), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
