//! Compiles `bpf/gpuctl.bpf.c` into a libbpf skeleton embedded in the binary.
//!
//! Environment overrides:
//! - `BPF_CLANG`: the clang to use (default: `clang` from `PATH`).
//! - `BPF_CFLAGS`: extra flags for clang, split on whitespace.

use std::env;
use std::ffi::OsString;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "bpf/gpuctl.bpf.c";
const HEADERS: &[&str] = &["bpf/gpuctl.h", "bpf/vmlinux.h"];

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let skel = out_dir.join("gpuctl.skel.rs");

    let mut args: Vec<OsString> = vec!["-Wall".into(), "-Werror".into(), "-Ibpf".into()];
    if let Ok(extra) = env::var("BPF_CFLAGS") {
        args.extend(extra.split_whitespace().map(OsString::from));
    }

    let mut builder = SkeletonBuilder::new();
    builder.source(SRC).clang_args(args);
    if let Some(clang) = env::var_os("BPF_CLANG") {
        builder.clang(clang);
    }
    if let Err(err) = builder.build_and_generate(&skel) {
        // The build script's own failure is the one place a panic is the
        // right report: cargo prints it with the compiler output.
        panic!("building the BPF skeleton from {SRC} failed: {err:#}");
    }

    println!("cargo:rerun-if-changed={SRC}");
    for h in HEADERS {
        println!("cargo:rerun-if-changed={h}");
    }
    println!("cargo:rerun-if-env-changed=BPF_CLANG");
    println!("cargo:rerun-if-env-changed=BPF_CFLAGS");
}
