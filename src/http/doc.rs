//! The OpenAPI 3.1 document: its root (info, tags, the bearer scheme) and the parts every
//! operation shares. Those are added here, in one pass over the finished document, so that no
//! route can forget them: the problem+json answers of the body parser (400, 413, 415, 422), of
//! authentication (401 on `/v1`), of the query parser (422) and of the connection layer (414,
//! 431); `security: []` on the open routes; and the description of every Server-Sent Events
//! response. The routes themselves document only what is theirs (success bodies, 404, 409, …).

use serde_json::json;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, OpenApi as Document, Ref, RefOr, Response};
use utoipa::{Modify, OpenApi};

use super::Problem;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The media type of the observation streams.
pub const EVENT_STREAM: &str = "text/event-stream";

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "pes-server",
        description = "Durable Plan-Execute-Synthesize agents on threads, with an SSE observation stream.\n\n\
Every error is an RFC 9457 problem (`application/problem+json`, the `Problem` schema) with a stable \
`code`. When the server has API keys (`PES_API_KEYS`), every `/v1` route needs \
`Authorization: Bearer <key>`; the health, metrics and documentation routes never do.",
        license(name = "Apache-2.0")
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    components(schemas(Problem)),
    tags(
        (name = "threads", description = "Threads, their agent state and history"),
        (name = "runs", description = "Runs of queries on threads"),
        (name = "observations", description = "The observation log and its SSE stream"),
        (name = "suspensions", description = "Pauses for a person"),
        (name = "health", description = "Liveness, readiness, metrics")
    )
)]
pub(super) struct ApiDoc;

/// A shared problem+json response: (component name, status, description).
type Shared = (&'static str, &'static str, &'static str);

const MALFORMED_JSON: Shared = (
    "MalformedJson",
    "400",
    "The body is not syntactically valid JSON (`malformed_json`).",
);
const UNAUTHORIZED: Shared = (
    "Unauthorized",
    "401",
    "The server has API keys (`PES_API_KEYS`) and the request carries no valid \
     `Authorization: Bearer <key>` (`unauthorized`).",
);
const URI_TOO_LONG: Shared = (
    "UriTooLong",
    "414",
    "The request target is longer than the server reads.",
);
const PAYLOAD_TOO_LARGE: Shared = (
    "PayloadTooLarge",
    "413",
    "The body is larger than `PES_MAX_BODY_BYTES` (`payload_too_large`).",
);
const UNSUPPORTED_MEDIA_TYPE: Shared = (
    "UnsupportedMediaType",
    "415",
    "The body is not sent as `Content-Type: application/json` (`unsupported_media_type`).",
);
const INVALID_BODY: Shared = (
    "InvalidBody",
    "422",
    "Valid JSON that the route does not take: not an object, an unknown or missing field, a \
     value of the wrong type or out of range (`validation_failed`, or a more specific code).",
);
const INVALID_QUERY: Shared = (
    "InvalidQuery",
    "422",
    "A query parameter that is unknown, of the wrong type or out of range, or a cursor this API \
     did not make (`validation_failed`).",
);
const HEADERS_TOO_LARGE: Shared = (
    "HeadersTooLarge",
    "431",
    "The request headers are larger than the server reads.",
);

/// Every shared response, for the components section.
const SHARED: [Shared; 8] = [
    MALFORMED_JSON,
    UNAUTHORIZED,
    URI_TOO_LONG,
    PAYLOAD_TOO_LARGE,
    UNSUPPORTED_MEDIA_TYPE,
    INVALID_BODY,
    INVALID_QUERY,
    HEADERS_TOO_LARGE,
];

fn shared_response((_, status, description): Shared) -> Response {
    let mut response = json!({
        "description": description,
        "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    });
    if status == "401" {
        response["headers"] = json!({"WWW-Authenticate": {
            "description": "Always `Bearer`.",
            "schema": {"type": "string"},
        }});
    }
    serde_json::from_value(response).expect("a response object")
}

/// Add `shared` to `op` unless the route documents that status itself.
fn add(op: &mut Operation, (name, status, _): Shared) {
    op.responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(|| RefOr::Ref(Ref::new(format!("#/components/responses/{name}"))));
}

/// The description of a `text/event-stream` response body, with its events' schema. OpenAPI 3.1
/// has no way to describe the items of a stream (3.2 adds `itemSchema`); the stream is a string
/// here, and `x-itemSchema` says what 3.2 would: each event's `data` is one `Observation`.
fn event_stream_content() -> Content {
    serde_json::from_value(json!({
        "schema": {
            "type": "string",
            "description": "Server-Sent Events, one per observation: `id: <seq>`, \
                `event: <observation type>`, `data: <the Observation as JSON>` (see the \
                `Observation` schema, and `x-itemSchema`). Comment lines (`: keep-alive`) come \
                every `PES_SSE_KEEPALIVE_SECONDS` (15 s by default). Reconnect with \
                `Last-Event-ID: <last id seen>` to continue without a gap or a duplicate.",
        },
        "example": "id: 1\nevent: RUN_STARTED\ndata: {\"id\":\"0196…\",\"seq\":1,\"threadId\":\"t1\",\
            \"runId\":\"0196…\",\"parentId\":null,\"type\":\"RUN_STARTED\",\"title\":\"Run started\",\
            \"content\":{},\"createdAt\":\"2025-01-01T00:00:00Z\"}\n\n",
        "x-itemSchema": {
            "type": "object",
            "description": "One event of the stream (the shape OpenAPI 3.2 gives SSE items).",
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
    }))
    .expect("a media type object")
}

/// Add the shared parts to every operation of `api` (see the module documentation).
pub(super) fn add_shared_parts(api: &mut Document) {
    let components = api.components.get_or_insert_with(Default::default);
    for shared in SHARED {
        components
            .responses
            .insert(shared.0.to_owned(), RefOr::T(shared_response(shared)));
    }
    for (path, item) in api.paths.paths.iter_mut() {
        let guarded = path.starts_with("/v1/");
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for op in ops.into_iter().flatten() {
            if guarded {
                add(op, UNAUTHORIZED);
            } else {
                // The open routes need no key, whatever the document's default says.
                op.security = Some(vec![]);
            }
            if op.request_body.is_some() {
                for shared in [
                    MALFORMED_JSON,
                    PAYLOAD_TOO_LARGE,
                    UNSUPPORTED_MEDIA_TYPE,
                    INVALID_BODY,
                ] {
                    add(op, shared);
                }
            }
            let has_query = op
                .parameters
                .iter()
                .flatten()
                .any(|p| matches!(p.parameter_in, utoipa::openapi::path::ParameterIn::Query));
            if has_query {
                add(op, INVALID_QUERY);
            }
            add(op, URI_TOO_LONG);
            add(op, HEADERS_TOO_LARGE);
            for response in op.responses.responses.values_mut() {
                if let RefOr::T(response) = response
                    && let Some(content) = response.content.get_mut(EVENT_STREAM)
                {
                    *content = event_stream_content();
                }
            }
        }
    }
}
