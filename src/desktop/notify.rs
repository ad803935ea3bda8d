//! Desktop notifications (`org.freedesktop.Notifications`), each kind
//! rate-limited and switchable off (config.rs). Per kind, the first
//! notification goes out at once; within `min_interval_s` after it, later
//! ones are held and only the newest is shown when the interval ends
//! ("and N earlier"), so a burst never floods the screen and the last word
//! is always the current one. A kind's notification replaces its previous
//! one on screen (`replaces_id`).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::proto::event::Event;
use zbus::zvariant::Value as DValue;

use super::config;
use super::model::describe;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Mode,
    Wake,
    Display,
    Denied,
    Action,
    /// A GPU left awake for a display server (switched with `mode`).
    Held,
}

/// Which kind an event is, if it is one the user can be told about.
pub fn kind_of(e: &Event) -> Option<Kind> {
    match e {
        Event::Mode(_) => Some(Kind::Mode),
        Event::Wake(_) => Some(Kind::Wake),
        Event::Blocked(b) if b.reason == "display" && !b.blocked => Some(Kind::Display),
        Event::Denied(_) => Some(Kind::Denied),
        Event::Held(_) => Some(Kind::Held),
        _ => None,
    }
}

#[derive(Default)]
struct Limiter {
    last: Option<Instant>,
    pending: Option<(String, String)>,
    held: u32,
    id: u32,
}

/// Sends notifications through `sink` (D-Bus in the tray; a Vec in tests).
pub struct Notifier<S: FnMut(u32, &str, &str) -> Option<u32>> {
    cfg: config::Notify,
    kinds: BTreeMap<Kind, Limiter>,
    sink: S,
}

impl<S: FnMut(u32, &str, &str) -> Option<u32>> Notifier<S> {
    pub fn new(cfg: config::Notify, sink: S) -> Self {
        Notifier {
            cfg,
            kinds: BTreeMap::new(),
            sink,
        }
    }

    fn enabled(&self, k: Kind) -> bool {
        match k {
            Kind::Mode | Kind::Held => self.cfg.mode,
            Kind::Wake => self.cfg.wake,
            Kind::Display => self.cfg.display,
            Kind::Denied => self.cfg.denied,
            Kind::Action => self.cfg.actions,
        }
    }

    fn interval(&self) -> Duration {
        Duration::from_secs_f64(self.cfg.min_interval_s)
    }

    /// A daemon event: notified if its kind is on (and not too soon).
    pub fn event(&mut self, v: &Event, now: Instant) {
        let (Some(k), Some((summary, body))) = (kind_of(v), describe(v)) else {
            return;
        };
        self.post(k, summary, body, now);
    }

    /// A menu action the daemon refused or that failed.
    pub fn action_failed(&mut self, what: &str, why: &str, now: Instant) {
        self.post(
            Kind::Action,
            format!("gpuctl: {what} not done"),
            why.to_string(),
            now,
        );
    }

    fn post(&mut self, k: Kind, summary: String, body: String, now: Instant) {
        if !self.enabled(k) {
            return;
        }
        let interval = self.interval();
        let l = self.kinds.entry(k).or_default();
        if l.last.is_some_and(|t| now.duration_since(t) < interval) {
            if l.pending.is_some() {
                l.held += 1;
            }
            l.pending = Some((summary, body));
            return;
        }
        self.send(k, summary, body, now);
    }

    fn send(&mut self, k: Kind, summary: String, mut body: String, now: Instant) {
        let l = self.kinds.entry(k).or_default();
        if l.held > 0 {
            if !body.is_empty() {
                body.push('\n');
            }
            body.push_str(&format!(
                "(and {} earlier within {:.0} s)",
                l.held, self.cfg.min_interval_s
            ));
        }
        l.held = 0;
        l.last = Some(now);
        let replaces = l.id;
        // Servers render the body as markup (`<b>`, `<a href>`, `<img>`);
        // the summary is plain text, shown on one line.
        let (summary, body) = (crate::text::human(&summary), crate::text::markup(&body));
        if let Some(id) = (self.sink)(replaces, &summary, &body) {
            if let Some(l) = self.kinds.get_mut(&k) {
                l.id = id;
            }
        }
    }

    /// Sends what was held back, once its interval is over.
    pub fn tick(&mut self, now: Instant) {
        let interval = self.interval();
        let due: Vec<Kind> = self
            .kinds
            .iter()
            .filter(|(_, l)| {
                l.pending.is_some() && l.last.is_none_or(|t| now.duration_since(t) >= interval)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            if let Some((s, b)) = self.kinds.get_mut(&k).and_then(|l| l.pending.take()) {
                self.send(k, s, b, now);
            }
        }
    }

    /// When [`Notifier::tick`] next has something to send.
    pub fn deadline(&self) -> Option<Instant> {
        let interval = self.interval();
        self.kinds
            .values()
            .filter(|l| l.pending.is_some())
            .filter_map(|l| l.last.map(|t| t + interval))
            .min()
    }
}

/// The D-Bus sink: `Notify` on the session bus. A missing notification
/// server is said once on stderr, not at every event.
pub fn dbus_sink(conn: zbus::blocking::Connection) -> impl FnMut(u32, &str, &str) -> Option<u32> {
    let mut warned = false;
    move |replaces, summary, body| {
        let hints: HashMap<&str, DValue> = HashMap::new();
        let r = conn.call_method(
            Some("org.freedesktop.Notifications"),
            "/org/freedesktop/Notifications",
            Some("org.freedesktop.Notifications"),
            "Notify",
            &(
                "gpuctl",
                replaces,
                "video-display",
                summary,
                body,
                Vec::<&str>::new(),
                hints,
                -1i32,
            ),
        );
        match r.and_then(|m| m.body().deserialize::<u32>()) {
            Ok(id) => Some(id),
            Err(e) => {
                if !warned {
                    warned = true;
                    eprintln!("gpuctl tray: cannot show notifications ({e}); going on without");
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::cell::RefCell;
    use std::rc::Rc;

    fn ev(v: serde_json::Value) -> Event {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn rate_limited_last_word_kept_and_switchable() {
        let sent = Rc::new(RefCell::new(Vec::<(u32, String, String)>::new()));
        let s2 = sent.clone();
        let mut n = Notifier::new(
            config::Notify {
                min_interval_s: 5.0,
                ..config::Notify::default()
            },
            move |r, a: &str, b: &str| {
                s2.borrow_mut().push((r, a.into(), b.into()));
                Some(7)
            },
        );
        let t = Instant::now();
        for (i, m) in ["integrated", "hybrid", "smart", "integrated"]
            .iter()
            .enumerate()
        {
            n.event(
                &ev(json!({"event": "mode", "mode": m, "reason": "manual"})),
                t + Duration::from_millis(i as u64),
            );
        }
        // Denials are off by default; power events are never notified.
        n.event(&ev(json!({"event": "denied", "comm": "x", "gpu": 1})), t);
        n.event(&ev(json!({"event": "power", "gpu": 1})), t);
        assert_eq!(sent.borrow().len(), 1);
        assert_eq!(sent.borrow()[0].1, "GPU mode: integrated");
        assert_eq!(n.deadline(), Some(t + Duration::from_secs(5)));
        n.tick(t + Duration::from_secs(4));
        assert_eq!(sent.borrow().len(), 1);
        n.tick(t + Duration::from_secs(5));
        let s = sent.borrow();
        assert_eq!(s.len(), 2);
        // The newest, replacing the first on screen, saying two were merged.
        assert_eq!((s[1].0, s[1].1.as_str()), (7, "GPU mode: integrated"));
        assert!(s[1].2.ends_with("(and 2 earlier within 5 s)"), "{}", s[1].2);
        drop(s);
        assert_eq!(n.deadline(), None);
    }
}
