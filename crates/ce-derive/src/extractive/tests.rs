use super::*;

fn derive(content: &str, budget: Budget) -> Derived {
    derive_one(
        &DeriveInput::Leaf {
            content: content.into(),
        },
        budget,
    )
}

#[test]
fn nothing_to_summarise_derives_nothing() {
    for content in [
        "",
        "   \n\n",
        "```\nfn main() {}\n```",
        "| a | b |\n|---|---|",
        "... —— !!!",
    ] {
        let d = derive(content, Budget::default());
        assert_eq!((d.abstract_text, d.overview), (None, None), "{content:?}");
    }
}

#[test]
fn truncation_cuts_at_a_word_and_says_so() {
    assert_eq!(truncate("short", 10), "short");
    assert_eq!(truncate("one two three four", 12), "one two…");
    assert_eq!(truncate("上下文数据库保存记忆", 5), "上下文数…");
    assert_eq!(truncate("abc", 0), "");
}

mod properties {
    use std::collections::BTreeSet;

    use ce_core::text::tokenize;
    use proptest::prelude::*;

    use super::*;

    /// Lines of words, punctuation, headings, list items and Chinese, like real notes.
    fn text() -> impl Strategy<Value = String> {
        let word = prop::sample::select(vec![
            "index",
            "vector",
            "pool",
            "server",
            "the",
            "of",
            "3.14",
            "e.g.",
            "Dr.",
            "检索",
            "向量",
            "数据库",
            "。",
            "！",
            ".",
            "?",
            ",",
            "…",
            "\"",
            ")",
        ]);
        let line = (
            prop::sample::select(vec!["", "", "", "# ", "## ", "- ", "1. ", "```"]),
            prop::collection::vec(word, 0..12),
        )
            .prop_map(|(lead, words)| format!("{lead}{}", words.join(" ")));
        prop::collection::vec(line, 0..20).prop_map(|lines| lines.join("\n"))
    }

    fn budget() -> impl Strategy<Value = Budget> {
        (1usize..300, 1usize..1200).prop_map(|(l0_chars, l1_chars)| Budget { l0_chars, l1_chars })
    }

    proptest! {
        /// Within budget, deterministic, and made of the input's own words.
        #[test]
        fn leaf_layers_fit_repeat_and_invent_nothing(content in text(), b in budget()) {
            let input = DeriveInput::Leaf { content: content.clone() };
            let d = derive_one(&input, b);
            prop_assert_eq!(&d, &derive_one(&input, b));
            let words: BTreeSet<String> = tokenize(&content).into_iter().collect();
            for (layer, max) in [(&d.abstract_text, b.l0_chars), (&d.overview, b.l1_chars)] {
                if let Some(t) = layer {
                    prop_assert!(t.chars().count() <= max, "{t:?} over {max}");
                    prop_assert!(!t.trim().is_empty());
                    // The last word may be cut short by truncation: a prefix of an input
                    // word (stems compared), never a new word.
                    let mut terms = tokenize(t.trim_end_matches('…'));
                    if let Some(last) = terms.pop() {
                        prop_assert!(
                            words.iter().any(|w| w.starts_with(&last) || last.starts_with(w.as_str())),
                            "{last:?} is not in the input"
                        );
                    }
                    for term in terms {
                        prop_assert!(words.contains(&term), "{term:?} is not in the input");
                    }
                }
            }
            prop_assert_eq!(d.abstract_text.is_none(), d.overview.is_none());
        }

        /// A roll-up fits its budget and names only its children.
        #[test]
        fn rollups_fit_and_name_only_children(
            abstracts in prop::collection::vec(text(), 0..30),
            b in budget(),
        ) {
            let children: Vec<Child> = abstracts
                .iter()
                .enumerate()
                .map(|(i, a)| Child { name: format!("c{i}"), abstract_text: a.clone() })
                .collect();
            let input = DeriveInput::Container { content: String::new(), children };
            let d = derive_one(&input, b);
            prop_assert_eq!(&d, &derive_one(&input, b));
            if let Some(l0) = &d.abstract_text {
                prop_assert!(l0.chars().count() <= b.l0_chars);
            }
            if let Some(l1) = &d.overview {
                prop_assert!(l1.chars().count() <= b.l1_chars);
            }
            let any = abstracts.iter().any(|a| !a.trim().is_empty());
            prop_assert_eq!(d.abstract_text.is_some(), any);
        }
    }
}

fn folder(abstracts: &[String], budget: Budget) -> Derived {
    let children = abstracts
        .iter()
        .enumerate()
        .map(|(i, a)| Child {
            name: format!("c{i}"),
            abstract_text: a.clone(),
        })
        .collect();
    derive_one(
        &DeriveInput::Container {
            content: String::new(),
            children,
        },
        budget,
    )
}

#[test]
fn a_folder_names_the_children_left_out_all_or_as_many_as_fit() {
    let abstracts: Vec<String> = [
        "Vector indexes store embeddings.",
        "Keyword indexes store postings.",
        "",
    ]
    .map(String::from)
    .to_vec();
    let budget = Budget {
        l0_chars: 40,
        l1_chars: 60,
    };
    let l1 = folder(&abstracts, budget).overview.expect("an overview");
    let lines: Vec<&str> = l1.lines().collect();
    assert_eq!(lines.len(), 2, "{l1}");
    assert!(
        lines[0].starts_with("- c0: ") || lines[0].starts_with("- c1: "),
        "{l1}"
    );
    let other = if lines[0].starts_with("- c0") {
        "c1"
    } else {
        "c0"
    };
    assert_eq!(lines[1], format!("- 2 more: {other}, c2"), "{l1}");

    // Thousands of children: a few listed, the count of all the others, the names that fit.
    let words = [
        "index", "vector", "graph", "queue", "lease", "token", "shard", "cache",
    ];
    let abstracts: Vec<String> = (0..3000)
        .map(|i| format!("{} {} note {i}.", words[i % 8], words[(i / 8) % 8]))
        .collect();
    let budget = Budget::default();
    let d = folder(&abstracts, budget);
    let l1 = d.overview.expect("an overview");
    assert!(l1.chars().count() <= budget.l1_chars);
    let listed: Vec<&str> = l1
        .lines()
        .filter(|l| !l.contains(" more: "))
        .map(|l| {
            l.trim_start_matches("- ")
                .split(':')
                .next()
                .expect("a name")
        })
        .collect();
    assert!(!listed.is_empty(), "{l1}");
    let more = l1.lines().last().expect("a last line");
    assert!(
        more.starts_with(&format!("- {} more: ", 3000 - listed.len())) && more.ends_with(", …"),
        "{more}"
    );
    let named: Vec<&str> = more
        .split_once(" more: ")
        .expect("names")
        .1
        .trim_end_matches(", …")
        .split(", ")
        .collect();
    let mut all: Vec<&str> = listed.iter().chain(&named).copied().collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len(),
        listed.len() + named.len(),
        "a child named twice: {l1}"
    );
    assert!(all.iter().all(|n| {
        abstracts
            .get(n[1..].parse::<usize>().expect("cN"))
            .is_some()
    }));
}
