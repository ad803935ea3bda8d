//! `gpuctl daemon`: one thread, one blocking `poll` loop over the socket,
//! its clients and a signal pipe. It owns the enforcer and the user's
//! choice; every decision comes from `policy::plan`.

mod auth;
pub mod config;
mod notify;
mod server;
pub mod state;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::{json, Value};

use crate::bpf::{self, Backend, Enforcer};
use crate::gpu::{self, Inventory, Roots};
use crate::policy::{self, Choice, ManualBlock, Mode, Plan};
use crate::procs;
use crate::proto::{Code, Request, Response};
use auth::Peer;
use config::Config;
use server::Server;

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

macro_rules! log {
    ($($arg:tt)*) => { eprintln!("gpuctl: {}", format_args!($($arg)*)) };
}

/// The daemon's state. Dropping it detaches every program (fail-open).
struct Daemon {
    roots: Roots,
    state_path: PathBuf,
    config: Config,
    choice: Choice,
    inventory: Inventory,
    plan: Plan,
    /// Why the saved choice is not (fully) in force, if it is not.
    note: Option<String>,
    enforcer: Enforcer,
    started: Instant,
}

pub fn run(opts: Options) -> Result<()> {
    let (config, warn) = config::load(&opts.config);
    if let Some(w) = warn {
        log!("{w}");
    }
    bpf::init_logging(opts.verbose);

    // Signals first, so a SIGTERM during start-up is not lost.
    let (sig_rx, sig_tx) = UnixStream::pair().context("creating the signal pipe")?;
    sig_rx.set_nonblocking(true)?;
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::low_level::pipe::register(sig, sig_tx.try_clone()?)
            .context("installing signal handlers")?;
    }

    let state_path = opts.state_dir.join("state.json");
    let (choice, warn) = state::load(&state_path);
    if let Some(w) = warn {
        log!("{w}");
    }
    let inventory = gpu::discover(&opts.roots).context("discovering GPUs")?;
    let enforcer = load_backend(&opts, &config)?;
    let mut d = Daemon {
        roots: opts.roots,
        state_path,
        config,
        choice,
        inventory,
        plan: Plan::default(),
        note: None,
        enforcer,
        started: Instant::now(),
    };
    // The saved mode is in force before anyone is told we are ready.
    d.reapply().context("applying the saved mode")?;
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

    let mut server = Server::bind(&opts.socket)?;
    if let Err(e) = notify::notify("READY=1") {
        log!("{e:#}");
    }
    event_loop(&mut d, &mut server, &sig_rx)?;
    log!("stopping; every block is lifted");
    Ok(())
}

/// The active LSM list, if securityfs shows it.
fn active_lsms() -> Option<String> {
    std::fs::read_to_string("/sys/kernel/security/lsm").ok()
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
        })
    };
    let lsms = active_lsms();
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

fn event_loop(d: &mut Daemon, server: &mut Server, sig_rx: &UnixStream) -> Result<()> {
    loop {
        let now = Instant::now();
        server.reap(now);
        let timeout = match server.next_deadline() {
            Some(t) => {
                PollTimeout::try_from(t.saturating_duration_since(now) + Duration::from_millis(1))
                    .unwrap_or(PollTimeout::MAX)
            }
            None => PollTimeout::NONE,
        };
        let mut fds: Vec<PollFd> = Vec::with_capacity(2 + server.conns.len());
        fds.push(PollFd::new(sig_rx.as_fd(), PollFlags::POLLIN));
        fds.push(server.listener_fd());
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

        if !revents[0].is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        // Existing clients first (their indexes match `revents`), then new ones.
        for (i, ev) in revents[2..].iter().enumerate() {
            if !ev.is_empty() {
                server.service(i, *ev, now, &mut |req, peer| d.handle(req, peer));
            }
        }
        if !revents[1].is_empty() {
            server.accept(now);
        }
    }
}

impl Daemon {
    /// Re-reads the hardware; re-plans if anything changed (hot plug,
    /// a display plugged in, a driver bound).
    fn refresh(&mut self) {
        match gpu::discover(&self.roots) {
            Ok(inv) if inv != self.inventory => {
                self.inventory = inv;
                if let Err(e) = self.reapply() {
                    log!("re-applying after a hardware change failed: {e:#}");
                }
            }
            Ok(_) => {}
            Err(e) => log!("rediscovering GPUs failed: {e:#}"),
        }
    }

    /// Applies the saved choice to the current inventory. Protected GPUs
    /// are skipped with a log line; a mode that makes no sense here blocks
    /// nothing. Never fails because of policy, only because of the kernel.
    fn reapply(&mut self) -> Result<()> {
        let plan = match policy::plan(&self.inventory, &self.choice) {
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
        self.plan = plan;
        Ok(())
    }

    /// Makes `choice` the new choice: checked by the rules, saved, applied.
    /// On failure nothing changes.
    fn change(&mut self, choice: Choice) -> Response {
        let plan = match policy::check(&self.inventory, &choice) {
            Ok(p) => p,
            Err(r) => return Response::err(Code::Refused, r.0),
        };
        if let Err(e) = state::save(&self.state_path, &choice) {
            return Response::err(Code::Internal, format!("{e:#}"));
        }
        if let Err(e) = self.enforcer.apply(&plan) {
            // Put back what was in force, in the kernel and on disk.
            let _ = state::save(&self.state_path, &self.choice);
            let _ = self.enforcer.apply(&self.plan);
            return Response::err(Code::Internal, format!("{e:#}"));
        }
        self.choice = choice;
        self.plan = plan;
        self.note = None;
        Response::ok(self.mode_json())
    }

    fn handle(&mut self, req: Request, peer: Option<&Peer>) -> Response {
        if req.is_change() {
            let allowed = peer.is_some_and(|p| auth::may_change(p, &self.config.group));
            if !allowed {
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
        self.refresh();
        let resp = match &req {
            Request::Ping {} => Response::ok(json!({
                "pid": std::process::id(),
                "version": env!("CARGO_PKG_VERSION"),
            })),
            Request::List {} => Response::ok(self.list_json()),
            Request::Get {} => Response::ok(self.mode_json()),
            Request::Status {} => self.status(),
            Request::Who { gpu } => self.who(gpu.as_deref()),
            Request::Set { mode, force } => match mode.parse::<Mode>() {
                Ok(mode) => self.change(Choice {
                    mode,
                    force: *force,
                    manual: self.choice.manual.clone(),
                }),
                Err(e) => Response::err(Code::BadRequest, e),
            },
            Request::Block { gpu, force } => self.block(gpu, *force, true),
            Request::Unblock { gpu } => self.block(gpu, false, false),
        };
        if req.is_change() {
            if let Some(p) = peer {
                log!(
                    "{:?} from pid {} uid {} ({}): {} in {:?}",
                    req,
                    p.pid,
                    p.uid,
                    p.comm(),
                    if resp.ok {
                        format!("done, blocking {}", describe_blocked(&self.plan))
                    } else {
                        format!(
                            "refused: {}",
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
        })
    }

    fn mode_json(&self) -> Value {
        json!({
            "mode": self.choice.mode,
            "force": self.choice.force,
            "blocked": self.plan.blocked,
            "note": self.note,
        })
    }

    fn gpus_with_blocked(&self) -> Vec<gpu::Gpu> {
        let mut gpus = self.inventory.gpus.clone();
        for g in &mut gpus {
            g.blocked = Some(self.plan.blocked.contains(&g.id));
        }
        gpus
    }

    fn list_json(&self) -> Value {
        json!({
            "schema": 1,
            "mode": self.choice.mode,
            "backend": self.enforcer.backend(),
            "gpus": self.gpus_with_blocked(),
        })
    }

    fn status(&self) -> Response {
        let denied = match self.enforcer.denied_counts() {
            Ok(d) => d,
            Err(e) => return Response::err(Code::Internal, format!("{e:#}")),
        };
        let gpus: Vec<Value> = self
            .gpus_with_blocked()
            .into_iter()
            .map(|g| {
                json!({
                    "id": g.id,
                    "pci": g.pci,
                    "name": g.name,
                    "default": g.default,
                    "blocked": g.blocked,
                    "power_state": g.power_state,
                    "runtime_status": g.runtime_status,
                    "denied_opens": denied.get(g.id as usize).copied().unwrap_or(0),
                })
            })
            .collect();
        Response::ok(json!({
            "schema": 1,
            "daemon": {
                "pid": std::process::id(),
                "version": env!("CARGO_PKG_VERSION"),
                "uptime_s": self.started.elapsed().as_secs(),
            },
            "backend": self.enforcer.backend(),
            "backend_limits": self.enforcer.backend().limits(),
            "cgroup": self.enforcer.cgroup_path(),
            "smart_hooks": self.enforcer.smart_attached(),
            "attached": self.enforcer.attached(),
            "mode": self.choice.mode,
            "force": self.choice.force,
            "note": self.note,
            "blocked_nodes": self
                .plan
                .nodes
                .iter()
                .filter(|(_, r)| r.flags & policy::RULE_ONLY_HIDE == 0)
                .map(|(d, _)| *d)
                .collect::<Vec<_>>(),
            "gpus": gpus,
        }))
    }

    fn who(&self, arg: Option<&str>) -> Response {
        let only = match arg.map(|a| self.inventory.find(a)) {
            Some(Ok(g)) => Some(g.id),
            Some(Err(e)) => return Response::err(Code::UnknownGpu, e),
            None => None,
        };
        let mut owners = gpu::node_owners(&self.inventory);
        owners.retain(|_, id| only.is_none_or(|o| o == *id));
        let holders = procs::holders(&self.roots.procfs, &owners);
        Response::ok(json!({ "holders": holders }))
    }
}
