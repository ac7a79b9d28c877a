//! The fresh segment: vectors committed to the database but not yet in the graph, held in one
//! contiguous `f32` buffer and searched exactly.
//!
//! A write makes its vectors searchable here at once; the graph inserter (`insert_step` in
//! `embedded.rs`) later copies a batch into the graph and retires it from this segment. Every
//! live key is in the fresh segment or in the graph (invariant **FS1**; during an insertion a
//! key may be in both for a moment, and searches count it once). Removal swaps the last entry
//! into the hole, so the buffer stays dense and a scan is a straight walk over memory.

use std::collections::HashMap;

use super::super::rules::cosine;

/// A copy of some of the fresh segment's entries ([`Fresh::batch`]).
#[derive(Debug)]
pub(super) struct Batch {
    keys: Vec<u64>,
    data: Vec<f32>,
    dimension: usize,
}

impl Batch {
    /// The keys, in the batch's order.
    pub(super) fn keys(&self) -> &[u64] {
        &self.keys
    }

    /// Vector dimension (0 when empty).
    pub(super) fn dimension(&self) -> usize {
        self.dimension
    }

    /// `(key, vector)` pairs, in the batch's order.
    pub(super) fn items(&self) -> Vec<(u64, &[f32])> {
        let d = self.dimension.max(1);
        self.keys
            .iter()
            .copied()
            .zip(self.data.chunks_exact(d))
            .collect()
    }
}

/// Vectors not yet in the graph (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct Fresh {
    dimension: usize,
    keys: Vec<u64>,
    /// `keys.len() × dimension` values, entry `i` at `i·dimension`.
    data: Vec<f32>,
    /// Key → entry index.
    pos: HashMap<u64, usize>,
}

impl Fresh {
    /// Number of vectors.
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the segment holds no vector.
    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Memory held by the vectors and keys, in bytes (the bound back-pressure checks).
    pub(super) fn bytes(&self) -> usize {
        Self::bytes_for(self.keys.len(), self.dimension)
    }

    /// What `vectors` vectors of `dimension` hold here, in bytes: the measure of
    /// [`Fresh::bytes`], for deciding before loading whether they fit the bound.
    pub(super) fn bytes_for(vectors: usize, dimension: usize) -> usize {
        vectors * (dimension * 4 + 8 + 24)
    }

    /// Whether `key` is here.
    pub(super) fn contains(&self, key: u64) -> bool {
        self.pos.contains_key(&key)
    }

    /// Adds `vector` under `key` (a fresh key: keys are never reused, AK1). The first vector
    /// fixes the dimension; the caller has checked it against the database's.
    pub(super) fn push(&mut self, key: u64, vector: &[f32]) {
        if self.keys.is_empty() {
            self.dimension = vector.len();
        }
        debug_assert_eq!(vector.len(), self.dimension, "fresh segment dimension");
        debug_assert!(!self.pos.contains_key(&key), "key {key} added twice (AK1)");
        self.pos.insert(key, self.keys.len());
        self.keys.push(key);
        self.data.extend_from_slice(vector);
    }

    /// Removes `key`; whether it was here.
    pub(super) fn remove(&mut self, key: u64) -> bool {
        let Some(i) = self.pos.remove(&key) else {
            return false;
        };
        let last = self.keys.len() - 1;
        if i != last {
            let moved = self.keys[last];
            self.keys[i] = moved;
            self.pos.insert(moved, i);
            let d = self.dimension;
            self.data.copy_within(last * d..(last + 1) * d, i * d);
        }
        self.keys.pop();
        self.data.truncate(last * self.dimension);
        self.shrink();
        true
    }

    /// Gives memory back once the segment holds under a quarter of what it has room for
    /// (keeping room for twice what it holds): after the graph took a burst in, the buffer
    /// would otherwise keep its high-water mark for good. Amortised O(1) per removal.
    fn shrink(&mut self) {
        /// Below this many vectors' room nothing is given back.
        const FLOOR: usize = 1024;
        let len = self.keys.len();
        if self.keys.capacity() > FLOOR && self.keys.capacity() > 4 * len {
            let room = (2 * len).max(FLOOR);
            self.keys.shrink_to(room);
            self.data.shrink_to(room * self.dimension);
            self.pos.shrink_to(room);
        }
    }

    /// The vector of `key`.
    pub(super) fn get(&self, key: u64) -> Option<&[f32]> {
        let i = *self.pos.get(&key)?;
        Some(&self.data[i * self.dimension..(i + 1) * self.dimension])
    }

    /// A copy of up to `max` entries (the oldest first while nothing was removed), in one
    /// buffer: a step's copy is one allocation, not one per vector.
    pub(super) fn batch(&self, max: usize) -> Batch {
        let n = self.keys.len().min(max);
        Batch {
            keys: self.keys[..n].to_vec(),
            data: self.data[..n * self.dimension].to_vec(),
            dimension: self.dimension,
        }
    }

    /// Scores every entry `admit` accepts (the filter is checked before the dot product).
    pub(super) fn scan(&self, query: &[f32], admit: impl Fn(u64) -> bool) -> Vec<(u64, f32)> {
        let d = self.dimension.max(1);
        self.keys
            .iter()
            .zip(self.data.chunks_exact(d))
            .filter(|(k, _)| admit(**k))
            .map(|(k, v)| (*k, cosine(query, v)))
            .collect()
    }

    /// Room for vectors without growing (see [`Fresh::shrink`]).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.keys.capacity()
    }

    /// Removes everything.
    pub(super) fn clear(&mut self) {
        *self = Fresh::default();
    }
}

#[cfg(test)]
mod tests {
    use super::Fresh;

    #[test]
    fn removal_keeps_the_buffer_dense_and_lookups_right() {
        let mut f = Fresh::default();
        for k in 1..=5u64 {
            f.push(k, &[k as f32, -(k as f32)]);
        }
        assert!(f.remove(2));
        assert!(!f.remove(2), "removing twice");
        assert!(f.remove(5), "the last entry");
        assert_eq!(f.len(), 3);
        assert!(!f.contains(2) && f.contains(4));
        for k in [1u64, 3, 4] {
            assert_eq!(f.get(k), Some(&[k as f32, -(k as f32)][..]), "key {k}");
        }
        let batch = f.batch(10);
        for (k, v) in batch.items() {
            assert_eq!(f.get(k), Some(v), "key {k}");
        }
        let mut keys = batch.keys().to_vec();
        keys.sort_unstable();
        assert_eq!(keys, vec![1, 3, 4]);
        assert_eq!(f.batch(2).keys().len(), 2);
        let admitted: Vec<u64> = f
            .scan(&[1.0, 0.0], |k| k != 3)
            .iter()
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(admitted.len(), 2);
        assert!(!admitted.contains(&3), "the filter runs before scoring");
        f.clear();
        assert!(f.is_empty() && f.bytes() == 0);
    }

    /// A burst taken in by the graph gives its memory back: once removals leave the segment
    /// under a quarter full it shrinks, and what is left reads back unchanged.
    #[test]
    fn a_drained_segment_gives_its_memory_back() {
        let mut f = Fresh::default();
        for k in 0..20_000u64 {
            f.push(k, &[k as f32, 1.0, 2.0]);
        }
        let full = f.capacity();
        assert!(full >= 20_000);
        for k in 0..19_900u64 {
            assert!(f.remove(k), "key {k}");
        }
        assert!(f.capacity() < full / 4, "{} of {full} kept", f.capacity());
        assert!(f.capacity() >= f.len());
        for k in 19_900..20_000u64 {
            assert_eq!(f.get(k), Some(&[k as f32, 1.0, 2.0][..]), "key {k}");
        }
    }
}
