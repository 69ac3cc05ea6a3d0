//! The relay over real TCP on loopback: a [`RelayClient`] through a [`RelayServer`] to loopback
//! listeners that stand in for sandbox ports (see `common`). The relay is the subject; the test
//! runtime only maps sandboxes to those listeners and counts its dials.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Fleet, Relay, client, closed_addr, echo, id, ping, token};
use oka_relay::{ClientConfig, RelayClient, RelayError, RelayToken, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ENVD: u16 = 49983;

/// Sends `bytes` to the relay as they are, and returns everything it answers until it closes.
async fn raw(relay: &Relay, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(relay.addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer));
    read.await.unwrap().unwrap();
    String::from_utf8(answer).unwrap()
}

fn scrape(relay: &Relay) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    relay.server.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

#[tokio::test]
async fn a_large_transfer_flows_both_ways_and_a_half_close_is_passed_on() {
    let fleet = Fleet::new();
    fleet.serve("sbx", ENVD, echo(b"").await);
    let relay = Relay::start(fleet, ServerConfig::default()).await;
    let stream = client().connect(relay.addr, &id("sbx"), ENVD).await.unwrap();
    let (mut r, mut w) = stream.into_split();
    let sent: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let expected = [sent.as_slice(), b"<eof>"].concat();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await.unwrap();
        // Our half-close: the sandbox must see end of file and still be able to answer.
        w.shutdown().await.unwrap();
        w
    });
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    let _w = writer.await.unwrap();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "the echoed bytes differ");
    let metrics = scrape(&relay);
    assert!(metrics.contains("oka_relay_connections_total{result=\"ok\"} 1"), "{metrics}");
    assert!(metrics.contains("oka_relay_bytes_total{direction=\"in\"} 8388608"), "{metrics}");
    assert!(metrics.contains("oka_relay_bytes_total{direction=\"out\"} 8388613"), "{metrics}");
    // The traffic is the sandbox's activity, on its port only.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let last = relay.server.activity().last("sbx", &[i32::from(ENVD)]).expect("activity recorded");
    assert!((i64::try_from(now.as_secs()).unwrap() - last).abs() <= 2, "{last}");
    assert_eq!(relay.server.activity().last("sbx", &[1]), None);
    assert_eq!(relay.server.activity().last("other", &[]), None);
}

#[tokio::test]
async fn a_sandbox_that_speaks_first_loses_nothing() {
    let fleet = Fleet::new();
    fleet.serve("sbx", 22, echo(b"SSH-2.0-sandbox\r\n").await);
    let relay = Relay::start(fleet, ServerConfig::default()).await;
    // A "host:port" string works as well as a socket address.
    let mut stream = client().connect(relay.addr.to_string(), &id("sbx"), 22).await.unwrap();
    let mut greeting = [0u8; 17];
    stream.read_exact(&mut greeting).await.unwrap();
    assert_eq!(&greeting, b"SSH-2.0-sandbox\r\n");
    ping(&mut stream, b"hello").await;
}

#[tokio::test]
async fn bytes_sent_right_after_the_header_reach_the_sandbox() {
    let fleet = Fleet::new();
    fleet.serve("sbx", ENVD, echo(b"").await);
    let relay = Relay::start(fleet, ServerConfig::default()).await;
    let mut stream = TcpStream::connect(relay.addr).await.unwrap();
    let header = format!("OKA-RELAY/1 {} sbx {ENVD}\nearly", token().expose());
    stream.write_all(header.as_bytes()).await.unwrap();
    let mut answer = [0u8; 8];
    stream.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"OK\nearly");
}

#[tokio::test]
async fn a_closed_port_is_port_closed() {
    let fleet = Fleet::new();
    fleet.serve("sbx", 8080, closed_addr().await);
    let relay = Relay::start(fleet.clone(), ServerConfig::default()).await;
    let error = client().connect(relay.addr, &id("sbx"), 8080).await.unwrap_err();
    assert!(matches!(error, RelayError::PortClosed { port: 8080 }), "{error:?}");
    assert_eq!(fleet.dials(), 1);
    assert!(scrape(&relay).contains("oka_relay_connections_total{result=\"port_closed\"} 1"));
}

#[tokio::test]
async fn an_unknown_or_stopped_sandbox_is_gone() {
    let fleet = Fleet::new();
    fleet.stop("stopped");
    let relay = Relay::start(fleet, ServerConfig::default()).await;
    for sandbox in ["unknown", "stopped"] {
        let error = client().connect(relay.addr, &id(sandbox), ENVD).await.unwrap_err();
        match error {
            RelayError::SandboxGone(message) => assert!(message.contains(sandbox), "{message}"),
            other => panic!("{sandbox}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_wrong_token_is_unauthorized_and_nothing_is_dialed() {
    let fleet = Fleet::new();
    fleet.serve("sbx", ENVD, echo(b"").await);
    let relay = Relay::start(fleet.clone(), ServerConfig::default()).await;
    let stranger = RelayClient::new(
        RelayToken::new("not-the-token-0123456789abcdef-012345").unwrap(),
        ClientConfig::default(),
    );
    let error = stranger.connect(relay.addr, &id("sbx"), ENVD).await.unwrap_err();
    assert!(matches!(error, RelayError::Unauthorized), "{error:?}");
    assert_eq!(fleet.dials(), 0);
    assert!(scrape(&relay).contains("oka_relay_connections_total{result=\"unauthorized\"} 1"));
}

#[tokio::test]
async fn garbage_oversized_and_foreign_version_headers_are_refused_without_a_dial() {
    let fleet = Fleet::new();
    fleet.serve("sbx", ENVD, echo(b"").await);
    let relay = Relay::start(fleet.clone(), ServerConfig::default()).await;
    let t = token().expose().to_owned();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            "ERR bad-request not an OKA-RELAY header\n",
        ),
        // A TLS client hello: refused on its first byte.
        (b"\x16\x03\x01\x02\x00".to_vec(), "ERR bad-request not an OKA-RELAY header\n"),
        (
            [b"OKA-RELAY/1 ".as_slice(), &[b'a'; 2000]].concat(),
            "ERR bad-request header longer than 512 bytes\n",
        ),
        (
            format!("OKA-RELAY/2 {t} sbx 1\n").into_bytes(),
            "ERR bad-request unsupported version OKA-RELAY/2 (this relay speaks OKA-RELAY/1)\n",
        ),
        (
            format!("OKA-RELAY/1 {t} sbx\n").into_bytes(),
            "ERR bad-request malformed header: expected `OKA-RELAY/1 <token> <runtime-id> <port>`\n",
        ),
        (
            format!("OKA-RELAY/1 {t} ../x 1\n").into_bytes(),
            "ERR bad-request invalid runtime id \"../x\"\n",
        ),
        (format!("OKA-RELAY/1 {t} sbx 0\n").into_bytes(), "ERR bad-request invalid port \"0\"\n"),
    ];
    for (bytes, want) in cases {
        assert_eq!(raw(&relay, &bytes).await, want);
    }
    assert_eq!(fleet.dials(), 0);
    assert!(scrape(&relay).contains("oka_relay_connections_total{result=\"bad_request\"} 7"));
}

#[tokio::test]
async fn a_client_that_does_not_speak_the_servers_version_gets_a_protocol_error() {
    // A relay of a later version answers a version-1 header as a bad request.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut header = [0u8; 256];
        let _ = stream.read(&mut header).await.unwrap();
        let answer =
            b"ERR bad-request unsupported version OKA-RELAY/1 (this relay speaks OKA-RELAY/2)\n";
        stream.write_all(answer).await.unwrap();
    });
    let error = client().connect(addr, &id("sbx"), ENVD).await.unwrap_err();
    match error {
        RelayError::Protocol(message) => assert!(message.contains("OKA-RELAY/2"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn something_that_is_not_a_relay_is_a_protocol_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await.unwrap();
    });
    let error = client().connect(addr, &id("sbx"), ENVD).await.unwrap_err();
    assert!(matches!(error, RelayError::Protocol(_)), "{error:?}");
}

#[tokio::test]
async fn a_slow_header_is_timed_out_without_a_dial() {
    let fleet = Fleet::new();
    fleet.serve("sbx", ENVD, echo(b"").await);
    let config =
        ServerConfig { handshake_timeout: Duration::from_millis(200), ..ServerConfig::default() };
    let relay = Relay::start(fleet.clone(), config).await;
    // Half a header, then nothing: the server must not wait for the rest.
    let answer = raw(&relay, b"OKA-RELAY/1 test-tok").await;
    assert_eq!(answer, "ERR bad-request header not received within 200ms\n");
    assert_eq!(fleet.dials(), 0);
    assert!(scrape(&relay).contains("oka_relay_connections_total{result=\"timeout\"} 1"));
}

#[tokio::test]
async fn a_relay_that_never_answers_is_a_client_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(stream);
    });
    let client = RelayClient::new(token(), ClientConfig { timeout: Duration::from_millis(200) });
    let error = client.connect(addr, &id("sbx"), ENVD).await.unwrap_err();
    assert!(matches!(error, RelayError::Timeout), "{error:?}");
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_connections_are_relayed() {
    let fleet = Fleet::new();
    fleet.serve("sbx", ENVD, echo(b"").await);
    let relay = Relay::start(fleet.clone(), ServerConfig::default()).await;
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let addr = relay.addr;
            tokio::spawn(async move {
                let mut stream = client().connect(addr, &id("sbx"), ENVD).await.unwrap();
                for round in 0..5 {
                    ping(&mut stream, format!("client {i} round {round}").as_bytes()).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(fleet.dials(), 200);
    assert!(scrape(&relay).contains("oka_relay_connections_total{result=\"ok\"} 200"));
}

#[tokio::test]
async fn shutdown_stops_accepting_and_lets_open_pipes_finish() {
    let fleet = Fleet::new();
    fleet.serve("sbx", ENVD, echo(b"").await);
    let mut relay = Relay::start(fleet, ServerConfig::default()).await;
    let mut open = client().connect(relay.addr, &id("sbx"), ENVD).await.unwrap();
    ping(&mut open, b"before").await;
    relay.shutdown();
    // The listener closes: new connections are refused.
    let mut refused = false;
    for _ in 0..100 {
        match TcpStream::connect(relay.addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert!(refused, "the relay still accepts after shutdown");
    // The open pipe still works, and the server ends once it is closed.
    ping(&mut open, b"after").await;
    assert!(!relay.task.is_finished());
    drop(open);
    tokio::time::timeout(Duration::from_secs(5), &mut relay.task).await.unwrap().unwrap();
    assert!(scrape(&relay).contains("oka_relay_active_connections 0"));
}

#[tokio::test]
async fn shutdown_closes_pipes_still_open_after_the_drain_timeout() {
    let fleet = Fleet::new();
    fleet.serve("sbx", ENVD, echo(b"").await);
    let config =
        ServerConfig { drain_timeout: Duration::from_millis(200), ..ServerConfig::default() };
    let mut relay = Relay::start(fleet, config).await;
    let mut open = client().connect(relay.addr, &id("sbx"), ENVD).await.unwrap();
    ping(&mut open, b"before").await;
    relay.shutdown();
    tokio::time::timeout(Duration::from_secs(5), &mut relay.task).await.unwrap().unwrap();
    // The relay closed our pipe: end of file (or a reset), never a hang.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), open.read_to_end(&mut rest)).await;
    assert!(read.unwrap().map_or(true, |n| n == 0));
    assert!(scrape(&relay).contains("oka_relay_active_connections 0"));
}
