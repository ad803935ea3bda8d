//! Human names from the PCI ID database (the `pci-ids` crate's data,
//! compiled in by build.rs as one relocation-free blob: fixed-size records
//! of integers and one string area, searched by binary search; nothing in
//! it is a pointer, so loading the binary relocates none of it).

/// build.rs's `pci_names`: the header, the vendor and device records, the
/// names.
static BLOB: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pci_names.bin"));

const VENDOR_REC: usize = 8;
const DEVICE_REC: usize = 10;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The blob's parts: vendor records, device records, names.
fn parts() -> Option<(&'static [u8], &'static [u8], &'static [u8])> {
    let nv = u32_at(BLOB, 0)? as usize;
    let nd = u32_at(BLOB, 4)? as usize;
    let rest = BLOB.get(8..)?;
    let (v, rest) = rest.split_at_checked(nv * VENDOR_REC)?;
    let (d, names) = rest.split_at_checked(nd * DEVICE_REC)?;
    Some((v, d, names))
}

/// Binary search of `recs` (records of `size` bytes, sorted by the key
/// `key` reads); the record's name.
fn find(
    recs: &[u8],
    size: usize,
    want: u32,
    key: impl Fn(&[u8]) -> Option<u32>,
    names: &'static [u8],
) -> Option<&'static str> {
    let (mut lo, mut hi) = (0, recs.len() / size);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let rec = recs.get(mid * size..(mid + 1) * size)?;
        let k = key(rec)?;
        if k < want {
            lo = mid + 1;
        } else if k > want {
            hi = mid;
        } else {
            let off = u32_at(rec, size - 6)? as usize;
            let len = usize::from(u16_at(rec, size - 2)?);
            return std::str::from_utf8(names.get(off..off + len)?).ok();
        }
    }
    None
}

fn vendor_name(id: u16) -> Option<&'static str> {
    let (v, _, names) = parts()?;
    find(
        v,
        VENDOR_REC,
        u32::from(id),
        |r| u16_at(r, 0).map(u32::from),
        names,
    )
}

/// A short vendor name for the vendors people know by one word.
pub fn vendor(id: u16) -> Option<String> {
    let short = match id {
        0x10de => Some("NVIDIA"),
        0x1002 | 0x1022 => Some("AMD"),
        0x8086 => Some("Intel"),
        _ => None,
    };
    short.or_else(|| vendor_name(id)).map(str::to_string)
}

/// The device's name, e.g. `GA107M [GeForce RTX 3050 Mobile]`.
pub fn device(vendor: u16, device: u16) -> Option<String> {
    let (_, d, names) = parts()?;
    let want = (u32::from(vendor) << 16) | u32::from(device);
    find(d, DEVICE_REC, want, |r| u32_at(r, 0), names).map(str::to_string)
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_names() {
        assert_eq!(super::vendor(0x10de).as_deref(), Some("NVIDIA"));
        assert_eq!(super::vendor(0x1af4).as_deref(), Some("Red Hat, Inc."));
        assert_eq!(
            super::device(0x10de, 0x25a2).as_deref(),
            Some("GA107M [GeForce RTX 3050 Mobile]")
        );
        assert_eq!(super::device(0xffff, 0x0001), None);
    }

    /// The generated table says what the `pci-ids` crate says, for every
    /// vendor and device it has (and nothing for ids it lacks).
    #[test]
    fn the_table_is_the_crate_s_database() {
        let mut n = 0;
        for v in pci_ids::Vendors::iter() {
            assert_eq!(super::vendor_name(v.id()), Some(v.name()), "{:04x}", v.id());
            for d in v.devices() {
                let want = pci_ids::Device::from_vid_pid(v.id(), d.id()).map(|d| d.name());
                assert_eq!(super::device(v.id(), d.id()).as_deref(), want);
                n += 1;
            }
        }
        assert!(n > 10_000, "{n} devices");
        let crate_vendors: std::collections::HashMap<u16, &str> = pci_ids::Vendors::iter()
            .map(|v| (v.id(), v.name()))
            .collect();
        for id in 0..=u16::MAX {
            let want = crate_vendors.get(&id).copied();
            assert_eq!(super::vendor_name(id), want, "{id:04x}");
        }
    }
}
