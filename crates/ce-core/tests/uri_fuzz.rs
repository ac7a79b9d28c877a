//! URI canonicalization under random input (issue 5, reliability): 100k seeded cases of
//! random strings (ASCII with the URI's special characters, whitespace, control characters,
//! CJK, right-to-left text, combining marks, emoji, inputs around [`MAX_URI_BYTES`]) and of
//! mutated valid URIs. `canonicalize_uri` never panics; an accepted URI is canonical
//! (idempotent, within the limits, no empty / `.` / `..` / reserved segment) and equals an
//! independent model of spec §2.1.1; a rejected one gets the typed error whose condition holds
//! in the input and whose message names it; `parent` / `is_within` / `rebase` /
//! `relative_to` obey their laws.
//!
//! Since issue 13 the model also refuses invisible and bidirectional-control characters and
//! full-width Latin letters and digits, and normalizes to NFC (with the `unicode-normalization`
//! crate, not the crate's code); the tokens include NFC-sensitive and look-alike text.
//!
//! `CE_PROPTEST_CASES` sets the number of cases (default 100 000); `CE_SEED` replays a run.

use ce_core::uri::{MAX_URI_BYTES, RESERVED_SEGMENTS, SCHEME};
use ce_core::{Classify, CoreError, CtxUri, ErrorCode, UriError, canonicalize_uri};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestError};
use unicode_normalization::UnicodeNormalization;

/// Invisible characters and bidirectional controls a URI must not hold (an independent copy
/// of the rule: code points, not the crate's table).
const HIDDEN: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x2028, 0x2029),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x2069),
    (0x3164, 0x3164),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF9, 0xFFFB),
    (0xE0000, 0xE007F),
];

fn is_hidden(c: char) -> bool {
    let c = u32::from(c);
    HIDDEN.iter().any(|&(a, b)| (a..=b).contains(&c))
}

fn is_full_width_alnum(c: char) -> bool {
    matches!(u32::from(c), 0xFF10..=0xFF19 | 0xFF21..=0xFF3A | 0xFF41..=0xFF5A)
}

/// Pieces random inputs are made of: the URI's own syntax, look-alikes and hostile text.
const TOKENS: &[&str] = &[
    "ctx://",
    "CTX://",
    "Ctx://",
    "ctx:/",
    "ctx:",
    "ctx",
    "http://",
    "://",
    "/",
    "//",
    ".",
    "..",
    "%",
    "%2F",
    "%00",
    ":",
    "?",
    "#",
    "\\",
    "&",
    "=",
    "@",
    "~",
    " ",
    "\t",
    "\n",
    "\r",
    "\u{b}",
    "\u{c}",
    "\u{0}",
    "\u{7}",
    "\u{1b}",
    "\u{7f}",
    "\u{85}",
    "\u{a0}",
    "\u{2028}",
    "\u{3000}",
    "\u{feff}",
    "\u{200b}",
    "\u{200d}",
    "\u{202e}",
    "\u{301}",
    "\u{327}",
    "\u{e9}",
    "\u{1100}\u{1161}",
    "\u{f900}",
    "\u{2060}",
    "\u{ad}",
    "\u{200e}",
    "\u{2067}",
    "\u{e0041}",
    "ａ",
    "Ｚ９",
    "（",
    "：",
    "\u{5d0}\u{5d1}",
    "\u{627}\u{644}",
    "中文",
    "記憶",
    "😀",
    "👩\u{200d}💻",
    "e\u{301}",
    "a",
    "B",
    "z9",
    "-",
    "_",
    "acc",
    "users",
    "u1",
    "content.md",
    ".abstract.md",
    ".overview.md",
    ".meta.json",
    ".relations.json",
    "content.MD",
    "...",
    ".a",
    "a.",
];

/// A character for long segments: one to four bytes, so the limit falls inside or between
/// characters.
const WIDE: &[char] = &['x', 'é', '中', '😀'];

fn token() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(TOKENS)
}

fn tokens(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(token(), 0..max).prop_map(|v| v.concat())
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_\\-]{1,8}",
        "[a-z]{1,3}[ .:%?#@~][a-z]{1,3}",
        "\\PC{1,4}".prop_filter("a valid segment", |s| {
            canonicalize_uri(&format!("ctx://{s}")).is_ok_and(|c| c == format!("ctx://{s}"))
        }),
    ]
}

/// A valid canonical URI: the root or one to six segments.
fn valid() -> impl Strategy<Value = String> {
    proptest::collection::vec(segment(), 0..7).prop_map(|s| format!("{SCHEME}{}", s.join("/")))
}

/// An edit of a string: at a byte position (rounded to a char boundary).
#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, &'static str),
    Delete(usize, usize),
    Replace(usize, usize, &'static str),
    Pad(&'static str, &'static str),
    UpperScheme,
    TrailingSlash,
}

fn edit() -> impl Strategy<Value = Edit> {
    let pad =
        proptest::sample::select(&["", " ", "\t", "\n", "\u{a0}", "\u{3000}", "/", "\u{7}"][..]);
    prop_oneof![
        4 => (any::<usize>(), token()).prop_map(|(i, t)| Edit::Insert(i, t)),
        2 => (any::<usize>(), 1usize..4).prop_map(|(i, n)| Edit::Delete(i, n)),
        2 => (any::<usize>(), 1usize..4, token()).prop_map(|(i, n, t)| Edit::Replace(i, n, t)),
        1 => (pad.clone(), pad).prop_map(|(a, b)| Edit::Pad(a, b)),
        1 => Just(Edit::UpperScheme),
        1 => Just(Edit::TrailingSlash),
    ]
}

fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(s: &str, e: &Edit) -> String {
    let at = |i: usize| floor_boundary(s, if s.is_empty() { 0 } else { i % (s.len() + 1) });
    match *e {
        Edit::Insert(i, t) => {
            let i = at(i);
            format!("{}{t}{}", &s[..i], &s[i..])
        }
        Edit::Delete(i, n) | Edit::Replace(i, n, _) => {
            let a = at(i);
            let b = floor_boundary(s, a + n);
            let with = if let Edit::Replace(_, _, t) = e {
                t
            } else {
                ""
            };
            format!("{}{with}{}", &s[..a], &s[b..])
        }
        Edit::Pad(a, b) => format!("{a}{s}{b}"),
        Edit::UpperScheme => s.replacen("ctx://", "CTX://", 1),
        Edit::TrailingSlash => format!("{s}/"),
    }
}

/// A valid URI with zero to four edits.
fn mutated() -> impl Strategy<Value = String> {
    (valid(), proptest::collection::vec(edit(), 0..5))
        .prop_map(|(u, edits)| edits.iter().fold(u, |s, e| apply(&s, e)))
}

/// A URI whose canonical length is within a few bytes of [`MAX_URI_BYTES`], built of
/// segments of one-to-four-byte characters, sometimes with a trailing slash or padding.
fn long() -> impl Strategy<Value = String> {
    (
        proptest::sample::select(WIDE),
        4usize..64,
        0usize..24,
        proptest::sample::select(&["", "/", " ", "\u{3000}", "//"][..]),
    )
        .prop_map(|(c, seg_chars, slack, tail)| {
            let budget = MAX_URI_BYTES + 12 - slack; // MAX - 11 ..= MAX + 12 bytes
            let mut s = String::from("ctx://acc");
            while s.len() < budget {
                s.push('/');
                for _ in 0..seg_chars {
                    if s.len() + c.len_utf8() > budget {
                        break;
                    }
                    s.push(c);
                }
            }
            if s.ends_with('/') {
                s.push('y');
            }
            s.push_str(tail);
            s
        })
}

fn input() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => tokens(24),
        4 => mutated(),
        2 => (token(), "\\PC{0,30}", token()).prop_map(|(a, b, c)| format!("ctx://{a}{b}{c}")),
        1 => any::<String>(),
        1 => long(),
    ]
}

/// The spec's canonical form, or why there is none, computed without the crate's code.
fn model(input: &str) -> Result<String, &'static str> {
    let t = input.trim();
    if t.is_empty() {
        return Err("empty");
    }
    if t.chars().any(char::is_control) {
        return Err("control");
    }
    for c in t.chars() {
        if is_hidden(c) {
            return Err("hidden");
        }
        if is_full_width_alnum(c) {
            return Err("full width");
        }
    }
    let t: String = t.nfc().collect();
    let t = t.as_str();
    let (scheme, rest) = t.split_at(t.char_indices().nth(6).map_or(t.len(), |(i, _)| i));
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return Err("scheme");
    }
    let path = rest.strip_suffix('/').map_or(rest, str::trim_end);
    if !path.is_empty() {
        for seg in path.split('/') {
            match seg {
                "" => return Err("empty segment"),
                "." | ".." => return Err("dot"),
                s if RESERVED_SEGMENTS.contains(&s) => return Err("reserved"),
                s if s.contains('\\') => return Err("backslash"),
                _ => {}
            }
        }
    }
    let out = format!("{SCHEME}{path}");
    if out.len() > MAX_URI_BYTES {
        return Err("too long");
    }
    Ok(out)
}

fn check(cond: bool, why: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(why()))
    }
}

/// What an accepted URI must be.
fn check_canonical(input: &str, c: &str) -> Result<(), TestCaseError> {
    let again = canonicalize_uri(c);
    check(again.as_deref() == Ok(c), || {
        format!("not idempotent: {input:?} -> {c:?} -> {again:?}")
    })?;
    let parsed = CtxUri::parse(input).map_err(|e| TestCaseError::fail(e.to_string()))?;
    check(parsed.as_str() == c, || {
        format!("CtxUri::parse({input:?}) = {parsed:?}, canonicalize = {c:?}")
    })?;
    check(c.starts_with(SCHEME) && c.len() <= MAX_URI_BYTES, || {
        format!("{input:?} -> {c:?}: scheme or length")
    })?;
    check(c.trim() == c, || {
        format!("{input:?} -> {c:?}: surrounding whitespace")
    })?;
    check(!c.chars().any(char::is_control), || {
        format!("{input:?} -> {c:?}: control character")
    })?;
    check(
        !c.chars().any(|ch| is_hidden(ch) || is_full_width_alnum(ch)),
        || format!("{input:?} -> {c:?}: invisible or full-width character"),
    )?;
    check(c.nfc().eq(c.chars()), || {
        format!("{input:?} -> {c:?}: not NFC")
    })?;
    let stored = CtxUri::parse_stored(c);
    check(stored.as_ref().map(CtxUri::as_str) == Ok(c), || {
        format!("{input:?} -> {c:?} reads back from storage as {stored:?}")
    })?;
    let path = &c[SCHEME.len()..];
    if !path.is_empty() {
        for seg in path.split('/') {
            check(
                !seg.is_empty()
                    && seg != "."
                    && seg != ".."
                    && !seg.contains('\\')
                    && !RESERVED_SEGMENTS.contains(&seg),
                || format!("{input:?} -> {c:?}: bad segment {seg:?}"),
            )?;
        }
    }
    let want = model(input);
    check(want.as_deref() == Ok(c), || {
        format!("{input:?} -> {c:?}, the model says {want:?}")
    })
}

/// What a rejection must be: the variant the model predicts, its condition true of the
/// input, and a message naming it.
fn check_rejection(input: &str, e: &UriError) -> Result<(), TestCaseError> {
    let msg = e.to_string();
    let core = CoreError::from(e.clone());
    check(
        core.code() == ErrorCode::InvalidUri && !core.is_retryable(),
        || format!("{input:?}: {e:?} is classified {:?}", core.code()),
    )?;
    check(
        !msg.is_empty()
            && !msg.ends_with('.')
            && msg.chars().next().is_some_and(|c| !c.is_uppercase()),
        || format!("{input:?}: message style {msg:?}"),
    )?;
    let t = input.trim();
    let (kind, names) = match e {
        UriError::Empty => ("empty", msg.contains("empty") && t.is_empty()),
        UriError::ControlCharacter { position, uri } => (
            "control",
            msg.contains("control character")
                && uri == t
                && t.get(*position..)
                    .and_then(|s| s.chars().next())
                    .is_some_and(char::is_control),
        ),
        UriError::InvisibleCharacter {
            uri,
            position,
            character,
            ..
        } => (
            "hidden",
            uri == t
                && is_hidden(*character)
                && t.get(*position..).and_then(|s| s.chars().next()) == Some(*character)
                && msg.contains(&format!(
                    "U+{:04X} at byte {position}",
                    u32::from(*character)
                )),
        ),
        UriError::FullWidthCharacter {
            uri,
            position,
            character,
            ascii,
        } => (
            "full width",
            uri == t
                && is_full_width_alnum(*character)
                && ascii.is_ascii_alphanumeric()
                && t.get(*position..).and_then(|s| s.chars().next()) == Some(*character)
                && msg.contains(&format!("at byte {position}")),
        ),
        UriError::UnsupportedScheme { uri } => ("scheme", msg.contains("ctx://") && uri == t),
        UriError::EmptySegment { .. } => ("empty segment", msg.contains("empty segment")),
        UriError::DotSegment { segment, .. } => (
            "dot",
            (segment == "." || segment == "..") && msg.contains(&format!("{segment:?}")),
        ),
        UriError::ReservedSegment { segment, .. } => (
            "reserved",
            RESERVED_SEGMENTS.contains(&segment.as_str()) && msg.contains(segment.as_str()),
        ),
        UriError::Backslash { .. } => ("backslash", msg.contains("backslash")),
        UriError::TooLong { len, max } => (
            "too long",
            *len > *max && *max == MAX_URI_BYTES && msg.contains(&len.to_string()),
        ),
        UriError::NotWithin { .. } => ("not within", false),
    };
    check(names, || {
        format!("{input:?}: {e:?} does not name its problem: {msg:?}")
    })?;
    let want = model(input);
    check(want == Err(kind), || {
        format!("{input:?}: rejected as {kind} ({e:?}) but the model says {want:?}")
    })
}

/// Tree laws of an accepted URI, with a second one (`other`) for rebase.
fn check_laws(u: &CtxUri, other: &CtxUri) -> Result<(), TestCaseError> {
    let root = CtxUri::root();
    check(u.is_within(u) && u.is_within(&root), || {
        format!("{u:?} reflexive / root")
    })?;
    check(u.relative_to(u) == Some(""), || {
        format!("{u:?} relative to itself")
    })?;
    match u.parent() {
        None => check(u.is_root() && u.depth() == 0, || {
            format!("{u:?} has no parent")
        })?,
        Some(p) => {
            check(u.is_within(&p) && !p.is_within(u) && p != *u, || {
                format!("{u:?} within its parent {p:?}")
            })?;
            check(p.depth() + 1 == u.depth(), || format!("{u:?} parent depth"))?;
            let back = p.join(u.name());
            check(back.as_ref() == Ok(u), || {
                format!("{p:?}.join({:?}) = {back:?}, want {u:?}", u.name())
            })?;
            check(u.relative_to(&p) == Some(u.name()), || {
                format!("{u:?} relative to its parent")
            })?;
        }
    }
    let anc = u.ancestors();
    check(anc.len() == u.depth().saturating_sub(1), || {
        format!("{u:?} ancestors {anc:?}")
    })?;
    for a in &anc {
        check(u.is_within(a) && !a.is_within(u), || {
            format!("{u:?} within ancestor {a:?}")
        })?;
    }
    // Antisymmetry, and a sibling that shares a text prefix is not within.
    if u.is_within(other) && other.is_within(u) {
        check(u == other, || {
            format!("{u:?} and {other:?} within each other")
        })?;
    }
    if !u.is_root()
        && let Ok(sib) = CtxUri::parse(&format!("{u}x"))
    {
        check(!sib.is_within(u) && !u.is_within(&sib), || {
            format!("{sib:?} vs {u:?}: text prefix taken for a parent")
        })?;
    }
    // Rebase onto `other` from some ancestors (the nearest and farthest three; deep URIs
    // have hundreds), the URI itself and the root.
    let mut froms: Vec<CtxUri> = if anc.len() > 6 {
        anc[..3]
            .iter()
            .chain(&anc[anc.len() - 3..])
            .cloned()
            .collect()
    } else {
        anc.clone()
    };
    froms.push(u.clone());
    froms.push(root.clone());
    for from in &froms {
        match u.rebase(from, other) {
            Ok(r) => {
                check(CtxUri::parse(r.as_str()).as_ref() == Ok(&r), || {
                    format!("rebase {u:?} {from:?} -> {other:?} = {r:?} is not canonical")
                })?;
                check(r.is_within(other), || format!("{r:?} not within {other:?}"))?;
                let rel = u.relative_to(from);
                check(r.relative_to(other) == rel, || {
                    format!("rebase {u:?} {from:?} -> {other:?} = {r:?} lost the path {rel:?}")
                })?;
                if let Ok(back) = r.rebase(other, from) {
                    check(back == *u, || {
                        format!("rebase of {u:?} there and back gives {back:?}")
                    })?;
                }
            }
            Err(UriError::TooLong { len, max }) => {
                check(len > max, || format!("rebase {u:?} TooLong {len} <= {max}"))?;
            }
            Err(e) => {
                return Err(TestCaseError::fail(format!(
                    "rebase {u:?} from its ancestor {from:?} to {other:?}: {e:?}"
                )));
            }
        }
    }
    if !other.is_within(u) && !other.is_root() {
        let r = other.rebase(u, &root);
        check(matches!(r, Err(UriError::NotWithin { .. })), || {
            format!("rebase {other:?} from {u:?} (not within) = {r:?}")
        })?;
    }
    Ok(())
}

fn run_case(input: &str, other: &str) -> Result<(), TestCaseError> {
    let res = std::panic::catch_unwind(|| canonicalize_uri(input))
        .map_err(|_| TestCaseError::fail(format!("canonicalize_uri({input:?}) panicked")))?;
    match res {
        Ok(c) => {
            check_canonical(input, &c)?;
            let u = CtxUri::parse(&c).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let o = CtxUri::parse(other).unwrap_or_else(|_| CtxUri::root());
            check_laws(&u, &o)
        }
        Err(e) => check_rejection(input, &e),
    }
}

/// `s`, or its start and end with the length when it is long (inputs near the size limit).
fn short(s: &str) -> String {
    if s.len() <= 400 {
        return s.to_owned();
    }
    let a = floor_boundary(s, 200);
    let b = (s.len() - 200..=s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    format!("{} …[{} bytes]… {}", &s[..a], s.len(), &s[b..])
}

#[test]
fn random_and_mutated_uris() {
    let seed = ce_testkit::seed("random_and_mutated_uris");
    let mut runner = ce_testkit::seeded_runner(seed, ce_core::test_cases(100_000), 10_000);
    let strategy = (input(), prop_oneof![valid(), mutated()]);
    match runner.run(&strategy, |(input, other)| run_case(&input, &other)) {
        Ok(()) => {}
        Err(TestError::Fail(why, (input, other))) => panic!(
            "uri fuzz failed (replay with CE_SEED={seed}): {}\nminimal input {} (other {})",
            short(why.message()),
            short(&format!("{input:?}")),
            short(&format!("{other:?}"))
        ),
        Err(e) => panic!("uri fuzz aborted (CE_SEED={seed}): {e}"),
    }
}

/// Found by the fuzz: a last segment ending in whitespace, followed by the trailing slash
/// that canonicalization drops, became a canonical URI ending in whitespace, which
/// canonicalizes again to another URI (the whitespace is trimmed the second time).
#[test]
fn whitespace_before_a_trailing_slash_is_canonical_once() {
    for input in [
        "ctx://acc/a /",
        "ctx://acc/\t/",
        "ctx://\u{3000}/",
        "ctx://acc/b\u{a0}/",
    ] {
        let once = canonicalize_uri(input);
        let twice = once.as_deref().map(canonicalize_uri);
        match (&once, &twice) {
            (Ok(c), Ok(Ok(c2))) => assert_eq!(c, c2, "{input:?} is not canonical once"),
            (Err(_), _) => {}
            (Ok(c), _) => panic!("{input:?} -> {c:?} is refused the second time: {twice:?}"),
        }
    }
}

/// Found by the fuzz: rebasing from the root onto an account or deeper node drops the `/`
/// between the new prefix and the path (`ctx://b` from `ctx://` to `ctx://a` gives
/// `ctx://ab`, which is not within `ctx://a`).
#[test]
fn rebase_from_the_root_keeps_the_separator() {
    let u = |s: &str| CtxUri::parse(s).expect("valid");
    let r = u("ctx://b/c").rebase(&CtxUri::root(), &u("ctx://a"));
    assert_eq!(r, Ok(u("ctx://a/b/c")));
}
