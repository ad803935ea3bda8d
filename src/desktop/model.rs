//! What the desktop shows, as a pure function of what the daemon said:
//! the icon's state, the tooltip, the menu, the status-bar line. No D-Bus
//! and no I/O here, so every rule is unit-tested.

use std::collections::{BTreeMap, VecDeque};
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;

use crate::policy::Mode;
use crate::procs::Holder;
use crate::proto::data::{AutoData, StatusData, StatusGpu};
use crate::proto::event::Event;

/// Recent denials kept for the menu.
pub const RECENT_DENIALS: usize = 5;

/// What the icon says about the offload GPU(s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// No daemon answers.
    Down,
    /// An offload GPU is awake (powered, drawing watts).
    Awake,
    /// Every offload GPU is blocked (and none is awake).
    Blocked,
    /// Offload GPUs asleep and usable (hybrid, smart, manual unblocked).
    Asleep,
    /// No offload GPU, or its power state is unknown.
    Unknown,
}

impl Look {
    pub fn name(self) -> &'static str {
        match self {
            Look::Down => "down",
            Look::Awake => "awake",
            Look::Blocked => "blocked",
            Look::Asleep => "asleep",
            Look::Unknown => "unknown",
        }
    }
}

/// A denied open the user may turn into an app rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Denial {
    pub pid: Option<u64>,
    pub comm: String,
    pub gpu: Option<u64>,
    /// The executable, read from /proc when the event arrived (our own
    /// processes only; `None` when it could not be read).
    pub exe: Option<String>,
}

/// An action the menu offers.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    SetMode(String),
    Block(u64),
    Unblock(u64),
    Allow(String),
    Auto(bool),
    Quit,
}

/// Everything the desktop surface knows.
#[derive(Default)]
pub struct State {
    /// `status --json` data, or why there is none.
    pub status: Option<StatusData>,
    pub down: Option<String>,
    /// `who` holders (only those this user may see).
    pub holders: Vec<Holder>,
    pub denials: VecDeque<Denial>,
    /// Since when (as seen here) each GPU has been suspended.
    pub asleep_since: BTreeMap<u64, SystemTime>,
    /// The last refused or failed action, shown until the next success.
    pub last_error: Option<String>,
}

fn offload(status: &StatusData) -> Vec<&StatusGpu> {
    status.gpus.iter().filter(|g| !g.default).collect()
}

fn awake(g: &StatusGpu) -> bool {
    // runtime_status is what runtime PM says; power_state the D-state.
    match g.runtime_status.as_deref() {
        Some("active" | "resuming") => true,
        Some(_) => false,
        None => matches!(g.power_state.as_deref(), Some("D0")),
    }
}

fn asleep(g: &StatusGpu) -> bool {
    match g.runtime_status.as_deref() {
        Some("suspended" | "suspending") => true,
        Some(_) => false,
        None => matches!(g.power_state.as_deref(), Some("D3hot" | "D3cold")),
    }
}

/// `HH:MM:SS`, local time: a tooltip that says "asleep since 10:42:05"
/// stays true without being redrawn every second.
pub fn clock(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`, which we own; it reads
    // `secs` and the process's time zone.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers are valid for the call.
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return "?".into();
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

impl State {
    pub fn mode(&self) -> Option<&str> {
        self.status.as_ref().map(|s| s.mode.as_str())
    }

    pub fn may_change(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.may_change)
    }

    pub fn look(&self) -> Look {
        let Some(st) = &self.status else {
            return Look::Down;
        };
        let gpus = offload(st);
        if gpus.is_empty() {
            Look::Unknown
        } else if gpus.iter().any(|g| awake(g)) {
            Look::Awake
        } else if gpus.iter().all(|g| g.blocked == Some(true)) {
            Look::Blocked
        } else if gpus.iter().all(|g| asleep(g)) {
            Look::Asleep
        } else {
            Look::Unknown
        }
    }

    /// Takes a fresh `status` answer: tracks when each GPU fell asleep.
    pub fn set_status(&mut self, status: StatusData, now: SystemTime) {
        for g in offload(&status) {
            let id = u64::from(g.id);
            if asleep(g) {
                self.asleep_since.entry(id).or_insert(now);
            } else {
                self.asleep_since.remove(&id);
            }
        }
        self.status = Some(status);
        self.down = None;
    }

    pub fn set_down(&mut self, why: String) {
        self.status = None;
        self.holders.clear();
        self.asleep_since.clear();
        self.down = Some(why);
    }

    pub fn add_denial(&mut self, d: Denial) {
        // One entry per program: the newest first.
        self.denials
            .retain(|x| !(x.comm == d.comm && x.exe == d.exe && x.gpu == d.gpu));
        self.denials.push_front(d);
        self.denials.truncate(RECENT_DENIALS);
    }

    /// The short line: `integrated · dGPU asleep`.
    pub fn text(&self) -> String {
        match self.mode() {
            None => "gpuctl: daemon not running".to_string(),
            Some(m) => format!("{m} · dGPU {}", self.look().name()),
        }
    }

    pub fn title(&self) -> String {
        match self.mode() {
            None => "gpuctl: the daemon is not running".to_string(),
            Some(m) => format!("gpuctl: {m} mode, dGPU {}", self.look().name()),
        }
    }

    /// One line per GPU: state, time asleep, who holds it.
    pub fn tooltip(&self) -> String {
        let Some(st) = &self.status else {
            return self
                .down
                .clone()
                .unwrap_or_else(|| "the gpuctl daemon is not running".into());
        };
        let mut lines = Vec::new();
        for g in &st.gpus {
            let id = u64::from(g.id);
            let name = g.name.as_deref().unwrap_or("GPU");
            let mut l = format!("GPU {id} {name}");
            if g.default {
                l.push_str(": default");
            } else {
                let ps = g.power_state.as_deref().unwrap_or("?");
                if awake(g) {
                    l.push_str(&format!(": awake ({ps})"));
                } else if asleep(g) {
                    // The daemon's residency (power monitor) if it has it,
                    // else since this client saw it fall asleep.
                    let since = g
                        .runtime_pm
                        .as_ref()
                        .and_then(|p| p.awake_since)
                        .is_none()
                        .then(|| self.asleep_since.get(&id))
                        .flatten()
                        .map(|t| format!(", since {}", clock(*t)))
                        .unwrap_or_default();
                    l.push_str(&format!(": asleep ({ps}{since})"));
                    if let Some(p) = g
                        .runtime_pm
                        .as_ref()
                        .and_then(|p| p.since_start)
                        .and_then(|r| r.asleep_pct)
                    {
                        l.push_str(&format!(", {p:.0}% asleep since the daemon started"));
                    }
                } else {
                    l.push_str(&format!(": power {ps}"));
                }
                l.push_str(if g.blocked == Some(true) {
                    ", blocked"
                } else {
                    ", usable"
                });
            }
            let held: Vec<String> = self
                .holders
                .iter()
                .filter(|h| h.gpu == g.id)
                .map(|h| format!("{} ({})", h.comm, h.pid))
                .collect();
            if !held.is_empty() {
                l.push_str(&format!("; held by {}", held.join(", ")));
            }
            if let Some(p) = &g.power_off {
                l.push_str(&format!("; {}", p.summary()));
            }
            lines.push(l);
        }
        if let Some(n) = &st.note {
            lines.push(format!("not fully in force: {n}"));
        }
        if !self.may_change() {
            lines.push(may_not_change(st));
        }
        if let Some(e) = &self.last_error {
            lines.push(e.clone());
        }
        lines.join("\n")
    }

    /// The `watch --waybar` line (waybar, i3blocks and polybar custom
    /// modules read `text`, `tooltip`, `class`, `alt`).
    pub fn waybar(&self) -> Value {
        let look = self.look();
        to_value(&Waybar {
            text: self.text(),
            // Waybar renders the tooltip as Pango markup.
            tooltip: crate::text::markup(&format!("{}\n{}", self.title(), self.tooltip())),
            class: [look.name(), self.mode().unwrap_or("down")],
            alt: look.name(),
        })
    }

    /// The `watch --json` line: the facts, for scripts.
    pub fn json(&self) -> Value {
        let Some(st) = &self.status else {
            return to_value(&WatchDown {
                daemon: "down",
                mode: None,
                state: "down",
                reason: self.down.as_deref(),
                gpus: [],
            });
        };
        let gpus: Vec<WatchGpu> = st
            .gpus
            .iter()
            .map(|g| WatchGpu {
                id: g.id,
                pci: g.pci.map(|p| p.to_string()),
                name: g.name.as_deref(),
                default: g.default,
                blocked: g.blocked,
                power_state: g.power_state.as_deref(),
                runtime_status: g.runtime_status.as_deref(),
                holders: self
                    .holders
                    .iter()
                    .filter(|h| h.gpu == g.id)
                    .map(|h| WatchHolder {
                        pid: h.pid,
                        comm: &h.comm,
                    })
                    .collect(),
            })
            .collect();
        to_value(&WatchUp {
            daemon: "running",
            mode: st.mode,
            state: self.look().name(),
            may_change: self.may_change(),
            auto: st.auto.as_ref(),
            gpus,
        })
    }

    /// The menu, top to bottom.
    pub fn menu(&self) -> Vec<Item> {
        let mut m = Vec::new();
        let Some(st) = &self.status else {
            m.push(Item::label(
                self.down
                    .clone()
                    .unwrap_or_else(|| "the gpuctl daemon is not running".into()),
            ));
            m.push(Item::Separator);
            m.push(Item::action("Quit", Action::Quit));
            return m;
        };
        let may = self.may_change();
        m.push(Item::label(self.title()));
        if !may {
            m.push(Item::label(may_not_change(st)));
        }
        if let Some(e) = &self.last_error {
            m.push(Item::label(e.clone()));
        }
        m.push(Item::Separator);
        let current = st.mode.as_str();
        for mode in ["hybrid", "integrated", "smart", "manual"] {
            let why = st.modes.why_not(mode);
            let mut label = capitalize(mode);
            if let Some(w) = why {
                label = format!("{label} (unavailable: {w})");
            }
            m.push(Item::Radio {
                label,
                on: mode == current,
                enabled: may && why.is_none() && mode != current,
                action: Action::SetMode(mode.into()),
            });
        }
        if current == "manual" {
            m.push(Item::Separator);
            for g in offload(st) {
                let id = u64::from(g.id);
                let blocked = g.blocked == Some(true);
                m.push(Item::Check {
                    label: format!(
                        "Block GPU {id} ({})",
                        g.name.as_deref().unwrap_or("offload GPU")
                    ),
                    on: blocked,
                    enabled: may,
                    action: if blocked {
                        Action::Unblock(id)
                    } else {
                        Action::Block(id)
                    },
                });
            }
        }
        m.push(Item::Separator);
        let denials: Vec<Item> = self
            .denials
            .iter()
            .map(|d| {
                let who = match d.pid {
                    Some(p) => format!("{} (pid {p})", d.comm),
                    None => d.comm.clone(),
                };
                let gpu = d.gpu.map(|g| format!(" → GPU {g}")).unwrap_or_default();
                match &d.exe {
                    Some(exe) => Item::Submenu {
                        label: format!("{who}{gpu}"),
                        items: vec![
                            Item::label(exe.clone()),
                            Item::Action {
                                label: "Allow this app".into(),
                                enabled: may,
                                action: Action::Allow(exe.clone()),
                            },
                        ],
                    },
                    None => Item::label(format!("{who}{gpu} (executable unknown)")),
                }
            })
            .collect();
        if denials.is_empty() {
            m.push(Item::label("No recent denials".into()));
        } else {
            m.push(Item::Submenu {
                label: "Recent denials".into(),
                items: denials,
            });
        }
        match st.auto.as_ref().map(|a| (a.enabled, a.active)) {
            Some((on, active)) => m.push(Item::Check {
                label: if on && !active {
                    "Automatic modes (no rule set: gpuctl config auto.on_battery …)".into()
                } else {
                    "Automatic modes".into()
                },
                on,
                enabled: may,
                action: Action::Auto(!on),
            }),
            None => m.push(Item::label(
                "Automatic modes: not offered by this daemon".into(),
            )),
        }
        m.push(Item::Separator);
        m.push(Item::action("Quit", Action::Quit));
        m
    }
}

fn may_not_change(st: &StatusData) -> String {
    let _ = st;
    "You may not change modes (needs root, the gpuctl group, or the active local session at the seat)".to_string()
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// One menu entry.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Label(String),
    Separator,
    Action {
        label: String,
        enabled: bool,
        action: Action,
    },
    Radio {
        label: String,
        on: bool,
        enabled: bool,
        action: Action,
    },
    Check {
        label: String,
        on: bool,
        enabled: bool,
        action: Action,
    },
    Submenu {
        label: String,
        items: Vec<Item>,
    },
}

impl Item {
    fn label(s: String) -> Item {
        Item::Label(s)
    }
    fn action(s: &str, a: Action) -> Item {
        Item::Action {
            label: s.into(),
            enabled: true,
            action: a,
        }
    }
}

/// A human line for one event (`gpuctl events` without --json, and the
/// notifications).
pub fn describe(e: &Event) -> Option<(String, String)> {
    let gpu = |g: u32| format!("GPU {g}");
    let who = |comm: &Option<String>, pid: Option<u64>| match (comm, pid) {
        (Some(c), Some(p)) => format!("{c} (pid {p})"),
        (Some(c), None) => c.to_string(),
        _ => "another user's process".to_string(),
    };
    match e {
        Event::Mode(v) => Some((
            format!("GPU mode: {}", v.mode),
            match v.reason.as_str() {
                "auto" => format!(
                    "changed automatically{}",
                    v.detail
                        .as_deref()
                        .map(|d| format!(": {d}"))
                        .unwrap_or_default()
                ),
                "restore" => "restored at start-up".into(),
                _ => "changed by a user".into(),
            },
        )),
        Event::Blocked(v) if v.reason == "display" => Some((
            format!("A monitor on a dGPU port: {} unblocked", gpu(v.gpu)),
            format!(
                "{} is connected to it; it stays usable while the display is",
                v.displays.join(", ")
            ),
        )),
        Event::Blocked(v) => Some((
            format!(
                "{} {}",
                gpu(v.gpu),
                if v.blocked { "blocked" } else { "unblocked" }
            ),
            String::new(),
        )),
        Event::Wake(v) => Some((
            format!(
                "The dGPU was woken by {}",
                who(&v.comm, v.pid.map(u64::from))
            ),
            v.file
                .as_deref()
                .or(v.what.as_deref())
                .map(|f| format!("{} woke through {f}", gpu(v.gpu)))
                .unwrap_or_else(|| gpu(v.gpu)),
        )),
        Event::Sleep(v) => Some((format!("{} asleep", gpu(v.gpu)), String::new())),
        Event::Power(v) => Some((
            format!(
                "{} power: {} ({})",
                gpu(v.gpu),
                v.power_state.as_deref().unwrap_or("?"),
                v.runtime_status
            ),
            String::new(),
        )),
        Event::PowerOff(v) => Some(match &v.power_off {
            Some(p) => (format!("{}: {}", gpu(v.gpu), p.summary()), String::new()),
            None => (
                format!("{}: drivers bound again (power-off undone)", gpu(v.gpu)),
                String::new(),
            ),
        }),
        Event::Grant(v) => Some((
            format!(
                "{} may use {}",
                who(&v.comm, v.pid.and_then(|p| u64::try_from(p).ok())),
                gpu_list(&v.gpus)
            ),
            format!("granted by {}", v.how),
        )),
        Event::Denied(v) => Some((
            if v.via.as_deref() == Some("logind") {
                format!("A compositor was kept off {} (through logind)", gpu(v.gpu))
            } else {
                format!(
                    "{} was kept off {}",
                    who(&v.comm, v.pid.map(u64::from)),
                    gpu(v.gpu)
                )
            },
            v.why.clone().unwrap_or_else(|| {
                format!(
                    "it opened {}",
                    v.node
                        .map_or_else(|| "a device node".into(), |n| n.to_string())
                )
            }),
        )),
        Event::Held(v) => Some((
            format!(
                "{} left awake for the display server {}",
                gpu(v.gpu),
                who(&v.comm, v.pid.map(u64::from))
            ),
            format!(
                "{} mode {} would block it, but that session would then offer a GPU its \
                 programs cannot open; it is blocked when the display server exits",
                if v.auto { "automation's" } else { "the" },
                v.mode
            ),
        )),
        Event::Unknown => None,
    }
}

fn gpu_list(ids: &[u32]) -> String {
    let ids: Vec<String> = ids.iter().map(|g| format!("GPU {g}")).collect();
    if ids.is_empty() {
        "the offload GPU".into()
    } else {
        ids.join(", ")
    }
}

/// The `watch --waybar` line.
#[derive(Serialize)]
struct Waybar<'a> {
    text: String,
    tooltip: String,
    class: [&'a str; 2],
    alt: &'a str,
}

/// The `watch --json` line while no daemon answers.
#[derive(Serialize)]
struct WatchDown<'a> {
    daemon: &'static str,
    mode: Option<Mode>,
    state: &'static str,
    reason: Option<&'a str>,
    gpus: [WatchGpu<'a>; 0],
}

/// The `watch --json` line.
#[derive(Serialize)]
struct WatchUp<'a> {
    daemon: &'static str,
    mode: Mode,
    state: &'static str,
    may_change: bool,
    auto: Option<&'a AutoData>,
    gpus: Vec<WatchGpu<'a>>,
}

#[derive(Serialize)]
struct WatchGpu<'a> {
    id: u32,
    pci: Option<String>,
    name: Option<&'a str>,
    default: bool,
    blocked: Option<bool>,
    power_state: Option<&'a str>,
    runtime_status: Option<&'a str>,
    holders: Vec<WatchHolder<'a>>,
}

#[derive(Serialize)]
struct WatchHolder<'a> {
    pid: u32,
    comm: &'a str,
}

fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(v: Value) -> Event {
        serde_json::from_value(v).unwrap()
    }

    fn status(mode: &str, blocked: bool, rs: &str) -> StatusData {
        serde_json::from_value(json!({"mode": mode, "may_change": true,
               "modes": {"hybrid": null, "integrated": null, "smart": null, "manual": null},
               "gpus": [
                 {"id": 0, "name": "UHD", "default": true, "blocked": false,
                  "power_state": "D0", "runtime_status": "active"},
                 {"id": 1, "name": "GA107M", "default": false, "blocked": blocked,
                  "power_state": if rs == "active" {"D0"} else {"D3cold"}, "runtime_status": rs}]}))
        .unwrap()
    }

    #[test]
    fn look_follows_mode_and_power() {
        let mut s = State::default();
        assert_eq!(s.look(), Look::Down);
        let t = SystemTime::now();
        s.set_status(status("hybrid", false, "suspended"), t);
        assert_eq!(s.look(), Look::Asleep);
        s.set_status(status("integrated", true, "suspended"), t);
        assert_eq!(s.look(), Look::Blocked);
        s.set_status(status("integrated", true, "active"), t);
        assert_eq!(s.look(), Look::Awake);
        assert_eq!(s.text(), "integrated · dGPU awake");
    }

    /// Issue 18, F4: a holder's name another user chose is markup-escaped
    /// in waybar's (Pango) tooltip; the JSON line keeps it exact.
    #[test]
    fn waybar_tooltip_escapes_markup_in_names() {
        let mut s = State::default();
        s.set_status(status("hybrid", false, "suspended"), SystemTime::now());
        s.holders = vec![serde_json::from_value(
            json!({"gpu": 1, "pid": 42, "comm": "<b>x</b>&\u{1b}", "path": "/dev/dri/card1", "node": "226:1", "uid": 1000}),
        )
        .unwrap()];
        let tip = s.waybar()["tooltip"].as_str().unwrap().to_string();
        assert!(
            tip.contains("held by &lt;b&gt;x&lt;/b&gt;&amp;\\x1b (42)"),
            "{tip}"
        );
        assert!(!tip.contains("<b>") && !tip.contains('\u{1b}'), "{tip}");
        assert!(s.json().to_string().contains("<b>x</b>&"));
    }

    #[test]
    fn tooltip_has_time_asleep_and_holders() {
        let mut s = State::default();
        let t = SystemTime::now();
        s.set_status(status("hybrid", false, "suspended"), t);
        s.holders = vec![serde_json::from_value(
            json!({"gpu": 1, "pid": 42, "comm": "steam", "path": "/dev/dri/card1", "node": "226:1", "uid": 1000}),
        )
        .unwrap()];
        let tip = s.tooltip();
        let want = format!(
            "GPU 1 GA107M: asleep (D3cold, since {}), usable; held by steam (42)",
            clock(t)
        );
        assert!(tip.contains(&want), "{tip}");
        // Still asleep later: the time stays; awake and asleep again: it restarts.
        let later = t + std::time::Duration::from_secs(3600);
        s.set_status(status("hybrid", false, "suspended"), later);
        assert!(s.tooltip().contains(&clock(t)));
        s.set_status(status("hybrid", false, "active"), later);
        assert!(s.tooltip().contains("GA107M: awake (D0), usable"));
        s.set_status(status("hybrid", false, "suspended"), later);
        assert!(s.tooltip().contains(&format!("since {}", clock(later))));
    }

    #[test]
    fn tooltip_and_events_say_what_the_power_off_did() {
        use crate::proto::data::{PowerOffInfo, PowerOffState};
        let mut s = State::default();
        let mut st = status("integrated", true, "suspended");
        let info = PowerOffInfo {
            state: PowerOffState::Off,
            since: 1_764_589_100,
            unbound: vec!["0000:01:00.0=nvidia".into()],
            power_state: Some("D3cold".into()),
            reason: None,
        };
        st.gpus[1].power_off = Some(info.clone());
        s.set_status(st, SystemTime::now());
        let tip = s.tooltip();
        assert!(
            tip.contains(
                "powered off by gpuctl: drivers unbound (0000:01:00.0=nvidia), rail off (D3cold)"
            ),
            "{tip}"
        );
        let e = Event::PowerOff(crate::proto::event::PowerOffEvent {
            gpu: 1,
            pci: None,
            power_off: Some(PowerOffInfo {
                state: PowerOffState::Refused,
                reason: Some("held open by Xorg (pid 9) on /dev/dri/card1".into()),
                ..info
            }),
        });
        let (what, _) = describe(&e).unwrap();
        assert!(
            what.contains("power-off refused: held open by Xorg (pid 9)"),
            "{what}"
        );
        let e = Event::PowerOff(crate::proto::event::PowerOffEvent {
            gpu: 1,
            pci: None,
            power_off: None,
        });
        assert!(describe(&e).unwrap().0.contains("drivers bound again"));
    }

    #[test]
    fn menu_disables_unavailable_modes_with_the_reason() {
        let mut s = State::default();
        let mut st = status("hybrid", false, "suspended");
        st.modes.integrated = Some("refused: GPU 1 drives a connected display".into());
        s.set_status(st, SystemTime::now());
        let m = s.menu();
        let integrated = m
            .iter()
            .find(|i| matches!(i, Item::Radio { action: Action::SetMode(x), .. } if x == "integrated"))
            .unwrap();
        assert!(
            matches!(integrated, Item::Radio { enabled: false, label, .. }
            if label.contains("unavailable: refused: GPU 1 drives a connected display"))
        );
        let smart = m
            .iter()
            .find(|i| matches!(i, Item::Radio { action: Action::SetMode(x), .. } if x == "smart"))
            .unwrap();
        assert!(matches!(smart, Item::Radio { enabled: true, .. }));
    }

    #[test]
    fn menu_for_a_user_who_may_not_change() {
        let mut s = State::default();
        let mut st = status("manual", true, "suspended");
        st.may_change = false;
        s.set_status(st, SystemTime::now());
        let m = s.menu();
        assert!(m.contains(&Item::Label(
            "You may not change modes (needs root, the gpuctl group, or the active local session at the seat)".into()
        )));
        assert!(m
            .iter()
            .all(|i| !matches!(i, Item::Radio { enabled: true, .. })));
        // Manual mode lists the per-GPU block, checked.
        assert!(m.iter().any(|i| matches!(
            i,
            Item::Check {
                on: true,
                action: Action::Unblock(1),
                ..
            }
        )));
    }

    #[test]
    fn denials_offer_allow_once_per_program() {
        let mut s = State::default();
        s.set_status(status("integrated", true, "suspended"), SystemTime::now());
        for pid in [10, 11, 12] {
            s.add_denial(Denial {
                pid: Some(pid),
                comm: "glxgears".into(),
                gpu: Some(1),
                exe: Some("/usr/bin/glxgears".into()),
            });
        }
        assert_eq!(s.denials.len(), 1);
        let m = s.menu();
        let sub = m
            .iter()
            .find_map(|i| match i {
                Item::Submenu { label, items } if label == "Recent denials" => Some(items),
                _ => None,
            })
            .unwrap();
        assert!(matches!(&sub[0], Item::Submenu { label, items }
            if label == "glxgears (pid 12) → GPU 1"
            && items[1] == Item::Action { label: "Allow this app".into(), enabled: true,
                                          action: Action::Allow("/usr/bin/glxgears".into()) }));
    }

    #[test]
    fn down_is_said() {
        let mut s = State::default();
        s.set_down("the gpuctl daemon is not running (nothing listens on /x)".into());
        assert_eq!(s.look(), Look::Down);
        assert_eq!(s.waybar()["class"][0], "down");
        assert!(matches!(&s.menu()[0], Item::Label(l) if l.contains("not running")));
    }

    #[test]
    fn describes_events() {
        let (t, b) = describe(&ev(
            json!({"event": "mode", "mode": "integrated", "reason": "auto",
                                      "detail": "on battery"}),
        ))
        .unwrap();
        assert_eq!(t, "GPU mode: integrated");
        assert_eq!(b, "changed automatically: on battery");
        let (t, _) = describe(&ev(
            json!({"event": "wake", "gpu": 1, "comm": "lspci", "pid": 9,
                                      "file": "/sys/bus/pci/devices/0000:01:00.0/config"}),
        ))
        .unwrap();
        assert_eq!(t, "The dGPU was woken by lspci (pid 9)");
        let (t, _) = describe(&ev(json!({"event": "blocked", "gpu": 1, "blocked": false,
                                      "reason": "display", "displays": ["HDMI-A-1"]})))
        .unwrap();
        assert_eq!(t, "A monitor on a dGPU port: GPU 1 unblocked");
        assert!(describe(&ev(json!({"event": "future-kind"}))).is_none());
    }
}
