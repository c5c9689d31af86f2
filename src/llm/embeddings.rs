//! Embeddings: text to vectors, for the memory store's semantic search. [`Embedder`] is the seam
//! (the use cases hold one when `PES_EMBEDDINGS_MODEL` is set); [`OpenAiEmbedder`] speaks any
//! OpenAI-compatible `POST {base}/embeddings` (OpenAI, vLLM, Ollama, LiteLLM… and the test
//! double) through the shared [`Transport`]: the same in-flight cap, timeouts and retries of
//! transient failures as model calls.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::openai::{OpenAiConfigError, checked_base};
use super::transport::{
    Exchange, MAX_ERROR_BODY, Retrier, Transport, TransportConfig, is_transient,
};
use super::{LlmError, truncate};

/// Turns texts into vectors.
#[async_trait]
pub trait Embedder: Send + Sync + 'static {
    /// The model: embeddings of different models are never compared.
    fn model(&self) -> &str;

    /// One vector per text, in order.
    ///
    /// # Errors
    /// [`LlmError::Unavailable`] when the provider cannot be reached (after retries);
    /// [`LlmError::Rejected`] for a request it refuses; [`LlmError::BadReply`].
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError>;
}

/// An OpenAI-compatible embeddings endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiEmbedder {
    endpoint: String,
    api_key: Option<String>,
    model: String,
    transport: Transport,
}

impl OpenAiEmbedder {
    /// An embedder of `model` at `{base_url}/embeddings` (no network call is made).
    ///
    /// # Errors
    /// A base URL that is not http(s), an empty model, or an HTTP client that cannot be built.
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        model: &str,
        transport: TransportConfig,
    ) -> Result<Self, OpenAiConfigError> {
        let base = checked_base(base_url)?;
        if model.trim().is_empty() {
            return Err(OpenAiConfigError::EmptyModel);
        }
        Ok(Self {
            endpoint: format!("{base}/embeddings"),
            api_key,
            model: model.trim().to_owned(),
            transport: Transport::new(TransportConfig {
                stream: false,
                ..transport
            })?,
        })
    }

    /// The URL requests are POSTed to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

#[async_trait]
impl Embedder for OpenAiEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, LlmError> {
        if texts.is_empty() {
            return Ok(vec![]);
        }
        let body = json!({"model": self.model, "input": texts, "encoding_format": "float"});
        let mut retrier = Retrier::new(&self.transport.cfg, "openai", &self.model);
        loop {
            let mut req = self.transport.client.post(&self.endpoint).json(&body);
            if let Some(key) = &self.api_key {
                req = req.bearer_auth(key);
            }
            let (problem, wait) = match self.transport.exchange(req, None).await? {
                Exchange::Reply { status, body, .. } if status.is_success() => {
                    return parse_embeddings(&body, texts.len());
                }
                Exchange::Reply {
                    status,
                    retry_after,
                    body,
                } if is_transient(status) => (
                    format!(
                        "HTTP {}: {}",
                        status.as_u16(),
                        truncate(&body, MAX_ERROR_BODY)
                    ),
                    retry_after,
                ),
                Exchange::Reply { status, body, .. } => {
                    return Err(LlmError::Rejected {
                        status: status.as_u16(),
                        body: truncate(&body, MAX_ERROR_BODY),
                    });
                }
                Exchange::Failed(problem) => (problem, None),
                Exchange::Streamed => ("an unexpected streamed reply".to_owned(), None),
            };
            retrier.transient(problem, wait).await?;
        }
    }
}

/// The vectors of an embeddings reply (`{data: [{index, embedding}]}`), in input order.
///
/// # Errors
/// [`LlmError::BadReply`] when it is not that, or holds another number of vectors.
fn parse_embeddings(body: &str, expected: usize) -> Result<Vec<Vec<f32>>, LlmError> {
    let bad = |why: &str| {
        LlmError::BadReply(format!(
            "embeddings reply {why}: {}",
            truncate(body, MAX_ERROR_BODY)
        ))
    };
    let v: Value = serde_json::from_str(body).map_err(|_| bad("is not JSON"))?;
    let data = v["data"]
        .as_array()
        .ok_or_else(|| bad("has no `data` list"))?;
    let mut out: Vec<(u64, Vec<f32>)> = Vec::with_capacity(data.len());
    for (i, d) in data.iter().enumerate() {
        let index = d["index"].as_u64().unwrap_or(i as u64);
        let vector = d["embedding"]
            .as_array()
            .ok_or_else(|| bad("has an entry without an `embedding` list"))?
            .iter()
            .map(|x| x.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| bad("has an embedding that is not all numbers"))?;
        out.push((index, vector));
    }
    if out.len() != expected {
        return Err(bad(&format!(
            "holds {} vectors for {expected} texts",
            out.len()
        )));
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, v)| v).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_in_input_order() {
        let body = r#"{"data":[{"index":1,"embedding":[0.5,1]},{"index":0,"embedding":[2,3]}]}"#;
        assert_eq!(
            parse_embeddings(body, 2).unwrap(),
            vec![vec![2.0, 3.0], vec![0.5, 1.0]]
        );
        assert!(parse_embeddings(body, 3).is_err());
        assert!(parse_embeddings("nope", 1).is_err());
        assert!(parse_embeddings(r#"{"data":[{"embedding":["x"]}]}"#, 1).is_err());
    }
}
