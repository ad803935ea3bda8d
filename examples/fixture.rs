//! Materialises one named fixture machine of tests/common/fixture.rs (a faithful sysfs and
//! procfs tree) for scripts: `make demo`, a manual session.
//!
//!     cargo run --example fixture -- NAME DIR    # creates DIR/sys and DIR/proc
//!     cargo run --example fixture -- --list      # the names
//!
//! Point gpuctl at it with GPUCTL_SYSFS_ROOT=DIR/sys GPUCTL_PROCFS_ROOT=DIR/proc. The tree
//! is the one the integration tests use, so there is one builder of fixture machines.
//! Exit status 0, 1 when DIR cannot be written, 2 on bad usage or an unknown name.

// Test and bench code: a failed step panics, which is how the harness reports it
// (the crate's unwrap/expect lints are for the shipped binary's runtime paths).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{Context, Result};
use std::fs;
use std::path::Path;
use std::process::ExitCode;

#[path = "../tests/common/fixture.rs"]
#[allow(dead_code)]
mod fixture;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [l] if l == "--list" => {
            for m in fixture::MACHINES {
                println!("{m}");
            }
            ExitCode::SUCCESS
        }
        [name, dir] if fixture::MACHINES.contains(&name.as_str()) => {
            match materialise(name, Path::new(dir)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("fixture: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
        [name, _] => {
            eprintln!(
                "fixture: no machine {name:?}; known: {}",
                fixture::MACHINES.join(" ")
            );
            ExitCode::from(2)
        }
        _ => {
            eprintln!("usage: fixture NAME DIR | fixture --list");
            ExitCode::from(2)
        }
    }
}

/// Builds the machine inside DIR (the builder's own temp dir, placed there through
/// GPUCTL_FIXTURE_DIR), then moves its `sys` and `proc` to DIR/sys and DIR/proc: a rename
/// keeps every file's sentinel times and every relative symlink as built.
fn materialise(name: &str, dir: &Path) -> Result<()> {
    for sub in ["sys", "proc"] {
        if dir.join(sub).exists() {
            anyhow::bail!("{} exists already", dir.join(sub).display());
        }
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::env::set_var("GPUCTL_FIXTURE_DIR", dir);
    std::env::remove_var("GPUCTL_KEEP_FIXTURE");
    let m = fixture::machine(name);
    for (from, sub) in [(m.sysfs(), "sys"), (m.procfs(), "proc")] {
        fs::rename(from, dir.join(sub))
            .with_context(|| format!("moving {} into {}", from.display(), dir.display()))?;
    }
    drop(m); // removes the builder's now empty temp dir
    Ok(())
}
