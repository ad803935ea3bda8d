//! Which enforcement backend to load: `--backend auto` tries the BPF LSM
//! where it is active and falls back to the cgroup backend, saying why.

use anyhow::{bail, Result};

use super::config::Config;
use super::log::log;
use super::{BackendChoice, Options};
use crate::bpf::{self, Backend, Enforcer, Preload};
use crate::kernel::{self, active_lsms};

/// Loads the requested backend; `auto` tries lsm where the BPF LSM is
/// active and falls back to cgroup, saying why. `preload`: what the saved
/// mode attaches (loaded before READY; the rest after it, or on first need).
pub fn load_backend(opts: &Options, config: &Config, preload: Preload) -> Result<Enforcer> {
    let load = |backend| {
        Enforcer::load(&bpf::Options {
            backend,
            cgroup: opts.cgroup.clone(),
            log_level: config.bpf_log,
            daemon_tgid: std::process::id(),
            max_grants: config.max_grants,
            preload,
        })
    };
    let lsms = active_lsms(&opts.roots);
    let lsm_active = lsms.as_deref().is_some_and(kernel::bpf_lsm_active);
    match opts.backend {
        BackendChoice::Cgroup => load(Backend::Cgroup),
        BackendChoice::Lsm => {
            if !lsm_active {
                bail!(
                    "the lsm backend needs the BPF LSM, which is not active ({}); add `bpf` to \
                     the kernel's lsm= parameter (see `gpuctl doctor`) or use --backend cgroup",
                    lsms.map(|l| format!("active LSMs: {}", l.trim()))
                        .unwrap_or_else(|| "/sys/kernel/security/lsm is not readable".into())
                );
            }
            load(Backend::Lsm)
        }
        BackendChoice::Auto => {
            if lsm_active {
                match load(Backend::Lsm) {
                    Ok(e) => return Ok(e),
                    Err(e) => log!("the BPF LSM is active but its programs did not load or attach ({e:#}); falling back to the cgroup backend"),
                }
            } else {
                log!(
                    "BPF LSM not active ({}); using the cgroup backend",
                    lsms.map(|l| format!("active LSMs: {}", l.trim()))
                        .unwrap_or_else(|| "securityfs not mounted".into())
                );
            }
            load(Backend::Cgroup)
        }
    }
}
