//! Who is calling, as HTTP sees it: a service key in a request's headers (`keys`), a
//! person's session cookie and the middleware every dashboard request passes through
//! (`session`), with its cookies (`cookies`), the origin check (`origin`), the security
//! headers (`headers`) and form bodies' limits (`forms`); and the sign-in form (`login`). Which keys and sessions are valid, signing in
//! and the audit records are the service's (`service::keys`, `service::sessions`); the
//! guards the dashboard's server functions use are the dashboard's (`app::guard`).

pub mod cookies;
pub mod forms;
pub mod headers;
pub mod keys;
pub mod login;
pub mod origin;
pub mod server_fns;
pub mod session;
