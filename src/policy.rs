//! Policy: what must be blocked, as a pure function of the inventory, the
//! mode and the user's choices. Every rule lives here (ARCHITECTURE.md#modes); the
//! enforcer only applies the resulting plan.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::gpu::{DevNum, FileId, Gpu, Inventory, PciAddr, DRM_MAJOR, NVIDIACTL, NVIDIA_MAJOR};

/// `NodeRule::flags`: a grant for this GPU lets a process through (smart).
pub const RULE_GRANTABLE: u32 = 1;
/// `NodeRule::flags`: a default-GPU node, hidden only from `--only` trees.
pub const RULE_ONLY_HIDE: u32 = 2;
/// A sysfs file only enumerators read (`uevent`): udevd may read it and a
/// write-only open is never denied (`GPUCTL_RULE_ENUM`).
pub const RULE_ENUM: u32 = 4;

/// How the kernel treats one blocked device node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeRule {
    /// The owning GPU's id.
    pub gpu: u32,
    pub flags: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Nothing blocked, programs detached.
    #[default]
    Hybrid,
    /// Every offload GPU blocked for everyone.
    Integrated,
    /// Per-GPU blocks chosen with `gpuctl block`/`unblock`.
    Manual,
    /// Offload GPUs blocked except for processes granted access.
    Smart,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Hybrid, Mode::Integrated, Mode::Manual, Mode::Smart];
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Hybrid => "hybrid",
            Mode::Integrated => "integrated",
            Mode::Manual => "manual",
            Mode::Smart => "smart",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                format!("unknown mode {s:?} (expected hybrid, integrated, manual or smart)")
            })
    }
}

/// A GPU the user asked to block in manual mode, by PCI address (stable
/// across reboots, unlike ids).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ManualBlock {
    pub pci: PciAddr,
    /// Blocked even though it drives a connected display.
    #[serde(default)]
    pub force: bool,
}

/// What the user chose: the persisted part of the daemon's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    pub mode: Mode,
    /// `set integrated --force`: block offload GPUs even if they drive a display.
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub manual: BTreeSet<ManualBlock>,
    /// Per-application rules (smart mode), by executable path.
    #[serde(default)]
    pub apps: BTreeMap<String, AppRule>,
    /// Smart mode: an exclusive (`--only`) grant was made, so the default
    /// GPU's nodes need their hide-from-`--only`-trees rules. Until then
    /// they stay out of the map: opening the default GPU (what every
    /// program does) then costs one map miss. Not persisted: grants die
    /// with the daemon.
    #[serde(skip)]
    pub only_grants: bool,
}

/// `gpuctl app allow|deny PATH`: what exec of that file does in smart mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppRule {
    pub allow: bool,
    /// The GPU it may use (`None`: every offload GPU).
    #[serde(default)]
    pub gpu: Option<PciAddr>,
    /// The kernel's identity of the program, saved when the rule was made
    /// from a descriptor the client passed and the daemon cannot see the
    /// path itself (its unit hides `/home` and `/tmp`): used at start while
    /// the path stays out of sight (DESIGN-NOTES, issue 18 round three).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<crate::gpu::FileId>,
}

/// Why a GPU that the mode would block is left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    pub gpu: u32,
    pub reason: String,
    /// The display server the GPU was left alone for, if that is why
    /// (typed: the daemon watches it, `status` names it).
    pub holder: Option<crate::gpu::DisplayHolder>,
}

/// While a GPU is blocked, a node of its major (DRM, NVIDIA) that did not
/// exist when the plan was made is denied as that GPU's until the next plan
/// attributes it: a driver that binds after the daemon planned (a module
/// loaded late at boot, a rebind) creates nodes the plan cannot name, and the
/// re-plan that follows its uevent comes after the node exists
/// (docs/DESIGN-NOTES.md, "New nodes of a blocked GPU").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    /// The rule a new node gets: the (lowest) blocked GPU of this major.
    pub rule: NodeRule,
    /// Minors that existed at the plan and are not blocked: they stay open.
    pub known: BTreeSet<u32>,
    /// The default GPU has no node of this major yet: its driver may bind
    /// later and its first node is new too. The daemon then lets each new
    /// node that is not a blocked GPU's through on its uevent
    /// (`Core::release_new_nodes`); without uevents it drops this guard.
    pub default_unseen: bool,
}

/// The result of [`plan`]: every device number to deny, with the id of the
/// GPU it belongs to (for the per-GPU denied counters).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub nodes: BTreeMap<DevNum, NodeRule>,
    /// Sysfs files that wake a blocked GPU when read (lsm backend only).
    pub files: BTreeMap<FileId, u32>,
    /// Which of `files` only enumerators read (`uevent`): udevd reads them,
    /// and a write-only open (`udevadm trigger`) is allowed.
    pub enum_files: BTreeSet<FileId>,
    /// Smart mode: the fork/exec/exit hooks must be attached.
    pub smart: bool,
    /// Smart mode: the environment strings an exec is granted for, and the
    /// GPUs (id mask) each grants ([`crate::envgrant::accepted`]).
    pub env: BTreeMap<String, u32>,
    /// Ids of the GPUs this plan blocks.
    pub blocked: BTreeSet<u32>,
    /// GPUs the mode asks to block but the rules protect.
    pub skipped: Vec<Skip>,
    /// New nodes guarded, by major ([`Guard`]); none for a major whose
    /// unblocked default GPU has no node yet (its own new node would be
    /// denied: see [`guards`]).
    pub guards: BTreeMap<u32, Guard>,
}

/// A request the rules refuse as a whole, with the sentence that says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why `gpu` may not be blocked, if it may not.
pub fn protect_reason(gpu: &Gpu, force: bool) -> Option<String> {
    if gpu.default {
        return Some(format!(
            "{} is the default GPU (it runs the desktop) and is never blocked",
            gpu.label()
        ));
    }
    if gpu.drives_display() && !force {
        let shown: Vec<&str> = gpu
            .displays
            .iter()
            .filter(|d| d.connected())
            .map(|d| d.connector.as_str())
            .collect();
        return Some(format!(
            "{} drives a connected display ({}); blocking it would freeze that screen; \
             unplug it or repeat with --force",
            gpu.label(),
            shown.join(", ")
        ));
    }
    // Split session: a compositor that opened the GPU keeps advertising it
    // to its clients, which then cannot open it (black windows).
    if let Some(holder) = gpu.display_holder.as_ref().filter(|_| !force) {
        return Some(format!(
            "{} is held open by the display server {holder}; blocking it would leave that \
             session offering a GPU its programs cannot open (black windows); log out of \
             that session or repeat with --force",
            gpu.label()
        ));
    }
    None
}

/// Checks a mode change before it is made: the whole request is refused when
/// the mode makes no sense on this machine, or when a GPU it would block is
/// protected and `force` was not given.
pub fn check(inv: &Inventory, choice: &Choice) -> Result<Plan, Refusal> {
    refuse_skips(plan(inv, choice)?)
}

/// [`check`]'s rule on a plan already made: a GPU it skips refuses it.
pub fn refuse_skips(plan: Plan) -> Result<Plan, Refusal> {
    match plan.skipped.first() {
        Some(skip) => Err(Refusal(format!("refused: {}", skip.reason))),
        None => Ok(plan),
    }
}

/// What must be blocked. A protected GPU is skipped (with its reason), never
/// blocked; a mode that makes no sense on this machine is refused.
pub fn plan(inv: &Inventory, choice: &Choice) -> Result<Plan, Refusal> {
    let targets: Vec<(&Gpu, bool)> = match choice.mode {
        Mode::Hybrid => Vec::new(),
        Mode::Integrated | Mode::Smart => {
            if let Some(d) = inv.default_gpu() {
                // Only on evidence, never on the `discrete` guess alone: an
                // integrated GPU is there but is not the default, and the
                // firmware booted on the dGPU or the internal panel hangs
                // off it (a MUX switched to the dGPU, a desktop booting on
                // its card). A guess that calls every GPU discrete is no
                // evidence of anything.
                let panel = d.displays.iter().any(|x| x.internal() && x.connected());
                let igpu_aside = inv
                    .gpus
                    .iter()
                    .any(|g| !g.default && g.discrete == Some(false));
                if d.discrete == Some(true) && igpu_aside && (d.boot_vga == Some(true) || panel) {
                    return Err(Refusal(format!(
                        "refused: {} mode blocks every GPU but the default one, and \
                         the default GPU here is the discrete {} (a MUX laptop switched to \
                         dGPU mode, or a desktop whose firmware boots on the card); switch \
                         the MUX or firmware to the integrated GPU first",
                        choice.mode,
                        d.label()
                    )));
                }
            }
            inv.gpus
                .iter()
                .filter(|g| g.offload)
                .map(|g| (g, choice.force))
                .collect()
        }
        Mode::Manual => choice
            .manual
            .iter()
            .filter_map(|m| {
                inv.gpus
                    .iter()
                    .find(|g| g.pci == m.pci)
                    .map(|g| (g, m.force))
            })
            .collect(),
    };

    let smart = choice.mode == Mode::Smart;
    let flags = if smart { RULE_GRANTABLE } else { 0 };
    let mut out = Plan {
        smart,
        ..Plan::default()
    };
    if smart {
        out.env = crate::envgrant::accepted(inv);
    }
    for (gpu, force) in targets {
        if let Some(reason) = protect_reason(gpu, force) {
            // The holder is the reason only when nothing before it is.
            let holder = gpu
                .display_holder
                .clone()
                .filter(|_| !force && !gpu.default && !gpu.drives_display());
            out.skipped.push(Skip {
                gpu: gpu.id,
                reason,
                holder,
            });
            continue;
        }
        out.blocked.insert(gpu.id);
        for n in &gpu.nodes {
            out.nodes.insert(*n, NodeRule { gpu: gpu.id, flags });
        }
        for f in gpu.wake_files.iter().chain(&gpu.enum_files) {
            out.files.insert(*f, gpu.id);
        }
        out.enum_files.extend(gpu.enum_files.iter().copied());
    }
    // Smart mode: the default GPU stays open to everyone, except trees
    // granted with `--only`, which see only their GPU.
    if smart && choice.only_grants {
        if let Some(d) = inv.default_gpu() {
            for n in &d.nodes {
                out.nodes.insert(
                    *n,
                    NodeRule {
                        gpu: d.id,
                        flags: RULE_ONLY_HIDE,
                    },
                );
            }
        }
    }

    // `nvidiactl` is shared by every NVIDIA GPU: block it only when every
    // NVIDIA GPU is blocked, or a running one would lose its control node.
    let nvidia: Vec<&Gpu> = inv
        .gpus
        .iter()
        .filter(|g| g.is_nvidia() && g.nvidia_minor.is_some())
        .collect();
    if nvidia.len() == 1 && out.blocked.contains(&nvidia[0].id) {
        out.nodes.insert(
            NVIDIACTL,
            NodeRule {
                gpu: nvidia[0].id,
                flags,
            },
        );
    }
    out.guards = guards(inv, &out, flags);
    Ok(out)
}

/// The guards of a plan ([`Guard`]). The DRM major is guarded while any GPU
/// is blocked, the NVIDIA major while an NVIDIA GPU is. Known (left open):
/// every node that exists now and the plan does not block — other GPUs',
/// `simpledrm`'s, `nvidia-modeset` (254), `nvidiactl` (255) while an NVIDIA
/// GPU runs unblocked. A default GPU with no DRM node yet is marked
/// (`default_unseen`): its new node is let through on its uevent. No NVIDIA
/// guard while the default GPU is an NVIDIA one without its minor (NVIDIA's
/// nodes come with no uevent to let it through by).
fn guards(inv: &Inventory, plan: &Plan, flags: u32) -> BTreeMap<u32, Guard> {
    let mut out = BTreeMap::new();
    if plan.blocked.is_empty() {
        return out;
    }
    let default = inv.default_gpu();
    let blocked = |g: &&Gpu| plan.blocked.contains(&g.id);
    // DRM: every GPU may have DRM nodes. A default GPU without one yet
    // (both drivers still loading at boot) is said, not waited for.
    if let Some(gpu) = inv.gpus.iter().filter(blocked).map(|g| g.id).min() {
        let mut g = guard_of(inv, plan, DRM_MAJOR, gpu, flags, &[]);
        g.default_unseen = default.is_some_and(|d| !d.nodes.iter().any(|n| n.major == DRM_MAJOR));
        out.insert(DRM_MAJOR, g);
    }
    // NVIDIA: only where an NVIDIA GPU is blocked.
    let nv_gpu = inv
        .gpus
        .iter()
        .filter(|g| g.is_nvidia())
        .filter(blocked)
        .map(|g| g.id)
        .min();
    let default_ready = default.is_none_or(|d| !d.is_nvidia() || d.nvidia_minor.is_some());
    if let (Some(gpu), true) = (nv_gpu, default_ready) {
        // The control nodes: modeset is never blocked; nvidiactl is open
        // while some NVIDIA GPU is not blocked (the plan blocks it, when it
        // must, by its number).
        let mut fixed = vec![254];
        if inv
            .gpus
            .iter()
            .any(|g| g.is_nvidia() && !plan.blocked.contains(&g.id))
        {
            fixed.push(NVIDIACTL.minor);
        }
        out.insert(
            NVIDIA_MAJOR,
            guard_of(inv, plan, NVIDIA_MAJOR, gpu, flags, &fixed),
        );
    }
    out
}

fn guard_of(
    inv: &Inventory,
    plan: &Plan,
    major: u32,
    gpu: u32,
    flags: u32,
    fixed: &[u32],
) -> Guard {
    let known = inv
        .gpus
        .iter()
        .flat_map(|g| g.nodes.iter())
        .chain(&inv.other_nodes)
        .filter(|n| n.major == major && !plan.nodes.contains_key(n))
        .map(|n| n.minor)
        .chain(fixed.iter().copied())
        .collect();
    Guard {
        rule: NodeRule { gpu, flags },
        known,
        default_unseen: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Display;

    fn gpu(id: u32, pci: &str, vendor: &str, default: bool, nodes: &[(u32, u32)]) -> Gpu {
        Gpu {
            nodes: nodes.iter().map(|&(a, b)| DevNum::new(a, b)).collect(),
            ..crate::gpu::test_gpu(id, pci, vendor, default)
        }
    }

    fn laptop() -> Inventory {
        let mut nv = gpu(
            1,
            "0000:01:00.0",
            "10de",
            false,
            &[(226, 0), (226, 129), (195, 0)],
        );
        nv.nvidia_minor = Some(0);
        Inventory {
            gpus: vec![
                gpu(0, "0000:00:02.0", "8086", true, &[(226, 1), (226, 128)]),
                nv,
            ],
            ..Default::default()
        }
    }

    fn choice(mode: Mode) -> Choice {
        Choice {
            mode,
            ..Choice::default()
        }
    }

    fn devs(p: &Plan) -> Vec<String> {
        p.nodes.keys().map(|d| d.to_string()).collect()
    }

    #[test]
    fn hybrid_blocks_nothing() {
        let p = plan(&laptop(), &choice(Mode::Hybrid)).unwrap();
        assert!(p.nodes.is_empty() && !p.smart);
        assert!(p.blocked.is_empty());
    }

    #[test]
    fn integrated_blocks_offload_and_sole_nvidiactl() {
        let p = plan(&laptop(), &choice(Mode::Integrated)).unwrap();
        assert_eq!(devs(&p), ["195:0", "195:255", "226:0", "226:129"]);
        assert_eq!(p.blocked, BTreeSet::from([1]));
        assert!(p.nodes.values().all(|r| r.gpu == 1 && r.flags == 0));
        assert!(!p.smart);
    }

    #[test]
    fn nvidiactl_kept_while_another_nvidia_gpu_runs() {
        let mut inv = laptop();
        let mut second = gpu(2, "0000:02:00.0", "10de", false, &[(226, 2), (195, 1)]);
        second.nvidia_minor = Some(1);
        inv.gpus.push(second);
        let mut c = choice(Mode::Manual);
        c.manual.insert(ManualBlock {
            pci: "0000:01:00.0".parse().unwrap(),
            force: false,
        });
        let p = plan(&inv, &c).unwrap();
        assert!(!p.nodes.contains_key(&NVIDIACTL));
        assert!(p.nodes.contains_key(&DevNum::new(195, 0)));
        assert!(!p.nodes.contains_key(&DevNum::new(195, 1)));
    }

    #[test]
    fn default_gpu_never_blocked() {
        let mut c = choice(Mode::Manual);
        c.manual.insert(ManualBlock {
            pci: "0000:00:02.0".parse().unwrap(),
            force: true,
        });
        let p = plan(&laptop(), &c).unwrap();
        assert!(p.nodes.is_empty());
        assert_eq!(p.skipped.len(), 1);
        assert!(p.skipped[0].reason.contains("default GPU"));
        assert!(check(&laptop(), &c).is_err());
    }

    #[test]
    fn display_driving_gpu_needs_force() {
        let mut inv = laptop();
        inv.gpus[1].displays.push(Display {
            connector: "DP-1".into(),
            status: Some("connected".into()),
        });
        let err = check(&inv, &choice(Mode::Integrated)).unwrap_err();
        assert!(err.0.contains("connected display (DP-1)"), "{err}");
        assert!(err.0.contains("--force"));
        let mut forced = choice(Mode::Integrated);
        forced.force = true;
        let p = check(&inv, &forced).unwrap();
        assert_eq!(p.blocked, BTreeSet::from([1]));
    }

    /// Issue 10 item 8: a GPU whose primary node a display server holds is
    /// refused by every path that blocks (set, block, the automatic rules
    /// through `plan`), naming the holder, unless forced.
    #[test]
    fn split_session_gpu_needs_force() {
        let mut inv = laptop();
        inv.gpus[1].display_holder = Some(crate::gpu::DisplayHolder {
            comm: "Xorg".into(),
            pid: 1234,
            uid: 0,
        });
        for mode in [Mode::Integrated, Mode::Smart] {
            let err = check(&inv, &choice(mode)).unwrap_err();
            assert!(err.0.contains("display server Xorg (pid 1234)"), "{err}");
            assert!(err.0.contains("--force"), "{err}");
            // The automatic path (plan) skips it with the same reason.
            let p = plan(&inv, &choice(mode)).unwrap();
            assert!(p.blocked.is_empty());
            assert!(p.skipped[0].reason.contains("Xorg (pid 1234)"));
            assert_eq!(p.skipped[0].holder.as_ref().map(|h| h.pid), Some(1234));
            let mut forced = choice(mode);
            forced.force = true;
            assert_eq!(check(&inv, &forced).unwrap().blocked, BTreeSet::from([1]));
        }
        let mut manual = choice(Mode::Manual);
        manual.manual.insert(ManualBlock {
            pci: inv.gpus[1].pci,
            force: false,
        });
        assert!(check(&inv, &manual).unwrap_err().0.contains("Xorg"));
        assert!(protect_reason(&inv.gpus[1], false).is_some());
        assert!(protect_reason(&inv.gpus[1], true).is_none());
        // Nobody holding it: blocked as before.
        inv.gpus[1].display_holder = None;
        assert_eq!(
            check(&inv, &choice(Mode::Integrated)).unwrap().blocked,
            BTreeSet::from([1])
        );
    }

    #[test]
    fn integrated_refused_when_default_is_discrete() {
        let mut inv = laptop();
        inv.gpus[0].discrete = Some(false);
        inv.gpus[0].default = false;
        inv.gpus[0].offload = true;
        inv.gpus[1].default = true;
        inv.gpus[1].offload = false;
        inv.gpus[1].discrete = Some(true);
        // The discrete guess alone is no evidence: a switchable laptop whose
        // GPUs were misjudged must not be refused.
        inv.gpus[1].boot_vga = None;
        assert!(plan(&inv, &choice(Mode::Integrated)).is_ok());
        assert!(plan(&inv, &choice(Mode::Smart)).is_ok());
        // Evidence 1: the firmware booted on the dGPU.
        inv.gpus[1].boot_vga = Some(true);
        let err = plan(&inv, &choice(Mode::Integrated)).unwrap_err();
        assert!(err.0.contains("MUX"), "{err}");
        // Evidence 2: the internal panel is wired to it.
        inv.gpus[1].boot_vga = None;
        inv.gpus[1].displays.push(Display {
            connector: "eDP-1".into(),
            status: Some("connected".into()),
        });
        let err = plan(&inv, &choice(Mode::Smart)).unwrap_err();
        assert!(err.0.contains("MUX"), "{err}");
        // Every GPU guessed discrete (a pre-Zen APU misjudged): no
        // integrated GPU aside, so nothing proves a MUX.
        inv.gpus[0].discrete = Some(true);
        assert!(plan(&inv, &choice(Mode::Integrated)).is_ok());
    }

    #[test]
    fn manual_block_of_vanished_gpu_is_ignored() {
        let mut c = choice(Mode::Manual);
        c.manual.insert(ManualBlock {
            pci: "0000:09:00.0".parse().unwrap(),
            force: false,
        });
        assert!(plan(&laptop(), &c).unwrap().nodes.is_empty());
    }

    #[test]
    fn gpu_without_nodes_blocks_nothing_but_counts_as_blocked() {
        let mut inv = laptop();
        inv.gpus[1].nodes.clear();
        inv.gpus[1].nvidia_minor = None;
        let p = plan(&inv, &choice(Mode::Integrated)).unwrap();
        assert!(p.nodes.is_empty());
        assert_eq!(p.blocked, BTreeSet::from([1]));
    }

    fn known(p: &Plan, major: u32) -> Vec<u32> {
        p.guards[&major].known.iter().copied().collect()
    }

    /// The bug (distro boot, DESIGN-NOTES "New nodes of a blocked GPU"):
    /// the dGPU's driver had made no node when the daemon planned, so the
    /// plan blocked no number; the node it made then was open until the
    /// re-plan. The guard denies every DRM minor that did not exist.
    #[test]
    fn a_blocked_gpu_without_nodes_guards_new_minors_of_its_majors() {
        let mut inv = laptop();
        inv.gpus[1].nodes.clear();
        inv.gpus[1].nvidia_minor = None;
        inv.other_nodes.push(DevNum::new(226, 2));
        let p = plan(&inv, &choice(Mode::Integrated)).unwrap();
        let g = &p.guards[&DRM_MAJOR];
        assert_eq!(g.rule, NodeRule { gpu: 1, flags: 0 });
        // The default GPU's nodes and a non-GPU node (simpledrm) stay open.
        assert_eq!(known(&p, DRM_MAJOR), [1, 2, 128]);
        // NVIDIA: nvidia-modeset is never blocked; nvidiactl is guarded
        // with the only NVIDIA GPU blocked.
        assert_eq!(known(&p, NVIDIA_MAJOR), [254]);
        assert_eq!(p.guards[&NVIDIA_MAJOR].rule.gpu, 1);
        // Smart: the new node is as grantable as the GPU's known ones.
        let p = plan(&inv, &choice(Mode::Smart)).unwrap();
        assert_eq!(p.guards[&DRM_MAJOR].rule.flags, RULE_GRANTABLE);
    }

    #[test]
    fn blocked_nodes_are_not_known_and_nothing_blocked_guards_nothing() {
        let p = plan(&laptop(), &choice(Mode::Integrated)).unwrap();
        assert_eq!(known(&p, DRM_MAJOR), [1, 128]);
        assert_eq!(known(&p, NVIDIA_MAJOR), [254]);
        let p = plan(&laptop(), &choice(Mode::Hybrid)).unwrap();
        assert!(p.guards.is_empty());
        // A default GPU that is not NVIDIA: the NVIDIA guard does not wait
        // for it; the DRM one does.
        let mut inv = laptop();
        assert!(!p_default_unseen(&inv));
        inv.gpus[0].nodes.clear();
        let p = plan(&inv, &choice(Mode::Integrated)).unwrap();
        assert_eq!(
            p.guards.keys().collect::<Vec<_>>(),
            [&NVIDIA_MAJOR, &DRM_MAJOR]
        );
        assert!(p_default_unseen(&inv));
        assert!(!p.guards[&NVIDIA_MAJOR].default_unseen);
        // An NVIDIA default GPU without its minor: no NVIDIA guard.
        inv.gpus[0].vendor_id = "10de".into();
        let p = plan(&inv, &choice(Mode::Integrated)).unwrap();
        assert_eq!(p.guards.keys().collect::<Vec<_>>(), [&DRM_MAJOR]);
    }

    fn p_default_unseen(inv: &Inventory) -> bool {
        plan(inv, &choice(Mode::Integrated)).unwrap().guards[&DRM_MAJOR].default_unseen
    }

    #[test]
    fn nvidiactl_stays_known_while_an_nvidia_gpu_runs_unblocked() {
        let mut inv = laptop();
        let mut other = gpu(2, "0000:02:00.0", "10de", false, &[(226, 3), (195, 1)]);
        other.nvidia_minor = Some(1);
        inv.gpus.push(other);
        let mut c = choice(Mode::Manual);
        c.manual.insert(ManualBlock {
            pci: "0000:01:00.0".parse().unwrap(),
            force: false,
        });
        let p = plan(&inv, &c).unwrap();
        assert_eq!(known(&p, NVIDIA_MAJOR), [1, 254, 255]);
        assert_eq!(known(&p, DRM_MAJOR), [1, 3, 128]);
        // Both NVIDIA GPUs blocked, the lowest id names the rule.
        let p = plan(&inv, &choice(Mode::Integrated)).unwrap();
        assert_eq!(p.guards[&NVIDIA_MAJOR].rule.gpu, 1);
        assert_eq!(known(&p, NVIDIA_MAJOR), [254]);
    }

    #[test]
    fn smart_blocks_offload_grantably_and_hides_default_only_for_only_trees() {
        let p = plan(&laptop(), &choice(Mode::Smart)).unwrap();
        assert!(
            !p.nodes.contains_key(&DevNum::new(226, 1)),
            "no --only grant yet"
        );
        let mut c = choice(Mode::Smart);
        c.only_grants = true;
        let p = plan(&laptop(), &c).unwrap();
        assert!(p.smart);
        assert_eq!(p.blocked, BTreeSet::from([1]));
        for d in ["226:0", "226:129", "195:0", "195:255"] {
            let r = p.nodes[&d.parse().unwrap()];
            assert_eq!((r.gpu, r.flags), (1, RULE_GRANTABLE), "{d}");
        }
        for d in ["226:1", "226:128"] {
            let r = p.nodes[&d.parse().unwrap()];
            assert_eq!((r.gpu, r.flags), (0, RULE_ONLY_HIDE), "{d}");
        }
    }

    #[test]
    fn wake_files_follow_their_gpu() {
        let mut inv = laptop();
        let f = FileId {
            dev: DevNum::new(0, 22),
            ino: 4242,
        };
        inv.gpus[1].wake_files.push(f);
        let uevent = FileId {
            dev: DevNum::new(0, 22),
            ino: 4243,
        };
        inv.gpus[1].enum_files.push(uevent);
        let p = plan(&inv, &choice(Mode::Integrated)).unwrap();
        assert_eq!((p.files[&f], p.files[&uevent]), (1, 1));
        assert!(p.enum_files.contains(&uevent) && !p.enum_files.contains(&f));
        assert!(plan(&inv, &choice(Mode::Hybrid)).unwrap().files.is_empty());
    }

    #[test]
    fn mode_names() {
        for m in Mode::ALL {
            assert_eq!(m.as_str().parse::<Mode>().unwrap(), m);
        }
        assert!("smartish".parse::<Mode>().is_err());
    }
}
