//! The thin client: one request, one response, over the daemon's socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::proto::{self, Code, Request, Response, MAX_LINE};

/// Why a request got no answer.
#[derive(Debug)]
pub enum ClientError {
    /// Nothing listens on the socket.
    NotRunning(String),
    /// The daemon is there but did not serve us: too many clients, no
    /// answer in time, or it closed the connection unanswered.
    Busy(String),
    /// Connected, but the exchange failed.
    Io(anyhow::Error),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NotRunning(m) | ClientError::Busy(m) => f.write_str(m),
            ClientError::Io(e) => write!(f, "{e:#}"),
        }
    }
}

fn not_running(socket: &Path) -> ClientError {
    ClientError::NotRunning(format!(
        "the gpuctl daemon is not running (nothing listens on {}); \
         start it with `systemctl start gpuctl` or `gpuctl daemon`",
        socket.display()
    ))
}

/// Connects without ever blocking in `connect(2)`: a daemon whose listen
/// queue is full answers EAGAIN at once, which is reported as busy.
fn connect(socket: &Path) -> Result<UnixStream, ClientError> {
    use nix::sys::socket::{self as sock, AddressFamily, SockFlag, SockType, UnixAddr};
    let io = |e: nix::Error, what: &str| {
        ClientError::Io(
            anyhow::Error::new(std::io::Error::from(e))
                .context(format!("{what} {}", socket.display())),
        )
    };
    let fd = sock::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| io(e, "creating a socket for"))?;
    let addr = UnixAddr::new(socket).map_err(|e| io(e, "bad socket path"))?;
    match sock::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
        Ok(()) => {}
        Err(nix::Error::ENOENT | nix::Error::ECONNREFUSED) => return Err(not_running(socket)),
        Err(nix::Error::EAGAIN) => {
            return Err(ClientError::Busy(format!(
                "the gpuctl daemon is busy (its connection queue on {} is full); try again",
                socket.display()
            )))
        }
        Err(e) => return Err(io(e, "connecting to")),
    }
    let stream = UnixStream::from(fd);
    stream
        .set_nonblocking(false)
        .map_err(|e| ClientError::Io(e.into()))?;
    Ok(stream)
}

/// An I/O failure talking to a connected daemon, classified.
fn exchange_error(e: std::io::Error, what: &str) -> ClientError {
    use std::io::ErrorKind::*;
    match e.kind() {
        WouldBlock | TimedOut => ClientError::Busy(format!(
            "the gpuctl daemon did not answer within {} s (it is busy or hung); try again, \
             or see `journalctl -u gpuctl`",
            TIMEOUT.as_secs()
        )),
        BrokenPipe | ConnectionReset => ClientError::Busy(
            "the gpuctl daemon closed the connection without answering (too busy, or \
             restarting); try again"
                .to_string(),
        ),
        _ => ClientError::Io(anyhow::Error::new(e).context(what.to_string())),
    }
}

/// How long a client waits for the daemon. Requests are answered in
/// milliseconds; this only bounds a wedged daemon.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `req` and returns the daemon's response.
pub fn request(socket: &Path, req: &Request) -> Result<Response, ClientError> {
    let mut stream = connect(socket)?;
    exchange(&mut stream, req)
}

/// `gpuctl app allow|deny|forget|list`. For `allow`/`deny` the program
/// goes along as an O_PATH descriptor (SCM_RIGHTS), so the daemon needs no
/// access to its path (its unit hides `/home` and `/tmp`); a path this
/// client cannot open is sent as a path alone, for the daemon to open.
pub fn app(
    socket: &Path,
    action: proto::AppAction,
    path: Option<String>,
    gpu: Option<String>,
) -> Result<Response, ClientError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match (&action, &path) {
        (proto::AppAction::Allow | proto::AppAction::Deny, Some(p)) => std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(p)
            .ok(),
        _ => None,
    };
    let req = Request::App {
        action,
        path,
        gpu,
        fd: file.is_some(),
    };
    let Some(file) = file else {
        return request(socket, &req);
    };
    let mut stream = connect(socket)?;
    let line = proto::encode(&req);
    let setup = |e: std::io::Error| ClientError::Io(e.into());
    stream.set_write_timeout(Some(TIMEOUT)).map_err(setup)?;
    let sent = send_with_fd(&stream, &line, std::os::fd::AsFd::as_fd(&file))
        .map_err(|e| exchange_error(e, "sending the request to the daemon"))?;
    drop(file);
    exchange_line(&mut stream, &line[sent..])
}

/// One `sendmsg(2)` of (the start of) `bytes` with `fd` attached to its
/// first byte; returns how many bytes went.
fn send_with_fd(
    stream: &UnixStream,
    bytes: &[u8],
    fd: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<usize> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd;
    let fds = [fd.as_raw_fd()];
    let iov = [std::io::IoSlice::new(bytes)];
    loop {
        match sendmsg::<()>(
            stream.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(n) => return Ok(n),
        }
    }
}

fn exchange(stream: &mut UnixStream, req: &Request) -> Result<Response, ClientError> {
    exchange_line(stream, &proto::encode(req))
}

fn exchange_line(stream: &mut UnixStream, line: &[u8]) -> Result<Response, ClientError> {
    let setup = |e: std::io::Error| ClientError::Io(e.into());
    stream.set_read_timeout(Some(TIMEOUT)).map_err(setup)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(setup)?;
    // The daemon may already have answered `busy` and closed: its answer
    // is still readable, so a failed write is only reported if no answer
    // follows.
    let sent = stream.write_all(line);
    let mut line = Vec::new();
    let read = BufReader::new(stream.take(MAX_LINE as u64 * 16)).read_until(b'\n', &mut line);
    if line.is_empty() {
        if let Err(e) = sent {
            return Err(exchange_error(e, "sending the request to the daemon"));
        }
        if let Err(e) = read {
            return Err(exchange_error(e, "reading the daemon's response"));
        }
        return Err(exchange_error(
            std::io::ErrorKind::ConnectionReset.into(),
            "reading the daemon's response",
        ));
    }
    serde_json::from_slice(&line)
        .context("the daemon's response is not valid JSON")
        .map_err(ClientError::Io)
}

/// Sends `req` and hands every line the daemon sends back to `each` until
/// the connection closes. A line `each` rejects ends the stream with its
/// error response printed.
pub fn stream(
    socket: &Path,
    req: &Request,
    mut each: impl FnMut(&serde_json::Value) -> Result<(), Response>,
) -> Result<(), ClientError> {
    let mut stream = connect(socket)?;
    stream
        .write_all(&proto::encode(req))
        .map_err(|e| exchange_error(e, "sending the request to the daemon"))?;
    let reader = BufReader::new(stream.take(u64::MAX));
    for line in reader.split(b'\n') {
        let line = line.map_err(|e| ClientError::Io(e.into()))?;
        if line.len() > MAX_LINE {
            return Err(ClientError::Io(anyhow::anyhow!(
                "the daemon sent an oversized line"
            )));
        }
        let v: serde_json::Value = serde_json::from_slice(&line)
            .map_err(|e| ClientError::Io(anyhow::Error::new(e).context("bad event line")))?;
        if let Err(resp) = each(&v) {
            let (code, msg) = match resp.error {
                Some(e) => (Some(e.code), e.message),
                None => (None, "the daemon refused".to_string()),
            };
            return Err(if code == Some(Code::Busy) {
                ClientError::Busy(msg)
            } else {
                ClientError::Io(anyhow::anyhow!("{msg}"))
            });
        }
    }
    Ok(())
}

/// The first line of a stream: `Err` (to hand back from `stream`'s `each`)
/// when it is a refusal (`"ok": false`), `Ok` otherwise.
pub fn refusal(first: &serde_json::Value) -> Result<(), Response> {
    match serde_json::from_value::<Response>(first.clone()) {
        Ok(r) if !r.ok => Err(r),
        _ => Ok(()),
    }
}
