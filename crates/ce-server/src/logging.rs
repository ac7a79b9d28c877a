//! Logs: `tracing` events on stderr, human-readable by default or one JSON object per line.
//! The level comes from `CE_LOG` (e.g. `info`, `warn,ce_index=debug`), else the caller's
//! default.

use std::str::FromStr;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The variable holding the log filter.
pub const LOG_ENV: &str = "CE_LOG";

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per event (with the current span's fields).
    Json,
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("{other:?} is not one of human, json")),
        }
    }
}

/// Installs the global subscriber (a second call does nothing). An unparsable `CE_LOG`
/// falls back to `default_filter` with a warning.
pub fn init(format: LogFormat, default_filter: &str) {
    let (targets, bad) = match std::env::var(LOG_ENV) {
        Ok(v) if !v.trim().is_empty() => match v.parse::<Targets>() {
            Ok(t) => (t, None),
            Err(e) => (
                fallback(default_filter),
                Some(format!("{LOG_ENV}={v:?}: {e}")),
            ),
        },
        _ => (fallback(default_filter), None),
    };
    let registry = tracing_subscriber::registry().with(targets);
    let installed = match format {
        LogFormat::Human => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(false),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    if installed.is_ok()
        && let Some(bad) = bad
    {
        tracing::warn!(problem = %bad, "ignoring the log filter");
    }
}

fn fallback(default_filter: &str) -> Targets {
    default_filter
        .parse()
        .unwrap_or_else(|_| Targets::new().with_default(tracing::Level::INFO))
}
