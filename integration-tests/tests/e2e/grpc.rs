//! gRPC through real Envoy: a tonic server on each of three hosts (h2c),
//! a tonic client, `envoy-configs/envoy.yaml` with the cluster speaking
//! HTTP/2. A listed unary method is hedged and the first answer wins; an
//! unlisted method is never duplicated, a client-streaming one included
//! (the filter cannot tell a streaming call from its headers: only the
//! list decides); a fast UNAVAILABLE on a listed method is answered by the
//! second attempt (`grpc_retry_on`; a retry before any hedge is sent).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use integration_tests::harness::envoy::{Envoy, EnvoyOptions};
use integration_tests::runtime;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

/// The request of every method: `id` names the call across its attempts.
#[derive(Clone, PartialEq, prost::Message)]
struct Call {
    #[prost(string, tag = "1")]
    id: String,
    /// How long the call's first attempt takes (later ones: 1 ms).
    #[prost(uint64, tag = "2")]
    first_attempt_ms: u64,
    /// The first attempt fails at once with UNAVAILABLE instead.
    #[prost(bool, tag = "3")]
    fail_first: bool,
    /// Every attempt takes this long (when not 0): past the route timeout.
    #[prost(uint64, tag = "4")]
    every_attempt_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Reply {
    /// Which attempt of the call answered (1: the first).
    #[prost(uint32, tag = "1")]
    attempt: u32,
    #[prost(uint32, tag = "2")]
    host: u32,
}

const LISTED: &str = "/demo.Echo/Get";
const UNLISTED: &str = "/demo.Echo/Put";
const CLIENT_STREAMING: &str = "/demo.Echo/Collect";

/// Attempts seen per call id, all hosts together.
type Attempts = Arc<Mutex<HashMap<String, u32>>>;

/// The `demo.Echo` service of one host: every method counts the attempt
/// and answers as the call asks.
#[derive(Clone)]
struct Echo {
    host: u32,
    attempts: Attempts,
}

impl Echo {
    async fn answer(self, call: Call) -> Result<tonic::Response<Reply>, tonic::Status> {
        let attempt = {
            let mut seen = self.attempts.lock().unwrap();
            let n = seen.entry(call.id.clone()).or_default();
            *n += 1;
            *n
        };
        if attempt == 1 && call.fail_first {
            return Err(tonic::Status::unavailable("first attempt fails"));
        }
        let ms = match (call.every_attempt_ms, attempt) {
            (0, 1) => call.first_attempt_ms,
            (0, _) => 1,
            (every, _) => every,
        };
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(tonic::Response::new(Reply {
            attempt,
            host: self.host,
        }))
    }
}

struct Unary(Echo);

impl tonic::server::UnaryService<Call> for Unary {
    type Response = Reply;
    type Future = BoxFuture<tonic::Response<Reply>, tonic::Status>;
    fn call(&mut self, request: tonic::Request<Call>) -> Self::Future {
        Box::pin(self.0.clone().answer(request.into_inner()))
    }
}

struct Collect(Echo);

impl tonic::server::ClientStreamingService<Call> for Collect {
    type Response = Reply;
    type Future = BoxFuture<tonic::Response<Reply>, tonic::Status>;
    fn call(&mut self, request: tonic::Request<tonic::Streaming<Call>>) -> Self::Future {
        let echo = self.0.clone();
        Box::pin(async move {
            let mut stream = request.into_inner();
            let mut first = None;
            while let Some(call) = stream.message().await? {
                first.get_or_insert(call);
            }
            echo.answer(first.unwrap_or_default()).await
        })
    }
}

impl<B> Service<http::Request<B>> for Echo
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let echo = self.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Reply, Call>::default());
            Ok(match request.uri().path() {
                LISTED | UNLISTED => grpc.unary(Unary(echo), request).await,
                CLIENT_STREAMING => grpc.client_streaming(Collect(echo), request).await,
                _ => tonic::Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

impl tonic::server::NamedService for Echo {
    const NAME: &'static str = "demo.Echo";
}

/// Three tonic servers on 127.0.0.1, stopped when dropped.
struct GrpcHosts {
    ports: Vec<u16>,
    attempts: Attempts,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl GrpcHosts {
    async fn start(n: u32) -> GrpcHosts {
        let attempts = Attempts::default();
        let (mut ports, mut stop) = (Vec::new(), Vec::new());
        for host in 0..n {
            let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
                .await
                .unwrap();
            ports.push(listener.local_addr().unwrap().port());
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stop.push(tx);
            let echo = Echo {
                host,
                attempts: Arc::clone(&attempts),
            };
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(echo)
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        async {
                            let _ = rx.await;
                        },
                    ),
            );
        }
        GrpcHosts {
            ports,
            attempts,
            stop,
        }
    }

    /// The attempts the hosts saw for call `id`.
    fn attempts_of(&self, id: &str) -> u32 {
        self.attempts.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

impl Drop for GrpcHosts {
    fn drop(&mut self) {
        for tx in self.stop.drain(..) {
            let _ = tx.send(());
        }
    }
}

/// What a call returned, and the filter's debug header.
struct Answer {
    reply: Result<Reply, tonic::Status>,
    decision: String,
    took: Duration,
}

async fn channel(envoy: &Envoy) -> Channel {
    Channel::from_shared(format!("http://127.0.0.1:{}", envoy.listener_port))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn decision_of(metadata: &tonic::metadata::MetadataMap) -> String {
    metadata
        .get("x-adaptive-hedge")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

async fn unary(channel: &Channel, method: &'static str, call: Call) -> Answer {
    let mut client = tonic::client::Grpc::new(channel.clone());
    client.ready().await.unwrap();
    let started = Instant::now();
    let result = client
        .unary(
            tonic::Request::new(call),
            PathAndQuery::from_static(method),
            ProstCodec::<Call, Reply>::default(),
        )
        .await;
    let took = started.elapsed();
    match result {
        Ok(response) => Answer {
            decision: decision_of(response.metadata()),
            reply: Ok(response.into_inner()),
            took,
        },
        Err(status) => Answer {
            decision: decision_of(status.metadata()),
            reply: Err(status),
            took,
        },
    }
}

/// The backend cluster speaks HTTP/2 to the hosts (gRPC needs it).
fn over_h2c(options: EnvoyOptions) -> EnvoyOptions {
    options.edit(
        "    - name: backend\n      type: STATIC\n      connect_timeout: 1s\n",
        "    - name: backend\n      type: STATIC\n      connect_timeout: 1s\n      typed_extension_protocol_options:\n        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n          explicit_http_config:\n            http2_protocol_options: {}\n",
    )
}

fn fast(id: String) -> Call {
    Call {
        id,
        first_attempt_ms: 2,
        fail_first: false,
        every_attempt_ms: 0,
    }
}

/// Listed calls until every worker has learned the cluster: 32 calls in a
/// row, each on a new connection (a new connection lands on a worker at
/// random), decided rather than warming up.
async fn warm_up(envoy: &Envoy) {
    let shared = channel(envoy).await;
    for i in 0..150 {
        let answer = unary(&shared, LISTED, fast(format!("warm-{i}"))).await;
        assert!(answer.reply.is_ok(), "{:?}", answer.reply);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut in_a_row = 0;
    let mut i = 0;
    while in_a_row < 32 {
        i += 1;
        let answer = unary(&channel(envoy).await, LISTED, fast(format!("prime-{i}"))).await;
        assert!(answer.reply.is_ok(), "{:?}", answer.reply);
        let decision = answer.decision.as_str();
        match decision.split(';').nth(1).map(str::trim) {
            None => panic!("no debug header: {:?}", answer.reply),
            Some("reason=warming_up" | "reason=unconfirmed") => {
                in_a_row = 0;
                assert!(Instant::now() < deadline, "still warming up after 10 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => in_a_row += 1,
        }
    }
}

#[test]
fn a_listed_unary_method_is_hedged_and_nothing_else_is_duplicated() {
    let rt = runtime();
    let hosts = rt.block_on(GrpcHosts::start(3));
    let plugin = format!(
        r#"{{"debug_header": true, "min_samples": 50, "budget_percent": 50, "min_delay": "20ms", "idempotent_grpc_methods": ["{LISTED}"]}}"#
    );
    // a route timeout of 2 s: longer than any call below but the last
    let envoy = Envoy::start(
        over_h2c(EnvoyOptions::new("envoy.yaml", &hosts.ports))
            .plugin_config(&plugin)
            .edit(
                "match: { prefix: \"/\" }\n                          route: { cluster: backend }",
                "match: { prefix: \"/\" }\n                          route: { cluster: backend, timeout: 2s }",
            ),
    )
    .unwrap();
    rt.block_on(async {
        warm_up(&envoy).await;
        let channel = channel(&envoy).await;

        // a listed method whose first attempt stalls: the hedge answers
        let slow = Call {
            first_attempt_ms: 3_000,
            ..fast("listed-slow".into())
        };
        let answer = unary(&channel, LISTED, slow).await;
        let reply = answer.reply.as_ref().expect("the hedge's answer");
        assert_eq!(reply.attempt, 2, "the second attempt's answer wins");
        assert!(answer.decision.starts_with("armed"), "{}", answer.decision);
        assert!(
            answer.took < Duration::from_millis(2_000),
            "{:?}: the call waited for its stalled first attempt",
            answer.took
        );
        assert_eq!(hosts.attempts_of("listed-slow"), 2);

        // a fast UNAVAILABLE from the first attempt does not end the race
        let failing = Call {
            fail_first: true,
            ..fast("listed-unavailable".into())
        };
        let answer = unary(&channel, LISTED, failing).await;
        assert!(answer.decision.starts_with("armed"), "{}", answer.decision);
        assert_eq!(
            answer.reply.as_ref().map(|r| r.attempt).ok(),
            Some(2),
            "{:?}",
            answer.reply
        );

        // an unlisted method: one attempt, however slow
        let slow = Call {
            first_attempt_ms: 600,
            ..fast("unlisted-slow".into())
        };
        let answer = unary(&channel, UNLISTED, slow).await;
        assert_eq!(answer.reply.as_ref().map(|r| r.attempt).ok(), Some(1));
        assert!(
            answer.decision.starts_with("skipped; reason=grpc_method"),
            "{}",
            answer.decision
        );
        assert!(answer.took >= Duration::from_millis(600));
        // and its fast UNAVAILABLE reaches the client: nothing retried it
        let failing = Call {
            fail_first: true,
            ..fast("unlisted-unavailable".into())
        };
        let answer = unary(&channel, UNLISTED, failing).await;
        assert_eq!(
            answer.reply.as_ref().map_err(|s| s.code()).err(),
            Some(tonic::Code::Unavailable)
        );

        // a client-streaming call (unlisted): one attempt
        let mut client = tonic::client::Grpc::new(channel.clone());
        client.ready().await.unwrap();
        let messages: Vec<Call> = (0..3)
            .map(|_| Call {
                first_attempt_ms: 600,
                ..fast("streaming-slow".into())
            })
            .collect();
        let response = client
            .client_streaming(
                tonic::Request::new(tokio_stream::iter(messages)),
                PathAndQuery::from_static(CLIENT_STREAMING),
                ProstCodec::<Call, Reply>::default(),
            )
            .await
            .unwrap();
        let decision = decision_of(response.metadata());
        assert!(
            decision.starts_with("skipped; reason=grpc_method"),
            "{decision}"
        );
        assert_eq!(response.into_inner().attempt, 1);

        for id in ["unlisted-slow", "unlisted-unavailable", "streaming-slow"] {
            assert_eq!(hosts.attempts_of(id), 1, "{id} was duplicated");
        }

        // a listed call that outlives the route timeout in every attempt:
        // UNAVAILABLE, as without the filter (the router's 504 mapped), not
        // the UNKNOWN of the 204 armed requests ask for on timeouts
        let hung = Call {
            every_attempt_ms: 5_000,
            ..fast("listed-hung".into())
        };
        let answer = unary(&channel, LISTED, hung).await;
        assert!(answer.decision.starts_with("armed"), "{}", answer.decision);
        let status = answer.reply.as_ref().err();
        assert_eq!(
            status.map(tonic::Status::code),
            Some(tonic::Code::Unavailable),
            "{status:?}"
        );
        assert_eq!(hosts.attempts_of("listed-hung"), 2);
    });
    let sent = envoy.flushed_filter_stat("hedges_sent_total", "backend", 2);
    assert!(sent >= 2, "{}", envoy.filter_stats("backend"));
    envoy.assert_no_vm_failure();
}
