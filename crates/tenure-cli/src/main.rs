//! `tenure`: run a command under a distributed lock, or only while leader.
//!
//! This file parses the command line, sets up logging and the runtime,
//! hands the command to [`commands::run`] and turns its result into the
//! exit code. The command line's shape is in [`cli`], each subcommand in
//! `commands/`, the exit codes in [`exit`].

/// `println!` that a closed stdout (`tenure backends | head -1`) does not
/// turn into a panic: the rest of the output is dropped and the command
/// goes on (a lock held meanwhile is still released as usual).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::print_line(format_args!($($arg)*))
    };
}

mod audit;
mod child;
mod cli;
mod commands;
mod console;
// Public, as it always was: its codes are the program's interface, each
// one kept whether or not the code names it.
pub mod exit;
mod output;
mod process_metrics;
mod supervise;
mod torture;
mod version;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cli::Cli;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == supervise::ARG) {
        return ExitCode::from(supervise::main(argv.get(2..).unwrap_or_default()));
    }
    // Before anything of tenure's own changes a disposition.
    child::record_inherited_signals();
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_logging(cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tenure: cannot start the runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let result = runtime.block_on(commands::run(cli));
    // Background work (a best-effort release on a store that does not answer)
    // must not hold the exit up.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("tenure: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Logs to stderr, more with each `-v`.
fn init_logging(verbose: u8) {
    let filter = match verbose {
        0 => "warn",
        1 => "info,tenure=debug",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .init();
}

/// Colour in log lines only on a terminal, and never with `NO_COLOR` set
/// (to anything but the empty string: <https://no-color.org>).
fn colour() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    std::io::stderr().is_terminal() && !no_color
}
