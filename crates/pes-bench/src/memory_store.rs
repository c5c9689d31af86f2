//! `--mode store`: the memory store's search latency. The bench fills the store with `--items`
//! items (default 100,000) through `PUT /v1/store/items`, `--concurrency` writes in flight:
//! 1,000 users (`["users", "u<n>"]`), each item a 12-word fact drawn from a 5,000-word made-up
//! vocabulary with a Zipf-like skew (as content words are once stop words are left out: the
//! most common word is in about 5 % of the facts, most words in few). Then it runs `--searches` full-text searches one after another, each a query of three
//! words drawn the same way, and times each request (sent to whole reply received):
//!
//! - `user`: in one user's namespace (what the agent's `memory_search` does);
//! - `all`: across every item (`namespacePrefix: ["users"]`), the worst case: a common word
//!   matches most of the store, and every match is ranked;
//! - `recent`: no query, one user's newest 10 (a listing).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::Args;
use crate::runs::{ms, quantile};
use crate::server::{Server, phase};
use crate::store::Database;
use crate::system::Machine;

/// Users the items are spread over.
const USERS: usize = 1000;
/// Words of the vocabulary.
const VOCABULARY: usize = 5000;
/// The most common words of a language, which full-text search leaves out (not generated).
const STOP_WORDS: usize = 50;
/// Words of one fact.
const FACT_WORDS: usize = 12;

/// A small deterministic generator (xorshift64*), so every run stores the same facts.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A float in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A word index with a Zipf-like skew, as content words have once stop words are left
    /// out: log-uniform over the ranks 50 to 5,049 of a language (the first 50 are the stop
    /// words), so the most common word is in about 5 % of the facts and most words in few.
    fn word(&mut self) -> usize {
        let top = (STOP_WORDS + VOCABULARY) as f64 / STOP_WORDS as f64;
        ((STOP_WORDS as f64 * top.powf(self.unit())) as usize)
            .saturating_sub(STOP_WORDS)
            .min(VOCABULARY - 1)
    }
}

/// The made-up word of rank `i` (distinct for every rank; letters only).
fn word(i: usize) -> String {
    const SYLLABLES: [&str; 20] = [
        "ba", "ko", "ri", "su", "te", "na", "lo", "mi", "pe", "du", "ga", "zo", "fi", "ve", "ha",
        "ju", "ce", "wy", "qo", "xa",
    ];
    let mut n = i + 20;
    let mut w = String::new();
    while n > 0 {
        w.push_str(SYLLABLES[n % 20]);
        n /= 20;
    }
    w
}

fn sentence(rng: &mut Rng, words: usize) -> String {
    (0..words)
        .map(|_| word(rng.word()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The latencies of one kind of search, sorted.
pub(crate) struct Series {
    name: &'static str,
    latencies: Vec<Duration>,
    found: usize,
}

/// What `--mode store` measured.
pub(crate) struct StoreReport {
    items: usize,
    fill: Duration,
    series: Vec<Series>,
}

pub(crate) async fn store_mode(args: &Args, server: &Server) -> Result<StoreReport> {
    let items = args.items;
    let started = Instant::now();
    phase(
        "filling the store",
        args.phase_deadline(),
        fill(server, items, args.concurrency),
    )
    .await?;
    let fill = started.elapsed();
    let mut rng = Rng(0x5eed_cafe);
    let mut series = Vec::new();
    for (name, scoped, query) in [
        ("user", true, true),
        ("all", false, true),
        ("recent", true, false),
    ] {
        let s = phase(
            "searching",
            args.phase_deadline(),
            searches(server, &mut rng, name, scoped, query, args.searches),
        )
        .await?;
        series.push(s);
    }
    Ok(StoreReport {
        items,
        fill,
        series,
    })
}

async fn fill(server: &Server, items: usize, concurrency: usize) -> Result<()> {
    let bodies = (0..items).map(|i| {
        // Its own generator per item: the facts do not depend on the order writes finish in.
        let mut rng =
            Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
        json!({
            "namespace": ["users", format!("u{}", i % USERS)],
            "key": format!("fact-{i}"),
            "value": {"fact": sentence(&mut rng, FACT_WORDS), "n": i},
        })
    });
    let mut puts = futures::stream::iter(bodies)
        .map(|body| async move {
            let resp = server
                .http
                .put(server.url("/v1/store/items"))
                .json(&body)
                .timeout(Duration::from_secs(60))
                .send()
                .await
                .context("PUT /v1/store/items")?;
            let status = resp.status();
            ensure!(
                status.as_u16() == 204,
                "PUT /v1/store/items answered {status}: {}",
                resp.text().await.unwrap_or_default()
            );
            Ok(())
        })
        .buffer_unordered(concurrency.max(1));
    while let Some(r) = puts.next().await {
        r?;
    }
    Ok(())
}

async fn searches(
    server: &Server,
    rng: &mut Rng,
    name: &'static str,
    scoped: bool,
    query: bool,
    n: usize,
) -> Result<Series> {
    let mut latencies = Vec::with_capacity(n);
    let mut found = 0;
    for _ in 0..n {
        let user = (rng.next() % USERS as u64) as usize;
        let mut body = json!({"limit": 10});
        body["namespacePrefix"] = if scoped {
            json!(["users", format!("u{user}")])
        } else {
            json!(["users"])
        };
        if query {
            body["query"] = Value::from(sentence(rng, 3));
        }
        let sent = Instant::now();
        let reply = server
            .post_json("/v1/store/items/search", &body, Duration::from_secs(30))
            .await?;
        latencies.push(sent.elapsed());
        found += reply["items"].as_array().map_or(0, Vec::len);
    }
    latencies.sort_unstable();
    Ok(Series {
        name,
        latencies,
        found,
    })
}

impl StoreReport {
    pub(crate) fn print(&self, args: &Args, db: &Database, m: &Machine) {
        println!(
            "{}",
            m.header(
                db,
                &format!(
                    "mode=store  items={}  searches={}",
                    self.items, args.searches
                )
            )
        );
        println!(
            "fill                  {:.1} s ({:.0} writes/s, {} in flight)",
            self.fill.as_secs_f64(),
            self.items as f64 / self.fill.as_secs_f64(),
            args.concurrency
        );
        for s in &self.series {
            let q = |p| ms(quantile(&s.latencies, p));
            println!(
                "search {:<7} p50/p99/max  {:.1} / {:.1} / {:.1} ms  ({:.1} items per reply)",
                s.name,
                q(0.50),
                q(0.99),
                q(1.0),
                s.found as f64 / s.latencies.len().max(1) as f64
            );
        }
    }

    pub(crate) fn to_json(&self, args: &Args) -> Value {
        let series: serde_json::Map<String, Value> = self
            .series
            .iter()
            .map(|s| {
                let q = |p| ms(quantile(&s.latencies, p));
                (
                    s.name.to_owned(),
                    json!({"p50": q(0.50), "p99": q(0.99), "max": q(1.0),
                           "itemsPerReply": s.found as f64 / s.latencies.len().max(1) as f64}),
                )
            })
            .collect();
        json!({"items": self.items, "searches": args.searches,
               "fillSeconds": self.fill.as_secs_f64(), "searchMs": series})
    }
}
