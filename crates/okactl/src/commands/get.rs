//! `get KIND [NAME] [-o wide|yaml|json|name] [-w] [-l SELECTOR] [-A]`: what `kubectl get`
//! prints, for operators without kubectl.
//!
//! Tables are the server's (`Accept: ...;as=Table`): its columns are the CRDs'
//! `additionalPrinterColumns` with ages already computed, so okactl only lays them out as
//! kubectl does (upper-case headers, priority > 0 only with `-o wide`, NAMESPACE first with
//! `-A`, cells padded by three spaces).

use futures::StreamExt as _;
use kube::api::{GetParams, ListParams, WatchEvent, WatchParams};
use kube::core::Request;
use serde_json::Value;

use crate::args::{GetArgs, Output};
use crate::client;
use crate::kinds::{KINDS, Kind};
use crate::printer::{Printer, layout, tabulate, widths};

/// The media type that asks the API server for a Table (with each row's metadata).
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// The kind `name` names, or an error that lists the kinds okactl knows.
pub fn find_kind(name: &str) -> anyhow::Result<Kind> {
    Kind::find(name).ok_or_else(|| {
        let known: Vec<String> =
            KINDS.iter().map(|k| format!("{} ({})", k.plural, k.short)).collect();
        anyhow::anyhow!(
            "the server doesn't have a resource type \"{name}\" (okactl knows {})",
            known.join(", ")
        )
    })
}

/// Lists or gets, prints, and with `-w` follows the changes.
pub async fn run(
    client: &kube::Client,
    ns: &str,
    args: &GetArgs,
    printer: &Printer,
) -> anyhow::Result<()> {
    let kind = find_kind(&args.kind)?;
    anyhow::ensure!(
        !(args.all_namespaces && args.name.is_some()),
        "a resource cannot be retrieved by name across all namespaces"
    );
    let namespace = (!args.all_namespaces).then_some(ns);
    let request = Request::new(kind.path(namespace));
    let table = matches!(args.output, None | Some(Output::Wide));
    let mut http = match &args.name {
        Some(name) => request.get(name, &GetParams::default())?,
        None => {
            let mut params = ListParams::default();
            if let Some(selector) = &args.selector {
                params = params.labels(selector);
            }
            request.list(&params)?
        }
    };
    if table {
        http.headers_mut().insert(http::header::ACCEPT, http::HeaderValue::from_static(TABLE));
    }
    let answer: Value =
        client.request(http).await.map_err(|err| anyhow::anyhow!(client::message(&err)))?;
    let mut version = answer
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut table_widths = Vec::new();
    if table {
        let rows = table_rows(&answer, args, true);
        if rows.len() <= 1 && !args.watch {
            printer.notice(&no_resources(namespace));
            return Ok(());
        }
        if rows.len() > 1 {
            table_widths = widths(&rows);
            for line in tabulate(&rows) {
                printer.line(&line);
            }
        }
    } else {
        print_objects(&answer, kind, args, namespace, printer)?;
    }
    if !args.watch {
        return Ok(());
    }
    loop {
        let mut params = WatchParams::default();
        if let Some(selector) = &args.selector {
            params = params.labels(selector);
        }
        if let Some(name) = &args.name {
            params = params.fields(&format!("metadata.name={name}"));
        }
        let mut http = request.watch(&params, &version)?;
        if table {
            http.headers_mut().insert(http::header::ACCEPT, http::HeaderValue::from_static(TABLE));
        }
        let events = client
            .request_events::<Value>(http)
            .await
            .map_err(|err| anyhow::anyhow!(client::message(&err)))?;
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let object = match event.map_err(|err| anyhow::anyhow!(client::message(&err)))? {
                WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
                WatchEvent::Bookmark(bookmark) => {
                    version = bookmark.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(status) => anyhow::bail!(status.message),
            };
            let rv = object
                .pointer("/rows/0/object/metadata/resourceVersion")
                .or_else(|| object.pointer("/metadata/resourceVersion"))
                .and_then(Value::as_str);
            if let Some(rv) = rv {
                version = rv.to_owned();
            }
            if table {
                let rows = table_rows(&object, args, table_widths.is_empty());
                if table_widths.is_empty() {
                    table_widths = widths(&rows);
                }
                for row in rows {
                    printer.line(&layout(&row, &table_widths));
                }
            } else {
                print_objects(&object, kind, args, namespace, printer)?;
            }
        }
    }
}

/// kubectl's line for an empty answer (on stderr, and not an error).
fn no_resources(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("No resources found in {ns} namespace."),
        None => "No resources found".to_owned(),
    }
}

/// The header (when `header`) and the rows of a Table, with the columns `args` shows.
fn table_rows(table: &Value, args: &GetArgs, header: bool) -> Vec<Vec<String>> {
    let wide = args.output == Some(Output::Wide);
    let columns: Vec<(usize, String)> = table["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| wide || c["priority"].as_i64().unwrap_or(0) == 0)
        .map(|(i, c)| (i, c["name"].as_str().unwrap_or_default().to_uppercase()))
        .collect();
    let mut rows = Vec::new();
    if header {
        let mut row: Vec<String> = Vec::new();
        if args.all_namespaces {
            row.push("NAMESPACE".to_owned());
        }
        row.extend(columns.iter().map(|(_, name)| name.clone()));
        rows.push(row);
    }
    for item in table["rows"].as_array().into_iter().flatten() {
        let mut row = Vec::new();
        if args.all_namespaces {
            let ns = item.pointer("/object/metadata/namespace").and_then(Value::as_str);
            row.push(ns.unwrap_or_default().to_owned());
        }
        row.extend(columns.iter().map(|(i, _)| cell(&item["cells"][*i])));
        rows.push(row);
    }
    rows
}

/// A cell as kubectl prints it: strings as they are, missing values empty.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => text.lines().next().unwrap_or_default().to_owned(),
        other => other.to_string(),
    }
}

/// An object or a list in `-o yaml|json|name`: a list as kubectl's `List`, one
/// `kind.group/name` line per object for `name`.
fn print_objects(
    answer: &Value,
    kind: Kind,
    args: &GetArgs,
    namespace: Option<&str>,
    printer: &Printer,
) -> anyhow::Result<()> {
    let is_list = answer.get("items").is_some();
    let items: Vec<&Value> = match answer.get("items").and_then(Value::as_array) {
        Some(items) => items.iter().collect(),
        None => vec![answer],
    };
    if is_list && items.is_empty() && args.output == Some(Output::Name) {
        if !args.watch {
            printer.notice(&no_resources(namespace));
        }
        return Ok(());
    }
    match args.output {
        Some(Output::Name) => {
            for item in items {
                let name =
                    item.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                printer.line(&format!("{}/{name}", kind.qualified()));
            }
        }
        Some(Output::Json) => printer.line(&json(&document(answer, is_list, kind))?),
        Some(Output::Yaml) => {
            printer.text(&serde_yaml::to_string(&document(answer, is_list, kind))?)
        }
        None | Some(Output::Wide) => {}
    }
    Ok(())
}

/// What `-o json|yaml` prints: the object, or for a list kubectl's `List` of the items, each
/// with its kind and apiVersion (a list's items carry neither on the wire).
fn document(answer: &Value, is_list: bool, kind: Kind) -> Value {
    if !is_list {
        return answer.clone();
    }
    let items: Vec<Value> = answer["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            let mut item = item.clone();
            if let Value::Object(map) = &mut item {
                map.entry("apiVersion").or_insert_with(|| {
                    Value::String(format!("{}/{}", crate::kinds::GROUP, crate::kinds::VERSION))
                });
                map.entry("kind").or_insert_with(|| Value::String(kind.kind.to_owned()));
            }
            item
        })
        .collect();
    serde_json::json!({
        "apiVersion": "v1",
        "items": items,
        "kind": "List",
        "metadata": { "resourceVersion": "" },
    })
}

/// JSON indented by four spaces, as kubectl prints it.
fn json(value: &Value) -> anyhow::Result<String> {
    use serde::Serialize as _;
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    value.serialize(&mut serializer)?;
    Ok(String::from_utf8(out)?)
}
