//! A page of a list, and the parameters that ask for one: every list of the API pages the same
//! way (`limit`, an opaque `cursor`, `nextCursor`).

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// A page of items.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Page<T: ToSchema> {
    pub items: Vec<T>,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
}

impl<T: ToSchema> Page<T> {
    /// A page from `limit + 1` rows: the extra row only tells that there is a next page, whose
    /// cursor `cursor_of` makes from the page's last item.
    pub fn from_overfetch(mut items: Vec<T>, limit: u32, cursor_of: impl Fn(&T) -> String) -> Self {
        let next_cursor = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(cursor_of)
        } else {
            None
        };
        Page { items, next_cursor }
    }
}

/// Pagination parameters (query string). Unknown parameters are refused (422).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page: 1–200, default 50.
    #[param(minimum = 1, maximum = 200, nullable = false)]
    pub limit: Option<u32>,
    /// `nextCursor` of the previous page (opaque); a cursor this API did not make is refused
    /// (422).
    #[param(min_length = 1, nullable = false)]
    pub cursor: Option<String>,
}
