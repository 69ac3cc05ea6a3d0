//! Relay benchmark: latency (p50, p99) of a connect plus one small request and its answer,
//! directly to a loopback echo service (the baseline: what the local runtime's dial costs the
//! gateway) and through a relay on loopback to the same service, interleaved in one run; then of
//! one round trip on an already open connection, direct and relayed.
//!
//! `cargo bench -p oka-relay --bench relay` (env `ROUNDS`, default 3000).
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::{Fleet, Relay, client, echo, id, ping};
use hdrhistogram::Histogram;
use oka_relay::ServerConfig;
use tokio::net::TcpStream;

const PORT: u16 = 49983;
const REQUEST: &[u8] = b"GET /health HTTP/1.1\r\nHost: sandbox\r\n\r\n";

fn rounds() -> usize {
    std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

fn report(what: &str, h: &Histogram<u64>) {
    // Recorded in nanoseconds, shown in microseconds.
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!("{what:<44} n={:<6} p50 {:>8.1} µs  p99 {:>8.1} µs", h.len(), us(0.5), us(0.99));
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(run(rounds()));
}

async fn run(rounds: usize) {
    let service = echo(b"").await;
    let fleet = Fleet::new();
    fleet.serve("sbx", PORT, service);
    let relay = Relay::start(fleet, ServerConfig::default()).await;
    let client = client();
    let sandbox = id("sbx");

    let (mut direct, mut relayed) = (histogram(), histogram());
    // Warm up, then interleave the two so drift (other load, the page cache) hits both alike.
    for round in 0..rounds + 200 {
        let started = Instant::now();
        let mut stream = TcpStream::connect(service).await.unwrap();
        stream.set_nodelay(true).unwrap();
        ping(&mut stream, REQUEST).await;
        let took = started.elapsed();
        drop(stream);
        if round >= 200 {
            direct.record(took.as_nanos() as u64).unwrap();
        }

        let started = Instant::now();
        let mut stream = client.connect(relay.addr, &sandbox, PORT).await.unwrap();
        ping(&mut stream, REQUEST).await;
        let took = started.elapsed();
        drop(stream);
        if round >= 200 {
            relayed.record(took.as_nanos() as u64).unwrap();
        }
    }
    report("connect + 1 round trip, direct", &direct);
    report("connect + 1 round trip, through the relay", &relayed);

    let (mut direct, mut relayed) = (histogram(), histogram());
    let mut direct_stream = TcpStream::connect(service).await.unwrap();
    direct_stream.set_nodelay(true).unwrap();
    let mut relayed_stream = client.connect(relay.addr, &sandbox, PORT).await.unwrap();
    for round in 0..rounds + 200 {
        let started = Instant::now();
        ping(&mut direct_stream, REQUEST).await;
        let took = started.elapsed();
        if round >= 200 {
            direct.record(took.as_nanos() as u64).unwrap();
        }
        let started = Instant::now();
        ping(&mut relayed_stream, REQUEST).await;
        let took = started.elapsed();
        if round >= 200 {
            relayed.record(took.as_nanos() as u64).unwrap();
        }
    }
    report("1 round trip on an open connection, direct", &direct);
    report("1 round trip on an open connection, relayed", &relayed);
}
