//! Tier 2: what a running daemon sends is documented. Every key of every
//! answer and event a daemon on a fixture machine sends (as root and as a
//! plain user) is in the example of its type in docs/PROTOCOL.md, at the
//! same place; the unit test `proto::golden` ties the examples to the
//! types, this ties them to the daemon, black box.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::common::fixture::machine;
use crate::common::harness::{require_root, Env};
use serde_json::Value;

/// The documented examples, by type name (` ```json status`).
fn examples() -> BTreeMap<String, Vec<Value>> {
    let page = include_str!("../../../docs/PROTOCOL.md");
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut open: Option<(String, String)> = None;
    for line in page.lines() {
        match &mut open {
            None => {
                if let Some(tag) = line.strip_prefix("```json ") {
                    open = Some((tag.trim().to_string(), String::new()));
                }
            }
            Some(_) if line.starts_with("```") => {
                let (name, text) = open.take().unwrap();
                let v = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("a {name} example is not JSON: {e}"));
                out.entry(name).or_default().push(v);
            }
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    out
}

/// Every key path of `v` (`.gpus[].runtime_pm.wakes`); arrays are merged.
fn paths(v: &Value, at: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            // `env` maps variable names (data, not keys) to values.
            if at == ".env" {
                return;
            }
            for (k, x) in o {
                let p = format!("{at}.{k}");
                out.insert(p.clone());
                paths(x, &p, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| paths(x, &format!("{at}[]"), out)),
        _ => {}
    }
}

/// Fails unless every key of `sent` is documented for `name` (`event`
/// examples are matched by their kind).
fn documented(ex: &BTreeMap<String, Vec<Value>>, name: &str, sent: &Value) {
    let docs: Vec<&Value> = ex
        .get(name)
        .unwrap_or_else(|| panic!("docs/PROTOCOL.md has no {name} example"))
        .iter()
        .filter(|d| name != "event" || d["event"] == sent["event"])
        .collect();
    let mut known = BTreeSet::new();
    for d in &docs {
        paths(d, "", &mut known);
    }
    let mut got = BTreeSet::new();
    paths(sent, "", &mut got);
    let missing: Vec<&String> = got.difference(&known).collect();
    assert!(
        missing.is_empty(),
        "the daemon sends {name} keys docs/PROTOCOL.md does not show: {missing:?}\n{sent}"
    );
}

/// The frame of an answer (its `data` is checked as its own type).
fn frame(resp: &Value) -> Value {
    let mut f = resp.clone();
    if let Some(d) = f.get_mut("data") {
        *d = Value::Null;
    }
    f
}

fn request(env: &Env, line: &str) -> Value {
    let mut s = UnixStream::connect(env.socket()).unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut l = String::new();
    BufReader::new(s).read_line(&mut l).unwrap();
    serde_json::from_str(&l).unwrap()
}

#[test]
#[ignore = "root"]
fn every_key_the_daemon_sends_is_documented() {
    require_root("every_key_the_daemon_sends_is_documented");
    let ex = examples();
    let mut env = Env::new(machine("intel_nvidia"));
    env.start();

    let mut events = UnixStream::connect(env.socket()).unwrap();
    events.write_all(b"{\"type\":\"events\"}\n").unwrap();
    events
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut events = BufReader::new(events);
    let mut first = String::new();
    events.read_line(&mut first).unwrap();
    let first: Value = serde_json::from_str(&first).unwrap();
    documented(&ex, "response", &frame(&first));
    documented(&ex, "events", &first["data"]);

    for (req, name) in [
        (r#"{"type":"ping"}"#, "ping"),
        (r#"{"type":"get"}"#, "mode"),
        (r#"{"type":"set","mode":"integrated"}"#, "mode"),
        (r#"{"type":"list"}"#, "list"),
        (r#"{"type":"status"}"#, "status"),
        (r#"{"type":"who"}"#, "who"),
        (r#"{"type":"wakes"}"#, "wakes"),
        (r#"{"type":"auto"}"#, "auto"),
        (r#"{"type":"config"}"#, "config"),
        (r#"{"type":"config","key":"max_grants"}"#, "config"),
        (
            r#"{"type":"config","key":"max_grants","value":"4096"}"#,
            "config",
        ),
        (r#"{"type":"app","action":"list"}"#, "apps"),
        (r#"{"type":"set","mode":"smart"}"#, "mode"),
        (r#"{"type":"grant"}"#, "grant"),
        (r#"{"type":"status"}"#, "status"),
    ] {
        let resp = request(&env, req);
        assert_eq!(resp["ok"], true, "{req}: {resp}");
        documented(&ex, "response", &frame(&resp));
        documented(&ex, name, &resp["data"]);
    }
    let refused = request(&env, r#"{"type":"set","mode":"bogus"}"#);
    documented(&ex, "response", &refused);

    // A plain user's view (redacted) has the same shape.
    for args in [&["status"][..], &["list"], &["who"], &["wakes"]] {
        let out = env.gpuctl_as(Some(1000), &[args, &["--json"]].concat());
        assert!(out.status.success(), "{args:?}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let name = args[0];
        documented(&ex, name, &v);
    }

    let mut kinds = BTreeSet::new();
    loop {
        let mut l = String::new();
        match events.read_line(&mut l) {
            Ok(n) if n > 0 => {
                let e: Value = serde_json::from_str(&l).unwrap();
                kinds.insert(e["event"].as_str().unwrap_or("?").to_string());
                documented(&ex, "event", &e);
            }
            _ => break,
        }
    }
    for k in ["mode", "blocked", "grant"] {
        assert!(kinds.contains(k), "no {k} event came: {kinds:?}");
    }
    env.stop();
}
