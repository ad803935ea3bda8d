/*
 * q35 power tier (tests/vm/power-tests.sh): an ACPI companion for the GPU behind root port
 * \_SB.PCI0.S10 (0000:01:00.0) with a power resource in _PR0/_PR3, so the PCI core can put it in
 * D3cold as on a laptop's dGPU. QEMU must run with
 * -global ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off: QEMU's own hotplug slot object has
 * _EJ0, and the kernel skips ACPI power control for devices with _EJ0.
 * CMOS 0x72: 1 = GPU power off; 0x73: number of _OFF calls; 0x74: number of _ON calls (the guest
 * reads them through /dev/port to see the firmware really switched the power).
 */
DefinitionBlock ("power-d3cold.aml", "SSDT", 2, "GPUCTL", "GPUD3C", 1)
{
    External (\_SB.PCI0, DeviceObj)
    External (\_SB.PCI0.S10, DeviceObj)
    Scope (\_SB.PCI0)
    {
        OperationRegion (GPCM, SystemIO, 0x70, 2)
        Field (GPCM, ByteAcc, NoLock, Preserve) { GIDX, 8, GDAT, 8 }
        IndexField (GIDX, GDAT, ByteAcc, NoLock, Preserve)
        {
            Offset (0x72),
            GOFF, 8,
            GCOF, 8,
            GCON, 8,
        }
        PowerResource (GPPR, 0, 0)
        {
            Method (_STA, 0) { If (GOFF) { Return (0) } Return (1) }
            Method (_ON, 0) { GOFF = 0; GCON++ }
            Method (_OFF, 0) { GOFF = 1; GCOF++ }
        }
    }
    Scope (\_SB.PCI0.S10)
    {
        Device (GPU0)
        {
            Name (_ADR, 0)
            Name (_PR0, Package () { \_SB.PCI0.GPPR })
            Name (_PR3, Package () { \_SB.PCI0.GPPR })
        }
    }
}
