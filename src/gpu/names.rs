//! Human names from the PCI ID database (the `pci-ids` crate, compiled in).

/// A short vendor name for the vendors people know by one word.
pub fn vendor(id: u16) -> Option<String> {
    let short = match id {
        0x10de => Some("NVIDIA"),
        0x1002 | 0x1022 => Some("AMD"),
        0x8086 => Some("Intel"),
        _ => None,
    };
    short.map(str::to_string).or_else(|| {
        pci_ids::Vendors::iter()
            .find(|v| v.id() == id)
            .map(|v| v.name().to_string())
    })
}

/// The device's name, e.g. `GA107M [GeForce RTX 3050 Mobile]`.
pub fn device(vendor: u16, device: u16) -> Option<String> {
    pci_ids::Device::from_vid_pid(vendor, device).map(|d| d.name().to_string())
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
}
