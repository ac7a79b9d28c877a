//! Sessions in the engine (docs/sessions.md): create, append, show and list, and the
//! two-phase commit of the spec (`path-locks-crash-recovery`, "session.commit()").
//!
//! ```text
//! session_add ─► EXACT lock on the session ─► messages/{id} + session counters (one txn)
//! session_commit (Phase 1, [`commit`]) ─► EXACT lock on the session, no model call:
//!     archives/{n} (transcript, state ready) + rm archived messages + counters and the
//!     phase-1-ready marker + Enqueue(session-commit) ─ one transaction
//! session-commit job (Phase 2, [`phase2`]) ─► summary ─► extraction (saved on the archive)
//!     ─► TREE lock on the owner's memories: merge + memory_diffs/{n} + completion marker
//!        (one transaction)
//! ```
//!
//! The logic (layout, extraction schema, merge rule) is `ce-session`'s; this module reads
//! and writes it through the store and the path locks, like every other writer.

mod commit;
mod extract;
pub mod phase2;

use ce_core::{Clock as _, ContextNode, CoreError, CtxUri, Meta, SystemClock};
use ce_lock::LockRequest;
use ce_session::layout::{
    RETRY_ARCHIVES, SessionLayout, archive_meta, check_message_id, generated_message_id,
    session_meta,
};
use ce_session::{ArchiveState, ExtractionState, Message, Role, SessionError, transcript_texts};
use ce_store::{PutMode, PutRequest, StoreError, WriteOp};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use commit::CommitOutcome;

use crate::engine::Engine;
use crate::error::Result;
use crate::guarded::Guarded;

/// What session operations read and write through: the source of truth, the path locks,
/// the configuration, and (in an engine) the wake-up of its workers and job runner. The
/// engine and the local CLI build one each, like [`Guarded`].
#[derive(Clone, Copy)]
pub struct Sessions<'a> {
    /// The source of truth.
    pub store: &'a dyn ce_store::SourceStore,
    /// The path locks.
    pub locks: &'a ce_lock::LockManager,
    /// The configuration (`[sessions]`, `[derive]`).
    pub config: &'a ce_core::Config,
    /// Woken after each write, when workers run in this process.
    pub wake: Option<&'a ce_index::worker::runner::Wakeup>,
    /// The embedder (behind the embedding cache) whose similarity of facts is the merge's
    /// second signal (docs/sessions.md, "Merge"), or why there is none.
    pub embedder: std::result::Result<&'a dyn ce_embed::Embedder, &'a str>,
}

impl Engine {
    /// The session operations of this engine.
    pub fn sessions(&self) -> Sessions<'_> {
        Sessions {
            store: self.store().as_ref(),
            locks: self.locks(),
            config: self.config(),
            wake: Some(self.wakeup().as_ref()),
            embedder: self
                .embedder()
                .map(|e| e.as_ref() as &dyn ce_embed::Embedder),
        }
    }
}

/// A message to append.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddMessage {
    /// The session.
    pub uri: CtxUri,
    /// Who said it.
    pub role: Role,
    /// What was said (non-empty).
    pub content: String,
    /// The client's message id: a retried append with the same id does not duplicate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// When it was said (milliseconds since the epoch; default: now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ms: Option<i64>,
    /// Tool calls or other structured parts, kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Value>,
}

/// What an append did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Appended {
    /// The session.
    pub session: CtxUri,
    /// The message node.
    pub uri: CtxUri,
    /// The message id.
    pub id: String,
    /// Its sequence number.
    pub seq: u64,
    /// False when the id was appended before (a retry): nothing was written.
    pub created: bool,
    /// When the retried message was archived meanwhile: the archive holding it (`uri` no
    /// longer exists). Only the session's newest `RETRY_ARCHIVES` archives are looked in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<CtxUri>,
}

/// A message found in one of a session's newest archives.
struct ArchivedMessage {
    archive: CtxUri,
    seq: u64,
    /// `role: content`, as the transcript holds it.
    text: String,
}

/// One archive of a session, as `show` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ArchiveView {
    /// The archive node.
    pub uri: CtxUri,
    /// Its number.
    pub number: u64,
    /// `ready` (Phase 2 pending or running) or `completed`.
    pub state: Option<ArchiveState>,
    /// Where extraction is.
    pub extraction: ExtractionState,
    /// Why extraction is off or failed, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Messages archived.
    pub messages: u64,
    /// Its summary (L0), empty until derived.
    pub summary: String,
    /// Its memory diff, once written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

/// A session with its live messages and archives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionView {
    /// The session.
    pub uri: CtxUri,
    /// Its title (L2), possibly empty.
    pub title: String,
    /// Its node version.
    pub version: u64,
    /// The live messages, in order.
    pub messages: Vec<Message>,
    /// The archives, oldest first.
    pub archives: Vec<ArchiveView>,
    /// The sequence number of the next message.
    pub next_seq: u64,
    /// The last archive whose Phase 1 committed (0: none).
    pub phase1_ready: u64,
    /// Creation time.
    pub created_at_ms: i64,
}

/// One session, as `ls` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SessionEntry {
    /// The session.
    pub uri: CtxUri,
    /// Its title.
    pub title: String,
    /// Messages appended so far (live and archived).
    pub appended: u64,
    /// Archives committed.
    pub archives: u64,
    /// Last change.
    pub updated_at_ms: i64,
}

pub(crate) fn meta_u64(meta: &Meta, key: &str, default: u64) -> u64 {
    meta.get(key).and_then(Value::as_u64).unwrap_or(default)
}

fn is_session(node: &ContextNode) -> bool {
    node.meta.get(session_meta::SESSION) == Some(&Value::Bool(true))
}

/// The session node at `layout`, or not-found (a node there that is no session counts as
/// missing: `ce session new` creates one).
pub(crate) fn read_session(s: &Sessions<'_>, layout: &SessionLayout) -> Result<ContextNode> {
    match s.store.read_node(layout.session())? {
        Some(n) if is_session(&n) => Ok(n),
        Some(_) => Err(CoreError::InvalidField {
            field: "session",
            reason: format!(
                "{} exists but is not a session (it was not made by `ce session new`)",
                layout.session()
            ),
        }
        .into()),
        None => Err(StoreError::NodeNotFound {
            uri: layout.session().clone(),
        }
        .into()),
    }
}

/// The nodes of `uri`'s subtree, none when it does not exist.
pub(crate) fn subtree(s: &Sessions<'_>, uri: &CtxUri) -> Result<Vec<ContextNode>> {
    match s.store.read_subtree(uri) {
        Ok(n) => Ok(n),
        Err(StoreError::NodeNotFound { .. }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// The live messages of a session, in order.
pub(crate) fn live_messages(s: &Sessions<'_>, layout: &SessionLayout) -> Result<Vec<Message>> {
    let dir = layout.messages();
    let mut out: Vec<Message> = subtree(s, &dir)?
        .iter()
        .filter(|n| n.parent_uri == dir)
        .filter_map(Message::from_node)
        .collect();
    out.sort_by_key(|m| m.seq);
    Ok(out)
}

fn archive_view(node: &ContextNode) -> Option<ArchiveView> {
    let number = node.meta.get(archive_meta::NUMBER)?.as_u64()?;
    let str_of = |k: &str| node.meta.get(k).and_then(Value::as_str).map(str::to_owned);
    Some(ArchiveView {
        uri: node.uri.clone(),
        number,
        state: ArchiveState::of(&node.meta),
        extraction: ExtractionState::of(&node.meta),
        note: str_of(archive_meta::EXTRACTION_NOTE),
        messages: node
            .meta
            .get(archive_meta::MESSAGE_IDS)
            .and_then(Value::as_array)
            .map_or(0, |a| a.len() as u64),
        summary: node.layers.abstract_text.clone(),
        diff: str_of(archive_meta::DIFF),
    })
}

impl Sessions<'_> {
    pub(crate) fn guarded(&self) -> Guarded<'_> {
        Guarded {
            store: self.store,
            locks: self.locks,
        }
    }

    pub(crate) fn woke(&self) {
        if let Some(w) = self.wake {
            w.notify();
        }
    }

    /// Creates the session at `uri` (`ctx://A/users/U/sessions/S` or `…/agents/G/…`) with
    /// an optional title; one that exists is `already_exists`.
    pub fn create(&self, uri: &CtxUri, title: Option<String>) -> Result<SessionView> {
        let layout = SessionLayout::of(uri)?;
        let mut meta = Meta::new();
        meta.insert(session_meta::SESSION.into(), true.into());
        meta.insert(session_meta::NEXT_SEQ.into(), 1.into());
        meta.insert(session_meta::NEXT_ARCHIVE.into(), 1.into());
        meta.insert(session_meta::PHASE1_READY.into(), 0.into());
        meta.insert(session_meta::ARCHIVED_MESSAGES.into(), 0.into());
        self.store
            .put(
                layout.session(),
                PutRequest {
                    mode: PutMode::Replace,
                    content: title.filter(|t| !t.trim().is_empty()),
                    meta,
                    expect_version: Some(0),
                    ..PutRequest::default()
                },
            )
            .map_err(|e| match e {
                StoreError::VersionConflict { .. } => StoreError::AlreadyExists {
                    uri: layout.session().clone(),
                },
                e => e,
            })?;
        self.woke();
        self.show(uri)
    }

    /// Appends one message under the session's EXACT lock: the message node and the
    /// session's counter, in one transaction (never a rewrite of the history). A retried
    /// append with the same id returns the stored message (`created: false`); the same id
    /// with another role or content is `already_exists`.
    pub fn add(&self, req: AddMessage) -> Result<Appended> {
        let layout = SessionLayout::of(&req.uri)?;
        if req.content.trim().is_empty() {
            return Err(CoreError::InvalidField {
                field: "content",
                reason: "a message needs content".into(),
            }
            .into());
        }
        if let Some(id) = &req.id {
            check_message_id(id)?;
        }
        let lock = [LockRequest::exact(layout.session().clone())];
        let out = self.guarded().with_locks(&lock, |fences| {
            let session = read_session(self, &layout)?;
            if let Some(id) = &req.id {
                let uri = layout.message(id)?;
                let conflict = |role_differs: bool, content_differs: bool| {
                    let what = if role_differs {
                        "role"
                    } else if content_differs {
                        "content"
                    } else {
                        return Ok(());
                    };
                    Err(SessionError::MessageConflict {
                        session: layout.session().to_string(),
                        id: id.clone(),
                        what,
                    })
                };
                if let Some(m) = self
                    .store
                    .read_node(&uri)?
                    .as_ref()
                    .and_then(Message::from_node)
                {
                    conflict(m.role != req.role, m.content != req.content)?;
                    return Ok(Appended {
                        session: layout.session().clone(),
                        uri,
                        id: id.clone(),
                        seq: m.seq,
                        created: false,
                        archive: None,
                    });
                }
                if let Some(a) = self.archived_message(&layout, &session, id)? {
                    // The transcript holds `role: content` (content trimmed).
                    let (role, content) = a.text.split_once(": ").unwrap_or(("", &a.text));
                    conflict(role != req.role.to_string(), content != req.content.trim())?;
                    return Ok(Appended {
                        session: layout.session().clone(),
                        uri,
                        id: id.clone(),
                        seq: a.seq,
                        created: false,
                        archive: Some(a.archive),
                    });
                }
            }
            let seq = meta_u64(&session.meta, session_meta::NEXT_SEQ, 1);
            let id = req.id.clone().unwrap_or_else(|| generated_message_id(seq));
            let uri = layout.message(&id)?;
            let message = Message {
                id: id.clone(),
                seq,
                role: req.role,
                content: req.content.clone(),
                time_ms: req.time_ms.unwrap_or_else(|| SystemClock.now_ms()),
                parts: req.parts.clone(),
            };
            let mut counters = Meta::new();
            counters.insert(session_meta::NEXT_SEQ.into(), (seq + 1).into());
            let ops = vec![
                WriteOp::Put {
                    uri: uri.clone(),
                    req: PutRequest {
                        mode: PutMode::Replace,
                        content: Some(message.content.clone()),
                        meta: message.meta(),
                        expect_version: Some(0),
                        ..PutRequest::default()
                    },
                },
                WriteOp::Put {
                    uri: layout.session().clone(),
                    req: PutRequest {
                        // No version fence: the EXACT lock keeps every other session
                        // writer out, and a derived L0/L1 written meanwhile is kept.
                        mode: PutMode::Merge,
                        meta: counters,
                        ..PutRequest::default()
                    },
                },
            ];
            self.store.apply_fenced(fences, ops)?;
            Ok(Appended {
                session: layout.session().clone(),
                uri,
                id,
                seq,
                created: true,
                archive: None,
            })
        })?;
        self.woke();
        Ok(out)
    }

    /// Message `id` in one of the session's newest [`RETRY_ARCHIVES`] archives (read newest
    /// first, metadata only until one lists the id; then its transcript).
    fn archived_message(
        &self,
        layout: &SessionLayout,
        session: &ContextNode,
        id: &str,
    ) -> Result<Option<ArchivedMessage>> {
        let next = meta_u64(&session.meta, session_meta::NEXT_ARCHIVE, 1);
        for n in (next.saturating_sub(RETRY_ARCHIVES).max(1)..next).rev() {
            let uri = layout.archive(n);
            let stat = match self.store.stat(&uri) {
                Ok(s) => s,
                Err(StoreError::NodeNotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let ids = phase2::archived_ids(&stat.meta);
            let Some(pos) = ids.iter().position(|i| i == id) else {
                continue;
            };
            let Some(node) = self.store.read_node(&uri)? else {
                continue;
            };
            // Every id, in order: a block ends where the next message's begins.
            let text = transcript_texts(&node.layers.content, &ids)
                .remove(id)
                .unwrap_or_default();
            // Phase 1 archives a run of consecutive messages, in order.
            let seq = meta_u64(&stat.meta, archive_meta::FIRST_SEQ, 1) + pos as u64;
            return Ok(Some(ArchivedMessage {
                archive: uri,
                seq,
                text,
            }));
        }
        Ok(None)
    }

    /// The session with its live messages and its archives.
    pub fn show(&self, uri: &CtxUri) -> Result<SessionView> {
        let layout = SessionLayout::of(uri)?;
        let session = read_session(self, &layout)?;
        let messages = live_messages(self, &layout)?;
        let dir = layout.archives();
        let mut archives: Vec<ArchiveView> = subtree(self, &dir)?
            .iter()
            .filter(|n| n.parent_uri == dir)
            .filter_map(archive_view)
            .collect();
        archives.sort_by_key(|a| a.number);
        Ok(SessionView {
            uri: layout.session().clone(),
            title: session.layers.content.clone(),
            version: session.version,
            messages,
            archives,
            next_seq: meta_u64(&session.meta, session_meta::NEXT_SEQ, 1),
            phase1_ready: meta_u64(&session.meta, session_meta::PHASE1_READY, 0),
            created_at_ms: session.created_at_ms,
        })
    }

    /// The sessions under `within`: an owner (`ctx://A/users/U`), its `sessions` folder, an
    /// account, or (`None`) every account.
    pub fn ls(&self, within: Option<&CtxUri>) -> Result<Vec<SessionEntry>> {
        let folders: Vec<CtxUri> = match within {
            Some(u) if SessionLayout::owner_of(u).is_some() => {
                vec![u.join("sessions").map_err(CoreError::from)?]
            }
            Some(u)
                if u.name() == "sessions"
                    && u.parent()
                        .and_then(|p| SessionLayout::owner_of(&p))
                        .is_some() =>
            {
                vec![u.clone()]
            }
            Some(u) if u.depth() == 1 => self.owner_session_folders(u)?,
            Some(u) => {
                return Err(CoreError::InvalidField {
                    field: "uri",
                    reason: format!(
                        "{u} is not an account, an owner (ctx://A/users/U, ctx://A/agents/G) \
                         or its sessions folder"
                    ),
                }
                .into());
            }
            None => {
                let mut out = Vec::new();
                for account in self.store.ls(&CtxUri::root())? {
                    out.extend(self.owner_session_folders(&account.uri)?);
                }
                out
            }
        };
        let mut out = Vec::new();
        for folder in folders {
            let children = match self.store.ls(&folder) {
                Ok(c) => c,
                Err(StoreError::NodeNotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            for s in children {
                if s.meta.get(session_meta::SESSION) != Some(&Value::Bool(true)) {
                    continue;
                }
                let node = self.store.read_node(&s.uri)?;
                out.push(SessionEntry {
                    uri: s.uri.clone(),
                    title: node.map(|n| n.layers.content).unwrap_or_default(),
                    appended: meta_u64(&s.meta, session_meta::NEXT_SEQ, 1).saturating_sub(1),
                    archives: meta_u64(&s.meta, session_meta::NEXT_ARCHIVE, 1).saturating_sub(1),
                    updated_at_ms: s.updated_at_ms,
                });
            }
        }
        Ok(out)
    }

    /// `…/users/*/sessions` and `…/agents/*/sessions` of `account`.
    fn owner_session_folders(&self, account: &CtxUri) -> Result<Vec<CtxUri>> {
        let mut out = Vec::new();
        for kind in ["users", "agents"] {
            let dir = account.join(kind).map_err(CoreError::from)?;
            let owners = match self.store.ls(&dir) {
                Ok(o) => o,
                Err(StoreError::NodeNotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            for o in owners {
                out.push(o.uri.join("sessions").map_err(CoreError::from)?);
            }
        }
        Ok(out)
    }
}
