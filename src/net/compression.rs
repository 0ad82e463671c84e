//! Response compression for what is worth it: pages and large JSON, brotli or gzip as the
//! browser takes it.

/// Pages (HTML over 1 KiB) and large JSON (over 8 KiB: history, audit, a server function's
/// answer) sent brotli- or gzip-compressed when the browser takes it (a page of 40 policies
/// to under a quarter, `tests/it/http_server.rs`). A check's answer (under 1 KiB) and the
/// live streams are sent as they are: compressing them costs more than it saves.
pub fn layer() -> tower_http::compression::CompressionLayer<impl tower_http::compression::Predicate>
{
    use tower_http::compression::{
        Predicate,
        predicate::{DefaultPredicate, SizeAbove},
    };
    let html =
        |_: axum::http::StatusCode,
         _: axum::http::Version,
         headers: &axum::http::HeaderMap,
         _: &axum::http::Extensions| { content_type_is(headers, "text/html") };
    let json =
        |_: axum::http::StatusCode,
         _: axum::http::Version,
         headers: &axum::http::HeaderMap,
         _: &axum::http::Extensions| { content_type_is(headers, "application/json") };
    tower_http::compression::CompressionLayer::new()
        .br(true)
        .gzip(true)
        .quality(tower_http::CompressionLevel::Fastest)
        .compress_when(DefaultPredicate::new().and(Either(
            html.and(SizeAbove::new(1024)),
            json.and(SizeAbove::new(8192)),
        )))
}

fn content_type_is(headers: &axum::http::HeaderMap, media: &str) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(media))
}

/// One predicate or the other.
#[derive(Clone, Copy)]
struct Either<A, B>(A, B);

impl<A: tower_http::compression::Predicate, B: tower_http::compression::Predicate>
    tower_http::compression::Predicate for Either<A, B>
{
    fn should_compress<Body: axum::body::HttpBody>(
        &self,
        response: &axum::http::Response<Body>,
    ) -> bool {
        self.0.should_compress(response) || self.1.should_compress(response)
    }
}
