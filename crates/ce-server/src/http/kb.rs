//! The knowledge-base routes (admin only: they read the server's files and URLs on its
//! behalf; docs/http-api.md, docs/ingestion.md): `GET /v1/kb`, `POST /v1/kb/create`,
//! `GET /v1/kb/{base}`, `GET /v1/kb/{base}/status?item=`, `POST /v1/kb/{base}/rm`,
//! `POST /v1/kb/{base}/items`, `POST /v1/kb/{base}/items/rm`, `POST /v1/kb/{base}/reindex`,
//! `POST /v1/kb/{base}/progress`. Entries answer once their rows and jobs exist; the
//! server's job runner does the work, and `progress` reports on it.

use std::path::Path as FsPath;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use ce_core::{CoreError, ErrorCode};

use super::AppState;
use super::error::ApiError;
use super::handlers::{Answer, J, NoBody, Q, blocking, body, no_fields, params};
use super::openapi::{Param, schema};
use crate::kb::{CreateBase, KbInput};
use crate::wire::{KbAddBody, KbItemsBody, KbProgressBody};

/// `GET /v1/kb/{base}/status`.
pub(super) const STATUS: &[Param] = &[Param::optional(
    "item",
    schema::<String>(),
    "Only this item and its subtree.",
)];

type P = Result<Path<String>, PathRejection>;

fn base(p: P) -> Result<String, ApiError> {
    p.map(|Path(b)| b).map_err(|r| {
        ApiError::new(
            ErrorCode::InvalidField,
            format!("bad knowledge base in the path: {}", r.body_text()),
            false,
        )
    })
}

/// Refuses a local path outside `[ingest].allowed_paths` (none by default): an HTTP or MCP
/// caller must not make the server read its own files at will.
pub(crate) fn check_paths(allowed: &[String], inputs: &[KbInput]) -> Result<(), ApiError> {
    for i in inputs {
        let Some(p) = &i.path else { continue };
        let path = FsPath::new(p);
        let inside = path.is_absolute()
            && !path
                .components()
                .any(|c| c == std::path::Component::ParentDir)
            && allowed.iter().any(|a| path.starts_with(a));
        if !inside {
            return Err(CoreError::InvalidField {
                field: "path",
                reason: format!(
                    "{p:?} is not under [ingest].allowed_paths of the server ({}); add URLs \
                     or notes, or run `ce kb add` without --server on the machine that has the \
                     files",
                    if allowed.is_empty() {
                        "none configured".to_owned()
                    } else {
                        allowed.join(", ")
                    }
                ),
            }
            .into());
        }
    }
    Ok(())
}

/// `GET /v1/kb`: every base.
pub async fn list(State(s): State<AppState>, q: Q) -> Answer {
    params(q, super::handlers::NONE)?;
    blocking(&s, move |e| Ok(e.kb_bases()?)).await
}

/// `POST /v1/kb/create`.
pub async fn create(State(s): State<AppState>, b: J<CreateBase>) -> Answer {
    let req = body(b)?;
    blocking(&s, move |e| Ok(e.kb_create(req)?)).await
}

/// `GET /v1/kb/{base}`.
pub async fn show(State(s): State<AppState>, b: P, q: Q) -> Answer {
    let name = base(b)?;
    params(q, super::handlers::NONE)?;
    blocking(&s, move |e| Ok(e.kb_status(&name, None)?)).await
}

/// `GET /v1/kb/{base}/status?item=`.
pub async fn status(State(s): State<AppState>, b: P, q: Q) -> Answer {
    let name = base(b)?;
    let p = params(q, STATUS)?;
    let item = p.get("item").map(str::to_owned);
    blocking(&s, move |e| Ok(e.kb_status(&name, item.as_deref())?)).await
}

/// `POST /v1/kb/{base}/rm` (body: none or `{}`).
pub async fn remove(State(s): State<AppState>, b: P, nothing: NoBody) -> Answer {
    let name = base(b)?;
    no_fields(nothing)?;
    blocking(&s, move |e| Ok(e.kb_remove(&name)?)).await
}

/// `POST /v1/kb/{base}/items`.
pub async fn add(State(s): State<AppState>, b: P, j: J<KbAddBody>) -> Answer {
    let name = base(b)?;
    let req = body(j)?;
    check_paths(&s.engine.config().ingest.allowed_paths, &req.inputs)?;
    blocking(&s, move |e| Ok(e.kb_add(&name, req.inputs)?)).await
}

/// `POST /v1/kb/{base}/items/rm`.
pub async fn remove_items(State(s): State<AppState>, b: P, j: J<KbItemsBody>) -> Answer {
    let name = base(b)?;
    let req = body(j)?;
    blocking(&s, move |e| Ok(e.kb_delete_items(&name, &req.items)?)).await
}

/// `POST /v1/kb/{base}/reindex`.
pub async fn reindex(State(s): State<AppState>, b: P, j: J<KbItemsBody>) -> Answer {
    let name = base(b)?;
    let req = body(j)?;
    blocking(&s, move |e| Ok(e.kb_reindex_items(&name, &req.items)?)).await
}

/// `POST /v1/kb/{base}/progress`. An unknown base is `not_found`, unless the request names
/// jobs and they all exist: the base was removed by them (`POST /v1/kb/{base}/rm`), and
/// their progress is the end of the removal.
pub async fn progress(State(s): State<AppState>, b: P, j: J<KbProgressBody>) -> Answer {
    let name = base(b)?;
    let req = body(j)?;
    blocking(&s, move |e| {
        match e.store().kb_base(&name) {
            Ok(_) => {}
            Err(ce_store::StoreError::KbNotFound { .. })
                if !req.jobs.is_empty() && req.jobs.iter().all(|j| e.job(j).is_ok()) => {}
            Err(err) => return Err(err.into()),
        }
        Ok(e.kb_progress(&name, &req.roots, &req.jobs)?)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_over_http_must_lie_under_an_allowed_root() {
        let input = |p: &str| KbInput {
            path: Some(p.into()),
            ..KbInput::default()
        };
        let allowed = vec!["/srv/docs".to_owned()];
        assert!(check_paths(&allowed, &[input("/srv/docs/a.md")]).is_ok());
        for bad in [
            "/etc/passwd",
            "/srv/docs/../../etc/passwd",
            "relative.md",
            "/srv/docsx/a",
        ] {
            assert!(check_paths(&allowed, &[input(bad)]).is_err(), "{bad}");
        }
        assert!(check_paths(&[], &[input("/srv/docs/a.md")]).is_err());
        let url = KbInput {
            url: Some("https://example.com".into()),
            ..KbInput::default()
        };
        assert!(check_paths(&[], &[url]).is_ok());
    }
}
