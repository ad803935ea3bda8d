//! Start-up, and what one room's news means for the others: the one
//! `impl Daemon`. A hardware change re-plans, re-syncs the power watch and
//! asks automation; automation's answer goes to the core; a new config is
//! applied by the core, then automation decides again.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::apps::Apps;
use super::auto::Auto;
use super::config;
use super::core::{describe_blocked, Applied, Core};
use super::grants::Grants;
use super::log::log;
use super::power::Power;
use super::poweroff::{self, PowerOff};
use super::push::Push;
use super::{backend, lifetime, rescue, state, uevent, Daemon, Options, Unsupported};
use crate::bpf;
use crate::gpu;
use crate::policy::Mode;

/// Read requests within this time of the last one share one discovery
/// (sysfs) and one `who` scan (procfs): a burst of `status`/`who` costs
/// one read of the hardware, not one each.
pub const SHARED_READ_WINDOW: Duration = Duration::from_millis(250);

impl Daemon {
    /// Reads the files, discovers, loads the backend and opens every
    /// room; nothing is applied yet.
    fn open(opts: &Options) -> Result<Daemon> {
        // One daemon per state directory, whatever happened to the socket file.
        let lock = lifetime::lock_state_dir(&opts.state_dir)?;
        // Drivers a previous daemon unbound (it died: kill -9, a crash)
        // are bound again before anything else, so discovery sees them.
        let poweroff = PowerOff::start(&opts.state_dir, &opts.roots.sysfs);
        let (config, warn) = config::load(&opts.config);
        if let Some(w) = warn {
            log!("{w}");
        }
        bpf::init_logging(opts.verbose);

        let state_path = opts.state_dir.join("state.json");
        let (choice, warn) = state::load(&state_path);
        if let Some(w) = warn {
            log!("{w}");
        }
        let (auto, warns) = Auto::load(&opts.state_dir);
        for w in warns {
            log!("{w}");
        }
        let inventory = gpu::discover(&opts.roots).context("discovering GPUs")?;
        // What the saved mode attaches is loaded before READY, the rest after it
        // (`start_power`), or at once if a plan needs it first (the automatic
        // rules may pick another mode below: `Enforcer::apply` loads it then).
        let preload = match choice.mode {
            Mode::Hybrid => bpf::Preload::Nothing,
            Mode::Integrated | Mode::Manual => bpf::Preload::Block,
            Mode::Smart => bpf::Preload::Smart,
        };
        let enforcer =
            backend::load_backend(opts, &config, preload).map_err(|e| e.context(Unsupported))?;
        let power = Power::deferred(&opts.roots.sysfs);
        let apps = Apps::new(opts.services.clone())?;
        let uevents = match uevent::Uevents::open() {
            Ok(u) => Some(u),
            Err(e) => {
                log!("{e:#}; GPUs will be re-read on each request only");
                None
            }
        };
        let mut core = Core::new(
            opts.roots.clone(),
            state_path,
            config,
            choice,
            inventory,
            enforcer,
        );
        core.set_node_events(uevents.is_some());
        Ok(Daemon {
            core,
            apps,
            grants: Grants::new(&opts.state_dir),
            auto,
            power,
            poweroff,
            push: Push::default(),
            uevents,
            burst: uevent::Coalesce::default(),
            config_path: opts.config.clone(),
            run_root: opts.run_root.clone(),
            seats: super::seat::ActiveSessions::new(&opts.run_root)?,
            started: Instant::now(),
            refreshed: None,
            who_scans: super::holders::Scans::default(),
            _lock: lock,
        })
    }

    /// Everything before the socket: the lock, the files, discovery, the
    /// backend, the saved mode in force, the grants of processes that
    /// outlived the previous daemon.
    pub(super) fn start(opts: &Options) -> Result<Daemon> {
        let mut d = Daemon::open(opts)?;
        let (rescue, warns) = rescue::read(&opts.roots.procfs);
        for w in warns {
            log!("{w}");
        }
        d.core.set_rescue(rescue);
        let env_grants = d.core.config().env_grants;
        d.core.enforcer.set_env_grants(env_grants)?;
        d.sync_power();
        d.apps.load_services(&mut d.core);
        d.seats.sync(&mut d.core.enforcer);
        d.apps.load(&mut d.core);
        // The automatic rules pick the mode from the power source now: the
        // rules' mode becomes the choice before the first apply, so it is
        // in force before READY.
        d.auto_evaluate(false, "start");
        d.core.reapply().context("applying the saved mode")?;
        // A blocked GPU that cannot sleep is powered off before READY (and
        // before the socket answers): no client waits yet, so the start
        // waits for its unbinds, each bounded by its deadline.
        d.poweroff_sync();
        while d.poweroff.in_flight() {
            std::thread::sleep(Duration::from_millis(5));
            d.poweroff_sync();
        }
        d.push = Push::new(d.core.choice(), d.core.plan());
        // Grants of processes that outlived the previous daemon.
        let apps = d.apps.in_force(&d.core);
        let mode = d.core.choice().mode;
        d.grants.restore(&mut d.core.enforcer, mode, &apps);
        let core = &d.core;
        log!(
            "started: backend {}{}, mode {}, {} GPU(s), blocking {}",
            core.enforcer.backend(),
            core.enforcer
                .cgroup_path()
                .map(|p| format!(" on {}", p.display()))
                .unwrap_or_default(),
            core.choice().mode,
            core.inventory().gpus.len(),
            describe_blocked(core.plan())
        );
        Ok(d)
    }

    /// Re-reads the hardware; re-plans if anything changed (hot plug,
    /// a display plugged in, a driver bound).
    pub(super) fn refresh(&mut self) {
        match self.core.rediscover() {
            Ok(true) => {
                self.sync_power();
                self.core.replan();
                self.auto_evaluate(true, "GPU change");
            }
            Ok(false) => {}
            Err(e) => log!("rediscovering GPUs failed: {e:#}"),
        }
    }

    /// Re-reads the hardware for a read request, unless a read within the
    /// last [`SHARED_READ_WINDOW`] already did.
    pub(super) fn refresh_for_read(&mut self) {
        let now = Instant::now();
        if self
            .refreshed
            .is_some_and(|t| now.duration_since(t) < SHARED_READ_WINDOW)
        {
            return;
        }
        self.refresh();
        self.refreshed = Some(now);
    }

    /// After READY=1: loads the runtime-PM programs (wake attribution) and
    /// watches the GPUs with them. The boot does not wait for them: they
    /// only observe, so no block or grant depends on them.
    /// Also loads the enforcer's other programs (smart mode's hooks unless
    /// the saved mode is smart, the holder scan): nothing in force needs
    /// them, and whatever needs one later loads them first.
    pub(super) fn start_power(&mut self) {
        if let Err(e) = self.core.enforcer.load_rest() {
            log!("{e:#}; smart mode and `who` will retry loading them when asked");
        }
        self.power.load();
        if let Some(e) = self.power.error() {
            log!("runtime-PM programs not loaded ({e}); residency only, no wake attribution");
        }
        self.sync_power();
    }

    /// Brings the power-off of blocked GPUs that cannot sleep in line with
    /// the plan (poweroff.rs); after every turn of the loop and at start.
    /// When it did something, the hardware is read again.
    pub(super) fn poweroff_sync(&mut self) {
        let core = &self.core;
        let inputs = poweroff::Inputs {
            sysfs: &core.roots.sysfs,
            procfs: &core.roots.procfs,
            inventory: core.inventory(),
            blocked: &core.plan().blocked,
            auto: core.config().power_off == config::PowerOff::Auto,
            disabled: poweroff::disabled_by_cmdline(&core.roots.procfs),
            now: Instant::now(),
        };
        let changed = self.poweroff.sync(&inputs);
        if !changed.is_empty() {
            for (id, pci, info) in changed {
                if let Some(i) = &info {
                    log!("GPU {id}: {}", i.summary());
                }
                self.push.power_off(id, pci, info);
            }
            self.refresh();
        }
    }

    /// Watches the offload GPUs' runtime PM (power.rs); never fatal.
    pub(super) fn sync_power(&mut self) {
        if let Err(e) = self.power.sync(self.core.inventory()) {
            log!("watching the GPUs' runtime PM failed: {e}");
        }
    }

    /// Automation reads its inputs and decides; a new mode goes to the core
    /// (applied now unless `apply` is false: at start, before the first
    /// apply) and to subscribers.
    pub(super) fn auto_evaluate(&mut self, apply: bool, trigger: &str) {
        // The kernel command line's mode (or gpuctl.disable) holds this boot.
        if self.core.boot_mode_held() || self.core.disabled() {
            return;
        }
        let Some((mode, why)) = self.auto.evaluate(&self.core) else {
            return;
        };
        if let Err(e) = self.core.follow(mode, apply) {
            log!("auto: applying {mode} failed: {e:#}");
        }
        log!(
            "auto: mode {mode} ({why}; after {trigger}), blocking {}",
            if apply {
                describe_blocked(self.core.plan())
            } else {
                "what it blocks before READY".into()
            }
        );
        self.auto.announce(mode, &why, trigger);
    }

    /// Runs an automatic decision that is due (the settle deadline passed).
    pub(super) fn auto_tick(&mut self, now: Instant) {
        if let Some(cause) = self.auto.take_due(now) {
            self.auto_evaluate(true, cause);
        }
    }

    /// After the core applied a new configuration ([`Core::apply_config`],
    /// from SIGHUP or `gpuctl config KEY VALUE`): automation decides again
    /// if its rules changed.
    pub(super) fn config_applied(&mut self, applied: &Applied) {
        if applied.rules_changed {
            self.auto_evaluate(true, "config change");
        }
    }

    /// SIGHUP: re-reads the config and applies what can change live (the
    /// group, env_grants, the automatic rules), and re-resolves the app
    /// rules.
    pub(super) fn reload(&mut self) {
        let (new, warn) = config::load(&self.config_path);
        if let Some(w) = warn {
            log!("{w}");
        }
        let applied = match self.core.apply_config(new) {
            Ok(a) => a,
            Err(e) => {
                log!("reload: {e:#}");
                return;
            }
        };
        if applied.needs_restart {
            log!("reload: bpf_log and max_grants are fixed when the BPF programs load; restart the daemon to change them");
        }
        self.apps.load(&mut self.core);
        self.config_applied(&applied);
        log!(
            "reloaded {}: group {}, env_grants {}",
            self.config_path.display(),
            self.core.config().group,
            self.core.config().env_grants
        );
    }
}
