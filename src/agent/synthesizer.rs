//! Synthesis: once no item can run, cancel the pending items whose dependencies cannot complete,
//! then ask the model for the final answer and complete the run. The answer is the answer to this
//! run's query: the brief holds the results of this run's items, and of earlier runs' items only a
//! bounded summary, as context.

use crate::model::payloads::{RunCompletedContent, SynthesisContent};
use chrono::Utc;
use serde::Deserialize;
use serde_json::Value;

use super::changes::{Op, RunUpdate};
use crate::llm::{ChatMessage, ChatRequest, JsonSchemaFormat, Phase};
use crate::model::RunPhase;
use crate::model::payloads::FinalResponseContent;
use crate::model::{ItemStatus, Message, MessageRole, RunStatus, new_id};

use super::Engine;
use super::journal::{Ctx, Halt};
use super::prompts;

impl Engine {
    /// No item can run any more: cancel pending items whose dependencies cannot complete (see
    /// the scheduler), and announce synthesis.
    pub(super) async fn begin_synthesis(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let mut b = ctx.batch();
        self.cancel_unreachable(ctx, &mut b);
        let count = |s: ItemStatus| {
            ctx.items
                .iter()
                .filter(|i| i.status == s && super::context::this_runs(ctx, i))
                .count() as u32
        };
        b.observe(ctx.emit(
            None,
            "Synthesizing the answer",
            &SynthesisContent {
                completed: count(ItemStatus::Completed),
                failed: count(ItemStatus::Failed),
                cancelled: count(ItemStatus::Cancelled),
            },
        ));
        b.op(Op::UpdateRun(RunUpdate {
            phase: Some(RunPhase::Synthesizing),
            ..Default::default()
        }));
        ctx.stage(b);
        ctx.run.phase = RunPhase::Synthesizing;
        Ok(())
    }

    pub(super) async fn synthesize(&self, ctx: &mut Ctx<'_>) -> Result<(), Halt> {
        let brief = prompts::synthesis_brief(
            &ctx.run.query,
            ctx.state.plan.as_deref(),
            &self.earlier(ctx, prompts::EARLIER_ITEMS_IN_SYNTHESIS),
            &self.result_lines(ctx),
        );
        let req = ChatRequest {
            phase: Phase::Synthesize,
            model: ctx.model(),
            messages: vec![
                ChatMessage::system(prompts::synthesis_system(&ctx.env.cfg)),
                ChatMessage::user(brief),
            ],
            tools: vec![],
            response_format: Some(JsonSchemaFormat {
                name: prompts::SYNTHESIS_SCHEMA_NAME.into(),
                schema: prompts::synthesis_schema(),
            }),
            tokens: crate::llm::Tokens::none(),
        };
        let value = ctx.ask_structured(req).await?;
        let response = value
            .get("response")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let answer = FinalResponseContent {
            response: response.clone(),
            sources: list_of(value.get("sources")),
            suggestions: list_of(value.get("suggestions")),
            output: None,
        };
        ctx.state.current_step_id = None;
        let mut b = ctx.batch();
        b.op(Op::AppendMessage(Message {
            id: new_id(),
            thread_id: ctx.env.thread_id.clone(),
            run_id: Some(ctx.run.run_id),
            role: MessageRole::Assistant,
            content: response.clone(),
            item_id: None,
            tool_call_id: None,
            name: None,
            tool_calls: vec![],
            created_at: Utc::now(),
        }));
        b.op(Op::SetAgentState(ctx.state.clone()));
        b.observe(ctx.emit(None, "Final response", &answer));
        let duration_ms = ctx
            .run
            .started_at
            .map(|s| (Utc::now() - s).num_milliseconds().max(0))
            .unwrap_or_else(|| ctx.env.started.elapsed().as_millis() as i64);
        b.observe(ctx.emit(
            None,
            "Run completed",
            &RunCompletedContent {
                usage: ctx.usage,
                duration_ms,
            },
        ));
        b.op(Op::UpdateRun(RunUpdate {
            status: Some(RunStatus::Completed),
            phase: Some(RunPhase::Done),
            usage: Some(ctx.usage),
            final_response: Some(serde_json::to_value(&answer).unwrap_or_default()),
            ended: true,
            ..Default::default()
        }));
        ctx.commit(b).await?;
        ctx.run.phase = RunPhase::Done;
        Ok(())
    }
}

/// A nullable array of a structured reply: null, absent or not of that shape is empty (the reply
/// was checked against the synthesis schema; this only guards a provider that ignored it).
fn list_of<T: serde::de::DeserializeOwned>(v: Option<&Value>) -> Vec<T> {
    v.and_then(|v| Vec::<T>::deserialize(v).ok())
        .unwrap_or_default()
}
