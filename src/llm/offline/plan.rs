//! Planning: the `pes_plan` reply. New items for the query (from what [`super::query`] finds in
//! it), after the items not started yet that the refinement note lists, numbered past every item
//! the thread has. The items' descriptions are the offline model's own language: `execute` reads
//! the tool and its arguments back from them, and a follow-up's plan rebuilds the items not started
//! from them.

use serde_json::{Value, json};

use super::query::{
    asks_for_time, detect_expressions, detect_zone, independent_parts, named_calls,
    wants_a_question,
};
use super::read::{NoteEntry, available_tools, last_user_text, max_items, read_refinement};
use super::{MAX_QUOTED_QUERY, truncate_chars};
use crate::llm::ChatRequest;
use crate::model::ItemStatus;

/// Items a plan holds when the system prompt gives no bound.
const DEFAULT_MAX_ITEMS: usize = 20;

/// One plan item as the `pes_plan` schema spells it.
#[derive(Debug, Clone, PartialEq)]
struct PlanItem {
    id: String,
    description: String,
    step_type: &'static str,
    required_tools: Vec<String>,
    expected_outcome: String,
    dependencies: Vec<String>,
}

impl PlanItem {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "description": self.description,
            "stepType": self.step_type,
            "requiredTools": self.required_tools,
            "expectedOutcome": self.expected_outcome,
            "dependencies": self.dependencies,
            "kind": "leaf",
            "role": null,
            "toolAllowlist": null,
        })
    }
}

/// A new item's content before it gets an id.
struct Draft {
    description: String,
    tool: Option<String>,
    expected_outcome: String,
}

const ANSWER_PREFIX: &str = "Compose the answer to: ";
pub(super) const CALCULATE_PREFIX: &str = "Calculate ";
const TIME_PREFIX: &str = "Look up the current time";
pub(super) const ASK_PREFIX: &str = "Ask the user: ";
/// Prefix of an item that calls a tool the query named: `Call the tool <name> with <json>`.
const CALL_PREFIX: &str = "Call the tool ";
/// The question the offline model asks when a query says "ask me".
pub(super) const ASK_QUESTION: &str = "What should I know to answer?";
/// Prefix of an item that answers one independent part of a query that needs no tool.
pub(super) const PART_PREFIX: &str = "Answer this part: ";
/// Expected outcome of such an item.
const PART_OUTCOME: &str = "An answer to this part of the query";

/// The tool and arguments of an item the offline model planned from a named tool
/// (`Call the tool <name> with <json>`).
pub(super) fn called_tool(description: &str) -> Option<(&str, Value)> {
    let (name, args) = description
        .strip_prefix(CALL_PREFIX)?
        .split_once(" with ")?;
    let args: Value = serde_json::from_str(args).ok()?;
    args.is_object().then_some((name, args))
}

/// New items for a query: one per arithmetic expression, one for the time, one to ask the user,
/// or, when none of these applies, one per independent part of the query; then the answer, which
/// depends on all of them. The parts have no dependency between them, so they run in parallel.
fn drafts_for(query: &str, available: &[String]) -> (Vec<Draft>, Draft) {
    let (named, rest) = named_calls(query, available);
    let mut tools: Vec<Draft> = named
        .into_iter()
        .map(|(name, args)| Draft {
            description: format!("{CALL_PREFIX}{name} with {args}"),
            expected_outcome: format!("The result of {name}"),
            tool: Some(name),
        })
        .collect();
    tools.extend(detect_expressions(&rest).into_iter().map(|expr| Draft {
        description: format!("{CALCULATE_PREFIX}{expr}"),
        tool: Some("calculator".into()),
        expected_outcome: format!("The value of {expr}"),
    }));
    if asks_for_time(query) {
        let zone = detect_zone(query);
        let suffix = zone.map(|z| format!(" in {z}")).unwrap_or_default();
        tools.push(Draft {
            description: format!("{TIME_PREFIX}{suffix}"),
            tool: Some("current_time".into()),
            expected_outcome: format!("The current date and time{suffix}"),
        });
    }
    if wants_a_question(query) {
        tools.push(Draft {
            description: format!("{ASK_PREFIX}{ASK_QUESTION}"),
            tool: Some("ask_user".into()),
            expected_outcome: "The user's answer".into(),
        });
    }
    if tools.is_empty() {
        tools = independent_parts(query)
            .into_iter()
            .map(|part| Draft {
                description: format!("{PART_PREFIX}{}", truncate_chars(&part, MAX_QUOTED_QUERY)),
                tool: None,
                expected_outcome: PART_OUTCOME.into(),
            })
            .collect();
    }
    let answer = Draft {
        description: format!(
            "{ANSWER_PREFIX}{}",
            truncate_chars(query.trim(), MAX_QUOTED_QUERY)
        ),
        tool: None,
        expected_outcome: "A direct answer to the user's question".into(),
    };
    (tools, answer)
}

/// What items not started yet must have been, from their description (the offline model wrote
/// it) and the dependencies the note gives: answer items depend on what the note says, else on
/// the tool and part items listed since the previous answer, as when first planned.
fn rebuild_existing(existing: &[NoteEntry]) -> Vec<PlanItem> {
    let mut items = Vec::new();
    let mut batch: Vec<String> = Vec::new();
    for NoteEntry {
        id,
        description,
        dependencies,
        ..
    } in existing
    {
        let tool = if description.starts_with(CALCULATE_PREFIX) {
            Some("calculator".to_owned())
        } else if description.starts_with(TIME_PREFIX) {
            Some("current_time".to_owned())
        } else if description.starts_with(ASK_PREFIX) {
            Some("ask_user".to_owned())
        } else {
            called_tool(description).map(|(name, _)| name.to_owned())
        };
        let item = match tool {
            Some(t) => {
                // The same expected outcome as when the item was first planned.
                let expected_outcome = match description.strip_prefix(CALCULATE_PREFIX) {
                    Some(expr) => format!("The value of {expr}"),
                    None if t == "ask_user" => "The user's answer".into(),
                    None if description.starts_with(CALL_PREFIX) => format!("The result of {t}"),
                    None => format!(
                        "The current date and time{}",
                        &description[TIME_PREFIX.len()..]
                    ),
                };
                batch.push(id.clone());
                PlanItem {
                    id: id.clone(),
                    description: description.clone(),
                    step_type: "tool",
                    required_tools: vec![t],
                    expected_outcome,
                    dependencies: vec![],
                }
            }
            None if description.starts_with(PART_PREFIX) => {
                batch.push(id.clone());
                PlanItem {
                    id: id.clone(),
                    description: description.clone(),
                    step_type: "reasoning",
                    required_tools: vec![],
                    expected_outcome: PART_OUTCOME.into(),
                    dependencies: vec![],
                }
            }
            None => PlanItem {
                id: id.clone(),
                description: description.clone(),
                step_type: "reasoning",
                required_tools: vec![],
                expected_outcome: "A direct answer to the user's question".into(),
                dependencies: if description.starts_with(ANSWER_PREFIX) {
                    std::mem::take(&mut batch)
                } else {
                    vec![]
                },
            },
        };
        let item = match dependencies {
            Some(deps) => PlanItem {
                dependencies: deps.clone(),
                ..item
            },
            None => item,
        };
        items.push(item);
    }
    items
}

/// The `pes_plan` reply for the query of a planning request: the query's own items (at most the
/// cap), after the items of the refinement note no run started when they fit beside them (the
/// query wins when they do not). Items earlier runs finished are never listed again: they stay
/// in the thread whatever the list says, so a thread's 200th follow-up has the room its first had.
pub(super) fn plan(req: &ChatRequest) -> Value {
    let query = last_user_text(req).unwrap_or_default();
    let available = available_tools(req);
    let cap = max_items(req).unwrap_or(DEFAULT_MAX_ITEMS);
    let note = read_refinement(req);
    let (mut drafts, answer) = drafts_for(query, &available);
    drafts.truncate(cap.saturating_sub(1));
    let not_started: Vec<NoteEntry> = note
        .entries
        .iter()
        .filter(|e| e.status == ItemStatus::Pending)
        .cloned()
        .collect();
    let mut items = if not_started.len() + drafts.len() < cap {
        rebuild_existing(&not_started)
    } else {
        Vec::new()
    };
    // Fresh ids continue the numbering: past every id the note lists, and past the count of the
    // thread's items (the note shows only the latest ones).
    let highest = note
        .entries
        .iter()
        .filter_map(|e| e.id.strip_prefix("step-")?.parse::<usize>().ok())
        .max()
        .unwrap_or(0);
    let mut next = highest.max(note.earlier_total + not_started.len()) + 1;
    let listed: Vec<String> = note.entries.iter().map(|e| e.id.clone()).collect();
    let mut fresh_id = |items: &[PlanItem]| loop {
        let id = format!("step-{next}");
        next += 1;
        if !items.iter().any(|i| i.id == id) && !listed.contains(&id) {
            return id;
        }
    };
    let mut draft_ids = Vec::new();
    for d in drafts {
        let id = fresh_id(&items);
        draft_ids.push(id.clone());
        items.push(PlanItem {
            id,
            description: d.description,
            step_type: if d.tool.is_some() {
                "tool"
            } else {
                "reasoning"
            },
            required_tools: d.tool.into_iter().collect(),
            expected_outcome: d.expected_outcome,
            dependencies: vec![],
        });
    }
    let id = fresh_id(&items);
    items.push(PlanItem {
        id,
        description: answer.description,
        step_type: "reasoning",
        required_tools: vec![],
        expected_outcome: answer.expected_outcome,
        dependencies: draft_ids,
    });
    let steps: Vec<String> = items
        .iter()
        .enumerate()
        .map(|(i, it)| format!("{}. {}", i + 1, it.description))
        .collect();
    let title = truncate_chars(query.trim(), 60);
    json!({
        "title": if title.is_empty() { "Untitled".to_owned() } else { title },
        "intent": format!(
            "The user wants an answer to: \"{}\" (planned by the offline model, not a real LLM).",
            truncate_chars(query.trim(), MAX_QUOTED_QUERY)
        ),
        "plan": steps.join("\n"),
        "todoList": items.iter().map(PlanItem::to_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::agent::prompts;
    use crate::llm::offline::OfflineProvider;
    use crate::llm::offline::testing::*;
    use crate::llm::{ChatMessage, LlmProvider, Phase, ToolSpec};
    use crate::model::{AgentConfig, TodoItem};

    #[tokio::test]
    async fn a_tool_the_query_names_is_called_with_the_arguments_that_follow() {
        let described = vec![
            ("calculator".to_owned(), "math".to_owned()),
            ("web__echo".to_owned(), "echo".to_owned()),
            ("web__echo_all".to_owned(), "echo all".to_owned()),
            ("web__ping".to_owned(), "ping".to_owned()),
        ];
        let req = request(
            Phase::Plan,
            vec![
                ChatMessage::system(prompts::planning_system(
                    &AgentConfig::default(),
                    &described,
                    10,
                    true,
                )),
                ChatMessage::user(
                    r#"Use web__ping, then call `web__echo` with {"text": "1+1 at 2024-01-02"} and add 2*3"#,
                ),
            ],
        );
        assert_eq!(
            available_tools(&req),
            ["calculator", "web__echo", "web__echo_all", "web__ping"]
        );
        let plan = reply(req).await;
        let items = plan["todoList"].as_array().unwrap();
        let described: Vec<(&str, &Value)> = items
            .iter()
            .map(|i| (i["description"].as_str().unwrap(), &i["requiredTools"]))
            .collect();
        assert_eq!(
            described[..3],
            [
                ("Call the tool web__ping with {}", &json!(["web__ping"])),
                (
                    r#"Call the tool web__echo with {"text":"1+1 at 2024-01-02"}"#,
                    &json!(["web__echo"])
                ),
                ("Calculate 2*3", &json!(["calculator"])),
            ],
            "the arithmetic inside the arguments is not calculated: {plan}"
        );
        assert_eq!(items.len(), 4);
        // Executing the item calls the tool with exactly those arguments.
        let r = OfflineProvider::new()
            .complete(execute_request(
                "q",
                r#"Call the tool web__echo with {"text":"1+1 at 2024-01-02"}"#,
                &["web__echo"],
                vec![],
            ))
            .await
            .unwrap();
        assert_eq!(r.tool_calls.len(), 0, "not offered: {r:?}");
        let mut req = execute_request(
            "q",
            r#"Call the tool web__echo with {"text":"1+1 at 2024-01-02"}"#,
            &["web__echo"],
            vec![],
        );
        req.tools = vec![ToolSpec {
            name: "web__echo".into(),
            description: "echo".into(),
            parameters: json!({"type": "object"}),
        }];
        let r = OfflineProvider::new().complete(req).await.unwrap();
        assert_eq!(r.tool_calls[0].name, "web__echo");
        assert_eq!(
            r.tool_calls[0].arguments,
            json!({"text": "1+1 at 2024-01-02"})
        );
        // A refinement keeps the item as planned.
        let rebuilt = rebuild_existing(&[NoteEntry {
            id: "step-1".into(),
            status: ItemStatus::Pending,
            description: "Call the tool web__ping with {}".into(),
            dependencies: None,
        }]);
        assert_eq!(rebuilt[0].required_tools, ["web__ping"]);
    }

    #[tokio::test]
    async fn a_plan_has_one_item_per_expression_and_a_final_answer() {
        let p = plan_for("what is 12*(3+4) and 2^10", 10).await;
        assert_eq!(p["title"], "what is 12*(3+4) and 2^10");
        assert!(
            p["intent"]
                .as_str()
                .unwrap()
                .contains("what is 12*(3+4) and 2^10")
        );
        let list = p["todoList"].as_array().unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(
            list[0],
            json!({"id": "step-1", "description": "Calculate 12*(3+4)", "stepType": "tool",
                   "requiredTools": ["calculator"], "expectedOutcome": "The value of 12*(3+4)",
                   "dependencies": [], "kind": "leaf", "role": null, "toolAllowlist": null})
        );
        assert_eq!(list[1]["description"], "Calculate 2^10");
        assert_eq!(list[2]["id"], "step-3");
        assert_eq!(list[2]["stepType"], "reasoning");
        assert_eq!(
            list[2]["description"],
            "Compose the answer to: what is 12*(3+4) and 2^10"
        );
        assert_eq!(list[2]["dependencies"], json!(["step-1", "step-2"]));
        assert_eq!(
            p["plan"],
            "1. Calculate 12*(3+4)\n2. Calculate 2^10\n3. Compose the answer to: what is 12*(3+4) and 2^10"
        );
    }

    #[tokio::test]
    async fn a_time_question_plans_a_current_time_step() {
        let p = plan_for("What time is it in Asia/Tokyo?", 10).await;
        let list = p["todoList"].as_array().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(
            list[0]["description"],
            "Look up the current time in Asia/Tokyo"
        );
        assert_eq!(list[0]["requiredTools"], json!(["current_time"]));
        assert_eq!(list[1]["dependencies"], json!(["step-1"]));
        let p = plan_for("tell me a joke", 10).await;
        assert_eq!(
            descriptions(&p),
            vec!["Compose the answer to: tell me a joke"]
        );
    }

    #[tokio::test]
    async fn independent_parts_of_a_query_become_parallel_items() {
        let query =
            "Compare the history of Rome; summarize the causes of WW1; list three prime numbers";
        let p = plan_for(query, 10).await;
        let list = p["todoList"].as_array().unwrap();
        assert_eq!(
            descriptions(&p),
            vec![
                "Answer this part: Compare the history of Rome",
                "Answer this part: summarize the causes of WW1",
                "Answer this part: list three prime numbers",
                &format!("Compose the answer to: {query}"),
            ]
        );
        for part in &list[..3] {
            assert_eq!(part["stepType"], "reasoning");
            assert_eq!(part["requiredTools"], json!([]));
            assert_eq!(part["dependencies"], json!([]), "{part}");
        }
        assert_eq!(
            list[3]["dependencies"],
            json!(["step-1", "step-2", "step-3"])
        );

        // Questions split at `?`; trivial pieces do not count.
        let p = plan_for("Who built the pyramids? Why is the sky blue? Why?", 10).await;
        assert_eq!(
            descriptions(&p)[..2],
            [
                "Answer this part: Who built the pyramids",
                "Answer this part: Why is the sky blue"
            ]
        );
        assert_eq!(descriptions(&p).len(), 3);
        // One real part, or a query with a tool, is planned as before.
        for q in [
            "What is the capital of France? Thanks",
            "what is 2+3? and 4*5?",
        ] {
            let p = plan_for(q, 10).await;
            assert!(
                descriptions(&p).iter().all(|d| !d.starts_with(PART_PREFIX)),
                "{q}: {p}"
            );
        }
        // The cap leaves room for the answer.
        let p = plan_for(query, 3).await;
        assert_eq!(
            p["todoList"][2]["dependencies"],
            json!(["step-1", "step-2"])
        );
    }

    #[tokio::test]
    async fn plans_respect_max_items_and_a_long_query_makes_a_short_title() {
        let p = plan_for("1+1, 2+2, 3+3 and 4+4", 3).await;
        assert_eq!(
            descriptions(&p),
            vec![
                "Calculate 1+1",
                "Calculate 2+2",
                "Compose the answer to: 1+1, 2+2, 3+3 and 4+4"
            ]
        );
        let p = plan_for("1+1 and 2+2", 1).await;
        assert_eq!(descriptions(&p).len(), 1);
        let long = "why ".repeat(40);
        let p = plan_for(&long, 5).await;
        assert!(p["title"].as_str().unwrap().chars().count() <= 61);
        // Without the cap line, the default bound applies.
        let many: Vec<String> = (1..=25).map(|i| format!("{i}+{i}")).collect();
        let mut req = plan_request(&many.join(", "), 5, &[], &[]);
        req.messages[0] = ChatMessage::system("Plan.");
        assert_eq!(max_items(&req), None);
        let p = reply(req).await;
        assert_eq!(descriptions(&p).len(), DEFAULT_MAX_ITEMS);
    }

    #[tokio::test]
    async fn a_follow_up_plans_its_own_items_and_continues_the_numbering() {
        for first_query in [
            "what is 2+2",
            "Who built Rome? Who built Athens?",
            "What time is it in UTC? ask me",
        ] {
            let first = plan_for(first_query, 10).await;
            let items = completed_items(&first);
            let req = plan_request("and 3*3?", 10, &[first_query], &items);
            let note = read_refinement(&req);
            assert_eq!(note.entries.len(), items.len(), "{first_query}");
            assert_eq!(note.earlier_total, items.len());
            let p = reply(req).await;
            let list = p["todoList"].as_array().unwrap();
            let kept = items.len();
            // Finished items are not listed again (they stay whatever the list says); the new
            // query is planned, the previous one (in the history) is not planned again.
            assert_eq!(list.len(), 2, "{p}");
            assert_eq!(list[0]["id"], format!("step-{}", kept + 1));
            assert_eq!(list[0]["description"], "Calculate 3*3");
            assert_eq!(list[1]["id"], format!("step-{}", kept + 2));
            assert_eq!(
                list[1]["dependencies"],
                json!([format!("step-{}", kept + 1)])
            );
            assert_eq!(p["title"], "and 3*3?");
        }
    }

    #[tokio::test]
    async fn items_not_started_are_kept_with_their_dependencies_when_they_fit() {
        let first = plan_for("what is 2+2 and 3+3", 10).await;
        let mut items = completed_items(&first);
        // A cancelled run: the calculations finished, the answer never started.
        let answer = items.len() - 1;
        items[answer].status = ItemStatus::Pending;
        let p = reply(plan_request("and 4*4?", 10, &[], &items)).await;
        let list = p["todoList"].as_array().unwrap();
        assert_eq!(
            list[0], first["todoList"][answer],
            "kept as first planned: {p}"
        );
        assert_eq!(list[0]["dependencies"], json!(["step-1", "step-2"]));
        assert_eq!(
            descriptions(&p)[1..],
            ["Calculate 4*4", "Compose the answer to: and 4*4?"]
        );
        assert_eq!(list[1]["id"], "step-4");
        // When they do not fit beside the new query's items, the query wins.
        let p = reply(plan_request("and 4*4?", 2, &[], &items)).await;
        assert_eq!(
            descriptions(&p),
            ["Calculate 4*4", "Compose the answer to: and 4*4?"]
        );
    }

    #[tokio::test]
    async fn the_200th_follow_up_is_planned_like_the_first() {
        let mut thread: Vec<TodoItem> = Vec::new();
        let mut sizes = Vec::new();
        for n in 1..=200 {
            let query = format!("What is 2+{n}?");
            let req = plan_request(&query, 4, &[], &thread);
            sizes.push(
                req.messages
                    .iter()
                    .map(|m| m.content.as_deref().map_or(0, str::len))
                    .sum::<usize>(),
            );
            let p = reply(req).await;
            assert_eq!(
                descriptions(&p),
                [
                    format!("Calculate 2+{n}"),
                    format!("Compose the answer to: {query}")
                ],
                "run {n}"
            );
            let fresh = completed_items(&p);
            for it in &fresh {
                assert!(
                    thread.iter().all(|t| t.id != it.id),
                    "run {n} reuses {}",
                    it.id
                );
            }
            thread.extend(fresh);
        }
        // The planning prompt stops growing once the note shows its most items (but for the
        // numbers' digits).
        assert!(
            sizes[199] * 10 <= sizes[20] * 11,
            "{} vs {}",
            sizes[199],
            sizes[20]
        );
    }

    #[tokio::test]
    async fn the_offline_plan_matches_a_strict_plan_schema() {
        let schema = crate::agent::prompts::plan_schema();
        for q in [
            "what is 2+2 and what time is it",
            "Who built Rome? Who built Athens?",
        ] {
            let p = plan_for(q, 10).await;
            crate::json::schema::validate(&schema, &p).unwrap();
        }
    }
}
