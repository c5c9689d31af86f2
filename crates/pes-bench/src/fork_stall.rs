//! Fork-stall mode: whether forking a long thread stalls the other tenants. The contract: a fork
//! holds SQLite's writer (or, on Postgres, locks beyond its own rows) at most 100 ms at a time,
//! however large its source, so while 10 forks of a 10,000-observation thread run, another
//! tenant's writes keep p99 ≤ 250 ms on both stores.
//!
//! The service gets two tenants (`PES_API_KEYS`, [`api_keys`]). As `forker` the bench grows ONE
//! thread to `--observations` observations (history mode's follow-ups). Then, as `bystander`, it
//! writes memory-store items one after another (`PUT /v1/store/items`, a write transaction
//! each: on SQLite it waits for the one writer), timing each from the request sent to the answer
//! received: alone for [`ALONE`] (the baseline), then while `--forks` forks of the thread run at
//! once (`POST /v1/threads/{id}/fork`, as `forker`), until the last fork has answered. A write
//! counts as alone when it ended before the first fork was sent, as during the forks when it
//! overlapped them. Last, one fork is checked to end at its source's last observation (a fork
//! that copied nothing would be fast and prove nothing).
//!
//! A p99 past the bound is a figure, printed as such (`contract: … no`); the bench fails only
//! when a fork is refused or cut elsewhere, or a write fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::Args;
use crate::history::{Grown, grow_thread, last_seq};
use crate::runs::{ms, quantile};
use crate::server::{Server, phase, truncate};
use crate::store::Database;
use crate::system::Machine;

/// The forking tenant's API key (loopback only: it protects nothing).
const FORKER_KEY: &str = "pes-bench-forker";
/// The other tenant's API key.
const BYSTANDER_KEY: &str = "pes-bench-bystander";
/// How long the bystander writes before the forks start: its latency with nothing else running.
const ALONE: Duration = Duration::from_secs(2);
/// The contract's bound on the bystander's p99 while the forks run.
const BOUND: Duration = Duration::from_millis(250);

/// `PES_API_KEYS` of the service in this mode: the two tenants, `key:tenant`.
pub(crate) fn api_keys() -> String {
    format!("{FORKER_KEY}:forker,{BYSTANDER_KEY}:bystander")
}

/// What fork-stall mode measured.
pub(crate) struct ForkStallReport {
    /// The source thread's last seq.
    observations: i64,
    runs: usize,
    build: Duration,
    /// Each fork's duration (request sent to answer received), sorted.
    forks: Vec<Duration>,
    /// The statuses the forks were answered with (each 200 or 201), and how many of each.
    statuses: Vec<(u16, usize)>,
    /// From the first fork sent to the last answered.
    forking: Duration,
    /// The bystander's writes that ended before the first fork was sent, sorted.
    alone: Vec<Duration>,
    /// The bystander's writes that overlapped the forks, sorted.
    during: Vec<Duration>,
    /// The fork checked, and the last seq it holds (its source's).
    checked: (String, i64),
}

/// Grow the thread, start the bystander, fork at once, stop the bystander, check a fork.
pub(crate) async fn fork_stall_mode(args: &Args, server: &Server) -> Result<ForkStallReport> {
    let limit = args.phase_deadline();
    let forker = server.as_tenant(FORKER_KEY)?;
    let bystander = server.as_tenant(BYSTANDER_KEY)?;
    let Grown {
        thread,
        last,
        runs,
        took: build,
    } = grow_thread(&forker, limit, args.observations).await?;
    let end = phase(
        "reading the source's last observation",
        limit,
        last_observation(&forker, &thread, last),
    )
    .await?;

    let stop = AtomicBool::new(false);
    let ids: Vec<String> = (0..args.forks)
        .map(|i| format!("fork-{i}-{}", Uuid::now_v7()))
        .collect();
    let driver = async {
        tokio::time::sleep(ALONE).await;
        let first = Instant::now();
        // Every fork at once: they queue on the source's lock or the writer, as clients would.
        let forks =
            futures::future::join_all(ids.iter().map(|id| fork(&forker, &thread, id, end, limit)))
                .await;
        let window = (first, Instant::now());
        stop.store(true, Ordering::Relaxed);
        let forks = forks.into_iter().collect::<Result<Vec<_>>>()?;
        Ok::<_, anyhow::Error>((forks, window))
    };
    let ((forks, (first, done)), writes) =
        phase("forking while the bystander writes", limit, async {
            tokio::try_join!(driver, bystander_writes(&bystander, &stop, limit))
        })
        .await?;

    let checked = ids[0].clone();
    phase(
        "checking a fork",
        limit,
        check_fork(&forker, &thread, &checked, last, end),
    )
    .await?;

    let mut alone = Vec::new();
    let mut during = Vec::new();
    for (sent, took) in writes {
        if sent + took <= first {
            alone.push(took);
        } else if sent < done {
            during.push(took);
        }
    }
    alone.sort_unstable();
    during.sort_unstable();
    let mut statuses: Vec<(u16, usize)> = Vec::new();
    for (status, _) in &forks {
        match statuses.iter_mut().find(|(s, _)| s == status) {
            Some((_, n)) => *n += 1,
            None => statuses.push((*status, 1)),
        }
    }
    let mut durations: Vec<Duration> = forks.into_iter().map(|(_, took)| took).collect();
    durations.sort_unstable();
    Ok(ForkStallReport {
        observations: end,
        runs,
        build,
        forks: durations,
        statuses,
        forking: done - first,
        alone,
        during,
        checked: (checked, end),
    })
}

/// The thread's last observation, paging its log from just before `from` (a seq it holds): the
/// newest history point may be followed by observations that changed no state.
async fn last_observation(server: &Server, thread: &str, from: i64) -> Result<i64> {
    let mut after = (from - 1).max(0);
    let mut end = 0;
    loop {
        let page = server
            .get_json(&format!(
                "/v1/threads/{thread}/observations?after={after}&limit=1000"
            ))
            .await?;
        let items = page["items"].as_array().map_or(&[][..], Vec::as_slice);
        if let Some(seq) = items.last().and_then(|o| o["seq"].as_i64()) {
            end = seq;
        }
        match page["nextCursor"].as_str().and_then(|c| c.parse().ok()) {
            Some(next) if !items.is_empty() => after = next,
            _ => return Ok(end),
        }
    }
}

/// Fork `source` as `id` (`POST /v1/threads/{id}/fork`): the status it was answered with and
/// how long it took, from the request sent to the answer received. Anything but 200 or 201, or
/// a fork cut anywhere but at `end` (the source's last observation), fails the bench.
async fn fork(
    forker: &Server,
    source: &str,
    id: &str,
    end: i64,
    limit: Duration,
) -> Result<(u16, Duration)> {
    let path = format!("/v1/threads/{source}/fork");
    let sent = Instant::now();
    let resp = forker
        .http
        .post(forker.url(&path))
        .json(&json!({"threadId": id}))
        .timeout(limit)
        .send()
        .await
        .with_context(|| format!("fork {id}: POST {path}"))?;
    let status = resp.status();
    let text = resp
        .text()
        .await
        .with_context(|| format!("fork {id}: POST {path}: body"))?;
    let took = sent.elapsed();
    ensure!(
        matches!(status.as_u16(), 200 | 201),
        "fork {id}: POST {path} answered {status}: {}",
        truncate(&text, 300)
    );
    let thread: Value = serde_json::from_str(&text)
        .with_context(|| format!("fork {id}: not JSON: {}", truncate(&text, 300)))?;
    let from = &thread["metadata"]["forkedFrom"];
    ensure!(
        thread["threadId"] == id && from["threadId"] == source && from["atSeq"] == end,
        "fork {id}: expected the thread {id} forked from {source} at {end}, got {}",
        truncate(&text, 300)
    );
    Ok((status.as_u16(), took))
}

/// The bystander: items written one after another until `stop`, each timed from the request sent
/// to the answer received (`(sent, took)`). Every write must succeed (204): a refused write is
/// no latency.
async fn bystander_writes(
    bystander: &Server,
    stop: &AtomicBool,
    limit: Duration,
) -> Result<Vec<(Instant, Duration)>> {
    let mut writes = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let sent = Instant::now();
        let resp = bystander
            .http
            .put(bystander.url("/v1/store/items"))
            .json(&json!({"namespace": ["bench"], "key": format!("k{n}"), "value": {"n": n}}))
            .timeout(limit)
            .send()
            .await
            .with_context(|| format!("bystander write {n}: PUT /v1/store/items"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let took = sent.elapsed();
        if status.as_u16() != 204 {
            bail!(
                "bystander write {n}: PUT /v1/store/items answered {status}: {}",
                truncate(&text, 300)
            );
        }
        writes.push((sent, took));
    }
    Ok(writes)
}

/// Whether the fork ends where its source does: the same newest history point, and its log's
/// last observation is the source's `end` (read from just before it: cheap, however long the
/// log).
async fn check_fork(forker: &Server, source: &str, fork: &str, last: i64, end: i64) -> Result<()> {
    let point = last_seq(forker, fork).await?;
    ensure!(
        point == last,
        "the fork {fork}'s newest history point is {point}, its source {source}'s is {last}"
    );
    let its_end = last_observation(forker, fork, end).await?;
    ensure!(
        its_end == end,
        "the fork {fork}'s last observation is {its_end}, its source {source}'s is {end}"
    );
    Ok(())
}

impl ForkStallReport {
    fn p99_during(&self) -> Option<Duration> {
        quantile(&self.during, 0.99)
    }

    pub(crate) fn print(&self, args: &Args, db: &Database, m: &Machine) {
        let what = format!(
            "mode=fork-stall  observations={}  forks={}",
            args.observations, args.forks
        );
        println!("{}", m.header(db, &what));
        println!(
            "source            {} observations from {} runs (built in {:.1} s)",
            self.observations,
            self.runs,
            self.build.as_secs_f64()
        );
        let statuses = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{n} × {s}"))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "forks             {} at once ({statuses}), all answered in {:.1} s; each p50 {:.1} ms, \
             max {:.1} ms",
            self.forks.len(),
            self.forking.as_secs_f64(),
            ms(quantile(&self.forks, 0.5)),
            ms(quantile(&self.forks, 1.0))
        );
        println!(
            "checked fork      {} ends at seq {}, as its source",
            self.checked.0, self.checked.1
        );
        for (name, s) in [("alone", &self.alone), ("during forks", &self.during)] {
            println!(
                "bystander {name:<13} {} writes: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                s.len(),
                ms(quantile(s, 0.5)),
                ms(quantile(s, 0.99)),
                ms(quantile(s, 1.0))
            );
        }
        println!(
            "contract: bystander p99 during forks <= {} ms: {}",
            BOUND.as_millis(),
            if self.within_bound() { "yes" } else { "no" }
        );
    }

    /// The contract: the bystander's p99 while the forks ran is within [`BOUND`] (a bystander
    /// that wrote nothing meanwhile proves nothing: no).
    fn within_bound(&self) -> bool {
        self.p99_during().is_some_and(|p| p <= BOUND)
    }

    pub(crate) fn to_json(&self, args: &Args) -> Value {
        let series = |s: &[Duration]| {
            json!({"writes": s.len(), "p50Ms": ms(quantile(s, 0.5)),
                   "p99Ms": ms(quantile(s, 0.99)), "maxMs": ms(quantile(s, 1.0))})
        };
        json!({
            "observations": self.observations,
            "runs": self.runs,
            "buildSeconds": self.build.as_secs_f64(),
            "forks": args.forks,
            "forkP50Ms": ms(quantile(&self.forks, 0.5)),
            "forkMaxMs": ms(quantile(&self.forks, 1.0)),
            "forkingSeconds": self.forking.as_secs_f64(),
            "alone": series(&self.alone),
            "duringForks": series(&self.during),
            "boundMs": BOUND.as_millis() as u64,
            "withinBound": self.within_bound(),
        })
    }
}
