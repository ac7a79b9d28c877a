//! The `filesystem` provider: lock files in a mirror of the `ctx://` tree, shared by the
//! processes of one host.
//!
//! `ctx://acc/a/b` maps to the directory `<dir>/acc/a/b` (the root to `<dir>`). Tokens hold
//! `{owner}:{time_ns}:{E|T}:{fence}`:
//!
//! - EXACT on `p`: the sidecar `<dir of parent(p)>/.exact.ovlock.<name>.<hash>`, where
//!   `<hash>` is the first 16 hex digits of the SHA-256 of the full `ctx://` path (the spec
//!   says SHA-1; SHA-256 is what the workspace already depends on) and `<name>` the last
//!   segment, cut to 100 bytes (only the hash identifies the path);
//! - TREE on `p`: `<dir of p>/.path.ovlock` (the directory is created for it).
//!
//! The mode is always read from the token's letter, never from the file name (spec: either
//! file may hold either type). An acquire checks the same path (both files), the TREE tokens
//! of every ancestor in the scope and, for TREE, every token below the path; stale tokens it
//! meets are removed; then it creates the files with `O_EXCL` and reads them back.
//!
//! Every operation (the check and the writes of an acquire, refresh, release, transfer) runs
//! under an exclusive advisory lock on `<dir>/.fence`, the file that also holds the fence
//! counter. That makes a batch atomic among the processes of the host, like the Redis
//! provider's Lua script, and closes the races the spec's write-then-recheck protocol leaves
//! open (a holder whose stamp is older but whose write is later, a stale cleanup that
//! deletes a token refreshed in between). Only processes that use this protocol are
//! coordinated; the directory must be on a local filesystem (advisory locks, `rename` and
//! `O_EXCL` are unreliable on NFS).
//!
//! Segments that could be mistaken for the provider's own files (`.fence`, names starting
//! with `.` that contain `ovlock`, names starting with `%`) get a `%` prefix in the mirror;
//! segments over 200 bytes become `%~<sha-256 hex>`. Directories created for tokens stay.

use std::borrow::Cow;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ce_core::CtxUri;
use sha2::{Digest, Sha256};

use crate::{
    Attempt, FenceToken, LockError, LockMode, LockProvider, LockRequest, Result, Token, next_fence,
};

/// File name of a TREE token (and of the spec's directory-resident EXACT token).
pub const TREE_FILE: &str = ".path.ovlock";
/// File-name prefix of an EXACT sidecar.
pub const SIDECAR_PREFIX: &str = ".exact.ovlock.";
/// The fence counter, also the file every operation locks.
pub const FENCE_FILE: &str = ".fence";
const TMP_PREFIX: &str = ".tmp.ovlock.";
/// Longest segment name kept in a sidecar file name.
const SIDECAR_NAME_MAX: usize = 100;
/// Longest segment mirrored as is.
const SEGMENT_MAX: usize = 200;

/// The `filesystem` provider.
#[derive(Debug)]
pub struct FilesystemProvider {
    dir: PathBuf,
}

/// A token as a lock file stores it.
#[derive(Debug, Clone, PartialEq)]
struct Stored {
    owner: String,
    time_ns: u64,
    mode: LockMode,
    fence: FenceToken,
}

impl Stored {
    fn parse(text: &str) -> Option<Stored> {
        let mut parts = text.trim_end().split(':');
        let owner = parts.next()?;
        let time_ns = parts.next()?.parse().ok()?;
        let mode = match parts.next()? {
            "E" => LockMode::Exact,
            "T" => LockMode::Tree,
            _ => return None,
        };
        let fence = FenceToken(parts.next()?.parse().ok()?);
        if owner.is_empty() || parts.next().is_some() {
            return None;
        }
        Some(Stored {
            owner: owner.to_owned(),
            time_ns,
            mode,
            fence,
        })
    }

    fn text(&self) -> String {
        format!(
            "{}:{}:{}:{}\n",
            self.owner,
            self.time_ns,
            self.mode.letter(),
            self.fence
        )
    }

    fn matches(&self, t: &Token) -> bool {
        self.owner == t.owner && self.fence == t.fence && self.mode == t.request.mode
    }
}

fn io_err(path: &Path, e: io::Error) -> LockError {
    LockError::Provider {
        provider: "filesystem",
        message: format!("{}: {e}", path.display()),
    }
}

fn escape_segment(s: &str) -> Cow<'_, str> {
    if s.len() > SEGMENT_MAX {
        return Cow::Owned(format!("%~{}", hex::encode(Sha256::digest(s.as_bytes()))));
    }
    if s.starts_with('%') || s == FENCE_FILE || (s.starts_with('.') && s.contains("ovlock")) {
        Cow::Owned(format!("%{s}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// The segment a mirror directory name stands for; `None` for a hashed long segment.
fn unescape_segment(s: &str) -> Option<&str> {
    if s.starts_with("%~") {
        None
    } else {
        Some(s.strip_prefix('%').unwrap_or(s))
    }
}

fn path_hash(uri: &CtxUri) -> String {
    hex::encode(&Sha256::digest(uri.as_str().as_bytes())[..8])
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Whether a token of `time_ns` is stale at `now_ns`.
fn is_stale(time_ns: u64, now_ns: u64, expire_ns: u64) -> bool {
    now_ns.saturating_sub(time_ns) > expire_ns
}

/// Writes `text` to `path` atomically (a temporary file in the same directory, renamed).
fn replace_file(path: &Path, text: &str) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!("{TMP_PREFIX}{}", uuid::Uuid::now_v7().simple()));
    fs::write(&tmp, text).map_err(|e| io_err(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err(path, e)
    })
}

/// Creates `path` with `text`; `Ok(false)` when it exists.
fn create_new(path: &Path, text: &str) -> Result<bool> {
    let mut f = match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(io_err(path, e)),
    };
    if let Err(e) = f.write_all(text.as_bytes()) {
        let _ = fs::remove_file(path);
        return Err(io_err(path, e));
    }
    Ok(true)
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path, e)),
    }
}

/// The exclusive advisory lock on the fence file, held for one operation.
struct Guard {
    file: File,
    path: PathBuf,
}

impl Guard {
    /// Issues the next fence: `max(last + 1, now_us)`, stored as 20 fixed-width digits so an
    /// in-place rewrite never leaves a shorter number behind.
    fn next_fence(&mut self, now_ns: u64) -> Result<FenceToken> {
        let mut text = String::new();
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.read_to_string(&mut text))
            .map_err(|e| io_err(&self.path, e))?;
        let last = text.trim().parse::<u64>().unwrap_or(0);
        let fence = next_fence(last, now_ns);
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.write_all(format!("{:020}\n", fence.0).as_bytes()))
            .map_err(|e| io_err(&self.path, e))?;
        Ok(fence)
    }
}

impl FilesystemProvider {
    /// The provider over lock directory `dir` (created when missing).
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let p = FilesystemProvider {
            dir: dir.to_path_buf(),
        };
        drop(p.guard()?);
        Ok(p)
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The lock file of a request: the sidecar for EXACT, `.path.ovlock` for TREE.
    pub fn location(&self, req: &LockRequest) -> PathBuf {
        match req.mode {
            LockMode::Exact => self.sidecar(&req.path),
            LockMode::Tree => self.mirror(&req.path).join(TREE_FILE),
        }
    }

    fn mirror(&self, uri: &CtxUri) -> PathBuf {
        let mut p = self.dir.clone();
        for s in uri.segments() {
            p.push(escape_segment(s).as_ref());
        }
        p
    }

    fn sidecar(&self, uri: &CtxUri) -> PathBuf {
        let dir = uri
            .parent()
            .map_or_else(|| self.dir.clone(), |p| self.mirror(&p));
        dir.join(format!(
            "{SIDECAR_PREFIX}{}.{}",
            truncate(uri.name(), SIDECAR_NAME_MAX),
            path_hash(uri)
        ))
    }

    fn guard(&self) -> Result<Guard> {
        let path = self.dir.join(FENCE_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        file.lock().map_err(|e| io_err(&path, e))?;
        Ok(Guard { file, path })
    }

    /// The token in `path`, if any. A file that does not parse is a leftover of a crash
    /// between create and write (tokens are only written under the guard) and is removed.
    fn read(&self, path: &Path) -> Result<Option<Stored>> {
        let text = match fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(path, e)),
        };
        match Stored::parse(&text) {
            Some(s) => Ok(Some(s)),
            None => {
                tracing::warn!(path = %path.display(), "removing an unreadable lock file");
                remove_if_present(path)?;
                Ok(None)
            }
        }
    }

    /// The live conflicting token of another owner in `loc` (a lock of `path`), removing it
    /// when stale; only TREE tokens count when `only_tree`.
    fn conflict_at(
        &self,
        loc: &Path,
        path: &CtxUri,
        only_tree: bool,
        owner: &str,
        now_ns: u64,
        expire_ns: u64,
    ) -> Result<Option<(LockRequest, String)>> {
        let Some(s) = self.read(loc)? else {
            return Ok(None);
        };
        if s.owner == owner {
            return Ok(None);
        }
        if is_stale(s.time_ns, now_ns, expire_ns) {
            tracing::info!(path = %path, owner = %s.owner, "removing a stale lock");
            remove_if_present(loc)?;
            return Ok(None);
        }
        if only_tree && s.mode != LockMode::Tree {
            return Ok(None);
        }
        Ok(Some((
            LockRequest {
                path: path.clone(),
                mode: s.mode,
            },
            s.owner,
        )))
    }

    /// The first live lock of another owner that conflicts with `req`.
    fn check(
        &self,
        req: &LockRequest,
        owner: &str,
        now_ns: u64,
        expire_ns: u64,
    ) -> Result<Option<(LockRequest, String)>> {
        let p = &req.path;
        let here = [self.sidecar(p), self.mirror(p).join(TREE_FILE)];
        for loc in &here {
            if let Some(c) = self.conflict_at(loc, p, false, owner, now_ns, expire_ns)? {
                return Ok(Some(c));
            }
        }
        for a in p.ancestors() {
            for loc in [self.sidecar(&a), self.mirror(&a).join(TREE_FILE)] {
                if let Some(c) = self.conflict_at(&loc, &a, true, owner, now_ns, expire_ns)? {
                    return Ok(Some(c));
                }
            }
        }
        // Below the root lie other scopes: a TREE lock on the root conflicts with none.
        if req.mode == LockMode::Tree && !p.is_root() {
            return self.check_subtree(&self.mirror(p), p, owner, now_ns, expire_ns);
        }
        Ok(None)
    }

    /// Every token below (and in) mirror directory `dir` of `uri`; a missing directory holds
    /// none.
    fn check_subtree(
        &self,
        dir: &Path,
        uri: &CtxUri,
        owner: &str,
        now_ns: u64,
        expire_ns: u64,
    ) -> Result<Option<(LockRequest, String)>> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_err(dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            let kind = entry.file_type().map_err(|e| io_err(&entry.path(), e))?;
            if kind.is_dir() {
                // Best effort for the report: a hashed segment names its parent.
                let child = unescape_segment(name)
                    .and_then(|n| uri.join(n).ok())
                    .unwrap_or_else(|| uri.clone());
                if let Some(c) =
                    self.check_subtree(&entry.path(), &child, owner, now_ns, expire_ns)?
                {
                    return Ok(Some(c));
                }
            } else if kind.is_file() {
                let path = if name == TREE_FILE {
                    uri.clone()
                } else if let Some(rest) = name.strip_prefix(SIDECAR_PREFIX) {
                    rest.rsplit_once('.')
                        .filter(|(n, _)| n.len() < SIDECAR_NAME_MAX)
                        .and_then(|(n, _)| uri.join(n).ok())
                        .unwrap_or_else(|| uri.clone())
                } else {
                    continue;
                };
                if let Some(c) =
                    self.conflict_at(&entry.path(), &path, false, owner, now_ns, expire_ns)?
                {
                    return Ok(Some(c));
                }
            }
        }
        Ok(None)
    }

    /// Writes the batch's tokens; on any failure removes those already written.
    fn write_batch(
        &self,
        owner: &str,
        reqs: &[LockRequest],
        now_ns: u64,
        fence: FenceToken,
    ) -> Result<Vec<Token>> {
        let mut written: Vec<PathBuf> = Vec::with_capacity(reqs.len());
        let mut out = Vec::with_capacity(reqs.len());
        for req in reqs {
            match self.write_one(owner, req, now_ns, fence) {
                Ok(token) => {
                    written.push(PathBuf::from(&token.location));
                    out.push(token);
                }
                Err(e) => {
                    for w in &written {
                        if let Err(e) = remove_if_present(w) {
                            tracing::warn!(error = %e, "rollback of a lock file failed");
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn write_one(
        &self,
        owner: &str,
        req: &LockRequest,
        now_ns: u64,
        fence: FenceToken,
    ) -> Result<Token> {
        let loc = self.location(req);
        if let Some(dir) = loc.parent() {
            fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        }
        let stored = Stored {
            owner: owner.to_owned(),
            time_ns: now_ns,
            mode: req.mode,
            fence,
        };
        if !create_new(&loc, &stored.text())? {
            // The check left only our own token here (another grant of the same owner).
            match self.read(&loc)? {
                Some(s) if s.owner == owner => replace_file(&loc, &stored.text())?,
                _ => {
                    return Err(LockError::Provider {
                        provider: "filesystem",
                        message: format!("{}: lock file appeared during the grant", loc.display()),
                    });
                }
            }
        }
        // Ownership check: the file holds what we wrote.
        if self.read(&loc)?.as_ref() != Some(&stored) {
            return Err(LockError::Provider {
                provider: "filesystem",
                message: format!("{}: lock file changed during the grant", loc.display()),
            });
        }
        Ok(Token {
            request: req.clone(),
            owner: owner.to_owned(),
            time_ns: now_ns,
            fence,
            location: loc.display().to_string(),
        })
    }

    /// [`LockError::Lost`] for the first token not stored as written.
    fn check_owned(&self, tokens: &[Token]) -> Result<()> {
        for t in tokens {
            let loc = self.location(&t.request);
            if !self.read(&loc)?.is_some_and(|s| s.matches(t)) {
                return Err(LockError::Lost {
                    path: t.request.path.clone(),
                    reason: format!("{:?} token of {} gone or replaced", t.request.mode, t.owner),
                });
            }
        }
        Ok(())
    }

    /// Rewrites still-owned `tokens` stamped `now_ns`, to `new_owner` when given.
    fn restamp(
        &self,
        tokens: &[Token],
        new_owner: Option<&str>,
        now_ns: u64,
    ) -> Result<Vec<Token>> {
        let _guard = self.guard()?;
        self.check_owned(tokens)?;
        let mut out = Vec::with_capacity(tokens.len());
        for t in tokens {
            let owner = new_owner.unwrap_or(&t.owner);
            let loc = self.location(&t.request);
            let stored = Stored {
                owner: owner.to_owned(),
                time_ns: now_ns,
                mode: t.request.mode,
                fence: t.fence,
            };
            replace_file(&loc, &stored.text())?;
            out.push(Token {
                request: t.request.clone(),
                owner: owner.to_owned(),
                time_ns: now_ns,
                fence: t.fence,
                location: loc.display().to_string(),
            });
        }
        Ok(out)
    }
}

impl LockProvider for FilesystemProvider {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    fn try_acquire(
        &self,
        owner: &str,
        reqs: &[LockRequest],
        now_ns: u64,
        expire_ns: u64,
    ) -> Result<Vec<Token>, Attempt> {
        let mut guard = self.guard()?;
        // Nothing is created (no directory either) before the whole batch is clear.
        for req in reqs {
            if let Some((held, owner)) = self.check(req, owner, now_ns, expire_ns)? {
                return Err(Attempt::Conflict { held, owner });
            }
        }
        let fence = guard.next_fence(now_ns)?;
        Ok(self.write_batch(owner, reqs, now_ns, fence)?)
    }

    fn refresh(&self, tokens: &[Token], now_ns: u64) -> Result<Vec<Token>> {
        self.restamp(tokens, None, now_ns)
    }

    fn release(&self, tokens: &[Token]) -> Result<()> {
        let _guard = self.guard()?;
        for t in tokens {
            let loc = self.location(&t.request);
            if self.read(&loc)?.is_some_and(|s| s.matches(t)) {
                remove_if_present(&loc)?;
            }
        }
        Ok(())
    }

    fn transfer(&self, tokens: &[Token], new_owner: &str, now_ns: u64) -> Result<Vec<Token>> {
        self.restamp(tokens, Some(new_owner), now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    #[test]
    fn token_text_round_trips_and_rejects_garbage() {
        let s = Stored {
            owner: "12-abc".into(),
            time_ns: 42,
            mode: LockMode::Tree,
            fence: FenceToken(7),
        };
        assert_eq!(s.text(), "12-abc:42:T:7\n");
        assert_eq!(Stored::parse(&s.text()), Some(s));
        for bad in ["", "o:1:X:2", "o:1:E", "o:x:E:2", "o:1:E:2:3", ":1:E:2"] {
            assert_eq!(Stored::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn layout_follows_the_spec() {
        let p = FilesystemProvider {
            dir: PathBuf::from("/locks"),
        };
        let docs = uri("ctx://acc/docs");
        let a = uri("ctx://acc/docs/a.md");
        assert_eq!(
            p.location(&LockRequest::tree(docs.clone())),
            PathBuf::from("/locks/acc/docs/.path.ovlock")
        );
        let side = p.location(&LockRequest::exact(a.clone()));
        assert_eq!(side.parent(), Some(Path::new("/locks/acc/docs")));
        assert_eq!(
            side.file_name().and_then(|n| n.to_str()),
            Some(format!(".exact.ovlock.a.md.{}", path_hash(&a)).as_str())
        );
        assert_eq!(path_hash(&a).len(), 16);
        assert_eq!(
            p.location(&LockRequest::tree(CtxUri::root())),
            PathBuf::from("/locks/.path.ovlock")
        );
        // Segments that look like the provider's own files are escaped.
        assert_eq!(
            p.mirror(&uri("ctx://.fence/.path.ovlock/%x")),
            PathBuf::from("/locks/%.fence/%.path.ovlock/%%x")
        );
        let long = "x".repeat(300);
        let m = p.mirror(&uri(&format!("ctx://acc/{long}")));
        let last = m.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(last.starts_with("%~") && last.len() == 66, "{last}");
    }
}
