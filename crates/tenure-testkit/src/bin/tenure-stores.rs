//! Prints what the table of stores says, for `scripts/test`:
//!
//! - `tenure-stores packages`: the Debian packages the stores' servers need
//!   that are not installed here, one per line;
//! - `tenure-stores features`: the `tenure` cargo features of every store,
//!   comma-separated, as `cargo --features` takes them;
//! - `tenure-stores names`: the stores' names, one per line.

use std::process::ExitCode;

use tenure_testkit::stores::STORES;

fn main() -> ExitCode {
    let what = std::env::args().nth(1).unwrap_or_default();
    match what.as_str() {
        "packages" => {
            let mut missing: Vec<&str> = STORES
                .iter()
                .flat_map(|s| s.packages)
                .filter(|p| !p.is_installed())
                .map(|p| p.name)
                .collect();
            missing.sort_unstable();
            missing.dedup();
            for p in missing {
                println!("{p}");
            }
        }
        "features" => {
            let features: Vec<String> = STORES
                .iter()
                .map(|s| s.feature())
                .filter(|f| !f.is_empty())
                .map(|f| format!("tenure/{f}"))
                .collect();
            println!("{}", features.join(","));
        }
        "names" => {
            for s in STORES {
                println!("{}", s.backend);
            }
        }
        _ => {
            eprintln!("usage: tenure-stores packages|features|names");
            return ExitCode::from(64);
        }
    }
    ExitCode::SUCCESS
}
