//! The generated corpus of `ce bench ingest --source kb`: files of mixed formats (Markdown,
//! HTML, PDF, Rust, Python) of 1–20 KB in nested directories, deterministic from a seed.
//!
//! Every document is a plan (title, sections, each with a byte budget) drawn from the
//! document's own random stream, and every section's text from a stream of its own, so an
//! edit (`rev` > 0) rewrites exactly one section and leaves the others byte for byte — the
//! chunks that do not contain it keep their texts, as in a real edit. Sentences are drawn
//! from word lists (about 300 words, several sentence shapes), so no two chunks share a text
//! and the embedding cache cannot hide the embedding cost. Sizes are log-uniform between
//! 1 and 20 KB (more small files than large ones, as in real document folders). PDFs are
//! written by lopdf (the PDF library under the parser): one or more pages per section, the
//! standard Helvetica font, one text line per `Tj`.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use anyhow::Context as _;

/// Smallest and largest target sizes of a file, in bytes.
const MIN_BYTES: f64 = 1024.0;
const MAX_BYTES: f64 = 20.0 * 1024.0;
/// Files per leaf directory (directories are `gNN/sNN/`, ten leaves per top directory).
pub const FILES_PER_DIR: usize = 100;

/// A file format of the corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `.md`
    Markdown,
    /// `.html`
    Html,
    /// `.pdf`
    Pdf,
    /// `.rs`
    Rust,
    /// `.py`
    Python,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 5] = [
        Kind::Markdown,
        Kind::Html,
        Kind::Pdf,
        Kind::Rust,
        Kind::Python,
    ];

    /// The file extension (also the kind's name in the report).
    pub fn ext(self) -> &'static str {
        match self {
            Kind::Markdown => "md",
            Kind::Html => "html",
            Kind::Pdf => "pdf",
            Kind::Rust => "rs",
            Kind::Python => "py",
        }
    }
}

/// SplitMix64: a small, well-mixed, seedable generator (the bench needs reproducible
/// streams, not cryptographic ones).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A stream for `parts` (seed, document, section, revision…), mixed so that streams of
    /// neighbouring parts are unrelated.
    pub fn new(parts: &[u64]) -> Rng {
        let mut r = Rng(0x243f_6a88_85a3_08d3);
        for p in parts {
            r.0 ^= p.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            r.next_u64();
        }
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// A float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn pick<'a>(&mut self, words: &[&'a str]) -> &'a str {
        words[self.below(words.len())]
    }
}

static NOUNS: LazyLock<Vec<&str>> = LazyLock::new(|| {
    words(
        "
    account agent archive audit backlog balance batch bridge budget buffer cache catalog
    channel checkpoint client cluster commit compiler contract counter customer dashboard
    dataset deadline decision deployment design device document draft engine estimate event
    experiment feature field filter forecast framework gateway graph handler harbor history
    index inventory invoice journal kernel ledger library license market meeting memory
    message method metric migration model module network notebook operator order outline
    package partner payload pipeline platform policy portfolio printer process product profile
    project protocol query queue record region release report request resource review river
    router sample schedule schema sensor server service session shipment signal snapshot
    source specification storage strategy stream supplier survey table team template tenant
    ticket timeline token transaction tree upgrade vendor version warehouse window worker
    workflow
",
    )
});

static ADJECTIVES: LazyLock<Vec<&str>> = LazyLock::new(|| {
    words(
        "
    accurate active annual automatic available brief careful central clear complete complex
    consistent critical current daily default detailed direct durable early efficient empty
    entire external familiar final flexible formal fresh full global gradual hidden historic
    idle incremental initial internal large late legacy linear local main manual minor modern
    monthly narrow native nested new normal official old open optional ordinary partial
    pending periodic plain primary private public quarterly quiet random rapid recent regional
    regular remote reliable robust rough safe secondary secure separate shared short silent
    simple single slow small stable stale steady strict strong temporary typical uniform
    unique urgent valid visible weekly wide
",
    )
});

static VERBS: LazyLock<Vec<&str>> = LazyLock::new(|| {
    words(
        "
    accepts adjusts allocates analyses announces approves assigns balances blocks builds
    captures changes checks collects combines compares compiles confirms connects contains
    converts copies creates defines delays delivers describes detects drains drops enables
    encodes estimates exports extends filters finds follows forwards groups handles holds
    ignores imports improves includes indexes inspects joins keeps limits lists loads locks
    measures merges moves notifies opens orders parses prepares publishes reads records
    reduces refreshes rejects removes renews repairs replaces reports requests resolves
    restores returns reviews routes samples saves schedules searches selects sends settles
    shares sorts splits starts stores summarises supports tracks transfers updates validates
    verifies watches writes
",
    )
});

static ADVERBS: LazyLock<Vec<&str>> = LazyLock::new(|| {
    words(
        "
    quickly slowly carefully quietly usually rarely often always never eventually gradually
    immediately automatically manually reliably safely directly together again already
",
    )
});

static PREPOSITIONS: LazyLock<Vec<&str>> = LazyLock::new(|| {
    words(
        "
    after before behind beside beyond during for from inside into near under with without
    across around through between
",
    )
});

static CONNECTIVES: LazyLock<Vec<&str>> = LazyLock::new(|| {
    words(
        "
    because|while|although|unless|until|since|whenever|so that|even though|as soon as
",
    )
});

/// The words of `list`: separated by `|` when it has one, else by whitespace.
fn words(list: &'static str) -> Vec<&'static str> {
    if list.contains('|') {
        list.split('|').map(str::trim).collect()
    } else {
        list.split_whitespace().collect()
    }
}

/// One sentence of one of several shapes.
fn sentence(r: &mut Rng) -> String {
    let np = |r: &mut Rng| format!("the {} {}", r.pick(&ADJECTIVES), r.pick(&NOUNS));
    let s = match r.below(6) {
        0 => format!("{} {} {}", np(r), r.pick(&VERBS), np(r)),
        1 => format!(
            "{} {} {} {} {}",
            np(r),
            r.pick(&ADVERBS),
            r.pick(&VERBS),
            np(r),
            format_args!("{} {}", r.pick(&PREPOSITIONS), np(r))
        ),
        2 => format!(
            "{} {} {}, {} {} {} {}",
            np(r),
            r.pick(&VERBS),
            np(r),
            r.pick(&CONNECTIVES),
            np(r),
            r.pick(&VERBS),
            np(r)
        ),
        3 => format!(
            "{} {} {} {} {} {}",
            r.pick(&PREPOSITIONS),
            np(r),
            np(r),
            r.pick(&VERBS),
            r.between(2, 9000),
            r.pick(&NOUNS).to_owned() + "s"
        ),
        4 => format!(
            "every {} {} {} {} {}",
            r.pick(&NOUNS),
            r.pick(&VERBS),
            np(r),
            r.pick(&ADVERBS),
            format_args!("{} {}", r.pick(&PREPOSITIONS), np(r))
        ),
        _ => format!(
            "{} and {} {} {}",
            np(r),
            np(r),
            r.pick(&VERBS).trim_end_matches('s'),
            np(r)
        ),
    };
    let mut c = s.chars();
    let first = c.next().map(|f| f.to_ascii_uppercase()).unwrap_or('T');
    let end = if r.below(12) == 0 { '?' } else { '.' };
    format!("{first}{}{end}", c.as_str())
}

/// A title of three to five words, capitalised.
fn title(r: &mut Rng) -> String {
    let n = r.between(3, 5);
    (0..n)
        .map(|k| {
            let w = if k % 2 == 0 {
                r.pick(&ADJECTIVES)
            } else {
                r.pick(&NOUNS)
            };
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One section of a document: a heading and its paragraphs (sentences).
#[derive(Debug, Clone)]
pub struct Section {
    /// The heading.
    pub heading: String,
    /// Paragraphs, each a list of sentences.
    pub paragraphs: Vec<Vec<String>>,
}

/// A document's text before rendering.
#[derive(Debug, Clone)]
pub struct Doc {
    /// The title.
    pub title: String,
    /// The sections, in order.
    pub sections: Vec<Section>,
}

/// Where document `i` lives and what it is.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its number.
    pub i: usize,
    /// Its format.
    pub kind: Kind,
    /// Its path relative to the corpus root.
    pub rel: PathBuf,
    /// Its target size in bytes.
    pub target: usize,
}

/// The corpus plan: `docs` entries from `seed`.
pub fn plan(seed: u64, docs: usize) -> Vec<Entry> {
    (0..docs)
        .map(|i| {
            let mut r = Rng::new(&[seed, i as u64]);
            // Every block of 20 files holds each format in the same proportions (7 Markdown,
            // 5 HTML, 3 PDF, 3 Rust, 2 Python), shuffled within the block.
            let kind = match block_slot(seed, i) {
                0..=6 => Kind::Markdown,
                7..=11 => Kind::Html,
                12..=14 => Kind::Pdf,
                15..=17 => Kind::Rust,
                _ => Kind::Python,
            };
            let target = (MIN_BYTES * (MAX_BYTES / MIN_BYTES).powf(r.unit())) as usize;
            let leaf = i / FILES_PER_DIR;
            let rel = PathBuf::from(format!("g{:02}", leaf / 10))
                .join(format!("s{:02}", leaf % 10))
                .join(format!("doc-{i:05}.{}", kind.ext()));
            Entry {
                i,
                kind,
                rel,
                target,
            }
        })
        .collect()
}

/// The slot (0..20) of file `i` in its block of 20: a seeded permutation of the block.
fn block_slot(seed: u64, i: usize) -> usize {
    let mut r = Rng::new(&[seed, (i / 20) as u64, 0xb10c]);
    let mut perm: [usize; 20] = std::array::from_fn(|k| k);
    for k in (1..20).rev() {
        perm.swap(k, r.below(k + 1));
    }
    perm[i % 20]
}

/// The text of entry `e` at revision `rev` (0: the original; `rev` > 0 rewrites the middle
/// section only). The text takes a share of the target that leaves room for the format's
/// markup, so the file comes out close to its target.
pub fn doc(seed: u64, e: &Entry, rev: u64) -> Doc {
    let mut r = Rng::new(&[seed, e.i as u64, 0xd0c]);
    let share = match e.kind {
        Kind::Markdown => 0.95,
        Kind::Html => 0.85,
        Kind::Pdf => 0.8,
        Kind::Rust | Kind::Python => 0.65,
    };
    let budget = (e.target as f64 * share) as usize;
    let sections = (budget / 1500).clamp(1, 12);
    let edited = sections / 2;
    let per = budget / sections;
    let title = title(&mut r);
    let sections = (0..sections)
        .map(|k| {
            let rev = if k == edited { rev } else { 0 };
            let mut s = Rng::new(&[seed, e.i as u64, k as u64, rev]);
            let heading = title_case_sentence(&mut s);
            let mut paragraphs = Vec::new();
            let mut used = heading.len();
            'fill: loop {
                let mut p = Vec::new();
                for _ in 0..s.between(2, 6) {
                    let t = sentence(&mut s);
                    // The first sentence of a section always fits; then none past the budget.
                    if used + t.len() + 1 > per && (used > heading.len() || !p.is_empty()) {
                        if !p.is_empty() {
                            paragraphs.push(p);
                        }
                        break 'fill;
                    }
                    used += t.len() + 1;
                    p.push(t);
                }
                paragraphs.push(p);
            }
            Section {
                heading,
                paragraphs,
            }
        })
        .collect();
    Doc { title, sections }
}

fn title_case_sentence(r: &mut Rng) -> String {
    let t = title(r);
    if r.below(3) == 0 {
        format!("{t} and {}", r.pick(&NOUNS))
    } else {
        t
    }
}

/// The bytes of `d` rendered as `kind`.
pub fn render(kind: Kind, d: &Doc) -> anyhow::Result<Vec<u8>> {
    Ok(match kind {
        Kind::Markdown => markdown(d).into_bytes(),
        Kind::Html => html(d).into_bytes(),
        Kind::Pdf => pdf(d)?,
        Kind::Rust => rust(d).into_bytes(),
        Kind::Python => python(d).into_bytes(),
    })
}

fn markdown(d: &Doc) -> String {
    let mut out = format!("# {}\n\n", d.title);
    for s in &d.sections {
        out.push_str(&format!("## {}\n\n", s.heading));
        for (k, p) in s.paragraphs.iter().enumerate() {
            if k % 4 == 3 {
                for line in p {
                    out.push_str(&format!("- {line}\n"));
                }
                out.push('\n');
            } else {
                out.push_str(&p.join(" "));
                out.push_str("\n\n");
            }
        }
    }
    out
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;")
}

fn html(d: &Doc) -> String {
    let mut out = format!(
        "<!doctype html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>{}</title>\
         <style>body {{ font-family: sans-serif; }}</style></head>\n<body>\n\
         <nav><a href=\"/\">Home</a> <a href=\"/docs\">Docs</a></nav>\n<article>\n<h1>{}</h1>\n",
        escape_html(&d.title),
        escape_html(&d.title)
    );
    for s in &d.sections {
        out.push_str(&format!("<h2>{}</h2>\n", escape_html(&s.heading)));
        for (k, p) in s.paragraphs.iter().enumerate() {
            if k % 4 == 3 {
                out.push_str("<ul>\n");
                for line in p {
                    out.push_str(&format!("<li>{}</li>\n", escape_html(line)));
                }
                out.push_str("</ul>\n");
            } else {
                out.push_str(&format!("<p>{}</p>\n", escape_html(&p.join(" "))));
            }
        }
    }
    out.push_str(
        "</article>\n<footer>Generated for the ingest benchmark.</footer>\n</body>\n</html>\n",
    );
    out
}

fn ident(s: &str) -> String {
    s.split_whitespace()
        .map(|w| {
            w.chars()
                .filter(char::is_ascii_alphanumeric)
                .collect::<String>()
                .to_ascii_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

fn rust(d: &Doc) -> String {
    let mut out = format!("//! {}\n\nuse std::collections::BTreeMap;\n\n", d.title);
    for s in &d.sections {
        let name = ident(&s.heading);
        for p in &s.paragraphs {
            for line in p {
                out.push_str(&format!("/// {line}\n"));
            }
            out.push_str("///\n");
        }
        out.push_str(&format!(
            "pub fn {name}(input: &BTreeMap<String, u64>) -> u64 {{\n    let mut total = 0;\n"
        ));
        for (k, p) in s.paragraphs.iter().enumerate() {
            let key = ident(p.first().map_or("value", String::as_str));
            let key: String = key.chars().take(40).collect();
            out.push_str(&format!(
                "    // step {k}\n    total += input.get(\"{key}\").copied().unwrap_or({k});\n"
            ));
        }
        out.push_str("    total\n}\n\n");
    }
    out
}

fn python(d: &Doc) -> String {
    let mut out = format!("\"\"\"{}.\"\"\"\n\nimport json\n\n\n", d.title);
    for s in &d.sections {
        let name = ident(&s.heading);
        out.push_str(&format!("def {name}(records):\n    \"\"\"\n"));
        for p in &s.paragraphs {
            for line in p {
                out.push_str(&format!("    {line}\n"));
            }
            out.push('\n');
        }
        out.push_str("    \"\"\"\n    total = 0\n");
        for (k, p) in s.paragraphs.iter().enumerate() {
            let key: String = ident(p.first().map_or("value", String::as_str))
                .chars()
                .take(40)
                .collect();
            out.push_str(&format!(
                "    # step {k}\n    total += records.get(\"{key}\", {k})\n"
            ));
        }
        out.push_str("    return json.dumps({\"total\": total})\n\n\n");
    }
    out
}

/// Characters per PDF line and lines per page (Helvetica 10 pt on US Letter).
const PDF_LINE_CHARS: usize = 95;
const PDF_PAGE_LINES: usize = 48;

/// Lines of `s`: the heading, then each paragraph wrapped at [`PDF_LINE_CHARS`], a blank
/// line between paragraphs.
fn pdf_lines(s: &Section) -> Vec<String> {
    let mut lines = vec![s.heading.clone(), String::new()];
    for p in &s.paragraphs {
        let mut line = String::new();
        for w in p.join(" ").split_whitespace() {
            if !line.is_empty() && line.len() + 1 + w.len() > PDF_LINE_CHARS {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(w);
        }
        if !line.is_empty() {
            lines.push(line);
        }
        lines.push(String::new());
    }
    lines
}

/// A real PDF (lopdf): each section starts a page; a page holds [`PDF_PAGE_LINES`] lines.
fn pdf(d: &Doc) -> anyhow::Result<Vec<u8>> {
    use lopdf::content::{Content, Operation};
    use lopdf::{Document, Object, Stream, dictionary};

    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let font_id = doc.add_object(dictionary! {
        "Type" => "Font",
        "Subtype" => "Type1",
        "BaseFont" => "Helvetica",
        "Encoding" => "WinAnsiEncoding",
    });
    let resources_id = doc.add_object(dictionary! {
        "Font" => dictionary! { "F1" => font_id },
    });
    let mut kids: Vec<Object> = Vec::new();
    for s in &d.sections {
        for page in pdf_lines(s).chunks(PDF_PAGE_LINES) {
            let mut ops = vec![
                Operation::new("BT", vec![]),
                Operation::new("Tf", vec!["F1".into(), 10.into()]),
                Operation::new("TL", vec![14.into()]),
                Operation::new("Td", vec![56.into(), 740.into()]),
            ];
            for line in page {
                if !line.is_empty() {
                    ops.push(Operation::new(
                        "Tj",
                        vec![Object::string_literal(line.as_str())],
                    ));
                }
                ops.push(Operation::new("T*", vec![]));
            }
            ops.push(Operation::new("ET", vec![]));
            let content = Content { operations: ops }
                .encode()
                .context("encode a PDF page")?;
            let content_id = doc.add_object(Stream::new(dictionary! {}, content));
            let page_id = doc.add_object(dictionary! {
                "Type" => "Page",
                "Parent" => pages_id,
                "Contents" => content_id,
            });
            kids.push(page_id.into());
        }
    }
    let count = kids.len() as i64;
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages",
            "Kids" => kids,
            "Count" => count,
            "Resources" => resources_id,
            "MediaBox" => vec![0.into(), 0.into(), 612.into(), 792.into()],
        }),
    );
    let info_id = doc.add_object(dictionary! {
        "Title" => Object::string_literal(d.title.as_str()),
    });
    let catalog_id = doc.add_object(dictionary! {
        "Type" => "Catalog",
        "Pages" => pages_id,
    });
    doc.trailer.set("Root", catalog_id);
    doc.trailer.set("Info", info_id);
    let mut out = Vec::new();
    doc.save_to(&mut out).context("write a PDF")?;
    Ok(out)
}

/// Writes entry `e` at revision `rev` under `root`; returns its size in bytes.
pub fn write(root: &Path, seed: u64, e: &Entry, rev: u64) -> anyhow::Result<usize> {
    let bytes = render(e.kind, &doc(seed, e, rev))?;
    let path = root.join(&e.rel);
    if let Some(dir) = path.parent() {
        fs_err::create_dir_all(dir)?;
    }
    fs_err::write(&path, &bytes)?;
    Ok(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(kind: Kind, bytes: &[u8]) -> ce_ingest::ParsedDocument {
        let name = format!("x.{}", kind.ext());
        ce_ingest::parse(bytes, ce_ingest::Hint::file(&name)).expect("parses")
    }

    #[test]
    fn every_format_parses_back_to_its_sentences() {
        let entries = plan(7, 200);
        for kind in Kind::ALL {
            let e = entries
                .iter()
                .find(|e| e.kind == kind && e.target > 8000)
                .expect("an entry of each kind");
            let d = doc(7, e, 0);
            let bytes = render(kind, &d).expect("renders");
            let parsed = parse(kind, &bytes);
            // Every sentence of the middle section comes back (PDF lines are wrapped, so
            // compare with whitespace collapsed).
            let text: String = parsed.text.split_whitespace().collect::<Vec<_>>().join(" ");
            let s = &d.sections[d.sections.len() / 2];
            for p in &s.paragraphs {
                for line in p {
                    let want = if kind == Kind::Html {
                        line.clone()
                    } else {
                        line.split_whitespace().collect::<Vec<_>>().join(" ")
                    };
                    assert!(
                        text.contains(&want),
                        "{kind:?}: {want:?} not in the parsed text"
                    );
                }
            }
            if kind == Kind::Pdf {
                assert_eq!(parsed.title.as_deref(), Some(d.title.as_str()));
                assert!(
                    parsed.pages.len() >= d.sections.len(),
                    "a page per section at least"
                );
            }
        }
    }

    #[test]
    fn sizes_are_within_bounds_and_an_edit_changes_one_section() {
        let entries = plan(3, 300);
        for e in &entries {
            assert!((1024..=20 * 1024).contains(&e.target), "{e:?}");
        }
        for kind in Kind::ALL {
            assert!(entries.iter().any(|e| e.kind == kind), "{kind:?} present");
        }
        let e = entries
            .iter()
            .find(|e| e.target > 10_000)
            .expect("a large entry");
        let (a, b) = (doc(3, e, 0), doc(3, e, 1));
        let changed: Vec<usize> = (0..a.sections.len())
            .filter(|&k| a.sections[k].paragraphs != b.sections[k].paragraphs)
            .collect();
        assert_eq!(changed, vec![a.sections.len() / 2]);
        let again = doc(3, e, 0);
        assert_eq!(markdown(&a), markdown(&again), "deterministic");
        // Every file comes out close to its target, within 1–20 KB (a small HTML page's head
        // and a small PDF's objects may take it a little over a 1 KB target).
        for e in &entries {
            let len = render(e.kind, &doc(3, e, 0)).expect("renders").len();
            assert!(len <= 20 * 1024, "{e:?}: {len} bytes");
            assert!(len >= e.target * 3 / 4, "{e:?}: {len} bytes");
            assert!(len <= e.target + 1024, "{e:?}: {len} bytes");
        }
    }
}
