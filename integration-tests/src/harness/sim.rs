//! Upstream simulator: several HTTP hosts on 127.0.0.1, each with a latency
//! model, counting what arrives, completes and is cancelled.
//!
//! Per-request controls (request headers, for deterministic tests):
//! - `x-sim-echo: <name>,<name>`: the named request headers' values as the
//!   host received them, in `x-sim-echo-<name>` (joined by " | ").
//! - `x-sim-delay-ms: N`: answer after N ms (every attempt).
//! - `x-sim-first-delay-ms: N`: the FIRST attempt of this request (same
//!   `x-request-id`, which Envoy keeps across retries and hedges) waits N ms;
//!   later attempts use `x-sim-delay-ms` or the host's model.
//!
//! - `x-sim-stream: <chunks>`: streaming (SSE, LLM tokens): headers at once,
//!   the first body chunk after the delay (the time to first byte), then
//!   `<chunks> - 1` more chunks every `x-sim-chunk-gap-ms` (10) ms.
//!   Completion = the last chunk sent. `0` chunks: headers at once, then the
//!   end of the body after the delay, with no data. `x-sim-trailers: 1` ends
//!   the stream with trailers (HTTP/2, or HTTP/1.1 when the request allows).
//!   A host started with a default stream (`Simulator::set_stream`, the
//!   `sim` binary's `--stream`) streams every request that does not say
//!   (`x-sim-stream: off`: a plain response) and is not a HEAD.
//! - A response whose latency came from the model's slow mode (a straggler,
//!   a cache miss) carries `x-sim-straggler: 1` (plain responses).
//! - Every response echoes the first-byte marker the request carried, if
//!   any, as `x-sim-marker` (what the filter sent upstream).
//! - `x-sim-body: empty`: a `200` with `content-length: 0` after the delay.
//! - `upgrade: websocket`: `101 Switching Protocols`, then every byte sent
//!   is echoed back.
//!
//! - `x-sim-status: N`: answer with status N (every attempt); without it,
//!   the host's status (`Simulator::set_status`, `set_flaky`: a share of
//!   its requests), else 200. `x-sim-later-status: N`: attempts after the
//!   first answer with status N (a hedge to an overloaded host).
//!   `x-sim-fail-fast: 1`: a status other than 200 is answered at once,
//!   not after the delay (a full queue's 503).
//! - `x-sim-fault: reset`: close the connection after the delay, before any
//!   response; `reset-mid-body`: headers and a first chunk, then a reset.
//!
//! Without them a request follows its host's [`Latency`] model, which can be
//! changed while running (`set_model`, or the control endpoint).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::Rng;
use rand_distr::{Distribution, LogNormal};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;

use adaptive_hedge::headers::FIRST_BYTE_MARKER;

/// How long a host takes to answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Latency {
    Fixed(Duration),
    /// Lognormal base (mean, sd in ms); with probability `straggler_prob` a
    /// request takes `straggler_mult` times its base.
    LogNormal {
        mean_ms: f64,
        sd_ms: f64,
        straggler_prob: f64,
        straggler_mult: f64,
    },
    /// A cache in front of a slow backend (an inference server's prompt
    /// cache): hits lognormal (`hit_mean_ms`, `hit_sd_ms`); with probability
    /// `miss_prob` a miss, lognormal (`miss_mean_ms`, `miss_sd_ms`).
    Cache {
        hit_mean_ms: f64,
        hit_sd_ms: f64,
        miss_prob: f64,
        miss_mean_ms: f64,
        miss_sd_ms: f64,
    },
}

/// A lognormal sample with the given mean and standard deviation (ms).
fn lognormal_ms(mean_ms: f64, sd_ms: f64, rng: &mut impl Rng) -> f64 {
    let sigma2 = (1.0 + (sd_ms * sd_ms) / (mean_ms * mean_ms)).ln();
    let mu = mean_ms.ln() - sigma2 / 2.0;
    LogNormal::new(mu, sigma2.sqrt())
        .map(|d| d.sample(rng))
        .unwrap_or(mean_ms)
}

impl Latency {
    /// The reference workload (docs/reference-workload.md): lognormal mean 5 ms,
    /// sd 2 ms, 5% stragglers at 10x.
    pub fn reference() -> Self {
        Latency::LogNormal {
            mean_ms: 5.0,
            sd_ms: 2.0,
            straggler_prob: 0.05,
            straggler_mult: 10.0,
        }
    }

    /// Time to first token of a streaming model server: prompt-cache hits
    /// lognormal mean 15 ms sd 3 ms, 20% misses lognormal mean 200 ms sd 25 ms.
    pub fn streaming() -> Self {
        Latency::Cache {
            hit_mean_ms: 15.0,
            hit_sd_ms: 3.0,
            miss_prob: 0.2,
            miss_mean_ms: 200.0,
            miss_sd_ms: 25.0,
        }
    }

    /// `["fixed", ms]`, `["lognormal", mean_ms, sd_ms, straggler_prob,
    /// straggler_mult]`, `["cache", hit_mean_ms, hit_sd_ms, miss_prob,
    /// miss_mean_ms, miss_sd_ms]`, `["reference"]` or `["streaming"]` (the
    /// control endpoint's `/model/<host>/lognormal/5/2/0.05/10`, the `sim`
    /// binary's `--model lognormal:5:2:0.05:10`).
    pub fn parse(parts: &[&str]) -> Option<Latency> {
        let nums: Vec<f64> = parts
            .iter()
            .skip(1)
            .map(|s| s.parse().ok())
            .collect::<Option<_>>()?;
        if nums.iter().any(|n| !n.is_finite() || *n < 0.0) {
            return None;
        }
        match (parts.first(), nums.as_slice()) {
            (Some(&"reference"), []) => Some(Latency::reference()),
            (Some(&"streaming"), []) => Some(Latency::streaming()),
            (Some(&"cache"), [hit_mean_ms, hit_sd_ms, miss_prob, miss_mean_ms, miss_sd_ms])
                if *hit_mean_ms > 0.0 && *miss_mean_ms > 0.0 && *miss_prob <= 1.0 =>
            {
                Some(Latency::Cache {
                    hit_mean_ms: *hit_mean_ms,
                    hit_sd_ms: *hit_sd_ms,
                    miss_prob: *miss_prob,
                    miss_mean_ms: *miss_mean_ms,
                    miss_sd_ms: *miss_sd_ms,
                })
            }
            (Some(&"fixed"), [ms]) => Some(Latency::Fixed(Duration::from_secs_f64(ms / 1000.0))),
            (Some(&"lognormal"), [mean_ms, sd_ms, straggler_prob, straggler_mult])
                if *mean_ms > 0.0 && *straggler_prob <= 1.0 =>
            {
                Some(Latency::LogNormal {
                    mean_ms: *mean_ms,
                    sd_ms: *sd_ms,
                    straggler_prob: *straggler_prob,
                    straggler_mult: *straggler_mult,
                })
            }
            _ => None,
        }
    }

    pub fn fixed_ms(ms: u64) -> Self {
        Latency::Fixed(Duration::from_millis(ms))
    }

    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        self.sample_kind(rng).0
    }

    /// A latency, and whether it came from the slow mode (a straggler, a
    /// cache miss).
    pub fn sample_kind(&self, rng: &mut impl Rng) -> (Duration, bool) {
        match *self {
            Latency::Fixed(d) => (d, false),
            Latency::LogNormal {
                mean_ms,
                sd_ms,
                straggler_prob,
                straggler_mult,
            } => {
                let base = lognormal_ms(mean_ms, sd_ms, rng);
                let slow = rng.gen::<f64>() < straggler_prob;
                let ms = if slow { base * straggler_mult } else { base };
                (Duration::from_secs_f64(ms / 1000.0), slow)
            }
            Latency::Cache {
                hit_mean_ms,
                hit_sd_ms,
                miss_prob,
                miss_mean_ms,
                miss_sd_ms,
            } => {
                let slow = rng.gen::<f64>() < miss_prob;
                let ms = if slow {
                    lognormal_ms(miss_mean_ms, miss_sd_ms, rng)
                } else {
                    lognormal_ms(hit_mean_ms, hit_sd_ms, rng)
                };
                (Duration::from_secs_f64(ms / 1000.0), slow)
            }
        }
    }
}

/// A host's default for requests that carry no `x-sim-stream`: every
/// response streams `chunks` chunks, `gap` apart, after the time to first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    pub chunks: u64,
    pub gap: Duration,
}

impl Stream {
    /// `chunks:gap_ms` (the `sim` binary's `--stream 20:10`).
    pub fn parse(text: &str) -> Option<Stream> {
        let (chunks, gap) = text.split_once(':')?;
        Some(Stream {
            chunks: chunks.trim().parse().ok()?,
            gap: Duration::from_millis(gap.trim().parse().ok()?),
        })
    }
}

/// What one host saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCounts {
    pub arrivals: u64,
    pub completions: u64,
    /// The client (Envoy) went away before the response was sent: a hedge loser.
    pub cancellations: u64,
}

#[derive(Default)]
struct HostStats {
    arrivals: AtomicU64,
    completions: AtomicU64,
    cancellations: AtomicU64,
}

struct Host {
    index: usize,
    model: Mutex<Latency>,
    /// Every response's status unless the request says (0: 200)...
    status: AtomicU64,
    /// ... for this share of the requests (per mille).
    status_permille: AtomicU64,
    stats: HostStats,
}

struct Shared {
    hosts: Vec<Arc<Host>>,
    stream: Mutex<Option<Stream>>,
    /// Attempts seen per x-request-id (to tell a first attempt from a hedge).
    attempts: Mutex<HashMap<String, u32>>,
}

pub struct Simulator {
    shared: Arc<Shared>,
    ports: Vec<u16>,
    control_port: u16,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Simulator {
    /// Starts one host per model on free loopback ports, plus a control port.
    pub fn start(models: Vec<Latency>) -> std::io::Result<Simulator> {
        let addrs = vec!["127.0.0.1:0".to_string(); models.len()];
        Simulator::start_at(&addrs, "127.0.0.1:0", models)
    }

    /// Starts one host per model on the given addresses (the `sim` binary of
    /// the docker-compose demo binds 0.0.0.0), plus a control port.
    pub fn start_at(
        addrs: &[String],
        control_addr: &str,
        models: Vec<Latency>,
    ) -> std::io::Result<Simulator> {
        let hosts: Vec<Arc<Host>> = models
            .into_iter()
            .enumerate()
            .map(|(index, model)| {
                Arc::new(Host {
                    index,
                    model: Mutex::new(model),
                    status: AtomicU64::new(0),
                    status_permille: AtomicU64::new(1000),
                    stats: HostStats::default(),
                })
            })
            .collect();
        let shared = Arc::new(Shared {
            hosts,
            stream: Mutex::new(None),
            attempts: Mutex::new(HashMap::new()),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .thread_name("upstream-sim")
            .build()?;
        let mut listeners = Vec::new();
        let mut ports = Vec::new();
        for addr in addrs.iter().take(shared.hosts.len()) {
            let std_listener = std::net::TcpListener::bind(addr)?;
            std_listener.set_nonblocking(true)?;
            ports.push(std_listener.local_addr()?.port());
            listeners.push(std_listener);
        }
        let control = std::net::TcpListener::bind(control_addr)?;
        control.set_nonblocking(true)?;
        let control_port = control.local_addr()?.port();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task_shared = shared.clone();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                for (host, listener) in task_shared.hosts.iter().zip(listeners) {
                    if let Ok(listener) = TcpListener::from_std(listener) {
                        tokio::spawn(serve_host(listener, task_shared.clone(), host.clone()));
                    }
                }
                if let Ok(control) = TcpListener::from_std(control) {
                    tokio::spawn(serve_control(control, task_shared.clone()));
                }
                let _ = stop_rx.await;
            });
            runtime.shutdown_timeout(Duration::from_millis(100));
        });
        Ok(Simulator {
            shared,
            ports,
            control_port,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    pub fn control_port(&self) -> u16 {
        self.control_port
    }

    pub fn counts(&self) -> Vec<HostCounts> {
        self.shared.hosts.iter().map(|h| counts_of(h)).collect()
    }

    pub fn total(&self) -> HostCounts {
        self.counts()
            .iter()
            .fold(HostCounts::default(), |a, c| HostCounts {
                arrivals: a.arrivals + c.arrivals,
                completions: a.completions + c.completions,
                cancellations: a.cancellations + c.cancellations,
            })
    }

    pub fn set_model(&self, host: usize, model: Latency) {
        if let Some(h) = self.shared.hosts.get(host) {
            *h.model.lock().unwrap() = model;
        }
    }

    /// Makes `host` answer every request with `status` (`None`: 200),
    /// after its model's latency.
    pub fn set_status(&self, host: usize, status: Option<u16>) {
        self.set_flaky(host, status, 1.0);
    }

    /// Makes `host` answer `share` of its requests (at random) with
    /// `status` (`None`: all 200).
    pub fn set_flaky(&self, host: usize, status: Option<u16>, share: f64) {
        if let Some(h) = self.shared.hosts.get(host) {
            h.status_permille.store(
                (share.clamp(0.0, 1.0) * 1000.0).round() as u64,
                Ordering::SeqCst,
            );
            h.status
                .store(status.map_or(0, u64::from), Ordering::SeqCst);
        }
    }

    /// Makes every response stream (or not) unless its request says.
    pub fn set_stream(&self, stream: Option<Stream>) {
        *self.shared.stream.lock().unwrap() = stream;
    }

    pub fn set_all_models(&self, model: Latency) {
        for i in 0..self.shared.hosts.len() {
            self.set_model(i, model.clone());
        }
    }

    /// Zeroes the counters (e.g. after a warm-up phase).
    pub fn reset_counts(&self) {
        for h in &self.shared.hosts {
            h.stats.arrivals.store(0, Ordering::SeqCst);
            h.stats.completions.store(0, Ordering::SeqCst);
            h.stats.cancellations.store(0, Ordering::SeqCst);
        }
        self.shared.attempts.lock().unwrap().clear();
    }

    /// Waits until every arrival has completed or been cancelled (losers are
    /// cancelled asynchronously), at most `timeout`.
    pub fn settle(&self, timeout: Duration) -> HostCounts {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let t = self.total();
            if t.arrivals == t.completions + t.cancellations || std::time::Instant::now() > deadline
            {
                return t;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn counts_of(h: &Host) -> HostCounts {
    HostCounts {
        arrivals: h.stats.arrivals.load(Ordering::SeqCst),
        completions: h.stats.completions.load(Ordering::SeqCst),
        cancellations: h.stats.cancellations.load(Ordering::SeqCst),
    }
}

async fn serve_host(listener: TcpListener, shared: Arc<Shared>, host: Arc<Host>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (shared, host) = (shared.clone(), host.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |req| handle(req, shared.clone(), host.clone()));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Counts a cancellation if the response is dropped before it finishes
/// (hyper drops it when the client closes the connection or resets the stream).
struct InFlight {
    host: Arc<Host>,
    done: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let counter = if self.done {
            &self.host.stats.completions
        } else {
            &self.host.stats.cancellations
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

/// An error in a body or a handler makes hyper abort the connection (an
/// upstream reset, as Envoy sees it).
type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

fn full(text: String) -> Body {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

/// What a request asks the host to do wrong (`x-sim-fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Close the connection after the delay, before any response.
    Reset,
    /// Send the headers and a first chunk after the delay, then reset.
    ResetMidBody,
}

/// An expensive endpoint on the same hosts: a path under `/x<N>/` (N from 2
/// to 1000) takes N times the model's latency (`envoy-configs/envoy.yaml`
/// routes `/x10/` by a route of its own).
pub fn path_scale(path: &str) -> f64 {
    path.strip_prefix("/x")
        .and_then(|rest| rest.split('/').next())
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|n| (2..=1000).contains(n))
        .map_or(1.0, f64::from)
}

fn header_ms(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.headers().get(name)?.to_str().ok()?.trim().parse().ok()
}

async fn handle(
    mut req: Request<Incoming>,
    shared: Arc<Shared>,
    host: Arc<Host>,
) -> Result<Response<Body>, BoxError> {
    host.stats.arrivals.fetch_add(1, Ordering::SeqCst);
    let mut guard = InFlight {
        host: host.clone(),
        done: false,
    };
    if req
        .headers()
        .get("upgrade")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
    {
        guard.done = true;
        return Ok(websocket_echo(&mut req, host.index));
    }
    let attempt = match req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
    {
        Some(id) => {
            let mut attempts = shared.attempts.lock().unwrap();
            let n = attempts.entry(id.to_string()).or_insert(0);
            *n += 1;
            *n
        }
        None => 1,
    };
    let (delay, straggler) = match (
        attempt,
        header_ms(&req, "x-sim-first-delay-ms"),
        header_ms(&req, "x-sim-delay-ms"),
    ) {
        (1, Some(first), _) => (Duration::from_millis(first), false),
        (_, _, Some(ms)) => (Duration::from_millis(ms), false),
        _ => {
            let model = host.model.lock().unwrap().clone();
            let (delay, straggler) = model.sample_kind(&mut rand::thread_rng());
            (delay.mul_f64(path_scale(req.uri().path())), straggler)
        }
    };
    // Envoy tells the upstream its timeout: with a per-try timeout armed, that
    // is the hedge delay. Echoed so tests can see what each worker armed.
    let expected_timeout = req.headers().get("x-envoy-expected-rq-timeout-ms").cloned();
    // `x-sim-echo: a,b`: each named header's values as received, joined by
    // " | ", in `x-sim-echo-<name>` (what reached the host, for tests)
    let echo: Vec<(String, String)> = req
        .headers()
        .get("x-sim-echo")
        .and_then(|v| v.to_str().ok())
        .map(|names| {
            names
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| {
                    let values: Vec<&str> = req
                        .headers()
                        .get_all(n)
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .collect();
                    (format!("x-sim-echo-{n}"), values.join(" | "))
                })
                .collect()
        })
        .unwrap_or_default();
    let fault = match req.headers().get("x-sim-fault").map(|v| v.as_bytes()) {
        Some(b"reset") => Some(Fault::Reset),
        Some(b"reset-mid-body") => Some(Fault::ResetMidBody),
        _ => None,
    };
    let default_stream = *shared.stream.lock().unwrap();
    let marker = req.headers().get(FIRST_BYTE_MARKER).cloned();
    let stream = match (req.headers().get("x-sim-stream"), default_stream) {
        (Some(v), _) if v.as_bytes() == b"off" => None,
        (Some(_), _) => header_ms(&req, "x-sim-stream").map(|chunks| Stream {
            chunks,
            gap: Duration::from_millis(header_ms(&req, "x-sim-chunk-gap-ms").unwrap_or(10)),
        }),
        (None, Some(s)) if req.method() != hyper::Method::HEAD => Some(s),
        _ => None,
    };
    if let Some(stream) = stream {
        let trailers = header_ms(&req, "x-sim-trailers") == Some(1);
        return Ok(with_marker(
            stream_response(guard, attempt, delay, stream, trailers, None),
            marker,
        ));
    }
    if fault == Some(Fault::ResetMidBody) {
        let stream = Stream {
            chunks: 3,
            gap: Duration::from_millis(5),
        };
        return Ok(stream_response(guard, attempt, delay, stream, false, fault));
    }
    let host_status = match host.status.load(Ordering::SeqCst) {
        0 => 200,
        s if rand::thread_rng().gen_range(0..1000)
            < host.status_permille.load(Ordering::SeqCst) =>
        {
            s
        }
        _ => 200,
    };
    let status = match header_ms(&req, "x-sim-later-status") {
        Some(later) if attempt > 1 => later,
        _ => header_ms(&req, "x-sim-status").unwrap_or(host_status),
    };
    // a failure at once (a 503 from a full queue), not after the latency
    let delay = match status != 200 && header_ms(&req, "x-sim-fail-fast") == Some(1) {
        true => Duration::ZERO,
        false => delay,
    };
    let is_head = req.method() == hyper::Method::HEAD;
    let req_body_empty = req
        .headers()
        .get("x-sim-body")
        .is_some_and(|v| v.as_bytes() == b"empty");
    crate::harness::timer::sleep(delay).await;
    if fault == Some(Fault::Reset) {
        guard.done = true; // it did answer, in its way
        return Err("x-sim-fault: reset".into());
    }
    // drain the request body (a hedged GET has none)
    let _ = req.into_body().collect().await;
    guard.done = true;
    // 204, 304 and HEAD answers have no body by definition (HTTP/2 rejects one).
    let body = match req_body_empty || status == 204 || status == 304 || is_head {
        true => String::new(),
        false => format!("host={} attempt={attempt}\n", host.index),
    };
    let mut response = Response::builder();
    if let Some(t) = expected_timeout {
        response = response.header("x-sim-expected-timeout-ms", t);
    }
    if straggler {
        response = response.header("x-sim-straggler", "1");
    }
    for (name, value) in echo {
        response = response.header(name, value);
    }
    let response = response
        .status(u16::try_from(status).unwrap_or(200))
        .header("x-sim-host", host.index.to_string())
        .header("x-sim-attempt", attempt.to_string())
        .body(full(body))
        .unwrap_or_else(|_| Response::new(full(String::new())));
    Ok(with_marker(response, marker))
}

fn with_marker(
    mut response: Response<Body>,
    marker: Option<hyper::header::HeaderValue>,
) -> Response<Body> {
    if let Some(marker) = marker {
        response.headers_mut().insert("x-sim-marker", marker);
    }
    response
}

/// Headers now; the first chunk after `first_byte`, then one every `gap`
/// (no chunk at all: the end of the body after `first_byte`).
fn stream_response(
    guard: InFlight,
    attempt: u32,
    first_byte: Duration,
    stream: Stream,
    trailers: bool,
    fault: Option<Fault>,
) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
    let index = guard.host.index;
    tokio::spawn(async move {
        // move the whole guard in (not just its field): its Drop does the counting
        let mut guard = guard;
        crate::harness::timer::sleep(first_byte).await;
        for i in 0..stream.chunks {
            if i > 0 {
                crate::harness::timer::sleep(stream.gap).await;
            }
            if i == 1 && fault == Some(Fault::ResetMidBody) {
                guard.done = true;
                let _ = tx.send(Err("x-sim-fault: reset-mid-body".into())).await;
                return;
            }
            let chunk = format!("data: host={index} attempt={attempt} chunk={i}\n\n");
            if tx.send(Ok(Frame::data(Bytes::from(chunk)))).await.is_err() {
                return; // the client went away: guard counts a cancellation
            }
        }
        if trailers {
            let mut map = hyper::HeaderMap::new();
            map.insert(
                "x-sim-chunks",
                hyper::header::HeaderValue::from(stream.chunks),
            );
            if tx.send(Ok(Frame::trailers(map))).await.is_err() {
                return;
            }
        }
        guard.done = true;
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-sim-host", index.to_string())
        .header("x-sim-attempt", attempt.to_string())
        .body(StreamBody::new(ReceiverStream::new(rx)).boxed())
        .unwrap_or_else(|_| Response::new(full(String::new())))
}

/// `101 Switching Protocols`, then an echo of every byte on the upgraded
/// connection (a WebSocket as far as a proxy can tell).
fn websocket_echo(req: &mut Request<Incoming>, index: usize) -> Response<Body> {
    let upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let (mut rd, mut wr) = tokio::io::split(TokioIo::new(upgraded));
        let _ = tokio::io::copy(&mut rd, &mut wr).await;
    });
    Response::builder()
        .status(101)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("x-sim-host", index.to_string())
        .body(full(String::new()))
        .unwrap_or_else(|_| Response::new(full(String::new())))
}

/// Control endpoint: `GET /stats` (JSON counts per host),
/// `POST /model/<host>/fixed/<ms>`, `POST /model/<host>/lognormal/<mean>/<sd>/<p>/<mult>`
/// (`<host>` may be `all`), `POST /reset`.
async fn serve_control(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(control(&req, &shared)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn control(req: &Request<Incoming>, shared: &Shared) -> Response<Body> {
    let parts: Vec<&str> = req.uri().path().trim_matches('/').split('/').collect();
    let reply = |status: u16, body: String| {
        Response::builder()
            .status(status)
            .body(full(body))
            .unwrap_or_else(|_| Response::new(full(String::new())))
    };
    match parts.as_slice() {
        ["stats"] => {
            let hosts: Vec<serde_json::Value> = shared
                .hosts
                .iter()
                .map(|h| {
                    let c = counts_of(h);
                    serde_json::json!({"host": h.index, "arrivals": c.arrivals, "completions": c.completions, "cancellations": c.cancellations})
                })
                .collect();
            reply(200, serde_json::json!({ "hosts": hosts }).to_string())
        }
        ["reset"] => {
            for h in &shared.hosts {
                h.stats.arrivals.store(0, Ordering::SeqCst);
                h.stats.completions.store(0, Ordering::SeqCst);
                h.stats.cancellations.store(0, Ordering::SeqCst);
            }
            shared.attempts.lock().unwrap().clear();
            reply(200, "reset\n".into())
        }
        ["model", host, rest @ ..] => {
            let Some(model) = Latency::parse(rest) else {
                return reply(400, "bad model\n".into());
            };
            for h in shared
                .hosts
                .iter()
                .filter(|h| *host == "all" || host.parse() == Ok(h.index))
            {
                *h.model.lock().unwrap() = model.clone();
            }
            reply(200, format!("{model:?}\n"))
        }
        _ => reply(404, "unknown\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn an_x_prefix_scales_the_latency() {
        assert_eq!(path_scale("/x10/item"), 10.0);
        assert_eq!(path_scale("/x10"), 10.0);
        for plain in ["/", "/b/x10/", "/x1/", "/x/", "/xyz/", "/x5000/"] {
            assert_eq!(path_scale(plain), 1.0, "{plain}");
        }
    }

    #[test]
    fn streaming_model_has_fast_hits_and_a_fifth_of_slow_misses() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let model = Latency::parse(&["streaming"]).unwrap();
        let ms: Vec<f64> = (0..20_000)
            .map(|_| model.sample(&mut rng).as_secs_f64() * 1000.0)
            .collect();
        let misses = ms.iter().filter(|&&m| m > 80.0).count() as f64 / ms.len() as f64;
        assert!((misses - 0.2).abs() < 0.015, "miss share {misses}");
        let hits: Vec<f64> = ms.iter().copied().filter(|&m| m <= 80.0).collect();
        let mean = hits.iter().sum::<f64>() / hits.len() as f64;
        assert!((mean - 15.0).abs() < 0.5, "hit mean {mean}");
        assert_eq!(
            Latency::parse(&["cache", "15", "3", "0.2", "200", "25"]),
            Some(Latency::streaming())
        );
        assert_eq!(
            Latency::parse(&["cache", "15", "3", "1.5", "200", "25"]),
            None
        );
        assert_eq!(
            Stream::parse("20:10"),
            Some(Stream {
                chunks: 20,
                gap: Duration::from_millis(10)
            })
        );
        assert_eq!(Stream::parse("20"), None);
    }
}
