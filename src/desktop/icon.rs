//! The tray icons, drawn here and sent as pixmaps (StatusNotifierItem
//! `IconPixmap`: ARGB32, network byte order), so no icon theme is needed.
//! A GPU chip whose colour says the dGPU's state and whose letter says the
//! mode: green asleep, amber awake, blue blocked, grey unknown, red cross
//! when the daemon is down.

use super::model::Look;

/// Sizes offered to the host (it picks the nearest).
pub const SIZES: [i32; 3] = [22, 32, 64];

/// 3×5 bitmap letters for the modes.
fn glyph(c: char) -> [u8; 5] {
    match c {
        'H' => [0b101, 0b101, 0b111, 0b101, 0b101],
        'I' => [0b111, 0b010, 0b010, 0b010, 0b111],
        'S' => [0b111, 0b100, 0b111, 0b001, 0b111],
        'M' => [0b101, 0b111, 0b111, 0b101, 0b101],
        _ => [0; 5],
    }
}

pub fn colour(look: Look) -> [u8; 3] {
    match look {
        Look::Asleep => [0x2e, 0x9e, 0x4f],
        Look::Awake => [0xf0, 0x9a, 0x10],
        Look::Blocked => [0x2f, 0x6f, 0xd8],
        Look::Unknown => [0x80, 0x80, 0x80],
        Look::Down => [0x60, 0x60, 0x60],
    }
}

/// One `size`×`size` ARGB32 image (network byte order).
pub fn pixmap(look: Look, mode: Option<&str>, size: i32) -> (i32, i32, Vec<u8>) {
    let n = size.max(8) as usize;
    let mut px = vec![[0u8; 4]; n * n]; // A, R, G, B
    let f = n as f32;
    let [r, g, b] = colour(look);
    // The chip: a square with a margin for the pins.
    let (c0, c1) = ((f * 0.16) as usize, (f * 0.84) as usize);
    for y in 0..n {
        for x in 0..n {
            let inside = (c0..c1).contains(&x) && (c0..c1).contains(&y);
            // Pins: short stubs on each side, every other 1/8th.
            let pin_span = |v: usize| ((v * 8 / n) % 2 == 1) && (c0..c1).contains(&v);
            let pin = (x < c0 && x >= c0 / 3 && pin_span(y))
                || (x >= c1 && x < n - c0 / 3 && pin_span(y))
                || (y < c0 && y >= c0 / 3 && pin_span(x))
                || (y >= c1 && y < n - c0 / 3 && pin_span(x));
            if inside {
                px[y * n + x] = [0xff, r, g, b];
            } else if pin {
                px[y * n + x] = [0xff, 0x40, 0x40, 0x40];
            }
        }
    }
    let letter = mode
        .and_then(|m| m.chars().next())
        .map(|c| c.to_ascii_uppercase());
    if look == Look::Down {
        // A white cross over the chip.
        let w = (f * 0.08).max(1.0);
        for y in c0..c1 {
            for x in c0..c1 {
                let (dx, dy) = (x as f32 - y as f32, x as f32 + y as f32 - (n - 1) as f32);
                if dx.abs() <= w || dy.abs() <= w {
                    px[y * n + x] = [0xff, 0xff, 0xff, 0xff];
                }
            }
        }
    } else if let Some(c) = letter {
        // The mode's letter, white, centred, scaled to half the chip.
        let rows = glyph(c);
        let cell = ((c1 - c0) / 2 / 5).max(1);
        let (w, h) = (3 * cell, 5 * cell);
        let (ox, oy) = ((n - w) / 2, (n - h) / 2);
        for (ry, bits) in rows.iter().enumerate() {
            for rx in 0..3 {
                if bits & (0b100 >> rx) == 0 {
                    continue;
                }
                for y in oy + ry * cell..oy + (ry + 1) * cell {
                    for x in ox + rx * cell..ox + (rx + 1) * cell {
                        px[y * n + x] = [0xff, 0xff, 0xff, 0xff];
                    }
                }
            }
        }
    }
    (size, size, px.into_iter().flatten().collect())
}

/// Every size, for `IconPixmap`.
pub fn pixmaps(look: Look, mode: Option<&str>) -> Vec<(i32, i32, Vec<u8>)> {
    SIZES.iter().map(|&s| pixmap(look, mode, s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_states_differ() {
        let (w, h, d) = pixmap(Look::Asleep, Some("hybrid"), 32);
        assert_eq!((w, h, d.len()), (32, 32, 32 * 32 * 4));
        // The centre of the chip carries the state's colour or the letter.
        let a = pixmap(Look::Asleep, Some("integrated"), 32).2;
        let b = pixmap(Look::Blocked, Some("integrated"), 32).2;
        let c = pixmap(Look::Blocked, Some("hybrid"), 32).2;
        assert_ne!(a, b);
        assert_ne!(b, c);
        // Pixel (8, 8) is inside the chip, away from the letter: ARGB.
        let at = |d: &[u8], x: usize, y: usize| d[(y * 32 + x) * 4..(y * 32 + x) * 4 + 4].to_vec();
        assert_eq!(at(&a, 7, 7), vec![0xff, 0x2e, 0x9e, 0x4f]);
        assert_eq!(at(&b, 7, 7), vec![0xff, 0x2f, 0x6f, 0xd8]);
        // Corners stay transparent.
        assert_eq!(at(&a, 0, 0)[0], 0);
    }
}
