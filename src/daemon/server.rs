//! The socket side of the event loop. No client, and no one user, can stall
//! the loop or lock the others out:
//!
//! - **Slots**: [`MAX_CLIENTS`] in all, of which [`RESERVED`] only root and
//!   the configured group may take; every other uid holds at most
//!   [`PER_UID_CONNS`] connections and [`PER_UID_SUBSCRIBERS`] of them as
//!   `events` streams. A client refused a slot is told `busy` and closed.
//! - **Deadlines**: a whole request within [`CLIENT_DEADLINE`] of connecting
//!   (or of the previous answer), and a connection lives at most
//!   [`MAX_LIFETIME`] however often it pings. `events` streams have no
//!   request deadline, but one that stops reading is dropped past
//!   [`MAX_PENDING_OUT`] of backlog.
//! - **Bounded work**: at most one request per connection per loop turn;
//!   more pipelined lines wait in that connection's buffer (the loop comes
//!   back at once), so a 4 000-request pipeline costs the others one
//!   request's time per turn.
//! - **Backpressure**: nothing more is read from a connection while its
//!   previous answer is not yet sent, or while it has a request waiting.
//! - **Passed descriptors** (`app allow|deny` sends the program as an
//!   O_PATH fd, SCM_RIGHTS): at most [`MAX_PASSED`] held per connection,
//!   given to the next request served and closed with it whatever it
//!   answers; a second one, or any other ancillary data, closes the
//!   connection with `bad_request` (every descriptor received is closed).

use std::io::{ErrorKind, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::poll::{PollFd, PollFlags};

use super::auth::Peer;
use crate::proto::{self, Code, Request, Response, MAX_LINE};

/// Descriptors one connection may have passed and not yet used.
pub const MAX_PASSED: usize = 1;

/// A client must send a whole request within this time of connecting (or
/// of its previous response), or it is told so and dropped.
pub const CLIENT_DEADLINE: Duration = Duration::from_secs(5);
/// A request/response connection is closed this long after it was accepted,
/// whatever it does (pings cannot keep a connection, and its credentials,
/// alive for ever).
pub const MAX_LIFETIME: Duration = Duration::from_secs(60);
/// Clients served at once.
pub const MAX_CLIENTS: usize = 64;
/// Slots only root and the configured group may take.
pub const RESERVED: usize = 16;
/// Connections one unprivileged uid may hold at once.
pub const PER_UID_CONNS: usize = 8;
/// `events` streams one unprivileged uid may hold at once.
pub const PER_UID_SUBSCRIBERS: usize = 4;
/// A subscriber that does not read its events is dropped past this.
pub const MAX_PENDING_OUT: usize = 1 << 20;

pub struct Conn {
    stream: UnixStream,
    pub peer: Option<Peer>,
    /// Root or a member of the configured group (decided at accept).
    pub privileged: bool,
    /// Not privileged, but the user of seat0's active local session
    /// (`seat`, decided at accept): may change the mode and block/unblock.
    pub seat: bool,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    deadline: Instant,
    expires: Instant,
    /// Close once `outbuf` is flushed.
    closing: bool,
    /// Streams events; no request deadline applies.
    pub subscribed: bool,
    /// The descriptor that came with the request being read (SCM_RIGHTS).
    passed: Option<OwnedFd>,
}

impl Conn {
    fn new(stream: UnixStream, privileged: bool, peer: Option<Peer>, now: Instant) -> Self {
        Conn {
            stream,
            peer,
            privileged,
            seat: false,
            inbuf: Vec::new(),
            outbuf: Vec::new(),
            deadline: now + CLIENT_DEADLINE,
            expires: now + MAX_LIFETIME,
            closing: false,
            subscribed: false,
            passed: None,
        }
    }

    fn uid(&self) -> Option<u32> {
        self.peer.as_ref().map(|p| p.uid)
    }

    fn respond(&mut self, r: &Response) {
        self.outbuf.extend_from_slice(&r.to_line());
    }

    fn fail(&mut self, r: &Response) {
        self.respond(r);
        self.closing = true;
    }

    /// A complete request line is waiting in the buffer.
    fn has_request(&self) -> bool {
        !self.closing && self.inbuf.contains(&b'\n')
    }

    pub fn poll_flags(&self) -> PollFlags {
        let mut f = PollFlags::empty();
        // Backpressure: read only once the last answer is sent and no
        // request is waiting.
        if !self.closing && self.outbuf.is_empty() && !self.has_request() {
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

    /// When this connection next needs the loop's attention by time.
    fn next_deadline(&self) -> Option<Instant> {
        if self.closing {
            return None;
        }
        if self.subscribed {
            return None;
        }
        Some(self.deadline.min(self.expires))
    }

    /// Whether the connection is finished and can be dropped.
    pub fn done(&self) -> bool {
        self.closing && self.outbuf.is_empty()
    }
}

/// Why an accepted connection gets no slot.
fn refuse_reason(conns: &[Conn], uid: Option<u32>, privileged: bool) -> Option<String> {
    if conns.len() >= MAX_CLIENTS {
        return Some(format!(
            "the gpuctl daemon is busy ({MAX_CLIENTS} clients connected); try again"
        ));
    }
    if privileged {
        return None;
    }
    if conns.len() >= MAX_CLIENTS - RESERVED {
        return Some(format!(
            "the gpuctl daemon is busy (the last {RESERVED} client slots are kept for root and \
             the gpuctl group); try again"
        ));
    }
    let mine = conns.iter().filter(|c| c.uid() == uid).count();
    if uid.is_none() || mine >= PER_UID_CONNS {
        return Some(format!(
            "the gpuctl daemon is busy: this user already has {mine} connections open (at most \
             {PER_UID_CONNS}); try again"
        ));
    }
    None
}

/// The listening socket. Removes its file on drop.
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    pub conns: Vec<Conn>,
}

impl Server {
    /// Binds `path` (mode 0666: reads are for everyone; changes are checked
    /// per request). The caller holds the daemon lock, so a socket file
    /// already there is a stale one.
    pub fn bind(path: &Path) -> Result<Server> {
        let listener = bind_socket(path)?;
        Ok(Server {
            listener,
            path: path.to_path_buf(),
            conns: Vec::new(),
        })
    }

    /// The socket file is gone (deleted by someone): bind a new one at the
    /// same path. Existing connections are kept.
    pub fn rebind(&mut self) -> Result<()> {
        self.listener = bind_socket(&self.path)?;
        Ok(())
    }

    /// Whether the socket file still exists at its path.
    pub fn socket_present(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.file_type().is_socket())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn listener_fd(&self) -> PollFd<'_> {
        PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)
    }

    /// Accepts every pending connection, giving each a slot if its uid may
    /// have one. `privileged` says whether a peer is root or in the group;
    /// `seat`, asked only of the others, whether it is the seat's user.
    pub fn accept(
        &mut self,
        now: Instant,
        privileged: &dyn Fn(&Peer) -> bool,
        seat: &dyn Fn(&Peer) -> bool,
    ) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let peer = Peer::of(&stream).ok();
                    let privileged = peer.as_ref().is_some_and(privileged);
                    let uid = peer.as_ref().map(|p| p.uid);
                    let at_seat = !privileged && peer.as_ref().is_some_and(seat);
                    let mut conn = Conn::new(stream, privileged, peer, now);
                    conn.seat = at_seat;
                    if let Some(why) = refuse_reason(&self.conns, uid, privileged) {
                        // Best effort: a full socket buffer just loses it.
                        let _ = conn.stream.write(&Response::err(Code::Busy, why).to_line());
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

    /// Reads from and writes to connection `i` as poll reported.
    pub fn io(&mut self, i: usize, revents: PollFlags) {
        let conn = &mut self.conns[i];
        if revents.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            && !conn.closing
            && conn.outbuf.is_empty()
            && !conn.has_request()
        {
            read_some(conn);
        }
        if !conn.outbuf.is_empty() {
            flush(conn);
        }
    }

    /// Whether some connection has a request waiting (the loop must not
    /// sleep).
    pub fn has_work(&self) -> bool {
        self.conns.iter().any(Conn::has_request)
    }

    /// Answers at most one waiting request per connection (round robin, so
    /// one client's pipeline cannot starve the others).
    /// A descriptor the client passed goes to `handle` with the request
    /// that takes one ([`Request::takes_fd`]); with any other request it
    /// is closed and the request refused.
    pub fn serve(
        &mut self,
        now: Instant,
        handle: &mut dyn FnMut(Request, &Conn, Option<OwnedFd>) -> Response,
    ) {
        for i in 0..self.conns.len() {
            if !self.conns[i].has_request() {
                continue;
            }
            let conn = &mut self.conns[i];
            let Some(pos) = conn.inbuf.iter().position(|&b| b == b'\n') else {
                continue;
            };
            let line: Vec<u8> = conn.inbuf.drain(..=pos).collect();
            let line = &line[..line.len() - 1];
            // Taken here, so it is closed on every path below.
            let passed = conn.passed.take();
            let resp = match proto::decode(line) {
                Ok(req) if passed.is_some() && !req.takes_fd() => Response::err(
                    Code::BadRequest,
                    "a descriptor came with a request that takes none (only `app allow|deny` \
                     with \"fd\": true does)",
                ),
                Ok(Request::Events {}) => self.subscribe(i, handle),
                Ok(req) => handle(req, &self.conns[i], passed),
                Err(r) => r,
            };
            let conn = &mut self.conns[i];
            conn.respond(&resp);
            conn.deadline = now + CLIENT_DEADLINE;
            flush(conn);
        }
    }

    /// `events`: turns connection `i` into a stream, within the per-uid cap.
    fn subscribe(
        &mut self,
        i: usize,
        handle: &mut dyn FnMut(Request, &Conn, Option<OwnedFd>) -> Response,
    ) -> Response {
        let conn = &self.conns[i];
        if !conn.privileged {
            let uid = conn.uid();
            let mine = self
                .conns
                .iter()
                .filter(|c| c.subscribed && !c.closing && c.uid() == uid)
                .count();
            if mine >= PER_UID_SUBSCRIBERS {
                return Response::err(
                    Code::Busy,
                    format!(
                        "this user already has {mine} event streams open (at most \
                         {PER_UID_SUBSCRIBERS}); close one and try again"
                    ),
                );
            }
        }
        let resp = handle(Request::Events {}, &self.conns[i], None);
        if resp.ok {
            let conn = &mut self.conns[i];
            conn.subscribed = true;
            // Whatever else it pipelined is not a request any more.
            conn.inbuf.clear();
        }
        resp
    }

    /// Answers clients past their deadline or lifetime, and drops finished
    /// ones.
    pub fn reap(&mut self, now: Instant) {
        for c in &mut self.conns {
            if c.closing || c.subscribed {
                continue;
            }
            let why = if now >= c.expires {
                format!(
                    "connection open for {} s; closing (reconnect for more requests)",
                    MAX_LIFETIME.as_secs()
                )
            } else if now >= c.deadline {
                format!(
                    "no complete request within {} s; closing",
                    CLIENT_DEADLINE.as_secs()
                )
            } else {
                continue;
            };
            c.fail(&Response::err(Code::Timeout, why));
            flush(c);
            // A client that does not read either is simply dropped.
            c.outbuf.clear();
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

    /// Sends one JSON line to every subscriber; `line_for` shapes it per
    /// subscriber (`None`: not for this one). One that stopped reading is
    /// dropped rather than buffered without bound.
    pub fn broadcast(&mut self, line_for: &dyn Fn(&Conn) -> Option<serde_json::Value>) {
        for c in self.conns.iter_mut().filter(|c| c.subscribed && !c.closing) {
            let Some(v) = line_for(c) else {
                continue;
            };
            let mut line = v.to_string().into_bytes();
            line.push(b'\n');
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
        self.conns.iter().filter_map(Conn::next_deadline).min()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn bind_socket(path: &Path) -> Result<UnixListener> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating socket directory {}", dir.display()))?;
    // Bound and listening under a temporary name first, then renamed into
    // place: the path never names a socket that refuses connections (a
    // client that sees the file between bind(2) and listen(2) got
    // ECONNREFUSED), and a stale socket is replaced in one step.
    let name = path
        .file_name()
        .with_context(|| format!("socket path {} has no file name", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.new", std::process::id()));
    let tmp = dir.join(tmp_name);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing stale {}", tmp.display())),
    }
    // The socket gets its mode 0666 from the umask at bind(2), not from a
    // chmod of the path afterwards, which would follow whatever the path
    // names by then (issue 18).
    // SAFETY: umask has no preconditions. It is process-wide: set and
    // restored around the bind only; the daemon's other thread (the holder
    // scan) creates no files.
    let old = unsafe { libc::umask(0o111) };
    // std's bind also listens (backlog 128).
    let bound = UnixListener::bind(&tmp);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound.with_context(|| format!("listening on {}", tmp.display()))?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("moving the socket to {}", path.display()));
    }
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// One read (bounded work per turn), up to the line cap. Nothing more is
/// read once a complete line is buffered (backpressure: the rest waits in
/// the kernel's socket buffer, and the writer blocks).
fn read_some(conn: &mut Conn) {
    let mut buf = [0u8; 8192];
    let room = MAX_LINE
        .saturating_sub(conn.inbuf.len())
        .clamp(1, buf.len());
    let got = recv_with_fds(&conn.stream, &mut buf[..room]);
    if let Ok((_, anc)) = &got {
        if let Some(why) = anc.refusal(conn.passed.is_some()) {
            // Every descriptor in `anc` is closed when it drops.
            conn.fail(&Response::err(Code::BadRequest, why));
            conn.inbuf.clear();
            conn.passed = None;
            return;
        }
    }
    match got {
        Ok((0, _)) => {
            // EOF. A partial line means the client left mid-request: there
            // is nobody to answer.
            conn.closing = true;
            conn.inbuf.clear();
            conn.passed = None;
        }
        // A stream takes no requests; what it says (or passes) is ignored.
        Ok(_) if conn.subscribed => {}
        Ok((n, mut anc)) => {
            if let Some(fd) = anc.fds.pop() {
                conn.passed = Some(fd);
            }
            conn.inbuf.extend_from_slice(&buf[..n]);
            let line_end = conn.inbuf.iter().position(|&b| b == b'\n');
            if line_end.unwrap_or(conn.inbuf.len()) >= MAX_LINE {
                conn.fail(&too_large());
                conn.inbuf.clear();
                conn.passed = None;
            }
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
        Err(_) => {
            conn.closing = true;
            conn.inbuf.clear();
            conn.outbuf.clear();
            conn.passed = None;
        }
    }
}

/// What one `recvmsg` brought besides bytes. Each descriptor is owned at
/// once, so whatever is refused is closed.
#[derive(Default)]
struct Ancillary {
    fds: Vec<OwnedFd>,
    /// A control message that is not SCM_RIGHTS (credentials, say).
    other: bool,
    /// The kernel had more than the buffer holds (MSG_CTRUNC): the
    /// descriptors that did not fit were closed by the kernel.
    truncated: bool,
}

impl Ancillary {
    /// Why this read closes the connection (`held`: a descriptor is
    /// already waiting for its request).
    fn refusal(&self, held: bool) -> Option<String> {
        if self.other || self.truncated {
            return Some(
                "only one descriptor (SCM_RIGHTS) may come with a request; closing".into(),
            );
        }
        if self.fds.len() + usize::from(held) > MAX_PASSED {
            return Some(format!(
                "at most {MAX_PASSED} descriptor may come with a request; closing"
            ));
        }
        None
    }
}

/// Control-message room: a few descriptors (more than [`MAX_PASSED`] are
/// refused, but each that arrives must be taken to be closed), 8-aligned.
const CMSG_WORDS: usize = 8;

/// `recvmsg(2)` of up to `buf.len()` bytes and the descriptors sent with
/// them (close-on-exec), without blocking.
fn recv_with_fds(stream: &UnixStream, buf: &mut [u8]) -> std::io::Result<(usize, Ancillary)> {
    let mut cbuf = [0u64; CMSG_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid (no name, no buffers).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: `msg` points at `iov` (into `buf`) and `cbuf`, both live and
    // of the lengths given, for the duration of the call.
    let n = unsafe {
        libc::recvmsg(
            stream.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut anc = Ancillary {
        truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
        ..Ancillary::default()
    };
    let end = cbuf.as_ptr() as usize + msg.msg_controllen.min(std::mem::size_of_val(&cbuf));
    // SAFETY: the kernel filled `msg_controllen` bytes of `cbuf` with
    // well-formed cmsghdrs; CMSG_FIRSTHDR/NXTHDR stay inside that length.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: `c` is a cmsghdr inside `cbuf` (checked by the macros).
        let (level, ty, len) = unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len) };
        if level == libc::SOL_SOCKET && ty == libc::SCM_RIGHTS {
            // SAFETY: as above; CMSG_DATA is the payload after the header.
            let data = unsafe { libc::CMSG_DATA(c) } as usize;
            let stop = (c as usize + len).min(end);
            let count = stop.saturating_sub(data) / std::mem::size_of::<libc::c_int>();
            for k in 0..count {
                // SAFETY: `count` ints lie between `data` and the end of
                // this message, inside `cbuf` (unaligned read: CMSG_DATA
                // need not be int-aligned in general).
                let fd = unsafe { std::ptr::read_unaligned((data as *const libc::c_int).add(k)) };
                if fd >= 0 {
                    // SAFETY: the kernel just installed `fd` in this
                    // process for us; nothing else owns it.
                    anc.fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        } else {
            anc.other = true;
        }
        // SAFETY: `c` is a valid header of `msg`'s control buffer.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    Ok((n as usize, anc))
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
                conn.inbuf.clear();
                conn.closing = true;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(uid: u32, privileged: bool) -> Conn {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut peer = Peer::of(&a).unwrap();
        peer.uid = uid;
        Conn::new(a, privileged, Some(peer), Instant::now())
    }

    #[test]
    fn slots_are_reserved_and_capped_per_uid() {
        let mut conns: Vec<Conn> = Vec::new();
        for _ in 0..PER_UID_CONNS {
            assert!(refuse_reason(&conns, Some(1000), false).is_none());
            conns.push(conn(1000, false));
        }
        assert!(refuse_reason(&conns, Some(1000), false)
            .unwrap()
            .contains("this user"));
        // Other users fill the shared slots…
        let mut uid = 2000;
        while conns.len() < MAX_CLIENTS - RESERVED {
            assert!(refuse_reason(&conns, Some(uid), false).is_none());
            conns.push(conn(uid, false));
            uid += 1;
        }
        assert!(refuse_reason(&conns, Some(uid), false)
            .unwrap()
            .contains("kept for root"));
        // …but root and the group still get in.
        assert!(refuse_reason(&conns, Some(0), true).is_none());
        while conns.len() < MAX_CLIENTS {
            conns.push(conn(0, true));
        }
        assert!(refuse_reason(&conns, Some(0), true)
            .unwrap()
            .contains("busy"));
    }

    #[test]
    fn no_reading_while_an_answer_or_request_waits() {
        let mut c = conn(1000, false);
        assert!(c.poll_flags().contains(PollFlags::POLLIN));
        c.inbuf.extend_from_slice(b"{\"type\":\"get\"}\n{\"type\":");
        assert!(!c.poll_flags().contains(PollFlags::POLLIN));
        c.inbuf.clear();
        c.outbuf.extend_from_slice(b"x");
        assert_eq!(c.poll_flags(), PollFlags::POLLOUT);
    }

    #[test]
    fn pings_do_not_keep_a_connection_past_its_lifetime() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let now = Instant::now();
        let mut server = Server {
            listener: UnixListener::bind(
                std::env::temp_dir().join(format!("gpuctl-srv-{}.sock", std::process::id())),
            )
            .unwrap(),
            path: PathBuf::from("/nonexistent/gpuctl-test.sock"),
            conns: vec![Conn::new(a, false, None, now)],
        };
        let _ = std::fs::remove_file(
            std::env::temp_dir().join(format!("gpuctl-srv-{}.sock", std::process::id())),
        );
        // A request every few seconds keeps the request deadline fresh…
        let mut t = now;
        while t + Duration::from_secs(3) < now + MAX_LIFETIME {
            t += Duration::from_secs(3);
            server.conns[0].deadline = t + CLIENT_DEADLINE;
            server.reap(t);
            assert_eq!(server.conns.len(), 1);
        }
        // …but not past the lifetime.
        t = now + MAX_LIFETIME;
        server.conns[0].deadline = t + CLIENT_DEADLINE;
        server.reap(t);
        assert!(server.conns.is_empty());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(&mut b), &mut line).unwrap();
        assert!(
            line.contains("\"timeout\"") && line.contains("60 s"),
            "{line}"
        );
    }
}
