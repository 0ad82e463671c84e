//! Free TCP ports on the loopback, for the servers each test starts.

use std::net::TcpListener;

/// Returns a TCP port nobody is listening on right now.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// Returns `n` distinct TCP ports nobody is listening on right now (each is held until all are
/// chosen, so none is handed out twice).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}
