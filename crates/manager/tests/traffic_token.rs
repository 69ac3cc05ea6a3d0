//! The traffic-token refresh route end to end over real HTTP: the manager's API and the real
//! gateway served on loopback over one store (the gateway's route table is what the API waits
//! for), and a loopback server standing in for the sandbox's port.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Client;
use futures::future::BoxFuture;
use oka_api::{Sandbox, annotations};
use oka_gateway::{DialError, Dialer, Gateway, GatewayConfig};
use oka_store::embedded::EmbeddedStore;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The gateway's routes as the API waits for them (`oka serve` glues them the same way).
struct Routes(Gateway<EmbeddedStore>);

impl oka_manager::api::RouteWaiter for Routes {
    fn wait_routed<'a>(&'a self, id: &'a str, timeout: Duration) -> BoxFuture<'a, bool> {
        Box::pin(self.0.wait_routed(id, timeout))
    }

    fn wait_version<'a>(
        &'a self,
        id: &'a str,
        version: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, bool> {
        Box::pin(self.0.wait_version(id, version, timeout))
    }
}

/// Every sandbox port is the one loopback server.
struct Loopback(SocketAddr);

impl Dialer for Loopback {
    fn dial<'a>(
        &'a self,
        _: &'a Sandbox,
        port: u16,
    ) -> BoxFuture<'a, Result<TcpStream, DialError>> {
        Box::pin(async move {
            TcpStream::connect(self.0).await.map_err(|e| DialError::from_connect(port, e))
        })
    }
}

/// A server answering every request 200 `sandbox`, one request per connection.
async fn sandbox_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nsandbox",
                    )
                    .await;
            });
        }
    });
    addr
}

/// The status of a request through the gateway to sandbox `id`, with `token` if any.
async fn through_gateway(gateway: SocketAddr, id: &str, token: Option<&str>) -> u16 {
    let stream = TcpStream::connect(gateway).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::get("/health")
        .header("host", gateway.to_string())
        .header("e2b-sandbox-id", id)
        .header("e2b-sandbox-port", "49983");
    if let Some(token) = token {
        request = request.header("e2b-traffic-access-token", token);
    }
    let request = request.body(http_body_util::Empty::<axum::body::Bytes>::new()).unwrap();
    sender.send_request(request).await.unwrap().status().as_u16()
}

async fn json_of(
    client: &mut Client,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, Value) {
    let (status, _, bytes) = client.send(method, path, body).await;
    (status.as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_refreshed_token_passes_the_gateway_at_once_and_replaces_the_old_one() {
    let port = sandbox_port().await;
    let slot = Arc::new(Mutex::new(None));
    let gateway_slot = Arc::clone(&slot);
    let api = common::api_with_state(
        3,
        |config| config.traffic_token_validity = Duration::from_secs(3600),
        move |state| {
            let gateway = Gateway::start(
                state.store.clone(),
                GatewayConfig::new(""),
                Arc::new(Loopback(port)),
            );
            *gateway_slot.lock().unwrap() = Some(gateway.clone());
            state.with_routes(Arc::new(Routes(gateway)))
        },
    )
    .await;
    let gateway = slot.lock().unwrap().take().unwrap();
    gateway.wait_ready().await;
    let gateway_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway_addr = gateway_listener.local_addr().unwrap();
    tokio::spawn(oka_gateway::serve(gateway_listener, gateway, std::future::pending()));
    let api_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_addr = api_listener.local_addr().unwrap();
    let router = api.router.clone();
    tokio::spawn(async move { axum::serve(api_listener, router).await });
    let mut client = Client::connect(api_addr).await;

    let create =
        json!({"templateID": "base", "network": {"allowPublicTraffic": false}}).to_string();
    let (status, created) = json_of(&mut client, "POST", "/v2/sandboxes", Some(&create)).await;
    assert_eq!(status, 201, "{created}");
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    let first = created["trafficAccessToken"].as_str().unwrap().to_owned();
    assert_eq!(through_gateway(gateway_addr, &id, Some(&first)).await, 200);
    assert_eq!(through_gateway(gateway_addr, &id, None).await, 403);

    let path = format!("/sandboxes/{id}/traffic-access-token");
    let (status, refreshed) = json_of(&mut client, "POST", &path, None).await;
    assert_eq!(status, 200, "{refreshed}");
    let keys: Vec<&String> = refreshed.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["trafficAccessToken", "trafficAccessTokenExpiration"]);
    let second = refreshed["trafficAccessToken"].as_str().unwrap().to_owned();
    assert!(uuid_like(&second), "{second}");
    let expiration: jiff::Timestamp =
        refreshed["trafficAccessTokenExpiration"].as_str().unwrap().parse().unwrap();
    assert!(refreshed["trafficAccessTokenExpiration"].as_str().unwrap().ends_with('Z'));
    let life = expiration.duration_since(jiff::Timestamp::now()).as_secs();
    assert!((3590..=3600).contains(&life), "{life}");
    // At once, with no wait: the answer came after the gateway had the new version.
    assert_eq!(through_gateway(gateway_addr, &id, Some(&second)).await, 200);
    assert_eq!(through_gateway(gateway_addr, &id, Some(&first)).await, 403, "replaced");
    let stored = api.index.by_id(&id).unwrap();
    let notes = stored.metadata.annotations.as_ref().unwrap();
    assert_eq!(
        notes[annotations::TRAFFIC_ACCESS_TOKEN_SHA256],
        oka_manager::api::keys::key_hash(&second)
    );
    assert!(!serde_json::to_string(notes).unwrap().contains(&second), "only the hash is kept");

    // The reference's path, under `/kruise/api`.
    let (status, third) = json_of(&mut client, "POST", &format!("/kruise/api{path}"), None).await;
    assert_eq!(status, 200, "{third}");
    let third = third["trafficAccessToken"].as_str().unwrap().to_owned();
    assert_eq!(through_gateway(gateway_addr, &id, Some(&third)).await, 200);
    assert_eq!(through_gateway(gateway_addr, &id, Some(&second)).await, 403);

    // Concurrent refreshes share one token.
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Client::connect(api_addr).await);
    }
    let answers =
        futures::future::join_all(clients.iter_mut().map(|c| json_of(c, "POST", &path, None)))
            .await;
    let tokens: std::collections::HashSet<String> = answers
        .iter()
        .map(|(status, body)| {
            assert_eq!(*status, 200, "{body}");
            body["trafficAccessToken"].as_str().unwrap().to_owned()
        })
        .collect();
    let passing: Vec<&String> = tokens.iter().collect();
    assert_eq!(
        through_gateway(gateway_addr, &id, Some(passing[tokens.len() - 1])).await,
        200,
        "{tokens:?}"
    );
    assert_eq!(tokens.len(), 1, "one issuance for concurrent callers: {tokens:?}");

    // A sandbox that does not require traffic auth, an unknown one, no key.
    let open = json!({"templateID": "base"}).to_string();
    let (_, public) = json_of(&mut client, "POST", "/v2/sandboxes", Some(&open)).await;
    let public_path =
        format!("/sandboxes/{}/traffic-access-token", public["sandboxID"].as_str().unwrap());
    let (status, refused) = json_of(&mut client, "POST", &public_path, None).await;
    assert_eq!(
        (status, refused["message"].clone()),
        (409, json!("Sandbox cannot refresh its traffic access token"))
    );
    let (status, missing) =
        json_of(&mut client, "POST", "/sandboxes/nope/traffic-access-token", None).await;
    assert_eq!((status, missing["message"].clone()), (404, json!("Sandbox not found")));
    let reply = common::send(&api.router, "POST", &path, Some("wrong"), &[], None).await;
    assert_eq!(reply.status, 401);
}

fn uuid_like(token: &str) -> bool {
    token.len() == 36 && token.chars().filter(|c| *c == '-').count() == 4
}
