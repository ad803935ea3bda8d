//! Who may make the tray act. The session bus lets any program of the
//! session call the tray, including a sandboxed one (Flatpak, snap, an
//! AppArmor profile) that cannot reach the gpuctl socket: a menu `Event`
//! from it would switch modes with the user's rights. So every method that
//! acts is answered only for a peer of the tray's own uid (or root, who can
//! act as the user anyway) outside a sandbox, as the bus reports it
//! (`GetConnectionCredentials`: uid, pid, security label) and as the peer's
//! `/proc` entry shows it (a Flatpak app's `.flatpak-info`, its
//! `app-flatpak-*` or `snap.*` cgroup). Reads stay open: the status host
//! must read the item. The same test decides whether the holder of
//! `org.gpuctl.Tray` is a tray of this user (then this one leaves) or a
//! squatter (then this one runs without the name).

use std::path::{Path, PathBuf};

use zbus::fdo::ConnectionCredentials;

/// What the bus says of a peer.
#[derive(Clone, Debug, Default)]
pub struct Peer {
    pub uid: Option<u32>,
    pub pid: Option<u32>,
    pub label: Option<String>,
}

impl From<ConnectionCredentials> for Peer {
    fn from(c: ConnectionCredentials) -> Peer {
        Peer {
            uid: c.unix_user_id(),
            pid: c.process_id(),
            label: c.linux_security_label().map(|l| label_text(l)),
        }
    }
}

/// The bus sends the label as bytes, usually NUL-terminated.
fn label_text(l: &[u8]) -> String {
    let end = l.iter().position(|b| *b == 0).unwrap_or(l.len());
    String::from_utf8_lossy(&l[..end]).trim().to_string()
}

/// The tray itself: its uid and its own label (the bus's view of it).
#[derive(Clone, Debug)]
pub struct Me {
    pub uid: u32,
    pub label: Option<String>,
    /// `/proc`, or a fixture in tests.
    pub proc_root: PathBuf,
}

/// Whether `label` is no confinement: AppArmor's `unconfined`, a profile in
/// unconfined mode (`name (unconfined)`), or the very label the tray runs
/// under (SELinux gives every process a label; a peer confined like the
/// tray itself is no less trusted than the tray).
fn unconfined(label: &str, mine: Option<&str>) -> bool {
    label.is_empty()
        || label == "unconfined"
        || label.ends_with(" (unconfined)")
        || mine == Some(label)
}

/// `Ok(())` if `peer` may make the tray act; else why not. `root_ok`:
/// whether uid 0 counts as the user (for callers; not for the holder of
/// the tray's name, which must be this user's own tray).
pub fn judge(me: &Me, peer: &Peer, root_ok: bool) -> Result<(), String> {
    let uid = peer.uid.ok_or("the bus did not say its uid")?;
    if uid != me.uid && !(root_ok && uid == 0) {
        return Err(format!("uid {uid}, not the tray's uid {}", me.uid));
    }
    if let Some(l) = peer.label.as_deref() {
        if !unconfined(l, me.label.as_deref()) {
            return Err(format!(
                "confined by the security label {:?}",
                crate::text::human(l)
            ));
        }
    }
    let pid = peer.pid.ok_or("the bus did not say its pid")?;
    let dir = me.proc_root.join(pid.to_string());
    sandboxed(&dir, uid == 0)
}

/// A Flatpak app (or its D-Bus proxy, which Flatpak gives the app's
/// `.flatpak-info`) or a snap, from its `/proc` entry.
fn sandboxed(dir: &Path, root: bool) -> Result<(), String> {
    let cgroup = std::fs::read_to_string(dir.join("cgroup"))
        .map_err(|e| format!("its process cannot be read ({e})"))?;
    for line in cgroup.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        for part in path.split('/') {
            if part.starts_with("app-flatpak-") {
                return Err(format!(
                    "a Flatpak app (cgroup {})",
                    crate::text::human(part)
                ));
            }
            if part.starts_with("snap.") {
                return Err(format!("a snap (cgroup {})", crate::text::human(part)));
            }
        }
    }
    match std::fs::symlink_metadata(dir.join("root/.flatpak-info")) {
        Ok(_) => Err("a Flatpak app (/.flatpak-info in its root)".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // Root's processes are not the user's to look into; Flatpak never
        // runs an app as root, and the cgroup was read above.
        Err(_) if root => Ok(()),
        Err(e) => Err(format!("its root cannot be checked for a sandbox ({e})")),
    }
}

const BUS: &str = "org.freedesktop.DBus";
const BUS_PATH: &str = "/org/freedesktop/DBus";

/// The bus's credentials of `name` (a unique or well-known name).
pub fn credentials(conn: &zbus::blocking::Connection, name: &str) -> zbus::Result<Peer> {
    let m = conn.call_method(
        Some(BUS),
        BUS_PATH,
        Some(BUS),
        "GetConnectionCredentials",
        &(name,),
    )?;
    Ok(Peer::from(m.body().deserialize::<ConnectionCredentials>()?))
}

/// The same, from inside a method handler.
pub async fn credentials_async(conn: &zbus::Connection, name: &str) -> zbus::Result<Peer> {
    let m = conn
        .call_method(
            Some(BUS),
            BUS_PATH,
            Some(BUS),
            "GetConnectionCredentials",
            &(name,),
        )
        .await?;
    Ok(Peer::from(m.body().deserialize::<ConnectionCredentials>()?))
}

/// Answers a method that acts: `Ok(())` for an allowed caller, else
/// `AccessDenied` (logged) and the caller's request is dropped.
pub async fn check(
    me: &Me,
    conn: &zbus::Connection,
    hdr: &zbus::message::Header<'_>,
    what: &str,
) -> zbus::fdo::Result<()> {
    let sender = hdr
        .sender()
        .map(|s| s.to_string())
        .ok_or_else(|| zbus::fdo::Error::AccessDenied("no sender".into()))?;
    let verdict = match credentials_async(conn, &sender).await {
        Ok(peer) => judge(me, &peer, true),
        Err(e) => Err(format!("its credentials are unknown ({e})")),
    };
    verdict.map_err(|why| {
        eprintln!("gpuctl tray: refused {what} from {sender}: {why}");
        zbus::fdo::Error::AccessDenied(format!(
            "gpuctl tray: only the tray's user, outside a sandbox, may do this ({why})"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(pid: u32, cgroup: &str, flatpak: bool) -> (tempdir::Dir, Me) {
        let d = tempdir::Dir::new();
        let p = d.0.join(pid.to_string());
        std::fs::create_dir_all(p.join("root")).unwrap();
        std::fs::write(p.join("cgroup"), cgroup).unwrap();
        if flatpak {
            std::fs::write(
                p.join("root/.flatpak-info"),
                "[Application]\nname=org.example.Evil\n",
            )
            .unwrap();
        }
        let me = Me {
            uid: 1000,
            label: None,
            proc_root: d.0.clone(),
        };
        (d, me)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let d = std::env::temp_dir().join(format!(
                    "gpuctl-peer-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                let _ = std::fs::remove_dir_all(&d);
                std::fs::create_dir_all(&d).unwrap();
                Dir(d)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    const HOST_CGROUP: &str =
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/waybar.service\n";

    fn peer(uid: u32, pid: u32, label: Option<&str>) -> Peer {
        Peer {
            uid: Some(uid),
            pid: Some(pid),
            label: label.map(str::to_string),
        }
    }

    #[test]
    fn the_users_unconfined_host_is_allowed() {
        let (_d, me) = fixture(42, HOST_CGROUP, false);
        assert_eq!(judge(&me, &peer(1000, 42, None), true), Ok(()));
        assert_eq!(
            judge(&me, &peer(1000, 42, Some("unconfined")), true),
            Ok(())
        );
        assert_eq!(
            judge(&me, &peer(1000, 42, Some("chrome (unconfined)")), true),
            Ok(())
        );
        assert_eq!(judge(&me, &peer(0, 42, None), true), Ok(()), "root");
    }

    #[test]
    fn another_uid_is_refused() {
        let (_d, me) = fixture(42, HOST_CGROUP, false);
        let e = judge(&me, &peer(1001, 42, None), true).unwrap_err();
        assert!(e.contains("uid 1001"), "{e}");
        assert!(
            judge(&me, &peer(0, 42, None), false).is_err(),
            "root, for the name"
        );
        assert!(
            judge(&me, &Peer::default(), true).is_err(),
            "no credentials"
        );
    }

    #[test]
    fn a_flatpak_app_is_refused_by_its_flatpak_info_or_its_cgroup() {
        let (_d, me) = fixture(42, HOST_CGROUP, true);
        let e = judge(&me, &peer(1000, 42, None), true).unwrap_err();
        assert!(e.contains("Flatpak") && e.contains("flatpak-info"), "{e}");
        let (_d, me) = fixture(
            43,
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-flatpak-org.example.Evil-1234.scope\n",
            false,
        );
        let e = judge(&me, &peer(1000, 43, None), true).unwrap_err();
        assert!(
            e.contains("Flatpak") && e.contains("app-flatpak-org.example.Evil"),
            "{e}"
        );
    }

    #[test]
    fn a_confined_peer_is_refused_by_its_label_or_its_snap_cgroup() {
        let (_d, me) = fixture(42, HOST_CGROUP, false);
        let e = judge(&me, &peer(1000, 42, Some("snap.evil.evil (enforce)")), true).unwrap_err();
        assert!(e.contains("snap.evil.evil (enforce)"), "{e}");
        let e = judge(&me, &peer(1000, 42, Some("firefox (complain)")), true).unwrap_err();
        assert!(e.contains("label"), "{e}");
        let (_d, me) = fixture(
            44,
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/snap.evil.evil-1b2c.scope\n",
            false,
        );
        let e = judge(&me, &peer(1000, 44, None), true).unwrap_err();
        assert!(e.contains("snap"), "{e}");
    }

    #[test]
    fn a_peer_labelled_like_the_tray_itself_is_allowed() {
        let (_d, mut me) = fixture(42, HOST_CGROUP, false);
        let selinux = "unconfined_u:unconfined_r:unconfined_t:s0-s0:c0.c1023";
        me.label = Some(selinux.into());
        assert_eq!(judge(&me, &peer(1000, 42, Some(selinux)), true), Ok(()));
        let other = "unconfined_u:unconfined_r:container_t:s0:c1,c2";
        assert!(judge(&me, &peer(1000, 42, Some(other)), true).is_err());
    }

    #[test]
    fn a_gone_process_is_refused() {
        let (_d, me) = fixture(42, HOST_CGROUP, false);
        let e = judge(&me, &peer(1000, 99, None), true).unwrap_err();
        assert!(e.contains("cannot be read"), "{e}");
    }

    #[test]
    fn the_label_loses_its_nul() {
        assert_eq!(label_text(b"unconfined\0"), "unconfined");
        assert_eq!(label_text(b"snap.x.y (enforce)"), "snap.x.y (enforce)");
    }
}
