//! A thread's agent state (its todo items and snapshot) and its conversation messages.

use super::*;

async fn agent_snapshot_reflects_items_and_state(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let mut b = batch(A, "t");
    let built: Vec<TodoItem> = [("c", 2), ("a", 0), ("b", 1)]
        .into_iter()
        .map(|(id, pos)| item(id, pos, run.run_id))
        .collect();
    for it in &built {
        b.op(Op::UpsertItem(Box::new(it.clone())));
    }
    b.op(Op::SetAgentState(AgentStateRow {
        intent: Some("intent".into()),
        title: Some("title".into()),
        plan: Some("plan".into()),
        current_step_id: None,
        version: 0,
    }));
    apply(&store, f, b).await;
    let snap = store.agent_snapshot(A, &tid("t")).await.unwrap().unwrap();
    let ids: Vec<&str> = snap.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(snap.items[0], built[1]);
    assert_eq!(snap.state.version, 1);
    assert_eq!(snap.state.intent.as_deref(), Some("intent"));

    // Every field survives the round trip.
    let t = now();
    let mut full = item("b", 1, run.run_id);
    full.status = ItemStatus::Completed;
    full.dependencies = vec![iid("a")];
    full.step_type = StepType::Reasoning;
    full.tool_validation_mode = ToolValidationMode::Advisory;
    full.validation_status = ValidationStatus::Passed;
    full.tool_calls = vec![ToolCallRecord {
        id: "c1".into(),
        name: "calculator".into(),
        arguments: json!({ "expression": "2*3" }),
    }];
    full.actual_tool_calls = full.tool_calls.clone();
    full.tool_results = vec![ToolResultRecord {
        tool_call_id: "c1".into(),
        name: "calculator".into(),
        status: ToolResultStatus::Success,
        output: json!(6),
        error: None,
    }];
    full.thoughts = vec!["multiply".into()];
    full.result = Some("6".into());
    full.error = Some(ErrorInfo {
        code: "none".into(),
        message: "fine".into(),
    });
    full.attempts = 2;
    full.usage = Usage {
        prompt_tokens: 1,
        completion_tokens: 2,
        total_tokens: 3,
        llm_calls: 1,
        ..Usage::default()
    };
    full.conversation = vec![ConversationMessage {
        role: MessageRole::Assistant,
        content: None,
        tool_calls: full.tool_calls.clone(),
        tool_call_id: None,
    }];
    full.started_at = Some(t);
    full.completed_at = Some(t);
    let mut b = batch(A, "t");
    b.op(Op::UpsertItem(Box::new(full.clone())))
        .op(Op::DeleteItem(iid("c")))
        .op(Op::SetAgentState(AgentStateRow {
            current_step_id: Some("b".into()),
            ..Default::default()
        }));
    apply(&store, f, b).await;
    let snap = store.agent_snapshot(A, &tid("t")).await.unwrap().unwrap();
    assert_eq!(snap.items.len(), 2);
    assert_eq!(snap.items[1], full);
    assert_eq!(snap.state.version, 2);
    assert_eq!(snap.state.intent, None, "the state row is replaced");
    assert_eq!(snap.state.current_step_id.as_deref(), Some("b"));
    assert!(
        store
            .agent_snapshot(A, &tid("nope"))
            .await
            .unwrap()
            .is_none()
    );
}

async fn messages_list_oldest_first_with_a_cursor(store: S) {
    let (run, f) = running(&store, A, "t").await;
    let mut written = Vec::new();
    for i in 0..5 {
        let role = if i % 2 == 0 {
            MessageRole::User
        } else {
            MessageRole::Assistant
        };
        let mut m = message("t", run.run_id, role, &format!("m{i}"));
        if i == 2 {
            // An item's tool-call turn: an assistant message with its calls.
            m.item_id = Some("step-1".into());
            m.role = MessageRole::Assistant;
            m.content = String::new();
            m.tool_calls = vec![ToolCallRecord {
                id: "call-1".into(),
                name: "calculator".into(),
                arguments: json!({"expression": "1+1"}),
            }];
        }
        if i == 3 {
            m.item_id = Some("step-1".into());
            m.tool_call_id = Some("call-1".into());
            m.name = Some("calculator".into());
            m.role = MessageRole::Tool;
        }
        written.push(m.clone());
        let mut b = batch(A, "t");
        b.op(Op::AppendMessage(m));
        apply(&store, f, b).await;
    }
    let all = store
        .list_messages(A, &tid("t"), 0, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(all, written);
    let first = store
        .list_messages(A, &tid("t"), 2, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, written[..2]);
    let cursor = PageCursor {
        created_at: first[1].created_at,
        id: first[1].id.to_string(),
    };
    let second = store
        .list_messages(A, &tid("t"), 2, Some(&cursor))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second, written[2..4]);
    // The planner's context: the newest messages of the thread-level conversation (no item's
    // tool-call turn or tool result), oldest first.
    let recent = store.recent_messages(A, &tid("t"), 2).await.unwrap();
    assert_eq!(recent, vec![written[1].clone(), written[4].clone()]);
    let recent = store.recent_messages(A, &tid("t"), 10).await.unwrap();
    assert_eq!(
        recent,
        vec![written[0].clone(), written[1].clone(), written[4].clone()]
    );
}

crate::conformance!(
    agent_snapshot_reflects_items_and_state,
    messages_list_oldest_first_with_a_cursor,
);
