//! The core: the user's choice, the plan in force, the hardware it was made
//! for, the enforcer that applies it, and the configuration. This is the
//! only code that assigns the choice, the plan, the inventory and the
//! config (the fields are private to this module): every other room reads
//! them through the getters, and asks for a change with [`Core::change`]
//! (a request), [`Core::follow`] (automation), [`Core::set_apps`] (app
//! rules), [`Core::rediscover`] + [`Core::replan`] (hardware) or
//! [`Core::apply_config`]. Every plan comes from `policy::plan` (through
//! `holders`, which adds the split-session rule). The enforcer is public:
//! the grant and app components fill its maps, which the plan does not
//! cover.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::proto::data::ModeData;
use anyhow::Result;

use super::config::Config;
use super::log::log;
use super::reject::Rejection;
use super::rescue::Rescue;
use super::{auto, holders, state};
use crate::bpf::Enforcer;
use crate::gpu::{self, DisplayHolder, Inventory, Roots};
use crate::policy::{AppRule, Choice, Mode, Plan};

pub struct Core {
    pub roots: Roots,
    /// What discovery last read; re-read by [`Core::rediscover`] only.
    inventory: Inventory,
    /// Applies plans; the components also fill its grant and app maps.
    pub enforcer: Enforcer,
    /// Where the choice is saved (`state.json`).
    state_path: PathBuf,
    /// Written by [`Core::apply_config`] only.
    config: Config,
    choice: Choice,
    plan: Plan,
    /// Why the saved choice is not (fully) in force, if it is not.
    note: Option<String>,
    /// The choice changed and is not saved yet.
    dirty: bool,
    /// Why the last save failed, if it did.
    save_error: Option<String>,
    /// The kernel command line's rescue words (`rescue`), fixed at start.
    rescue: Rescue,
    /// While `gpuctl.mode=` is in force: the saved choice (what is saved,
    /// and what the next boot gets). Ended by the user's first change.
    boot_saved: Option<Choice>,

    /// Pidfds of the display servers the plan in force skipped GPUs for:
    /// readable when one exits, then [`Core::holder_gone`] plans again.
    holder_watch: Vec<std::os::fd::OwnedFd>,
    /// A forced choice's blocked GPUs that a display server holds (GPU id
    /// → holder): recorded when the GPU became blocked, kept while the
    /// holder runs (`holders::forced_over`), named in the note.
    forced_over: BTreeMap<u32, DisplayHolder>,
    /// Kernel uevents arrive (the daemon has its socket): a guard may wait
    /// on a default GPU that has no node yet (`Guard::default_unseen`).
    node_events: bool,
}

/// What [`Core::apply_config`] changed that others must act on.
pub struct Applied {
    /// `bpf_log` or `max_grants` changed: they take effect on a restart.
    pub needs_restart: bool,
    /// The `[auto]` rules changed: automation decides again.
    pub rules_changed: bool,
}

impl Core {
    /// The core before the first apply: nothing is planned yet.
    pub fn new(
        roots: Roots,
        state_path: PathBuf,
        config: Config,
        choice: Choice,
        inventory: Inventory,
        enforcer: Enforcer,
    ) -> Core {
        Core {
            roots,
            inventory,
            enforcer,
            state_path,
            config,
            choice,
            plan: Plan::default(),
            note: None,
            dirty: false,
            save_error: None,
            rescue: Rescue::default(),
            boot_saved: None,

            holder_watch: Vec::new(),
            forced_over: BTreeMap::new(),
            node_events: false,
        }
    }

    /// Whether kernel uevents reach the daemon (set once, before the first
    /// apply).
    pub fn set_node_events(&mut self, on: bool) {
        self.node_events = on;
    }

    /// What the kernel gets of `plan`: without uevents, a guard that waits
    /// on the default GPU's first node would deny it until a request came,
    /// so it is dropped (the window stays open until the re-plan).
    fn fit(&self, mut plan: Plan) -> Plan {
        if !self.node_events {
            plan.guards.retain(|_, g| !g.default_unseen);
        }
        plan
    }

    /// DRM nodes the kernel just made (their uevents' device paths and
    /// numbers), before any discovery: each one that is not a blocked
    /// GPU's is let through the guard at once — the default GPU's first
    /// node, at boot, when its driver binds after the daemon started
    /// (DESIGN-NOTES, "New nodes of a blocked GPU"). A blocked GPU's stays
    /// denied; the re-plan the uevent causes names it.
    pub fn release_new_nodes(&mut self, added: &[(String, crate::gpu::DevNum)]) {
        for (devpath, dev) in added {
            if owner_is_blocked(&self.inventory, &self.plan, devpath) {
                continue;
            }
            match self.enforcer.know_node(*dev) {
                Ok(true) => log!("new node {dev} ({devpath}) is no blocked GPU's: let through"),
                Ok(false) => {}
                Err(e) => log!("{e:#}"),
            }
        }
    }

    /// The kernel command line's rescue, before the first apply:
    /// `gpuctl.mode=` replaces the choice's mode for this boot (the saved
    /// choice is kept aside and is what gets saved), `gpuctl.disable`
    /// makes every plan empty.
    pub fn set_rescue(&mut self, rescue: Rescue) {
        if let Some(mode) = rescue.mode {
            if !rescue.disable {
                log!(
                    "kernel command line gpuctl.mode={mode}: mode {mode} for this boot \
                     (the saved mode, {}, is kept for the next)",
                    self.choice.mode
                );
                self.boot_saved = Some(self.choice.clone());
                self.choice = Choice {
                    mode,
                    force: false,
                    ..self.choice.clone()
                };
            }
        }
        if rescue.disable {
            log!(
                "kernel command line gpuctl.disable: blocking nothing and powering off \
                 nothing this boot"
            );
        }
        self.rescue = rescue;
    }

    /// `gpuctl.disable` is on this boot's command line: nothing is blocked
    /// or powered off, and changes are refused. The one flag every
    /// enforcing component checks.
    pub fn disabled(&self) -> bool {
        self.rescue.disable
    }

    /// The command line's mode is in force (the user has not changed it):
    /// automation holds off.
    pub fn boot_mode_held(&self) -> bool {
        self.boot_saved.is_some()
    }

    /// What is saved: the choice, with the saved mode in place of the
    /// command line's while that is in force.
    fn to_save(&self) -> Choice {
        match &self.boot_saved {
            Some(saved) => Choice {
                mode: saved.mode,
                force: saved.force,
                manual: saved.manual.clone(),
                ..self.choice.clone()
            },
            None => self.choice.clone(),
        }
    }

    /// The note a rescue adds to `get`/`status`.
    fn rescue_note(&self) -> Option<String> {
        if self.rescue.disable {
            return Some(
                "disabled for this boot by the kernel command line (gpuctl.disable): \
                 nothing is blocked; reboot without it to block again"
                    .into(),
            );
        }
        self.boot_saved.as_ref().map(|saved| {
            format!(
                "mode {} for this boot from the kernel command line (gpuctl.mode); \
                 the saved mode, {}, is back on the next boot",
                self.choice.mode, saved.mode
            )
        })
    }

    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    pub fn choice(&self) -> &Choice {
        &self.choice
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn note(&self) -> &Option<String> {
        &self.note
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn save_error(&self) -> &Option<String> {
        &self.save_error
    }

    /// Re-reads the hardware; true if it changed (then the new inventory is
    /// in place, and [`Core::replan`] is due).
    pub fn rediscover(&mut self) -> Result<bool> {
        let inv = gpu::discover(&self.roots)?;
        if inv == self.inventory {
            return Ok(false);
        }
        self.inventory = inv;
        Ok(true)
    }

    /// After a hardware change: re-applies the choice. Power state changes
    /// land here too; says something only when what is blocked changed.
    pub fn replan(&mut self) {
        let before = self.plan.clone();
        match self.reapply() {
            Ok(()) if self.plan != before => log!(
                "GPUs changed; mode {} re-applied, blocking {}",
                self.choice.mode,
                describe_blocked(&self.plan)
            ),
            Ok(()) => {}
            Err(e) => log!("re-applying after a hardware change failed: {e:#}"),
        }
    }

    /// The pidfds to poll: display servers the plan skipped GPUs for.
    pub fn holder_fds(&self) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.holder_watch.iter().map(|f| f.as_fd())
    }

    /// Watches (pidfds) the display servers the plan skipped GPUs for and
    /// those a forced choice blocks GPUs under: an exit plans again.
    fn watch_holders(&mut self, plan: &Plan) {
        let mut pids = holders::skipped_holder_pids(plan);
        pids.extend(self.forced_over.values().map(|h| h.pid));
        pids.sort_unstable();
        pids.dedup();
        self.holder_watch = pids.into_iter().filter_map(super::auth::pidfd_of).collect();
    }

    /// The GPUs a user's change counts as blocked already (the split-session
    /// rule looks at the others): leaving smart mode for a mode without
    /// grants takes a blocked GPU from its granted programs, a compositor
    /// among them, so every GPU counts as newly blocked then.
    fn blocked_for_change(&self, choice: &Choice) -> std::collections::BTreeSet<u32> {
        if self.plan.smart && choice.mode != Mode::Smart {
            return std::collections::BTreeSet::new();
        }
        self.plan.blocked.clone()
    }

    /// A watched display server exited: plan again (the GPU it held may be
    /// blocked now, as the choice asks).
    pub fn holder_gone(&mut self) {
        self.holder_watch.clear();
        self.replan();
    }

    /// Applies the saved choice to the current inventory. Protected GPUs
    /// are skipped with a log line; a mode that makes no sense here blocks
    /// nothing. Never fails because of policy, only because of the kernel.
    pub fn reapply(&mut self) -> Result<()> {
        let planned = holders::plan(
            &self.inventory,
            &self.roots.procfs,
            &self.choice,
            &self.plan.blocked,
        );
        let planned = if self.disabled() {
            Ok(Plan::default())
        } else {
            planned
        };
        let plan = match planned {
            Ok(p) => {
                self.note = (!p.skipped.is_empty()).then(|| {
                    p.skipped
                        .iter()
                        .map(|s| s.reason.clone())
                        .collect::<Vec<_>>()
                        .join("; ")
                });
                p
            }
            Err(r) => {
                self.note = Some(r.0.clone());
                Plan::default()
            }
        };
        if let Some(n) = &self.note {
            log!("mode {} is not fully in force: {n}", self.choice.mode);
        }
        self.forced_over = holders::forced_over(
            &self.inventory,
            &self.roots.procfs,
            &self.choice,
            &plan,
            &self.forced_over,
            &self.plan.blocked,
        );
        if let Some(f) = holders::forced_note(&self.inventory, &self.forced_over) {
            self.note = Some(match self.note.take() {
                Some(n) => format!("{n}; {f}"),
                None => f,
            });
        }
        if let Some(r) = self.rescue_note() {
            self.note = Some(match self.note.take() {
                Some(n) => format!("{r}; {n}"),
                None => r,
            });
        }

        self.watch_holders(&plan);
        let plan = self.fit(plan);
        self.enforcer.apply(&plan)?;
        let before = std::mem::replace(&mut self.plan, plan);
        self.nudge_compositors(&before);
        Ok(())
    }

    /// Makes `choice` the new choice: checked by the rules and applied;
    /// if the kernel refuses, nothing changes. Saving it (temp file, fsync,
    /// rename, fsync) happens right after the response is sent
    /// ([`Core::persist`]), so the client does not wait for the disk.
    pub fn change(&mut self, choice: Choice) -> Result<(), Rejection> {
        if self.disabled() {
            return Err(Rejection::Refused(
                "gpuctl is disabled for this boot by the kernel command line word \
                 gpuctl.disable: nothing is blocked and no change is made; reboot without it"
                    .into(),
            ));
        }
        let was_blocked = self.blocked_for_change(&choice);
        let plan = holders::check(&self.inventory, &self.roots.procfs, &choice, &was_blocked)?;
        let plan = self.fit(plan);
        if let Err(e) = self.enforcer.apply(&plan) {
            if let Err(back) = self.enforcer.apply(&self.plan) {
                log!("restoring the previous blocks failed: {back:#}");
            }
            return Err(e.into());
        }
        self.forced_over = holders::forced_over(
            &self.inventory,
            &self.roots.procfs,
            &choice,
            &plan,
            &self.forced_over,
            &was_blocked,
        );
        self.note = holders::forced_note(&self.inventory, &self.forced_over);
        self.watch_holders(&plan);
        self.choice = choice;
        // The user chose: the command line's mode ends, this is saved.
        self.boot_saved = None;
        let before = std::mem::replace(&mut self.plan, plan);
        self.nudge_compositors(&before);
        self.dirty = true;
        Ok(())
    }

    /// Automation chose `mode`: it becomes the choice (not forced), saved
    /// after the turn; applied now unless `apply` is false (at start, the
    /// first apply follows).
    pub fn follow(&mut self, mode: Mode, apply: bool) -> Result<()> {
        if self.boot_mode_held() || self.disabled() {
            return Ok(());
        }
        self.choice = Choice {
            mode,
            force: false,
            ..self.choice.clone()
        };
        self.dirty = true;
        if apply {
            self.reapply()?;
        }
        Ok(())
    }

    /// The app rules changed (already in the kernel): saved at once, then
    /// part of the choice.
    pub fn set_apps(&mut self, apps: BTreeMap<String, AppRule>) -> Result<()> {
        let choice = Choice {
            apps,
            ..self.choice.clone()
        };
        let saved = Choice {
            apps: choice.apps.clone(),
            ..self.to_save()
        };
        state::save(&self.state_path, &saved)?;
        self.choice = choice;
        Ok(())
    }

    /// Saves the choice if a change is not saved yet. Runs after responses
    /// are flushed and before the loop waits again, so a stop (SIGTERM) never
    /// finds it unsaved. A failure is logged and shown by `status`; the next
    /// change tries again.
    pub fn persist(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        match state::save(&self.state_path, &self.to_save()) {
            Ok(()) => self.save_error = None,
            Err(e) => {
                log!("{e:#}; the change is in force but will not survive a restart");
                self.save_error = Some(format!("{e:#}"));
            }
        }
    }

    /// The one place a new configuration takes effect (SIGHUP and
    /// `gpuctl config KEY VALUE`): what can change live (the group,
    /// env_grants, the automatic rules) does; if the kernel refuses
    /// env_grants, nothing changes.
    pub fn apply_config(&mut self, new: Config) -> Result<Applied> {
        if new.env_grants != self.config.env_grants {
            self.enforcer.set_env_grants(new.env_grants)?;
        }
        let applied = Applied {
            needs_restart: new.bpf_log != self.config.bpf_log
                || new.max_grants != self.config.max_grants,
            rules_changed: new.auto != self.config.auto,
        };
        self.config = new;
        Ok(applied)
    }

    pub fn mode_json(&self) -> ModeData {
        ModeData {
            mode: self.choice.mode,
            force: self.choice.force,
            blocked: self.plan.blocked.iter().copied().collect(),
            note: self.note.clone(),
        }
    }

    pub fn gpus_with_blocked(&self) -> Vec<gpu::Gpu> {
        let mut gpus = self.inventory.gpus.clone();
        for g in &mut gpus {
            g.blocked = Some(self.plan.blocked.contains(&g.id));
        }
        gpus
    }

    fn nudge_compositors(&self, before: &Plan) {
        auto::nudge_compositors(
            &self.roots.sysfs,
            self.config.auto.external_display,
            &self.inventory,
            &before.blocked,
            &self.plan.blocked,
        );
    }
}

/// Whether the device at `devpath` (a uevent's `DEVPATH`) belongs to a GPU
/// that `plan` blocks: one of the path's components is its PCI address
/// (`/devices/pci0000:00/0000:00:03.0/virtio1/drm/card1`).
fn owner_is_blocked(inv: &crate::gpu::Inventory, plan: &Plan, devpath: &str) -> bool {
    inv.gpus
        .iter()
        .filter(|g| plan.blocked.contains(&g.id))
        .any(|g| {
            let pci = g.pci.to_string();
            devpath.split('/').any(|c| c == pci)
        })
}

pub fn describe_blocked(plan: &Plan) -> String {
    if plan.blocked.is_empty() {
        "nothing (programs detached)".to_string()
    } else {
        let ids: Vec<String> = plan.blocked.iter().map(|i| format!("GPU {i}")).collect();
        let guarded: Vec<String> = plan.guards.keys().map(|m| m.to_string()).collect();
        let waits = plan.guards.values().any(|g| g.default_unseen);
        let guard = match (guarded.len(), waits) {
            (0, _) => "; new nodes not guarded: the default GPU has none yet and no uevents arrive"
                .to_string(),
            (_, false) => format!(
                "; new nodes of major {} denied until known",
                guarded.join(", ")
            ),
            (_, true) => format!(
                "; new nodes of major {} denied until known, but for those of no blocked GPU \
                 (the default GPU has none yet), let through on their uevent",
                guarded.join(", ")
            ),
        };
        format!(
            "{} ({} device nodes{guard})",
            ids.join(", "),
            plan.nodes.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_node_is_a_blocked_gpus_when_its_path_goes_through_that_gpu() {
        let inv = crate::gpu::Inventory {
            gpus: vec![
                crate::gpu::test_gpu(0, "0000:00:02.0", "1234", true),
                crate::gpu::test_gpu(1, "0000:00:03.0", "1af4", false),
            ],
            ..Default::default()
        };
        let mut plan = Plan::default();
        plan.blocked.insert(1);
        let blocked = |plan: &Plan, p: &str| owner_is_blocked(&inv, plan, p);
        assert!(blocked(
            &plan,
            "/devices/pci0000:00/0000:00:03.0/virtio1/drm/card1"
        ));
        assert!(blocked(
            &plan,
            "/devices/pci0000:00/0000:00:03.0/drm/renderD128"
        ));
        // The default GPU's, a platform device's, a look-alike name's.
        assert!(!blocked(
            &plan,
            "/devices/pci0000:00/0000:00:02.0/drm/card0"
        ));
        assert!(!blocked(
            &plan,
            "/devices/platform/simple-framebuffer.0/drm/card0"
        ));
        assert!(!blocked(
            &plan,
            "/devices/pci0000:00/0000:00:03.01/drm/card2"
        ));
        plan.blocked.clear();
        assert!(!blocked(
            &plan,
            "/devices/pci0000:00/0000:00:03.0/virtio1/drm/card1"
        ));
    }
}
