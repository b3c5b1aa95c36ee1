//! The command line's shape: the top-level [`Cli`], the [`Command`] list
//! with each subcommand's help, and the options several subcommands share.
//!
//! One rule for arguments: a subcommand's own argument types live in the
//! file that runs it (`commands/<name>.rs`, or the `console` and `torture`
//! modules for the subcommands big enough to have their own); this file
//! holds only what is not one subcommand's.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::commands::{
    cell::CellCommand, completions::CompletionsArgs, cron::CronArgs, crond::CrondArgs,
    elect::ElectArgs, elector::ElectorCommand, fence::FenceArgs, leader::LeaderArgs,
    lock::LockArgs, release::ReleaseArgs, schedule::ScheduleCommand, shards::ShardsArgs,
    status::StatusArgs, upgrade::UpgradeCommand,
};
use crate::exit::EXIT_CODES;
use crate::{console, torture};

#[derive(Parser, Debug)]
#[command(
    name = "tenure",
    version = crate::version::short(),
    long_version = crate::version::long(),
    about = "Distributed locks and leader election on the stores you already run",
    long_about = "Distributed locks and leader election on the stores you already run.\n\n\
                  The store is --store, else $TENURE_STORE, else an SQLite file in your state \
                  directory ($XDG_STATE_HOME/tenure/tenure.db or ~/.local/state/tenure/tenure.db), \
                  shared by every process on this machine.",
    after_help = EXIT_CODES
)]
pub(crate) struct Cli {
    /// Store URL, BACKEND://… for a backend `tenure backends` lists (e.g. sqlite:///path.db, postgres://user:pw@host/db); each store's URL, options and TLS form: docs/stores/
    #[arg(long, global = true, env = "TENURE_STORE", hide_env_values = true)]
    pub(crate) store: Option<String>,

    /// Log what tenure does (to stderr); repeat for more.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run a command while holding a lock, or hold it until interrupted.
    #[command(
        after_help = "Examples:\n  tenure lock nightly-report --ttl 15s -- ./report.sh\n  \
        tenure lock -w 10s migration      (holds it until SIGINT or SIGTERM; prints `locked NAME TOKEN`)\n\n\
        The command gets TENURE_LOCK=<name> and TENURE_FENCE=<token> in its environment and runs\n\
        in its own process group under a small supervisor process (tenure itself, re-run). If no\n\
        renewal is confirmed, the group gets SIGTERM --kill-grace before the lease's local deadline\n\
        and SIGKILL at it, so the command is stopped before the store can grant the lock to anyone\n\
        else; tenure then exits 79. The supervisor does this even if tenure (or its process group)\n\
        is stopped, and stops the group (SIGTERM, --kill-grace, SIGKILL) if tenure dies. SIGINT,\n\
        SIGTERM or SIGHUP to tenure: SIGTERM to the group, SIGKILL after --kill-grace (a second\n\
        SIGINT within 3 s: at once). The command starts as a shell starts it (empty signal mask,\n\
        default dispositions, descriptors 0-2 only). The lock is released only once nothing of the\n\
        group is left."
    )]
    Lock(LockArgs),
    /// Campaign for leadership; hold it until stopped, or run a command while leader.
    #[command(
        after_help = "Examples:\n  tenure elect scheduler --value \"$(hostname)\"\n  \
        tenure elect scheduler -- ./run-scheduler\n\n\
        Without a command, prints `elected <token>` once leader and holds leadership until\n\
        SIGINT or SIGTERM, then resigns. With a command, runs it only while leader, with the\n\
        same lease-loss handling as `tenure lock`."
    )]
    Elect(ElectArgs),
    /// Own a share of a group's shards: run a command once per shard this instance owns.
    #[command(
        after_help = "Examples:\n  tenure shards ingest --shards 16 -- ./consume.sh\n  \
        tenure shards status ingest --json\n\n\
        Every instance running `tenure shards NAME --shards N` is a member of the group NAME; the\n\
        group's N shards are split among its live members (in proportion to --weight), each shard\n\
        owned by at most one member at a time. For each shard it owns, this instance runs the\n\
        command with TENURE_GROUP, TENURE_SHARD (0 to N-1), TENURE_SHARDS and TENURE_FENCE (the\n\
        shard's fencing token), under the same supervisor as `tenure lock`: stopped by the lease's\n\
        local deadline even if tenure is stopped or dies. When a member joins or leaves, a shard\n\
        that moves is revoked: SIGTERM to its run's process group, SIGKILL after --grace, and the\n\
        shard is released (its next owner granted) only once nothing of the group is left. A run\n\
        that exits while its shard is still owned is started again a second later. SIGINT/SIGTERM:\n\
        every run is stopped (SIGTERM, --grace, SIGKILL), then the member leaves. A lost session\n\
        stops every run; the member then joins again. For thousands of shards per instance, use\n\
        the library (tenure::Shards) rather than a process per shard. A group named `status`\n\
        cannot be run from here."
    )]
    Shards(ShardsArgs),
    /// Show the current leader of an election.
    #[command(
        after_help = "Example:\n  tenure leader scheduler --watch\n\nExits 3 when nobody leads (without --watch)."
    )]
    Leader(LeaderArgs),
    /// List names with their holders and waiters in queue order.
    #[command(after_help = "Example:\n  tenure status nightly- --json")]
    Status(StatusArgs),
    /// Evict the holders of a name, or one session (administrators only).
    #[command(after_help = "Examples:\n  tenure release nightly-report --force\n  \
        tenure release --session 3f2a9c01b7de --force --reason 'stuck worker'\n\n\
        This ends the sessions that hold the name, and everything else they hold. The evicted\n\
        holder learns of it only at its next renewal, so for a moment two holders may both\n\
        believe they hold the lock: safe only if the protected resource checks fencing tokens.")]
    Release(ReleaseArgs),
    /// Run a command on a cron schedule across instances: once per tick, or only on the leader.
    #[command(
        after_help = "Examples:\n  tenure cron '0 */5 * * * *' cleanup -- ./cleanup.sh\n  \
        tenure cron '30 2 * * *' nightly --mode leader --tz Europe/Berlin -- ./nightly.sh\n\n\
        SCHEDULE has six fields (sec min hour day month weekday) or the classic five (at second 0).\n\
        Each tick runs at most once across every instance sharing the store (per-tick mode), or\n\
        only on the elected leader (leader mode). The command gets TENURE_JOB, TENURE_TICK (Unix\n\
        seconds), TENURE_TICK_AT (RFC 3339, in the --tz zone) and, in leader mode, TENURE_FENCE.\n\
        A run is stopped (SIGTERM to its process group, SIGKILL after --grace) at --at-most, when\n\
        the term ends, on SIGINT/SIGTERM to tenure (which then stops), and by the lease's local\n\
        deadline even if tenure is stopped or dies. A schedule that never fires, or a command that\n\
        cannot be found (127) or run (126), is refused at start."
    )]
    Cron(CronArgs),
    /// One election for a service; the crontab's jobs run only on its leader.
    #[command(
        after_help = "Example:\n  tenure crond billing --crontab /etc/billing.crontab --ttl 15s\n\n\
        Each line of the crontab is `[name=JOB] [on-failure=resign] SCHEDULE COMMAND…`: SCHEDULE is\n\
        `@every D` (ticks on multiples of D since the Unix epoch), `@hourly` and the like, or five\n\
        to seven crontab fields (seconds first, a year last); COMMAND runs under `sh -c`. `#` starts\n\
        a comment; `NAME=value` sets the environment of the jobs below it; `%` is refused.\n\
        A job without name= is named from its schedule and command (never its line). Every instance\n\
        campaigns in the election NAME; only the leader runs jobs, each tick at most once across\n\
        the cluster, with TENURE_JOB, TENURE_TICK, TENURE_TICK_AT and TENURE_FENCE (the term's\n\
        token). A run is stopped (SIGTERM, --grace, SIGKILL) when the term ends, before the leader\n\
        resigns. A run that exits non-zero is recorded as failed; with on-failure=resign the leader\n\
        then starts no new run, lets those in progress end (up to --grace) and resigns. SIGHUP reads the\n\
        crontab again; SIGTERM/SIGINT stop new runs, send running ones SIGTERM, SIGKILL after\n\
        --grace, and resign only once none is left. `tenure elector pause NAME` pauses the service."
    )]
    Crond(CrondArgs),
    /// Check a fencing token against a fence kept by the store.
    #[command(after_help = "Example, in a job under `tenure lock printer`:\n  \
        tenure fence printer \"$TENURE_FENCE\" && ./print.sh\n\n\
        Admits TOKEN if it is at least the highest token the fence has admitted, and records it;\n\
        prints `admitted` or `stale`, the token and the highest. Exits 0 when admitted, 75 when\n\
        stale: a later holder of the lock has used the fence, so this holder may have lost the lock.")]
    Fence(FenceArgs),
    /// Serve a live web page of the store's locks, elections and sessions, with an HTTP API.
    #[command(
        after_help = "Example:\n  tenure console --store postgres://… --listen 127.0.0.1:9480\n\n\
        Open http://127.0.0.1:9480/ in a browser. The page follows the store live (server-sent\n\
        events from /api/events); /api/status is `tenure status --json`, /metrics is Prometheus\n\
        text of the store-wide view. Read-only unless started with --admin-token-file: then a\n\
        holder can be force-released (a leader made to step down) from the page, after typing the\n\
        name again and a reason; every such action is appended to --audit-log. Loopback only\n\
        unless a token is set."
    )]
    Console(console::ConsoleArgs),
    /// Read, write or delete a cell: a small value with a version, written by compare-and-set.
    #[command(subcommand)]
    Cell(CellCommand),
    /// List schedules, or pause and resume one on every instance.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Pause or resume an elector on every instance, or show who leads it.
    #[command(subcommand)]
    Elector(ElectorCommand),
    /// Rolling upgrades: which builds use the store, and finishing an upgrade.
    #[command(subcommand)]
    Upgrade(UpgradeCommand),
    /// Declare a new store new, once, before its first use (Redis: grant at once on its empty keyspace).
    #[command(
        after_help = "Example:\n  tenure init --store redis://redis.internal:6379/0\n\n\
        A Redis keyspace that comes back empty (a restart without persistence, a failover to a\n\
        replica that had none of it) looks the same as a new one: tenure grants nothing on an empty\n\
        keyspace until the longest lease it could have held has lapsed (the URL's max_ttl, 60s by\n\
        default). Run this once on a Redis you know is new to skip that wait; never from a start\n\
        script, which would skip it after a loss too. Refused (exit 64) while any session lives on\n\
        the store. Other stores keep what they hold: nothing to do."
    )]
    Init,
    /// Contend for one lock from many worker processes while injecting faults, and check the history.
    #[command(
        after_help = "Example:\n  tenure torture --store postgres://… --clients 6 --duration 2m --report torture.json\n\n\
        Workers (this binary, as processes) loop: lock, read a fenced register with the token, a\n\
        random critical section, write it one higher, release. The harness kills (SIGKILL) and\n\
        pauses (SIGSTOP for 1.5-3 TTLs, some between a read and its write) the holder, keeps the\n\
        fenced register and an unfenced twin, and checks the whole history: lost acknowledged\n\
        writes, tokens that go back or repeat, a lower token accepted, overlaps with no pause in\n\
        force, recovery within TTL + one renew interval, names left behind. Names are under\n\
        tenure-torture/<run>/. Exit 0 pass, 1 safety violation, 2 liveness or leak failure."
    )]
    Torture(torture::TortureArgs),
    /// One worker of `tenure torture` (run by it).
    #[command(hide = true)]
    TortureWorker(torture::WorkerArgs),
    /// Show what each built-in backend can do.
    #[command(after_help = "Example:\n  tenure backends --json")]
    Backends(JsonArg),
    /// Print a completion script for a shell.
    #[command(after_help = "Examples:\n  \
        tenure completions bash > ~/.local/share/bash-completion/completions/tenure\n  \
        tenure completions zsh > \"${fpath[1]}/_tenure\"\n  \
        tenure completions fish > ~/.config/fish/completions/tenure.fish")]
    Completions(CompletionsArgs),
    /// Print the manual page, tenure(1), as roff.
    #[command(after_help = "Example:\n  tenure man > tenure.1 && man ./tenure.1")]
    Man,
}

/// The lease options of `lock` and `elect`.
#[derive(Args, Debug)]
pub(crate) struct LeaseArgs {
    /// Session TTL: how long the store keeps the lease without renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub(crate) ttl: Duration,
    /// Time between SIGTERM and SIGKILL when the lease is at risk (default: TTL/6).
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub(crate) kill_grace: Option<Duration>,
}

/// `--metrics ADDR`, of the subcommands that run a while (`lock`, `elect`,
/// `cron`).
#[derive(Args, Debug, Default)]
pub(crate) struct MetricsArg {
    /// Serve this process's metrics (Prometheus text) at http://ADDR/metrics
    /// while it runs, such as 127.0.0.1:9481 (port 0: any; the address is
    /// printed on stderr).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<std::net::SocketAddr>,
}

/// `--json` alone.
#[derive(Args, Debug)]
pub(crate) struct JsonArg {
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A duration on the command line, such as `15s`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    // Taken even when it starts with '-' (clap would otherwise suggest
    // `-- -5s`, which makes the value the command): said here instead.
    if s.trim_start().starts_with('-') {
        return Err(format!(
            "{s:?} is negative: a duration is 0 or more (examples: 500ms, 15s, 2m)"
        ));
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 15s, 2m)"))
}
