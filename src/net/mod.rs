//! The network's edges, below every layer: the listeners' connections (timeouts hyper has
//! no timer for, the budget of calls begun and not yet read), TLS on both ports, which
//! forwarded headers to believe, answers of one HTTP/2 connection written together, and
//! on the way out, which addresses webhooks may reach and how they are signed and sent.

pub mod batched_writes;
pub mod compression;
pub mod connection;
pub mod forwarded;
pub mod metrics_port;
pub mod outbound;
pub mod tls;
pub mod webhooks;
