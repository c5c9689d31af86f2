//! The two graphs a flowchart must keep acyclic: its stages (a walk through them must end, the
//! only repetition being a `loop` stage's body run at most `maxIterations` times) and the
//! flowcharts calling one another through `flow` stages.
//!
//! A `select` branch and a `loop` body are calls: their chain runs, then control returns to the
//! calling stage. Counting a call as an edge like `next`, every cycle of the stage graph is a
//! walk that can come back to where it was without a bound; a loop body that leads back to its
//! own `loop` stage is one of them (the loop would start again inside itself).

use std::collections::{BTreeMap, BTreeSet};

use super::{Problem, ValidationEnv, at_stage};
use crate::flowchart::model::{Flowchart, FlowchartSpec, Stage};

/// The stages `stage` (id `id`) may go to or call, each with the pointer of the field that names
/// it, in document order.
pub(super) fn edges<'a>(id: &str, stage: &'a Stage) -> Vec<(String, &'a str)> {
    let mut out = Vec::new();
    match stage {
        Stage::Decide { rules, default } => {
            for (i, rule) in rules.iter().enumerate() {
                out.push((
                    at_stage(id, &["rules", &i.to_string(), "next"]),
                    rule.next.as_str(),
                ));
            }
            out.push((at_stage(id, &["default"]), default.as_str()));
        }
        Stage::Select { rules, .. } => {
            for (i, rule) in rules.iter().enumerate() {
                let at = at_stage(id, &["rules", &i.to_string(), "branch"]);
                out.push((at, rule.branch.as_str()));
            }
        }
        Stage::Loop { body, .. } => out.push((at_stage(id, &["body"]), body.as_str())),
        _ => {}
    }
    if let Some(next) = stage.next() {
        out.push((at_stage(id, &["next"]), next));
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    OnPath,
    Done,
}

/// One problem per cycle of the stage graph, at the field whose edge closes it.
pub(super) fn stage_cycles(chart: &Flowchart, out: &mut Vec<Problem>) {
    let mut marks: BTreeMap<&str, Mark> = BTreeMap::new();
    let mut path = Vec::new();
    for id in chart.stages.keys() {
        if !marks.contains_key(id.as_str()) {
            visit(chart, id, &mut marks, &mut path, out);
        }
    }
}

fn visit<'a>(
    chart: &'a Flowchart,
    id: &'a str,
    marks: &mut BTreeMap<&'a str, Mark>,
    path: &mut Vec<&'a str>,
    out: &mut Vec<Problem>,
) {
    let Some(stage) = chart.stages.get(id) else {
        return;
    };
    marks.insert(id, Mark::OnPath);
    path.push(id);
    for (at, target) in edges(id, stage) {
        let Some((target, _)) = chart.stages.get_key_value(target) else {
            continue;
        };
        match marks.get(target.as_str()) {
            Some(Mark::OnPath) => {
                let from = path.iter().rposition(|s| *s == target).unwrap_or(0);
                let mut chain: Vec<&str> = path[from..].to_vec();
                chain.push(target);
                out.push(Problem::new(
                    at,
                    format!(
                        "an unbounded loop: {} (only a `loop` stage repeats, at most \
                         `maxIterations` times)",
                        chain.join(" → ")
                    ),
                ));
            }
            Some(Mark::Done) => {}
            None => visit(chart, target, marks, path, out),
        }
    }
    path.pop();
    marks.insert(id, Mark::Done);
}

/// The flowcharts `spec` calls, each with the stage that calls it, in stage order.
fn calls(spec: &FlowchartSpec) -> impl Iterator<Item = (&str, &str)> {
    spec.flowchart
        .stages
        .iter()
        .filter_map(|(id, stage)| match stage {
            Stage::Flow { flowchart, .. } => Some((id.as_str(), flowchart.as_str())),
            _ => None,
        })
}

/// Every `flow` stage names a flowchart of the tenant, and no chain of calls starting at `name`
/// comes back to a flowchart already on it (a call would never end). The stored flowcharts are
/// taken at their latest version, `name` as `spec`.
pub(super) fn subflow_cycles<'a>(
    name: &'a str,
    spec: &'a FlowchartSpec,
    env: &ValidationEnv<'a>,
    out: &mut Vec<Problem>,
) {
    let lookup = |n: &str| -> Option<&'a FlowchartSpec> {
        if n == name {
            Some(spec)
        } else {
            env.flowcharts.get(n)
        }
    };
    for (id, target) in calls(spec) {
        let at = at_stage(id, &["flowchart"]);
        if lookup(target).is_none() {
            let message = if (env.is_tool)(target) {
                format!("`{target}` is a tool, not a flowchart: call it with a `tool` stage")
            } else {
                format!("`{target}` names no flowchart of this tenant")
            };
            out.push(Problem::new(at, message));
            continue;
        }
        let mut path = vec![name];
        let mut done = BTreeSet::new();
        if let Some(chain) = cycle_through(target, &mut path, &mut done, &lookup) {
            out.push(Problem::new(
                at,
                format!("a sub-flow cycle: {}", chain.join(" → ")),
            ));
        }
    }
}

/// The chain of calls from `path[0]` that reaches a flowchart already on it, going through
/// `next`, if there is one.
fn cycle_through<'a, F>(
    next: &'a str,
    path: &mut Vec<&'a str>,
    done: &mut BTreeSet<&'a str>,
    lookup: &F,
) -> Option<Vec<String>>
where
    F: Fn(&str) -> Option<&'a FlowchartSpec>,
{
    if path.contains(&next) {
        let mut chain: Vec<String> = path.iter().map(|s| (*s).to_owned()).collect();
        chain.push(next.to_owned());
        return Some(chain);
    }
    if done.contains(next) {
        return None;
    }
    let spec = lookup(next)?;
    path.push(next);
    for (_, target) in calls(spec) {
        if let Some(chain) = cycle_through(target, path, done, lookup) {
            return Some(chain);
        }
    }
    path.pop();
    done.insert(next);
    None
}
