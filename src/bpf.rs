//! The enforcer: the only code that touches BPF. It loads the embedded
//! object, applies a [`Plan`] to the kernel maps, and attaches the blocking
//! program only while something is blocked. It holds no policy.

use std::collections::BTreeMap;
use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags};
use serde::{Deserialize, Serialize};

use crate::gpu::DevNum;
use crate::policy::Plan;

#[allow(
    clippy::all,
    clippy::pedantic,
    dead_code,
    unused_imports,
    non_camel_case_types
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/gpuctl.skel.rs"));
}

use skel::{GpuctlSkel, GpuctlSkelBuilder};

/// Mirrors `GPUCTL_MAX_GPUS` in `bpf/gpuctl.h`.
pub const MAX_GPUS: u32 = 32;

/// How blocking is enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// `cgroup/dev` on the cgroup-v2 root: opens fail with EPERM.
    Cgroup,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Cgroup => "cgroup",
        }
    }

    /// What a user should know this backend does not do.
    pub fn limits(self) -> &'static str {
        match self {
            Backend::Cgroup => {
                "blocks opens of the GPU's character devices (EPERM); sysfs files that wake \
                 the GPU (PCI config, resource, rom: lspci reads them) are not covered"
            }
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// BPF log levels; a `.rodata` constant, so what is off costs nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    #[default]
    Off,
    Deny,
    Debug,
}

impl LogLevel {
    fn raw(self) -> u32 {
        match self {
            LogLevel::Off => 0,
            LogLevel::Deny => 1,
            LogLevel::Debug => 2,
        }
    }
}

pub struct Options {
    /// The cgroup-v2 directory to attach to; `None`: the cgroup-v2 root.
    pub cgroup: Option<PathBuf>,
    pub log_level: LogLevel,
    /// Exempt from every block (the daemon itself).
    pub daemon_tgid: u32,
}

/// Owns the loaded BPF object and the attachment. Dropping it detaches
/// everything (links are never pinned: fail-open if the daemon dies).
pub struct Enforcer {
    skel: GpuctlSkel<'static>,
    backend: Backend,
    cgroup_path: PathBuf,
    cgroup: OwnedFd,
    link: Option<Link>,
    applied: BTreeMap<DevNum, u32>,
}

fn key_bytes(d: DevNum) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&d.major.to_ne_bytes());
    k[4..].copy_from_slice(&d.minor.to_ne_bytes());
    k
}

fn rule_bytes(gpu: u32) -> [u8; 8] {
    let mut v = [0u8; 8];
    v[..4].copy_from_slice(&gpu.to_ne_bytes());
    v
}

/// Routes libbpf's messages (verifier logs included) to stderr, so a failed
/// load says why instead of only "Permission denied".
pub fn init_logging(verbose: bool) {
    let level = if verbose {
        libbpf_rs::PrintLevel::Debug
    } else {
        libbpf_rs::PrintLevel::Warn
    };
    libbpf_rs::set_print(Some((level, |_lvl, msg| eprint!("libbpf: {msg}"))));
}

/// The mount point of the cgroup-v2 hierarchy, from a mountinfo file.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // `36 25 0:31 / /sys/fs/cgroup rw,… shared:9 - cgroup2 cgroup2 rw,…`
        let (pre, post) = line.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mount = pre.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn open_cgroup(path: &Path) -> Result<OwnedFd> {
    let f = std::fs::File::open(path)
        .with_context(|| format!("opening cgroup directory {}", path.display()))?;
    if !f.metadata()?.is_dir() {
        bail!("{} is not a cgroup directory", path.display());
    }
    Ok(OwnedFd::from(f))
}

impl Enforcer {
    /// Opens, configures (`.rodata`) and loads the BPF object. Attaches
    /// nothing: call [`Enforcer::apply`].
    pub fn load(opts: &Options) -> Result<Self> {
        let cgroup_path = match &opts.cgroup {
            Some(p) => p.clone(),
            None => {
                let mi = std::fs::read_to_string("/proc/self/mountinfo")
                    .context("reading /proc/self/mountinfo")?;
                cgroup2_mount(&mi).context(
                    "no cgroup-v2 hierarchy is mounted (the cgroup backend attaches to it)",
                )?
            }
        };
        let cgroup = open_cgroup(&cgroup_path)?;

        // The skeleton borrows its object storage for its whole life; the
        // daemon loads one object per run, so the storage is leaked on
        // purpose (a few hundred bytes) to give it a 'static lifetime.
        let storage: &'static mut MaybeUninit<libbpf_rs::OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = GpuctlSkelBuilder::default()
            .open(storage)
            .context("opening the embedded BPF object")?;
        let rodata = open
            .maps
            .rodata_data
            .as_deref_mut()
            .context("the BPF object has no .rodata section")?;
        rodata.log_level = opts.log_level.raw();
        rodata.daemon_tgid = opts.daemon_tgid;
        let skel = open.load().context(
            "loading the BPF programs into the kernel (needs root or CAP_BPF+CAP_SYS_ADMIN; \
             libbpf's messages above say what the kernel refused)",
        )?;
        Ok(Enforcer {
            skel,
            backend: Backend::Cgroup,
            cgroup_path,
            cgroup,
            link: None,
            applied: BTreeMap::new(),
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn cgroup_path(&self) -> &Path {
        &self.cgroup_path
    }

    /// Whether a blocking program is attached right now.
    pub fn attached(&self) -> bool {
        self.link.is_some()
    }

    /// Makes the kernel enforce `plan`: map entries first, then attach (so
    /// nothing is attached half-filled); detach first when nothing is left.
    pub fn apply(&mut self, plan: &Plan) -> Result<()> {
        let map = &self.skel.maps.blocked_devs;
        if plan.is_empty() {
            self.link = None;
        }
        for dev in self.applied.keys() {
            if !plan.nodes.contains_key(dev) {
                map.delete(&key_bytes(*dev))
                    .with_context(|| format!("unblocking {dev} in the kernel map"))?;
            }
        }
        self.applied.retain(|d, _| plan.nodes.contains_key(d));
        for (dev, gpu) in &plan.nodes {
            if *gpu >= MAX_GPUS {
                bail!("GPU id {gpu} is beyond the {MAX_GPUS} GPUs gpuctl can count");
            }
            map.update(&key_bytes(*dev), &rule_bytes(*gpu), MapFlags::ANY)
                .with_context(|| format!("blocking {dev} in the kernel map"))?;
            self.applied.insert(*dev, *gpu);
        }
        if !plan.is_empty() && self.link.is_none() {
            let link = self
                .skel
                .progs
                .gpuctl_cgroup_dev
                .attach_cgroup(self.cgroup.as_fd().as_raw_fd())
                .with_context(|| {
                    format!(
                        "attaching the cgroup/dev program to {}",
                        self.cgroup_path.display()
                    )
                })?;
            self.link = Some(link);
        }
        Ok(())
    }

    /// Denied opens per GPU id since load, summed over CPUs.
    pub fn denied_counts(&self) -> Result<Vec<u64>> {
        let map = &self.skel.maps.denied;
        (0..MAX_GPUS)
            .map(|id| {
                let per_cpu = map
                    .lookup_percpu(&id.to_ne_bytes(), MapFlags::ANY)
                    .context("reading the denied-open counters")?
                    .unwrap_or_default();
                Ok(per_cpu
                    .iter()
                    .filter_map(|v| v.get(..8).and_then(|b| b.try_into().ok()))
                    .map(u64::from_ne_bytes)
                    .sum())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_in_mountinfo() {
        let mi = "24 30 0:22 / /sys rw,nosuid - sysfs sysfs rw\n\
                  35 24 0:30 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755\n\
                  36 35 0:31 / /sys/fs/cgroup/unified rw shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(mi),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount("24 30 0:22 / /sys rw - sysfs sysfs rw\n"),
            None
        );
        let esc = "36 35 0:31 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(esc), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn map_layouts_match_the_c_structs() {
        assert_eq!(
            std::mem::size_of::<skel::types::dev_key>(),
            key_bytes(DevNum::new(0, 0)).len()
        );
        assert_eq!(
            std::mem::size_of::<skel::types::dev_rule>(),
            rule_bytes(0).len()
        );
    }
}
