//! Flowchart expressions: JSON Logic (the `datalogic-rs` crate, with templating, so an object
//! whose key is not an operator is a literal object whose values are evaluated) over
//! `{args, state}`, JSON Logic truthiness, what an expression read (the `var` paths it names
//! and their values: the evidence of a decision), and the bounds of one evaluation (how
//! large a value it may compute and for how long: see Bounds, below).
//!
//! # Bounds
//!
//! An expression is the tenant's code, and JSON Logic is not small: a `reduce` whose body is
//! `{"cat": [acc, acc]}` doubles a string each round, a `merge` of an array with itself doubles
//! the array (sharing its elements, so it costs little to build and a great deal to write out),
//! and nested `reduce`s over a few thousand elements spin for hours. The engine has no hook to
//! stop an evaluation from outside and a thread cannot be killed, so every evaluation stops
//! itself:
//!
//! - **Every value it computes is checked.** Before compiling, each operator and each literal
//!   object or array that computes something is wrapped in one more operator of ours
//!   ([`TICK`]), which returns its argument unchanged after checking it. So after every node of
//!   the expression (a `reduce` body once per round) we look at the clock
//!   (`PES_FLOWCHART_EXPR_TIMEOUT_MS`), at the working memory, and at the value just computed:
//!   its JSON size (counting a shared element as often as it would be written, so the array
//!   doubled by `merge` is as large as it really is), at most `PES_FLOWCHART_MAX_VALUE_BYTES`,
//!   and its depth, at most [`MAX_VALUE_DEPTH`]. Between two checks a node does the work of one
//!   operator over values that passed, so the next check is never far. The clock is the CPU
//!   time of the evaluation's thread: the timeout bounds the work an expression does, the same
//!   on a busy machine as on an idle one (and an evaluation starved past the caller's patience,
//!   the timeout and two seconds, stops as well).
//! - **Working memory is capped by the allocator itself.** The engine evaluates in an arena (a
//!   `bumpalo` bump) that it never frees before the evaluation ends; the arena gets an
//!   allocation limit of twice [`ExprLimits::working_memory`] (16 × the value limit). The checks
//!   above stop an evaluation at one working memory; one operator that allocates past the hard
//!   limit between two checks makes the arena panic, and that panic is caught. Nothing grows
//!   outside the arena: the result is converted to JSON only after its size passed.
//! - **Off the runtime, a bounded number at once.** An evaluation runs on a thread of its own
//!   (with a stack sized for deep expressions, at a lower priority), never on the runtime's
//!   workers, after taking one of a fixed number of slots (one less than the CPUs, 1 to 8). The slot is held by the thread
//!   until it ends, so an evaluation the caller stopped waiting for still counts: threads cannot
//!   pile up, whatever a tenant sends.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Once};
use std::time::{Duration, Instant};

use datalogic_rs::bumpalo::Bump;
use datalogic_rs::{DataValue, EvalInput, FromDataValue};
use serde_json::{Map, Value};
use tokio::sync::Semaphore;

/// The operator that checks every value an expression computes (see the module docs). Not a
/// name a flowchart means: an expression that uses it gets its first argument back.
pub const TICK: &str = "__pes_checked";

/// A computed value nests at most this deep: deeper JSON cannot be stored and read back
/// (readers stop at 128 levels) and walking it would need a deep stack.
pub const MAX_VALUE_DEPTH: usize = 64;

/// The stack of an evaluation thread: expressions nest up to the JSON reader's 128 levels.
const STACK_BYTES: usize = 16 * 1024 * 1024;

/// How long past its timeout the caller still waits for an evaluation to report (its own
/// checks stop it within milliseconds of the timeout; this only covers a machine too busy
/// to run it).
const GRACE: Duration = Duration::from_secs(2);

/// One engine for the process: it holds no per-call state. Constant folding is off so that
/// compiling evaluates nothing (every evaluation happens under the bounds).
static ENGINE: LazyLock<datalogic_rs::Engine> = LazyLock::new(|| {
    datalogic_rs::Engine::builder()
        .with_templating(true)
        .with_constant_folding(false)
        .add_operator(TICK, Checked)
        .build()
});

static OPERATORS: LazyLock<BTreeSet<&'static str>> =
    LazyLock::new(|| ENGINE.builtin_operator_names().collect());

/// The bounds of one evaluation: how large a value it may compute and how long it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExprLimits {
    /// The largest value, in bytes of JSON, an expression may compute, in the middle or as its
    /// result (`PES_FLOWCHART_MAX_VALUE_BYTES`); also the largest value a stage may write.
    pub max_value_bytes: usize,
    /// How long one evaluation may run (`PES_FLOWCHART_EXPR_TIMEOUT_MS`).
    pub timeout: Duration,
}

impl Default for ExprLimits {
    fn default() -> Self {
        Self {
            max_value_bytes: 1024 * 1024,
            timeout: Duration::from_millis(100),
        }
    }
}

impl ExprLimits {
    /// The memory one evaluation may work in beyond the data it reads: 16 × the value limit
    /// (at least 1 MiB), room for the intermediate values a `reduce` leaves behind.
    pub fn working_memory(&self) -> usize {
        self.max_value_bytes.saturating_mul(16).max(1024 * 1024)
    }
}

/// Why an expression gave no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExprError {
    pub message: String,
    /// A bound of §7.1 stopped it (time, memory, a value's size or depth), rather than the
    /// expression itself failing (an unknown operator, a division by zero, …).
    pub limit: bool,
}

impl ExprError {
    fn failed(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            limit: false,
        }
    }

    fn limit(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            limit: true,
        }
    }
}

/// Evaluates expressions under [`ExprLimits`], on threads of their own, a bounded number at
/// once. Cheap to clone: clones share the slots.
#[derive(Debug, Clone)]
pub struct Evaluator {
    limits: ExprLimits,
    slots: Arc<Semaphore>,
    started: Arc<AtomicU64>,
}

impl Default for Evaluator {
    fn default() -> Self {
        Self::new(ExprLimits::default())
    }
}

impl Evaluator {
    /// An evaluator with `limits`, running at most one less than the CPUs (1 to 8) evaluations
    /// at once, so the runtime keeps a CPU when tenants' expressions keep the others busy.
    pub fn new(limits: ExprLimits) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        Self::with_slots(limits, cpus.saturating_sub(1).clamp(1, 8))
    }

    /// An evaluator with `limits` running at most `slots` evaluations at once.
    pub fn with_slots(limits: ExprLimits, slots: usize) -> Self {
        quiet_caught_panics();
        Self {
            limits,
            slots: Arc::new(Semaphore::new(slots.max(1))),
            started: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Its limits.
    pub fn limits(&self) -> ExprLimits {
        self.limits
    }

    /// How many evaluations it has started (what a test counts to show one did not run).
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Evaluate `expr` over `data` (`{args, state}`) under the limits, on a thread of its own.
    ///
    /// # Errors
    /// What went wrong (an unknown operator, a division by zero, …), or the bound that stopped
    /// it ([`ExprError::limit`]).
    pub async fn eval(&self, expr: &Value, data: &Arc<Value>) -> Result<Value, ExprError> {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|_| ExprError::failed("the expression evaluator has stopped"))?;
        self.started.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (expr, data, limits) = (expr.clone(), Arc::clone(data), self.limits);
        std::thread::Builder::new()
            .name("pes-flowchart-expr".into())
            .stack_size(STACK_BYTES)
            .spawn(move || {
                yield_to_requests();
                let out = evaluate(&expr, &data, limits);
                // The slot is free only once the thread is done with its work.
                drop(slot);
                let _ = tx.send(out);
            })
            .map_err(|e| ExprError::failed(format!("no thread to evaluate it on: {e}")))?;
        match tokio::time::timeout(limits.timeout + GRACE, rx).await {
            Ok(Ok(out)) => out,
            Ok(Err(_)) => Err(ExprError::failed("its evaluation ended without an answer")),
            Err(_) => Err(timed_out(limits)),
        }
    }
}

/// The clocks are read at every 16th check: reading the thread's CPU clock is a system call,
/// and 16 nodes' work is still nothing next to the timeout.
const CLOCK_EVERY: u32 = 16;

/// The CPU time this thread has used (Linux; elsewhere the time since the process started).
fn thread_cpu_time() -> Duration {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for the call to fill.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) } == 0 {
            return Duration::new(
                u64::try_from(ts.tv_sec).unwrap_or(0),
                u32::try_from(ts.tv_nsec).unwrap_or(0),
            );
        }
    }
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);
    START.elapsed()
}

/// Lower this thread's priority (nice +10, Linux): when the CPUs are busy, the threads that
/// serve requests (`/healthz` among them) and drive runs go first, a tenant's expression after.
fn yield_to_requests() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls on this thread's own id; a failure only leaves the priority.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, u32::try_from(tid).unwrap_or(0), 10);
    }
}

fn timed_out(limits: ExprLimits) -> ExprError {
    ExprError::limit(format!(
        "the expression ran longer than {} ms (PES_FLOWCHART_EXPR_TIMEOUT_MS)",
        limits.timeout.as_millis()
    ))
}

/// Evaluate `expr` over `data` on this thread, under `limits` (what an evaluation thread runs).
///
/// # Errors
/// As [`Evaluator::eval`].
pub fn evaluate(expr: &Value, data: &Value, limits: ExprLimits) -> Result<Value, ExprError> {
    quiet_caught_panics();
    let logic = ENGINE
        .compile(&instrument(expr))
        .map_err(|e| ExprError::failed(describe(&e)))?;
    let arena = Bump::new();
    let root = data
        .into_arena_value(&arena)
        .map_err(|e| ExprError::failed(describe(&e)))?;
    // What the data took is not the expression's; what it allocates from here on is.
    let base = arena.allocated_bytes();
    let memory = limits.working_memory();
    arena.set_allocation_limit(Some(base.saturating_add(memory.saturating_mul(2))));
    let _budget = BudgetGuard::enter(Budget {
        cpu_deadline: thread_cpu_time() + limits.timeout,
        gone_at: Instant::now() + limits.timeout + GRACE,
        ticks: 0,
        limits,
        memory_at: base.saturating_add(memory),
        tripped: None,
    });
    CATCHING.set(true);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        match ENGINE.evaluate(&logic, root, &arena) {
            Ok(v) => match measure(v, limits.max_value_bytes) {
                Ok(_) => Value::from_arena(v).map_err(|e| ExprError::failed(describe(&e))),
                Err(over) => Err(over.error(limits)),
            },
            Err(e) => Err(ExprError::failed(describe(&e))),
        }
    }));
    CATCHING.set(false);
    // A bound that stopped it is the reason, whatever the engine made of the error.
    if let Some(tripped) = BUDGET.with_borrow_mut(|b| b.as_mut().and_then(|b| b.tripped.take())) {
        return Err(tripped);
    }
    match outcome {
        Ok(out) => out,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if what.contains("out of memory") || what.contains("allocation error") {
                Err(memory_error(limits))
            } else {
                tracing::warn!(panic = %what, "a flowchart expression made the engine panic");
                Err(ExprError::failed(format!(
                    "the expression engine failed: {}",
                    crate::text::truncate(&what, 200)
                )))
            }
        }
    }
}

fn memory_error(limits: ExprLimits) -> ExprError {
    ExprError::limit(format!(
        "the expression needed more than {} bytes of working memory (16 × \
         PES_FLOWCHART_MAX_VALUE_BYTES)",
        limits.working_memory()
    ))
}

fn describe(e: &datalogic_rs::Error) -> String {
    let text = format!("{e:?}");
    crate::text::truncate(&text, 300)
}

/// What one evaluation may still do, for the [`TICK`] checks on its thread.
struct Budget {
    /// This thread's CPU time at which the evaluation stops: the timeout bounds the work it
    /// does, not how long a busy machine makes it wait for a CPU.
    cpu_deadline: Duration,
    /// When the caller stops waiting: an evaluation starved that long stops too.
    gone_at: Instant,
    /// Checks so far (the clocks are read every [`CLOCK_EVERY`] checks).
    ticks: u32,
    limits: ExprLimits,
    /// The arena size at which the evaluation stops.
    memory_at: usize,
    /// The bound that stopped it, once one did.
    tripped: Option<ExprError>,
}

thread_local! {
    static BUDGET: RefCell<Option<Budget>> = const { RefCell::new(None) };
    /// This thread is inside an evaluation whose panics are caught and reported.
    static CATCHING: Cell<bool> = const { Cell::new(false) };
}

/// The budget of this thread's evaluation, for as long as it runs.
struct BudgetGuard;

impl BudgetGuard {
    fn enter(budget: Budget) -> Self {
        BUDGET.set(Some(budget));
        Self
    }
}

impl Drop for BudgetGuard {
    fn drop(&mut self) {
        BUDGET.set(None);
    }
}

/// A panic inside an evaluation is caught and becomes the stage's error: the default hook
/// would also print it as if the process had a bug. Other panics print as before.
fn quiet_caught_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CATCHING.get() {
                previous(info);
            }
        }));
    });
}

/// The [`TICK`] operator: its first argument, once checked against the evaluation's budget.
struct Checked;

impl datalogic_rs::CustomOperator for Checked {
    fn evaluate<'a>(
        &self,
        args: &[&'a DataValue<'a>],
        _ctx: &mut datalogic_rs::operator::EvalContext<'_, 'a>,
        arena: &'a Bump,
    ) -> datalogic_rs::Result<&'a DataValue<'a>> {
        let value: &'a DataValue<'a> = match args.first() {
            Some(v) => v,
            None => arena.alloc(DataValue::Null),
        };
        let stop = BUDGET.with_borrow_mut(|budget| {
            let budget = budget.as_mut()?;
            if let Some(t) = &budget.tripped {
                return Some(t.message.clone());
            }
            budget.ticks = budget.ticks.wrapping_add(1);
            let late = budget.ticks % CLOCK_EVERY == 0
                && (thread_cpu_time() >= budget.cpu_deadline || Instant::now() >= budget.gone_at);
            let why = if late {
                Some(timed_out(budget.limits))
            } else if arena.allocated_bytes() > budget.memory_at {
                Some(memory_error(budget.limits))
            } else {
                measure(value, budget.limits.max_value_bytes)
                    .err()
                    .map(|over| over.error(budget.limits))
            }?;
            let message = why.message.clone();
            budget.tripped = Some(why);
            Some(message)
        });
        match stop {
            None => Ok(value),
            Some(message) => Err(datalogic_rs::Error::custom_message(message)),
        }
    }
}

/// How a computed value passed a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Oversize {
    /// Its JSON is at least this many bytes, more than the limit.
    Bytes(usize),
    /// It nests deeper than [`MAX_VALUE_DEPTH`].
    Deep,
}

impl Oversize {
    fn error(self, limits: ExprLimits) -> ExprError {
        ExprError::limit(match self {
            Oversize::Bytes(n) => format!(
                "the expression computed a value of at least {n} bytes, more than the limit of \
                 {} bytes (PES_FLOWCHART_MAX_VALUE_BYTES)",
                limits.max_value_bytes
            ),
            Oversize::Deep => format!(
                "the expression computed a value nested deeper than {MAX_VALUE_DEPTH} levels"
            ),
        })
    }
}

/// A lower bound of the size of `v`'s JSON (a number counts one byte, a string its bytes and
/// quotes), shared parts counted as often as they occur; it stops as soon as it passes `cap`.
/// Its work is at most proportional to `cap`.
fn measure(v: &DataValue<'_>, cap: usize) -> Result<usize, Oversize> {
    fn walk(
        v: &DataValue<'_>,
        depth: usize,
        total: &mut usize,
        cap: usize,
    ) -> Result<(), Oversize> {
        if depth > MAX_VALUE_DEPTH {
            return Err(Oversize::Deep);
        }
        let own = match v {
            DataValue::Null | DataValue::Bool(_) => 4,
            DataValue::String(s) => s.len() + 2,
            DataValue::Array(items) => 2 + items.len(),
            DataValue::Object(pairs) => 2 + pairs.iter().map(|(k, _)| k.len() + 4).sum::<usize>(),
            #[allow(unreachable_patterns)]
            _ => 1,
        };
        *total = total.saturating_add(own);
        if *total > cap {
            return Err(Oversize::Bytes(*total));
        }
        match v {
            DataValue::Array(items) => {
                for item in *items {
                    walk(item, depth + 1, total, cap)?;
                }
            }
            DataValue::Object(pairs) => {
                for (_, item) in *pairs {
                    walk(item, depth + 1, total, cap)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    let mut total = 0;
    walk(v, 1, &mut total, cap)?;
    Ok(total)
}

/// The size of `v`'s JSON text in bytes, exactly, or `None` once it passes `cap` (counted
/// without building the text).
pub fn json_size(v: &Value, cap: usize) -> Option<usize> {
    struct Count {
        n: usize,
        cap: usize,
    }
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.n += buf.len();
            if self.n > self.cap {
                return Err(std::io::Error::other("over"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count { n: 0, cap };
    serde_json::to_writer(&mut count, v).ok()?;
    Some(count.n)
}

/// `expr` with every operator, and every literal object or array that computes something,
/// wrapped in [`TICK`] (see the module docs). `var` reads are left bare: they compute nothing.
fn instrument(expr: &Value) -> Value {
    match expr {
        Value::Object(map) => {
            let inner = match single(map) {
                Some((op, arg)) if op == "var" || op == "val" => {
                    return Value::Object(Map::from_iter([(op.clone(), arguments(arg))]));
                }
                Some((op, arg)) if OPERATORS.contains(op.as_str()) => {
                    Value::Object(Map::from_iter([(op.clone(), arguments(arg))]))
                }
                _ => Value::Object(
                    map.iter()
                        .map(|(k, v)| (k.clone(), instrument(v)))
                        .collect(),
                ),
            };
            checked(inner)
        }
        Value::Array(items) => {
            let inner = Value::Array(items.iter().map(instrument).collect());
            if items.iter().any(|i| i.is_object() || i.is_array()) {
                checked(inner)
            } else {
                inner
            }
        }
        scalar => scalar.clone(),
    }
}

/// An operator's arguments: a list of expressions, or one.
fn arguments(arg: &Value) -> Value {
    match arg {
        Value::Array(items) => Value::Array(items.iter().map(instrument).collect()),
        one => instrument(one),
    }
}

fn single(map: &Map<String, Value>) -> Option<(&String, &Value)> {
    if map.len() == 1 {
        map.iter().next()
    } else {
        None
    }
}

fn checked(v: Value) -> Value {
    Value::Object(Map::from_iter([(TICK.to_owned(), Value::Array(vec![v]))]))
}

/// JSON Logic truthiness: `false`, `null`, `0`, `""` and `[]` are false; everything else true.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(_) => true,
    }
}

/// The values `expr` reads: every `var` path it names (`args.amount`, `state.total`) with its
/// value in `data` (`null` when absent), in the order first named.
pub fn reads(expr: &Value, data: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    collect(expr, data, &mut out);
    out
}

fn collect(expr: &Value, data: &Value, out: &mut Map<String, Value>) {
    match expr {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "var" {
                    let path = match v {
                        Value::String(p) => Some(p.clone()),
                        Value::Array(a) => a.first().and_then(Value::as_str).map(str::to_owned),
                        Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    };
                    if let Some(p) = path {
                        let value = lookup(data, &p);
                        out.entry(p).or_insert(value);
                        continue;
                    }
                }
                collect(v, data, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect(i, data, out)),
        _ => {}
    }
}

/// The value at a dotted path (`state.order.total`, `args.items.0`), `null` when absent.
pub fn lookup(data: &Value, path: &str) -> Value {
    if path.is_empty() {
        return data.clone();
    }
    let mut at = data;
    for part in path.split('.') {
        at = match at {
            Value::Object(m) => match m.get(part) {
                Some(v) => v,
                None => return Value::Null,
            },
            Value::Array(a) => match part.parse::<usize>().ok().and_then(|i| a.get(i)) {
                Some(v) => v,
                None => return Value::Null,
            },
            _ => return Value::Null,
        };
    }
    at.clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(expr: &Value, data: &Value) -> Result<Value, ExprError> {
        evaluate(expr, data, ExprLimits::default())
    }

    #[test]
    fn expressions_evaluate_over_args_and_state() {
        let data = json!({"args": {"amount": 150}, "state": {"tier": "gold", "items": [1, 2]}});
        assert_eq!(
            eval(&json!({">": [{"var": "args.amount"}, 100]}), &data),
            Ok(json!(true))
        );
        assert_eq!(
            eval(
                &json!({"total": {"var": "args.amount"}, "tier": {"var": "state.tier"}}),
                &data
            ),
            Ok(json!({"total": 150, "tier": "gold"})),
            "an object of non-operators is a template"
        );
        assert_eq!(eval(&json!("literal"), &data), Ok(json!("literal")));
        assert!(eval(&json!({"/": [1, 0]}), &data).is_err());
        let r = reads(
            &json!({"and": [{">": [{"var": "args.amount"}, 100]}, {"==": [{"var": ["state.tier", "x"]}, "gold"]}, {"var": "state.none"}]}),
            &data,
        );
        assert_eq!(
            Value::Object(r),
            json!({"args.amount": 150, "state.tier": "gold", "state.none": null})
        );
        assert_eq!(lookup(&data, "state.items.1"), json!(2));
        assert_eq!(
            eval(&json!({"var": ["state.none", {"+": [1, 2]}]}), &data),
            Ok(json!(3)),
            "a default computes"
        );
        for (v, t) in [
            (json!(0), false),
            (json!(""), false),
            (json!([]), false),
            (json!(null), false),
            (json!({}), true),
            (json!("0"), true),
        ] {
            assert_eq!(truthy(&v), t, "{v}");
        }
    }

    /// The checks wrapped around every node change no result: the same expressions give the
    /// same values (or both fail) with and without them.
    #[test]
    fn checked_expressions_mean_what_they_say() {
        let plain = datalogic_rs::Engine::builder()
            .with_templating(true)
            .build();
        let data = json!({"args": {"n": 3, "xs": [1, 2, 3, 4], "name": "ada", "o": {"a": 1, "b": [2]}},
                          "state": {"items": [{"p": 2, "q": "a"}, {"p": 5, "q": "b"}], "flag": true, "s": ""}});
        let corpus = [
            json!({"+": [{"var": "args.n"}, 1, 2]}),
            json!({"max": {"var": "args.xs"}}),
            json!({"max": {"map": [{"var": "args.xs"}, {"*": [{"var": ""}, 2]}]}}),
            json!({"min": [{"var": "args.n"}, {"-": [0, 1]}]}),
            json!({"+": {"map": [{"var": "args.xs"}, {"var": ""}]}}),
            json!({"cat": ["a", {"var": "args.name"}, ["x", "y"], {"var": "args.n"}]}),
            json!({"cat": {"map": [{"var": "args.xs"}, {"cat": ["<", {"var": ""}, ">"]}]}}),
            json!({"merge": [[1], [{"var": "args.n"}], {"var": "args.xs"}, 7, [[8]]]}),
            json!({"merge": {"var": "args.xs"}}),
            json!({"map": [{"var": "state.items"}, {"p2": {"*": [{"var": "p"}, 2]}, "q": {"var": "q"}}]}),
            json!({"filter": [{"var": "state.items"}, {">": [{"var": "p"}, 3]}]}),
            json!({"reduce": [{"var": "args.xs"}, {"+": [{"var": "current"}, {"var": "accumulator"}]}, 0]}),
            json!({"reduce": [{"var": "args.xs"}, {"merge": [{"var": "accumulator"}, [{"var": "current"}]]}, []]}),
            json!({"reduce": [{"var": "state.items"}, {"cat": [{"var": "accumulator"}, {"var": "current.q"}]}, ""]}),
            json!({"all": [{"var": "args.xs"}, {">": [{"var": ""}, 0]}]}),
            json!({"some": [{"var": "state.items"}, {"==": [{"var": "q"}, "b"]}]}),
            json!({"none": [[], true]}),
            json!({"if": [{"var": "state.flag"}, {"x": {"var": "args.n"}}, {"y": 1}]}),
            json!({"if": [{"var": "state.s"}, "no", {"var": "args.o.b"}, "yes", "else"]}),
            json!({"and": [true, {"var": "args.n"}, [1]]}),
            json!({"or": [0, "", {"var": "args.name"}]}),
            json!({"??": [{"var": "state.none"}, {"var": "args.name"}]}),
            json!({"!": [{"var": "state.s"}]}),
            json!({"!!": [[{"var": "args.n"}]]}),
            json!({"in": ["d", {"var": "args.name"}]}),
            json!({"in": [3, {"var": "args.xs"}]}),
            json!({"substr": [{"var": "args.name"}, 1]}),
            json!({"missing": ["args.n", "args.zz"]}),
            json!({"missing_some": [1, ["args.n", "args.zz"]]}),
            json!({"==": [{"var": "args.o"}, {"a": 1, "b": [2]}]}),
            json!({"===": [[1, {"var": "args.n"}], [1, 3]]}),
            json!({"var": ["args.zz", "dflt"]}),
            json!({"val": ["args", "n"]}),
            json!([1, {"var": "args.n"}, [2, {"var": "args.name"}]]),
            json!({"a": {"b": {"var": "args.n"}, "c": [{"var": "args.name"}]}}),
            json!({"%": [{"var": "args.n"}, 2]}),
            json!({"/": [{"var": "args.n"}, 0]}),
            json!({"unknown_op_like": [1, 2]}),
            json!({"map": [{"var": "args.xs"}, {"reduce": [[1, 2], {"+": [{"var": "accumulator"}, {"var": "current"}]}, 0]}]}),
        ];
        let total = corpus.len();
        let mut both_ok = 0;
        for expr in corpus {
            let want = plain
                .eval_into::<Value, _, _>(&expr, data.to_string().as_str())
                .map_err(|e| describe(&e));
            let got = eval(&expr, &data);
            match (&want, &got) {
                (Ok(w), Ok(g)) => {
                    assert_eq!(w, g, "{expr}");
                    both_ok += 1;
                }
                (Err(_), Err(_)) => {}
                _ => panic!("{expr}: {want:?} vs {got:?}"),
            }
        }
        assert!(both_ok + 1 >= total, "{both_ok} of {total} gave a value");
    }

    /// A string doubled in a reduce stops at the value limit, long before it is large; an
    /// evaluation that spins stops at its timeout; neither keeps its thread busy.
    #[test]
    fn growth_and_spinning_stop_inside_one_expression() {
        let limits = ExprLimits {
            max_value_bytes: 4096,
            timeout: Duration::from_millis(50),
        };
        let data = json!({"args": {}, "state": {}});
        let rounds: Vec<u32> = (0..40).collect();
        let e = evaluate(
            &json!({"reduce": [rounds, {"cat": [{"var": "accumulator"}, {"var": "accumulator"}]}, "ab"]}),
            &data,
            limits,
        )
        .unwrap_err();
        assert!(e.limit && e.message.contains("limit of 4096 bytes"), "{e}");
        // 10^10 comparisons, allocating nothing: the clock stops it.
        let many: Vec<u32> = (0..100_000).collect();
        let started = Instant::now();
        let e = evaluate(
            &json!({"some": [many, {"some": [many, {"<": [{"var": ""}, 0]}]}]}),
            &data,
            ExprLimits {
                max_value_bytes: 1 << 20,
                ..limits
            },
        )
        .unwrap_err();
        assert!(
            e.limit && e.message.contains("ran longer than 50 ms"),
            "{e}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(1000),
            "{:?}",
            started.elapsed()
        );
        // 10^10 additions, each leaving a number in the arena: the working memory stops it.
        let e = evaluate(
            &json!({"map": [many, {"reduce": [many, {"+": [{"var": "accumulator"}, 1]}, 0]}]}),
            &data,
            limits,
        )
        .unwrap_err();
        assert!(e.limit, "{e}");
        // A literal array built wide (no operator in it) is measured at the end.
        let e = evaluate(
            &json!({"var": "args"}),
            &json!({"args": {"s": "z".repeat(5000)}, "state": {}}),
            limits,
        )
        .unwrap_err();
        assert!(e.message.contains("more than the limit"), "{e}");
        assert_eq!(json_size(&json!({"a": [1, "x"]}), 100), Some(13));
        assert_eq!(json_size(&json!({"a": [1, "x"]}), 10), None);
    }
}
