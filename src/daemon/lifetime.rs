//! The daemon's lifetime: signals, the single-instance lock, the systemd
//! watchdog.
//!
//! Only SIGTERM and SIGINT (and SIGKILL) stop the daemon. SIGHUP reloads the
//! config. Every other signal whose default action would kill it and that
//! only a sender, not a fault, raises (SIGUSR1/2, SIGALRM, SIGPIPE, SIGQUIT,
//! SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT, SIGXCPU, SIGXFSZ, the
//! real-time signals) is ignored.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::log::log;

/// Readable ends of the signal pipes.
pub struct Signals {
    /// SIGTERM / SIGINT.
    pub stop: UnixStream,
    /// SIGHUP.
    pub reload: UnixStream,
}

fn pipe_for(sigs: &[i32]) -> Result<UnixStream> {
    let (rx, tx) = UnixStream::pair().context("creating a signal pipe")?;
    rx.set_nonblocking(true)?;
    for &sig in sigs {
        signal_hook::low_level::pipe::register(sig, tx.try_clone()?)
            .context("installing signal handlers")?;
    }
    Ok(rx)
}

impl Signals {
    pub fn install() -> Result<Signals> {
        use signal_hook::consts::*;
        let s = Signals {
            stop: pipe_for(&[SIGTERM, SIGINT])?,
            reload: pipe_for(&[SIGHUP])?,
        };
        let ignored = [
            libc::SIGUSR1,
            libc::SIGUSR2,
            libc::SIGALRM,
            libc::SIGPIPE,
            libc::SIGQUIT,
            libc::SIGVTALRM,
            libc::SIGPROF,
            libc::SIGIO,
            libc::SIGPWR,
            libc::SIGSTKFLT,
            libc::SIGXCPU,
            libc::SIGXFSZ,
        ];
        for sig in ignored {
            // SAFETY: SIG_IGN installs no handler code; the daemon starts
            // no children that could inherit the disposition.
            if unsafe { libc::signal(sig, libc::SIG_IGN) } == libc::SIG_ERR {
                bail!("ignoring signal {sig}: {}", std::io::Error::last_os_error());
            }
        }
        for rt in libc::SIGRTMIN()..=libc::SIGRTMAX() {
            // SAFETY: as above, on a valid signal number. glibc refuses the
            // real-time signals it reserves (EINVAL): that result is ignored.
            unsafe { libc::signal(rt, libc::SIG_IGN) };
        }
        Ok(s)
    }
}

/// Empties a signal pipe; true if any signal arrived.
pub fn drain(rx: &UnixStream) -> bool {
    let mut any = false;
    let mut buf = [0u8; 64];
    while let Ok(n) = std::io::Read::read(&mut &*rx, &mut buf) {
        if n == 0 {
            break;
        }
        any = true;
    }
    any
}

/// Takes the single-instance lock: an exclusive `flock` on the state
/// directory, held for the daemon's life. A second daemon (even one whose
/// socket path differs, or after the socket file was deleted) is refused.
pub fn lock_state_dir(dir: &Path) -> Result<OwnedFd> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating state directory {}", dir.display()))?;
    let f = std::fs::File::open(dir)
        .with_context(|| format!("opening state directory {}", dir.display()))?;
    // SAFETY: flock on a valid open fd.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            bail!(
                "another gpuctl daemon is running (it holds the lock on {}); stop it first",
                dir.display()
            );
        }
        return Err(e).with_context(|| format!("locking {}", dir.display()));
    }
    Ok(f.into())
}

/// The systemd watchdog: `WATCHDOG=1` every half of `WatchdogSec=`, only
/// when systemd asked for it (`$WATCHDOG_USEC`, for this pid).
pub struct Watchdog {
    every: Duration,
    next: Instant,
}

impl Watchdog {
    pub fn from_env() -> Option<Watchdog> {
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        if let Ok(pid) = std::env::var("WATCHDOG_PID") {
            if pid.parse::<u32>().ok()? != std::process::id() {
                return None;
            }
        }
        let every = Duration::from_micros(usec / 2).max(Duration::from_millis(100));
        Some(Watchdog {
            every,
            next: Instant::now() + every,
        })
    }

    pub fn deadline(&self) -> Instant {
        self.next
    }

    /// Pings systemd if it is time.
    pub fn tick(&mut self, now: Instant) {
        if now >= self.next {
            if let Err(e) = super::notify::notify("WATCHDOG=1") {
                log!("{e:#}");
            }
            self.next = now + self.every;
        }
    }
}
