//! Writing to stdout: lines that a closed stdout does not turn into a
//! panic, raw bytes, and values kept to one line of text.

use crate::exit::{self, Failure};

pub(crate) fn write_stdout(bytes: &[u8]) -> Result<u8, Failure> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        // The reader stopped reading (`| head`): not this command's failure.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(Failure::new(
            exit::SOFTWARE,
            format!("cannot write to stdout: {e}"),
        )),
        Ok(()) => Ok(0),
    }
}

/// One line to stdout for [`outln!`]; a reader that went away is ignored.
pub(crate) fn print_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(line)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    if let Err(e) = written {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("tenure: cannot write to stdout: {e}");
        }
    }
}

/// A value on one line of text output: a backslash and control characters
/// (newline, tab, ESC, …) are escaped as in Rust (`\\`, `\n`, `\u{1b}`), so
/// one leader is always one line and no escape sequence reaches a terminal.
/// `--json` carries the value unchanged.
pub(crate) fn escape_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\\' || c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_line_keeps_one_line_and_plain_text() {
        assert_eq!(escape_line("host:1 é"), "host:1 é");
        assert_eq!(escape_line("a\nb\u{1b}[1m\\"), r"a\nb\u{1b}[1m\\");
    }
}
