//! Per-application rules (smart mode): `gpuctl app allow|deny|forget|list`.
//!
//! A rule is keyed by the kernel's identity of the executable (superblock
//! `s_dev`, inode), learned from the kernel itself, and persisted with its
//! path. Each rule's directory is watched with inotify, so a file replaced
//! by a package upgrade (a new inode renamed over the path) is re-resolved
//! without polling.

use std::os::unix::fs::OpenOptionsExt;

use crate::proto::data::{AppChanged, AppEntry, AppsData};
use anyhow::{Context, Result};
use nix::sys::inotify::AddWatchFlags;

use super::server::Server;
use super::{state, Daemon};
use crate::policy::AppRule;
use crate::proto::{AppAction, Code, Response};

impl Daemon {
    /// Loads every saved app rule into the kernel, resolving each path to
    /// the kernel's identity of the file. A path that cannot be resolved
    /// (not installed yet, removed) is kept and reported, not dropped.
    pub(super) fn load_apps(&mut self) {
        let apps = self.choice.apps.clone();
        for (path, rule) in &apps {
            match self.install_app(path, rule) {
                Ok(_) => {
                    self.app_errors.remove(path);
                }
                Err(e) => {
                    log!("app rule for {path} not in force: {e:#}");
                    self.app_errors.insert(path.clone(), format!("{e:#}"));
                }
            }
        }
    }

    fn app_mask(&self, rule: &AppRule) -> u32 {
        match rule
            .gpu
            .and_then(|pci| self.inventory.gpus.iter().find(|g| g.pci == pci))
        {
            Some(g) => 1 << g.id,
            None => self
                .inventory
                .gpus
                .iter()
                .filter(|g| g.offload)
                .fold(0, |m, g| m | 1 << g.id),
        }
    }

    /// Installs the rule under the kernel's identity of `path`; returns the
    /// O_PATH handle of exactly the file that was installed.
    fn install_app(&mut self, path: &str, rule: &AppRule) -> Result<std::fs::File> {
        self.watch_dir_of(path);
        // O_PATH: never blocks (a FIFO would stall the loop on a plain
        // open) and reads nothing; the kernel still knows the inode.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(path)
            .with_context(|| format!("opening {path}"))?;
        let meta = f.metadata().with_context(|| format!("stat {path}"))?;
        if !meta.is_file() {
            anyhow::bail!("{path} is not a regular file (an executable is needed)");
        }
        let id = self.enforcer.kernel_file_id(&f)?;
        let mask = self.app_mask(rule);
        self.enforcer.set_app(id, Some((mask, rule.allow)))?;
        self.app_ids.insert(path.to_string(), id);
        Ok(f)
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

    /// Re-resolves the app rules whose file changed in a watched directory;
    /// re-creates the socket if its file was deleted.
    pub(super) fn on_inotify(&mut self, server: &mut Server) {
        let Ok(events) = self.inotify.read_events() else {
            return;
        };
        let mut touched = Vec::new();
        for ev in events {
            if Some(ev.wd) == self.socket_watch
                && ev.name.as_deref() == server.path().file_name()
                && !server.socket_present()
            {
                match server.rebind() {
                    Ok(()) => log!(
                        "the socket {} was removed; listening on a new one",
                        server.path().display()
                    ),
                    Err(e) => log!("re-creating the socket failed: {e:#}"),
                }
            }
            let (Some(dir), Some(name)) = (self.watches.get(&ev.wd), ev.name) else {
                continue;
            };
            let path = dir.join(name).to_string_lossy().into_owned();
            if self.choice.apps.contains_key(&path) && !touched.contains(&path) {
                touched.push(path);
            }
        }
        for path in touched {
            let Some(rule) = self.choice.apps.get(&path).cloned() else {
                continue;
            };
            if let Some(old) = self.app_ids.remove(&path) {
                let _ = self.enforcer.set_app(old, None);
            }
            match self.install_app(&path, &rule) {
                Ok(_) => {
                    self.app_errors.remove(&path);
                    log!("app rule for {path} re-resolved (the file was replaced)");
                }
                Err(e) => {
                    self.app_errors.insert(path.clone(), format!("{e:#}"));
                    log!("app rule for {path} not in force: {e:#}");
                }
            }
        }
    }

    pub(super) fn app(
        &mut self,
        action: AppAction,
        path: Option<&str>,
        gpu: Option<&str>,
    ) -> Response {
        if action == AppAction::List {
            let apps: Vec<AppEntry> = self
                .choice
                .apps
                .iter()
                .map(|(p, r)| AppEntry {
                    path: p.clone(),
                    allow: r.allow,
                    gpu: r.gpu,
                    error: self.app_errors.get(p).cloned(),
                })
                .collect();
            return Response::with(&AppsData { apps });
        }
        let Some(path) = path else {
            return Response::err(Code::BadRequest, "app allow/deny/forget need a PATH");
        };
        let canon = match std::fs::canonicalize(path) {
            Ok(c) => c.to_string_lossy().into_owned(),
            Err(_) if action == AppAction::Forget => path.to_string(),
            Err(e) => return Response::err(Code::BadRequest, format!("{path}: {e}")),
        };
        let mut choice = self.choice.clone();
        let mut note = None;
        match action {
            AppAction::Forget => {
                if choice.apps.remove(&canon).is_none() {
                    return Response::err(Code::BadRequest, format!("no app rule for {canon}"));
                }
                if let Some(id) = self.app_ids.remove(&canon) {
                    if let Err(e) = self.enforcer.set_app(id, None) {
                        return Response::err(Code::Internal, format!("{e:#}"));
                    }
                }
                self.app_errors.remove(&canon);
            }
            AppAction::Allow | AppAction::Deny => {
                let gpu = match gpu.map(|g| self.inventory.find(g)) {
                    Some(Ok(g)) => Some(g.pci),
                    Some(Err(e)) => return Response::err(Code::UnknownGpu, e),
                    None => None,
                };
                let rule = AppRule {
                    allow: action == AppAction::Allow,
                    gpu,
                };
                if let Some(old) = self.app_ids.remove(&canon) {
                    let _ = self.enforcer.set_app(old, None);
                }
                let file = match self.install_app(&canon, &rule) {
                    Ok(f) => f,
                    Err(e) => return Response::err(Code::BadRequest, format!("{e:#}")),
                };
                note = script_note(&canon, &file);
                choice.apps.insert(canon.clone(), rule);
            }
            AppAction::List => {
                return Response::err(Code::Internal, "app list reached the edit path")
            }
        }
        if let Err(e) = state::save(&self.state_path, &choice) {
            return Response::err(Code::Internal, format!("{e:#}"));
        }
        self.choice = choice;
        Response::with(&AppChanged { path: canon, note })
    }
}

/// `#!` scripts: exec runs the interpreter, so a rule keyed on the script
/// never matches. Say so, with the interpreter. The file read is the one
/// the rule was installed for (re-opened through its O_PATH handle, never
/// by path: a FIFO swapped in at the path meanwhile must not hang the
/// daemon), without blocking, and only if it is a regular file.
fn script_note(path: &str, file: &std::fs::File) -> Option<String> {
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
