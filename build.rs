//! Generates the PCI ID name tables (`pci_names.bin`, see [`pci_names`]) and
//! compiles the BPF programs into libbpf skeletons embedded in the binary:
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
    pci_names(&out_dir);

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

/// The PCI ID database (the `pci-ids` crate's data, read here at build time)
/// as one relocation-free blob for src/gpu/names.rs: the crate's own tables
/// are `&'static str`s, one load-time relocation each (~48 000 in a PIE
/// binary, 1.2 ms of every CLI call's start). Layout, all little-endian:
/// `u32 vendor count, u32 device count`, then the vendors (`u16 id,
/// u32 name offset, u16 name length`, sorted by id), the devices (`u32
/// vendor << 16 | device, u32 offset, u16 length`, sorted), then the names.
/// Offsets are from the start of the names. Where the crate has a vendor
/// or device twice, the first one is kept, as its look-ups find.
fn pci_names(out_dir: &std::path::Path) {
    use std::collections::HashMap;
    let mut names: Vec<u8> = Vec::new();
    let mut seen: HashMap<&str, (u32, u16)> = HashMap::new();
    let mut intern = |s: &'static str| -> (u32, u16) {
        *seen.entry(s).or_insert_with(|| {
            let at = (names.len() as u32, s.len() as u16);
            names.extend_from_slice(s.as_bytes());
            at
        })
    };
    let mut vendors: Vec<(u16, (u32, u16))> = Vec::new();
    let mut devices: Vec<(u32, (u32, u16))> = Vec::new();
    for v in pci_ids::Vendors::iter() {
        vendors.push((v.id(), intern(v.name())));
        for d in v.devices() {
            devices.push((
                (u32::from(v.id()) << 16) | u32::from(d.id()),
                intern(d.name()),
            ));
        }
    }
    // Stable sorts: the first of equal keys stays first.
    vendors.sort_by_key(|v| v.0);
    vendors.dedup_by_key(|v| v.0);
    devices.sort_by_key(|d| d.0);
    devices.dedup_by_key(|d| d.0);
    let mut blob = Vec::new();
    blob.extend_from_slice(&(vendors.len() as u32).to_le_bytes());
    blob.extend_from_slice(&(devices.len() as u32).to_le_bytes());
    for (id, (off, len)) in &vendors {
        blob.extend_from_slice(&id.to_le_bytes());
        blob.extend_from_slice(&off.to_le_bytes());
        blob.extend_from_slice(&len.to_le_bytes());
    }
    for (key, (off, len)) in &devices {
        blob.extend_from_slice(&key.to_le_bytes());
        blob.extend_from_slice(&off.to_le_bytes());
        blob.extend_from_slice(&len.to_le_bytes());
    }
    blob.extend_from_slice(&names);
    let path = out_dir.join("pci_names.bin");
    if let Err(e) = std::fs::write(&path, blob) {
        panic!("writing {}: {e}", path.display());
    }
}
