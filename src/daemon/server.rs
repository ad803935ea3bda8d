//! The socket side of the event loop: non-blocking clients, each with a line
//! size cap and a deadline, so no client can stall the loop for the others.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::poll::{PollFd, PollFlags};

use super::auth::Peer;
use crate::proto::{self, Code, Request, Response, MAX_LINE};

/// A client must send a whole request within this time of connecting (or
/// of its previous response), or it is told so and dropped.
pub const CLIENT_DEADLINE: Duration = Duration::from_secs(5);
/// Clients served at once; one more is told `busy` and dropped.
pub const MAX_CLIENTS: usize = 64;
/// A client that does not read its responses is dropped past this.
const MAX_PENDING_OUT: usize = 1 << 20;

pub struct Conn {
    stream: UnixStream,
    peer: Option<Peer>,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    deadline: Instant,
    /// Close once `outbuf` is flushed.
    closing: bool,
    /// Streams events; no deadline applies.
    subscribed: bool,
}

impl Conn {
    fn new(stream: UnixStream, now: Instant) -> Self {
        let peer = Peer::of(&stream).ok();
        Conn {
            stream,
            peer,
            inbuf: Vec::new(),
            outbuf: Vec::new(),
            deadline: now + CLIENT_DEADLINE,
            closing: false,
            subscribed: false,
        }
    }

    fn respond(&mut self, r: &Response) {
        self.outbuf.extend_from_slice(&r.to_line());
    }

    fn fail(&mut self, r: &Response) {
        self.respond(r);
        self.closing = true;
    }

    pub fn poll_flags(&self) -> PollFlags {
        let mut f = PollFlags::empty();
        if !self.closing {
            f |= PollFlags::POLLIN;
        }
        if !self.outbuf.is_empty() {
            f |= PollFlags::POLLOUT;
        }
        f
    }

    pub fn poll_fd(&self) -> PollFd<'_> {
        PollFd::new(self.stream.as_fd(), self.poll_flags())
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the connection is finished and can be dropped.
    pub fn done(&self) -> bool {
        self.closing && self.outbuf.is_empty()
    }
}

/// The listening socket. Removes its file on drop.
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    pub conns: Vec<Conn>,
}

impl Server {
    /// Binds `path` (mode 0666: reads are for everyone; changes are checked
    /// per request). Refuses to steal the socket of a live daemon.
    pub fn bind(path: &Path) -> Result<Server> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating socket directory {}", dir.display()))?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                bail!(
                    "another gpuctl daemon is already listening on {}",
                    path.display()
                );
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale socket {}", path.display()))?;
        }
        let listener =
            UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))?;
        listener.set_nonblocking(true)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
            .with_context(|| format!("setting the mode of {}", path.display()))?;
        Ok(Server {
            listener,
            path: path.to_path_buf(),
            conns: Vec::new(),
        })
    }

    pub fn listener_fd(&self) -> PollFd<'_> {
        PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)
    }

    /// Accepts every pending connection.
    pub fn accept(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let mut conn = Conn::new(stream, now);
                    if self.conns.len() >= MAX_CLIENTS {
                        // Best effort: a full socket buffer just loses it.
                        let _ = conn.stream.write(
                            &Response::err(Code::Busy, "too many clients; try again").to_line(),
                        );
                        continue;
                    }
                    self.conns.push(conn);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("gpuctl: accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// Services connection `i` after poll reported `revents`, handing every
    /// complete request line to `handle`.
    pub fn service(
        &mut self,
        i: usize,
        revents: PollFlags,
        now: Instant,
        handle: &mut dyn FnMut(Request, Option<&Peer>) -> Response,
    ) {
        let conn = &mut self.conns[i];
        if revents.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            && !conn.closing
        {
            read_requests(conn, now, handle);
        }
        if !conn.outbuf.is_empty() {
            flush(conn);
        }
    }

    /// Answers clients past their deadline, and drops finished ones.
    pub fn reap(&mut self, now: Instant) {
        for c in &mut self.conns {
            if !c.closing && !c.subscribed && now >= c.deadline {
                c.fail(&Response::err(
                    Code::Timeout,
                    format!(
                        "no complete request within {} s; closing",
                        CLIENT_DEADLINE.as_secs()
                    ),
                ));
                flush(c);
                // A client that does not read either is simply dropped.
                c.outbuf.clear();
            }
        }
        self.conns.retain(|c| !c.done());
    }

    /// Connections streaming events.
    pub fn subscribers(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| c.subscribed && !c.closing)
            .count()
    }

    /// Sends one JSON line to every subscriber (dropping one that stopped
    /// reading rather than buffering without bound).
    pub fn broadcast(&mut self, v: &serde_json::Value) {
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        for c in self.conns.iter_mut().filter(|c| c.subscribed && !c.closing) {
            if c.outbuf.len() + line.len() > MAX_PENDING_OUT {
                c.closing = true;
                c.outbuf.clear();
                continue;
            }
            c.outbuf.extend_from_slice(&line);
            flush(c);
        }
    }

    /// The earliest client deadline, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.conns
            .iter()
            .filter(|c| !c.closing && !c.subscribed)
            .map(Conn::deadline)
            .min()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn read_requests(
    conn: &mut Conn,
    now: Instant,
    handle: &mut dyn FnMut(Request, Option<&Peer>) -> Response,
) {
    let mut buf = [0u8; 8192];
    loop {
        match conn.stream.read(&mut buf) {
            Ok(0) => {
                // EOF. A partial line means the client left mid-request:
                // there is nobody to answer.
                conn.closing = true;
                conn.inbuf.clear();
                return;
            }
            Ok(n) => {
                conn.inbuf.extend_from_slice(&buf[..n]);
                while let Some(pos) = conn.inbuf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = conn.inbuf.drain(..=pos).collect();
                    let line = &line[..line.len() - 1];
                    if line.len() + 1 > MAX_LINE {
                        conn.fail(&too_large());
                        return;
                    }
                    let resp = match proto::decode(line) {
                        Ok(req) => {
                            let events = matches!(req, Request::Events {});
                            let resp = handle(req, conn.peer.as_ref());
                            conn.subscribed |= events && resp.ok;
                            resp
                        }
                        Err(r) => r,
                    };
                    conn.respond(&resp);
                    conn.deadline = now + CLIENT_DEADLINE;
                    if conn.outbuf.len() > MAX_PENDING_OUT {
                        conn.closing = true;
                        conn.outbuf.clear();
                        return;
                    }
                }
                if conn.inbuf.len() >= MAX_LINE {
                    conn.fail(&too_large());
                    conn.inbuf.clear();
                    return;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                conn.closing = true;
                conn.outbuf.clear();
                return;
            }
        }
    }
}

fn too_large() -> Response {
    Response::err(
        Code::TooLarge,
        format!("request line longer than {} bytes; closing", MAX_LINE),
    )
}

fn flush(conn: &mut Conn) {
    while !conn.outbuf.is_empty() {
        match conn.stream.write(&conn.outbuf) {
            Ok(0) => break,
            Ok(n) => {
                conn.outbuf.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                // The client went away; nothing more to send.
                conn.outbuf.clear();
                conn.closing = true;
                return;
            }
        }
    }
}
