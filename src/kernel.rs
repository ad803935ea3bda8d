//! Kernel feature probes: what the running kernel offers gpuctl, read from
//! sysfs and procfs (under [`Roots`], so tests point them at fixtures). They
//! load nothing and need no root, so the daemon's backend choice and
//! `gpuctl doctor` share them without touching BPF (the role
//! `scx_utils::compat` has for the sched_ext schedulers).

use std::os::fd::RawFd;
use std::path::PathBuf;

use crate::gpu::Roots;

/// The active LSM list (`lockdown,capability,…,bpf`), if securityfs shows it.
pub fn active_lsms(roots: &Roots) -> Option<String> {
    std::fs::read_to_string(roots.sysfs.join("kernel/security/lsm")).ok()
}

/// Whether the BPF LSM is active, from the text of the active LSM list.
pub fn bpf_lsm_active(lsm_list: &str) -> bool {
    lsm_list.trim().split(',').any(|l| l == "bpf")
}

/// Whether the kernel exposes its BTF (`/sys/kernel/btf/vmlinux`), which the
/// CO-RE programs need to load.
pub fn btf_present(roots: &Roots) -> bool {
    roots.sysfs.join("kernel/btf/vmlinux").exists()
}

/// The kernel lockdown mode (`none`, `integrity`, `confidentiality`), if
/// securityfs shows it.
pub fn lockdown(roots: &Roots) -> Option<String> {
    let l = std::fs::read_to_string(roots.sysfs.join("kernel/security/lockdown")).ok()?;
    // `none [integrity] confidentiality`: the active mode is in brackets.
    let mode = l
        .split_whitespace()
        .find(|w| w.starts_with('['))
        .unwrap_or("[none]")
        .trim_matches(|c| c == '[' || c == ']');
    Some(mode.to_string())
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
        let octal = i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c));
        if b[i] == b'\\' && octal {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A loaded BPF program's statistics, from its fd's `/proc/self/fdinfo`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgStats {
    pub prog_id: u64,
    /// Runs and total run time: the kernel counts them only while
    /// `kernel.bpf_stats_enabled` is 1 (0 otherwise).
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

/// The statistics of the program behind `fd` (zeros where unreadable).
pub fn prog_stats(fd: RawFd) -> ProgStats {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
    parse_fdinfo(&info)
}

fn parse_fdinfo(info: &str) -> ProgStats {
    let field = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    ProgStats {
        prog_id: field("prog_id:"),
        run_cnt: field("run_cnt:"),
        run_time_ns: field("run_time_ns:"),
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
    fn lsm_list() {
        assert!(bpf_lsm_active(
            "lockdown,capability,landlock,yama,apparmor,bpf\n"
        ));
        assert!(!bpf_lsm_active(
            "lockdown,capability,landlock,yama,apparmor\n"
        ));
        assert!(!bpf_lsm_active(""));
    }

    #[test]
    fn fdinfo_fields() {
        let info = "pos:\t0\nflags:\t02000002\nprog_type:\t26\nprog_jited:\t1\n\
                    prog_tag:\t0123456789abcdef\nmemlock:\t4096\nprog_id:\t77\n\
                    run_time_ns:\t1500\nrun_cnt:\t3\nrecursion_misses:\t0\n";
        assert_eq!(
            parse_fdinfo(info),
            ProgStats {
                prog_id: 77,
                run_cnt: 3,
                run_time_ns: 1500
            }
        );
        assert_eq!(parse_fdinfo(""), ProgStats::default());
    }
}
