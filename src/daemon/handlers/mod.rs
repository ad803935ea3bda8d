//! One request: authorization (from the credentials captured at connect),
//! a fresh enough view of the hardware, the handler, and the audit line.
//! Handlers return `Result<Value, Rejection>`; [`Rejection::into_response`]
//! maps a rejection to its protocol code.

mod app;
mod auto;
mod config;
mod events;
mod modes;
mod run;
mod status;
mod who;

use std::time::Instant;

use serde_json::{json, Value};

use super::core::describe_blocked;
use super::log::log;
use super::power;
use super::reject::Rejection;
use super::server::Conn;
use super::Daemon;
use crate::proto::{Code, Request, Response};

/// Who sees other users' processes in power reports (power.rs).
pub(super) fn viewer(c: &Conn) -> power::Viewer {
    if c.privileged {
        None
    } else {
        Some(c.peer.as_ref().map_or(u32::MAX, |p| p.uid))
    }
}

pub(super) fn handle(d: &mut Daemon, req: Request, conn: &Conn) -> Response {
    if req.is_change() {
        // Decided from the credentials captured at connect (uid, gid,
        // supplementary groups), never from /proc at request time.
        if !conn.privileged {
            return Response::err(
                Code::PermissionDenied,
                format!(
                    "changing the GPU mode needs root or membership in the `{}` group",
                    d.core.config().group
                ),
            );
        }
    }
    let t0 = Instant::now();
    // Reads report live power state, so they re-read sysfs. Changes use
    // the inventory uevents keep current (a node, GPU or display
    // appearing re-plans at once), unless uevents are unavailable.
    if !req.is_change() {
        d.refresh_for_read();
    } else if d.uevents.is_none() {
        d.refresh();
    }
    let resp = match dispatch(d, &req, conn) {
        Ok(data) => Response::ok(data),
        Err(r) => r.into_response(),
    };
    if resp.ok
        && matches!(
            req,
            Request::Set { .. } | Request::Block { .. } | Request::Unblock { .. }
        )
    {
        let blocking = describe_blocked(d.core.plan());
        d.auto
            .manual(&d.core.config().auto, d.core.choice().mode, &blocking);
    }
    audit(d, &req, conn, &resp, t0);
    resp
}

fn dispatch(d: &mut Daemon, req: &Request, conn: &Conn) -> Result<Value, Rejection> {
    match req {
        Request::Ping {} => Ok(json!({
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
        })),
        Request::List {} => Ok(status::list(d, viewer(conn))),
        Request::Get {} => Ok(d.core.mode_json()),
        Request::Status {} => status::status(d, conn),
        Request::Who { gpu } => who::who(d, gpu.as_deref(), conn),
        Request::Set { mode, force } => modes::set(d, mode, *force),
        Request::Block { gpu, force } => modes::block(d, gpu, *force, true),
        Request::Unblock { gpu } => modes::block(d, gpu, false, false),
        Request::Grant { gpu, only } => run::grant(d, conn.peer.as_ref(), gpu.as_deref(), *only),
        Request::App { action, path, gpu } => app::app(d, *action, path.as_deref(), gpu.as_deref()),
        Request::Config { key, value } => config::config(d, key.as_deref(), value.as_deref()),
        Request::Wakes { gpu } => events::wakes(d, gpu.as_deref(), conn),
        Request::Auto { action } => auto::auto(d, *action),
        Request::Events {} => events::subscribe(d),
    }
}

/// The audit line of a change. Refusals of unprivileged requests are not
/// logged: anyone could flood the journal with them.
fn audit(d: &Daemon, req: &Request, conn: &Conn, resp: &Response, t0: Instant) {
    if !req.is_change() || !conn.privileged {
        return;
    }
    let Some(p) = conn.peer.as_ref() else {
        return;
    };
    log!(
        "{:?} from pid {} uid {} ({}): {} in {:?}",
        req,
        p.pid,
        p.uid,
        p.comm,
        if resp.ok {
            format!("done, blocking {}", describe_blocked(d.core.plan()))
        } else {
            format!(
                "not done: {}",
                resp.error.as_ref().map_or("", |e| e.message.as_str())
            )
        },
        t0.elapsed()
    );
}
