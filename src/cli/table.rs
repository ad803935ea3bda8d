//! Aligned tables for people. Input is the same JSON scripts get, so the
//! table can never show something the JSON does not say.

use serde_json::Value;

/// Left-aligned columns, two spaces apart, no trailing blanks.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(x) => x.clone(),
        Value::Array(a) => a.iter().map(s).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// `NVIDIA GA107M [GeForce RTX 3050 Mobile]`; unknown parts left out.
fn name(g: &Value) -> String {
    let parts: Vec<&str> = [&g["vendor"], &g["name"]]
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    if parts.is_empty() {
        format!(
            "unknown device {}:{}",
            s(&g["vendor_id"]),
            s(&g["device_id"])
        )
    } else {
        parts.join(" ")
    }
}

fn power(g: &Value) -> String {
    match (g["power_state"].as_str(), g["runtime_status"].as_str()) {
        (Some(p), Some(r)) => format!("{p} ({r})"),
        (Some(p), None) => p.to_string(),
        (None, Some(r)) => r.to_string(),
        (None, None) => "-".to_string(),
    }
}

fn role(g: &Value) -> String {
    let mut r = if g["default"] == true {
        "default"
    } else {
        "offload"
    }
    .to_string();
    match g["discrete"].as_bool() {
        Some(true) => r.push_str(", discrete"),
        Some(false) => r.push_str(", integrated"),
        None => {}
    }
    r
}

fn nodes(g: &Value) -> String {
    let mut n: Vec<String> = ["card", "render"]
        .iter()
        .filter_map(|k| g[*k].as_str().map(str::to_string))
        .collect();
    if let Some(m) = g["nvidia_minor"].as_u64() {
        n.push(format!("nvidia{m}"));
    }
    if n.is_empty() {
        "-".to_string()
    } else {
        n.join(" ")
    }
}

fn displays(g: &Value) -> String {
    let d: Vec<String> = g["displays"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["status"] == "connected")
        .filter_map(|d| d["connector"].as_str().map(str::to_string))
        .collect();
    if d.is_empty() {
        "-".to_string()
    } else {
        d.join(",")
    }
}

fn blocked(v: &Value) -> String {
    match v.as_bool() {
        Some(true) => "yes".to_string(),
        Some(false) => "no".to_string(),
        None => "-".to_string(),
    }
}

/// `gpuctl list`.
pub fn list(data: &Value) -> String {
    let gpus = data["gpus"].as_array().cloned().unwrap_or_default();
    let mut out = match data["mode"].as_str() {
        Some(m) => format!("mode: {m} (backend: {})\n", s(&data["backend"])),
        None => "mode: unknown (the daemon is not running)\n".to_string(),
    };
    if gpus.is_empty() {
        out.push_str("No GPU found.\n");
        return out;
    }
    let rows: Vec<Vec<String>> = gpus
        .iter()
        .map(|g| {
            vec![
                s(&g["id"]),
                s(&g["pci"]),
                name(g),
                s(&g["driver"]),
                nodes(g),
                role(g),
                displays(g),
                power(g),
                blocked(&g["blocked"]),
            ]
        })
        .collect();
    out.push_str(&render(
        &[
            "ID", "PCI", "NAME", "DRIVER", "NODES", "ROLE", "DISPLAYS", "POWER", "BLOCKED",
        ],
        &rows,
    ));
    out
}

/// `gpuctl status`.
pub fn status(d: &Value) -> String {
    let mut out = format!(
        "daemon:   pid {}, version {}, up {} s\nbackend:  {} ({}{})\n          {}\nmode:     {}{}\n",
        s(&d["daemon"]["pid"]),
        s(&d["daemon"]["version"]),
        s(&d["daemon"]["uptime_s"]),
        s(&d["backend"]),
        d["cgroup"]
            .as_str()
            .map(|c| format!("on cgroup {c}: "))
            .unwrap_or_default(),
        if d["attached"] == true { "programs attached" } else { "nothing attached" },
        s(&d["backend_limits"]),
        s(&d["mode"]),
        if d["force"] == true { " (--force)" } else { "" },
    );
    if let Some(why) = auto_why(&d["auto"]) {
        out.push_str(&format!("why:      {why}\n"));
    }
    if let Some(n) = d["note"].as_str() {
        out.push_str(&format!("note:     {n}\n"));
    }
    if let Some(n) = d["state_not_saved"].as_str() {
        out.push_str(&format!(
            "WARNING:  the mode is not saved ({n}); it will not survive a restart\n"
        ));
    }
    let rows: Vec<Vec<String>> = d["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            vec![
                s(&g["id"]),
                s(&g["pci"]),
                s(&g["name"]),
                if g["default"] == true {
                    "default"
                } else {
                    "offload"
                }
                .to_string(),
                blocked(&g["blocked"]),
                power(g),
                s(&g["denied_opens"]),
            ]
        })
        .collect();
    out.push_str(&render(
        &[
            "ID",
            "PCI",
            "NAME",
            "ROLE",
            "BLOCKED",
            "POWER",
            "DENIED OPENS",
        ],
        &rows,
    ));
    if d["mode"] == "smart" {
        out.push_str(&smart_status(d));
    }
    out.trim_end().to_string()
}

/// The smart-mode part of `gpuctl status`: hooks, settings, grants.
fn smart_status(d: &Value) -> String {
    let grants = d["grants"].as_array().cloned().unwrap_or_default();
    let mut out = format!(
        "\nsmart mode: fork/exec hooks {}; DRI_PRIME grants {}; {} granted process(es)",
        if d["smart_hooks"] == true {
            "attached"
        } else {
            "detached"
        },
        if d["env_grants"] == true { "on" } else { "off" },
        grants.len()
    );
    let full = d["grants_refused_map_full"].as_u64().unwrap_or(0);
    if full > 0 {
        out.push_str(&format!(
            "; {full} grant(s) refused: the grant map was full"
        ));
    }
    out.push('\n');
    if !grants.is_empty() {
        let rows: Vec<Vec<String>> = grants
            .iter()
            .map(|g| {
                vec![
                    s(&g["pid"]),
                    s(&g["comm"]),
                    s(&g["how"]),
                    s(&g["gpus"]),
                    if g["only"] == true { "only" } else { "" }.to_string(),
                ]
            })
            .collect();
        out.push_str(&render(
            &["PID", "COMMAND", "GRANTED BY", "GPUS", ""],
            &rows,
        ));
    }
    out
}

/// `gpuctl who`.
pub fn who(d: &Value) -> String {
    let holders = d["holders"].as_array().cloned().unwrap_or_default();
    if holders.is_empty() {
        return "No process holds a GPU open.\n".to_string();
    }
    let rows: Vec<Vec<String>> = holders
        .iter()
        .map(|h| {
            vec![
                s(&h["gpu"]),
                s(&h["pid"]),
                s(&h["comm"]),
                s(&h["path"]),
                s(&h["node"]),
            ]
        })
        .collect();
    render(&["GPU", "PID", "COMMAND", "PATH", "NODE"], &rows)
}

/// `gpuctl app list`.
pub fn apps(apps: &[Value]) -> String {
    if apps.is_empty() {
        return "No app rules.".to_string();
    }
    let rows: Vec<Vec<String>> = apps
        .iter()
        .map(|a| {
            vec![
                if a["allow"] == true { "allow" } else { "deny" }.to_string(),
                s(&a["gpu"]),
                s(&a["path"]),
                a["error"]
                    .as_str()
                    .map(|e| format!("not in force: {e}"))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    render(&["RULE", "GPU", "PATH", "NOTE"], &rows)
        .trim_end()
        .to_string()
}

pub fn event_header() -> String {
    format!("{:<8}  {:<16}  {:<4}  NODE", "PID", "COMMAND", "GPU")
}

/// One line of `gpuctl events`.
pub fn event(v: &Value) -> String {
    let node = match v["node"].as_str() {
        Some("0:0") => "sysfs file".to_string(),
        _ => s(&v["node"]),
    };
    format!(
        "{:<8}  {:<16}  {:<4}  {node}",
        s(&v["pid"]),
        s(&v["comm"]),
        s(&v["gpu"])
    )
}

/// Why the mode is in force, from the `auto` object of `status`:
/// `auto: on battery since 10:42`. `None` when automation is not set up.
fn auto_why(a: &Value) -> Option<String> {
    let why = a["why"].as_str()?;
    if !why.starts_with("auto:") {
        return (a["active"] == true || why.starts_with("manual")).then(|| why.to_string());
    }
    Some(match a["since"].as_u64().and_then(local_hhmm) {
        Some(t) if why.starts_with("auto: on ") => format!("{why} since {t}"),
        _ => why.to_string(),
    })
}

/// `HH:MM` in the local time zone.
fn local_hhmm(secs: u64) -> Option<String> {
    let t = libc::time_t::try_from(secs).ok()?;
    // SAFETY: `tm` is plain old data, zero is a valid bit pattern; both
    // pointers are valid for the call and localtime_r is thread-safe.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::localtime_r(&t, &mut tm) };
    (!r.is_null()).then(|| format!("{:02}:{:02}", tm.tm_hour, tm.tm_min))
}

/// `gpuctl auto [on|off|status]`.
pub fn auto(d: &Value) -> String {
    let r = &d["rules"];
    let mut out = format!(
        "automation: {}{}\nrules:      on_battery = {}, on_ac = {}, external_display = {}\npower:      {}\nmode:       {}",
        if d["enabled"] == true { "on" } else { "off (gpuctl auto on)" },
        if d["active"] == true || d["enabled"] != true {
            ""
        } else {
            " (no rule set: gpuctl config auto.on_battery integrated)"
        },
        s(&r["on_battery"]),
        s(&r["on_ac"]),
        s(&r["external_display"]),
        match d["power"].as_str() {
            Some("ac") => "AC",
            Some("battery") => "battery",
            _ => "unknown",
        },
        s(&d["mode"]),
    );
    if let Some(why) = auto_why(d).or_else(|| d["why"].as_str().map(str::to_string)) {
        out.push_str(&format!(" ({why})"));
    }
    if d["resume_watch"] == false {
        out.push_str("\nnote:       not re-evaluated after a resume (no timerfd)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_columns() {
        let t = render(
            &["ID", "NAME"],
            &[
                vec!["0".into(), "a".into()],
                vec!["10".into(), "bbb".into()],
            ],
        );
        assert_eq!(t, "ID  NAME\n0   a\n10  bbb\n");
    }

    #[test]
    fn empty_list_says_so() {
        let t = list(&serde_json::json!({"schema":1,"mode":null,"backend":null,"gpus":[]}));
        assert!(t.contains("No GPU found."));
        assert!(t.contains("daemon is not running"));
    }
}
