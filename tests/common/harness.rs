//! Root test harness: a daemon run against a fixture machine, its own
//! socket/state directory, `mknod`'d device nodes, and a test-owned child
//! cgroup whose processes the daemon's program governs. Nothing here touches
//! the rest of the machine, so tests run in parallel.

use std::ffi::CString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::fixture::Machine;

pub const BIN: &str = env!("CARGO_BIN_EXE_gpuctl");

pub const ENXIO: i32 = 6;
pub const EPERM: i32 = 1;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Held by the tests that send machine-wide uevents (every running test
/// daemon reads them: a PCI uevent costs each one a discovery) and by the
/// tests that count a daemon's CPU or wake-ups, so that one test's uevent
/// is never counted as another's daemon doing work per launch. All the
/// integration tests share one process (tests/it), so a static lock works.
static MACHINE_EVENTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes [`MACHINE_EVENTS`] for the rest of the calling test (a test that
/// panicked while holding it leaves nothing to repair, so poison is ignored).
pub fn machine_events() -> std::sync::MutexGuard<'static, ()> {
    MACHINE_EVENTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Fails the calling test unless it runs as root. Root tests carry
/// `#[ignore = "root"]`, so an unprivileged `cargo test` reports them as
/// ignored; one run anyway (`-- --ignored`) without root fails here, loudly,
/// instead of passing without having tested anything.
pub fn require_root(test: &str) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let name = std::thread::current().name().map(str::to_string);
    let name = name.unwrap_or_else(|| test.to_string());
    assert!(
        root,
        "{name} needs root (BPF programs, mknod, cgroups): run the root tests as root \
         (`sudo make test-root`); an unprivileged `cargo test` reports them as ignored"
    );
}

/// The cgroup-v2 mount point, from /proc/self/mountinfo.
pub fn cgroup2_root() -> PathBuf {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mi.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            pre.split_whitespace().nth(4).map(PathBuf::from)
        })
        .expect("no cgroup2 mount")
}

pub struct Env {
    pub machine: Machine,
    pub dir: PathBuf,
    pub cgroup: PathBuf,
    pub daemon: Option<Child>,
    pub extra_daemon_args: Vec<String>,
    /// Extra environment for the daemon.
    pub extra_env: Vec<(String, String)>,
    /// Directories the daemon cannot see: it runs in its own mount
    /// namespace with an empty read-only tmpfs over each, the way the
    /// packaged unit's `ProtectHome=`/`PrivateTmp=` hide `/home` and `/tmp`.
    pub hidden: Vec<PathBuf>,
    /// The sd_notify socket after READY=1 (later messages: WATCHDOG=1).
    pub notify_rx: Option<UnixDatagram>,
    /// The daemon's log, read as it is written (a full pipe would block a
    /// daemon that logs a lot before the test stops it).
    log: Option<std::thread::JoinHandle<String>>,
}

impl Env {
    pub fn new(machine: Machine) -> Env {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let tag = format!("gpuctl-test-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(&tag);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("dev")).unwrap();
        // Non-root clients must reach the socket.
        set_mode(&dir, 0o755);
        let cgroup = cgroup2_root().join(&tag);
        std::fs::create_dir_all(&cgroup).unwrap();
        Env {
            machine,
            dir,
            cgroup,
            daemon: None,
            extra_daemon_args: Vec::new(),
            extra_env: Vec::new(),
            hidden: Vec::new(),
            notify_rx: None,
            log: None,
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("gpuctl.sock")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn state_file(&self) -> PathBuf {
        self.state_dir().join("state.json")
    }

    fn env_cmd(&self, cmd: &mut Command) {
        cmd.env("GPUCTL_SOCKET", self.socket())
            .env("GPUCTL_SYSFS_ROOT", self.machine.sysfs())
            .env("GPUCTL_PROCFS_ROOT", self.machine.procfs())
            .env("GPUCTL_STATE_DIR", self.state_dir())
            .env("GPUCTL_CONFIG", self.dir.join("gpuctl.toml"));
    }

    /// Starts the daemon and waits for its `READY=1` (sd_notify).
    pub fn start(&mut self) {
        assert!(self.daemon.is_none(), "daemon already running");
        let notify = self.dir.join("notify.sock");
        let _ = std::fs::remove_file(&notify);
        let rx = UnixDatagram::bind(&notify).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut cmd = Command::new(BIN);
        self.env_cmd(&mut cmd);
        cmd.arg("daemon")
            .arg("--cgroup")
            .arg(&self.cgroup)
            .args(&self.extra_daemon_args)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .env("NOTIFY_SOCKET", &notify)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !self.hidden.is_empty() {
            let hidden: Vec<CString> = self
                .hidden
                .iter()
                .map(|p| CString::new(p.to_str().unwrap()).unwrap())
                .collect();
            // SAFETY: between fork and exec only async-signal-safe calls
            // (unshare, mount) on memory prepared before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let none = std::ptr::null();
                    let tmpfs = c"tmpfs".as_ptr();
                    if libc::unshare(libc::CLONE_NEWNS) != 0
                        || libc::mount(
                            none,
                            c"/".as_ptr(),
                            none,
                            libc::MS_REC | libc::MS_PRIVATE,
                            std::ptr::null(),
                        ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    for h in &hidden {
                        if libc::mount(tmpfs, h.as_ptr(), tmpfs, libc::MS_RDONLY, std::ptr::null())
                            != 0
                        {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                })
            };
        }
        let mut child = cmd.spawn().unwrap();
        let mut err = child.stderr.take().unwrap();
        self.log = Some(std::thread::spawn(move || {
            let mut log = String::new();
            let _ = err.read_to_string(&mut log);
            log
        }));
        self.daemon = Some(child);
        let mut buf = [0u8; 256];
        let got = loop {
            match rx.recv(&mut buf) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        match got {
            Ok(n) => {
                assert_eq!(&buf[..n], b"READY=1");
                self.notify_rx = Some(rx);
            }
            Err(e) => {
                let log = self.stop();
                panic!("daemon did not signal readiness ({e}); its log:\n{log}");
            }
        }
    }

    /// SIGTERMs the daemon and returns its log (stderr).
    pub fn stop(&mut self) -> String {
        self.signal(libc::SIGTERM)
    }

    /// Sends `sig` to the daemon, reaps it, returns its log.
    pub fn signal(&mut self, sig: i32) -> String {
        let Some(mut child) = self.daemon.take() else {
            return String::new();
        };
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, sig) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("daemon did not exit after signal {sig}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.log
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Runs `gpuctl ARGS` against this environment.
    pub fn gpuctl(&self, args: &[&str]) -> Output {
        self.gpuctl_as(None, args)
    }

    /// Runs `gpuctl ARGS` as `uid` (and gid) when given.
    pub fn gpuctl_as(&self, uid: Option<u32>, args: &[&str]) -> Output {
        let mut cmd = Command::new(BIN);
        self.env_cmd(&mut cmd);
        cmd.args(args);
        if let Some(u) = uid {
            // std drops supplementary groups when root sets a uid.
            cmd.uid(u).gid(u);
        }
        cmd.output().unwrap()
    }

    /// `gpuctl ARGS --json`, parsed; panics unless it exits 0.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.gpuctl(&a);
        assert!(out.status.success(), "gpuctl {a:?}: {}", describe(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Creates a char device node `major:minor` in the test's dev dir.
    pub fn mknod(&self, major: u32, minor: u32) -> PathBuf {
        let p = self.dir.join(format!("dev/node-{major}-{minor}"));
        if !p.exists() {
            let c = CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: valid NUL-terminated path; makedev/mknod have no other
            // preconditions.
            let r = unsafe {
                libc::mknod(
                    c.as_ptr(),
                    libc::S_IFCHR | 0o666,
                    libc::makedev(major, minor),
                )
            };
            assert_eq!(
                r,
                0,
                "mknod {}: {}",
                p.display(),
                std::io::Error::last_os_error()
            );
        }
        p
    }

    /// Opens `major:minor` read-write from a fresh process inside the test
    /// cgroup; returns 0 on success, else the errno (ENXIO: allowed but no
    /// driver; EPERM: blocked).
    pub fn open_errno(&self, major: u32, minor: u32) -> i32 {
        let node = self.mknod(major, minor);
        open_in_cgroup(&self.cgroup, &node, None)
    }

    /// A raw protocol connection.
    pub fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(self.socket()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }
}

/// Makes `cmd`'s child move itself into `cgroup` before it execs (exit
/// status 100 if it cannot).
pub fn join_cgroup_before_exec(cmd: &mut Command, cgroup: &Path) {
    let procs = CString::new(cgroup.join("cgroup.procs").to_str().unwrap()).unwrap();
    // SAFETY: the closure runs in the forked child and calls only
    // async-signal-safe functions (open, write, close, _exit) on a buffer
    // allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                libc::_exit(100);
            }
            libc::close(fd);
            Ok(())
        });
    }
}

/// Opens `node` from a forked child that first moves itself into `cgroup`;
/// the child's exit status is the errno (0: opened). Everything happens in
/// `pre_exec` (async-signal-safe calls only), so no helper binary is needed.
pub fn open_in_cgroup(cgroup: &Path, node: &Path, env: Option<&[(&str, &str)]>) -> i32 {
    let node = CString::new(node.to_str().unwrap()).unwrap();
    let mut cmd = Command::new("/bin/true");
    if let Some(env) = env {
        cmd.envs(env.iter().copied());
    }
    join_cgroup_before_exec(&mut cmd, cgroup);
    // SAFETY: runs in the forked child after the cgroup hook; open and
    // _exit are async-signal-safe, `node` was allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::open(node.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            let e = if r >= 0 { 0 } else { *libc::__errno_location() };
            libc::_exit(e);
        });
    }
    let status = cmd.status().unwrap();
    let code = status.code().expect("open helper killed by a signal");
    assert_ne!(code, 100, "could not join cgroup {}", cgroup.display());
    code
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Processes that joined the cgroup have exited; it is empty.
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn describe(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Sends raw bytes and reads one response line.
pub fn raw_exchange(s: &mut UnixStream, bytes: &[u8]) -> serde_json::Value {
    s.write_all(bytes).unwrap();
    read_line(s)
}

pub fn read_line(s: &mut UnixStream) -> serde_json::Value {
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}"))
}
