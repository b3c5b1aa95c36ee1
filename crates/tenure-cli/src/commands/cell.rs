//! `tenure cell get|put|delete`: a small value with a version, written by
//! compare-and-set.

use std::sync::Arc;

use clap::{Args, Subcommand};
use tenure::{Name, Store};

use super::{positive, register_failure};
use crate::exit::{self, Failure};
use crate::output::write_stdout;

#[derive(Subcommand, Debug)]
pub(crate) enum CellCommand {
    /// Print a cell's version and value.
    #[command(after_help = "Example:\n  tenure cell get config --json\n\n\
        Prints `version=N` and then the value on a line of its own. Exits 3 when the cell has\n\
        no value (never written, deleted, or its session ended).")]
    Get(CellGetArgs),
    /// Write a cell if it is as expected; print its new version.
    #[command(
        after_help = "Examples:\n  tenure cell put config 'v1' --if-absent\n  \
        tenure cell put config 'v2' --if-version 1\n\n\
        Exits 75, writing nothing, if the cell is not as expected (the message says its current\n\
        version): read it again and retry."
    )]
    Put(CellPutArgs),
    /// Delete a cell's value if it is at a version.
    #[command(
        after_help = "Example:\n  tenure cell delete config --if-version 2\n\n\
        Exits 75, deleting nothing, if the cell is not at that version."
    )]
    Delete(CellDeleteArgs),
}

#[derive(Args, Debug)]
pub(crate) struct CellGetArgs {
    /// The cell's name.
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("expect").required(true).args(["if_absent", "if_version"])))]
pub(crate) struct CellPutArgs {
    /// The cell's name.
    name: String,
    /// The value (1 byte to 64 KiB).
    value: String,
    /// Write only if the cell has no value.
    #[arg(long)]
    if_absent: bool,
    /// Write only if the cell is at this version.
    #[arg(long, value_name = "N")]
    if_version: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct CellDeleteArgs {
    /// The cell's name.
    name: String,
    /// Delete only if the cell is at this version.
    #[arg(long, value_name = "N", required = true)]
    if_version: String,
}

/// Checks the name, the value and the version before the store is opened.
pub(super) fn validate(command: &CellCommand) -> Result<(), Failure> {
    match command {
        CellCommand::Get(args) => Name::new(&args.name).map(|_| ()).map_err(Into::into),
        CellCommand::Put(args) => {
            Name::new(&args.name)?;
            tenure::store::check_value(args.value.as_bytes())?;
            if let Some(v) = &args.if_version {
                positive("--if-version", v)?;
            }
            Ok(())
        }
        CellCommand::Delete(args) => {
            Name::new(&args.name)?;
            positive("--if-version", &args.if_version).map(|_| ())
        }
    }
}

pub(super) async fn run(store: Arc<dyn Store>, command: CellCommand) -> Result<u8, Failure> {
    match command {
        CellCommand::Get(args) => {
            let cell = tenure::Cell::new(&store, &args.name)?;
            let got = cell.get().await.map_err(register_failure)?;
            if args.json {
                let mut out = serde_json::json!({
                    "cell": cell.name().as_str(),
                    "version": got.as_ref().map(|v| v.version),
                });
                if let Some(v) = &got {
                    match std::str::from_utf8(&v.value) {
                        Ok(text) => out["value"] = text.into(),
                        Err(_) => {
                            let hex: String = v.value.iter().map(|b| format!("{b:02x}")).collect();
                            out["value_hex"] = hex.into();
                        }
                    }
                }
                outln!("{out}");
            } else if let Some(v) = &got {
                let mut out = format!("version={}\n", v.version).into_bytes();
                out.extend_from_slice(&v.value);
                out.push(b'\n');
                write_stdout(&out)?;
            }
            Ok(if got.is_some() { 0 } else { exit::NO_LEADER })
        }
        CellCommand::Put(args) => {
            let expect = match &args.if_version {
                Some(v) => tenure::Expect::Version(positive("--if-version", v)?),
                None => tenure::Expect::Absent,
            };
            let cell = tenure::Cell::new(&store, &args.name)?;
            let version = cell
                .put(args.value.as_bytes(), expect)
                .await
                .map_err(register_failure)?;
            outln!("version={version}");
            Ok(0)
        }
        CellCommand::Delete(args) => {
            let version = positive("--if-version", &args.if_version)?;
            let cell = tenure::Cell::new(&store, &args.name)?;
            cell.delete(version).await.map_err(register_failure)?;
            outln!("deleted version={version}");
            Ok(0)
        }
    }
}
