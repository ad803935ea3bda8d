//! `/etc/gpuctl/gpuctl.toml`: admin-edited settings. A missing file means
//! defaults; a corrupt one is reported, copied aside as `*.bad` (the admin's
//! file itself is left for them to fix) and replaced by defaults.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::automation::Rules;
use crate::bpf::LogLevel;
use crate::safefile::{self, ReadError};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Members of this group may change the mode (root always may).
    pub group: String,
    /// What the BPF programs log (`off`, `deny`, `debug`); fixed at load.
    pub bpf_log: LogLevel,
    /// Smart mode: grant processes exec'd with a non-empty `DRI_PRIME`
    /// other than `0`, or with `__NV_PRIME_RENDER_OFFLOAD=1`.
    pub env_grants: bool,
    /// Processes that can hold a grant at once (the kernel map's size,
    /// fixed at load). Past it a new grant is refused: the process is
    /// denied, never crashed, and `status` counts it.
    pub max_grants: u32,
    /// The user of the active, local session on seat0 (logind) may change
    /// the mode too, besides root and the group.
    pub seat_may_change: bool,
    /// `[auto]`: automatic modes (battery/AC, external displays).
    pub auto: Rules,
    /// A blocked GPU that cannot sleep by itself: `auto` unbinds its
    /// slot's drivers so the kernel can cut its power (issue 19); `never`
    /// only blocks it.
    pub power_off: PowerOff,
}

/// The `power_off` key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PowerOff {
    #[default]
    Auto,
    Never,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            group: "gpuctl".to_string(),
            bpf_log: LogLevel::Off,
            env_grants: true,
            max_grants: 8192,
            seat_may_change: true,
            auto: Rules::default(),
            power_off: PowerOff::Auto,
        }
    }
}

/// Reads the config; returns it and, when the file was unusable, the log
/// line that says so. The file is opened without blocking (a FIFO does not
/// hang the daemon), must be a regular file (a symlink to one is fine: the
/// admin's /etc may be managed that way) of at most 1 MiB. Out-of-range
/// values are reported and replaced by their defaults, key by key.
pub fn load(path: &Path) -> (Config, Option<String>) {
    let text = match safefile::read_capped(path, safefile::MAX_FILE) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(ReadError::Missing) => return (Config::default(), None),
        Err(e) => {
            return (
                Config::default(),
                Some(format!(
                    "cannot use config {}: {e}; using defaults",
                    path.display()
                )),
            )
        }
    };
    match toml::from_str::<Config>(&text) {
        Ok(mut c) => {
            let warn = c
                .sanitize()
                .map(|w| format!("config {}: {w}", path.display()));
            (c, warn)
        }
        Err(e) => {
            let kept = safefile::copy_aside(path, text.as_bytes());
            let msg = format!(
                "config {} is invalid ({}); using defaults; {kept}",
                path.display(),
                e.message().trim()
            );
            (Config::default(), Some(msg))
        }
    }
}

/// The range `max_grants` may take (the kernel map is allocated at load).
pub const MAX_GRANTS_RANGE: std::ops::RangeInclusive<u32> = 1..=1_000_000;

/// Every key, for listings and errors (`[auto]` keys as `auto.KEY`).
pub const KEYS: [&str; 9] = [
    "group",
    "bpf_log",
    "env_grants",
    "max_grants",
    "seat_may_change",
    "auto.on_battery",
    "auto.on_ac",
    "auto.external_display",
    "power_off",
];

impl Config {
    /// Replaces out-of-range values by their defaults; says what it did.
    pub fn sanitize(&mut self) -> Option<String> {
        if !MAX_GRANTS_RANGE.contains(&self.max_grants) {
            let was = self.max_grants;
            self.max_grants = Config::default().max_grants;
            return Some(format!(
                "max_grants = {was} is out of range ({}..={}); using {}",
                MAX_GRANTS_RANGE.start(),
                MAX_GRANTS_RANGE.end(),
                self.max_grants
            ));
        }
        None
    }

    /// The config as `key → value` JSON, tables flattened to `table.key`
    /// (`proto::data::ConfigData`).
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        if let Ok(serde_json::Value::Object(top)) = serde_json::to_value(self) {
            for (k, v) in top {
                match v {
                    serde_json::Value::Object(t) => {
                        for (k2, v2) in t {
                            out.insert(format!("{k}.{k2}"), v2);
                        }
                    }
                    v => {
                        out.insert(k, v);
                    }
                }
            }
        }
        out
    }
}

/// Sets `key = value` in the config file's text, keeping the admin's
/// comments and layout; returns the new text and the config it means.
pub fn edit(text: &str, key: &str, value: &str) -> Result<(String, Config), String> {
    if !KEYS.contains(&key) {
        return Err(format!("unknown key {key:?} (keys: {})", KEYS.join(", ")));
    }
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| format!("the config file is not valid TOML ({e}); fix it by hand first"))?;
    let item = match key {
        "env_grants" | "seat_may_change" => match value {
            "true" | "on" | "yes" => toml_edit::value(true),
            "false" | "off" | "no" => toml_edit::value(false),
            _ => return Err(format!("{key} is true or false, not {value:?}")),
        },
        "max_grants" => match value.parse::<u32>() {
            Ok(n) if MAX_GRANTS_RANGE.contains(&n) => toml_edit::value(i64::from(n)),
            _ => {
                return Err(format!(
                    "{key} is a number from 1 to 1000000, not {value:?}"
                ))
            }
        },
        _ => toml_edit::value(value),
    };
    match key.split_once('.') {
        Some((table, k)) => {
            if !doc.contains_key(table) {
                doc[table] = toml_edit::table();
            }
            doc[table][k] = item;
        }
        None => doc[key] = item,
    }
    let out = doc.to_string();
    let cfg = toml::from_str::<Config>(&out)
        .map_err(|e| format!("{key} = {value:?} is not valid: {}", e.message().trim()))?;
    Ok((out, cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_keeps_comments_and_validates() {
        let text = "# who may switch\ngroup = \"gpuctl\"\n";
        let (out, c) = edit(text, "env_grants", "false").unwrap();
        assert!(out.starts_with("# who may switch\n"), "{out}");
        assert!(!c.env_grants);
        let (_, c) = edit(&out, "group", "video").unwrap();
        assert_eq!(c.group, "video");
        assert!(edit(text, "bpf_log", "loud").is_err());
        assert!(edit(text, "colour", "red")
            .unwrap_err()
            .contains("keys: group"));
        assert!(edit("group = [", "group", "x").is_err());
    }

    #[test]
    fn auto_keys_edit_the_auto_table() {
        use crate::automation::{DisplayRule, Target};
        let text = "group = \"gpuctl\"\n";
        let (out, c) = edit(text, "auto.on_battery", "integrated").unwrap();
        assert!(out.contains("[auto]\non_battery = \"integrated\""), "{out}");
        assert_eq!(c.auto.on_battery, Target::Integrated);
        let (out, c) = edit(&out, "auto.external_display", "none").unwrap();
        assert_eq!(c.auto.external_display, DisplayRule::None);
        assert_eq!(c.auto.on_battery, Target::Integrated, "{out}");
        let (o2, c2) = edit(&out, "power_off", "never").unwrap();
        assert_eq!(c2.power_off, PowerOff::Never, "{o2}");
        assert!(edit(&out, "power_off", "sometimes").is_err());
        let err = edit(&out, "auto.on_ac", "manual").unwrap_err();
        assert!(err.contains("auto.on_ac"), "{err}");
        assert!(edit(&out, "auto.colour", "x").is_err());
        let j = c.to_json();
        assert_eq!(j["auto.on_battery"], "integrated");
        assert_eq!(j["auto.on_ac"], "none");
        assert_eq!(j["group"], "gpuctl");
    }

    #[test]
    fn parses_and_rejects() {
        let c: Config = toml::from_str("group = \"video\"\nbpf_log = \"debug\"\n").unwrap();
        assert_eq!(c.group, "video");
        assert_eq!(c.bpf_log, LogLevel::Debug);
        assert_eq!(toml::from_str::<Config>("").unwrap(), Config::default());
        assert!(toml::from_str::<Config>("grop = \"x\"").is_err());
        assert!(toml::from_str::<Config>("bpf_log = \"loud\"").is_err());
    }

    #[test]
    fn corrupt_file_falls_back_and_is_copied() {
        let dir = std::env::temp_dir().join(format!("gpuctl-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("gpuctl.toml");
        std::fs::write(&p, "group = [").unwrap();
        let (c, warn) = load(&p);
        assert_eq!(c, Config::default());
        assert!(warn.unwrap().contains("invalid"));
        assert!(dir.join("gpuctl.toml.bad").exists());
        assert!(p.exists(), "the admin's file is left in place");
        let (_, warn) = load(&dir.join("missing.toml"));
        assert!(warn.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn out_of_range_max_grants_is_replaced_not_fatal() {
        let dir = std::env::temp_dir().join(format!("gpuctl-cfg-mg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("gpuctl.toml");
        for bad in ["0", "4000000000"] {
            std::fs::write(&p, format!("group = \"video\"\nmax_grants = {bad}\n")).unwrap();
            let (c, warn) = load(&p);
            assert_eq!(c.group, "video", "the rest of the file still applies");
            assert_eq!(c.max_grants, Config::default().max_grants);
            assert!(warn.unwrap().contains("out of range"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
