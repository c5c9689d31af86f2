//! The OpenAPI document as a client generator reads it: every enum spelled as on the wire, the
//! shared answers where they apply, streams described, every reference resolved, unions named.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::http::runs::IfNotExists;
use crate::http::suspensions::SuspensionFilter;
use crate::model::*;

fn document() -> Value {
    serde_json::to_value(crate::http::openapi()).unwrap()
}

fn wire<T: Serialize>(values: &[T]) -> Value {
    serde_json::to_value(values).unwrap()
}

/// Every operation of the document: (path, method, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            out.push((path.clone(), method.clone(), op.clone()));
        }
    }
    out
}

/// A response of `op` for `status`, with `$ref`s to shared responses followed.
fn response<'a>(doc: &'a Value, op: &'a Value, status: &str) -> Option<&'a Value> {
    let r = op["responses"].get(status)?;
    match r.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let name = reference.rsplit('/').next().unwrap();
            doc["components"]["responses"].get(name)
        }
        None => Some(r),
    }
}

#[test]
fn every_enum_schema_spells_the_values_on_the_wire() {
    let doc = document();
    let expected: BTreeMap<&str, Value> = [
        ("RunStatus", wire(RunStatus::ALL)),
        ("RunKind", wire(crate::model::RunKind::ALL)),
        ("ThreadStatus", wire(ThreadStatus::ALL)),
        ("MultitaskStrategy", wire(MultitaskStrategy::ALL)),
        ("ItemStatus", wire(ItemStatus::ALL)),
        ("ItemKind", wire(crate::model::ItemKind::ALL)),
        ("ContextMode", wire(crate::model::ContextMode::ALL)),
        ("StepType", wire(StepType::ALL)),
        ("ToolValidationMode", wire(ToolValidationMode::ALL)),
        ("ValidationStatus", wire(ValidationStatus::ALL)),
        ("MessageRole", wire(MessageRole::ALL)),
        ("ObservationType", wire(ObservationType::ALL)),
        ("SuspensionKind", wire(SuspensionKind::ALL)),
        ("SuspensionStatus", wire(SuspensionStatus::ALL)),
        ("Decision", wire(Decision::ALL)),
        ("ToolResultStatus", wire(ToolResultStatus::ALL)),
        ("ToolSource", wire(crate::tools::ToolSource::ALL)),
        ("WebhookEvent", wire(crate::model::WebhookEvent::ALL)),
        ("DeliveryStatus", wire(crate::model::DeliveryStatus::ALL)),
        ("OnMissed", wire(crate::model::OnMissed::ALL)),
        ("OnExceed", wire(crate::model::OnExceed::ALL)),
        (
            "IfNotExists",
            wire(&[IfNotExists::Create, IfNotExists::Reject]),
        ),
        (
            "ResumeStatus",
            wire(&[
                crate::http::agui::ResumeStatus::Resolved,
                crate::http::agui::ResumeStatus::Cancelled,
            ]),
        ),
    ]
    .into_iter()
    .collect();
    let mut seen = 0;
    for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
        if let Some(values) = schema.get("enum") {
            let want = expected
                .get(name.as_str())
                .unwrap_or_else(|| panic!("enum schema {name} is not checked here: add it"));
            assert_eq!(values, want, "{name}");
            seen += 1;
        }
    }
    assert_eq!(seen, expected.len(), "an expected enum schema is missing");
    assert_eq!(ObservationType::ALL[0].as_str(), "RUN_STARTED");

    let status = &doc["paths"]["/v1/threads/{threadId}/suspensions"]["get"]["parameters"][1];
    assert_eq!(status["name"], "status");
    let values = status["schema"]["enum"].as_array().unwrap();
    let parsed: Vec<SuspensionFilter> = values
        .iter()
        .map(|v| serde_json::from_value(v.clone()).unwrap())
        .collect();
    assert_eq!(parsed, [SuspensionFilter::Pending, SuspensionFilter::All]);
}

#[test]
fn parameters_are_where_the_server_reads_them_and_optional_unless_in_the_path() {
    let doc = document();
    let mut queries = 0;
    for (path, method, op) in operations(&doc) {
        for p in op["parameters"].as_array().into_iter().flatten() {
            let name = p["name"].as_str().unwrap();
            let placeholder = path.contains(&format!("{{{name}}}"));
            match p["in"].as_str().unwrap() {
                "path" => assert!(placeholder, "{method} {path}: `{name}` is not in the path"),
                "query" | "header" => {
                    assert!(
                        !placeholder,
                        "{method} {path}: `{name}` is a path parameter"
                    );
                    assert_eq!(p["required"], false, "{method} {path}: `{name}`");
                    queries += 1;
                }
                other => panic!("{method} {path}: `{name}` in {other}"),
            }
        }
    }
    // limit+cursor ×5 (threads, runs, messages, assistants, assistant versions),
    // observations 5, events 5 + Last-Event-ID, suspensions 1, flowchart and assistant
    // version 1 each, /a2a's A2A-Version and Last-Event-ID, `tokens` on a streamed run and
    // resume, /v1/ag-ui's Last-Event-ID, a store item's namespace and key.
    // Crons' threadId+limit+cursor, webhook deliveries' runId+status+limit+cursor; a thread's
    // state's atSeq and its history's limit+cursor.
    assert_eq!(queries, 41);
    let limit = &doc["paths"]["/v1/threads"]["get"]["parameters"][0];
    assert_eq!(limit["name"], "limit");
    assert_eq!(limit["in"], "query");
    assert_eq!(limit["schema"]["minimum"], 1);
    assert_eq!(limit["schema"]["maximum"], 200);
}

#[test]
fn the_routes_a_quota_counts_document_429_with_retry_after() {
    let doc = document();
    for (method, path) in super::QUOTA_ROUTES {
        let op = doc["paths"][path][method].clone();
        assert!(op.is_object(), "{method} {path} exists");
        let r = response(&doc, &op, "429").unwrap_or_else(|| panic!("{method} {path}"));
        assert!(r["headers"]["Retry-After"].is_object(), "{method} {path}");
    }
}

#[test]
fn open_routes_need_no_key_and_every_v1_route_documents_401() {
    let doc = document();
    assert_eq!(doc["security"], json!([{"bearer": []}]));
    for (path, method, op) in operations(&doc) {
        if path.starts_with("/v1/admin/") {
            assert_eq!(
                op["security"],
                json!([{"operatorKey": []}]),
                "{method} {path} takes the operator's key"
            );
            assert!(response(&doc, &op, "401").is_some(), "{method} {path}");
            assert!(response(&doc, &op, "403").is_some(), "{method} {path}");
        } else if path.starts_with("/v1/") || path == super::A2A_PATH || path == super::MCP_PATH {
            assert!(
                op.get("security").is_none(),
                "{method} {path} overrides the bearer"
            );
            let r = response(&doc, &op, "401").unwrap_or_else(|| panic!("{method} {path}"));
            assert!(r["headers"]["WWW-Authenticate"].is_object());
        } else {
            assert_eq!(op["security"], json!([]), "{method} {path} needs no key");
            // `/metrics` alone may be closed by the operator (`PES_METRICS_KEY`).
            assert_eq!(
                op["responses"].get("401").is_some(),
                path == "/metrics",
                "{method} {path}"
            );
        }
    }
    for open in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
        "/console",
        "/.well-known/agent-card.json",
    ] {
        assert!(doc["paths"][open]["get"].is_object(), "{open}");
    }
}

#[test]
fn every_error_response_is_a_problem_and_body_routes_document_their_rejections() {
    let doc = document();
    let mut bodies = 0;
    for (path, method, op) in operations(&doc) {
        let mut statuses = vec!["414", "431"];
        if path == super::A2A_PATH {
            // JSON-RPC: what it cannot parse is a JSON-RPC error at 400, not a problem.
            let bad = response(&doc, &op, "400").unwrap();
            assert_eq!(
                bad["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/JsonRpcResponse"
            );
            for status in ["408", "413", "415"] {
                assert!(response(&doc, &op, status).is_some(), "/a2a lacks {status}");
            }
            assert!(
                response(&doc, &op, "422").is_none(),
                "/a2a never answers 422"
            );
            continue;
        }
        if path == super::MCP_PATH {
            // The MCP transport: JSON-RPC errors at 400; what it refuses before JSON-RPC (a body
            // over the limit, a wrong Accept or Host) and our own checks as problems.
            let bad = response(&doc, &op, "400").unwrap();
            assert!(bad["content"]["application/json"].is_object(), "{bad}");
            assert!(
                bad["content"]["application/problem+json"].is_object(),
                "{bad}"
            );
            for status in ["401", "403", "406", "408", "413", "415"] {
                let r =
                    response(&doc, &op, status).unwrap_or_else(|| panic!("/mcp lacks {status}"));
                assert_eq!(
                    r["content"]["application/problem+json"]["schema"]["$ref"],
                    "#/components/schemas/Problem",
                    "/mcp {status}"
                );
            }
            continue;
        }
        if op.get("requestBody").is_some() {
            bodies += 1;
            statuses.extend(["400", "408", "413", "415", "422"]);
        }
        for status in statuses {
            assert!(
                response(&doc, &op, status).is_some(),
                "{method} {path} lacks {status}"
            );
        }
        for status in op["responses"].as_object().unwrap().keys() {
            if status.as_str() >= "400" {
                let r = response(&doc, &op, status).unwrap();
                assert_eq!(
                    r["content"]["application/problem+json"]["schema"]["$ref"],
                    "#/components/schemas/Problem",
                    "{method} {path} {status}"
                );
            }
        }
    }
    assert_eq!(
        bodies, 22,
        "threads POST/PATCH, thread fork, runs, runs/wait, resume, flowcharts PUT, flowchart \
         runs, assistants POST/PUT, assistant current, threads prune, ag-ui, crons POST/PATCH, \
         store items PUT/DELETE, store search, store namespaces, steer, admin budget-raises and \
         resume"
    );
    let events = &doc["paths"]["/v1/threads/{threadId}/events"]["get"];
    assert!(response(&doc, events, "400").is_some(), "bad Last-Event-ID");
}

#[test]
fn streams_are_described_as_server_sent_events_of_observations() {
    let doc = document();
    for (path, method) in [
        ("/v1/threads/{threadId}/events", "get"),
        ("/v1/threads/{threadId}/runs", "post"),
        ("/v1/suspensions/{suspensionId}/resume", "post"),
    ] {
        let content = &doc["paths"][path][method]["responses"]["200"]["content"];
        let sse = &content[super::EVENT_STREAM];
        // No `schema`: in OpenAPI 3.1 it would describe each event (as a string).
        assert!(sse.get("schema").is_none(), "{method} {path}: {sse}");
        let items = &sse["x-itemSchema"]["oneOf"];
        assert_eq!(
            items[0]["properties"]["data"]["contentSchema"]["$ref"],
            "#/components/schemas/Observation",
            "{method} {path}"
        );
        // Token frames (`tokens=true`): no id, a TokenDelta.
        assert_eq!(items[1]["properties"]["event"]["const"], "token");
        assert_eq!(items[1]["required"], json!(["event", "data"]));
        assert_eq!(
            items[1]["properties"]["data"]["contentSchema"]["$ref"],
            "#/components/schemas/TokenDelta",
            "{method} {path}"
        );
        assert!(
            doc["paths"][path][method]["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "tokens" && p["in"] == "query"),
            "{method} {path} takes tokens"
        );
    }
    let token = &doc["components"]["schemas"]["TokenDelta"];
    assert_eq!(
        token["required"],
        json!(["runId", "phase", "delta"]),
        "{token}"
    );
    let run_200 = &doc["paths"]["/v1/threads/{threadId}/runs"]["post"]["responses"]["200"];
    assert_eq!(
        run_200["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/Run",
        "a repeated idempotency key answers the run as JSON"
    );
}

#[test]
fn the_agui_route_streams_agui_events() {
    let doc = document();
    let op = &doc["paths"]["/v1/ag-ui"]["post"];
    assert_eq!(
        op["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/RunAgentInput"
    );
    let sse = &op["responses"]["200"]["content"][super::EVENT_STREAM];
    assert!(sse.get("schema").is_none(), "{sse}");
    let data = &sse["x-itemSchema"]["properties"]["data"]["contentSchema"];
    let types = data["properties"]["type"]["enum"].as_array().unwrap();
    assert!(types.contains(&json!("RUN_STARTED")) && types.contains(&json!("STATE_DELTA")));
    for status in ["400", "404", "409", "422", "429"] {
        assert!(
            response(&doc, op, status).is_some(),
            "POST /v1/ag-ui lacks {status}"
        );
    }
}

#[test]
fn body_constraints_are_stated() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["CreateRun"]["properties"]["query"]["minLength"], 1);
    assert_eq!(schemas["CreateRun"]["required"], json!(["query"]));
    for body in ["CreateThread", "UpdateThread"] {
        assert_eq!(
            schemas[body]["properties"]["metadata"]["type"],
            json!(["object", "null"]),
            "{body}"
        );
        assert_eq!(schemas[body]["additionalProperties"], false, "{body}");
    }
    assert_eq!(
        schemas["Thread"]["properties"]["metadata"]["type"],
        "object"
    );
    for decision in ["approve", "edit", "reject", "respond"] {
        let name = format!("{}ResumeRequest", super::unions::pascal(decision));
        let variant = &schemas[&name];
        assert_eq!(variant["properties"]["reason"]["maxLength"], 4000, "{name}");
        assert_eq!(
            variant["properties"]["decision"]["const"], decision,
            "{name}"
        );
        assert_eq!(variant["additionalProperties"], false, "{name}");
        assert_eq!(
            schemas["ResumeRequest"]["discriminator"]["mapping"][decision],
            format!("#/components/schemas/{name}")
        );
    }
    assert_eq!(
        schemas["EditResumeRequest"]["required"],
        json!(["modifiedArgs", "decision"])
    );
    assert_eq!(
        schemas["RespondResumeRequest"]["required"],
        json!(["response", "decision"])
    );
}

/// Every `$ref` of the document names a component that exists.
#[test]
fn every_reference_resolves() {
    fn walk(doc: &Value, v: &Value, seen: &mut usize) {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    let pointer = r.strip_prefix('#').expect("a local reference");
                    assert!(doc.pointer(pointer).is_some(), "{r} resolves");
                    *seen += 1;
                }
                map.values().for_each(|c| walk(doc, c, seen));
            }
            Value::Array(items) => items.iter().for_each(|c| walk(doc, c, seen)),
            _ => {}
        }
    }
    let doc = document();
    let mut seen = 0;
    walk(&doc, &doc, &mut seen);
    assert!(seen > 100, "{seen} references");
}

/// No union of the components has an anonymous object variant (a client generator names
/// those `X_type_0`, …, and drops them when their inner names collide), and every union of
/// objects has a discriminator whose mapping names each variant by its tag's `const`.
#[test]
fn every_union_of_objects_is_named_and_discriminated() {
    let doc = document();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut unions = Vec::new();
    for (name, schema) in schemas {
        let Some(items) = schema["oneOf"].as_array() else {
            continue;
        };
        for item in items {
            assert!(
                item.get("$ref").is_some() || item["type"] == "null",
                "{name} has an anonymous variant: {item}"
            );
        }
        let tag = schema["discriminator"]["propertyName"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no discriminator"));
        let mapping = schema["discriminator"]["mapping"].as_object().unwrap();
        assert_eq!(mapping.len(), items.len(), "{name}");
        for (value, target) in mapping {
            let variant = target.as_str().unwrap().rsplit('/').next().unwrap();
            assert_eq!(
                schemas[variant]["properties"][tag]["const"], *value,
                "{variant}"
            );
            assert!(
                schemas[variant]["required"]
                    .as_array()
                    .unwrap()
                    .contains(&json!(tag)),
                "{variant} requires {tag}"
            );
        }
        unions.push(name.as_str());
    }
    assert_eq!(unions, ["Observation", "ResumeRequest", "Stage"]);
}

/// `Observation` is a union over `type` with one named schema per observation type, whose
/// `content` is that type's content schema; a page of observations refers to it.
#[test]
fn each_observation_type_has_its_content_schema() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    let mapping = &schemas["Observation"]["discriminator"]["mapping"];
    for t in ObservationType::ALL {
        let name = super::observations::observation_schema_name(*t);
        assert_eq!(mapping[t.as_str()], format!("#/components/schemas/{name}"));
        let content = schemas[&name]["properties"]["content"]["$ref"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}'s content is named"));
        let content = content.rsplit('/').next().unwrap();
        assert_eq!(schemas[content]["type"], "object", "{content}");
        assert_eq!(schemas[&name]["properties"]["type"]["const"], t.as_str());
    }
    assert_eq!(
        schemas["Page_Observation"]["properties"]["items"]["items"]["$ref"],
        "#/components/schemas/Observation"
    );
    let run = &schemas["Run"]["properties"];
    assert_eq!(
        run["suspension"]["oneOf"][1]["$ref"],
        "#/components/schemas/Suspension"
    );
    assert_eq!(
        run["finalResponse"]["oneOf"][1]["$ref"],
        "#/components/schemas/FinalResponseContent"
    );
}

/// The integer ranges the document states for a config are the ones `validate` enforces.
#[test]
fn config_ranges_are_the_ones_the_server_enforces() {
    let doc = document();
    let props = &doc["components"]["schemas"]["AgentConfig"]["properties"];
    type Setter = fn(&mut AgentConfig, u64);
    let fields: [(&str, Setter); 3] = [
        ("maxIterations", |c, n| c.max_iterations = Some(n as u32)),
        ("maxItems", |c, n| c.max_items = Some(n as u32)),
        ("suspensionTtlSeconds", |c, n| {
            c.suspension_ttl_seconds = Some(n)
        }),
    ];
    for (name, set) in fields {
        let min = props[name]["minimum"].as_u64().unwrap();
        let max = props[name]["maximum"].as_u64().unwrap();
        let below = min.checked_sub(1).map(|n| (n, false));
        for (n, ok) in below
            .into_iter()
            .chain([(min, true), (max, true), (max + 1, false)])
        {
            let mut c = AgentConfig::default();
            set(&mut c, n);
            assert_eq!(c.validate().is_ok(), ok, "{name} = {n}");
        }
    }
}

#[test]
fn the_page_limit_range_is_the_one_the_server_enforces() {
    let doc = document();
    let limit = &doc["paths"]["/v1/threads"]["get"]["parameters"][0]["schema"];
    let (min, max) = (
        limit["minimum"].as_u64().unwrap() as u32,
        limit["maximum"].as_u64().unwrap() as u32,
    );
    assert!(crate::http::page_limit(Some(min - 1)).is_err());
    assert!(crate::http::page_limit(Some(min)).is_ok());
    assert!(crate::http::page_limit(Some(max)).is_ok());
    assert!(crate::http::page_limit(Some(max + 1)).is_err());
}
