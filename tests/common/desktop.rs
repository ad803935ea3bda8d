#![allow(dead_code)] // each test file uses a part of the kit
//! Desktop test kit: a private `dbus-daemon --session`, a test
//! StatusNotifierWatcher and notification server (written here, on zbus),
//! proxies to read the tray's item and menu, and a scripted protocol peer
//! ("fixture daemon") for events the real daemon cannot produce on this
//! machine (runtime-PM transitions of a fixture GPU) and for restarts.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use zbus::zvariant::{OwnedValue, Value as DValue};

pub const BIN: &str = env!("CARGO_BIN_EXE_gpuctl");

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("gpuctl-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `prog` is on PATH; says loudly (fd 2) when it is not.
pub fn have(prog: &str, test: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false);
    if !found {
        let _ = std::io::stderr().write_all(
            format!("SKIPPED {test}: `{prog}` is not installed (make deps installs it)\n")
                .as_bytes(),
        );
    }
    found
}

/// A private session bus. Any uid may connect (the tray may run as another
/// user than the test).
pub struct Bus {
    pub address: String,
    child: Child,
    _dir: Scratch,
}

impl Bus {
    /// A private session bus where anyone may own anything.
    pub fn start() -> Bus {
        Bus::launch(
            "bus",
            "bus",
            r#"  <type>session</type>
  <policy context="default">
    <allow user="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
"#,
        )
    }

    /// A private bus configured as a system bus (`<type>system</type>`,
    /// owning names denied by default) with gpuctl's packaged D-Bus policy
    /// for net.hadess.SwitcherooControl included: only what that file
    /// allows may own the name.
    pub fn start_system() -> Bus {
        let policy = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("packaging/dbus/net.hadess.SwitcherooControl-gpuctl.conf");
        Bus::launch(
            "sysbus",
            "system_bus_socket",
            &format!(
                r#"  <type>system</type>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus"/>
  </policy>
  <include>{}</include>
"#,
                policy.display()
            ),
        )
    }

    /// dbus-daemon with BODY (type and policy) listening on SOCKET in a
    /// scratch directory named after TAG.
    fn launch(tag: &str, socket: &str, body: &str) -> Bus {
        let dir = Scratch::new(tag);
        let conf = dir.0.join("bus.conf");
        std::fs::write(
            &conf,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>unix:path={}/{socket}</listen>
  <auth>EXTERNAL</auth>
{body}</busconfig>
"#,
                dir.0.display()
            ),
        )
        .unwrap();
        set_mode(&dir.0, 0o755);
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .args(["--nofork", "--print-address=1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting dbus-daemon");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("unix:"), "dbus-daemon said {line:?}");
        Bus {
            address: line.trim().to_string(),
            child,
            _dir: dir,
        }
    }

    pub fn connect(&self) -> zbus::blocking::Connection {
        zbus::blocking::connection::Builder::address(self.address.as_str())
            .unwrap()
            .build()
            .unwrap()
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The test StatusNotifierWatcher: records each registration.
pub struct Watcher {
    pub items: Arc<Mutex<Vec<String>>>,
}

#[zbus::interface(name = "org.kde.StatusNotifierWatcher")]
impl Watcher {
    fn register_status_notifier_item(&self, service: &str) {
        self.items.lock().unwrap().push(service.to_string());
    }
    fn register_status_notifier_host(&self, _service: &str) {}
    #[zbus(property)]
    fn registered_status_notifier_items(&self) -> Vec<String> {
        self.items.lock().unwrap().clone()
    }
    #[zbus(property)]
    fn is_status_notifier_host_registered(&self) -> bool {
        true
    }
    #[zbus(property)]
    fn protocol_version(&self) -> i32 {
        0
    }
}

#[derive(Clone, Debug)]
pub struct Notification {
    pub replaces: u32,
    pub summary: String,
    pub body: String,
    pub at: Instant,
}

/// The test notification server: records each Notify.
pub struct Notifications {
    pub got: Arc<Mutex<Vec<Notification>>>,
}

#[zbus::interface(name = "org.freedesktop.Notifications")]
impl Notifications {
    #[allow(clippy::too_many_arguments)]
    fn notify(
        &self,
        _app_name: &str,
        replaces_id: u32,
        _app_icon: &str,
        summary: &str,
        body: &str,
        _actions: Vec<String>,
        _hints: HashMap<String, OwnedValue>,
        _expire_timeout: i32,
    ) -> u32 {
        let mut g = self.got.lock().unwrap();
        g.push(Notification {
            replaces: replaces_id,
            summary: summary.into(),
            body: body.into(),
            at: Instant::now(),
        });
        g.len() as u32
    }
    fn get_capabilities(&self) -> Vec<String> {
        vec!["body".into()]
    }
    fn get_server_information(&self) -> (String, String, String, String) {
        ("test".into(), "gpuctl".into(), "0".into(), "1.2".into())
    }
    fn close_notification(&self, _id: u32) {}
}

/// The desktop side of a session: watcher and notification server on `bus`.
pub struct Session {
    pub conn: zbus::blocking::Connection,
    pub items: Arc<Mutex<Vec<String>>>,
    pub notes: Arc<Mutex<Vec<Notification>>>,
}

impl Session {
    pub fn start(bus: &Bus) -> Session {
        let items = Arc::new(Mutex::new(Vec::new()));
        let notes = Arc::new(Mutex::new(Vec::new()));
        let conn = zbus::blocking::connection::Builder::address(bus.address.as_str())
            .unwrap()
            .name("org.kde.StatusNotifierWatcher")
            .unwrap()
            .name("org.freedesktop.Notifications")
            .unwrap()
            .serve_at(
                "/StatusNotifierWatcher",
                Watcher {
                    items: items.clone(),
                },
            )
            .unwrap()
            .serve_at(
                "/org/freedesktop/Notifications",
                Notifications { got: notes.clone() },
            )
            .unwrap()
            .build()
            .unwrap();
        Session { conn, items, notes }
    }

    /// Proxies to the tray registered as `name`: its StatusNotifierItem and its
    /// dbusmenu, uncached (every read asks the tray).
    pub fn tray_proxies(
        &self,
        name: &str,
    ) -> (ItemProxyBlocking<'static>, MenuProxyBlocking<'static>) {
        let item = ItemProxyBlocking::builder(&self.conn)
            .destination(name.to_string())
            .unwrap()
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .unwrap();
        let menu = MenuProxyBlocking::builder(&self.conn)
            .destination(name.to_string())
            .unwrap()
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .unwrap();
        (item, menu)
    }

    pub fn notes(&self) -> Vec<Notification> {
        self.notes.lock().unwrap().clone()
    }

    /// Waits until `f` holds of the notifications received.
    pub fn wait_notes(&self, what: &str, f: impl Fn(&[Notification]) -> bool) -> Vec<Notification> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n = self.notes();
            if f(&n) {
                return n;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; got {n:#?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// SNI `ToolTip`: icon name, icon pixmaps, title, body.
pub type ToolTip = (String, Vec<(i32, i32, Vec<u8>)>, String, String);
/// dbusmenu layout node: id, properties, children (each a variant node).
pub type MenuNode = (i32, HashMap<String, OwnedValue>, Vec<OwnedValue>);

#[zbus::proxy(
    interface = "org.kde.StatusNotifierItem",
    default_path = "/StatusNotifierItem"
)]
pub trait Item {
    #[zbus(property)]
    fn icon_pixmap(&self) -> zbus::Result<Vec<(i32, i32, Vec<u8>)>>;
    #[zbus(property)]
    fn title(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn tool_tip(&self) -> zbus::Result<ToolTip>;
    #[zbus(property)]
    fn menu(&self) -> zbus::Result<zbus::zvariant::OwnedObjectPath>;
    #[zbus(property)]
    fn item_is_menu(&self) -> zbus::Result<bool>;
    #[zbus(property)]
    fn category(&self) -> zbus::Result<String>;
}

#[zbus::proxy(interface = "com.canonical.dbusmenu", default_path = "/MenuBar")]
pub trait Menu {
    fn get_layout(
        &self,
        parent_id: i32,
        recursion_depth: i32,
        property_names: &[&str],
    ) -> zbus::Result<(u32, MenuNode)>;
    fn event(&self, id: i32, event_id: &str, data: &DValue<'_>, timestamp: u32)
        -> zbus::Result<()>;
}

/// One menu entry as a host sees it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub id: i32,
    /// 0 for top-level entries, 1 inside a submenu, …
    pub depth: usize,
    pub label: String,
    pub enabled: bool,
    pub toggle: Option<i32>,
    pub separator: bool,
}

fn entry(id: i32, depth: usize, props: &HashMap<String, OwnedValue>) -> Entry {
    let s = |k: &str| {
        props
            .get(k)
            .and_then(|v| String::try_from(v.try_clone().ok()?).ok())
    };
    Entry {
        id,
        depth,
        label: s("label").unwrap_or_default().replace("__", "_"),
        enabled: props
            .get("enabled")
            .and_then(|v| bool::try_from(v).ok())
            .unwrap_or(true),
        toggle: props
            .get("toggle-state")
            .and_then(|v| i32::try_from(v).ok()),
        separator: s("type").as_deref() == Some("separator"),
    }
}

fn walk(v: &DValue<'_>, depth: usize, out: &mut Vec<Entry>) {
    let DValue::Structure(s) = v else {
        panic!("menu child is not a structure: {v:?}")
    };
    let f = s.fields();
    let DValue::I32(id) = f[0] else {
        panic!("bad id")
    };
    let props: HashMap<String, OwnedValue> = HashMap::try_from(f[1].try_clone().unwrap()).unwrap();
    out.push(entry(id, depth, &props));
    if let DValue::Array(a) = &f[2] {
        for c in a.iter() {
            let inner = match c {
                DValue::Value(b) => &**b,
                other => other,
            };
            walk(inner, depth + 1, out);
        }
    }
}

/// The whole menu, flattened in order (the root is not listed).
pub fn menu_entries(menu: &MenuProxyBlocking<'_>) -> (u32, Vec<Entry>) {
    let (rev, (_, _, children)) = menu.get_layout(0, -1, &[]).unwrap();
    let mut out = Vec::new();
    for c in &children {
        walk(&DValue::from(c.try_clone().unwrap()), 0, &mut out);
    }
    (rev, out)
}

pub fn click(menu: &MenuProxyBlocking<'_>, id: i32) {
    menu.event(id, "clicked", &DValue::from(0i32), 0).unwrap();
}

/// Signals the tray emits on its item object, with their arrival time.
pub fn item_signals(
    conn: &zbus::blocking::Connection,
    sender: &str,
) -> Receiver<(String, Instant)> {
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(sender.to_string())
        .unwrap()
        .path("/StatusNotifierItem")
        .unwrap()
        .build();
    let it = zbus::blocking::MessageIterator::for_match_rule(rule, conn, Some(64)).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for m in it.flatten() {
            let member = m
                .header()
                .member()
                .map(|m| m.to_string())
                .unwrap_or_default();
            if tx.send((member, Instant::now())).is_err() {
                return;
            }
        }
    });
    rx
}

/// A child process killed on drop (a failed test leaves nothing behind).
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpuctl tray`, killed on drop.
pub struct Tray {
    pub child: Child,
    pub name: String,
    log: Option<std::thread::JoinHandle<String>>,
}

impl Tray {
    pub fn start(bus: &Bus, socket: &Path, desktop_config: &Path, uid: Option<u32>) -> Tray {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(BIN);
        cmd.arg("tray")
            .env("DBUS_SESSION_BUS_ADDRESS", &bus.address)
            .env("GPUCTL_SOCKET", socket)
            .env("GPUCTL_DESKTOP_CONFIG", desktop_config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(u) = uid {
            cmd.uid(u).gid(u);
        }
        let mut child = cmd.spawn().unwrap();
        let mut err = child.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let name = format!("org.kde.StatusNotifierItem-{}-1", child.id());
        Tray {
            child,
            name,
            log: Some(log),
        }
    }

    pub fn stop(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Tray {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `f` (test side only) until it returns Some, or panics with `what`.
pub fn wait_for<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for the first signal named `member`; returns its arrival time.
pub fn next_signal(rx: &Receiver<(String, Instant)>, member: &str) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((m, t)) if m == member => return t,
            Ok(_) => {}
            Err(e) => panic!("no {member} signal: {e}"),
        }
    }
}

pub fn drain(rx: &Receiver<(String, Instant)>) {
    while rx.try_recv().is_ok() {}
}

/// A scripted daemon: answers `status`, `who`, `set`, `block`, `unblock`
/// from a status object the test controls, and streams events the test
/// pushes. It speaks the same protocol as `gpuctl daemon`, line for line.
pub struct FakeDaemon {
    pub socket: PathBuf,
    pub status: Arc<Mutex<Value>>,
    pub refuse: Arc<Mutex<Option<(String, String)>>>,
    /// Every request received, in order.
    pub requests: Arc<Mutex<Vec<Value>>>,
    subs: Arc<Mutex<Vec<UnixStream>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub fn laptop_status(mode: &str, blocked: bool, power: (&str, &str)) -> Value {
    json!({
        "schema": 1, "mode": mode, "may_change": true, "note": null,
        "modes": {"hybrid": null, "integrated": null, "smart": null, "manual": null},
        "gpus": [
            {"id": 0, "pci": "0000:00:02.0", "name": "Iris Xe", "default": true,
             "blocked": false, "power_state": "D0", "runtime_status": "active"},
            {"id": 1, "pci": "0000:01:00.0", "name": "RTX 3050", "default": false,
             "blocked": blocked, "power_state": power.0, "runtime_status": power.1},
        ]
    })
}

impl FakeDaemon {
    pub fn start(socket: &Path, status: Value) -> FakeDaemon {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).unwrap();
        set_mode(socket, 0o666);
        listener.set_nonblocking(true).unwrap();
        let status = Arc::new(Mutex::new(status));
        let refuse = Arc::new(Mutex::new(None));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let subs = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, rf, sb, sp) = (status.clone(), refuse.clone(), subs.clone(), stop.clone());
        let rq = requests.clone();
        let thread = std::thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let (st, rf, sb, rq) = (st.clone(), rf.clone(), sb.clone(), rq.clone());
                        std::thread::spawn(move || serve(s, &st, &rf, &sb, &rq));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        FakeDaemon {
            socket: socket.to_path_buf(),
            status,
            refuse,
            requests,
            subs,
            stop,
            thread: Some(thread),
        }
    }

    /// Sends `event` to every subscriber.
    pub fn push(&self, event: Value) {
        push(&self.subs, &event);
    }

    pub fn subscribers(&self) -> usize {
        self.subs.lock().unwrap().len()
    }

    pub fn set_status(&self, v: Value) {
        *self.status.lock().unwrap() = v;
    }

    /// Stops like a daemon that exits: streams closed, socket removed.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let Some(t) = self.thread.take() else {
            return;
        };
        let _ = t.join();
        for s in self.subs.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

fn push(subs: &Mutex<Vec<UnixStream>>, event: &Value) {
    let line = format!("{event}\n");
    subs.lock()
        .unwrap()
        .retain_mut(|s| s.write_all(line.as_bytes()).is_ok());
}

fn serve(
    s: UnixStream,
    status: &Mutex<Value>,
    refuse: &Mutex<Option<(String, String)>>,
    subs: &Mutex<Vec<UnixStream>>,
    requests: &Mutex<Vec<Value>>,
) {
    let mut line = String::new();
    let mut r = BufReader::new(s.try_clone().unwrap());
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let req: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    requests.lock().unwrap().push(req.clone());
    let ok = |data: Value| json!({"ok": true, "proto": 1, "data": data});
    let mut w = s;
    let change = matches!(
        req["type"].as_str(),
        Some("set" | "block" | "unblock" | "app")
    );
    let refused = refuse.lock().unwrap().clone();
    let resp = match (req["type"].as_str(), refused) {
        (Some(_), Some((code, msg))) if change => {
            json!({"ok": false, "proto": 1, "error": {"code": code, "message": msg}})
        }
        (Some("status"), _) => ok(status.lock().unwrap().clone()),
        (Some("app"), _) => ok(json!({"path": req["path"]})),
        (Some("who"), _) => ok(json!({"holders": [], "hidden": 0})),
        (Some("events"), _) => {
            let _ = w.write_all(format!("{}\n", ok(json!({"subscribed": true}))).as_bytes());
            subs.lock().unwrap().push(w);
            return;
        }
        (Some("set"), _) => {
            let mode = req["mode"].as_str().unwrap_or("?").to_string();
            let blocked = mode == "integrated" || mode == "smart";
            {
                let mut st = status.lock().unwrap();
                st["mode"] = json!(mode);
                st["gpus"][1]["blocked"] = json!(blocked);
            }
            let resp = ok(json!({"mode": mode}));
            let _ = w.write_all(format!("{resp}\n").as_bytes());
            push(
                subs,
                &json!({"event": "mode", "mode": mode, "reason": "manual", "detail": "set"}),
            );
            push(
                subs,
                &json!({"event": "blocked", "gpu": 1, "pci": "0000:01:00.0", "blocked": blocked, "reason": "mode", "displays": []}),
            );
            return;
        }
        _ => {
            json!({"ok": false, "proto": 1, "error": {"code": "bad_request", "message": "fixture daemon: unsupported"}})
        }
    };
    let _ = w.write_all(format!("{resp}\n").as_bytes());
}
