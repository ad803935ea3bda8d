//! `list` and `status`.

use super::super::grants::Grants;
use super::super::server::Conn;
use super::super::{push, Daemon};
use super::viewer;
use super::Rejection;
use crate::policy;
use crate::proto::data::{DaemonInfo, HeldGpu, ListData, ListGpu, StatusData, StatusGpu, SCHEMA};
use crate::proto::redact::{Redact, Viewer};

pub(super) fn list(d: &mut Daemon, viewer: Viewer) -> ListData {
    let mut gpus: Vec<ListGpu> = d
        .core
        .gpus_with_blocked()
        .into_iter()
        .map(|gpu| ListGpu {
            power_off: Some(d.poweroff.info(gpu.pci).cloned()),
            gpu,
            runtime_pm: None,
        })
        .collect();
    d.power.annotate_list(&mut gpus);
    ListData {
        schema: SCHEMA,
        mode: Some(d.core.choice().mode),
        backend: Some(d.core.enforcer.backend()),
        gpus,
    }
    .for_viewer(viewer)
}

pub(super) fn status(d: &mut Daemon, conn: &Conn) -> Result<StatusData, Rejection> {
    let (grants, grants_hidden, grants_not_listed) =
        d.grants.view(&mut d.core.enforcer, viewer(conn));
    let grants_full = d.core.enforcer.grants_full().unwrap_or(0);
    let max_grants = d.core.config().max_grants;
    let grant_share = Grants::share_view(&mut d.core.enforcer, max_grants);
    let denied = d.core.enforcer.denied_counts()?;
    let mut gpus: Vec<StatusGpu> = d
        .core
        .gpus_with_blocked()
        .into_iter()
        .map(|g| StatusGpu {
            id: g.id,
            pci: Some(g.pci),
            name: g.name,
            default: g.default,
            blocked: g.blocked,
            power_state: g.power_state,
            runtime_status: g.runtime_status,
            denied_opens: denied.get(g.id as usize).copied().unwrap_or(0),
            runtime_pm: None,
            power_off: d.poweroff.info(g.pci).cloned(),
        })
        .collect();
    d.power.annotate_status(&mut gpus);
    let core = &d.core;
    let backend = core.enforcer.backend();
    let auto = d.auto.json(&core.config().auto, core.choice().mode);
    let held_by_display_server = core
        .plan()
        .skipped
        .iter()
        .filter_map(|s| {
            let h = s.holder.as_ref()?;
            Some(HeldGpu {
                gpu: s.gpu,
                auto: auto.active,
                pid: Some(h.pid),
                comm: Some(h.comm.clone()),
                uid: Some(h.uid),
            })
        })
        .collect();
    Ok(StatusData {
        schema: SCHEMA,
        daemon: DaemonInfo {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_s: d.started.elapsed().as_secs(),
        },
        backend: Some(backend),
        backend_limits: backend.limits().to_string(),
        cgroup: core.enforcer.cgroup_path().map(|p| p.to_path_buf()),
        smart_hooks: core.enforcer.smart_attached(),
        events: core.enforcer.events_fd().is_some(),
        attached: core.enforcer.attached(),
        mode: core.choice().mode,
        force: core.choice().force,
        note: core.note().clone(),
        modes: push::modes(core.inventory(), core.choice()),
        may_change: conn.privileged || conn.seat,
        auto: Some(auto),
        state_not_saved: core.save_error().clone(),
        grants,
        grants_hidden,
        grants_refused_map_full: grants_full,
        grants_not_listed,
        grant_share,
        env_grants: core.config().env_grants,
        blocked_nodes: core
            .plan()
            .nodes
            .iter()
            .filter(|(_, r)| r.flags & policy::RULE_ONLY_HIDE == 0)
            .map(|(d, _)| *d)
            .collect(),
        gpus,
        power_monitor: Some(d.power.status_json()),
        held_by_display_server,
    }
    .for_viewer(viewer(conn)))
}
