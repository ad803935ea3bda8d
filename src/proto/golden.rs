//! The golden test: every JSON block of `docs/PROTOCOL.md` tagged with a
//! type name (` ```json status`) is parsed as that type and written back,
//! and must come out as the same text (keys, their order, null-vs-absent,
//! numbers). A field renamed, added or dropped in `data.rs`/`event.rs`
//! without the page, or an example on the page with a field the type does
//! not have, fails here.

use std::collections::BTreeSet;

use serde_json::Value;

use super::data::round_trip;

const PAGE: &str = include_str!("../../docs/PROTOCOL.md");

/// `(type name, JSON text, line)` of each tagged block.
fn blocks() -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String, usize)> = None;
    for (n, line) in PAGE.lines().enumerate() {
        match &mut open {
            None => {
                if let Some(tag) = line.strip_prefix("```json ") {
                    open = Some((tag.trim().to_string(), String::new(), n + 1));
                }
            }
            Some(_) if line.starts_with("```") => out.extend(open.take()),
            Some((_, text, _)) => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    assert!(
        open.is_none(),
        "docs/PROTOCOL.md: a code block is not closed"
    );
    out
}

/// Where two values differ: `+path` only in the type's JSON, `-path`
/// only on the page, `~path` in both with other values or order.
fn differences(ty: &Value, page: &Value, at: &str) -> Vec<String> {
    match (ty, page) {
        (Value::Object(a), Value::Object(b)) => {
            let mut out: Vec<String> = Vec::new();
            for k in a.keys().filter(|k| !b.contains_key(*k)) {
                out.push(format!("+{at}.{k}"));
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("-{at}.{k}"));
            }
            for (k, v) in a {
                if let Some(w) = b.get(k) {
                    out.extend(differences(v, w, &format!("{at}.{k}")));
                }
            }
            if out.is_empty() && !a.keys().eq(b.keys()) {
                out.push(format!("~{at} (key order)"));
            }
            out
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .flat_map(|(i, (v, w))| differences(v, w, &format!("{at}[{i}]")))
            .collect(),
        (a, b) if a == b => Vec::new(),
        _ => vec![format!("~{at}")],
    }
}

#[test]
fn every_documented_example_is_its_type_exactly() {
    let blocks = blocks();
    assert!(blocks.len() > 20, "found only {} examples", blocks.len());
    for (name, text, line) in &blocks {
        let doc: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("docs/PROTOCOL.md:{line}: not JSON: {e}"));
        let back = round_trip(name, &doc)
            .unwrap_or_else(|e| panic!("docs/PROTOCOL.md:{line}: not a {name}: {e}"));
        let (b, d) = (
            serde_json::to_string(&back).unwrap(),
            serde_json::to_string(&doc).unwrap(),
        );
        assert!(
            b == d,
            "docs/PROTOCOL.md:{line}: the {name} example and its type differ \
             (a key added, dropped, renamed or reordered on one side): {:?}\n\
             type: {b}\npage: {d}",
            differences(&back, &doc, "")
        );
    }
}

#[test]
fn every_payload_and_event_is_documented() {
    let blocks = blocks();
    let names: BTreeSet<&str> = blocks.iter().map(|(n, _, _)| n.as_str()).collect();
    for want in [
        "request", "response", "ping", "mode", "list", "status", "who", "grant", "config", "apps",
        "app", "auto", "wakes", "events", "event",
    ] {
        assert!(
            names.contains(want),
            "docs/PROTOCOL.md has no {want} example"
        );
    }
    let kinds: BTreeSet<String> = blocks
        .iter()
        .filter(|(n, _, _)| n == "event")
        .filter_map(|(_, t, _)| {
            let v: Value = serde_json::from_str(t).ok()?;
            Some(v.get("event")?.as_str()?.to_string())
        })
        .collect();
    // Every variant of `Event` but `Unknown`, by its tag.
    use super::event::*;
    for e in [
        Event::Denied(Denied::default()),
        Event::Mode(ModeEvent::default()),
        Event::Blocked(Blocked::default()),
        Event::Grant(GrantEvent::default()),
        Event::Wake(Default::default()),
        Event::Sleep(SleepEvent::default()),
        Event::Power(PowerEvent::default()),
        Event::PowerOff(PowerOffEvent::default()),
        Event::Held(HeldEvent::default()),
    ] {
        let v = e.to_value();
        let tag = v.get("event").and_then(Value::as_str).unwrap().to_string();
        assert!(kinds.contains(&tag), "docs/PROTOCOL.md has no {tag} event");
    }
}

/// The example of `config KEY` and the one of `config KEY VALUE` differ
/// only by `note`: each must stay its own shape.
#[test]
fn config_shapes_stay_apart() {
    let one: super::data::ConfigData = serde_json::from_str(r#"{"key": "k", "value": 1}"#).unwrap();
    assert!(matches!(one, super::data::ConfigData::One(_)));
    let set: super::data::ConfigData =
        serde_json::from_str(r#"{"key": "k", "value": 1, "note": null}"#).unwrap();
    assert!(matches!(set, super::data::ConfigData::Set { .. }));
}

/// Every key of every payload and event type has a privacy decision: the
/// type's documented example serializes to exactly the keys of its
/// `PUBLIC` and `PRIVATE` tables (a field added to a type and to neither
/// fails here), and a stranger sees every private one as `null`.
#[test]
fn every_documented_key_has_a_privacy_decision() {
    use serde::de::DeserializeOwned;
    use serde::Serialize;

    use super::data::*;
    use super::event::*;
    use super::redact::{Redact, Viewer};

    /// The type, the keys its example has, and its tables' keys.
    type Seen = (&'static str, BTreeSet<String>, BTreeSet<&'static str>);
    type Check = fn(&Value) -> Result<Seen, String>;
    fn check<T: Redact + Serialize + DeserializeOwned>(v: &Value) -> Result<Seen, String> {
        let t: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
        let full = serde_json::to_value(&t).map_err(|e| e.to_string())?;
        let keys: BTreeSet<String> = full
            .as_object()
            .ok_or("not an object")?
            .keys()
            .cloned()
            .collect();
        let table: BTreeSet<&'static str> = T::PUBLIC.iter().chain(T::PRIVATE).copied().collect();
        if let Some(k) = keys.iter().find(|k| !table.contains(k.as_str())) {
            return Err(format!(
                "{k} is in neither PUBLIC nor PRIVATE of {}: each field needs a decision",
                std::any::type_name::<T>()
            ));
        }
        let shown = serde_json::to_value(t.for_viewer(Viewer::user(4_000_000_000)))
            .map_err(|e| e.to_string())?;
        for k in T::PRIVATE {
            if !shown[*k].is_null() {
                return Err(format!("{k} reaches a stranger"));
            }
        }
        Ok((std::any::type_name::<T>(), keys, table))
    }
    let payloads: &[(&str, &str, Check)] = &[
        ("ping", "", check::<PingData>),
        ("mode", "", check::<ModeData>),
        ("list", "", check::<ListData>),
        ("list", "/gpus/0", check::<ListGpu>),
        ("list", "/gpus/0/runtime_pm", check::<RuntimePm>),
        ("status", "", check::<StatusData>),
        ("status", "/daemon", check::<DaemonInfo>),
        ("status", "/modes", check::<Modes>),
        ("status", "/auto", check::<AutoData>),
        ("status", "/auto/rules", check::<AutoRules>),
        ("status", "/gpus/1", check::<StatusGpu>),
        ("status", "/gpus/1/runtime_pm", check::<RuntimePm>),
        ("status", "/gpus/1/power_off", check::<PowerOffInfo>),
        (
            "status",
            "/gpus/1/runtime_pm/since_start",
            check::<Residency>,
        ),
        ("status", "/gpus/1/runtime_pm/last_wake", check::<Wake>),
        (
            "status",
            "/gpus/1/runtime_pm/top_wakers/0",
            check::<TopWaker>,
        ),
        ("status", "/gpus/1/runtime_pm/watched/0", check::<Watched>),
        ("status", "/power_monitor", check::<PowerMonitor>),
        ("status", "/grant_share", check::<GrantShareView>),
        ("status", "/power_monitor/programs/0", check::<ProgramStats>),
        ("who", "", check::<WhoData>),
        ("grant", "", check::<GrantData>),
        ("apps", "", check::<AppsData>),
        ("apps", "/apps/0", check::<AppEntry>),
        ("app", "", check::<AppChanged>),
        ("auto", "", check::<AutoData>),
        ("wakes", "", check::<WakesData>),
        ("wakes", "/gpus/0", check::<WakesGpu>),
        ("wakes", "/wakes/0", check::<Wake>),
        ("events", "", check::<Subscribed>),
    ];
    let events: &[(&str, Check)] = &[
        ("denied", check::<Denied>),
        ("mode", check::<ModeEvent>),
        ("blocked", check::<Blocked>),
        ("grant", check::<GrantEvent>),
        ("wake", check::<Wake>),
        ("sleep", check::<SleepEvent>),
        ("power", check::<PowerEvent>),
        ("power_off", check::<PowerOffEvent>),
        ("held", check::<HeldEvent>),
    ];
    let mut seen: std::collections::BTreeMap<&str, (BTreeSet<String>, BTreeSet<&str>)> =
        Default::default();
    let mut checked = 0;
    for (name, text, line) in blocks() {
        let doc: Value = serde_json::from_str(&text).unwrap();
        let mut run = |what: String, v: Option<&Value>, f: Check| {
            let v = v.unwrap_or_else(|| panic!("docs/PROTOCOL.md:{line}: no {what}"));
            match f(v) {
                Ok((ty, keys, table)) => {
                    let e = seen.entry(ty).or_insert_with(|| (BTreeSet::new(), table));
                    e.0.extend(keys);
                }
                Err(e) => panic!("docs/PROTOCOL.md:{line}: {what}: {e}"),
            }
            checked += 1;
        };
        if name == "event" {
            let mut body = doc.clone();
            let tag = body
                .as_object_mut()
                .and_then(|o| o.shift_remove("event"))
                .and_then(|t| t.as_str().map(str::to_string))
                .unwrap_or_default();
            let f = events.iter().find(|(t, _)| *t == tag).map(|(_, f)| *f);
            run(
                format!("the {tag} event"),
                Some(&body),
                f.unwrap_or_else(|| panic!("no table for {tag}")),
            );
        } else {
            for (_, ptr, f) in payloads.iter().filter(|(n, _, _)| *n == name) {
                run(format!("{name} {ptr}"), doc.pointer(ptr), *f);
            }
        }
    }
    assert!(checked >= payloads.len(), "only {checked} checks ran");
    // Every key of a table is shown by some example (an example per type
    // with every field: a table cannot list a key the type does not have).
    for (ty, (keys, table)) in &seen {
        let keys: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
        assert_eq!(&keys, table, "{ty}: its examples and its tables differ");
    }
}

/// A client reads a newer daemon (keys and event kinds it does not know)
/// and an older one (keys missing): unknown keys are ignored, missing ones
/// take their defaults.
#[test]
fn a_newer_or_older_daemon_is_read() {
    use super::data::{StatusData, WhoData};
    use super::event::Event;
    let st: StatusData = serde_json::from_str(
        r#"{"mode": "smart", "a_new_key": {"x": 1}, "gpus": [{"id": 1, "new": true}]}"#,
    )
    .unwrap();
    assert!(st.may_change, "an older daemon said nothing: assume yes");
    assert_eq!((st.gpus[0].id, st.gpus[0].pci), (1, None));
    assert!(st.auto.is_none(), "a daemon without automation");
    let who: WhoData = serde_json::from_str(r#"{"holders": []}"#).unwrap();
    assert_eq!(who.hidden, None);
    let e: Event = serde_json::from_str(r#"{"event": "teleport", "gpu": 1}"#).unwrap();
    assert_eq!(e, Event::Unknown);
    let e: Event = serde_json::from_str(r#"{"event": "sleep", "gpu": 1, "later": 2}"#).unwrap();
    assert!(matches!(e, Event::Sleep(s) if s.gpu == 1 && s.ts.is_none()));
}
