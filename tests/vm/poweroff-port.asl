/*
 * Tier 3, power-off (tests/vm/poweroff-tests.sh): the dGPU rail on the ROOT PORT, as laptop
 * firmware puts it on PEG0. A _PR0/_PR3 power resource on the root port's node
 * \_SB.PCI0.S10 (0000:00:02.0, above the GPU 0000:01:00.0): when the port runtime-suspends
 * with d3cold_allowed = 1 (every function below it suspended first), the kernel calls _OFF
 * and the port and GPU are in D3cold; a resume calls _ON.
 * CMOS 0x72: 1 = rail off; 0x73: count of _OFF calls; 0x74: count of _ON calls (the guest
 * reads them through /dev/port).
 * Needs -global ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off (QEMU's own hotplug
 * methods would otherwise define S10's children).
 */
DefinitionBlock ("poweroff-port.aml", "SSDT", 2, "GPUCTL", "PORTOFF", 1)
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
        PowerResource (PPPR, 0, 0)
        {
            Method (_STA, 0) { If (GOFF) { Return (0) } Return (1) }
            Method (_ON, 0) { GOFF = 0; GCON++ }
            Method (_OFF, 0) { GOFF = 1; GCOF++ }
        }
    }
    Scope (\_SB.PCI0.S10)
    {
        Name (_PR0, Package () { \_SB.PCI0.PPPR })
        Name (_PR3, Package () { \_SB.PCI0.PPPR })
        Device (GPU0)
        {
            Name (_ADR, 0)
        }
    }
}
