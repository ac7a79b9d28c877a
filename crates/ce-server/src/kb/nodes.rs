//! A parsed, chunked document as the node writes of its item (docs/ingestion.md, "Nodes"):
//! a document that fits one chunk is one node (L2: its text); a longer one is a document node
//! (L2 empty; its L0/L1 roll up from its chunks) with one child `chunk-NNNN` per chunk (L2:
//! the chunk's text). Meta is deterministic — no times, no item ids — so writing an unchanged input again
//! changes no node and appends no event; chunk nodes a shorter version no longer has are
//! removed in the same batch.

use ce_core::{CoreError, CtxUri, Meta};
use ce_ingest::{Chunking, ParsedDocument};
use ce_store::{KbItem, PutMode, PutRequest, WriteOp};
use serde_json::{Value, json};

use super::source::SourceBytes;
use crate::error::Result;

/// The version of the node layout [`document_ops`] writes for a chunked document. Bump it
/// with any change to the nodes, their names or their meta: a re-sync skips a file only when
/// the layout that wrote its nodes is this one (docs/ingestion.md, "Re-sync").
pub const LAYOUT_VERSION: u32 = 1;

/// The name of chunk `i`'s node.
pub fn chunk_name(i: usize) -> String {
    format!("chunk-{i:04}")
}

/// Whether a child name is a chunk's.
pub fn is_chunk_name(name: &str) -> bool {
    name.strip_prefix("chunk-")
        .is_some_and(|n| n.len() >= 4 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Turns a file name into a node segment: separators, control and invisible characters
/// become `_`, a reserved layout name gets a `_` prefix, and an empty or dot name becomes
/// `_`; `fallback` when the result still does not join.
pub fn segment_for(parent: &CtxUri, name: &str, fallback: &str) -> CtxUri {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c == '/'
                || c == '\\'
                || c.is_control()
                || ce_core::uri::hidden_character(c).is_some()
            {
                '_'
            } else if let Some(a) = ce_core::uri::full_width_ascii(c) {
                a
            } else {
                c
            }
        })
        .collect();
    let s_trim = s.trim().to_owned();
    s = if s_trim.is_empty() || s_trim == "." || s_trim == ".." {
        "_".into()
    } else {
        s_trim
    };
    if ce_core::uri::RESERVED_SEGMENTS.contains(&s.as_str()) {
        s = format!("_{s}");
    }
    parent
        .join(&s)
        .ok()
        .filter(|u| u.parent().as_ref() == Some(parent))
        .unwrap_or_else(|| parent.join(fallback).unwrap_or_else(|_| parent.clone()))
}

fn meta_of(pairs: Value) -> Meta {
    match pairs {
        Value::Object(m) => m.into_iter().collect(),
        _ => Meta::new(),
    }
}

fn put(uri: CtxUri, content: String, meta: Meta) -> WriteOp {
    WriteOp::Put {
        uri,
        req: PutRequest {
            // Merge: derived L0/L1 are kept (replace would empty them and re-derive an
            // unchanged document); every meta key is always written.
            mode: PutMode::Merge,
            content: Some(content),
            meta,
            ..PutRequest::default()
        },
    }
}

/// The writes of `item`'s document: its node(s), and removals of the chunk nodes among
/// `existing_children` (the current children of its node) that it no longer has.
pub fn document_ops(
    item: &KbItem,
    src: &SourceBytes,
    doc: &ParsedDocument,
    chunking: &Chunking,
    existing_children: &[CtxUri],
) -> Result<Vec<WriteOp>> {
    let kb = json!({
        // No item id: a re-synced directory's entries get new items for the same nodes.
        "base": item.base,
        "source": src.origin,
        "format": doc.format.as_str(),
        "language": doc.language,
        "title": doc.title,
    });
    let mut ops = Vec::new();
    let keep: Vec<CtxUri> = match chunking {
        Chunking::Whole { tokens } => {
            let meta = meta_of(json!({"kb": kb, "kb_chunks": 0, "kb_tokens": tokens}));
            ops.push(put(item.node_uri.clone(), doc.text.trim().to_owned(), meta));
            Vec::new()
        }
        Chunking::Split { chunks } => {
            let meta =
                meta_of(json!({"kb": kb, "kb_chunks": chunks.len(), "kb_tokens": Value::Null}));
            ops.push(put(item.node_uri.clone(), String::new(), meta));
            let mut keep = Vec::with_capacity(chunks.len());
            for c in chunks {
                let uri = item
                    .node_uri
                    .join(&chunk_name(c.index))
                    .map_err(CoreError::from)?;
                let meta = meta_of(json!({
                    "kb": kb,
                    "kb_chunk": {
                        "index": c.index,
                        "heading_path": c.heading_path,
                        "range": [c.range.start, c.range.end],
                        "pages": c.pages.map(|p| [p.first, p.last]),
                        "tokens": c.tokens,
                        "overlap": c.overlap,
                    },
                }));
                ops.push(put(uri.clone(), c.text.clone(), meta));
                keep.push(uri);
            }
            keep
        }
    };
    for child in existing_children {
        if is_chunk_name(child.name()) && !keep.contains(child) {
            ops.push(WriteOp::Rm {
                uri: child.clone(),
                recursive: true,
                expect_version: None,
                trace_id: None,
            });
        }
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_become_single_segments() {
        let p = CtxUri::parse("ctx://a/resources/b").expect("uri");
        assert_eq!(
            segment_for(&p, "guide.md", "x").as_str(),
            "ctx://a/resources/b/guide.md"
        );
        assert_eq!(
            segment_for(&p, "a/b", "x").as_str(),
            "ctx://a/resources/b/a_b"
        );
        assert_eq!(
            segment_for(&p, "content.md", "x").as_str(),
            "ctx://a/resources/b/_content.md"
        );
        assert_eq!(segment_for(&p, "..", "x").as_str(), "ctx://a/resources/b/_");
        assert!(is_chunk_name("chunk-0003"));
        assert!(!is_chunk_name("chunk-x"));
        assert!(!is_chunk_name("guide.md"));
    }
}
