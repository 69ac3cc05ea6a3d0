//! What a real registry is hard to make do: transient failures (503s retried with backoff),
//! blobs redirected to another host (followed, without the registry's credentials), and a
//! mirror tried before the registry it mirrors. Small hyper servers on loopback play the
//! registry and the blob host.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use oka_image::{ImageStore, ImageStoreConfig, PullError, RegistryAuth};
use support::{Entry, Registry, TestImage, TestLayer, host_arch};

type Handler =
    Arc<dyn Fn(&str, Option<&str>) -> (u16, Vec<(String, String)>, Vec<u8>) + Send + Sync>;

/// Serves `handler(path, authorization)` on a free loopback port; returns the port.
async fn serve(handler: Handler) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let handler = handler.clone();
                    async move {
                        let auth = request
                            .headers()
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_string());
                        let (status, headers, body) =
                            handler(request.uri().path(), auth.as_deref());
                        let mut response = hyper::Response::builder().status(status);
                        for (k, v) in headers {
                            response = response.header(k, v);
                        }
                        Ok::<_, Infallible>(response.body(Full::new(Bytes::from(body))).unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_are_retried_and_a_missing_manifest_is_not() {
    let hits = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = hits.clone();
    let port = serve(Arc::new(move |path: &str, _: Option<&str>| {
        let mut hits = seen.lock().unwrap();
        hits.push(path.to_string());
        let pings = hits.iter().filter(|p| *p == "/v2/").count();
        match path {
            "/v2/" if pings <= 2 => (503, vec![], b"busy".to_vec()),
            "/v2/" => (200, vec![], b"{}".to_vec()),
            _ => (
                404,
                vec![("content-type".into(), "application/json".into())],
                br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#
                    .to_vec(),
            ),
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path(), ImageStoreConfig::default()).unwrap();
    let err = store.pull(&format!("127.0.0.1:{port}/a/b:1"), &[], &|_| {}).await.unwrap_err();
    assert!(matches!(err, PullError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("MANIFEST_UNKNOWN: manifest unknown"), "{err}");
    let hits = hits.lock().unwrap().clone();
    assert_eq!(
        hits,
        ["/v2/", "/v2/", "/v2/", "/v2/a/b/manifests/1"],
        "two 503s retried, the 404 not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blob_redirects_are_followed_without_the_registrys_credentials() {
    let image = TestImage::new(
        vec![TestLayer::build(&[Entry::File("redirected".into(), b"yes".to_vec(), 0o644, 0)])],
        host_arch(),
    );
    let layer = image.layers[0].gz.clone();
    let blob_auth = Arc::new(Mutex::new(Vec::new()));
    let seen = blob_auth.clone();
    let blob_port = serve(Arc::new(move |_: &str, auth: Option<&str>| {
        seen.lock().unwrap().push(auth.map(str::to_string));
        (200, vec![], layer.clone())
    }))
    .await;
    let layer_digest = support::sha256(&image.layers[0].gz);
    let config_digest = support::sha256(&image.config);
    let (manifest, config) = (image.manifest.clone(), image.config.clone());
    let expected = "Basic dTpw"; // u:p
    let port = serve(Arc::new(move |path: &str, auth: Option<&str>| {
        if auth != Some(expected) {
            return (401, vec![("www-authenticate".into(), "Basic realm=\"test\"".into())], vec![]);
        }
        if path == "/v2/" {
            (200, vec![], b"{}".to_vec())
        } else if path.ends_with("/manifests/1") {
            (200, vec![("content-type".into(), support::OCI_MANIFEST.into())], manifest.clone())
        } else if path.ends_with(&config_digest) {
            (200, vec![], config.clone())
        } else if path.ends_with(&layer_digest) {
            (
                307,
                vec![(
                    "location".into(),
                    format!("http://127.0.0.1:{blob_port}/storage/layer?sig=x"),
                )],
                vec![],
            )
        } else {
            (404, vec![], vec![])
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path(), ImageStoreConfig::default()).unwrap();
    let auth = [RegistryAuth {
        registry: format!("127.0.0.1:{port}"),
        username: "u".into(),
        password: "p".into(),
    }];
    let pulled = store.pull(&format!("127.0.0.1:{port}/r/app:1"), &auth, &|_| {}).await.unwrap();
    assert_eq!(std::fs::read_to_string(pulled.layers[0].join("redirected")).unwrap(), "yes");
    assert_eq!(
        *blob_auth.lock().unwrap(),
        [None],
        "the blob host never sees the registry's credentials"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_hub_mirror_is_tried_first() {
    let registry = Registry::start(None);
    let image = TestImage::new(
        vec![TestLayer::build(&[Entry::File("mirrored".into(), b"hub".to_vec(), 0o644, 0)])],
        host_arch(),
    );
    // As a mirror holds Docker Hub's official images: under `library/`.
    registry.push_image("library/hello", "1", &image).await;
    let dir = tempfile::tempdir().unwrap();
    let config = ImageStoreConfig {
        mirrors: BTreeMap::from([("docker.io".to_string(), format!("http://{}", registry.host))]),
        ..ImageStoreConfig::default()
    };
    let store = ImageStore::open(dir.path(), config).unwrap();
    let pulled = store.pull("hello:1", &[], &|_| {}).await.unwrap();
    assert_eq!(pulled.reference, "docker.io/library/hello:1");
    assert_eq!(std::fs::read_to_string(pulled.layers[0].join("mirrored")).unwrap(), "hub");
    assert_eq!(store.get("docker.io/library/hello:1").map(|i| i.digest), Some(image.digest()));
}
