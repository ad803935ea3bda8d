//! Following the daemon: one `events` stream, read on its own thread, each
//! line handed to the session's loop. Nothing is polled: the stream blocks
//! until the daemon says something. When the daemon goes away the thread
//! says so, waits for its socket to be created again (inotify on the
//! socket's directory; a 2 s re-check only while the daemon is down) and
//! reconnects.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::time::SystemTime;

use super::model::{Action, State};
use crate::client::{self, ClientError};
use crate::proto::data::{StatusData, WhoData};
use crate::proto::event::Event;
use crate::proto::{AppAction, AutoAction, Code, Request, Response};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

pub enum Msg {
    /// The stream is open: fetch the whole state.
    Up,
    /// One event from the daemon, and for a denial of one of our own
    /// processes its executable (read here, at once).
    Event(Box<Event>, Option<String>),
    /// No daemon (or it refused the stream): why.
    Down(String),
    /// The user picked a menu entry.
    Action(Action),
}

pub fn spawn(socket: PathBuf, tx: Sender<Msg>) {
    std::thread::spawn(move || {
        let mut last_down = String::new();
        let mut retried = false;
        loop {
            let mut up = false;
            let res = client::stream(&socket, &Request::Events {}, |v| {
                if !up {
                    up = true;
                    client::refusal(v)?;
                    last_down.clear();
                    retried = false;
                    return tx.send(Msg::Up).map_err(|_| stop());
                }
                // A line this build cannot read still says something
                // changed (a newer daemon's): the state is fetched again.
                let e = serde_json::from_value::<Event>(v.clone()).unwrap_or(Event::Unknown);
                let exe = exe_of(&e);
                tx.send(Msg::Event(Box::new(e), exe)).map_err(|_| stop())
            });
            // A daemon that stops with our request unread resets the
            // connection instead of closing it: the same news as an end.
            let res = match res {
                Err(ClientError::Io(e))
                    if e.chain().any(|c| {
                        c.downcast_ref::<std::io::Error>()
                            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset)
                    }) =>
                {
                    Ok(())
                }
                r => r,
            };
            let why = match res {
                // The stream ended: try once at once (a restarted daemon
                // may already listen); if not, what connect says is the news.
                Ok(()) if !retried => {
                    retried = true;
                    continue;
                }
                Ok(()) => "the gpuctl daemon closed the event stream".to_string(),
                Err(ClientError::Io(e)) if format!("{e}") == STOP => return,
                Err(e) => e.to_string(),
            };
            if why != last_down {
                if tx.send(Msg::Down(why.clone())).is_err() {
                    return;
                }
                last_down = why;
            }
            wait_for_socket(&socket);
        }
    });
}

const STOP: &str = "the session loop stopped";

fn stop() -> Response {
    Response::err(Code::Internal, STOP)
}

/// A denial of one of our own processes: name its executable now, while
/// the process (often short-lived) still exists, for "Allow this app".
fn exe_of(e: &Event) -> Option<String> {
    let Event::Denied(d) = e else { return None };
    // logind opened it for a compositor: logind is not the app to allow.
    if d.via.is_some() {
        return None;
    }
    let exe = std::fs::read_link(format!("/proc/{}/exe", d.pid?)).ok()?;
    let s = exe.to_str()?;
    // A deleted or replaced file cannot be allowed by path.
    (!s.ends_with(" (deleted)")).then(|| s.to_string())
}

/// Returns when the socket's directory changes, or after 2 s.
fn wait_for_socket(socket: &Path) {
    let timeout = PollTimeout::from(2000u16);
    let dir = socket.parent().filter(|d| d.is_dir());
    let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok();
    match (dir, ino) {
        (Some(dir), Some(ino))
            if ino
                .add_watch(
                    dir,
                    AddWatchFlags::IN_CREATE
                        | AddWatchFlags::IN_MOVED_TO
                        | AddWatchFlags::IN_ATTRIB,
                )
                .is_ok() =>
        {
            // Created between the failed connect and the watch?
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return;
            }
            let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, timeout);
            // bind(2) then listen(2): give the daemon a moment between them.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        _ => std::thread::sleep(std::time::Duration::from_secs(2)),
    }
}

/// Re-reads what the daemon knows (`status` and `who`) into `state`.
pub fn fetch(socket: &Path, state: &mut State) {
    match client::request(socket, &Request::Status {}) {
        Ok(r) if r.ok => match r.parse::<StatusData>() {
            Ok(st) => {
                state.set_status(st, SystemTime::now());
                if let Ok(w) = client::request(socket, &Request::Who { gpu: None }) {
                    if let Ok(w) = w.parse::<WhoData>() {
                        state.holders = w.holders;
                    }
                }
            }
            Err(e) => state.set_down(e),
        },
        Ok(r) => state.set_down(
            r.error
                .map_or("the daemon refused `status`".into(), |e| e.message),
        ),
        Err(e) => state.set_down(e.to_string()),
    }
}

/// Carries out a menu action; `Err` is the sentence to show the user.
pub fn perform(socket: &Path, action: &Action) -> Result<(), String> {
    let req = match action {
        Action::SetMode(m) => Request::Set {
            mode: m.clone(),
            force: false,
        },
        Action::Block(g) => Request::Block {
            gpu: g.to_string(),
            force: false,
        },
        Action::Unblock(g) => Request::Unblock { gpu: g.to_string() },
        // The program goes as a descriptor: the daemon may not see the
        // user's home (client::app).
        Action::Allow(path) => {
            return match client::app(socket, AppAction::Allow, Some(path.clone()), None) {
                Ok(Response { ok: true, .. }) => Ok(()),
                Ok(r) => Err(r.error.map_or("the daemon refused".into(), |e| e.message)),
                Err(e) => Err(e.to_string()),
            }
        }
        Action::Auto(on) => Request::Auto {
            action: Some(if *on { AutoAction::On } else { AutoAction::Off }),
        },
        Action::Quit => return Ok(()),
    };
    match client::request(socket, &req) {
        Ok(Response { ok: true, .. }) => Ok(()),
        Ok(r) => Err(r.error.map_or("the daemon refused".into(), |e| e.message)),
        Err(e) => Err(e.to_string()),
    }
}
