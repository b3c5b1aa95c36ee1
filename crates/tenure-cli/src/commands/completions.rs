//! `tenure completions SHELL`: a completion script, from the CLI's own
//! definition.

use clap::Args;

use crate::exit::Failure;
use crate::output::write_stdout;

#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub(super) shell: clap_complete::Shell,
}

/// Writes the completion script for `shell`, generated from the CLI's own
/// definition, to stdout.
pub(super) fn run(shell: clap_complete::Shell) -> Result<u8, Failure> {
    use clap::CommandFactory;
    let mut command = crate::cli::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "tenure", &mut out);
    write_stdout(&out)
}
