//! One Envoy worker's view of the clusters it routes to. The HTTP context
//! calls `on_request` / `on_response` / `on_complete` (no shared memory, no
//! host calls); the root context calls `sync` on every tick, which merges this
//! worker's samples and budget into shared memory and refreshes the cached
//! hedge delays from the window all workers fill together.

use std::collections::HashMap;
use std::sync::Arc;

use super::budget::LocalBudget;
use super::config::{ClusterPolicy, Config};
use super::decision::{budget_terms, decide, hedge_delay, Decision, HedgeDelay, Skip};
use super::shared_state::{
    cluster_key, Registry, SharedCluster, SharedStore, StoreError, CREATE_ONLY, MAX_CLUSTER_NAME,
    REGISTRY_KEY,
};
use super::sketch::Sketch;
use super::window::WindowGeometry;

/// Compare-and-swap attempts per value per tick before leaving the work to
/// the next tick (contention is between a handful of workers).
const CAS_ATTEMPTS: u32 = 8;

/// A worker's local cluster table holds up to this many times `max_clusters`
/// names (tracked, pending or refused by the shared registry).
const LOCAL_CLUSTERS_PER_LIMIT: usize = 2;

/// Latency samples a worker takes per tick at most (1,280/s at the default
/// 200 ms tick; a 30 s window then holds up to ~38,000 per worker). Taking
/// the first requests of each tick is unbiased: when a request starts within
/// a tick says nothing about how long it takes.
pub const SAMPLES_PER_TICK: u32 = 256;

/// Slices that make up the "recent" quantile (see `decision::hedge_delay`).
const RECENT_SLICES: u64 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

pub trait Logger {
    fn log(&mut self, level: Level, message: &str);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

/// Envoy stats as the worker sees them (`define_metric` & co).
pub trait MetricsSink {
    fn define(&mut self, name: &str, kind: MetricKind) -> Option<u32>;
    fn add(&mut self, id: u32, delta: u64);
    fn set(&mut self, id: u32, value: u64);
}

/// Counts since the last metrics flush.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterCounters {
    pub requests: u64,
    pub hedges_armed: u64,
    pub hedges_sent: u64,
    /// Hedges armed and paid for but not sent (the request ended first).
    pub hedges_refunded: u64,
    pub budget_exhausted: u64,
    pub ineligible: u64,
}

/// Per-cluster metric names: `adaptive_hedge.<metric>.<cluster>`; the
/// Envoy config's `stats_tags` turns the suffix into a `cluster` label.
pub const CLUSTER_COUNTERS: [&str; 6] = [
    "requests_total",
    "hedges_armed_total",
    "hedges_sent_total",
    "hedges_refunded_total",
    "budget_exhausted_total",
    "ineligible_total",
];
pub const CLUSTER_GAUGES: [&str; 2] = ["hedge_delay_us", "window_samples"];
/// Worker-wide counters.
/// Worker-wide gauges: the bytes of the cluster values in shared memory,
/// as this worker last read or wrote them.
pub const GLOBAL_GAUGES: [&str; 1] = ["shared_data_bytes"];
pub const GLOBAL_COUNTERS: [&str; 4] = [
    "untracked_requests_total",
    "shared_state_resets_total",
    "sync_conflicts_total",
    "host_errors_total",
];

pub fn metric_name(metric: &str, cluster: &str) -> String {
    format!("adaptive_hedge.{metric}.{cluster}")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tracking {
    /// Seen locally, not yet in the shared registry (next tick).
    Pending,
    Tracked,
    /// The registry is full: passes through unhedged.
    Untracked,
}

/// One cluster as this worker knows it.
#[derive(Debug)]
pub struct ClusterState {
    pub name: String,
    pub policy: Arc<ClusterPolicy>,
    tracking: Tracking,
    /// Cached on the tick; `None` while warming up.
    pub hedge_delay: Option<HedgeDelay>,
    /// Samples in the shared window at the last tick (all workers).
    pub window_samples: u64,
    pub budget: LocalBudget,
    /// Latencies seen since the last tick, not yet in the shared window.
    samples: Sketch,
    requests_unsynced: u64,
    sent_unsynced: u64,
    counters: ClusterCounters,
    metric_ids: Option<[u32; 8]>,
    reset_logged: bool,
    /// Latency samples taken since the last tick.
    samples_this_tick: u32,
    /// Size of the cluster's shared value at the last sync.
    shared_bytes: usize,
}

impl ClusterState {
    fn new(name: String, policy: Arc<ClusterPolicy>) -> Self {
        let budget = LocalBudget::new(budget_terms(&policy));
        ClusterState {
            name,
            policy,
            tracking: Tracking::Pending,
            hedge_delay: None,
            window_samples: 0,
            budget,
            samples: Sketch::new(),
            requests_unsynced: 0,
            sent_unsynced: 0,
            counters: ClusterCounters::default(),
            metric_ids: None,
            reset_logged: false,
            samples_this_tick: 0,
            shared_bytes: 0,
        }
    }
}

/// Worker-wide counts since the last flush, in `GLOBAL_COUNTERS` order.
#[derive(Clone, Copy, Debug, Default)]
struct GlobalCounters([u64; 4]);

const UNTRACKED: usize = 0;
const RESETS: usize = 1;
const CONFLICTS: usize = 2;
const HOST_ERRORS: usize = 3;

/// A cluster handle for the HTTP context to keep between callbacks.
pub type ClusterId = usize;

pub struct Worker {
    pub config: Arc<Config>,
    geometry: WindowGeometry,
    clusters: Vec<ClusterState>,
    index: HashMap<Box<[u8]>, ClusterId>,
    global: GlobalCounters,
    global_ids: Option<[u32; 5]>,
    registry_full_logged: bool,
}

impl Worker {
    pub fn new(config: Arc<Config>) -> Self {
        Worker {
            geometry: WindowGeometry::new(config.window),
            config,
            clusters: Vec::new(),
            index: HashMap::new(),
            global: GlobalCounters::default(),
            global_ids: None,
            registry_full_logged: false,
        }
    }

    pub fn cluster(&self, id: ClusterId) -> Option<&ClusterState> {
        self.clusters.get(id)
    }

    /// Request headers: find the cluster, earn budget, decide.
    pub fn on_request(
        &mut self,
        cluster: Option<&[u8]>,
        method: &[u8],
        upgrade: bool,
    ) -> (Option<ClusterId>, Decision) {
        let Some(name) = cluster.filter(|n| !n.is_empty()) else {
            return (None, Decision::Skip(Skip::NoCluster));
        };
        let Some(id) = self.lookup_or_insert(name) else {
            self.global.0[UNTRACKED] += 1;
            return (None, Decision::Skip(Skip::Untracked));
        };
        let Some(state) = self.clusters.get_mut(id) else {
            return (None, Decision::Skip(Skip::Untracked));
        };
        if state.tracking == Tracking::Untracked {
            self.global.0[UNTRACKED] += 1;
            return (None, Decision::Skip(Skip::Untracked));
        }
        state.counters.requests += 1;
        state.requests_unsynced += 1;
        state.budget.earn();
        let decision = decide(
            &state.policy,
            state.hedge_delay,
            method,
            upgrade,
            &mut state.budget,
        );
        match decision {
            Decision::Arm(h) => state.counters.hedges_armed += u64::from(h.hedges),
            Decision::Skip(Skip::BudgetExhausted) => state.counters.budget_exhausted += 1,
            Decision::Skip(_) => state.counters.ineligible += 1,
        }
        (Some(id), decision)
    }

    /// A request the filter decided not to arm because the client controls
    /// hedging itself (`trust_client_headers`). Counted, nothing reserved.
    pub fn on_client_controlled(&mut self, cluster: Option<&[u8]>) {
        if let Some(state) = cluster
            .and_then(|n| self.index.get(n).copied())
            .and_then(|id| self.clusters.get_mut(id))
        {
            state.counters.requests += 1;
            state.counters.ineligible += 1;
            state.requests_unsynced += 1;
            state.budget.earn();
        }
    }

    fn lookup_or_insert(&mut self, name: &[u8]) -> Option<ClusterId> {
        if let Some(&id) = self.index.get(name) {
            return Some(id);
        }
        // Room for twice the limit: the registry decides which clusters are
        // tracked, and a worker whose first names were refused there (other
        // workers registered theirs first) must still be able to take the
        // clusters that were registered. Memory stays bounded either way.
        if self.clusters.len() >= LOCAL_CLUSTERS_PER_LIMIT * self.config.max_clusters
            || name.len() > MAX_CLUSTER_NAME
        {
            return None;
        }
        let text = std::str::from_utf8(name).ok()?.to_string();
        let id = self.clusters.len();
        let policy = self.config.policy_for(&text);
        self.clusters.push(ClusterState::new(text, policy));
        self.index.insert(name.into(), id);
        Some(id)
    }

    /// An upstream response arrived `latency_us` after the request started:
    /// min(primary, delay + hedge) when hedged, which keeps the trigger at the
    /// true quantile instead of drifting down with the filter's own hedging.
    pub fn on_response(&mut self, id: ClusterId, latency_us: u64) {
        if let Some(state) = self.clusters.get_mut(id) {
            state.samples.add(latency_us as f64);
        }
    }

    /// The request ended; `attempts` is `upstream.request_attempt_count`
    /// (`None` if the host could not tell: then every reserved token is spent).
    pub fn on_complete(&mut self, id: ClusterId, reserved: u32, attempts: Option<u64>) {
        let Some(state) = self.clusters.get_mut(id) else {
            return;
        };
        let extra = match attempts {
            Some(a) => a.saturating_sub(1),
            None => u64::from(reserved),
        };
        let sent = u32::try_from(extra).unwrap_or(u32::MAX).min(reserved);
        state.budget.settle(reserved, sent);
        state.counters.hedges_sent += extra;
        state.counters.hedges_refunded += u64::from(reserved - sent);
        state.sent_unsynced += extra;
    }

    /// The tick: register new clusters, merge into shared memory, refresh delays.
    /// Whether this request's latency should be sampled (at most
    /// `SAMPLES_PER_TICK` per cluster per tick).
    pub fn take_sample_slot(&mut self, id: ClusterId) -> bool {
        match self.clusters.get_mut(id) {
            Some(c) if c.samples_this_tick < SAMPLES_PER_TICK => {
                c.samples_this_tick += 1;
                true
            }
            _ => false,
        }
    }

    pub fn sync(&mut self, now_ms: u64, store: &dyn SharedStore, log: &mut dyn Logger) {
        for c in self.clusters.iter_mut() {
            c.samples_this_tick = 0;
        }
        if self
            .clusters
            .iter()
            .any(|c| c.tracking == Tracking::Pending)
        {
            self.register_pending(store, log);
        }
        for id in 0..self.clusters.len() {
            self.sync_cluster(id, now_ms, store, log);
        }
    }

    fn register_pending(&mut self, store: &dyn SharedStore, log: &mut dyn Logger) {
        for _ in 0..CAS_ATTEMPTS {
            let (mut registry, cas) = match store.get(REGISTRY_KEY) {
                Ok(Some((bytes, cas))) => match Registry::decode(&bytes) {
                    Ok(r) => (r, cas),
                    Err(e) => {
                        log.log(
                            Level::Warn,
                            &format!("shared registry {REGISTRY_KEY} reset: {e}"),
                        );
                        self.global.0[RESETS] += 1;
                        (Registry::default(), cas)
                    }
                },
                Ok(None) => (Registry::default(), CREATE_ONLY),
                Err(e) => {
                    self.host_error(log, "get_shared_data(registry)", e);
                    return;
                }
            };
            let mut outcome = Vec::new();
            let mut changed = false;
            for (id, state) in self.clusters.iter().enumerate() {
                if state.tracking != Tracking::Pending {
                    continue;
                }
                if registry.contains(&state.name) {
                    outcome.push((id, Tracking::Tracked));
                } else if registry.names.len() < self.config.max_clusters {
                    registry.names.push(state.name.clone());
                    changed = true;
                    outcome.push((id, Tracking::Tracked));
                } else {
                    outcome.push((id, Tracking::Untracked));
                }
            }
            if changed {
                match store.set(REGISTRY_KEY, &registry.encode(), cas) {
                    Ok(()) => {}
                    Err(StoreError::CasMismatch) => {
                        self.global.0[CONFLICTS] += 1;
                        continue;
                    }
                    Err(e) => {
                        self.host_error(log, "set_shared_data(registry)", e);
                        return;
                    }
                }
            }
            for (id, tracking) in outcome {
                if let Some(state) = self.clusters.get_mut(id) {
                    state.tracking = tracking;
                    if tracking == Tracking::Untracked && !self.registry_full_logged {
                        self.registry_full_logged = true;
                        log.log(
                            Level::Warn,
                            &format!(
                                "max_clusters ({}) reached: cluster \"{}\" and any further new cluster pass through unhedged",
                                self.config.max_clusters, state.name
                            ),
                        );
                    }
                }
            }
            return;
        }
    }

    fn sync_cluster(
        &mut self,
        id: ClusterId,
        now_ms: u64,
        store: &dyn SharedStore,
        log: &mut dyn Logger,
    ) {
        let geometry = self.geometry;
        let Some(state) = self.clusters.get(id) else {
            return;
        };
        if state.tracking != Tracking::Tracked {
            return;
        }
        let key = cluster_key(&state.name);
        for _ in 0..CAS_ATTEMPTS {
            let Some(state) = self.clusters.get_mut(id) else {
                return;
            };
            let mut shared_bytes = 0;
            let (mut shared, cas) = match store.get(&key) {
                Ok(Some((bytes, cas))) => match SharedCluster::decode(&bytes, geometry) {
                    Ok(shared) => {
                        shared_bytes = bytes.len();
                        (shared, cas)
                    }
                    Err(e) => {
                        if !state.reset_logged {
                            state.reset_logged = true;
                            log.log(
                                Level::Warn,
                                &format!("shared state of cluster \"{}\" reset: {e}", state.name),
                            );
                        }
                        self.global.0[RESETS] += 1;
                        (SharedCluster::new(geometry), cas)
                    }
                },
                Ok(None) => (SharedCluster::new(geometry), CREATE_ONLY),
                Err(e) => {
                    self.host_error(log, "get_shared_data(cluster)", e);
                    return;
                }
            };
            let before = shared.clone();
            let mut budget = state.budget.clone();
            shared.window.merge(now_ms, &state.samples);
            shared.window.expire(now_ms);
            budget.rebalance(&mut shared.pool);
            shared.requests_total = shared.requests_total.wrapping_add(state.requests_unsynced);
            shared.hedges_sent_total = shared.hedges_sent_total.wrapping_add(state.sent_unsynced);
            // Write only if something changed (or the key is new). An
            // unchanged value means nothing local was pending: samples,
            // requests and sent hedges each change it.
            if shared != before || cas == CREATE_ONLY {
                let encoded = shared.encode();
                shared_bytes = encoded.len();
                match store.set(&key, &encoded, cas) {
                    Ok(()) => {}
                    Err(StoreError::CasMismatch) => {
                        self.global.0[CONFLICTS] += 1;
                        continue;
                    }
                    Err(e) => {
                        self.host_error(log, "set_shared_data(cluster)", e);
                        return;
                    }
                }
            }
            state.samples.clear();
            state.requests_unsynced = 0;
            state.sent_unsynced = 0;
            state.budget = budget;
            state.shared_bytes = shared_bytes;
            let window = shared.window.snapshot(now_ms);
            state.window_samples = window.count();
            // the current slice and the one before: one to two slices of samples
            let recent = shared.window.snapshot_recent(now_ms, RECENT_SLICES);
            state.hedge_delay = hedge_delay(&state.policy, &window, &recent);
            return;
        }
    }

    fn host_error(&mut self, log: &mut dyn Logger, call: &str, e: StoreError) {
        self.global.0[HOST_ERRORS] += 1;
        if self.global.0[HOST_ERRORS] == 1 {
            log.log(
                Level::Error,
                &format!("{call} failed: {e:?}; hedging uses the last known state"),
            );
        }
    }

    /// Pushes counter deltas and gauges to Envoy's stats (on the tick).
    pub fn flush_metrics(&mut self, sink: &mut dyn MetricsSink) {
        let ids = match self.global_ids {
            Some(ids) => Some(ids),
            None => define_all(sink, &GLOBAL_COUNTERS, &GLOBAL_GAUGES, None),
        };
        self.global_ids = ids;
        if let Some(ids) = ids {
            for (id, n) in ids.iter().zip(self.global.0.iter_mut()) {
                if *n > 0 {
                    sink.add(*id, *n);
                    *n = 0;
                }
            }
            // Every VM sets the same gauge; one without clusters (Envoy's
            // main thread) would overwrite the workers' value with 0.
            let shared_bytes: usize = self.clusters.iter().map(|c| c.shared_bytes).sum();
            if let (Some(id), true) = (ids.get(GLOBAL_COUNTERS.len()), shared_bytes > 0) {
                sink.set(*id, shared_bytes as u64);
            }
        }
        for state in self
            .clusters
            .iter_mut()
            .filter(|c| c.tracking == Tracking::Tracked)
        {
            let ids = match state.metric_ids {
                Some(ids) => Some(ids),
                None => define_all(sink, &CLUSTER_COUNTERS, &CLUSTER_GAUGES, Some(&state.name)),
            };
            state.metric_ids = ids;
            let Some(ids) = ids else { continue };
            let c = std::mem::take(&mut state.counters);
            let deltas = [
                c.requests,
                c.hedges_armed,
                c.hedges_sent,
                c.hedges_refunded,
                c.budget_exhausted,
                c.ineligible,
            ];
            for (id, n) in ids.iter().zip(deltas) {
                if n > 0 {
                    sink.add(*id, n);
                }
            }
            let gauges = [
                state.hedge_delay.map_or(0, |d| d.delay_us),
                state.window_samples,
            ];
            for (id, v) in ids.iter().skip(CLUSTER_COUNTERS.len()).zip(gauges) {
                sink.set(*id, v);
            }
        }
    }
}

/// Defines counters then gauges (`adaptive_hedge.<name>[.<cluster>]`);
/// `None` if any definition fails (retried next tick).
pub(super) fn define_all<const N: usize>(
    sink: &mut dyn MetricsSink,
    counters: &[&str],
    gauges: &[&str],
    cluster: Option<&str>,
) -> Option<[u32; N]> {
    let mut ids = [0u32; N];
    let names = counters
        .iter()
        .map(|n| (n, MetricKind::Counter))
        .chain(gauges.iter().map(|n| (n, MetricKind::Gauge)));
    for (slot, (name, kind)) in ids.iter_mut().zip(names) {
        let full = match cluster {
            Some(c) => metric_name(name, c),
            None => format!("adaptive_hedge.{name}"),
        };
        *slot = sink.define(&full, kind)?;
    }
    Some(ids)
}

#[cfg(test)]
mod tests {
    use super::super::shared_state::memory::MemoryStore;
    use super::*;
    use std::time::Duration;

    #[derive(Default)]
    struct Lines(Vec<String>);
    impl Logger for Lines {
        fn log(&mut self, _: Level, m: &str) {
            self.0.push(m.to_string());
        }
    }

    #[derive(Default)]
    struct Stats {
        names: Vec<String>,
        values: HashMap<u32, u64>,
    }
    impl MetricsSink for Stats {
        fn define(&mut self, name: &str, _: MetricKind) -> Option<u32> {
            self.names.push(name.to_string());
            Some(self.names.len() as u32 - 1)
        }
        fn add(&mut self, id: u32, d: u64) {
            *self.values.entry(id).or_default() += d;
        }
        fn set(&mut self, id: u32, v: u64) {
            self.values.insert(id, v);
        }
    }
    impl Stats {
        fn get(&self, name: &str) -> u64 {
            let id = self.names.iter().position(|n| n == name).unwrap() as u32;
            self.values.get(&id).copied().unwrap_or(0)
        }
    }

    fn config(json: &str) -> Arc<Config> {
        Arc::new(Config::parse(json.as_bytes()).unwrap())
    }

    const T0: u64 = 1_700_000_000_000;

    /// Feeds `n` requests with latency `us` through a worker.
    fn traffic(w: &mut Worker, cluster: &str, n: u64, us: u64) -> Vec<Decision> {
        (0..n)
            .map(|_| {
                let (id, d) = w.on_request(Some(cluster.as_bytes()), b"GET", false);
                let id = id.unwrap();
                w.on_response(id, us);
                let reserved = if let Decision::Arm(h) = d {
                    h.hedges
                } else {
                    0
                };
                w.on_complete(id, reserved, Some(1));
                d
            })
            .collect()
    }

    #[test]
    fn two_workers_learn_together() {
        let store = MemoryStore::default();
        let cfg = config(r#"{"min_samples": 100}"#);
        let (mut a, mut b) = (Worker::new(cfg.clone()), Worker::new(cfg));
        let mut log = Lines::default();
        // 60 samples on each worker: neither alone has min_samples
        traffic(&mut a, "c", 60, 2000);
        traffic(&mut b, "c", 60, 2000);
        a.sync(T0, &store, &mut log);
        assert_eq!(
            a.cluster(0).unwrap().hedge_delay,
            None,
            "60 samples are not enough"
        );
        b.sync(T0 + 10, &store, &mut log);
        a.sync(T0 + 200, &store, &mut log);
        let (da, db) = (
            a.cluster(0).unwrap().hedge_delay,
            b.cluster(0).unwrap().hedge_delay,
        );
        assert!(
            da.is_some(),
            "120 samples from both workers warm the cluster up"
        );
        assert_eq!(da, db, "both workers arm the same delay");
        assert_eq!(a.cluster(0).unwrap().window_samples, 120);
        assert!(log.0.is_empty(), "{:?}", log.0);
    }

    #[test]
    fn merged_window_equals_one_sketch_fed_everything() {
        let store = MemoryStore::default();
        let cfg = config("");
        let (mut a, mut b) = (Worker::new(cfg.clone()), Worker::new(cfg.clone()));
        let mut all = Sketch::new();
        let mut log = Lines::default();
        for i in 0..3000u64 {
            let us = 500 + (i * 7919) % 40_000;
            let w = if i % 3 == 0 { &mut a } else { &mut b };
            traffic(w, "c", 1, us);
            all.add(us as f64);
            if i % 500 == 0 {
                a.sync(T0 + i, &store, &mut log);
                b.sync(T0 + i, &store, &mut log);
            }
        }
        a.sync(T0 + 3000, &store, &mut log);
        b.sync(T0 + 3000, &store, &mut log);
        let (bytes, _) = store.get(&cluster_key("c")).unwrap().unwrap();
        let shared = SharedCluster::decode(&bytes, WindowGeometry::new(cfg.window)).unwrap();
        assert_eq!(shared.window.snapshot(T0 + 3000), all);
        assert_eq!(shared.requests_total, 3000);
    }

    #[test]
    fn cas_conflicts_are_retried_without_losing_samples() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        traffic(&mut w, "c", 50, 3000);
        *store.conflicts.borrow_mut() = 3;
        w.sync(T0, &store, &mut log);
        assert_eq!(w.cluster(0).unwrap().window_samples, 50);
        // more conflicts than attempts: kept for the next tick
        traffic(&mut w, "c", 50, 3000);
        *store.conflicts.borrow_mut() = 100;
        w.sync(T0 + 200, &store, &mut log);
        *store.conflicts.borrow_mut() = 0;
        w.sync(T0 + 400, &store, &mut log);
        assert_eq!(w.cluster(0).unwrap().window_samples, 100);
    }

    /// A store in which another worker's tick runs between this worker's
    /// read of `key` and its write: two workers' first ticks, interleaved.
    struct Interleaved<'a> {
        inner: &'a MemoryStore,
        key: String,
        racer: std::cell::RefCell<Option<Racer<'a>>>,
    }
    type Racer<'a> = Box<dyn FnOnce(&MemoryStore) + 'a>;
    impl SharedStore for Interleaved<'_> {
        fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            if key == self.key {
                if let Some(racer) = self.racer.borrow_mut().take() {
                    racer(self.inner);
                }
            }
            self.inner.set(key, value, cas)
        }
    }

    /// Worker `a` finds `key` missing, then `b` creates it before `a`
    /// writes. Nothing either wrote may be lost (a write with CAS 0 would
    /// erase `b`'s samples and requests, or its cluster's registration).
    fn first_ticks_interleaved(key: &str, b_cluster: &str) -> MemoryStore {
        let store = MemoryStore::default();
        let cfg = config(r#"{"min_samples": 50}"#);
        let (mut a, mut b) = (Worker::new(cfg.clone()), Worker::new(cfg));
        let mut log = Lines::default();
        traffic(&mut a, "c", 30, 2000);
        traffic(&mut b, b_cluster, 30, 2000);
        let interleaved = Interleaved {
            inner: &store,
            key: key.to_string(),
            racer: std::cell::RefCell::new(Some(Box::new(|inner: &MemoryStore| {
                b.sync(T0, inner, &mut Lines::default())
            }))),
        };
        a.sync(T0, &interleaved, &mut log);
        assert!(interleaved.racer.borrow().is_none(), "b never ran");
        drop(interleaved);
        assert!(log.0.is_empty(), "{:?}", log.0);
        store
    }

    #[test]
    fn workers_creating_a_cluster_key_at_once_lose_no_samples() {
        let store = first_ticks_interleaved(&cluster_key("c"), "c");
        let (bytes, _) = store.get(&cluster_key("c")).unwrap().unwrap();
        let geometry = WindowGeometry::new(Duration::from_secs(30));
        let shared = SharedCluster::decode(&bytes, geometry).unwrap();
        assert_eq!(shared.requests_total, 60);
        assert_eq!(shared.window.snapshot(T0).count(), 60);
    }

    #[test]
    fn workers_creating_the_registry_at_once_lose_no_cluster() {
        let store = first_ticks_interleaved(REGISTRY_KEY, "d");
        let (bytes, _) = store.get(REGISTRY_KEY).unwrap().unwrap();
        let mut names = Registry::decode(&bytes).unwrap().names;
        names.sort();
        assert_eq!(names, ["c", "d"]);
    }

    #[test]
    fn delay_follows_a_3x_shift_within_one_window() {
        let store = MemoryStore::default();
        let cfg = config(r#"{"window": "30s", "min_samples": 50}"#);
        let mut w = Worker::new(cfg);
        let mut log = Lines::default();
        // latencies 1..10 ms uniformly: p90 = 9 ms; after the shift 3..30 ms: p90 = 27 ms
        let mut now = T0;
        let step = 200;
        let mut run = |w: &mut Worker, now: &mut u64, ms: u64, scale: u64| {
            let end = *now + ms;
            let mut i = 0u64;
            while *now < end {
                for _ in 0..20 {
                    i += 1;
                    traffic(w, "c", 1, scale * (1000 + (i * 37) % 9000));
                }
                w.sync(*now, &store, &mut log);
                *now += step;
            }
        };
        run(&mut w, &mut now, 60_000, 1);
        let before = w.cluster(0).unwrap().hedge_delay.unwrap().delay_us as f64;
        assert!(
            (before / 9100.0 - 1.0).abs() < 0.03,
            "p90 before the shift: {before}"
        );
        run(&mut w, &mut now, 30_000, 3);
        let after = w.cluster(0).unwrap().hedge_delay.unwrap().delay_us as f64;
        assert!(
            (after / 27_300.0 - 1.0).abs() < 0.03,
            "p90 one window after the shift: {after}"
        );
    }

    #[test]
    fn corrupt_shared_value_is_reset_logged_once_and_recovers() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        traffic(&mut w, "c", 20, 3000);
        w.sync(T0, &store, &mut log);
        for garbage in [&b"garbage"[..], b"AHC\x07older version", b""] {
            store.set(&cluster_key("c"), garbage, 0).unwrap();
            traffic(&mut w, "c", 20, 3000);
            w.sync(T0 + 200, &store, &mut log);
            assert_eq!(
                w.cluster(0).unwrap().window_samples,
                20,
                "recovered with the new samples"
            );
        }
        assert_eq!(log.0.len(), 1, "{:?}", log.0);
        assert!(log.0[0].contains("reset"));
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.shared_state_resets_total"), 3);
    }

    #[test]
    fn clusters_past_the_limit_pass_through_and_are_counted() {
        let store = MemoryStore::default();
        let cfg = config(r#"{"max_clusters": 2, "min_samples": 1}"#);
        let (mut a, mut b) = (Worker::new(cfg.clone()), Worker::new(cfg));
        let mut log = Lines::default();
        traffic(&mut a, "one", 5, 1000);
        traffic(&mut b, "two", 5, 1000);
        a.sync(T0, &store, &mut log);
        b.sync(T0, &store, &mut log);
        // the registry (shared) is full, though worker a has room locally
        traffic(&mut a, "three", 5, 1000);
        a.sync(T0 + 200, &store, &mut log);
        let (_, d) = a.on_request(Some(b"three"), b"GET", false);
        assert_eq!(d, Decision::Skip(Skip::Untracked));
        // the local map is bounded too (twice the limit)
        traffic(&mut a, "four", 1, 1000);
        traffic(&mut a, "five", 1, 1000);
        let (_, d) = a.on_request(Some(b"six"), b"GET", false);
        assert_eq!(d, Decision::Skip(Skip::Untracked));
        assert_eq!(log.0.len(), 1);
        let mut stats = Stats::default();
        a.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.untracked_requests_total"), 2);
        assert!(!stats.names.iter().any(|n| n.ends_with(".three")));
    }

    /// Worker a's first names were refused by the registry (b registered
    /// its clusters first); a can still track the registered ones.
    #[test]
    fn a_worker_full_of_refused_names_still_tracks_registered_clusters() {
        let store = MemoryStore::default();
        let cfg = config(r#"{"max_clusters": 2, "min_samples": 1}"#);
        let (mut a, mut b) = (Worker::new(cfg.clone()), Worker::new(cfg));
        let mut log = Lines::default();
        traffic(&mut b, "b1", 5, 1000);
        traffic(&mut b, "b2", 5, 1000);
        b.sync(T0, &store, &mut log);
        traffic(&mut a, "a1", 5, 1000);
        traffic(&mut a, "a2", 5, 1000);
        a.sync(T0, &store, &mut log);
        traffic(&mut a, "b1", 20, 1000); // earns the tokens of a hedge
        a.sync(T0 + 200, &store, &mut log);
        let (_, d) = a.on_request(Some(b"b1"), b"GET", false);
        assert!(matches!(d, Decision::Arm(_)), "{d:?}");
        let (_, d) = a.on_request(Some(b"a1"), b"GET", false);
        assert_eq!(d, Decision::Skip(Skip::Untracked));
    }

    #[test]
    fn metrics_count_what_happened() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        traffic(&mut w, "c", 200, 5000);
        w.sync(T0, &store, &mut log);
        // armed and hedged
        let (id, d) = w.on_request(Some(b"c"), b"GET", false);
        assert!(matches!(d, Decision::Arm(_)));
        w.on_complete(id.unwrap(), 1, Some(2));
        // not idempotent
        let (_, d) = w.on_request(Some(b"c"), b"POST", false);
        assert_eq!(d, Decision::Skip(Skip::Method));
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.requests_total.c"), 202);
        assert_eq!(stats.get("adaptive_hedge.hedges_sent_total.c"), 1);
        assert_eq!(stats.get("adaptive_hedge.ineligible_total.c"), 201); // 200 warming up + POST
        assert!(stats.get("adaptive_hedge.hedges_armed_total.c") >= 1);
        assert_eq!(stats.get("adaptive_hedge.window_samples.c"), 200);
        let delay = stats.get("adaptive_hedge.hedge_delay_us.c");
        assert!((4900..=5100).contains(&delay), "{delay}");
        // a second flush adds nothing
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.requests_total.c"), 202);
    }

    #[test]
    fn samples_are_capped_per_tick() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(""));
        let (a, _) = w.on_request(Some(b"a"), b"GET", false);
        let (b, _) = w.on_request(Some(b"b"), b"GET", false);
        let (a, b) = (a.unwrap(), b.unwrap());
        let taken = (0..1000).filter(|_| w.take_sample_slot(a)).count();
        assert_eq!(taken, SAMPLES_PER_TICK as usize);
        assert!(w.take_sample_slot(b), "each cluster has its own slots");
        w.sync(T0, &store, &mut Lines::default());
        assert!(w.take_sample_slot(a), "a new tick, new slots");
    }

    #[test]
    fn requests_without_a_cluster_are_not_armed() {
        let mut w = Worker::new(config(""));
        assert_eq!(
            w.on_request(None, b"GET", false).1,
            Decision::Skip(Skip::NoCluster)
        );
        assert_eq!(
            w.on_request(Some(b""), b"GET", false).1,
            Decision::Skip(Skip::NoCluster)
        );
        let _ = Duration::ZERO;
    }
}
