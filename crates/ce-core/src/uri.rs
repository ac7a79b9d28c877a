//! `ctx://` URIs: canonicalization (spec §2.1.1) and tree arithmetic.
//!
//! A canonical URI is `ctx://` followed by zero or more `/`-separated segments. The first
//! segment is the account (DESIGN.md decision 14). The root `ctx://` is virtual: it holds
//! accounts but is never a node itself.

use std::fmt;

use serde::{Deserialize, Serialize};
use unicode_normalization::UnicodeNormalization;

/// The only scheme ContextEngine accepts, in canonical (lower-case) spelling.
pub const SCHEME: &str = "ctx://";

/// Longest accepted canonical URI, in bytes.
pub const MAX_URI_BYTES: usize = 4096;

/// Segment names that the node layout (spec §2.2) uses for a node's own files; a child node
/// with one of these names could not be exported, so such URIs are rejected.
pub const RESERVED_SEGMENTS: [&str; 5] = [
    ".abstract.md",
    ".overview.md",
    "content.md",
    ".meta.json",
    ".relations.json",
];

/// Why a string is not a valid `ctx://` URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    /// The input is empty or only whitespace.
    #[error("uri is empty")]
    Empty,
    /// The input does not start with `ctx://` (in any letter case).
    #[error("uri {uri:?} must start with ctx://")]
    UnsupportedScheme {
        /// The offending input (trimmed).
        uri: String,
    },
    /// The input contains a control character.
    #[error("uri {uri:?} contains a control character at byte {position}")]
    ControlCharacter {
        /// The offending input (trimmed, control characters escaped by `Debug`).
        uri: String,
        /// Byte offset of the character in the trimmed input.
        position: usize,
    },
    /// The input contains an invisible character (zero-width, soft hyphen, word joiner, ...)
    /// or a bidirectional control, which would let two different URIs look identical.
    #[error("uri {uri:?} contains {what} U+{code:04X} at byte {position}", code = u32::from(*character))]
    InvisibleCharacter {
        /// The offending input (trimmed; `Debug` shows the character escaped).
        uri: String,
        /// Byte offset of the character in the trimmed input.
        position: usize,
        /// The character.
        character: char,
        /// What it is, e.g. `the invisible character` or `the bidirectional control`.
        what: &'static str,
    },
    /// The input contains a full-width Latin letter or digit (U+FF10–U+FF5A), a look-alike
    /// of an ASCII one.
    #[error(
        "uri {uri:?} contains the full-width {character:?} (U+{code:04X}) at byte {position}: write the ASCII {ascii:?}",
        code = u32::from(*character)
    )]
    FullWidthCharacter {
        /// The offending input (trimmed).
        uri: String,
        /// Byte offset of the character in the trimmed input.
        position: usize,
        /// The full-width character.
        character: char,
        /// Its ASCII form.
        ascii: char,
    },
    /// A segment is `.` or `..`.
    #[error("uri {uri:?} contains the relative segment {segment:?}")]
    DotSegment {
        /// The offending input.
        uri: String,
        /// `.` or `..`.
        segment: String,
    },
    /// Two slashes in a row, or a slash right after the scheme.
    #[error("uri {uri:?} contains an empty segment")]
    EmptySegment {
        /// The offending input.
        uri: String,
    },
    /// A segment is one of the node layout's file names.
    #[error("uri {uri:?} uses the reserved segment name {segment:?}")]
    ReservedSegment {
        /// The offending input.
        uri: String,
        /// The reserved name.
        segment: String,
    },
    /// A segment holds a backslash, which the on-disk layout cannot represent portably.
    #[error("uri {uri:?} contains a backslash")]
    Backslash {
        /// The offending input.
        uri: String,
    },
    /// A rebase of a URI that is not within the prefix it was asked to replace.
    #[error("uri {uri:?} is not within {prefix:?}")]
    NotWithin {
        /// The URI.
        uri: String,
        /// The prefix.
        prefix: String,
    },
    /// The canonical form is longer than [`MAX_URI_BYTES`].
    #[error("uri is {len} bytes long, the limit is {max}")]
    TooLong {
        /// Length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Canonicalizes a `ctx://` URI (spec §2.1.1).
///
/// Trims surrounding whitespace, lower-cases the scheme, drops a trailing `/` (and whitespace
/// before it) except at the root, keeps the case of the path and normalizes it to Unicode
/// NFC. Rejects empty input, other schemes, control characters, invisible and
/// bidirectional-control characters ([`hidden_character`]), full-width Latin letters and
/// digits, `.`/`..`, empty segments, backslashes and reserved layout names.
pub fn canonicalize_uri(input: &str) -> Result<String, UriError> {
    let trimmed = input.trim();
    check_characters(trimmed)?;
    if trimmed.is_ascii() {
        // No hidden or full-width character is ASCII, and ASCII text is its own NFC.
        return canonical_form(trimmed, trimmed);
    }
    canonicalize_unicode(trimmed)
}

/// [`canonicalize_uri`] of a trimmed input that passed [`check_characters`]: hidden and
/// full-width characters refused, the text normalized to NFC.
fn canonicalize_unicode(trimmed: &str) -> Result<String, UriError> {
    for (position, c) in trimmed.char_indices() {
        if let Some(what) = hidden_character(c) {
            return Err(UriError::InvisibleCharacter {
                uri: trimmed.to_owned(),
                position,
                character: c,
                what,
            });
        }
        if let Some(ascii) = full_width_ascii(c) {
            return Err(UriError::FullWidthCharacter {
                uri: trimmed.to_owned(),
                position,
                character: c,
                ascii,
            });
        }
    }
    // NFC never adds whitespace, control, invisible or full-width characters, so the checks
    // above hold for the normalized text too.
    let normalized: String = trimmed.nfc().collect();
    canonical_form(trimmed, &normalized)
}

/// Canonicalizes a URI read back from storage with the rules it was written under before
/// NFC normalization and the refusal of invisible and full-width characters (issue 13):
/// every URI accepted by [`canonicalize_uri`] comes back unchanged, and one stored earlier
/// keeps its exact key, so it stays readable and removable.
pub fn canonicalize_stored_uri(input: &str) -> Result<String, UriError> {
    let trimmed = input.trim();
    check_characters(trimmed)?;
    canonical_form(trimmed, trimmed)
}

/// The checks on the whole (trimmed) input that come before the scheme.
fn check_characters(trimmed: &str) -> Result<(), UriError> {
    if trimmed.is_empty() {
        return Err(UriError::Empty);
    }
    if let Some(position) = trimmed.find(char::is_control) {
        return Err(UriError::ControlCharacter {
            uri: trimmed.to_owned(),
            position,
        });
    }
    Ok(())
}

/// The canonical form of `text`, the trimmed (and normalized) spelling of `trimmed`, which
/// errors quote.
fn canonical_form(trimmed: &str, text: &str) -> Result<String, UriError> {
    let rest = match text.get(..SCHEME.len()) {
        Some(scheme) if scheme.eq_ignore_ascii_case(SCHEME) => &text[SCHEME.len()..],
        _ => {
            return Err(UriError::UnsupportedScheme {
                uri: trimmed.to_owned(),
            });
        }
    };
    // Whitespace before a trailing `/` is surrounding whitespace too: `ctx://a/b /` is
    // `ctx://a/b`, as its canonical form would be trimmed again on the next parse.
    let path = rest.strip_suffix('/').map_or(rest, str::trim_end);
    let mut canonical = String::with_capacity(SCHEME.len() + path.len());
    canonical.push_str(SCHEME);
    if !path.is_empty() {
        for (i, segment) in path.split('/').enumerate() {
            check_segment(trimmed, segment)?;
            if i > 0 {
                canonical.push('/');
            }
            canonical.push_str(segment);
        }
    }
    if canonical.len() > MAX_URI_BYTES {
        return Err(UriError::TooLong {
            len: canonical.len(),
            max: MAX_URI_BYTES,
        });
    }
    Ok(canonical)
}

/// What `c` is when it is invisible or a bidirectional control: characters that render as
/// nothing (or reorder the text around them), so that two different URIs would look
/// identical. `None` for every other character.
pub fn hidden_character(c: char) -> Option<&'static str> {
    match c {
        '\u{202A}'..='\u{202E}'
        | '\u{2066}'..='\u{2069}'
        | '\u{200E}'
        | '\u{200F}'
        | '\u{061C}' => Some("the bidirectional control"),
        '\u{00AD}'
        | '\u{034F}'
        | '\u{115F}'
        | '\u{1160}'
        | '\u{180E}'
        | '\u{200B}'..='\u{200D}'
        | '\u{2028}'
        | '\u{2029}'
        | '\u{2060}'..='\u{2064}'
        | '\u{3164}'
        | '\u{FEFF}'
        | '\u{FFA0}'
        | '\u{FFF9}'..='\u{FFFB}'
        | '\u{E0000}'..='\u{E007F}' => Some("the invisible character"),
        _ => None,
    }
}

/// The ASCII letter or digit that the full-width `c` (U+FF10–U+FF19, U+FF21–U+FF3A,
/// U+FF41–U+FF5A) looks like. Full-width punctuation (`（`, `：`, ...) is ordinary CJK text
/// and stays allowed.
pub fn full_width_ascii(c: char) -> Option<char> {
    match c {
        '\u{FF10}'..='\u{FF19}' | '\u{FF21}'..='\u{FF3A}' | '\u{FF41}'..='\u{FF5A}' => {
            char::from_u32(u32::from(c) - 0xFF10 + u32::from('0'))
        }
        _ => None,
    }
}

fn check_segment(uri: &str, segment: &str) -> Result<(), UriError> {
    match segment {
        "" => Err(UriError::EmptySegment {
            uri: uri.to_owned(),
        }),
        "." | ".." => Err(UriError::DotSegment {
            uri: uri.to_owned(),
            segment: segment.to_owned(),
        }),
        s if RESERVED_SEGMENTS.contains(&s) => Err(UriError::ReservedSegment {
            uri: uri.to_owned(),
            segment: s.to_owned(),
        }),
        s if s.contains('\\') => Err(UriError::Backslash {
            uri: uri.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// A canonical `ctx://` URI. Construct it with [`CtxUri::parse`]; every value is canonical.
#[derive(
    Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
#[schemars(
    description = "A `ctx://` URI: `ctx://ACCOUNT/segment/...` (`ctx://` alone is the root).",
    extend("pattern" = "^ctx://")
)]
pub struct CtxUri(String);

impl CtxUri {
    /// Parses and canonicalizes `input`.
    pub fn parse(input: &str) -> Result<Self, UriError> {
        canonicalize_uri(input).map(CtxUri)
    }

    /// Parses a URI read back from storage or from a stored document (rows, event payloads,
    /// answers): the rules of [`canonicalize_stored_uri`], so a key written before NFC and
    /// the invisible-character refusal stays exactly the key it was.
    pub fn parse_stored(input: &str) -> Result<Self, UriError> {
        canonicalize_stored_uri(input).map(CtxUri)
    }

    /// The virtual root `ctx://`.
    pub fn root() -> Self {
        CtxUri(SCHEME.to_owned())
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path after `ctx://` (empty at the root).
    pub fn path(&self) -> &str {
        &self.0[SCHEME.len()..]
    }

    /// Whether this is the virtual root `ctx://`.
    pub fn is_root(&self) -> bool {
        self.path().is_empty()
    }

    /// The path segments, account first.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.path().split('/').filter(|s| !s.is_empty())
    }

    /// Number of segments (0 at the root, 1 for an account).
    pub fn depth(&self) -> usize {
        self.segments().count()
    }

    /// The account id: the first segment; empty at the root.
    pub fn account_id(&self) -> &str {
        self.segments().next().unwrap_or("")
    }

    /// The last segment; empty at the root.
    pub fn name(&self) -> &str {
        self.path().rsplit('/').next().unwrap_or("")
    }

    /// The parent URI; the root for an account, `None` for the root.
    pub fn parent(&self) -> Option<CtxUri> {
        if self.is_root() {
            return None;
        }
        match self.path().rfind('/') {
            Some(i) => Some(CtxUri(format!("{SCHEME}{}", &self.path()[..i]))),
            None => Some(CtxUri::root()),
        }
    }

    /// Every proper ancestor that is a node (accounts included, the root excluded), nearest
    /// last: `ctx://a/b/c` gives `[ctx://a, ctx://a/b]`.
    pub fn ancestors(&self) -> Vec<CtxUri> {
        let mut out = Vec::new();
        let mut cur = self.parent();
        while let Some(p) = cur {
            if p.is_root() {
                break;
            }
            cur = p.parent();
            out.push(p);
        }
        out.reverse();
        out
    }

    /// Appends one segment (validated).
    pub fn join(&self, segment: &str) -> Result<CtxUri, UriError> {
        if self.is_root() {
            CtxUri::parse(&format!("{SCHEME}{segment}"))
        } else {
            CtxUri::parse(&format!("{}/{segment}", self.0))
        }
    }

    /// Whether `self` equals `other` or lies below it.
    pub fn is_within(&self, other: &CtxUri) -> bool {
        if other.is_root() {
            return true;
        }
        self.0 == other.0
            || (self.0.starts_with(&other.0) && self.0.as_bytes().get(other.0.len()) == Some(&b'/'))
    }

    /// Rewrites the prefix `from` into `to` (spec §6.3). Fails when `self` is not within
    /// `from`, or when the result would exceed [`MAX_URI_BYTES`].
    pub fn rebase(&self, from: &CtxUri, to: &CtxUri) -> Result<CtxUri, UriError> {
        if !self.is_within(from) {
            return Err(UriError::NotWithin {
                uri: self.0.clone(),
                prefix: from.0.clone(),
            });
        }
        let rel = self.0[from.0.len()..].trim_start_matches('/');
        let out = match (rel.is_empty(), to.is_root()) {
            (true, _) => to.0.clone(),
            (false, true) => format!("{SCHEME}{rel}"),
            (false, false) => format!("{}/{rel}", to.0),
        };
        if out.len() > MAX_URI_BYTES {
            return Err(UriError::TooLong {
                len: out.len(),
                max: MAX_URI_BYTES,
            });
        }
        Ok(CtxUri(out))
    }

    /// The path of `self` relative to `base` (`""` when equal), or `None` when not within.
    pub fn relative_to(&self, base: &CtxUri) -> Option<&str> {
        if !self.is_within(base) {
            return None;
        }
        Some(self.0[base.0.len()..].trim_start_matches('/'))
    }
}

impl fmt::Display for CtxUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for CtxUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Deserialization reads documents this engine wrote (stored events, answers), so it takes
/// the stored rules ([`CtxUri::parse_stored`]); input from users goes through
/// [`CtxUri::parse`].
impl TryFrom<String> for CtxUri {
    type Error = UriError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        CtxUri::parse_stored(&value)
    }
}

impl From<CtxUri> for String {
    fn from(value: CtxUri) -> Self {
        value.0
    }
}

impl std::str::FromStr for CtxUri {
    type Err = UriError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CtxUri::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn canonicalizes_spellings() {
        let c = |s| canonicalize_uri(s).expect("valid");
        assert_eq!(c("  CTX://acc1/Users/u1/  "), "ctx://acc1/Users/u1");
        assert_eq!(c("Ctx://acc1"), "ctx://acc1");
        assert_eq!(c("ctx://"), "ctx://");
        assert_eq!(c("ctx:///"), "ctx://");
        assert_eq!(c("ctx://a/b c/d"), "ctx://a/b c/d");
    }

    #[test]
    fn rejects_each_problem_with_its_own_error() {
        let e = |s| canonicalize_uri(s).expect_err(s);
        assert_eq!(e(""), UriError::Empty);
        assert_eq!(e("   \t"), UriError::Empty);
        assert!(matches!(
            e("http://a/b"),
            UriError::UnsupportedScheme { .. }
        ));
        assert!(matches!(e("a/b"), UriError::UnsupportedScheme { .. }));
        assert!(matches!(
            e("ctx://a/\u{7}b"),
            UriError::ControlCharacter { position: 8, .. }
        ));
        assert!(matches!(
            e("ctx://a/\nb"),
            UriError::ControlCharacter { .. }
        ));
        assert!(matches!(e("ctx://a/../b"), UriError::DotSegment { .. }));
        assert!(matches!(e("ctx://a/./b"), UriError::DotSegment { .. }));
        assert!(matches!(e("ctx://a//b"), UriError::EmptySegment { .. }));
        assert!(matches!(e("ctx:////a"), UriError::EmptySegment { .. }));
        assert!(matches!(e("ctx://a/b//"), UriError::EmptySegment { .. }));
        assert!(matches!(
            e("ctx://a/content.md"),
            UriError::ReservedSegment { .. }
        ));
        assert!(matches!(e("ctx://a/b\\c"), UriError::Backslash { .. }));
        let long = format!("ctx://a/{}", "x".repeat(MAX_URI_BYTES));
        assert!(matches!(e(&long), UriError::TooLong { .. }));
    }

    #[test]
    fn normalizes_to_nfc() {
        // "é" as e + combining acute and as one precomposed character: one key.
        let decomposed = canonicalize_uri("ctx://acc/cafe\u{301}").expect("valid");
        assert_eq!(decomposed, "ctx://acc/caf\u{e9}");
        assert_eq!(
            canonicalize_uri("ctx://acc/caf\u{e9}"),
            Ok(decomposed.clone())
        );
        // Hangul jamo compose; CJK text and full-width punctuation stay as written.
        assert_eq!(
            canonicalize_uri("ctx://acc/\u{1100}\u{1161}"),
            Ok("ctx://acc/\u{ac00}".into())
        );
        assert_eq!(
            canonicalize_uri("ctx://acc/会议记录（草稿）：一"),
            Ok("ctx://acc/会议记录（草稿）：一".into())
        );
    }

    #[test]
    fn refuses_invisible_and_bidi_characters_naming_the_position() {
        use crate::Classify;
        for (input, code, what, position) in [
            ("ctx://acc/a\u{200b}b", 0x200B, "invisible", 11),
            ("ctx://acc/\u{200d}", 0x200D, "invisible", 10),
            ("ctx://\u{feff}acc", 0xFEFF, "invisible", 6),
            ("ctx://acc/so\u{ad}ft", 0xAD, "invisible", 12),
            ("ctx://acc/w\u{2060}j", 0x2060, "invisible", 11),
            ("ctx://acc/x\u{e0041}", 0xE0041, "invisible", 11),
            ("ctx://acc/txt.\u{202e}fdp", 0x202E, "bidirectional", 14),
            ("ctx://acc/\u{2066}a\u{2069}", 0x2066, "bidirectional", 10),
            ("ctx://acc/a\u{200f}", 0x200F, "bidirectional", 11),
            ("ctx://acc/\u{61c}", 0x61C, "bidirectional", 10),
        ] {
            let e = canonicalize_uri(input).expect_err(input);
            let UriError::InvisibleCharacter {
                position: p,
                character,
                ..
            } = &e
            else {
                panic!("{input:?}: {e:?}");
            };
            assert_eq!((*p, u32::from(*character)), (position, code), "{input:?}");
            let msg = e.to_string();
            assert!(msg.contains(what), "{msg}");
            assert!(
                msg.contains(&format!("U+{code:04X} at byte {position}")),
                "{msg}"
            );
            assert_eq!(
                crate::CoreError::from(e).code(),
                crate::ErrorCode::InvalidUri
            );
        }
    }

    #[test]
    fn refuses_full_width_letters_and_digits() {
        let e = canonicalize_uri("ctx://ａcc1/x").expect_err("full-width a");
        assert_eq!(
            e,
            UriError::FullWidthCharacter {
                uri: "ctx://ａcc1/x".into(),
                position: 6,
                character: 'ａ',
                ascii: 'a',
            }
        );
        assert!(e.to_string().contains("write the ASCII 'a'"), "{e}");
        assert_eq!(full_width_ascii('０'), Some('0'));
        assert_eq!(full_width_ascii('Ｚ'), Some('Z'));
        assert_eq!(full_width_ascii('ｚ'), Some('z'));
        assert_eq!(full_width_ascii('（'), None);
        assert_eq!(full_width_ascii('a'), None);
    }

    #[test]
    fn stored_uris_keep_their_key() {
        // Written before NFC and the refusals: read back byte for byte.
        for stored in [
            "ctx://acc/cafe\u{301}",
            "ctx://acc/a\u{200b}b",
            "ctx://ａcc",
        ] {
            assert_eq!(
                CtxUri::parse_stored(stored).map(String::from),
                Ok(stored.to_owned())
            );
            let back: CtxUri = serde_json::from_value(serde_json::json!(stored)).expect("json");
            assert_eq!(back.as_str(), stored);
        }
        // The stored rules still refuse what was never valid.
        assert!(CtxUri::parse_stored("ctx://a//b").is_err());
        assert!(CtxUri::parse_stored("ctx://a/\u{7}").is_err());
    }

    #[test]
    fn tree_arithmetic() {
        let u = CtxUri::parse("ctx://acc1/users/u1/memories").expect("valid");
        assert_eq!(u.account_id(), "acc1");
        assert_eq!(u.name(), "memories");
        assert_eq!(u.depth(), 4);
        assert_eq!(u.parent().expect("parent").as_str(), "ctx://acc1/users/u1");
        let acc = CtxUri::parse("ctx://acc1").expect("valid");
        assert_eq!(acc.parent(), Some(CtxUri::root()));
        assert_eq!(CtxUri::root().parent(), None);
        let anc: Vec<_> = u.ancestors().iter().map(|a| a.to_string()).collect();
        assert_eq!(
            anc,
            ["ctx://acc1", "ctx://acc1/users", "ctx://acc1/users/u1"]
        );
        let ab = CtxUri::parse("ctx://acc1/users").expect("valid");
        let abx = CtxUri::parse("ctx://acc1/usersx").expect("valid");
        assert!(u.is_within(&ab));
        assert!(!abx.is_within(&ab));
        assert!(u.is_within(&CtxUri::root()));
        let to = CtxUri::parse("ctx://acc2/people").expect("valid");
        assert_eq!(
            u.rebase(&ab, &to).expect("within").as_str(),
            "ctx://acc2/people/u1/memories"
        );
        assert_eq!(u.relative_to(&ab), Some("u1/memories"));
        assert_eq!(ab.relative_to(&ab), Some(""));
        assert!(matches!(
            abx.rebase(&ab, &to),
            Err(UriError::NotWithin { .. })
        ));
        let long = CtxUri::parse(&format!("ctx://acc2/{}", "y".repeat(MAX_URI_BYTES - 20)))
            .expect("valid");
        assert!(matches!(
            u.rebase(&ab, &long),
            Err(UriError::TooLong { .. })
        ));
    }

    fn spelling() -> impl Strategy<Value = String> {
        let seg = "[A-Za-z0-9_\\-]{1,6}";
        (
            prop_oneof![Just("ctx://"), Just("CTX://"), Just("Ctx://")],
            proptest::collection::vec(seg, 0..5),
            prop_oneof![Just(""), Just("/")],
            prop_oneof![Just(""), Just("  "), Just("\t")],
        )
            .prop_map(|(scheme, segs, slash, pad)| {
                format!("{pad}{scheme}{}{slash}{pad}", segs.join("/"))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::test_cases(2000)))]

        #[test]
        fn never_panics_and_is_idempotent(input in "\\PC{0,40}|ctx://[\\PC/]{0,40}") {
            if let Ok(c) = canonicalize_uri(&input) {
                prop_assert_eq!(canonicalize_uri(&c), Ok(c.clone()));
                // A URI accepted now is stored as is and reads back equal.
                prop_assert_eq!(canonicalize_stored_uri(&c), Ok(c.clone()));
                prop_assert!(c.starts_with(SCHEME));
                prop_assert!(c == SCHEME || !c.ends_with('/'));
            }
        }

        #[test]
        fn ascii_takes_the_short_way_to_the_same_result(input in "[ -~]{0,40}|ctx://[ -~]{0,40}") {
            let trimmed = input.trim();
            let full = check_characters(trimmed).and_then(|()| canonicalize_unicode(trimmed));
            prop_assert_eq!(canonicalize_uri(&input), full);
        }

        #[test]
        fn equivalent_spellings_give_one_key(s in spelling()) {
            let lower = s.trim().replacen("CTX://", "ctx://", 1).replacen("Ctx://", "ctx://", 1);
            let a = canonicalize_uri(&s).expect("generated uris are valid");
            let b = canonicalize_uri(&lower).expect("generated uris are valid");
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(crate::stable_hash(&a, 0), crate::stable_hash(&b, 0));
        }
    }
}
