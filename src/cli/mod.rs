//! Client commands: parse, send one request, print (a table for people,
//! `--json` for scripts). Each returns the process exit status.

pub mod docs;
mod doctor;
mod power;
mod table;

use serde_json::{json, Value};

use crate::client::{self, ClientError};
use crate::exit;
use crate::gpu::{self, Roots};
use crate::proto::{AppAction, Code, Request, Response};
use crate::{daemon, AppCmd, Cli, Cmd};

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
        } => {
            let opts = daemon::Options {
                roots,
                socket: cli.socket,
                state_dir: cli.state_dir,
                config: cli.config,
                backend,
                cgroup,
                verbose,
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
        Cmd::Get { json } => call(&cli.socket, &Request::Get {}, json, |d| {
            format!("{}{}", d["mode"].as_str().unwrap_or("?"), note(d))
        }),
        Cmd::Set { mode, force } => call(&cli.socket, &Request::Set { mode, force }, false, |d| {
            format!("mode {}; {}", d["mode"].as_str().unwrap_or("?"), blocked(d))
        }),
        Cmd::Block { gpu, force } => {
            call(&cli.socket, &Request::Block { gpu, force }, false, |d| {
                format!("mode manual; {}", blocked(d))
            })
        }
        Cmd::Unblock { gpu } => call(&cli.socket, &Request::Unblock { gpu }, false, |d| {
            format!("mode manual; {}", blocked(d))
        }),
        Cmd::Status { json } => call(&cli.socket, &Request::Status {}, json, |d| {
            format!("{}{}", table::status(d), power::status_lines(d))
        }),
        Cmd::Wakes { gpu, json } => call(&cli.socket, &Request::Wakes { gpu }, json, power::wakes),
        Cmd::Who { gpu, json } => who(&cli.socket, &roots, gpu, json),
        Cmd::Run { gpu, only, command } => run_cmd(&cli.socket, &roots, gpu, only, &command),
        Cmd::App { action } => app(&cli.socket, action),
        Cmd::Events { json } => events(&cli.socket, json),
        Cmd::Auto { action, json } => {
            call(&cli.socket, &Request::Auto { action }, json, table::auto)
        }
        Cmd::Tray => crate::desktop::tray::run(&cli.socket),
        Cmd::Watch { waybar, json: _ } => crate::desktop::watch::run(
            &cli.socket,
            if waybar {
                crate::desktop::watch::Format::Waybar
            } else {
                crate::desktop::watch::Format::Json
            },
        ),
        Cmd::Doctor => doctor::run(&cli.socket, &roots),
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
            let data = resp.data.unwrap_or_default();
            let target: Option<gpu::Gpu> = serde_json::from_value(data["gpu"].clone()).ok();
            match (target, data["env"].as_object()) {
                // The daemon knows every GPU (the NVIDIA provider needs them).
                (Some(_), Some(env)) => env
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect(),
                (Some(g), None) => owned(g.offload_env(&gpu::Inventory {
                    gpus: vec![g.clone()],
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
    let req = Request::App {
        action: act,
        path,
        gpu,
    };
    let verb = match action {
        AppCmd::Allow { .. } => "allowed",
        AppCmd::Deny { .. } => "denied",
        AppCmd::Forget { .. } => "forgot",
        AppCmd::List { .. } => "",
    };
    call(socket, &req, json, |d| {
        if let Some(apps) = d["apps"].as_array() {
            return table::apps(apps);
        }
        let mut out = format!("{verb} {}", d["path"].as_str().unwrap_or("?"));
        if let Some(n) = d["note"].as_str() {
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
    let data = match client::request(socket, &req) {
        Ok(resp) if resp.ok => resp.data.unwrap_or(Value::Null),
        Ok(resp) => return report(&resp),
        Err(ClientError::NotRunning(_)) if value.is_none() => {
            // Reading works without the daemon: the file as it would load.
            let (cfg, warn) = daemon::config::load(file);
            if let Some(w) = warn {
                eprintln!("gpuctl: {w}");
            }
            let all = cfg.to_json();
            match &key {
                None => json!({ "path": file, "config": all }),
                Some(k) => match all.get(k) {
                    Some(v) => json!({ "key": k, "value": v }),
                    None => {
                        eprintln!("gpuctl: unknown key {k:?}");
                        return exit::USAGE;
                    }
                },
            }
        }
        Err(e) => return client_error(&e),
    };
    if as_json {
        print_json(&data);
    } else if let Some(all) = data["config"].as_object() {
        for (k, v) in all {
            println!("{k} = {}", show(v));
        }
    } else {
        match (&value, data["note"].as_str()) {
            (Some(_), Some(n)) => {
                println!("{} = {} ({n})", show(&data["key"]), show(&data["value"]))
            }
            (Some(_), None) => println!("{} = {}", show(&data["key"]), show(&data["value"])),
            (None, _) => println!("{}", show(&data["value"])),
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
            if v["ok"] == false {
                return Err(v.clone());
            }
            if !json {
                println!("{}", table::event_header());
            }
            return Ok(());
        }
        if json {
            println!("{v}");
        } else if v["event"] == "denied" {
            println!("{}", table::event(v));
        } else {
            println!("{}", power::event_line(v));
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

fn note(d: &Value) -> String {
    match d["note"].as_str() {
        Some(n) => format!(" (not fully in force: {n})"),
        None => String::new(),
    }
}

fn blocked(d: &Value) -> String {
    let ids: Vec<String> = d["blocked"]
        .as_array()
        .map(|a| a.iter().map(|v| format!("GPU {v}")).collect())
        .unwrap_or_default();
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

/// Sends `req` and prints the answer with `human`, or as JSON.
fn call(
    socket: &std::path::Path,
    req: &Request,
    as_json: bool,
    human: impl Fn(&Value) -> String,
) -> u8 {
    match client::request(socket, req) {
        Ok(resp) if resp.ok => {
            let data = resp.data.unwrap_or(Value::Null);
            if as_json {
                print_json(&data);
            } else {
                println!("{}", human(&data));
            }
            exit::OK
        }
        Ok(resp) => report(&resp),
        Err(e) => client_error(&e),
    }
}

fn list(socket: &std::path::Path, roots: &Roots, as_json: bool) -> u8 {
    let data = match client::request(socket, &Request::List {}) {
        Ok(resp) if resp.ok => resp.data.unwrap_or(Value::Null),
        Ok(resp) => return report(&resp),
        // No daemon: the hardware facts alone; mode, backend and blocked
        // are unknown (null).
        Err(ClientError::NotRunning(_)) => match local_inventory(roots) {
            Ok(inv) => json!({"schema": 1, "mode": null, "backend": null, "gpus": inv.gpus}),
            Err(code) => return code,
        },
        Err(e) => return client_error(&e),
    };
    if as_json {
        print_json(&data);
    } else {
        print!("{}", table::list(&data));
        print!("{}", power::list_notes(&data));
    }
    exit::OK
}

fn who(socket: &std::path::Path, roots: &Roots, gpu: Option<String>, as_json: bool) -> u8 {
    let data = match client::request(socket, &Request::Who { gpu: gpu.clone() }) {
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
                Ok(h) => json!({ "holders": h }),
                Err(e) => {
                    eprintln!("gpuctl: {e}");
                    return exit::USAGE;
                }
            }
        }
        Err(e) => return client_error(&e),
    };
    if as_json {
        print_json(&data);
    } else {
        print!("{}", table::who(&data));
    }
    exit::OK
}
