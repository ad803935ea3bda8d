//! `gpuctl wakes` and `gpuctl events` (the subscription; what is pushed
//! comes from the loop, push.rs and power.rs).

use super::super::server::Conn;
use super::super::Daemon;
use super::{viewer, Rejection};
use crate::proto::data::{Subscribed, WakesData};
use crate::proto::redact::Redact;

pub(super) fn wakes(
    d: &mut Daemon,
    gpu: Option<&str>,
    conn: &Conn,
) -> Result<WakesData, Rejection> {
    d.power
        .wakes_json(d.core.inventory(), gpu)
        .map(|w| w.for_viewer(viewer(conn)))
        .map_err(Rejection::UnknownGpu)
}

pub(super) fn subscribe(d: &mut Daemon) -> Result<Subscribed, Rejection> {
    d.core.enforcer.set_events(true)?;
    Ok(Subscribed { subscribed: true })
}
