//! `gpuctl wakes` and `gpuctl events` (the subscription; what is pushed
//! comes from the loop, push.rs and power.rs).

use serde_json::{json, Value};

use super::super::server::Conn;
use super::super::Daemon;
use super::{viewer, Rejection};

pub(super) fn wakes(d: &mut Daemon, gpu: Option<&str>, conn: &Conn) -> Result<Value, Rejection> {
    d.power
        .wakes_json(d.core.inventory(), gpu, viewer(conn))
        .map_err(Rejection::UnknownGpu)
}

pub(super) fn subscribe(d: &mut Daemon) -> Result<Value, Rejection> {
    d.core.enforcer.set_events(true)?;
    Ok(json!({ "subscribed": true }))
}
