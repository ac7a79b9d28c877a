//! The one tokenizer of CE's text: the keyword index indexes records and parses queries with
//! it (so a query term matches exactly the terms a text was indexed under), and the extractive
//! generator of derived layers weighs sentences by its terms.
//!
//! Text is split into runs of one script class; everything else (punctuation, whitespace,
//! symbols, `_`) only separates runs and never becomes a token:
//! - Han runs are segmented by jieba in search mode with the HMM on (long words also yield
//!   the dictionary words inside them: `北京大学` → `北京`, `大学`, `北京大学`), so a query
//!   for a word finds texts holding a compound that contains it;
//! - other alphanumeric runs (Latin, digits, other alphabets) are lower-cased and reduced by
//!   the Snowball English stemmer (`Running runs` → `run run`).
//!
//! Not handled (deliberately, for now): Unicode normalization (full-width `Ａ` stays distinct
//! from `A`), stop words (BM25's idf weighs them down), and languages other than Chinese and
//! English beyond lower-casing (Japanese kana runs become whole tokens).

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::LazyLock;

use jieba_rs::Jieba;
use rust_stemmers::{Algorithm, Stemmer};

/// jieba with its default dictionary, loaded once per process (a few hundred ms).
static JIEBA: LazyLock<Jieba> = LazyLock::new(Jieba::new);

static STEMMER: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));

/// Most words a thread remembers the stem of (cleared when full: ~1.5 MiB per thread).
const STEM_MEMO: usize = 16_384;

/// Longest word (bytes) whose stem is remembered.
const STEM_MEMO_WORD: usize = 24;

thread_local! {
    /// Stems of the words this thread stemmed recently. Stemming is a pure function of the
    /// lower-cased word and words repeat across texts (a few thousand make up most of any
    /// corpus), so most words are looked up instead of stemmed again: stemming was 14 % of a
    /// keyword back-fill.
    static STEMS: RefCell<HashMap<String, String>> = RefCell::new(HashMap::new());
}

/// The script class of a character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A Han ideograph: segmented by jieba.
    Han,
    /// Any other letter or digit: lower-cased and stemmed.
    Word,
    /// Everything else: a separator.
    Other,
}

fn class(c: char) -> Class {
    if is_han(c) {
        Class::Han
    } else if c.is_alphanumeric() {
        Class::Word
    } else {
        Class::Other
    }
}

/// Han ideographs: the unified blocks with their extensions and the compatibility blocks.
pub(crate) fn is_han(c: char) -> bool {
    matches!(
        c,
        '\u{3400}'..='\u{4DBF}'
            | '\u{4E00}'..='\u{9FFF}'
            | '\u{F900}'..='\u{FAFF}'
            | '\u{20000}'..='\u{2FA1F}'
            | '\u{30000}'..='\u{323AF}'
    )
}

/// Whether a token holds anything searchable (not pure punctuation or whitespace).
fn is_word(token: &str) -> bool {
    token.chars().any(char::is_alphanumeric)
}

/// Splits `text` into its terms, in text order (a term appears once per occurrence).
pub fn tokenize(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_term(text, |t| out.push(t.to_owned()));
    out
}

/// Calls `f` with each term of `text`, in text order, as [`tokenize`] returns them — without
/// allocating a string per occurrence (counting the terms of a record this way instead of
/// through [`tokenize`] saved most of the allocations of a keyword write). `f` must not
/// tokenize: it runs while this thread's stem memo is borrowed.
pub fn for_each_term(text: &str, mut f: impl FnMut(&str)) {
    let mut start = 0;
    let mut current = Class::Other;
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        let k = class(c);
        if k == current {
            continue;
        }
        emit(current, &text[start..i], &mut f);
        start = i;
        current = k;
    }
}

/// Calls `f` with the terms of one run of class `class`.
fn emit(class: Class, run: &str, f: &mut impl FnMut(&str)) {
    match class {
        Class::Han => {
            for t in JIEBA.cut_for_search(run, true) {
                if is_word(t.word) {
                    f(t.word);
                }
            }
        }
        Class::Word => {
            let lower = if run.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()) {
                Cow::Borrowed(run)
            } else {
                Cow::Owned(run.to_lowercase())
            };
            STEMS.with(|m| with_stem(&mut m.borrow_mut(), STEM_MEMO, &lower, f));
        }
        Class::Other => {}
    }
}

/// Calls `f` with the stem of `lower` (a lower-cased word), remembered in `memo` (cleared when
/// it holds `cap` words).
fn with_stem<R>(
    memo: &mut HashMap<String, String>,
    cap: usize,
    lower: &str,
    f: impl FnOnce(&str) -> R,
) -> R {
    if lower.len() > STEM_MEMO_WORD {
        return f(&STEMMER.stem(lower));
    }
    if let Some(s) = memo.get(lower) {
        return f(s);
    }
    let s = STEMMER.stem(lower).into_owned();
    if memo.len() >= cap {
        memo.clear();
    }
    let r = f(&s);
    memo.insert(lower.to_owned(), s);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memo answers what the stemmer would, across clears and for long words.
    #[test]
    fn remembered_stems_are_the_stemmers() {
        let words: Vec<String> = ["running", "runs", "databases", "indexed", "quickly", "the"]
            .iter()
            .map(|w| (*w).to_owned())
            .chain((0..200).map(|i| format!("generalizations{i}")))
            .chain(["internationalizationalisms".to_owned()])
            .collect();
        let mut memo = HashMap::new();
        for round in 0..3 {
            for w in &words {
                let stem = with_stem(&mut memo, 7, w, str::to_owned);
                assert_eq!(stem, STEMMER.stem(w), "{w}, round {round}");
                assert!(memo.len() <= 7);
            }
        }
        assert_eq!(
            tokenize("Running RUNS running Ünïcode ÜNÏCODE"),
            ["run", "run", "run", "ünïcode", "ünïcode"]
        );
    }

    #[test]
    fn english_is_lower_cased_and_stemmed() {
        assert_eq!(tokenize("Running runs"), ["run", "run"]);
        assert_eq!(
            tokenize("The DATABASES were indexed, quickly!"),
            ["the", "databas", "were", "index", "quick"]
        );
    }

    #[test]
    fn punctuation_and_whitespace_only_separate() {
        assert!(tokenize("").is_empty());
        assert!(tokenize("  ,.;!? —— 。，、！ \n\t").is_empty());
        assert_eq!(tokenize("snake_case-name"), ["snake", "case", "name"]);
        assert_eq!(tokenize("v2.0 in 2024"), ["v2", "0", "in", "2024"]);
    }

    #[test]
    fn chinese_is_segmented_into_words() {
        let t = tokenize("我们在北京大学学习机器学习");
        for w in ["北京", "大学", "机器", "学习"] {
            assert!(t.iter().any(|x| x == w), "{w} missing from {t:?}");
        }
        assert!(t.iter().all(|x| x.chars().all(is_han)), "{t:?}");
    }

    #[test]
    fn mixed_text_keeps_run_order() {
        let t = tokenize("Rust语言的Indexing性能，测试2024年。");
        let pos = |w: &str| t.iter().position(|x| x == w);
        for w in ["rust", "语言", "index", "性能", "测试", "2024", "年"] {
            assert!(pos(w).is_some(), "{w} missing from {t:?}");
        }
        assert!(pos("rust") < pos("语言"));
        assert!(pos("语言") < pos("index"));
        assert!(pos("index") < pos("性能"));
        assert!(pos("测试") < pos("2024"));
        assert!(pos("2024") < pos("年"));
    }

    #[test]
    fn query_and_text_agree_on_a_compound() {
        let text = tokenize("北京大学的图书馆");
        for q in tokenize("北京") {
            assert!(text.contains(&q), "{q} not in {text:?}");
        }
    }
}
