//! The tray icon: a StatusNotifierItem (`org.kde.StatusNotifierItem`, what
//! KDE Plasma, waybar and other wlroots bars, XFCE and GNOME's AppIndicator
//! extension host) with its menu over `com.canonical.dbusmenu`. The icon is
//! sent as pixmaps (no theme needed). The session loop (tray.rs) owns the
//! state; these objects read a shared copy and turn clicks into messages.

use std::collections::HashMap;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde::Serialize;
use zbus::zvariant::{ObjectPath, OwnedObjectPath, OwnedValue, Type, Value};

use super::follow::Msg;
use super::model::{Action, Item};
use super::peer::{self, Me};

pub const ITEM_PATH: &str = "/StatusNotifierItem";
pub const MENU_PATH: &str = "/MenuBar";
pub const WATCHER: &str = "org.kde.StatusNotifierWatcher";
/// Held by the session's one tray.
pub const SINGLE: &str = "org.gpuctl.Tray";

pub type Pixmaps = Vec<(i32, i32, Vec<u8>)>;

/// What the item shows now.
#[derive(Clone, Default, PartialEq)]
pub struct Shown {
    pub title: String,
    pub status: String,
    pub pixmaps: Pixmaps,
    pub tip_title: String,
    pub tip_body: String,
    pub menu: Vec<Item>,
    pub revision: u32,
}

type Shared = Arc<Mutex<Shown>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Shown> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

struct ItemObj {
    shown: Shared,
    me: Arc<Me>,
}

#[zbus::interface(name = "org.kde.StatusNotifierItem")]
impl ItemObj {
    #[zbus(property)]
    fn category(&self) -> &str {
        "Hardware"
    }
    #[zbus(property)]
    fn id(&self) -> &str {
        "gpuctl"
    }
    #[zbus(property)]
    fn title(&self) -> String {
        lock(&self.shown).title.clone()
    }
    #[zbus(property)]
    fn status(&self) -> String {
        lock(&self.shown).status.clone()
    }
    #[zbus(property)]
    fn window_id(&self) -> i32 {
        0
    }
    #[zbus(property)]
    fn icon_name(&self) -> &str {
        ""
    }
    #[zbus(property)]
    fn icon_theme_path(&self) -> &str {
        ""
    }
    #[zbus(property)]
    fn icon_pixmap(&self) -> Pixmaps {
        lock(&self.shown).pixmaps.clone()
    }
    #[zbus(property)]
    fn overlay_icon_name(&self) -> &str {
        ""
    }
    #[zbus(property)]
    fn overlay_icon_pixmap(&self) -> Pixmaps {
        Vec::new()
    }
    #[zbus(property)]
    fn attention_icon_name(&self) -> &str {
        ""
    }
    #[zbus(property)]
    fn attention_icon_pixmap(&self) -> Pixmaps {
        Vec::new()
    }
    #[zbus(property)]
    fn attention_movie_name(&self) -> &str {
        ""
    }
    #[zbus(property)]
    fn tool_tip(&self) -> (String, Pixmaps, String, String) {
        let s = lock(&self.shown);
        (
            String::new(),
            Vec::new(),
            s.tip_title.clone(),
            s.tip_body.clone(),
        )
    }
    #[zbus(property)]
    fn item_is_menu(&self) -> bool {
        true
    }
    #[zbus(property)]
    fn menu(&self) -> OwnedObjectPath {
        ObjectPath::from_static_str_unchecked(MENU_PATH).into()
    }
    // A click shows the menu (ItemIsMenu); these exist for hosts that
    // call them anyway. They do nothing, but are methods that act by their
    // kind: answered, like the menu's events, only for the tray's user
    // outside a sandbox (peer.rs).
    async fn activate(
        &self,
        _x: i32,
        _y: i32,
        #[zbus(header)] hdr: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &zbus::Connection,
    ) -> zbus::fdo::Result<()> {
        peer::check(&self.me, conn, &hdr, "Activate").await
    }
    async fn secondary_activate(
        &self,
        _x: i32,
        _y: i32,
        #[zbus(header)] hdr: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &zbus::Connection,
    ) -> zbus::fdo::Result<()> {
        peer::check(&self.me, conn, &hdr, "SecondaryActivate").await
    }
    async fn context_menu(
        &self,
        _x: i32,
        _y: i32,
        #[zbus(header)] hdr: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &zbus::Connection,
    ) -> zbus::fdo::Result<()> {
        peer::check(&self.me, conn, &hdr, "ContextMenu").await
    }
    async fn scroll(
        &self,
        _delta: i32,
        _orientation: &str,
        #[zbus(header)] hdr: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &zbus::Connection,
    ) -> zbus::fdo::Result<()> {
        peer::check(&self.me, conn, &hdr, "Scroll").await
    }
}

/// One dbusmenu node: `(ia{sv}av)`.
#[derive(Serialize, Type, Value, OwnedValue)]
struct Layout {
    id: i32,
    props: HashMap<String, OwnedValue>,
    children: Vec<OwnedValue>,
}

/// The menu as a tree with ids (0 is the root), in menu order.
struct Node {
    id: i32,
    props: HashMap<String, OwnedValue>,
    action: Option<Action>,
    children: Vec<Node>,
}

fn prop(v: Value<'_>) -> OwnedValue {
    // Only fd values fail to convert; none are used here.
    v.try_to_owned().unwrap_or_else(|_| OwnedValue::from(0u8))
}

fn tree(items: &[Item]) -> Node {
    let mut next = 1;
    let children = nodes(items, &mut next);
    let mut props = HashMap::new();
    props.insert("children-display".into(), prop(Value::from("submenu")));
    Node {
        id: 0,
        props,
        action: None,
        children,
    }
}

fn nodes(items: &[Item], next: &mut i32) -> Vec<Node> {
    let mut out = Vec::new();
    for it in items {
        let id = *next;
        *next += 1;
        let mut p: HashMap<String, OwnedValue> = HashMap::new();
        // dbusmenu labels take `_` as the access-key marker.
        let label = |s: &str| prop(Value::from(s.replace('_', "__")));
        let mut action = None;
        let mut children = Vec::new();
        match it {
            Item::Separator => {
                p.insert("type".into(), prop(Value::from("separator")));
            }
            Item::Label(s) => {
                p.insert("label".into(), label(s));
                p.insert("enabled".into(), prop(Value::from(false)));
            }
            Item::Action {
                label: l,
                enabled,
                action: a,
            } => {
                p.insert("label".into(), label(l));
                p.insert("enabled".into(), prop(Value::from(*enabled)));
                action = Some(a.clone());
            }
            Item::Radio {
                label: l,
                on,
                enabled,
                action: a,
            }
            | Item::Check {
                label: l,
                on,
                enabled,
                action: a,
            } => {
                p.insert("label".into(), label(l));
                p.insert("enabled".into(), prop(Value::from(*enabled)));
                let kind = if matches!(it, Item::Radio { .. }) {
                    "radio"
                } else {
                    "checkmark"
                };
                p.insert("toggle-type".into(), prop(Value::from(kind)));
                p.insert("toggle-state".into(), prop(Value::from(i32::from(*on))));
                action = Some(a.clone());
            }
            Item::Submenu { label: l, items } => {
                p.insert("label".into(), label(l));
                p.insert("children-display".into(), prop(Value::from("submenu")));
                children = nodes(items, next);
            }
        }
        out.push(Node {
            id,
            props: p,
            action,
            children,
        });
    }
    out
}

fn find(n: &Node, id: i32) -> Option<&Node> {
    if n.id == id {
        return Some(n);
    }
    n.children.iter().find_map(|c| find(c, id))
}

fn layout(n: &Node, depth: i32) -> Layout {
    let children = if depth == 0 {
        Vec::new()
    } else {
        n.children
            .iter()
            .filter_map(|c| OwnedValue::try_from(layout(c, depth - 1)).ok())
            .collect()
    };
    Layout {
        id: n.id,
        props: n
            .props
            .iter()
            .filter_map(|(k, v)| v.try_clone().ok().map(|v| (k.clone(), v)))
            .collect(),
        children,
    }
}

struct MenuObj {
    shown: Shared,
    tx: Mutex<Sender<Msg>>,
    me: Arc<Me>,
}

impl MenuObj {
    fn click(&self, id: i32, event: &str) {
        if event != "clicked" {
            return;
        }
        let tree = tree(&lock(&self.shown).menu);
        let action = find(&tree, id).and_then(|n| n.action.clone());
        let enabled = find(&tree, id)
            .and_then(|n| n.props.get("enabled"))
            .and_then(|v| bool::try_from(v).ok())
            .unwrap_or(true);
        if let (Some(a), true) = (action, enabled) {
            let _ = self
                .tx
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(Msg::Action(a));
        }
    }
}

#[zbus::interface(name = "com.canonical.dbusmenu")]
impl MenuObj {
    #[zbus(out_args("revision", "layout"))]
    fn get_layout(
        &self,
        parent_id: i32,
        recursion_depth: i32,
        _property_names: Vec<String>,
    ) -> zbus::fdo::Result<(u32, Layout)> {
        let s = lock(&self.shown);
        let tree = tree(&s.menu);
        let node = find(&tree, parent_id)
            .ok_or_else(|| zbus::fdo::Error::InvalidArgs(format!("no menu item {parent_id}")))?;
        Ok((s.revision, layout(node, recursion_depth)))
    }

    fn get_group_properties(
        &self,
        ids: Vec<i32>,
        _property_names: Vec<String>,
    ) -> Vec<(i32, HashMap<String, OwnedValue>)> {
        let tree = tree(&lock(&self.shown).menu);
        ids.iter()
            .filter_map(|id| find(&tree, *id))
            .map(|n| (n.id, layout(n, 0).props))
            .collect()
    }

    fn get_property(&self, id: i32, name: &str) -> zbus::fdo::Result<OwnedValue> {
        let tree = tree(&lock(&self.shown).menu);
        find(&tree, id)
            .and_then(|n| n.props.get(name))
            .and_then(|v| v.try_clone().ok())
            .ok_or_else(|| zbus::fdo::Error::InvalidArgs(format!("no property {name} on {id}")))
    }

    /// A click: acted on only for the tray's user outside a sandbox
    /// (peer.rs); anyone else gets `AccessDenied` and nothing happens.
    async fn event(
        &self,
        id: i32,
        event_id: &str,
        _data: OwnedValue,
        _timestamp: u32,
        #[zbus(header)] hdr: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &zbus::Connection,
    ) -> zbus::fdo::Result<()> {
        peer::check(&self.me, conn, &hdr, "a menu event").await?;
        self.click(id, event_id);
        Ok(())
    }

    async fn event_group(
        &self,
        events: Vec<(i32, String, OwnedValue, u32)>,
        #[zbus(header)] hdr: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &zbus::Connection,
    ) -> zbus::fdo::Result<Vec<i32>> {
        peer::check(&self.me, conn, &hdr, "a menu event group").await?;
        for (id, ev, _, _) in &events {
            self.click(*id, ev);
        }
        Ok(Vec::new())
    }

    fn about_to_show(&self, _id: i32) -> bool {
        false
    }

    fn about_to_show_group(&self, _ids: Vec<i32>) -> (Vec<i32>, Vec<i32>) {
        (Vec::new(), Vec::new())
    }

    #[zbus(property)]
    fn version(&self) -> u32 {
        3
    }
    #[zbus(property)]
    fn text_direction(&self) -> &str {
        "ltr"
    }
    #[zbus(property)]
    fn status(&self) -> &str {
        "normal"
    }
    #[zbus(property)]
    fn icon_theme_path(&self) -> Vec<String> {
        Vec::new()
    }
}

/// The tray's own uid and label, as the bus reports them.
fn whoami(conn: &zbus::blocking::Connection) -> Me {
    let label = conn
        .unique_name()
        .and_then(|n| peer::credentials(conn, n.as_str()).ok())
        .and_then(|p| p.label);
    Me {
        // SAFETY: getuid has no preconditions and cannot fail.
        uid: unsafe { libc::getuid() },
        label,
        proc_root: "/proc".into(),
    }
}

/// `org.gpuctl.Tray` is taken: whether by a squatter (`true`: run without
/// the name, queued for it) rather than a tray of this user (`false`:
/// leave, one tray per session). Whoever holds or waits for the name is
/// judged like a caller, except that root's is not this user's tray.
fn squatted(conn: &zbus::blocking::Connection, me: &Me) -> bool {
    let mut why = Vec::new();
    let owners: Vec<String> = conn
        .call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            Some("org.freedesktop.DBus"),
            "ListQueuedOwners",
            &(SINGLE,),
        )
        .and_then(|m| m.body().deserialize::<Vec<String>>())
        .unwrap_or_else(|e| {
            // Most likely released between the two calls (NameHasNoOwner).
            why.push(format!("its holders are unknown: {e}"));
            Vec::new()
        });
    for o in &owners {
        match peer::credentials(conn, o).map_err(|e| e.to_string()) {
            Ok(p) => match peer::judge(me, &p, false) {
                Ok(()) => return false,
                Err(w) => why.push(format!("{o}: {w}")),
            },
            Err(w) => why.push(format!("{o}: {w}")),
        }
    }
    eprintln!(
        "gpuctl tray: {SINGLE} is held by something that is not your gpuctl tray ({}); \
         running without it, as the item's own name only, and waiting for it",
        why.join("; ")
    );
    // Queued: the name comes to this tray when the squatter leaves.
    // No flags (zbus's default is DoNotQueue and more): stay in the queue.
    // (Two different flags ANDed: the empty set.)
    let queue =
        zbus::fdo::RequestNameFlags::DoNotQueue & zbus::fdo::RequestNameFlags::ReplaceExisting;
    if let Err(e) = conn.request_name_with_flags(SINGLE, queue) {
        eprintln!("gpuctl tray: queueing for {SINGLE}: {e}");
    }
    true
}

/// The item on the session bus.
pub struct Tray {
    pub conn: zbus::blocking::Connection,
    pub name: String,
    shown: Shared,
}

impl Tray {
    /// `Ok(None)`: another gpuctl tray already runs in this session.
    pub fn start(tx: Sender<Msg>) -> Result<Option<Tray>> {
        let shown: Shared = Arc::default();
        let name = format!("org.kde.StatusNotifierItem-{}-1", std::process::id());
        let conn = zbus::blocking::connection::Builder::session()
            .context("no D-Bus session bus (DBUS_SESSION_BUS_ADDRESS)")?
            // A hung notification server or watcher must not hang the tray.
            .method_timeout(std::time::Duration::from_secs(2))
            .build()
            .context("connecting to the D-Bus session bus")?;
        let me = Arc::new(whoami(&conn));
        // One tray per session (the autostart entry and the user unit may
        // both start one).
        match conn.request_name_with_flags(SINGLE, zbus::fdo::RequestNameFlags::DoNotQueue.into()) {
            Ok(zbus::fdo::RequestNameReply::PrimaryOwner) => {}
            Ok(_) | Err(zbus::Error::NameTaken) => {
                if !squatted(&conn, &me) {
                    return Ok(None);
                }
            }
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context("asking the session bus for org.gpuctl.Tray")
                )
            }
        }
        conn.object_server()
            .at(
                ITEM_PATH,
                ItemObj {
                    shown: shown.clone(),
                    me: me.clone(),
                },
            )
            .context("serving the item")?;
        conn.object_server()
            .at(
                MENU_PATH,
                MenuObj {
                    shown: shown.clone(),
                    tx: Mutex::new(tx),
                    me,
                },
            )
            .context("serving the menu")?;
        conn.request_name(name.as_str())
            .context("asking the session bus for the item's name")?;
        let tray = Tray { conn, name, shown };
        tray.follow_watcher();
        Ok(Some(tray))
    }

    /// Registers with the StatusNotifierWatcher now, and again whenever
    /// one (re)appears (the panel restarted).
    fn follow_watcher(&self) {
        let register = {
            let conn = self.conn.clone();
            let name = self.name.clone();
            move || {
                conn.call_method(
                    Some(WATCHER),
                    "/StatusNotifierWatcher",
                    Some(WATCHER),
                    "RegisterStatusNotifierItem",
                    &(name.as_str(),),
                )
                .map(|_| ())
            }
        };
        let proxy = zbus::blocking::fdo::DBusProxy::new(&self.conn);
        let stream = proxy
            .as_ref()
            .ok()
            .and_then(|p| p.receive_name_owner_changed_with_args(&[(0, WATCHER)]).ok());
        if let Err(e) = register() {
            eprintln!(
                "gpuctl tray: no StatusNotifierWatcher yet ({e}); the icon appears when a tray host starts"
            );
        }
        if let Some(stream) = stream {
            std::thread::spawn(move || {
                for sig in stream {
                    let appeared = sig.args().is_ok_and(|a| a.new_owner().is_some());
                    if appeared {
                        if let Err(e) = register() {
                            eprintln!("gpuctl tray: registering with the new tray host: {e}");
                        }
                    }
                }
            });
        }
    }

    /// Shows `new`, telling hosts what changed.
    pub fn show(&self, mut new: Shown) {
        let old = {
            let mut s = lock(&self.shown);
            new.revision = if new.menu != s.menu {
                s.revision.wrapping_add(1)
            } else {
                s.revision
            };
            std::mem::replace(&mut *s, new.clone())
        };
        let mut changed = Vec::new();
        let mut signal = |name: &str, prop: &'static str| {
            let _ = self.conn.emit_signal(
                None::<()>,
                ITEM_PATH,
                "org.kde.StatusNotifierItem",
                name,
                &(),
            );
            changed.push(prop);
        };
        if old.title != new.title {
            signal("NewTitle", "Title");
        }
        if old.pixmaps != new.pixmaps {
            signal("NewIcon", "IconPixmap");
        }
        if old.tip_title != new.tip_title || old.tip_body != new.tip_body {
            signal("NewToolTip", "ToolTip");
        }
        if old.status != new.status {
            let _ = self.conn.emit_signal(
                None::<()>,
                ITEM_PATH,
                "org.kde.StatusNotifierItem",
                "NewStatus",
                &(new.status.as_str(),),
            );
            changed.push("Status");
        }
        if !changed.is_empty() {
            let none: HashMap<&str, Value> = HashMap::new();
            let _ = self.conn.emit_signal(
                None::<()>,
                ITEM_PATH,
                "org.freedesktop.DBus.Properties",
                "PropertiesChanged",
                &("org.kde.StatusNotifierItem", none, changed),
            );
        }
        if old.menu != new.menu {
            let _ = self.conn.emit_signal(
                None::<()>,
                MENU_PATH,
                "com.canonical.dbusmenu",
                "LayoutUpdated",
                &(new.revision, 0i32),
            );
        }
    }
}
