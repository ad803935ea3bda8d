/*
 * gpuctl tier 3 (tests/vm/auto-tests.sh): a real ACPI AC adapter (ACPI0003) and battery
 * (PNP0C0A) for QEMU -machine pc, whose state the guest flips by writing CMOS bytes
 * through /dev/port (QEMU has no battery device of its own):
 *
 *   CMOS 0x70  AC online (1 = mains, 0 = battery); _INI sets 1
 *   CMOS 0x71  battery charge in percent;           _INI sets 80
 *
 * The firmware notices a change itself and raises Notify(ADP1/BAT0, 0x80), so the kernel's
 * ac and battery drivers send real power_supply uevents: \_SB.PWCK compares the bytes with
 * the values it last saw; it runs every second from the thermal zone's _TMP (_TZP = 10:
 * the kernel polls it) and on every read of the adapter's or battery's state.
 *
 * Compiled with iasl (Debian package acpica-tools); passed with -acpitable file=...aml.
 */
DefinitionBlock ("ssdt-power.aml", "SSDT", 2, "GPUCTL", "PWRSUPLY", 1)
{
    Scope (\_SB)
    {
        OperationRegion (CMSI, SystemIO, 0x70, 2)
        Field (CMSI, ByteAcc, NoLock, Preserve) { CIDX, 8, CDAT, 8 }
        IndexField (CIDX, CDAT, ByteAcc, NoLock, Preserve)
        {
            Offset (0x70),
            ACON, 8,
            BCAP, 8,
        }
        Mutex (PWMX, 0)
        Name (LACN, 0xFF)       // AC state last notified
        Name (LCAP, 0xFF)       // charge last notified

        Method (PWCK, 0, Serialized)
        {
            Acquire (PWMX, 0xFFFF)
            Local0 = (ACON & 1)
            Local1 = BCAP
            If (Local0 != LACN) {
                LACN = Local0
                Notify (\_SB.ADP1, 0x80)
                Notify (\_SB.BAT0, 0x80)
            } ElseIf (Local1 != LCAP) {
                Notify (\_SB.BAT0, 0x80)
            }
            LCAP = Local1
            Release (PWMX)
        }

        Device (ADP1)
        {
            Name (_HID, "ACPI0003")
            Name (_PCL, Package () { \_SB })
            Method (_INI, 0) {
                ACON = 1
                BCAP = 80
                LACN = 1
                LCAP = 80
            }
            Method (_STA, 0) { Return (0x0F) }
            Method (_PSR, 0) {
                PWCK ()
                Return (ACON & 1)
            }
        }

        Device (BAT0)
        {
            Name (_HID, EisaId ("PNP0C0A"))
            Name (_UID, 0)
            Name (_PCL, Package () { \_SB })
            Method (_STA, 0) { Return (0x1F) }
            Method (_BIF, 0) {
                Return (Package () {
                    1,          // units: mA / mAh
                    5000,       // design capacity
                    5000,       // last full charge
                    1,          // rechargeable
                    11100,      // design voltage (mV)
                    500, 100,   // warning, low
                    10, 10,     // granularity
                    "GPUCTLBAT", "0001", "LION", "QEMU"
                })
            }
            Name (BSTP, Package (4) { 0, 1000, 0, 11100 })
            Method (_BST, 0, Serialized) {
                PWCK ()
                Local0 = BCAP
                If (Local0 > 100) { Local0 = 100 }
                If (ACON & 1) {
                    If (Local0 >= 100) { BSTP [0] = 0 } Else { BSTP [0] = 2 }  // full, charging
                } Else {
                    BSTP [0] = 1                                                // discharging
                }
                BSTP [2] = (Local0 * 50)                                        // remaining mAh
                Return (BSTP)
            }
        }
    }

    Scope (\_TZ)
    {
        ThermalZone (PWTZ)
        {
            Name (_TZP, 10)                         // polled every 1.0 s
            Method (_TMP, 0) {
                \_SB.PWCK ()
                Return (3000)                       // 26.85 C
            }
            Method (_CRT, 0) { Return (3732) }      // one valid trip point: 100 C
        }
    }
}
