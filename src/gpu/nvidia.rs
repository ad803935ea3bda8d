//! The NVIDIA proprietary driver's per-GPU procfs file, for `/dev/nvidiaN`.

use std::path::Path;

use super::pci::PciFunction;

/// The minor number of `/dev/nvidiaN` for an NVIDIA GPU bound to `nvidia`.
///
/// The source is `Device Minor:` in
/// `<procfs>/driver/nvidia/gpus/<pci>/information`, but the driver takes a
/// runtime-PM reference to answer that read: reading it wakes a suspended
/// GPU. So a suspended GPU's file is not read. The driver numbers GPUs from
/// 0 in probe order, so when it is the only GPU bound to `nvidia` its minor
/// is 0 for certain; with several suspended ones the minor is unknown (null).
pub fn device_minor(procfs: &Path, gpu: &PciFunction, nvidia_gpus: usize) -> Option<u32> {
    if gpu.runtime_status.as_deref() == Some("suspended") {
        return (nvidia_gpus == 1).then_some(0);
    }
    let path = procfs.join(format!("driver/nvidia/gpus/{}/information", gpu.addr));
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
