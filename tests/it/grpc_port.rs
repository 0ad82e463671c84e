//! The gRPC port as anyone on the network meets it, before any key: nothing is read before
//! the key is checked, whatever the content-type; messages, streams and the time to send
//! them are bounded; connections that ask nothing are closed.

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::helpers::{RedisServer, SERVICE_KEY, TestApp, spawn_app_with};

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// An HTTP/2 connection to the app's gRPC port.
async fn connect(app: &TestApp) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(app.grpc.unwrap())
        .await
        .unwrap();
    let (sender, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    sender.ready().await.unwrap()
}

/// Sends `first` of a body that says it is longer and never ends it; answers the
/// response's HTTP status and gRPC status (a trailers-only answer's), as they arrive while
/// the body is still open.
async fn answer_before_the_body_ends(
    app: &TestApp,
    path: &str,
    headers: &[(&str, &str)],
    first: Bytes,
) -> (http::StatusCode, Option<String>) {
    let mut sender = connect(app).await;
    let mut request =
        http::Request::post(format!("http://{}{path}", app.grpc.unwrap())).header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let (response, mut stream) = sender
        .send_request(request.body(()).unwrap(), false)
        .unwrap();
    stream.reserve_capacity(first.len());
    stream.send_data(first, false).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("answered while the body is still open")
        .unwrap();
    let status = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned());
    drop(stream);
    (response.status(), status)
}

/// The prefix of a gRPC message of `declared` bytes, and `n` bytes of it.
fn start_of_message(declared: u32, n: usize) -> Bytes {
    let mut out = vec![0u8];
    out.extend_from_slice(&declared.to_be_bytes());
    out.extend(std::iter::repeat_n(0x0a, n));
    out.into()
}

/// N1 of the second probe: a call with no key was read whole (up to 4 MiB) before the key
/// was checked unless its content-type was exactly `application/grpc`. Now: what is not
/// gRPC is a 415, any gRPC call without a key is UNAUTHENTICATED, both before the body
/// ends; health needs no key; the server allows 128 streams a connection; an authenticated
/// message that stops coming is ended at the header-read timeout.
#[tokio::test]
async fn the_grpc_port_checks_the_key_before_reading_a_body() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_HEADER_READ_TIMEOUT_MS", "800")]).await;
    let big = || start_of_message(4_000_000, 60_000);
    for content_type in ["text/plain", "application/json", "application/grpcx"] {
        let (status, grpc) = answer_before_the_body_ends(
            &app,
            SHOULD_RATE_LIMIT,
            &[("content-type", content_type)],
            big(),
        )
        .await;
        assert_eq!(status, 415, "{content_type}");
        assert_eq!(grpc, None);
    }
    for (path, content_type) in [
        (SHOULD_RATE_LIMIT, "application/grpc"),
        (SHOULD_RATE_LIMIT, "application/grpc+json"),
        (SHOULD_RATE_LIMIT, "application/grpc+proto; charset=x"),
        (
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "application/grpc",
        ),
        ("/no.such.Service/Method", "application/grpc"),
    ] {
        let (status, grpc) =
            answer_before_the_body_ends(&app, path, &[("content-type", content_type)], big()).await;
        assert_eq!(status, 200, "{path} {content_type}");
        assert_eq!(grpc.as_deref(), Some("16"), "{path} {content_type}");
    }
    // A wrong key is refused the same way.
    let (_, grpc) = answer_before_the_body_ends(
        &app,
        SHOULD_RATE_LIMIT,
        &[
            ("content-type", "application/grpc+json"),
            ("authorization", "Bearer not-a-key"),
        ],
        big(),
    )
    .await;
    assert_eq!(grpc.as_deref(), Some("16"));

    // Health answers without a key (orchestrators' probes send none).
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", app.grpc.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(serving.status, 1, "SERVING");

    // The server says how many streams a connection may open.
    let tcp = tokio::net::TcpStream::connect(app.grpc.unwrap())
        .await
        .unwrap();
    let (_sender, mut connection) = h2::client::handshake(tcp).await.unwrap();
    // A PING answered means the server's SETTINGS (its first frame) have been read.
    let mut ping = connection.ping_pong().unwrap();
    tokio::select! {
        pong = ping.ping(h2::Ping::opaque()) => pong.unwrap(),
        ended = &mut connection => panic!("the connection ended: {ended:?}"),
    };
    assert_eq!(connection.max_concurrent_send_streams(), 128);

    // With a key, a message that stops halfway is ended at the header-read timeout.
    let bearer = format!("Bearer {SERVICE_KEY}");
    let started = Instant::now();
    let (status, grpc) = answer_before_the_body_ends(
        &app,
        SHOULD_RATE_LIMIT,
        &[
            ("content-type", "application/grpc"),
            ("authorization", &bearer),
        ],
        start_of_message(100, 10),
    )
    .await;
    let took = started.elapsed();
    assert_eq!((status.as_u16(), grpc.as_deref()), (200, Some("4")));
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

/// Reads from a raw socket until the server closes it; how long that took, or `None` when
/// it was still open after `limit`.
async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(tokio::time::Instant::from_std(started + limit), async {
            stream.read(&mut buf).await
        })
        .await
        {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// N3 of the second probe: 500 silent connections and 100 that sent only the preface were
/// all open after 40 s. Now a connection that starts no call within the header-read
/// timeout (silent, a preface alone, or idle after its calls) is closed; one whose call is
/// in flight is not.
#[tokio::test]
async fn grpc_connections_that_ask_nothing_are_closed() {
    use tokio::io::AsyncWriteExt;
    let redis = RedisServer::start();
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_HEADER_READ_TIMEOUT_MS", "600"),
            ("SPILLWAY_REDIS_TIMEOUT_MS", "5000"),
        ],
    )
    .await;
    let addr = app.grpc.unwrap();
    let limit = Duration::from_secs(6);
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut preface = tokio::net::TcpStream::connect(addr).await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let (silent, preface) = tokio::join!(
        closed_within(&mut silent, limit),
        closed_within(&mut preface, limit)
    );
    let silent = silent.expect("a silent connection is closed");
    let preface = preface.expect("a connection that sent only the preface is closed");
    assert!(silent >= Duration::from_millis(600), "{silent:?}");
    assert!(preface >= Duration::from_millis(600), "{preface:?}");

    // A call in flight for longer than the timeout (Redis paused) is answered, and the
    // connection, idle after it, is then closed.
    crate::envoy::load(&app, "edge_proxy_per_ip", crate::envoy::PER_IP).await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = h2::client::handshake(tcp).await.unwrap();
    let ended = tokio::spawn(async move {
        let _ = connection.await;
        Instant::now()
    });
    let mut sender = sender.ready().await.unwrap();
    redis.pause(1500);
    let bearer = format!("Bearer {SERVICE_KEY}");
    let request = http::Request::post(format!("http://{addr}{SHOULD_RATE_LIMIT}"))
        .header("content-type", "application/grpc")
        .header("authorization", &bearer)
        .header("te", "trailers")
        .body(())
        .unwrap();
    let message = prost::Message::encode_to_vec(&crate::envoy::request(
        "edge_proxy_per_ip",
        vec![crate::envoy::descriptor(&[("remote_address", "10.1.1.1")])],
    ));
    let mut body = start_of_message(message.len() as u32, 0).to_vec();
    body.extend_from_slice(&message);
    let started = Instant::now();
    let (response, mut stream) = sender.send_request(request, false).unwrap();
    stream.send_data(body.into(), true).unwrap();
    let response = response.await.expect("the call in flight is answered");
    let answered = Instant::now();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers().get("grpc-status"), None, "not an error");
    assert!(
        answered - started >= Duration::from_millis(1000),
        "Redis was paused: {:?}",
        answered - started
    );
    drop(response);
    let closed = tokio::time::timeout(limit, ended)
        .await
        .expect("the connection, idle after its call, is closed")
        .unwrap();
    // The port looks at its connections every quarter of the timeout and closes one at its
    // fourth quiet look: from three quarters of the timeout (450 ms) after the call ended,
    // which the client sees a moment later. The bound is half the timeout; a timer that had
    // run on during the call would close the connection at the first look (150 ms).
    assert!(
        closed - answered >= Duration::from_millis(300),
        "closed {:?} after the answer",
        closed - answered
    );
}
