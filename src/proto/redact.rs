//! Privacy as a property of the types: what a viewer who is neither root
//! nor in the configured group may see of another user's processes.
//!
//! Two kinds of record:
//! - [`Redact`]: the record is shown to everyone, but its private fields
//!   (pid, command name, uid, the file touched) become `null` for a
//!   stranger. Each type lists its fields in two tables, [`Redact::PUBLIC`]
//!   and [`Redact::PRIVATE`], and implements [`Redact::redact`] with an
//!   exhaustive destructuring (no `..`), so a new field does not compile
//!   until it is named there, and `tests::every_field_has_a_decision`
//!   fails until it is in one of the tables.
//! - [`Withheld`]: the whole record is another user's (a grant, a process
//!   holding a GPU open): a stranger does not get it at all, only a count.
//! - Every other payload type implements [`Redact`] too, through
//!   [`public!`]: all its keys listed as public, and `for_viewer` passing
//!   the viewer on to its parts (a `status` hands it to each GPU's
//!   `runtime_pm`, withholds other users' grants). The daemon builds a
//!   whole answer and calls `for_viewer` once, at the handler's edge; the
//!   golden test checks each type's table against its documented example.

/// Who is looking: [`Viewer::ALL`] sees everything (root and the group);
/// `Viewer(Some(uid))` (a plain user) sees their own processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Viewer(pub Option<u32>);

impl Viewer {
    /// Root, or a member of the configured group.
    pub const ALL: Viewer = Viewer(None);

    pub fn user(uid: u32) -> Viewer {
        Viewer(Some(uid))
    }

    /// Whether this viewer sees what belongs to `owner` (`None`: to no
    /// user in particular, which only root and the group see).
    pub fn sees(self, owner: Option<u32>) -> bool {
        match self.0 {
            None => true,
            Some(me) => owner == Some(me),
        }
    }
}

/// A record whose private fields are nulled for a stranger.
// The tables are read by the tests (every field has a decision).
#[cfg_attr(not(test), allow(dead_code))]
pub trait Redact: Sized {
    /// The JSON keys everyone sees as they are.
    const PUBLIC: &'static [&'static str];
    /// The JSON keys a stranger sees as `null`.
    const PRIVATE: &'static [&'static str];

    /// Whether `viewer` sees the private fields.
    fn visible_to(&self, viewer: Viewer) -> bool;

    /// Sets every private field to `None`.
    fn redact(&mut self);

    /// The record as `viewer` may see it.
    fn for_viewer(mut self, viewer: Viewer) -> Self {
        if !self.visible_to(viewer) {
            self.redact();
        }
        self
    }
}

/// A record with nothing private of its own: every key is listed as
/// public (the tests check the list is the type's whole key set), and
/// `for_viewer` hands the viewer on to the fields that have private parts
/// (the optional `|self, viewer| body`).
macro_rules! public {
    ($t:ty, [$($k:literal),* $(,)?]) => {
        $crate::proto::redact::public!($t, [$($k),*], |s, _v| s);
    };
    ($t:ty, [$($k:literal),* $(,)?], |$s:ident, $v:ident| $body:expr) => {
        impl $crate::proto::redact::Redact for $t {
            const PUBLIC: &'static [&'static str] = &[$($k),*];
            const PRIVATE: &'static [&'static str] = &[];
            fn visible_to(&self, _: $crate::proto::redact::Viewer) -> bool {
                true
            }
            fn redact(&mut self) {}
            fn for_viewer(self, viewer: $crate::proto::redact::Viewer) -> Self {
                #[allow(unused_mut)]
                let mut $s = self;
                let $v = viewer;
                $body
            }
        }
    };
}
pub(crate) use public;

/// Each element of `items` as `viewer` may see it.
pub fn each<T: Redact>(items: Vec<T>, viewer: Viewer) -> Vec<T> {
    items.into_iter().map(|i| i.for_viewer(viewer)).collect()
}

/// A `note` (why a mode is not fully in force) as `viewer` may see it: it
/// may name a display server with its pid (`gnome-shell (pid 4321)`), which
/// is another user's process; a plain user gets the name without the pid
/// (issue 18).
pub fn note_for(note: Option<String>, viewer: Viewer) -> Option<String> {
    if viewer.sees(None) {
        return note;
    }
    note.map(|n| {
        let mut out = String::with_capacity(n.len());
        let mut rest = n.as_str();
        while let Some(i) = rest.find(" (pid ") {
            let after = &rest[i + 6..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            out.push_str(&rest[..i]);
            if digits > 0 && after[digits..].starts_with(')') {
                rest = &after[digits + 1..];
            } else {
                out.push_str(" (pid ");
                rest = after;
            }
        }
        out.push_str(rest);
        out
    })
}

/// A record a stranger does not get at all.
pub trait Withheld {
    /// The uid the record belongs to (`None`: nobody's in particular).
    fn owner(&self) -> Option<u32>;

    fn visible_to(&self, viewer: Viewer) -> bool {
        viewer.sees(self.owner())
    }
}

/// Splits `items` into what `viewer` may see and how many were withheld.
pub fn withhold<T: Withheld>(items: Vec<T>, viewer: Viewer) -> (Vec<T>, u64) {
    let mut hidden = 0;
    let shown = items
        .into_iter()
        .filter(|i| {
            let ok = i.visible_to(viewer);
            hidden += u64::from(!ok);
            ok
        })
        .collect();
    (shown, hidden)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde::Serialize;
    use serde_json::Value;

    use super::*;

    #[test]
    fn a_note_loses_its_pids_for_a_plain_user() {
        let n = Some(
            "GPU 1: held open by the display server gnome-shell (pid 4321); GPU 2 (pid x)"
                .to_string(),
        );
        assert_eq!(note_for(n.clone(), Viewer::ALL), n);
        assert_eq!(
            note_for(n, Viewer::user(1000)).as_deref(),
            Some("GPU 1: held open by the display server gnome-shell; GPU 2 (pid x)")
        );
        assert_eq!(note_for(None, Viewer::user(1000)), None);
    }
    use crate::proto::data::{Role, TopWaker, Wake};
    use crate::proto::event::{
        Blocked, Denied, Event, GrantEvent, ModeEvent, PowerEvent, SleepEvent,
    };

    /// Every field of a fully populated record, redacted for a stranger,
    /// is in exactly one of the type's tables: the private ones are
    /// `null`, the public ones unchanged. A field added to the type and
    /// to neither table fails here (and, without a name in `redact`'s
    /// destructuring, does not compile).
    fn check<T: Redact + Serialize + Clone>(full: T, stranger: Viewer) {
        let name = std::any::type_name::<T>();
        let before = serde_json::to_value(&full).unwrap();
        let after = serde_json::to_value(full.clone().for_viewer(stranger)).unwrap();
        let (Value::Object(before), Value::Object(after)) = (before, after) else {
            panic!("{name} is not a JSON object");
        };
        let keys: BTreeSet<&str> = before
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "event")
            .collect();
        let table: BTreeSet<&str> = T::PUBLIC.iter().chain(T::PRIVATE).copied().collect();
        assert_eq!(
            keys, table,
            "{name}: every field needs a redaction decision (PUBLIC or PRIVATE)"
        );
        assert_eq!(
            T::PUBLIC.len() + T::PRIVATE.len(),
            table.len(),
            "{name}: a field is in both tables"
        );
        for k in T::PRIVATE {
            assert!(!before[*k].is_null(), "{name}.{k}: populate it in the test");
            assert_eq!(after[*k], Value::Null, "{name}.{k} leaks to a stranger");
        }
        for k in T::PUBLIC {
            assert_eq!(after[*k], before[*k], "{name}.{k} is public");
        }
        // The owner sees everything.
        let all = serde_json::to_value(full.clone().for_viewer(Viewer::ALL)).unwrap();
        assert_eq!(all, Value::Object(before), "{name}: root sees it all");
    }

    pub fn wake() -> Wake {
        Wake {
            gpu: 1,
            pci: "0000:01:00.0".into(),
            device: "0000:01:00.0".into(),
            role: Role::Gpu,
            ts: Some(1.5),
            pid: Some(10),
            tgid: Some(10),
            comm: Some("lspci".into()),
            uid: Some(1000),
            what: Some("read /sys/x".into()),
            op: Some("read".into()),
            file: Some("/sys/x".into()),
            kworker: false,
            r#async: false,
            awake_ms: Some(3),
            count: 2,
            last_ts: Some(2.5),
            mono_ns: 0,
            first_of_uid: false,
        }
    }

    #[test]
    fn every_field_has_a_decision() {
        let stranger = Viewer::user(2000);
        check(wake(), stranger);
        check(
            crate::proto::data::HeldGpu {
                gpu: 1,
                auto: true,
                pid: Some(900),
                comm: Some("gnome-shell".into()),
                uid: Some(1000),
            },
            stranger,
        );
        check(
            TopWaker {
                comm: Some("lspci".into()),
                uid: Some(1000),
                wakes: 3,
            },
            stranger,
        );
        check(
            Denied {
                pid: Some(7),
                comm: Some("glxinfo".into()),
                uid: Some(1000),
                gpu: 1,
                node: Some("226:1".parse().unwrap()),
                ..Default::default()
            },
            stranger,
        );
        check(
            GrantEvent {
                pid: Some(7),
                comm: Some("game".into()),
                uid: Some(1000),
                gpus: vec![1],
                how: "run".into(),
            },
            stranger,
        );
        check(
            Blocked {
                gpu: 1,
                pci: Some("0000:01:00.0".parse().unwrap()),
                blocked: true,
                reason: "mode".into(),
                displays: vec!["HDMI-A-1".into()],
            },
            stranger,
        );
        check(
            ModeEvent {
                mode: crate::policy::Mode::Integrated,
                reason: "auto".into(),
                detail: Some("on battery".into()),
                trigger: Some("power_supply uevent".into()),
            },
            stranger,
        );
        check(
            SleepEvent {
                gpu: 1,
                pci: "0000:01:00.0".into(),
                ts: Some(2.0),
                awake_ms: Some(20),
                power_state: Some("D3cold".into()),
            },
            stranger,
        );
        check(
            PowerEvent {
                gpu: 1,
                pci: "0000:01:00.0".into(),
                power_state: Some("D0".into()),
                runtime_status: "active".into(),
            },
            stranger,
        );
    }

    #[test]
    fn owners_and_kernel_threads_are_seen() {
        let mine = wake().for_viewer(Viewer::user(1000));
        assert_eq!(mine.comm.as_deref(), Some("lspci"));
        let mut k = wake();
        k.kworker = true;
        k.uid = None;
        assert_eq!(
            k.for_viewer(Viewer::user(2000)).comm.as_deref(),
            Some("lspci")
        );
        let e = Event::Wake(wake()).for_viewer(Viewer::user(2000));
        let Event::Wake(w) = e else { panic!() };
        assert_eq!(w.pid, None);
    }
}
