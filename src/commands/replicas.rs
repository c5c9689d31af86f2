//! Wake-ups from other processes sharing the store. With Postgres, one LISTEN connection per
//! process receives the [`Signal`]s other replicas' commits send, and hands each to whoever here
//! must know: the bus (observations, a deleted thread), the worker (a run became claimable), a
//! run driven here (a cancel, a decision), the token channels (interest in a thread's deltas,
//! and the deltas, see [`crate::events::token_relay`]). A poll of the watched threads' `last_seq` covers a
//! notification lost while that connection was down; a lost cancel or decision is covered by
//! the run's heartbeat and its fallback look at its suspensions.
//!
//! With a store no other process shares (SQLite), nothing is spawned: every command was made
//! here and already told everyone (see [`crate::commands`]).

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::commands::RunCommands;
use crate::model::ThreadId;
use crate::store::Signal;
use crate::telemetry::metrics::Metrics;

/// Start the LISTEN loop, the poll of watched threads and the token relay on `tracker`, all
/// ending when `stop` fires; nothing when the store is not shared. `every` is the poll's period.
///
/// # Errors
/// The LISTEN connection cannot be opened.
pub async fn spawn(
    tracker: &TaskTracker,
    commands: &RunCommands,
    every: Duration,
    metrics: &Metrics,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let Some(signals) = commands
        .store()
        .signals()
        .await
        .context("listening for signals")?
    else {
        return Ok(());
    };
    tracker.spawn(listen(signals, commands.clone(), stop.clone()));
    tracker.spawn(poll_watched(commands.clone(), every, stop.clone()));
    let tokens = commands.bus().tokens().clone();
    let relay = tokens.relay().clone();
    crate::events::token_relay::spawn(
        tracker,
        &relay,
        Box::new(move || tokens.subscribed()),
        commands.store().clone(),
        metrics.clone(),
        stop,
    );
    Ok(())
}

/// Hand every signal to whoever here must know, until `stop` fires or the stream ends.
async fn listen(
    mut signals: BoxStream<'static, Signal>,
    commands: RunCommands,
    stop: CancellationToken,
) {
    loop {
        let signal = tokio::select! {
            _ = stop.cancelled() => return,
            s = signals.next() => match s {
                Some(s) => s,
                None => return,
            },
        };
        deliver(&commands, signal);
    }
}

/// What a signal means here.
fn deliver(commands: &RunCommands, signal: Signal) {
    match signal {
        Signal::Observations {
            tenant,
            thread,
            seq,
        } => commands
            .bus()
            .wake(&tenant, &ThreadId::from_stored(thread), seq),
        Signal::RunReady => commands.wake_worker(),
        Signal::Cancel { run } => {
            commands.runs().cancel(run);
        }
        Signal::Decided { run } => {
            commands.runs().decided(run);
        }
        Signal::Steered { run } => {
            commands.runs().steered(run);
        }
        Signal::ThreadDeleted { tenant, thread } => {
            commands
                .bus()
                .thread_deleted(&tenant, &ThreadId::from_stored(thread));
        }
        Signal::TokensWanted { threads } => commands.bus().tokens().wanted_remotely(
            threads
                .into_iter()
                .map(|(tenant, thread)| (tenant, ThreadId::from_stored(thread))),
            crate::events::token_relay::INTEREST_TTL,
        ),
        Signal::Tokens {
            tenant,
            thread,
            deltas,
            ..
        } => commands
            .bus()
            .tokens()
            .inject(&tenant, &ThreadId::from_stored(thread), deltas),
    }
}

/// Every `every`, read the `last_seq` of the threads someone here streams and wake their
/// subscribers for what they have not been told; a watched thread with no row was deleted by
/// another replica.
async fn poll_watched(commands: RunCommands, every: Duration, stop: CancellationToken) {
    let (store, bus) = (commands.store(), commands.bus());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let watched = bus.watched();
        if watched.is_empty() {
            continue;
        }
        let keys: Vec<(String, ThreadId)> = watched.into_iter().map(|(t, id, _)| (t, id)).collect();
        match store.thread_seqs(&keys).await {
            Ok(seqs) => {
                let mut missing: HashSet<(String, ThreadId)> = keys.into_iter().collect();
                for (tenant, id, seq) in seqs {
                    missing.remove(&(tenant.clone(), id.clone()));
                    bus.wake(&tenant, &id, seq);
                }
                for (tenant, id) in missing {
                    bus.thread_deleted(&tenant, &id);
                }
            }
            Err(e) => warn!(error = %e, "polling watched threads failed"),
        }
    }
}
