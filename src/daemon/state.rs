//! `state.json`: what the user chose (mode, manual blocks), written by the
//! daemon atomically (temp file, fsync, rename, fsync of the directory), so a
//! daemon killed mid-write leaves the old file or the new one, never half.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::policy::Choice;

const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    #[serde(flatten)]
    choice: Choice,
}

/// `x.json` → `x.json.bad`.
pub fn bad_path(path: &Path) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(".bad");
    PathBuf::from(s)
}

/// Reads the saved choice. A missing file is the default (hybrid); an
/// unreadable or corrupt one is moved aside as `state.json.bad`, reported in
/// the returned message, and replaced by the default.
pub fn load(path: &Path) -> (Choice, Option<String>) {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Choice::default(), None),
        Err(e) => {
            return (
                Choice::default(),
                Some(format!(
                    "cannot read state {}: {e}; starting in hybrid",
                    path.display()
                )),
            )
        }
    };
    let err = match serde_json::from_slice::<StateFile>(&bytes) {
        Ok(f) if f.version == VERSION => return (f.choice, None),
        Ok(f) => format!("unknown state version {}", f.version),
        Err(e) => e.to_string(),
    };
    let bad = bad_path(path);
    let kept = match std::fs::rename(path, &bad) {
        Ok(()) => format!("kept as {}", bad.display()),
        Err(e) => format!("could not move it to {}: {e}", bad.display()),
    };
    (
        Choice::default(),
        Some(format!(
            "state {} is corrupt ({err}); starting in hybrid; {kept}",
            path.display()
        )),
    )
}

/// Writes the choice atomically.
pub fn save(path: &Path, choice: &Choice) -> Result<()> {
    let mut body = serde_json::to_vec_pretty(&StateFile {
        version: VERSION,
        choice: choice.clone(),
    })
    .context("encoding state")?;
    body.push(b'\n');
    write_atomic(path, &body).with_context(|| format!("writing state {}", path.display()))
}

/// Replaces `path` with `body` so that a crash at any moment leaves the old
/// file or the new one: temp file, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, body: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = OsString::from(path.as_os_str());
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    };
    Ok(write()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{ManualBlock, Mode};

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpuctl-state-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn round_trip() {
        let d = tmpdir("rt");
        let p = d.join("state.json");
        let mut c = Choice {
            mode: Mode::Manual,
            force: false,
            ..Choice::default()
        };
        c.manual.insert(ManualBlock {
            pci: "0000:01:00.0".parse().unwrap(),
            force: true,
        });
        save(&p, &c).unwrap();
        assert_eq!(load(&p), (c, None));
        assert!(!d.join("state.json.tmp").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn corrupt_state_is_kept_aside() {
        let d = tmpdir("bad");
        let p = d.join("state.json");
        for junk in [
            &b"{\"version\":1,\"mode\":\"integ"[..],
            b"\x00\xff",
            b"{\"version\":9}",
        ] {
            std::fs::write(&p, junk).unwrap();
            let (c, warn) = load(&p);
            assert_eq!(c, Choice::default());
            assert!(warn.unwrap().contains("corrupt"));
            assert_eq!(std::fs::read(d.join("state.json.bad")).unwrap(), junk);
            assert!(!p.exists());
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
