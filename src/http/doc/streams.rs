//! The event streams' responses: no `schema`, and the OpenAPI 3.2 item schema of each event (an
//! observation or a token delta; on `/a2a`, a JSON-RPC response) under `x-itemSchema`.

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
