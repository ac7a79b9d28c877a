//! Data parallelism over a slice on scoped threads, for coarse work (a pool would not pay).

/// The machine's parallelism (1 when unknown).
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `f` over `items` cut into one contiguous chunk per thread ([`threads`]), on scoped
/// threads when `items` holds at least `min_len` (else `f` of the whole slice on this
/// thread); the chunks' results in the slice's order. A panic in a chunk resumes on the
/// caller.
pub fn map_chunks<T: Sync, R: Send>(
    items: &[T],
    min_len: usize,
    f: impl Fn(&[T]) -> R + Sync,
) -> Vec<R> {
    let threads = threads();
    if items.len() < min_len.max(2) || threads == 1 {
        return vec![f(items)];
    }
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(items.len().div_ceil(threads))
            .map(|chunk| s.spawn(move || f(chunk)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_slice_in_order_above_and_below_the_threshold() {
        let items: Vec<u32> = (0..1000).collect();
        for min_len in [1, 999, 1000, 1001] {
            let parts = map_chunks(&items, min_len, <[u32]>::to_vec);
            assert_eq!(parts.concat(), items, "min_len {min_len}");
            if min_len > items.len() {
                assert_eq!(parts.len(), 1);
            } else {
                assert!(parts.len() <= threads() && (threads() == 1 || parts.len() > 1));
            }
        }
        assert_eq!(map_chunks(&[] as &[u32], 0, <[u32]>::len), vec![0]);
    }

    #[test]
    #[should_panic(expected = "chunk failed")]
    fn a_panicking_chunk_panics_the_caller() {
        let items: Vec<u32> = (0..64).collect();
        map_chunks(&items, 1, |c| assert!(!c.contains(&63), "chunk failed"));
    }
}
