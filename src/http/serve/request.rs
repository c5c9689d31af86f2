//! One request on a connection: its head checked against our limits (414, 431) before routing,
//! its body on a total deadline (408), and its response body holding the connection busy until
//! hyper has written it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Request, Response};
use axum::response::IntoResponse;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use super::Shared;
use super::conn::{Conn, InFlight};

/// Per connection: checks the head, puts the body on its deadline, routes, and keeps the
/// connection busy until the response ends.
#[derive(Clone)]
pub(super) struct RequestService {
    pub(super) conn: Arc<Conn>,
    pub(super) shared: Arc<Shared>,
}

impl hyper::service::Service<Request<Incoming>> for RequestService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let in_flight = self.conn.begin_request();
        let shared = self.shared.clone();
        Box::pin(async move {
            let settings = &shared.settings;
            let response = match settings.check_head(&req) {
                Err(problem) => {
                    // Answered before the router: give it the request id the router would have.
                    let id = req
                        .headers()
                        .get(crate::http::REQUEST_ID)
                        .cloned()
                        .unwrap_or_else(|| {
                            axum::http::HeaderValue::from_str(&uuid::Uuid::new_v4().to_string())
                                .expect("a UUID is a valid header value")
                        });
                    tracing::info!(request_id = ?id, status = %problem.status(), "refused before routing");
                    let mut resp = problem.into_response();
                    resp.headers_mut().insert(crate::http::REQUEST_ID, id);
                    resp
                }
                Ok(()) => {
                    let timeout = settings.body_read_timeout;
                    let req = req.map(|body| Body::new(DeadlineBody::new(body, timeout)));
                    match shared.router.clone().oneshot(req).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    }
                }
            };
            Ok(response.map(|body| TrackedBody {
                body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// A response body that holds its request's [`InFlight`] until hyper drops it.
pub(super) struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The error a request body yields when it has not arrived in full by its deadline; the body
/// extractors map it to 408 `request_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs())]
pub struct BodyReadTimeout(Duration);

impl BodyReadTimeout {
    /// The deadline, in whole seconds.
    pub fn seconds(&self) -> u64 {
        self.0.as_secs()
    }
}

/// A request body that must arrive in full within `timeout` of its creation (the request head).
/// The timer starts only when someone reads the body, so a request without one costs nothing.
struct DeadlineBody {
    body: Incoming,
    deadline: Instant,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl DeadlineBody {
    fn new(body: Incoming, timeout: Duration) -> Self {
        Self {
            body,
            deadline: Instant::now() + timeout,
            timeout,
            sleep: None,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyReadTimeout(this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
