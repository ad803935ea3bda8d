//! `list` and `status`.

use serde_json::{json, Value};

use super::super::server::Conn;
use super::super::{power, push, Daemon};
use super::viewer;
use super::Rejection;
use crate::policy;

pub(super) fn list(d: &mut Daemon, viewer: power::Viewer) -> Value {
    let mut gpus: Vec<Value> = d
        .core
        .gpus_with_blocked()
        .iter()
        .filter_map(|g| serde_json::to_value(g).ok())
        .collect();
    d.power.annotate(&mut gpus, viewer);
    json!({
        "schema": 1,
        "mode": d.core.choice().mode,
        "backend": d.core.enforcer.backend(),
        "gpus": gpus,
    })
}

pub(super) fn status(d: &mut Daemon, conn: &Conn) -> Result<Value, Rejection> {
    let grants = d
        .grants
        .view(&d.core.enforcer, conn.peer.as_ref(), conn.privileged);
    let grants_full = d.core.enforcer.grants_full().unwrap_or(0);
    let denied = d.core.enforcer.denied_counts()?;
    let mut gpus: Vec<Value> = d
        .core
        .gpus_with_blocked()
        .into_iter()
        .map(|g| {
            json!({
                "id": g.id,
                "pci": g.pci,
                "name": g.name,
                "default": g.default,
                "blocked": g.blocked,
                "power_state": g.power_state,
                "runtime_status": g.runtime_status,
                "denied_opens": denied.get(g.id as usize).copied().unwrap_or(0),
            })
        })
        .collect();
    d.power.annotate(&mut gpus, viewer(conn));
    let core = &d.core;
    Ok(json!({
        "schema": 1,
        "daemon": {
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": d.started.elapsed().as_secs(),
        },
        "backend": core.enforcer.backend(),
        "backend_limits": core.enforcer.backend().limits(),
        "cgroup": core.enforcer.cgroup_path(),
        "smart_hooks": core.enforcer.smart_attached(),
        "events": core.enforcer.events_fd().is_some(),
        "attached": core.enforcer.attached(),
        "mode": core.choice().mode,
        "force": core.choice().force,
        "note": core.note(),
        "modes": push::modes(core.inventory(), core.choice()),
        "may_change": conn.privileged,
        "auto": d.auto.json(&core.config().auto, core.choice().mode),
        "state_not_saved": core.save_error(),
        "grants": grants["shown"],
        "grants_hidden": grants["hidden"],
        "grants_refused_map_full": grants_full,
        "env_grants": core.config().env_grants,
        "blocked_nodes": core
            .plan()
            .nodes
            .iter()
            .filter(|(_, r)| r.flags & policy::RULE_ONLY_HIDE == 0)
            .map(|(d, _)| *d)
            .collect::<Vec<_>>(),
        "gpus": gpus,
        "power_monitor": d.power.status_json(),
    }))
}
