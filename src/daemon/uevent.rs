//! Kernel uevents (netlink `NETLINK_KOBJECT_UEVENT`): a DRM node appearing
//! (a driver that binds after the daemon started), a GPU hot-plugged or
//! removed, a display connected. Each one re-plans, so a late driver's nodes
//! are blocked the moment they exist, not at the next client request.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use anyhow::{Context, Result};
use nix::sys::socket::{
    bind, recv, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

pub struct Uevents {
    fd: OwnedFd,
}

impl Uevents {
    pub fn open() -> Result<Uevents> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Datagram,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkKObjectUEvent,
        )
        .context("opening the uevent socket")?;
        // Group 1: the kernel's own broadcasts (not udev's re-broadcasts).
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &NetlinkAddr::new(0, 1),
        )
        .context("binding the uevent socket")?;
        Ok(Uevents { fd })
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Reads every pending uevent; true if one concerns GPUs (DRM or PCI).
    pub fn drain(&self) -> bool {
        let mut buf = [0u8; 8192];
        let mut relevant = false;
        loop {
            match recv(
                std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                &mut buf,
                MsgFlags::empty(),
            ) {
                Ok(0) => return relevant,
                Ok(n) => relevant |= concerns_gpus(&buf[..n]),
                Err(nix::errno::Errno::EINTR) => continue,
                // EAGAIN: drained. ENOBUFS: we missed some; re-plan anyway.
                Err(nix::errno::Errno::ENOBUFS) => relevant = true,
                Err(_) => return relevant,
            }
        }
    }
}

/// `ACTION@DEVPATH\0KEY=VALUE\0…`: DRM and PCI events matter.
fn concerns_gpus(msg: &[u8]) -> bool {
    msg.split(|&b| b == 0)
        .any(|f| f == b"SUBSYSTEM=drm" || f == b"SUBSYSTEM=pci")
}

#[cfg(test)]
mod tests {
    #[test]
    fn filters_subsystems() {
        let drm = b"add@/devices/pci0000:00/0000:00:02.0/drm/card1\0ACTION=add\0SUBSYSTEM=drm\0DEVNAME=dri/card1\0";
        let usb = b"add@/devices/usb1\0ACTION=add\0SUBSYSTEM=usb\0";
        assert!(super::concerns_gpus(drm));
        assert!(!super::concerns_gpus(usb));
        assert!(super::concerns_gpus(b"change@/x\0SUBSYSTEM=pci\0"));
    }
}
