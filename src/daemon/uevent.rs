//! Kernel uevents (netlink `NETLINK_KOBJECT_UEVENT`): a DRM node appearing
//! (a driver that binds after the daemon started), a GPU hot-plugged or
//! removed, a display connected. Each one re-plans, so a late driver's nodes
//! are blocked the moment they exist, not at the next client request.
//! `power_supply` events (AC plugged, battery) feed the automatic modes.
//! Only the kernel's own messages count: a datagram whose sender is not the
//! kernel (netlink port id 0, sent to the kernel's group 1) is ignored, so a
//! local process cannot forge a power change.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use anyhow::{Context, Result};
use nix::sys::socket::{
    bind, recvfrom, socket, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

/// What a batch of uevents was about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kinds {
    /// DRM or PCI: re-read the GPUs.
    pub gpus: bool,
    /// `power_supply`: the power source may have changed.
    pub power: bool,
    /// Datagrams ignored because the kernel did not send them.
    pub forged: u32,
}

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

    /// Reads every pending uevent and says what they concern.
    pub fn drain(&self) -> Kinds {
        let mut buf = [0u8; 8192];
        let mut k = Kinds::default();
        loop {
            match recvfrom::<NetlinkAddr>(std::os::fd::AsRawFd::as_raw_fd(&self.fd), &mut buf) {
                Ok((0, _)) => return k,
                Ok((n, from)) => {
                    if !from_kernel(from.as_ref()) {
                        k.forged += 1;
                        continue;
                    }
                    let msg = &buf[..n];
                    k.gpus |= concerns_gpus(msg);
                    k.power |= concerns_power(msg);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                // EAGAIN: drained. ENOBUFS: we missed some; re-read all.
                Err(nix::errno::Errno::ENOBUFS) => {
                    k.gpus = true;
                    k.power = true;
                }
                Err(_) => return k,
            }
        }
    }
}

/// The kernel sends from port id 0 to its multicast group 1; a process
/// always has a non-zero port id.
fn from_kernel(addr: Option<&NetlinkAddr>) -> bool {
    addr.is_some_and(|a| a.pid() == 0 && a.groups() & 1 != 0)
}

/// `SUBSYSTEM=power_supply`: an AC adapter, USB-C source or battery.
fn concerns_power(msg: &[u8]) -> bool {
    msg.split(|&b| b == 0)
        .any(|f| f == b"SUBSYSTEM=power_supply")
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
        let ac = b"change@/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0003:00/power_supply/ADP1\0ACTION=change\0SUBSYSTEM=power_supply\0POWER_SUPPLY_ONLINE=1\0";
        assert!(super::concerns_power(ac));
        assert!(!super::concerns_gpus(ac));
        assert!(!super::concerns_power(drm));
    }

    #[test]
    fn only_the_kernel_is_believed() {
        use nix::sys::socket::NetlinkAddr;
        assert!(super::from_kernel(Some(&NetlinkAddr::new(0, 1))));
        // A process (port id = its pid), or udev's re-broadcast group 2.
        assert!(!super::from_kernel(Some(&NetlinkAddr::new(4242, 1))));
        assert!(!super::from_kernel(Some(&NetlinkAddr::new(0, 2))));
        assert!(!super::from_kernel(None));
    }
}
