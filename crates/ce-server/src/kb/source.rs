//! Reading an item's input — a local file, an HTTP(S) URL or a note — as bytes and the hint
//! the parser needs, with the limits of docs/ingestion.md ("Sources"): files and bodies of at
//! most [`MAX_SOURCE_BYTES`], URLs answered within [`FETCH_TIMEOUT`] with a content type a
//! parser reads. Every failure is classified: a missing file, a too-large input or a refused
//! content type is permanent; a timeout, a refused connection or a 5xx is retryable.

use std::path::Path;
use std::time::Duration;

use ce_core::{CoreError, ErrorCode};
use ce_http::{Failure, GetError};
use ce_store::{ItemKind, KbItem};

use super::fingerprint::TakenStat;

use crate::error::{Result, ServerError};

/// The largest input read (file or URL body): 32 MiB.
pub const MAX_SOURCE_BYTES: u64 = 32 << 20;
/// The longest a URL fetch may take, connect to last byte.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest note, in bytes.
pub const MAX_NOTE_BYTES: usize = 1 << 20;

/// An input's bytes and what the parser is told about them.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceBytes {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// The file name (a path's last segment, a URL's last path segment, `note.md`).
    pub file_name: Option<String>,
    /// The content type (URLs).
    pub content_type: Option<String>,
    /// Where it was read from, for the nodes' meta (a path, the final URL, `note`).
    pub origin: String,
    /// A file's stat, taken from the open file before its bytes were read (a write during
    /// the read shows in the next stat, never in this one and its fingerprint).
    pub stat: Option<TakenStat>,
}

fn failed(code: ErrorCode, retryable: bool, context: &str, message: String) -> ServerError {
    ServerError::Failed {
        context: context.to_owned(),
        code,
        retryable,
        message,
    }
}

/// Reads `item`'s input (not for containers).
pub fn read(item: &KbItem) -> Result<SourceBytes> {
    match item.kind {
        ItemKind::File => read_file(Path::new(&item.source)),
        ItemKind::Url => fetch(&item.source),
        ItemKind::Note => Ok(SourceBytes {
            bytes: item.source.clone().into_bytes(),
            file_name: Some("note.md".into()),
            content_type: None,
            origin: "note".into(),
            stat: None,
        }),
        ItemKind::Directory => Err(ServerError::Internal(format!(
            "item {} is a directory: it is expanded, not read",
            item.id
        ))),
    }
}

/// Reads a local file of at most [`MAX_SOURCE_BYTES`], with its stat.
pub fn read_file(path: &Path) -> Result<SourceBytes> {
    use std::io::Read as _;
    let context = format!("reading {}", path.display());
    let mut file = std::fs::File::open(path).map_err(|e| io_failure(&context, &e))?;
    let taken_at = std::time::SystemTime::now();
    let meta = file.metadata().map_err(|e| io_failure(&context, &e))?;
    if !meta.is_file() {
        return Err(failed(
            ErrorCode::InvalidField,
            false,
            &context,
            "not a regular file".into(),
        ));
    }
    if meta.len() > MAX_SOURCE_BYTES {
        return Err(too_large(&context, MAX_SOURCE_BYTES));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // One byte more than the limit tells a file that grew past it since the stat.
    (&mut file)
        .take(MAX_SOURCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_failure(&context, &e))?;
    if bytes.len() as u64 > MAX_SOURCE_BYTES {
        return Err(too_large(&context, MAX_SOURCE_BYTES));
    }
    Ok(SourceBytes {
        bytes,
        file_name: path.file_name().map(|n| n.to_string_lossy().into_owned()),
        content_type: None,
        origin: path.display().to_string(),
        stat: Some(TakenStat::of(&meta, taken_at)),
    })
}

fn io_failure(context: &str, e: &std::io::Error) -> ServerError {
    let (code, retryable) = match e.kind() {
        std::io::ErrorKind::NotFound => (ErrorCode::NotFound, false),
        std::io::ErrorKind::PermissionDenied => (ErrorCode::Io, false),
        _ => (ErrorCode::Io, true),
    };
    failed(code, retryable, context, e.to_string())
}

fn too_large(context: &str, max: u64) -> ServerError {
    failed(
        ErrorCode::PayloadTooLarge,
        false,
        context,
        format!("larger than the limit of {max} bytes"),
    )
}

/// Whether a parser reads `content_type` (its media type, parameters ignored): text, HTML,
/// XHTML, PDF, and none or `application/octet-stream` (the name and bytes decide).
pub fn readable_content_type(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else {
        return true;
    };
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media.is_empty()
        || media.starts_with("text/")
        || matches!(
            media.as_str(),
            "application/xhtml+xml" | "application/pdf" | "application/octet-stream"
        )
}

/// Checks a URL's shape: `http://` or `https://` with a host (`invalid_field` otherwise).
pub fn check_url(url: &str) -> std::result::Result<(), CoreError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(r)
            if !r.is_empty() && !r.starts_with('/') && !url.chars().any(char::is_whitespace) =>
        {
            Ok(())
        }
        _ => Err(CoreError::InvalidField {
            field: "url",
            reason: format!("{url:?} is not an http:// or https:// URL with a host"),
        }),
    }
}

/// The last non-empty path segment of a URL (query and fragment dropped), if any.
pub fn url_file_name(url: &str) -> Option<String> {
    let no_scheme = url.split_once("://").map_or(url, |(_, r)| r);
    let path = no_scheme.split(['?', '#']).next().unwrap_or("");
    let mut segs = path.split('/');
    let _host = segs.next();
    segs.rfind(|s| !s.is_empty()).map(str::to_owned)
}

/// The host of a URL.
pub fn url_host(url: &str) -> String {
    let no_scheme = url.split_once("://").map_or(url, |(_, r)| r);
    no_scheme
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("")
        .to_owned()
}

/// Fetches a URL within [`FETCH_TIMEOUT`] and [`MAX_SOURCE_BYTES`], refusing a content type
/// no parser reads before its body is read.
pub fn fetch(url: &str) -> Result<SourceBytes> {
    fetch_with(url, FETCH_TIMEOUT, MAX_SOURCE_BYTES)
}

/// [`fetch`] with explicit limits.
pub fn fetch_with(url: &str, timeout: Duration, max_bytes: u64) -> Result<SourceBytes> {
    check_url(url)?;
    let context = format!("fetching {url}");
    let got =
        ce_http::get(url, timeout, max_bytes, &readable_content_type).map_err(|e| match e {
            GetError::TooLarge { max_bytes } => too_large(&context, max_bytes),
            GetError::ContentType { content_type } => failed(
                ErrorCode::UnsupportedFormat,
                false,
                &context,
                format!("unsupported format: content type {content_type}"),
            ),
            GetError::Failure(f) => {
                let (code, retryable, message) = match f {
                    Failure::Timeout { after } => (
                        ErrorCode::Upstream,
                        true,
                        format!("no answer within {} s", after.as_secs()),
                    ),
                    Failure::Paused { left } => (
                        ErrorCode::RateLimited,
                        true,
                        format!("rate limited for {} s more", left.as_secs()),
                    ),
                    Failure::RateLimited { message, .. } => (ErrorCode::RateLimited, true, message),
                    Failure::Status {
                        status,
                        message,
                        retryable,
                    } => (
                        if status == 404 || status == 410 {
                            ErrorCode::NotFound
                        } else {
                            ErrorCode::Upstream
                        },
                        retryable,
                        message,
                    ),
                    Failure::Transport { message, retryable } => {
                        (ErrorCode::Upstream, retryable, message)
                    }
                };
                failed(code, retryable, &context, message)
            }
        })?;
    Ok(SourceBytes {
        file_name: url_file_name(&got.url),
        content_type: got.content_type,
        origin: got.url,
        bytes: got.body,
        stat: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_named() {
        assert!(check_url("https://example.com/a").is_ok());
        assert!(check_url("http://127.0.0.1:8080").is_ok());
        for bad in [
            "ftp://x",
            "https://",
            "https:///a",
            "example.com",
            "http://a b",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        assert_eq!(
            url_file_name("https://example.com/docs/guide.html?x=1#top").as_deref(),
            Some("guide.html")
        );
        assert_eq!(url_file_name("https://example.com/"), None);
        assert_eq!(url_host("https://example.com:8443/a"), "example.com:8443");
    }

    #[test]
    fn only_content_types_a_parser_reads_are_fetched() {
        for ok in [
            None,
            Some("text/html; charset=utf-8"),
            Some("text/markdown"),
            Some("application/pdf"),
            Some("Application/XHTML+XML"),
        ] {
            assert!(readable_content_type(ok), "{ok:?}");
        }
        for bad in ["image/png", "application/zip", "video/mp4"] {
            assert!(!readable_content_type(Some(bad)), "{bad}");
        }
    }
}
