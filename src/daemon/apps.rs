//! Per-application rules (smart mode): `gpuctl app allow|deny|forget|list`.
//!
//! A rule is keyed by the kernel's identity of the executable (superblock
//! `s_dev`, inode), learned from the kernel itself, and persisted with its
//! path. Each rule's directory is watched with inotify, so a file replaced
//! by a package upgrade (a new inode renamed over the path) is re-resolved
//! without polling.
//!
//! The same watches keep the kernel's identity of the system programs with
//! a role (systemd-udevd reads a blocked GPU's `uevent`, systemd-logind
//! opens its card for a granted session: [`Service`]) current across
//! upgrades.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::proto::data::{AppEntry, AppsData};
use anyhow::{Context, Result};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use super::core::Core;
use super::log::log;
use crate::bpf::{Enforcer, Service};
use crate::gpu::{self, Inventory};
use crate::policy::{AppRule, Choice};

/// The app rules' kernel side: what each rule is installed under, why one
/// is not in force, and the inotify watches that notice a replaced file
/// (the socket's directory is watched by the same instance). The rules
/// themselves are part of the choice, in [`Core`].
pub struct Apps {
    /// Why an app rule is not in force, by path.
    errors: BTreeMap<String, String>,
    /// The kernel identity each app rule is installed under, by path.
    ids: BTreeMap<String, gpu::FileId>,
    /// Watches the directories of app-rule executables, so a replaced file
    /// (a package upgrade renames a new inode over it) is re-resolved.
    inotify: Inotify,
    watches: BTreeMap<WatchDescriptor, PathBuf>,
    /// The inotify watch on the socket's directory.
    socket_watch: Option<WatchDescriptor>,
    /// System programs with a role, with the paths each may be at.
    services: Vec<(Service, Vec<PathBuf>)>,
    /// Where each found service is (its real path) and its kernel identity.
    service_ids: BTreeMap<Service, (PathBuf, gpu::FileId)>,
}

impl Apps {
    pub fn new(services: Vec<(Service, Vec<PathBuf>)>) -> Result<Apps> {
        Ok(Apps {
            services,
            service_ids: BTreeMap::new(),
            errors: BTreeMap::new(),
            ids: BTreeMap::new(),
            inotify: Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
                .context("creating the inotify instance")?,
            watches: BTreeMap::new(),
            socket_watch: None,
        })
    }

    /// The inotify fd, for the poll set.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }

    /// Loads every saved app rule into the kernel, resolving each path to
    /// the kernel's identity of the file. A path that cannot be resolved
    /// (not installed yet, removed) is kept and reported, not dropped.
    pub fn load(&mut self, core: &mut Core) {
        let apps = core.choice().apps.clone();
        for (path, rule) in &apps {
            match self.install(core, path, rule) {
                Ok(_) => {
                    self.errors.remove(path);
                }
                Err(e) => {
                    log!("app rule for {path} not in force: {e:#}");
                    self.errors.insert(path.clone(), format!("{e:#}"));
                }
            }
        }
    }

    /// Resolves each system program ([`Service`]) to the kernel's identity
    /// of its executable and gives it its role; a program not installed is
    /// logged (its role is simply absent). Called at start and when a
    /// watched directory changes (a package upgrade replaced the file).
    pub fn load_services(&mut self, core: &mut Core) {
        for (svc, paths) in self.services.clone() {
            let found = paths.iter().find_map(|p| std::fs::canonicalize(p).ok());
            let resolved = found.as_ref().map(|real| -> Result<gpu::FileId> {
                self.watch_dir_of(&real.to_string_lossy());
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                    .open(real)
                    .with_context(|| format!("opening {}", real.display()))?;
                core.enforcer.kernel_file_id(&f)
            });
            let old = self.service_ids.get(&svc).map(|(_, id)| *id);
            match (found, resolved) {
                (Some(real), Some(Ok(id))) => {
                    if old == Some(id) {
                        continue;
                    }
                    if let Some(old) = old {
                        let _ = core.enforcer.set_service(old, None);
                    }
                    match core.enforcer.set_service(id, Some(svc)) {
                        Ok(()) => {
                            log!("{} is {}", svc.name(), real.display());
                            self.service_ids.insert(svc, (real, id));
                        }
                        Err(e) => log!("{}: {e:#}", svc.name()),
                    }
                }
                (_, Some(Err(e))) => log!("{}: {e:#}", svc.name()),
                _ => {
                    if let Some(old) = old {
                        let _ = core.enforcer.set_service(old, None);
                        self.service_ids.remove(&svc);
                    }
                    log!(
                        "{} not found (looked at {}); its role is off",
                        svc.name(),
                        paths
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
            }
        }
    }

    /// Installs the rule under the kernel's identity of `path`; returns the
    /// O_PATH handle of exactly the file that was installed (`None`: the
    /// path is out of the daemon's sight and the rule went in under the
    /// identity saved with it).
    fn install(
        &mut self,
        core: &mut Core,
        path: &str,
        rule: &AppRule,
    ) -> Result<Option<(std::fs::File, gpu::FileId)>> {
        self.watch_dir_of(path);
        // O_PATH: never blocks (a FIFO would stall the loop on a plain
        // open) and reads nothing; the kernel still knows the inode.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(path);
        match (opened, rule.id) {
            (Ok(f), _) => self.install_file(core, path, rule, f).map(Some),
            // Made from a passed descriptor: the daemon never saw the
            // path (ProtectHome=, PrivateTmp=), and still does not.
            (Err(e), Some(id))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                let mask = app_mask(core.inventory(), rule);
                core.enforcer.set_app(id, Some((mask, rule.allow)))?;
                self.ids.insert(path.to_string(), id);
                log!(
                    "app rule for {} installed under its saved identity ({}:{}): the daemon \
                     cannot see the path",
                    path,
                    id.dev,
                    id.ino
                );
                Ok(None)
            }
            (Err(e), _) => Err(e).with_context(|| format!("opening {path}")),
        }
    }

    /// Installs the rule under the kernel's identity of `f` (opened by the
    /// daemon, or passed by the client) named `path`.
    fn install_file(
        &mut self,
        core: &mut Core,
        path: &str,
        rule: &AppRule,
        f: std::fs::File,
    ) -> Result<(std::fs::File, gpu::FileId)> {
        let meta = f.metadata().with_context(|| format!("stat {path}"))?;
        if !meta.is_file() {
            anyhow::bail!("{path} is not a regular file (an executable is needed)");
        }
        let id = core.enforcer.kernel_file_id(&f)?;
        let mask = app_mask(core.inventory(), rule);
        core.enforcer.set_app(id, Some((mask, rule.allow)))?;
        self.ids.insert(path.to_string(), id);
        Ok((f, id))
    }

    /// Takes the rule for `path` out of the kernel (if it is in) and
    /// installs `rule` instead, for `passed` (a descriptor the client
    /// sent) or else the file at `path`; returns the file it was installed
    /// for and its kernel identity.
    pub fn replace(
        &mut self,
        core: &mut Core,
        path: &str,
        rule: &AppRule,
        passed: Option<std::fs::File>,
    ) -> Result<(std::fs::File, gpu::FileId)> {
        if let Some(old) = self.ids.remove(path) {
            let _ = core.enforcer.set_app(old, None);
        }
        self.errors.remove(path);
        match passed {
            Some(f) => {
                self.watch_dir_of(path);
                self.install_file(core, path, rule, f)
            }
            None => {
                let no_id = AppRule {
                    id: None,
                    ..rule.clone()
                };
                self.install(core, path, &no_id)?
                    .with_context(|| format!("{path}: not opened"))
            }
        }
    }

    /// The rules in force, by the kernel identity of their executable:
    /// `(allow, gpus)` as the exec hook applies them.
    pub fn in_force(&self, core: &Core) -> BTreeMap<gpu::FileId, (bool, u32)> {
        let choice = core.choice();
        self.ids
            .iter()
            .filter_map(|(path, id)| {
                let rule = choice.apps.get(path)?;
                Some((*id, (rule.allow, app_mask(core.inventory(), rule))))
            })
            .collect()
    }

    /// Takes the rule for `path` out of the kernel and forgets its error.
    pub fn forget(&mut self, enforcer: &Enforcer, path: &str) -> Result<()> {
        if let Some(id) = self.ids.remove(path) {
            enforcer.set_app(id, None)?;
        }
        self.errors.remove(path);
        Ok(())
    }

    /// `app list`: every rule of `choice`, with why it is not in force.
    pub fn list_json(&self, choice: &Choice) -> AppsData {
        let apps: Vec<AppEntry> = choice
            .apps
            .iter()
            .map(|(p, r)| AppEntry {
                path: p.clone(),
                allow: r.allow,
                gpu: r.gpu,
                error: self.errors.get(p).cloned(),
            })
            .collect();
        AppsData { apps }
    }

    /// Watches the directory holding `path` (once per directory).
    fn watch_dir_of(&mut self, path: &str) {
        let Some(dir) = std::path::Path::new(path).parent() else {
            return;
        };
        if self.watches.values().any(|d| d == dir) {
            return;
        }
        let mask = AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            // The socket's directory may be watched too: add, not replace.
            | AddWatchFlags::from_bits_retain(libc::IN_MASK_ADD);
        match self.inotify.add_watch(dir, mask) {
            Ok(wd) => {
                self.watches.insert(wd, dir.to_path_buf());
            }
            Err(e) => log!(
                "cannot watch {} for replaced executables: {e}",
                dir.display()
            ),
        }
    }

    /// Watches the socket's directory, so a deleted socket file is noticed
    /// (and re-created) at once, without polling.
    pub fn watch_socket_dir(&mut self, socket: &Path) {
        let Some(dir) = socket.parent() else {
            return;
        };
        // IN_MASK_ADD: an app rule's directory may be the same one.
        let mask = AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::from_bits_retain(libc::IN_MASK_ADD);
        match self.inotify.add_watch(dir, mask) {
            Ok(wd) => self.socket_watch = Some(wd),
            Err(e) => log!(
                "cannot watch {} (a deleted socket will not be re-created): {e}",
                dir.display()
            ),
        }
    }

    /// Reads what changed in the watched directories: the app rules whose
    /// file was replaced, and whether the socket's file (named `socket`)
    /// was deleted or moved away (the loop re-creates it if it is gone).
    pub fn read_events(&mut self, core: &Core, socket: Option<&OsStr>) -> Inotified {
        let mut news = Inotified::default();
        let Ok(events) = self.inotify.read_events() else {
            return news;
        };
        for ev in events {
            if Some(ev.wd) == self.socket_watch && ev.name.as_deref() == socket {
                news.socket_gone = true;
            }
            let (Some(dir), Some(name)) = (self.watches.get(&ev.wd), ev.name) else {
                continue;
            };
            let full = dir.join(&name);
            if self.service_ids.values().any(|(p, _)| *p == full)
                || self.services.iter().any(|(_, ps)| ps.contains(&full))
            {
                news.services = true;
            }
            let path = full.to_string_lossy().into_owned();
            if core.choice().apps.contains_key(&path) && !news.replaced.contains(&path) {
                news.replaced.push(path);
            }
        }
        news
    }

    /// Re-resolves the app rules whose file was replaced.
    pub fn reresolve(&mut self, core: &mut Core, replaced: Vec<String>) {
        for path in replaced {
            let Some(rule) = core.choice().apps.get(&path).cloned() else {
                continue;
            };
            match self.replace(core, &path, &rule, None) {
                Ok(_) => {
                    self.errors.remove(&path);
                    log!("app rule for {path} re-resolved (the file was replaced)");
                }
                Err(e) => {
                    self.errors.insert(path.clone(), format!("{e:#}"));
                    log!("app rule for {path} not in force: {e:#}");
                }
            }
        }
    }
}

/// What one read of the inotify instance found ([`Apps::read_events`]).
#[derive(Default)]
pub struct Inotified {
    /// An event on the socket's name in its directory.
    pub socket_gone: bool,
    /// App-rule paths whose file changed, each once.
    pub replaced: Vec<String>,
    /// A system program's file changed: re-resolve them ([`Apps::load_services`]).
    pub services: bool,
}

/// The GPUs a rule is about: its GPU, or every offload GPU.
fn app_mask(inv: &Inventory, rule: &AppRule) -> u32 {
    match rule
        .gpu
        .and_then(|pci| inv.gpus.iter().find(|g| g.pci == pci))
    {
        Some(g) => 1 << g.id,
        None => inv
            .gpus
            .iter()
            .filter(|g| g.offload)
            .fold(0, |m, g| m | 1 << g.id),
    }
}

/// `#!` scripts: exec runs the interpreter, so a rule keyed on the script
/// never matches. Say so, with the interpreter. The file read is the one
/// the rule was installed for (re-opened through its O_PATH handle, never
/// by path: a FIFO swapped in at the path meanwhile must not hang the
/// daemon), without blocking, and only if it is a regular file.
pub fn script_note(path: &str, file: &std::fs::File) -> Option<String> {
    use std::os::fd::AsRawFd;
    let mut head = [0u8; 256];
    let fdpath = format!("/proc/self/fd/{}", file.as_raw_fd());
    let mut f = crate::safefile::open_regular(std::path::Path::new(&fdpath), false).ok()?;
    let n = std::io::Read::read(&mut f, &mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
    let interp = String::from_utf8_lossy(&line[..end]).trim().to_string();
    Some(format!(
        "{path} is a #! script: exec runs its interpreter ({interp}), so this rule never \
         matches; allow the program the script launches, or start the script with \
         `gpuctl run`"
    ))
}
