//! A property test over the request types: seeded random JSON bodies (deep, wide, with NUL and
//! multibyte strings, huge and negative numbers, near-miss field names) and random query strings
//! sent to every route that takes them. Whatever arrives, the answer is never a 5xx, every error
//! is problem+json, and the service stays healthy with the data it had.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, spawn};

/// Field names the routes know, so random bodies reach past the unknown-field check.
const NAMES: &[&str] = &[
    "query",
    "config",
    "metadata",
    "threadId",
    "multitaskStrategy",
    "ifNotExists",
    "idempotencyKey",
    "decision",
    "reason",
    "modifiedArgs",
    "response",
    "maxIterations",
    "maxItems",
    "suspensionTtlSeconds",
    "tools",
    "requireApproval",
    "systemPrompt",
    "persona",
    "provider",
    "model",
    "expression",
];

const STRINGS: &[&str] = &[
    "",
    " ",
    "1+1",
    "approve",
    "edit",
    "respond",
    "reject",
    "create",
    "interrupt",
    "calculator",
    "a\u{0}b",
    "😀",
    "é",
    "\u{FFFF}",
    "../../etc",
    "%00",
    "t-1",
];

fn random_string(rng: &mut StdRng) -> String {
    if rng.random_bool(0.7) {
        STRINGS[rng.random_range(0..STRINGS.len())].to_owned()
    } else {
        let len = rng.random_range(0..40);
        (0..len)
            .map(|_| char::from_u32(rng.random_range(0..0x1_0000)).unwrap_or('x'))
            .collect()
    }
}

fn random_value(rng: &mut StdRng, depth: u32) -> Value {
    let pick = if depth > 4 {
        rng.random_range(0..5)
    } else {
        rng.random_range(0..7)
    };
    match pick {
        0 => Value::Null,
        1 => json!(rng.random_bool(0.5)),
        2 => match rng.random_range(0..5) {
            0 => json!(rng.random::<i64>()),
            1 => json!(rng.random::<u64>()),
            2 => json!(rng.random::<f64>() * 1e300),
            3 => json!(-1),
            _ => json!(rng.random_range(0..100)),
        },
        3 | 4 => json!(random_string(rng)),
        5 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => random_object(rng, depth + 1),
    }
}

fn random_object(rng: &mut StdRng, depth: u32) -> Value {
    let mut map = Map::new();
    for _ in 0..rng.random_range(0..5) {
        let key = if rng.random_bool(0.85) {
            NAMES[rng.random_range(0..NAMES.len())].to_owned()
        } else {
            random_string(rng)
        };
        map.insert(key, random_value(rng, depth));
    }
    Value::Object(map)
}

fn encode(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

async fn check(app: &TestApp, what: &str, r: reqwest::Response) {
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("").to_owned())
        .unwrap_or_default();
    let body = r.text().await.unwrap_or_default();
    assert!(status < 500, "{what} answered {status}: {body}");
    if status >= 400 {
        assert_eq!(ct, "application/problem+json", "{what} → {status}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], status, "{what}: {body}");
    }
    let _ = app;
}

async fn random_requests_never_get_a_5xx_or_lose_data(backend: Backend) {
    let app = spawn(backend, None).await;
    let t = app.thread(json!({"threadId": "keep"})).await;
    app.run_wait(&t, "what is 2+3?").await;
    let waiting = app
        .thread(json!({"config": {"requireApproval": ["calculator"]}}))
        .await;
    let run = app.run_wait(&waiting, "what is 2+2?").await;
    let sid = run["suspension"]["suspensionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = app.observations(&t).await;

    let mut rng = StdRng::seed_from_u64(0x0005_eed7);
    for i in 0..150 {
        let body = if rng.random_bool(0.8) {
            random_object(&mut rng, 0)
        } else {
            random_value(&mut rng, 0)
        };
        // Never post to the seeded thread: a random body may be a valid query and change it.
        for path in [
            "/v1/threads".to_owned(),
            format!("/v1/threads/fz-{i}/runs"),
            format!("/v1/suspensions/{sid}/resume"),
        ] {
            let r = app
                .client
                .post(app.url(&path))
                .json(&body)
                .send()
                .await
                .unwrap();
            check(&app, &format!("POST {path} {body}"), r).await;
        }
        let r = app
            .client
            .patch(app.url("/v1/threads/fz-none"))
            .json(&body)
            .send()
            .await
            .unwrap();
        check(&app, &format!("PATCH {body}"), r).await;

        let (k, v) = (
            NAMES[rng.random_range(0..NAMES.len())],
            random_string(&mut rng),
        );
        for name in [
            k, "limit", "cursor", "after", "type", "types", "parentId", "status",
        ] {
            for path in [
                "/v1/threads".to_owned(),
                format!("/v1/threads/{t}/runs"),
                format!("/v1/threads/{t}/messages"),
                format!("/v1/threads/{t}/observations"),
                format!("/v1/threads/{t}/suspensions"),
            ] {
                let url = format!("{}?{name}={}", app.url(&path), encode(&v));
                let r = app.client.get(&url).send().await.unwrap();
                check(&app, &format!("GET {url}"), r).await;
            }
        }
    }
    let (s, _) = app.get("/healthz").await;
    assert_eq!(s, 200);
    assert_eq!(app.observations(&t).await, before, "stored data unchanged");
    app.stop().await;
}
both_stores!(random, random_requests_never_get_a_5xx_or_lose_data);
