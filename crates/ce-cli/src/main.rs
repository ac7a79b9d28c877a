//! `ce`: the ContextEngine command line.
//!
//! Parses arguments (`cli`), runs one command against the data directory (`commands`,
//! `demo`, `bench`) or, with `--server URL`, against a running `ce serve` (`remote`), and
//! prints its answer (`output`): human text by default, one JSON document with `--json`.
//! Failures print `error: <message> [<code>]` on stderr (JSON with `--json`) and exit with
//! the code's exit status (see the README's table). Commands that run the workers to the end
//! report progress on stderr in both modes (JSON lines with `--json`, the error object last).

mod bench;
mod bench_corpus;
mod bench_derive;
mod bench_ingest;
mod bench_kb;
mod bench_locks;
mod bench_pipeline;
mod bench_retrieval;
mod bench_scale;
mod bench_sessions;
mod bench_ui;
mod cli;
mod commands;
mod demo;
mod error;
mod eval;
mod jobs;
mod kb;
mod mcp;
mod output;
mod remote;
mod repair;
mod session;

use std::process::ExitCode;

use ce_core::Classify;
use ce_server::logging::{self, LogFormat};

use crate::cli::{Cli, Command};
use crate::error::CliError;

fn main() -> ExitCode {
    let cli = cli::parse();
    let result = init_logging(&cli)
        .and_then(|()| commands::run(&cli))
        .and_then(|rendered| {
            if rendered.json.is_null() && rendered.human.is_empty() {
                return Ok(());
            }
            let text = if cli.json {
                output::json_text(&rendered.json)
            } else {
                rendered.human
            };
            output::print_stdout(&text).map_err(CliError::from)
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            output::print_error(&e, cli.json);
            ExitCode::from(u8::try_from(e.code().exit_code()).unwrap_or(1))
        }
    }
}

/// Long-running commands log at `info`; one-shot commands only errors, and nothing with
/// `--json` (stderr then holds JSON lines only: drain progress, and at most one error, last).
/// `CE_LOG` overrides.
fn init_logging(cli: &Cli) -> Result<(), CliError> {
    let format: LogFormat = cli.log_format.parse().map_err(|e| {
        CliError::Core(ce_core::CoreError::InvalidField {
            field: "log_format",
            reason: e,
        })
    })?;
    let default = match cli.command {
        Command::Serve(_) => "info",
        // Stdio clients show stderr in their logs: warnings and errors only.
        Command::Mcp(_) => "warn",
        Command::Worker(ref w) if !w.once && !w.dry_run => "info",
        _ if cli.json => "off",
        _ => "error",
    };
    logging::init(format, default);
    Ok(())
}
