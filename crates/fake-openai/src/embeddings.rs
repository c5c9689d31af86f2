//! A deterministic OpenAI-compatible `POST /v1/embeddings`: each text becomes a 64-dimension
//! unit vector made from its words, so tests can check ranking by meaning without a model.
//! Words of one [`CONCEPTS`] group (`dog`, `puppy`, `hound`…) share a dimension, so texts
//! about the same thing in different words come out close; any other word lands on a dimension
//! of its own hash, with less weight. [`crate::FakeLlm::embeddings_down`] makes the endpoint
//! answer 503, as a provider outage would.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::{Shared, error_response};

/// How many dimensions every vector has.
pub const DIMENSIONS: usize = 64;

/// Words that mean the same thing, one group per dimension (the first `CONCEPTS.len()`).
pub const CONCEPTS: &[&[&str]] = &[
    &[
        "dog", "dogs", "puppy", "puppies", "canine", "hound", "pooch", "rex",
    ],
    &["cat", "cats", "kitten", "kittens", "feline", "kitty"],
    &[
        "tea", "coffee", "drink", "drinks", "beverage", "espresso", "latte",
    ],
    &[
        "green", "blue", "red", "colour", "color", "colours", "colors",
    ],
    &["car", "cars", "automobile", "vehicle", "drive", "driving"],
    &[
        "food", "pizza", "pasta", "meal", "dinner", "lunch", "eat", "eats",
    ],
    &["music", "song", "songs", "guitar", "piano", "jazz"],
    &["travel", "trip", "flight", "holiday", "vacation", "journey"],
    &["birthday", "born", "anniversary", "date"],
    &["job", "work", "works", "career", "employer", "office"],
];

/// The vector of `text`: concept words weigh 1, other words 0.25 on a hashed dimension;
/// normalized to length 1 (all zeros for a text without words).
pub fn embed(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; DIMENSIONS];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let word = word.to_lowercase();
        match CONCEPTS.iter().position(|g| g.contains(&word.as_str())) {
            Some(dim) => v[dim] += 1.0,
            None => {
                let spare = DIMENSIONS - CONCEPTS.len();
                let dim = CONCEPTS.len() + (fnv1a(word.as_bytes()) % spare as u64) as usize;
                v[dim] += 0.25;
            }
        }
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `POST /v1/embeddings`: `{model, input: string | [string]}` → `{data: [{index, embedding}]}`.
pub(crate) async fn handle(State(shared): State<Arc<Shared>>, Json(req): Json<Value>) -> Response {
    shared.embedding_calls.fetch_add(1, Ordering::Relaxed);
    if shared.embeddings_down.load(Ordering::Relaxed) {
        return error_response(
            503,
            json!({"error": {"message": "embeddings are down (the test said so)"}}).to_string(),
            None,
        );
    }
    let inputs: Vec<String> = match &req["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().unwrap_or_default().to_owned())
            .collect(),
        _ => {
            return error_response(
                400,
                json!({"error": {"message": "`input` must be a string or a list of strings"}})
                    .to_string(),
                None,
            );
        }
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| json!({"object": "embedding", "index": i, "embedding": embed(text)}))
        .collect();
    Json(json!({
        "object": "list",
        "data": data,
        "model": req["model"],
        "usage": {"prompt_tokens": inputs.len(), "total_tokens": inputs.len()}
    }))
    .into_response()
}
