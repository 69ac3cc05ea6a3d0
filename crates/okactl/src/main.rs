//! okactl: the command line for OpenKruise Agents' sandboxes, against oka's Kubernetes API
//! (`oka serve` writes the kubeconfig) or a cluster's.
//!
//! # Exit codes
//!
//! - 0: success, and `--help`.
//! - 1: any failure (usage, validation, the API), printed as `Error: <message>` on stderr;
//!   usage is not printed after an error, as in the reference.
//!
//! The commands, their messages and their order of checks follow the reference's okactl
//! (`cmd/okactl`, `pkg/cli`); `get` and `delete` print what kubectl prints.

mod args;
mod client;
mod commands;
mod kinds;
mod printer;

use std::process::ExitCode;

use std::error::Error as _;

use clap::FromArgMatches as _;
use clap::error::{ContextKind, ContextValue, ErrorKind};

use crate::args::Cli;
use crate::printer::Printer;

/// A failure already printed (each name `delete` could not delete): only the exit code is left.
#[derive(Debug)]
pub struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reported")
    }
}

impl std::error::Error for Reported {}

fn main() -> ExitCode {
    let printer = Printer;
    let parsed =
        args::command().try_get_matches().and_then(|matches| Cli::from_arg_matches(&matches));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(err) => return usage_error(&err, &printer),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            printer.error(&format!("cannot start: {err}"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli, &printer)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if !err.is::<Reported>() {
                printer.error(&format!("{err:#}"));
            }
            ExitCode::FAILURE
        }
    }
}

/// Help is printed and succeeds; every other parse failure is one `Error:` line in the
/// reference's (cobra's) words, and exit code 1 (clap's own would be 2).
fn usage_error(err: &clap::Error, printer: &Printer) -> ExitCode {
    match err.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            printer.text(&err.render().to_string());
            ExitCode::SUCCESS
        }
        _ => {
            printer.error(&usage_message(err));
            ExitCode::FAILURE
        }
    }
}

fn usage_message(err: &clap::Error) -> String {
    let strings = |kind| match err.get(kind) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(s)) => s.clone(),
        Some(ContextValue::StyledStr(s)) => vec![s.to_string()],
        _ => Vec::new(),
    };
    let first = |kind| strings(kind).into_iter().next().unwrap_or_default();
    match err.kind() {
        ErrorKind::InvalidSubcommand => {
            format!(
                "unknown command \"{}\" for \"{}\"",
                first(ContextKind::InvalidSubcommand),
                command_path(err)
            )
        }
        ErrorKind::UnknownArgument => {
            let arg = first(ContextKind::InvalidArg);
            let flag = arg.split('=').next().unwrap_or_default();
            if flag.starts_with("--") {
                format!("unknown flag: {flag}")
            } else if let Some(short) = flag.strip_prefix('-') {
                let letter = short.chars().next().unwrap_or_default();
                format!("unknown shorthand flag: '{letter}' in {flag}")
            } else {
                format!("unexpected argument \"{arg}\" for \"{}\"", command_path(err))
            }
        }
        ErrorKind::MissingRequiredArgument => {
            let missing = strings(ContextKind::InvalidArg);
            let flags: Vec<String> = missing
                .iter()
                .filter_map(|a| a.strip_prefix("--").or_else(|| a.strip_prefix("-")))
                .map(|a| format!("\"{}\"", a.split([' ', '=', '<']).next().unwrap_or_default()))
                .collect();
            if flags.len() == missing.len() {
                format!("required flag(s) {} not set", flags.join(", "))
            } else {
                let names: Vec<&str> = missing
                    .iter()
                    .map(|a| a.trim_matches(|c| c == '<' || c == '>' || c == '.'))
                    .collect();
                format!("missing required argument(s): {}", names.join(", "))
            }
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let arg = first(ContextKind::InvalidArg);
            let flag = arg.split([' ', '=']).next().unwrap_or_default();
            let value = first(ContextKind::InvalidValue);
            let reason = match err.source() {
                Some(source) => source.to_string(),
                None => match strings(ContextKind::ValidValue) {
                    valid if !valid.is_empty() => format!("must be one of {}", valid.join(", ")),
                    _ => "invalid value".to_owned(),
                },
            };
            if flag.starts_with('-') {
                format!("invalid argument \"{value}\" for \"{flag}\" flag: {reason}")
            } else {
                let name = flag.trim_matches(|c| c == '<' || c == '>');
                format!("invalid argument \"{value}\" for {name}: {reason}")
            }
        }
        _ => {
            let text = err.to_string();
            let line = text.lines().next().unwrap_or_default();
            line.strip_prefix("error: ").unwrap_or(line).to_owned()
        }
    }
}

/// `okactl scale`, read from the usage line of the command that failed to parse.
fn command_path(err: &clap::Error) -> String {
    let usage = match err.get(ContextKind::Usage) {
        Some(ContextValue::StyledStr(s)) => s.to_string(),
        _ => return "okactl".to_owned(),
    };
    let usage = usage.trim().trim_start_matches("Usage:").trim();
    let words: Vec<&str> =
        usage.split_whitespace().take_while(|w| !w.starts_with(['[', '<', '-'])).collect();
    if words.is_empty() { "okactl".to_owned() } else { words.join(" ") }
}
