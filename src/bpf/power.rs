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

use super::abi;
pub use super::abi::{RPM_ACTIVE, RPM_SUSPENDED};
use super::skel::power::{types, PowerSkel, PowerSkelBuilder};

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

/// A device to watch: its name (a PCI address), its GPU and role, and its
/// runtime status now (`power/runtime_status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watch {
    pub dev: String,
    pub gpu: u32,
    pub role: Role,
    pub status: Option<String>,
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
        // As in enforcer.rs: the skeleton borrows its object storage for its
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
            if let Some(e) = abi::read::<types::pm_event>(data) {
                q.borrow_mut().push(PmEvent::from(&e));
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
            match map.delete(abi::bytes(&abi::pm_key(&d))) {
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
            let (key, value) = (abi::pm_key(d), abi::pm_dev(w));
            map.update(abi::bytes(&key), abi::bytes(&value), MapFlags::ANY)
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
        self.pm_dev(dev).map(|v| abi::pm_wakes(&v))
    }

    /// The `pm_devs` entry of `dev`, if it is watched.
    fn pm_dev(&self, dev: &str) -> Option<types::pm_dev> {
        let key = abi::pm_key(dev);
        let v = self
            .skel
            .maps
            .pm_devs
            .lookup(abi::bytes(&key), MapFlags::ANY)
            .ok()??;
        abi::read(&v)
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
            let st = crate::kernel::prog_stats(fd);
            (name, st.prog_id, st.run_cnt, st.run_time_ns)
        })
        .collect()
    }

    /// The waker recorded for a resume of `dev` that has not completed.
    #[cfg(test)]
    pub fn pending_waker(&self, dev: &str) -> Option<Waker> {
        abi::pm_pending(&self.pm_dev(dev)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root only: the programs load and attach on this kernel (tp_btf), and
    /// a watched device's runtime-PM calls run them: reading a PCI
    /// function's `config` calls pm_runtime_get_sync (rpm_resume) on it.
    #[test]
    #[ignore = "root"]
    fn loads_attaches_and_filters() {
        crate::bpf::require_root("loads_attaches_and_filters");
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
