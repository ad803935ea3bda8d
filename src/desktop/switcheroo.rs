//! `gpuctl switcheroo`: `net.hadess.SwitcherooControl` on the system bus,
//! the service GNOME Shell, KDE Plasma and `switcherooctl` read to offer
//! "Launch using Discrete Graphics Card" (and to honour
//! `PrefersNonDefaultGPU=true`). Its own process and a plain client of the
//! daemon (`list`, `status`, the `events` stream): the daemon stays free
//! of D-Bus. What it offers is `offers::offers`; it follows the daemon's
//! events and emits `PropertiesChanged` when the offer changes.
//!
//! Coexistence: the name is asked for without queueing. When another
//! process (the real switcheroo-control) owns it, this one says so and
//! exits 0, leaving it be; once this one owns it, the real one's start
//! fails ("cannot own its D-Bus name"). The unit orders this one after
//! switcheroo-control.service, so with both enabled the real one wins.

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use zbus::zvariant::{OwnedValue, Value};

use super::follow::{self, Msg};
use super::offers::{offers, Offer};
use crate::client;
use crate::exit;
use crate::proto::data::{ListData, StatusData};
use crate::proto::Request;

pub const NAME: &str = "net.hadess.SwitcherooControl";
pub const PATH: &str = "/net/hadess/SwitcherooControl";

/// How long the first answer from the daemon is waited for before the
/// name is taken anyway (KDE reads the service once per process: better a
/// short wait at boot than an empty answer cached for the session).
const FIRST_WAIT: Duration = Duration::from_secs(5);

type Shared = Arc<Mutex<Vec<Offer>>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Vec<Offer>> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn value(v: Value<'_>) -> OwnedValue {
    // Only fd values fail to convert; none are used here.
    v.try_to_owned().unwrap_or_else(|_| OwnedValue::from(false))
}

fn gpus_value(offers: &[Offer]) -> Vec<HashMap<String, OwnedValue>> {
    offers
        .iter()
        .map(|o| {
            let mut m = HashMap::new();
            m.insert("Name".to_string(), value(Value::from(o.name.clone())));
            m.insert(
                "Environment".to_string(),
                value(Value::from(o.environment.clone())),
            );
            m.insert("Default".to_string(), value(Value::from(o.default)));
            m.insert("Discrete".to_string(), value(Value::from(o.discrete)));
            m
        })
        .collect()
}

struct Control {
    offers: Shared,
}

#[zbus::interface(name = "net.hadess.SwitcherooControl")]
impl Control {
    #[zbus(property(emits_changed_signal = "false"), name = "HasDualGpu")]
    fn has_dual_gpu(&self) -> bool {
        lock(&self.offers).len() >= 2
    }
    #[zbus(property(emits_changed_signal = "false"), name = "NumGPUs")]
    fn num_gpus(&self) -> u32 {
        u32::try_from(lock(&self.offers).len()).unwrap_or(u32::MAX)
    }
    #[zbus(property(emits_changed_signal = "false"), name = "GPUs")]
    fn gpus(&self) -> Vec<HashMap<String, OwnedValue>> {
        gpus_value(&lock(&self.offers))
    }
}

/// The daemon's current offer, or why there is none.
fn fetch(socket: &Path) -> Result<Vec<Offer>, String> {
    let status: StatusData = match client::request(socket, &Request::Status {}) {
        Ok(r) if r.ok => r.parse()?,
        Ok(r) => {
            return Err(r
                .error
                .map_or("the daemon refused `status`".into(), |e| e.message))
        }
        Err(e) => return Err(e.to_string()),
    };
    let list: ListData = match client::request(socket, &Request::List {}) {
        Ok(r) if r.ok => r.parse()?,
        Ok(r) => {
            return Err(r
                .error
                .map_or("the daemon refused `list`".into(), |e| e.message))
        }
        Err(e) => return Err(e.to_string()),
    };
    Ok(offers(&list, &status))
}

fn connect() -> Result<zbus::blocking::Connection> {
    zbus::blocking::connection::Builder::system()
        .context("no D-Bus system bus")?
        .method_timeout(Duration::from_secs(2))
        .build()
        .context("connecting to the D-Bus system bus")
}

/// `Ok(false)`: another process owns the name.
fn take_name(conn: &zbus::blocking::Connection) -> Result<bool> {
    match conn.request_name_with_flags(NAME, zbus::fdo::RequestNameFlags::DoNotQueue.into()) {
        Ok(zbus::fdo::RequestNameReply::PrimaryOwner)
        | Ok(zbus::fdo::RequestNameReply::AlreadyOwner) => Ok(true),
        Ok(_) | Err(zbus::Error::NameTaken) => Ok(false),
        Err(e) => Err(anyhow::Error::new(e).context(format!(
            "asking the system bus for {NAME} (is gpuctl's D-Bus policy, \
             net.hadess.SwitcherooControl-gpuctl.conf, installed, and do we run as root?)"
        ))),
    }
}

fn owned_elsewhere(conn: &zbus::blocking::Connection) -> Result<bool> {
    let proxy = zbus::blocking::fdo::DBusProxy::new(conn).context("the bus's own proxy")?;
    let name = zbus::names::BusName::try_from(NAME).context("the service name")?;
    proxy
        .name_has_owner(name)
        .context("asking the system bus who owns net.hadess.SwitcherooControl")
}

const ELSEWHERE: &str = "gpuctl switcheroo: net.hadess.SwitcherooControl is owned by another \
     process (switcheroo-control?); leaving it be. Desktops then offer the discrete GPU \
     even where gpuctl blocks it: `systemctl disable --now switcheroo-control` and \
     `systemctl enable --now gpuctl-switcheroo` to use gpuctl's";

pub fn run(socket: &Path) -> u8 {
    match serve(socket) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuctl switcheroo: {e:#}");
            exit::ERROR
        }
    }
}

fn serve(socket: &Path) -> Result<u8> {
    let conn = connect()?;
    if owned_elsewhere(&conn)? {
        eprintln!("{ELSEWHERE}");
        return Ok(exit::OK);
    }
    let shared: Shared = Arc::default();
    conn.object_server()
        .at(
            PATH,
            Control {
                offers: shared.clone(),
            },
        )
        .context("serving /net/hadess/SwitcherooControl")?;
    let (tx, rx) = mpsc::channel();
    follow::spawn(socket.to_path_buf(), tx);

    // The first answer, then the name.
    let until = Instant::now() + FIRST_WAIT;
    loop {
        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(Msg::Up) => {
                match fetch(socket) {
                    Ok(o) => *lock(&shared) = o,
                    Err(why) => eprintln!("gpuctl switcheroo: {why}"),
                }
                break;
            }
            Ok(Msg::Down(why)) => eprintln!("gpuctl switcheroo: {why}; waiting for the daemon"),
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => break,
            Err(RecvTimeoutError::Disconnected) => return Ok(exit::ERROR),
        }
    }
    if !take_name(&conn)? {
        eprintln!("{ELSEWHERE}");
        return Ok(exit::OK);
    }
    eprintln!(
        "gpuctl switcheroo: serving {NAME}: {}",
        describe(&lock(&shared))
    );
    loop {
        let Ok(first) = rx.recv() else {
            return Ok(exit::ERROR);
        };
        let mut refresh = false;
        for msg in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match msg {
                Msg::Up | Msg::Event(..) => refresh = true,
                // Nothing is blocked without a daemon, but nothing new is
                // known either: the last offer stays.
                Msg::Down(why) => eprintln!("gpuctl switcheroo: {why}"),
                Msg::Action(_) => {}
            }
        }
        if !refresh {
            continue;
        }
        let new = match fetch(socket) {
            Ok(o) => o,
            Err(why) => {
                eprintln!("gpuctl switcheroo: {why}");
                continue;
            }
        };
        let old = std::mem::replace(&mut *lock(&shared), new.clone());
        if old != new {
            eprintln!("gpuctl switcheroo: now {}", describe(&new));
            changed(&conn, &old, &new);
        }
    }
}

fn describe(o: &[Offer]) -> String {
    if o.is_empty() {
        return "no GPUs known yet".into();
    }
    o.iter()
        .map(|g| g.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `PropertiesChanged` with the new values of the properties that changed.
fn changed(conn: &zbus::blocking::Connection, old: &[Offer], new: &[Offer]) {
    let mut props: HashMap<&str, Value<'_>> = HashMap::new();
    if (old.len() >= 2) != (new.len() >= 2) {
        props.insert("HasDualGpu", Value::from(new.len() >= 2));
    }
    if old.len() != new.len() {
        props.insert(
            "NumGPUs",
            Value::from(u32::try_from(new.len()).unwrap_or(u32::MAX)),
        );
    }
    props.insert("GPUs", Value::from(gpus_value(new)));
    let invalidated: Vec<&str> = Vec::new();
    if let Err(e) = conn.emit_signal(
        None::<()>,
        PATH,
        "org.freedesktop.DBus.Properties",
        "PropertiesChanged",
        &(NAME, props, invalidated),
    ) {
        eprintln!("gpuctl switcheroo: emitting PropertiesChanged: {e}");
    }
}
