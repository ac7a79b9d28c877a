//! Attributing the failure of a batched call to its items (issue 13): one embedding call
//! carries up to `embedding.batch_size` texts and one index write up to
//! `upsert_batch_size` records, and a provider or index that refuses *one* item refuses the
//! whole call. A permanent refusal of a call over several items is therefore split in halves,
//! recursively, until the refused items are isolated: the other items succeed (their nodes
//! proceed to done) and only the refused ones fail, with the refusal's message.
//!
//! Only permanent refusals that may concern some items are split ([`Refusal::splittable`]):
//! a retryable failure (timeout, 5xx, rate limit, index unavailable) fails every item as
//! before and the events retry — the next attempt bisects if the refusal is then permanent.
//! Cost: `k` refused items among `n` add at most `2k⌈log₂ n⌉` calls (each level of the
//! recursion splits at most `k` failing halves), counted in
//! `index_worker_split_calls_total{consumer, call}`.

use super::error::WorkError;
use super::target::IndexKind;

/// Why a batched call failed as a whole.
pub(super) struct Refusal {
    /// The failure every item gets when it is not split (or cannot be split further).
    pub error: WorkError,
    /// Whether calling again with fewer items may succeed for some of them.
    pub splittable: bool,
}

/// A batched call: one result per item on success.
type BatchedCall<'c, T, R> = dyn FnMut(&[T]) -> Result<Vec<R>, Refusal> + 'c;

/// Runs one batched write to the index `kind`, recording its latency in the index's
/// histogram ([`IndexKind::write_latency_metric`]); a failure is logged and becomes a
/// [`Refusal`], splittable when it is permanent.
pub(super) fn index_write<W, T>(
    writes: &[W],
    kind: IndexKind,
    write: impl FnOnce(&[W]) -> crate::Result<T>,
) -> Result<T, Refusal> {
    let (n, t0) = (writes.len(), std::time::Instant::now());
    match write(writes) {
        Ok(outcomes) => {
            metrics::histogram!(kind.write_latency_metric())
                .record(t0.elapsed().as_secs_f64() * 1e3);
            Ok(outcomes)
        }
        Err(e) => {
            tracing::warn!(error = %e, items = n, "batched {} write failed", kind.name());
            Err(Refusal {
                splittable: !ce_core::Classify::is_retryable(&e),
                error: WorkError::from(e),
            })
        }
    }
}

/// Calls `call` on `items` and returns one outcome per item, in order, splitting a
/// splittable refusal of several items (see the module documentation). `call` must return
/// one result per item it is given. The extra calls are counted under `consumer` and
/// `call_name` (`embed`, `write`).
pub(super) fn call_split<T, R>(
    items: &[T],
    call: &mut BatchedCall<'_, T, R>,
    consumer: &str,
    call_name: &'static str,
) -> Vec<Result<R, WorkError>> {
    let mut extra = 0u64;
    let out = split(items, call, &mut extra);
    if extra > 0 {
        metrics::counter!("index_worker_split_calls_total", "consumer" => consumer.to_owned(), "call" => call_name).increment(extra);
    }
    out
}

fn split<T, R>(
    items: &[T],
    call: &mut BatchedCall<'_, T, R>,
    extra: &mut u64,
) -> Vec<Result<R, WorkError>> {
    let n = items.len();
    match call(items) {
        Ok(results) if results.len() == n => results.into_iter().map(Ok).collect(),
        Ok(results) => {
            let e = WorkError::internal(format!("{} results for {n} items", results.len()));
            (0..n).map(|_| Err(e.clone())).collect()
        }
        Err(refusal) if refusal.splittable && n > 1 => {
            let (left, right) = items.split_at(n / 2);
            *extra += 2;
            let mut out = split(left, call, extra);
            out.extend(split(right, call, extra));
            out
        }
        Err(refusal) => (0..n).map(|_| Err(refusal.error.clone())).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that refuses (permanently, splittably) any batch holding a refused item.
    fn refusing(
        refused: &[u32],
        calls: &mut u64,
    ) -> impl FnMut(&[u32]) -> Result<Vec<u32>, Refusal> {
        let refused = refused.to_vec();
        move |items: &[u32]| {
            *calls += 1;
            match items.iter().find(|i| refused.contains(i)) {
                Some(i) => Err(Refusal {
                    error: WorkError {
                        code: ce_core::ErrorCode::Upstream,
                        message: format!("refused {i}"),
                        retryable: false,
                        retry_after: None,
                    },
                    splittable: true,
                }),
                None => Ok(items.iter().map(|i| i * 10).collect()),
            }
        }
    }

    #[test]
    fn only_refused_items_fail_and_the_cost_is_bounded() {
        for refused in [
            vec![],
            vec![7],
            vec![0, 31],
            vec![3, 4, 5],
            (0..32).collect(),
        ] {
            let mut calls = 0u64;
            let items: Vec<u32> = (0..32).collect();
            let out = call_split(&items, &mut refusing(&refused, &mut calls), "t", "embed");
            for (i, r) in out.iter().enumerate() {
                let i = i as u32;
                match r {
                    Ok(v) => assert!(!refused.contains(&i) && *v == i * 10, "{i}"),
                    Err(e) => {
                        assert!(refused.contains(&i), "{i} is innocent");
                        assert_eq!(e.message, format!("refused {i}"));
                    }
                }
            }
            // One call, plus at most two per refused item per level (log₂ 32 = 5 levels).
            let k = refused.len() as u64;
            assert!(
                calls <= 1 + (2 * k * 5).min(62),
                "{refused:?}: {calls} calls"
            );
        }
    }

    #[test]
    fn unsplittable_refusals_and_single_items_fail_as_a_whole() {
        let mut calls = 0;
        let mut call = |items: &[u32]| -> Result<Vec<u32>, Refusal> {
            calls += 1;
            Err(Refusal {
                error: WorkError::internal(format!("down ({} items)", items.len())),
                splittable: false,
            })
        };
        let out = call_split(&(0..8).collect::<Vec<_>>(), &mut call, "t", "write");
        assert_eq!(calls, 1, "a retryable failure is not split");
        assert!(out.iter().all(|r| {
            r.as_ref()
                .err()
                .is_some_and(|e| e.message == "down (8 items)")
        }));
        let mut calls = 0;
        let out = call_split(&[1], &mut refusing(&[1], &mut calls), "t", "embed");
        assert_eq!((calls, out.len()), (1, 1));
        let mut short = |_items: &[u32]| -> Result<Vec<u32>, Refusal> { Ok(vec![1]) };
        let out = call_split(&[1, 2], &mut short, "t", "embed");
        assert!(
            out.iter().all(Result::is_err),
            "a short answer fails every item"
        );
    }
}
