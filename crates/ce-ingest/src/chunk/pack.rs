//! Step 2: packing units into chunks, with overlap and the merging of small sections (see
//! the module documentation of [`super`]).

use super::units::{Units, pieces};
use super::{Chunk, ChunkOptions, PageSpan, TokenCount};
use crate::document::{BlockKind, ParsedDocument};

/// A chunk being built: bytes `start..units[last].end`.
#[derive(Debug, Clone)]
struct Open {
    /// Where its text starts (inside unit `from` when it opens with an overlap).
    start: usize,
    /// The unit its text starts in.
    from: usize,
    /// Its first unit of its own (not overlap).
    own: usize,
    /// Its last unit.
    last: usize,
    /// Its tokens: exact, or an estimate (a sum) while it grows.
    tokens: usize,
}

/// A closed chunk, before its text and meta are filled in.
struct Draft {
    open: Open,
    end: usize,
}

struct Packer<'a> {
    text: &'a str,
    doc: &'a ParsedDocument,
    u: &'a Units,
    counter: &'a dyn TokenCount,
    o: &'a ChunkOptions,
}

/// Packs `units` of `doc` into chunks.
pub(super) fn pack(
    doc: &ParsedDocument,
    units: &Units,
    counter: &dyn TokenCount,
    options: &ChunkOptions,
) -> Vec<Chunk> {
    let p = Packer {
        text: &doc.text,
        doc,
        u: units,
        counter,
        o: options,
    };
    let drafts = p.drafts();
    drafts
        .into_iter()
        .enumerate()
        .scan(None::<usize>, |prev_end, (index, d)| {
            let chunk = p.finish(index, d, *prev_end);
            *prev_end = Some(chunk.range.end);
            Some(chunk)
        })
        .collect()
}

impl Packer<'_> {
    fn count(&self, start: usize, end: usize) -> usize {
        self.counter.count_tokens(&self.text[start..end])
    }

    fn unit_end(&self, i: usize) -> usize {
        self.u.units[i].range.end
    }

    fn section(&self, i: usize) -> usize {
        self.u.units[i].section
    }

    fn fresh(&self, i: usize) -> Open {
        Open {
            start: self.u.units[i].range.start,
            from: i,
            own: i,
            last: i,
            tokens: self.u.units[i].tokens,
        }
    }

    /// The tokens of `open` extended by unit `i`, if that fits: a sum of counts when the sum
    /// fits, else the exact count of the extended text.
    fn fits(&self, open: &Open, i: usize) -> Option<usize> {
        let max = self.o.max_tokens;
        let sum = open.tokens + self.u.units[i].tokens;
        if sum <= max {
            return Some(sum);
        }
        let exact = self.count(open.start, self.unit_end(i));
        (exact <= max).then_some(exact)
    }

    /// Closes `open`: counts its text exactly and, should a counter not be subadditive and
    /// the sum have fitted where the text does not, gives back units from its end. With
    /// `more` (units follow), headings at its end are given back too: a heading opens the
    /// next chunk rather than ending this one without its body.
    fn close(&self, mut open: Open, more: bool) -> Draft {
        if more {
            while open.last > open.own && self.is_heading(open.last) {
                open.last -= 1;
            }
        }
        loop {
            let tokens = self.count(open.start, self.unit_end(open.last));
            if tokens <= self.o.max_tokens || open.last == open.own {
                open.tokens = tokens;
                let end = self.unit_end(open.last);
                return Draft { open, end };
            }
            open.last -= 1;
        }
    }

    fn is_heading(&self, i: usize) -> bool {
        let unit = &self.u.units[i];
        matches!(self.doc.blocks[unit.block].kind, BlockKind::Heading { .. })
    }

    /// Opens the chunk after `prev` at unit `i` of the same section, starting with the
    /// longest run of whole pieces at the end of `prev` within `overlap_tokens`.
    fn with_overlap(&self, prev: &Draft, i: usize) -> Open {
        let fresh = self.fresh(i);
        if self.o.overlap_tokens == 0 {
            return fresh;
        }
        let section = self.section(i);
        let mut best: Option<(usize, usize)> = None;
        'units: for k in (prev.open.from..=prev.open.last).rev() {
            let unit = &self.u.units[k];
            if unit.section != section {
                break;
            }
            let kind = &self.doc.blocks[unit.block].kind;
            let mut starts: Vec<usize> = pieces(self.text, unit.range.clone(), kind)
                .into_iter()
                .map(|r| r.start)
                .collect();
            if starts.first() != Some(&unit.range.start) {
                starts.insert(0, unit.range.start);
            }
            for &s in starts.iter().rev() {
                if s <= prev.open.start {
                    // Never repeat the whole previous chunk.
                    break 'units;
                }
                if self.count(s, prev.end) > self.o.overlap_tokens {
                    break 'units;
                }
                best = Some((s, k));
            }
        }
        let Some((start, from)) = best else {
            return fresh;
        };
        let tokens = self.count(start, self.unit_end(i));
        if tokens > self.o.max_tokens {
            return fresh;
        }
        Open {
            start,
            from,
            own: i,
            last: i,
            tokens,
        }
    }

    /// Packs all units into drafts (module documentation, step 2).
    fn drafts(&self) -> Vec<Draft> {
        let n = self.u.units.len();
        let mut out: Vec<Draft> = Vec::new();
        let mut open: Option<Open> = None;
        let mut i = 0;
        loop {
            let Some(mut o) = open.take() else {
                if i >= n {
                    break;
                }
                open = Some(self.fresh(i));
                i += 1;
                continue;
            };
            if i < n {
                let boundary = self.section(o.last) != self.section(i);
                let keep_going = !boundary || self.merges(&o, i);
                if let Some(tokens) = keep_going.then(|| self.fits(&o, i)).flatten() {
                    o.last = i;
                    o.tokens = tokens;
                    open = Some(o);
                    i += 1;
                    continue;
                }
            }
            // Closing may give units back (headings; a counter that is not subadditive), so
            // packing goes on after the draft's last unit, even past the end of the input.
            let draft = self.close(o, i < n);
            i = draft.open.last + 1;
            if i < n {
                open = Some(if self.section(draft.open.last) == self.section(i) {
                    self.with_overlap(&draft, i)
                } else {
                    self.fresh(i)
                });
                i += 1;
            }
            out.push(draft);
        }
        out
    }

    /// Whether the section starting at unit `i` joins `open`: when one of the two is small
    /// (under `min_tokens`) and the whole section fits in it.
    fn merges(&self, open: &Open, i: usize) -> bool {
        let section = self.section(i);
        let end = (i..self.u.units.len())
            .take_while(|&k| self.section(k) == section)
            .last()
            .unwrap_or(i);
        let incoming: usize = self.u.units[i..=end].iter().map(|u| u.tokens).sum();
        if open.tokens >= self.o.min_tokens && incoming >= self.o.min_tokens {
            return false;
        }
        open.tokens + incoming <= self.o.max_tokens
            || self.count(open.start, self.unit_end(end)) <= self.o.max_tokens
    }

    /// The chunk of draft `d`.
    fn finish(&self, index: usize, d: Draft, prev_end: Option<usize>) -> Chunk {
        let units = &self.u.units[d.open.from..=d.open.last];
        let mut heading_path: Option<Vec<String>> = None;
        let mut pages: Option<PageSpan> = None;
        for unit in units {
            let path = &self.u.sections[unit.section];
            heading_path = Some(match heading_path {
                None => path.clone(),
                Some(p) => p
                    .into_iter()
                    .zip(path)
                    .take_while(|(a, b)| a == *b)
                    .map(|(a, _)| a)
                    .collect(),
            });
            if let Some(page) = self.doc.blocks[unit.block].page {
                pages = Some(match pages {
                    None => PageSpan {
                        first: page,
                        last: page,
                    },
                    Some(s) => PageSpan {
                        first: s.first.min(page),
                        last: s.last.max(page),
                    },
                });
            }
        }
        let range = d.open.start..d.end;
        Chunk {
            index,
            text: self.text[range.clone()].to_owned(),
            overlap: prev_end.map_or(0, |e| e.saturating_sub(range.start)),
            range,
            heading_path: heading_path.unwrap_or_default(),
            pages,
            tokens: d.open.tokens,
        }
    }
}
