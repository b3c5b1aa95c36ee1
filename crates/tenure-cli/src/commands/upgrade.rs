//! `tenure upgrade status|finish`: which builds use the store, and
//! finishing a rolling upgrade (docs/operations/upgrades.md).

use std::sync::Arc;

use clap::Subcommand;
use tenure::Store;

use crate::exit::Failure;
use crate::output::escape_line;

#[derive(Subcommand, Debug)]
pub(crate) enum UpgradeCommand {
    /// Show which builds and formats the store's live sessions speak.
    #[command(after_help = "Example:\n  tenure upgrade status --json")]
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Retire the formats older than this build's, once no older build uses the store.
    #[command(after_help = "Example:\n  tenure upgrade finish\n\n\
        Refused (exit 75), changing nothing, while a session of an older build is live on the\n\
        store (a crashed process's lease counts until the store has ended it; `tenure release\n\
        --session TAG --force` ends one). Then older builds are refused by the store from their\n\
        next connection on (on a store that keeps no marker they read, they are not: its page in\n\
        docs/stores/ says so; stop them all first). Finishing again changes nothing.")]
    Finish,
}

pub(super) async fn run(store: Arc<dyn Store>, command: UpgradeCommand) -> Result<u8, Failure> {
    match command {
        UpgradeCommand::Status { json } => status(&store, json).await,
        UpgradeCommand::Finish => {
            let finished = tenure::upgrade::finish(&store).await?;
            outln!("finished: format {}", finished.format);
            for change in &finished.retired {
                outln!("  {}", escape_line(change));
            }
            Ok(0)
        }
    }
}

/// The store's sessions by build, as text lines or JSON.
pub(crate) async fn builds_json(store: &Arc<dyn Store>) -> Result<serde_json::Value, Failure> {
    let groups = tenure::upgrade::builds_in_use(store).await?;
    Ok(serde_json::json!({
        "format": tenure::upgrade::this_format(store.as_ref()),
        "builds": groups.iter().map(|(build, sessions)| serde_json::json!({
            "release": build.as_ref().map(|b| b.release.clone()),
            "format": build.as_ref().map(|b| b.format.clone()),
            "sessions": sessions.iter().map(|s| serde_json::json!({
                "tag": s.tag,
                "label": s.label,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    }))
}

/// One line per build: what `tenure status` and `tenure upgrade status`
/// print.
pub(crate) async fn builds_lines(store: &Arc<dyn Store>) -> Result<Vec<String>, Failure> {
    let groups = tenure::upgrade::builds_in_use(store).await?;
    Ok(groups
        .iter()
        .map(|(build, sessions)| {
            let which = match build {
                Some(b) => format!("tenure {} (format {})", b.release, b.format),
                None => "no build recorded (tenure 0.1.0)".to_string(),
            };
            format!("{which}: {} session(s)", sessions.len())
        })
        .collect())
}

async fn status(store: &Arc<dyn Store>, json: bool) -> Result<u8, Failure> {
    if json {
        outln!("{}", builds_json(store).await?);
        return Ok(0);
    }
    outln!(
        "this build: tenure {} (format {})",
        env!("CARGO_PKG_VERSION"),
        tenure::upgrade::this_format(store.as_ref())
    );
    for line in builds_lines(store).await? {
        outln!("{}", escape_line(&line));
    }
    Ok(0)
}
