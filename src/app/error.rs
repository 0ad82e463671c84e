//! What a dashboard server function answers when it does not do what was asked: typed, so a
//! page puts a field's message beside that field without parsing a string.

use leptos::server_fn::{
    codec::JsonEncoding,
    error::{FromServerFnError, ServerFnErrorErr},
};
use serde::{Deserialize, Serialize};

/// A server function's failure, as the page shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AppError {
    /// An input the user can correct: shown beside the form field it names.
    #[error("{field}: {message}")]
    Field { field: String, message: String },
    /// Not signed in, not allowed, or a stale form: said as is.
    #[error("{0}")]
    Refused(String),
    /// Redis could not be reached; nothing was changed.
    #[error("Redis is unavailable; try again")]
    Unavailable,
    /// The call itself failed (network, encoding): the framework's words.
    #[error("{0}")]
    Call(String),
}

impl AppError {
    /// The field an input error names, if it is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            AppError::Field { field, .. } => Some(field),
            _ => None,
        }
    }

    /// What to tell the user (for a field error, without the field's name).
    pub fn message(&self) -> String {
        match self {
            AppError::Field { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        // Arguments that do not decode are the caller's mistake: a 400, not the
        // framework's 500.
        #[cfg(feature = "ssr")]
        if matches!(
            value,
            ServerFnErrorErr::Args(_) | ServerFnErrorErr::MissingArg(_)
        ) {
            crate::app::guard::set_status(axum::http::StatusCode::BAD_REQUEST);
        }
        AppError::Call(value.to_string())
    }
}

/// Constructors that also set the answer's HTTP status (a plain form post keeps its redirect).
#[cfg(feature = "ssr")]
mod answer {
    use axum::http::StatusCode;

    use super::AppError;
    use crate::app::guard::set_status;

    impl AppError {
        /// A 400 naming the form field.
        pub fn bad_input(field: &str, message: impl std::fmt::Display) -> Self {
            set_status(StatusCode::BAD_REQUEST);
            AppError::Field {
                field: field.to_owned(),
                message: message.to_string(),
            }
        }

        /// A refusal with its status (401, 403, 409, 429).
        pub fn refused(status: StatusCode, message: impl std::fmt::Display) -> Self {
            set_status(status);
            AppError::Refused(message.to_string())
        }

        /// A 503 for a failed Redis call, logged with what `context` was doing.
        pub fn unavailable(context: &str, error: impl std::fmt::Display) -> Self {
            tracing::warn!(error = %error, "{context}: Redis call failed");
            set_status(StatusCode::SERVICE_UNAVAILABLE);
            AppError::Unavailable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_error_keeps_its_field_and_message_apart_through_the_wire() {
        let e = AppError::Field {
            field: "rules[0].limit".into(),
            message: "must be at least 1: got 0".into(),
        };
        let wire = serde_json::to_string(&e).unwrap();
        let back: AppError = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.field(), Some("rules[0].limit"));
        // A message that itself holds ": " is not split again.
        assert_eq!(back.message(), "must be at least 1: got 0");
        assert_eq!(AppError::Unavailable.field(), None);
    }
}
