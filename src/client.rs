//! The thin client: one request, one response, over the daemon's socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::proto::{self, Request, Response, MAX_LINE};

/// Why a request got no answer.
#[derive(Debug)]
pub enum ClientError {
    /// Nothing listens on the socket.
    NotRunning(String),
    /// Connected, but the exchange failed.
    Io(anyhow::Error),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NotRunning(m) => f.write_str(m),
            ClientError::Io(e) => write!(f, "{e:#}"),
        }
    }
}

/// How long a client waits for the daemon. Requests are answered in
/// milliseconds; this only bounds a wedged daemon.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `req` and returns the daemon's response.
pub fn request(socket: &Path, req: &Request) -> Result<Response, ClientError> {
    let mut stream = UnixStream::connect(socket).map_err(|e| {
        use std::io::ErrorKind::*;
        match e.kind() {
            NotFound | ConnectionRefused => ClientError::NotRunning(format!(
                "the gpuctl daemon is not running (nothing listens on {}); \
                 start it with `systemctl start gpuctl` or `gpuctl daemon`",
                socket.display()
            )),
            _ => ClientError::Io(
                anyhow::Error::new(e).context(format!("connecting to {}", socket.display())),
            ),
        }
    })?;
    exchange(&mut stream, req).map_err(ClientError::Io)
}

fn exchange(stream: &mut UnixStream, req: &Request) -> anyhow::Result<Response> {
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    stream
        .write_all(&proto::encode(req))
        .context("sending the request to the daemon")?;
    let mut line = Vec::new();
    BufReader::new(stream.take(MAX_LINE as u64 * 16))
        .read_until(b'\n', &mut line)
        .context("reading the daemon's response")?;
    if line.is_empty() {
        anyhow::bail!("the daemon closed the connection without answering");
    }
    serde_json::from_slice(&line).context("the daemon's response is not valid JSON")
}

/// Sends `req` and hands every line the daemon sends back to `each` until
/// the connection closes. A line `each` rejects ends the stream with its
/// error response printed.
pub fn stream(
    socket: &Path,
    req: &Request,
    mut each: impl FnMut(&serde_json::Value) -> Result<(), serde_json::Value>,
) -> Result<(), ClientError> {
    let mut stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ClientError::NotRunning(format!(
                "the gpuctl daemon is not running (nothing listens on {})",
                socket.display()
            ))
        }
        _ => ClientError::Io(anyhow::Error::new(e).context("connecting")),
    })?;
    stream
        .write_all(&proto::encode(req))
        .map_err(|e| ClientError::Io(e.into()))?;
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
        if let Err(errv) = each(&v) {
            return Err(ClientError::Io(anyhow::anyhow!(
                "{}",
                errv["error"]["message"]
                    .as_str()
                    .unwrap_or("the daemon refused")
            )));
        }
    }
    Ok(())
}
