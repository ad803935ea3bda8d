//! Compiles the BPF programs into libbpf skeletons embedded in the binary:
//! `bpf/gpuctl.bpf.c` (the enforcer) and `bpf/power.bpf.c` (runtime-PM
//! transitions and wake attribution, attached in every mode).
//!
//! Environment overrides:
//! - `BPF_CLANG`: the clang to use (default: `clang` from `PATH`).
//! - `BPF_CFLAGS`: extra flags for clang, split on whitespace.

// A build script fails by panicking: that is how cargo reports it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::env;
use std::ffi::OsString;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

/// (source, skeleton file name)
const OBJECTS: &[(&str, &str)] = &[
    ("bpf/gpuctl.bpf.c", "gpuctl.skel.rs"),
    ("bpf/power.bpf.c", "power.skel.rs"),
];
const HEADERS: &[&str] = &["bpf/gpuctl.h", "bpf/power.h", "bpf/vmlinux.h"];

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let mut args: Vec<OsString> = vec!["-Wall".into(), "-Werror".into(), "-Ibpf".into()];
    if let Ok(extra) = env::var("BPF_CFLAGS") {
        args.extend(extra.split_whitespace().map(OsString::from));
    }

    for (src, skel) in OBJECTS {
        let mut builder = SkeletonBuilder::new();
        builder.source(src).clang_args(args.clone());
        if let Some(clang) = env::var_os("BPF_CLANG") {
            builder.clang(clang);
        }
        if let Err(err) = builder.build_and_generate(out_dir.join(skel)) {
            // The build script's own failure is the one place a panic is the
            // right report: cargo prints it with the compiler output.
            panic!("building the BPF skeleton from {src} failed: {err:#}");
        }
        println!("cargo:rerun-if-changed={src}");
    }
    for h in HEADERS {
        println!("cargo:rerun-if-changed={h}");
    }
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    println!("cargo:rerun-if-env-changed=BPF_CFLAGS");
}
