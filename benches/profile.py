#!/usr/bin/env python3
"""Where a check's time goes: a CPU profile of the server under the load of `make bench`'s
1-rule HTTP row (wrk) and its gRPC row (examples/grpcload), pinned as there (server on core
0; Redis and the load on core 1). The server is the release build with the sampling profiler
built in (`--features profile`, src/telemetry/profile.rs); each scenario gets a server of
its own, stopped after the load, which writes its table. Writes benches/PROFILE.md.

Usage: make profile   (or python3 benches/profile.py after building the profiled binary
into target/profile/spillway and examples/grpcload)
"""
import datetime
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as bench  # noqa: E402  (the load generators and helpers of make bench)

ROOT = bench.ROOT
BINARY = os.path.join(ROOT, "target", "profile", "spillway")
SECONDS = bench.SECONDS


def server(redis_url, out):
    port, grpc = bench.free_port(), bench.free_port()
    proc = bench.start([BINARY], 0, {
        "REDIS_URL": redis_url, "LEPTOS_SITE_ADDR": f"127.0.0.1:{port}", "SPILLWAY_GRPC_ADDR": f"127.0.0.1:{grpc}",
        "SPILLWAY_SERVICE_KEYS": bench.SERVICE_KEY, "SPILLWAY_ADMIN_KEYS": bench.ADMIN_KEY,
        "SPILLWAY_SEED_DEMO": "false", "RUST_LOG": "error", "SPILLWAY_REDIS_TIMEOUT_MS": "1000",
        "SPILLWAY_PROFILE_OUT": out})
    bench.wait_port(port)
    bench.wait_port(grpc)
    return proc, port, grpc


def setup(port):
    base = f"http://127.0.0.1:{port}/api/v1"
    big = 1_000_000_000
    status, body = bench.http("PUT", f"{base}/policies/one",
                              {"rules": [{"name": "r", "algorithm": "fixed_window", "limit": big, "window_ms": 60000}]})
    assert status in (200, 201), body
    request = urllib.request.Request(
        f"{base}/envoy/domains/bench", method="PUT",
        data=f"domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {big}}}\n".encode(),
        headers={"Authorization": f"Bearer {bench.ADMIN_KEY}", "Content-Type": "application/yaml"})
    assert urllib.request.urlopen(request).status in (200, 201)


def profile(redis_url, name, load):
    out = tempfile.mktemp(prefix="spillway-profile-", suffix=".md")
    proc, port, grpc = server(redis_url, out)
    setup(port)
    time.sleep(1)
    result = load(port, grpc)
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    with open(out) as f:
        table = f.read()
    os.unlink(out)
    return f"## {name}\n\n{result['rps']:,.0f} checks/s under the profiler; {table}"


def main():
    for path in (BINARY, bench.GRPCLOAD):
        if not os.path.exists(path):
            sys.exit(f"{os.path.relpath(path, ROOT)} is missing (make profile builds it)")
    tmp = tempfile.mkdtemp(prefix="spillway-profile-")
    redis_port = bench.free_port()
    bench.start(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no", "--dir", tmp], 1)
    bench.wait_port(redis_port)
    redis_url = f"redis://127.0.0.1:{redis_port}"
    sections = [
        profile(redis_url, f"{bench.ONE} over HTTP/1.1 (wrk, {bench.CONNECTIONS} connections)",
                lambda port, grpc: bench.wrk(port, {"POLICY": "one"})),
        profile(redis_url, "Envoy ShouldRateLimit over gRPC, 1 limit (examples/grpcload)",
                lambda port, grpc: bench.grpcload(grpc, "bench")),
    ]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report = (f"# Where a check's time goes\n\n`make profile` on {socket.gethostname()} ({os.cpu_count()} cores), "
              f"{when}: {SECONDS} s of load per scenario, {bench.USERS:,} users, the server alone on core 0 "
              "(Redis and the load generator on core 1), sampled about 999 times a second "
              "(src/telemetry/profile.rs; the kernel's timer may deliver fewer, 100 a second on this VM). "
              "\"Own time\" counts the samples whose innermost frame is the function; \"with what it "
              "calls\" those it is anywhere in. Frames of the C library and the "
              "kernel are not resolved: time in system calls shows in the Rust frame that made them.\n\n"
              + "\n".join(sections))
    with open(os.path.join(ROOT, "benches", "PROFILE.md"), "w") as f:
        f.write(report)
    print(report)


if __name__ == "__main__":
    main()
