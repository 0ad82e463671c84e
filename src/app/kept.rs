//! What a person typed into a form whose save failed, kept when JavaScript is off.
//!
//! A hydrated form keeps its fields itself (the page does not reload). A plain form post
//! reloads the page, which would come back empty, so a failed save sends the browser back
//! with the typed values and the error in the address (`kept=`, JSON, percent-encoded),
//! and the form fills itself from there. Passwords and secrets are never put in an
//! address: the form asks for them again. (The policy editor has its own, richer draft.)

use std::collections::BTreeMap;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

/// A failed form's values and error.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    /// Which form on the page (its id), so two forms do not fill each other.
    pub form: String,
    pub values: BTreeMap<String, String>,
    /// The field the save refused (empty for none) and why.
    pub field: String,
    pub message: String,
}

impl Kept {
    /// The kept values of `form` in a query string, if it carries them.
    pub fn from_search(search: &str, form: &str) -> Option<Self> {
        let raw = crate::domain::query_value(search, "kept")?;
        serde_json::from_str::<Self>(&raw)
            .ok()
            .filter(|k| k.form == form)
    }

    /// The error as a line of its own: `field: message`, or the message alone.
    pub fn error_line(&self) -> String {
        if self.field.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.field, self.message)
        }
    }

    /// The value typed into `name` (empty if none was kept).
    pub fn value(&self, name: &str) -> String {
        self.values.get(name).cloned().unwrap_or_default()
    }
}

/// The kept values of `form` on the current page, if its last save failed without
/// JavaScript.
pub fn use_kept(form: &'static str) -> Memo<Option<Kept>> {
    let location = leptos_router::hooks::use_location();
    Memo::new(move |_| location.search.with(|s| Kept::from_search(s, form)))
}

/// Whether the last post of `form` on the current page succeeded without JavaScript (the
/// address says `done=<form>`): the page shows its success notice from that.
pub fn use_done(form: &'static str) -> Memo<bool> {
    let location = leptos_router::hooks::use_location();
    Memo::new(move |_| {
        location
            .search
            .with(|s| crate::domain::query_value(s, "done").as_deref() == Some(form))
    })
}

/// Where a form posted without JavaScript goes once its server function has answered: on
/// failure back to `page` with `values` and the error kept, landing on the form (`#form`);
/// on success to `page` with `done=<form>` (its notice, and empty fields). Leave secrets out
/// of `values`. A hydrated page is left alone (it shows the answer where it is).
#[cfg(feature = "ssr")]
pub fn answer_form<T>(
    page: &str,
    form: &str,
    values: &[(&str, &str)],
    result: &Result<T, crate::app::error::AppError>,
) {
    let Err(error) = result else {
        crate::app::guard::back_from_a_form(&format!("{page}?done={form}#{form}"));
        return;
    };
    let kept = Kept {
        form: form.to_owned(),
        values: values
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        field: error.field().unwrap_or_default().to_owned(),
        message: error.message(),
    };
    let json = serde_json::to_string(&kept).unwrap_or_default();
    crate::app::guard::back_from_a_form(&format!(
        "{page}?kept={}#{form}",
        crate::domain::percent_encode(&json)
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_values_travel_in_the_address_and_belong_to_one_form() {
        let kept = Kept {
            form: "new-alert".into(),
            values: [("name".to_owned(), "floods & more=?".to_owned())].into(),
            field: "secret".into(),
            message: "must be 16 to 256 characters".into(),
        };
        let search = format!(
            "?x=1&kept={}",
            crate::domain::percent_encode(&serde_json::to_string(&kept).unwrap())
        );
        assert_eq!(Kept::from_search(&search, "new-alert"), Some(kept.clone()));
        assert_eq!(Kept::from_search(&search, "new-user"), None);
        assert_eq!(kept.value("name"), "floods & more=?");
        assert_eq!(kept.value("policy"), "");
        assert_eq!(Kept::from_search("?kept=%7Bnot", "new-alert"), None);
    }
}
