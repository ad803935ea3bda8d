//! Client commands: parse, send one request, print (a table for people,
//! `--json` for scripts). Each returns the process exit status.

pub mod docs;
mod doctor;
mod power;
mod table;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::client::{self, ClientError};
use crate::exit;
use crate::gpu::{self, Roots};
use crate::proto::data::{
    AppChanged, AppsData, AutoData, ConfigData, ConfigOne, GrantData, ListData, ListGpu, ModeData,
    StatusData, WakesData, WhoData, SCHEMA,
};
use crate::proto::event::Event;
use crate::proto::{AppAction, Code, Request, Response};
use crate::{daemon, AppCmd, Cli, Cmd};

/// `gpuctl get`: the mode (and a note when it is not fully in force).
pub fn get(socket: &std::path::Path, json: bool) -> u8 {
    call(socket, &Request::Get {}, json, |d: &ModeData| {
        format!("{}{}", d.mode, note(d))
    })
}

pub fn run(cli: Cli) -> u8 {
    let roots = Roots {
        sysfs: cli.sysfs_root.clone(),
        procfs: cli.procfs_root.clone(),
    };
    match cli.cmd {
        Cmd::Daemon {
            backend,
            cgroup,
            verbose,
            udevd,
            logind,
        } => {
            let opts = daemon::Options {
                roots,
                socket: cli.socket,
                run_root: cli.run_root,
                state_dir: cli.state_dir,
                config: cli.config,
                backend,
                cgroup,
                verbose,
                services: vec![
                    (crate::bpf::Service::Udev, udevd),
                    (crate::bpf::Service::Logind, logind),
                ],
            };
            match daemon::run(opts) {
                Ok(()) => exit::OK,
                Err(e) => {
                    eprintln!("gpuctl: error: {e:#}");
                    if e.downcast_ref::<daemon::Unsupported>().is_some() {
                        exit::UNSUPPORTED
                    } else {
                        exit::ERROR
                    }
                }
            }
        }
        Cmd::List { json } => list(&cli.socket, &roots, json),
        Cmd::Get { json } => get(&cli.socket, json),
        Cmd::Set { mode, force } => call(
            &cli.socket,
            &Request::Set { mode, force },
            false,
            |d: &ModeData| format!("mode {}; {}", d.mode, blocked(d)),
        ),
        Cmd::Block { gpu, force } => call(
            &cli.socket,
            &Request::Block { gpu, force },
            false,
            |d: &ModeData| format!("mode manual; {}", blocked(d)),
        ),
        Cmd::Unblock { gpu } => call(
            &cli.socket,
            &Request::Unblock { gpu },
            false,
            |d: &ModeData| format!("mode manual; {}", blocked(d)),
        ),
        Cmd::Status { json } => call(&cli.socket, &Request::Status {}, json, |d: &StatusData| {
            format!("{}{}", table::status(d), power::status_lines(d))
        }),
        Cmd::Wakes { gpu, json } => call(
            &cli.socket,
            &Request::Wakes { gpu },
            json,
            |d: &WakesData| power::wakes(d),
        ),
        Cmd::Who { gpu, json } => who(&cli.socket, &roots, gpu, json),
        Cmd::Run { gpu, only, command } => run_cmd(&cli.socket, &roots, gpu, only, &command),
        Cmd::App { action } => app(&cli.socket, action),
        Cmd::Events { json } => events(&cli.socket, json),
        Cmd::Auto { action, json } => call(
            &cli.socket,
            &Request::Auto { action },
            json,
            |d: &AutoData| table::auto(d),
        ),
        Cmd::Tray => crate::desktop::tray::run(&cli.socket),
        Cmd::Switcheroo => crate::desktop::switcheroo::run(&cli.socket),
        Cmd::Watch { waybar, json: _ } => crate::desktop::watch::run(
            &cli.socket,
            if waybar {
                crate::desktop::watch::Format::Waybar
            } else {
                crate::desktop::watch::Format::Json
            },
        ),
        Cmd::Doctor => doctor::run(&cli.socket, &roots),
        Cmd::PoweroffRestore => {
            let path = cli.state_dir.join(daemon::poweroff::RECORD_FILE);
            let lines = daemon::poweroff::restore_file(&roots.sysfs, &path);
            for l in &lines {
                println!("{l}");
            }
            exit::OK
        }
        Cmd::Completions { shell } => {
            match docs::completions(&<Cli as clap::CommandFactory>::command(), shell) {
                Ok(()) => exit::OK,
                Err(e) => {
                    eprintln!("gpuctl: writing the completion script: {e}");
                    exit::ERROR
                }
            }
        }
        Cmd::Manpage => {
            use std::io::Write;
            let page = docs::manpage(&<Cli as clap::CommandFactory>::command());
            match std::io::stdout().write_all(page.as_bytes()) {
                Ok(()) => exit::OK,
                Err(e) => {
                    eprintln!("gpuctl: writing the man page: {e}");
                    exit::ERROR
                }
            }
        }
        Cmd::Config { key, value, json } => config_cmd(&cli.socket, &cli.config, key, value, json),
    }
}

/// `gpuctl run`: get a grant for this very process (smart mode), then exec
/// the command with the GPU's offload environment. The grant survives the
/// exec and reaches every descendant.
fn run_cmd(
    socket: &std::path::Path,
    roots: &Roots,
    gpu: Option<String>,
    only: bool,
    command: &[String],
) -> u8 {
    use std::os::unix::process::CommandExt;
    let req = Request::Grant {
        gpu: gpu.clone(),
        only,
    };
    let env: Vec<(String, String)> = match client::request(socket, &req) {
        Ok(resp) if resp.ok => {
            let data: Option<GrantData> = resp.parse().ok();
            match data.map(|d| (d.gpu, d.env)).unwrap_or_default() {
                // The daemon knows every GPU (the NVIDIA provider needs them).
                (Some(_), Some(env)) => env.0,
                (Some(g), None) => owned(g.offload_env(&gpu::Inventory {
                    gpus: vec![g.clone()],
                    ..Default::default()
                })),
                (None, _) => {
                    eprintln!("gpuctl: the daemon's answer names no GPU");
                    return exit::ERROR;
                }
            }
        }
        Ok(resp) => return report(&resp),
        Err(ClientError::NotRunning(_)) => {
            // No daemon: nothing is blocked, so the environment alone does it.
            let inv = match local_inventory(roots) {
                Ok(i) => i,
                Err(code) => return code,
            };
            match inv.run_target(gpu.as_deref()) {
                Ok(g) => owned(g.offload_env(&inv)),
                Err(e) => {
                    eprintln!("gpuctl: {e}");
                    return exit::USAGE;
                }
            }
        }
        Err(e) => return client_error(&e),
    };
    let err = std::process::Command::new(&command[0])
        .args(&command[1..])
        .envs(env)
        .exec();
    eprintln!("gpuctl: cannot run {}: {err}", command[0]);
    if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

fn owned(env: Vec<(&'static str, String)>) -> Vec<(String, String)> {
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn app(socket: &std::path::Path, action: AppCmd) -> u8 {
    // The daemon resolves paths from its own working directory: send
    // absolute ones.
    let abs = |p: &std::path::Path| {
        std::fs::canonicalize(p)
            .or_else(|_| std::env::current_dir().map(|d| d.join(p)))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| p.to_string_lossy().into_owned())
    };
    let (act, path, gpu, json) = match &action {
        AppCmd::Allow { path, gpu } => (AppAction::Allow, Some(abs(path)), gpu.clone(), false),
        AppCmd::Deny { path } => (AppAction::Deny, Some(abs(path)), None, false),
        AppCmd::Forget { path } => (AppAction::Forget, Some(abs(path)), None, false),
        AppCmd::List { json } => (AppAction::List, None, None, *json),
    };
    let verb = match action {
        AppCmd::Allow { .. } => "allowed",
        AppCmd::Deny { .. } => "denied",
        AppCmd::Forget { .. } => "forgot",
        AppCmd::List { .. } => "",
    };
    let answer = client::app(socket, act, path, gpu);
    if verb.is_empty() {
        return shown(answer, json, |d: &AppsData| table::apps(&d.apps));
    }
    shown(answer, json, |d: &AppChanged| {
        let mut out = format!("{verb} {}", d.path);
        if let Some(n) = &d.note {
            out.push_str(&format!("\nnote: {n}"));
        }
        out
    })
}

fn config_cmd(
    socket: &std::path::Path,
    file: &std::path::Path,
    key: Option<String>,
    value: Option<String>,
    as_json: bool,
) -> u8 {
    let show = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let req = Request::Config {
        key: key.clone(),
        value: value.clone(),
    };
    let raw = match client::request(socket, &req) {
        Ok(resp) if resp.ok => resp.data.unwrap_or(Value::Null),
        Ok(resp) => return report(&resp),
        Err(ClientError::NotRunning(_)) if value.is_none() => {
            // Reading works without the daemon: the file as it would load.
            let (cfg, warn) = daemon::config::load(file);
            if let Some(w) = warn {
                eprintln!("gpuctl: {w}");
            }
            let all = cfg.to_json();
            let data = match &key {
                None => ConfigData::All {
                    path: file.to_path_buf(),
                    config: all,
                },
                Some(k) => match all.get(k) {
                    Some(v) => ConfigData::One(ConfigOne {
                        key: k.clone(),
                        value: v.clone(),
                    }),
                    None => {
                        eprintln!("gpuctl: unknown key {k:?}");
                        return exit::USAGE;
                    }
                },
            };
            serde_json::to_value(&data).unwrap_or(Value::Null)
        }
        Err(e) => return client_error(&e),
    };
    if as_json {
        print_json(&raw);
        return exit::OK;
    }
    let data: ConfigData = match serde_json::from_value(raw) {
        Ok(d) => d,
        Err(e) => return not_understood(&format!("the daemon's answer is not understood: {e}")),
    };
    let null = Value::Null;
    let (k, v) = (
        data.key().map_or(null.clone(), |k| Value::String(k.into())),
        data.value().unwrap_or(&null),
    );
    if let ConfigData::All { config, .. } = &data {
        for (k, v) in config {
            println!("{k} = {}", show(v));
        }
    } else {
        match (&value, data.note()) {
            (Some(_), Some(n)) => println!("{} = {} ({n})", show(&k), show(v)),
            (Some(_), None) => println!("{} = {}", show(&k), show(v)),
            (None, _) => println!("{}", show(v)),
        }
    }
    exit::OK
}

/// Streams denial events until the daemon goes away or the user stops it.
fn events(socket: &std::path::Path, json: bool) -> u8 {
    let mut first = true;
    let res = client::stream(socket, &Request::Events {}, |v| {
        if first {
            first = false;
            client::refusal(v)?;
            if !json {
                println!("{}", table::event_header());
            }
            return Ok(());
        }
        if json {
            // Scripts get the line as the daemon sent it.
            println!("{v}");
            return Ok(());
        }
        match serde_json::from_value::<Event>(v.clone()) {
            Ok(Event::Denied(d)) => println!("{}", table::event(&d)),
            // One line per event: nothing in it may act on the terminal.
            Ok(e) => println!("{}", crate::text::human(&power::event_line(&e, v))),
            Err(_) => println!("{v}"),
        }
        Ok(())
    });
    match res {
        Ok(()) => exit::OK,
        Err(e) => client_error(&e),
    }
}

/// Discovery in the client itself (no daemon); on failure, the message is
/// printed and the exit status returned.
fn local_inventory(roots: &Roots) -> Result<gpu::Inventory, u8> {
    gpu::discover(roots).map_err(|e| {
        eprintln!("gpuctl: {e:#}");
        exit::ERROR
    })
}

fn note(d: &ModeData) -> String {
    match &d.note {
        Some(n) => format!(" (not fully in force: {n})"),
        None => String::new(),
    }
}

fn blocked(d: &ModeData) -> String {
    let ids: Vec<String> = d.blocked.iter().map(|v| format!("GPU {v}")).collect();
    if ids.is_empty() {
        "nothing blocked".to_string()
    } else {
        format!("blocked: {}", ids.join(", "))
    }
}

/// Exit status for an error response.
fn exit_for(code: Code) -> u8 {
    match code {
        Code::BadRequest | Code::UnknownGpu | Code::UnsupportedVersion => exit::USAGE,
        Code::Refused => exit::REFUSED,
        Code::PermissionDenied => exit::DENIED,
        Code::Busy => exit::BUSY,
        Code::TooLarge | Code::Timeout | Code::Internal => exit::ERROR,
    }
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// Prints an error response and returns its exit status.
fn report(resp: &Response) -> u8 {
    match &resp.error {
        Some(e) => {
            eprintln!("gpuctl: {}", e.message);
            exit_for(e.code)
        }
        None => {
            eprintln!("gpuctl: the daemon answered with an error and no reason");
            exit::ERROR
        }
    }
}

fn client_error(e: &ClientError) -> u8 {
    eprintln!("gpuctl: {e}");
    match e {
        ClientError::NotRunning(_) => exit::NOT_RUNNING,
        ClientError::Busy(_) => exit::BUSY,
        ClientError::Io(_) => exit::ERROR,
    }
}

/// An answer this build cannot read (a much older or newer daemon).
fn not_understood(e: &str) -> u8 {
    eprintln!("gpuctl: {e}");
    exit::ERROR
}

/// Sends `req` and prints the answer with `human`, or as JSON (as the
/// daemon sent it: a newer daemon's fields pass through to scripts).
fn call<T: DeserializeOwned>(
    socket: &std::path::Path,
    req: &Request,
    as_json: bool,
    human: impl Fn(&T) -> String,
) -> u8 {
    shown(client::request(socket, req), as_json, human)
}

/// Prints an answer (its JSON, or `human` of its data) or why there is none.
fn shown<T: DeserializeOwned>(
    answer: Result<Response, ClientError>,
    as_json: bool,
    human: impl Fn(&T) -> String,
) -> u8 {
    match answer {
        Ok(resp) if resp.ok => {
            if as_json {
                print_json(resp.data.as_ref().unwrap_or(&Value::Null));
                return exit::OK;
            }
            match resp.parse::<T>() {
                Ok(d) => println!("{}", human(&d)),
                Err(e) => return not_understood(&e),
            }
            exit::OK
        }
        Ok(resp) => report(&resp),
        Err(e) => client_error(&e),
    }
}

fn list(socket: &std::path::Path, roots: &Roots, as_json: bool) -> u8 {
    let raw = match client::request(socket, &Request::List {}) {
        Ok(resp) if resp.ok => resp.data.unwrap_or(Value::Null),
        Ok(resp) => return report(&resp),
        // No daemon: the hardware facts alone; mode, backend and blocked
        // are unknown (null).
        Err(ClientError::NotRunning(_)) => match local_inventory(roots) {
            Ok(inv) => {
                let d = ListData {
                    schema: SCHEMA,
                    mode: None,
                    backend: None,
                    gpus: inv
                        .gpus
                        .into_iter()
                        .map(|gpu| ListGpu {
                            gpu,
                            runtime_pm: None,
                            power_off: None,
                        })
                        .collect(),
                };
                serde_json::to_value(&d).unwrap_or(Value::Null)
            }
            Err(code) => return code,
        },
        Err(e) => return client_error(&e),
    };
    if as_json {
        print_json(&raw);
    } else {
        let data: ListData = match serde_json::from_value(raw) {
            Ok(d) => d,
            Err(e) => {
                return not_understood(&format!("the daemon's answer is not understood: {e}"))
            }
        };
        print!("{}", table::list(&data));
        print!("{}", power::list_notes(&data));
    }
    exit::OK
}

fn who(socket: &std::path::Path, roots: &Roots, gpu: Option<String>, as_json: bool) -> u8 {
    let raw = match client::request(socket, &Request::Who { gpu: gpu.clone() }) {
        Ok(resp) if resp.ok => resp.data.unwrap_or(Value::Null),
        Ok(resp) => return report(&resp),
        Err(ClientError::NotRunning(_)) => {
            // Without the daemon, look ourselves (an unprivileged user sees
            // only their own processes).
            let inv = match local_inventory(roots) {
                Ok(i) => i,
                Err(code) => return code,
            };
            match crate::procs::holders_of(&inv, &roots.procfs, gpu.as_deref()) {
                Ok(holders) => {
                    let d = WhoData {
                        holders,
                        hidden: None,
                        age_ms: None,
                    };
                    serde_json::to_value(&d).unwrap_or(Value::Null)
                }
                Err(e) => {
                    eprintln!("gpuctl: {e}");
                    return exit::USAGE;
                }
            }
        }
        Err(e) => return client_error(&e),
    };
    if as_json {
        print_json(&raw);
    } else {
        let data: WhoData = match serde_json::from_value(raw) {
            Ok(d) => d,
            Err(e) => {
                return not_understood(&format!("the daemon's answer is not understood: {e}"))
            }
        };
        print!("{}", table::who(&data));
    }
    exit::OK
}
