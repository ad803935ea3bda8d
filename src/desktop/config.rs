//! The desktop side's own settings, per user: `$XDG_CONFIG_HOME/gpuctl/desktop.toml`
//! (`~/.config/gpuctl/desktop.toml`; `GPUCTL_DESKTOP_CONFIG` overrides the
//! path). The daemon's config is the admin's; which pop-ups a user sees is
//! theirs. A missing file means the defaults; a bad one is reported and the
//! defaults are used, so the tray always starts.
//!
//! ```toml
//! [notify]
//! mode = true          # mode changes, manual and automatic; a GPU left awake for a display server
//! wake = true          # "the dGPU was woken by X"
//! display = true       # "a monitor on a dGPU port: GPU unblocked"
//! denied = false       # each program kept off the dGPU
//! actions = true       # a menu action the daemon refused
//! min_interval_s = 10  # per kind: at most one notification per interval
//! ```

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Notify {
    pub mode: bool,
    pub wake: bool,
    pub display: bool,
    pub denied: bool,
    pub actions: bool,
    pub min_interval_s: f64,
}

impl Default for Notify {
    fn default() -> Self {
        Notify {
            mode: true,
            wake: true,
            display: true,
            denied: false,
            actions: true,
            min_interval_s: 10.0,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Desktop {
    pub notify: Notify,
}

pub fn path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUCTL_DESKTOP_CONFIG") {
        return Some(p.into());
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("gpuctl/desktop.toml"))
}

/// The settings, and a warning to print if the file could not be used.
pub fn load() -> (Desktop, Option<String>) {
    let Some(p) = path() else {
        return (Desktop::default(), None);
    };
    let text = match crate::safefile::read_capped(&p, 64 * 1024) {
        Ok(b) => b,
        Err(crate::safefile::ReadError::Missing) => return (Desktop::default(), None),
        Err(e) => {
            return (
                Desktop::default(),
                Some(format!("{}: {e}; using the defaults", p.display())),
            )
        }
    };
    match parse(&String::from_utf8_lossy(&text)) {
        Ok(c) => (c, None),
        Err(e) => (
            Desktop::default(),
            Some(format!("{}: {e}; using the defaults", p.display())),
        ),
    }
}

pub fn parse(text: &str) -> Result<Desktop, String> {
    let c: Desktop = toml::from_str(text).map_err(|e| e.message().to_string())?;
    if !(0.0..=86_400.0).contains(&c.notify.min_interval_s) {
        return Err("notify.min_interval_s must be between 0 and 86400".into());
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_switches() {
        assert_eq!(parse("").unwrap(), Desktop::default());
        let c = parse("[notify]\nwake = false\nmin_interval_s = 0.5\n").unwrap();
        assert!(!c.notify.wake && c.notify.mode);
        assert_eq!(c.notify.min_interval_s, 0.5);
        assert!(parse("[notify]\nwak = false\n")
            .unwrap_err()
            .contains("wak"));
        assert!(parse("[notify]\nmin_interval_s = -1\n").is_err());
    }
}
