//! The stat cache of imports (docs/store.md, "The stat cache"): per directory of an earlier
//! import of the same folder into the same target, what it held — its own and its files'
//! inode, size, modification and change times, its sub-directories, its skipped entries —
//! and the stamp (version, time written) of each node it gave. A directory whose entries all
//! still have those stats, and whose nodes the source still holds at those stamps, gave the
//! same nodes as before: it is neither read nor compared again.
//!
//! Like git's index, a stat that could hide a change is not trusted ("racily clean",
//! [`ce_core::racy`], the rule the knowledge-base re-sync applies too): a file modified
//! within the file system's timestamp granularity of the moment it was read can keep its
//! times. So an entry counts only when its times lie before the moment its record was made
//! by more than [`ce_core::racy::RACY_WINDOW`]; otherwise the directory is read again and
//! recorded anew.
//!
//! The cache is a hint, never the truth: a missing, unreadable or corrupt file is no cache
//! (everything is read), and the file is replaced whole (written aside, then renamed).

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType};

use ce_core::racy::FileStat;

use crate::model::NodeStamp;

/// The file's first bytes; a new layout gets a new magic (the old file is then no cache).
const MAGIC: &[u8; 8] = b"CESTAT01";

/// The [`FileStat`] (what identifies a file's state without reading it, as every reader
/// that trusts stats sees it) of a `stat` record.
pub(super) fn stat_of_record(st: &rustix::fs::Stat) -> FileStat {
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    FileStat::unix(
        st.st_ino as u64,
        st.st_size as u64,
        (st.st_mtime as i64, st.st_mtime_nsec as i64),
        (st.st_ctime as i64, st.st_ctime_nsec as i64),
    )
}

/// The stat of the entry at `path`, not following a symbolic link; `None` if it cannot be
/// read (it is then read the ordinary way, which reports why).
fn stat_of(path: &Path) -> Option<(FileType, FileStat)> {
    let st = rustix::fs::statat(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    Some((FileType::from_raw_mode(st.st_mode), stat_of_record(&st)))
}

/// What one directory of an import held, and the nodes it gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DirRecord {
    /// When the import that read it started (ns since the epoch, wall clock).
    pub recorded_at_ns: i64,
    /// The directory's own stat (a listed entry added, removed or renamed changes it).
    pub dir: FileStat,
    /// The regular files read, by name, with their stats.
    pub files: Vec<(CString, FileStat)>,
    /// Its sub-directories, in name order.
    pub subdirs: Vec<CString>,
    /// Its entries not imported, relative to the import's root (as reported).
    pub skipped: Vec<String>,
    /// The nodes it gave (its own unless it is the root, and one per plain file), with the
    /// stamps the source held them at after that import.
    pub nodes: Vec<(String, NodeStamp)>,
}

impl DirRecord {
    /// Whether the directory at `path` still holds what this record says, and the source
    /// (`stored`: URI → stamp) still holds its nodes as they were. A directory with
    /// relations is always read again: its edges can change without its node's version.
    pub(super) fn still_holds(&self, path: &Path, stored: &HashMap<&str, NodeStamp>) -> bool {
        let settled = |s: &FileStat| s.settled_before(self.recorded_at_ns.into());
        if !settled(&self.dir)
            || self
                .files
                .iter()
                .any(|(n, s)| n.to_bytes() == super::RELATIONS_FILE.as_bytes() || !settled(s))
            || self
                .nodes
                .iter()
                .any(|(u, s)| stored.get(u.as_str()) != Some(s))
        {
            return false;
        }
        if stat_of(path) != Some((FileType::Directory, self.dir)) {
            return false;
        }
        self.files.iter().all(|(name, stamp)| {
            stat_of(&path.join(OsStr::from_bytes(name.to_bytes())))
                == Some((FileType::RegularFile, *stamp))
        })
    }

    /// The sub-directories' paths under `path`.
    pub(super) fn subdir_paths(&self, path: &Path) -> Vec<(String, PathBuf)> {
        self.subdirs
            .iter()
            .map(|n| {
                let name = OsStr::from_bytes(n.to_bytes());
                (name.to_string_lossy().into_owned(), path.join(name))
            })
            .collect()
    }
}

/// Every directory's record, by its path relative to the import's root (`""` for the root).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct StatCache {
    pub dirs: HashMap<PathBuf, DirRecord>,
}

impl StatCache {
    /// The cache in `file`; empty when there is none or it cannot be used (a damaged file
    /// is named in the log, then ignored: it only makes the import read everything).
    pub(super) fn load(file: &Path) -> StatCache {
        let bytes = match std::fs::read(file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return StatCache::default(),
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "import stat cache unreadable: reading every file");
                return StatCache::default();
            }
        };
        match Self::decode(&bytes) {
            Some(c) => c,
            None => {
                tracing::warn!(file = %file.display(), "import stat cache damaged: reading every file");
                StatCache::default()
            }
        }
    }

    /// Writes the cache to `file` whole: aside, then renamed over it.
    pub(super) fn save(&self, file: &Path) -> std::io::Result<()> {
        if let Some(dir) = file.parent() {
            fs_err::create_dir_all(dir)?;
        }
        let aside = file.with_extension(format!("tmp-{}", uuid::Uuid::now_v7().simple()));
        fs_err::write(&aside, self.encode())?;
        fs_err::rename(&aside, file)
    }

    fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64 + self.dirs.len() * 160);
        w.extend_from_slice(MAGIC);
        put_u64(&mut w, self.dirs.len() as u64);
        for (path, r) in &self.dirs {
            put_bytes(&mut w, path.as_os_str().as_bytes());
            put_u64(&mut w, r.recorded_at_ns as u64);
            put_stamp(&mut w, &r.dir);
            put_u64(&mut w, r.files.len() as u64);
            for (name, s) in &r.files {
                put_bytes(&mut w, name.to_bytes());
                put_stamp(&mut w, s);
            }
            put_u64(&mut w, r.subdirs.len() as u64);
            for name in &r.subdirs {
                put_bytes(&mut w, name.to_bytes());
            }
            put_u64(&mut w, r.skipped.len() as u64);
            for s in &r.skipped {
                put_bytes(&mut w, s.as_bytes());
            }
            put_u64(&mut w, r.nodes.len() as u64);
            for (uri, s) in &r.nodes {
                put_bytes(&mut w, uri.as_bytes());
                put_u64(&mut w, s.version);
                put_u64(&mut w, s.updated_at as u64);
            }
        }
        let sum = ce_core::hash::sha256_hex(&w);
        w.extend_from_slice(sum.as_bytes());
        w
    }

    fn decode(bytes: &[u8]) -> Option<StatCache> {
        let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(64)?)?;
        if ce_core::hash::sha256_hex(body).as_bytes() != sum {
            return None;
        }
        let mut r = Reader(body);
        if r.take(MAGIC.len())? != MAGIC {
            return None;
        }
        let n = r.u64()?;
        let mut dirs = HashMap::new();
        for _ in 0..n {
            let path = PathBuf::from(OsStr::from_bytes(r.bytes()?));
            let recorded_at_ns = r.u64()? as i64;
            let dir = r.stamp()?;
            let files = r.list(|r| Some((r.c_string()?, r.stamp()?)))?;
            let subdirs = r.list(Reader::c_string)?;
            let skipped = r.list(Reader::string)?;
            let nodes = r.list(|r| {
                let uri = r.string()?;
                let version = r.u64()?;
                let updated_at = r.u64()? as i64;
                Some((
                    uri,
                    NodeStamp {
                        version,
                        updated_at,
                    },
                ))
            })?;
            dirs.insert(
                path,
                DirRecord {
                    recorded_at_ns,
                    dir,
                    files,
                    subdirs,
                    skipped,
                    nodes,
                },
            );
        }
        r.0.is_empty().then_some(StatCache { dirs })
    }
}

/// The cache file of importing the folder `dir` into `into`, in `cache_dir`: one per folder
/// (its absolute path), target and source store (`store`: what names it, e.g. its URL).
pub fn stat_cache_file(
    cache_dir: &Path,
    store: &str,
    dir: &Path,
    into: &ce_core::CtxUri,
) -> PathBuf {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    let mut key = Vec::new();
    for part in [
        store.as_bytes(),
        dir.as_os_str().as_bytes(),
        into.as_str().as_bytes(),
    ] {
        put_bytes(&mut key, part);
    }
    let hash = ce_core::hash::sha256_hex(&key);
    cache_dir.join(format!("{}.bin", &hash[..32]))
}

fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    put_u64(w, b.len() as u64);
    w.extend_from_slice(b);
}

fn put_stamp(w: &mut Vec<u8>, s: &FileStat) {
    for v in [s.ino, s.size, s.mtime_ns as u64, s.ctime_ns as u64] {
        put_u64(w, v);
    }
}

/// Reads what the `put_*` functions wrote; `None` at any inconsistency.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }

    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }

    fn c_string(&mut self) -> Option<CString> {
        CString::new(self.bytes()?).ok()
    }

    fn stamp(&mut self) -> Option<FileStat> {
        Some(FileStat {
            ino: self.u64()?,
            size: self.u64()?,
            mtime_ns: self.u64()? as i64,
            ctime_ns: self.u64()? as i64,
        })
    }

    /// A count, then that many items; the count is checked against the bytes left (each
    /// item takes at least 8), so a damaged count allocates nothing.
    fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        let n = usize::try_from(self.u64()?).ok()?;
        if n > self.0.len() / 8 {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(item(self)?);
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ImportOptions, ImportReport, import_dir_fenced};
    use super::*;
    use crate::SqliteStore;
    use crate::model::{ContextFs, PutRequest};
    use ce_core::{Config, CtxUri};

    fn uri(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    /// A folder of `n` node directories (content and metadata), a plain file, a binary
    /// file and a hidden file (both skipped).
    fn tree(root: &Path, n: usize) {
        for i in 0..n {
            let d = root.join(format!("d{i}"));
            fs_err::create_dir_all(&d).expect("mkdir");
            fs_err::write(d.join("content.md"), format!("document {i} text")).expect("write");
            fs_err::write(d.join(".meta.json"), r#"{"meta": {"group": "g"}}"#).expect("write");
        }
        fs_err::write(root.join("notes.md"), "plain notes").expect("write");
        fs_err::write(root.join("blob.bin"), [0xff, 0xfe, 0x00]).expect("write");
        fs_err::write(root.join(".hidden"), "not imported").expect("write");
    }

    /// Waits until what was just written is older than the racy window.
    fn settle() {
        std::thread::sleep(ce_core::racy::RACY_WINDOW + std::time::Duration::from_millis(100));
    }

    struct Fixture {
        _tmp: tempfile::TempDir,
        store: SqliteStore,
        src: PathBuf,
        cache: PathBuf,
    }

    impl Fixture {
        fn new(n: usize) -> Fixture {
            let tmp = tempfile::tempdir().expect("tmp");
            let store = SqliteStore::open(&tmp.path().join("db"), Config::default()).expect("open");
            let src = tmp.path().join("src");
            tree(&src, n);
            let cache = stat_cache_file(&tmp.path().join("cache"), "", &src, &uri("ctx://a/t"));
            Fixture {
                _tmp: tmp,
                store,
                src,
                cache,
            }
        }

        fn import(&self, prune: bool) -> ImportReport {
            let options = ImportOptions {
                prune,
                stat_cache: Some(self.cache.clone()),
                ..ImportOptions::default()
            };
            import_dir_fenced(
                &self.store,
                &self.src,
                &uri("ctx://a/t"),
                options,
                &[],
                None,
            )
            .expect("import")
            .0
        }

        fn content(&self, u: &str) -> String {
            self.store
                .read_node(&uri(u))
                .expect("read")
                .expect("node")
                .layers
                .content
        }
    }

    #[test]
    fn an_unchanged_tree_is_not_read_again_and_reports_the_same() {
        let f = Fixture::new(5);
        settle();
        let first = f.import(false);
        // The root's node, five directories and the plain file.
        assert_eq!((first.nodes_written, first.nodes_not_read), (7, 0));
        assert_eq!(first.skipped, vec![".hidden".to_owned(), "blob.bin".into()]);
        let second = f.import(false);
        assert_eq!(second.nodes_written, 0);
        assert_eq!(second.nodes_unchanged, 7);
        assert_eq!(second.nodes_not_read, 7, "{second:?}");
        assert_eq!(second.skipped, first.skipped);
        assert_eq!(second.events, 0);
    }

    #[test]
    fn a_first_import_of_many_nodes_records_every_one() {
        // More nodes than the record looks up one by one: their stamps come from one range.
        let n = super::super::STAMPS_BY_RANGE_FROM + 50;
        let f = Fixture::new(n);
        settle();
        assert_eq!(f.import(false).nodes_written, n as u64 + 2);
        let again = f.import(false);
        assert_eq!(again.nodes_not_read, n as u64 + 2, "{again:?}");
    }

    #[test]
    fn a_file_rewritten_with_its_size_and_modification_time_kept_is_read() {
        let f = Fixture::new(3);
        settle();
        f.import(false);
        let file = f.src.join("d1").join("content.md");
        let mtime = fs_err::metadata(&file)
            .expect("stat")
            .modified()
            .expect("mtime");
        fs_err::write(&file, "DOCUMENT 1 TEXT").expect("write");
        fs_err::File::options()
            .write(true)
            .open(&file)
            .expect("open")
            .set_modified(mtime)
            .expect("set mtime");
        // Read at once (its change time is new, and too recent to vouch for).
        let r = f.import(false);
        assert_eq!(r.nodes_written, 1, "{r:?}");
        assert_eq!(f.content("ctx://a/t/d1"), "DOCUMENT 1 TEXT");
        // Recorded while its change was too recent to vouch for, it is read again (the
        // others are not); recorded once settled, it is vouched for again.
        settle();
        assert_eq!(f.import(false).nodes_not_read, 4);
        assert_eq!(f.import(false).nodes_not_read, 5);
    }

    #[test]
    fn a_node_another_writer_changed_is_read_and_restored() {
        let f = Fixture::new(3);
        settle();
        f.import(false);
        let edit = PutRequest {
            content: Some("edited by a client".into()),
            ..PutRequest::default()
        };
        f.store.put(&uri("ctx://a/t/d2"), edit).expect("put");
        let r = f.import(false);
        assert_eq!((r.nodes_written, r.nodes_not_read), (1, 4), "{r:?}");
        assert_eq!(f.content("ctx://a/t/d2"), "document 2 text");
    }

    #[test]
    fn added_and_removed_directories_are_seen() {
        let f = Fixture::new(4);
        settle();
        f.import(true);
        fs_err::remove_dir_all(f.src.join("d0")).expect("rm");
        let d = f.src.join("new");
        fs_err::create_dir_all(&d).expect("mkdir");
        fs_err::write(d.join("content.md"), "a new document").expect("write");
        let r = f.import(true);
        assert_eq!(r.nodes_removed, 1, "{r:?}");
        assert_eq!(r.nodes_written, 1, "{r:?}");
        // d1..d3 are vouched for; the root's listing changed, so it was read.
        assert_eq!(r.nodes_not_read, 3, "{r:?}");
        assert!(
            f.store
                .read_node(&uri("ctx://a/t/d0"))
                .expect("read")
                .is_none()
        );
        assert_eq!(f.content("ctx://a/t/new"), "a new document");
    }

    #[test]
    fn a_directory_with_relations_is_always_read() {
        let f = Fixture::new(2);
        fs_err::write(
            f.src.join("d0").join(super::super::RELATIONS_FILE),
            r#"[{"to": "d1", "type": "references"}]"#,
        )
        .expect("write");
        settle();
        f.import(false);
        let r = f.import(false);
        assert_eq!((r.nodes_unchanged, r.nodes_not_read), (4, 3), "{r:?}");
    }

    #[test]
    fn a_damaged_cache_is_no_cache() {
        let f = Fixture::new(3);
        settle();
        f.import(false);
        let mut bytes = fs_err::read(&f.cache).expect("cache");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x55;
        fs_err::write(&f.cache, &bytes).expect("damage");
        let r = f.import(false);
        assert_eq!((r.nodes_written, r.nodes_not_read), (0, 0), "{r:?}");
        // It was written anew.
        assert_eq!(f.import(false).nodes_not_read, 5);
        fs_err::write(&f.cache, b"short").expect("truncate");
        assert_eq!(f.import(false).nodes_not_read, 0);
    }

    #[test]
    fn the_encoding_round_trips_and_rejects_any_cut() {
        let stamp = |i: u64| FileStat {
            ino: i,
            size: 10 + i,
            mtime_ns: -5 + i as i64,
            ctime_ns: 1_700_000_000_123_456_789,
        };
        let mut cache = StatCache::default();
        for i in 0..3u64 {
            cache.dirs.insert(
                PathBuf::from(if i == 0 {
                    String::new()
                } else {
                    format!("d{i}/ü")
                }),
                DirRecord {
                    recorded_at_ns: 42 + i as i64,
                    dir: stamp(i),
                    files: vec![(CString::new("content.md").expect("name"), stamp(i + 7))],
                    subdirs: vec![CString::new(format!("s{i}")).expect("name")],
                    skipped: vec![format!("x{i}.bin")],
                    nodes: vec![(
                        format!("ctx://a/t/d{i}"),
                        NodeStamp {
                            version: i + 1,
                            updated_at: -3,
                        },
                    )],
                },
            );
        }
        let bytes = cache.encode();
        assert_eq!(StatCache::decode(&bytes), Some(cache));
        for cut in [0, 8, bytes.len() / 2, bytes.len() - 1] {
            assert_eq!(StatCache::decode(&bytes[..cut]), None, "cut at {cut}");
        }
    }
}
