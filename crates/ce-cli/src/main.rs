//! `ce`: the ContextEngine command line.
//!
//! Parses arguments (`cli`), runs one command against the SQLite store (`commands`, `demo`,
//! `bench`) and prints its answer (`output`): human text by default, one JSON document with
//! `--json`. Failures print `error: <message> [<code>]` on stderr (JSON with `--json`) and
//! exit with the code's exit status (see the README's table).

mod bench;
mod cli;
mod commands;
mod demo;
mod error;
mod output;

use std::process::ExitCode;

use ce_core::Classify;
use clap::Parser;

use crate::cli::Cli;
use crate::error::CliError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = commands::run(&cli).and_then(|rendered| {
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
