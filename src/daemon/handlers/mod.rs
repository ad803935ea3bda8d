//! One request: authorization (from the credentials captured at connect),
//! a fresh enough view of the hardware, the handler, and the audit line.
//! Handlers return their typed answer (`proto::data`) or a `Rejection`;
//! [`Rejection::into_response`] maps a rejection to its protocol code.

mod app;
mod auto;
mod config;
mod events;
mod modes;
mod run;
mod status;
mod who;

use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use super::core::describe_blocked;
use super::log::log;
use super::reject::{internal, Rejection};
use super::server::Conn;
use super::Daemon;
use crate::proto::data::PingData;
use crate::proto::redact::Viewer;
use crate::proto::{Code, Request, Response};

/// Who is looking: root and the group see other users' processes, a
/// plain user their own (`proto::redact`).
pub(super) fn viewer(c: &Conn) -> Viewer {
    if c.privileged {
        Viewer::ALL
    } else {
        Viewer::user(c.peer.as_ref().map_or(u32::MAX, |p| p.uid))
    }
}

/// A handler's typed answer as the response's `data`.
pub(super) fn data<T: Serialize>(t: T) -> Result<Value, Rejection> {
    serde_json::to_value(t).map_err(|e| internal(format!("encoding the answer: {e}")))
}

/// `passed`: the descriptor that came with the request line, if any (the
/// server lets one through only for a request that takes it).
pub(super) fn handle(
    d: &mut Daemon,
    req: Request,
    conn: &Conn,
    passed: Option<std::os::fd::OwnedFd>,
) -> Response {
    if req.is_change() {
        // Decided from the credentials captured at connect (uid, gid,
        // supplementary groups), never from /proc at request time.
        if !may(conn, &req) {
            let seat = if d.core.config().seat_may_change {
                ", or (for the mode and block/unblock) being the user of the active local \
                 session at the seat"
            } else {
                ""
            };
            return Response::err(
                Code::PermissionDenied,
                format!(
                    "changing the GPU mode needs root or membership in the `{}` group{seat}",
                    d.core.config().group
                ),
            );
        }
    }
    let t0 = Instant::now();
    // Reads report live power state, so they re-read sysfs. Changes use
    // the inventory uevents keep current (a node, GPU or display
    // appearing re-plans at once), unless uevents are unavailable.
    // A burst of uevents may still owe a re-plan: any request takes it
    // first, so nothing is answered or changed from a stale inventory.
    // `get` answers from the choice and the plan alone, which uevents keep
    // current: no discovery for it.
    let owed = d.burst.take_due(t0, true);
    let plan_only = matches!(req, Request::Get {}) && d.uevents.is_some();
    if owed || (req.is_change() && d.uevents.is_none()) {
        d.refresh();
    } else if !req.is_change() && !plan_only {
        d.refresh_for_read();
    }
    let resp = match dispatch(d, &req, conn, passed) {
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

fn dispatch(
    d: &mut Daemon,
    req: &Request,
    conn: &Conn,
    passed: Option<std::os::fd::OwnedFd>,
) -> Result<Value, Rejection> {
    match req {
        Request::Ping {} => data(PingData {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }),
        Request::List {} => data(status::list(d, viewer(conn))),
        Request::Get {} => data(d.core.mode_json()),
        Request::Status {} => data(status::status(d, conn)?),
        Request::Who { gpu } => data(who::who(d, gpu.as_deref(), conn)?),
        Request::Set { mode, force } => data(modes::set(d, mode, *force)?),
        Request::Block { gpu, force } => data(modes::block(d, gpu, *force, true)?),
        Request::Unblock { gpu } => data(modes::block(d, gpu, false, false)?),
        Request::Grant { gpu, only } => {
            data(run::grant(d, conn.peer.as_ref(), gpu.as_deref(), *only)?)
        }
        Request::App {
            action,
            path,
            gpu,
            fd,
        } => {
            let passed = match (fd, passed) {
                (true, Some(f)) => Some(f),
                (true, None) => {
                    return Err(Rejection::BadRequest(
                        "\"fd\": true, but no descriptor came with the request line \
                         (SCM_RIGHTS, with its first byte)"
                            .into(),
                    ))
                }
                (false, _) => None,
            };
            app::app(d, *action, path.as_deref(), gpu.as_deref(), passed)
        }
        Request::Config { key, value } => {
            data(config::config(d, key.as_deref(), value.as_deref())?)
        }
        Request::Wakes { gpu } => data(events::wakes(d, gpu.as_deref(), conn)?),
        Request::Auto { action } => data(auto::auto(d, *action)?),
        Request::Events {} => data(events::subscribe(d)?),
    }
}

/// What the user at the seat may change: the mode and blocks, not the
/// config or the app rules (those stay with root and the group).
fn seat_may(req: &Request) -> bool {
    matches!(
        req,
        Request::Set { .. } | Request::Block { .. } | Request::Unblock { .. }
    )
}

/// Whether this connection may make this change.
pub(super) fn may(conn: &Conn, req: &Request) -> bool {
    conn.privileged || (conn.seat && seat_may(req))
}

/// The audit line of a change. Refusals of unprivileged requests are not
/// logged: anyone could flood the journal with them.
fn audit(d: &Daemon, req: &Request, conn: &Conn, resp: &Response, t0: Instant) {
    if !req.is_change() || !may(conn, req) {
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
