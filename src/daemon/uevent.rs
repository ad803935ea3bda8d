//! Kernel uevents (netlink `NETLINK_KOBJECT_UEVENT`): a DRM node appearing
//! (a driver that binds after the daemon started), a GPU hot-plugged or
//! removed, a display connected. Each one re-plans, so a late driver's nodes
//! are blocked the moment they exist, not at the next client request.
//! `power_supply` events (AC plugged, battery) feed the automatic modes.
//! Only the kernel's own messages count: a datagram whose sender is not the
//! kernel (netlink port id 0, sent to the kernel's group 1) is ignored, so a
//! local process cannot forge a power change.
//!
//! A classic BPF socket filter ([`filter`]) drops, in the kernel, every
//! uevent whose `SUBSYSTEM` is not one of ours, so a storm of unrelated
//! events (`udevadm trigger` at boot replays one per device) never wakes
//! the daemon. A burst of GPU events re-plans once ([`Coalesce`]): the
//! first at once, the rest at the end of a short window.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::socket::{
    bind, recvfrom, socket, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType,
};

/// What a batch of uevents was about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kinds {
    /// DRM or PCI: re-read the GPUs.
    pub gpus: bool,
    /// `power_supply`: the power source may have changed.
    pub power: bool,
    /// Datagrams ignored because the kernel did not send them.
    pub forged: u32,
    /// DRM nodes the kernel added (their device path and number), at most
    /// [`MAX_ADDED`] per batch: the guard lets through, before any
    /// discovery, those that are not a blocked GPU's
    /// (`Core::release_new_nodes`).
    pub drm_added: Vec<(String, crate::gpu::DevNum)>,
}

/// Most DRM adds one batch records (a burst past it is left to the re-plan).
pub const MAX_ADDED: usize = 64;

/// `add@DEVPATH\0…SUBSYSTEM=drm\0…MAJOR=M\0MINOR=N\0`: a DRM node the kernel
/// made, as (DEVPATH, M:N).
fn drm_added(msg: &[u8]) -> Option<(String, crate::gpu::DevNum)> {
    let mut fields = msg.split(|&b| b == 0);
    let devpath = fields.next()?.strip_prefix(b"add@")?;
    let (mut drm, mut major, mut minor) = (false, None, None);
    for f in fields {
        if f == b"SUBSYSTEM=drm" {
            drm = true;
        } else if let Some(v) = f.strip_prefix(b"MAJOR=") {
            major = std::str::from_utf8(v).ok()?.parse().ok();
        } else if let Some(v) = f.strip_prefix(b"MINOR=") {
            minor = std::str::from_utf8(v).ok()?.parse().ok();
        }
    }
    let path = String::from_utf8(devpath.to_vec()).ok()?;
    match (drm, major, minor) {
        (true, Some(ma), Some(mi)) => Some((path, crate::gpu::DevNum::new(ma, mi))),
        _ => None,
    }
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
        // Without the filter (a kernel that refuses it) every uevent wakes
        // the daemon, as before it had one: slower, never wrong.
        if let Err(e) = attach(&fd, &filter()) {
            super::log::log!(
                "attaching the uevent socket filter failed ({e:#}); every uevent wakes the daemon"
            );
        }
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
                    if k.drm_added.len() < MAX_ADDED {
                        k.drm_added.extend(drm_added(msg));
                    }
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

/// The subsystems whose events the daemon reads (the `SUBSYSTEM=` values
/// [`concerns_gpus`] and [`concerns_power`] match); the socket filter lets
/// only these through.
const SUBSYSTEMS: &[&[u8]] = &[b"pci", b"drm", b"power_supply"];

/// How far the filter looks for the end of the `ACTION@DEVPATH` header (a
/// multiple of 4). A longer header (a devpath over ~250 bytes; GPU, PCI and
/// power-supply devpaths are 40–150) is let through, and the daemon reads
/// it as before: the filter only ever drops what it is sure of. The bound
/// is set by the kernel's limit on a socket filter's size: the kernel
/// converts the program to eBPF (each absolute or indexed load becomes
/// ~15 instructions, net/core/filter.c `convert_bpf_ld_abs`) and charges
/// that to `net.core.optmem_max`, 20 480 bytes by default before Linux 6.9.
const MAX_HEADER: u32 = 256;

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const LD_W_ABS: u16 = 0x20;
const LD_W_IND: u16 = 0x40;
const LD_H_IND: u16 = 0x48;
const LD_B_IND: u16 = 0x50;
const LDX_IMM: u16 = 0x01;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const ACCEPT: u32 = u32::MAX;
const DROP: u32 = 0;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The kernel's uevent is `ACTION@DEVPATH\0ACTION=…\0DEVPATH=…\0SUBSYSTEM=…\0…`
/// (lib/kobject_uevent.c: the header, then the three default keys in this
/// order, then the rest). With `H` the header's length including its NUL,
/// `SUBSYSTEM=` starts at `2H + 15` (`ACTION=` and `DEVPATH=` repeat the
/// header's two parts). cBPF cannot loop, so the scan for the header's NUL
/// is unrolled: one load per 4 bytes, then per byte a test and, on a NUL
/// at `p`, `X = 2p + 17` and a jump to the check. The check reads
/// `SUBSYSTEM=` at `X` and compares the value with [`SUBSYSTEMS`]. Anything
/// not in that shape (no `SUBSYSTEM=` where expected, a header over
/// [`MAX_HEADER`]) is let through: the daemon's own parsing decides, as it
/// did before the filter. A load past the datagram's end ends the filter
/// with "drop": it only happens for a datagram too short to carry a
/// subsystem (the word holding the header's NUL is followed by the keys).
pub fn filter() -> Vec<libc::sock_filter> {
    let mut f = Vec::new();
    let words = (MAX_HEADER / 4) as usize;
    // Each word: a load and 4 × (test, X, jump); then one ACCEPT.
    let check = 13 * words + 1;
    for w in 0..MAX_HEADER / 4 {
        f.push(op(LD_W_ABS, 0, 0, 4 * w));
        for j in 0..4u32 {
            // The word is big-endian: its first byte is the high one.
            let mask = 0xff00_0000u32 >> (8 * j);
            // A non-zero byte skips its two landing instructions.
            f.push(op(JMP_JSET_K, 2, 0, mask));
            f.push(op(LDX_IMM, 0, 0, 2 * (4 * w + j) + 17));
            // The jump's offset counts from the next instruction.
            let at = f.len() + 1;
            f.push(op(JMP_JA, 0, 0, (check - at) as u32));
        }
    }
    f.push(op(RET_K, 0, 0, ACCEPT));
    debug_assert_eq!(f.len(), check);
    // X = the offset of `SUBSYSTEM=`; not there: unknown shape, accept.
    let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    f.push(op(LD_W_IND, 0, 0, 0));
    f.push(op(JMP_JEQ_K, 1, 0, word(b"SUBS")));
    f.push(op(RET_K, 0, 0, ACCEPT));
    f.push(op(LD_W_IND, 0, 0, 4));
    f.push(op(JMP_JEQ_K, 1, 0, word(b"YSTE")));
    f.push(op(RET_K, 0, 0, ACCEPT));
    f.push(op(LD_H_IND, 0, 0, 8));
    f.push(op(JMP_JEQ_K, 1, 0, u32::from(u16::from_be_bytes(*b"M="))));
    f.push(op(RET_K, 0, 0, ACCEPT));
    // The value, with its NUL, compared 4 bytes at a time (the last word
    // padded with what follows the NUL is compared bytewise instead).
    for name in SUBSYSTEMS {
        let mut v = name.to_vec();
        v.push(0);
        let mut body = Vec::new();
        let words = v.len() / 4;
        let tail = v.len() % 4;
        // Instructions of this candidate: 2 per word, 2 per tail byte, then
        // RET ACCEPT; a mismatch jumps past them all to the next candidate.
        let total = 2 * (words + tail) + 1;
        for w in 0..words {
            let off = 10 + 4 * w as u32;
            body.push(op(LD_W_IND, 0, 0, off));
            let left = total - body.len() - 1;
            body.push(op(JMP_JEQ_K, 0, left as u8, word(&v[4 * w..])));
        }
        for t in 0..tail {
            let off = 10 + (4 * words + t) as u32;
            body.push(op(LD_B_IND, 0, 0, off));
            let left = total - body.len() - 1;
            body.push(op(JMP_JEQ_K, 0, left as u8, u32::from(v[4 * words + t])));
        }
        body.push(op(RET_K, 0, 0, ACCEPT));
        debug_assert_eq!(body.len(), total);
        f.extend(body);
    }
    f.push(op(RET_K, 0, 0, DROP));
    f
}

/// SO_ATTACH_FILTER: the kernel runs `prog` on each datagram before it is
/// queued; what it drops never reaches the socket (nor wakes a poll).
fn attach(fd: &OwnedFd, prog: &[libc::sock_filter]) -> Result<()> {
    let len = u16::try_from(prog.len()).context("the socket filter is too long")?;
    let fprog = libc::sock_fprog {
        len,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `prog`, alive for the call; the kernel
    // copies the program and reads `size_of::<sock_fprog>()` bytes.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            std::ptr::addr_of!(fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// How long a burst of GPU uevents is gathered into one re-plan after the
/// first one, which re-plans at once.
pub const BURST_WINDOW: Duration = Duration::from_millis(50);

/// One re-plan per burst of GPU uevents: the first event of a quiet spell
/// re-plans at once (a hot plug is acted on with no delay); the ones within
/// [`BURST_WINDOW`] after it re-plan once, at the end of the window.
#[derive(Debug, Default)]
pub struct Coalesce {
    /// When the last re-plan for a uevent ran.
    last: Option<Instant>,
    /// A re-plan owed at this time (events arrived within the window).
    pending: Option<Instant>,
}

impl Coalesce {
    /// GPU uevents arrived at `now`: true to re-plan now; otherwise one is
    /// owed at [`Coalesce::deadline`].
    pub fn on_event(&mut self, now: Instant) -> bool {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < BURST_WINDOW => {
                self.pending.get_or_insert(t + BURST_WINDOW);
                false
            }
            _ => {
                self.last = Some(now);
                self.pending = None;
                true
            }
        }
    }

    /// When an owed re-plan is due.
    pub fn deadline(&self) -> Option<Instant> {
        self.pending
    }

    /// True (once) when the owed re-plan is due at `now`, or when `force`
    /// (a request that must see the hardware as it is now).
    pub fn take_due(&mut self, now: Instant, force: bool) -> bool {
        match self.pending {
            Some(t) if force || now >= t => {
                self.pending = None;
                self.last = Some(now);
                true
            }
            _ => false,
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

    /// A cBPF interpreter for the subset [`super::filter`] uses, so the
    /// program's verdicts are tested here as the kernel would reach them.
    fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let load = |at: usize, n: usize| -> Option<u32> {
            let b = pkt.get(at..at + n)?;
            Some(b.iter().fold(0u32, |acc, &v| (acc << 8) | u32::from(v)))
        };
        loop {
            let i = prog[pc];
            pc += 1;
            let (k, ind) = (i.k as usize, (x as usize) + i.k as usize);
            let got = match i.code {
                super::LD_W_ABS => load(k, 4),
                super::LD_W_IND => load(ind, 4),
                super::LD_H_IND => load(ind, 2),
                super::LD_B_IND => load(ind, 1),
                super::LDX_IMM => {
                    x = i.k;
                    continue;
                }
                super::JMP_JA => {
                    pc += i.k as usize;
                    continue;
                }
                super::JMP_JEQ_K => {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf });
                    continue;
                }
                super::JMP_JSET_K => {
                    pc += usize::from(if a & i.k != 0 { i.jt } else { i.jf });
                    continue;
                }
                super::RET_K => return i.k,
                c => panic!("opcode {c:#x}"),
            };
            match got {
                Some(v) => a = v,
                None => return 0,
            }
        }
    }

    /// A uevent as the kernel formats it.
    fn uevent(action: &str, devpath: &str, subsystem: &str, rest: &[&str]) -> Vec<u8> {
        let mut m = format!(
            "{action}@{devpath}\0ACTION={action}\0DEVPATH={devpath}\0SUBSYSTEM={subsystem}\0"
        );
        for r in rest {
            m.push_str(r);
            m.push('\0');
        }
        m.push_str("SEQNUM=4242\0");
        m.into_bytes()
    }

    #[test]
    fn the_socket_filter_passes_ours_and_drops_the_rest() {
        let f = super::filter();
        assert!(f.len() <= 4096, "BPF_MAXINSNS: {}", f.len());
        // What the kernel charges to optmem_max (20 480 bytes by default
        // before Linux 6.9): the eBPF it converts to, each load ~15
        // instructions of 8 bytes, the rest one; a 1 KiB margin.
        let loads = f
            .iter()
            .filter(|i| i.code & 0x07 == 0 && i.code & 0xe0 != 0)
            .count();
        let ebpf = 15 * loads + (f.len() - loads) + 16;
        assert!(8 * ebpf + 1024 < 20_480, "{ebpf} eBPF instructions");
        let pass = |m: &[u8]| run(&f, m) == u32::MAX;
        let card = "/devices/pci0000:00/0000:00:01.0/0000:01:00.0/drm/card1";
        for (sub, path) in [
            ("drm", card),
            ("pci", "/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
            (
                "power_supply",
                "/devices/LNXSYSTM:00/ACPI0003:00/power_supply/ADP1",
            ),
        ] {
            for action in [
                "add", "remove", "change", "bind", "unbind", "move", "online",
            ] {
                let m = uevent(action, path, sub, &["DEVNAME=dri/card1"]);
                assert!(pass(&m), "{}", String::from_utf8_lossy(&m));
                assert!(super::concerns_gpus(&m) || super::concerns_power(&m));
            }
        }
        // Other subsystems, and names that only start like ours.
        for sub in [
            "mem",
            "usb",
            "block",
            "net",
            "pcie",
            "dr",
            "drmx",
            "power",
            "power_supplyx",
            "pci_bus",
        ] {
            let m = uevent("change", "/devices/virtual/mem/null", sub, &["MAJOR=1"]);
            assert!(!pass(&m), "{sub}");
            assert!(
                !super::concerns_gpus(&m) && !super::concerns_power(&m),
                "{sub}"
            );
        }
        // A later key saying `SUBSYSTEM=drm` does not make it ours.
        let m = uevent(
            "change",
            "/devices/virtual/mem/null",
            "mem",
            &["X=1", "SUBSYSTEM=drm"],
        );
        assert!(!pass(&m));
        // Devpaths of every length up to the scan's end are read exactly.
        for len in 1..(super::MAX_HEADER as usize - 8) {
            let path = format!("/{}", "a".repeat(len - 1));
            assert!(pass(&uevent("add", &path, "drm", &[])), "{len}");
            assert!(!pass(&uevent("add", &path, "usb", &[])), "{len}");
        }
        // Past the scan, or in a shape it does not know: let through (the
        // daemon's parser decides, as before the filter).
        let long = format!("/{}", "a".repeat(super::MAX_HEADER as usize + 10));
        assert!(pass(&uevent("add", &long, "usb", &[])));
        assert!(pass(b"add@/x\0SUBSYSTEM=usb\0ACTION=add\0DEVPATH=/x\0"));
    }

    #[test]
    fn a_burst_replans_at_once_then_once_at_the_window_end() {
        use super::{Coalesce, BURST_WINDOW};
        use std::time::Duration;
        let t0 = std::time::Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut c = Coalesce::default();
        // The first event of a quiet spell: at once, nothing owed.
        assert!(c.on_event(t0));
        assert_eq!(c.deadline(), None);
        // The rest of the burst: owed, at the window's end.
        for i in 1..40 {
            assert!(!c.on_event(ms(i)));
        }
        assert_eq!(c.deadline(), Some(t0 + BURST_WINDOW));
        assert!(!c.take_due(ms(10), false));
        assert!(c.take_due(t0 + BURST_WINDOW, false));
        assert!(!c.take_due(t0 + BURST_WINDOW, false), "once");
        // A change request forces what is owed.
        assert!(!c.on_event(t0 + BURST_WINDOW + Duration::from_millis(1)));
        assert!(c.take_due(t0 + BURST_WINDOW + Duration::from_millis(2), true));
        // After a quiet window, the next event is acted on at once again.
        assert!(c.on_event(ms(500)));
    }

    #[test]
    fn drm_adds_are_read_with_their_path_and_number() {
        let m = uevent(
            "add",
            "/devices/pci0000:00/0000:00:03.0/virtio1/drm/card1",
            "drm",
            &["MAJOR=226", "MINOR=1", "DEVNAME=dri/card1"],
        );
        assert_eq!(
            super::drm_added(&m),
            Some((
                "/devices/pci0000:00/0000:00:03.0/virtio1/drm/card1".to_string(),
                crate::gpu::DevNum::new(226, 1)
            ))
        );
        let change = uevent(
            "change",
            "/devices/x/drm/card1",
            "drm",
            &["MAJOR=226", "MINOR=1"],
        );
        assert_eq!(super::drm_added(&change), None);
        let pci = uevent("add", "/devices/pci0000:00/0000:00:03.0", "pci", &[]);
        assert_eq!(super::drm_added(&pci), None);
        let connector = uevent("add", "/devices/x/drm/card1/card1-DP-1", "drm", &[]);
        assert_eq!(super::drm_added(&connector), None);
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
