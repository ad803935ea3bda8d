//! Automatic modes, daemon side: gathers the rule's inputs from the kernel
//! (`class/power_supply`, the GPUs' connectors, the user's last manual
//! choice), runs [`automation::decide`] and applies its answer.
//!
//! - **Power source**: read at start (before READY), then on `power_supply`
//!   uevents. Plugging AC emits several events and a flapping connector
//!   many: each event (re)arms a settle deadline in the poll loop (quiet for
//!   [`QUIET`], at most [`MAX_WAIT`] after the first), and one decision is
//!   made from the state sysfs shows then. No polling.
//! - **Resume**: a `CLOCK_REALTIME` timerfd armed with
//!   `TFD_TIMER_CANCEL_ON_SET` becomes readable when the clock is set and on
//!   every resume from suspend (the kernel treats resume as a clock set), so
//!   the rules are re-evaluated after a sleep during which the power source
//!   may have changed without an event.
//! - **Manual vs automatic**: a `set`/`block`/`unblock` while automation is
//!   active stands until the power source changes or `gpuctl auto on`.
//!   Persisted in `auto.json` beside `state.json` with the power source it
//!   was made on, so a restart on the same power keeps it.
//! - **External displays**: when a GPU that was blocked is unblocked while it
//!   drives a connected display, a synthetic `add` uevent is written to its
//!   `cardN/uevent`, so compositors that ignored the GPU (its open failed)
//!   add it: Mutter and KWin hot-add a DRM device on `add`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::proto::data::{AutoData, AutoRules};
use crate::proto::event::{Event, ModeEvent};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::core::Core;
use super::log::log;
use super::state;
use crate::automation::{self, Inputs, Power, Rules, Why};
use crate::gpu::Inventory;
use crate::policy::{self, Choice, Mode};
use crate::safefile::{self, ReadError};

/// A burst of power events is over when none came for this long.
pub const QUIET: Duration = Duration::from_millis(600);
/// A decision is made at most this long after the first event of a burst,
/// even if the connector keeps flapping (then from the state at that time).
pub const MAX_WAIT: Duration = Duration::from_millis(3000);

#[derive(Default, Serialize, Deserialize)]
struct AutoFile {
    version: u32,
    /// `gpuctl auto off` was run (automation is on unless this is true).
    #[serde(default)]
    off: bool,
    /// A manual choice stands; the power source it was made on.
    #[serde(default)]
    manual_on: Option<Power>,
}

pub struct Auto {
    path: PathBuf,
    enabled: bool,
    overridden: bool,
    /// The power source last read (`None` before the first read).
    power: Option<Power>,
    /// When the power source last changed (or the daemon started).
    since: Option<SystemTime>,
    why: Option<Why>,
    /// A pending decision: (first event of the burst, deadline).
    settle: Option<(Instant, Instant)>,
    settle_cause: &'static str,
    /// Readable after a clock set or a resume; `None` if refused.
    clock: Option<OwnedFd>,
    /// `mode` events for subscribers, sent by the loop.
    outbox: Vec<Event>,
    /// Why the last save of `auto.json` failed, if it did.
    save_error: Option<String>,
}

impl Auto {
    /// Loads `auto.json` from the state directory. A corrupt file is moved
    /// aside and reported; automation then starts on, with no override.
    /// Returns every warning (a corrupt file, a refused resume watch).
    pub fn load(state_dir: &Path) -> (Auto, Vec<String>) {
        Auto::load_with(state_dir, clock_watch())
    }

    /// [`Auto::load`] with the resume watch given (a test makes it fail).
    fn load_with(state_dir: &Path, clock: Result<OwnedFd>) -> (Auto, Vec<String>) {
        let path = state_dir.join("auto.json");
        let mut warn = Vec::new();
        // One of the daemon's own files: not a symlink, regular, <= 1 MiB,
        // opened O_NONBLOCK (a FIFO planted there cannot stall the start).
        let err = match safefile::read_own(&path) {
            Err(ReadError::Missing) => None,
            Ok(b) => match serde_json::from_slice::<AutoFile>(&b) {
                Ok(f) if f.version == 1 => Some(Ok(f)),
                Ok(f) => Some(Err(format!("is corrupt (unknown version {})", f.version))),
                Err(e) => Some(Err(format!("is corrupt ({e})"))),
            },
            Err(e) => Some(Err(format!("is unusable ({e})"))),
        };
        let file = match err {
            None => AutoFile::default(),
            Some(Ok(f)) => f,
            Some(Err(why)) => {
                let kept = safefile::keep_aside(&path);
                warn.push(format!(
                    "{} {why}; automation on, no manual override; {kept}",
                    path.display()
                ));
                AutoFile::default()
            }
        };
        let clock = match clock {
            Ok(fd) => Some(fd),
            Err(e) => {
                warn.push(format!(
                    "{e:#}; automatic modes will not be re-evaluated after a resume"
                ));
                None
            }
        };
        let auto = Auto {
            path,
            enabled: !file.off,
            overridden: file.manual_on.is_some(),
            power: file.manual_on,
            since: None,
            why: None,
            settle: None,
            settle_cause: "",
            clock,
            outbox: Vec::new(),
            save_error: None,
        };
        (auto, warn)
    }

    fn save(&mut self) {
        let f = AutoFile {
            version: 1,
            off: !self.enabled,
            manual_on: if self.overridden { self.power } else { None },
        };
        let res = serde_json::to_vec_pretty(&f)
            .context("encoding auto.json")
            .and_then(|mut b| {
                b.push(b'\n');
                state::write_atomic(&self.path, &b)
            });
        self.save_error = res.err().map(|e| {
            log!("saving {}: {e:#}", self.path.display());
            format!("{e:#}")
        });
    }

    /// The `mode` events queued since the last call, for subscribers.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.outbox)
    }

    /// Why the last save of `auto.json` failed, if it did.
    pub fn save_error(&self) -> Option<&str> {
        self.save_error.as_deref()
    }

    /// The poll loop's deadline for a pending decision.
    pub fn deadline(&self) -> Option<Instant> {
        self.settle.map(|(_, d)| d)
    }

    pub fn clock_fd(&self) -> Option<BorrowedFd<'_>> {
        self.clock.as_ref().map(|f| f.as_fd())
    }

    /// A power event (or a resume): decide once things settled.
    pub fn arm(&mut self, now: Instant, cause: &'static str) {
        let first = self.settle.map_or(now, |(f, _)| f);
        self.settle = Some((first, (now + QUIET).min(first + MAX_WAIT)));
        self.settle_cause = cause;
    }

    /// The clock was set or the machine resumed: re-arm the watch.
    pub fn on_clock(&mut self, now: Instant) {
        log!("auto: the clock was set or the machine resumed; re-reading the power source");
        if let Some(fd) = &self.clock {
            let mut b = [0u8; 8];
            // SAFETY: reading 8 bytes into an 8-byte buffer from an fd we
            // own. The result (ECANCELED after a clock set) only resets the
            // timer's state; it is not needed.
            let _ = unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
            if let Err(e) = arm_clock(fd) {
                log!("{e:#}; automatic modes will not be re-evaluated after a resume");
                self.clock = None;
            }
        }
        self.arm(now, "resume or clock change");
    }

    /// Takes a due decision's cause, if the deadline passed.
    pub fn take_due(&mut self, now: Instant) -> Option<&'static str> {
        match self.settle {
            Some((_, d)) if d <= now => {
                self.settle = None;
                Some(self.settle_cause)
            }
            _ => None,
        }
    }
}

/// A `CLOCK_REALTIME` timerfd that fires only when the clock is set (or the
/// machine resumes): armed at the far future with `TFD_TIMER_CANCEL_ON_SET`.
fn clock_watch() -> Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is checked and owned at once.
    let raw = unsafe {
        libc::timerfd_create(libc::CLOCK_REALTIME, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC)
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error()).context("timerfd_create");
    }
    // SAFETY: `raw` is a fresh fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    arm_clock(&fd)?;
    Ok(fd)
}

fn arm_clock(fd: &OwnedFd) -> Result<()> {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        // Year ~2255: never reached; only a clock set wakes it.
        it_value: libc::timespec {
            tv_sec: 9_000_000_000,
            tv_nsec: 0,
        },
    };
    // SAFETY: valid fd and a fully initialised itimerspec; no old value.
    let r = unsafe {
        libc::timerfd_settime(
            fd.as_raw_fd(),
            libc::TFD_TIMER_ABSTIME | libc::TFD_TIMER_CANCEL_ON_SET,
            &spec,
            std::ptr::null_mut(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("arming the resume watch (timerfd)");
    }
    Ok(())
}

/// The power source from `class/power_supply`: any `Mains` or `USB`
/// supply online → AC; else a system battery (not a device's, such as a
/// mouse's: `scope` = `Device`) → battery; no battery at all → AC (a
/// desktop). Unreadable directory → unknown.
pub fn read_power(sysfs: &Path) -> Power {
    let dir = sysfs.join("class/power_supply");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Power::Ac,
        Err(_) => return Power::Unknown,
    };
    let mut battery = false;
    for e in entries.flatten().take(256) {
        let p = e.path();
        match safefile::read_attr(&p.join("type"), true).as_deref() {
            Some("Mains" | "USB")
                if safefile::read_attr(&p.join("online"), true).as_deref() == Some("1") =>
            {
                return Power::Ac;
            }
            Some("Battery")
                if safefile::read_attr(&p.join("scope"), true).as_deref() != Some("Device") =>
            {
                battery = true;
            }
            _ => {}
        }
    }
    if battery {
        Power::Battery
    } else {
        Power::Ac
    }
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Auto {
    /// Reads the inputs (the power source now, the GPUs' displays, which
    /// modes the rules refuse here), decides, and returns the mode to
    /// switch to, with why, if it differs from the choice in `core`.
    pub fn evaluate(&mut self, core: &Core) -> Option<(Mode, Why)> {
        let power = read_power(&core.roots.sysfs);
        let prev = self.power;
        if self.since.is_none() || prev != Some(power) {
            // At start, `prev` is the power source a saved manual choice
            // was made on: it stands only if the power source is the same.
            if self.overridden && prev != Some(power) {
                self.overridden = false;
                log!("auto: the power source changed; the manual choice gives way to the rules");
                self.save();
            }
            self.power = Some(power);
            self.since = Some(SystemTime::now());
        }
        let display = core
            .inventory()
            .gpus
            .iter()
            .filter(|g| g.offload)
            .find_map(|g| {
                g.displays
                    .iter()
                    .find(|d| d.connected() && !d.internal())
                    .map(|d| format!("GPU {} {}", g.id, d.connector))
            });
        let mut refused = BTreeMap::new();
        for m in [Mode::Integrated, Mode::Smart] {
            let c = Choice {
                mode: m,
                ..Choice::default()
            };
            if let Err(r) = policy::plan(core.inventory(), &c) {
                refused.insert(m, r.0.trim_start_matches("refused: ").to_string());
            }
        }
        let d = automation::decide(&Inputs {
            rules: &core.config().auto,
            enabled: self.enabled,
            power,
            overridden: self.overridden,
            display: display.as_deref(),
            refused: &refused,
        });
        self.why = Some(d.why.clone());
        let mode = d.mode?;
        if mode == core.choice().mode && !core.choice().force {
            return None;
        }
        Some((mode, d.why))
    }

    /// The rules' mode is in force: tells subscribers (a `mode` event).
    pub fn announce(&mut self, mode: Mode, why: &Why, trigger: &str) {
        self.outbox.push(Event::Mode(ModeEvent {
            mode,
            reason: "auto".into(),
            detail: Some(why.to_string()),
            trigger: Some(trigger.to_string()),
        }));
    }

    /// A manual `set`/`block`/`unblock` succeeded: while automation is
    /// active it stands until the power source changes.
    pub fn manual(&mut self, rules: &Rules, mode: Mode, blocking: &str) {
        if rules.any() && self.enabled && !self.overridden {
            self.overridden = true;
            self.why = Some(Why::Manual);
            self.save();
        }
        self.outbox.push(Event::Mode(ModeEvent {
            mode,
            reason: "manual".into(),
            detail: Some(format!("gpuctl set/block/unblock; blocking {blocking}")),
            trigger: None,
        }));
    }

    /// `gpuctl auto on|off`: the rules decide again (a manual override
    /// ends). Saved at once.
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        self.overridden = false;
        self.save();
    }

    /// Whether automation is active: rules set and not turned off (the
    /// mode in force is then the rules', as `status` says in `auto`).
    pub fn active(&self, rules: &Rules) -> bool {
        rules.any() && self.enabled
    }

    /// The automation part of `status` and `auto status`.
    pub fn json(&self, rules: &Rules, mode: Mode) -> AutoData {
        AutoData {
            active: self.active(rules),
            enabled: self.enabled,
            rules: AutoRules {
                on_battery: rules.on_battery,
                on_ac: rules.on_ac,
                external_display: rules.external_display,
            },
            power: self.power,
            since: self.since.map(unix_secs),
            manual_override: self.overridden,
            pending: self.settle.is_some(),
            mode,
            why: self.why.as_ref().map(|w| w.to_string()),
            resume_watch: self.clock.is_some(),
        }
    }
}

/// After a plan change: a GPU that was blocked (in `before`), is not any
/// more (in `after`), and drives a connected display gets a synthetic `add`
/// uevent on its primary node, so a compositor that could not open it adds
/// it now.
pub fn nudge_compositors(
    sysfs: &Path,
    rule: automation::DisplayRule,
    inv: &Inventory,
    before: &BTreeSet<u32>,
    after: &BTreeSet<u32>,
) {
    if rule != automation::DisplayRule::Unblock {
        return;
    }
    for g in &inv.gpus {
        if !before.contains(&g.id) || after.contains(&g.id) || !g.drives_display() {
            continue;
        }
        let Some(card) = &g.card else { continue };
        let path = sysfs.join("class/drm").join(card).join("uevent");
        match write_uevent(&path, "add") {
            Ok(()) => log!(
                "{} unblocked with a display connected: sent `add` on {card} so the compositor adds it",
                g.label()
            ),
            Err(e) => log!("telling compositors about {card}: {e:#}"),
        }
    }
}

fn write_uevent(path: &Path, action: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(action.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supply(root: &Path, name: &str, attrs: &[(&str, &str)]) {
        let d = root.join("class/power_supply").join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (k, v) in attrs {
            std::fs::write(d.join(k), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn power_source_from_power_supply() {
        let root = std::env::temp_dir().join(format!("gpuctl-psu-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        // No class/power_supply at all: a desktop.
        assert_eq!(read_power(&root), Power::Ac);
        // A wireless mouse's battery is not the system's.
        supply(
            &root,
            "hidpp_battery_0",
            &[("type", "Battery"), ("scope", "Device")],
        );
        assert_eq!(read_power(&root), Power::Ac);
        supply(
            &root,
            "BAT0",
            &[("type", "Battery"), ("status", "Discharging")],
        );
        supply(&root, "AC", &[("type", "Mains"), ("online", "0")]);
        supply(
            &root,
            "ucsi-source-psy-USBC000:001",
            &[("type", "USB"), ("online", "0")],
        );
        assert_eq!(read_power(&root), Power::Battery);
        supply(
            &root,
            "ucsi-source-psy-USBC000:001",
            &[("type", "USB"), ("online", "1")],
        );
        assert_eq!(read_power(&root), Power::Ac);
        supply(
            &root,
            "ucsi-source-psy-USBC000:001",
            &[("type", "USB"), ("online", "0")],
        );
        supply(&root, "AC", &[("type", "Mains"), ("online", "1")]);
        assert_eq!(read_power(&root), Power::Ac);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn corrupt_auto_json_is_kept_aside_and_automation_is_on() {
        let dir = std::env::temp_dir().join(format!("gpuctl-autojson-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("auto.json"), "{\"version\":1,\"off\":tr").unwrap();
        let (a, warn) = Auto::load(&dir);
        assert!(a.enabled && !a.overridden);
        assert!(warn[0].contains("is corrupt"), "{warn:?}");
        assert!(dir.join("auto.json.bad").exists());
        // A saved state round-trips.
        let (mut a, _) = Auto::load(&dir);
        a.enabled = false;
        a.overridden = true;
        a.power = Some(Power::Battery);
        a.save();
        let (b, warn) = Auto::load(&dir);
        assert!(warn.iter().all(|w| w.contains("timerfd")), "{warn:?}");
        assert!(!b.enabled && b.overridden);
        assert_eq!(b.power, Some(Power::Battery));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_file_and_a_refused_resume_watch_are_both_reported() {
        let dir = std::env::temp_dir().join(format!("gpuctl-autowarn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("auto.json"), "not json").unwrap();
        let refused = Err(anyhow::anyhow!("timerfd_create: EMFILE"));
        let (a, warns) = Auto::load_with(&dir, refused);
        assert!(a.enabled && a.clock.is_none());
        let all = format!("{warns:?}");
        assert!(all.contains("is corrupt"), "{all}");
        assert!(all.contains("EMFILE"), "{all}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bursts_settle_once_and_flapping_is_capped() {
        let dir = std::env::temp_dir().join(format!("gpuctl-auto-{}", std::process::id()));
        let (mut a, _) = Auto::load(&dir);
        let t0 = Instant::now();
        a.arm(t0, "power_supply uevent");
        assert_eq!(a.deadline(), Some(t0 + QUIET));
        // Events every 100 ms keep pushing the deadline, up to MAX_WAIT.
        for i in 1..30 {
            a.arm(t0 + Duration::from_millis(100 * i), "power_supply uevent");
        }
        assert_eq!(a.deadline(), Some(t0 + MAX_WAIT));
        assert_eq!(a.take_due(t0 + MAX_WAIT - Duration::from_millis(1)), None);
        assert_eq!(a.take_due(t0 + MAX_WAIT), Some("power_supply uevent"));
        assert_eq!(a.deadline(), None, "one decision per burst");
    }
}
