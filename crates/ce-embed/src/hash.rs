//! Deterministic feature-hashing embedder — **for tests and pipeline-overhead benchmarks
//! only, never for semantic search**.
//!
//! Features are lower-cased alphanumeric words and, for CJK text (Han, kana, Hangul), single
//! characters and character bigrams. Each feature is hashed with FNV-1a 64 (stable across
//! platforms, Rust versions and runs, unlike `std`'s `DefaultHasher`) into one signed
//! component; the sum is L2-normalised. Texts sharing words therefore have a positive cosine,
//! which is enough to exercise ranking code, but the vectors carry no meaning: synonyms,
//! paraphrases and other languages' words are unrelated.
//!
//! Its [`ModelIdentity`] is `hash:feature-hash-v1:{dimension}`, so vectors from it can never
//! be mixed up with a real model's, and any index built from it says what it is.

use std::time::Duration;

use crate::{EmbedError, Embedder, ModelIdentity};

/// The identity's provider name.
pub const PROVIDER: &str = "hash";
/// The identity's model name; bump the suffix if the feature scheme ever changes.
pub const MODEL: &str = "feature-hash-v1";

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Feature kinds, mixed into the hash so that a word, a CJK character and a CJK bigram
/// with the same bytes land on different components.
const TAG_WORD: u8 = b'w';
const TAG_CJK_CHAR: u8 = b'c';
const TAG_CJK_BIGRAM: u8 = b'b';
const TAG_EMPTY: u8 = b'e';

/// Signed feature hashing into `dimension` components (test and benchmark use only; see the
/// module docs).
#[derive(Debug, Clone)]
pub struct HashEmbedder {
    identity: ModelIdentity,
}

impl HashEmbedder {
    /// Creates a hashing embedder producing `dimension`-component vectors.
    ///
    /// # Panics
    ///
    /// Panics if `dimension` is 0 (a configuration is validated before it gets here).
    pub fn new(dimension: usize) -> Self {
        assert!(dimension > 0, "hash embedder dimension must be at least 1");
        HashEmbedder {
            identity: ModelIdentity {
                provider: PROVIDER.to_owned(),
                model: MODEL.to_owned(),
                dimension,
            },
        }
    }

    /// Embeds one text (what [`Embedder::embed_texts`] does for each text).
    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let dim = self.identity.dimension;
        let mut v = vec![0f32; dim];
        let mut features = 0usize;
        for_each_feature(text, |h| {
            add_feature(&mut v, h);
            features += 1;
        });
        // Empty text (or only punctuation, or features that cancel out): a fixed unit vector.
        if features == 0 || !crate::normalize(&mut v) {
            v.fill(0.0);
            add_feature(&mut v, Fnv::new(TAG_EMPTY).finish());
            crate::normalize(&mut v);
        }
        v
    }
}

impl Embedder for HashEmbedder {
    fn identity(&self) -> &ModelIdentity {
        &self.identity
    }

    /// Embeds every text; this takes microseconds, so `timeout` never expires.
    fn embed_texts(&self, texts: &[&str], _timeout: Duration) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|t| self.embed_one(t)).collect())
    }
}

/// Adds ±1 at the component chosen by the hash: the low 32 bits pick the component (by
/// multiply-shift range reduction), the top bit picks the sign.
fn add_feature(v: &mut [f32], h: u64) {
    let idx = (((h & 0xffff_ffff) * v.len() as u64) >> 32) as usize;
    let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
    v[idx] += sign;
}

/// FNV-1a 64 over bytes, seeded with a feature tag.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    fn new(tag: u8) -> Self {
        let mut f = Fnv(FNV_OFFSET);
        f.byte(tag);
        f
    }

    fn byte(&mut self, b: u8) {
        self.0 ^= u64::from(b);
        self.0 = self.0.wrapping_mul(FNV_PRIME);
    }

    fn char(&mut self, c: char) {
        let mut buf = [0u8; 4];
        for &b in c.encode_utf8(&mut buf).as_bytes() {
            self.byte(b);
        }
    }

    /// The hash with a final avalanche (FNV's high bits mix poorly on short inputs, and we
    /// take the sign from the top bit).
    fn finish(self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        h
    }
}

/// Whether `c` is written without spaces between words (Han ideographs, kana, Hangul), so
/// that characters and bigrams stand in for words.
pub(crate) fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF       // Hiragana, Katakana
        | 0x3400..=0x4DBF     // CJK Extension A
        | 0x4E00..=0x9FFF     // CJK Unified Ideographs
        | 0xAC00..=0xD7AF     // Hangul syllables
        | 0xF900..=0xFAFF     // CJK Compatibility Ideographs
        | 0x20000..=0x2FA1F   // CJK Extensions B–F, Compatibility Supplement
    )
}

/// Calls `f` with the hash of every feature of `text`, in order.
fn for_each_feature(text: &str, mut f: impl FnMut(u64)) {
    let mut word: Option<Fnv> = None;
    let mut prev_cjk: Option<char> = None;
    for c in text.chars() {
        if is_cjk(c) {
            if let Some(w) = word.take() {
                f(w.finish());
            }
            let mut uni = Fnv::new(TAG_CJK_CHAR);
            uni.char(c);
            f(uni.finish());
            if let Some(p) = prev_cjk {
                let mut bi = Fnv::new(TAG_CJK_BIGRAM);
                bi.char(p);
                bi.char(c);
                f(bi.finish());
            }
            prev_cjk = Some(c);
        } else if c.is_alphanumeric() {
            prev_cjk = None;
            let w = word.get_or_insert_with(|| Fnv::new(TAG_WORD));
            if c.is_ascii() {
                w.byte(c.to_ascii_lowercase() as u8);
            } else {
                for l in c.to_lowercase() {
                    w.char(l);
                }
            }
        } else {
            prev_cjk = None;
            if let Some(w) = word.take() {
                f(w.finish());
            }
        }
    }
    if let Some(w) = word {
        f(w.finish());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cos(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn norm(v: &[f32]) -> f32 {
        v.iter().map(|x| x * x).sum::<f32>().sqrt()
    }

    #[test]
    fn identity_says_test_only_hashing() {
        let e = HashEmbedder::new(64);
        assert_eq!(e.identity().key(), "hash:feature-hash-v1:64");
    }

    #[test]
    fn vectors_are_unit_and_deterministic() {
        let e = HashEmbedder::new(384);
        for t in [
            "",
            "   ",
            "hello world",
            "用户偏好深色主题",
            "Mixed 中文 and English!",
        ] {
            let v = e.embed_one(t);
            assert_eq!(v.len(), 384);
            assert!((norm(&v) - 1.0).abs() < 1e-5, "{t:?}");
            assert_eq!(v, e.embed_one(t));
        }
        assert_eq!(e.embed_one(""), e.embed_one("?!"));
    }

    #[test]
    fn values_are_stable_across_builds() {
        // FNV-1a + fixed mixing: these numbers must never change (persisted caches and
        // benchmark fixtures rely on them); change MODEL's version if they must.
        let e = HashEmbedder::new(8);
        let r = std::f32::consts::FRAC_1_SQRT_2;
        assert_eq!(
            e.embed_one("hello world"),
            [0.0, -r, 0.0, -r, 0.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(e.embed_one("HELLO, World"), e.embed_one("hello world"));
        let s = 1.0 / 7f32.sqrt(); // 4 characters + 3 bigrams
        let got = e.embed_one("用户偏好");
        let want = [0.0, s, 0.0, -2.0 * s, 0.0, s, 0.0, s];
        assert!(
            got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{got:?}"
        );
        assert_eq!(e.embed_one(""), [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn shared_words_and_cjk_bigrams_give_similarity() {
        let e = HashEmbedder::new(256);
        let a = e.embed_one("the user prefers a dark theme");
        let b = e.embed_one("dark theme preferred by the user");
        let c = e.embed_one("quarterly revenue grew strongly");
        assert!(cos(&a, &b) > cos(&a, &c));
        let x = e.embed_one("用户偏好深色主题");
        let y = e.embed_one("深色主题是用户的偏好");
        let z = e.embed_one("季度收入强劲增长");
        assert!(cos(&x, &y) > 0.3, "{}", cos(&x, &y));
        assert!(cos(&x, &y) > cos(&x, &z));
    }

    #[test]
    fn batch_matches_single() {
        let e = HashEmbedder::new(32);
        let texts = ["a b", "", "中文"];
        let out = e
            .embed_texts(&texts, Duration::from_secs(1))
            .expect("embed");
        for (t, v) in texts.iter().zip(out) {
            assert_eq!(v, e.embed_one(t));
        }
    }

    #[test]
    fn is_fast_enough_for_benchmarks() {
        // ≥ 100k short texts/s in release; the dev profile compiles this crate at opt-level
        // 0, so only a loose floor is asserted here.
        let e = HashEmbedder::new(384);
        let texts: Vec<String> = (0..20_000)
            .map(|i| format!("user {i} prefers the dark theme in editor number {i}"))
            .collect();
        let start = std::time::Instant::now();
        for t in &texts {
            std::hint::black_box(e.embed_one(t));
        }
        let per_sec = texts.len() as f64 / start.elapsed().as_secs_f64();
        println!("hash embedder: {per_sec:.0} texts/s");
        assert!(per_sec > 10_000.0, "{per_sec:.0} texts/s");
    }
}
