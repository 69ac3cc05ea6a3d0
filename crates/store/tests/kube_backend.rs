//! `KubeStore` against a scripted API server.
//!
//! Each test is a scenario, in the style of kube-rs `mock_tests.rs` and controller-rs
//! `fixtures.rs`: a task plays the API server on a `tower-test` mock service, checks every
//! request the store sends (method, path, query, JSON body) and answers as the API server
//! does (status code, object or `Status` JSON, watch lines streamed in chunks). The client side
//! then checks what the `Store` method returned. A scenario that receives fewer requests than it
//! expects times out; one that receives more closes its service, which the store reports as
//! `Unavailable`.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use kube::client::Body;
use kube::{Client, CustomResource};
use oka_store::kubernetes::KubeStore;
use oka_store::{Deleted, Preconditions, Selector, Store, StoreError, WatchEvent, WatchStream};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

// === the test kind ===

/// A namespaced kind with a status subresource, like every `agents.kruise.io` kind.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "test.oka.dev",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus",
    derive = "PartialEq"
)]
struct WidgetSpec {
    size: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
struct WidgetStatus {
    ready: bool,
}

const WIDGETS: &str = "/apis/test.oka.dev/v1/namespaces/ns1/widgets";
const W1: &str = "/apis/test.oka.dev/v1/namespaces/ns1/widgets/w1";

/// A widget as a caller builds it: a name and a spec, nothing the server sets.
fn widget(name: &str) -> Widget {
    Widget::new(name, WidgetSpec { size: 3 })
}

/// Fixture builders, read as sentences: `widget("w1").labeled("app", "web").stored("11")`.
trait WidgetExt: Sized {
    fn labeled(self, key: &str, value: &str) -> Self;
    /// As the server stores it in `ns1`, at resourceVersion `rv`.
    fn stored(self, rv: &str) -> Self;
    fn finalized(self) -> Self;
    fn ready(self) -> Self;
    /// The server's JSON for this object.
    fn json(&self) -> Value;
    /// The server's JSON for this object, with `deletionTimestamp` set.
    fn deleting_json(&self) -> Value;
}

impl WidgetExt for Widget {
    fn labeled(mut self, key: &str, value: &str) -> Self {
        self.metadata.labels.get_or_insert_default().insert(key.into(), value.into());
        self
    }

    fn stored(mut self, rv: &str) -> Self {
        let name = self.metadata.name.clone().unwrap_or_default();
        self.metadata.namespace = Some("ns1".into());
        self.metadata.uid = Some(format!("uid-{name}"));
        self.metadata.resource_version = Some(rv.into());
        self.metadata.generation.get_or_insert(1);
        self
    }

    fn finalized(mut self) -> Self {
        self.metadata.finalizers = Some(vec!["test.oka.dev/cleanup".into()]);
        self
    }

    fn ready(mut self) -> Self {
        self.status = Some(WidgetStatus { ready: true });
        self
    }

    fn json(&self) -> Value {
        serde_json::to_value(self).expect("a widget serializes")
    }

    fn deleting_json(&self) -> Value {
        let mut value = self.json();
        value["metadata"]["deletionTimestamp"] = json!("2025-06-01T12:00:00Z");
        value["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        value
    }
}

/// An API server `Status` error answer, as `k8s.io/apimachinery/pkg/api/errors` builds it.
fn failure(code: u16, reason: &str, message: &str, name: Option<&str>) -> Value {
    let details = match name {
        Some(name) => json!({"name": name, "group": "test.oka.dev", "kind": "widgets"}),
        None => json!({}),
    };
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "details": details, "code": code,
    })
}

/// The 409 the API server answers when a write's resourceVersion is stale.
fn stale() -> Value {
    failure(
        409,
        "Conflict",
        "Operation cannot be fulfilled on widgets.test.oka.dev \"w1\": the object has been \
         modified; please apply your changes to the latest version and try again",
        Some("w1"),
    )
}

/// The 409 the API server answers when a delete precondition fails.
fn precondition_failed(what: &str, expected: &str, actual: &str) -> Value {
    let message = format!(
        "Operation cannot be fulfilled on widgets.test.oka.dev \"w1\": Precondition failed: \
         {what} in precondition: {expected}, {what} in object meta: {actual}"
    );
    failure(409, "Conflict", &message, Some("w1"))
}

/// The query of a watch without a selector, from `rv`.
fn watch_query(rv: &str) -> [(&str, &str); 4] {
    [
        ("watch", "true"),
        ("timeoutSeconds", "290"),
        ("allowWatchBookmarks", "true"),
        ("resourceVersion", rv),
    ]
}

/// A watch line.
fn event(kind: &str, object: Value) -> String {
    format!("{}\n", json!({"type": kind, "object": object}))
}

fn bookmark(rv: &str) -> String {
    event(
        "BOOKMARK",
        json!({
            "kind": "Widget", "apiVersion": "test.oka.dev/v1",
            "metadata": {"resourceVersion": rv},
        }),
    )
}

// === the scripted API server ===

type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;
type Handle = tower_test::mock::Handle<Request<Body>, Response<ResponseBody>>;
type Responder = tower_test::mock::SendResponse<Response<ResponseBody>>;

/// A store wired to a mock service, and the handle that plays the API server.
fn setup() -> (KubeStore, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<ResponseBody>>();
    (KubeStore::new(Client::new(service, "default")), ApiServer(handle))
}

struct ApiServer(Handle);

/// One request the scenario received, with what it needs to answer it.
struct Call {
    /// The request body as JSON (`Null` when empty).
    body: Value,
    headers: http::HeaderMap,
    respond: Responder,
}

impl ApiServer {
    /// Runs `scenario` as the API server.
    fn run<F, Fut>(self, scenario: F) -> JoinHandle<()>
    where
        F: FnOnce(ApiServer) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(scenario(self))
    }

    /// Waits for the next request and checks its method, path and query parameters (in any
    /// order, decoded).
    async fn expect(&mut self, method: Method, path: &str, query: &[(&str, &str)]) -> Call {
        let next = tokio::time::timeout(Duration::from_secs(5), self.0.next_request());
        let (request, respond) = next
            .await
            .unwrap_or_else(|_| panic!("no {method} {path} within 5s"))
            .unwrap_or_else(|| panic!("the store dropped its client before {method} {path}"));
        assert_eq!(request.method(), method, "method of {}", request.uri());
        assert_eq!(request.uri().path(), path, "path of {method} {}", request.uri());
        let mut got = parse_query(request.uri().query().unwrap_or_default());
        let mut want: Vec<(String, String)> =
            query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "query of {method} {}", request.uri());
        let headers = request.headers().clone();
        let bytes = request.into_body().collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("the request body is JSON")
        };
        Call { body, headers, respond }
    }
}

impl Call {
    /// Answers with a JSON body.
    fn reply(self, code: u16, body: Value) {
        let bytes = Bytes::from(body.to_string());
        let response = Response::builder()
            .status(code)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(bytes).boxed_unsync())
            .expect("a valid response");
        self.respond.send_response(response);
    }

    /// Answers 200 with a body that stays open; the returned sender writes its chunks, and
    /// dropping it ends the body.
    fn reply_stream(self) -> Chunks {
        let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
        let frames = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (Ok::<_, Infallible>(Frame::data(chunk)), rx))
        });
        let response = Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(StreamBody::new(frames).boxed_unsync())
            .expect("a valid response");
        self.respond.send_response(response);
        Chunks(tx)
    }

    /// Fails the request as a broken connection would.
    fn fail_transport(self) {
        self.respond.send_error(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
    }
}

/// The open body of a streamed answer.
struct Chunks(mpsc::UnboundedSender<Bytes>);

impl Chunks {
    fn send(&self, chunk: impl Into<String>) {
        self.0.send(Bytes::from(chunk.into())).expect("the store still reads the body");
    }
}

/// Waits for the scenario to finish, re-raising its panic so its message is what the test
/// reports.
async fn finish(server: JoinHandle<()>) {
    match tokio::time::timeout(Duration::from_secs(10), server).await {
        Err(_) => {
            panic!("the scenario did not finish: the store sent fewer requests than expected")
        }
        Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Ok(Err(e)) => panic!("scenario task failed: {e}"),
        Ok(Ok(())) => {}
    }
}

/// The next watch item, within a deadline.
async fn next_event(
    stream: &mut WatchStream<Widget>,
) -> Option<Result<WatchEvent<Widget>, StoreError>> {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("no watch event within 5s")
}

/// `a=1&b=x%3Dy` → `[(a, 1), (b, x=y)]`.
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("percent escape");
                out.push(u8::from_str_radix(hex, 16).expect("hex digits"));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).expect("UTF-8 query")
}

const FIELD_MANAGER: (&str, &str) = ("fieldManager", "oka");

// === reads and writes ===

#[tokio::test]
async fn create_posts_the_object_and_returns_what_the_server_stored() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        let call = api.expect(Method::POST, WIDGETS, &[FIELD_MANAGER]).await;
        assert_eq!(
            call.body,
            json!({
                "apiVersion": "test.oka.dev/v1", "kind": "Widget",
                "metadata": {"name": "w1", "labels": {"app": "web"}},
                "spec": {"size": 3},
            })
        );
        call.reply(201, widget("w1").labeled("app", "web").stored("11").json());
    });

    let created = store.create("ns1", &widget("w1").labeled("app", "web")).await;
    finish(server).await;

    assert_eq!(created.unwrap(), widget("w1").labeled("app", "web").stored("11"));
}

#[tokio::test]
async fn get_reads_one_object() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        let call = api.expect(Method::GET, W1, &[]).await;
        assert_eq!(call.body, Value::Null);
        call.reply(200, widget("w1").stored("11").ready().json());
    });

    let got = store.get::<Widget>("ns1", "w1").await;
    finish(server).await;

    assert_eq!(got.unwrap(), widget("w1").stored("11").ready());
}

#[tokio::test]
async fn list_sends_the_selector_and_returns_sorted_items_with_the_list_version() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        let call =
            api.expect(Method::GET, WIDGETS, &[("labelSelector", "app=web,tier in (a,b)")]).await;
        call.reply(
            200,
            json!({
                "apiVersion": "test.oka.dev/v1", "kind": "WidgetList",
                "metadata": {"resourceVersion": "42"},
                "items": [widget("w2").stored("30").json(), widget("w1").stored("31").json()],
            }),
        );
        // Across namespaces: the cluster-wide path, no selector.
        let call = api.expect(Method::GET, "/apis/test.oka.dev/v1/widgets", &[]).await;
        call.reply(
            200,
            json!({
                "apiVersion": "test.oka.dev/v1", "kind": "WidgetList",
                "metadata": {"resourceVersion": "43"}, "items": [],
            }),
        );
    });

    let selector: Selector = "app=web, tier in (a, b)".parse().unwrap();
    let in_ns1 = store.list::<Widget>(Some("ns1"), &selector).await;
    let everywhere = store.list::<Widget>(None, &Selector::everything()).await;
    finish(server).await;

    let in_ns1 = in_ns1.unwrap();
    let names: Vec<_> = in_ns1.items.iter().map(|w| w.metadata.name.as_deref().unwrap()).collect();
    assert_eq!(names, ["w1", "w2"]);
    assert_eq!(in_ns1.resource_version, "42");
    let everywhere = everywhere.unwrap();
    assert!(everywhere.items.is_empty());
    assert_eq!(everywhere.resource_version, "43");
}

#[tokio::test]
async fn update_replaces_the_object_at_its_resource_version() {
    let (store, api) = setup();
    let mut changed = widget("w1").stored("11");
    changed.spec.size = 5;
    let sent = changed.clone();
    let server = api.run(|mut api| async move {
        let call = api.expect(Method::PUT, W1, &[FIELD_MANAGER]).await;
        assert_eq!(call.body, sent.json(), "the object is sent as is, resourceVersion included");
        let mut stored = sent.stored("12");
        stored.metadata.generation = Some(2);
        call.reply(200, stored.json());
    });

    let updated = store.update("ns1", &changed).await;
    finish(server).await;

    let updated = updated.unwrap();
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("12"));
    assert_eq!(updated.metadata.generation, Some(2));
    assert_eq!(updated.spec.size, 5);
}

#[tokio::test]
async fn update_without_resource_version_writes_over_the_current_version() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        // Read the current version, write at it; another writer got in first: read and write again.
        api.expect(Method::GET, W1, &[]).await.reply(200, widget("w1").stored("11").json());
        let call = api.expect(Method::PUT, W1, &[FIELD_MANAGER]).await;
        assert_eq!(call.body["metadata"]["resourceVersion"], "11");
        call.reply(409, stale());
        api.expect(Method::GET, W1, &[]).await.reply(200, widget("w1").stored("12").json());
        let call = api.expect(Method::PUT, W1, &[FIELD_MANAGER]).await;
        assert_eq!(call.body["metadata"]["resourceVersion"], "12");
        assert_eq!(call.body["spec"]["size"], 7);
        let mut stored = widget("w1").stored("13");
        stored.spec.size = 7;
        call.reply(200, stored.json());
    });

    let mut unconditional = widget("w1");
    unconditional.spec.size = 7;
    let updated = store.update("ns1", &unconditional).await;
    finish(server).await;

    let updated = updated.unwrap();
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("13"));
    assert_eq!(updated.spec.size, 7);
}

#[tokio::test]
async fn update_status_replaces_the_status_subresource() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        let call = api.expect(Method::PUT, &format!("{W1}/status"), &[FIELD_MANAGER]).await;
        assert_eq!(call.body["status"], json!({"ready": true}));
        assert_eq!(call.body["metadata"]["resourceVersion"], "11");
        call.reply(200, widget("w1").stored("12").ready().json());
    });

    let updated = store.update_status("ns1", &widget("w1").stored("11").ready()).await;
    finish(server).await;

    let updated = updated.unwrap();
    assert_eq!(updated.status, Some(WidgetStatus { ready: true }));
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("12"));
}

// === delete ===

#[tokio::test]
async fn delete_of_finalized_object_returns_it_finalizing() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::GET, W1, &[])
            .await
            .reply(200, widget("w1").stored("11").finalized().json());
        let call = api.expect(Method::DELETE, W1, &[]).await;
        assert_eq!(call.body, json!({"preconditions": {"uid": "uid-w1", "resourceVersion": "11"}}));
        // The API server keeps the object and answers it, deletionTimestamp set.
        call.reply(200, widget("w1").stored("12").finalized().deleting_json());
    });

    let deleted = store.delete::<Widget>("ns1", "w1", &Preconditions::default()).await;
    finish(server).await;

    let Deleted::Finalizing(obj) = deleted.unwrap() else { panic!("expected Finalizing") };
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert_eq!(obj.metadata.resource_version.as_deref(), Some("12"));
}

#[tokio::test]
async fn delete_answered_with_a_status_returns_the_state_read_before_deletion() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::GET, W1, &[]).await.reply(200, widget("w1").stored("11").ready().json());
        let call = api.expect(Method::DELETE, W1, &[]).await;
        assert_eq!(call.body, json!({"preconditions": {"uid": "uid-w1", "resourceVersion": "11"}}));
        // A custom resource without finalizers is removed at once; the answer is a Status.
        call.reply(
            200,
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {
                    "name": "w1", "group": "test.oka.dev", "kind": "widgets", "uid": "uid-w1",
                },
            }),
        );
    });

    let deleted = store.delete::<Widget>("ns1", "w1", &Preconditions::default()).await;
    finish(server).await;

    assert_eq!(deleted.unwrap(), Deleted::Gone(widget("w1").stored("11").ready()));
}

#[tokio::test]
async fn delete_sends_the_callers_preconditions_and_maps_their_failure_to_conflict() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::GET, W1, &[]).await.reply(200, widget("w1").stored("11").json());
        let call = api.expect(Method::DELETE, W1, &[]).await;
        assert_eq!(call.body, json!({"preconditions": {"uid": "uid-w1", "resourceVersion": "9"}}));
        call.reply(409, precondition_failed("ResourceVersion", "9", "11"));
        // No retry: the caller's own precondition failed.
    });

    let pre = Preconditions { uid: Some("uid-w1".into()), resource_version: Some("9".into()) };
    let deleted = store.delete::<Widget>("ns1", "w1", &pre).await;
    finish(server).await;

    match deleted.unwrap_err() {
        StoreError::Conflict { kind, namespace, name, message } => {
            assert_eq!((kind.as_str(), namespace.as_str(), name.as_str()), ("Widget", "ns1", "w1"));
            assert!(message.contains("Precondition failed"), "{message}");
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn delete_of_a_recreated_object_fails_on_the_uid_precondition() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::GET, W1, &[]).await.reply(200, widget("w1").stored("11").json());
        let call = api.expect(Method::DELETE, W1, &[]).await;
        assert_eq!(
            call.body,
            json!({"preconditions": {"uid": "uid-old", "resourceVersion": "11"}})
        );
        call.reply(409, precondition_failed("UID", "uid-old", "uid-w1"));
    });

    let pre = Preconditions { uid: Some("uid-old".into()), resource_version: None };
    let deleted = store.delete::<Widget>("ns1", "w1", &pre).await;
    finish(server).await;

    assert!(deleted.unwrap_err().is_conflict());
}

#[tokio::test]
async fn delete_retries_when_the_object_changes_between_read_and_delete() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::GET, W1, &[]).await.reply(200, widget("w1").stored("11").json());
        let call = api.expect(Method::DELETE, W1, &[]).await;
        assert_eq!(call.body["preconditions"]["resourceVersion"], "11");
        call.reply(409, precondition_failed("ResourceVersion", "11", "12"));
        api.expect(Method::GET, W1, &[]).await.reply(200, widget("w1").stored("12").ready().json());
        let call = api.expect(Method::DELETE, W1, &[]).await;
        assert_eq!(call.body["preconditions"]["resourceVersion"], "12");
        call.reply(
            200,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
        );
    });

    let deleted = store.delete::<Widget>("ns1", "w1", &Preconditions::default()).await;
    finish(server).await;

    assert_eq!(deleted.unwrap(), Deleted::Gone(widget("w1").stored("12").ready()));
}

// === watch ===

#[tokio::test]
async fn watch_streams_events_as_their_chunks_arrive() {
    let (store, api) = setup();
    let (body_tx, body_rx) = tokio::sync::oneshot::channel();
    let server = api.run(|mut api| async move {
        let call = api
            .expect(
                Method::GET,
                WIDGETS,
                &[
                    ("watch", "true"),
                    ("timeoutSeconds", "290"),
                    ("labelSelector", "app=web"),
                    ("allowWatchBookmarks", "true"),
                    ("resourceVersion", "10"),
                ],
            )
            .await;
        body_tx.send(call.reply_stream()).ok().unwrap();
    });

    let selector = Selector::from_labels([("app", "web")]);
    let mut stream = store.watch::<Widget>(Some("ns1"), &selector, "10").await.unwrap();
    finish(server).await;
    let body = body_rx.await.unwrap();

    // One event and half of the next: the first is delivered before the body goes on.
    let modified = event("MODIFIED", widget("w1").stored("12").ready().json());
    let (head, tail) = modified.split_at(modified.len() / 2);
    body.send(event("ADDED", widget("w1").stored("11").json()) + head);
    assert_eq!(
        next_event(&mut stream).await.unwrap().unwrap(),
        WatchEvent::Added(widget("w1").stored("11").into())
    );

    // The rest of it, a bookmark and a deletion, in one chunk.
    body.send(
        tail.to_owned()
            + &bookmark("14")
            + &event("DELETED", widget("w1").stored("15").ready().json()),
    );
    assert_eq!(
        next_event(&mut stream).await.unwrap().unwrap(),
        WatchEvent::Modified(widget("w1").stored("12").ready().into())
    );
    assert_eq!(next_event(&mut stream).await.unwrap().unwrap(), WatchEvent::Bookmark("14".into()));
    assert_eq!(
        next_event(&mut stream).await.unwrap().unwrap(),
        WatchEvent::Deleted(widget("w1").stored("15").ready().into())
    );
}

#[tokio::test]
async fn watch_resumes_from_the_last_version_when_the_server_ends_the_request() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        let body = api.expect(Method::GET, WIDGETS, &watch_query("10")).await.reply_stream();
        body.send(event("ADDED", widget("w1").stored("11").json()));
        drop(body); // the request times out
        let body = api.expect(Method::GET, WIDGETS, &watch_query("11")).await.reply_stream();
        body.send(bookmark("15"));
        drop(body);
        // By now the history before 15 is compacted away.
        api.expect(Method::GET, WIDGETS, &watch_query("15"))
            .await
            .reply(410, failure(410, "Expired", "too old resource version: 15 (20)", None));
    });

    let mut stream =
        store.watch::<Widget>(Some("ns1"), &Selector::everything(), "10").await.unwrap();
    let added = next_event(&mut stream).await;
    let bookmark = next_event(&mut stream).await;
    let expired = next_event(&mut stream).await;
    let end = next_event(&mut stream).await;
    finish(server).await;

    assert_eq!(added.unwrap().unwrap(), WatchEvent::Added(widget("w1").stored("11").into()));
    assert_eq!(bookmark.unwrap().unwrap(), WatchEvent::Bookmark("15".into()));
    assert_eq!(
        expired.unwrap().unwrap_err(),
        StoreError::Gone { requested: "15".into(), oldest: "20".into() }
    );
    assert!(end.is_none(), "the stream ends after its error");
}

#[tokio::test(start_paused = true)]
async fn watch_pauses_before_resending_a_request_that_delivered_nothing() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        let body = api.expect(Method::GET, WIDGETS, &watch_query("10")).await.reply_stream();
        body.send(event("ADDED", widget("w1").stored("11").json()));
        drop(body);
        // The previous request delivered an event: resent at once.
        let resent = tokio::time::Instant::now();
        drop(api.expect(Method::GET, WIDGETS, &watch_query("11")).await.reply_stream());
        assert_eq!(resent.elapsed(), Duration::ZERO);
        // That one closed without a line (a misbehaving proxy): the next waits a second.
        let closed = tokio::time::Instant::now();
        let call = api.expect(Method::GET, WIDGETS, &watch_query("11")).await;
        assert_eq!(closed.elapsed(), Duration::from_secs(1));
        call.reply(410, failure(410, "Expired", "too old resource version: 11 (12)", None));
    });

    let mut stream =
        store.watch::<Widget>(Some("ns1"), &Selector::everything(), "10").await.unwrap();
    let added = next_event(&mut stream).await;
    let expired = next_event(&mut stream).await;
    finish(server).await;

    assert!(matches!(added, Some(Ok(WatchEvent::Added(_)))), "{added:?}");
    assert!(matches!(expired, Some(Err(StoreError::Gone { .. }))), "{expired:?}");
}

#[tokio::test]
async fn expired_watch_maps_to_gone() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        let call = api
            .expect(
                Method::GET,
                WIDGETS,
                &[
                    ("watch", "true"),
                    ("timeoutSeconds", "290"),
                    ("allowWatchBookmarks", "true"),
                    ("resourceVersion", "5"),
                ],
            )
            .await;
        call.reply(410, failure(410, "Expired", "too old resource version: 5 (10)", None));
    });

    let watched = store.watch::<Widget>(Some("ns1"), &Selector::everything(), "5").await;
    finish(server).await;

    let Err(err) = watched else { panic!("expected the watch to fail") };
    assert_eq!(err, StoreError::Gone { requested: "5".into(), oldest: "10".into() });
}

#[tokio::test]
async fn expired_watch_event_maps_to_gone_and_ends_the_stream() {
    let (store, api) = setup();
    let (body_tx, body_rx) = tokio::sync::oneshot::channel();
    let server = api.run(|mut api| async move {
        let call = api
            .expect(
                Method::GET,
                WIDGETS,
                &[
                    ("watch", "true"),
                    ("timeoutSeconds", "290"),
                    ("allowWatchBookmarks", "true"),
                    ("resourceVersion", "5"),
                ],
            )
            .await;
        // The watch cache accepts the request, then reports the expiry as an ERROR event.
        let body = call.reply_stream();
        body.send(event(
            "ERROR",
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too old resource version: 5 (10)", "reason": "Expired", "code": 410,
            }),
        ));
        body_tx.send(body).ok().unwrap();
    });

    let mut stream =
        store.watch::<Widget>(Some("ns1"), &Selector::everything(), "5").await.unwrap();
    let expired = next_event(&mut stream).await;
    let end = next_event(&mut stream).await;
    finish(server).await;
    drop(body_rx);

    assert_eq!(
        expired.unwrap().unwrap_err(),
        StoreError::Gone { requested: "5".into(), oldest: "10".into() }
    );
    assert!(end.is_none(), "the stream ends after its error, without a new request");
}

#[tokio::test]
async fn watch_without_version_starts_at_the_current_state() {
    let (store, api) = setup();
    let (body_tx, body_rx) = tokio::sync::oneshot::channel();
    let server = api.run(|mut api| async move {
        // A one-item metadata list tells the current version; the watch starts there, so the
        // existing objects are not replayed as ADDED.
        let call =
            api.expect(Method::GET, "/apis/test.oka.dev/v1/widgets", &[("limit", "1")]).await;
        let accept = call.headers.get(http::header::ACCEPT).unwrap().to_str().unwrap().to_owned();
        assert!(accept.contains("as=PartialObjectMetadataList"), "{accept}");
        call.reply(
            200,
            json!({
                "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": "77", "continue": "more"},
                "items": [{
                    "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"name": "w0", "namespace": "ns1"},
                }],
            }),
        );
        let call =
            api.expect(Method::GET, "/apis/test.oka.dev/v1/widgets", &watch_query("77")).await;
        let body = call.reply_stream();
        body.send(event("MODIFIED", widget("w1").stored("78").json()));
        body_tx.send(body).ok().unwrap();
    });

    let mut stream = store.watch::<Widget>(None, &Selector::everything(), "").await.unwrap();
    let first = next_event(&mut stream).await;
    finish(server).await;
    drop(body_rx);

    assert_eq!(first.unwrap().unwrap(), WatchEvent::Modified(widget("w1").stored("78").into()));
}

// === error mapping ===

#[tokio::test]
async fn stale_update_maps_to_conflict() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        let call = api.expect(Method::PUT, W1, &[FIELD_MANAGER]).await;
        call.reply(409, stale());
        // No retry: the caller's resourceVersion is the precondition.
    });

    let updated = store.update("ns1", &widget("w1").stored("10")).await;
    finish(server).await;

    match updated.unwrap_err() {
        StoreError::Conflict { kind, namespace, name, message } => {
            assert_eq!((kind.as_str(), namespace.as_str(), name.as_str()), ("Widget", "ns1", "w1"));
            assert!(message.contains("the object has been modified"), "{message}");
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn taken_name_maps_to_already_exists() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::POST, WIDGETS, &[FIELD_MANAGER]).await.reply(
            409,
            failure(409, "AlreadyExists", "widgets.test.oka.dev \"w1\" already exists", Some("w1")),
        );
    });

    let created = store.create("ns1", &widget("w1")).await;
    finish(server).await;

    assert_eq!(
        created.unwrap_err(),
        StoreError::AlreadyExists {
            kind: "Widget".into(),
            namespace: "ns1".into(),
            name: "w1".into()
        }
    );
}

#[tokio::test]
async fn missing_object_maps_to_not_found() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::GET, W1, &[]).await.reply(
            404,
            failure(404, "NotFound", "widgets.test.oka.dev \"w1\" not found", Some("w1")),
        );
        // delete reads first: a missing object fails there.
        api.expect(Method::GET, W1, &[]).await.reply(
            404,
            failure(404, "NotFound", "widgets.test.oka.dev \"w1\" not found", Some("w1")),
        );
    });

    let got = store.get::<Widget>("ns1", "w1").await;
    let deleted = store.delete::<Widget>("ns1", "w1", &Preconditions::default()).await;
    finish(server).await;

    let not_found =
        StoreError::NotFound { kind: "Widget".into(), namespace: "ns1".into(), name: "w1".into() };
    assert_eq!(got.unwrap_err(), not_found);
    assert_eq!(deleted.unwrap_err(), not_found);
}

#[tokio::test]
async fn rejected_object_maps_to_invalid() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::POST, WIDGETS, &[FIELD_MANAGER]).await.reply(
            422,
            failure(
                422,
                "Invalid",
                "Widget.test.oka.dev \"w1\" is invalid: spec.size: Invalid value: -1: \
                 spec.size in body should be greater than or equal to 0",
                Some("w1"),
            ),
        );
    });

    let mut bad = widget("w1");
    bad.spec.size = -1;
    let created = store.create("ns1", &bad).await;
    finish(server).await;

    let StoreError::Invalid(message) = created.unwrap_err() else { panic!("expected Invalid") };
    assert!(message.contains("Widget ns1/w1") && message.contains("spec.size"), "{message}");
}

#[tokio::test]
async fn missing_crd_is_not_mistaken_for_a_missing_object() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::PUT, &format!("{W1}/status"), &[FIELD_MANAGER]).await.reply(
            404,
            failure(404, "NotFound", "the server could not find the requested resource", None),
        );
    });

    let updated = store.update_status("ns1", &widget("w1").stored("11").ready()).await;
    finish(server).await;

    let StoreError::Internal(message) = updated.unwrap_err() else { panic!("expected Internal") };
    assert!(message.contains("widgets.v1.test.oka.dev (status subresource)"), "{message}");
}

#[tokio::test]
async fn unreachable_or_overloaded_server_maps_to_unavailable() {
    let (store, api) = setup();
    let server = api.run(|mut api| async move {
        api.expect(Method::GET, W1, &[]).await.fail_transport();
        api.expect(Method::GET, W1, &[])
            .await
            .reply(503, failure(503, "ServiceUnavailable", "apiserver is shutting down", None));
        api.expect(Method::GET, W1, &[]).await.reply(
            429,
            failure(429, "TooManyRequests", "too many requests, please try again later", None),
        );
    });

    let refused = store.get::<Widget>("ns1", "w1").await;
    let shutting_down = store.get::<Widget>("ns1", "w1").await;
    let throttled = store.get::<Widget>("ns1", "w1").await;
    finish(server).await;

    for (what, result) in [("refused", refused), ("503", shutting_down), ("429", throttled)] {
        let err = result.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{what}: {err:?}");
        assert!(err.is_retryable(), "{what}");
    }
}

#[tokio::test]
async fn malformed_requests_are_rejected_without_a_request() {
    // No scenario: any request would fail with `Unavailable`, not `Invalid`.
    let (store, _api) = setup();

    let mut elsewhere = widget("w1");
    elsewhere.metadata.namespace = Some("ns2".into());
    let mut nameless = widget("w1");
    nameless.metadata.name = None;

    let cases = [
        ("namespace mismatch on create", store.create("ns1", &elsewhere).await.map(drop)),
        ("namespace mismatch on update", store.update("ns1", &elsewhere).await.map(drop)),
        ("update without a name", store.update("ns1", &nameless).await.map(drop)),
        ("empty namespace", store.get::<Widget>("", "w1").await.map(drop)),
        ("empty name", store.get::<Widget>("ns1", "").await.map(drop)),
    ];
    for (what, result) in cases {
        assert!(matches!(result, Err(StoreError::Invalid(_))), "{what}: {result:?}");
    }
}
