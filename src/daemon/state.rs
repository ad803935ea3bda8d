//! `state.json`: what the user chose (mode, manual blocks), written by the
//! daemon atomically (temp file, fsync, rename, fsync of the directory), so a
//! daemon killed mid-write leaves the old file or the new one, never half.

use std::path::Path;

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

use crate::safefile::{self, ReadError};

/// Reads the saved choice. A missing file is the default (hybrid); an
/// unreadable, oversized, non-regular (a FIFO, a symlink) or corrupt one is
/// moved aside as `state.json.bad`, reported in the returned message, and
/// replaced by the default. Never blocks: the file is opened with
/// `O_NONBLOCK|O_NOFOLLOW` and read with a 1 MiB cap.
pub fn load(path: &Path) -> (Choice, Option<String>) {
    let err = match safefile::read_own(path) {
        Err(ReadError::Missing) => return (Choice::default(), None),
        Ok(bytes) => match serde_json::from_slice::<StateFile>(&bytes) {
            Ok(f) if f.version == VERSION => return (f.choice, None),
            Ok(f) => format!("is corrupt (unknown state version {})", f.version),
            Err(e) => format!("is corrupt ({e})"),
        },
        Err(e) => format!("is unusable ({e})"),
    };
    let kept = safefile::keep_aside(path);
    (
        Choice::default(),
        Some(format!(
            "state {} {err}; starting in hybrid; {kept}",
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
/// file or the new one (see [`safefile::write_atomic`]).
pub fn write_atomic(path: &Path, body: &[u8]) -> Result<()> {
    Ok(safefile::write_atomic(path, body, 0o644)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{ManualBlock, Mode};

    use std::path::PathBuf;

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

    #[test]
    fn fifo_and_symlink_to_dev_zero_are_moved_aside_without_blocking() {
        let d = tmpdir("odd");
        let p = d.join("state.json");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (choice, warn) = load(&p);
        assert_eq!(choice, Choice::default());
        assert!(warn.unwrap().contains("FIFO"));
        assert!(!p.exists() && d.join("state.json.bad").exists());
        std::fs::remove_file(d.join("state.json.bad")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        let (choice, warn) = load(&p);
        assert_eq!(choice, Choice::default());
        assert!(warn.unwrap().contains("symlink"));
        assert!(std::fs::symlink_metadata(&p).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
