//! The poll set and one turn of the loop. Each fd is paired with the
//! source it is ([`Src`]); only the sources that exist are in the set
//! (uevents, the resume clock, deny events and the runtime-PM ring buffer
//! may be absent), and what is ready is served by one `match`.
//!
//! What a turn keeps: the stop pipe is drained first; each connection gets
//! at most one request served per turn; the wait is zero while requests
//! are buffered; the server, the watchdog and automation set the deadline;
//! with none of them, the loop sleeps until an fd is ready (no polling).

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::auth::{self, Peer};
use super::handlers::{self, viewer};
use super::lifetime::{self, Signals, Watchdog};
use super::log::log;
use super::seat;
use super::server::{Conn, Server};
use super::Daemon;
use crate::proto::event::{Denied, Event};

/// What an fd in the poll set is. The set holds the sources in this order,
/// which is the order they are served in (the stop pipe first; the
/// listener last, so a client accepted this turn does not shift the
/// indexes of the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Src {
    /// The SIGTERM/SIGINT pipe.
    Stop,
    /// The SIGHUP pipe.
    Reload,
    /// App rules' directories and the socket's directory.
    Inotify,
    /// logind's seats (which sessions are in front of a seat).
    Seats,
    /// Kernel uevents (hot plug, drivers, power supply).
    Uevent,
    /// The resume / clock-set timerfd.
    Clock,
    /// The runtime-PM ring buffer.
    Power,
    /// The enforcer's deny events (only while someone subscribes).
    Denials,
    /// The holder scan's thread has a result.
    Scan,
    /// The power-off's unbind helper has exited (its pidfd).
    Helper,
    /// A display server the plan skipped a GPU for has exited.
    HolderGone(usize),
    /// An accepted client, by its index in `server.conns`.
    Conn(usize),
    /// The listening socket.
    Listener,
}

pub(super) fn serve(d: &mut Daemon, server: &mut Server, sigs: &Signals) -> Result<()> {
    let mut watchdog = Watchdog::from_env();
    loop {
        let now = Instant::now();
        server.reap(now);
        if let Some(w) = &mut watchdog {
            w.tick(now);
        }
        // Nobody listens any more: the kernel stops emitting events.
        if server.subscribers() == 0 && d.core.enforcer.events_fd().is_some() {
            d.core.enforcer.set_events(false)?;
        }
        let deadlines = [
            server.next_deadline(),
            watchdog.as_ref().map(Watchdog::deadline),
            d.auto.deadline(),
            d.burst.deadline(),
            d.poweroff.deadline(),
        ];
        let timeout = timeout(server.has_work(), deadlines, now);
        let ready = match wait(d, server, sigs, timeout) {
            Ok(r) => r,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context("poll"),
        };
        if !turn(d, server, sigs, &ready) {
            return Ok(());
        }
    }
}

/// Requests already buffered are served without sleeping; else the loop
/// sleeps until the earliest deadline, or until an fd is ready.
fn timeout<const N: usize>(
    has_work: bool,
    deadlines: [Option<Instant>; N],
    now: Instant,
) -> PollTimeout {
    if has_work {
        return PollTimeout::ZERO;
    }
    match deadlines.into_iter().flatten().min() {
        Some(t) => {
            PollTimeout::try_from(t.saturating_duration_since(now) + Duration::from_millis(1))
                .unwrap_or(PollTimeout::MAX)
        }
        None => PollTimeout::NONE,
    }
}

/// Waits on every source that exists; returns the ready ones, in the
/// order they are served.
fn wait(
    d: &Daemon,
    server: &Server,
    sigs: &Signals,
    timeout: PollTimeout,
) -> nix::Result<Vec<(Src, PollFlags)>> {
    let input = |fd| PollFd::new(fd, PollFlags::POLLIN);
    let mut set: Vec<(Src, PollFd)> = Vec::with_capacity(8 + server.conns.len());
    set.push((Src::Stop, input(sigs.stop.as_fd())));
    set.push((Src::Reload, input(sigs.reload.as_fd())));
    set.push((Src::Inotify, input(d.apps.fd())));
    set.push((Src::Seats, input(d.seats.fd())));
    if let Some(u) = &d.uevents {
        set.push((Src::Uevent, input(u.as_fd())));
    }
    if let Some(fd) = d.auto.clock_fd() {
        set.push((Src::Clock, input(fd)));
    }
    if let Some(fd) = d.power.fd() {
        set.push((Src::Power, input(fd)));
    }
    if let Some(fd) = d.core.enforcer.events_fd() {
        set.push((Src::Denials, input(fd)));
    }
    if let Some(fd) = d.core.enforcer.holder_scan_fd() {
        set.push((Src::Scan, input(fd)));
    }
    if let Some(fd) = d.poweroff.fd() {
        set.push((Src::Helper, input(fd)));
    }
    set.extend(
        d.core
            .holder_fds()
            .enumerate()
            .map(|(i, fd)| (Src::HolderGone(i), input(fd))),
    );
    let conns = server.conns.iter().enumerate();
    set.extend(conns.map(|(i, c)| (Src::Conn(i), c.poll_fd())));
    set.push((Src::Listener, server.listener_fd()));
    let (srcs, mut fds): (Vec<Src>, Vec<PollFd>) = set.into_iter().unzip();
    poll(&mut fds, timeout)?;
    let revents = fds
        .iter()
        .map(|f| f.revents().unwrap_or(PollFlags::empty()));
    Ok(srcs
        .into_iter()
        .zip(revents)
        .filter(|(_, r)| !r.is_empty())
        .collect())
}

/// Serves what is ready; false when the daemon is to stop.
fn turn(d: &mut Daemon, server: &mut Server, sigs: &Signals, ready: &[(Src, PollFlags)]) -> bool {
    let mut t = Turn {
        now: Instant::now(),
        accept: false,
    };
    // Automation decides once this turn's news of the power source (uevents,
    // the resume clock) is read, and before the other sources are served.
    debug_assert!(ready.windows(2).all(|w| w[0].0 < w[1].0));
    // The end of a burst of GPU uevents: the one re-plan it owes.
    if d.burst.take_due(t.now, false) {
        d.refresh();
    }
    let (news, rest) = ready.split_at(ready.partition_point(|(s, _)| *s <= Src::Clock));
    for &(src, revents) in news {
        if !on_ready(d, server, sigs, &mut t, src, revents) {
            return false;
        }
    }
    d.auto_tick(Instant::now());
    for &(src, revents) in rest {
        on_ready(d, server, sigs, &mut t, src, revents);
    }
    let Turn { now, accept } = t;
    server.serve(now, &mut |req, conn, fd| handlers::handle(d, req, conn, fd));
    if accept {
        let gid = auth::configured_gid(&d.core.config().group);
        let seat = d
            .core
            .config()
            .seat_may_change
            .then_some(d.run_root.as_path());
        server.accept(now, &|p: &Peer| p.may_change(gid), &|p: &Peer| {
            seat.is_some_and(|run| seat::is_seat_user(run, p.uid))
        });
    }
    for e in d.auto.take_events() {
        server.broadcast(&|c: &Conn| Some(e.clone().for_viewer(viewer(c)).to_value()));
    }
    // After every turn: the power-off follows the plan (and its events
    // go out with this turn's).
    d.poweroff_sync();
    announce(d, server);
    d.core.persist();
    true
}

/// What a turn carries from one source to the next.
struct Turn {
    /// The time requests are served at (re-read after a reload).
    now: Instant,
    /// The listener is ready: accept after serving.
    accept: bool,
}

/// Serves one ready source; false when the daemon is to stop.
fn on_ready(
    d: &mut Daemon,
    server: &mut Server,
    sigs: &Signals,
    t: &mut Turn,
    src: Src,
    revents: PollFlags,
) -> bool {
    match src {
        Src::Stop => {
            if lifetime::drain(&sigs.stop) {
                d.core.persist();
                return false;
            }
        }
        Src::Reload => {
            if lifetime::drain(&sigs.reload) {
                d.reload();
            }
            t.now = Instant::now();
        }
        Src::Inotify => {
            let news = d.apps.read_events(&d.core, server.path().file_name());
            if news.socket_gone {
                rebind_if_gone(server);
            }
            d.apps.reresolve(&mut d.core, news.replaced);
            if news.services {
                d.apps.load_services(&mut d.core);
            }
        }
        Src::Seats => d.seats.on_event(&mut d.core.enforcer),
        Src::Uevent => {
            let k = d.uevents.as_ref().map(|u| u.drain()).unwrap_or_default();
            // Before the re-plan (and its discovery): what the guard holds
            // back that is no blocked GPU's goes through now.
            d.core.release_new_nodes(&k.drm_added);
            if k.gpus && d.burst.on_event(t.now) {
                d.refresh();
            }
            if k.power {
                d.auto.arm(t.now, "power_supply uevent");
            }
            if k.forged > 0 {
                log!("ignored {} uevent(s) not sent by the kernel", k.forged);
            }
        }
        Src::Clock => d.auto.on_clock(t.now),
        Src::Power => send_wakes(d, server),
        Src::Denials => send_denials(d, server),
        // The watch list is rebuilt by the re-plan: later indexes of this
        // turn are stale, and `holder_gone` on an empty list is harmless.
        Src::HolderGone(_) => {
            if d.core.holder_fds().next().is_some() {
                log!("a display server that held a GPU exited; planning again");
                d.core.holder_gone();
            }
        }
        // Reaped and continued by the power-off's sync after the turn.
        Src::Helper => {}
        Src::Scan => {
            let core = &mut d.core;
            d.who_scans.finish(&mut core.enforcer, &core.roots.procfs);
        }
        // Existing clients' indexes match the set: new ones are accepted
        // after serving.
        Src::Conn(i) => server.io(i, revents),
        Src::Listener => t.accept = true,
    }
    true
}

/// Runtime-PM events (wake, sleep) to subscribers, redacted per viewer.
fn send_wakes(d: &mut Daemon, server: &mut Server) {
    for e in d.power.on_ready() {
        server.broadcast(&|c: &Conn| Some(e.clone().for_viewer(viewer(c)).to_value()));
    }
}

/// The enforcer's deny events to subscribers.
fn send_denials(d: &mut Daemon, server: &mut Server) {
    for e in d.core.enforcer.drain_events() {
        // Other users' pids and command names only to root and the
        // group; a plain user sees their own, and the count.
        let ev = Event::Denied(Denied {
            pid: Some(e.pid),
            comm: Some(e.comm.clone()),
            uid: Some(e.uid),
            gpu: e.gpu,
            node: Some(e.node),
            why: Some(denial_why(d.core.choice().mode, &e)),
            via: (e.service == Some(crate::bpf::Service::Logind)).then(|| "logind".into()),
        });
        server.broadcast(&|c: &Conn| Some(ev.clone().for_viewer(viewer(c)).to_value()));
    }
}

/// Why gpuctl refused an open, in words that name no process.
fn denial_why(mode: crate::policy::Mode, e: &crate::bpf::DenyEvent) -> String {
    let g = e.gpu;
    let logind = e.service == Some(crate::bpf::Service::Logind);
    match (mode, logind) {
        (crate::policy::Mode::Smart, true) => format!(
            "gpuctl refused GPU {g} to a compositor (logind opened it for TakeDevice): no \
             process of the session in front of the seat holds a grant for GPU {g}; start \
             the compositor with `gpuctl run` in that session"
        ),
        (crate::policy::Mode::Smart, false) => format!(
            "gpuctl refused GPU {g}: smart mode, and the program holds no grant for it \
             (start it with `gpuctl run`, or `gpuctl app allow`)"
        ),
        (m, true) => format!(
            "gpuctl refused GPU {g} to a compositor (logind opened it for TakeDevice): \
             the mode {m} blocks GPU {g}"
        ),
        (m, false) => format!("gpuctl refused GPU {g}: the mode {m} blocks it"),
    }
}

/// The socket's file was deleted or moved away: listen on a new one.
fn rebind_if_gone(server: &mut Server) {
    if server.socket_present() {
        return;
    }
    match server.rebind() {
        Ok(()) => log!(
            "the socket {} was removed; listening on a new one",
            server.path().display()
        ),
        Err(e) => log!("re-creating the socket failed: {e:#}"),
    }
}

/// Sends every subscriber what changed this turn (push.rs).
fn announce(d: &mut Daemon, server: &mut Server) {
    let auto = d.auto.active(&d.core.config().auto);
    let all = d.push.take(&d.core, auto);
    if server.subscribers() == 0 {
        return;
    }
    for e in all {
        server.broadcast(&|c: &Conn| Some(e.clone().for_viewer(viewer(c)).to_value()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_zero_with_work_until_the_earliest_deadline_else_forever() {
        let now = Instant::now();
        let soon = Some(now + Duration::from_millis(10));
        let later = Some(now + Duration::from_secs(5));
        assert_eq!(
            timeout(true, [later, None, None, None], now),
            PollTimeout::ZERO
        );
        assert_eq!(
            timeout(false, [None, None, None, None], now),
            PollTimeout::NONE
        );
        let t = timeout(false, [later, None, soon, None], now);
        assert_eq!(i32::from(t), 11);
        // A deadline already passed: wake at once (1 ms), never negative.
        let past = Some(now - Duration::from_millis(5));
        assert_eq!(i32::from(timeout(false, [None, past, None, None], now)), 1);
    }
}
