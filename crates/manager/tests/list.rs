//! `GET /v2/sandboxes` and v1 `GET /sandboxes`: order, filters and paging as the SDKs use them.
#![allow(clippy::unwrap_used)]

mod common;

use http::StatusCode;
use serde_json::{Value, json};

use common::{call, create};

fn ids(reply: &common::Reply) -> Vec<String> {
    reply
        .json
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandboxID"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn newest_first_by_default_with_order_template_and_started_after() {
    let api = common::api(3).await;
    let mut created = Vec::new();
    for _ in 0..3 {
        created.push(create(&api.router, json!({"templateID": "base"})).await);
    }
    let made: std::collections::BTreeSet<String> =
        created.iter().map(|c| c["sandboxID"].as_str().unwrap().to_owned()).collect();
    // Newest first by claim time (microseconds), then by ID; `order=asc` is the reverse.
    let newest_first = ids(&call(&api.router, "GET", "/v2/sandboxes", None).await);
    assert_eq!(newest_first.iter().cloned().collect::<std::collections::BTreeSet<_>>(), made);
    let mut creation_order: Vec<String> =
        created.iter().map(|c| c["sandboxID"].as_str().unwrap().to_owned()).collect();
    creation_order.reverse();
    assert_eq!(newest_first, creation_order, "claimed within a second, still newest first");
    let mut oldest_first = ids(&call(&api.router, "GET", "/v2/sandboxes?order=asc", None).await);
    oldest_first.reverse();
    assert_eq!(oldest_first, newest_first);
    assert_eq!(ids(&call(&api.router, "GET", "/sandboxes", None).await), newest_first, "v1");
    // Paging newest first, one at a time, follows X-Next-Token to the end.
    let mut seen = Vec::new();
    let mut uri = "/v2/sandboxes?limit=1".to_owned();
    loop {
        let reply = call(&api.router, "GET", &uri, None).await;
        seen.extend(ids(&reply));
        match reply.headers.get("x-next-token") {
            Some(token) => {
                uri = format!("/v2/sandboxes?limit=1&nextToken={}", token.to_str().unwrap())
            }
            None => break,
        }
    }
    assert_eq!(seen, newest_first);
    // template: by pool name; unknown: empty.
    assert_eq!(ids(&call(&api.router, "GET", "/v2/sandboxes?template=base", None).await).len(), 3);
    let reply = call(&api.router, "GET", "/v2/sandboxes?template=other", None).await;
    assert_eq!((reply.status, reply.json), (StatusCode::OK, json!([])));
    // startedAfter is inclusive: the first one's start time keeps all three.
    let first: &Value = &created[0]["startedAt"];
    let started = first.as_str().unwrap().replace(':', "%3A").replace('+', "%2B");
    let reply =
        call(&api.router, "GET", &format!("/v2/sandboxes?startedAfter={started}"), None).await;
    assert_eq!(ids(&reply).len(), 3);
    // Listed items carry no access token.
    assert!(reply.json[0].get("envdAccessToken").is_none());
}

#[tokio::test]
async fn refreshes_only_extend_the_end_time() {
    let api = common::api(1).await;
    let created = create(&api.router, json!({"templateID": "base", "timeout": 600})).await;
    let id = created["sandboxID"].as_str().unwrap();
    let uri = format!("/sandboxes/{id}/refreshes");
    let reply = call(&api.router, "POST", &uri, Some(json!({"duration": 60}))).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let info = call(&api.router, "GET", &format!("/sandboxes/{id}"), None).await;
    assert_eq!(info.json["endAt"], created["endAt"], "a shorter refresh never shortens");
    let reply = call(&api.router, "POST", &uri, Some(json!({"duration": 3600}))).await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let info = call(&api.router, "GET", &format!("/sandboxes/{id}"), None).await;
    let end: jiff::Timestamp = info.json["endAt"].as_str().unwrap().parse().unwrap();
    assert!(((end - jiff::Timestamp::now()).get_seconds() - 3600).abs() <= 2);
    let reply = call(&api.router, "POST", &uri, Some(json!({"duration": 3601}))).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let reply = call(&api.router, "POST", "/sandboxes/nope/refreshes", Some(json!({}))).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_and_running_list_in_one_order_and_filters_apply_before_paging() {
    let api = common::api(6).await;
    let _controller = common::stand_in_controller(&api.store);
    let mut created = Vec::new();
    for _ in 0..6 {
        let sandbox = create(&api.router, json!({"templateID": "base"})).await;
        created.push(sandbox["sandboxID"].as_str().unwrap().to_owned());
    }
    // Pause the 1st, 3rd and 4th (oldest first): states interleave in the claim order.
    for i in [0, 2, 3] {
        let reply =
            call(&api.router, "POST", &format!("/sandboxes/{}/pause", created[i]), None).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.json);
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();
    assert_eq!(ids(&call(&api.router, "GET", "/v2/sandboxes", None).await), newest_first);
    let paused: Vec<String> = [3, 2, 0].iter().map(|&i| created[i].clone()).collect();
    let running: Vec<String> = [5, 4, 1].iter().map(|&i| created[i].clone()).collect();
    // (query, expected walk with limit=1 and with limit=2)
    let cases = [
        ("state=paused", &paused),
        ("state=running", &running),
        ("state=running,paused", &newest_first),
        ("state=paused&state=running", &newest_first),
    ];
    for (query, expected) in cases {
        let all = ids(&call(&api.router, "GET", &format!("/v2/sandboxes?{query}"), None).await);
        assert_eq!(&all, expected, "{query}");
        for limit in [1, 2] {
            let mut seen = Vec::new();
            let mut uri = format!("/v2/sandboxes?{query}&limit={limit}");
            loop {
                let reply = call(&api.router, "GET", &uri, None).await;
                let page = ids(&reply);
                assert!(page.len() <= limit && !page.is_empty(), "{query}: {page:?}");
                seen.extend(page);
                match reply.headers.get("x-next-token") {
                    Some(token) => {
                        let token = token.to_str().unwrap();
                        uri = format!("/v2/sandboxes?{query}&limit={limit}&nextToken={token}");
                    }
                    None => break,
                }
            }
            assert_eq!(&seen, expected, "{query}, limit {limit}");
        }
    }
    // Page one of `state=paused, limit=1` is the newest paused sandbox.
    let reply = call(&api.router, "GET", "/v2/sandboxes?state=paused&limit=1", None).await;
    assert_eq!(ids(&reply), vec![created[3].clone()]);
}
