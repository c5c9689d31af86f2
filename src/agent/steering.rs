//! Steering: a person's messages to a run in flight. Every item's next model call reads them
//! (after its own conversation), and before the next item starts the planner gets one refinement
//! turn per batch of new messages that may change the items not yet started.
//!
//! The messages are the run's `STEERING` observations (and the user messages committed with them,
//! named `steering`); which ones the planner took in is recorded in its `PLAN_UPDATE`
//! (`steeringMessageIds`), so a run re-claimed after a crash neither loses a message nor plans for
//! one twice.

use uuid::Uuid;

use super::Engine;
use super::changes::Op;
use super::journal::{Ctx, Halt};
use super::plan::{self, PlanReply};
use super::prompts::{self, truncate};
use super::steer::{Steer, latest_lines};
use crate::llm::{ChatMessage, ChatRequest, JsonSchemaFormat, Phase};
use crate::model::payloads::{PlanUpdateContent, SteeringContent};
use crate::model::{ItemStatus, ObservationType, ToolValidationMode};

impl Ctx<'_> {
    /// Read the run's steering again (it was pushed), and which of it the planner took in.
    pub(super) async fn reload_steering(&mut self) -> Result<(), Halt> {
        let found = self
            .env
            .journal
            .run_observations(&[ObservationType::Steering, ObservationType::PlanUpdate])
            .await
            .map_err(Halt::from)?;
        let mut planned: Vec<Uuid> = self
            .steering
            .iter()
            .filter(|s| s.planned)
            .map(|s| s.id)
            .collect();
        let mut all = Vec::new();
        for o in &found {
            if let Some(update) = o.payload::<PlanUpdateContent>() {
                planned.extend(update.steering_message_ids.into_iter().flatten());
            } else if let Some(steer) = o.payload::<SteeringContent>() {
                all.push(Steer {
                    id: steer.message_id,
                    text: steer.message,
                    planned: false,
                });
            }
        }
        for s in &mut all {
            s.planned = planned.contains(&s.id);
        }
        self.steering = all;
        Ok(())
    }
}

impl Engine {
    /// Steering the planner has not taken in, while items remain to start: one refinement turn
    /// that may replace the items not yet started (`PLAN_UPDATE` with `steeringMessageIds`).
    pub(super) async fn refine_for_steering(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let fresh: Vec<Steer> = ctx
            .steering
            .iter()
            .filter(|s| !s.planned)
            .cloned()
            .collect();
        if fresh.is_empty() {
            return Ok(());
        }
        let known = self.enabled_tools(ctx);
        let described = self.described_tools(ctx, &known);
        let max_items = self.max_items(&ctx.env.cfg);
        let pending: Vec<crate::model::TodoItem> = ctx
            .items
            .iter()
            .filter(|i| i.status == ItemStatus::Pending && i.parent_item_id.is_none())
            .cloned()
            .collect();
        let mut messages = vec![ChatMessage::system(prompts::planning_system(
            &ctx.env.cfg,
            &described,
            max_items,
            self.max_team_depth(&ctx.env.cfg) > 0,
        ))];
        messages.extend(self.recent_conversation(ctx));
        messages.push(ChatMessage::user(prompts::refinement_note(
            &self.earlier(ctx, prompts::EARLIER_ITEMS_SHOWN),
            &pending,
        )));
        messages.push(ChatMessage::user(ctx.run.query.clone()));
        let lines = latest_lines(&fresh);
        messages.push(ChatMessage::user(format!(
            "While the plan ran, the person steered it:\n{}\nReply with the whole plan: keep the \
             items that started as they are, and change, add or drop the items that have not \
             started so the plan follows what the person said.",
            lines.join("\n")
        )));
        let req = ChatRequest {
            phase: Phase::Plan,
            model: ctx.model(),
            messages,
            tools: vec![],
            response_format: Some(JsonSchemaFormat {
                name: prompts::PLAN_SCHEMA_NAME.into(),
                schema: prompts::plan_schema(),
            }),
            tokens: crate::llm::Tokens::none(),
        };
        let value = ctx.ask_structured(req).await?;
        let ids: Vec<Uuid> = fresh.iter().map(|s| s.id).collect();
        for s in &mut ctx.steering {
            s.planned = true;
        }
        let frozen: Vec<crate::model::ItemId> = ctx
            .items
            .iter()
            .filter(|i| i.status != ItemStatus::Pending)
            .map(|i| i.id.clone())
            .collect();
        let checked = serde_json::from_value::<PlanReply>(value.clone())
            .map_err(|e| vec![e.to_string()])
            .and_then(|r| {
                plan::validate(
                    &r.todo_list,
                    &frozen,
                    &plan::Rules {
                        known_tools: &known,
                        roles: ctx.env.cfg.roles.as_ref(),
                        max_items: max_items as usize,
                    },
                )
                .map(|v| (r, v))
            });
        let mut b = ctx.batch();
        let mut content = match checked {
            Ok((reply, valid)) => {
                let mode = ctx
                    .env
                    .cfg
                    .tool_validation_mode
                    .unwrap_or(ToolValidationMode::Strict);
                let mut diff =
                    plan::merge(std::mem::take(&mut ctx.items), &valid, mode, ctx.run.run_id);
                let mut c = diff.observation_content();
                ctx.items = std::mem::take(&mut diff.items);
                for id in &diff.removed {
                    b.op(Op::DeleteItem(id.clone()));
                }
                for it in &ctx.items {
                    if diff.dirty.contains(&it.id) {
                        b.op(Op::UpsertItem(Box::new(it.clone())));
                    }
                }
                ctx.state.plan = Some(reply.plan.clone());
                b.op(Op::SetAgentState(ctx.state.clone()));
                c.plan = Some(reply.plan);
                c
            }
            // The plan stays as it was; the items still read the steering.
            Err(errors) => PlanUpdateContent {
                added: vec![],
                changed: vec![],
                removed: vec![],
                todo_list: crate::model::payloads::summary(&ctx.items),
                plan: None,
                steering_message_ids: None,
                unchanged: Some(true),
                error: Some(truncate(&errors.join("; "), 500)),
            },
        };
        content.steering_message_ids = Some(ids);
        b.observe(ctx.emit(None, "Plan refined after steering", &content));
        ctx.stage(b);
        Ok(())
    }
}
