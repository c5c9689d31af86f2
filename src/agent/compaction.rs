//! Compaction: what other items read of an item's result. A result no longer than
//! `compactionThresholdChars` is its own compacted output; a longer one is summarized by the model
//! (`pes_compaction`) and the summary is committed with a `COMPACTION` observation. Items that
//! depend on it become ready only once its compacted output exists, so a crash between the
//! result and its compaction resumes with the compaction.

use crate::model::payloads::CompactionContent;
use chrono::Utc;
use serde_json::Value;

use super::changes::{Op, RunUpdate};
use crate::llm::{ChatMessage, ChatRequest, ChatResponse, JsonSchemaFormat, Phase};

use super::Engine;
use super::executor::Next;
use super::journal::Ctx;
use super::prompts::{self, truncate};

impl Engine {
    /// Results longer than this many characters are compacted.
    pub(super) fn compaction_threshold(&self, ctx: &Ctx<'_>) -> usize {
        ctx.env
            .cfg
            .compaction_threshold_chars
            .unwrap_or(self.settings.compaction_threshold_chars) as usize
    }

    /// A completed item whose result is short enough becomes its own compacted output (in
    /// memory; staged with the item's completion by the caller).
    pub(super) fn settle_compaction(&self, ctx: &mut Ctx<'_>, idx: usize) {
        let limit = self.compaction_threshold(ctx);
        let it = &mut ctx.items[idx];
        let result = it.result.clone().unwrap_or_default();
        if result.chars().count() <= limit {
            it.compacted_output = Some(result);
        }
    }

    /// The request that compacts a completed item's long result.
    pub(super) fn compaction_step(&self, ctx: &mut Ctx<'_>, idx: usize) -> Next {
        let limit = self.compaction_threshold(ctx);
        let it = &ctx.items[idx];
        let result = it.result.clone().unwrap_or_default();
        if result.chars().count() <= limit {
            // Nothing to ask (a result committed before compaction existed).
            self.settle_compaction(ctx, idx);
            let mut b = ctx.batch();
            b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
            ctx.stage(b);
            return Next::Idle;
        }
        Next::Compact(ChatRequest {
            phase: Phase::Compact,
            model: ctx.model(),
            messages: vec![
                ChatMessage::system(prompts::compaction_system(limit)),
                ChatMessage::user(prompts::compaction_request(
                    it.id.as_str(),
                    &it.description,
                    &result,
                )),
            ],
            tools: vec![],
            response_format: Some(JsonSchemaFormat {
                name: prompts::COMPACTION_SCHEMA_NAME.into(),
                schema: prompts::compaction_schema(),
            }),
            tokens: crate::llm::Tokens::none(),
        })
    }

    /// The model's summary becomes the item's compacted output, with `COMPACTION` (staged).
    pub(super) fn take_compaction(
        &self,
        ctx: &mut Ctx<'_>,
        item_id: &str,
        value: &Value,
        resp: &ChatResponse,
    ) {
        let Some(idx) = ctx.item_idx(item_id) else {
            return;
        };
        let limit = self.compaction_threshold(ctx);
        ctx.spend(item_id, &resp.usage, false);
        let summary = value
            .get("summary")
            .and_then(Value::as_str)
            .unwrap_or_default();
        // A summary longer than the limit would defeat the purpose: it is cut to the limit.
        let summary = truncate(summary, limit);
        let it = &mut ctx.items[idx];
        let input_chars = it.result.as_deref().unwrap_or("").chars().count();
        let output_chars = summary.chars().count();
        it.compacted_output = Some(summary.clone());
        it.updated_at = Utc::now();
        let mut b = ctx.batch();
        b.op(Op::UpsertItem(Box::new(ctx.items[idx].clone())));
        b.observe(ctx.emit(
            Some(item_id),
            format!("{item_id}: {input_chars} → {output_chars} characters"),
            &CompactionContent {
                item_id: ctx.items[idx].id.clone(),
                summary: summary.clone(),
                input_chars: input_chars as u64,
                output_chars: output_chars as u64,
            },
        ));
        b.op(Op::UpdateRun(RunUpdate {
            usage: Some(ctx.usage),
            ..Default::default()
        }));
        ctx.stage(b);
    }
}
