//! gpuctl: keep a laptop's discrete GPU asleep.
//!
//! One binary: `gpuctl daemon` runs the daemon; every other subcommand is a
//! thin client of its socket (and `list` also works without it).

mod automation;
mod bpf;
mod cli;
mod client;
mod daemon;
mod desktop;
mod envgrant;
mod gpu;
mod kernel;
mod policy;
mod procs;
mod proto;
mod safefile;
mod text;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit statuses scripts can rely on (README, "Exit codes").
pub mod exit {
    pub const OK: u8 = 0;
    /// Something failed (the message says what).
    pub const ERROR: u8 = 1;
    /// Bad usage: unknown command, option, mode or GPU.
    pub const USAGE: u8 = 2;
    /// The daemon is not running.
    pub const NOT_RUNNING: u8 = 3;
    /// The rules refused the change (the message says why).
    pub const REFUSED: u8 = 4;
    /// The caller may not change the mode.
    pub const DENIED: u8 = 5;
    /// The daemon is busy: too many clients, or no answer in time (sysexits'
    /// EX_TEMPFAIL: try again).
    pub const BUSY: u8 = 75;
    /// `gpuctl daemon`: this kernel cannot load or attach the BPF programs
    /// (sysexits' EX_CONFIG; the systemd unit does not restart on it).
    pub const UNSUPPORTED: u8 = 78;
}

#[derive(Parser)]
#[command(
    name = "gpuctl",
    version,
    about = "Keep a laptop's discrete GPU asleep: per-device, per-process GPU access control with eBPF",
    after_help = "Exit codes: 0 ok, 1 error, 2 bad usage, 3 daemon not running, 4 refused, 5 permission denied, 75 daemon busy (try again)."
)]
pub struct Cli {
    /// The daemon's socket.
    #[arg(
        long,
        global = true,
        env = "GPUCTL_SOCKET",
        default_value = DEFAULT_SOCKET
    )]
    socket: PathBuf,
    /// Where sysfs is (tests point this at a fixture tree). Hidden from help.
    #[arg(
        long,
        global = true,
        hide = true,
        env = "GPUCTL_SYSFS_ROOT",
        default_value = "/sys"
    )]
    sysfs_root: PathBuf,
    /// Where procfs is (tests). Hidden from help.
    #[arg(
        long,
        global = true,
        hide = true,
        env = "GPUCTL_PROCFS_ROOT",
        default_value = "/proc"
    )]
    procfs_root: PathBuf,
    /// Where /run is: logind's state files, for who is at the seat (tests).
    /// Hidden from help.
    #[arg(
        long,
        global = true,
        hide = true,
        env = "GPUCTL_RUN_ROOT",
        default_value = "/run"
    )]
    run_root: PathBuf,
    /// The daemon's state directory (state.json).
    #[arg(
        long,
        global = true,
        env = "GPUCTL_STATE_DIR",
        default_value = "/var/lib/gpuctl"
    )]
    state_dir: PathBuf,
    /// The config file (TOML).
    #[arg(
        long,
        global = true,
        env = "GPUCTL_CONFIG",
        default_value = "/etc/gpuctl/gpuctl.toml"
    )]
    config: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon (as root, usually under systemd).
    Daemon {
        /// How to block: lsm, cgroup, or auto (lsm if the kernel has the BPF LSM, else cgroup).
        #[arg(long, value_enum, default_value = "auto")]
        backend: daemon::BackendChoice,
        /// The cgroup-v2 directory to attach to (default: the cgroup-v2 root).
        #[arg(long)]
        cgroup: Option<PathBuf>,
        /// Print libbpf's debug messages (the verifier log on failure).
        #[arg(long)]
        verbose: bool,
        /// Where systemd-udevd is (first that exists; tests). Hidden from help.
        #[arg(long, hide = true, value_delimiter = ':', default_value = daemon::UDEVD_PATHS)]
        udevd: Vec<PathBuf>,
        /// Where systemd-logind is (first that exists; tests). Hidden from help.
        #[arg(long, hide = true, value_delimiter = ':', default_value = daemon::LOGIND_PATHS)]
        logind: Vec<PathBuf>,
    },
    /// List the GPUs (works without the daemon).
    List {
        /// One JSON object for scripts (schema in the README).
        #[arg(long)]
        json: bool,
    },
    /// Print the current mode.
    Get {
        #[arg(long)]
        json: bool,
    },
    /// Switch mode: hybrid, integrated, manual or smart.
    Set {
        /// The mode to switch to.
        #[arg(value_parser = cli::docs::Offered(cli::docs::mode_names))]
        mode: String,
        /// Also block GPUs that drive a connected display.
        #[arg(long)]
        force: bool,
    },
    /// Block one GPU (switches to manual mode).
    Block {
        /// GPU id (`1`) or PCI address (`0000:01:00.0`, `01:00.0`).
        gpu: String,
        /// Block it even if it drives a connected display.
        #[arg(long)]
        force: bool,
    },
    /// Unblock one GPU (switches to manual mode).
    Unblock {
        /// GPU id or PCI address.
        gpu: String,
    },
    /// Show the daemon, backend, mode, and per-GPU state with denied-open counts.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// List processes holding a GPU open (they keep it awake).
    Who {
        /// GPU id or PCI address (default: every GPU).
        gpu: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Run a program on the offload GPU (smart mode grants it and its children).
    #[command(
        after_help = "Examples:\n  gpuctl run -- glxgears\n  Steam launch option: gpuctl run -- %command%\n  .desktop file: Exec=gpuctl run -- /usr/bin/blender\n\nWithout gpuctl run, smart mode grants a program exec'd with an offload request the GPU its loader will select: DRI_PRIME=1 (every offload GPU), DRI_PRIME=pci-DDDD_BB_DD_F[!] or vid:did[!] and MESA_VK_DEVICE_SELECT=vid:did[!] (that GPU; nothing when it is the default GPU), __NV_PRIME_RENDER_OFFLOAD=1 and __VK_LAYER_NV_optimus=NVIDIA_only (the NVIDIA offload GPUs), VK_ICD_FILENAMES/VK_DRIVER_FILES/VK_LOADER_DRIVERS_SELECT naming a Vulkan driver only offload GPUs use. Not seen: variables set after exec, Mesa's drirc device_id."
    )]
    Run {
        /// GPU id or PCI address (default: the offload GPU).
        #[arg(long)]
        gpu: Option<String>,
        /// Hide every other GPU from the program's process tree, so programs
        /// that take "the first GPU" land on this one.
        #[arg(long)]
        only: bool,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Per-application policy for smart mode.
    App {
        #[command(subcommand)]
        action: AppCmd,
    },
    /// Show the daemon's settings, one of them, or set one (group, bpf_log, env_grants, max_grants, seat_may_change, auto.on_battery, auto.on_ac, auto.external_display, power_off).
    Config {
        #[arg(value_parser = cli::docs::Offered(cli::docs::config_keys))]
        key: Option<String>,
        value: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff) on stdout.
    #[command(hide = true)]
    Manpage,
    /// Bind back the drivers a power-off left unbound (the unit's
    /// ExecStopPost; a daemon that died). Reads the state directory's
    /// poweroff.json and removes it.
    #[command(hide = true)]
    PoweroffRestore,
    /// Check what keeping the dGPU asleep needs, and say how to fix what is missing.
    Doctor,
    /// Automatic modes: on, off, or show why the current mode is in force.
    #[command(
        after_help = "Rules live in the config's [auto] table (gpuctl config auto.on_battery integrated).\n`gpuctl auto on` also ends a manual override; a manual `set` otherwise stands until the power source changes."
    )]
    Auto {
        /// on | off | status (default: status)
        #[arg(value_enum)]
        action: Option<crate::proto::AutoAction>,
        /// One JSON object for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Stream events as they happen: denied opens, mode changes, GPUs blocked or
    /// unblocked, grants, and the offload GPUs' wakes (with who woke them), sleeps
    /// and power-state changes.
    Events {
        #[arg(long)]
        json: bool,
    },
    /// Show the GPU state in the desktop's tray (StatusNotifierItem: KDE, waybar,
    /// XFCE, GNOME with AppIndicator): icon by mode and dGPU state, tooltip, a menu
    /// to switch modes, block GPUs and allow denied apps, and notifications.
    ///
    /// Notifications are set per user in ~/.config/gpuctl/desktop.toml
    /// (GPUCTL_DESKTOP_CONFIG overrides the path): [notify] mode, wake, display,
    /// denied, actions (true/false) and min_interval_s.
    #[cfg_attr(not(feature = "tray"), command(hide = true))]
    Tray,
    /// Serve net.hadess.SwitcherooControl on the system bus (what GNOME, KDE
    /// and switcherooctl read for "Launch using Discrete Graphics Card"), as a
    /// client of the daemon: the GPUs a launch may use in the current mode,
    /// each with the environment gpuctl's smart mode grants. Run by the
    /// service unit of its own, as root; leaves a running switcheroo-control be.
    #[cfg_attr(not(feature = "tray"), command(hide = true))]
    Switcheroo,
    /// Print one line per change of the GPU state, for status bars and scripts.
    ///
    /// --waybar: {"text", "tooltip", "class", "alt"} as waybar, i3blocks and
    /// polybar custom modules read them (class/alt: asleep, awake, blocked,
    /// unknown, down). --json: mode, state and each GPU's facts.
    Watch {
        /// waybar/i3blocks/polybar JSON lines.
        #[arg(long, conflicts_with = "json")]
        waybar: bool,
        /// A JSON object per change (the default).
        #[arg(long)]
        json: bool,
    },
    /// Recent wakes of the offload GPUs: who woke each, what they touched,
    /// how long it stayed awake; top wakers and time asleep.
    Wakes {
        /// GPU id or PCI address (default: every offload GPU).
        gpu: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum AppCmd {
    /// Let an executable use the offload GPU whenever it is exec'd.
    Allow {
        path: PathBuf,
        /// GPU id or PCI address (default: every offload GPU).
        #[arg(long)]
        gpu: Option<String>,
    },
    /// Never grant an executable, even when launched with DRI_PRIME.
    ///
    /// A convenience, not a security boundary: it matches the file the
    /// kernel execs, so the program started through the dynamic loader
    /// (`ld.so PROG`) or a copy of the binary is not matched. Use integrated
    /// mode to keep every program off the dGPU.
    Deny { path: PathBuf },
    /// Remove an executable's rule.
    Forget { path: PathBuf },
    /// List the rules.
    List {
        #[arg(long)]
        json: bool,
    },
}

/// `gpuctl get` with nothing else on the command line, which trays and
/// scripts run in loops, is answered without building the command-line
/// parser (clap builds every subcommand's definition first: a large share
/// of the client's own start-up; issue 21). The socket is found as clap
/// finds it (`GPUCTL_SOCKET`, else the default; an empty one is clap's
/// usage error). Anything else, `get --json` included, goes through clap.
fn plain_get() -> Option<u8> {
    let mut args = std::env::args_os();
    args.next()?;
    if args.next()? != "get" || args.next().is_some() {
        return None;
    }
    let socket = match std::env::var_os("GPUCTL_SOCKET") {
        None => PathBuf::from(DEFAULT_SOCKET),
        // clap refuses an empty value (a usage error): let it say so.
        Some(s) if s.is_empty() => return None,
        Some(s) => PathBuf::from(s),
    };
    // SAFETY: as in `main`: one signal's default disposition, no thread yet.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    Some(cli::get(&socket, false))
}

/// The daemon's socket unless `--socket`/`GPUCTL_SOCKET` say otherwise.
const DEFAULT_SOCKET: &str = "/run/gpuctl/gpuctl.sock";

fn main() -> ExitCode {
    if let Some(code) = plain_get() {
        return ExitCode::from(code);
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if !matches!(cli.cmd, Cmd::Daemon { .. }) {
        // A client piped into `head` should end quietly like any Unix tool,
        // not panic on EPIPE. The daemon keeps ignoring SIGPIPE: a client
        // that hangs up must never kill it.
        // SAFETY: restoring the default disposition of one signal before any
        // thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    ExitCode::from(cli::run(cli))
}
