//! `gpuctl daemon`: one thread, one blocking `poll` loop over the socket,
//! its clients, a signal pipe and the kernel's event fds. Every decision
//! comes from `policy::plan`. The rooms, and who owns what:
//!
//! - [`core`]: the choice, the plan in force, the inventory, the enforcer
//!   and the config — the only writer of the choice and the plan;
//! - components that own their state and say what they want done: [`apps`]
//!   (app rules' kernel side, inotify), [`grants`] (`gpuctl run`), [`auto`]
//!   (automatic modes), [`power`] (runtime PM), [`push`] (`events`);
//! - [`sources`]: the poll set and one turn of the loop;
//! - [`handlers`]: one request → authorization, a handler, the audit line;
//! - [`wiring`]: start-up, and what one room's news means for the others
//!   (a hardware change re-plans, re-syncs power and asks automation);
//! - the edges: [`server`] (clients), [`auth`], [`uevent`], [`lifetime`]
//!   (signals, lock, watchdog), [`notify`] (sd_notify), [`backend`],
//!   [`state`] and [`config`] (files), [`holders`], [`reject`], [`log`].

mod apps;
mod auth;
mod auto;
mod backend;
pub mod config;
mod core;
mod grants;
mod handlers;
mod holders;
mod lifetime;
mod log;
mod notify;
mod power;
pub mod poweroff;
mod push;
mod reject;
pub mod rescue;
mod seat;
mod server;
mod sources;
pub mod state;
mod uevent;
mod wiring;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};

use crate::gpu::Roots;
use log::log;

/// Marks a start-up failure that a restart cannot fix (this kernel cannot
/// load or attach the BPF programs): the daemon exits with `EX_CONFIG` (78),
/// which the systemd unit does not restart, instead of crash-looping.
#[derive(Debug)]
pub struct Unsupported;

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("gpuctl cannot enforce on this kernel (run `gpuctl doctor`)")
    }
}

/// How the daemon was asked to run (`gpuctl daemon …`).
pub struct Options {
    pub roots: Roots,
    pub socket: PathBuf,
    /// Where logind's state files are (`/run`): who is at the seat.
    pub run_root: PathBuf,
    pub state_dir: PathBuf,
    pub config: PathBuf,
    pub backend: BackendChoice,
    pub cgroup: Option<PathBuf>,
    pub verbose: bool,
    /// System programs with a role in the kernel's decision, each with the
    /// paths it may be installed at (the first that exists is used).
    pub services: Vec<(crate::bpf::Service, Vec<PathBuf>)>,
}

/// Where systemd-udevd is installed (merged /usr first; `:`-separated).
pub const UDEVD_PATHS: &str = "/usr/lib/systemd/systemd-udevd:/lib/systemd/systemd-udevd";
/// Where systemd-logind is installed (merged /usr first; `:`-separated).
pub const LOGIND_PATHS: &str = "/usr/lib/systemd/systemd-logind:/lib/systemd/systemd-logind";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Auto,
    Lsm,
    Cgroup,
}

/// The daemon: its rooms. Dropping it detaches every program (fail-open).
struct Daemon {
    /// The choice, the plan, the inventory, the enforcer, the config.
    core: core::Core,
    /// The app rules' kernel identities and the inotify watches.
    apps: apps::Apps,
    /// `gpuctl run` grants: sweeps, the per-uid cap, restart.
    grants: grants::Grants,
    /// Automatic modes (power source, external displays).
    auto: auto::Auto,
    /// Runtime-PM transitions, wake attribution and residency.
    power: power::Power,
    /// Blocked GPUs that cannot sleep: their slots' drivers unbound.
    poweroff: poweroff::PowerOff,
    /// What subscribers were last told.
    push: push::Push,
    /// Hot-plug and late-driver events; `None` where netlink is refused.
    uevents: Option<uevent::Uevents>,
    /// One re-plan per burst of GPU uevents.
    burst: uevent::Coalesce,
    /// The config file (`gpuctl config` edits it; SIGHUP re-reads it).
    config_path: PathBuf,
    /// `/run` (logind's state files: the seat's user may change).
    run_root: PathBuf,
    /// The seats' active login sessions, kept in the kernel for logind.
    seats: seat::ActiveSessions,
    started: Instant,
    /// When the inventory was last re-read for a read request.
    refreshed: Option<Instant>,
    /// The `who` scans (the last result, when it ended, who asked).
    who_scans: holders::Scans,
    /// The single-instance lock (flock on the state directory).
    _lock: OwnedFd,
}

pub fn run(opts: Options) -> Result<()> {
    // Signals first, so a SIGTERM during start-up is not lost.
    let sigs = lifetime::Signals::install()?;
    // The saved mode is in force before anyone is told we are ready.
    let mut d = Daemon::start(&opts)?;
    if std::os::unix::net::UnixStream::connect(&opts.socket).is_ok() {
        bail!(
            "another gpuctl daemon is already listening on {}",
            opts.socket.display()
        );
    }
    // Watched before the path appears: a deletion right after the bind is
    // seen (watched after it, a client's unlink in between was missed and
    // the socket never came back; seen as a flaky
    // `root::hostile::the_socket_path_appears_only_when_it_listens` under load).
    // The directory first (the bind would make it; the watch needs it):
    // a failure is the bind's to report, with its context.
    if let Some(dir) = opts.socket.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    d.apps.watch_socket_dir(&opts.socket);
    let mut server = server::Server::bind(&opts.socket)?;
    if let Err(e) = notify::notify("READY=1") {
        log!("{e:#}");
    }
    d.start_power();
    sources::serve(&mut d, &mut server, &sigs)?;
    d.grants.save(&d.core.enforcer, d.core.choice().mode);
    d.poweroff.restore_all(&opts.roots.sysfs);
    log!("stopping; every block is lifted");
    Ok(())
}
