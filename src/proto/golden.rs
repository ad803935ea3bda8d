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
