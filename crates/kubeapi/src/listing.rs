//! List and watch options as the API server reads them (`labelSelector`, `fieldSelector`,
//! `limit`, `continue`, `resourceVersion`, `resourceVersionMatch`, `watch`,
//! `allowWatchBookmarks`, `sendInitialEvents`, `timeoutSeconds`), and paging.
//!
//! Paging keeps the list it started from: the first page of a list with `limit` stores the
//! whole matching list in a bounded cache, and each `continue` token names it, so every page
//! comes from the same resourceVersion, as on a cluster. A token whose list has left the cache
//! answers 410 Expired with a token that continues over the current state, as the API server
//! answers a token older than its compaction.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use oka_store::{Selector, StoreError};
use serde_json::{Value, json};

use crate::status::ApiStatus;

/// How `resourceVersion` is compared on a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionMatch {
    /// The list is at least as new as `resourceVersion`.
    NotOlderThan,
    /// The list is read exactly at `resourceVersion`.
    Exact,
}

/// One term of a field selector: `metadata.name=x`, `metadata.namespace!=y`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    /// The field's JSON pointer (`/metadata/name`).
    pub pointer: String,
    /// The value compared with.
    pub value: String,
    /// `!=` rather than `=`.
    pub negated: bool,
}

/// A field selector over the fields a custom resource supports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// Parses `fieldSelector` over `fields` (each field's name and JSON pointer: a custom
    /// resource takes `metadata.name` and `metadata.namespace`); any other field answers the
    /// API server's error.
    pub fn parse(text: &str, fields: &[(String, String)]) -> Result<Self, ApiStatus> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, false)
            } else {
                return Err(ApiStatus::bad_request(format!(
                    "invalid field selector: invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            let Some((_, pointer)) = fields.iter().find(|(name, _)| name == field) else {
                return Err(ApiStatus::bad_request(format!("field label not supported: {field}")));
            };
            terms.push(FieldTerm {
                pointer: pointer.clone(),
                value: value.trim().to_owned(),
                negated,
            });
        }
        Ok(FieldSelector { terms })
    }

    /// Whether `obj` matches every term.
    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|t| {
            let value = match obj.pointer(&t.pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (value == t.value) != t.negated
        })
    }

    /// Whether every term reads the name or the namespace only.
    pub fn only_metadata(&self) -> bool {
        self.terms
            .iter()
            .all(|t| t.pointer == "/metadata/name" || t.pointer == "/metadata/namespace")
    }

    /// Whether an object of this namespace and name matches (for selectors that read only
    /// those, see [`FieldSelector::only_metadata`]).
    pub fn matches_name(&self, namespace: &str, name: &str) -> bool {
        self.terms.iter().all(|t| {
            let value = if t.pointer == "/metadata/name" { name } else { namespace };
            (value == t.value) != t.negated
        })
    }

    /// Whether the selector has no terms (matches everything).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

/// The options of a list or watch request.
#[derive(Debug, Clone)]
pub struct ListOptions {
    /// `labelSelector`.
    pub labels: Selector,
    /// The text of `labelSelector`, to tell lists apart.
    pub label_text: String,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// The text of `fieldSelector`.
    pub field_text: String,
    /// `limit` (absent or 0: everything).
    pub limit: Option<usize>,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `resourceVersion`, when given and not empty.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`.
    pub version_match: Option<VersionMatch>,
    /// `watch=true`.
    pub watch: bool,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`.
    pub send_initial_events: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
}

fn invalid_options(field: &str, message: String) -> ApiStatus {
    ApiStatus::invalid("ListOptions", "meta.k8s.io", "", &[(field, message)])
}

fn truthy(value: Option<&String>) -> bool {
    value.is_some_and(|v| v == "true" || v == "1")
}

impl ListOptions {
    /// Reads the options from the query's parameters, refusing what the API server refuses;
    /// `fields` are the fields a field selector takes (see [`FieldSelector::parse`]).
    pub fn parse(
        query: &BTreeMap<String, String>,
        fields: &[(String, String)],
    ) -> Result<Self, ApiStatus> {
        let label_text = query.get("labelSelector").cloned().unwrap_or_default();
        let labels: Selector = if label_text.trim().is_empty() {
            Selector::everything()
        } else {
            label_text.parse().map_err(|e: StoreError| ApiStatus::bad_request(e.to_string()))?
        };
        let field_text = query.get("fieldSelector").cloned().unwrap_or_default();
        let fields = FieldSelector::parse(&field_text, fields)?;
        let limit = match query.get("limit").map(String::as_str) {
            None | Some("") => None,
            Some(text) => match text.parse::<i64>() {
                Ok(n) if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
                Ok(_) => None,
                Err(_) => {
                    return Err(ApiStatus::bad_request(format!(
                        "limit: Invalid value: \"{text}\": must be an integer"
                    )));
                }
            },
        };
        let resource_version = query.get("resourceVersion").filter(|v| !v.is_empty()).cloned();
        let version_match = match query.get("resourceVersionMatch").map(String::as_str) {
            None | Some("") => None,
            Some("NotOlderThan") => Some(VersionMatch::NotOlderThan),
            Some("Exact") => Some(VersionMatch::Exact),
            Some(other) => {
                return Err(invalid_options(
                    "resourceVersionMatch",
                    format!(
                        "Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\""
                    ),
                ));
            }
        };
        let watch = truthy(query.get("watch"));
        if version_match.is_some() && resource_version.is_none() {
            return Err(invalid_options(
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
                    .to_owned(),
            ));
        }
        if watch && version_match == Some(VersionMatch::Exact) {
            return Err(invalid_options(
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
                    .to_owned(),
            ));
        }
        if !watch && query.contains_key("sendInitialEvents") {
            return Err(invalid_options(
                "sendInitialEvents",
                "Forbidden: sendInitialEvents is forbidden for list".to_owned(),
            ));
        }
        let continue_token = query.get("continue").filter(|v| !v.is_empty()).cloned();
        if continue_token.is_some() && resource_version.as_deref().is_some_and(|rv| rv != "0") {
            return Err(invalid_options(
                "resourceVersion",
                "Forbidden: specifying resource version is not allowed when using continue"
                    .to_owned(),
            ));
        }
        let timeout = match query.get("timeoutSeconds").map(String::as_str) {
            None | Some("") => None,
            Some(text) => match text.parse::<u64>() {
                Ok(0) => None,
                Ok(s) => Some(Duration::from_secs(s)),
                Err(_) => {
                    return Err(ApiStatus::bad_request(format!(
                        "timeoutSeconds: Invalid value: \"{text}\": must be a non-negative integer"
                    )));
                }
            },
        };
        Ok(ListOptions {
            labels,
            label_text,
            fields,
            field_text,
            limit,
            continue_token,
            resource_version,
            version_match,
            watch,
            bookmarks: truthy(query.get("allowWatchBookmarks")),
            send_initial_events: truthy(query.get("sendInitialEvents")),
            timeout,
        })
    }

    /// The requested resourceVersion as a number (`None` for none or "0"); anything but a
    /// decimal is refused, as the API server refuses it.
    pub fn requested_version(&self) -> Result<Option<u64>, ApiStatus> {
        match self.resource_version.as_deref() {
            None | Some("0") => Ok(None),
            Some(text) => text.parse::<u64>().map(Some).map_err(|_| {
                invalid_options(
                    "resourceVersion",
                    format!("Invalid value: \"{text}\": invalid resource version"),
                )
            }),
        }
    }

    /// Checks the requested resourceVersion against the list read at `current`.
    pub fn check_version(&self, current: u64) -> Result<(), ApiStatus> {
        let Some(requested) = self.requested_version()? else { return Ok(()) };
        if requested > current {
            return Err(ApiStatus::too_large_resource_version(requested, current));
        }
        if self.version_match == Some(VersionMatch::Exact) && requested < current {
            return Err(ApiStatus::expired(
                "The resourceVersion for the provided list is too old.",
            ));
        }
        Ok(())
    }
}

/// What a `continue` token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continue {
    /// The list's resourceVersion; 0 continues over the current state.
    pub rv: u64,
    /// The key (`namespace/name`) of the last item served.
    pub start: String,
    /// The cached list it continues, when it has one.
    pub list: u64,
}

impl Continue {
    /// The token clients send back.
    pub fn encode(&self) -> String {
        let body =
            json!({"v": "meta.k8s.io/v1", "rv": self.rv, "start": self.start, "list": self.list});
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(body.to_string())
    }

    /// Reads a token, refusing one this server did not make.
    pub fn decode(token: &str) -> Result<Self, ApiStatus> {
        let bad = || {
            ApiStatus::bad_request(format!(
                "continue key is not valid: the continue token `{token}` was not issued by this server"
            ))
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .map_err(|_| bad())?;
        let body: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        if body["v"] != "meta.k8s.io/v1" {
            return Err(bad());
        }
        Ok(Continue {
            rv: body["rv"].as_u64().ok_or_else(bad)?,
            start: body["start"].as_str().ok_or_else(bad)?.to_owned(),
            list: body["list"].as_u64().unwrap_or(0),
        })
    }
}

/// The key items are ordered and continued by: namespace, then name (the store's order).
pub fn item_key(obj: &Value) -> (&str, &str) {
    let text = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
    (text("/metadata/namespace"), text("/metadata/name"))
}

/// `namespace/name`, as a token records the last item served (a namespace has no `/`).
fn key_text(obj: &Value) -> String {
    let (ns, name) = item_key(obj);
    format!("{ns}/{name}")
}

/// A list kept for its next pages.
struct Snapshot {
    id: u64,
    /// What the list was of (resource, namespace, selectors): a token is only good for it.
    scope: String,
    rv: u64,
    items: Arc<Vec<Value>>,
    made: Instant,
}

/// How long a paged list stays continuable (the API server's default compaction interval).
const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
/// At most this many items are kept over all lists, so paging cannot exhaust memory.
const SNAPSHOT_ITEMS: usize = 200_000;

/// The lists being paged through.
#[derive(Default)]
pub struct Snapshots {
    inner: Mutex<SnapshotsInner>,
}

#[derive(Default)]
struct SnapshotsInner {
    next_id: u64,
    lists: VecDeque<Snapshot>,
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The items of this page.
    pub items: Vec<Value>,
    /// The resourceVersion the list was read at.
    pub rv: u64,
    /// The token of the next page, when there is one.
    pub continue_token: Option<String>,
    /// How many items follow this page.
    pub remaining: usize,
}

impl Snapshots {
    /// The first page of `items` (read at `rv`, ordered by [`item_key`]), keeping the list
    /// for its next pages when there are more.
    pub fn first_page(
        &self,
        scope: &str,
        rv: u64,
        items: Vec<Value>,
        limit: Option<usize>,
    ) -> Page {
        let Some(limit) = limit.filter(|&l| l < items.len()) else {
            return Page { items, rv, continue_token: None, remaining: 0 };
        };
        let items = Arc::new(items);
        let id = {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            inner.next_id += 1;
            let id = inner.next_id;
            inner.lists.push_back(Snapshot {
                id,
                scope: scope.to_owned(),
                rv,
                items: Arc::clone(&items),
                made: Instant::now(),
            });
            let mut held: usize = inner.lists.iter().map(|s| s.items.len()).sum();
            while held > SNAPSHOT_ITEMS && inner.lists.len() > 1 {
                if let Some(old) = inner.lists.pop_front() {
                    held -= old.items.len();
                }
            }
            id
        };
        page_after(&items, "", rv, limit, id)
    }

    /// The page after `token` of the list it names. `Ok(None)` for a token that continues over
    /// the current state (see [`current_page`]); 410 Expired, with such a token, when the list
    /// is no longer kept.
    pub fn next_page(
        &self,
        scope: &str,
        token: &Continue,
        limit: Option<usize>,
    ) -> Result<Option<Page>, ApiStatus> {
        let kept = if token.list == 0 {
            None
        } else {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            inner.lists.retain(|s| s.made.elapsed() < SNAPSHOT_TTL);
            inner
                .lists
                .iter()
                .find(|s| s.id == token.list)
                .map(|s| (s.scope.clone(), s.rv, Arc::clone(&s.items)))
        };
        match kept {
            Some((kept_scope, rv, items)) => {
                if kept_scope != scope {
                    return Err(ApiStatus::bad_request(
                        "continue key is not valid: it continues a list of other objects",
                    ));
                }
                Ok(Some(page_after(
                    &items,
                    &token.start,
                    rv,
                    limit.unwrap_or(usize::MAX),
                    token.list,
                )))
            }
            None if token.rv == 0 => Ok(None),
            None => {
                let inconsistent = Continue { rv: 0, start: token.start.clone(), list: 0 };
                Err(ApiStatus::expired(
                    "The provided continue parameter is too old to display a consistent list \
                     result. You can start a new list without the continue parameter, or use the \
                     continue token in this response to retrieve the remainder of the results. \
                     Continuing with the provided token results in an inconsistent list - objects \
                     that were created, modified, or deleted between the time the first chunk was \
                     returned and now may show up in the list.",
                )
                .with_continue(inconsistent.encode()))
            }
        }
    }
}

/// The page after `token` over the current `items` (read at `rv`): an inconsistent
/// continuation, which the client asked for with the token of an expired list.
pub fn current_page(items: &[Value], rv: u64, token: &Continue, limit: Option<usize>) -> Page {
    // Its own token continues inconsistently too (rv 0).
    let page = page_after(items, &token.start, 0, limit.unwrap_or(usize::MAX), 0);
    Page { rv, ..page }
}

/// The `limit` items of `items` after key `start`, and the token for the rest.
fn page_after(items: &[Value], start: &str, rv: u64, limit: usize, list: u64) -> Page {
    let from = match start.split_once('/') {
        Some(start) => items.partition_point(|i| item_key(i) <= start),
        None => 0,
    };
    let rest = &items[from..];
    let take = limit.min(rest.len());
    let page: Vec<Value> = rest[..take].to_vec();
    let remaining = rest.len() - take;
    let continue_token = (remaining > 0).then(|| {
        let last = page.last().map(key_text).unwrap_or_default();
        Continue { rv, start: last, list }.encode()
    });
    Page { items: page, rv, continue_token, remaining }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(ns: &str, name: &str) -> Value {
        json!({"metadata": {"namespace": ns, "name": name}})
    }

    fn names() -> Vec<(String, String)> {
        vec![
            ("metadata.name".into(), "/metadata/name".into()),
            ("metadata.namespace".into(), "/metadata/namespace".into()),
        ]
    }

    fn query(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn keys_order_as_the_store_does() {
        // `a-b` sorts before `a/...` as text, but namespace `a` comes first in the store.
        let items = [obj("a", "z"), obj("a-b", "c")];
        let page = page_after(&items, "a/z", 1, 10, 0);
        assert_eq!(page.items, [obj("a-b", "c")]);
    }

    #[test]
    fn field_selectors_take_name_and_namespace_only() {
        let s = FieldSelector::parse("metadata.name=a,metadata.namespace!=kube-system", &names())
            .unwrap();
        assert!(s.matches(&obj("default", "a")));
        assert!(!s.matches(&obj("default", "b")));
        assert!(!s.matches(&obj("kube-system", "a")));
        let e = FieldSelector::parse("spec.replicas=1", &names()).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, "field label not supported: spec.replicas"));
        assert!(FieldSelector::parse("", &names()).unwrap().is_empty());
    }

    #[test]
    fn options_are_refused_as_the_api_server_refuses_them() {
        let e =
            ListOptions::parse(&query(&[("resourceVersionMatch", "Exact")]), &names()).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: \
             resourceVersionMatch is forbidden unless resourceVersion is provided"
        );
        let o = ListOptions::parse(
            &query(&[("resourceVersion", "10"), ("resourceVersionMatch", "Exact")]),
            &names(),
        )
        .unwrap();
        assert_eq!(o.check_version(10), Ok(()));
        assert_eq!(o.check_version(12).unwrap_err().code, 410);
        assert_eq!(o.check_version(9).unwrap_err().code, 504);
        let o = ListOptions::parse(&query(&[("resourceVersion", "10")]), &names()).unwrap();
        assert_eq!(o.check_version(12), Ok(()));
        let o = ListOptions::parse(&query(&[("resourceVersion", "x")]), &names()).unwrap();
        assert_eq!(o.check_version(12).unwrap_err().code, 422);
    }

    #[test]
    fn pages_walk_one_list_and_a_lost_one_expires_with_a_way_on() {
        let snapshots = Snapshots::default();
        let items: Vec<Value> = (0..5).map(|i| obj("default", &format!("s{i}"))).collect();
        let first = snapshots.first_page("sbx", 7, items.clone(), Some(2));
        assert_eq!(first.items, items[..2]);
        assert_eq!(first.remaining, 3);
        let token = Continue::decode(first.continue_token.as_deref().unwrap()).unwrap();
        let second = snapshots.next_page("sbx", &token, Some(2)).unwrap().unwrap();
        assert_eq!((second.items.as_slice(), second.rv), (&items[2..4], 7));
        let token = Continue::decode(second.continue_token.as_deref().unwrap()).unwrap();
        let last = snapshots.next_page("sbx", &token, Some(2)).unwrap().unwrap();
        assert_eq!((last.items.as_slice(), last.continue_token), (&items[4..], None));
        // Another list's token is refused; a forgotten list expires with an inconsistent token.
        assert_eq!(snapshots.next_page("sbs", &token, Some(2)).unwrap_err().code, 400);
        let lost = Continue { rv: 7, start: "default/s1".into(), list: 99 };
        let e = snapshots.next_page("sbx", &lost, Some(2)).unwrap_err();
        assert_eq!((e.code, e.reason), (410, "Expired"));
        let again = Continue::decode(e.continue_token.as_deref().unwrap()).unwrap();
        assert_eq!(snapshots.next_page("sbx", &again, Some(10)).unwrap(), None);
        let now = current_page(&items, 9, &again, Some(10));
        assert_eq!((now.items.as_slice(), now.rv), (&items[2..], 9));
    }
}
