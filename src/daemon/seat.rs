//! The person at the seat: the user of the active, local logind session
//! on `seat0` may change the mode and block/unblock, besides root and the
//! group — the same user udev's `uaccess` gives the GPUs' device nodes, so
//! no privilege is added.
//!
//! Read at connect time from logind's state files, without D-Bus, under
//! the run root (`--run-root`, `GPUCTL_RUN_ROOT`, default `/run`):
//!
//! - `systemd/seats/seat0`: `ACTIVE=<session>` (the session in front of
//!   the seat's screen);
//! - `systemd/sessions/<session>`: `UID`, `ACTIVE=1`, `REMOTE=0`,
//!   `SEAT=seat0`, `STATE=active`, `CLASS=user` (not a greeter).
//!
//! Only root-owned state counts: each file and the directories above it
//! (up to the run root) must be owned by root and not writable by group
//! or others, and the files are opened without following symlinks. A user
//! who writes a session file where they can write is refused. Sessions on
//! another seat are refused: the GPUs are seat0's (a multi-seat machine
//! that gives an offload GPU to another seat is not handled; the group
//! still works there). Config key `seat_may_change` (default true) turns
//! this off.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::safefile;

/// The seat whose active user may switch.
pub const SEAT: &str = "seat0";

/// Largest state file read (logind's are a few hundred bytes).
const CAP: u64 = 64 << 10;

/// Why a uid is not the seat's user, for the log (never for the peer).
#[derive(Debug, PartialEq, Eq)]
pub enum No {
    /// A file is missing or unreadable (no logind, no session).
    Missing(String),
    /// A file or directory is not root's alone.
    NotRoots(String),
    /// The seat's active session is not this user's, or not local and active.
    NotThem(String),
}

/// Root-owned and not writable by group or others.
fn roots_alone(meta: &std::fs::Metadata) -> bool {
    meta.uid() == 0 && meta.mode() & 0o022 == 0
}

/// The KEY=VALUE lines of a root-owned state file under `run`.
fn read_state(run: &Path, rel: &str) -> Result<Vec<(String, String)>, No> {
    let path = run.join(rel);
    // Every directory from the file's up to (and including) the run root.
    let mut dir = path.parent();
    while let Some(d) = dir {
        let meta = std::fs::symlink_metadata(d)
            .map_err(|e| No::Missing(format!("{}: {e}", d.display())))?;
        if !meta.is_dir() || !roots_alone(&meta) {
            return Err(No::NotRoots(format!(
                "{} is not a directory only root may write",
                d.display()
            )));
        }
        if d == run {
            break;
        }
        dir = d.parent();
    }
    let f = safefile::open_regular(&path, true)
        .map_err(|e| No::Missing(format!("{}: {e}", path.display())))?;
    let meta = f
        .metadata()
        .map_err(|e| No::Missing(format!("{}: {e}", path.display())))?;
    if !roots_alone(&meta) {
        return Err(No::NotRoots(format!(
            "{} is not owned and writable by root alone",
            path.display()
        )));
    }
    let text =
        safefile::read_from(f, CAP).map_err(|e| No::Missing(format!("{}: {e}", path.display())))?;
    Ok(String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn get<'a>(kv: &'a [(String, String)], key: &str) -> Option<&'a str> {
    kv.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// Whether `uid` is the user of seat0's active, local session.
pub fn check(run: &Path, uid: u32) -> Result<(), No> {
    let seat = read_state(run, &format!("systemd/seats/{SEAT}"))?;
    let session = get(&seat, "ACTIVE")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| No::NotThem(format!("{SEAT} has no active session")))?;
    // A session id is a name, never a path.
    if !session
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
    {
        return Err(No::NotThem(format!("odd session id {session:?}")));
    }
    let s = read_state(run, &format!("systemd/sessions/{session}"))?;
    let want = [
        ("UID", uid.to_string()),
        ("ACTIVE", "1".to_string()),
        ("REMOTE", "0".to_string()),
        ("SEAT", SEAT.to_string()),
        ("STATE", "active".to_string()),
        ("CLASS", "user".to_string()),
    ];
    for (k, v) in want {
        let got = get(&s, k);
        if got != Some(v.as_str()) {
            return Err(No::NotThem(format!(
                "session {session}: {k}={} (wanted {v})",
                got.unwrap_or("(none)")
            )));
        }
    }
    Ok(())
}

/// `check` as a yes or no.
pub fn is_seat_user(run: &Path, uid: u32) -> bool {
    check(run, uid).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture run root, owned by whoever runs the test: as root the
    /// ownership rule passes; the owner checks themselves are proved by
    /// the root tests (tests/it/root/seat.rs).
    fn fixture(seat: &str, session: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "gpuctl-seat-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("systemd/seats")).unwrap();
        std::fs::create_dir_all(d.join("systemd/sessions")).unwrap();
        std::fs::write(d.join("systemd/seats/seat0"), seat).unwrap();
        std::fs::write(d.join("systemd/sessions/2"), session).unwrap();
        d
    }

    const LOCAL: &str = "UID=1000\nUSER=alice\nACTIVE=1\nIS_DISPLAY=1\nSTATE=active\nREMOTE=0\n\
                         TYPE=wayland\nCLASS=user\nSEAT=seat0\nVTNR=2\n";

    #[test]
    fn reads_logind_state() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // Files a plain user made are not root's: refused, as they must be.
            let d = fixture("ACTIVE=2\nACTIVE_UID=1000\n", LOCAL);
            assert!(matches!(check(&d, 1000), Err(No::NotRoots(_))));
            let _ = std::fs::remove_dir_all(&d);
            return;
        }
        let d = fixture("ACTIVE=2\nACTIVE_UID=1000\n", LOCAL);
        // The fixture's temp dir may sit in a sticky world-writable /tmp:
        // check from the run root down (the root tests use their own).
        let run = d.clone();
        assert_eq!(check(&run, 1000), Ok(()));
        assert!(matches!(check(&run, 1001), Err(No::NotThem(_))));
        for (bad, what) in [
            ("ACTIVE=1", "ACTIVE=0"),
            ("REMOTE=0", "REMOTE=1"),
            ("SEAT=seat0", "SEAT=seat1"),
            ("STATE=active", "STATE=online"),
            ("CLASS=user", "CLASS=greeter"),
        ] {
            std::fs::write(run.join("systemd/sessions/2"), LOCAL.replace(bad, what)).unwrap();
            assert!(matches!(check(&run, 1000), Err(No::NotThem(_))), "{what}");
        }
        std::fs::write(run.join("systemd/sessions/2"), LOCAL).unwrap();
        std::fs::write(run.join("systemd/seats/seat0"), "ACTIVE=../../x\n").unwrap();
        assert!(matches!(check(&run, 1000), Err(No::NotThem(_))));
        std::fs::write(run.join("systemd/seats/seat0"), "ACTIVE_UID=1000\n").unwrap();
        assert!(matches!(check(&run, 1000), Err(No::NotThem(_))));
        let _ = std::fs::remove_dir_all(&d);
    }
}
