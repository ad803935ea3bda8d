//! Who is on the other end of a connection, and what they may do.
//!
//! Everything is captured once, when the connection is accepted, from the
//! kernel's record of the connecting process: `SO_PEERCRED` (pid, uid, gid
//! at `connect(2)`), `SO_PEERGROUPS` (its supplementary groups at
//! `connect(2)`) and, for grants, a pidfd of that process (`SO_PEERPIDFD`
//! on Linux 6.5+, else `pidfd_open` at accept). Nothing is re-read from
//! `/proc/<pid>` at request time: a pid can be reused by another process
//! while the connection lives, a credential captured at connect cannot.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that called connect.
const SO_PEERPIDFD: libc::c_int = 77;
/// Most supplementary groups a process can have (`NGROUPS_MAX`).
const NGROUPS_MAX: usize = 65536;

/// The credentials of a connected client, as the kernel recorded them when
/// it connected.
#[derive(Debug)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (`SO_PEERGROUPS`); empty if the kernel refused.
    pub groups: Vec<u32>,
    /// The connecting process itself, for binding grants to it; `None` when
    /// it had already gone by the time the connection was accepted.
    pub pidfd: Option<OwnedFd>,
    /// Its command name at accept time (for logs only, never for a decision).
    pub comm: String,
}

/// The command name of `pid` (`/proc/<pid>/comm`), `None` if it is gone.
/// One open, one read, one close (a name is at most 16 bytes): on every
/// connection, so no size probe and no read to EOF as `read_to_string`
/// does. (`status` names grants from the grants themselves: issue 21.)
pub fn comm_of(pid: u32) -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(format!("/proc/{pid}/comm")).ok()?;
    let mut buf = [0u8; 64];
    let n = f.read(&mut buf).ok()?;
    let name = buf.get(..n)?;
    let name = name.strip_suffix(b"\n").unwrap_or(name);
    Some(String::from_utf8_lossy(name).into_owned())
}

impl Peer {
    pub fn of(stream: &UnixStream) -> nix::Result<Peer> {
        let c = getsockopt(stream, PeerCredentials)?;
        let pid = c.pid();
        let comm = u32::try_from(pid)
            .ok()
            .and_then(comm_of)
            .unwrap_or_else(|| "?".to_string());
        Ok(Peer {
            pid,
            uid: c.uid(),
            gid: c.gid(),
            groups: peer_groups(stream),
            pidfd: peer_pidfd(stream, pid),
            comm,
        })
    }

    /// Whether this peer may change state: uid 0, or primary or
    /// supplementary group `gid` (the configured group's id).
    pub fn may_change(&self, group_gid: Option<u32>) -> bool {
        self.uid == 0 || group_gid.is_some_and(|g| self.gid == g || self.groups.contains(&g))
    }
}

/// The supplementary groups the peer had at connect (`SO_PEERGROUPS`).
fn peer_groups(stream: &UnixStream) -> Vec<u32> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: the buffer is valid for `len` bytes and outlives the call;
        // the kernel writes at most `len` bytes and sets `len` to what it
        // wrote, or to what it needs with ERANGE.
        let r = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(n);
            return groups;
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= NGROUPS_MAX {
            groups.resize(n, 0);
            continue;
        }
        return Vec::new();
    }
}

/// A pidfd of the peer: `SO_PEERPIDFD` where the kernel has it (taken at
/// connect, so it is the connecting process even if the pid was reused
/// since), else `pidfd_open` of the `SO_PEERCRED` pid right after accept.
fn peer_pidfd(stream: &UnixStream, pid: i32) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is a valid c_int buffer of `len` bytes for the duration
    // of the call.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r == 0 && fd >= 0 {
        // SAFETY: the kernel just gave us this new fd; nothing else owns it.
        return Some(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    if pid <= 0 {
        return None;
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new fd from pidfd_open, owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// A pidfd of process `pid`, `None` if it is gone (or pidfds are missing).
pub fn pidfd_of(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new fd from pidfd_open, owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Whether the process behind `pidfd` still runs (its pidfd is not yet
/// readable: a pidfd polls readable once the process has exited).
pub fn alive(pidfd: &OwnedFd) -> bool {
    use std::os::fd::AsFd;
    let mut fds = [nix::poll::PollFd::new(
        pidfd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    matches!(
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO),
        Ok(0)
    )
}

/// The gid of group `name` from an `/etc/group`-format text.
pub fn group_gid(etc_group: &str, name: &str) -> Option<u32> {
    etc_group.lines().find_map(|l| {
        let mut f = l.split(':');
        if f.next()? != name {
            return None;
        }
        f.nth(1)?.parse().ok()
    })
}

/// The gid of the configured group, read from `/etc/group` (a name, not a
/// process, so reading it per request is safe; it is small).
pub fn configured_gid(group: &str) -> Option<u32> {
    // Digits name a gid directly.
    if let Ok(g) = group.parse() {
        return Some(g);
    }
    let text = crate::safefile::read_capped("/etc/group".as_ref(), 4 << 20).ok()?;
    group_gid(&String::from_utf8_lossy(&text), group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_of_a_live_process_and_of_none() {
        let me = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(
            comm_of(std::process::id()),
            Some(me.trim_end_matches('\n').into())
        );
        // Above the kernel's largest pid_max (2^22): never a process.
        assert_eq!(comm_of(5_000_000), None);
    }

    #[test]
    fn parses_group_file() {
        let g = "root:x:0:\nvideo:x:44:alice\ngpuctl:x:998:alice,bob\n";
        assert_eq!(group_gid(g, "gpuctl"), Some(998));
        assert_eq!(group_gid(g, "gpu"), None);
    }

    #[test]
    fn decides_from_captured_credentials_only() {
        let p = |uid, gid, groups: Vec<u32>| Peer {
            pid: 4242,
            uid,
            gid,
            groups,
            pidfd: None,
            comm: "x".into(),
        };
        assert!(p(0, 0, vec![]).may_change(None));
        assert!(p(1000, 998, vec![]).may_change(Some(998)));
        assert!(p(1000, 1000, vec![44, 998]).may_change(Some(998)));
        assert!(!p(1000, 1000, vec![44]).may_change(Some(998)));
        assert!(!p(1000, 1000, vec![998]).may_change(None));
    }

    #[test]
    fn captures_own_credentials_over_a_socketpair() {
        let (a, _b) = UnixStream::pair().unwrap();
        let p = Peer::of(&a).unwrap();
        assert_eq!(p.pid as u32, std::process::id());
        // SAFETY: getuid has no preconditions.
        assert_eq!(p.uid, unsafe { libc::getuid() });
        // SAFETY: getgid has no preconditions.
        assert_eq!(p.gid, unsafe { libc::getgid() });
        let fd = p.pidfd.expect("a pidfd of ourselves");
        assert!(alive(&fd));
    }
}
