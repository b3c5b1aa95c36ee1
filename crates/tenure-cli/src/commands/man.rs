//! `tenure man`: the manual page, tenure(1), as roff.
//!
//! One page: clap_mangen renders the top command and each subcommand, and
//! the subcommands' pages become sections of this one (there are no
//! tenure-lock(1) pages to point at). The exit codes, which `--help` shows
//! as a table after the options, become the page's EXIT STATUS.

use crate::exit::{self, Failure, EXIT_CODES};
use crate::output::write_stdout;

/// Writes tenure(1), generated from the CLI's own definition (every
/// subcommand with its options), to stdout as roff.
pub(super) fn run() -> Result<u8, Failure> {
    write_stdout(page()?.as_bytes())
}

fn render(command: clap::Command) -> Result<String, Failure> {
    let mut out = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut out)
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot render the manual: {e}")))?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn page() -> Result<String, Failure> {
    use clap::CommandFactory;
    let command = crate::cli::Cli::command();
    let subcommands: Vec<&clap::Command> = command
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    let mut out = String::new();
    let top = render(command.clone())?;
    let mut section = "";
    for line in top.lines() {
        if let Some(name) = line.strip_prefix(".SH ") {
            section = name;
            match name {
                "SUBCOMMANDS" => {
                    out.push_str(".SH SUBCOMMANDS\nEach has its section below.\n");
                    out.push_str(&entries(&command, "tenure"));
                }
                "EXTRA" => out.push_str(&exit_status()),
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            continue;
        }
        // The subcommands and the exit codes were written above.
        if section != "SUBCOMMANDS" && section != "EXTRA" {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str(&environment());
    // One section per subcommand, with its own options and examples.
    for sub in subcommands {
        let name = format!("tenure-{}", sub.get_name());
        let text = render(sub.clone().bin_name(format!("tenure {}", sub.get_name())))?;
        out.push_str(&format!(".SH \"{}\"\n", name.to_uppercase()));
        let mut in_extra = false;
        let mut in_subcommands = false;
        // Drop the sub-page's own title line; its sections follow, its own
        // subcommands named as commands (not as pages), and its examples
        // and notes keep their lines as written.
        for line in text.lines().filter(|l| !l.starts_with(".TH ")) {
            if let Some(rest) = line.strip_prefix(".SH ") {
                if in_extra {
                    out.push_str(".fi\n");
                }
                in_extra = rest == "EXTRA";
                in_subcommands = rest == "SUBCOMMANDS";
                if in_extra {
                    out.push_str(".SS NOTES\n.nf\n");
                } else if in_subcommands {
                    out.push_str(".SS SUBCOMMANDS\n");
                    out.push_str(&entries(sub, &format!("tenure {}", sub.get_name())));
                } else {
                    out.push_str(&format!(".SS {rest}\n"));
                }
                continue;
            }
            if !in_subcommands {
                out.push_str(line);
                out.push('\n');
            }
        }
        if in_extra {
            out.push_str(".fi\n");
        }
    }
    Ok(out)
}

/// One entry per subcommand of `command` (clap's own `help` left out),
/// each named as it is typed: `tenure cell get`.
fn entries(command: &clap::Command, prefix: &str) -> String {
    let mut out = String::new();
    for sub in command
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
    {
        let about = sub.get_about().map(ToString::to_string).unwrap_or_default();
        out.push_str(&format!(
            ".TP\n\\fB{} {}\\fR\n{}\n",
            roff_text(prefix),
            roff_text(sub.get_name()),
            roff_text(&about)
        ));
    }
    out
}

/// The EXIT STATUS section, from the table `--help` shows: one entry per
/// code, the lines that continue it joined.
fn exit_status() -> String {
    let mut out = String::from(".SH \"EXIT STATUS\"\nThe same in every subcommand:\n");
    for (code, meaning) in exit_codes() {
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            roff_text(&code),
            roff_text(&meaning)
        ));
    }
    out
}

/// `(code, meaning)` for each entry of [`EXIT_CODES`]: an entry starts at
/// two spaces of indent, and lines indented further continue it.
fn exit_codes() -> Vec<(String, String)> {
    let mut codes: Vec<(String, String)> = Vec::new();
    for line in EXIT_CODES.lines().skip(1) {
        let text = line.trim();
        if line.starts_with("      ") {
            if let Some((_, meaning)) = codes.last_mut() {
                meaning.push(' ');
                meaning.push_str(text);
            }
        } else if let Some(split) = text.find("   ").or_else(|| text.find(' ')) {
            let (code, meaning) = text.split_at(split);
            codes.push((code.trim().to_string(), meaning.trim().to_string()));
        }
    }
    codes
}

fn environment() -> String {
    format!(
        ".SH ENVIRONMENT\n.TP\n\\fBTENURE_STORE\\fR\n{}\n",
        roff_text(
            "The store URL when --store is not given. Passwords in it are never shown \
             in logs, messages or reports."
        )
    )
}

/// Text as roff reads it: hyphens and backslashes escaped, and no line
/// starting with a control character.
fn roff_text(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exit_code_has_its_entry() {
        let codes = exit_codes();
        let found: Vec<&str> = codes.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(
            found,
            [
                "the command's own code",
                "126",
                "127",
                "64",
                "69",
                "70",
                "75",
                "79",
                "3"
            ]
        );
        let (_, lease) = &codes[7];
        assert!(
            lease.ends_with("(its process group was killed first)"),
            "{lease}"
        );
    }
}
