//! Who is calling and what they may do: API keys for services and automation, users with
//! roles and sessions for people, and the sign-in form. (The guards the dashboard's server
//! functions use are the dashboard's: `app::guard`.)

pub mod keys;
pub mod login;
pub mod password;
pub mod people;
pub mod session;

pub use keys::{ApiKeys, KeyCaller, KeyRole, generate_key};
