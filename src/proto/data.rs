//! The payloads of the daemon's answers (`Response.data`), one type per
//! request, shared by the daemon (which builds them) and the CLI and tray
//! (which read them). The JSON is documented in `docs/PROTOCOL.md`; a test
//! (`tests/protocol_golden.rs`) ties each documented example to its type.
//!
//! Wire rules, the same for every type here:
//! - Field order is the order on the wire (`serde_json` keeps it).
//! - An `Option` field is always sent, as `null` when unknown, unless it is
//!   marked `skip_serializing_if` (absent, not `null`: named in its doc).
//! - Reading tolerates a newer or older daemon: unknown fields are ignored,
//!   and a missing field takes its default (`None`, empty, `false`, 0;
//!   `may_change` and `resume_watch`: `true`). Types that have no default
//!   (a PCI address, a device number, a backend) are `Option` for that
//!   reason alone: the daemon always sends them. Only `ListGpu` (the
//!   discovery record, as `run` reads it back) needs every field.

use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::redact::{each, note_for, public, withhold, Redact, Viewer, Withheld};
use crate::automation::{DisplayRule, Power, Target};
use crate::bpf::{Backend, GrantHow};
use crate::gpu::{DevNum, Gpu, PciAddr};
use crate::policy::Mode;
use crate::procs::Holder;

/// The `schema` number of `list`, `status` and `wakes`.
pub const SCHEMA: u32 = 1;

fn yes() -> bool {
    true
}

/// Reads a present field as `Some` (even `null` inside), so that absent and
/// `null` stay apart (`Option<Option<T>>`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `ping`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PingData {
    pub pid: u32,
    #[serde(default)]
    pub version: String,
}

/// `get`, and the answer to `set`, `block` and `unblock`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModeData {
    pub mode: Mode,
    #[serde(default)]
    pub force: bool,
    /// GPU ids blocked now.
    #[serde(default)]
    pub blocked: Vec<u32>,
    /// Why the mode is not fully in force, if it is not.
    pub note: Option<String>,
}

/// `list` (`gpuctl list --json`). Without a daemon the CLI prints the same
/// object with `mode` and `backend` `null` and no `runtime_pm`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ListData {
    #[serde(default)]
    pub schema: u32,
    pub mode: Option<Mode>,
    pub backend: Option<Backend>,
    #[serde(default)]
    pub gpus: Vec<ListGpu>,
}

/// One GPU of `list`: the discovery record (`gpu::Gpu`, serialized as it
/// is, every field in its order) and the daemon's `runtime_pm` after it.
/// `runtime_pm` is absent where no daemon answered, `null` for a GPU the
/// power monitor does not watch (a default GPU).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ListGpu {
    #[serde(flatten)]
    pub gpu: Gpu,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_pm: Option<Option<RuntimePm>>,
    /// What gpuctl's power-off did to the GPU, as in `status`; absent where
    /// no daemon answered, `null` when it did nothing.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub power_off: Option<Option<PowerOffInfo>>,
}

/// `status` (`gpuctl status --json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatusData {
    #[serde(default)]
    pub schema: u32,
    pub daemon: DaemonInfo,
    pub backend: Option<Backend>,
    /// What the backend cannot do, as a sentence.
    #[serde(default)]
    pub backend_limits: String,
    /// The cgroup the cgroup backend attached to (`null` for lsm).
    pub cgroup: Option<PathBuf>,
    #[serde(default)]
    pub smart_hooks: bool,
    /// Whether denied-open events are on (someone subscribed).
    #[serde(default)]
    pub events: bool,
    #[serde(default)]
    pub attached: bool,
    pub mode: Mode,
    #[serde(default)]
    pub force: bool,
    pub note: Option<String>,
    #[serde(default)]
    pub modes: Modes,
    /// Whether the caller may change modes (an older daemon: assumed yes).
    #[serde(default = "yes")]
    pub may_change: bool,
    /// `None` from a daemon without automation.
    pub auto: Option<AutoData>,
    /// Why the mode could not be saved, if it could not.
    pub state_not_saved: Option<String>,
    /// The live grants the caller may see (all to root and the group).
    #[serde(default)]
    pub grants: Vec<GrantView>,
    /// How many grants were left out of `grants` (another user's).
    #[serde(default)]
    pub grants_hidden: u64,
    #[serde(default)]
    pub grants_refused_map_full: u64,
    /// How many grants the caller may see that `grants` does not list (it
    /// lists the first [`GRANTS_LISTED`] by pid).
    #[serde(default)]
    pub grants_not_listed: u64,
    /// Each uid's share of the grant map (issue 18); `null` from an older
    /// daemon.
    #[serde(default)]
    pub grant_share: Option<GrantShareView>,
    #[serde(default)]
    pub env_grants: bool,
    #[serde(default)]
    pub blocked_nodes: Vec<DevNum>,
    #[serde(default)]
    pub gpus: Vec<StatusGpu>,
    pub power_monitor: Option<PowerMonitor>,
    /// GPUs the mode in force would block but leaves alone because a
    /// display server holds them (issue 18, F2).
    #[serde(default)]
    pub held_by_display_server: Vec<HeldGpu>,
}

/// A GPU left unblocked for the display server holding it (`status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HeldGpu {
    pub gpu: u32,
    /// Whether the mode in force is automation's (it skipped the GPU
    /// rather than refuse a request).
    #[serde(default)]
    pub auto: bool,
    /// Private: the display server's pid.
    pub pid: Option<u32>,
    /// Private: its command name.
    pub comm: Option<String>,
    /// Private: the owner of its `/proc` entry.
    pub uid: Option<u32>,
}

impl Redact for HeldGpu {
    const PUBLIC: &'static [&'static str] = &["gpu", "auto"];
    const PRIVATE: &'static [&'static str] = &["pid", "comm", "uid"];

    fn visible_to(&self, viewer: Viewer) -> bool {
        viewer.sees(self.uid)
    }

    fn redact(&mut self) {
        let HeldGpu {
            gpu: _,
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

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DaemonInfo {
    pub pid: u32,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub uptime_s: u64,
}

/// Which modes can be chosen now: `None` (`null`) for one that can, the
/// refusal's sentence for one that cannot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Modes {
    pub hybrid: Option<String>,
    pub integrated: Option<String>,
    pub smart: Option<String>,
    pub manual: Option<String>,
}

impl Modes {
    /// Why `mode` cannot be chosen (`None`: it can, or it is unknown).
    pub fn why_not(&self, mode: &str) -> Option<&str> {
        match mode {
            "hybrid" => self.hybrid.as_deref(),
            "integrated" => self.integrated.as_deref(),
            "smart" => self.smart.as_deref(),
            "manual" => self.manual.as_deref(),
            _ => None,
        }
    }

    pub fn set(&mut self, mode: Mode, why: Option<String>) {
        match mode {
            Mode::Hybrid => self.hybrid = why,
            Mode::Integrated => self.integrated = why,
            Mode::Smart => self.smart = why,
            Mode::Manual => self.manual = why,
        }
    }
}

/// One GPU of `status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatusGpu {
    pub id: u32,
    pub pci: Option<PciAddr>,
    pub name: Option<String>,
    #[serde(default)]
    pub default: bool,
    pub blocked: Option<bool>,
    pub power_state: Option<String>,
    pub runtime_status: Option<String>,
    #[serde(default)]
    pub denied_opens: u64,
    /// `null` for a GPU the power monitor does not watch.
    pub runtime_pm: Option<RuntimePm>,
    /// What gpuctl's power-off did to this GPU (issue 19); `null` when it
    /// did nothing (not blocked, it sleeps by itself, or `power_off =
    /// never`).
    pub power_off: Option<PowerOffInfo>,
}

/// Where a power-off stands (`power_off.state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PowerOffState {
    /// The slot's drivers are unbound; `power_state` says what the rail gave.
    Off,
    /// Not attempted: `reason` says why (a holder, a known NVIDIA hang).
    Refused,
    /// Attempted and stopped: `reason` says at which step.
    Failed,
    /// Under way: an unbind runs in a helper (at most 5 s); `reason` says
    /// which (`unbinding PCI from DRIVER`), `unbound` what is done.
    PoweringOff,
    /// A state this build does not know (a newer daemon's).
    #[serde(other)]
    Unknown,
}

/// The power-off of one GPU (`status --json`, `power_off`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerOffInfo {
    pub state: PowerOffState,
    /// Unix time (seconds) the state began.
    #[serde(default)]
    pub since: u64,
    /// Functions whose driver gpuctl unbound, `PCI=driver`, in unbind order.
    #[serde(default)]
    pub unbound: Vec<String>,
    /// The GPU's `power_state` as last read after the power-off (`D3cold`,
    /// `D3hot`, `D0`); `null` before the first read.
    #[serde(default)]
    pub power_state: Option<String>,
    /// Why it was refused or failed; `null` when it is off.
    #[serde(default)]
    pub reason: Option<String>,
}

/// A GPU's power truth: residency, wakes, who woke it (`status`, `list`,
/// `wakes`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RuntimePm {
    /// Unix time the residency below counts from.
    #[serde(default)]
    pub since: f64,
    pub since_start: Option<Residency>,
    pub since_boot: Option<Residency>,
    #[serde(default)]
    pub counters_reset: bool,
    /// The kernel's count of resumes; `null` without the programs.
    pub wakes: Option<u64>,
    /// Unix time the GPU last woke, while it is awake.
    pub awake_since: Option<f64>,
    pub last_wake: Option<Wake>,
    #[serde(default)]
    pub top_wakers: Vec<TopWaker>,
    #[serde(default)]
    pub watched: Vec<Watched>,
}

/// Time asleep and awake over a span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Residency {
    /// `null` when no time has passed (nothing to divide by).
    pub asleep_pct: Option<f64>,
    #[serde(default)]
    pub asleep_s: f64,
    #[serde(default)]
    pub awake_s: f64,
}

/// What a watched device is to its GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The GPU's own PCI function.
    #[default]
    Gpu,
    /// Another function of its slot (HDMI audio `.1`, USB-C `.2`, …).
    Sibling,
    /// The PCI bridge (root port) above it.
    Bridge,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Gpu => "gpu",
            Role::Sibling => "sibling",
            Role::Bridge => "bridge",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Watched {
    pub device: String,
    pub role: Role,
}

/// One wake of a watched device (`wakes`, `last_wake`, the `wake` event).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Wake {
    pub gpu: u32,
    /// The GPU's PCI address.
    #[serde(default)]
    pub pci: String,
    /// The device that woke: the GPU function, a sibling or the bridge.
    #[serde(default)]
    pub device: String,
    pub role: Role,
    /// Unix time, seconds (always sent; an older line may lack it).
    pub ts: Option<f64>,
    /// Private: the waking task's pid (`null` to another user).
    pub pid: Option<u32>,
    /// Private: its process.
    pub tgid: Option<u32>,
    /// Private: its command name.
    pub comm: Option<String>,
    /// Private: its uid (`null` for a kernel thread).
    pub uid: Option<u32>,
    /// Private: `read /sys/bus/pci/devices/0000:01:00.0/config`.
    pub what: Option<String>,
    /// The operation alone: `open`, `read`, `write`, `ioctl`, `mmap`.
    pub op: Option<String>,
    /// Private: the file alone.
    pub file: Option<String>,
    /// A kernel thread resumed it (a kworker, for a driver).
    #[serde(default)]
    pub kworker: bool,
    /// An asynchronous resume request.
    #[serde(default)]
    pub r#async: bool,
    /// How long the GPU stayed awake (the latest time, for a merged row);
    /// `null` while it is awake (or for a sibling or bridge).
    pub awake_ms: Option<u64>,
    /// How many wakes this row stands for: repeated wakes of one device by
    /// one command, uid and operation are merged into one history row
    /// (1 in a `wake` event).
    #[serde(default = "one")]
    pub count: u64,
    /// Unix time of the latest of them (`ts` is the first's).
    pub last_ts: Option<f64>,
    /// The kernel's CLOCK_MONOTONIC stamp (daemon only, not on the wire).
    #[serde(skip)]
    pub mono_ns: u64,
    /// The first row of its uid in the history, kept whatever others do
    /// (daemon only, not on the wire).
    #[serde(skip)]
    pub first_of_uid: bool,
}

fn one() -> u64 {
    1
}

/// One of a GPU's most frequent wakers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopWaker {
    /// Private.
    pub comm: Option<String>,
    /// Private.
    pub uid: Option<u32>,
    #[serde(default)]
    pub wakes: u64,
}

/// The power monitor's programs (`status`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PowerMonitor {
    #[serde(default)]
    pub running: bool,
    /// Why the programs are not loaded, if they are not.
    pub error: Option<String>,
    #[serde(default)]
    pub programs: Vec<ProgramStats>,
}

/// Run count and time of one BPF program (non-zero only while
/// `kernel.bpf_stats_enabled` is 1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProgramStats {
    pub name: String,
    #[serde(default)]
    pub prog_id: u64,
    #[serde(default)]
    pub run_cnt: u64,
    #[serde(default)]
    pub run_time_ns: u64,
}

/// The automation part of `status`, and the answer to `auto`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AutoData {
    /// Enabled and at least one rule set.
    #[serde(default)]
    pub active: bool,
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub rules: AutoRules,
    /// `ac`, `battery`, or `null` when unknown.
    pub power: Option<Power>,
    /// Unix time of the last automatic change.
    pub since: Option<u64>,
    #[serde(default)]
    pub manual_override: bool,
    #[serde(default)]
    pub pending: bool,
    pub mode: Mode,
    /// Why the mode is in force, as a sentence.
    pub why: Option<String>,
    /// Whether a resume re-evaluates the rules (an older daemon: yes).
    #[serde(default = "yes")]
    pub resume_watch: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AutoRules {
    #[serde(default)]
    pub on_battery: Target,
    #[serde(default)]
    pub on_ac: Target,
    #[serde(default)]
    pub external_display: DisplayRule,
}

/// One live grant as `status` shows it. The whole record is another
/// user's secret: a plain user sees only their own ([`Withheld`]), and the
/// others are counted in `grants_hidden`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GrantView {
    pub pid: u32,
    /// The command name as of the process's last exec or fork (kept in its
    /// grant; a later rename is not seen); `null` when none was recorded.
    pub comm: Option<String>,
    /// `null` when the process is gone.
    pub uid: Option<u32>,
    pub how: Option<GrantHow>,
    #[serde(default)]
    pub only: bool,
    pub gpus: GrantGpus,
}

/// Most grants `status` lists (the rest is counted in `grants_not_listed`):
/// a full map of 8192 would make every tray's `status` a megabyte.
pub const GRANTS_LISTED: usize = 64;

/// The grant map's per-uid limits and the kernel's counts (`status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GrantShareView {
    /// Grants from the fork/exec hooks one plain uid may hold.
    pub share: u32,
    /// Once the hooks' grants fill this many entries ...
    pub reserve_at: u32,
    /// ... only a uid holding fewer than this many gets one more.
    pub small: u32,
    /// The hooks' grants in the map now (every uid's).
    pub kernel_grants: u64,
    /// Grants the hooks refused because a uid held its share.
    pub refused: u64,
    /// Per plain uid (a plain user sees their own row only).
    pub uids: Vec<UidGrants>,
}

/// One uid's count in [`GrantShareView`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UidGrants {
    pub uid: u32,
    /// Grants from the hooks it holds now (inherited, `DRI_PRIME`, apps).
    pub inherited: u64,
    /// Grants refused to it because it held its share.
    pub refused: u64,
}

/// The GPUs of a grant: `"all"`, or the ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrantGpus {
    All,
    Ids(Vec<u32>),
}

impl Default for GrantGpus {
    fn default() -> Self {
        GrantGpus::Ids(Vec::new())
    }
}

impl Serialize for GrantGpus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            GrantGpus::All => s.serialize_str("all"),
            GrantGpus::Ids(ids) => ids.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for GrantGpus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            Ids(Vec<u32>),
        }
        match Raw::deserialize(d)? {
            Raw::Ids(ids) => Ok(GrantGpus::Ids(ids)),
            Raw::Word(w) if w == "all" => Ok(GrantGpus::All),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "grant gpus: expected \"all\" or a list, got {w:?}"
            ))),
        }
    }
}

impl std::fmt::Display for GrantGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrantGpus::All => f.write_str("all"),
            GrantGpus::Ids(ids) => {
                let s: Vec<String> = ids.iter().map(u32::to_string).collect();
                f.write_str(&s.join(","))
            }
        }
    }
}

/// `who`: the processes holding GPU nodes open. From the daemon, only the
/// caller's own to a plain user ([`Withheld`]), with the others counted in
/// `hidden`; without a daemon (the CLI's own scan) `hidden` is absent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WhoData {
    #[serde(default)]
    pub holders: Vec<Holder>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<u64>,
    /// How old the scan is, in milliseconds since it ended (one scan serves
    /// every client for a while; issue 18). Absent without a daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<u64>,
}

/// `grant` (`gpuctl run`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GrantData {
    /// Whether a grant was made (hybrid and manual need none).
    #[serde(default)]
    pub granted: bool,
    pub mode: Mode,
    /// The GPU granted (the discovery record).
    pub gpu: Option<Gpu>,
    /// The environment to exec with (an older daemon: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<EnvVars>,
}

/// Environment variables in order (a JSON object of strings).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvVars(pub Vec<(String, String)>);

impl Serialize for EnvVars {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for EnvVars {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = Map::<String, Value>::deserialize(d)?;
        Ok(EnvVars(
            m.into_iter()
                .filter_map(|(k, v)| Some((k, v.as_str()?.to_string())))
                .collect(),
        ))
    }
}

/// `config`: the whole config, one key, or one key just set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ConfigData {
    /// `gpuctl config`: the file and every `key → value` (tables
    /// flattened to `table.key`; values are the config's own types).
    All {
        path: PathBuf,
        config: Map<String, Value>,
    },
    /// `gpuctl config KEY`.
    One(ConfigOne),
    /// `gpuctl config KEY VALUE`: the value now in force, and a note when
    /// it takes a restart.
    Set {
        key: String,
        value: Value,
        note: Option<String>,
    },
}

/// `gpuctl config KEY` (exactly these fields: a `note` makes it a `Set`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigOne {
    pub key: String,
    pub value: Value,
}

impl ConfigData {
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigData::All { .. } => None,
            ConfigData::One(ConfigOne { key, .. }) | ConfigData::Set { key, .. } => Some(key),
        }
    }
    pub fn value(&self) -> Option<&Value> {
        match self {
            ConfigData::All { .. } => None,
            ConfigData::One(ConfigOne { value, .. }) | ConfigData::Set { value, .. } => Some(value),
        }
    }
    pub fn note(&self) -> Option<&str> {
        match self {
            ConfigData::Set { note, .. } => note.as_deref(),
            _ => None,
        }
    }
}

/// `app list`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppsData {
    pub apps: Vec<AppEntry>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppEntry {
    pub path: String,
    #[serde(default)]
    pub allow: bool,
    /// The GPU it may use (`null`: every offload GPU).
    pub gpu: Option<PciAddr>,
    /// Why the rule is not in force, if it is not.
    pub error: Option<String>,
}

/// `app allow|deny|forget`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppChanged {
    /// The path as the daemon resolved it.
    pub path: String,
    pub note: Option<String>,
}

/// `wakes` (`gpuctl wakes --json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WakesData {
    #[serde(default)]
    pub schema: u32,
    /// Whether the runtime-PM programs run (who woke it is known).
    #[serde(default)]
    pub attributed: bool,
    pub error: Option<String>,
    #[serde(default)]
    pub history_max: u64,
    #[serde(default)]
    pub gpus: Vec<WakesGpu>,
    /// Oldest first.
    #[serde(default)]
    pub wakes: Vec<Wake>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WakesGpu {
    pub id: u32,
    pub pci: Option<PciAddr>,
    pub name: Option<String>,
    pub power_state: Option<String>,
    pub runtime_status: Option<String>,
    pub runtime_pm: Option<RuntimePm>,
}

/// `events`: the first line, before the stream of [`super::event::Event`]s.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Subscribed {
    pub subscribed: bool,
}

// ---- privacy (see `redact.rs`) ------------------------------------------

impl Redact for Wake {
    const PUBLIC: &'static [&'static str] = &[
        "gpu", "pci", "device", "role", "ts", "op", "kworker", "async", "awake_ms", "count",
        "last_ts",
    ];
    const PRIVATE: &'static [&'static str] = &["pid", "tgid", "comm", "uid", "what", "file"];

    fn visible_to(&self, viewer: Viewer) -> bool {
        // Kernel threads are nobody's secret.
        self.kworker || viewer.sees(self.uid)
    }

    fn redact(&mut self) {
        let Wake {
            gpu: _,
            pci: _,
            device: _,
            role: _,
            ts: _,
            pid,
            tgid,
            comm,
            uid,
            what,
            op: _,
            file,
            kworker: _,
            r#async: _,
            awake_ms: _,
            count: _,
            last_ts: _,
            mono_ns: _,
            first_of_uid: _,
        } = self;
        *pid = None;
        *tgid = None;
        *comm = None;
        *uid = None;
        *what = None;
        *file = None;
    }
}

impl Redact for TopWaker {
    const PUBLIC: &'static [&'static str] = &["wakes"];
    const PRIVATE: &'static [&'static str] = &["comm", "uid"];

    fn visible_to(&self, viewer: Viewer) -> bool {
        viewer.sees(self.uid)
    }

    fn redact(&mut self) {
        let TopWaker {
            comm,
            uid,
            wakes: _,
        } = self;
        *comm = None;
        *uid = None;
    }
}

public!(
    RuntimePm,
    [
        "since",
        "since_start",
        "since_boot",
        "counters_reset",
        "wakes",
        "awake_since",
        "last_wake",
        "top_wakers",
        "watched",
    ],
    |p, v| {
        p.last_wake = p.last_wake.map(|w| w.for_viewer(v));
        p.top_wakers = each(p.top_wakers, v);
        p
    }
);
public!(PingData, ["pid", "version"]);
public!(ModeData, ["mode", "force", "blocked", "note"], |m, v| {
    m.note = note_for(m.note, v);
    m
});
public!(ListData, ["schema", "mode", "backend", "gpus"], |l, v| {
    l.gpus = each(l.gpus, v);
    l
});
public!(
    ListGpu,
    [
        "id",
        "pci",
        "vendor_id",
        "device_id",
        "vendor",
        "name",
        "driver",
        "default",
        "offload",
        "discrete",
        "boot_vga",
        "card",
        "render",
        "nodes",
        "nvidia_minor",
        "power_state",
        "runtime_status",
        "displays",
        "sleep",
        "functions",
        "blocked",
        "runtime_pm",
        "power_off",
    ],
    |g, v| {
        g.runtime_pm = g.runtime_pm.map(|p| p.map(|p| p.for_viewer(v)));
        g.power_off = g.power_off.map(|p| p.map(|p| p.for_viewer(v)));
        g
    }
);
public!(
    StatusData,
    [
        "schema",
        "daemon",
        "backend",
        "backend_limits",
        "cgroup",
        "smart_hooks",
        "events",
        "attached",
        "mode",
        "force",
        "note",
        "modes",
        "may_change",
        "auto",
        "state_not_saved",
        "grants",
        "grants_hidden",
        "grants_refused_map_full",
        "grants_not_listed",
        "grant_share",
        "env_grants",
        "blocked_nodes",
        "gpus",
        "power_monitor",
        "held_by_display_server",
    ],
    |s, v| {
        s.note = note_for(s.note, v);
        s.held_by_display_server = each(s.held_by_display_server, v);
        let (grants, hidden) = withhold(s.grants, v);
        s.grants = grants;
        s.grants_hidden += hidden;
        s.grant_share = s.grant_share.map(|g| g.for_viewer(v));
        s.gpus = each(s.gpus, v);
        s
    }
);
public!(DaemonInfo, ["pid", "version", "uptime_s"]);
public!(Modes, ["hybrid", "integrated", "smart", "manual"]);
public!(
    StatusGpu,
    [
        "id",
        "pci",
        "name",
        "default",
        "blocked",
        "power_state",
        "runtime_status",
        "denied_opens",
        "runtime_pm",
        "power_off",
    ],
    |g, v| {
        g.runtime_pm = g.runtime_pm.map(|p| p.for_viewer(v));
        g.power_off = g.power_off.map(|p| p.for_viewer(v));
        g
    }
);

impl PowerOffInfo {
    /// One line for people: `off: rail off (D3cold) …`, `refused: held open by …`.
    pub fn summary(&self) -> String {
        let i = self;
        match i.state {
            PowerOffState::Off => {
                let rail = match i.power_state.as_deref() {
                    Some("D3cold") => "rail off (D3cold)".to_string(),
                    Some("D3hot") => "D3hot only (the slot's power was not cut)".to_string(),
                    Some(p) => format!("still {p}"),
                    None => "power state not read yet".to_string(),
                };
                format!(
                    "powered off by gpuctl: drivers unbound ({}), {rail}",
                    i.unbound.join(", ")
                )
            }
            PowerOffState::Refused => format!(
                "power-off refused: {}",
                i.reason.as_deref().unwrap_or("(reason withheld)")
            ),
            PowerOffState::Failed => format!(
                "power-off failed: {}",
                i.reason.as_deref().unwrap_or("(reason withheld)")
            ),
            PowerOffState::PoweringOff => format!(
                "powering off: {}…",
                i.reason.as_deref().unwrap_or("unbinding the drivers")
            ),
            PowerOffState::Unknown => "in a state this gpuctl does not know".to_string(),
        }
    }
}

/// The refusal's reason can name other users' processes (the holders):
/// root and the group see it, everyone else sees `null`.
impl Redact for PowerOffInfo {
    const PUBLIC: &'static [&'static str] = &["state", "since", "unbound", "power_state"];
    const PRIVATE: &'static [&'static str] = &["reason"];
    fn visible_to(&self, viewer: Viewer) -> bool {
        viewer.sees(None)
    }
    fn redact(&mut self) {
        self.reason = None;
    }
}
public!(Residency, ["asleep_pct", "asleep_s", "awake_s"]);
public!(Watched, ["device", "role"]);
public!(PowerMonitor, ["running", "error", "programs"]);
public!(ProgramStats, ["name", "prog_id", "run_cnt", "run_time_ns"]);
public!(
    AutoData,
    [
        "active",
        "enabled",
        "rules",
        "power",
        "since",
        "manual_override",
        "pending",
        "mode",
        "why",
        "resume_watch",
    ]
);
public!(AutoRules, ["on_battery", "on_ac", "external_display"]);
public!(WhoData, ["holders", "hidden", "age_ms"], |w, v| {
    let (holders, hidden) = withhold(w.holders, v);
    w.holders = holders;
    w.hidden = w.hidden.map(|h| h + hidden);
    w
});
public!(GrantData, ["granted", "mode", "gpu", "env"]);
public!(AppsData, ["apps"]);
public!(AppEntry, ["path", "allow", "gpu", "error"]);
public!(AppChanged, ["path", "note"]);
public!(
    WakesData,
    [
        "schema",
        "attributed",
        "error",
        "history_max",
        "gpus",
        "wakes"
    ],
    |w, v| {
        w.gpus = each(w.gpus, v);
        w.wakes = each(w.wakes, v);
        w
    }
);
public!(
    WakesGpu,
    [
        "id",
        "pci",
        "name",
        "power_state",
        "runtime_status",
        "runtime_pm"
    ],
    |g, v| {
        g.runtime_pm = g.runtime_pm.map(|p| p.for_viewer(v));
        g
    }
);
public!(Subscribed, ["subscribed"]);
public!(
    GrantShareView,
    [
        "share",
        "reserve_at",
        "small",
        "kernel_grants",
        "refused",
        "uids"
    ],
    |g, v| {
        g.uids = withhold(g.uids, v).0;
        g
    }
);

impl Withheld for UidGrants {
    fn owner(&self) -> Option<u32> {
        Some(self.uid)
    }
}

impl Withheld for GrantView {
    fn owner(&self) -> Option<u32> {
        self.uid
    }
}

impl Withheld for Holder {
    fn owner(&self) -> Option<u32> {
        Some(self.uid)
    }
}

#[cfg(test)]
/// Every documented payload type, by the name `docs/PROTOCOL.md` gives
/// its examples: parses `json` as that type and writes it back (the
/// golden test compares the two).
pub fn round_trip(name: &str, json: &Value) -> Result<Value, String> {
    fn rt<T: Serialize + for<'de> Deserialize<'de>>(v: &Value) -> Result<Value, String> {
        let t: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
        serde_json::to_value(&t).map_err(|e| e.to_string())
    }
    match name {
        "ping" => rt::<PingData>(json),
        "mode" => rt::<ModeData>(json),
        "list" => rt::<ListData>(json),
        "status" => rt::<StatusData>(json),
        "who" => rt::<WhoData>(json),
        "grant" => rt::<GrantData>(json),
        "config" => rt::<ConfigData>(json),
        "apps" => rt::<AppsData>(json),
        "app" => rt::<AppChanged>(json),
        "auto" => rt::<AutoData>(json),
        "wakes" => rt::<WakesData>(json),
        "events" => rt::<Subscribed>(json),
        "event" => rt::<super::event::Event>(json),
        "response" => rt::<super::Response>(json),
        "request" => rt::<super::Request>(json),
        other => Err(format!("no payload type is documented as {other:?}")),
    }
}
