//! envoyproxy/ratelimit's `POST /json`: the request as proto3 JSON (filled in later).
