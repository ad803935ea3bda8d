//! systemd readiness (`sd_notify(READY=1)`), without libsystemd.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

use anyhow::{Context, Result};

/// Sends `msg` to `$NOTIFY_SOCKET` if it is set; does nothing otherwise.
pub fn notify(msg: &str) -> Result<()> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(());
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(abs) => SocketAddr::from_abstract_name(abs.as_bytes()),
        None => SocketAddr::from_pathname(&path),
    }
    .with_context(|| format!("bad NOTIFY_SOCKET {path:?}"))?;
    let sock = UnixDatagram::unbound().context("creating the notify socket")?;
    sock.send_to_addr(msg.as_bytes(), &addr)
        .with_context(|| format!("notifying systemd at {path}"))?;
    Ok(())
}
