//! Files the daemon reads and writes, opened so that no file can stall or
//! bloat it: never blocking (`O_NONBLOCK`: a FIFO planted in place of a file
//! does not hang the loop in `open`), checked to be a regular file through
//! the fd (not a FIFO, a device, `/dev/zero`), read with a size cap, never
//! following a symlink where the file is the daemon's own, and written
//! through temp files created with `O_EXCL`.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The daemon's own files (state, config) are at most this big.
pub const MAX_FILE: u64 = 1 << 20;

/// Why a file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The file does not exist.
    Missing,
    /// It exists but is not a regular file (FIFO, device, directory,
    /// socket) or, with `nofollow`, is a symlink.
    NotRegular(&'static str),
    /// Larger than the cap.
    TooLarge(u64),
    /// Any other error of open or read.
    Io(std::io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Missing => f.write_str("no such file"),
            ReadError::NotRegular(what) => write!(f, "not a regular file ({what})"),
            ReadError::TooLarge(cap) => write!(f, "larger than {cap} bytes"),
            ReadError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReadError {}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_symlink() {
        "a symlink"
    } else {
        "not a file"
    }
}

/// Opens `path` for reading without blocking and checks, through the fd,
/// that it is a regular file. With `nofollow`, a symlink is refused too.
pub fn open_regular(path: &Path, nofollow: bool) -> Result<File, ReadError> {
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    let f = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadError::Missing),
        // O_NOFOLLOW on a symlink fails with ELOOP.
        Err(e) if nofollow && e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ReadError::NotRegular("a symlink"))
        }
        Err(e) => return Err(ReadError::Io(e)),
    };
    let meta = f.metadata().map_err(ReadError::Io)?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular(kind_of(meta.file_type())));
    }
    Ok(f)
}

/// Reads at most `cap` bytes of a regular file; a longer one is an error.
pub fn read_from(mut f: File, cap: u64) -> Result<Vec<u8>, ReadError> {
    let mut buf = Vec::new();
    (&mut f)
        .take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(ReadError::Io)?;
    if buf.len() as u64 > cap {
        return Err(ReadError::TooLarge(cap));
    }
    Ok(buf)
}

/// The largest attribute [`read_attr`] reads: a sysfs `show` fills one page.
pub const ATTR_MAX: u64 = 4096;

/// Reads a small sysfs or procfs attribute, trimmed: a regular file, opened
/// without blocking (and, with `nofollow`, without following a final
/// symlink), at most [`ATTR_MAX`] bytes. `None` when it is absent,
/// unreadable, not a regular file or longer: every caller treats an
/// attribute it cannot read as not there. The one reader of attributes
/// (discovery, runtime PM, the power source, the power-off).
pub fn read_attr(path: &Path, nofollow: bool) -> Option<String> {
    let b = read_from(open_regular(path, nofollow).ok()?, ATTR_MAX).ok()?;
    Some(String::from_utf8_lossy(&b).trim().to_string())
}

/// Reads a regular file (following symlinks) of at most `cap` bytes.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, ReadError> {
    read_from(open_regular(path, false)?, cap)
}

/// Reads one of the daemon's own files: not a symlink, regular, ≤ 1 MiB.
pub fn read_own(path: &Path) -> Result<Vec<u8>, ReadError> {
    read_from(open_regular(path, true)?, MAX_FILE)
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(suffix);
    PathBuf::from(s)
}

/// Creates `path` exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW`): whatever was
/// there before (a stale temp file, or a symlink planted to redirect the
/// write) is unlinked first, never written through.
fn create_exclusive(path: &Path, mode: u32) -> std::io::Result<File> {
    let open = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    };
    match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(path)?;
            open()
        }
        other => other,
    }
}

/// Replaces `path` with `body` so that a crash at any moment leaves the old
/// file or the new one: exclusive temp file, fsync, rename, fsync of the
/// directory.
pub fn write_atomic(path: &Path, body: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = with_suffix(path, ".tmp");
    let mut f = create_exclusive(&tmp, mode)?;
    let written = f.write_all(body).and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)?;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?
        .sync_all()
}

/// Writes `body` to a new file at `path` (replacing whatever is there,
/// never writing through a symlink).
pub fn write_new(path: &Path, body: &[u8], mode: u32) -> std::io::Result<()> {
    create_exclusive(path, mode)?.write_all(body)
}

/// `x.json` → `x.json.bad`.
pub fn bad_path(path: &Path) -> PathBuf {
    with_suffix(path, ".bad")
}

/// Moves a corrupt daemon-written file aside as `*.bad` (the daemon then
/// starts from defaults, and the next save writes a fresh file) and says
/// what happened, for the warning that reports the corruption.
pub fn keep_aside(path: &Path) -> String {
    let bad = bad_path(path);
    match std::fs::rename(path, &bad) {
        Ok(()) => format!("kept as {}", bad.display()),
        Err(e) => format!("could not move it to {}: {e}", bad.display()),
    }
}

/// Copies an invalid admin-edited file to `*.bad` (the original stays
/// where the admin keeps it) and says what happened.
pub fn copy_aside(path: &Path, text: &[u8]) -> String {
    let bad = bad_path(path);
    match write_new(&bad, text, 0o600) {
        Ok(()) => format!("a copy is at {}", bad.display()),
        Err(e) => format!("could not copy it to {}: {e}", bad.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpuctl-safefile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn refuses_fifo_symlink_device_and_oversize_without_blocking() {
        let d = tmpdir("refuse");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A plain open(2) of a FIFO with no writer would block forever.
        assert!(matches!(
            read_own(&fifo),
            Err(ReadError::NotRegular("a FIFO"))
        ));
        let link = d.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(matches!(
            read_own(&link),
            Err(ReadError::NotRegular("a symlink"))
        ));
        assert!(matches!(
            read_capped(&link, 10),
            Err(ReadError::NotRegular("a character device"))
        ));
        let big = d.join("big");
        std::fs::write(&big, vec![b'x'; 11]).unwrap();
        assert!(matches!(
            read_capped(&big, 10),
            Err(ReadError::TooLarge(10))
        ));
        assert_eq!(read_capped(&big, 11).unwrap().len(), 11);
        assert!(matches!(read_own(&d.join("none")), Err(ReadError::Missing)));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn attributes_are_trimmed_small_regular_files() {
        let d = tmpdir("attr");
        let a = d.join("power_state");
        std::fs::write(&a, "D3cold\n").unwrap();
        assert_eq!(read_attr(&a, true).as_deref(), Some("D3cold"));
        let link = d.join("link");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert_eq!(read_attr(&link, false).as_deref(), Some("D3cold"));
        assert_eq!(read_attr(&link, true), None, "nofollow");
        let page = d.join("page");
        std::fs::write(&page, vec![b'1'; ATTR_MAX as usize]).unwrap();
        assert_eq!(read_attr(&page, false).map(|s| s.len()), Some(4096));
        std::fs::write(&page, vec![b'1'; ATTR_MAX as usize + 1]).unwrap();
        assert_eq!(read_attr(&page, false), None, "longer than a page");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // A FIFO planted as an attribute (no writer): answered at once.
        let (tx, rx) = std::sync::mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || tx.send(read_attr(&f, false)).unwrap());
        let got = rx.recv_timeout(std::time::Duration::from_secs(5));
        // Unblock a reader stuck in open(2) (before: read_to_string), so the test ends.
        if got.is_err() {
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        assert_eq!(got, Ok(None), "a FIFO is no attribute, and must not hang");
        assert_eq!(read_attr(&d.join("none"), false), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn writes_never_follow_a_planted_symlink() {
        let d = tmpdir("write");
        let target = d.join("victim");
        std::fs::write(&target, b"keep").unwrap();
        let p = d.join("state.json");
        // A symlink planted at the temp path and at the .bad path.
        std::os::unix::fs::symlink(&target, d.join("state.json.tmp")).unwrap();
        std::os::unix::fs::symlink(&target, bad_path(&p)).unwrap();
        write_atomic(&p, b"new", 0o644).unwrap();
        write_new(&bad_path(&p), b"bad", 0o600).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(std::fs::read(bad_path(&p)).unwrap(), b"bad");
        assert!(!d.join("state.json.tmp").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
