//! Names the commit the binary is built from, for `tenure --version`:
//! `TENURE_COMMIT` when set (a build outside a git checkout, such as a
//! package's), else git's `HEAD`, else "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=TENURE_COMMIT");
    let commit = match std::env::var("TENURE_COMMIT") {
        Ok(c) if !c.is_empty() => c,
        _ => {
            // Built again when HEAD moves: HEAD itself, the branch it names,
            // and the packed refs.
            for path in ["HEAD", "packed-refs"] {
                if let Some(p) = git(&["rev-parse", "--git-path", path]) {
                    println!("cargo:rerun-if-changed={p}");
                }
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                if let Some(p) = git(&["rev-parse", "--git-path", &branch]) {
                    println!("cargo:rerun-if-changed={p}");
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env=TENURE_COMMIT={commit}");
}
