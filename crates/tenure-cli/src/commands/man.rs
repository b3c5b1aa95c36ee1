//! `tenure man`: the manual page, tenure(1), as roff.

use crate::exit::{self, Failure};
use crate::output::write_stdout;

/// Writes tenure(1), generated from the CLI's own definition (every
/// subcommand with its options), to stdout as roff.
pub(super) fn run() -> Result<u8, Failure> {
    use clap::CommandFactory;
    let command = crate::cli::Cli::command();
    let mut out = Vec::new();
    let render = |out: &mut Vec<u8>, command: clap::Command| {
        clap_mangen::Man::new(command)
            .render(out)
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot render the manual: {e}")))
    };
    render(&mut out, command.clone())?;
    // One section per subcommand, with its own options and examples.
    for sub in command.get_subcommands().filter(|c| !c.is_hide_set()) {
        let name = format!("tenure-{}", sub.get_name());
        let mut page = Vec::new();
        render(
            &mut page,
            sub.clone().bin_name(format!("tenure {}", sub.get_name())),
        )?;
        out.extend_from_slice(format!(".SH \"{}\"\n", name.to_uppercase()).as_bytes());
        // Drop the sub-page's own title line; its sections follow.
        let text = String::from_utf8_lossy(&page);
        for line in text.lines().filter(|l| !l.starts_with(".TH ")) {
            let line = line
                .strip_prefix(".SH ")
                .map_or(line.to_string(), |rest| format!(".SS {rest}"));
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
    }
    write_stdout(&out)
}
