//! The event streams' responses: no `schema`, and the OpenAPI 3.2 item schema of each event (an
//! observation or a token delta; on `/a2a`, a JSON-RPC response; on `/v1/ag-ui`, an AG-UI event)
//! under `x-itemSchema`.

use serde_json::json;
use utoipa::openapi::Content;

/// The description of a `text/event-stream` response body: no `schema` (OpenAPI 3.1 has no way
/// to describe a stream's items, and a `schema` there describes each event, as a tool reads it),
/// and in `x-itemSchema` what OpenAPI 3.2's `itemSchema` says: each event's `id`, `event` and
/// `data`, whose content is one `Observation` (or, with `tokens=true`, a `TokenDelta`). OpenAPI
/// 3.1 allows the key only as an extension (`x-`); its value is the 3.2 item schema as written.
pub(super) fn event_stream_content() -> Content {
    serde_json::from_value(json!({
        "example": "id: 1\nevent: RUN_STARTED\ndata: {\"id\":\"0196…\",\"seq\":1,\"threadId\":\"t1\",\
            \"runId\":\"0196…\",\"parentId\":null,\"type\":\"RUN_STARTED\",\"title\":\"Run started\",\
            \"content\":{\"query\":\"What is 2+2?\",\"provider\":\"offline\",\"model\":null,\
            \"attempt\":1},\"createdAt\":\"2025-01-01T00:00:00Z\"}\n\n",
        "x-itemSchema": {
            "description": "Server-Sent Events, one per observation: `id: <seq>`, `event: <observation \
                type>`, `data: <the Observation as JSON>`. Comment lines (`: keep-alive`) come every \
                `PES_SSE_KEEPALIVE_SECONDS` (15 s by default). Reconnect with `Last-Event-ID: <last \
                id seen>` to continue without a gap or a duplicate. A client that asked for tokens \
                (`tokens=true`) also gets `event: token` frames without `id:` (`data: <a \
                TokenDelta>`), never stored and never replayed.",
            "oneOf": [
                {
                    "type": "object",
                    "description": "An observation.",
                    "required": ["id", "event", "data"],
                    "properties": {
                        "id": {"type": "string", "description": "The observation's `seq`."},
                        "event": {"$ref": "#/components/schemas/ObservationType"},
                        "data": {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": {"$ref": "#/components/schemas/Observation"},
                        },
                    },
                },
                {
                    "type": "object",
                    "description": "A token delta (`tokens=true` only): no `id`.",
                    "required": ["event", "data"],
                    "properties": {
                        "event": {"const": "token"},
                        "data": {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": {"$ref": "#/components/schemas/TokenDelta"},
                        },
                    },
                },
            ],
        },
    }))
    .expect("a media type object")
}

/// The description of `/a2a`'s event streams (as [`event_stream_content`]): each event's `data`
/// is a JSON-RPC response.
pub(super) fn a2a_stream_content() -> Content {
    serde_json::from_value(json!({
        "x-itemSchema": {
            "description": "Server-Sent Events, one per task update: `id: <seq>` (the observation \
                it comes from; the first event, the task itself, has the seq it was read at), \
                `data: <a JSON-RPC response>` whose `result` is a v1.0 `StreamResponse` \
                (`{\"task\"}`, `{\"statusUpdate\"}`, `{\"artifactUpdate\"}`) or, for the v0.3 \
                methods, the bare v0.3 object with its `kind`. The stream ends when the task \
                ends or needs input.",
            "type": "object",
            "required": ["id", "data"],
            "properties": {
                "id": {"type": "string"},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {"$ref": "#/components/schemas/JsonRpcResponse"},
                },
            },
        },
    }))
    .expect("a media type object")
}

/// The AG-UI event types `POST /v1/ag-ui` sends.
const AGUI_EVENT_TYPES: [&str; 14] = [
    "RUN_STARTED",
    "RUN_FINISHED",
    "RUN_ERROR",
    "STEP_STARTED",
    "STEP_FINISHED",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "STATE_SNAPSHOT",
    "STATE_DELTA",
];

/// The description of `/v1/ag-ui`'s stream (as [`event_stream_content`]): each event's `data` is
/// one AG-UI 1.0 event, as the protocol's own schema defines it.
pub(super) fn agui_stream_content() -> Content {
    serde_json::from_value(json!({
        "example": "data: {\"type\":\"RUN_STARTED\",\"threadId\":\"t1\",\"runId\":\"r1\",\
            \"protocolVersion\":\"1.0\",\"metadata\":{\"pes\":{\"threadId\":\"t1\",\
            \"runId\":\"0196…\",\"seq\":0}},\"timestamp\":1735689600000}\n\n",
        "x-itemSchema": {
            "description": "Server-Sent Events, one AG-UI 1.0 event each (the protocol's schema: \
                https://ag-ui.com/spec/1.0/schema.json), camelCase, optional fields left out. \
                `data:` is the event; `id:` (on the last event an observation gave) is that \
                observation's `seq`, to reconnect after with `Last-Event-ID`. Comment lines \
                (`: keep-alive`) come every `PES_SSE_KEEPALIVE_SECONDS`. The stream opens with \
                `RUN_STARTED` and ends after `RUN_FINISHED` or `RUN_ERROR`.",
            "type": "object",
            "required": ["data"],
            "properties": {
                "id": {"type": "string", "description": "An observation's `seq`."},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": {
                        "type": "object",
                        "description": "An AG-UI event.",
                        "required": ["type"],
                        "properties": {"type": {"enum": AGUI_EVENT_TYPES}},
                    },
                },
            },
        },
    }))
    .expect("a media type object")
}

/// The description of `/mcp`'s event streams: each event's `data` is one JSON-RPC message.
pub(super) fn mcp_stream_content() -> Content {
    serde_json::from_value(json!({
        "x-itemSchema": {
            "description": "Server-Sent Events of the MCP streamable HTTP transport: each `data:` \
                one JSON-RPC message (progress notifications while a tool call runs, then its \
                response), as the Model Context Protocol defines them.",
            "type": "object",
            "required": ["data"],
            "properties": {
                "id": {"type": "string"},
                "data": {"type": "string", "contentMediaType": "application/json"},
            },
        },
    }))
    .expect("a media type object")
}
