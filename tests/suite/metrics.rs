//! The metrics endpoint: scraped over HTTP like Prometheus does, and read
//! with real parsers of the exposition format.

use baton::{CreateMode, Lock};
use baton_testkit::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// When set (as `.ci/run` does), the strict OpenMetrics parser of the
/// Prometheus project's Python client must be there; otherwise it is used
/// if it is.
const REQUIRE_PYTHON_PARSER: &str = "BATON_TEST_OPENMETRICS_PARSER";
const PYTHON: &str = "/usr/bin/python3";

/// Serves `server`'s metrics on a free loopback port; returns its address.
async fn metrics_endpoint(server: &TestServer) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(baton::server::metrics::serve(
        listener,
        server.handle.clone(),
    ));
    addr
}

/// One HTTP request; returns the status line, the headers and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String, String) {
    let mut stream = within(
        10,
        "connect to the metrics endpoint",
        TcpStream::connect(addr),
    )
    .await
    .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    within(10, "the metrics answer", stream.read_to_end(&mut raw))
        .await
        .unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_owned(), headers.to_owned(), body.to_owned())
}

/// Checks the text with the Prometheus project's own OpenMetrics parser
/// (strict: metadata, suffixes, bucket order, the closing `# EOF`), and
/// returns what it makes of each sample, one `name{labels} value` a line.
fn python_parse(text: &str) -> Option<String> {
    let present = std::process::Command::new(PYTHON)
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        assert!(
            std::env::var_os(REQUIRE_PYTHON_PARSER).is_none(),
            "{REQUIRE_PYTHON_PARSER} is set but {PYTHON} cannot import prometheus_client \
             (apt-get install python3-prometheus-client)"
        );
        eprintln!(
            "skipping the strict OpenMetrics parse: {PYTHON} with prometheus_client is not \
             installed (apt-get install python3-prometheus-client; .ci/run does)"
        );
        return None;
    }
    let script = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        print(f"{s.name}{{{labels}}} {s.value}")
"#;
    let mut child = std::process::Command::new(PYTHON)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

/// The value of the sample `name` with exactly `labels`, from the
/// `prometheus-parse` crate's reading.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == name
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
                && s.labels.iter().count() == labels.len()
        })
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"));
    match &sample.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => *v,
        other => panic!("{name}: not a single value: {other:?}"),
    }
}

fn histogram_count(scrape: &prometheus_parse::Scrape, name: &str) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name)
        .unwrap_or_else(|| panic!("no histogram {name}"));
    match &sample.value {
        prometheus_parse::Value::Histogram(buckets) => {
            let inf = buckets.iter().find(|b| b.less_than == f64::INFINITY);
            inf.expect("a +Inf bucket").count
        }
        other => panic!("{name}: not a histogram: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_counts_what_the_server_did_and_parses() {
    let dir = scratch("metrics");
    let server = TestServer::with_config(durable_config(dir.path())).await;
    let metrics = metrics_endpoint(&server).await;

    let a = server.client().await;
    let b = server.client().await;
    a.create("/m", "", CreateMode::Persistent).await.unwrap();
    for i in 0..5 {
        a.create(&format!("/m/n{i}"), "x", CreateMode::Ephemeral)
            .await
            .unwrap();
    }
    assert!(a.get_data("/m/missing").await.is_err());
    let (_, _, _watch) = b.get_data_watch("/m/n0").await.unwrap();
    // A lock held by a, waited for by b: each queue node has its queue
    // watch (the holder's tells it if its node goes).
    let held = Lock::new(&a, "/locks/m").acquire().await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { Lock::new(&b, "/locks/m").acquire().await }
    });
    eventually(10, "b to wait in the queue", || {
        server.handle.stats().watches >= 3
    })
    .await;

    let (status, headers, body) = http_get(metrics, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("Content-Type: application/openmetrics-text"),
        "{headers}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");

    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    assert_eq!(value(&scrape, "baton_sessions", &[]), 2.0);
    // The root, /m, five children, /locks, /locks/m and two queue nodes.
    assert_eq!(value(&scrape, "baton_nodes", &[]), 11.0);
    assert_eq!(value(&scrape, "baton_watches", &[]), 1.0);
    assert_eq!(value(&scrape, "baton_queue_watches", &[]), 2.0);
    assert!(value(&scrape, "baton_connections", &[]) >= 2.0);
    // /m and its five children, and the lock's parents /locks and /locks/m
    // (the first acquire creates them; the second finds them).
    let created = value(
        &scrape,
        "baton_requests_total",
        &[("op", "create"), ("result", "ok")],
    );
    assert_eq!(created, 8.0);
    assert_eq!(
        value(
            &scrape,
            "baton_requests_total",
            &[("op", "get_data"), ("result", "no_node")]
        ),
        1.0
    );
    assert!(histogram_count(&scrape, "baton_request_handle_seconds") >= 9.0);
    // Changes were synced, several to a batch at times; a batch is counted
    // when written, before its sync (which may still be under way here).
    let syncs = histogram_count(&scrape, "baton_log_sync_seconds");
    assert!(syncs >= 1.0, "{body}");
    assert!(histogram_count(&scrape, "baton_log_batch_bytes") >= syncs);
    assert!(value(&scrape, "baton_received_bytes_total", &[]) > 0.0);
    assert!(value(&scrape, "baton_sent_bytes_total", &[]) > 0.0);
    assert_eq!(
        value(
            &scrape,
            "baton_server_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("role", "single"),
                ("fsync", "always")
            ]
        ),
        1.0
    );

    if let Some(parsed) = python_parse(&body) {
        for line in [
            "baton_sessions{} 2",
            "baton_requests_total{op=\"create\",result=\"ok\"} 8",
            "baton_queue_watches{} 2",
        ] {
            assert!(
                parsed.lines().any(|l| l == line),
                "no {line:?} in:\n{parsed}"
            );
        }
    }

    // Anything else than /metrics is not found.
    let (status, _, _) = http_get(metrics, "/").await;
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    held.release().await.unwrap();
    let next = within(10, "b's turn", waiting).await.unwrap().unwrap();

    // The lock's figures: two grants, one hold over, b's token, b queued.
    let (_, _, body) = http_get(metrics, "/metrics").await;
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let lock = [("lock", "/locks/m")];
    assert_eq!(value(&scrape, "baton_lock_grants_total", &lock), 2.0);
    assert_eq!(value(&scrape, "baton_lock_holds_total", &lock), 1.0);
    assert_eq!(value(&scrape, "baton_lock_queue", &lock), 1.0);
    assert_eq!(
        value(&scrape, "baton_lock_token", &lock),
        next.token().get() as f64
    );
    assert!(value(&scrape, "baton_lock_hold_seconds_total", &lock) > 0.0);
    python_parse(&body);
    next.release().await.unwrap();
    a.close().await;
    b.close().await;
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_sends_nothing_does_not_hold_the_endpoint() {
    let server = TestServer::start().await;
    let metrics = metrics_endpoint(&server).await;
    // One connection says nothing, another sends garbage: a scrape still
    // gets its answer.
    let _silent = TcpStream::connect(metrics).await.unwrap();
    let mut garbage = TcpStream::connect(metrics).await.unwrap();
    garbage.write_all(&[0xff; 20_000]).await.unwrap();
    let (status, _, body) = http_get(metrics, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("baton_sessions 0"), "{body}");
    server.stop().await;
}

#[tokio::test]
async fn a_lock_path_with_quotes_and_backslashes_stays_one_label() {
    let server = TestServer::start().await;
    let metrics = metrics_endpoint(&server).await;
    let c = server.client().await;
    let tricky = r#"/l/x",role="leader\"#;
    let held = Lock::new(&c, tricky).acquire().await.unwrap();
    let (_, _, body) = http_get(metrics, "/metrics").await;
    // Escaped as the text format has it. (The Rust parser used above
    // splits such a label wrongly: the exact text and the strict parser
    // judge this one.)
    let line = r#"baton_lock_grants_total{lock="/l/x\",role=\"leader\\"} 1"#;
    assert!(body.lines().any(|l| l.starts_with(line)), "{body}");
    if let Some(parsed) = python_parse(&body) {
        let line = parsed
            .lines()
            .find(|l| l.starts_with("baton_lock_grants_total"))
            .unwrap();
        assert_eq!(
            line,
            format!("baton_lock_grants_total{{lock=\"{tricky}\"}} 1.0")
        );
    }
    held.release().await.unwrap();
    c.close().await;
    server.stop().await;
}

#[tokio::test]
async fn connections_past_the_endpoints_limit_are_closed_and_it_recovers() {
    let server = TestServer::start().await;
    let metrics = metrics_endpoint(&server).await;
    // 64 connections that say nothing hold every slot.
    let mut silent = Vec::new();
    for _ in 0..64 {
        silent.push(TcpStream::connect(metrics).await.unwrap());
    }
    let mut extra = TcpStream::connect(metrics).await.unwrap();
    let _ = extra.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = within(
        10,
        "the extra connection to close",
        extra.read_to_end(&mut answer),
    )
    .await;
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    // Once they go, scrapes are answered again.
    drop(silent);
    eventually_async(10, "a scrape to be answered", || async {
        let Ok(mut s) = TcpStream::connect(metrics).await else {
            return false;
        };
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").await;
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer).await;
        answer.starts_with(b"HTTP/1.1 200 OK")
    })
    .await;
    server.stop().await;
}
