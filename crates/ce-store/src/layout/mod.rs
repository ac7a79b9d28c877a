//! Import and export in the on-disk node layout (spec §2.2, DESIGN.md decision 2).
//!
//! Every node is a directory: `.abstract.md` (L0), `.overview.md` (L1), `content.md` (L2),
//! `.meta.json` (attributes and user metadata) and `.relations.json` (outgoing edges);
//! child nodes are sub-directories. Empty layers have no file. Relation targets inside the
//! exported tree are written relative to its root, so a tree can be imported elsewhere.
//!
//! Import of a plain file that is not part of the layout (e.g. `notes.md`) creates a leaf node
//! with the file as its content, so an ordinary folder of text files imports too. Export →
//! import → export is byte-identical.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::FileType;

use ce_core::{ContextNode, ContextType, CtxUri, Level, Meta, OwnerSpace};
use serde::{Deserialize, Serialize};

use crate::SourceStore;
use crate::error::{Result, StoreError};
use crate::model::{LinkRequest, NodeStamp, PutMode, PutRequest, WriteFence, WriteOp};
use ce_core::racy::FileStat;
pub use stat_cache::stat_cache_file;
use stat_cache::{DirRecord, StatCache};

mod stat_cache;
use ce_core::safety::DeleteSafety;

/// File holding a node's attributes and user metadata.
pub const META_FILE: &str = ".meta.json";
/// File holding a node's outgoing relations.
pub const RELATIONS_FILE: &str = ".relations.json";

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ImportReport {
    /// Nodes created or changed.
    pub nodes_written: u64,
    /// Nodes already identical (no event).
    pub nodes_unchanged: u64,
    /// Nodes whose outgoing relations changed.
    pub relations_written: u64,
    /// Events appended.
    pub events: u64,
    /// Files that are not part of the layout and were not imported, relative to the root.
    pub skipped: Vec<String>,
    /// With [`ImportOptions::prune`]: nodes under the target that the directory no longer
    /// has, removed with their subtrees.
    pub nodes_removed: u64,
    /// Of the unchanged nodes, those whose files were not even read: the stat cache
    /// vouched for their directories ([`ImportOptions::stat_cache`]).
    pub nodes_not_read: u64,
    /// Milliseconds spent reading the directory (the stat cache and the source's stamps
    /// included) and turning it into writes.
    pub read_ms: f64,
    /// Milliseconds of the write transaction (and of a prune's read of the target).
    pub write_ms: f64,
    /// Milliseconds spent recording the stat cache.
    pub record_ms: f64,
}

/// How an import treats what the target holds and the directory does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Remove nodes under the target that are absent from the directory (a re-sync). This is
    /// a derived deletion: over the delete-safety limits it is refused (`large_delete`)
    /// unless `allow_large_delete`.
    pub prune: bool,
    /// Lift the delete-safety limits of `prune` (after checking the directory is complete).
    pub allow_large_delete: bool,
    /// The stat cache's file ([`stat_cache_file`]): a directory whose entries and nodes are
    /// as the last import through this file left them is neither read nor compared, and the
    /// file is replaced by what this import read. `None`: every file is read, nothing is
    /// recorded.
    pub stat_cache: Option<PathBuf>,
    /// With `stat_cache`: trust none of it — every file is read and compared — and record
    /// what was read (`ce import --read-all`).
    pub read_all: bool,
}

/// What an export wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExportReport {
    /// Nodes exported.
    pub nodes: u64,
    /// Files written.
    pub files: u64,
}

/// `.meta.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetaFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    context_type: Option<ContextType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    category: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner_space: Option<OwnerSpace>,
    #[serde(default, skip_serializing_if = "Meta::is_empty")]
    meta: Meta,
}

/// One entry of `.relations.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RelationEntry {
    /// A path relative to the tree root (`""` is the root), or an absolute `ctx://` URI.
    to: String,
    #[serde(rename = "type")]
    relation_type: String,
    #[serde(default = "one")]
    weight: f64,
    #[serde(default)]
    reason: String,
}

fn one() -> f64 {
    1.0
}

fn at(path: &Path) -> impl FnOnce(StoreError) -> StoreError + '_ {
    move |e| StoreError::AtPath {
        path: path.to_owned(),
        source: Box::new(e),
    }
}

fn bad(path: &Path, reason: impl Into<String>) -> StoreError {
    StoreError::BadLayout {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// An I/O error of the import at `path`, worded as `fs_err` words its own.
fn io_at<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(rustix::io::Errno) -> StoreError + 'a {
    move |e| {
        let e = std::io::Error::from(e);
        StoreError::Io(std::io::Error::new(
            e.kind(),
            format!("failed to {what} `{}`: {e}", path.display()),
        ))
    }
}

/// The read buffer's first size and its least free space before a read: the files of a
/// node directory are small.
const READ_CHUNK: usize = 8 * 1024;

/// Reads the file `name` of the open directory `dir` whole into `buf` (`path` names it in
/// errors) in four system calls — open, read, the read that meets its end, close — where
/// `fs::read` makes seven (it also asks twice for the size and once for the position to
/// size its buffer): the files of a node layout are small, and opening and reading them is
/// most of a no-op re-import. `buf` is the caller's, reused from file to file. With
/// `stamp`, the open file's stat is taken before it is read, for the stat cache (a change
/// made after it then shows in the next import's stat).
fn read_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    path: &Path,
    buf: &mut Vec<u8>,
    stamp: bool,
) -> Result<Option<FileStat>> {
    use rustix::fs::{Mode, OFlags};
    let file = rustix::io::retry_on_intr(|| {
        rustix::fs::openat(dir, name, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
    })
    .map_err(io_at(path, "open"))?;
    let stamp = match stamp {
        true => Some(stat_cache::stat_of_record(
            &rustix::fs::fstat(&file).map_err(io_at(path, "stat"))?,
        )),
        false => None,
    };
    buf.clear();
    loop {
        if buf.capacity() - buf.len() < READ_CHUNK / 2 {
            buf.reserve(buf.capacity().max(READ_CHUNK));
        }
        let read = rustix::io::retry_on_intr(|| {
            rustix::io::read(&file, rustix::buffer::spare_capacity(buf))
        })
        .map_err(io_at(path, "read"))?;
        if read == 0 {
            break;
        }
    }
    Ok(stamp)
}

/// The text of a file read into `buf` (allocated at its size), or the layout error naming
/// `path` when it is not UTF-8.
fn text_of(buf: &[u8], path: &Path) -> Result<String> {
    std::str::from_utf8(buf)
        .map(str::to_owned)
        .map_err(|_| bad(path, "is not valid UTF-8"))
}

/// A directory opened and listed: its stream (still open, for [`read_at`]), its stat when
/// asked for, and its entries.
type Listing = (rustix::fs::Dir, Option<FileStat>, Vec<(CString, FileType)>);

/// The entries of the directory at `path` (without `.` and `..`), in name order. An entry
/// whose type the directory does not record (some file systems) is asked for it, without
/// following a symbolic link. The directory stays open in the returned stream, for
/// [`read_at`]. With `stamp`, the directory's stat, taken before it is listed.
fn read_dir_at(path: &Path, stamp: bool) -> Result<Listing> {
    use rustix::fs::{AtFlags, Dir, Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = rustix::io::retry_on_intr(|| {
        rustix::fs::openat(rustix::fs::CWD, path, flags, Mode::empty())
    })
    .map_err(io_at(path, "open directory"))?;
    let stamp = match stamp {
        true => Some(stat_cache::stat_of_record(
            &rustix::fs::fstat(&fd).map_err(io_at(path, "stat"))?,
        )),
        false => None,
    };
    let mut dir = Dir::new(fd).map_err(io_at(path, "read directory"))?;
    let mut entries = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(io_at(path, "read directory"))?;
        let name = entry.file_name();
        if matches!(name.to_bytes(), b"." | b"..") {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => FileType::from_raw_mode(
                rustix::fs::statat(
                    dir.fd().map_err(io_at(path, "read directory"))?,
                    name,
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|e| io_at(&path.join(OsStr::from_bytes(name.to_bytes())), "stat")(e))?
                .st_mode,
            ),
            known => known,
        };
        entries.push((name.to_owned(), kind));
    }
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok((dir, stamp, entries))
}

/// Imports the node tree in `dir` so that `dir` itself becomes `into`, in one transaction:
/// either the whole tree (with its events) commits, or nothing does.
pub fn import_dir(store: &dyn SourceStore, dir: &Path, into: &CtxUri) -> Result<ImportReport> {
    Ok(import_dir_fenced(store, dir, into, ImportOptions::default(), &[], None)?.0)
}

/// [`import_dir`] under a path lock: the batch carries the lease's `fences`, and `hold` (a
/// [`WriteOp::Hold`]) goes last in the same transaction, so the lease is handed off exactly
/// when the import commits. Returns the report and whether the hold was recorded.
///
/// With [`ImportOptions::stat_cache`], the directories that cache vouches for are neither
/// read nor compared (their nodes count as unchanged and not read), and after the commit
/// the cache is replaced by what this import read.
pub fn import_dir_fenced(
    store: &dyn SourceStore,
    dir: &Path,
    into: &CtxUri,
    options: ImportOptions,
    fences: &[WriteFence],
    hold: Option<WriteOp>,
) -> Result<(ImportReport, bool)> {
    if !fs_err::metadata(dir)?.is_dir() {
        return Err(bad(dir, "is not a directory"));
    }
    // Before anything is read: a record's entries count only if their times lie before it.
    let started_ns = now_ns();
    let started = std::time::Instant::now();
    let cache = options
        .stat_cache
        .as_deref()
        .map(|file| match options.read_all {
            true => StatCache::default(),
            false => StatCache::load(file),
        });
    // What the source holds under the target, when records are to be checked against it.
    let stored: Vec<(CtxUri, NodeStamp)> = match &cache {
        Some(c) if !c.dirs.is_empty() => store.subtree_stamps(into)?,
        _ => Vec::new(),
    };
    let by_uri: HashMap<&str, NodeStamp> = stored.iter().map(|(u, s)| (u.as_str(), *s)).collect();
    let recall = cache.as_ref().map(|c| (c, &by_uri));
    let mut scans = scan_tree(dir, recall, options.stat_cache.is_some());
    let mut batch = Batch {
        record_at: options.stat_cache.as_ref().map(|_| started_ns),
        ..Batch::default()
    };
    walk(&mut scans, (dir, dir), (into, into), &mut batch)?;
    let Batch {
        puts,
        relations,
        mut report,
        vouched,
        kept,
        records,
        ..
    } = batch;
    report.read_ms = ms_since(started);
    let started = std::time::Instant::now();
    let n_puts = puts.len();
    let put_uris: Vec<CtxUri> = puts.iter().filter_map(WriteOp::put_uri).cloned().collect();
    let removals = if options.prune {
        let existing = match cache.is_some() && !stored.is_empty() {
            true => stored.iter().map(|(u, _)| u.clone()).collect(),
            false => store.subtree_uris(into)?,
        };
        let present = put_uris
            .iter()
            .map(CtxUri::as_str)
            .chain(vouched.iter().map(String::as_str));
        prune_ops(&existing, present, options.allow_large_delete, &mut report)?
    } else {
        Vec::new()
    };
    let mut ops = puts;
    ops.extend(relations);
    let n_ops = ops.len();
    ops.extend(removals);
    let with_hold = hold.is_some();
    ops.extend(hold);
    let outcomes = store.apply_fenced(fences, ops)?;
    // Every outcome's events count, the prune's DELETEs included.
    report.events = outcomes.iter().map(|o| o.event_ids.len() as u64).sum();
    let held = with_hold && outcomes.last().is_some_and(|o| o.changed);
    for (i, o) in outcomes.iter().take(n_ops).enumerate() {
        match (i < n_puts, o.changed) {
            (true, true) => report.nodes_written += 1,
            (true, false) => report.nodes_unchanged += 1,
            (false, true) => report.relations_written += 1,
            (false, false) => {}
        }
    }
    report.nodes_not_read = vouched.len() as u64;
    report.nodes_unchanged += report.nodes_not_read;
    report.write_ms = ms_since(started);
    let started = std::time::Instant::now();
    if let (Some(file), Some(mut cache)) = (&options.stat_cache, cache) {
        let unchanged = records.is_empty() && kept.len() == cache.dirs.len();
        if !unchanged {
            let written: HashMap<&str, u64> = put_uris
                .iter()
                .map(CtxUri::as_str)
                .zip(outcomes.iter().map(|o| o.version))
                .collect();
            let next = StatCache {
                dirs: kept
                    .into_iter()
                    .filter_map(|rel| cache.dirs.remove_entry(&rel))
                    .collect(),
            };
            if let Err(e) = record(store, into, &by_uri, next, records, &written, file) {
                tracing::warn!(file = %file.display(), error = %e, "import stat cache not written: the next import reads every file");
            }
        }
    }
    report.record_ms = ms_since(started);
    Ok((report, held))
}

/// Milliseconds since `t`, to the microsecond.
fn ms_since(t: std::time::Instant) -> f64 {
    ce_core::clock::ms_of(t.elapsed())
}

/// Wall-clock time in ns since the epoch.
fn now_ns() -> i64 {
    let ns = ce_core::racy::ns_since_epoch(std::time::SystemTime::now());
    i64::try_from(ns).unwrap_or(i64::MAX)
}

/// From how many nodes to stamp [`record`] reads the target's stamps in one range rather
/// than node by node.
const STAMPS_BY_RANGE_FROM: usize = 256;

/// Completes the records of the directories this import read with their nodes' stamps, adds
/// them to `next` and saves it to `file`. A node the import compared and found unchanged
/// keeps the stamp `before` read (the same version is the same row); the others are read
/// after the commit. A node that another writer changed since this import wrote or compared
/// it (its version is not the one `written` says) leaves its directory unrecorded: the next
/// import reads it.
fn record(
    store: &dyn SourceStore,
    into: &CtxUri,
    before: &HashMap<&str, NodeStamp>,
    mut next: StatCache,
    records: Vec<(PathBuf, DirRecord, Vec<CtxUri>)>,
    written: &HashMap<&str, u64>,
    file: &Path,
) -> Result<()> {
    let version = |u: &CtxUri| written.get(u.as_str()).copied();
    let ask: Vec<CtxUri> = records
        .iter()
        .flat_map(|(_, _, uris)| uris)
        .filter(|u| before.get(u.as_str()).map(|s| s.version) != version(u))
        .cloned()
        .collect();
    // Many (a first import): the target's stamps in one range read, cheaper than as many
    // lookups.
    let read = match ask.len() > STAMPS_BY_RANGE_FROM {
        true => store.subtree_stamps(into)?,
        false => ask
            .iter()
            .cloned()
            .zip(store.stamps(&ask)?)
            .filter_map(|(u, s)| Some((u, s?)))
            .collect(),
    };
    let after: HashMap<&str, NodeStamp> = read.iter().map(|(u, s)| (u.as_str(), *s)).collect();
    'dirs: for (rel, mut r, uris) in records {
        for u in uris {
            let stamp = after.get(u.as_str()).or_else(|| before.get(u.as_str()));
            match (stamp, version(&u)) {
                (Some(s), Some(v)) if s.version == v => r.nodes.push((u.as_str().to_owned(), *s)),
                _ => continue 'dirs,
            }
        }
        next.dirs.insert(rel, r);
    }
    next.save(file)?;
    Ok(())
}

/// The removals of a pruning import: every node of `existing` (what the target holds, in
/// URI order) that is not `present` in the directory, as one recursive rm per topmost such
/// node, after the delete-safety check.
fn prune_ops<'a>(
    existing: &[CtxUri],
    present: impl Iterator<Item = &'a str>,
    allow_large_delete: bool,
    report: &mut ImportReport,
) -> Result<Vec<WriteOp>> {
    let present: std::collections::HashSet<&str> = present.collect();
    let vanished: Vec<&CtxUri> = existing
        .iter()
        .filter(|u| !present.contains(u.as_str()))
        .collect();
    if !allow_large_delete {
        DeleteSafety::check(vanished.len() as u64, existing.len() as u64)?;
    }
    report.nodes_removed = vanished.len() as u64;
    // Parents sort before their children: keep only the topmost of each vanished subtree
    // (an ancestor looked up per node, not every root so far: a folder of 10,000 removed
    // files made that quadratic).
    let mut roots: Vec<&CtxUri> = Vec::new();
    let mut root_set: std::collections::HashSet<&CtxUri> = std::collections::HashSet::new();
    for u in vanished {
        if !u.ancestors().iter().any(|a| root_set.contains(a)) {
            roots.push(u);
            root_set.insert(u);
        }
    }
    Ok(roots
        .into_iter()
        .map(|uri| WriteOp::Rm {
            uri: uri.clone(),
            recursive: true,
            expect_version: None,
            trace_id: None,
        })
        .collect())
}

/// What one directory of an import holds, read by [`scan_dir`].
#[derive(Default)]
struct DirScan {
    /// `.abstract.md`, `.overview.md`, `content.md`.
    layers: [Option<String>; 3],
    meta: Option<MetaFile>,
    edges: Option<Vec<RelationEntry>>,
    /// Plain files (leaf nodes): name, path, text.
    files: Vec<(String, PathBuf, String)>,
    /// Sub-directories (child nodes): name, path.
    subdirs: Vec<(String, PathBuf)>,
    /// Entries not imported, relative to the root.
    skipped: Vec<String>,
    /// For the stat cache: the directory's stat, taken before it was listed, and the stats
    /// of the regular files read (skipped ones too: a binary file may become text).
    stamps: Option<(FileStat, Vec<(CString, FileStat)>)>,
    /// The stat cache vouched for the directory: nothing was read, `subdirs` and `skipped`
    /// are its record's, and these are the URIs of its nodes.
    vouched: Option<Vec<String>>,
}

/// Reads one directory of an import (its entries in name order, not its sub-directories);
/// with `stamp`, with the stats the stat cache records.
fn scan_dir(root_dir: &Path, dir: &Path, stamp: bool) -> Result<DirScan> {
    let (listing, dir_stamp, entries) = read_dir_at(dir, stamp)?;
    let fd = listing.fd().map_err(io_at(dir, "read directory"))?;
    let mut scan = DirScan::default();
    let mut file_stamps = Vec::new();
    let mut buf = Vec::new();
    for (c_name, kind) in entries {
        let os_name = OsStr::from_bytes(c_name.to_bytes());
        let path = dir.join(os_name);
        let name = os_name.to_string_lossy().into_owned();
        if kind == FileType::Directory {
            scan.subdirs.push((name, path));
            continue;
        }
        let rel = || {
            path.strip_prefix(root_dir)
                .unwrap_or(&path)
                .display()
                .to_string()
        };
        if kind != FileType::RegularFile || (name.starts_with('.') && !is_layout_file(&name)) {
            scan.skipped.push(rel());
            continue;
        }
        if let Some(s) = read_at(fd, &c_name, &path, &mut buf, stamp)? {
            file_stamps.push((c_name.clone(), s));
        }
        match name.as_str() {
            n if Level::ALL.iter().any(|l| l.file_name() == n) => {
                let level = Level::ALL
                    .iter()
                    .position(|l| l.file_name() == n)
                    .unwrap_or(2);
                scan.layers[level] = Some(text_of(&buf, &path)?);
            }
            META_FILE => {
                scan.meta = Some(
                    serde_json::from_slice(&buf)
                        .map_err(|e| bad(&path, format!("does not parse: {e}")))?,
                );
            }
            RELATIONS_FILE => {
                scan.edges = Some(
                    serde_json::from_slice(&buf)
                        .map_err(|e| bad(&path, format!("does not parse: {e}")))?,
                );
            }
            _ => match text_of(&buf, &path) {
                Ok(text) => scan.files.push((name, path, text)),
                Err(StoreError::BadLayout { .. }) => scan.skipped.push(rel()),
                Err(e) => return Err(e),
            },
        }
    }
    scan.stamps = dir_stamp.map(|d| (d, file_stamps));
    Ok(scan)
}

/// Whether `name` is one of the files of the node layout.
fn is_layout_file(name: &str) -> bool {
    Level::ALL.iter().any(|l| l.file_name() == name) || name == META_FILE || name == RELATIONS_FILE
}

/// Directories of one level scanned on several threads from this many on.
const PARALLEL_SCAN_FROM: usize = 64;

/// What a stat cache can vouch for: its records, and the stamps of the nodes the source
/// holds under the target, by URI.
type Recall<'a> = (&'a StatCache, &'a HashMap<&'a str, NodeStamp>);

/// Reads every directory of the tree at `root_dir`, one level at a time, the directories
/// of a level on all cores (reading 10,000 small node directories is most of a no-op
/// re-import). A directory that `recall` vouches for is not read (only its entries'
/// stats are). A directory that fails to read keeps its error, reported when the walk
/// reaches it, so the error is the one a sequential walk would meet first. With `stamp`,
/// the directories read are read with their stats.
fn scan_tree(
    root_dir: &Path,
    recall: Option<Recall<'_>>,
    stamp: bool,
) -> HashMap<PathBuf, Result<DirScan>> {
    let mut scans = HashMap::new();
    let mut level = vec![root_dir.to_owned()];
    let vouched = |dir: &Path| -> Option<DirScan> {
        let (cache, stored) = recall?;
        let record = cache.dirs.get(dir.strip_prefix(root_dir).ok()?)?;
        record.still_holds(dir, stored).then(|| DirScan {
            subdirs: record.subdir_paths(dir),
            skipped: record.skipped.clone(),
            vouched: Some(record.nodes.iter().map(|(u, _)| u.clone()).collect()),
            ..DirScan::default()
        })
    };
    while !level.is_empty() {
        let read = ce_core::parallel::map_chunks(&level, PARALLEL_SCAN_FROM, |dirs| {
            dirs.iter()
                .map(|d| vouched(d).map_or_else(|| scan_dir(root_dir, d, stamp), Ok))
                .collect::<Vec<_>>()
        });
        let mut next = Vec::new();
        for (dir, scan) in level.into_iter().zip(read.into_iter().flatten()) {
            if let Ok(s) = &scan {
                next.extend(s.subdirs.iter().map(|(_, p)| p.clone()));
            }
            scans.insert(dir, scan);
        }
        level = next;
    }
    scans
}

/// What the walk of an import's directories gathers.
#[derive(Default)]
struct Batch {
    puts: Vec<WriteOp>,
    relations: Vec<WriteOp>,
    report: ImportReport,
    /// With the stat cache: when this import started; records are made of what it reads.
    record_at: Option<i64>,
    /// The URIs of the nodes of the directories the stat cache vouched for.
    vouched: Vec<String>,
    /// Those directories, relative to the root (their records are kept).
    kept: Vec<PathBuf>,
    /// The records of the directories read, relative to the root, with the URIs of their
    /// nodes (stamped after the commit).
    records: Vec<(PathBuf, DirRecord, Vec<CtxUri>)>,
}

/// The ops of the directory `dir` (node `uri`) under the import's root directory and, depth
/// first, of its sub-directories from their `scans`: a directory's node, its relations, its
/// plain files, then each sub-directory (parents before children).
fn walk(
    scans: &mut HashMap<PathBuf, Result<DirScan>>,
    (root_dir, dir): (&Path, &Path),
    (root_uri, uri): (&CtxUri, &CtxUri),
    batch: &mut Batch,
) -> Result<()> {
    let scan = scans
        .remove(dir)
        .unwrap_or_else(|| Err(bad(dir, "was not read before the walk (an internal error)")))?;
    let rel = dir.strip_prefix(root_dir).unwrap_or(dir).to_owned();
    if let Some(uris) = scan.vouched {
        batch.report.skipped.extend(scan.skipped);
        batch.vouched.extend(uris);
        batch.kept.push(rel);
        for (name, path) in scan.subdirs {
            let child = uri.join(&name).map_err(|e| at(&path)(e.into()))?;
            walk(scans, (root_dir, &path), (root_uri, &child), batch)?;
        }
        return Ok(());
    }
    let mut nodes = Vec::new();
    if uri.is_root() {
        if scan.layers.iter().any(Option::is_some) || scan.edges.is_some() {
            return Err(at(dir)(StoreError::RootNotWritable));
        }
    } else {
        // A missing `.abstract.md` / `.overview.md` is no layer from the client: the replace
        // drops what a client wrote before and keeps a derived one, so re-importing an
        // unchanged tree changes nothing.
        let [a, o, c] = scan.layers;
        let m = scan.meta.unwrap_or_default();
        let req = PutRequest {
            mode: PutMode::Replace,
            context_type: m.context_type,
            category: m.category,
            owner_space: m.owner_space,
            meta: m.meta,
            abstract_text: a,
            overview: o,
            content: Some(c.unwrap_or_default()),
            ..PutRequest::default()
        };
        nodes.push(uri.clone());
        batch.puts.push(WriteOp::Put {
            uri: uri.clone(),
            req,
        });
    }
    if let Some(edges) = scan.edges {
        let mut links = Vec::with_capacity(edges.len());
        for e in edges {
            let to = resolve_target(root_uri, &e.to).map_err(at(&dir.join(RELATIONS_FILE)))?;
            links.push(LinkRequest {
                from: uri.clone(),
                to,
                relation_type: e.relation_type,
                weight: e.weight,
                reason: e.reason,
                trace_id: None,
            });
        }
        batch.relations.push(WriteOp::SetRelations {
            from: uri.clone(),
            edges: links,
            trace_id: None,
        });
    }
    for (name, path, text) in scan.files {
        let child = uri.join(&name).map_err(|e| at(&path)(e.into()))?;
        let req = PutRequest {
            content: Some(text),
            ..PutRequest::default()
        };
        nodes.push(child.clone());
        batch.puts.push(WriteOp::Put { uri: child, req });
    }
    if let (Some(recorded_at_ns), Some((dir_stamp, files))) = (batch.record_at, scan.stamps) {
        let record = DirRecord {
            recorded_at_ns,
            dir: dir_stamp,
            files,
            subdirs: scan
                .subdirs
                .iter()
                .filter_map(|(_, p)| CString::new(p.file_name()?.as_bytes()).ok())
                .collect(),
            skipped: scan.skipped.clone(),
            nodes: Vec::new(),
        };
        batch.records.push((rel, record, nodes));
    }
    batch.report.skipped.extend(scan.skipped);
    for (name, path) in scan.subdirs {
        let child = uri.join(&name).map_err(|e| at(&path)(e.into()))?;
        walk(scans, (root_dir, &path), (root_uri, &child), batch)?;
    }
    Ok(())
}

fn resolve_target(root: &CtxUri, to: &str) -> Result<CtxUri> {
    if to.contains("://") {
        return Ok(CtxUri::parse(to).map_err(ce_core::CoreError::from)?);
    }
    if to.is_empty() {
        return Ok(root.clone());
    }
    let joined = if root.is_root() {
        format!("{root}{to}")
    } else {
        format!("{root}/{to}")
    };
    Ok(CtxUri::parse(&joined).map_err(ce_core::CoreError::from)?)
}

/// Exports the subtree at `uri` into `dir` (created if missing; must be empty).
pub fn export_tree(store: &dyn SourceStore, uri: &CtxUri, dir: &Path) -> Result<ExportReport> {
    if dir.exists() && fs_err::read_dir(dir)?.next().is_some() {
        return Err(bad(dir, "already exists and is not empty"));
    }
    let nodes = store.read_subtree(uri)?;
    if nodes.is_empty() && !uri.is_root() {
        return Err(StoreError::NodeNotFound { uri: uri.clone() });
    }
    fs_err::create_dir_all(dir)?;
    let mut report = ExportReport::default();
    for node in &nodes {
        let rel = node.uri.relative_to(uri).unwrap_or("");
        let node_dir: PathBuf = if rel.is_empty() {
            dir.to_owned()
        } else {
            dir.join(rel)
        };
        fs_err::create_dir_all(&node_dir)?;
        report.nodes += 1;
        report.files += write_node(store, uri, node, &node_dir)?;
    }
    Ok(report)
}

fn write_node(
    store: &dyn SourceStore,
    root: &CtxUri,
    node: &ContextNode,
    dir: &Path,
) -> Result<u64> {
    let mut files = 0;
    for level in Level::ALL {
        let text = node.layers.get(level);
        if !text.is_empty() {
            fs_err::write(dir.join(level.file_name()), text)?;
            files += 1;
        }
    }
    let meta = MetaFile {
        context_type: Some(node.context_type),
        category: Some(node.category.clone()),
        owner_space: Some(node.owner_space.clone()),
        meta: node.meta.clone(),
    };
    fs_err::write(dir.join(META_FILE), json_text(&meta)?)?;
    files += 1;
    let edges = store.get_edges(&node.uri)?;
    if !edges.is_empty() {
        let entries: Vec<RelationEntry> = edges
            .into_iter()
            .map(|e| RelationEntry {
                to: match e.to_uri.relative_to(root) {
                    Some(rel) if !root.is_root() => rel.to_owned(),
                    _ => e.to_uri.to_string(),
                },
                relation_type: e.relation_type,
                weight: e.weight,
                reason: e.reason,
            })
            .collect();
        fs_err::write(dir.join(RELATIONS_FILE), json_text(&entries)?)?;
        files += 1;
    }
    Ok(files)
}

fn json_text<T: Serialize>(v: &T) -> Result<String> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    Ok(s)
}

/// Lists a directory tree as sorted `(relative path, bytes)` pairs (for comparing exports).
pub fn snapshot_dir(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in fs_err::read_dir(&d)? {
            let path = entry?.path();
            let rel = path
                .strip_prefix(dir)
                .unwrap_or(&path)
                .display()
                .to_string();
            if path.is_dir() {
                out.insert(format!("{rel}/"), Vec::new());
                stack.push(path);
            } else {
                out.insert(rel, fs_err::read(&path)?);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContextFs, LinkRequest, OutboxFilter, OutboxStore, RelationStore};
    use crate::sqlite::SqliteStore;
    use ce_core::Config;

    fn uri(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    fn store(dir: &Path) -> SqliteStore {
        SqliteStore::open(dir, Config::default()).expect("open")
    }

    fn seed(s: &SqliteStore) {
        let put = |u: &str, a: &str, c: &str| {
            let req = PutRequest {
                abstract_text: Some(a.into()),
                content: Some(c.into()),
                meta: Meta::from([("tags".into(), serde_json::json!(["x", "y"]))]),
                ..PutRequest::default()
            };
            s.put(&uri(u), req).expect("put");
        };
        put("ctx://acc/docs/a", "A doc", "alpha\ncontent with 中文\r\n");
        put("ctx://acc/docs/b", "", "beta");
        put("ctx://acc/docs/b/c", "C", "");
        put("ctx://acc/other", "outside", "");
        for (from, to) in [
            ("ctx://acc/docs/a", "ctx://acc/docs/b/c"),
            ("ctx://acc/docs/a", "ctx://acc/other"),
        ] {
            s.link(LinkRequest {
                from: uri(from),
                to: uri(to),
                relation_type: "references".into(),
                weight: 0.25,
                reason: "because".into(),
                trace_id: None,
            })
            .expect("link");
        }
    }

    #[test]
    fn export_import_export_is_byte_identical_and_relocatable() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s1 = store(&tmp.path().join("s1"));
        seed(&s1);
        let d1 = tmp.path().join("d1");
        let r = export_tree(&s1, &uri("ctx://acc/docs"), &d1).expect("export");
        assert_eq!(r.nodes, 4);
        let rel: String =
            fs_err::read_to_string(d1.join("a").join(RELATIONS_FILE)).expect("relations");
        assert!(
            rel.contains("\"to\": \"b/c\"") && rel.contains("\"to\": \"ctx://acc/other\""),
            "{rel}"
        );

        let s2 = store(&tmp.path().join("s2"));
        s2.put(
            &uri("ctx://acc/other"),
            PutRequest {
                abstract_text: Some("o".into()),
                ..PutRequest::default()
            },
        )
        .expect("target outside the tree");
        let rep = import_dir(&s2, &d1, &uri("ctx://acc/docs")).expect("import");
        assert_eq!((rep.nodes_written, rep.relations_written), (4, 1));
        let d2 = tmp.path().join("d2");
        export_tree(&s2, &uri("ctx://acc/docs"), &d2).expect("export again");
        assert_eq!(
            snapshot_dir(&d1).expect("d1"),
            snapshot_dir(&d2).expect("d2")
        );

        // Into another place: in-tree relations follow, the tree is identical on re-export.
        let rep = import_dir(&s2, &d1, &uri("ctx://acc/copy")).expect("import elsewhere");
        assert_eq!(rep.nodes_written, 4);
        let edges = s2.get_edges(&uri("ctx://acc/copy/a")).expect("edges");
        assert!(
            edges
                .iter()
                .any(|e| e.to_uri.as_str() == "ctx://acc/copy/b/c")
        );
        let d3 = tmp.path().join("d3");
        export_tree(&s2, &uri("ctx://acc/copy"), &d3).expect("export copy");
        assert_eq!(
            snapshot_dir(&d1).expect("d1"),
            snapshot_dir(&d3).expect("d3")
        );

        // Re-importing the same tree changes nothing and appends no event.
        let events = || {
            s2.list(&OutboxFilter {
                limit: Some(100_000),
                ..OutboxFilter::default()
            })
            .expect("list")
            .len()
        };
        let before = events();
        let rep = import_dir(&s2, &d1, &uri("ctx://acc/docs")).expect("re-import");
        assert_eq!(
            (rep.nodes_written, rep.nodes_unchanged, rep.events),
            (0, 4, 0)
        );
        assert_eq!(before, events());
    }

    /// A prune removes each vanished subtree with one recursive rm of its topmost node, also
    /// when a look-alike sibling (`b!x`, which sorts between `b` and `b/c`) vanished too.
    #[test]
    fn a_prune_removes_each_vanished_subtree_from_its_top() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(&tmp.path().join("s"));
        let d = tmp.path().join("d");
        for (dir, text) in [
            ("b", "b"),
            ("b/c", "c"),
            ("b/c/e", "e"),
            ("b!x", "x"),
            ("k", "k"),
        ] {
            fs_err::create_dir_all(d.join(dir)).expect("mkdir");
            fs_err::write(d.join(dir).join("content.md"), text).expect("write");
        }
        import_dir(&s, &d, &uri("ctx://acc/t")).expect("import");
        fs_err::remove_dir_all(d.join("b")).expect("rm b");
        fs_err::remove_dir_all(d.join("b!x")).expect("rm b!x");
        let options = ImportOptions {
            prune: true,
            allow_large_delete: true,
            ..ImportOptions::default()
        };
        let (rep, _) =
            import_dir_fenced(&s, &d, &uri("ctx://acc/t"), options, &[], None).expect("prune");
        assert_eq!(rep.nodes_removed, 4, "{rep:?}");
        // One DELETE event per recursive rm: b and b!x, not b/c or b/c/e again.
        assert_eq!(rep.events, 2, "{rep:?}");
        let left: Vec<String> = s
            .subtree_uris(&uri("ctx://acc/t"))
            .expect("uris")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(left, ["ctx://acc/t", "ctx://acc/t/k"]);
    }

    #[test]
    fn import_is_all_or_nothing() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(&tmp.path().join("s"));
        let d = tmp.path().join("d");
        fs_err::create_dir_all(d.join("good")).expect("mkdir");
        fs_err::write(d.join("good").join("content.md"), "fine").expect("write");
        fs_err::create_dir_all(d.join("bad")).expect("mkdir");
        fs_err::write(
            d.join("bad").join(RELATIONS_FILE),
            r#"[{"to": "missing", "type": "x"}]"#,
        )
        .expect("write");
        let err = import_dir(&s, &d, &uri("ctx://acc/t")).expect_err("dangling relation");
        assert!(matches!(err, StoreError::NodeNotFound { .. }), "{err}");
        assert!(s.read_subtree(&CtxUri::root()).expect("read").is_empty());
        assert!(s.list(&OutboxFilter::default()).expect("list").is_empty());

        fs_err::write(d.join("bad").join(RELATIONS_FILE), "not json").expect("write");
        let err = import_dir(&s, &d, &uri("ctx://acc/t")).expect_err("bad json");
        assert!(matches!(err, StoreError::BadLayout { .. }), "{err}");
        assert!(err.to_string().contains(".relations.json"), "{err}");
    }

    #[test]
    fn plain_files_become_leaf_nodes() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(&tmp.path().join("s"));
        let d = tmp.path().join("d");
        fs_err::create_dir_all(&d).expect("mkdir");
        fs_err::write(d.join("notes.md"), "# Notes\nhello").expect("write");
        fs_err::write(d.join(".hidden"), "x").expect("write");
        fs_err::write(d.join("blob.bin"), [0xff, 0xfe, 0x00]).expect("write");
        // Larger than the read buffer's first size: read in several pieces.
        let big: String = (0..5 * READ_CHUNK / 7)
            .map(|i| format!("{i:06}\n"))
            .collect();
        fs_err::write(d.join("big.md"), &big).expect("write");
        // A symbolic link is not followed: not a node.
        std::os::unix::fs::symlink("notes.md", d.join("link.md")).expect("symlink");
        let rep = import_dir(&s, &d, &uri("ctx://acc/notes")).expect("import");
        assert_eq!(rep.skipped, [".hidden", "blob.bin", "link.md"]);
        let content = |u: &str| {
            s.read_node(&uri(u))
                .expect("read")
                .expect("node")
                .layers
                .content
        };
        assert_eq!(content("ctx://acc/notes/notes.md"), "# Notes\nhello");
        assert_eq!(content("ctx://acc/notes/big.md"), big);
    }

    /// A file gone between the listing and its read, and a directory that is not there, are
    /// I/O errors naming them; nothing is written.
    #[test]
    fn a_missing_entry_is_an_io_error_naming_it() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(&tmp.path().join("s"));
        let d = tmp.path().join("d");
        fs_err::create_dir_all(d.join("a")).expect("mkdir");
        fs_err::write(d.join("a").join("content.md"), "a").expect("write");
        // A dangling name: listed, but gone when opened (a file removed mid-scan).
        let missing = d.join("gone");
        let err = read_at(
            read_dir_at(&d, true).expect("list").0.fd().expect("fd"),
            c"gone",
            &missing,
            &mut Vec::new(),
            true,
        )
        .expect_err("no such file");
        assert!(matches!(&err, StoreError::Io(e) if e.kind() == std::io::ErrorKind::NotFound));
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
        let err = import_dir(&s, &d.join("nope"), &uri("ctx://acc/x")).expect_err("no dir");
        assert!(err.to_string().contains("nope"), "{err}");
        assert!(s.read_subtree(&uri("ctx://acc")).expect("read").is_empty());
    }

    /// A level of more than [`PARALLEL_SCAN_FROM`] directories is read on several threads:
    /// the ops come out in the walk's order all the same (parents first, each directory's
    /// files before its sub-directories), the skipped entries in that order too, and of two
    /// bad files the one a depth-first walk meets first is reported — although the other
    /// sits on a shallower level, read earlier.
    #[test]
    fn a_wide_tree_read_in_parallel_imports_in_walk_order_and_reports_the_first_bad_file() {
        let tmp = tempfile::tempdir().expect("tmp");
        let s = store(&tmp.path().join("s"));
        let d = tmp.path().join("d");
        let n = 3 * PARALLEL_SCAN_FROM;
        for i in 0..n {
            let node = d.join(format!("n{i:03}"));
            fs_err::create_dir_all(node.join("sub")).expect("mkdir");
            fs_err::write(node.join("content.md"), format!("doc {i}")).expect("write");
            fs_err::write(node.join("sub").join("content.md"), format!("sub {i}")).expect("write");
            fs_err::write(node.join("note.txt"), format!("note {i}")).expect("write");
            fs_err::write(node.join(".hidden"), "x").expect("write");
        }
        let rep = import_dir(&s, &d, &uri("ctx://acc/wide")).expect("import");
        assert_eq!(rep.nodes_written as usize, 1 + 3 * n);
        let hidden: Vec<String> = (0..n).map(|i| format!("n{i:03}/.hidden")).collect();
        assert_eq!(rep.skipped, hidden);
        let nodes = s.read_subtree(&uri("ctx://acc/wide")).expect("read");
        let mut expected = vec![("ctx://acc/wide".to_owned(), String::new())];
        for i in 0..n {
            let at = format!("ctx://acc/wide/n{i:03}");
            expected.push((at.clone(), format!("doc {i}")));
            expected.push((format!("{at}/note.txt"), format!("note {i}")));
            expected.push((format!("{at}/sub"), format!("sub {i}")));
        }
        expected.sort();
        let got: Vec<(String, String)> = nodes
            .iter()
            .map(|n| (n.uri.to_string(), n.layers.content.clone()))
            .collect();
        assert_eq!(got, expected);
        // Parents were written before their children: no child created its parent as an
        // empty container that the parent's own write then changed (a second version).
        // (The store was empty: every node it holds now, the target's ancestors included,
        // came with one event of this import.)
        let all = s.read_subtree(&CtxUri::root()).expect("read");
        assert!(all.iter().all(|n| n.version == 1));
        assert_eq!(rep.events as usize, all.len());

        let shallow = d.join(format!("n{:03}", n - 1)).join(META_FILE);
        let deep = d.join("n005").join("sub").join(META_FILE);
        for bad_file in [&shallow, &deep] {
            fs_err::write(bad_file, "not json").expect("write");
        }
        let err = import_dir(&s, &d, &uri("ctx://acc/other")).expect_err("bad meta");
        match &err {
            StoreError::BadLayout { path, .. } => assert_eq!(path, &deep, "{err}"),
            other => panic!("expected a bad layout, got {other}"),
        }
        assert!(
            s.read_subtree(&uri("ctx://acc/other"))
                .expect("read")
                .is_empty()
        );
    }
}
