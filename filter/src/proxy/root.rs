//! The plugin: validates the configuration once (refusing a bad one, so
//! Envoy rejects it), then on every tick merges this worker's samples and
//! budget into shared memory and refreshes the cached delays (downstream
//! role), or checks and counts the holds (upstream role). It makes each
//! request's or attempt's context.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use super::downstream::DownstreamRequest;
use super::host::Host;
use super::placement::Placement;
use super::upstream::UpstreamAttempt;
use crate::policy::config::{Config, Role};
use crate::policy::hold::HoldStats;
use crate::policy::worker::Worker;
use crate::telemetry::Level;

/// The upstream role's tick: its misconfiguration check and counters need
/// no more than this.
const UPSTREAM_TICK_MS: u32 = 1000;

/// The longest wait for the admin interface's answer (ms; at most
/// `admin_refresh`).
const ADMIN_READ_TIMEOUT_MS: u32 = 5_000;

pub struct Plugin<H: Host> {
    host: H,
    role: Role,
    /// Downstream role: the learning, budget and decisions of this VM.
    worker: Option<Rc<RefCell<Worker>>>,
    /// Upstream role: what its attempts held and released.
    holds: Rc<RefCell<HoldStats>>,
    placement: Rc<Placement>,
    /// The read of Envoy's admin interface this VM sent (`admin_cluster`).
    admin_read: Option<u32>,
}

/// A context for one HTTP stream, of the plugin's role. Moved into a box
/// at once (`sdk.rs`), one per stream: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Stream<H: Host> {
    Downstream(DownstreamRequest<H>),
    Upstream(UpstreamAttempt<H>),
}

impl<H: Host> Plugin<H> {
    pub fn new(host: H) -> Self {
        Plugin {
            host,
            role: Role::Downstream,
            worker: None,
            holds: Rc::default(),
            placement: Rc::new(Placement::new(Role::Downstream)),
            admin_read: None,
        }
    }

    /// `false` refuses the configuration (Envoy then rejects it).
    pub fn on_configure(&mut self, configuration_size: usize) -> bool {
        let bytes = match self.host.plugin_configuration(configuration_size) {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(status) => {
                self.log_error(&format!(
                    "adaptive-hedge: cannot read the plugin configuration (status {})",
                    status.0
                ));
                return false;
            }
        };
        let config = match Config::parse(&bytes) {
            Ok(config) => Arc::new(config),
            Err(e) => {
                // Envoy logs a generic "Unable to create Wasm HTTP filter" next to this line.
                self.log_error(&format!("adaptive-hedge: {e}"));
                return false;
            }
        };
        for warning in &config.warnings {
            self.host
                .log(Level::Warn, &format!("adaptive-hedge: {warning}"));
        }
        let tick_ms = match config.role {
            Role::Downstream => u32::try_from(config.sync_interval.as_millis()).unwrap_or(u32::MAX),
            Role::Upstream => UPSTREAM_TICK_MS,
        };
        if let Err(status) = self.host.set_tick_period_ms(tick_ms) {
            self.log_error(&format!(
                "adaptive-hedge: cannot set the tick period (status {})",
                status.0
            ));
            return false;
        }
        self.host.log(
            Level::Info,
            &format!(
                "adaptive-hedge {} configured: {}",
                crate::VERSION,
                config.effective_json()
            ),
        );
        self.role = config.role;
        if let (Role::Upstream, Ok(now_ns), Ok(mut holds)) =
            (config.role, self.host.now_ns(), self.holds.try_borrow_mut())
        {
            holds.started(now_ns / 1_000_000);
        }
        self.placement = Rc::new(Placement::new(config.role));
        self.worker =
            (config.role == Role::Downstream).then(|| Rc::new(RefCell::new(Worker::new(config))));
        true
    }

    /// The plugin is going away (replaced by a new configuration, or
    /// Envoy stopping), after its last stream: what this worker learned
    /// since its last tick, its counts and its budgets' tokens go to
    /// shared memory and the stats, for the configuration that follows.
    pub fn on_done(&mut self) {
        let Some(Ok(mut worker)) = self.worker.as_ref().map(|w| w.try_borrow_mut()) else {
            // the upstream role: its counts since the last tick
            if let Ok(mut holds) = self.holds.try_borrow_mut() {
                holds.flush_metrics(&mut self.host.clone());
            }
            return;
        };
        let Ok(now_ns) = self.host.now_ns() else {
            return;
        };
        let mut host = self.host.clone();
        let handed = worker.retire(now_ns / 1_000_000, &self.host, &mut host);
        worker.flush_metrics(&mut host);
        if handed > 0 {
            self.host.log(
                Level::Info,
                &format!(
                    "adaptive-hedge: configuration retired; {handed} clusters' budgets handed over"
                ),
            );
        }
    }

    fn log_error(&mut self, message: &str) {
        self.host.log(Level::Error, message);
    }

    pub fn on_tick(&mut self) {
        let Ok(now_ns) = self.host.now_ns() else {
            return;
        };
        let now_ms = now_ns / 1_000_000;
        let mut host = self.host.clone();
        match self.role {
            Role::Downstream => {
                let Some(Ok(mut worker)) = self.worker.as_ref().map(|w| w.try_borrow_mut()) else {
                    return;
                };
                worker.stir(now_ns);
                worker.sync(now_ms, &self.host, &mut host);
                if let Some(path) = worker.claim_admin_read(now_ms, &self.host) {
                    self.admin_read = read_admin(&self.host, &mut worker, now_ms, path);
                }
                worker.flush_metrics(&mut host);
            }
            Role::Upstream => {
                let Ok(mut holds) = self.holds.try_borrow_mut() else {
                    return;
                };
                holds.check(now_ms, &mut host);
                holds.flush_metrics(&mut host);
            }
        }
    }

    /// The answer to an HTTP call this VM made: the admin read's, if its
    /// token (a 200's body, or why not).
    pub fn on_http_call_response(&mut self, token: u32, body_size: usize) {
        if self.admin_read != Some(token) {
            return;
        }
        self.admin_read = None;
        let Ok(now_ns) = self.host.now_ns() else {
            return;
        };
        let Some(Ok(mut worker)) = self.worker.as_ref().map(|w| w.try_borrow_mut()) else {
            return;
        };
        let body = match self.host.http_call_response_header(":status") {
            Ok(Some(status)) if status == b"200" => self
                .host
                .http_call_response_body(body_size)
                .map(Option::unwrap_or_default)
                .map_err(|s| format!("cannot read the answer's body (status {})", s.0)),
            Ok(Some(status)) => Err(format!("it answered {}", String::from_utf8_lossy(&status))),
            Ok(None) => Err("no answer (timed out, or the connection failed)".to_string()),
            // Envoy has no answer's headers to read when the call failed
            // (a reset, a refused connection): BadArgument
            Err(s) => Err(format!(
                "no answer (the connection failed or was reset; status {})",
                s.0
            )),
        };
        let mut host = self.host.clone();
        let now_ms = now_ns / 1_000_000;
        let next = worker.admin_read_done(
            now_ms,
            body.as_deref().map_err(Clone::clone),
            &self.host,
            &mut host,
        );
        if let Some(path) = next {
            self.admin_read = read_admin(&self.host, &mut worker, now_ms, path);
        }
    }

    /// The context of a new HTTP stream (without a worker, a downstream one
    /// passes requests through, removing client control headers).
    pub fn stream(&self) -> Stream<H> {
        let (host, placement) = (self.host.clone(), Rc::clone(&self.placement));
        match self.role {
            Role::Downstream => {
                Stream::Downstream(DownstreamRequest::new(host, self.worker.clone(), placement))
            }
            Role::Upstream => Stream::Upstream(UpstreamAttempt::new(
                host,
                Rc::clone(&self.holds),
                placement,
            )),
        }
    }
}

/// GETs `path` through `admin_cluster` for the worker's read of the admin
/// interface; the token of the call, or `None` once the read is over (a
/// dispatch that fails is the read's answer, and may ask for the next path).
fn read_admin<H: Host>(
    host: &H,
    worker: &mut Worker,
    now_ms: u64,
    mut path: String,
) -> Option<u32> {
    let cluster = worker.config().admin_cluster.clone();
    // an answer later than the next read is not waited for
    let timeout_ms = u32::try_from(worker.config().admin_refresh_ms())
        .unwrap_or(u32::MAX)
        .min(ADMIN_READ_TIMEOUT_MS);
    let mut logger = host.clone();
    loop {
        let status = match host.dispatch_get(&cluster, &path, timeout_ms) {
            Ok(token) => return Some(token),
            Err(status) => status,
        };
        let why = match status.0 {
            // Envoy's answer to an unknown cluster: where the cluster is
            // only the default's, a plain Envoy without it. Not once its
            // `/clusters` answer is in (the configuration dumps' turn): the
            // cluster went since, and what it said is kept, as for any
            // failed dump (before, the read was thrown away)
            2 if !worker.config().admin_cluster_given && !worker.admin_read_half_done() => {
                worker.admin_cluster_absent(now_ms, &mut logger);
                return None;
            }
            2 => "dispatch_http_call refused it (status 2: no such cluster?)".to_string(),
            other => format!("dispatch_http_call failed (status {other})"),
        };
        path = worker.admin_read_done(now_ms, Err(why), host, &mut logger)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::MAX_RETRIES;
    use crate::policy::shared_state::SharedStore;
    use crate::proxy::fake::{plugin, FakeHost};
    use crate::proxy::host::{Action, StreamCallbacks};

    fn configure(json: &str) -> (FakeHost, bool) {
        let host = FakeHost::default();
        host.state_mut().configuration = Some(json.as_bytes().to_vec());
        let ok = Plugin::new(host.clone()).on_configure(json.len());
        (host, ok)
    }

    #[test]
    fn a_bad_config_is_refused_with_its_field_named() {
        let (host, ok) = configure(r#"{"percentile": 2}"#);
        assert!(!ok);
        assert!(host.logged("invalid plugin config: field \"percentile\" = 2"));
        assert_eq!(host.state().tick_ms, None);
    }

    #[test]
    fn a_good_config_is_logged_with_its_warnings_and_sets_the_tick() {
        let (host, ok) = configure(r#"{"sync_interval": "100ms", "trust_client_headers": true}"#);
        assert!(ok);
        assert!(host.logged(r#""sync_interval":"100ms""#));
        assert!(host.logged("trust_client_headers is on"));
        assert_eq!(host.state().tick_ms, Some(100));
        let (host, ok) = configure(r#"{"role": "upstream"}"#);
        assert!(ok);
        assert!(host.logged(r#"configured: {"role":"upstream"}"#));
        assert_eq!(host.state().tick_ms, Some(UPSTREAM_TICK_MS));
        // no configuration at all: every default
        let (host, ok) = configure("");
        assert!(ok);
        assert!(host.logged(r#""role":"downstream""#));
    }

    #[test]
    fn host_failures_while_configuring_refuse_the_config() {
        for call in ["plugin_configuration", "set_tick_period_ms"] {
            let host = FakeHost::default();
            host.state_mut().configuration = Some(b"{}".to_vec());
            host.fail(call);
            assert!(!Plugin::new(host.clone()).on_configure(2), "{call}");
            assert!(host.logged("adaptive-hedge: cannot"), "{call}");
        }
    }

    #[test]
    fn a_tick_without_a_clock_or_shared_memory_changes_nothing() {
        let (host, mut plugin) = plugin("{}");
        host.fail("now_ns");
        let before = host.calls_to("get_shared_data");
        plugin.on_tick();
        assert_eq!(host.calls_to("get_shared_data"), before);
        host.state_mut().failing = vec!["get_shared_data".into()];
        // an upstream answered: the cluster is tracked, registered on the tick
        tracked_backend(&host, &plugin);
        plugin.on_tick();
        assert!(host.logged("get_shared_data(registry) failed"));
        assert_eq!(host.stat("adaptive_hedge.host_errors_total"), Some(1));
    }

    /// A request to "backend" answered by its upstream, so the cluster is
    /// tracked from the next tick on.
    fn tracked_backend(host: &FakeHost, plugin: &Plugin<FakeHost>) {
        host.request(Some("backend"), &[(":method", "GET")]);
        let Stream::Downstream(mut r) = plugin.stream() else {
            panic!("wrong role")
        };
        r.on_request_headers(true);
        host.set_property(b"response\0code_details", b"via_upstream");
        r.on_response_headers(true);
    }

    /// The answer to the HTTP call `token`: `status`, with `body`.
    fn answer_call(
        host: &FakeHost,
        plugin: &mut Plugin<FakeHost>,
        token: u32,
        status: &[u8],
        body: &[u8],
    ) {
        {
            let mut s = host.state_mut();
            s.call_response_headers = vec![(":status".into(), status.to_vec())];
            s.call_response_body = body.to_vec();
        }
        plugin.on_http_call_response(token, body.len());
    }

    #[test]
    fn the_admin_interface_is_read_on_the_tick_and_its_answer_shared() {
        let (host, mut plugin) =
            plugin(r#"{"admin_cluster": "envoy_admin", "admin_refresh": "2s"}"#);
        tracked_backend(&host, &plugin);
        plugin.on_tick();
        let dispatched = host.state().dispatched.clone();
        assert_eq!(
            dispatched,
            [(
                "envoy_admin".to_string(),
                "/clusters?filter=%5E%28%3F%3Abackend%29%24".to_string(),
                2000
            )]
        );
        // the next tick waits for the answer, and for the next period
        plugin.on_tick();
        assert_eq!(host.state().dispatched.len(), 1);
        let body = b"backend::10.0.0.1:80::health_flags::/failed_outlier_check\n";
        // an answer to a call the filter did not make changes nothing
        answer_call(&host, &mut plugin, 7, b"200", body);
        assert_eq!(host.calls_to("http_call_response_header"), 0);
        answer_call(&host, &mut plugin, 1, b"200", body);
        let key = crate::policy::shared_state::membership_key(
            plugin.worker.as_ref().unwrap().borrow().geometry(),
        );
        let (stored, _) = SharedStore::get(&host, &key).unwrap().unwrap();
        let membership = crate::policy::membership::Membership::decode(&stored).unwrap();
        let members = membership.clusters.get("backend").unwrap();
        assert_eq!(members[0].address, "10.0.0.1:80");
        assert!(!members[0].healthy);
        // a failed answer is logged with its status, a failed dispatch too
        host.advance_ms(2_000);
        plugin.on_tick();
        host.state_mut().call_response_headers = vec![(":status".into(), b"404".to_vec())];
        plugin.on_http_call_response(2, 0);
        assert!(host.logged("through cluster \"envoy_admin\": it answered 404"));
        host.fail("dispatch_get");
        host.advance_ms(2_000);
        plugin.on_tick();
        plugin.on_tick();
        assert_eq!(
            host.stat("adaptive_hedge.admin_read_failures_total"),
            Some(2)
        );
        assert_eq!(host.stat("adaptive_hedge.admin_reads_total"), Some(1));
    }

    /// At zero configuration `admin_cluster` is `prometheus_stats` (Istio's
    /// and Envoy Gateway's bootstraps have it). A plain Envoy without it
    /// refuses the call (status 2): one info line per worker, no failure
    /// counted, looked for again a minute later; once Envoy has it, it is
    /// read like a configured one.
    #[test]
    fn the_default_admin_cluster_is_read_where_envoy_has_it_and_quietly_missed_where_not() {
        let (host, mut plugin) = plugin("{}");
        tracked_backend(&host, &plugin);
        host.fail("dispatch_get");
        plugin.on_tick();
        let missing = "no cluster \"prometheus_stats\" to Envoy's admin interface";
        let said = |host: &FakeHost| {
            let s = host.state();
            let lines: Vec<_> = s.log.iter().filter(|(_, l)| l.contains(missing)).collect();
            assert!(
                lines.iter().all(|(level, _)| *level == Level::Info),
                "{lines:?}"
            );
            lines.len()
        };
        assert_eq!(said(&host), 1);
        assert!(!host.logged("cannot read"));
        assert_eq!(
            host.stat("adaptive_hedge.admin_read_failures_total")
                .unwrap_or(0),
            0
        );
        // not before a minute, then quietly again
        host.advance_ms(30_000);
        plugin.on_tick();
        assert_eq!(host.calls_to("dispatch_get"), 1);
        host.advance_ms(31_000);
        plugin.on_tick();
        assert_eq!(host.calls_to("dispatch_get"), 2);
        assert_eq!(said(&host), 1);
        assert_eq!(
            host.stat("adaptive_hedge.admin_read_failures_total")
                .unwrap_or(0),
            0
        );
        // Envoy has the cluster now
        host.state_mut().failing.clear();
        host.advance_ms(61_000);
        plugin.on_tick();
        let dispatched = host.state().dispatched.clone();
        assert_eq!(
            dispatched,
            [(
                "prometheus_stats".to_string(),
                "/clusters?filter=%5E%28%3F%3Abackend%29%24".to_string(),
                ADMIN_READ_TIMEOUT_MS.min(5_000)
            )]
        );
        // a name written in the configuration that Envoy lacks is a warning
        let (host, mut plugin) =
            crate::proxy::fake::plugin(r#"{"admin_cluster": "prometheus_stats"}"#);
        tracked_backend(&host, &plugin);
        host.fail("dispatch_get");
        plugin.on_tick();
        assert!(
            host.logged("cannot read Envoy's admin interface through cluster \"prometheus_stats\"")
        );
        assert_eq!(
            host.stat("adaptive_hedge.admin_read_failures_total"),
            Some(1)
        );
    }

    /// A `/clusters` answer showing outlier detection is followed by the
    /// configuration dumps (dynamic clusters, then static ones), each sent
    /// when the one before answered; the read is stored after the last.
    /// A dump whose dispatch fails ends the read, stored without the split.
    #[test]
    fn outlier_detection_is_followed_by_the_configuration_dumps() {
        let (host, mut plugin) =
            plugin(r#"{"admin_cluster": "envoy_admin", "admin_refresh": "2s"}"#);
        tracked_backend(&host, &plugin);
        plugin.on_tick();
        let answer = |plugin: &mut Plugin<FakeHost>, token: u32, body: &[u8]| {
            answer_call(&host, plugin, token, b"200", body)
        };
        let clusters = b"backend::outlier::success_rate_average::-1\nbackend::10.0.0.1:80::health_flags::healthy\n";
        answer(&mut plugin, 1, clusters);
        answer(&mut plugin, 2, b"{}");
        let paths: Vec<String> = host
            .state()
            .dispatched
            .iter()
            .map(|d| d.1.clone())
            .collect();
        assert_eq!(paths.len(), 3, "{paths:?}");
        assert!(paths[1].starts_with("/config_dump?resource=dynamic_active_clusters"));
        assert!(paths[2].starts_with("/config_dump?resource=static_clusters"));
        // nothing stored before the last answer
        assert_eq!(stored_membership(&host, &plugin).read_ms, 0);
        answer(
            &mut plugin,
            3,
            br#"{"configs": [{"cluster": {"name": "backend", "outlier_detection": {}}}]}"#,
        );
        use crate::policy::membership::OutlierDetection;
        assert_eq!(
            stored_membership(&host, &plugin)
                .outlier_detection
                .get("backend"),
            Some(&OutlierDetection::Unsplit)
        );
        // the next read: the first dump cannot be sent
        host.advance_ms(2_000);
        plugin.on_tick();
        host.fail("dispatch_get");
        let now = stored_membership(&host, &plugin).claimed_ms;
        answer(&mut plugin, 4, clusters);
        assert!(host.logged("cannot read Envoy's configuration dump"));
        assert_eq!(stored_membership(&host, &plugin).read_ms, now);
        assert_eq!(
            stored_membership(&host, &plugin)
                .outlier_detection
                .get("backend"),
            Some(&OutlierDetection::On)
        );
    }

    /// The admin interface's read as stored in shared memory (an empty one
    /// if none is).
    fn stored_membership(
        host: &FakeHost,
        plugin: &Plugin<FakeHost>,
    ) -> crate::policy::membership::Membership {
        let key = crate::policy::shared_state::membership_key(
            plugin.worker.as_ref().unwrap().borrow().geometry(),
        );
        SharedStore::get(host, &key)
            .unwrap()
            .map(|(bytes, _)| crate::policy::membership::Membership::decode(&bytes).unwrap())
            .unwrap_or_default()
    }

    /// With `admin_cluster` at its default, a dump that cannot be sent
    /// (the cluster gone since the `/clusters` answer) keeps that answer,
    /// as a failed dump does where the cluster was named.
    #[test]
    fn the_default_admin_cluster_gone_between_answers_keeps_the_first() {
        let (host, mut plugin) = plugin(r#"{"admin_refresh": "2s"}"#);
        tracked_backend(&host, &plugin);
        plugin.on_tick();
        host.fail("dispatch_get");
        let clusters = b"backend::outlier::success_rate_average::-1\nbackend::10.0.0.1:80::health_flags::healthy\n";
        answer_call(&host, &mut plugin, 1, b"200", clusters);
        assert_ne!(
            stored_membership(&host, &plugin).read_ms,
            0,
            "the /clusters answer is kept"
        );
        use crate::policy::membership::OutlierDetection;
        assert_eq!(
            stored_membership(&host, &plugin)
                .outlier_detection
                .get("backend"),
            Some(&OutlierDetection::On)
        );
    }

    #[test]
    fn the_downstream_role_in_a_cluster_chain_says_so_and_passes_through() {
        let (host, plugin) = plugin("{}");
        host.request(Some("backend"), &[(":method", "GET"), (MAX_RETRIES, "5")]);
        host.set_property(b"upstream\0address", b"10.0.0.1:80");
        let Stream::Downstream(mut r) = plugin.stream() else {
            panic!("wrong role")
        };
        assert_eq!(r.on_request_headers(true), Action::Continue);
        assert!(host.logged("running as an upstream filter"));
        assert_eq!(host.calls_to("request_header_pairs"), 0);
        // checked once per VM: the next request does not ask again
        host.request(Some("backend"), &[(":method", "GET")]);
        let Stream::Downstream(mut r) = plugin.stream() else {
            panic!("wrong role")
        };
        r.on_request_headers(true);
        assert_eq!(host.state().calls.len(), 0);
    }
}
