//! `gpuctl app allow|deny|forget|list` (the rules' kernel side is
//! apps.rs; the rules are part of the choice, saved by the core).

use serde_json::Value;

use super::super::apps::script_note;
use super::super::reject::internal;
use super::super::Daemon;
use super::{data, Rejection};
use crate::policy::AppRule;
use crate::proto::data::AppChanged;
use crate::proto::AppAction;

pub(super) fn app(
    d: &mut Daemon,
    action: AppAction,
    path: Option<&str>,
    gpu: Option<&str>,
) -> Result<Value, Rejection> {
    if action == AppAction::List {
        return data(d.apps.list_json(d.core.choice()));
    }
    let Some(path) = path else {
        return Err(Rejection::BadRequest(
            "app allow/deny/forget need a PATH".into(),
        ));
    };
    let canon = match std::fs::canonicalize(path) {
        Ok(c) => c.to_string_lossy().into_owned(),
        Err(_) if action == AppAction::Forget => path.to_string(),
        Err(e) => return Err(Rejection::BadRequest(format!("{path}: {e}"))),
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
            let rule = AppRule {
                allow: action == AppAction::Allow,
                gpu,
            };
            let file = d
                .apps
                .replace(&mut d.core, &canon, &rule)
                .map_err(|e| Rejection::BadRequest(format!("{e:#}")))?;
            note = script_note(&canon, &file);
            apps.insert(canon.clone(), rule);
        }
        AppAction::List => return Err(internal("app list reached the edit path")),
    }
    d.core.set_apps(apps)?;
    data(AppChanged { path: canon, note })
}
