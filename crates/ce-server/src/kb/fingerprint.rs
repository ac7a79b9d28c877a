//! What a file item's nodes were made from (docs/ingestion.md, "Re-sync"), so that a re-sync
//! of an unchanged directory reads no file: the file's stat — size, modification time, and on
//! Unix its change time and inode (the check rsync and git make instead of reading) — and
//! what reading depends on besides the file ([`Reading`]: the base's chunk settings, the
//! parser and chunker version, the node layout version, the token counter). The index job
//! records the fingerprint of what it read with the item's nodes; `kb-prepare-root` (and
//! `kb-reindex-subtree` for a file root) compare it with the file's stat now, one `stat`
//! per file and no read.
//!
//! A file changed within [`RACY_WINDOW`] of its reading gets no fingerprint: a write in the
//! same timestamp tick after the read would leave size and times unchanged (git's "racily
//! clean" entries), so it is read again at the next re-sync.

use std::fs::Metadata;
use std::time::SystemTime;

/// The rule and its window are shared with `ce import`'s stat cache.
pub use ce_core::racy::RACY_WINDOW;
use ce_core::racy::{FileStat, ns_since_epoch};
use ce_core::sha256_hex;

use super::KbSettings;

/// A file's stat ([`FileStat`], the one every reader that trusts stats shares) and when it
/// was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakenStat {
    /// What the stat says (hashed into the fingerprint).
    pub stat: FileStat,
    /// When it was taken (not part of the fingerprint: it decides whether the stat can vouch
    /// for the content, [`TakenStat::is_racy`]).
    pub taken_at: SystemTime,
}

impl TakenStat {
    /// The stat of `meta` (of the file itself: a symlink's target), taken at `taken_at`.
    pub fn of(meta: &Metadata, taken_at: SystemTime) -> TakenStat {
        TakenStat {
            stat: FileStat::of(meta),
            taken_at,
        }
    }

    /// Whether a write after the stat could leave it unchanged: the file changed — content
    /// or status (a tool setting its modification time back changes the latter) — within
    /// [`RACY_WINDOW`] before the stat was taken (or after, by the filesystem's clock).
    pub fn is_racy(&self) -> bool {
        !self.stat.settled_before(ns_since_epoch(self.taken_at))
    }
}

/// What reading a file of a base depends on besides the file (`Engine::kb_reading`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading(String);

impl Reading {
    /// The reading of a base with `settings` by a token counter of `counter` identity, with
    /// this build's parser, chunker ([`ce_ingest::OUTPUT_VERSION`]) and node layout
    /// ([`super::nodes::LAYOUT_VERSION`]).
    pub fn new(settings: &KbSettings, counter: &str) -> Reading {
        Reading(format!(
            "max_tokens={} overlap_tokens={} min_tokens={} ingest={} layout={} counter={counter}",
            settings.max_tokens,
            settings.overlap_tokens,
            settings.min_tokens,
            ce_ingest::OUTPUT_VERSION,
            super::nodes::LAYOUT_VERSION,
        ))
    }

    /// The fingerprint of a file of `taken` stat read this way; `None` when the stat cannot
    /// vouch for the content ([`TakenStat::is_racy`]).
    pub fn fingerprint(&self, taken: &TakenStat) -> Option<String> {
        if taken.is_racy() {
            return None;
        }
        let stat = &taken.stat;
        Some(sha256_hex(
            format!(
                "file size={} mtime={} ctime={} ino={} | {}",
                stat.size, stat.mtime_ns, stat.ctime_ns, stat.ino, self.0
            )
            .as_bytes(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// A stat taken at 1,000 s of a file last changed at `mtime_s`.
    fn stat(mtime_s: i64) -> TakenStat {
        TakenStat {
            stat: FileStat::unix(7, 100, (mtime_s, 0), (mtime_s, 0)),
            taken_at: UNIX_EPOCH + Duration::from_secs(1_000),
        }
    }

    /// `base` with its stat changed by `f`.
    fn with(base: TakenStat, f: impl FnOnce(&mut FileStat)) -> TakenStat {
        let mut t = base;
        f(&mut t.stat);
        t
    }

    #[test]
    fn every_part_of_the_stat_and_the_reading_changes_the_fingerprint() {
        let reading = Reading::new(&KbSettings::default(), "estimate");
        let base = stat(900);
        let fp = reading.fingerprint(&base).expect("old enough");
        assert_eq!(reading.fingerprint(&base), Some(fp.clone()), "stable");
        let variants = [
            with(base, |s| s.size = 101),
            with(base, |s| s.mtime_ns += 1),
            with(base, |s| s.ctime_ns += 1),
            with(base, |s| s.ino = 8),
        ];
        let later = TakenStat {
            taken_at: base.taken_at + Duration::from_secs(60),
            ..base
        };
        assert_eq!(reading.fingerprint(&later), Some(fp.clone()));
        for v in variants {
            assert_ne!(reading.fingerprint(&v), Some(fp.clone()), "{v:?}");
        }
        let other_settings = Reading::new(
            &KbSettings {
                max_tokens: 128,
                ..KbSettings::default()
            },
            "estimate",
        );
        let other_counter = Reading::new(&KbSettings::default(), "model tokenizer sha256:ab");
        for r in [other_settings, other_counter] {
            assert_ne!(r.fingerprint(&base), Some(fp.clone()), "{r:?}");
        }
    }

    #[test]
    fn a_file_modified_within_the_racy_window_gets_no_fingerprint() {
        let reading = Reading::new(&KbSettings::default(), "estimate");
        assert!(reading.fingerprint(&stat(999)).is_none(), "1 s old");
        assert!(reading.fingerprint(&stat(1_005)).is_none(), "future");
        assert!(reading.fingerprint(&stat(997)).is_some(), "3 s old");
        // A modification time just set back (cp -p, tar): racy by its change time.
        let set_back = with(stat(500), |s| s.ctime_ns = 999 * 1_000_000_000);
        assert!(reading.fingerprint(&set_back).is_none());
    }
}
