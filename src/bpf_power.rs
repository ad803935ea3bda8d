//! Loader of the runtime-PM programs (`bpf/power.bpf.c`): a separate object
//! from the enforcer, attached for the daemon's whole life in every mode,
//! whatever the backend. It only reports; it holds no policy and blocks
//! nothing. The daemon says which devices to watch ([`PowerMon::watch`]) and
//! drains transitions from the ring buffer ([`PowerMon::drain`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::rc::Rc;

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, RingBuffer, RingBufferBuilder};

#[allow(
    clippy::all,
    clippy::pedantic,
    dead_code,
    unused_imports,
    non_camel_case_types
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/power.skel.rs"));
}

use skel::{PowerSkel, PowerSkelBuilder};

/// Mirrors `GPUCTL_PM_NAME` in `bpf/power.h`.
const NAME: usize = 16;
const PATH_PARTS: usize = 4;
const PART: usize = 32;
const WHAT: usize = 64;
/// `struct pm_waker` / `struct pm_event` / `struct pm_dev` sizes (checked in tests).
const WAKER_SIZE: usize = 48 + WHAT + PATH_PARTS * PART + PART;
/// Offset of `pm_waker.mnt`.
const MNT_AT: usize = 48 + WHAT + PATH_PARTS * PART;
const EVENT_SIZE: usize = 24 + NAME + WAKER_SIZE;
const DEV_SIZE: usize = 24 + WAKER_SIZE;

const KTHREAD: u32 = 1;
const ASYNC: u32 = 2;
const FD: u32 = 4;
const OPEN: u32 = 8;

/// What a watched device is to its GPU (`pm_dev.role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The GPU's own PCI function.
    Gpu,
    /// Another function of its slot (HDMI audio `.1`, USB-C `.2`, …).
    Sibling,
    /// The PCI bridge (root port) above it.
    Bridge,
}

impl Role {
    fn raw(self) -> u32 {
        match self {
            Role::Gpu => 0,
            Role::Sibling => 1,
            Role::Bridge => 2,
        }
    }
    fn from_raw(v: u32) -> Role {
        match v {
            0 => Role::Gpu,
            1 => Role::Sibling,
            _ => Role::Bridge,
        }
    }
}

/// Runtime status as the kernel's `enum rpm_status`.
pub const RPM_ACTIVE: u32 = 0;
pub const RPM_SUSPENDED: u32 = 2;
/// Not known yet: the first settled status seen is reported.
const RPM_UNKNOWN: u32 = 0xff;

/// Who started a resume (`struct pm_waker`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Waker {
    /// CLOCK_MONOTONIC ns.
    pub ts: u64,
    pub pid: u32,
    pub tgid: u32,
    pub uid: u32,
    pub comm: String,
    /// A kernel thread did it (a kworker resuming for a driver).
    pub kthread: bool,
    /// An asynchronous request (`pm_request_resume`).
    pub r#async: bool,
    /// x86-64 syscall number the task was in, if a user task.
    pub syscall: Option<u32>,
    /// openat's path argument, when the task was opening a file.
    pub opened: Option<String>,
    /// The file behind the syscall's fd: names leaf first (`config`, `0000:01:00.0`, …).
    pub fd_path: Vec<String>,
    /// Where the file's file system is mounted (`dev`), when `fd_path` reached its root.
    pub mnt: Option<String>,
}

/// One settled runtime-PM transition of a watched device (`struct pm_event`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PmEvent {
    /// CLOCK_MONOTONIC ns.
    pub ts: u64,
    pub gpu: u32,
    pub role: Role,
    /// `RPM_ACTIVE` (a wake) or `RPM_SUSPENDED` (asleep).
    pub status: u32,
    pub dev: String,
    pub waker: Option<Waker>,
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(i..i + 8)?.try_into().ok()?))
}

impl Waker {
    fn parse(b: &[u8]) -> Option<Waker> {
        if b.len() < WAKER_SIZE {
            return None;
        }
        let flags = u32_at(b, 20)?;
        let syscall = u32_at(b, 24)? as i32;
        let fd_path = if flags & FD != 0 {
            (0..PATH_PARTS)
                .map(|i| cstr(&b[112 + i * PART..112 + (i + 1) * PART]))
                .take_while(|s| !s.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        Some(Waker {
            ts: u64_at(b, 0)?,
            pid: u32_at(b, 8)?,
            tgid: u32_at(b, 12)?,
            uid: u32_at(b, 16)?,
            kthread: flags & KTHREAD != 0,
            r#async: flags & ASYNC != 0,
            syscall: u32::try_from(syscall).ok(),
            comm: cstr(&b[32..48]),
            opened: (flags & OPEN != 0).then(|| cstr(&b[48..48 + WHAT])),
            mnt: Some(cstr(&b[MNT_AT..MNT_AT + PART])).filter(|m| !m.is_empty()),
            fd_path,
        })
    }
}

impl PmEvent {
    pub fn parse(b: &[u8]) -> Option<PmEvent> {
        if b.len() < EVENT_SIZE {
            return None;
        }
        let has_waker = u32_at(b, 20)? != 0;
        Some(PmEvent {
            ts: u64_at(b, 0)?,
            gpu: u32_at(b, 8)?,
            role: Role::from_raw(u32_at(b, 12)?),
            status: u32_at(b, 16)?,
            dev: cstr(&b[24..24 + NAME]),
            waker: if has_waker {
                Waker::parse(&b[24 + NAME..])
            } else {
                None
            },
        })
    }
}

/// A device to watch: its name (a PCI address), its GPU and role, and its
/// runtime status now (`power/runtime_status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watch {
    pub dev: String,
    pub gpu: u32,
    pub role: Role,
    pub status: Option<String>,
}

fn key(dev: &str) -> [u8; NAME] {
    let mut k = [0u8; NAME];
    let n = dev.len().min(NAME - 1);
    k[..n].copy_from_slice(&dev.as_bytes()[..n]);
    k
}

fn dev_value(w: &Watch) -> Vec<u8> {
    let mut v = vec![0u8; DEV_SIZE];
    let status = match w.status.as_deref() {
        Some("active") => RPM_ACTIVE,
        Some("suspended") => RPM_SUSPENDED,
        _ => RPM_UNKNOWN,
    };
    v[..4].copy_from_slice(&w.gpu.to_ne_bytes());
    v[4..8].copy_from_slice(&w.role.raw().to_ne_bytes());
    v[8..12].copy_from_slice(&status.to_ne_bytes());
    v
}

/// The loaded runtime-PM programs. Dropping it detaches them.
pub struct PowerMon {
    skel: PowerSkel<'static>,
    _links: Vec<Link>,
    rb: RingBuffer<'static>,
    queue: Rc<RefCell<Vec<PmEvent>>>,
    watched: BTreeMap<String, (u32, Role)>,
}

impl PowerMon {
    /// Loads and attaches the three `tp_btf/rpm_*` programs.
    pub fn load() -> Result<PowerMon> {
        // As in bpf.rs: the skeleton borrows its object storage for its
        // whole life; one per daemon run, leaked on purpose.
        let storage: &'static mut MaybeUninit<libbpf_rs::OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let skel = PowerSkelBuilder::default()
            .open(storage)
            .context("opening the embedded runtime-PM BPF object")?
            .load()
            .context("loading the runtime-PM programs (tp_btf/rpm_*)")?;
        let p = &skel.progs;
        let links = vec![
            p.gpuctl_rpm_resume.attach().context("tp_btf/rpm_resume")?,
            p.gpuctl_rpm_suspend
                .attach()
                .context("tp_btf/rpm_suspend")?,
            p.gpuctl_rpm_return_int
                .attach()
                .context("tp_btf/rpm_return_int")?,
        ];
        let queue: Rc<RefCell<Vec<PmEvent>>> = Rc::default();
        let q = Rc::clone(&queue);
        let mut b = RingBufferBuilder::new();
        b.add(&skel.maps.pm_events, move |data: &[u8]| {
            if let Some(e) = PmEvent::parse(data) {
                q.borrow_mut().push(e);
            }
            0
        })
        .context("setting up the runtime-PM ring buffer")?;
        let rb = b.build().context("building the runtime-PM ring buffer")?;
        Ok(PowerMon {
            skel,
            _links: links,
            rb,
            queue,
            watched: BTreeMap::new(),
        })
    }

    /// Makes the kernel watch exactly `devs`. An entry already watched for
    /// the same GPU and role is left alone (its status and counters stay).
    pub fn watch(&mut self, devs: &[Watch]) -> Result<()> {
        let map = &self.skel.maps.pm_devs;
        let want: BTreeMap<&str, &Watch> = devs.iter().map(|w| (w.dev.as_str(), w)).collect();
        let gone: Vec<String> = self
            .watched
            .keys()
            .filter(|d| !want.contains_key(d.as_str()))
            .cloned()
            .collect();
        for d in gone {
            match map.delete(&key(&d)) {
                Ok(()) => {}
                Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("unwatching {d}")),
            }
            self.watched.remove(&d);
        }
        for (d, w) in want {
            if self.watched.get(d) == Some(&(w.gpu, w.role)) {
                continue;
            }
            map.update(&key(d), &dev_value(w), MapFlags::ANY)
                .with_context(|| format!("watching {d}"))?;
            self.watched.insert(d.to_string(), (w.gpu, w.role));
        }
        Ok(())
    }

    /// The fd to poll: readable when transitions are queued.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the epoll fd is owned by the ring buffer, which lives in
        // `self` at least as long as the returned borrow.
        unsafe { BorrowedFd::borrow_raw(self.rb.epoll_fd()) }
    }

    /// Every queued transition, oldest first.
    pub fn drain(&mut self) -> Vec<PmEvent> {
        let _ = self.rb.consume();
        std::mem::take(&mut *self.queue.borrow_mut())
    }

    /// Completed resumes of `dev` counted in the kernel since it was watched.
    pub fn kernel_wakes(&self, dev: &str) -> Option<u64> {
        let v = self
            .skel
            .maps
            .pm_devs
            .lookup(&key(dev), MapFlags::ANY)
            .ok()??;
        u64_at(&v, 16)
    }

    /// Each program's name, kernel id, run count and total run time in ns, from
    /// `/proc/self/fdinfo` (the kernel counts only while
    /// `kernel.bpf_stats_enabled` is 1).
    pub fn stats(&self) -> Vec<(&'static str, u64, u64, u64)> {
        let p = &self.skel.progs;
        [
            ("gpuctl_rpm_resume", p.gpuctl_rpm_resume.as_fd().as_raw_fd()),
            (
                "gpuctl_rpm_suspend",
                p.gpuctl_rpm_suspend.as_fd().as_raw_fd(),
            ),
            (
                "gpuctl_rpm_return_int",
                p.gpuctl_rpm_return_int.as_fd().as_raw_fd(),
            ),
        ]
        .into_iter()
        .map(|(name, fd)| {
            let info =
                std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
            let field = |k: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            (
                name,
                field("prog_id:"),
                field("run_cnt:"),
                field("run_time_ns:"),
            )
        })
        .collect()
    }

    /// The waker recorded for a resume of `dev` that has not completed.
    #[cfg(test)]
    pub fn pending_waker(&self, dev: &str) -> Option<Waker> {
        let v = self
            .skel
            .maps
            .pm_devs
            .lookup(&key(dev), MapFlags::ANY)
            .ok()??;
        if u32_at(&v, 12)? == 0 {
            return None;
        }
        Waker::parse(&v[24..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_structs() {
        use std::mem::size_of;
        assert_eq!(size_of::<skel::types::pm_waker>(), WAKER_SIZE);
        // pm_event's size is a _Static_assert in bpf/power.h.
        assert_eq!(EVENT_SIZE, 312);
        assert_eq!(size_of::<skel::types::pm_dev>(), DEV_SIZE);
        assert_eq!(size_of::<skel::types::pm_key>(), NAME);
    }

    fn event_bytes(status: u32, waker: Option<(&str, u32, &[&str])>) -> Vec<u8> {
        let mut b = vec![0u8; EVENT_SIZE];
        b[..8].copy_from_slice(&5_000_000_000u64.to_ne_bytes());
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        b[12..16].copy_from_slice(&0u32.to_ne_bytes());
        b[16..20].copy_from_slice(&status.to_ne_bytes());
        b[24..36].copy_from_slice(b"0000:01:00.0");
        if let Some((comm, flags, parts)) = waker {
            b[20..24].copy_from_slice(&1u32.to_ne_bytes());
            let w = 24 + NAME;
            b[w + 8..w + 12].copy_from_slice(&4242u32.to_ne_bytes());
            b[w + 12..w + 16].copy_from_slice(&4242u32.to_ne_bytes());
            b[w + 16..w + 20].copy_from_slice(&1000u32.to_ne_bytes());
            b[w + 20..w + 24].copy_from_slice(&flags.to_ne_bytes());
            b[w + 24..w + 28].copy_from_slice(&17i32.to_ne_bytes());
            b[w + 32..w + 32 + comm.len()].copy_from_slice(comm.as_bytes());
            for (i, p) in parts.iter().enumerate() {
                let o = w + 112 + i * PART;
                b[o..o + p.len()].copy_from_slice(p.as_bytes());
            }
        }
        b
    }

    #[test]
    fn parses_wake_events() {
        let b = event_bytes(RPM_ACTIVE, Some(("lspci", FD, &["config", "0000:01:00.0"])));
        let e = PmEvent::parse(&b).unwrap();
        assert_eq!(
            (e.gpu, e.role, e.status, e.dev.as_str()),
            (1, Role::Gpu, RPM_ACTIVE, "0000:01:00.0")
        );
        let w = e.waker.unwrap();
        assert_eq!(
            (w.pid, w.uid, w.comm.as_str(), w.syscall),
            (4242, 1000, "lspci", Some(17))
        );
        assert_eq!(w.fd_path, vec!["config", "0000:01:00.0"]);
        assert!(!w.kthread && w.opened.is_none());
        assert_eq!(w.mnt, None);
        let b = event_bytes(RPM_SUSPENDED, None);
        assert!(PmEvent::parse(&b).unwrap().waker.is_none());
        assert!(PmEvent::parse(&b[..40]).is_none());
    }

    #[test]
    fn watch_values() {
        let w = Watch {
            dev: "0000:01:00.1".into(),
            gpu: 2,
            role: Role::Sibling,
            status: Some("suspended".into()),
        };
        let v = dev_value(&w);
        assert_eq!(u32_at(&v, 0), Some(2));
        assert_eq!(u32_at(&v, 4), Some(1));
        assert_eq!(u32_at(&v, 8), Some(RPM_SUSPENDED));
        assert_eq!(&key("0000:01:00.1")[..13], b"0000:01:00.1\0");
    }

    /// Root only: the programs load and attach on this kernel (tp_btf), and
    /// a watched device's runtime-PM calls run them: reading a PCI
    /// function's `config` calls pm_runtime_get_sync (rpm_resume) on it.
    #[test]
    fn loads_attaches_and_filters() {
        if !crate::bpf::root_or_skip("loads_attaches_and_filters") {
            return;
        }
        crate::bpf::init_logging(false);
        let mut m = PowerMon::load().unwrap();
        let Some(dev) = std::fs::read_dir("/sys/bus/pci/devices")
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
        else {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                b"SKIPPED loads_attaches_and_filters: no PCI device to read\n",
            );
            return;
        };
        // Reading a function's config takes a runtime-PM reference on its
        // parent (pm_runtime_get_sync: rpm_resume), here the root bus
        // device `pci0000:00`. Its runtime PM is disabled ("unsupported"),
        // and a disabled device stays RPM_SUSPENDED in the kernel: each
        // read starts a resume the kernel refuses. The program records who
        // asked, with the file, exactly as for a sleeping GPU.
        let config = format!("/sys/bus/pci/devices/{dev}/config");
        let Some(parent) = std::fs::canonicalize(format!("/sys/bus/pci/devices/{dev}"))
            .ok()
            .and_then(|p| p.parent().map(|p| p.to_path_buf()))
        else {
            return;
        };
        let bus = parent.file_name().unwrap().to_string_lossy().into_owned();
        let status = std::fs::read_to_string(parent.join("power/runtime_status"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        if status != "unsupported" {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("SKIPPED loads_attaches_and_filters: {bus} is {status}, not unsupported\n")
                    .as_bytes(),
            );
            return;
        }
        m.watch(&[Watch {
            dev: bus.clone(),
            gpu: 3,
            role: Role::Bridge,
            status: Some(status),
        }])
        .unwrap();
        assert!(m.pending_waker(&bus).is_none());
        let f = std::fs::File::open(&config).unwrap();
        let mut buf = [0u8; 64];
        let n = std::os::unix::fs::FileExt::read_at(&f, &mut buf, 0).unwrap();
        assert_eq!(n, 64);
        let w = m.pending_waker(&bus).expect("the read was attributed");
        assert_eq!(w.tgid, std::process::id());
        assert_eq!(w.syscall, Some(17), "pread64: {w:?}");
        assert_eq!(
            &w.fd_path[..2],
            &["config".to_string(), dev.clone()],
            "{w:?}"
        );
        // sysfs is deeper than the four names kept: its root (and mount) not reached.
        assert_eq!(w.mnt, None, "{w:?}");
        assert!(!w.kthread);
        // No device became active: no wake counted. (The first settled
        // status seen of a device whose status was unknown is reported.)
        let ev = m.drain();
        assert!(
            ev.iter()
                .all(|e| e.status == RPM_SUSPENDED && e.waker.is_none()),
            "{ev:?}"
        );
        let _ = std::os::unix::fs::FileExt::read_at(&f, &mut buf, 0);
        assert!(m.drain().is_empty());
        assert_eq!(m.kernel_wakes(&bus), Some(0));
        // An unwatched device's resume leaves it alone.
        m.watch(&[]).unwrap();
        let _ = std::os::unix::fs::FileExt::read_at(&f, &mut buf, 0);
        assert_eq!(m.kernel_wakes(&bus), None);
    }
}
