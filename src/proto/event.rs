//! The events a subscribed connection (`{"type": "events"}`) receives,
//! one JSON object per line, each tagged by its `event` field first.
//! Documented with examples in `docs/PROTOCOL.md`.

use serde::{Deserialize, Serialize};

use super::data::{PowerOffInfo, Wake};
use super::redact::{public, Redact, Viewer};
use crate::gpu::{DevNum, PciAddr};
use crate::policy::Mode;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The kernel refused an open of a blocked GPU's node.
    Denied(Denied),
    /// The mode changed (automation, or a user's set/block/unblock).
    Mode(ModeEvent),
    /// A GPU's blocked state changed.
    Blocked(Blocked),
    /// `gpuctl run` granted a process.
    Grant(GrantEvent),
    /// A watched device resumed.
    Wake(Wake),
    /// An offload GPU suspended.
    Sleep(SleepEvent),
    /// An offload GPU's runtime-PM status settled.
    Power(PowerEvent),
    /// What gpuctl's power-off did to a blocked GPU changed (issue 19).
    #[serde(rename = "power_off")]
    PowerOff(PowerOffEvent),
    /// The mode in force would block a GPU, but it was left alone because
    /// a display server holds its card (issue 18).
    Held(HeldEvent),
    /// An event this build does not know (a newer daemon's).
    #[serde(other)]
    Unknown,
}

impl Event {
    /// The event as `viewer` may see it.
    pub fn for_viewer(self, viewer: Viewer) -> Event {
        match self {
            Event::Denied(e) => Event::Denied(e.for_viewer(viewer)),
            Event::Mode(e) => Event::Mode(e.for_viewer(viewer)),
            Event::Blocked(e) => Event::Blocked(e.for_viewer(viewer)),
            Event::Grant(e) => Event::Grant(e.for_viewer(viewer)),
            Event::Wake(e) => Event::Wake(e.for_viewer(viewer)),
            Event::Sleep(e) => Event::Sleep(e.for_viewer(viewer)),
            Event::Power(e) => Event::Power(e.for_viewer(viewer)),
            Event::PowerOff(e) => Event::PowerOff(e.for_viewer(viewer)),
            Event::Held(e) => Event::Held(e.for_viewer(viewer)),
            Event::Unknown => Event::Unknown,
        }
    }

    /// The line's JSON (`null` if it could not be encoded, which plain
    /// data cannot).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// `{"event": "denied", …}`: another user's pid, command and uid are
/// `null` to a plain user.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Denied {
    pub pid: Option<u32>,
    pub comm: Option<String>,
    pub uid: Option<u32>,
    pub gpu: u32,
    /// `226:1`; `0:0` for a sysfs file (the lsm backend).
    pub node: Option<DevNum>,
    /// Why gpuctl refused it, a sentence naming no process (absent from
    /// daemons before issue 22).
    pub why: Option<String>,
    /// `logind` when systemd-logind opened the node for a compositor
    /// (`TakeDevice`): `comm` is then logind's, not the compositor's.
    pub via: Option<String>,
}

/// `{"event": "mode", …}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModeEvent {
    pub mode: Mode,
    /// `auto` or `manual`.
    pub reason: String,
    /// A sentence: why, or what did it.
    pub detail: Option<String>,
    /// What made automation look again (`reason` `auto` only; absent
    /// otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
}

/// `{"event": "blocked", …}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Blocked {
    pub gpu: u32,
    pub pci: Option<PciAddr>,
    pub blocked: bool,
    /// `display` (unblocked for a display connected to it) or `mode`.
    pub reason: String,
    /// Its connected connectors.
    #[serde(default)]
    pub displays: Vec<String>,
}

/// `{"event": "grant", …}`: pid, command and uid are `null` to a plain
/// user other than the grantee.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GrantEvent {
    pub pid: Option<i32>,
    pub comm: Option<String>,
    pub uid: Option<u32>,
    #[serde(default)]
    pub gpus: Vec<u32>,
    /// `run` or `run --only`.
    pub how: String,
}

/// `{"event": "held", …}`: a GPU the mode in force would block was left
/// alone because a display server holds its card (blocking it would leave
/// that session offering a GPU its programs cannot open). Sent once when
/// the skip begins, not at each re-plan; the GPU is blocked when the
/// holder exits (a `blocked` event). The holder's pid, command and uid are
/// `null` to a plain user other than its owner (as in `status`'s
/// `held_by_display_server`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HeldEvent {
    pub gpu: u32,
    pub pci: Option<PciAddr>,
    /// The mode in force.
    pub mode: Mode,
    /// Whether that mode is automation's (it skips such a GPU where a
    /// user's request would be refused).
    pub auto: bool,
    pub pid: Option<u32>,
    pub comm: Option<String>,
    pub uid: Option<u32>,
}

impl Redact for HeldEvent {
    const PUBLIC: &'static [&'static str] = &["gpu", "pci", "mode", "auto"];
    const PRIVATE: &'static [&'static str] = &["pid", "comm", "uid"];

    fn visible_to(&self, viewer: Viewer) -> bool {
        viewer.sees(self.uid)
    }

    fn redact(&mut self) {
        let HeldEvent {
            gpu: _,
            pci: _,
            mode: _,
            auto: _,
            pid,
            comm,
            uid,
        } = self;
        *pid = None;
        *comm = None;
        *uid = None;
    }
}

/// `{"event": "sleep", …}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SleepEvent {
    pub gpu: u32,
    pub pci: String,
    /// Unix time, seconds (always sent; an older line may lack it).
    pub ts: Option<f64>,
    /// How long it was awake (`null`: its wake was not seen).
    pub awake_ms: Option<u64>,
    pub power_state: Option<String>,
}

/// `{"event": "power", …}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PowerEvent {
    pub gpu: u32,
    pub pci: String,
    pub power_state: Option<String>,
    /// The status the kernel settled in: `active` or `suspended`.
    pub runtime_status: String,
}

impl Redact for Denied {
    const PUBLIC: &'static [&'static str] = &["gpu", "node", "why", "via"];
    const PRIVATE: &'static [&'static str] = &["pid", "comm", "uid"];

    fn visible_to(&self, viewer: Viewer) -> bool {
        viewer.sees(self.uid)
    }

    fn redact(&mut self) {
        let Denied {
            pid,
            comm,
            uid,
            gpu: _,
            node: _,
            why: _,
            via: _,
        } = self;
        *pid = None;
        *comm = None;
        *uid = None;
    }
}

impl Redact for GrantEvent {
    const PUBLIC: &'static [&'static str] = &["gpus", "how"];
    const PRIVATE: &'static [&'static str] = &["pid", "comm", "uid"];

    fn visible_to(&self, viewer: Viewer) -> bool {
        viewer.sees(self.uid)
    }

    fn redact(&mut self) {
        let GrantEvent {
            pid,
            comm,
            uid,
            gpus: _,
            how: _,
        } = self;
        *pid = None;
        *comm = None;
        *uid = None;
    }
}

// Events with nothing private: every field is public, and a new field
// still has to be added to the list (the tests check the key set).
public!(ModeEvent, ["mode", "reason", "detail", "trigger"]);
public!(Blocked, ["gpu", "pci", "blocked", "reason", "displays"]);
public!(SleepEvent, ["gpu", "pci", "ts", "awake_ms", "power_state"]);
public!(PowerEvent, ["gpu", "pci", "power_state", "runtime_status"]);
public!(PowerOffEvent, ["gpu", "pci", "power_off"], |e, v| {
    e.power_off = e.power_off.map(|p| p.for_viewer(v));
    e
});

/// `{"event": "power_off", …}`: a GPU's `power_off` (as in `status`) is
/// now this; `null` when the power-off was undone (the drivers are bound
/// again) or is no longer attempted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PowerOffEvent {
    pub gpu: u32,
    pub pci: Option<PciAddr>,
    pub power_off: Option<PowerOffInfo>,
}
