//! The one integration-test binary: real `redis-server` processes on free ports, and the
//! real app on port 0. Modules group the tests by feature.

mod helpers;

mod alerts;
mod api;
mod architecture;
mod auth;
mod caller_limits;
mod cli;
mod clients;
mod cluster;
mod cost;
mod dashboard;
mod docs;
mod engine;
mod envoy;
mod faults;
mod fuzz;
mod gateway;
mod grafana;
mod grpc_port;
mod health;
mod history;
mod http_server;
mod inspector;
mod leases;
mod listeners_tls;
mod live;
mod local;
mod memory;
mod memory_bound;
mod openapi;
mod penalty;
mod report;
mod sentinel;
mod service;
mod shared;
mod streaks;
mod tls;
mod traces;
mod unmatched;
mod unused;
mod upstream_env;
mod waiting;
mod wiring;
mod xds;
