//! `gpuctl daemon`: one thread, one blocking `poll` loop over the socket,
//! its clients and a signal pipe. It owns the enforcer and the user's
//! choice; every decision comes from `policy::plan`.

mod auth;
pub mod config;
mod notify;
mod power;
mod push;
mod server;
mod session;
pub mod state;
mod uevent;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{InitFlags, Inotify, WatchDescriptor};
use serde_json::Value;

use crate::bpf::{self, Backend, Enforcer};
use crate::gpu::{self, Inventory, Roots};
use crate::policy::{self, Choice, ManualBlock, Mode, Plan};
use crate::procs;
use crate::proto::data::{
    ConfigData, ConfigOne, DaemonInfo, GrantData, ListData, ListGpu, ModeData, PingData,
    StatusData, StatusGpu, Subscribed, WhoData, SCHEMA,
};
use crate::proto::event::{Denied, Event};
use crate::proto::redact::{withhold, Viewer};
use crate::proto::{Code, Request, Response};
use auth::Peer;
use config::Config;
use server::{Conn, Server};
use signals::{Signals, Watchdog};

/// Read requests within this time of the last one share one discovery
/// (sysfs) and one `who` scan (procfs): a burst of `status`/`who` costs
/// one read of the hardware, not one each.
const SHARED_READ_WINDOW: Duration = Duration::from_millis(250);

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
    pub state_dir: PathBuf,
    pub config: PathBuf,
    pub backend: BackendChoice,
    pub cgroup: Option<PathBuf>,
    pub verbose: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Auto,
    Lsm,
    Cgroup,
}

/// One log line, written with one write(2) (stderr is unbuffered, and
/// eprintln! writes each formatted piece separately).
macro_rules! log {
    ($($arg:tt)*) => {{
        let line = format!("gpuctl: {}\n", format_args!($($arg)*));
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }};
}

// After `log!`: macro_rules are visible to modules declared below them.
mod apps;
mod auto;
mod grants;
mod signals;

/// The daemon's state. Dropping it detaches every program (fail-open).
struct Daemon {
    roots: Roots,
    state_path: PathBuf,
    config_path: PathBuf,
    config: Config,
    choice: Choice,
    inventory: Inventory,
    plan: Plan,
    /// Why the saved choice is not (fully) in force, if it is not.
    note: Option<String>,
    enforcer: Enforcer,
    started: Instant,
    /// Why an app rule is not in force, by path.
    app_errors: BTreeMap<String, String>,
    /// The kernel identity each app rule is installed under, by path.
    app_ids: BTreeMap<String, gpu::FileId>,
    /// Watches the directories of app-rule executables, so a replaced file
    /// (a package upgrade renames a new inode over it) is re-resolved.
    inotify: Inotify,
    watches: BTreeMap<WatchDescriptor, PathBuf>,
    /// Hot-plug and late-driver events; `None` where netlink is refused.
    uevents: Option<uevent::Uevents>,
    /// The choice changed and is not saved yet.
    dirty: bool,
    /// Why the last save failed, if it did.
    save_error: Option<String>,
    /// Runtime-PM transitions, wake attribution and residency (power.rs).
    power: power::Power,
    /// Automatic modes (power source, external displays).
    auto: auto::Auto,
    /// When grants were last checked against live processes.
    last_sweep: Option<Instant>,
    /// When the inventory was last re-read for a read request.
    refreshed: Option<Instant>,
    /// The last `who` scan (every holder of every GPU) and when it ran.
    who_cache: Option<(Instant, Vec<procs::Holder>)>,
    /// What subscribers were last told (push.rs).
    push: push::Push,
    /// The single-instance lock (flock on the state directory).
    _lock: OwnedFd,
    /// The inotify watch on the socket's directory.
    socket_watch: Option<WatchDescriptor>,
}

pub fn run(opts: Options) -> Result<()> {
    // Signals first, so a SIGTERM during start-up is not lost.
    let sigs = Signals::install()?;
    // One daemon per state directory, whatever happened to the socket file.
    let lock = signals::lock_state_dir(&opts.state_dir)?;
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
    let (auto, warn) = auto::Auto::load(&opts.state_dir);
    if let Some(w) = warn {
        log!("{w}");
    }
    let inventory = gpu::discover(&opts.roots).context("discovering GPUs")?;
    let enforcer = load_backend(&opts, &config).map_err(|e| e.context(Unsupported))?;
    let power = power::Power::new(&opts.roots.sysfs);
    if let Some(e) = power.error() {
        log!("runtime-PM programs not loaded ({e}); residency only, no wake attribution");
    }
    let mut d = Daemon {
        power,
        roots: opts.roots,
        state_path,
        config_path: opts.config.clone(),
        config,
        choice,
        inventory,
        plan: Plan::default(),
        note: None,
        enforcer,
        started: Instant::now(),
        app_errors: BTreeMap::new(),
        app_ids: BTreeMap::new(),
        inotify: Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .context("creating the inotify instance")?,
        watches: BTreeMap::new(),
        dirty: false,
        save_error: None,
        auto,
        last_sweep: None,
        refreshed: None,
        who_cache: None,
        _lock: lock,
        socket_watch: None,
        push: push::Push::default(),
        uevents: match uevent::Uevents::open() {
            Ok(u) => Some(u),
            Err(e) => {
                log!("{e:#}; GPUs will be re-read on each request only");
                None
            }
        },
    };
    d.enforcer.set_env_grants(d.config.env_grants)?;
    d.sync_power();
    d.load_apps();
    // The automatic rules pick the mode from the power source now.
    d.auto_sync();
    // The saved mode is in force before anyone is told we are ready.
    d.reapply().context("applying the saved mode")?;
    d.push = push::Push::new(&d.choice, &d.plan);
    // Grants of processes that outlived the previous daemon.
    d.restore_grants();
    log!(
        "started: backend {}{}, mode {}, {} GPU(s), blocking {}",
        d.enforcer.backend(),
        d.enforcer
            .cgroup_path()
            .map(|p| format!(" on {}", p.display()))
            .unwrap_or_default(),
        d.choice.mode,
        d.inventory.gpus.len(),
        describe_blocked(&d.plan)
    );

    if std::os::unix::net::UnixStream::connect(&opts.socket).is_ok() {
        bail!(
            "another gpuctl daemon is already listening on {}",
            opts.socket.display()
        );
    }
    let mut server = Server::bind(&opts.socket)?;
    d.watch_socket_dir(&server);
    if let Err(e) = notify::notify("READY=1") {
        log!("{e:#}");
    }
    event_loop(&mut d, &mut server, &sigs)?;
    d.save_grants();
    log!("stopping; every block is lifted");
    Ok(())
}

/// The active LSM list, if securityfs shows it.
fn active_lsms(roots: &Roots) -> Option<String> {
    std::fs::read_to_string(roots.sysfs.join("kernel/security/lsm")).ok()
}

/// Loads the requested backend; `auto` tries lsm where the BPF LSM is
/// active and falls back to cgroup, saying why.
fn load_backend(opts: &Options, config: &Config) -> Result<Enforcer> {
    let load = |backend| {
        Enforcer::load(&bpf::Options {
            backend,
            cgroup: opts.cgroup.clone(),
            log_level: config.bpf_log,
            daemon_tgid: std::process::id(),
            max_grants: config.max_grants,
        })
    };
    let lsms = active_lsms(&opts.roots);
    let lsm_active = lsms.as_deref().is_some_and(bpf::bpf_lsm_active);
    match opts.backend {
        BackendChoice::Cgroup => load(Backend::Cgroup),
        BackendChoice::Lsm => {
            if !lsm_active {
                bail!(
                    "the lsm backend needs the BPF LSM, which is not active ({}); add `bpf` to \
                     the kernel's lsm= parameter (see `gpuctl doctor`) or use --backend cgroup",
                    lsms.map(|l| format!("active LSMs: {}", l.trim()))
                        .unwrap_or_else(|| "/sys/kernel/security/lsm is not readable".into())
                );
            }
            load(Backend::Lsm)
        }
        BackendChoice::Auto => {
            if lsm_active {
                match load(Backend::Lsm) {
                    Ok(e) => return Ok(e),
                    Err(e) => log!("the BPF LSM is active but its programs did not load or attach ({e:#}); falling back to the cgroup backend"),
                }
            } else {
                log!(
                    "BPF LSM not active ({}); using the cgroup backend",
                    lsms.map(|l| format!("active LSMs: {}", l.trim()))
                        .unwrap_or_else(|| "securityfs not mounted".into())
                );
            }
            load(Backend::Cgroup)
        }
    }
}

fn describe_blocked(plan: &Plan) -> String {
    if plan.blocked.is_empty() {
        "nothing (programs detached)".to_string()
    } else {
        let ids: Vec<String> = plan.blocked.iter().map(|i| format!("GPU {i}")).collect();
        format!("{} ({} device nodes)", ids.join(", "), plan.nodes.len())
    }
}

/// Who sees other users' processes in power reports (power.rs).
fn viewer(c: &Conn) -> Viewer {
    if c.privileged {
        Viewer::ALL
    } else {
        Viewer::user(c.peer.as_ref().map_or(u32::MAX, |p| p.uid))
    }
}

fn event_loop(d: &mut Daemon, server: &mut Server, sigs: &Signals) -> Result<()> {
    let mut watchdog = Watchdog::from_env();
    loop {
        let now = Instant::now();
        server.reap(now);
        if let Some(w) = &mut watchdog {
            w.tick(now);
        }
        // Nobody listens any more: the kernel stops emitting events.
        if server.subscribers() == 0 && d.enforcer.events_fd().is_some() {
            d.enforcer.set_events(false)?;
        }
        // Requests already buffered are served without sleeping.
        let wake_at = [
            server.next_deadline(),
            watchdog.as_ref().map(Watchdog::deadline),
            d.auto.deadline(),
        ]
        .into_iter()
        .flatten()
        .min();
        let timeout = if server.has_work() {
            PollTimeout::ZERO
        } else {
            match wake_at {
                Some(t) => PollTimeout::try_from(
                    t.saturating_duration_since(now) + Duration::from_millis(1),
                )
                .unwrap_or(PollTimeout::MAX),
                None => PollTimeout::NONE,
            }
        };
        let events_fd = d.enforcer.events_fd();
        let mut fds: Vec<PollFd> = Vec::with_capacity(6 + server.conns.len());
        fds.push(PollFd::new(sigs.stop.as_fd(), PollFlags::POLLIN));
        fds.push(PollFd::new(sigs.reload.as_fd(), PollFlags::POLLIN));
        fds.push(server.listener_fd());
        fds.push(PollFd::new(d.inotify.as_fd(), PollFlags::POLLIN));
        let uevent_at = fds.len();
        if let Some(u) = &d.uevents {
            fds.push(PollFd::new(u.as_fd(), PollFlags::POLLIN));
        }
        let clock_at = fds.len();
        if let Some(fd) = d.auto.clock_fd() {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        let events_at = fds.len();
        if let Some(fd) = events_fd {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        let power_at = fds.len();
        if let Some(fd) = d.power.fd() {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        let first_conn = fds.len();
        fds.extend(server.conns.iter().map(|c| c.poll_fd()));
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context("poll"),
        }
        let revents: Vec<PollFlags> = fds
            .iter()
            .map(|f| f.revents().unwrap_or(PollFlags::empty()))
            .collect();
        drop(fds);

        if !revents[0].is_empty() && signals::drain(&sigs.stop) {
            d.persist();
            return Ok(());
        }
        if !revents[1].is_empty() && signals::drain(&sigs.reload) {
            d.reload();
        }
        let now = Instant::now();
        if !revents[3].is_empty() {
            d.on_inotify(server);
        }
        if clock_at > uevent_at && !revents[uevent_at].is_empty() {
            let k = d.uevents.as_ref().map(|u| u.drain()).unwrap_or_default();
            if k.gpus {
                d.refresh();
            }
            if k.power {
                d.auto.arm(now, "power_supply uevent");
            }
            if k.forged > 0 {
                log!("ignored {} uevent(s) not sent by the kernel", k.forged);
            }
        }
        if events_at > clock_at && !revents[clock_at].is_empty() {
            d.auto.on_clock(now);
        }
        d.auto_tick(Instant::now());
        if first_conn > power_at && !revents[power_at].is_empty() {
            for e in d.power.on_ready() {
                server.broadcast(&|c: &Conn| Some(e.clone().for_viewer(viewer(c)).to_value()));
            }
        }
        if power_at > events_at && !revents[events_at].is_empty() {
            for e in d.enforcer.drain_events() {
                // Other users' pids and command names only to root and the
                // group; a plain user sees their own, and the count.
                let ev = Event::Denied(Denied {
                    pid: Some(e.pid),
                    comm: Some(e.comm.clone()),
                    uid: Some(e.uid),
                    gpu: e.gpu,
                    node: Some(e.node),
                });
                server.broadcast(&|c: &Conn| Some(ev.clone().for_viewer(viewer(c)).to_value()));
            }
        }
        // Existing clients first (their indexes match `revents`), then new ones.
        for (i, ev) in revents[first_conn..].iter().enumerate() {
            if !ev.is_empty() {
                server.io(i, *ev);
            }
        }
        server.serve(now, &mut |req, conn| d.handle(req, conn));
        if !revents[2].is_empty() {
            let gid = auth::configured_gid(&d.config.group);
            server.accept(now, &|p: &Peer| p.may_change(gid));
        }
        for e in std::mem::take(&mut d.auto.outbox) {
            server.broadcast(&|c: &Conn| Some(e.clone().for_viewer(viewer(c)).to_value()));
        }
        d.announce(server);
        d.persist();
    }
}

impl Daemon {
    /// Re-reads the hardware; re-plans if anything changed (hot plug,
    /// a display plugged in, a driver bound).
    fn refresh(&mut self) {
        match gpu::discover(&self.roots) {
            Ok(inv) if inv != self.inventory => {
                // Power state changes land here too; say something only
                // when what is blocked changed.
                self.inventory = inv;
                self.sync_power();
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
                self.auto_gpus_changed();
            }
            Ok(_) => {}
            Err(e) => log!("rediscovering GPUs failed: {e:#}"),
        }
    }

    /// Applies the saved choice to the current inventory. Protected GPUs
    /// are skipped with a log line; a mode that makes no sense here blocks
    /// nothing. Never fails because of policy, only because of the kernel.
    fn reapply(&mut self) -> Result<()> {
        let inv = session::with_display_holders(
            &self.inventory,
            &self.roots.procfs,
            &self.choice,
            &self.plan.blocked,
        );
        let plan = match policy::plan(&inv, &self.choice) {
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
        self.enforcer.apply(&plan)?;
        let before = std::mem::replace(&mut self.plan, plan);
        self.nudge_compositors(&before.blocked);
        Ok(())
    }

    /// Makes `choice` the new choice: checked by the rules and applied;
    /// if the kernel refuses, nothing changes. Saving it (temp file, fsync,
    /// rename, fsync) happens right after the response is sent
    /// ([`Daemon::persist`]), so the client does not wait for the disk.
    fn change(&mut self, choice: Choice) -> Response {
        let inv = session::with_display_holders(
            &self.inventory,
            &self.roots.procfs,
            &choice,
            &self.plan.blocked,
        );
        let plan = match policy::check(&inv, &choice) {
            Ok(p) => p,
            Err(r) => return Response::err(Code::Refused, r.0),
        };
        if let Err(e) = self.enforcer.apply(&plan) {
            if let Err(back) = self.enforcer.apply(&self.plan) {
                log!("restoring the previous blocks failed: {back:#}");
            }
            return Response::err(Code::Internal, format!("{e:#}"));
        }
        self.choice = choice;
        let before = std::mem::replace(&mut self.plan, plan);
        self.nudge_compositors(&before.blocked);
        self.note = None;
        self.dirty = true;
        Response::with(&self.mode_json())
    }

    /// Saves the choice if a change is not saved yet. Runs after responses
    /// are flushed and before the loop waits again, so a stop (SIGTERM) never
    /// finds it unsaved. A failure is logged and shown by `status`; the next
    /// change tries again.
    fn persist(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        match state::save(&self.state_path, &self.choice) {
            Ok(()) => self.save_error = None,
            Err(e) => {
                log!("{e:#}; the change is in force but will not survive a restart");
                self.save_error = Some(format!("{e:#}"));
            }
        }
    }

    /// SIGHUP: re-reads the config and applies what can change live (the
    /// group, env_grants), and re-resolves the app rules.
    fn reload(&mut self) {
        let (new, warn) = config::load(&self.config_path);
        if let Some(w) = warn {
            log!("{w}");
        }
        if new.env_grants != self.config.env_grants {
            if let Err(e) = self.enforcer.set_env_grants(new.env_grants) {
                log!("reload: {e:#}");
                return;
            }
        }
        if new.bpf_log != self.config.bpf_log || new.max_grants != self.config.max_grants {
            log!("reload: bpf_log and max_grants are fixed when the BPF programs load; restart the daemon to change them");
        }
        let rules_changed = new.auto != self.config.auto;
        self.config = new;
        self.load_apps();
        if rules_changed {
            self.auto_config_changed();
        }
        log!(
            "reloaded {}: group {}, env_grants {}",
            self.config_path.display(),
            self.config.group,
            self.config.env_grants
        );
    }

    /// Re-reads the hardware for a read request, unless a read within the
    /// last [`SHARED_READ_WINDOW`] already did.
    fn refresh_for_read(&mut self) {
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

    fn handle(&mut self, req: Request, conn: &Conn) -> Response {
        let peer = conn.peer.as_ref();
        if req.is_change() {
            // Decided from the credentials captured at connect (uid, gid,
            // supplementary groups), never from /proc at request time.
            if !conn.privileged {
                return Response::err(
                    Code::PermissionDenied,
                    format!(
                        "changing the GPU mode needs root or membership in the `{}` group",
                        self.config.group
                    ),
                );
            }
        }
        let t0 = Instant::now();
        // Reads report live power state, so they re-read sysfs. Changes use
        // the inventory uevents keep current (a node, GPU or display
        // appearing re-plans at once), unless uevents are unavailable.
        if !req.is_change() {
            self.refresh_for_read();
        } else if self.uevents.is_none() {
            self.refresh();
        }
        let resp = match &req {
            Request::Ping {} => Response::with(&PingData {
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
            Request::List {} => Response::with(&self.list_json(viewer(conn))),
            Request::Get {} => Response::with(&self.mode_json()),
            Request::Status {} => self.status(conn),
            Request::Who { gpu } => self.who(gpu.as_deref(), conn),
            Request::Set { mode, force } => match mode.parse::<Mode>() {
                Ok(mode) => self.change(Choice {
                    mode,
                    force: *force,
                    only_grants: false,
                    ..self.choice.clone()
                }),
                Err(e) => Response::err(Code::BadRequest, e),
            },
            Request::Block { gpu, force } => self.block(gpu, *force, true),
            Request::Unblock { gpu } => self.block(gpu, false, false),
            Request::Grant { gpu, only } => self.grant(peer, gpu.as_deref(), *only),
            Request::App { action, path, gpu } => {
                self.app(*action, path.as_deref(), gpu.as_deref())
            }
            Request::Config { key, value } => self.config_req(key.as_deref(), value.as_deref()),
            Request::Wakes { gpu } => {
                match self
                    .power
                    .wakes_json(&self.inventory, gpu.as_deref(), viewer(conn))
                {
                    Ok(v) => Response::with(&v),
                    Err(e) => Response::err(Code::UnknownGpu, e),
                }
            }
            Request::Auto { action } => self.auto_request(*action),
            Request::Events {} => match self.enforcer.set_events(true) {
                Ok(()) => Response::with(&Subscribed { subscribed: true }),
                Err(e) => Response::err(Code::Internal, format!("{e:#}")),
            },
        };
        if resp.ok
            && matches!(
                req,
                Request::Set { .. } | Request::Block { .. } | Request::Unblock { .. }
            )
        {
            self.auto_manual();
        }
        // Refusals of unprivileged requests are not logged: anyone could
        // flood the journal with them.
        if req.is_change() && conn.privileged {
            if let Some(p) = peer {
                log!(
                    "{:?} from pid {} uid {} ({}): {} in {:?}",
                    req,
                    p.pid,
                    p.uid,
                    p.comm,
                    if resp.ok {
                        format!("done, blocking {}", describe_blocked(&self.plan))
                    } else {
                        format!(
                            "not done: {}",
                            resp.error.as_ref().map_or("", |e| e.message.as_str())
                        )
                    },
                    t0.elapsed()
                );
            }
        }
        resp
    }

    fn block(&mut self, arg: &str, force: bool, block: bool) -> Response {
        let gpu = match self.inventory.find(arg) {
            Ok(g) => g.clone(),
            Err(e) => return Response::err(Code::UnknownGpu, e),
        };
        if block {
            if let Some(reason) = policy::protect_reason(&gpu, force) {
                return Response::err(Code::Refused, format!("refused: {reason}"));
            }
        }
        // Entering manual mode starts from what is blocked now.
        let mut manual = if self.choice.mode == Mode::Manual {
            self.choice.manual.clone()
        } else {
            self.inventory
                .gpus
                .iter()
                .filter(|g| self.plan.blocked.contains(&g.id))
                .map(|g| ManualBlock {
                    pci: g.pci,
                    force: self.choice.force,
                })
                .collect()
        };
        manual.retain(|m| m.pci != gpu.pci);
        if block {
            manual.insert(ManualBlock {
                pci: gpu.pci,
                force,
            });
        }
        self.change(Choice {
            mode: Mode::Manual,
            force: false,
            manual,
            ..self.choice.clone()
        })
    }

    /// `gpuctl run`: grants the caller's own process (never another one:
    /// the pid comes from SO_PEERCRED) access to one GPU.
    fn grant(&mut self, peer: Option<&Peer>, arg: Option<&str>, only: bool) -> Response {
        let Some(peer) = peer else {
            return Response::err(
                Code::Internal,
                "cannot identify the caller (SO_PEERCRED failed)",
            );
        };
        let gpu = match self.inventory.run_target(arg) {
            Ok(g) => g.clone(),
            Err(e) if arg.is_some() => return Response::err(Code::UnknownGpu, e),
            Err(e) => return Response::err(Code::Refused, format!("refused: {e}")),
        };
        let granted = match self.choice.mode {
            Mode::Hybrid => false,
            Mode::Smart => {
                // The first exclusive grant puts the default GPU's hide
                // rules in the map, before the grant (and the exec) exist.
                if only && !self.choice.only_grants {
                    let resp = self.change(Choice {
                        only_grants: true,
                        ..self.choice.clone()
                    });
                    if !resp.ok {
                        return resp;
                    }
                }
                if let Err(resp) = self.grant_peer(peer, &gpu, only) {
                    return resp;
                }
                let pid = peer.pid;
                self.push.grant(pid, peer.uid, &peer.comm, gpu.id, only);
                log!(
                    "granted pid {} ({}) {}{}",
                    pid,
                    peer.comm,
                    gpu.label(),
                    if only { " exclusively" } else { "" }
                );
                true
            }
            mode => {
                return Response::err(
                    Code::Refused,
                    format!(
                        "refused: the offload GPUs are blocked for every process in {mode} mode; \
                         switch to smart mode (`gpuctl set smart`) to let chosen programs use them"
                    ),
                )
            }
        };
        // The environment `gpuctl run` execs with: the loaders' offload
        // variables for this GPU (with several NVIDIA GPUs, the provider).
        let env = gpu
            .offload_env(&self.inventory)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        Response::with(&GrantData {
            granted,
            mode: self.choice.mode,
            gpu: Some(gpu),
            env: Some(crate::proto::data::EnvVars(env)),
        })
    }

    /// `gpuctl config [KEY [VALUE]]`. Setting edits the file (comments
    /// kept), writes it atomically, and applies what can change live.
    fn config_req(&mut self, key: Option<&str>, value: Option<&str>) -> Response {
        let all = self.config.to_json();
        let Some(key) = key else {
            return Response::with(&ConfigData::All {
                path: self.config_path.clone(),
                config: all,
            });
        };
        let Some(value) = value else {
            return match all.get(key) {
                Some(v) => Response::with(&ConfigData::One(ConfigOne {
                    key: key.to_string(),
                    value: v.clone(),
                })),
                None => Response::err(
                    Code::BadRequest,
                    format!("unknown key {key:?} (keys: {})", config::KEYS.join(", ")),
                ),
            };
        };
        let text = match crate::safefile::read_capped(&self.config_path, crate::safefile::MAX_FILE)
        {
            Ok(b) => match String::from_utf8(b) {
                Ok(t) => t,
                Err(_) => {
                    return Response::err(Code::Internal, "the config file is not UTF-8 text")
                }
            },
            Err(crate::safefile::ReadError::Missing) => String::new(),
            Err(e) => {
                return Response::err(
                    Code::Internal,
                    format!("reading the config {}: {e}", self.config_path.display()),
                )
            }
        };
        let (text, new) = match config::edit(&text, key, value) {
            Ok(x) => x,
            Err(e) => return Response::err(Code::BadRequest, e),
        };
        if let Err(e) = state::write_atomic(&self.config_path, text.as_bytes()) {
            return Response::err(Code::Internal, format!("{e:#}"));
        }
        let mut note = None;
        if new.env_grants != self.config.env_grants {
            if let Err(e) = self.enforcer.set_env_grants(new.env_grants) {
                return Response::err(Code::Internal, format!("{e:#}"));
            }
        }
        if new.bpf_log != self.config.bpf_log || new.max_grants != self.config.max_grants {
            note = Some(
                "bpf_log and max_grants are fixed when the BPF programs load: restart the daemon",
            );
        }
        let rules_changed = new.auto != self.config.auto;
        self.config = new;
        if rules_changed {
            self.auto_config_changed();
        }
        Response::with(&ConfigData::Set {
            key: key.to_string(),
            value: self
                .config
                .to_json()
                .get(key)
                .cloned()
                .unwrap_or(Value::Null),
            note: note.map(str::to_string),
        })
    }

    fn mode_json(&self) -> ModeData {
        ModeData {
            mode: self.choice.mode,
            force: self.choice.force,
            blocked: self.plan.blocked.iter().copied().collect(),
            note: self.note.clone(),
        }
    }

    fn gpus_with_blocked(&self) -> Vec<gpu::Gpu> {
        let mut gpus = self.inventory.gpus.clone();
        for g in &mut gpus {
            g.blocked = Some(self.plan.blocked.contains(&g.id));
        }
        gpus
    }

    fn list_json(&mut self, viewer: Viewer) -> ListData {
        let mut gpus: Vec<ListGpu> = self
            .gpus_with_blocked()
            .into_iter()
            .map(|gpu| ListGpu {
                gpu,
                runtime_pm: None,
            })
            .collect();
        self.power.annotate_list(&mut gpus, viewer);
        ListData {
            schema: SCHEMA,
            mode: Some(self.choice.mode),
            backend: Some(self.enforcer.backend()),
            gpus,
        }
    }

    /// Watches the offload GPUs' runtime PM (power.rs); never fatal.
    fn sync_power(&mut self) {
        if let Err(e) = self.power.sync(&self.inventory) {
            log!("watching the GPUs' runtime PM failed: {e}");
        }
    }

    fn status(&mut self, conn: &Conn) -> Response {
        let (grants, grants_hidden) = self.grants_view(viewer(conn));
        let grants_full = self.enforcer.grants_full().unwrap_or(0);
        let denied = match self.enforcer.denied_counts() {
            Ok(d) => d,
            Err(e) => return Response::err(Code::Internal, format!("{e:#}")),
        };
        let mut gpus: Vec<StatusGpu> = self
            .gpus_with_blocked()
            .into_iter()
            .map(|g| StatusGpu {
                id: g.id,
                pci: Some(g.pci),
                name: g.name,
                default: g.default,
                blocked: g.blocked,
                power_state: g.power_state,
                runtime_status: g.runtime_status,
                denied_opens: denied.get(g.id as usize).copied().unwrap_or(0),
                runtime_pm: None,
            })
            .collect();
        self.power.annotate_status(&mut gpus, viewer(conn));
        let backend = self.enforcer.backend();
        Response::with(&StatusData {
            schema: SCHEMA,
            daemon: DaemonInfo {
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                uptime_s: self.started.elapsed().as_secs(),
            },
            backend: Some(backend),
            backend_limits: backend.limits().to_string(),
            cgroup: self.enforcer.cgroup_path().map(|p| p.to_path_buf()),
            smart_hooks: self.enforcer.smart_attached(),
            events: self.enforcer.events_fd().is_some(),
            attached: self.enforcer.attached(),
            mode: self.choice.mode,
            force: self.choice.force,
            note: self.note.clone(),
            modes: push::modes(&self.inventory, &self.choice),
            may_change: conn.privileged,
            auto: Some(self.auto_json()),
            state_not_saved: self.save_error.clone(),
            grants,
            grants_hidden,
            grants_refused_map_full: grants_full,
            env_grants: self.config.env_grants,
            blocked_nodes: self
                .plan
                .nodes
                .iter()
                .filter(|(_, r)| r.flags & policy::RULE_ONLY_HIDE == 0)
                .map(|(d, _)| *d)
                .collect(),
            gpus,
            power_monitor: Some(self.power.status_json()),
        })
    }

    /// `who`: processes holding GPU nodes open. Every holder to root and
    /// the group; a plain user sees their own processes and a count of the
    /// others'. One procfs scan serves every `who` within
    /// [`SHARED_READ_WINDOW`].
    fn who(&mut self, arg: Option<&str>, conn: &Conn) -> Response {
        let only = match arg
            .map(|a| self.inventory.find(a).map(|g| g.id))
            .transpose()
        {
            Ok(o) => o,
            Err(e) => return Response::err(Code::UnknownGpu, e),
        };
        let now = Instant::now();
        let fresh = self
            .who_cache
            .as_ref()
            .is_some_and(|(t, _)| now.duration_since(*t) < SHARED_READ_WINDOW);
        if !fresh {
            let all = procs::holders(&self.roots.procfs, &gpu::node_owners(&self.inventory));
            self.who_cache = Some((now, all));
        }
        let all = self
            .who_cache
            .as_ref()
            .map(|(_, h)| h.as_slice())
            .unwrap_or(&[]);
        let (holders, hidden) = withhold(
            all.iter()
                .filter(|h| only.is_none_or(|o| o == h.gpu))
                .cloned()
                .collect(),
            viewer(conn),
        );
        Response::with(&WhoData {
            holders,
            hidden: Some(hidden),
        })
    }

    /// Watches the socket's directory, so a deleted socket file is noticed
    /// (and re-created) at once, without polling.
    fn watch_socket_dir(&mut self, server: &Server) {
        let Some(dir) = server.path().parent() else {
            return;
        };
        // IN_MASK_ADD: an app rule's directory may be the same one.
        let mask = nix::sys::inotify::AddWatchFlags::IN_DELETE
            | nix::sys::inotify::AddWatchFlags::IN_MOVED_FROM
            | nix::sys::inotify::AddWatchFlags::from_bits_retain(libc::IN_MASK_ADD);
        match self.inotify.add_watch(dir, mask) {
            Ok(wd) => self.socket_watch = Some(wd),
            Err(e) => log!(
                "cannot watch {} (a deleted socket will not be re-created): {e}",
                dir.display()
            ),
        }
    }
}
