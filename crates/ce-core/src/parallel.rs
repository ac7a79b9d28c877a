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

/// `f` over `items` in consecutive grains of `grain` items, which the threads ([`threads`])
/// take in turn from a shared cursor — when `items` holds at least `min_len` (else `f` of each
/// grain on this thread). Work balances itself, and the grains in progress at any moment are
/// neighbours, so the items are handled close to the slice's order (an index that numbers
/// what it is given in arrival order numbers it close to the slice's). No grain is taken
/// after an error; the first is returned. A panic in a grain resumes on the caller.
pub fn try_for_each_grain<T: Sync, E: Send>(
    items: &[T],
    min_len: usize,
    grain: usize,
    f: impl Fn(&[T]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let grain = grain.max(1);
    let threads = threads();
    if items.len() < min_len.max(2) || threads == 1 {
        return items.chunks(grain).try_for_each(&f);
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let work = || -> Result<(), E> {
        use std::sync::atomic::Ordering::Relaxed;
        while !failed.load(Relaxed) {
            let start = next.fetch_add(grain, Relaxed);
            let Some(chunk) = items.get(start..items.len().min(start + grain)) else {
                break;
            };
            if chunk.is_empty() {
                break;
            }
            if let Err(e) = f(chunk) {
                failed.store(true, Relaxed);
                return Err(e);
            }
        }
        Ok(())
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mine = work();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .fold(mine, Result::and)
    })
}

/// Lowers the scheduling priority of the calling thread to `nice` (0 normal, 19 lowest), for
/// background work that foreground threads should preempt; threads it spawns afterwards
/// inherit it. Linux only (elsewhere an error, and the thread keeps its priority).
pub fn lower_thread_priority(nice: i32) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // Linux keeps the nice value per thread: `setpriority` of a thread id changes that
        // thread alone.
        #[allow(unsafe_code)]
        // SAFETY: two system calls on integers; no memory is shared with the kernel.
        let rc = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, nice)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = nice;
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "thread priorities are set on Linux only",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value of the calling thread, from `/proc/thread-self/stat` (field 19).
    #[cfg(target_os = "linux")]
    fn own_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
        // The command name (field 2) may hold spaces; the fields after it follow its `)`.
        let rest = &stat[stat.rfind(')').expect("comm") + 2..];
        rest.split(' ')
            .nth(16)
            .and_then(|n| n.parse().ok())
            .expect("nice")
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_lowered_thread_and_its_children_run_at_that_priority_and_no_other_thread_does() {
        let before = own_nice();
        assert!(before <= 14, "the test needs room below nice {before}");
        let (lowered, child) = std::thread::spawn(move || {
            lower_thread_priority(before + 5).expect("lower");
            let child = std::thread::spawn(own_nice).join().expect("child");
            (own_nice(), child)
        })
        .join()
        .expect("thread");
        assert_eq!((lowered, child), (before + 5, before + 5));
        assert_eq!(own_nice(), before, "the caller's own thread is unchanged");
    }

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

    /// Every item is handled once, in grains of the given size cut in order, above and below
    /// the threshold; after an error no new grain starts and the error comes back.
    #[test]
    fn grains_cover_the_slice_once_and_stop_at_an_error() {
        use std::sync::Mutex;
        let items: Vec<u32> = (0..1000).collect();
        for min_len in [1, 1000, 1001] {
            let seen = Mutex::new(Vec::new());
            try_for_each_grain(&items, min_len, 64, |g| {
                assert!(g.len() == 64 || g.last() == Some(&999), "{g:?}");
                assert_eq!(g[0] % 64, 0, "grains start on a multiple of the grain");
                seen.lock().expect("lock").extend_from_slice(g);
                Ok::<(), ()>(())
            })
            .expect("no error");
            let mut seen = seen.into_inner().expect("lock");
            seen.sort_unstable();
            assert_eq!(seen, items, "min_len {min_len}");
        }
        let handled = Mutex::new(0usize);
        let e = try_for_each_grain(&items, 1, 10, |g| {
            *handled.lock().expect("lock") += 1;
            if g[0] == 100 { Err(g[0]) } else { Ok(()) }
        });
        assert_eq!(e, Err(100));
        // Grains 0 to 100 (eleven), plus at most two per other thread: the one it was in when
        // the error came and one it took just before seeing it.
        let handled = handled.into_inner().expect("lock");
        assert!(handled <= 11 + 2 * threads(), "{handled} grains of 100");
    }
}
