//! `gpuctl doctor`: checks what keeping a dGPU asleep needs, and says how to
//! fix what is missing. Reads only (sysfs, procfs, the daemon's status).

use std::fmt::Write as _;
use std::path::Path;

use crate::procs::Holder;
use crate::proto::data::{PowerOffState, StatusData, WhoData};

use crate::client;
use crate::gpu::{self, Gpu, Roots};
use crate::kernel::{self, bpf_lsm_active, cgroup2_mount};
use crate::proto::Request;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Info,
    Warn,
    Fail,
}

struct Report {
    out: String,
    worst: Level,
}

impl Report {
    fn say(&mut self, level: Level, what: &str, fix: Option<String>) {
        let tag = match level {
            Level::Ok => "ok  ",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        let _ = writeln!(self.out, "[{tag}] {what}");
        if let Some(f) = fix {
            for line in f.lines() {
                let _ = writeln!(self.out, "       {line}");
            }
        }
        self.worst = self.worst.max(level);
    }
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The `lsm=` value that adds `bpf` to the active list.
pub fn lsm_param(active: &str) -> String {
    let mut l: Vec<&str> = active
        .trim()
        .split(',')
        .filter(|x| !x.is_empty() && *x != "capability")
        .collect();
    if !l.contains(&"bpf") {
        l.push("bpf");
    }
    format!("lsm={}", l.join(","))
}

fn kernel_checks(r: &mut Report, roots: &Roots) {
    match kernel::active_lsms(roots) {
        Some(l) if bpf_lsm_active(&l) => r.say(
            Level::Ok,
            &format!("BPF LSM active ({}): the lsm backend can run", l.trim()),
            None,
        ),
        Some(l) => r.say(
            Level::Warn,
            &format!(
                "BPF LSM not active (active LSMs: {}): gpuctl uses the cgroup backend, which \
                 cannot stop lspci from waking the GPU through sysfs",
                l.trim()
            ),
            Some(format!(
                "add this to the kernel command line, then reboot:\n  {}\n\
                 (GRUB: GRUB_CMDLINE_LINUX in /etc/default/grub, then update-grub; \
                 systemd-boot: /etc/kernel/cmdline)",
                lsm_param(&l)
            )),
        ),
        None => r.say(
            Level::Warn,
            "cannot read /sys/kernel/security/lsm (securityfs not mounted?): the BPF LSM \
             cannot be checked, so gpuctl uses the cgroup backend",
            Some("mount -t securityfs securityfs /sys/kernel/security".into()),
        ),
    }
    if kernel::btf_present(roots) {
        r.say(
            Level::Ok,
            "kernel BTF present (/sys/kernel/btf/vmlinux)",
            None,
        );
    } else {
        r.say(
            Level::Fail,
            "no kernel BTF (/sys/kernel/btf/vmlinux): gpuctl's CO-RE programs cannot load",
            Some(
                "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distro's is)".into(),
            ),
        );
    }
    match read(&roots.procfs.join("self/mountinfo")).and_then(|m| cgroup2_mount(&m)) {
        Some(p) => r.say(
            Level::Ok,
            &format!("cgroup v2 mounted at {}", p.display()),
            None,
        ),
        None => r.say(
            Level::Warn,
            "no cgroup-v2 hierarchy mounted: the cgroup backend cannot run",
            Some("mount -t cgroup2 none /sys/fs/cgroup (systemd does this by default)".into()),
        ),
    }
    if let Some(mode) = kernel::lockdown(roots) {
        if mode == "confidentiality" {
            r.say(
                Level::Fail,
                "kernel lockdown is `confidentiality`: BPF programs may not read kernel memory, \
                 so gpuctl's programs cannot load",
                Some("use lockdown=integrity (the Secure Boot default on most distros)".into()),
            );
        } else {
            r.say(Level::Ok, &format!("kernel lockdown: {mode}"), None);
        }
    }
}

fn gpu_checks(r: &mut Report, roots: &Roots, g: &Gpu) {
    let dir = roots.sysfs.join(format!("bus/pci/devices/{}", g.pci));
    let label = g.label();
    if read(&dir.join("power/control")).is_some_and(|c| c.trim() == "auto") {
        r.say(
            Level::Ok,
            &format!("{label}: runtime power management on (power/control = auto)"),
            None,
        );
    }
    if read(&dir.join("d3cold_allowed")).is_some_and(|v| v.trim() == "1") {
        r.say(Level::Ok, &format!("{label}: D3cold allowed"), None);
    }
    // Every setting that keeps it (or its slot) powered, with its fix
    // (gpu/sleep.rs: the same verdict `gpuctl list` shows).
    for b in &g.sleep.blockers {
        r.say(
            Level::Warn,
            &format!("{label}: {}", b.problem),
            Some(b.fix.clone()),
        );
    }
    let verdict = g.sleep.summary();
    match g.sleep.can_sleep {
        Some(true) if g.sleep.blockers.is_empty() => r.say(
            Level::Ok,
            &format!("{label}: can sleep: {verdict}: blocking it keeps it asleep"),
            None,
        ),
        Some(true) => r.say(Level::Info, &format!("{label}: can sleep: {verdict}"), None),
        Some(false) => r.say(
            Level::Warn,
            &format!(
                "{label}: cannot sleep while its driver is bound: blocking alone does not lower \
                 idle power until the above is fixed; with power_off = auto (the default) \
                 gpuctl unbinds its drivers while it is blocked, so the kernel can cut its power"
            ),
            None,
        ),
        None => {}
    }
    if let (Some(p), Some(s)) = (&g.power_state, &g.runtime_status) {
        r.say(Level::Info, &format!("{label}: now {p} ({s})"), None);
    }
}

fn nvidia_checks(r: &mut Report, roots: &Roots) {
    let Some(params) = read(&roots.procfs.join("driver/nvidia/params")) else {
        return;
    };
    let dpm = params
        .lines()
        .find_map(|l| l.strip_prefix("DynamicPowerManagement:"))
        .and_then(|v| v.trim().parse::<u32>().ok());
    let fix = "options nvidia NVreg_DynamicPowerManagement=0x02\n\
               (in /etc/modprobe.d/nvidia-pm.conf, then rebuild the initramfs and reboot)"
        .to_string();
    match dpm {
        Some(2) => r.say(
            Level::Ok,
            "NVIDIA dynamic power management: fine-grained (0x02)",
            None,
        ),
        Some(3) => r.say(
            Level::Ok,
            "NVIDIA dynamic power management: driver default (fine-grained on Ampere and newer \
             notebook GPUs; older ones may need 0x02)",
            None,
        ),
        Some(v) => r.say(
            Level::Warn,
            &format!(
                "NVIDIA dynamic power management is {} ({v}): the GPU will not power off when idle",
                if v == 0 { "disabled" } else { "coarse-grained" }
            ),
            Some(fix),
        ),
        None => r.say(
            Level::Info,
            "NVIDIA driver loaded, but its DynamicPowerManagement setting is not readable",
            None,
        ),
    }
}

/// The desktop's own switcheroo-control (Fedora and Ubuntu install it):
/// its pid, if running. Its `comm` is the name cut to 15 bytes.
fn switcheroo_control_pid(procfs: &Path) -> Option<u32> {
    std::fs::read_dir(procfs).ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = read(&e.path().join("comm"))?;
        (comm.trim_end() == "switcheroo-cont").then_some(pid)
    })
}

/// switcheroo-control keeps offering a blocked GPU to the desktop.
fn switcheroo_checks(r: &mut Report, roots: &Roots, mode: Option<crate::policy::Mode>) {
    let Some(pid) = switcheroo_control_pid(&roots.procfs) else {
        return;
    };
    let integrated = mode == Some(crate::policy::Mode::Integrated);
    r.say(
        if integrated { Level::Warn } else { Level::Info },
        &format!(
            "the desktop's switcheroo-control is running (pid {pid}): in integrated mode it \
             still offers the blocked GPU to the desktop, and \"Launch using Discrete \
             Graphics\" then silently runs on the integrated GPU"
        ),
        Some(
            "systemctl disable --now switcheroo-control.service\n\
             systemctl enable --now gpuctl-switcheroo.service\n\
             (gpuctl's own net.hadess.SwitcherooControl answers in its place: it offers a \
             blocked GPU only where a launch from it is granted (smart mode); it steps \
             aside while the desktop's daemon holds the name)"
                .into(),
        ),
    );
}

/// Runs every check and prints the report; exit status 1 if any failed.
/// The boot-time rescue: what this boot's command line says, and how to
/// use it when a mode leaves the screen black.
fn rescue_checks(r: &mut Report, roots: &Roots, has_offload: bool) {
    let (rescue, warns) = crate::daemon::rescue::read(&roots.procfs);
    for w in warns {
        r.say(Level::Warn, &w, None);
    }
    if rescue.disable {
        r.say(
            Level::Info,
            "this boot: gpuctl.disable on the kernel command line: the daemon blocks nothing",
            Some("reboot without it to block again".into()),
        );
    } else if let Some(m) = rescue.mode {
        r.say(
            Level::Info,
            &format!(
                "this boot: gpuctl.mode={m} on the kernel command line (the saved mode is \
                 back on the next boot without it)"
            ),
            None,
        );
    }
    if has_offload {
        r.say(
            Level::Info,
            "a black screen after choosing a mode: boot once with a kernel command line word",
            Some(
                "at the boot menu, edit the entry (GRUB: `e`, add to the `linux` line, Ctrl-X;\n\
                 systemd-boot: `e`) and append\n\
                 gpuctl.mode=hybrid   this boot in hybrid mode (the saved mode is kept), or\n\
                 gpuctl.disable       this boot, gpuctl blocks and powers off nothing;\n\
                 then `gpuctl set hybrid` to keep hybrid"
                    .into(),
            ),
        );
    }
}

pub fn run(socket: &Path, roots: &Roots) -> u8 {
    let mut r = Report {
        out: String::new(),
        worst: Level::Ok,
    };
    kernel_checks(&mut r, roots);
    let inv = match gpu::discover(roots) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("gpuctl: {e:#}");
            return crate::exit::ERROR;
        }
    };
    if inv.gpus.is_empty() {
        r.say(Level::Info, "no GPU found: nothing to keep asleep", None);
    }
    for g in inv.gpus.iter().filter(|g| g.offload) {
        gpu_checks(&mut r, roots, g);
    }
    nvidia_checks(&mut r, roots);

    let status = client::request(socket, &Request::Status {})
        .ok()
        .filter(|s| s.ok)
        .and_then(|s| s.parse::<StatusData>().ok());
    match &status {
        Some(s) => r.say(
            Level::Ok,
            &format!(
                "daemon running: backend {}, mode {}{}",
                s.backend.map_or_else(|| "?".to_string(), |b| b.to_string()),
                s.mode,
                s.note
                    .as_deref()
                    .map(|n| format!(" (not fully in force: {n})"))
                    .unwrap_or_default()
            ),
            (!s.backend_limits.is_empty()).then(|| format!("backend: {}", s.backend_limits)),
        ),
        None => r.say(
            Level::Warn,
            "the gpuctl daemon is not running: nothing is blocked",
            Some("systemctl enable --now gpuctl".into()),
        ),
    }
    // What the power-off did to each GPU (status `power_off`).
    for g in status.iter().flat_map(|s| s.gpus.iter()) {
        let Some(p) = &g.power_off else { continue };
        let level = match (p.state, p.power_state.as_deref()) {
            (PowerOffState::Off, Some("D3cold")) => Level::Ok,
            (PowerOffState::Off, _)
            | (PowerOffState::Refused, _)
            | (PowerOffState::PoweringOff, _) => Level::Info,
            _ => Level::Warn,
        };
        r.say(level, &format!("GPU {}: {}", g.id, p.summary()), None);
    }

    switcheroo_checks(&mut r, roots, status.as_ref().map(|s| s.mode));

    rescue_checks(&mut r, roots, inv.gpus.iter().any(|g| g.offload));

    // Who keeps the offload GPUs awake right now.
    let holders: Vec<Holder> = client::request(socket, &Request::Who { gpu: None })
        .ok()
        .filter(|r| r.ok)
        .and_then(|r| r.parse::<WhoData>().ok())
        .map(|w| w.holders)
        .unwrap_or_else(|| crate::procs::holders_of(&inv, &roots.procfs, None).unwrap_or_default());
    let offload: Vec<u32> = inv
        .gpus
        .iter()
        .filter(|g| g.offload)
        .map(|g| g.id)
        .collect();
    let awake: Vec<&Holder> = holders
        .iter()
        .filter(|h| offload.contains(&h.gpu))
        .collect();
    if awake.is_empty() {
        r.say(Level::Ok, "no process holds an offload GPU open", None);
    } else {
        let list: Vec<String> = awake
            .iter()
            .map(|h| format!("{} holds {}", h.describe(), h.path))
            .collect();
        r.say(
            Level::Warn,
            "processes hold an offload GPU open and keep it awake (blocking only stops new opens)",
            Some(list.join("\n")),
        );
    }

    print!("{}", r.out);
    if r.worst == Level::Fail {
        crate::exit::ERROR
    } else {
        crate::exit::OK
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lsm_parameter_adds_bpf() {
        assert_eq!(
            super::lsm_param("lockdown,capability,landlock,yama,apparmor\n"),
            "lsm=lockdown,landlock,yama,apparmor,bpf"
        );
        assert_eq!(super::lsm_param("capability,bpf"), "lsm=bpf");
    }
}
