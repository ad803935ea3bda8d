//! DRM nodes and connectors, read from `<sysfs>/class/drm`.
//!
//! A GPU's nodes are the `cardN`/`renderDN` entries whose device path is the
//! PCI function or a descendant of it (virtio GPUs put them under `virtioN/`).
//! Non-PCI DRM devices (`simpledrm`) match no PCI function and are ignored.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{read_attr, DevNum, Display};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Card,
    Render,
}

#[derive(Debug)]
pub struct DrmEntry {
    name: String,
    kind: Kind,
    dev: Option<DevNum>,
    /// Canonical path of the node's directory (`…/drm/card1`).
    path: PathBuf,
}

#[derive(Debug, Default)]
pub struct DrmScan {
    entries: Vec<DrmEntry>,
    /// Connector entries: (card name, display).
    connectors: Vec<(String, Display)>,
}

/// The nodes of one GPU.
#[derive(Debug, Default)]
pub struct DrmNodes {
    pub card: Option<String>,
    pub card_dev: Option<DevNum>,
    pub render: Option<String>,
    pub render_dev: Option<DevNum>,
    pub displays: Vec<Display>,
}

fn kind_of(name: &str) -> Option<(Kind, u32)> {
    let (kind, digits) = if let Some(d) = name.strip_prefix("renderD") {
        (Kind::Render, d)
    } else if let Some(d) = name.strip_prefix("card") {
        (Kind::Card, d)
    } else {
        return None;
    };
    digits.parse().ok().map(|n| (kind, n))
}

/// Reads every DRM node and connector. No `class/drm` directory: no DRM.
pub fn scan(sysfs: &Path) -> Result<DrmScan> {
    let dir = sysfs.join("class/drm");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DrmScan::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let mut scan = DrmScan::default();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((kind, _)) = kind_of(&name) {
            let Ok(path) = entry.path().canonicalize() else {
                continue;
            };
            let dev = read_attr(&path.join("dev")).and_then(|d| d.parse().ok());
            scan.entries.push(DrmEntry {
                name,
                kind,
                dev,
                path,
            });
        } else if let Some((card, connector)) = name.split_once('-') {
            // `card1-eDP-1`: a connector of card1. A writeback connector
            // (`Writeback-1`) is a render target, not a display.
            if kind_of(card).map(|(k, _)| k) == Some(Kind::Card)
                && !connector.starts_with("Writeback")
            {
                // Unreadable: `null`, like every other unknown fact (the
                // kernel's own "unknown" stays "unknown").
                let status = read_attr(&entry.path().join("status"));
                scan.connectors.push((
                    card.to_string(),
                    Display {
                        connector: connector.to_string(),
                        status,
                    },
                ));
            }
        }
    }
    // Lowest node number first, so a device with two cards is deterministic.
    scan.entries
        .sort_by_key(|e| kind_of(&e.name).map(|(_, n)| n).unwrap_or(u32::MAX));
    scan.connectors
        .sort_by(|a, b| (&a.0, &a.1.connector).cmp(&(&b.0, &b.1.connector)));
    Ok(scan)
}

/// Every DRM node's device number, whoever owns it (a GPU, `simpledrm`,
/// `vkms`, a DisplayLink adapter).
pub fn all_devs(scan: &DrmScan) -> Vec<DevNum> {
    scan.entries.iter().filter_map(|e| e.dev).collect()
}

/// The nodes that belong to the PCI function at `pci_path`.
pub fn nodes_of(scan: &DrmScan, pci_path: &Path) -> DrmNodes {
    let mut nodes = DrmNodes::default();
    for e in scan.entries.iter().filter(|e| e.path.starts_with(pci_path)) {
        match e.kind {
            Kind::Card if nodes.card.is_none() => {
                nodes.card = Some(e.name.clone());
                nodes.card_dev = e.dev;
            }
            Kind::Render if nodes.render.is_none() => {
                nodes.render = Some(e.name.clone());
                nodes.render_dev = e.dev;
            }
            _ => {}
        }
    }
    if let Some(card) = &nodes.card {
        nodes.displays = scan
            .connectors
            .iter()
            .filter(|(c, _)| c == card)
            .map(|(_, d)| d.clone())
            .collect();
    }
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        assert_eq!(kind_of("card0"), Some((Kind::Card, 0)));
        assert_eq!(kind_of("renderD128"), Some((Kind::Render, 128)));
        assert_eq!(kind_of("card1-eDP-1"), None);
        assert_eq!(kind_of("version"), None);
        assert_eq!(kind_of("cardX"), None);
    }
}
