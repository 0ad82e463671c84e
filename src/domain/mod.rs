//! The pure core: identifiers, rules, policies, decisions, and a reference model of every
//! algorithm. No I/O, no async, no Redis: it compiles to wasm so the dashboard can share it.
