//! Who may change state: uid 0, or a member of the configured group. The
//! peer is identified by `SO_PEERCRED` per connection; its groups are read
//! from `/proc/<pid>/status` (the process's real credentials, not a name).

use std::os::unix::net::UnixStream;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

/// The credentials of a connected client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

impl Peer {
    pub fn of(stream: &UnixStream) -> nix::Result<Peer> {
        let c = getsockopt(stream, PeerCredentials)?;
        Ok(Peer {
            pid: c.pid(),
            uid: c.uid(),
            gid: c.gid(),
        })
    }

    /// The command name, for the log.
    pub fn comm(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/comm", self.pid))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".to_string())
    }
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

/// Supplementary groups from a `/proc/<pid>/status` text.
fn status_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `peer` may change state.
pub fn may_change(peer: &Peer, group: &str) -> bool {
    if peer.uid == 0 {
        return true;
    }
    let Some(gid) = std::fs::read_to_string("/etc/group")
        .ok()
        .and_then(|g| group_gid(&g, group))
    else {
        return false;
    };
    if peer.gid == gid {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{}/status", peer.pid))
        .map(|s| status_groups(&s).contains(&gid))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_group_file_and_status() {
        let g = "root:x:0:\nvideo:x:44:alice\ngpuctl:x:998:alice,bob\n";
        assert_eq!(group_gid(g, "gpuctl"), Some(998));
        assert_eq!(group_gid(g, "gpu"), None);
        let s = "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t44 998 1000 \n";
        assert_eq!(status_groups(s), vec![44, 998, 1000]);
        assert!(status_groups("Name: x\n").is_empty());
    }
}
