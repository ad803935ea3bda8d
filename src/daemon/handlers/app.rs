//! `gpuctl app allow|deny|forget|list` (the rules' kernel side is
//! apps.rs; the rules are part of the choice, saved by the core).

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;

use serde_json::Value;

use super::super::apps::script_note;
use super::super::reject::internal;
use super::super::Daemon;
use super::{data, Rejection};
use crate::policy::AppRule;
use crate::proto::data::AppChanged;
use crate::proto::AppAction;

/// `passed`: the program itself, as the descriptor the client sent with
/// the request (`allow`/`deny` with `"fd": true`); closed when this returns.
pub(super) fn app(
    d: &mut Daemon,
    action: AppAction,
    path: Option<&str>,
    gpu: Option<&str>,
    passed: Option<OwnedFd>,
) -> Result<Value, Rejection> {
    if action == AppAction::List {
        return data(d.apps.list_json(d.core.choice()));
    }
    let Some(path) = path else {
        return Err(Rejection::BadRequest(
            "app allow/deny/forget need a PATH".into(),
        ));
    };
    let passed = passed.map(std::fs::File::from);
    let (canon, unseen) = match &passed {
        Some(f) => passed_name(path, f)?,
        None => match std::fs::canonicalize(path) {
            Ok(c) => (c.to_string_lossy().into_owned(), false),
            Err(_) if action == AppAction::Forget => (path.to_string(), false),
            Err(e) => return Err(Rejection::BadRequest(format!("{path}: {e}"))),
        },
    };
    let mut apps = d.core.choice().apps.clone();
    let mut note = None;
    match action {
        AppAction::Forget => {
            if apps.remove(&canon).is_none() {
                return Err(Rejection::BadRequest(format!("no app rule for {canon}")));
            }
            d.apps.forget(&d.core.enforcer, &canon)?;
        }
        AppAction::Allow | AppAction::Deny => {
            let gpu = match gpu.map(|g| d.core.inventory().find(g)) {
                Some(Ok(g)) => Some(g.pci),
                Some(Err(e)) => return Err(Rejection::UnknownGpu(e)),
                None => None,
            };
            let mut rule = AppRule {
                allow: action == AppAction::Allow,
                gpu,
                id: None,
            };
            let (file, id) = d
                .apps
                .replace(&mut d.core, &canon, &rule, passed)
                .map_err(|e| Rejection::BadRequest(format!("{e:#}")))?;
            note = script_note(&canon, &file);
            if unseen {
                // The daemon cannot open the path at its next start either.
                rule.id = Some(id);
            }
            apps.insert(canon.clone(), rule);
        }
        AppAction::List => return Err(internal("app list reached the edit path")),
    }
    d.core.set_apps(apps)?;
    data(AppChanged { path: canon, note })
}

/// The name a rule made from a passed program goes by: `path` as the
/// client resolved it, which must be absolute and, where the daemon can see
/// it, name that very file. The second value says the daemon cannot see it
/// (then the kernel identity is saved with the rule).
fn passed_name(path: &str, f: &std::fs::File) -> Result<(String, bool), Rejection> {
    let meta = f
        .metadata()
        .map_err(|e| Rejection::BadRequest(format!("{path}: the passed descriptor: {e}")))?;
    if !meta.is_file() {
        return Err(Rejection::BadRequest(format!(
            "{path} is not a regular file (an executable is needed)"
        )));
    }
    if !path.starts_with('/') {
        return Err(Rejection::BadRequest(format!(
            "{path}: a passed program needs its absolute path"
        )));
    }
    match std::fs::canonicalize(path) {
        Ok(c) => match std::fs::metadata(&c) {
            Ok(m) if (m.dev(), m.ino()) == (meta.dev(), meta.ino()) => {
                Ok((c.to_string_lossy().into_owned(), false))
            }
            _ => Err(Rejection::BadRequest(format!(
                "{path} names another file than the program passed with the request"
            ))),
        },
        Err(_) => Ok((path.to_string(), true)),
    }
}
