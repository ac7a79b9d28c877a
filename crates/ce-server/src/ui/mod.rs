//! The web console (`/ui`, docs/console.md): hand-written HTML, CSS and JavaScript modules,
//! embedded in the binary with `include_str!` — no build step, nothing fetched at run time.
//! The pages call the HTTP API from the browser with the key the user logged in with
//! (kept in `sessionStorage`), so the console sees exactly what that key sees.
//!
//! The static files need no key (they hold no data); every answer carries a strict
//! Content-Security-Policy (same origin only, no inline script or style, no framing).

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

/// Where the console is served.
pub const PATH: &str = "/ui";

/// The Content-Security-Policy of every `/ui` answer.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'";

/// One embedded file: its path under `/ui/`, media type and bytes.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// The path below `/ui/` (`index.html`, `js/app.js`, ...).
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static str,
}

macro_rules! assets {
    ($($path:literal => $ty:expr),* $(,)?) => {
        &[$(Asset { path: $path, content_type: $ty, body: include_str!(concat!("assets/", $path)) }),*]
    };
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// Every file of the console.
pub const ASSETS: &[Asset] = assets![
    "index.html" => HTML,
    "console.css" => "text/css; charset=utf-8",
    "js/api.js" => JS,
    "js/app.js" => JS,
    "js/dom.js" => JS,
    "js/tree.js" => JS,
    "js/search.js" => JS,
    "js/indexes.js" => JS,
    "js/sessions.js" => JS,
];

/// The total size of the embedded files, in bytes.
pub fn assets_bytes() -> usize {
    ASSETS.iter().map(|a| a.body.len()).sum()
}

fn with_headers(status: StatusCode, content_type: &str, body: &'static str) -> Response {
    let mut res = (status, body).into_response();
    let h = res.headers_mut();
    let set = |v: &str| HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static(""));
    h.insert(header::CONTENT_TYPE, set(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    res
}

/// `GET /ui`: to `/ui/` (so relative module paths resolve under it).
pub async fn redirect() -> Redirect {
    Redirect::permanent("/ui/")
}

/// `GET /ui/`: the page.
pub async fn index() -> Response {
    file(Path("index.html".to_owned())).await
}

/// `GET /ui/{*file}`: an embedded file, or 404.
pub async fn file(Path(path): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.path == path) {
        Some(a) => with_headers(StatusCode::OK, a.content_type, a.body),
        None => with_headers(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_page_imports_is_embedded() {
        let known = |p: &str| ASSETS.iter().any(|a| a.path == p);
        for a in ASSETS
            .iter()
            .filter(|a| a.content_type == JS || a.content_type == HTML)
        {
            for line in a.body.lines() {
                let Some(rest) = line
                    .split(" from \"./")
                    .nth(1)
                    .or_else(|| line.split("src=\"").nth(1))
                else {
                    continue;
                };
                let target = rest.split('"').next().unwrap_or_default();
                let target = if a.path.starts_with("js/")
                    && !target.starts_with("js/")
                    && target.ends_with(".js")
                {
                    format!("js/{target}")
                } else {
                    target.to_owned()
                };
                assert!(
                    known(&target),
                    "{} imports {target}, which is not embedded",
                    a.path
                );
            }
        }
    }
}
