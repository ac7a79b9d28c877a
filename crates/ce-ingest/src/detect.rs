//! Which parser reads an input: from its content type, its file name, and its first bytes.
//!
//! 1. A specific content type decides: `text/markdown`, `text/html`,
//!    `application/xhtml+xml`, `application/pdf`; any other specific type that is not
//!    text (`image/png`, `application/zip`, …) is unsupported, whatever the file name says.
//! 2. Generic types (`text/plain`, `application/octet-stream`, none at all) defer to the file
//!    name: known file names (`Makefile`, `Dockerfile`, …) and extensions (see
//!    [`language_of`] for code, `md`/`markdown`, `txt`/`log`/`rst`…, `html`/`htm`, `pdf`).
//!    An unknown extension is unsupported — unless the content type says `text/*`, which
//!    makes it plain text.
//! 3. With no usable name either, the bytes decide: `%PDF-` is PDF, a document starting with
//!    `<!doctype html` or `<html` is HTML, UTF-8 without NUL bytes is plain text, and
//!    anything else is unsupported binary data.

use crate::document::Hint;
use crate::error::{IngestError, Result};

/// What an input was detected as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detected {
    Markdown,
    Text,
    Code(&'static str),
    Html,
    Pdf,
}

/// Source-code extensions and the language each means.
const CODE_EXTENSIONS: &[(&str, &str)] = &[
    ("rs", "rust"),
    ("py", "python"),
    ("pyi", "python"),
    ("js", "javascript"),
    ("mjs", "javascript"),
    ("cjs", "javascript"),
    ("jsx", "javascript"),
    ("ts", "typescript"),
    ("tsx", "typescript"),
    ("go", "go"),
    ("java", "java"),
    ("kt", "kotlin"),
    ("kts", "kotlin"),
    ("scala", "scala"),
    ("c", "c"),
    ("h", "c"),
    ("cc", "cpp"),
    ("cpp", "cpp"),
    ("cxx", "cpp"),
    ("hpp", "cpp"),
    ("hh", "cpp"),
    ("hxx", "cpp"),
    ("cs", "csharp"),
    ("rb", "ruby"),
    ("php", "php"),
    ("swift", "swift"),
    ("m", "objective-c"),
    ("mm", "objective-c"),
    ("sh", "shell"),
    ("bash", "shell"),
    ("zsh", "shell"),
    ("ps1", "powershell"),
    ("sql", "sql"),
    ("lua", "lua"),
    ("pl", "perl"),
    ("pm", "perl"),
    ("r", "r"),
    ("dart", "dart"),
    ("ex", "elixir"),
    ("exs", "elixir"),
    ("erl", "erlang"),
    ("hs", "haskell"),
    ("ml", "ocaml"),
    ("clj", "clojure"),
    ("zig", "zig"),
    ("jl", "julia"),
    ("vue", "vue"),
    ("svelte", "svelte"),
    ("css", "css"),
    ("scss", "scss"),
    ("proto", "protobuf"),
    ("groovy", "groovy"),
    ("gradle", "groovy"),
    ("tf", "terraform"),
    ("toml", "toml"),
    ("yaml", "yaml"),
    ("yml", "yaml"),
    ("json", "json"),
    ("xml", "xml"),
];

/// Source files known by their whole name.
const CODE_FILE_NAMES: &[(&str, &str)] = &[
    ("makefile", "make"),
    ("gnumakefile", "make"),
    ("dockerfile", "dockerfile"),
    ("containerfile", "dockerfile"),
    ("cmakelists.txt", "cmake"),
    ("justfile", "just"),
    ("rakefile", "ruby"),
    ("gemfile", "ruby"),
];

const MARKDOWN_EXTENSIONS: &[&str] = &["md", "markdown", "mdown", "mkd", "mdx"];
const TEXT_EXTENSIONS: &[&str] = &["txt", "text", "log", "rst", "adoc", "csv", "tsv"];
const HTML_EXTENSIONS: &[&str] = &["html", "htm", "xhtml"];

/// The programming language of a file name (`main.rs` → `rust`, `Makefile` → `make`).
pub fn language_of(file_name: &str) -> Option<&'static str> {
    let base = base_name(file_name).to_ascii_lowercase();
    if let Some(&(_, lang)) = CODE_FILE_NAMES.iter().find(|(n, _)| *n == base) {
        return Some(lang);
    }
    let ext = extension(&base)?;
    CODE_EXTENSIONS
        .iter()
        .find(|(e, _)| *e == ext)
        .map(|&(_, lang)| lang)
}

fn base_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// The lowercase extension of a base name (`a.tar.gz` → `gz`; `.bashrc` → none).
fn extension(base: &str) -> Option<&str> {
    let (stem, ext) = base.rsplit_once('.')?;
    (!stem.is_empty() && !ext.is_empty()).then_some(ext)
}

/// The MIME type without parameters, lowercase.
fn mime(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Decides the parser of an input (see the module documentation).
pub(crate) fn detect(bytes: &[u8], hint: &Hint<'_>) -> Result<Detected> {
    let name = hint.file_name.map(str::to_owned);
    let unsupported = |kind: String| IngestError::UnsupportedFormat {
        kind,
        name: name.clone(),
    };
    let mime = hint.content_type.map(mime).unwrap_or_default();
    match mime.as_str() {
        "text/markdown" | "text/x-markdown" => return Ok(Detected::Markdown),
        "text/html" | "application/xhtml+xml" => return Ok(Detected::Html),
        "application/pdf" => return Ok(Detected::Pdf),
        _ => {}
    }
    let generic = matches!(
        mime.as_str(),
        "" | "text/plain" | "application/octet-stream" | "binary/octet-stream"
    );
    // Source code is often served as text/x-… or application/javascript, json, xml, toml.
    let codeish = mime.starts_with("text/")
        || matches!(
            mime.as_str(),
            "application/javascript"
                | "application/json"
                | "application/xml"
                | "application/toml"
                | "application/yaml"
                | "application/x-sh"
        );
    if !generic && !codeish {
        return Err(unsupported(mime));
    }
    if let Some(file) = hint.file_name {
        if let Some(lang) = language_of(file) {
            return Ok(Detected::Code(lang));
        }
        let base = base_name(file).to_ascii_lowercase();
        if let Some(ext) = extension(&base) {
            if MARKDOWN_EXTENSIONS.contains(&ext) {
                return Ok(Detected::Markdown);
            }
            if TEXT_EXTENSIONS.contains(&ext) {
                return Ok(Detected::Text);
            }
            if HTML_EXTENSIONS.contains(&ext) {
                return Ok(Detected::Html);
            }
            if ext == "pdf" {
                return Ok(Detected::Pdf);
            }
            if mime.starts_with("text/") {
                return Ok(Detected::Text);
            }
            return Err(unsupported(format!("extension .{ext}")));
        }
    }
    if !generic {
        // A specific text type and no name to refine it.
        return Ok(Detected::Text);
    }
    sniff(bytes).ok_or_else(|| {
        unsupported(if mime.is_empty() {
            "binary data".to_owned()
        } else {
            mime.clone()
        })
    })
}

/// What the first bytes say, when nothing else does.
fn sniff(bytes: &[u8]) -> Option<Detected> {
    if bytes.starts_with(b"%PDF-") {
        return Some(Detected::Pdf);
    }
    let head = &bytes[..bytes.len().min(512)];
    let head = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
    let start = head
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(head.len());
    let lower = head[start..].to_ascii_lowercase();
    if lower.starts_with(b"<!doctype html") || lower.starts_with(b"<html") {
        return Some(Detected::Html);
    }
    (!bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()).then_some(Detected::Text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(bytes: &[u8], name: Option<&str>, ct: Option<&str>) -> Result<Detected> {
        detect(
            bytes,
            &Hint {
                file_name: name,
                content_type: ct,
            },
        )
    }

    #[test]
    fn content_type_then_name_then_bytes() {
        assert_eq!(
            d(b"x", Some("a.php"), Some("text/html; charset=utf-8")),
            Ok(Detected::Html)
        );
        assert_eq!(
            d(b"x", Some("notes.md"), Some("text/plain")),
            Ok(Detected::Markdown)
        );
        assert_eq!(
            d(b"x", Some("src/main.rs"), None),
            Ok(Detected::Code("rust"))
        );
        assert_eq!(d(b"x", Some("Makefile"), None), Ok(Detected::Code("make")));
        assert_eq!(
            d(b"x", Some("CMakeLists.txt"), None),
            Ok(Detected::Code("cmake"))
        );
        assert_eq!(
            d(b"x", Some("app.js"), Some("application/javascript")),
            Ok(Detected::Code("javascript"))
        );
        assert_eq!(
            d(b"x", Some("data.unknown"), Some("text/csv")),
            Ok(Detected::Text)
        );
        assert_eq!(
            d(b"%PDF-1.7 ...", Some("download"), None),
            Ok(Detected::Pdf)
        );
        assert_eq!(
            d(
                b"\n <!DOCTYPE html><p>",
                None,
                Some("application/octet-stream")
            ),
            Ok(Detected::Html)
        );
        assert_eq!(
            d("纯文本".as_bytes(), Some("README"), None),
            Ok(Detected::Text)
        );
        assert_eq!(d(b"x", Some("dir/.bashrc"), None), Ok(Detected::Text));
    }

    #[test]
    fn unsupported_names_the_type() {
        let e = d(b"\x89PNG", Some("logo.md"), Some("image/png")).expect_err("fails");
        assert_eq!(e.to_string(), "unsupported format: image/png (logo.md)");
        let e = d(b"PK\x03\x04", Some("report.DOCX"), None).expect_err("fails");
        assert_eq!(
            e.to_string(),
            "unsupported format: extension .docx (report.DOCX)"
        );
        let e = d(b"\x00\x01\x02", None, None).expect_err("fails");
        assert_eq!(e.to_string(), "unsupported format: binary data");
        let e = d(b"\x00\x01", None, Some("application/octet-stream")).expect_err("fails");
        assert_eq!(
            e.to_string(),
            "unsupported format: application/octet-stream"
        );
    }
}
