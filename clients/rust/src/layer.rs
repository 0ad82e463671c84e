//! A `tower` layer that checks every request before the service sees it: for axum routers
//! (`Router::layer`) and tonic servers (`Server::builder().layer`).
//!
//! ```no_run
//! # use spillway_client::{Client, Failure, FailMode, Identifiers, SpillwayLayer};
//! # fn app(spillway: Client) -> axum::Router {
//! axum::Router::new().layer(SpillwayLayer::new(spillway, "api", |head: &spillway_client::Head| {
//!     let user = head.headers.get("x-user")?.to_str().ok()?;
//!     Some(Identifiers::from([("user".to_owned(), user.to_owned())]))
//! }))
//! # }
//! ```
//!
//! An allowed request goes on, and its response carries `RateLimit-Policy` and `RateLimit`;
//! the leases of a `concurrency` rule are renewed while the service works and its response
//! body is sent, and released once the body's last frame is sent (or the body is dropped:
//! the end user gone, a panic), so a streamed answer holds its slot as long as it streams. A refused one is answered by the layer: an RFC 9457 problem (429 with
//! `Retry-After`, 422, or 503 for a check failing closed), or for gRPC a status
//! (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`) in a trailers-only response.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Extensions, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri};

use crate::leases::Leases;
use crate::{Checker, Client, Decision, Identifiers, Outcome};

/// What the layer sees of a request to name its identifiers and cost.
pub struct Head<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub extensions: &'a Extensions,
}

type Identify = dyn Fn(&Head<'_>) -> Option<Identifiers> + Send + Sync;
type Cost = dyn Fn(&Head<'_>) -> u64 + Send + Sync;

/// How a refused request is answered.
pub trait Refusal<B>: Clone + Send + Sync + 'static {
    fn refuse(&self, decision: &Decision) -> Response<B>;
}

/// An RFC 9457 `application/problem+json` answer (HTTP services).
#[derive(Clone, Copy, Debug, Default)]
pub struct Problem;

impl<B: From<String>> Refusal<B> for Problem {
    fn refuse(&self, decision: &Decision) -> Response<B> {
        let (status, problem) = decision.problem();
        let mut response = Response::new(B::from(problem.to_string()));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        for (name, value) in decision.headers() {
            headers.append(name, value.clone());
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// A gRPC status in a trailers-only response (tonic services).
#[derive(Clone, Copy, Debug, Default)]
pub struct Grpc;

impl<B: Default> Refusal<B> for Grpc {
    fn refuse(&self, decision: &Decision) -> Response<B> {
        // RESOURCE_EXHAUSTED for a limit, UNAVAILABLE for a check that could not be made.
        let (code, message) = match decision.outcome() {
            Outcome::Unavailable { .. } | Outcome::Misconfigured { .. } => {
                ("14", "rate limit check unavailable".to_owned())
            }
            Outcome::TooCostly { .. } => (
                "8",
                "asks for more than the rate limit allows at once".to_owned(),
            ),
            _ => (
                "8",
                match decision.retry_after_secs() {
                    Some(secs) => format!("rate limited: retry in {secs} s"),
                    None => "rate limited".to_owned(),
                },
            ),
        };
        let mut response = Response::new(B::default());
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from_static(code));
        if let Ok(message) = HeaderValue::from_str(&message) {
            headers.insert("grpc-message", message);
        }
        for (name, value) in decision.headers() {
            headers.append(name, value.clone());
        }
        response
    }
}

/// Checks each request against one policy; see the module's documentation. The checker is
/// a [`Client`], or any [`Checker`] (a [`Fake`](crate::testing::Fake) in a service's tests).
#[derive(Clone)]
pub struct SpillwayLayer<R = Problem, C = Client> {
    client: C,
    policy: Arc<str>,
    identify: Arc<Identify>,
    cost: Option<Arc<Cost>>,
    refusal: R,
}

impl<C: Checker> SpillwayLayer<Problem, C> {
    /// Checks `policy` with the identifiers `identify` names; a request it names none for
    /// (`None`) goes on unchecked.
    pub fn new(
        client: C,
        policy: impl Into<String>,
        identify: impl Fn(&Head<'_>) -> Option<Identifiers> + Send + Sync + 'static,
    ) -> Self {
        Self {
            client,
            policy: policy.into().into(),
            identify: Arc::new(identify),
            cost: None,
            refusal: Problem,
        }
    }
}

impl<R, C> SpillwayLayer<R, C> {
    /// Each request's cost (1 unless said).
    pub fn cost(mut self, cost: impl Fn(&Head<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Refusals as gRPC statuses, for a tonic server.
    pub fn grpc(self) -> SpillwayLayer<Grpc, C> {
        SpillwayLayer {
            client: self.client,
            policy: self.policy,
            identify: self.identify,
            cost: self.cost,
            refusal: Grpc,
        }
    }
}

impl<S, R: Clone, C: Clone> tower_layer::Layer<S> for SpillwayLayer<R, C> {
    type Service = SpillwayService<S, R, C>;

    fn layer(&self, inner: S) -> Self::Service {
        SpillwayService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`SpillwayLayer`] wraps around another.
#[derive(Clone)]
pub struct SpillwayService<S, R = Problem, C = Client> {
    inner: S,
    layer: SpillwayLayer<R, C>,
}

impl<S, B, ResBody, R, C> tower_service::Service<Request<B>> for SpillwayService<S, R, C>
where
    C: Checker,
    S: tower_service::Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    ResBody: Send + 'static,
    R: Refusal<ResBody>,
{
    type Response = Response<HeldBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone is the one made ready by poll_ready's caller's next call; this one (ready)
        // serves the request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let head = Head {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        };
        let identifiers = (self.layer.identify)(&head);
        let cost = self.layer.cost.as_ref().map_or(1, |cost| cost(&head));
        let SpillwayLayer {
            client,
            policy,
            refusal,
            ..
        } = self.layer.clone();
        Box::pin(async move {
            let Some(identifiers) = identifiers else {
                return Ok(inner.call(request).await?.map(HeldBody::free));
            };
            let decision = client.check(&policy, &identifiers, cost).await;
            if !decision.allowed() {
                return Ok(refusal.refuse(&decision).map(HeldBody::free));
            }
            // Renewed while the service answers and its body is sent; released (in the
            // background, not delaying the answer) once the body's last frame is sent, or the
            // body or the request is dropped (a client gone, a panic).
            let held = Leases::renewed(client, &decision);
            let mut response = inner.call(request).await?;
            let headers = response.headers_mut();
            for (name, value) in decision.headers() {
                headers.append(name, value.clone());
            }
            Ok(response.map(|body| HeldBody::holding(body, held)))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds its request's leases until its last frame is sent (or it
    /// is dropped), so a streamed answer keeps its `concurrency` slot as long as it streams.
    pub struct HeldBody<B> {
        #[pin]
        body: B,
        held: Option<Box<dyn Send + Sync>>,
    }
}

impl<B> HeldBody<B> {
    fn free(body: B) -> Self {
        Self { body, held: None }
    }

    fn holding<C: Checker>(body: B, leases: Leases<C>) -> Self {
        Self {
            body,
            held: Some(Box::new(leases)),
        }
    }

    /// The body inside.
    pub fn into_inner(self) -> B {
        self.body
    }
}

impl<B: Default> Default for HeldBody<B> {
    fn default() -> Self {
        Self::free(B::default())
    }
}

impl<B: http_body::Body> http_body::Body for HeldBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.body.poll_frame(cx);
        if matches!(frame, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // The body is done: its leases go back now, not when the connection drops it.
            this.held.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
