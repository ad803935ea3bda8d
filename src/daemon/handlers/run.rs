//! `gpuctl run` (the `grant` request).

use super::super::auth::Peer;
use super::super::log::log;
use super::super::reject::internal;
use super::super::Daemon;
use super::Rejection;
use crate::policy::{Choice, Mode};
use crate::proto::data::{EnvVars, GrantData};

/// Grants the caller's own process (never another one: the pid comes from
/// SO_PEERCRED) access to one GPU.
pub(super) fn grant(
    d: &mut Daemon,
    peer: Option<&Peer>,
    arg: Option<&str>,
    only: bool,
) -> Result<GrantData, Rejection> {
    let Some(peer) = peer else {
        return Err(internal("cannot identify the caller (SO_PEERCRED failed)"));
    };
    let gpu = match d.core.inventory().run_target(arg) {
        Ok(g) => g.clone(),
        Err(e) if arg.is_some() => return Err(Rejection::UnknownGpu(e)),
        Err(e) => return Err(Rejection::Refused(format!("refused: {e}"))),
    };
    let granted = match d.core.choice().mode {
        Mode::Hybrid => false,
        Mode::Smart => {
            // The first exclusive grant puts the default GPU's hide
            // rules in the map, before the grant (and the exec) exist.
            if only && !d.core.choice().only_grants {
                d.core.change(Choice {
                    only_grants: true,
                    ..d.core.choice().clone()
                })?;
            }
            let max_grants = d.core.config().max_grants;
            d.grants
                .grant_peer(&mut d.core.enforcer, max_grants, peer, &gpu, only)?;
            let pid = peer.pid;
            d.push.grant(pid, peer.uid, &peer.comm, gpu.id, only);
            log!(
                "granted pid {} ({}) {}{}",
                pid,
                peer.comm,
                gpu.label(),
                if only { " exclusively" } else { "" }
            );
            true
        }
        mode => {
            return Err(Rejection::Refused(format!(
                "refused: the offload GPUs are blocked for every process in {mode} mode; \
                 switch to smart mode (`gpuctl set smart`) to let chosen programs use them"
            )))
        }
    };
    // The environment `gpuctl run` execs with: the loaders' offload
    // variables for this GPU (with several NVIDIA GPUs, the provider).
    let env = gpu
        .offload_env(d.core.inventory())
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    Ok(GrantData {
        granted,
        mode: d.core.choice().mode,
        gpu: Some(gpu),
        env: Some(EnvVars(env)),
    })
}
