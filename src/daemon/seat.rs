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
//!
//! The same files say which login sessions are in front of a seat now
//! ([`ActiveSessions`]): logind opens a blocked GPU's card for a compositor
//! (`TakeDevice`) only while a process of such a session holds a grant for
//! that GPU. The kernel keeps them (`seat_sessions`), updated by inotify
//! when logind rewrites a seat's file (a login, a VT switch, a logout).

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use super::log::log;
use crate::bpf::{Enforcer, MAX_SEATS};
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

/// Where logind describes its seats, under the run root.
const SEATS: &str = "systemd/seats";

/// The active session of every seat logind describes under `run`, as the
/// audit session ids they are (logind names a session by its audit
/// session id where the kernel has audit), in the order of the seats'
/// names, at most [`MAX_SEATS`]. A seat with no active session, one whose
/// session is not named by an audit id (`c1`: no audit, so no grant can
/// carry it), or whose file is not root's alone adds nothing. `Err` when
/// the directory cannot be read (no logind, or not running yet).
pub fn active_sessions(run: &Path) -> Result<Vec<u32>, No> {
    let dir = run.join(SEATS);
    let entries =
        std::fs::read_dir(&dir).map_err(|e| No::Missing(format!("{}: {e}", dir.display())))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        // logind writes `.#seat0…` and renames it over `seat0`.
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let mut ids = Vec::new();
    for name in names {
        let seat = match read_state(run, &format!("{SEATS}/{name}")) {
            Ok(kv) => kv,
            Err(No::NotRoots(why)) => {
                log!("seat {name} ignored: {why}");
                continue;
            }
            Err(_) => continue,
        };
        let id = get(&seat, "ACTIVE").and_then(|s| s.parse::<u32>().ok());
        if let Some(id) = id.filter(|&id| id != 0 && id != u32::MAX) {
            if !ids.contains(&id) && ids.len() < MAX_SEATS {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

/// The seats' active sessions, kept in the kernel for logind's opens
/// (`seat_sessions`): read at start and again when a seat's file changes.
/// Until the seats' directory exists (logind starts after gpuctl at boot),
/// its parent is watched for it to appear; until then no session is
/// active, so logind's open of a blocked node is refused.
pub struct ActiveSessions {
    run: PathBuf,
    inotify: Inotify,
    /// The directory watched: the seats' own, or an ancestor waiting for it.
    watch: Option<(WatchDescriptor, PathBuf)>,
    /// What the kernel holds now.
    ids: Vec<u32>,
}

impl ActiveSessions {
    pub fn new(run: &Path) -> Result<ActiveSessions> {
        Ok(ActiveSessions {
            run: run.to_path_buf(),
            inotify: Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
                .context("creating the inotify instance for logind's seats")?,
            watch: None,
            ids: Vec::new(),
        })
    }

    /// The inotify fd, for the poll set.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }

    /// Watches the seats' directory, or the nearest ancestor under the run
    /// root that exists, for the directory to appear.
    fn rewatch(&mut self) {
        let seats = self.run.join(SEATS);
        let candidates = [seats.clone(), self.run.join("systemd"), self.run.clone()];
        for dir in candidates {
            if self.watch.as_ref().is_some_and(|(_, d)| *d == dir) {
                return;
            }
            let mask = if dir == seats {
                AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_MOVED_FROM
            } else {
                AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO
            };
            let mask = mask | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF;
            if let Ok(wd) = self.inotify.add_watch(&dir, mask) {
                if let Some((old, _)) = self.watch.take() {
                    let _ = self.inotify.rm_watch(old);
                }
                self.watch = Some((wd, dir));
                return;
            }
        }
    }

    /// Re-reads the seats and gives the kernel their active sessions.
    pub fn sync(&mut self, enforcer: &mut Enforcer) {
        self.rewatch();
        let ids = active_sessions(&self.run).unwrap_or_default();
        if ids == self.ids {
            return;
        }
        match enforcer.set_seat_sessions(&ids) {
            Ok(()) => {
                log!(
                    "seats' active login session(s): {}",
                    if ids.is_empty() {
                        "none".to_string()
                    } else {
                        ids.iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                );
                self.ids = ids;
            }
            Err(e) => log!("{e:#}"),
        }
    }

    /// Reads what changed; re-reads the seats if a seat's file (not one of
    /// logind's temporary files) or a watched directory changed.
    pub fn on_event(&mut self, enforcer: &mut Enforcer) {
        let Ok(events) = self.inotify.read_events() else {
            return;
        };
        let mut changed = false;
        for ev in events {
            if ev.mask.contains(AddWatchFlags::IN_IGNORED)
                && self.watch.as_ref().is_some_and(|(wd, _)| *wd == ev.wd)
            {
                // The watched directory went away: watch an ancestor.
                self.watch = None;
            }
            changed |= ev
                .name
                .as_ref()
                .is_none_or(|n| !n.as_encoded_bytes().starts_with(b"."));
        }
        if changed {
            self.sync(enforcer);
        }
    }
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

    #[test]
    fn active_sessions_are_each_seats_audit_id() {
        let d = fixture("ACTIVE=7\nACTIVE_UID=1000\n", LOCAL);
        let seats = d.join("systemd/seats");
        std::fs::write(seats.join("seat1"), "ACTIVE=c2\n").unwrap();
        std::fs::write(seats.join("seat2"), "ACTIVE=\n").unwrap();
        std::fs::write(seats.join("seat3"), "ACTIVE=9\n").unwrap();
        std::fs::write(seats.join("seat4"), "ACTIVE=7\n").unwrap();
        std::fs::write(seats.join("seat5"), "ACTIVE=4294967295\n").unwrap();
        // logind's temporary file, not renamed over a seat's yet.
        std::fs::write(seats.join(".#seat0abc"), "ACTIVE=11\n").unwrap();
        // SAFETY: geteuid has no preconditions.
        let want: Vec<u32> = if unsafe { libc::geteuid() } == 0 {
            vec![7, 9]
        } else {
            // Files a plain user made are not root's: no seat counts.
            vec![]
        };
        assert_eq!(active_sessions(&d), Ok(want));
        assert!(matches!(
            active_sessions(&d.join("nowhere")),
            Err(No::Missing(_))
        ));
        let _ = std::fs::remove_dir_all(&d);
    }
}
