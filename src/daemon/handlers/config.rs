//! `gpuctl config [KEY [VALUE]]`. Setting edits the file (comments kept),
//! writes it atomically, and applies what can change live (the core's
//! `apply_config`, the one place a config takes effect).

use serde_json::Value;

use super::super::reject::internal;
use super::super::{config, state, Daemon};
use super::Rejection;
use crate::proto::data::{ConfigData, ConfigOne};
use crate::safefile;

pub(super) fn config(
    d: &mut Daemon,
    key: Option<&str>,
    value: Option<&str>,
) -> Result<ConfigData, Rejection> {
    let all = d.core.config().to_json();
    let Some(key) = key else {
        return Ok(ConfigData::All {
            path: d.config_path.clone(),
            config: all,
        });
    };
    let Some(value) = value else {
        return match all.get(key) {
            Some(v) => Ok(ConfigData::One(ConfigOne {
                key: key.to_string(),
                value: v.clone(),
            })),
            None => Err(Rejection::BadRequest(format!(
                "unknown key {key:?} (keys: {})",
                config::KEYS.join(", ")
            ))),
        };
    };
    let text = match safefile::read_capped(&d.config_path, safefile::MAX_FILE) {
        Ok(b) => String::from_utf8(b).map_err(|_| internal("the config file is not UTF-8 text"))?,
        Err(safefile::ReadError::Missing) => String::new(),
        Err(e) => {
            return Err(internal(format!(
                "reading the config {}: {e}",
                d.config_path.display()
            )))
        }
    };
    let (text, new) = config::edit(&text, key, value).map_err(Rejection::BadRequest)?;
    state::write_atomic(&d.config_path, text.as_bytes())?;
    let applied = d.core.apply_config(new)?;
    d.config_applied(&applied);
    let note = applied.needs_restart.then_some(
        "bpf_log and max_grants are fixed when the BPF programs load: restart the daemon",
    );
    Ok(ConfigData::Set {
        key: key.to_string(),
        value: d
            .core
            .config()
            .to_json()
            .get(key)
            .cloned()
            .unwrap_or(Value::Null),
        note: note.map(str::to_string),
    })
}
