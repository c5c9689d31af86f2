//! Scheduling: the plan executes as a graph. Every item whose dependencies completed is *ready*;
//! up to `maxParallelItems` items are in flight at once, each with its own ReAct loop and journal.
//! A failed item cancels its dependents (transitively, with the reason: `failures.rs`) while
//! independent branches go on; an item waiting for a person stops nobody else (`hitl.rs`), and
//! a model call the budget refuses stops new work until a person raises it (`budget_gate.rs`).
//!
//! The loop owns the run's state alone: each in-flight item asks for its next step (a model call,
//! a tool call, a compaction), the loop starts that step's I/O, and when the I/O returns, the loop
//! journals what it brought. Only I/O runs concurrently, so every change to the state happens in
//! one place, in one order, and commits exactly as in a one-item run: before every model call and
//! every tool with side effects, and right after every tool result.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::Value;
use tracing::{Instrument, Span};

use crate::llm::{ChatResponse, LlmError};
use crate::model::{ItemStatus, ToolResultStatus};
use crate::telemetry::spans;

use super::calls::{Outcome, Watching, kind_of};
use super::executor::Next;
use super::hitl::{commit_waiting, take_decisions, waiting_suspensions};
use super::journal::{Ctx, Halt, llm_halt};
use super::{Engine, FLUSH_SLOW_TOOL_AFTER, RunEnd};

/// What a finished piece of I/O brought back for an item.
pub(super) enum Io {
    /// A ReAct turn of the model.
    Reply(Result<ChatResponse, LlmError>),
    /// A compaction's structured reply.
    Structured(Result<(Value, ChatResponse), LlmError>),
    /// A team plan's structured reply.
    TeamPlan(Result<(Value, ChatResponse), LlmError>),
    /// A durable call's outcome: its result, or the person it waits for.
    Call(crate::model::ToolCallRecord, Outcome),
}

type InFlight<'f> = Pin<Box<dyn Future<Output = (String, Io)> + Send + 'f>>;

/// The span of item `id` in this attempt, made the first time the item has I/O: under its team
/// item's span when it belongs to a team, else under the attempt's.
fn item_span(ctx: &Ctx<'_>, open: &mut HashMap<String, Span>, id: &str) -> Span {
    if let Some(s) = open.get(id) {
        return s.clone();
    }
    let team = ctx
        .item_idx(id)
        .and_then(|i| ctx.items[i].parent_item_id.as_ref())
        .and_then(|t| open.get(t.as_str()).cloned());
    let span = spans::item(id, team.as_ref());
    open.insert(id.to_owned(), span.clone());
    span
}

/// How a tool call's I/O ended, as the metrics count it.
fn tool_outcome(io: &Io) -> &'static str {
    match io {
        Io::Call(_, Outcome::Done(r, _)) => match r.status {
            ToolResultStatus::Success | ToolResultStatus::Responded => "ok",
            ToolResultStatus::Error => "error",
            ToolResultStatus::Rejected => "rejected",
        },
        Io::Call(_, Outcome::Paused(..)) => "suspended",
        Io::Reply(_) | Io::Structured(_) | Io::TeamPlan(_) => "ok",
    }
}

impl Engine {
    /// Ready items that execute at once for this run.
    fn parallel_limit(&self, ctx: &Ctx<'_>) -> usize {
        ctx.env
            .cfg
            .max_parallel_items
            .unwrap_or(self.settings.max_parallel_items)
            .max(1) as usize
    }

    /// Execute the plan until no item can make progress. `Some(Suspended)` when what is left
    /// waits for people; `None` when every item reached an end (synthesis comes next).
    pub(super) async fn execute_plan(&self, ctx: &mut Ctx<'_>) -> Result<Option<RunEnd>, Halt> {
        let signals = ctx.env.signals;
        let limit = self.parallel_limit(ctx);
        let mut inflight: FuturesUnordered<InFlight<'_>> = FuturesUnordered::new();
        // Items whose I/O is in flight.
        let mut busy: HashSet<String> = HashSet::new();
        // When staged changes must be committed even though no commit point came (a pure tool
        // that runs long: a person watching sees its call while it runs).
        let mut flush_at: Option<tokio::time::Instant> = None;
        // When to look for decisions on the suspensions some items wait on, should their push
        // have been lost.
        let mut look_at: Option<tokio::time::Instant> = None;
        // Items whose call only waits outside the process (its kind told `watching`); when every
        // item in flight is one, the run parks (after `a2a_park_after`) and gives its slot back.
        let watching = Arc::new(Watching::default());
        let mut park_at: Option<tokio::time::Instant> = None;
        let journal = ctx.env.journal;
        // The span of each item with work left in this attempt: its steps' I/O runs inside it.
        let mut item_spans: HashMap<String, Span> = HashMap::new();
        // A model call was refused by the run's budget (it suspends at the limit): nothing new
        // starts; once what is in flight is in, the run suspends.
        let mut over_budget = false;
        'run: loop {
            loop {
                if signals.cancel.is_cancelled() {
                    return Err(Halt::Cancel);
                }
                let draining = signals.drain.is_cancelled() || signals.shutdown.is_cancelled();
                // Steering pushed while the loop was busy is read before any call starts.
                if futures::FutureExt::now_or_never(journal.steering_arrived()).is_some() {
                    ctx.reload_steering().await?;
                }
                if !draining
                    && !over_budget
                    && ctx.steering.iter().any(|s| !s.planned)
                    && self.ready_item(ctx).is_some()
                {
                    // Steered: the planner takes it in before the next item starts.
                    self.refine_for_steering(ctx).await?;
                }
                if !draining {
                    // The tenant's daily spend, read again when stale (a budgeted tenant only).
                    ctx.refresh_tenant_spend().await?;
                    let started = self.launch(ctx, &mut busy, limit, &mut over_budget)?;
                    let needs_commit = started.iter().any(|(_, s)| s.needs_commit(self, ctx));
                    let idle_wait = started.is_empty() && !inflight.is_empty();
                    if needs_commit || (idle_wait && !ctx.pending.is_empty()) {
                        ctx.flush().await?;
                        flush_at = None;
                    } else if !ctx.pending.is_empty() && flush_at.is_none() {
                        flush_at = Some(tokio::time::Instant::now() + FLUSH_SLOW_TOOL_AFTER);
                    }
                    for (item, step) in started {
                        let span = item_span(ctx, &mut item_spans, &item);
                        // Entered while the step's own spans are made, so they nest under it.
                        let io = span.in_scope(|| self.start_io(ctx, item, step, &watching));
                        inflight.push(Box::pin(io.instrument(span)));
                    }
                }
                let only_remote = watching.all(busy.iter());
                if draining && only_remote {
                    // What they wait on is followed by the next owner, from the log.
                    return Err(Halt::Shutdown);
                }
                if !only_remote || !ctx.pending.is_empty() {
                    park_at = None;
                } else if park_at.is_none() {
                    park_at = Some(tokio::time::Instant::now() + self.settings.a2a_park_after);
                }
                if inflight.is_empty() {
                    if over_budget && !draining {
                        // Every call that was admitted is in; the next would pass the budget.
                        return Err(Halt::OverBudget);
                    }
                    if draining {
                        // The steps in flight are done and journaled: the next owner resumes here.
                        ctx.flush().await?;
                        return Err(Halt::Shutdown);
                    }
                    break;
                }
                let far = tokio::time::Instant::now() + Duration::from_secs(24 * 3600);
                let flush_deadline = flush_at.unwrap_or(far);
                // While some items wait for people and others work, a decision is taken in as
                // soon as it is pushed (or at the slow fallback look, should the push be lost),
                // so an answer is used without waiting for the others to finish.
                let waiting = waiting_suspensions(ctx);
                if waiting.is_empty() {
                    look_at = None;
                } else if look_at.is_none() {
                    look_at = Some(tokio::time::Instant::now() + self.settings.decision_poll);
                }
                tokio::select! {
                    biased;
                    _ = signals.shutdown.cancelled() => return Err(Halt::Shutdown),
                    _ = signals.cancel.cancelled() => return Err(Halt::Cancel),
                    done = inflight.next() => {
                        let (item, io) = done.expect("the set is not empty");
                        busy.remove(&item);
                        watching.remove(&item);
                        let was_tool = matches!(io, Io::Call(_, Outcome::Done(..)));
                        self.absorb(ctx, &item, io)?;
                        if ctx.item_idx(&item).is_none_or(|i| !self.needs_attention(&ctx.items[i])) {
                            item_spans.remove(&item);
                        }
                        if was_tool {
                            // A tool's result is journaled before anything else happens.
                            ctx.flush().await?;
                            flush_at = None;
                        }
                    }
                    _ = tokio::time::sleep_until(flush_deadline), if flush_at.is_some() => {
                        ctx.flush().await?;
                        flush_at = None;
                    }
                    _ = journal.decision_arrived(), if !waiting.is_empty() => {
                        take_decisions(ctx, &waiting).await?;
                    }
                    // A person steered the run: every item's next call reads it.
                    _ = journal.steering_arrived() => {
                        ctx.reload_steering().await?;
                    }
                    _ = tokio::time::sleep_until(look_at.unwrap_or(far)), if look_at.is_some() => {
                        look_at = None;
                        take_decisions(ctx, &waiting).await?;
                    }
                    // Stop starting new steps; the loop above notices.
                    _ = signals.drain.cancelled(), if !draining => {}
                    // A call started to wait outside: the loop above looks whether all do.
                    _ = watching.changed.notified() => {}
                    _ = tokio::time::sleep_until(park_at.unwrap_or(far)), if park_at.is_some() => {
                        // Nothing here can move until something outside answers: give the worker
                        // slot back (the lease stays), a watcher follows the calls
                        // (`Engine::follow_outside`).
                        ctx.flush().await?;
                        return Ok(Some(RunEnd::WaitingRemote));
                    }
                }
            }
            let waiting = waiting_suspensions(ctx);
            if waiting.is_empty() {
                return Ok(None);
            }
            // A person may have decided while the other items ran: apply it now.
            if take_decisions(ctx, &waiting).await? {
                continue 'run;
            }
            // Nothing can proceed until a person decides.
            let b = ctx.batch();
            commit_waiting(ctx, b, waiting).await?;
            return Ok(Some(RunEnd::Suspended));
        }
    }

    /// Bring every in-flight item to its next step and start ready items while there is room.
    /// Returns the steps whose I/O must start, by item.
    fn launch(
        &self,
        ctx: &mut Ctx<'_>,
        busy: &mut HashSet<String>,
        limit: usize,
        over_budget: &mut bool,
    ) -> Result<Vec<(String, Next)>, Halt> {
        let mut started = Vec::new();
        // Items that have nothing to start now (finished, failed, waiting for a person).
        let mut idle: HashSet<String> = HashSet::new();
        loop {
            let mut progressed = false;
            let active: Vec<String> = ctx
                .items
                .iter()
                .filter(|i| self.needs_attention(i) && ctx.works_on(i))
                .map(|i| i.id.to_string())
                .filter(|id| !busy.contains(id) && !idle.contains(id))
                .collect();
            for id in active {
                match self.item_step(ctx, &id)? {
                    Next::Idle => {
                        idle.insert(id);
                    }
                    Next::Ask(r) | Next::Compact(r) | Next::PlanTeam(r)
                        if *over_budget || ctx.refuses(&id, &r)? =>
                    {
                        // Past the budget: the call waits for a raise (the run suspends once
                        // what is in flight is in).
                        *over_budget = true;
                        idle.insert(id);
                    }
                    step => {
                        busy.insert(id.clone());
                        started.push((id, step));
                    }
                }
                progressed = true;
            }
            // A team in progress holds no slot: its children do the work.
            let running = ctx
                .items
                .iter()
                .filter(|i| {
                    i.status == ItemStatus::InProgress && i.kind != crate::model::ItemKind::Team
                })
                .count();
            if running < limit
                && !*over_budget
                && let Some(idx) = self.ready_item(ctx)
            {
                self.start_item(ctx, idx);
                progressed = true;
            }
            if !progressed {
                return Ok(started);
            }
        }
    }

    /// Items the loop must look at: in progress (or waiting: its decision may have come), or
    /// completed with a result other items cannot read yet (not compacted).
    fn needs_attention(&self, it: &crate::model::TodoItem) -> bool {
        matches!(it.status, ItemStatus::InProgress | ItemStatus::Waiting)
            || (it.status == ItemStatus::Completed && it.compacted_output.is_none())
    }

    /// The first pending item (in plan order) the run works on whose dependencies all completed
    /// and can be read, and whose team (if it has one) is in progress.
    pub(super) fn ready_item(&self, ctx: &Ctx<'_>) -> Option<usize> {
        ctx.items.iter().position(|it| {
            it.status == ItemStatus::Pending
                && ctx.works_on(it)
                && it.parent_item_id.as_ref().is_none_or(|p| {
                    ctx.items
                        .iter()
                        .any(|t| &t.id == p && t.status == ItemStatus::InProgress)
                })
                && it.dependencies.iter().all(|d| {
                    ctx.items.iter().any(|o| {
                        &o.id == d
                            && o.status == ItemStatus::Completed
                            && o.compacted_output.is_some()
                    })
                })
        })
    }

    /// Start the I/O of one step. A tool call runs in its `execute_tool` span and is counted
    /// by tool and outcome (under [`crate::tools::ToolRegistry::metric_label`]).
    fn start_io<'f>(
        &'f self,
        ctx: &Ctx<'f>,
        item: String,
        step: Next,
        watching: &Arc<Watching>,
    ) -> InFlight<'f> {
        let Next::Invoke(call, _) = &step else {
            return self.start_step(ctx, item, step, watching);
        };
        let span = spans::execute_tool(&call.name, &call.id);
        let tool = kind_of(self, &ctx.env, &call.name).metric_label(self, call);
        let (metrics, metrics_too, tool_too) =
            (self.metrics.clone(), self.metrics.clone(), tool.clone());
        // A call dropped while it only waits outside was handed over (the run parked, or is
        // drained), not cancelled: it goes on elsewhere.
        let (waiting, item_too) = (watching.clone(), item.clone());
        let fut = span.in_scope(|| self.start_step(ctx, item, step, watching));
        Box::pin(spans::timed(
            span.clone(),
            fut,
            move |(_, io), took| {
                let outcome = tool_outcome(io);
                if outcome == "error" {
                    spans::failed(&span, "tool_error");
                }
                metrics.tool_call(&tool, outcome, took);
            },
            move |took| {
                let outcome = if waiting.contains(&item_too) {
                    "parked"
                } else {
                    "cancelled"
                };
                metrics_too.tool_call(&tool_too, outcome, took);
            },
        ))
    }

    /// Start the I/O of one step, untraced.
    fn start_step<'f>(
        &'f self,
        ctx: &Ctx<'f>,
        item: String,
        step: Next,
        watching: &Arc<Watching>,
    ) -> InFlight<'f> {
        if let Next::Invoke(call, args) = step {
            let io = kind_of(self, &ctx.env, &call.name).start(
                self,
                ctx,
                &item,
                call.clone(),
                args,
                watching,
            );
            return Box::pin(async move { (item, Io::Call(call, io.await)) });
        }
        let llm = ctx.env.llm.clone();
        // The item's model text streams to the run's token sink, under the step's phase.
        let tokens = match &step {
            Next::Ask(r) | Next::Compact(r) | Next::PlanTeam(r) => ctx.tap(Some(&item), r.phase),
            Next::Invoke(..) | Next::Idle => crate::llm::Tokens::none(),
        };
        match step {
            Next::Ask(mut req) => Box::pin(async move {
                req.tokens = tokens;
                let r = llm.complete(req).await;
                (item, Io::Reply(r))
            }),
            Next::Compact(mut req) => Box::pin(async move {
                req.tokens = tokens;
                let r = crate::llm::structured::complete_structured(llm.as_ref(), req).await;
                (item, Io::Structured(r))
            }),
            Next::PlanTeam(mut req) => Box::pin(async move {
                req.tokens = tokens;
                let r = crate::llm::structured::complete_structured(llm.as_ref(), req).await;
                (item, Io::TeamPlan(r))
            }),
            Next::Invoke(..) | Next::Idle => {
                unreachable!("calls started above; idle steps start no I/O")
            }
        }
    }

    /// Journal (stage) what a step's I/O brought back.
    fn absorb(&self, ctx: &mut Ctx<'_>, item: &str, io: Io) -> Result<(), Halt> {
        match io {
            Io::Reply(Err(e)) | Io::Structured(Err(e)) | Io::TeamPlan(Err(e)) => {
                ctx.unadmit(item);
                Err(llm_halt(e, Some(item)))
            }
            Io::TeamPlan(Ok((value, resp))) => {
                self.take_team_plan(ctx, item, &value, &resp);
                Ok(())
            }
            Io::Reply(Ok(resp)) => {
                self.take_reply(ctx, item, resp);
                Ok(())
            }
            Io::Structured(Ok((value, resp))) => {
                self.take_compaction(ctx, item, &value, &resp);
                Ok(())
            }
            Io::Call(call, Outcome::Done(result, usage)) => {
                // Its model stages passed the meter themselves, priced.
                ctx.spend(item, &usage, true);
                self.journal_result(ctx, item, &call, result, vec![], vec![]);
                Ok(())
            }
            Io::Call(_, Outcome::Paused(at, kind)) => {
                // The call stays unanswered: the person decides on `at` (one of the call's own
                // steps, or its remote's question), and the call goes on from there.
                self.suspend(ctx, item, &at, kind);
                Ok(())
            }
        }
    }
}

impl Next {
    /// Whether everything staged must be committed before this step's I/O starts: a model call
    /// always (its request is built from the journal), a tool with side effects (so a failed
    /// commit can never make the model name a call that already ran).
    fn needs_commit(&self, engine: &Engine, ctx: &Ctx<'_>) -> bool {
        match self {
            Next::Ask(_) | Next::Compact(_) | Next::PlanTeam(_) => true,
            Next::Invoke(call, _) => engine.call_side_effects(ctx, &call.name),
            Next::Idle => false,
        }
    }
}
