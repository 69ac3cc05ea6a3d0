//! The real `oka-interpreter` binary with a real ipykernel, driven over raw HTTP/1.1: the NDJSON
//! shape, statuses, queuing, interrupt on disconnect, restart, env vars, kernel start failures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{FakeEnvd, Server, joined, main_text, of_type};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

macro_rules! require_kernel {
    () => {
        if !common::have_ipykernel() {
            return;
        }
    };
}

#[tokio::test]
async fn ndjson_lines_have_the_sdk_shape() {
    require_kernel!();
    let envd = FakeEnvd::start().await;
    let s = Server::start(&envd.url, &[]).await;
    let (st, lines) = s.execute(json!({"code": "print('hello'); 1+1"})).await;
    assert_eq!(st, 200);
    // The output first, in one chunk or more (how `print`'s text and newline are flushed is the
    // kernel's business), then the result, the count and the end.
    let chunks = lines.iter().take_while(|l| l["type"] == "stdout").count();
    assert!(chunks >= 1 && lines.len() == chunks + 3, "{lines:?}");
    assert_eq!(joined(&lines, "stdout"), "hello\n");
    assert!(lines[0]["timestamp"].as_i64().unwrap() > 1_600_000_000_000_000_000);
    let rest = &lines[chunks..];
    assert_eq!(rest[0], json!({"type": "result", "is_main_result": true, "text": "2"}));
    assert_eq!(rest[1]["type"], "number_of_executions");
    assert!(rest[1]["execution_count"].as_i64().unwrap() >= 1);
    assert_eq!(rest[2], json!({"type": "end_of_execution"}));

    let (_, lines) =
        s.execute(json!({"code": "import sys; print('e', file=sys.stderr); 1/0"})).await;
    assert_eq!(joined(&lines, "stderr"), "e\n");
    let err = of_type(&lines, "error")[0];
    assert_eq!(err["name"], "ZeroDivisionError");
    assert_eq!(err["value"], "division by zero");
    assert!(err["traceback"].as_str().unwrap().contains('\n'));
    assert_eq!(lines.last().unwrap()["type"], "end_of_execution");

    // A display of a PNG bundle: not the main result, fields mapped, the rest in `extra`.
    let code = "from IPython.display import display\ndisplay({'image/png': 'iVBORw0KGgo=', 'text/plain': 'img', 'application/x-custom': 'c'}, raw=True)";
    let (_, lines) = s.execute(json!({"code": code})).await;
    let r = of_type(&lines, "result")[0];
    assert_eq!(r["is_main_result"], false);
    assert_eq!(r["png"], "iVBORw0KGgo=");
    assert_eq!(r["text"], "img");
    assert_eq!(r["extra"]["application/x-custom"], "c");
}

#[tokio::test]
async fn statuses_for_bad_requests() {
    require_kernel!();
    let envd = FakeEnvd::start().await;
    let s = Server::start(&envd.url, &[]).await;
    assert_eq!(s.get("/health").await.unwrap().0, 200);
    let (st, b) = s.execute(json!({"code": "1", "context_id": "x", "language": "python"})).await;
    assert_eq!(st, 400, "{b:?}");
    let (st, b) = s.execute(json!({"code": "1", "context_id": "nope"})).await;
    assert_eq!(st, 404);
    assert!(b[0]["message"].as_str().unwrap().contains("nope"));
    let (st, body) = s.post("/execute", "{\"code\":").await;
    assert_eq!(st, 400);
    assert!(body.contains("invalid request body"), "{body}");
    let (st, _) = common::request(s.addr, "PUT", "/execute", &[], "").await.unwrap();
    assert_eq!(st, 405);
    assert_eq!(s.get("/no/such/path").await.unwrap().0, 404);
    assert_eq!(s.post("/contexts/nope/restart", "").await.0, 404);
    let (st, _) = common::request(s.addr, "DELETE", "/contexts/nope", &[], "").await.unwrap();
    assert_eq!(st, 404);
    let (st, b) = s.execute(json!({"code": "1", "language": "cobol"})).await;
    assert_eq!(st, 400);
    let m = b[0]["message"].as_str().unwrap();
    assert!(m.contains("no Jupyter kernel for language 'cobol'") && m.contains("install"), "{m}");
}

#[tokio::test]
async fn concurrent_executions_on_one_context_run_in_turn() {
    require_kernel!();
    let envd = FakeEnvd::start().await;
    let s = Server::start(&envd.url, &[]).await;
    s.execute(json!({"code": "1"})).await;
    let t0 = Instant::now();
    let first =
        s.execute(json!({"code": "import time; time.sleep(1); shared = 'set by the first'"}));
    let second = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        s.execute(json!({"code": "shared"})).await
    };
    let ((st1, _), (st2, lines)) = tokio::join!(first, second);
    assert_eq!((st1, st2), (200, 200));
    assert_eq!(main_text(&lines).as_deref(), Some("set by the first"), "{lines:?}");
    assert!(t0.elapsed() >= Duration::from_secs(1));
}

#[tokio::test]
async fn a_dropped_client_interrupts_its_execution() {
    require_kernel!();
    let envd = FakeEnvd::start().await;
    let s = Server::start(&envd.url, &[]).await;
    s.execute(json!({"code": "1"})).await;
    let body = json!({"code": "while True: pass"}).to_string();
    let mut c = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let req = format!(
        "POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut buf = [0u8; 512];
    let n = c.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(c);
    let t0 = Instant::now();
    let (st, lines) = s.execute(json!({"code": "1+1"})).await;
    assert_eq!(st, 200);
    assert_eq!(main_text(&lines).as_deref(), Some("2"), "{lines:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
}

#[tokio::test]
async fn contexts_create_list_restart_remove() {
    require_kernel!();
    let envd = FakeEnvd::start().await;
    let s = Server::start(&envd.url, &[]).await;
    let (st, body) = s.post("/contexts", r#"{"cwd": "/"}"#).await;
    assert_eq!(st, 200, "{body}");
    let ctx: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ctx["language"], "python");
    assert_eq!(ctx["cwd"], "/");
    let id = ctx["id"].as_str().unwrap().to_string();
    let (_, lines) =
        s.execute(json!({"code": "import os; y = 5; os.getcwd()", "context_id": id})).await;
    assert_eq!(main_text(&lines).as_deref(), Some("/"));
    // Contexts are separate kernels; the default one has no `y`.
    let (_, lines) = s.execute(json!({"code": "y"})).await;
    assert_eq!(of_type(&lines, "error")[0]["name"], "NameError");

    let (_, list) = s.get("/contexts").await.unwrap();
    let list: Vec<serde_json::Value> = serde_json::from_str(&list).unwrap();
    assert_eq!(list, vec![ctx.clone()], "only created contexts are listed");

    assert_eq!(s.post(&format!("/contexts/{id}/restart"), "").await.0, 200);
    let (_, lines) = s.execute(json!({"code": "y", "context_id": id})).await;
    assert_eq!(of_type(&lines, "error")[0]["name"], "NameError", "restart clears state");

    let del = format!("/contexts/{id}");
    assert_eq!(common::request(s.addr, "DELETE", &del, &[], "").await.unwrap().0, 200);
    assert_eq!(common::request(s.addr, "DELETE", &del, &[], "").await.unwrap().0, 404);
    assert_eq!(s.execute(json!({"code": "1", "context_id": id})).await.0, 404);
    assert_eq!(s.get("/contexts").await.unwrap().1, "[]");
}

#[tokio::test]
async fn env_vars_per_request_and_global_from_envd() {
    require_kernel!();
    let envd = FakeEnvd::start().await;
    envd.envs.lock().unwrap().insert("G".into(), "g1".into());
    *envd.token.lock().unwrap() = Some("tok".into());
    let s = Server::start(&envd.url, &[]).await;
    let auth = [("X-Access-Token", "tok")];
    let get = "import os; f\"{os.environ.get('A')} {os.environ.get('G')}\"";

    let (_, lines) = s.execute_with(json!({"code": get, "env_vars": {"A": "1"}}), &auth).await;
    assert_eq!(main_text(&lines).as_deref(), Some("1 g1"), "{lines:?}");
    let (_, lines) = s.execute_with(json!({"code": get}), &auth).await;
    assert_eq!(main_text(&lines).as_deref(), Some("None g1"), "request env is reverted");

    // A request env var shadows a global one and is restored to it.
    let (_, lines) = s.execute_with(json!({"code": get, "env_vars": {"G": "mine"}}), &auth).await;
    assert_eq!(main_text(&lines).as_deref(), Some("None mine"));
    let (_, lines) = s.execute_with(json!({"code": get}), &auth).await;
    assert_eq!(main_text(&lines).as_deref(), Some("None g1"));

    // envd's env changes (a re-init) are followed.
    envd.envs.lock().unwrap().insert("G".into(), "g2".into());
    let (_, lines) = s.execute_with(json!({"code": get}), &auth).await;
    assert_eq!(main_text(&lines).as_deref(), Some("None g2"));
    envd.envs.lock().unwrap().clear();
    let (_, lines) = s.execute_with(json!({"code": get}), &auth).await;
    assert_eq!(main_text(&lines).as_deref(), Some("None None"));

    // A token envd rejects is rejected.
    let (st, _) = s.execute_with(json!({"code": "1"}), &[("X-Access-Token", "wrong")]).await;
    assert_eq!(st, 401);
}

#[tokio::test]
async fn envd_unreachable_does_not_block() {
    require_kernel!();
    let s = Server::start("http://127.0.0.1:9", &[]).await;
    let (st, lines) = s.execute_with(json!({"code": "1+1"}), &[("X-Access-Token", "t")]).await;
    assert_eq!(st, 200);
    assert_eq!(main_text(&lines).as_deref(), Some("2"));
}

#[tokio::test]
async fn a_kernel_that_fails_to_start_is_a_clear_error() {
    require_kernel!();
    let dir = std::env::temp_dir().join(format!("oka-interp-ks-{}", std::process::id()));
    let spec = dir.join("kernels/broken");
    std::fs::create_dir_all(&spec).unwrap();
    std::fs::write(
        spec.join("kernel.json"),
        r#"{"argv": ["sh", "-c", "echo kaboom: no kernel here >&2; exit 3", "{connection_file}"], "language": "bash", "display_name": "broken"}"#,
    )
    .unwrap();
    let envd = FakeEnvd::start().await;
    let s = Server::start(&envd.url, &[("JUPYTER_PATH", &dir)]).await;
    let (st, body) = s.post("/contexts", r#"{"language": "bash"}"#).await;
    assert_eq!(st, 500, "{body}");
    assert!(body.contains("exited while starting") && body.contains("kaboom"), "{body}");
    let (st, b) = s.execute(json!({"code": "echo hi", "language": "bash"})).await;
    assert_eq!(st, 500);
    assert!(b[0]["message"].as_str().unwrap().contains("kaboom"));
    // Python still works.
    let (_, lines) = s.execute(json!({"code": "1+1"})).await;
    assert_eq!(main_text(&lines).as_deref(), Some("2"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn kernels_run_as_the_kernel_user() {
    require_kernel!();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    if !rustix::process::geteuid().is_root() || !passwd.lines().any(|l| l.starts_with("nobody:")) {
        println!("SKIPPED: needs root and a `nobody` account");
        return;
    }
    let envd = FakeEnvd::start().await;
    let s = Server::start_as(&envd.url, &[], "nobody").await;
    let code = "import os; f\"{os.getuid()} {os.getgroups()} {os.environ['USER']} {os.getcwd()}\"";
    let (_, lines) = s.execute(json!({"code": code})).await;
    let tmp = std::env::temp_dir();
    let want = format!("65534 [] nobody {}", tmp.display());
    assert_eq!(main_text(&lines).as_deref(), Some(want.as_str()), "{lines:?}");
}
