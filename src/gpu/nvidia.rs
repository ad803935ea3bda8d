//! The NVIDIA proprietary driver's per-GPU procfs file, for `/dev/nvidiaN`.

use std::path::Path;

use super::PciAddr;

/// `Device Minor:` from `<procfs>/driver/nvidia/gpus/<pci>/information`.
pub fn device_minor(procfs: &Path, addr: &PciAddr) -> Option<u32> {
    let path = procfs.join(format!("driver/nvidia/gpus/{addr}/information"));
    let text = std::fs::read_to_string(path).ok()?;
    parse_minor(&text)
}

fn parse_minor(text: &str) -> Option<u32> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == "Device Minor")
        .and_then(|(_, v)| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_real_information_file() {
        let text = "Model: \t\t NVIDIA GeForce RTX 3050 Laptop GPU\nIRQ:   \t\t 185\n\
                    GPU UUID: \t GPU-1b2c\nBus Location: \t 0000:01:00.0\n\
                    Device Minor: \t 1\nGPU Excluded:\t No\n";
        assert_eq!(super::parse_minor(text), Some(1));
        assert_eq!(super::parse_minor("Model: x\n"), None);
    }
}
