//! Team items: a sub-goal with its own nested plan. When a team becomes ready it is planned
//! (`pes_plan` for the team's goal, with its dependencies' compacted outputs), and the plan commits
//! as `PLAN` under the team item: children `<teamId>.<childId>` with `parentItemId`, run by the
//! same scheduler under the same rules. The team completes when its children do; its result is
//! their outputs, compacted like any result. A team deeper than `maxTeamDepth` is not planned and
//! fails with the reason.
//!
//! The team's planning conversation is journaled in the team item itself (the request's reply,
//! then the repair request when the plan was invalid), so a crash mid-planning resumes with the
//! same repair budget, and the scheduler's I/O stays a plain structured request.

use crate::model::payloads::PlanContent;
use chrono::Utc;
use serde_json::Value;

use super::changes::{Op, RunUpdate};
use crate::llm::{ChatMessage, ChatRequest, ChatResponse, JsonSchemaFormat, Phase};
use crate::model::{
    ConversationMessage, ErrorInfo, ItemId, ItemStatus, MessageRole, TodoItem, ToolValidationMode,
};

use super::Engine;
use super::executor::Next;
use super::journal::Ctx;
use super::plan::{self, PlanReply};
use super::prompts::{self, Outcome, ResultLine, truncate};

impl Engine {
    /// How deep `item` sits: a top-level team is depth 1, a team inside it 2.
    fn team_depth(&self, ctx: &Ctx<'_>, item: &TodoItem) -> u32 {
        let mut depth = 1;
        let mut parent = item.parent_item_id.clone();
        while let Some(p) = parent {
            depth += 1;
            parent = ctx
                .items
                .iter()
                .find(|i| i.id == p)
                .and_then(|i| i.parent_item_id.clone());
        }
        depth
    }

    /// What a team in progress needs: its plan (asked for, or repaired), nothing while its
    /// children run, or its end once they all ended.
    pub(super) fn team_step(&self, ctx: &mut Ctx<'_>, idx: usize) -> Next {
        let team = ctx.items[idx].clone();
        let max_depth = self.max_team_depth(&ctx.env.cfg);
        let depth = self.team_depth(ctx, &team);
        if depth > max_depth {
            self.fail_item(
                ctx,
                team.id.as_str(),
                ErrorInfo {
                    code: "team_too_deep".into(),
                    message: format!(
                        "the team is at depth {depth} and maxTeamDepth is {max_depth}: it was not planned"
                    ),
                },
                None,
            );
            return Next::Idle;
        }
        let children: Vec<&TodoItem> = ctx
            .items
            .iter()
            .filter(|i| i.parent_item_id.as_ref() == Some(&team.id))
            .collect();
        if children.is_empty() {
            return Next::PlanTeam(self.team_plan_request(ctx, &team, depth < max_depth));
        }
        if children.iter().any(|c| {
            !matches!(
                c.status,
                ItemStatus::Completed | ItemStatus::Failed | ItemStatus::Cancelled
            ) || (c.status == ItemStatus::Completed && c.compacted_output.is_none())
        }) {
            return Next::Idle;
        }
        let unfinished: Vec<String> = children
            .iter()
            .filter(|c| c.status != ItemStatus::Completed)
            .map(|c| format!("`{}` {}", c.id, c.status))
            .collect();
        if !unfinished.is_empty() {
            self.fail_item(
                ctx,
                team.id.as_str(),
                ErrorInfo {
                    code: "team_failed".into(),
                    message: format!(
                        "items of the team did not complete: {}",
                        unfinished.join(", ")
                    ),
                },
                None,
            );
            return Next::Idle;
        }
        let lines: Vec<ResultLine> = children
            .iter()
            .map(|c| ResultLine {
                id: c.id.to_string(),
                description: c.description.clone(),
                outcome: Outcome::Completed(
                    c.compacted_output
                        .clone()
                        .or_else(|| c.result.clone())
                        .unwrap_or_default(),
                ),
            })
            .collect();
        let result = prompts::results_section(prompts::labels::ITEM_RESULTS, &lines);
        let it = &mut ctx.items[idx];
        let previous = it.status;
        it.status = ItemStatus::Completed;
        it.result = Some(result);
        it.completed_at = Some(Utc::now());
        it.updated_at = Utc::now();
        self.settle_compaction(ctx, idx);
        self.item_left(ctx);
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.op(Op::SetAgentState(ctx.state.clone()));
        b.observe(ctx.status_change(&ctx.items[idx], previous));
        ctx.stage(b);
        // A long result is compacted on the next pass, like any item's.
        Next::Idle
    }

    /// The `pes_plan` request for a team's goal: the planning prompt (tools, roles, the room
    /// left under `maxItems`), what the team may build on, and its goal last; then the journaled
    /// planning turns (an invalid plan and the repair request).
    fn team_plan_request(
        &self,
        ctx: &Ctx<'_>,
        team: &TodoItem,
        teams_allowed: bool,
    ) -> ChatRequest {
        let known = self.enabled_tools(ctx);
        let described = self.described_tools(ctx, &known);
        let room = self.team_room(ctx);
        let mut context = format!("{}{}\n", prompts::labels::QUERY, ctx.run.query);
        context.push_str(&prompts::results_section(
            prompts::labels::EARLIER_RESULTS,
            &self.context_lines(ctx, team),
        ));
        context.push_str(&format!(
            "\nPlan only the sub-goal [{}] that follows: its items are ids local to it.",
            team.id
        ));
        let mut goal = team.description.clone();
        if let Some(e) = &team.expected_outcome {
            goal.push_str(&format!("\n{}{e}", prompts::labels::EXPECTED));
        }
        let mut messages = vec![
            ChatMessage::system(prompts::planning_system(
                &ctx.env.cfg,
                &described,
                room as u32,
                teams_allowed,
            )),
            ChatMessage::user(context),
            ChatMessage::user(goal),
        ];
        for m in &team.conversation {
            match m.role {
                MessageRole::Assistant => {
                    messages.push(ChatMessage::assistant(m.content.clone(), vec![]))
                }
                MessageRole::User => {
                    messages.push(ChatMessage::user(m.content.clone().unwrap_or_default()))
                }
                _ => {}
            }
        }
        ChatRequest {
            phase: Phase::Plan,
            model: ctx.model(),
            messages,
            tools: vec![],
            response_format: Some(JsonSchemaFormat {
                name: prompts::PLAN_SCHEMA_NAME.into(),
                schema: prompts::plan_schema(),
            }),
            tokens: crate::llm::Tokens::none(),
        }
    }

    /// Items a team's plan may still add: `maxItems` counts every item of the run, children too,
    /// and none of the items earlier runs of the thread finished.
    fn team_room(&self, ctx: &Ctx<'_>) -> usize {
        let this_run = ctx
            .items
            .iter()
            .filter(|i| super::context::this_runs(ctx, i) || i.status == ItemStatus::Pending)
            .count();
        (self.max_items(&ctx.env.cfg) as usize).saturating_sub(this_run)
    }

    /// A team's plan came back: its children join the todo list with `PLAN` under the team; an
    /// invalid plan gets one repair request (journaled in the team), then fails the team.
    pub(super) fn take_team_plan(
        &self,
        ctx: &mut Ctx<'_>,
        team_id: &str,
        value: &Value,
        resp: &ChatResponse,
    ) {
        let Some(idx) = ctx.item_idx(team_id) else {
            return;
        };
        ctx.spend(team_id, &resp.usage, false);
        let checked = serde_json::from_value::<PlanReply>(value.clone())
            .map_err(|e| vec![e.to_string()])
            .and_then(|reply| {
                self.check_team_plan(ctx, team_id, &reply)
                    .map(|v| (reply, v))
            });
        let (reply, valid) = match checked {
            Ok(ok) => ok,
            Err(errors) => {
                let asked_before = ctx.items[idx]
                    .conversation
                    .iter()
                    .any(|m| m.role == MessageRole::Assistant);
                if asked_before {
                    self.fail_item(
                        ctx,
                        team_id,
                        ErrorInfo {
                            code: "invalid_plan".into(),
                            message: format!(
                                "the team's plan is not valid after one repair: {}; it returned: {}",
                                errors.join("; "),
                                truncate(&value.to_string(), 500)
                            ),
                        },
                        None,
                    );
                    return;
                }
                let it = &mut ctx.items[idx];
                it.conversation.push(ConversationMessage {
                    role: MessageRole::Assistant,
                    content: Some(value.to_string()),
                    tool_calls: vec![],
                    tool_call_id: None,
                });
                it.conversation.push(ConversationMessage {
                    role: MessageRole::User,
                    content: Some(format!(
                        "Your plan is not valid:\n- {}\nReply again with the corrected JSON object.",
                        errors.join("\n- ")
                    )),
                    tool_calls: vec![],
                    tool_call_id: None,
                });
                it.updated_at = Utc::now();
                let mut b = ctx.batch();
                b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
                ctx.stage(b);
                return;
            }
        };
        let mode = ctx
            .env
            .cfg
            .tool_validation_mode
            .unwrap_or(ToolValidationMode::Strict);
        let team = ItemId::parse(team_id).expect("a stored item id");
        let first_position = ctx.items.iter().map(|i| i.position).max().unwrap_or(0) + 1;
        let mut children = Vec::with_capacity(valid.len());
        for (k, v) in valid.iter().enumerate() {
            let mut child = plan::new_item(v, mode);
            child.id = prefixed(&team, v.id.as_str());
            child.dependencies = v
                .dependencies
                .iter()
                .map(|d| prefixed(&team, d.as_str()))
                .collect();
            child.parent_item_id = Some(team.clone());
            child.position = first_position + k as i64;
            child.run_id = Some(ctx.run.run_id);
            children.push(child);
        }
        let it = &mut ctx.items[idx];
        it.thoughts.push(reply.plan.clone());
        it.updated_at = Utc::now();
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        for c in &children {
            b.op(Op::UpsertItem(Box::new(c.clone())));
        }
        b.observe(ctx.emit(
            Some(team_id),
            format!("Plan of team {team_id}"),
            &PlanContent {
                plan: reply.plan.clone(),
                todo_list: plan::summary(&children),
                team_id: Some(ctx.items[idx].id.clone()),
            },
        ));
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
        ctx.items.extend(children);
    }

    /// Validate a team's plan: the usual rules (tools, roles, cycles), the room left under
    /// `maxItems`, and ids that stay valid once prefixed with the team's.
    fn check_team_plan(
        &self,
        ctx: &Ctx<'_>,
        team_id: &str,
        reply: &PlanReply,
    ) -> Result<Vec<plan::ValidItem>, Vec<String>> {
        // Text by design: the problems go to the model, in its repair request, as they are.
        let known = self.enabled_tools(ctx);
        let room = self.team_room(ctx);
        let mut errors = Vec::new();
        if room == 0 {
            errors.push(format!(
                "maxItems ({}) is reached: the team cannot add items",
                self.max_items(&ctx.env.cfg)
            ));
        }
        for p in &reply.todo_list {
            let full = format!("{team_id}.{}", p.id);
            if ItemId::parse(&full).is_err() && ItemId::parse(&p.id).is_ok() {
                errors.push(format!(
                    "item id `{}` is too long once prefixed with the team's (`{full}`): use a shorter id",
                    p.id
                ));
            }
        }
        let valid = plan::validate(
            &reply.todo_list,
            &[],
            &plan::Rules {
                known_tools: &known,
                roles: ctx.env.cfg.roles.as_ref(),
                max_items: room.max(1),
            },
        );
        match valid {
            Ok(v) if errors.is_empty() => Ok(v),
            Ok(_) => Err(errors),
            Err(mut more) => {
                errors.append(&mut more);
                Err(errors)
            }
        }
    }
}

/// `<teamId>.<childId>`.
fn prefixed(team: &ItemId, child: &str) -> ItemId {
    ItemId::from_stored(format!("{team}.{child}"))
}
