//! HTTP client and load generators (open loop at a constant arrival rate, and
//! closed loop with N callers), recording latencies into an HDR histogram.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;

pub type Client = HyperClient<HttpConnector, Empty<Bytes>>;

pub fn client() -> Client {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    HyperClient::builder(TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build(connector)
}

#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
    /// Time to the whole response (from the request's start).
    pub elapsed: Duration,
    /// Time to the response headers.
    pub headers_after: Duration,
    /// Time to the first body byte (`None`: the body was empty).
    pub first_byte_after: Option<Duration>,
    pub trailers: HashMap<String, String>,
}

impl Reply {
    /// Reads a whole response; `elapsed` counts from `start`.
    async fn read(
        resp: hyper::Response<hyper::body::Incoming>,
        start: Instant,
    ) -> Result<Reply, String> {
        let headers_after = start.elapsed();
        let status = resp.status().as_u16();
        let headers = text_map(resp.headers());
        let mut body = resp.into_body();
        let (mut bytes, mut first_byte_after, mut trailers) = (Vec::new(), None, HashMap::new());
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| e.to_string())?;
            if let Some(data) = frame.data_ref() {
                if !data.is_empty() && first_byte_after.is_none() {
                    first_byte_after = Some(start.elapsed());
                }
                bytes.extend_from_slice(data);
            } else if let Some(t) = frame.trailers_ref() {
                trailers = text_map(t);
            }
        }
        Ok(Reply {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).to_string(),
            elapsed: start.elapsed(),
            headers_after,
            first_byte_after,
            trailers,
        })
    }
}

fn text_map(map: &hyper::HeaderMap) -> HashMap<String, String> {
    map.iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect()
}

/// The longest a test's request may take, answer and body: past Envoy's
/// route timeouts (15 s by default, 60 s in the streaming config's), so
/// that a filter that stalls requests fails a test in seconds, not in a
/// quarter of an hour of requests each waiting out a route timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// One request; `headers` are added as given. Gives up after
/// `REQUEST_TIMEOUT`.
pub async fn request(
    client: &Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        request_unbounded(client, method, url, headers),
    )
    .await
    .unwrap_or_else(|_| Err(format!("no answer within {REQUEST_TIMEOUT:?}")))
}

async fn request_unbounded(
    client: &Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let mut builder = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let req = builder
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let resp = client.request(req).await.map_err(|e| format!("{e:?}"))?;
    Reply::read(resp, start).await
}

/// Requests completed by every load run of this process (for progress lines).
pub static COMPLETED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Latencies (µs) and outcomes of a load run.
pub struct LoadResult {
    /// Time to the whole response.
    pub latency_us: Histogram<u64>,
    /// Time to the first body byte (responses with a body), on the same clock.
    pub first_byte_us: Histogram<u64>,
    pub statuses: HashMap<u16, u64>,
    pub errors: u64,
    pub sent: u64,
    /// 200s that came from an attempt in the hosts' slow mode (the
    /// simulator's `x-sim-straggler`): the stragglers no hedge beat.
    pub stragglers_served: u64,
    /// Replies whose filter debug header (`x-adaptive-hedge`, with
    /// `debug_header` on) says the request was paced for outlier detection.
    pub paced: u64,
    pub elapsed: Duration,
}

impl Default for LoadResult {
    fn default() -> Self {
        Self::new()
    }
}

impl LoadResult {
    pub fn new() -> Self {
        LoadResult {
            latency_us: Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds"),
            first_byte_us: Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds"),
            statuses: HashMap::new(),
            errors: 0,
            sent: 0,
            stragglers_served: 0,
            paced: 0,
            elapsed: Duration::ZERO,
        }
    }

    fn record(&mut self, outcome: &Result<Reply, String>, elapsed: Duration) {
        COMPLETED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.sent += 1;
        match outcome {
            Ok(r) => {
                *self.statuses.entry(r.status).or_default() += 1;
                if r.status == 200 && r.headers.contains_key("x-sim-straggler") {
                    self.stragglers_served += 1;
                }
                if r.headers
                    .get("x-adaptive-hedge")
                    .is_some_and(|d| d.starts_with("skipped; reason=paced"))
                {
                    self.paced += 1;
                }
                let _ = self.latency_us.record((elapsed.as_micros() as u64).max(1));
                if let Some(first_byte) = r.first_byte_after {
                    // `elapsed` may start before the request did (open loop:
                    // from its scheduled time); the first byte keeps that origin.
                    let origin = elapsed.saturating_sub(r.elapsed);
                    let _ = self
                        .first_byte_us
                        .record(((origin + first_byte).as_micros() as u64).max(1));
                }
            }
            Err(_) => self.errors += 1,
        }
    }

    /// Adds another run's latencies and outcomes to this one.
    pub fn merge(&mut self, other: &LoadResult) {
        let _ = self.latency_us.add(&other.latency_us);
        let _ = self.first_byte_us.add(&other.first_byte_us);
        for (status, n) in &other.statuses {
            *self.statuses.entry(*status).or_default() += n;
        }
        self.errors += other.errors;
        self.paced += other.paced;
        self.sent += other.sent;
        self.stragglers_served += other.stragglers_served;
        self.elapsed = self.elapsed.max(other.elapsed);
    }

    /// Percentile in milliseconds.
    pub fn ms(&self, q: f64) -> f64 {
        self.latency_us.value_at_quantile(q) as f64 / 1000.0
    }

    /// Percentile of the time to first byte in milliseconds.
    pub fn first_byte_ms(&self, q: f64) -> f64 {
        self.first_byte_us.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn ok(&self) -> u64 {
        self.statuses.get(&200).copied().unwrap_or(0)
    }

    pub fn summary(&self) -> String {
        let first_byte = if self.first_byte_us.is_empty() {
            String::new()
        } else {
            format!(
                "; first byte p50={:.1}ms p90={:.1}ms p99={:.1}ms",
                self.first_byte_ms(0.5),
                self.first_byte_ms(0.9),
                self.first_byte_ms(0.99)
            )
        };
        let text = format!(
            "n={} ok={} errors={} statuses={:?} p50={:.1}ms p90={:.1}ms p99={:.1}ms p999={:.1}ms max={:.1}ms in {:.1}s",
            self.sent,
            self.ok(),
            self.errors,
            self.statuses,
            self.ms(0.5),
            self.ms(0.9),
            self.ms(0.99),
            self.ms(0.999),
            self.latency_us.max() as f64 / 1000.0,
            self.elapsed.as_secs_f64()
        );
        text + &first_byte
    }
}

/// Open loop: `total` requests at `rate` per second, each sent on schedule
/// whatever the previous ones are doing (a slow response does not slow the
/// sender, so queueing shows up in the latencies). Each request is timed
/// from its scheduled start.
pub async fn open_loop(
    client: &Client,
    url: &str,
    rate: f64,
    total: u64,
    timeout: Duration,
) -> LoadResult {
    let mut results = open_loop_mixed(client, &[url.to_string()], rate, total, timeout).await;
    results.pop().unwrap_or_else(LoadResult::new)
}

/// Open loop over several URLs in turn (request i goes to `urls[i % n]`),
/// one result per URL, all timed from their scheduled start.
pub async fn open_loop_mixed(
    client: &Client,
    urls: &[String],
    rate: f64,
    total: u64,
    timeout: Duration,
) -> Vec<LoadResult> {
    open_loop_inner(client, urls, rate, total, timeout, &[]).await
}

/// Open loop with the same extra headers on every request.
pub async fn open_loop_with_headers(
    client: &Client,
    url: &str,
    rate: f64,
    total: u64,
    timeout: Duration,
    headers: &[(&str, &str)],
) -> LoadResult {
    let mut results =
        open_loop_inner(client, &[url.to_string()], rate, total, timeout, headers).await;
    results.pop().unwrap_or_else(LoadResult::new)
}

async fn open_loop_inner(
    client: &Client,
    urls: &[String],
    rate: f64,
    total: u64,
    timeout: Duration,
    headers: &[(&str, &str)],
) -> Vec<LoadResult> {
    let headers: Arc<Vec<(String, String)>> = Arc::new(
        headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let results: Vec<Arc<Mutex<LoadResult>>> = urls
        .iter()
        .map(|_| Arc::new(Mutex::new(LoadResult::new())))
        .collect();
    let elapsed = open_loop_schedule(rate, total, |i, due| {
        let k = (i as usize) % urls.len().max(1);
        let (client, url, result) = (
            client.clone(),
            urls.get(k)?.clone(),
            results.get(k)?.clone(),
        );
        let headers = headers.clone();
        Some(tokio::spawn(async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let outcome = get_within(&client, &url, &headers, timeout).await;
            let elapsed = due.elapsed();
            result.lock().unwrap().record(&outcome, elapsed);
        }))
    })
    .await;
    results
        .into_iter()
        .map(|r| {
            let mut r = Arc::try_unwrap(r)
                .ok()
                .map(|m| m.into_inner().unwrap())
                .unwrap_or_default();
            r.elapsed = elapsed;
            r
        })
        .collect()
}

/// The open-loop schedule: `spawn(i, due)` for each of `total` requests at
/// `rate` per second, each at its due time whatever is in flight (`None`
/// stops it); waits for every task. Returns how long it all took.
async fn open_loop_schedule<F>(rate: f64, total: u64, mut spawn: F) -> Duration
where
    F: FnMut(u64, Instant) -> Option<tokio::task::JoinHandle<()>>,
{
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let Some(task) = spawn(i, due) else {
            break;
        };
        tasks.push(task);
    }
    for t in tasks {
        let _ = t.await;
    }
    start.elapsed()
}

/// A GET that gives up after `timeout`.
async fn get_within(
    client: &Client,
    url: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<Reply, String> {
    // its own timeout, longer than REQUEST_TIMEOUT where asked (the
    // callgrind runs: V8 compiles under valgrind for seconds)
    match tokio::time::timeout(timeout, request_unbounded(client, "GET", url, headers)).await {
        Ok(r) => r,
        Err(_) => Err("timeout".into()),
    }
}

/// Fan-out, open loop: `total` front-end requests at `rate` per second,
/// each calling `url` `fanout` times in parallel and done when every call
/// has answered, as a service that needs all its backends' answers does.
/// One result per front-end request, timed from its scheduled start to its
/// last answer (`sent` counts front-end requests; the leaves are `sent` x
/// `fanout`); an error or non-200 leaf makes the front-end request an error.
pub async fn fan_out(
    client: &Client,
    url: &str,
    fanout: u64,
    rate: f64,
    total: u64,
    timeout: Duration,
) -> LoadResult {
    let result = Arc::new(Mutex::new(LoadResult::new()));
    let elapsed = open_loop_schedule(rate, total, |_, due| {
        let (client, url, result) = (client.clone(), url.to_string(), result.clone());
        Some(tokio::spawn(async move {
            let leaves: Vec<_> = (0..fanout)
                .map(|_| {
                    let (client, url) = (client.clone(), url.clone());
                    tokio::spawn(async move { get_within(&client, &url, &[], timeout).await })
                })
                .collect();
            // the front end answers with its slowest leaf, or fails
            let mut outcome: Result<Reply, String> = Err("no leaves".into());
            for leaf in leaves {
                let reply = leaf.await.unwrap_or_else(|e| Err(e.to_string()));
                outcome = match (outcome, reply) {
                    (Err(e), _) if e != "no leaves" => Err(e),
                    (_, Ok(r)) if r.status != 200 => Err(format!("leaf answered {}", r.status)),
                    (_, Err(e)) => Err(e),
                    (Ok(a), Ok(b)) => Ok(if b.elapsed > a.elapsed { b } else { a }),
                    (Err(_), Ok(b)) => Ok(b),
                };
            }
            let elapsed = due.elapsed();
            if let Ok(mut result) = result.lock() {
                result.record(&outcome, elapsed);
            }
        }))
    })
    .await;
    let mut result = Arc::try_unwrap(result)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .unwrap_or_default();
    result.elapsed = elapsed;
    result
}

/// Closed loop: `callers` concurrent callers send `total` requests, each
/// caller waiting for its previous answer.
pub async fn closed_loop(
    client: &Client,
    url: &str,
    callers: u64,
    total: u64,
    timeout: Duration,
) -> LoadResult {
    let result = Arc::new(Mutex::new(LoadResult::new()));
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (client, url, result, next) = (
            client.clone(),
            url.to_string(),
            result.clone(),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < total {
                let t0 = Instant::now();
                let outcome = get_within(&client, &url, &[], timeout).await;
                result.lock().unwrap().record(&outcome, t0.elapsed());
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut r = Arc::try_unwrap(result)
        .ok()
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_default();
    r.elapsed = start.elapsed();
    r
}

/// Exactly one HTTP/1.1 connection (requests go one after the other on it):
/// for tests that need to know which Envoy worker serves them.
pub struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    port: u16,
}

impl Connection {
    pub async fn open(port: u16) -> Result<Connection, String> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(Connection { sender, port })
    }

    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Result<Reply, String> {
        let mut builder = hyper::Request::builder()
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port));
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let req = builder
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let exchange = async {
            self.sender.ready().await.map_err(|e| e.to_string())?;
            let start = Instant::now();
            let resp = self
                .sender
                .send_request(req)
                .await
                .map_err(|e| e.to_string())?;
            Reply::read(resp, start).await
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {REQUEST_TIMEOUT:?}")))
    }
}
