//! Who is calling and what they may do: API keys for services and automation, users with
//! roles and sessions for people, the sign-in form, and the guards server functions use.

pub mod guard;
pub mod keys;
pub mod login;
pub mod password;
pub mod people;
pub mod session;

pub use keys::{ApiKeys, KeyCaller, KeyRole, generate_key};
