//! Aligned tables for people. Input is the same JSON scripts get, so the
//! table can never show something the JSON does not say.

use crate::automation::Power;
use crate::gpu::{DevNum, Gpu};
use crate::policy::Mode;
use crate::proto::data::{AppEntry, AutoData, ListData, ListGpu, StatusData, WhoData};
use crate::proto::event::Denied;

/// Left-aligned columns, two spaces apart, no trailing blanks.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    // Cells carry names and paths other users chose: control characters
    // shown escaped.
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| crate::text::human(c).into_owned())
                .collect()
        })
        .collect();
    let rows = rows.as_slice();
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

/// A fact for a cell: `-` when unknown.
fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |x| x.to_string())
}

/// `NVIDIA GA107M [GeForce RTX 3050 Mobile]`; unknown parts left out.
fn name(g: &Gpu) -> String {
    let parts: Vec<&str> = [&g.vendor, &g.name]
        .iter()
        .filter_map(|v| v.as_deref())
        .collect();
    if parts.is_empty() {
        format!("unknown device {}:{}", g.vendor_id, g.device_id)
    } else {
        parts.join(" ")
    }
}

pub(super) fn power(power_state: Option<&str>, runtime_status: Option<&str>) -> String {
    match (power_state, runtime_status) {
        (Some(p), Some(r)) => format!("{p} ({r})"),
        (Some(p), None) => p.to_string(),
        (None, Some(r)) => r.to_string(),
        (None, None) => "-".to_string(),
    }
}

fn role(g: &Gpu) -> String {
    let mut r = if g.default { "default" } else { "offload" }.to_string();
    match g.discrete {
        Some(true) => r.push_str(", discrete"),
        Some(false) => r.push_str(", integrated"),
        None => {}
    }
    r
}

fn nodes(g: &Gpu) -> String {
    let mut n: Vec<String> = [&g.card, &g.render]
        .iter()
        .filter_map(|v| (*v).clone())
        .collect();
    if let Some(m) = g.nvidia_minor {
        n.push(format!("nvidia{m}"));
    }
    if n.is_empty() {
        "-".to_string()
    } else {
        n.join(" ")
    }
}

fn displays(g: &Gpu) -> String {
    let d: Vec<String> = g
        .displays
        .iter()
        .filter(|d| d.connected())
        .map(|d| d.connector.clone())
        .collect();
    if d.is_empty() {
        "-".to_string()
    } else {
        d.join(",")
    }
}

fn blocked(v: Option<bool>) -> String {
    match v {
        Some(true) => "yes".to_string(),
        Some(false) => "no".to_string(),
        None => "-".to_string(),
    }
}

/// `gpuctl list`.
pub fn list(data: &ListData) -> String {
    let mut out = match data.mode {
        Some(m) => format!("mode: {m} (backend: {})\n", opt(data.backend)),
        None => "mode: unknown (the daemon is not running)\n".to_string(),
    };
    if data.gpus.is_empty() {
        out.push_str("No GPU found.\n");
        return out;
    }
    let rows: Vec<Vec<String>> = data
        .gpus
        .iter()
        .map(|ListGpu { gpu: g, .. }| {
            vec![
                g.id.to_string(),
                g.pci.to_string(),
                name(g),
                opt(g.driver.as_deref()),
                nodes(g),
                role(g),
                displays(g),
                power(g.power_state.as_deref(), g.runtime_status.as_deref()),
                blocked(g.blocked),
            ]
        })
        .collect();
    out.push_str(&render(
        &[
            "ID", "PCI", "NAME", "DRIVER", "NODES", "ROLE", "DISPLAYS", "POWER", "BLOCKED",
        ],
        &rows,
    ));
    // What the power-off did, as in `status`.
    for ListGpu {
        gpu: g, power_off, ..
    } in &data.gpus
    {
        if let Some(Some(p)) = power_off {
            if !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("power-off: GPU {}: {}\n", g.id, p.summary()));
        }
    }
    out
}

/// `gpuctl status`.
pub fn status(d: &StatusData) -> String {
    let mut out = format!(
        "daemon:   pid {}, version {}, up {} s\nbackend:  {} ({}{})\n          {}\nmode:     {}{}\n",
        d.daemon.pid,
        d.daemon.version,
        d.daemon.uptime_s,
        opt(d.backend),
        d.cgroup
            .as_ref()
            .map(|c| format!("on cgroup {}: ", c.display()))
            .unwrap_or_default(),
        if d.attached { "programs attached" } else { "nothing attached" },
        d.backend_limits,
        d.mode,
        if d.force { " (--force)" } else { "" },
    );
    if let Some(why) = d.auto.as_ref().and_then(auto_why) {
        out.push_str(&format!("why:      {why}\n"));
    }
    if let Some(n) = &d.note {
        out.push_str(&format!("note:     {n}\n"));
    }
    if let Some(n) = &d.state_not_saved {
        out.push_str(&format!(
            "WARNING:  the mode is not saved ({n}); it will not survive a restart\n"
        ));
    }
    let rows: Vec<Vec<String>> = d
        .gpus
        .iter()
        .map(|g| {
            vec![
                g.id.to_string(),
                opt(g.pci),
                opt(g.name.as_deref()),
                if g.default { "default" } else { "offload" }.to_string(),
                blocked(g.blocked),
                power(g.power_state.as_deref(), g.runtime_status.as_deref()),
                g.denied_opens.to_string(),
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
    for g in &d.gpus {
        if let Some(p) = &g.power_off {
            if !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("power-off: GPU {}: {}\n", g.id, p.summary()));
        }
    }
    if d.mode == Mode::Smart {
        out.push_str(&smart_status(d));
    }
    out.trim_end().to_string()
}

/// The smart-mode part of `gpuctl status`: hooks, settings, grants.
fn smart_status(d: &StatusData) -> String {
    let grants = &d.grants;
    let mut out = format!(
        "\nsmart mode: fork/exec hooks {}; DRI_PRIME grants {}; {} granted process(es)",
        if d.smart_hooks {
            "attached"
        } else {
            "detached"
        },
        if d.env_grants { "on" } else { "off" },
        grants.len() as u64 + d.grants_not_listed
    );
    let full = d.grants_refused_map_full;
    if full > 0 {
        out.push_str(&format!(
            "; {full} grant(s) refused: the grant map was full"
        ));
    }
    out.push('\n');
    if let Some(s) = &d.grant_share {
        // Each uid's row the caller sees (a plain user: their own).
        for u in s.uids.iter().filter(|u| u.refused > 0) {
            out.push_str(&format!(
                "uid {}: {} process(es) denied their inherited grant: over this user's share \
                 of the grant map ({} at once; holds {})\n",
                u.uid, u.refused, s.share, u.inherited
            ));
        }
    }
    if !grants.is_empty() {
        let rows: Vec<Vec<String>> = grants
            .iter()
            .map(|g| {
                vec![
                    g.pid.to_string(),
                    opt(g.comm.as_deref()),
                    g.how.as_ref().map_or_else(|| "-".to_string(), wire_name),
                    g.gpus.to_string(),
                    if g.only { "only" } else { "" }.to_string(),
                ]
            })
            .collect();
        out.push_str(&render(
            &["PID", "COMMAND", "GRANTED BY", "GPUS", ""],
            &rows,
        ));
    }
    if d.grants_not_listed > 0 {
        out.push_str(&format!(
            "... and {} more (the first {} are listed)\n",
            d.grants_not_listed,
            grants.len()
        ));
    }
    out
}

/// `gpuctl who`.
pub fn who(d: &WhoData) -> String {
    if d.holders.is_empty() {
        return "No process holds a GPU open.\n".to_string();
    }
    let rows: Vec<Vec<String>> = d
        .holders
        .iter()
        .map(|h| {
            vec![
                h.gpu.to_string(),
                h.pid.to_string(),
                match h.role {
                    Some(crate::procs::HolderRole::FdStore) => format!("{} (fd store)", h.comm),
                    None => h.comm.clone(),
                },
                h.path.clone(),
                h.node.to_string(),
            ]
        })
        .collect();
    render(&["GPU", "PID", "COMMAND", "PATH", "NODE"], &rows)
}

/// `gpuctl app list`.
pub fn apps(apps: &[AppEntry]) -> String {
    if apps.is_empty() {
        return "No app rules.".to_string();
    }
    let rows: Vec<Vec<String>> = apps
        .iter()
        .map(|a| {
            vec![
                if a.allow { "allow" } else { "deny" }.to_string(),
                opt(a.gpu),
                a.path.clone(),
                a.error
                    .as_ref()
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
pub fn event(v: &Denied) -> String {
    let node = if v.node == Some(DevNum::new(0, 0)) {
        "sysfs file".to_string()
    } else {
        opt(v.node)
    };
    let line = format!(
        "{:<8}  {:<16}  {:<4}  {node}",
        opt(v.pid),
        crate::text::human(&opt(v.comm.as_deref())),
        v.gpu
    );
    match &v.why {
        Some(why) => format!("{line:<40}  {why}"),
        None => line,
    }
}

/// Why the mode is in force, from the `auto` object of `status`:
/// `auto: on battery since 10:42`. `None` when automation is not set up.
fn auto_why(a: &AutoData) -> Option<String> {
    let why = a.why.as_deref()?;
    if !why.starts_with("auto:") {
        return (a.active || why.starts_with("manual")).then(|| why.to_string());
    }
    Some(match a.since.and_then(local_hhmm) {
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
pub fn auto(d: &AutoData) -> String {
    let r = &d.rules;
    let mut out = format!(
        "automation: {}{}\nrules:      on_battery = {}, on_ac = {}, external_display = {}\npower:      {}\nmode:       {}",
        if d.enabled { "on" } else { "off (gpuctl auto on)" },
        if d.active || !d.enabled {
            ""
        } else {
            " (no rule set: gpuctl config auto.on_battery integrated)"
        },
        wire_name(&r.on_battery),
        wire_name(&r.on_ac),
        wire_name(&r.external_display),
        match d.power {
            Some(Power::Ac) => "AC",
            Some(Power::Battery) => "battery",
            _ => "unknown",
        },
        d.mode,
    );
    if let Some(why) = auto_why(d).or_else(|| d.why.clone()) {
        out.push_str(&format!(" ({why})"));
    }
    if !d.resume_watch {
        out.push_str("\nnote:       not re-evaluated after a resume (no timerfd)");
    }
    out
}

/// A unit enum value as its JSON string (`integrated`, `unblock`).
fn wire_name<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "-".to_string(),
    }
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
        let t = list(
            &serde_json::from_value(
                serde_json::json!({"schema":1,"mode":null,"backend":null,"gpus":[]}),
            )
            .unwrap(),
        );
        assert!(t.contains("No GPU found."));
        assert!(t.contains("daemon is not running"));
    }
}
