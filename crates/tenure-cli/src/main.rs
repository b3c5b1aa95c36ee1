//! `tenure`: run a command under a distributed lock, or only while leader.

/// `println!` that a closed stdout (`tenure backends | head -1`) does not
/// turn into a panic: the rest of the output is dropped and the command
/// goes on (a lock held meanwhile is still released as usual).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

mod child;
mod console;
mod process_metrics;
mod schedules;
mod supervise;
mod torture;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use tenure::{Election, Error, Mutex, Name, Session, SessionOptions, Store};

/// Exit codes, documented in `--help` and the README.
pub mod exit {
    /// Bad usage: a bad URL, duration, name or flag.
    pub const USAGE: u8 = 64;
    /// The store cannot be reached.
    pub const UNAVAILABLE: u8 = 69;
    /// Any other failure of tenure itself.
    pub const SOFTWARE: u8 = 70;
    /// The lock was not acquired within `--wait` (or at once with `--no-wait`),
    /// or others hold the name in a way that conflicts.
    pub const NOT_ACQUIRED: u8 = 75;
    /// The session's lease was lost (or at risk): while waiting, while
    /// leading, or while the command ran (its process group was terminated).
    pub const LEASE_LOST: u8 = 79;
    /// The command was found but could not be run.
    pub const NOT_EXECUTABLE: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
    /// `tenure leader`: nobody leads; `tenure cell get`: no value;
    /// `tenure release --session`: no live session has the tag.
    pub const NO_LEADER: u8 = 3;
}

const EXIT_CODES: &str = "\
Exit codes (the same in every subcommand):
  the command's own code   when tenure ran a command (128+N if it died of signal N)
  126 the command was found but is not executable
  127 the command was not found
  64  usage error: bad URL, duration, name, flag or schedule (invalid input),
      or a store holding another version's schema or key layout
  69  store unavailable, or it refused the credentials
  70  other failure (a store error of another kind, an internal error)
  75  not acquired: within --wait, at once with --no-wait, or the name is held
      in a conflicting way; a fence refused a stale token; a cell was not at
      the version a write expected
  79  the session's lease was lost: while waiting, while leading, or while the
      command ran (its process group was killed first)
  3   `tenure leader`: nobody leads; `tenure cell get`: the cell has no value;
      `tenure release --session`: no live session has that tag";

#[derive(Parser, Debug)]
#[command(
    name = "tenure",
    version,
    about = "Distributed locks and leader election on the stores you already run",
    long_about = "Distributed locks and leader election on the stores you already run.\n\n\
                  The store is --store, else $TENURE_STORE, else an SQLite file in your state \
                  directory ($XDG_STATE_HOME/tenure/tenure.db or ~/.local/state/tenure/tenure.db), \
                  shared by every process on this machine.",
    after_help = EXIT_CODES
)]
struct Cli {
    /// Store URL: sqlite:///path.db, memory://, postgres://…, mysql://…, redis://…, redlock://…, etcd://…, zk://… (TLS: rediss://, redlocks://, etcds://, zks://, postgres ?sslmode=, mysql ?ssl-mode=)
    #[arg(long, global = true, env = "TENURE_STORE", hide_env_values = true)]
    store: Option<String>,

    /// Log what tenure does (to stderr); repeat for more.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding a lock.
    #[command(
        after_help = "Example:\n  tenure lock nightly-report --ttl 15s -- ./report.sh\n\n\
        The command gets TENURE_LOCK=<name> and TENURE_FENCE=<token> in its environment and runs\n\
        in its own process group under a small supervisor process (tenure itself, re-run). If no\n\
        renewal is confirmed, the group gets SIGTERM --kill-grace before the lease's local deadline\n\
        and SIGKILL at it, so the command is stopped before the store can grant the lock to anyone\n\
        else; tenure then exits 79. The supervisor does this even if tenure itself is stopped, and\n\
        kills the group at once if tenure dies. SIGINT, SIGTERM and SIGHUP sent to tenure are passed\n\
        on to the command; a second SIGINT within 3 s kills the group (SIGKILL). The lock is\n\
        released only once nothing of the group is left."
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
        A run is killed (its whole process group) after --at-most, when the lease is lost, or if\n\
        tenure dies. SIGINT/SIGTERM stop the schedule; a run in progress gets the signal and is\n\
        waited for (a second SIGINT within 3 s kills it). A schedule that never fires, or a\n\
        command that cannot be found (127) or run (126), is refused at start."
    )]
    Cron(CronArgs),
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
    Schedule(schedules::ScheduleCommand),
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

#[derive(Args, Debug)]
struct FenceArgs {
    /// The fence's name (usually the lock's).
    name: String,
    /// The fencing token, a positive integer (a grant's TENURE_FENCE).
    token: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum CellCommand {
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
struct CellGetArgs {
    /// The cell's name.
    name: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("expect").required(true).args(["if_absent", "if_version"])))]
struct CellPutArgs {
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
struct CellDeleteArgs {
    /// The cell's name.
    name: String,
    /// Delete only if the cell is at this version.
    #[arg(long, value_name = "N", required = true)]
    if_version: String,
}

#[derive(Args, Debug)]
struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
struct LeaseArgs {
    /// Session TTL: how long the store keeps the lease without renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    ttl: Duration,
    /// Time between SIGTERM and SIGKILL when the lease is at risk (default: TTL/6).
    #[arg(long, value_parser = parse_duration)]
    kill_grace: Option<Duration>,
}

#[derive(Args, Debug, Default)]
struct MetricsArg {
    /// Serve this process's metrics (Prometheus text) at http://ADDR/metrics
    /// while it runs, such as 127.0.0.1:9481 (port 0: any; the address is
    /// printed on stderr).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

#[derive(Args, Debug)]
struct LockArgs {
    /// The lock's name.
    name: String,
    #[command(flatten)]
    lease: LeaseArgs,
    #[command(flatten)]
    metrics: MetricsArg,
    /// Give up after waiting this long (exit 75).
    #[arg(long, value_parser = parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Give up at once if the lock is held (exit 75).
    #[arg(long)]
    no_wait: bool,
    /// Wait without a place in the queue: whoever asks first after a
    /// release wins (the lock is the same as the fair one of its name).
    #[arg(long)]
    unfair: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct ElectArgs {
    /// The election's name.
    name: String,
    /// The value to lead with (default: host:pid).
    #[arg(long)]
    value: Option<String>,
    #[command(flatten)]
    lease: LeaseArgs,
    #[command(flatten)]
    metrics: MetricsArg,
    /// A command to run only while leader.
    #[arg(last = true, num_args = 0..)]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct CronArgs {
    /// The cron expression, such as '0 */5 * * * *'.
    schedule: String,
    /// The job's name.
    name: String,
    /// Who runs ticks.
    #[arg(long, value_enum, default_value = "per-tick")]
    mode: CronMode,
    /// The time zone the schedule is read in.
    #[arg(long, default_value = "UTC")]
    tz: String,
    /// What to do about ticks missed while no instance could run them.
    #[arg(long, value_enum, default_value = "skip")]
    missed: CronMissed,
    /// Kill a run (its whole process group) that lasts longer than this (more than 0).
    #[arg(long, value_parser = parse_duration)]
    at_most: Option<Duration>,
    /// Keep each tick's claim held at least this long after the tick was due,
    /// even if the run ends sooner. Each tick has a claim of its own, so this
    /// does NOT limit how often the job runs across instances (ShedLock's
    /// lockAtLeastFor does); it only keeps the claim held (and shown by
    /// `tenure status`) that long.
    #[arg(long, value_parser = parse_duration, verbatim_doc_comment)]
    at_least: Option<Duration>,
    /// Session TTL.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    ttl: Duration,
    #[command(flatten)]
    metrics: MetricsArg,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CronMode {
    PerTick,
    Leader,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CronMissed {
    Skip,
    RunOnce,
}

#[derive(Args, Debug)]
struct LeaderArgs {
    /// The election's name.
    name: String,
    /// Print one line per change until interrupted.
    #[arg(long)]
    watch: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// Only names that start with this.
    #[arg(default_value = "")]
    prefix: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ReleaseArgs {
    /// The name to release.
    #[arg(required_unless_present = "session", conflicts_with = "session")]
    name: Option<String>,
    /// End this one session instead: everything it holds or waits for, on
    /// every name (its tag, as `tenure status` shows it).
    #[arg(long, value_name = "TAG")]
    session: Option<String>,
    /// Required: confirms you know this is unsafe without fencing.
    #[arg(long)]
    force: bool,
    /// Why (kept in the audit record).
    #[arg(long, default_value = "")]
    reason: String,
    /// Append the audit record (JSON, one line) to this file too; it always
    /// goes to the log (stderr at -v).
    #[arg(long, env = "TENURE_AUDIT_LOG")]
    audit_log: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct JsonArg {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 15s, 2m)"))
}

/// A failure with its exit code.
#[derive(Debug)]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

/// The one mapping from the library's errors to exit codes, used by every
/// subcommand (the table is `EXIT_CODES`, and the README's).
fn exit_code(e: &Error) -> u8 {
    match e {
        Error::InvalidName { .. }
        | Error::InvalidArgument { .. }
        | Error::InvalidUrl { .. }
        | Error::SchemaMismatch { .. }
        | Error::BackendDisabled { .. }
        | Error::Unsupported { .. } => exit::USAGE,
        Error::Unavailable { .. } | Error::Auth { .. } => exit::UNAVAILABLE,
        Error::Timeout(_)
        | Error::Conflict { .. }
        | Error::StaleToken { .. }
        | Error::VersionMismatch { .. } => exit::NOT_ACQUIRED,
        Error::SessionLost(_) => exit::LEASE_LOST,
        _ => exit::SOFTWARE,
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::new(exit_code(&e), e.to_string())
    }
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == supervise::ARG) {
        return ExitCode::from(supervise::main(argv.get(2..).unwrap_or_default()));
    }
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
    let filter = match cli.verbose {
        0 => "warn",
        1 => "info,tenure=debug",
        _ => "debug",
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .init();
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
    let result = runtime.block_on(run(cli));
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

/// Colour in log lines only on a terminal, and never with `NO_COLOR` set
/// (to anything but the empty string: <https://no-color.org>).
fn colour() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    std::io::stderr().is_terminal() && !no_color
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    match &cli.command {
        Command::Backends(args) => return backends(args.json),
        Command::Completions(args) => return completions(args.shell),
        Command::Man => return man_page(),
        _ => {}
    }
    validate(&cli.command)?;
    let url = store_url(cli.store)?;
    let metrics = match &cli.command {
        Command::Lock(a) => a.metrics.metrics,
        Command::Elect(a) => a.metrics.metrics,
        Command::Cron(a) => a.metrics.metrics,
        _ => None,
    };
    if let Some(addr) = metrics {
        // Before the store opens, so its metrics are described and kept.
        let bound = process_metrics::serve(addr)
            .await
            .map_err(|m| Failure::new(exit::UNAVAILABLE, m))?;
        eprintln!("tenure: metrics on http://{bound}/metrics");
    }
    let store = tenure::open(&url).await?;
    match cli.command {
        Command::Lock(args) => lock(store, args).await,
        Command::Elect(args) => elect(store, args).await,
        Command::Leader(args) => leader(store, args).await,
        Command::Status(args) => status(store, args).await,
        Command::Release(args) => release(store, args).await,
        Command::Cron(args) => cron(store, args).await,
        Command::Fence(args) => fence(store, args).await,
        Command::Torture(args) => torture::run(store, &url, args)
            .await
            .map_err(|m| Failure::new(exit::USAGE, m)),
        Command::TortureWorker(args) => torture::worker(store, args)
            .await
            .map_err(|m| Failure::new(exit::SOFTWARE, m)),
        Command::Cell(command) => cell(store, command).await,
        Command::Schedule(command) => schedules::run(store, command).await,
        Command::Console(args) => {
            let cx = console::Context {
                store,
                store_url: tenure::mask_password(&url),
            };
            console::run(cx, args)
                .await
                .map_err(|(code, message)| Failure::new(code, message))
        }
        Command::Backends(_) | Command::Completions(_) | Command::Man => Ok(0),
    }
}

/// Writes the completion script for `shell`, generated from the CLI's own
/// definition, to stdout.
fn completions(shell: clap_complete::Shell) -> Result<u8, Failure> {
    use clap::CommandFactory;
    let mut command = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "tenure", &mut out);
    write_stdout(&out)
}

/// Writes tenure(1), generated from the CLI's own definition (every
/// subcommand with its options), to stdout as roff.
fn man_page() -> Result<u8, Failure> {
    use clap::CommandFactory;
    let command = Cli::command();
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

fn write_stdout(bytes: &[u8]) -> Result<u8, Failure> {
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
fn print_line(line: std::fmt::Arguments<'_>) {
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

/// Checks what can be checked without the store, so a mistake is reported
/// as one (64, 126, 127) whether or not the store answers.
fn validate(command: &Command) -> Result<(), Failure> {
    match command {
        Command::Schedule(command) => schedules::validate(command),
        Command::Release(ReleaseArgs {
            session: Some(tag), ..
        }) => check_session_tag(tag).map_err(|m| Failure::new(exit::USAGE, m)),
        Command::Release(ReleaseArgs {
            name: Some(name), ..
        }) => Name::new(name).map(|_| ()).map_err(Into::into),
        Command::Fence(args) => {
            Name::new(&args.name)?;
            positive("TOKEN", &args.token).map(|_| ())
        }
        Command::Cell(CellCommand::Get(args)) => {
            Name::new(&args.name).map(|_| ()).map_err(Into::into)
        }
        Command::Cell(CellCommand::Put(args)) => {
            Name::new(&args.name)?;
            tenure::store::check_value(args.value.as_bytes())?;
            if let Some(v) = &args.if_version {
                positive("--if-version", v)?;
            }
            Ok(())
        }
        Command::Cell(CellCommand::Delete(args)) => {
            Name::new(&args.name)?;
            positive("--if-version", &args.if_version).map(|_| ())
        }
        Command::Lock(args) => {
            check_ttl(args.lease.ttl)?;
            child::check_command(&args.command)
        }
        Command::Elect(args) => {
            check_ttl(args.lease.ttl)?;
            if args.command.is_empty() {
                Ok(())
            } else {
                child::check_command(&args.command)
            }
        }
        Command::Cron(args) => {
            check_ttl(args.ttl)?;
            if args.at_most.is_some_and(|d| d.is_zero()) {
                return Err(Failure::new(
                    exit::USAGE,
                    "--at-most 0s would kill every run at once: give a positive duration, or leave it out",
                ));
            }
            let cron = tenure::parse_cron(&args.schedule)?;
            let tz: chrono_tz::Tz = args.tz.parse().map_err(|e| {
                Failure::new(exit::USAGE, format!("invalid time zone {:?}: {e}", args.tz))
            })?;
            if cron
                .after(&chrono::Utc::now().with_timezone(&tz))
                .next()
                .is_none()
            {
                return Err(Failure::new(
                    exit::USAGE,
                    format!(
                        "the schedule {:?} never fires (no time matches it from now on)",
                        args.schedule
                    ),
                ));
            }
            child::check_command(&args.command)
        }
        _ => Ok(()),
    }
}

/// --store, else $TENURE_STORE (through clap), else the SQLite file in the
/// user's state directory, created on first use.
fn store_url(flag: Option<String>) -> Result<String, Failure> {
    if let Some(url) = flag {
        if url.trim().is_empty() {
            return Err(Failure::new(
                exit::USAGE,
                "the store URL (--store or $TENURE_STORE) is empty: give a URL, or leave both unset for the default SQLite store",
            ));
        }
        return Ok(url);
    }
    let dir = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(state) => PathBuf::from(state).join("tenure"),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".local/state/tenure"),
            None => {
                return Err(Failure::new(
                    exit::USAGE,
                    "no --store, no $TENURE_STORE, and no $HOME or $XDG_STATE_HOME for the default store",
                ))
            }
        },
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        Failure::new(
            exit::USAGE,
            format!(
                "cannot create the default store's directory {}: {e}",
                dir.display()
            ),
        )
    })?;
    Ok(format!("sqlite://{}", dir.join("tenure.db").display()))
}

async fn open_session(
    store: &std::sync::Arc<dyn Store>,
    lease: &LeaseArgs,
) -> Result<(Session, Duration), Failure> {
    check_ttl(lease.ttl)?;
    let grace = lease.kill_grace.unwrap_or(lease.ttl / 6);
    if grace >= lease.ttl / 2 {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "--kill-grace {grace:?} must be under half the TTL ({:?})",
                lease.ttl
            ),
        ));
    }
    let session = Session::with_options(store, SessionOptions::new().ttl(lease.ttl)).await?;
    Ok((session, grace))
}

fn check_ttl(ttl: Duration) -> Result<(), Failure> {
    if ttl.is_zero() {
        return Err(Failure::new(
            exit::USAGE,
            "--ttl 0s: the session TTL must be more than zero (such as 15s)",
        ));
    }
    Ok(())
}

async fn lock(store: std::sync::Arc<dyn Store>, args: LockArgs) -> Result<u8, Failure> {
    let (session, grace) = open_session(&store, &args.lease).await?;
    let mutex = Mutex::new(&session, &args.name)?.fair(!args.unfair);
    let mut signals = child::Signals::new()?;
    let acquire = async {
        if args.no_wait {
            mutex.try_lock().await
        } else if let Some(wait) = args.wait {
            match mutex.lock_timeout(wait).await {
                Err(Error::Timeout(_)) => Ok(None),
                other => other.map(Some),
            }
        } else {
            mutex.lock().await.map(Some)
        }
    };
    let guard = tokio::select! {
        acquired = acquire => acquired,
        signal = signals.recv() => {
            let _ = session.close().await;
            return Ok(128 + signal as u8);
        }
    };
    let guard = match guard {
        Ok(Some(guard)) => guard,
        Ok(None) => {
            let _ = session.close().await;
            let when = match args.wait {
                Some(wait) => format!("within {}", humantime::format_duration(wait)),
                None => "at once (--no-wait)".to_string(),
            };
            return Err(Failure::new(
                exit::NOT_ACQUIRED,
                format!(
                    "lock {:?} is held by another session; not acquired {when}",
                    args.name
                ),
            ));
        }
        Err(e) => {
            let _ = bounded_close(&session).await;
            return Err(e.into());
        }
    };
    tracing::info!(name = %args.name, token = guard.token(), "lock acquired");
    let env = [
        ("TENURE_LOCK", args.name.clone()),
        ("TENURE_FENCE", guard.token().to_string()),
    ];
    let outcome =
        match child::run_while_held(&args.command, &env, &session, grace, &mut signals).await {
            Ok(outcome) => outcome,
            Err(f) => {
                // Release now: a runtime shutting down would not run a drop's release.
                let _ = guard.release().await;
                let _ = bounded_close(&session).await;
                return Err(f);
            }
        };
    finish(outcome, guard.release(), &session).await
}

/// How long tenure waits, at most, to end a session whose lease is lost:
/// the store ends it by itself within the TTL anyway.
const LOST_CLOSE_BOUND: Duration = Duration::from_secs(1);

/// Closes the session, waiting at most [`LOST_CLOSE_BOUND`].
async fn bounded_close(session: &Session) -> bool {
    matches!(
        tokio::time::timeout(LOST_CLOSE_BOUND, session.close()).await,
        Ok(Ok(()))
    )
}

/// Turns a child's outcome into tenure's exit code, after releasing. Called
/// only once the command's process group is gone.
async fn finish(
    outcome: child::Outcome,
    release: impl std::future::Future<Output = tenure::Result<()>>,
    session: &Session,
) -> Result<u8, Failure> {
    match outcome {
        child::Outcome::Exited(code) => {
            if let Err(e) = release.await {
                tracing::warn!(error = %e, "release after the command exited failed");
            }
            let _ = bounded_close(session).await;
            Ok(code)
        }
        child::Outcome::LeaseLost(why) => {
            // Nothing to release: the lease is gone or about to be. Ending the
            // session lets others in sooner, but a store that does not answer
            // must not keep tenure from reporting the loss.
            drop(release);
            tracing::warn!(
                "the command's process group is gone; ending the session (best effort, at most {}s)",
                LOST_CLOSE_BOUND.as_secs()
            );
            if bounded_close(session).await {
                tracing::info!("session ended");
            } else {
                tracing::warn!("the store did not confirm the session's end; it expires it by itself within the TTL");
            }
            Err(Failure::new(
                exit::LEASE_LOST,
                format!("lease lost while the command ran ({why}); its process group was killed"),
            ))
        }
    }
}

async fn elect(store: std::sync::Arc<dyn Store>, args: ElectArgs) -> Result<u8, Failure> {
    let (session, grace) = open_session(&store, &args.lease).await?;
    let election = Election::new(&session, &args.name)?;
    let value = args.value.clone().unwrap_or_else(tenure::default_label);
    let mut signals = child::Signals::new()?;
    let term = tokio::select! {
        term = election.campaign(value.clone()) => term?,
        signal = signals.recv() => {
            let _ = session.close().await;
            return Ok(128 + signal as u8);
        }
    };
    tracing::info!(name = %args.name, token = term.token(), "elected");
    if args.command.is_empty() {
        outln!("elected {}", term.token());
        let lost = term.lost();
        tokio::select! {
            reason = lost => {
                return Err(Failure::new(exit::LEASE_LOST, format!("leadership lost: {reason}")));
            }
            _ = signals.recv() => {}
        }
        let _ = term.resign().await;
        let _ = session.close().await;
        return Ok(0);
    }
    let env = [
        ("TENURE_ELECTION", args.name.clone()),
        ("TENURE_FENCE", term.token().to_string()),
        ("TENURE_LEADER_VALUE", value),
    ];
    let outcome =
        match child::run_while_held(&args.command, &env, &session, grace, &mut signals).await {
            Ok(outcome) => outcome,
            Err(f) => {
                let _ = term.resign().await;
                let _ = bounded_close(&session).await;
                return Err(f);
            }
        };
    finish(outcome, term.resign(), &session).await
}

async fn cron(store: std::sync::Arc<dyn Store>, args: CronArgs) -> Result<u8, Failure> {
    let mut schedule = tenure::Schedule::new(&store, &args.name, &args.schedule)?
        .time_zone(&args.tz)?
        .mode(match args.mode {
            CronMode::PerTick => tenure::ScheduleMode::PerTick,
            CronMode::Leader => tenure::ScheduleMode::Leader,
        })
        .missed(match args.missed {
            CronMissed::Skip => tenure::Missed::Skip,
            CronMissed::RunOnce => tenure::Missed::RunOnce,
        })
        .session_options(SessionOptions::new().ttl(args.ttl));
    if let Some(d) = args.at_most {
        schedule = schedule.lock_at_most_for(d);
    }
    if let Some(d) = args.at_least {
        schedule = schedule.lock_at_least_for(d);
    }
    let running = child::RunningGroup::default();
    let stop = child::forward_signals_then_stop(running.clone())?;
    let name = args.name.clone();
    let command = args.command.clone();
    // Checked in `validate`; the library parsed it too.
    let tz: chrono_tz::Tz = args.tz.parse().unwrap_or(chrono_tz::UTC);
    schedule
        .run(
            move |tick| {
                let mut env = vec![
                    ("TENURE_JOB", name.clone()),
                    ("TENURE_TICK", tick.at.timestamp().to_string()),
                    ("TENURE_TICK_AT", tick.at.with_timezone(&tz).to_rfc3339()),
                ];
                if let Some(token) = tick.leader_token {
                    env.push(("TENURE_FENCE", token.to_string()));
                }
                let (command, running) = (command.clone(), running.clone());
                async move {
                    match child::run_tick(&command, &env, &running).await {
                        Ok(code) if code != 0 => {
                            tracing::warn!(code, at = %tick.at, "the run failed")
                        }
                        Ok(_) => {}
                        Err(f) => tracing::error!(at = %tick.at, "{}", f.message),
                    }
                }
            },
            stop,
        )
        .await?;
    Ok(0)
}

fn unix_ms(t: Option<SystemTime>) -> Option<u128> {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis())
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

fn leader_line(name: &Name, leader: &Option<tenure::Leader>, json: bool) -> String {
    match (leader, json) {
        (Some(l), true) => serde_json::json!({
            "name": name.as_str(),
            "token": l.token,
            "value": l.value_str(),
            "label": l.label,
            "since_ms": unix_ms(l.since),
        })
        .to_string(),
        (None, true) => serde_json::json!({ "name": name.as_str(), "token": null }).to_string(),
        (Some(l), false) => format!(
            "{} token={} label={}",
            escape_line(&l.value_str()),
            l.token,
            escape_line(&l.label)
        ),
        (None, false) => "none".to_string(),
    }
}

async fn leader(store: std::sync::Arc<dyn Store>, args: LeaderArgs) -> Result<u8, Failure> {
    let name = Name::new(&args.name)?;
    if !args.watch {
        let leader = tenure::leader(store.as_ref(), &name).await?;
        outln!("{}", leader_line(&name, &leader, args.json));
        return Ok(if leader.is_some() { 0 } else { exit::NO_LEADER });
    }
    let mut observer = tenure::Observer::new(store, name.clone());
    let mut signals = child::Signals::new()?;
    loop {
        tokio::select! {
            next = observer.next() => {
                let leader = next?;
                outln!("{}", leader_line(&name, &leader, args.json));
            }
            _ = signals.recv() => return Ok(0),
        }
    }
}

/// A positive whole number given as `what` on the command line: digits
/// only, at most the largest token or version a store hands out.
fn positive(what: &str, text: &str) -> Result<u64, Failure> {
    let n = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u64>()
            .ok()
            .filter(|n| *n > 0 && i64::try_from(*n).is_ok())
    } else {
        None
    };
    n.ok_or_else(|| {
        Failure::new(
            exit::USAGE,
            format!(
                "{what} must be a whole number from 1 to {}, not {:?}",
                i64::MAX,
                escape_line(text)
            ),
        )
    })
}

/// A fence's or a cell's name used as the other is bad input here: exit 64,
/// not 75, so that a retry loop on 75 does not spin on it.
fn register_failure(e: Error) -> Failure {
    match e {
        Error::Conflict { .. } => Failure::new(exit::USAGE, e.to_string()),
        e => e.into(),
    }
}

async fn fence(store: std::sync::Arc<dyn Store>, args: FenceArgs) -> Result<u8, Failure> {
    let token = positive("TOKEN", &args.token)?;
    let fence = tenure::Fence::new(&store, &args.name)?;
    let (admitted, highest) = match fence.admit(token).await {
        Ok(highest) => (true, highest),
        Err(Error::StaleToken { highest, .. }) => (false, highest),
        Err(e) => return Err(register_failure(e)),
    };
    if args.json {
        outln!(
            "{}",
            serde_json::json!({
                "fence": fence.name().as_str(),
                "token": token,
                "admitted": admitted,
                "highest": highest,
            })
        );
    } else {
        let word = if admitted { "admitted" } else { "stale" };
        outln!("{word} token={token} highest={highest}");
    }
    if admitted {
        Ok(0)
    } else {
        eprintln!(
            "tenure: fence {} refused token {token}: it has seen {highest}, so a later holder \
             has used it",
            fence.name()
        );
        Ok(exit::NOT_ACQUIRED)
    }
}

async fn cell(store: std::sync::Arc<dyn Store>, command: CellCommand) -> Result<u8, Failure> {
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

/// `tenure status --json`'s answer (also the console's `/api/status`).
pub(crate) async fn status_json(
    store: &dyn Store,
    prefix: &str,
) -> tenure::Result<serde_json::Value> {
    let mut all = Vec::new();
    for name in store.names(prefix).await? {
        let queue = store.queue(&name).await?;
        let entries: Vec<_> = queue
            .entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "token": e.seq,
                    "state": if e.granted { "holder" } else { "waiter" },
                    "kind": format!("{:?}", e.kind),
                    "label": e.label,
                    "session": e.session_tag,
                    "holds": e.holds,
                    "ttl_left_ms": e.expires_in.as_millis(),
                    "value": String::from_utf8_lossy(&e.value),
                })
            })
            .collect();
        all.push(serde_json::json!({ "name": name.as_str(), "entries": entries }));
    }
    Ok(serde_json::Value::Array(all))
}

async fn status(store: std::sync::Arc<dyn Store>, args: StatusArgs) -> Result<u8, Failure> {
    if args.json {
        outln!("{}", status_json(store.as_ref(), &args.prefix).await?);
        return Ok(0);
    }
    for name in store.names(&args.prefix).await? {
        let queue = store.queue(&name).await?;
        outln!("{name}");
        for e in &queue.entries {
            outln!(
                "  {:<6} token={} {:?} label={} session={} ttl_left={}",
                if e.granted { "holder" } else { "waiter" },
                e.seq,
                e.kind,
                escape_line(&e.label),
                e.session_tag,
                humantime::format_duration(Duration::from_millis(e.expires_in.as_millis() as u64)),
            );
        }
    }
    Ok(0)
}

/// A queue as an audit record keeps it: each entry's token, state, session
/// and label (the console's actions and `release --force` alike).
pub(crate) fn entries_brief(q: &tenure::store::Queue) -> serde_json::Value {
    q.entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "token": e.seq,
                "state": if e.granted { "holder" } else { "waiter" },
                "session": e.session_tag,
                "label": e.label,
            })
        })
        .collect()
}

/// Records a forced action: to the log always, and as one JSON line
/// appended to `path` when given.
pub(crate) fn audit(
    path: Option<&std::path::Path>,
    record: &serde_json::Value,
) -> std::io::Result<()> {
    tracing::warn!(target: "tenure::audit", record = %record, "forced action");
    let Some(path) = path else {
        return Ok(());
    };
    use std::io::Write;
    let mut line = record.to_string();
    line.push('\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(line.as_bytes())
}

/// The entries of the session `tag`, on every name, as an audit record
/// keeps them (best effort: a name that cannot be read is left out).
pub(crate) async fn session_entries(store: &dyn Store, tag: &str) -> serde_json::Value {
    let mut found = Vec::new();
    for name in store.names("").await.unwrap_or_default() {
        let Ok(q) = store.queue(&name).await else {
            continue;
        };
        for e in q.entries.iter().filter(|e| e.session_tag == tag) {
            found.push(serde_json::json!({
                "name": name.as_str(),
                "token": e.seq,
                "state": if e.granted { "holder" } else { "waiter" },
                "label": e.label,
            }));
        }
    }
    serde_json::Value::Array(found)
}

/// Checks a session tag typed by a user (any text is safe to pass on; this
/// only says early that it cannot be one).
pub(crate) fn check_session_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() || tag.len() > 128 || tag.chars().any(char::is_control) {
        return Err(format!(
            "{:?} is not a session tag (1 to 128 characters, as `tenure status` shows it)",
            tag.escape_debug().take(40).collect::<String>()
        ));
    }
    Ok(())
}

async fn release(store: std::sync::Arc<dyn Store>, args: ReleaseArgs) -> Result<u8, Failure> {
    if !args.force {
        return Err(Failure::new(
            exit::USAGE,
            "release evicts another process's lease: pass --force if you mean it (see --help)",
        ));
    }
    if let Some(tag) = &args.session {
        check_session_tag(tag).map_err(|m| Failure::new(exit::USAGE, m))?;
        let before = session_entries(store.as_ref(), tag).await;
        let ended = store.evict_session(tag).await;
        let after = session_entries(store.as_ref(), tag).await;
        // A failure may have ended the session all the same (on some nodes
        // of a Redlock, say): it is audited too.
        let error = ended.as_ref().err().map(ToString::to_string);
        let record = serde_json::json!({
            "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            "who": std::env::var("USER").unwrap_or_default(),
            "from": format!("tenure release on {}", tenure::default_label()),
            "action": "end-session",
            "target": tag,
            "reason": args.reason,
            "ended": ended.as_ref().ok(),
            "error": error,
            "before": before,
            "after": after,
        });
        audit(args.audit_log.as_deref(), &record).map_err(|e| {
            Failure::new(
                exit::SOFTWARE,
                format!("done, but the audit log could not be written: {e}"),
            )
        })?;
        if ended? {
            outln!("ended session {tag}");
            return Ok(0);
        }
        return Err(Failure::new(
            exit::NO_LEADER,
            format!("no live session has the tag {tag}"),
        ));
    }
    let Some(name) = &args.name else {
        return Err(Failure::new(exit::USAGE, "give a NAME or --session TAG"));
    };
    let name = Name::new(name)?;
    // The record's "before" is best effort: the release does not wait on it.
    let before = store.queue(&name).await.unwrap_or_default();
    let evicted = store.evict(&name).await?;
    let after = store.queue(&name).await.unwrap_or_default();
    let record = serde_json::json!({
        "time": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        "who": std::env::var("USER").unwrap_or_default(),
        "from": format!("tenure release on {}", tenure::default_label()),
        "action": "release",
        "target": name.as_str(),
        "reason": args.reason,
        "evicted_sessions": evicted,
        "before": entries_brief(&before),
        "after": entries_brief(&after),
    });
    audit(args.audit_log.as_deref(), &record).map_err(|e| {
        Failure::new(
            exit::SOFTWARE,
            format!("released, but the audit log could not be written: {e}"),
        )
    })?;
    outln!("evicted {evicted} session(s) holding {name}");
    Ok(0)
}

fn backends(json: bool) -> Result<u8, Failure> {
    let all = tenure::builtin_backends();
    if json {
        let rows: Vec<_> = all
            .iter()
            .map(|c| {
                serde_json::json!({
                    "backend": c.backend,
                    "fencing": c.fencing,
                    "durable": c.durable,
                    "multi_process": c.multi_process,
                    "fifo": c.fifo,
                    "shared": c.shared,
                    "permits": c.permits,
                    "grant_times": c.grant_times,
                    "exact_first": c.exact_first,
                    "fences": c.fences,
                    "fence_values": c.fence_values,
                    "cells": c.cells,
                    "wake": format!("{:?}", c.wake),
                    "clock": c.clock,
                    "min_ttl_ms": c.min_ttl.as_millis(),
                    "max_ttl_ms": c.max_ttl.as_millis(),
                    "round_trips": c.round_trips,
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(rows));
    } else {
        for c in &all {
            outln!("{}", c.backend);
            outln!(
                "  fencing={} durable={} multi_process={} fifo={} shared={} permits={} grant_times={} exact_first={}",
                c.fencing, c.durable, c.multi_process, c.fifo, c.shared, c.permits, c.grant_times, c.exact_first
            );
            outln!(
                "  fences={} fence_values={} cells={}",
                c.fences,
                c.fence_values,
                c.cells
            );
            outln!("  wake: {:?}", c.wake);
            outln!("  clock: {}", c.clock);
            outln!("  ttl: {:?}..={:?}", c.min_ttl, c.max_ttl);
            outln!("  cost: {}", c.round_trips);
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One error kind, one exit code, whichever subcommand meets it.
    #[test]
    fn each_error_kind_has_one_exit_code() {
        let boxed = || -> tenure::BoxError { "x".into() };
        for (e, code) in [
            (
                Error::SessionLost(tenure::LostReason::Expired),
                exit::LEASE_LOST,
            ),
            (
                Error::SchemaMismatch {
                    backend: "redis",
                    url: "u".into(),
                    found: "layout 1".into(),
                    expected: "layout 2".into(),
                },
                exit::USAGE,
            ),
            (Error::Timeout(Duration::from_secs(1)), exit::NOT_ACQUIRED),
            (
                Error::Conflict {
                    name: "n".into(),
                    reason: "r".into(),
                },
                exit::NOT_ACQUIRED,
            ),
            (
                Error::InvalidUrl {
                    url: "u".into(),
                    reason: "r".into(),
                },
                exit::USAGE,
            ),
            (
                Error::Unavailable {
                    backend: "b",
                    source: boxed(),
                },
                exit::UNAVAILABLE,
            ),
            (
                Error::Backend {
                    backend: "b",
                    source: boxed(),
                },
                exit::SOFTWARE,
            ),
            (Error::NotHeld("x"), exit::SOFTWARE),
        ] {
            assert_eq!(Failure::from(e).code, code);
        }
    }

    #[test]
    fn escape_line_keeps_one_line_and_plain_text() {
        assert_eq!(escape_line("host:1 é"), "host:1 é");
        assert_eq!(escape_line("a\nb\u{1b}[1m\\"), r"a\nb\u{1b}[1m\\");
    }

    #[test]
    fn spawn_failures_map_like_a_shell() {
        use std::io::Error as E;
        assert_eq!(
            supervise::spawn_failure_code(&E::from_raw_os_error(libc::ENOENT)),
            127
        );
        assert_eq!(
            supervise::spawn_failure_code(&E::from_raw_os_error(libc::EACCES)),
            126
        );
        assert_eq!(
            supervise::spawn_failure_code(&E::from_raw_os_error(libc::ENOEXEC)),
            126
        );
        assert_eq!(
            supervise::spawn_failure_code(&E::from_raw_os_error(libc::EAGAIN)),
            70
        );
    }
}
