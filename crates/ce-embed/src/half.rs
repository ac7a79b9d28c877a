//! Embeddings kept at half precision: how the embedding cache and the embedded vector index
//! store a vector, and the one rounding every vector index applies to what it is given
//! ([`round`]), so that all of them keep — and score — the same values.
//!
//! A vector is stored as one byte, the exponent `e` of a power-of-two scale, then each
//! component divided by `2^e` as a little-endian IEEE `f16`: `1 + 2·d` bytes instead of the
//! `4·d` of `f32` (769 against 1,536 for a 384-d model). `e` is chosen so that the largest
//! magnitude lands in `(0.5, 1]`, where `f16` keeps 11 significant bits; scaling by a power of
//! two is exact, so each component is off by at most `2⁻¹²` of the largest one (half a unit in
//! the last place) and a cosine by about `1e-3` at worst — in practice far less: on clustered
//! 384-d vectors, recall@10 against the `f32` scores moves by under 0.002 (docs/indexing.md,
//! "Vectors at half precision"). Rounding is idempotent: [`encode`] of a [`decode`]d vector
//! gives back the same bytes, so a kept vector stays bit-identical however often it is
//! rewritten.
//!
//! The length tells the encodings apart: `1 + 2·d` is odd and the `4·d` bytes of the `f32`
//! layout files written before this one hold is even, so [`decode`] reads both.

use numkong::f16;

/// The smallest and largest scale exponents a vector records (`i8`); a vector beyond them
/// (a largest component above `2¹²⁷` or below `2⁻¹²⁸`) is clamped, and loses precision
/// rather than overflowing.
const E_MIN: i32 = i8::MIN as i32;
const E_MAX: i32 = i8::MAX as i32;

/// `⌈log₂ x⌉` for a positive finite `x`.
fn ceil_log2(x: f64) -> i32 {
    let bits = x.to_bits();
    // f32 inputs, even subnormal ones, are normal as f64.
    let exponent = ((bits >> 52) & 0x7ff) as i32 - 1023;
    let fraction = bits & ((1 << 52) - 1);
    if fraction == 0 {
        exponent
    } else {
        exponent + 1
    }
}

/// `v` narrowed as stored: the scale exponent and each component divided by `2^e` as an
/// `f16` (see the module documentation). Components must be finite.
fn narrow(v: &[f32]) -> (i8, Vec<f16>) {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let mut e = if max > 0.0 {
        ceil_log2(f64::from(max)).clamp(E_MIN, E_MAX)
    } else {
        0
    };
    let scale = 2f64.powi(-e);
    let mut halves = vec![f16::ZERO; v.len()];
    if (-126..=127).contains(&-e) {
        // `2^-e` is a normal `f32`: each product is the exact one correctly rounded, as in
        // `f64` below, and numkong narrows the lot in one vectorised call (the encoding was
        // a tenth of a cold drain's CPU one component at a time).
        let s = scale as f32;
        let scaled: Vec<f32> = v.iter().map(|x| x * s).collect();
        numkong::cast(&scaled, &mut halves);
    } else {
        for (h, &x) in halves.iter_mut().zip(v) {
            *h = f16::from_f32((f64::from(x) * scale) as f32);
        }
    }
    // Rounding is monotonic, so the largest magnitude rounds to the largest half. It can come
    // down to exactly 0.5: then one exponent lower (doubling an `f16` at most 0.5 is exact)
    // keeps it in (0.5, 1], as a re-encoding would.
    let top = f16::from_f32((f64::from(max) * scale) as f32).to_f32();
    if top > 0.0 && top <= 0.5 && e > E_MIN {
        e -= 1;
        halves
            .iter_mut()
            .for_each(|h| *h = f16::from_f32(h.to_f32() * 2.0));
    }
    (e as i8, halves)
}

/// `halves` scaled back by `2^e`: the vector [`narrow`] stands for.
fn widen(e: i8, halves: &[f16]) -> Option<Vec<f32>> {
    // Widening is exact, so numkong's vectorised cast gives the scalar conversion's values
    // (a search decodes a few dozen stored vectors).
    let mut out = vec![0f32; halves.len()];
    numkong::cast(halves, &mut out)?;
    // A power of two (2⁻¹²⁸ is a subnormal `f32`, still exact): one correctly rounded
    // product per component.
    let scale = 2f64.powi(i32::from(e)) as f32;
    if scale != 1.0 {
        out.iter_mut().for_each(|x| *x *= scale);
    }
    Some(out)
}

/// `v` as stored: see the module documentation. Components must be finite.
pub fn encode(v: &[f32]) -> Vec<u8> {
    let (e, halves) = narrow(v);
    let mut out = Vec::with_capacity(1 + 2 * v.len());
    out.push(e as u8);
    for h in halves {
        out.extend_from_slice(&h.0.to_le_bytes());
    }
    out
}

/// A stored vector: [`encode`]'s layout (odd length) or little-endian `f32`s (a length that
/// is a multiple of four); `None` for any other length.
pub fn decode(b: &[u8]) -> Option<Vec<f32>> {
    match b.split_first() {
        Some((&e, halves)) if !b.len().is_multiple_of(2) => {
            let halves: Vec<f16> = halves
                .chunks_exact(2)
                .map(|h| f16(u16::from_le_bytes([h[0], h[1]])))
                .collect();
            widen(e as i8, &halves)
        }
        _ if b.len().is_multiple_of(4) => Some(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => None,
    }
}

/// `v` as a vector index keeps it: `decode(encode(v))`, without the bytes in between (every
/// fresh vector is rounded twice on its way into the index: by the embedding cache, then by
/// the index's own rule).
pub fn round(v: &[f32]) -> Vec<f32> {
    let (e, halves) = narrow(v);
    widen(e, &halves).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn component() -> impl Strategy<Value = f32> {
        prop_oneof![
            -1.0f32..1.0,
            -1e6f32..1e6,
            -1e-6f32..1e-6,
            Just(0.0f32),
            Just(0.5f32),
            Just(1.0f32),
        ]
    }

    fn vector() -> impl Strategy<Value = Vec<f32>> {
        (1usize..48, 0i32..3).prop_flat_map(|(d, magnitude)| {
            proptest::collection::vec(component(), d).prop_map(move |v| {
                // Some vectors scaled far from 1, both ways.
                let s = [1.0f32, 1e-20, 1e20][magnitude as usize];
                v.into_iter().map(|x| x * s).collect::<Vec<f32>>()
            })
        })
    }

    /// [`encode`] one component at a time, in `f64`: what the vectorised narrowing must
    /// match bit for bit.
    fn reference_encode(v: &[f32]) -> Vec<u8> {
        let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let mut e = if max > 0.0 {
            ceil_log2(f64::from(max)).clamp(E_MIN, E_MAX)
        } else {
            0
        };
        let scale = 2f64.powi(-e);
        let mut halves: Vec<f16> = v
            .iter()
            .map(|&x| f16::from_f32((f64::from(x) * scale) as f32))
            .collect();
        let top = halves.iter().fold(0f32, |m, h| m.max(h.to_f32().abs()));
        if top > 0.0 && top <= 0.5 && e > E_MIN {
            e -= 1;
            halves
                .iter_mut()
                .for_each(|h| *h = f16::from_f32(h.to_f32() * 2.0));
        }
        let mut out = vec![e as i8 as u8];
        for h in halves {
            out.extend_from_slice(&h.0.to_le_bytes());
        }
        out
    }

    proptest! {
        /// The vectorised encoding is the reference one, at every scale (the clamped
        /// exponents included).
        #[test]
        fn encoding_matches_the_scalar_reference(v in vector(), far in 0usize..3) {
            // Also largest components near 2⁻¹²⁸ and below (the exponent clamped) and up to
            // 1e38 (exponents near 127, where `2^-e` is no normal `f32`).
            let s = [1.0f32, 1e-39, 1e12][far];
            let v: Vec<f32> = v.into_iter().map(|x| x * s).collect();
            prop_assert_eq!(encode(&v), reference_encode(&v));
        }

        /// Rounding is the decoding of the encoding, bit for bit, at every scale.
        #[test]
        fn rounding_is_decoding_the_encoding(v in vector(), far in 0usize..3) {
            let s = [1.0f32, 1e-39, 1e12][far];
            let v: Vec<f32> = v.into_iter().map(|x| x * s).collect();
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<u32>>();
            prop_assert_eq!(bits(round(&v)), bits(decode(&encode(&v)).expect("decodes")));
        }

        /// Each component within half an `f16` unit of the scaled largest one; encoding
        /// a decoded vector gives the same bytes; the length is odd and `1 + 2·d`.
        #[test]
        fn rounding_is_bounded_and_idempotent(v in vector()) {
            let bytes = encode(&v);
            prop_assert_eq!(bytes.len(), 1 + 2 * v.len());
            let w = decode(&bytes).expect("decodes");
            prop_assert_eq!(w.len(), v.len());
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (a, b) in v.iter().zip(&w) {
                let err = f64::from((a - b).abs());
                // Half an f16 unit at the scaled largest magnitude (at most 1, the scale below
                // twice the largest component).
                prop_assert!(
                    err <= f64::from(max) * 2f64.powi(-11),
                    "{a} -> {b}, largest {max}"
                );
            }
            prop_assert_eq!(encode(&w), bytes);
            prop_assert_eq!(round(&w), w);
        }
    }

    /// The vectorised widening agrees with the scalar one on every `f16` (NaNs compared as
    /// NaNs), at the scales at both ends of the exponent's range.
    #[test]
    fn every_half_decodes_as_the_scalar_conversion_does() {
        for e in [0i8, -1, 12, i8::MIN, i8::MAX] {
            let mut bytes = vec![e as u8];
            for bits in 0..=u16::MAX {
                bytes.extend_from_slice(&bits.to_le_bytes());
            }
            let got = decode(&bytes).expect("decodes");
            for (bits, x) in (0..=u16::MAX).zip(got) {
                let want = (f64::from(f16(bits).to_f32()) * 2f64.powi(i32::from(e))) as f32;
                assert!(
                    x.to_bits() == want.to_bits() || (x.is_nan() && want.is_nan()),
                    "{bits:#06x} at 2^{e}: {x} against {want}"
                );
            }
        }
    }

    #[test]
    fn the_f32_layout_is_still_read_and_other_lengths_are_refused() {
        let v = [0.25f32, -3.5, 1e-3];
        let legacy: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(decode(&legacy), Some(v.to_vec()));
        assert_eq!(decode(&[1, 2]), None);
        assert_eq!(decode(&[]), Some(vec![]));
        // Exactly representable vectors survive unchanged.
        assert_eq!(round(&v[..2]), v[..2].to_vec());
        assert_eq!(round(&[0.0, 0.0]), vec![0.0, 0.0]);
    }

    #[test]
    fn a_largest_component_rounded_down_to_one_half_keeps_the_canonical_exponent() {
        // 0.5 + 2⁻¹⁴ rounds to 0.5 in f16: the exponent moves down one and the bytes are the
        // ones the rounded vector encodes to.
        let v = [0.5f32 + 2f32.powi(-14), 0.1];
        let bytes = encode(&v);
        assert_eq!(bytes[0] as i8, -1);
        assert_eq!(encode(&decode(&bytes).expect("decodes")), bytes);
    }
}
