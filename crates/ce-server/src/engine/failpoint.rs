//! Fault injection for black-box tests, compiled into debug builds only.
//!
//! `CE_FAILPOINT_WORKER_EMBED_DELAY_MS=N`: every embedding call of the workers sleeps N ms
//! first, so a test can kill a worker while it holds claims (the middle of a batch). Release
//! builds ignore the variable.

use std::sync::Arc;

use ce_embed::{CachedEmbedder, Embedder};

/// The variable that delays the workers' embedding calls.
#[cfg(debug_assertions)]
pub const WORKER_EMBED_DELAY_VAR: &str = "CE_FAILPOINT_WORKER_EMBED_DELAY_MS";

/// The embedder the workers use: `e`, or `e` behind the delay when the failpoint is set.
pub(super) fn worker_embedder(e: Arc<CachedEmbedder>) -> Arc<dyn Embedder> {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var(WORKER_EMBED_DELAY_VAR)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        tracing::warn!(ms, "failpoint: worker embedding calls are delayed");
        return Arc::new(delayed::Delayed {
            inner: e,
            delay: std::time::Duration::from_millis(ms),
        });
    }
    e
}

#[cfg(debug_assertions)]
mod delayed {
    use std::sync::Arc;
    use std::time::Duration;

    use ce_embed::{CachedEmbedder, EmbedError, Embedder, ModelIdentity};

    pub(super) struct Delayed {
        pub inner: Arc<CachedEmbedder>,
        pub delay: Duration,
    }

    impl Embedder for Delayed {
        fn identity(&self) -> &ModelIdentity {
            self.inner.identity()
        }

        fn paused_for(&self) -> Option<Duration> {
            self.inner.paused_for()
        }

        fn flush(&self) {
            self.inner.flush();
        }

        fn embed_texts(
            &self,
            texts: &[&str],
            timeout: Duration,
        ) -> Result<Vec<Vec<f32>>, EmbedError> {
            std::thread::sleep(self.delay);
            self.inner.embed_texts(texts, timeout)
        }
    }
}
