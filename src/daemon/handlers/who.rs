//! `who`: processes holding GPU nodes open. Every holder to root and the
//! group; a plain user sees their own processes and a count of the
//! others'. One scan serves every `who` for a while, and each uid starts
//! one at most so often ([`holders::Scans`]); the answer says how old the
//! result is.

use super::super::server::Conn;
use super::super::Daemon;
use super::{viewer, Rejection};
use crate::gpu;
use crate::proto::data::WhoData;
use crate::proto::redact::Redact;

pub(super) fn who(d: &mut Daemon, arg: Option<&str>, conn: &Conn) -> Result<WhoData, Rejection> {
    let only = arg
        .map(|a| d.core.inventory().find(a).map(|g| g.id))
        .transpose()
        .map_err(Rejection::UnknownGpu)?;
    let owners = gpu::node_owners(d.core.inventory());
    let core = &mut d.core;
    // A peer whose credentials were not read shares one anonymous bucket.
    let uid = conn.peer.as_ref().map_or(u32::MAX, |p| p.uid);
    let (all, age) = d
        .who_scans
        .who(uid, &mut core.enforcer, &core.roots.procfs, &owners);
    Ok(WhoData {
        holders: all
            .into_iter()
            .filter(|h| only.is_none_or(|o| o == h.gpu))
            .collect(),
        hidden: Some(0),
        age_ms: Some(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
    }
    .for_viewer(viewer(conn)))
}
