//! Power truth for people: the per-GPU lines of `gpuctl status`, the
//! `gpuctl wakes` table, the can-it-sleep notes under `gpuctl list`, and the
//! `wake`/`sleep`/`power` lines of `gpuctl events`. Input is the JSON
//! scripts get.

use serde_json::Value;

use super::table::render;
use crate::proto::data::{ListData, ListGpu, Residency, StatusData, Wake, WakesData};
use crate::proto::event::Event;

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |x| x.to_string())
}

/// Local wall-clock time of a Unix timestamp: `09:12:05`.
pub fn clock(ts: f64) -> String {
    let t = ts as libc::time_t;
    // SAFETY: localtime_r reads one time_t and fills one tm we own.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return "?".to_string();
        }
        tm
    };
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

/// `lspci (pid 4242, uid 1000) read config`.
pub fn cause(w: &Wake) -> String {
    let comm = w.comm.as_deref().map(crate::text::human);
    let who = match (&comm, w.tgid) {
        (Some(c), Some(p)) if w.kworker => format!("{c} (kernel thread, pid {p})"),
        (Some(c), Some(p)) => match w.uid {
            Some(u) => format!("{c} (pid {p}, uid {u})"),
            None => format!("{c} (pid {p})"),
        },
        _ => "unknown cause".to_string(),
    };
    let file = w
        .file
        .as_deref()
        .map(|f| crate::text::human(f.rsplit('/').next().unwrap_or(f)));
    match (&w.op, file) {
        (Some(o), Some(f)) => format!("{who} {o} {f}"),
        (Some(o), None) => format!("{who} {o}"),
        _ => who,
    }
}

fn seconds(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 10_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else if ms < 120_000 {
        format!("{} s", ms / 1000)
    } else {
        format!("{} min", ms / 60_000)
    }
}

fn pct(r: &Option<Residency>) -> Option<String> {
    r.as_ref()?.asleep_pct.map(|p| format!("{p:.1} %"))
}

/// One or two lines per watched GPU, for `gpuctl status`.
pub fn status_lines(d: &StatusData) -> String {
    let mut out = String::new();
    for g in &d.gpus {
        let Some(p) = &g.runtime_pm else { continue };
        let mut parts = Vec::new();
        let since = clock(p.since);
        match (g.runtime_status.as_deref(), pct(&p.since_start)) {
            (Some("active"), Some(x)) => parts.push(format!(
                "awake now{} · asleep {x} since {since}",
                p.awake_since
                    .map(|t| format!(" (since {})", clock(t)))
                    .unwrap_or_default()
            )),
            (_, Some(x)) => parts.push(format!("asleep {x} since {since}")),
            (_, None) => parts.push(format!("residency unknown since {since}")),
        }
        if let Some(ps) = &g.power_state {
            parts[0].push_str(&format!(" ({ps})"));
        }
        match p.wakes {
            Some(1) => parts.push("1 wake".into()),
            Some(n) => parts.push(format!("{n} wakes")),
            None => parts.push("wakes not attributed".into()),
        }
        if let Some(w) = &p.last_wake {
            let mut last = format!("last: {}", cause(w));
            if let Some(ms) = w.awake_ms {
                last.push_str(&format!(", awake {}", seconds(ms)));
            }
            parts.push(last);
        }
        out.push_str(&format!("\nGPU {}: {}", g.id, parts.join(" · ")));
        if let (Some(x), Some(r)) = (pct(&p.since_boot), &p.since_boot) {
            out.push_str(&format!(
                "\n       since boot: asleep {x} ({} asleep, {} awake){}",
                seconds((r.asleep_s * 1000.0) as u64),
                seconds((r.awake_s * 1000.0) as u64),
                if p.counters_reset {
                    "; counters restarted (device re-added)"
                } else {
                    ""
                }
            ));
        }
    }
    if let Some(e) = d.power_monitor.as_ref().and_then(|m| m.error.as_deref()) {
        out.push_str(&format!("\nwake attribution off: {e}"));
    }
    out
}

/// `gpuctl wakes`.
pub fn wakes(d: &WakesData) -> String {
    let mut out = String::new();
    if d.wakes.is_empty() {
        out.push_str("No wakes recorded since the daemon started.\n");
    } else {
        let rows: Vec<Vec<String>> = d
            .wakes
            .iter()
            .map(|w| {
                vec![
                    w.ts.map(clock).unwrap_or_else(|| "-".into()),
                    w.gpu.to_string(),
                    format!("{} ({})", w.device, w.role.name()),
                    cause(w),
                    w.what.as_deref().unwrap_or("-").to_string(),
                    w.awake_ms.map(seconds).unwrap_or_else(|| "-".into()),
                    match (w.count, w.last_ts) {
                        (n, Some(last)) if n > 1 => format!("×{n} (last {})", clock(last)),
                        (n, _) => format!("×{n}"),
                    },
                ]
            })
            .collect();
        out.push_str(&render(
            &[
                "TIME", "GPU", "DEVICE", "WOKEN BY", "WHAT", "AWAKE", "TIMES",
            ],
            &rows,
        ));
    }
    for g in &d.gpus {
        let top: Vec<String> = g
            .runtime_pm
            .iter()
            .flat_map(|p| &p.top_wakers)
            .map(|t| {
                let uid = t.uid.map(|u| format!(" (uid {u})")).unwrap_or_default();
                let comm = opt(t.comm.as_deref());
                format!("{}{uid} ×{}", crate::text::human(&comm), t.wakes)
            })
            .collect();
        if !top.is_empty() {
            out.push_str(&format!("GPU {} top wakers: {}\n", g.id, top.join(", ")));
        }
    }
    if !d.attributed {
        out.push_str(&format!(
            "wake attribution off: {}\n",
            d.error
                .as_deref()
                .unwrap_or("the runtime-PM programs are not loaded")
        ));
    }
    out.trim_end().to_string()
}

/// Lines under `gpuctl list` for offload GPUs that cannot sleep (fully).
pub fn list_notes(d: &ListData) -> String {
    let mut out = String::new();
    for ListGpu { gpu: g, .. } in &d.gpus {
        if !g.offload {
            continue;
        }
        let v = &g.sleep;
        if v.blockers.is_empty() {
            continue;
        }
        out.push_str(&format!("GPU {} can sleep: {}\n", g.id, v.summary()));
        for b in &v.blockers {
            let fix = b.fix.lines().next().unwrap_or("");
            out.push_str(&format!("  - {}; fix: {fix}\n", b.problem));
        }
    }
    out
}

/// `09:12:05 ` before an event line (nothing without a time).
fn at(ts: Option<f64>) -> String {
    ts.map(|t| format!("{} ", clock(t))).unwrap_or_default()
}

/// One line of `gpuctl events` for the power kinds (`wake`, `sleep`,
/// `power`) and the state changes; `raw` is the line as it came.
pub fn event_line(e: &Event, raw: &Value) -> String {
    match e {
        Event::Wake(w) => format!(
            "{}wake   GPU {} {} ({}): {}{}",
            at(w.ts),
            w.gpu,
            w.device,
            w.role.name(),
            cause(w),
            w.what
                .as_deref()
                .map(|w| format!(" [{w}]"))
                .unwrap_or_default()
        ),
        Event::Sleep(v) => format!(
            "{}sleep  GPU {} {}: {}{}",
            at(v.ts),
            v.gpu,
            v.pci,
            opt(v.power_state.as_deref()),
            v.awake_ms
                .map(|ms| format!(" after {} awake", seconds(ms)))
                .unwrap_or_default()
        ),
        Event::Power(v) => format!(
            "power  GPU {} {}: {} ({})",
            v.gpu,
            v.pci,
            opt(v.power_state.as_deref()),
            v.runtime_status
        ),
        // State changes (mode, blocked, grant) read as a sentence.
        _ => match crate::desktop::model::describe(e) {
            Some((what, detail)) if detail.is_empty() => what,
            Some((what, detail)) => format!("{what}: {detail}"),
            None => raw.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A payload from test JSON (the fields a test leaves out that the
    /// type needs come from `base`).
    fn typed<T: serde::de::DeserializeOwned>(base: Value, v: Value) -> T {
        let mut b = base;
        if let (Some(o), Value::Object(v)) = (b.as_object_mut(), v) {
            o.extend(v);
        }
        serde_json::from_value(b).unwrap()
    }

    fn wake(v: Value) -> Wake {
        typed(json!({"gpu": 1, "role": "gpu"}), v)
    }

    fn event(v: Value) -> Event {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn status_line_reads_like_a_sentence() {
        let d: StatusData = typed(
            json!({"daemon": {"pid": 1}, "mode": "hybrid"}),
            json!({"gpus": [{"id": 1, "pci": "0000:01:00.0", "power_state": "D3cold", "runtime_status": "suspended",
            "runtime_pm": {"since": 0.0, "since_start": {"asleep_pct": 97.8, "asleep_s": 97.8, "awake_s": 2.2},
              "since_boot": {"asleep_pct": 99.0, "asleep_s": 990.0, "awake_s": 10.0},
              "counters_reset": false, "wakes": 3,
              "last_wake": {"gpu": 1, "role": "gpu", "comm": "lspci", "tgid": 4242, "uid": 1000, "kworker": false,
                            "op": "read", "file": "/sys/bus/pci/devices/0000:01:00.0/config",
                            "awake_ms": 2100}}},
            {"id": 0, "pci": "0000:00:02.0", "runtime_pm": null}]}),
        );
        let out = status_lines(&d);
        let line = out.lines().nth(1).unwrap();
        assert!(line.starts_with("GPU 1: asleep 97.8 % since "), "{out}");
        assert!(
            line.ends_with(
                " (D3cold) · 3 wakes · last: lspci (pid 4242, uid 1000) read config, awake 2.1 s"
            ),
            "{out}"
        );
        assert!(
            out.contains("since boot: asleep 99.0 % (16 min asleep, 10 s awake)"),
            "{out}"
        );
        assert!(!out.contains("GPU 0"), "{out}");
    }

    #[test]
    fn event_lines() {
        let wake = json!({"event": "wake", "gpu": 1, "device": "0000:01:00.0", "role": "gpu",
            "comm": "lspci", "tgid": 194, "uid": 0, "kworker": false, "op": "read",
            "file": "/sys/bus/pci/devices/0000:01:00.0/config",
            "what": "read /sys/bus/pci/devices/0000:01:00.0/config"});
        assert!(event_line(&event(wake.clone()), &wake).ends_with(
            "wake   GPU 1 0000:01:00.0 (gpu): lspci (pid 194, uid 0) read config \
             [read /sys/bus/pci/devices/0000:01:00.0/config]"
        ));
        let sleep = json!({"event": "sleep", "gpu": 1, "pci": "0000:01:00.0", "awake_ms": 27,
            "power_state": "D3cold"});
        assert_eq!(
            event_line(&event(sleep.clone()), &sleep),
            "sleep  GPU 1 0000:01:00.0: D3cold after 27 ms awake"
        );
        let power = json!({"event": "power", "gpu": 1, "pci": "0000:01:00.0",
            "power_state": "D0", "runtime_status": "active"});
        assert_eq!(
            event_line(&event(power.clone()), &power),
            "power  GPU 1 0000:01:00.0: D0 (active)"
        );
        // Issue 18 F2: a GPU automation left for a display server, its name
        // through the sanitizer (`events` prints `human` of the line).
        let held = json!({"event": "held", "gpu": 1, "pci": "0000:01:00.0",
            "mode": "integrated", "auto": true, "pid": 2210, "comm": "gnome\u{1b}[2Jshell",
            "uid": 1000});
        let line = crate::text::human(&event_line(&event(held.clone()), &held)).into_owned();
        assert!(
            line.starts_with(
                "GPU 1 left awake for the display server gnome\\x1b[2Jshell (pid 2210): \
                 automation's mode integrated would block it"
            ),
            "{line}"
        );
        let theirs = json!({"event": "held", "gpu": 1, "mode": "smart", "auto": false,
            "pid": null, "comm": null, "uid": null});
        assert!(event_line(&event(theirs.clone()), &theirs).starts_with(
            "GPU 1 left awake for the display server another user's process: the mode smart"
        ));
    }

    #[test]
    fn kworker_and_unknown_causes() {
        assert_eq!(
            cause(&wake(
                json!({"comm": "kworker/1:2", "tgid": 77, "kworker": true})
            )),
            "kworker/1:2 (kernel thread, pid 77)"
        );
        assert_eq!(cause(&wake(json!({"comm": null}))), "unknown cause");
    }

    #[test]
    fn list_notes_name_the_fix() {
        let mut g = crate::gpu::test_gpu(1, "0000:01:00.0", "10de", false);
        g.offload = true;
        g.sleep = serde_json::from_value(json!({"can_sleep": false, "d3cold": false,
            "blockers": [{"effect": "no_sleep", "problem": "runtime power management off (power/control = on): it never sleeps, blocked or not",
                          "fix": "echo auto > /sys/bus/pci/devices/0000:01:00.0/power/control\n(persistently…)"}]}))
        .unwrap();
        let d = ListData {
            schema: 1,
            mode: None,
            backend: None,
            gpus: vec![ListGpu {
                gpu: g,
                runtime_pm: None,
                power_off: None,
            }],
        };
        let out = list_notes(&d);
        assert!(
            out.starts_with("GPU 1 can sleep: no: runtime power management off"),
            "{out}"
        );
        assert!(
            out.contains("fix: echo auto > /sys/bus/pci/devices/0000:01:00.0/power/control\n"),
            "{out}"
        );
        assert!(!out.contains("persistently"), "{out}");
    }
}
