//! The conformance suite on every store of the test kit's table that this
//! build has, against real servers the kit starts: one test per store and
//! check (`redis::check_fifo`), plus the fault checks on each server store
//! (killed and restarted, paused, down at start).
//!
//! A store whose cargo feature is off is not run and is named on stderr; a
//! server that is not installed fails on CI and is skipped, loudly,
//! elsewhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use libtest_mimic::{Arguments, Trial};
use tenure_testkit::conformance::{self, Check, Target, CHECKS};
use tenure_testkit::stores::{Running, StoreFixture, STORES};

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    for store in STORES {
        if !store.is_built_in() {
            eprintln!(
                "SKIPPED: {} (cargo feature {:?} of tenure is off)",
                store.backend,
                store.feature()
            );
            continue;
        }
        for check in CHECKS {
            trials.push(Trial::test(
                format!("{}::{}", store.backend, check.name),
                move || {
                    run_check(store, check);
                    Ok(())
                },
            ));
        }
        trials.extend(fault_trials(store));
    }
    libtest_mimic::run(&args, trials).exit();
}

/// The checks that kill, pause or miss a server of the store's own.
fn fault_trials(store: &'static StoreFixture) -> Vec<Trial> {
    let Some(down_url) = store.down_url else {
        return Vec::new();
    };
    let name = |check: &str| format!("{}::{check}", store.backend);
    vec![
        Trial::test(name("server_killed_and_restarted"), move || {
            with_own_server(store, |server| {
                runtime().block_on(conformance::check_server_killed_and_restarted(server));
            });
            Ok(())
        }),
        Trial::test(name("server_paused_while_held"), move || {
            with_own_server(store, |server| {
                runtime().block_on(conformance::check_server_paused(server));
            });
            Ok(())
        }),
        Trial::test(
            name("every_call_fails_in_time_on_a_paused_server"),
            move || {
                with_own_server(store, |server| {
                    runtime().block_on(
                        conformance::check_every_call_fails_in_time_on_a_paused_server(server),
                    );
                });
                Ok(())
            },
        ),
        Trial::test(name("stops_end_on_a_paused_server"), move || {
            with_own_server(store, |server| {
                runtime().block_on(conformance::check_stops_end_on_a_paused_server(server));
            });
            Ok(())
        }),
        Trial::test(
            name("server_down_at_start_is_unavailable_in_time"),
            move || {
                let url = down_url(tenure_testkit::free_port());
                runtime().block_on(conformance::check_down_at_start(&url));
                Ok(())
            },
        ),
    ]
}

/// The runtime each check runs on, as `#[tokio::test]` with two workers.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The stores started so far, by backend; `None` where the server is missing.
type Started = Mutex<HashMap<&'static str, Option<Arc<Running>>>>;

/// One store of each kind for the whole binary, started on first use;
/// `None` where its server is missing (and this is not CI).
fn shared(store: &'static StoreFixture) -> Option<Arc<Running>> {
    static RUNNING: OnceLock<Started> = OnceLock::new();
    let mut running = RUNNING
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    running
        .entry(store.backend)
        .or_insert_with(|| (store.start)().map(Arc::new))
        .clone()
}

fn run_check(store: &'static StoreFixture, check: &Check) {
    let Some(running) = shared(store) else {
        eprintln!("SKIPPED: {}::{}", store.backend, check.name);
        return;
    };
    runtime().block_on(async {
        let target = Target::new(running.url.clone()).await;
        (check.run)(&target).await;
    });
}

/// A server of the store's own, for a check that kills or pauses it.
fn with_own_server(store: &StoreFixture, f: impl FnOnce(&mut dyn tenure_testkit::Server)) {
    let Some(mut running) = (store.start)() else {
        eprintln!("SKIPPED: {}: server not installed", store.backend);
        return;
    };
    match running.server.as_deref_mut() {
        Some(server) => f(server),
        None => panic!(
            "{}: the table gives a down URL but no server",
            store.backend
        ),
    }
}
