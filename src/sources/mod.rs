//! Where Envoy domains come from besides the admin API: a folder of domain files kept
//! loaded (a mounted ConfigMap, upstream's runtime folder) and an xDS subscription (Envoy
//! Gateway). Both hand what they read to the service, as any front door does.

pub mod domains_dir;
pub mod xds;
