//! The extractive generator: offline, deterministic, no model. Every word it writes is a word
//! of its input.
//!
//! - **Leaf L0**: the most central sentence of the content ([`rank::centrality`] over the
//!   sentences of its paragraphs and list items, from [`ce_core::text::blocks`]), and a second
//!   one — the next in the diverse order, which prefers what the first does not say — when the
//!   first leaves more than half of the budget; in text order.
//! - **Leaf L1**: an outline — each heading with the best sentences of its section, added
//!   round by round (every section's best, then every section's second best, …) while the
//!   outline fits; without headings, the best sentences in text order.
//! - **Container L0 / L1**: the container's own content summarised as a leaf, then its
//!   children's abstracts, named (`name: abstract`), in the diverse order of the children's
//!   abstracts (the most central first, then those unlike the ones already chosen, so that ten
//!   similar notes do not crowd out the rest); the L1 lists them one per line, keeping room
//!   for a last line that counts those left out (`- N more: a, b, …`, as many names as fit).
//!   Only as much of the order is computed as the budgets use: a folder of 10,000 children
//!   costs a few dozen passes over their abstracts, not 10,000².
//!
//! A sentence longer than the whole budget is cut at a word boundary and ends with `…`.
//! Content without any sentence (only code, tables or punctuation) derives nothing.

pub mod rank;

use std::time::Duration;

use ce_core::text::{Block, BlockKind, blocks, is_cjk};

use crate::generator::{
    Budget, Child, DeriveError, DeriveInput, Derived, Generator, GeneratorIdentity,
};
use rank::centrality;

/// The version of the algorithm; bump it when its output changes, so that stored layers
/// derived by an older version are derived again.
pub const VERSION: u32 = 2;

/// The weight of a sentence's centrality against its overlap with the sentences already
/// chosen (a summary repeats itself only when the text does).
const SENTENCE_RELEVANCE: f64 = 0.7;

/// The same for a container's children: coverage counts more (ten similar notes are one
/// topic of the folder, not ten).
const CHILD_RELEVANCE: f64 = 0.3;

/// The extractive generator.
#[derive(Debug, Clone)]
pub struct Extractive {
    identity: GeneratorIdentity,
}

impl Default for Extractive {
    fn default() -> Self {
        Extractive {
            identity: GeneratorIdentity {
                generator: "extractive".into(),
                version: VERSION,
                model: None,
            },
        }
    }
}

impl Generator for Extractive {
    fn identity(&self) -> &GeneratorIdentity {
        &self.identity
    }

    fn derive(
        &self,
        inputs: &[DeriveInput],
        budget: Budget,
        _timeout: Duration,
    ) -> Vec<Result<Derived, DeriveError>> {
        inputs.iter().map(|i| Ok(derive_one(i, budget))).collect()
    }
}

/// Derives one input (the generator's whole work; pure).
pub fn derive_one(input: &DeriveInput, budget: Budget) -> Derived {
    let (abstract_text, overview) = match input {
        DeriveInput::Leaf { content } => leaf(content, budget),
        DeriveInput::Container { content, children } => container(content, children, budget),
    };
    Derived {
        abstract_text,
        overview,
        tokens_in: 0,
        tokens_out: 0,
    }
}

/// A sentence of the body with its section.
struct Candidate<'a> {
    text: &'a str,
    ordinal: usize,
    /// Index into the outline's sections.
    section: usize,
}

/// One heading's part of a text (the part before the first heading has none).
struct Section<'a> {
    heading: Option<(u8, &'a str)>,
    /// Index of the section of its parent heading.
    parent: Option<usize>,
}

fn leaf(content: &str, budget: Budget) -> (Option<String>, Option<String>) {
    let blocks = blocks(content);
    let (sections, candidates, order) = sections_and_candidates(&blocks);
    if candidates.is_empty() {
        // Headings only: the title is the abstract, the headings the outline.
        let titles: Vec<&str> = sections
            .iter()
            .filter_map(|s| s.heading.map(|h| h.1))
            .collect();
        let Some(first) = titles.first() else {
            return (None, None);
        };
        let outline = outline(&sections, &candidates, &[], budget.l1_chars)
            .unwrap_or_else(|| truncate(first, budget.l1_chars));
        return (Some(truncate(first, budget.l0_chars)), Some(outline));
    }
    let l0 = abstract_of(&candidates, &order, budget.l0_chars);
    let l1 = overview_of(&sections, &candidates, &order, budget.l1_chars);
    (Some(l0), l1)
}

/// The sections of `blocks`, the sentences of their paragraphs and list items, and those in
/// [`rank::Ranking::diverse_order`].
fn sections_and_candidates(blocks: &[Block]) -> (Vec<Section<'_>>, Vec<Candidate<'_>>, Vec<usize>) {
    let mut sections = vec![Section {
        heading: None,
        parent: None,
    }];
    // Block index of a heading → its section.
    let mut section_of_block = std::collections::BTreeMap::new();
    let mut body = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match b.kind {
            BlockKind::Heading(level) => {
                let parent = b.section.and_then(|p| section_of_block.get(&p).copied());
                section_of_block.insert(i, sections.len());
                sections.push(Section {
                    heading: Some((level, b.text.as_str())),
                    parent: parent.or(Some(0)),
                });
            }
            BlockKind::Paragraph | BlockKind::ListItem => {
                let section = b
                    .section
                    .and_then(|h| section_of_block.get(&h).copied())
                    .unwrap_or(0);
                body.extend(b.sentences.iter().map(|s| (s, section)));
            }
            BlockKind::Code | BlockKind::Table => {}
        }
    }
    let texts: Vec<&str> = body.iter().map(|(s, _)| s.text.as_str()).collect();
    let order = centrality(&texts)
        .diverse_order(SENTENCE_RELEVANCE)
        .collect();
    let candidates = body
        .into_iter()
        .map(|(s, section)| Candidate {
            text: s.text.as_str(),
            ordinal: s.ordinal,
            section,
        })
        .collect();
    (sections, candidates, order)
}

/// The best sentence, and the next best that fits when the first leaves more than half of
/// `max` unused; in text order.
fn abstract_of(candidates: &[Candidate<'_>], order: &[usize], max: usize) -> String {
    let best = &candidates[order[0]];
    if chars(best.text) > max {
        return truncate(best.text, max);
    }
    let mut picked = vec![order[0]];
    if chars(best.text) * 2 < max {
        for &i in &order[1..] {
            let mut two = vec![order[0], i];
            two.sort_by_key(|&k| candidates[k].ordinal);
            if chars(&join(two.iter().map(|&k| candidates[k].text))) <= max {
                picked = two;
                break;
            }
        }
    }
    join(picked.iter().map(|&k| candidates[k].text))
}

/// The outline: sentences added round by round (each section's best first) while it fits.
fn overview_of(
    sections: &[Section<'_>],
    candidates: &[Candidate<'_>],
    order: &[usize],
    max: usize,
) -> Option<String> {
    // Each section's candidates, best first.
    let mut ranked: Vec<Vec<usize>> = vec![Vec::new(); sections.len()];
    for &i in order {
        ranked[candidates[i].section].push(i);
    }
    let mut selected = vec![false; candidates.len()];
    let mut any = false;
    for round in 0.. {
        let mut added = false;
        let mut exhausted = true;
        for list in &ranked {
            let Some(&i) = list.get(round) else {
                continue;
            };
            exhausted = false;
            selected[i] = true;
            if outline(sections, candidates, &selected, max).is_some() {
                added = true;
                any = true;
            } else {
                selected[i] = false;
            }
        }
        if exhausted || (!added && round > 0) {
            break;
        }
    }
    if !any {
        // Not even one sentence fits with its headings: the best sentence, cut to fit.
        return Some(truncate(candidates[order[0]].text, max));
    }
    outline(sections, candidates, &selected, max)
}

/// Renders the headings whose sections (or subsections) hold a selected sentence, each with
/// its selected sentences in text order; with no sentences at all, every heading. `None` when
/// the result is longer than `max` or empty.
fn outline(
    sections: &[Section<'_>],
    candidates: &[Candidate<'_>],
    selected: &[bool],
    max: usize,
) -> Option<String> {
    let headings_only = candidates.is_empty();
    let mut shown = vec![headings_only; sections.len()];
    for (c, _) in candidates.iter().zip(selected).filter(|(_, s)| **s) {
        let mut s = Some(c.section);
        while let Some(i) = s {
            shown[i] = true;
            s = sections[i].parent;
        }
    }
    let mut lines = Vec::new();
    for (i, section) in sections.iter().enumerate() {
        if !shown[i] {
            continue;
        }
        if let Some((level, title)) = section.heading {
            lines.push(format!("{} {title}", "#".repeat(usize::from(level))));
        }
        let mut texts: Vec<&Candidate<'_>> = candidates
            .iter()
            .zip(selected)
            .filter(|(c, s)| **s && c.section == i)
            .map(|(c, _)| c)
            .collect();
        texts.sort_by_key(|c| c.ordinal);
        if !texts.is_empty() {
            lines.push(join(texts.iter().map(|c| c.text)));
        }
    }
    if headings_only {
        // Every heading that fits, in order.
        let mut out = String::new();
        for l in &lines {
            let next = if out.is_empty() {
                l.clone()
            } else {
                format!("{out}\n{l}")
            };
            if chars(&next) > max {
                break;
            }
            out = next;
        }
        return (!out.is_empty()).then_some(out);
    }
    let out = lines.join("\n");
    (!out.is_empty() && chars(&out) <= max).then_some(out)
}

fn container(
    content: &str,
    children: &[Child],
    budget: Budget,
) -> (Option<String>, Option<String>) {
    let own_budget = Budget {
        l0_chars: budget.l0_chars,
        l1_chars: budget.l1_chars / 2,
    };
    let (own_l0, own_l1) = if content.trim().is_empty() {
        (None, None)
    } else {
        leaf(content, own_budget)
    };
    let named: Vec<&Child> = children
        .iter()
        .filter(|c| !c.abstract_text.trim().is_empty())
        .collect();
    if own_l0.is_none() && named.is_empty() {
        return (None, None);
    }
    let ranking = centrality(
        &named
            .iter()
            .map(|c| c.abstract_text.as_str())
            .collect::<Vec<_>>(),
    );
    // Read only as far as the budgets need: a folder of 10,000 children lists a few dozen.
    let mut order = Taken::new(ranking.diverse_order(CHILD_RELEVANCE));
    let entry = |c: &Child| format!("{}: {}", c.name, c.abstract_text.trim());

    // L0: own abstract, then the most representative children while they fit.
    let mut l0_parts: Vec<String> = own_l0.iter().cloned().collect();
    let mut k = 0;
    while let Some(i) = order.get(k) {
        let mut next = l0_parts.clone();
        next.push(entry(named[i]));
        if chars(&next.join("; ")) > budget.l0_chars {
            break;
        }
        l0_parts = next;
        k += 1;
    }
    let l0 = match order.get(0) {
        Some(first) if l0_parts.is_empty() => truncate(&entry(named[first]), budget.l0_chars),
        _ => l0_parts.join("; "),
    };

    // L1: own overview, one line per child while they fit, then the names of the others.
    let mut lines: Vec<String> = own_l1.into_iter().collect();
    let fits = |lines: &[String]| chars(&lines.join("\n")) <= budget.l1_chars;
    let unnamed: Vec<&str> = children
        .iter()
        .filter(|c| c.abstract_text.trim().is_empty())
        .map(|c| c.name.as_str())
        .collect();
    let mut listed = 0;
    while let Some(i) = order.get(listed) {
        lines.push(format!("- {}", entry(named[i])));
        // Room is kept for the line that counts the children after this one.
        let after = named.len() + unnamed.len() - listed - 1;
        let count = (after > 0).then(|| format!("- {after} more"));
        if fits(&[lines.as_slice(), count.as_slice()].concat()) {
            listed += 1;
        } else {
            lines.pop();
            break;
        }
    }
    let left_out = named.len() - listed + unnamed.len();
    if left_out > 0 {
        let head = format!("- {left_out} more:");
        let with = |line: String| [lines.as_slice(), &[line]].concat();
        // Each name takes at least 3 characters (one, and `, `): only then could all fit.
        let could_all_fit = 3 * left_out <= budget.l1_chars;
        let mut names = (listed..)
            .map_while(|k| order.get(k))
            .map(|i| named[i].name.as_str())
            .chain(unnamed.iter().copied());
        // The whole order is read only when every name could fit.
        let all: Option<Vec<&str>> = could_all_fit.then(|| names.by_ref().collect());
        let whole = all
            .as_ref()
            .map(|all| format!("{head} {}", all.join(", ")))
            .filter(|line| fits(&with(line.clone())));
        let line = match whole {
            Some(line) => line,
            None => {
                // As many names as fit, then `…`.
                let mut shown: Vec<&str> = Vec::new();
                for name in all.into_iter().flatten().chain(names) {
                    shown.push(name);
                    if !fits(&with(format!("{head} {}, …", shown.join(", ")))) {
                        shown.pop();
                        break;
                    }
                }
                if shown.is_empty() {
                    head.trim_end_matches(':').to_owned()
                } else {
                    format!("{head} {}, …", shown.join(", "))
                }
            }
        };
        if fits(&with(line.clone())) {
            lines.push(line);
        }
    }
    let l1 = lines.join("\n");
    (Some(l0), (!l1.is_empty()).then_some(l1))
}

/// The items of an iterator, kept as they are read, so that several passes read it once and
/// only as far as the furthest of them.
struct Taken<I> {
    iter: I,
    taken: Vec<usize>,
}

impl<I: Iterator<Item = usize>> Taken<I> {
    fn new(iter: I) -> Self {
        Taken {
            iter,
            taken: Vec::new(),
        }
    }

    /// The `k`th item, reading the iterator up to it.
    fn get(&mut self, k: usize) -> Option<usize> {
        while self.taken.len() <= k {
            self.taken.push(self.iter.next()?);
        }
        Some(self.taken[k])
    }
}

/// The length in characters.
fn chars(s: &str) -> usize {
    s.chars().count()
}

/// Joins sentences with a space, or without one after a CJK sentence.
fn join<'a>(parts: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::new();
    for p in parts {
        if !out.is_empty() && !out.chars().next_back().is_some_and(is_cjk) {
            out.push(' ');
        }
        out.push_str(p);
    }
    out
}

/// `s` cut to at most `max` characters, at a word boundary when there is one in the second
/// half, ending with `…` when cut.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if chars(s) <= max {
        return s.to_owned();
    }
    if max == 0 {
        return String::new();
    }
    let keep: String = s.chars().take(max - 1).collect();
    if keep.trim().is_empty() {
        // No room for a word and the ellipsis: the first characters, unmarked.
        return s.chars().take(max).collect();
    }
    let cut = match keep.rfind(char::is_whitespace) {
        Some(i) if chars(&keep[..i]) * 2 >= max => keep[..i].trim_end().to_owned(),
        _ => keep,
    };
    format!("{cut}…")
}

#[cfg(test)]
mod tests;
