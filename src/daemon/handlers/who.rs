//! `who`: processes holding GPU nodes open. Every holder to root and the
//! group; a plain user sees their own processes and a count of the
//! others'. One procfs scan serves every `who` within
//! [`SHARED_READ_WINDOW`].

use std::time::Instant;

use super::super::server::Conn;
use super::super::wiring::SHARED_READ_WINDOW;
use super::super::Daemon;
use super::{viewer, Rejection};
use crate::proto::data::WhoData;
use crate::proto::redact::Redact;
use crate::{gpu, procs};

pub(super) fn who(d: &mut Daemon, arg: Option<&str>, conn: &Conn) -> Result<WhoData, Rejection> {
    let only = arg
        .map(|a| d.core.inventory().find(a).map(|g| g.id))
        .transpose()
        .map_err(Rejection::UnknownGpu)?;
    let now = Instant::now();
    let fresh = d
        .who_cache
        .as_ref()
        .is_some_and(|(t, _)| now.duration_since(*t) < SHARED_READ_WINDOW);
    if !fresh {
        let all = procs::holders(&d.core.roots.procfs, &gpu::node_owners(d.core.inventory()));
        d.who_cache = Some((now, all));
    }
    let all = d
        .who_cache
        .as_ref()
        .map(|(_, h)| h.as_slice())
        .unwrap_or(&[]);
    Ok(WhoData {
        holders: all
            .iter()
            .filter(|h| only.is_none_or(|o| o == h.gpu))
            .cloned()
            .collect(),
        hidden: Some(0),
    }
    .for_viewer(viewer(conn)))
}
