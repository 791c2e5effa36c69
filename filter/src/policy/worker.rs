//! One Envoy worker's view of the clusters it routes to. Per request, the
//! HTTP context asks for a [`Plan`] (`Worker::plan`: find the cluster, earn
//! budget, `decision::plan`, book what it returns), reports the response's
//! latency (`on_response`) and settles the hedges when the request ends
//! (`settle`): no shared memory, no host calls. On every tick the root
//! context calls `sync`, which merges this worker's samples and budget into
//! shared memory and refreshes the cached hedge delays from the window all
//! workers fill together.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::backend_latency::{backend_quantile, primary_cut_short};
use super::budget::{LocalBudget, RefusalPressure};
use super::config::{policy_field_kind, ClusterPolicy, Config, Mode};
use super::decision::{
    self, in_sample_population, Cluster, ClusterId, ClusterView, Decision, Plan, Request, RouteId,
    Settlement, Skip,
};
use super::hedge_delay::{
    budget_terms, hedge_delay, hedged_quantile, trigger_quantile, ArmedShare, BudgetState,
    Censoring, HedgeDelay, REGIME_SAMPLES,
};
use super::hosts::{self, mix, HostPick, Hosts, HostsSummary, OverrideCheck};
use super::membership::{
    admin_path, config_dump_paths, lists_cluster, parse_admin_clusters, parse_config_dump,
    parse_outlier_detection, Member, Membership, OutlierDetection,
};
use super::routes::{RecentTerms, Routes};
use super::shared_state::{
    cluster_key, membership_key, registry_key, unknown_clusters_said_key, DecodeError, Registry,
    SharedCluster, SharedStore, StoreError, CREATE_ONLY, MAX_CLUSTER_NAME, MAX_HOSTS,
};
use super::sketch::Sketch;
use super::timeouts::{ArmedRequests, Ended};
use super::window::{WindowGeometry, SAMPLES_PER_TICK, SLICES};
use crate::route_metadata::overrides_to_json;
use crate::route_metadata_cache::RouteMetadataCache;
use crate::telemetry::{metric_set, Level, Logger, MetricTable, MetricsSink};

/// FNV-1a: a stable name for an unnamed route's overrides.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Compare-and-swap attempts per value per tick before leaving the work to
/// the next tick (contention is between a handful of workers).
const CAS_ATTEMPTS: u32 = 8;

/// A worker's local cluster table holds up to this many times `max_clusters`
/// names (tracked, pending or refused by the shared registry).
const LOCAL_CLUSTERS_PER_LIMIT: usize = 2;

/// Idle clusters a worker evicts per tick at most (it reads a value for
/// each one it checks, up to four times as many).
const EVICTIONS_PER_TICK: usize = 4;
/// Idle clusters whose first sighting a worker keeps (see
/// `idle_for_a_slice`): as many as a registry holds.
const IDLE_REMEMBERED: usize = 1_024;

/// Evicted markers beside registered names a worker remembers (`stranded`).
const MARKERS_REMEMBERED: usize = 32;

/// Routes with overrides in their metadata a worker knows at most (each is
/// hedged as a cluster of its own; past this their requests are not armed).
const MAX_ROUTE_VARIANTS: usize = 64;

/// Route overrides whose warnings or refusal a worker remembers having
/// logged (`Worker::variant`); past this it forgets them all and may log
/// each once more.
const VARIANT_LOGS_REMEMBERED: usize = 4_096;

/// Slices that make up the "recent" quantile (see `hedge_delay`).
const RECENT_SLICES: u64 = 2;

/// Of the single-attempt responses to requests whose host the filter
/// named, one in this many has its host read (`Worker::check_address`).
pub const ADDRESS_CHECK_EVERY: u32 = 4;

/// How often a worker looks at the admin interface's last read in shared
/// memory (ms): a tick's work, but not every tick's.
const MEMBERSHIP_LOOK_MS: u64 = 1_000;

metric_set! {
    /// Per cluster: `adaptive_hedge.<metric>.<cluster>`.
    pub enum ClusterMetric {
        Requests = ("requests_total", Counter),
        HedgesArmed = ("hedges_armed_total", Counter),
        HedgesSent = ("hedges_sent_total", Counter),
        /// Hedges armed and paid for but not sent (the request ended first).
        HedgesRefunded = ("hedges_refunded_total", Counter),
        BudgetExhausted = ("budget_exhausted_total", Counter),
        /// Eligible requests not armed while `timeouts::MAX_PAST_DELAY` of
        /// this worker's armed requests were past their delay.
        Paced = ("paced_total", Counter),
        Ineligible = ("ineligible_total", Counter),
        /// Hedges the router sent although the primary answered before
        /// their delay (its timers fire early on a busy event loop; see
        /// `settle`).
        EarlyHedges = ("early_hedges_total", Counter),
        HedgeDelayUs = ("hedge_delay_microseconds", Gauge),
        /// 0 while the delay is the learned quantile; 1 while it is held at
        /// `min_delay`, 2 at `max_delay` (the quantile is past the bound:
        /// the bound, not the latency, decides when requests hedge).
        HedgeDelayClamped = ("hedge_delay_clamped", Gauge),
        /// Hedges that answered first: a later attempt answered, the
        /// primary's host did not, after the delay. Counted where the
        /// filter chose the hosts (only then is the answering attempt
        /// known).
        HedgesWon = ("hedges_won_total", Counter),
        WindowSamples = ("window_samples", Gauge),
        /// Requests whose host the filter chose (`host_choice`).
        HostPicks = ("host_picks_total", Counter),
        /// Hosts the workers know the cost of (seen within `FORGET_MS`).
        HostsTracked = ("hosts_tracked", Gauge),
        HostsOnProbation = ("hosts_on_probation", Gauge),
        /// Hosts the admin interface says Envoy would not use (unhealthy,
        /// ejected, removed): never named (`admin_cluster`).
        HostsHeldOut = ("hosts_held_out", Gauge),
        /// Per mille of last tick's responses (this worker) that came from
        /// the slowest host.
        SlowestHostShare = ("slowest_host_share_permille", Gauge),
        /// 1 while the cluster is seen to ignore the host header (no
        /// `override_host` policy): the filter stops choosing for a while.
        HostChoiceIgnored = ("host_choice_ignored", Gauge),
        /// `mode: shadow`: requests that would have been armed, the hedges
        /// they would have sent (they outlived the delay), and the p99 the
        /// window's latency would have had with them (µs).
        ShadowArmed = ("shadow_armed_total", Counter),
        ShadowHedges = ("shadow_hedges_total", Counter),
        ShadowP99Us = ("shadow_p99_microseconds", Gauge),
        /// Quantiles of the window's latency (all workers): what clients
        /// got, hedges included, beside the delay learned from it.
        LatencyP50Us = ("latency_p50_microseconds", Gauge),
        LatencyP90Us = ("latency_p90_microseconds", Gauge),
        LatencyP99Us = ("latency_p99_microseconds", Gauge),
        /// Quantiles of the backend's own latency over the long horizon,
        /// the primaries cut short by hedges accounted for
        /// (`backend_latency`); 0 while not known (host choice off, or the
        /// quantile past every primary that was not cut short).
        BackendP50Us = ("backend_latency_p50_microseconds", Gauge),
        BackendP90Us = ("backend_latency_p90_microseconds", Gauge),
        BackendP99Us = ("backend_latency_p99_microseconds", Gauge),
    }
}

metric_set! {
    /// Worker-wide: `adaptive_hedge.<metric>`.
    pub enum WorkerMetric {
        UntrackedRequests = ("untracked_requests_total", Counter),
        /// Requests to a cluster no upstream had answered yet (on this
        /// worker): not tracked until one does.
        UnconfirmedRequests = ("unconfirmed_requests_total", Counter),
        ClustersEvicted = ("clusters_evicted_total", Counter),
        SharedStateResets = ("shared_state_resets_total", Counter),
        SyncConflicts = ("sync_conflicts_total", Counter),
        HostErrors = ("host_errors_total", Counter),
        /// Routes whose `adaptive_hedge` metadata was refused (logged), once
        /// per worker; and requests whose route's metadata could not be
        /// read: not hedged.
        RouteOverridesRefused = ("route_overrides_refused_total", Counter),
        /// The bytes of the cluster values in shared memory, as this worker
        /// last read or wrote them.
        SharedDataBytes = ("shared_data_bytes", Gauge),
        /// Reads of Envoy's admin interface (`admin_cluster`) this worker
        /// made that got an answer; and those that did not.
        AdminReads = ("admin_reads_total", Counter),
        AdminReadFailures = ("admin_read_failures_total", Counter),
    }
}

/// What the registry said to a cluster waiting for a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Its name was there already.
    Registered,
    /// This worker put it there.
    Added,
    /// Full.
    Refused,
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
    name: String,
    /// The Envoy cluster (`name` but for a route with overrides, hedged
    /// under a name of its own).
    envoy_cluster: String,
    /// A route's own state (`name` differs from `envoy_cluster`): kept so
    /// that a request need not compare the two names.
    route_state: bool,
    policy: Arc<ClusterPolicy>,
    tracking: Tracking,
    /// Cached on the tick; `None` while warming up.
    hedge_delay: Option<HedgeDelay>,
    /// Samples in the shared window at the last tick (all workers).
    window_samples: u64,
    budget: LocalBudget,
    /// How hard the budget has been refusing lately (raises the delay's
    /// recent guard).
    refusals: RefusalPressure,
    /// The share of recent latency samples whose request was armed.
    armed_share: ArmedShare,
    /// Latencies seen since the last tick, not yet in the shared window.
    samples: Sketch,
    /// Of `samples`, the primaries a hedge cut short.
    cut_short: Sketch,
    /// Latency samples taken since the last tick; requests of the sampled
    /// population seen since the last tick; take every `stride`-th.
    samples_this_tick: u32,
    population_this_tick: u32,
    stride: u32,
    requests_unsynced: u64,
    /// Requests since the last tick (for the budget's exposure cap).
    requests_this_tick: u64,
    /// How much later than the delay the per-try timeout is set.
    timer: TimerSlack,
    /// Set while the delay is known stale (see `StaleLatch`).
    stale: Option<StaleLatch>,
    /// The latency a latch found, until the recent slices hold it (see
    /// `NewRegime`).
    regime: Option<NewRegime>,
    sent_unsynced: u64,
    metrics: MetricTable<ClusterMetric>,
    reset_logged: bool,
    /// More hosts than host choice tracks was said (once).
    overflow_logged: bool,
    /// Size of the cluster's shared value at the last sync.
    shared_bytes: usize,
    /// Just registered: an `evicted` marker in its key is replaced, not
    /// obeyed.
    revive: bool,
    /// Untracked, and asked for since the last tick.
    wants_slot: bool,
    /// `mode: shadow`: the p99 the window would have had with hedging.
    shadow_p99_microseconds: Option<f64>,
    /// The window's p50, p90, p99 (µs) at the last sync; 0 while empty.
    latency_quantiles_us: [u64; 3],
    /// The backend's own p50, p90, p99 (µs) at the last sync; 0 while
    /// not known.
    backend_quantiles_us: [u64; 3],
    /// Single-attempt responses of chosen requests seen (`check_address`).
    address_checks: u32,
    /// Named routes that learn their own delay (`max_routes`).
    routes: Routes,
    /// The cluster's hosts (`host_choice`).
    hosts: Hosts,
    hosts_summary: HostsSummary,
    override_check: OverrideCheck,
    /// Its gauges were set to 0 since it was evicted (`flush_metrics`).
    gauges_cleared: bool,
    /// This worker's armed requests still running (see `timeouts`).
    armed: ArmedRequests,
    /// What Envoy's outlier detection on the cluster makes of a hedge's
    /// timeout, as its admin interface last said (`None`: not known, taken
    /// as counting it).
    outlier_detection: Option<OutlierDetection>,
    /// The last tick a request of it came to this worker (`None`: none
    /// yet, a cluster taken up at a push), and the last its shared value
    /// was read at (`None`: not yet): see `quiet`.
    busy_tick: Option<u64>,
    synced_tick: Option<u64>,
    /// The admin interface's last read changed its members or outlier
    /// detection since its value was last read (host health and weights
    /// are applied at a read: `Hosts::refresh`).
    membership_news: bool,
}

impl ClusterState {
    /// The requests in flight to the host of `address` (for tests).
    #[cfg(test)]
    pub fn in_flight_to(&self, address: &str) -> Option<u32> {
        self.hosts
            .iter_known()
            .find(|h| h.address == address)
            .map(|h| h.in_flight)
    }

    /// `Worker::on_host_response` of a cluster whose policy chooses hosts.
    fn hear_host_response(&mut self, pick: Option<HostPick>, response: HostResponse) {
        let winner = match (response.address, pick) {
            (Some(address), _) => self.hosts.find_or_add(address),
            (None, Some(p)) if response.attempts == Some(1) && !self.hosts.doubted(p.primary) => {
                Some(p.primary)
            }
            (None, _) => None,
        };
        let hedged = response.attempts.is_some_and(|a| a >= 2);
        let per_try_us = response
            .per_try_timeout_ms
            .map(|ms| ms.saturating_mul(1000));
        // the sample `on_response` took of this response: was it a primary
        // cut short by its hedge? (the backend's own latency) A winner not
        // known (no slot for its address) may be the hedge's: taken for
        // the primary's, the estimate erred low, which it must not (found
        // by a review)
        if let (false, Some(latency_us)) = (response.failed, response.latency_us) {
            let primary_answered = winner.zip(pick).map(|(w, p)| p.primary == w);
            if primary_cut_short(latency_us, response.attempts, per_try_us, primary_answered) {
                self.cut_short.add(self.policy.sample_us(latency_us));
            }
        }
        let Some(winner) = winner else {
            return;
        };
        self.hosts.answered(winner);
        // Any answer of the host clears the timeouts the filter left
        // standing there: a success resets outlier detection's count, and a
        // host answering 5xx is counted (and ejected) for its own errors,
        // whatever the filter does.
        if response.from_upstream {
            self.hosts.answered_upstream(winner);
        }
        if response.failed {
            self.hosts.fail(winner);
        } else if let Some(latency_us) = response.latency_us {
            let latency = latency_us as f64;
            match pick {
                // the primary lost: a later attempt answered first (a hedge
                // after the delay, or a retry after a 5xx or a reset). A
                // failure (what a failing or slow host does; a healthy one
                // loses only the races its tail loses), and it was at least
                // that slow; a hedge answered `delay` after it started.
                Some(p) if hedged && p.primary != winner => {
                    self.hosts.fail(p.primary);
                    self.hosts.observe_bound(p.primary, latency);
                    if let Some(d) = per_try_us.filter(|&d| latency_us >= d) {
                        self.hosts.observe(winner, (latency_us - d) as f64);
                        // a timed answer stands for `stride` requests
                        // (see `judge_timer`)
                        self.metrics
                            .add(ClusterMetric::HedgesWon, u64::from(self.stride));
                    }
                }
                // hedged, but which attempt answered is not known
                None if hedged => {}
                _ => self.hosts.observe(winner, latency),
            }
        }
        // only an address read tells whether Envoy followed the header
        if let (Some(p), Some(1), Some(_)) = (pick, response.attempts, response.address) {
            self.hosts.record_override(p.primary, p.primary == winner);
        }
    }

    fn new(name: String, envoy_cluster: String, policy: Arc<ClusterPolicy>) -> Self {
        let armed = ArmedRequests::new(1.0 - trigger_quantile(&policy));
        ClusterState {
            route_state: name != envoy_cluster,
            name,
            envoy_cluster,
            budget: LocalBudget::new(budget_terms(&policy)),
            refusals: RefusalPressure::default(),
            armed_share: ArmedShare::default(),
            policy,
            tracking: Tracking::Pending,
            hedge_delay: None,
            window_samples: 0,
            samples: Sketch::new(),
            cut_short: Sketch::new(),
            samples_this_tick: 0,
            population_this_tick: 0,
            stride: 1,
            requests_unsynced: 0,
            requests_this_tick: 0,
            timer: TimerSlack::default(),
            stale: None,
            regime: None,
            sent_unsynced: 0,
            shadow_p99_microseconds: None,
            latency_quantiles_us: [0; 3],
            backend_quantiles_us: [0; 3],
            metrics: MetricTable::default(),
            reset_logged: false,
            overflow_logged: false,
            outlier_detection: None,
            shared_bytes: 0,
            revive: false,
            wants_slot: false,
            address_checks: 0,
            routes: Routes::default(),
            hosts: Hosts::default(),
            hosts_summary: HostsSummary::default(),
            override_check: OverrideCheck::default(),
            gauges_cleared: false,
            armed,
            busy_tick: None,
            synced_tick: None,
            membership_news: false,
        }
    }

    /// Nothing of it happened on this worker for `quiet_ticks` ticks up to
    /// tick `now` and nothing is waiting to be merged: its shared value
    /// need not be read on every tick (`Worker::sync_shared`). A stale
    /// latch or a new regime keeps it read: they count ticks.
    fn quiet(&self, now: u64, quiet_ticks: u64) -> bool {
        self.tracking == Tracking::Tracked
            && !self.revive
            && self.synced_tick.is_some()
            && self
                .busy_tick
                .map_or(true, |busy| now.saturating_sub(busy) > quiet_ticks)
            && !self.membership_news
            && self.samples.is_empty()
            && self.cut_short.is_empty()
            && self.requests_unsynced == 0
            && self.sent_unsynced == 0
            && self.stale.is_none()
            && self.regime.is_none()
            && self.budget.settled()
            && !self.hosts.has_news()
            && !self.routes.has_news()
    }

    /// Its shared value was given up while idle (another worker needed the
    /// registry slot): what it learned goes, its metrics stay, and it asks
    /// for a slot again after its next request, like any untracked cluster.
    fn evicted(&mut self) {
        self.tracking = Tracking::Untracked;
        self.revive = false;
        self.hedge_delay = None;
        self.window_samples = 0;
        self.samples.clear();
        self.cut_short.clear();
        self.requests_unsynced = 0;
        self.sent_unsynced = 0;
        self.shadow_p99_microseconds = None;
        self.latency_quantiles_us = [0; 3];
        self.backend_quantiles_us = [0; 3];
        self.shared_bytes = 0;
        self.routes.retire_all();
        self.regime = None;
        self.gauges_cleared = false;
        // read at its first tick once registered again, as a new cluster
        // (found by a review: quiet at once, its first requests unarmed)
        self.synced_tick = None;
    }

    /// An eligible request, armed or refused for want of tokens, for the
    /// refusal pressure (see `book` for the exposure cap's refusals); not
    /// while the delay is stale (a brownout): the refusals then are the
    /// budget's brake on requests armed below the new latency, all of which
    /// fire their per-try timeouts (failures to outlier detection with the
    /// local-origin split; 504s without it before the 204), and raising
    /// the guard a little would arm more of them, not fewer (measured,
    /// before the 204: through real Envoy the brownout test's default outlier settings
    /// ejected all three hosts in 2 runs of 5 with the pressure counting
    /// there).
    fn count_refusal(&mut self, refused: bool) {
        if self.stale.is_none() && !self.armed.stale() {
            self.refusals.count(refused);
        }
    }

    /// What the budget says of the delay's recent guard.
    fn budget_state(&self) -> BudgetState {
        BudgetState {
            reserve_fill: self.budget.reserve_fill(),
            refusal_pressure: self.refusals.value(),
        }
    }

    /// The cluster's hosts as this worker knows them.
    pub fn hosts(&self) -> &Hosts {
        &self.hosts
    }

    fn chooses_hosts(&self) -> bool {
        self.policy.host_choice && !self.override_check.ignored()
    }

    /// The delay requests are armed with; `None` while warming up.
    pub fn hedge_delay(&self) -> Option<HedgeDelay> {
        self.hedge_delay
    }

    /// Samples in the shared window at the last tick (all workers).
    pub fn window_samples(&self) -> u64 {
        self.window_samples
    }

    /// The backend's own p50, p90, p99 (µs) at the last sync; 0 while not
    /// known (`backend_latency`).
    pub fn backend_quantiles_us(&self) -> [u64; 3] {
        self.backend_quantiles_us
    }

    /// The delay a request of `route` is armed with: the route's own once
    /// it has learned one, else the cluster's.
    pub fn route_delay(&self, route: Option<RouteId>) -> Option<HedgeDelay> {
        route
            .and_then(|r| self.routes.delay(r))
            .or(self.hedge_delay)
    }

    /// `past_delay`: armed requests with a timeout fired (see `timeouts`).
    fn view(
        &self,
        id: ClusterId,
        route: Option<RouteId>,
        random: u64,
        now_ns: Option<u64>,
        past_delay: usize,
    ) -> ClusterView<'_> {
        ClusterView {
            id,
            route,
            policy: &self.policy,
            delay: self.route_delay(route),
            budget: &self.budget,
            sample_turn: self.samples_this_tick < SAMPLES_PER_TICK
                && self.population_this_tick % self.stride == 0,
            hosts: self.chooses_hosts().then_some(&self.hosts),
            random,
            now_ns,
            past_delay,
            armed: Some(&self.armed),
            stale_delay: self.stale.is_some(),
            pacing: self.pacing(),
            timeouts_as_204: self.timeouts_as_204(),
        }
    }

    /// Whether armed requests ask for a 204 on timeouts: unless Envoy's
    /// admin interface says no outlier detector there reads the code
    /// (none, or local-origin errors split), whatever `outlier_pacing` is.
    fn timeouts_as_204(&self) -> bool {
        self.outlier_detection
            .map_or(true, OutlierDetection::reads_timeout_code)
    }

    /// Whether armed requests are paced for outlier detection's sake
    /// (`timeouts`): as configured (`outlier_pacing`), unless Envoy's admin
    /// interface says the cluster's outlier detection cannot count a
    /// hedge's timeout as a failure (none, or local-origin errors not split).
    fn pacing(&self) -> bool {
        self.policy.outlier_pacing
            && self
                .outlier_detection
                .map_or(true, OutlierDetection::counts_timeouts)
    }

    /// Books a plan made for this cluster: the request earns its share of
    /// budget before the decision, the armed hedges are reserved after it.
    fn book(&mut self, plan: &mut Plan, request: &Request, tick_us: u64, now_ns: Option<u64>) {
        if in_sample_population(request, &self.policy) {
            self.population_this_tick = self.population_this_tick.saturating_add(1);
        }
        match &plan.decision {
            Decision::Arm(a) => {
                self.count_refusal(false);
                self.budget
                    .reserve(a.reserved, delay_ticks(a.per_try_timeout_ms, tick_us));
                let metric = if a.shadow {
                    ClusterMetric::ShadowArmed
                } else {
                    ClusterMetric::HedgesArmed
                };
                self.metrics.add(metric, u64::from(a.reserved));
            }
            Decision::Skip(Skip::BudgetExhausted) => {
                // The exposure cap refuses for how many requests are armed
                // at once, not for what the delay costs: raising the delay
                // for it would arm more at once, and refuse more.
                if self.budget.short_of_tokens() {
                    self.count_refusal(true);
                }
                self.metrics.add(ClusterMetric::BudgetExhausted, 1)
            }
            Decision::Skip(Skip::Paced | Skip::StaleDelay) => {
                self.metrics.add(ClusterMetric::Paced, 1)
            }
            Decision::Skip(_) => self.metrics.add(ClusterMetric::Ineligible, 1),
        }
        if plan.sample {
            self.samples_this_tick += 1;
            // a shadow's sample is whole: nothing cut it short
            self.armed_share
                .sampled(matches!(&plan.decision, Decision::Arm(a) if !a.shadow));
        }
        if let (Some(deadline), Decision::Arm(a)) = (plan.deadline_ns, &plan.decision) {
            let per_try_ns = a.per_try_timeout_ms.saturating_mul(1_000_000);
            plan.deadline_ns = Some(self.armed.armed(deadline, per_try_ns, plan.hosts));
        }
        if let Some(pick) = plan.hosts {
            self.hosts.track(pick, true);
            if let Some(now) = now_ns {
                self.hosts.attempt_started(pick.primary, now);
            }
            self.metrics.add(ClusterMetric::HostPicks, 1);
        }
    }
}

/// What the response of a request tells about its cluster's hosts.
#[derive(Clone, Copy, Debug)]
pub struct HostResponse<'a> {
    /// `upstream.address`: the host whose response the client got; `None`
    /// when not read (`Worker::check_address` said the named primary of a
    /// single attempt may be trusted).
    pub address: Option<&'a [u8]>,
    /// The response's time, if it was timed and is a success.
    pub latency_us: Option<u64>,
    /// A 5xx, or a local reply (reset, connect failure, timeout).
    pub failed: bool,
    /// The host answered, whatever the status (not a local reply such as
    /// a timeout or a connect failure).
    pub from_upstream: bool,
    /// `upstream.request_attempt_count`.
    pub attempts: Option<u64>,
    /// The per-try timeout the request was armed with.
    pub per_try_timeout_ms: Option<u64>,
}

pub struct Worker {
    config: Arc<Config>,
    geometry: WindowGeometry,
    clusters: Vec<ClusterState>,
    index: HashMap<Box<[u8]>, ClusterId>,
    metrics: MetricTable<WorkerMetric>,
    registry_full_logged: bool,
    /// The tick a shared-memory call's failure was last logged at.
    shared_error_logged: Option<u64>,
    /// The worker's own table of clusters was found full (see `insert`).
    table_full_logged: bool,
    /// A cluster named as a route's state was logged (see `name_taken`).
    name_taken_logged: bool,
    /// A route's overrides could not be read (see
    /// `plan_unreadable_overrides`).
    unreadable_overrides_logged: bool,
    /// Where this tick's look for idle clusters starts in the registry.
    eviction_cursor: usize,
    /// The next quiet cluster to read, and the time owed to quiet
    /// clusters' reads (µs; one read per `QUIET_READ_US`): `sync_shared`.
    quiet_cursor: usize,
    quiet_credit_us: u64,
    /// Registered names whose key held an evicted marker, and the tick it
    /// was seen (see `stranded`).
    markers_seen: Sightings<(String, u32)>,
    /// Registered clusters this worker found idle, and when it first did,
    /// in ms (`idle_for_a_slice`).
    /// Idle clusters seen, by name and the value's `requests_total` (a
    /// value revived since starts again from 0: another cluster's life).
    idle_seen: Sightings<(String, u64)>,
    /// Names to take out of the registry on its next update: a marker
    /// stranded beside them.
    unregister: Vec<String>,
    /// Ticks so far, and their period (µs).
    ticks: u64,
    tick_us: u64,
    /// The shared registry was taken up (`adopt_shared`, once).
    adopted: bool,
    /// The host choice's random numbers (SplitMix64 state, stirred with
    /// the clock on every tick so workers do not draw alike).
    random: u64,
    /// Routes whose metadata overrides their cluster's policy.
    variants: Vec<RouteVariant>,
    /// The overrides (cluster, route and metadata hashed) whose warnings
    /// or refusal were logged: an entry the table gave up and made again
    /// is not logged again.
    variant_logs: HashSet<u64>,
    /// The routes' overrides as last read (the proxy glue reads them).
    route_metadata: RouteMetadataCache,
    /// Lines to log on the next tick (`plan` has no logger).
    pending_log: Vec<(Level, String)>,
    admin: AdminReads,
}

/// What a cluster's sync does with its budget and the shared pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolTurn {
    /// Keep up to the worker's cap, deposit or draw the rest (a tick).
    Rebalance,
    /// Leave every token to the pool (`retire`).
    HandOver,
}

/// The longest a worker leaves a quiet cluster's shared value unread
/// (`Worker::sync_shared`), µs. Under `budget::RATE_GAP_MS`, which a
/// pool's rate needs reads within.
const QUIET_READ_US: u64 = 10_000_000;

/// Clusters a new plugin reads from shared memory as it takes them up
/// (`Worker::adopt_shared`); the rest wait for its first tick.
const ADOPTED_SYNCED_AT_ONCE: usize = 64;

/// How long a worker waits before looking again for an `admin_cluster`
/// that Envoy did not have (its default, not written in the configuration).
const ABSENT_ADMIN_RETRY_MS: u64 = 60_000;

/// Reading Envoy's admin interface (`admin_cluster`, `membership`).
#[derive(Debug, Default)]
struct AdminReads {
    /// The last read, as this worker last looked at it in shared memory,
    /// and its token there.
    membership: Membership,
    token: Option<u32>,
    /// When this worker looks at the shared value next (ms).
    next_look_ms: u64,
    /// When this worker claimed a read it has not heard back from, and
    /// the clusters it asked for (sorted).
    in_flight_since_ms: Option<u64>,
    asked: Vec<String>,
    /// No cluster to ask for: not before this (ms).
    next_try_ms: u64,
    /// The last read this worker made failed (logged once until one works).
    failing: bool,
    /// A read past its `/clusters` answer, waiting for the configuration
    /// dumps that say which clusters split local-origin errors.
    pending: Option<PendingRead>,
    /// The last configuration dump failed (logged once until one works).
    dump_failing: bool,
    /// `admin_cluster`'s default names no cluster of this Envoy (said once).
    absent: bool,
    /// The configuration's `clusters` were looked for in a read (those
    /// Envoy does not have are said once: `warn_of_unknown_clusters`).
    overrides_checked: bool,
}

/// A read of the admin interface between its answers.
#[derive(Debug, Default)]
struct PendingRead {
    clusters: BTreeMap<String, Vec<Member>>,
    outlier_detection: BTreeMap<String, OutlierDetection>,
    /// The configuration dumps still to read, the next first.
    dumps: Vec<String>,
}

/// A route whose metadata (`filter_metadata.adaptive_hedge`) overrides its
/// cluster's policy: hedged as a cluster of its own (its own window, budget
/// and hosts, under the name `<cluster>.route.<route>`), so its percentile
/// and budget apply to its own traffic. Keyed by the metadata's bytes,
/// so a route whose metadata changes (xDS) starts afresh.
#[derive(Debug)]
struct RouteVariant {
    cluster: Box<[u8]>,
    route: Box<[u8]>,
    metadata: Box<[u8]>,
    /// `None`: the metadata was refused, the route is not hedged.
    target: Option<ClusterId>,
    /// The tick it was last looked up at.
    used_at_tick: u64,
}

/// Where a request with route overrides goes.
enum VariantLookup {
    Cluster(ClusterId),
    /// Its metadata was refused.
    Refused,
    /// The variant table (or the cluster table) is full.
    Full,
}

impl Worker {
    /// The window's geometry (part of the shared keys).
    pub fn geometry(&self) -> WindowGeometry {
        self.geometry
    }

    pub fn new(config: Arc<Config>) -> Self {
        let tick_us = u64::try_from(config.sync_interval.as_micros()).unwrap_or(u64::MAX);
        Worker {
            geometry: WindowGeometry::new(*config.window),
            config,
            clusters: Vec::new(),
            index: HashMap::new(),
            metrics: MetricTable::default(),
            registry_full_logged: false,
            shared_error_logged: None,
            table_full_logged: false,
            name_taken_logged: false,
            unreadable_overrides_logged: false,
            eviction_cursor: 0,
            quiet_cursor: 0,
            quiet_credit_us: 0,
            markers_seen: Sightings::new(MARKERS_REMEMBERED),
            idle_seen: Sightings::new(IDLE_REMEMBERED),
            unregister: Vec::new(),
            ticks: 0,
            tick_us,
            adopted: false,
            random: 0,
            variants: Vec::new(),
            variant_logs: HashSet::new(),
            route_metadata: RouteMetadataCache::new(tick_us),
            pending_log: Vec::new(),
            admin: AdminReads::default(),
        }
    }

    /// A new configuration's first look at shared memory (from the root,
    /// as its first stream is made): takes up every cluster the shared
    /// registry holds (at most `max_clusters`), as if this worker had
    /// confirmed it, and reads the oldest `ADOPTED_SYNCED_AT_ONCE` of
    /// them, so that their delays, hosts and the budgets' pool are known
    /// at once. Why: a configuration pushed to a running Envoy (an
    /// Istio `WasmPlugin` change through ECDS, an Envoy Gateway listener
    /// update) makes a new worker state in the same VM; without this, its
    /// first request of each cluster went unhedged as unconfirmed and the
    /// rest as warming up until its first tick. Route states
    /// (`<cluster>.route.<route>`) are made from their route's overrides
    /// as before. A registry that does not decode adopts nothing. Returns
    /// how many clusters were taken up.
    pub fn adopt_shared(
        &mut self,
        now_ms: u64,
        store: &dyn SharedStore,
        log: &mut dyn Logger,
    ) -> usize {
        if std::mem::replace(&mut self.adopted, true) {
            return 0;
        }
        let Ok(Some((bytes, _))) = store.get(&registry_key(self.geometry)) else {
            return 0;
        };
        let Ok(registry) = Registry::decode(&bytes) else {
            return 0;
        };
        // a push may have lowered max_clusters: no more than it
        let adopted = registry
            .names
            .iter()
            .filter(|name| !name.contains(".route."))
            .take(self.config.max_clusters)
            .filter(|name| self.lookup_or_insert(name.as_bytes()).is_some())
            .count();
        if adopted > 0 {
            // This runs as a request's stream is made, before the plugin's
            // first: its clusters are the ones just taken up, the
            // registry's oldest first. The first `ADOPTED_SYNCED_AT_ONCE`
            // are read now, the rest at the next tick, so that a mesh of
            // a thousand clusters does not hold that request for
            // milliseconds.
            self.sync_shared(
                now_ms,
                store,
                log,
                PoolTurn::Rebalance,
                ADOPTED_SYNCED_AT_ONCE,
            );
        }
        adopted
    }

    /// Whether `adopt_shared` has run: it runs once per worker state.
    pub fn has_adopted(&self) -> bool {
        self.adopted
    }

    /// This worker state is going away (the root's `on_done`: its plugin
    /// was replaced and its last request ended): one last sync merges
    /// what it learned since its last tick, and every cluster's tokens go
    /// to the shared pool (`LocalBudget::hand_over`) for the state that
    /// replaces it. Returns how many clusters' shared values took them.
    pub fn retire(&mut self, now_ms: u64, store: &dyn SharedStore, log: &mut dyn Logger) -> usize {
        self.sync_shared(now_ms, store, log, PoolTurn::HandOver, usize::MAX)
    }

    /// The overrides of `route` to `cluster` as read within the last
    /// ticks (`route_metadata_cache`); `None`: read them and `remember`.
    pub fn route_metadata(&self, cluster: &[u8], route: &[u8]) -> Option<&[u8]> {
        self.route_metadata.get(cluster, route, self.ticks)
    }

    /// Keeps a route's overrides as read; returns whether its name is
    /// shared by routes of different overrides (`route_metadata_cache`):
    /// then the caller takes the route for unnamed, as the name cannot
    /// tell them apart. Said once.
    pub fn remember_route_metadata(
        &mut self,
        cluster: &[u8],
        route: &[u8],
        metadata: &[u8],
    ) -> bool {
        let found = self
            .route_metadata
            .remember(cluster, route, metadata, self.ticks);
        if found.found_now {
            self.pending_log.push((
                Level::Warn,
                format!(
                    "route \"{}\" of cluster \"{}\": routes of this name carry different overrides (in two virtual hosts or listeners); it is taken as unnamed: its overrides are read on each request and it learns no delay of its own. Give routes unique names",
                    String::from_utf8_lossy(route),
                    String::from_utf8_lossy(cluster)
                ),
            ));
        }
        found.ambiguous
    }

    /// Mixes `entropy` (the clock in ns) into the host choice's generator.
    pub fn stir(&mut self, entropy: u64) {
        self.random = mix(self.random ^ entropy);
        // each tick, each worker looks for idle clusters somewhere else
        self.eviction_cursor = (self.random >> 32) as usize;
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn cluster(&self, id: ClusterId) -> Option<&ClusterState> {
        self.clusters.get(id)
    }

    /// The plan for a request routed to `cluster` (`xds.cluster_name`) by
    /// `route` (`xds.route_name`), booked: counters, the budget it earns and
    /// the hedges it reserves, its sample slot. The caller carries it out,
    /// and calls `settle` with its `settlement` when the request ends (or at
    /// once if arming failed).
    pub fn plan(
        &mut self,
        cluster: Option<&[u8]>,
        route: Option<&[u8]>,
        request: &Request,
    ) -> Plan {
        if let Some(name) = cluster {
            self.confirm_cluster(name);
        }
        self.plan_route(cluster, route, &[], request, None)
    }

    /// `plan` for a request whose route carries overrides: `route_metadata`
    /// is the serialised `filter_metadata.adaptive_hedge` of its route
    /// (empty: none), read only when new (see `RouteVariant`). `now_ns`:
    /// the clock, if read; armed requests' deadlines are then kept, and
    /// arming paces itself (see `timeouts`).
    pub fn plan_route(
        &mut self,
        cluster: Option<&[u8]>,
        route: Option<&[u8]>,
        route_metadata: &[u8],
        request: &Request,
        now_ns: Option<u64>,
    ) -> Plan {
        let Some(name) = cluster.filter(|name| !name.is_empty()) else {
            return decision::plan(request, &self.config, Cluster::None);
        };
        // A cluster is tracked (memory, a registry slot, a shared value)
        // only once one of its upstreams answered (`confirm_cluster`): a
        // name from a client header that no cluster has costs nothing.
        let Some(&cluster_id) = self.index.get(name) else {
            if self.clusters_full() {
                self.table_full(name);
                self.metrics.add(WorkerMetric::UntrackedRequests, 1);
                return decision::plan(request, &self.config, Cluster::Untracked);
            }
            self.metrics.add(WorkerMetric::UnconfirmedRequests, 1);
            return decision::plan(request, &self.config, Cluster::Unconfirmed);
        };
        // An Envoy cluster named as a route's own state is (`<cluster>.route.
        // <route>`) must not spend that route's budget or learn in its
        // window: not hedged (whichever came first on this worker keeps it).
        if self
            .clusters
            .get(cluster_id)
            .is_some_and(|state| state.route_state)
        {
            self.name_taken(name, cluster_id);
            self.metrics.add(WorkerMetric::UntrackedRequests, 1);
            return decision::plan(request, &self.config, Cluster::Untracked);
        }
        let id = if route_metadata.is_empty() {
            Some(cluster_id)
        } else {
            match self.variant(name, route.unwrap_or_default(), route_metadata) {
                VariantLookup::Cluster(id) => Some(id),
                VariantLookup::Refused => {
                    return decision::plan(request, &self.config, Cluster::Misconfigured)
                }
                VariantLookup::Full => None,
            }
        };
        let tracked = id.and_then(|id| {
            let state = self.clusters.get_mut(id)?;
            if state.tracking == Tracking::Untracked {
                // asks for a slot again on the tick: an idle cluster may
                // give its up
                state.wants_slot = true;
                return None;
            }
            Some((id, state))
        });
        let Some((id, state)) = tracked else {
            self.metrics.add(WorkerMetric::UntrackedRequests, 1);
            return decision::plan(request, &self.config, Cluster::Untracked);
        };
        state.metrics.add(ClusterMetric::Requests, 1);
        state.requests_unsynced += 1;
        state.requests_this_tick += 1;
        state.budget.earn();
        let max_routes = state.policy.max_routes;
        let route = route
            .filter(|_| max_routes > 0)
            .and_then(|r| state.routes.lookup(r, max_routes));
        let past_delay = now_ns.map_or(0, |now| state.armed.fire(now, &mut state.hosts));
        if state.stale.is_none() && state.armed.clearly_stale() {
            let max_ms = state.policy.max_delay_ms();
            state.stale = state
                .hedge_delay
                .filter(|d| d.per_try_timeout_ms < max_ms)
                .map(StaleLatch::new);
            // a regime that is stale in turn: the latch learns the next
            if state.stale.is_some() {
                state.regime = None;
            }
            // at max_delay nothing is latched, and the reading goes on: outlier
            // pacing keeps reading the brownout as stale
            if state.stale.is_some() {
                state.armed.new_reading();
            }
        }
        self.random = self.random.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut plan = decision::plan(
            request,
            &self.config,
            Cluster::Tracked(state.view(id, route, mix(self.random), now_ns, past_delay)),
        );
        state.book(&mut plan, request, self.tick_us, now_ns);
        plan
    }

    /// An upstream of cluster `name` answered a request planned
    /// `Skip::Unconfirmed`: the cluster exists and is tracked from now on.
    pub fn confirm_cluster(&mut self, name: &[u8]) {
        let _ = self.lookup_or_insert(name);
    }

    fn lookup_or_insert(&mut self, name: &[u8]) -> Option<ClusterId> {
        if let Some(&id) = self.index.get(name) {
            return Some(id);
        }
        let text = std::str::from_utf8(name).ok()?;
        let policy = self.config.policy_for(text);
        self.insert(text.to_string(), text.to_string(), policy)
    }

    /// A cluster whose name a route's own state already has: said once.
    fn name_taken(&mut self, name: &[u8], id: ClusterId) {
        if std::mem::replace(&mut self.name_taken_logged, true) {
            return;
        }
        let route_of = self.clusters.get(id).map(|s| s.envoy_cluster.clone());
        self.pending_log.push((
            Level::Error,
            format!(
                "cluster \"{}\" has the name of the state of a route of cluster \"{}\" with its own overrides: its requests are not hedged (counted in untracked_requests_total); name the route otherwise",
                String::from_utf8_lossy(name),
                route_of.unwrap_or_default()
            ),
        ));
    }

    fn clusters_full(&self) -> bool {
        self.clusters.len() >= LOCAL_CLUSTERS_PER_LIMIT * self.config.max_clusters
    }

    /// `name` found no room in the worker's table. Names are kept for the
    /// VM's life (a slot in the registry is given back, the worker's entry
    /// is not): said once, since from here only `untracked_requests_total`
    /// tells.
    fn table_full(&mut self, name: &[u8]) {
        if std::mem::replace(&mut self.table_full_logged, true) {
            return;
        }
        self.pending_log.push((
            Level::Warn,
            format!(
                "{} cluster and route names seen by this worker (2 x max_clusters): cluster \"{}\" and any further new one pass through unhedged until the plugin restarts",
                self.clusters.len(),
                String::from_utf8_lossy(name)
            ),
        ));
    }

    fn insert(
        &mut self,
        name: String,
        envoy_cluster: String,
        policy: Arc<ClusterPolicy>,
    ) -> Option<ClusterId> {
        // Room for twice the limit: the registry decides which clusters are
        // tracked, and a worker whose first names were refused there (other
        // workers registered theirs first) must still be able to take the
        // clusters that were registered. Memory stays bounded either way.
        if name.len() > MAX_CLUSTER_NAME {
            return None;
        }
        if self.clusters_full() {
            self.table_full(name.as_bytes());
            return None;
        }
        let id = self.clusters.len();
        self.index.insert(name.as_bytes().into(), id);
        self.clusters
            .push(ClusterState::new(name, envoy_cluster, policy));
        Some(id)
    }

    /// The cluster that hedges a route with overrides, made on first sight:
    /// the metadata is parsed and checked once, with the rules of a cluster
    /// override. Linear: at most `MAX_ROUTE_VARIANTS` short entries, and only
    /// requests whose route has overrides look.
    fn variant(&mut self, cluster: &[u8], route: &[u8], metadata: &[u8]) -> VariantLookup {
        let ticks = self.ticks;
        let known = self
            .variants
            .iter_mut()
            .find(|v| *v.metadata == *metadata && *v.route == *route && *v.cluster == *cluster);
        if let Some(v) = known {
            v.used_at_tick = ticks;
            return v
                .target
                .map_or(VariantLookup::Refused, VariantLookup::Cluster);
        }
        // A named route with other metadata than before: the route changed
        // (xDS). Its entries go (a rollback is parsed again and takes
        // effect; an entry of the old metadata led to the cluster state
        // that now holds the new settings) and make room for the new one.
        if !route.is_empty() {
            self.variants
                .retain(|v| !(*v.route == *route && *v.cluster == *cluster));
        }
        if self.variants.len() >= MAX_ROUTE_VARIANTS {
            // Room from the entry used longest ago, if not this tick: an
            // unnamed route's entries (one per metadata it ever had) are
            // never replaced by its next, and the table filled with
            // entries xDS left behind (found by a review). The state an
            // entry led to stays, and is found again by name.
            let stalest = self
                .variants
                .iter()
                .enumerate()
                .filter(|(_, v)| v.used_at_tick < ticks)
                .min_by_key(|(_, v)| v.used_at_tick)
                .map(|(i, _)| i);
            match stalest {
                Some(i) => {
                    self.variants.swap_remove(i);
                }
                None => return VariantLookup::Full,
            }
        }
        let (Ok(cluster_name), Ok(route_name)) =
            (std::str::from_utf8(cluster), std::str::from_utf8(route))
        else {
            return VariantLookup::Full;
        };
        let suffix = if route_name.is_empty() {
            // an unnamed route: named by its overrides, alike on every worker
            format!("{:016x}", fnv1a(metadata))
        } else {
            route_name.to_string()
        };
        let name = format!("{cluster_name}.route.{suffix}");
        let config = Arc::clone(&self.config);
        let base = config.policy_for(cluster_name);
        let prefix = "filter_metadata.adaptive_hedge.";
        let mut warnings = Vec::new();
        // "field = value: rule", as the plugin configuration's errors read
        let refusal = |field: &str, value: &str, rule: &str| {
            if value.is_empty() {
                format!("{field}: {rule}")
            } else {
                format!("{field} = {value}: {rule}")
            }
        };
        let policy = overrides_to_json(metadata, policy_field_kind)
            .map_err(|e| refusal(&format!("{prefix}{}", e.field), &e.value, &e.why))
            .and_then(|json| {
                config
                    .route_policy(&base, json, prefix, &mut warnings)
                    .map_err(|e| refusal(&e.field, &e.value, &e.rule))
            });
        // Said once per overrides: with more routes in use than the
        // table holds, each was made again and logged again, over and over.
        if self.variant_logs.len() >= VARIANT_LOGS_REMEMBERED {
            self.variant_logs.clear();
        }
        let first_sight = self.variant_logs.insert(
            fnv1a(metadata) ^ fnv1a(cluster).rotate_left(21) ^ fnv1a(route).rotate_left(42),
        );
        // A route cannot switch host choice on by itself: where the
        // configuration chooses hosts for no cluster, its cluster's policy
        // has it off, which `Config::route_policy` keeps (and says so).
        for w in warnings.into_iter().filter(|_| first_sight) {
            self.pending_log.push((
                Level::Warn,
                format!("route \"{suffix}\" of cluster \"{cluster_name}\": {w}"),
            ));
        }
        let taken = self
            .index
            .get(name.as_bytes())
            .and_then(|&id| self.clusters.get(id))
            .is_some_and(|state| state.envoy_cluster != cluster_name);
        let policy = match taken {
            // the name is another Envoy cluster's, or another cluster's
            // route's: sharing its state would share its budget
            true => Err(format!(
                "its state would be named \"{name}\", which another cluster's state has (an Envoy cluster of that name, or a route of another cluster); name the route otherwise"
            )),
            false => policy,
        };
        let target = match policy {
            Ok(policy) => match self.index.get(name.as_bytes()) {
                // the same name with other metadata: the route changed
                // (xDS; its old entries went above). The budget keeps its
                // tokens and armed hedges (a fresh one would refund those in
                // flight in full).
                Some(&id) => {
                    if let Some(state) = self.clusters.get_mut(id) {
                        state.budget.retune(budget_terms(&policy));
                        // a new quantile: what counts as stale follows the
                        // new plan, and what was judged under the old one
                        // goes (another change, as of the methods, keeps a
                        // latch set in a brownout)
                        let planned = trigger_quantile(&policy);
                        if planned != trigger_quantile(&state.policy) {
                            state.armed.replan(1.0 - planned);
                            state.stale = None;
                            state.regime = None;
                        }
                        // a raised min_samples is met whole again, not at
                        // the half that keeps a delay (`samples_needed`):
                        // judged afresh at the next tick
                        if policy.min_samples > state.policy.min_samples {
                            state.hedge_delay = None;
                        }
                        state.policy = Arc::new(policy);
                    }
                    Some(id)
                }
                None => match self.insert(name, cluster_name.to_string(), Arc::new(policy)) {
                    Some(id) => Some(id),
                    None => return VariantLookup::Full,
                },
            },
            Err(why) => {
                self.metrics.add(WorkerMetric::RouteOverridesRefused, 1);
                if first_sight {
                    self.pending_log.push((
                        Level::Error,
                        format!("route \"{suffix}\" of cluster \"{cluster_name}\": {why}; its requests are not hedged"),
                    ));
                }
                None
            }
        };
        self.variants.push(RouteVariant {
            cluster: cluster.into(),
            route: route.into(),
            metadata: metadata.into(),
            target,
            used_at_tick: ticks,
        });
        target.map_or(VariantLookup::Refused, VariantLookup::Cluster)
    }

    /// The plan for a request whose route's overrides could not be read
    /// (Envoy answered an error, not "none"): not armed, as for overrides
    /// refused. Taken for "no overrides" it would be armed with the
    /// cluster's policy where the route may say `disabled` or `shadow`.
    /// Counted as refused; said once.
    pub fn plan_unreadable_overrides(&mut self, cluster: &[u8], request: &Request) -> Plan {
        self.metrics.add(WorkerMetric::RouteOverridesRefused, 1);
        if !std::mem::replace(&mut self.unreadable_overrides_logged, true) {
            self.pending_log.push((
                Level::Error,
                format!(
                    "a route's overrides (xds.route_metadata.filter_metadata.adaptive_hedge) to cluster \"{}\" cannot be read: its requests are not hedged",
                    String::from_utf8_lossy(cluster)
                ),
            ));
        }
        decision::plan(request, &self.config, Cluster::Misconfigured)
    }

    /// An upstream response arrived `latency_us` after the request started:
    /// min(primary, delay + hedge) when hedged, which keeps the trigger at the
    /// true quantile instead of drifting down with the filter's own hedging.
    pub fn on_response(&mut self, id: ClusterId, route: Option<RouteId>, latency_us: u64) {
        if let Some(state) = self.clusters.get_mut(id) {
            // capped as every sample is: one request in flight across a
            // clock stepped forward by an hour squeezed a latch's whole
            // regime into its top bucket (found by a review)
            let sample = state.policy.sample_us(latency_us);
            if let Some(latch) = state.stale.as_mut() {
                latch.observe(sample as u64);
            }
            if let Some(regime) = state.regime.as_mut() {
                regime.observe(sample as u64);
            }
            state.samples.add(sample);
            if let Some(route) = route {
                state.routes.add_sample(route, sample);
            }
        }
    }

    /// A sampled request Envoy answered itself before any attempt reached
    /// a host: it stands for the `stride` requests of its population it
    /// was sampled from (one in `stride`), whose earnings go back
    /// (`LocalBudget::unearn`). Ineligible requests are not sampled, and
    /// theirs stay.
    pub fn on_unsent(&mut self, id: ClusterId) {
        if let Some(state) = self.clusters.get_mut(id) {
            state.budget.unearn(state.stride);
        }
    }

    /// What a response says about the cluster's hosts: the winner's
    /// latency (the primary's lower bound when the hedge won), failures,
    /// and whether the host the filter named is the one that answered.
    /// Ends the pick (`end_pick`) after: ended before, a forgotten primary's
    /// slot was free for the winner's address when it is new, and a
    /// hedge's answer was taken for the primary's. For a response whose
    /// request is over with its headers (the virtual-time harness, tests);
    /// the filter hears at the headers and ends at the stream's end
    /// (`hear_host_response`).
    pub fn on_host_response(
        &mut self,
        id: ClusterId,
        pick: Option<HostPick>,
        response: HostResponse,
    ) {
        self.hear_host_response(id, pick, response);
        if let Some(pick) = pick {
            self.end_pick(id, pick);
        }
    }

    /// `on_host_response` without ending the pick: the request's hosts
    /// stay in flight until its stream ends (`end_pick`, from the log). A
    /// stream (SSE, LLM tokens) answers at its headers or first byte and
    /// runs for seconds after: ended there, a host busy with twenty
    /// streams looked idle to the choice's load term (found by a review).
    pub fn hear_host_response(
        &mut self,
        id: ClusterId,
        pick: Option<HostPick>,
        response: HostResponse,
    ) {
        let Some(state) = self.clusters.get_mut(id) else {
            return;
        };
        if state.policy.host_choice {
            state.hear_host_response(pick, response);
        }
    }

    /// Whether the host the filter named for the primary (`pick`) gave the
    /// answer read from `upstream.address` (`address`; `None`: not read,
    /// which after a single attempt means the named host's). `None` when
    /// the filter named no host or the answer is not known.
    pub fn primary_answered(
        &self,
        id: ClusterId,
        pick: Option<HostPick>,
        address: Option<&[u8]>,
        attempts: Option<u64>,
    ) -> Option<bool> {
        let pick = pick?;
        let hosts = &self.clusters.get(id)?.hosts;
        let primary = hosts.get(pick.primary)?;
        // Envoy may not have followed the name of a doubted host (one it
        // no longer has): only its own answer tells
        let doubted = hosts.doubted(pick.primary);
        match address {
            Some(address) if primary.address.as_bytes() == address => Some(true),
            Some(_) => (!doubted).then_some(false),
            None => (attempts == Some(1) && !doubted).then_some(true),
        }
    }

    /// Whether the glue must read which host answered a response of a
    /// request whose primary the filter named (`pick`), after `attempts`.
    /// After a single attempt the answer is the named host's wherever
    /// Envoy follows the header, so only every `ADDRESS_CHECK_EVERY`-th is
    /// read (the first one included): enough to tell a cluster that
    /// ignores the header, or a host Envoy no longer has
    /// (`Hosts::take_override_checks`), while the others are attributed to
    /// the named host without a host call (about 12,500 instructions).
    /// Every other response is read: a hedge's or a retry's winner is not
    /// known otherwise; so is each one naming a host the last read showed
    /// missed (`Hosts::doubted`), and the first naming each host in a
    /// tick (`Hosts::first_read_this_tick`).
    pub fn check_address(
        &mut self,
        id: ClusterId,
        pick: Option<HostPick>,
        attempts: Option<u64>,
    ) -> bool {
        let Some(state) = self.clusters.get_mut(id) else {
            return true;
        };
        let Some(pick) = pick.filter(|_| attempts == Some(1)) else {
            return true;
        };
        let turn = state.address_checks;
        state.address_checks = turn.wrapping_add(1);
        let first_this_tick = state.hosts.first_read_this_tick(pick.primary, self.ticks);
        turn % ADDRESS_CHECK_EVERY == 0 || first_this_tick || state.hosts.doubted(pick.primary)
    }

    /// Host calls of a request that failed (headers not read, removed or
    /// written): counted, not logged (a request is no place for a log line).
    pub fn count_host_errors(&mut self, failures: u64) {
        self.metrics.add(WorkerMetric::HostErrors, failures);
    }

    /// A request whose host the filter chose is no longer in flight to it:
    /// its stream ended (the glue, from the log), or another host's attempt
    /// won. `on_host_response` ends the pick too (the harness's requests end
    /// with their answer).
    pub fn end_pick(&mut self, id: ClusterId, pick: HostPick) {
        if let Some(state) = self.clusters.get_mut(id) {
            state.hosts.track(pick, false);
        }
    }

    /// Another host than the named primary answered (`address`, if read):
    /// the primary's attempt was cancelled, so the pick ends; if the
    /// winner is the hedge's named host, the stream goes on there and is
    /// in flight on it until it ends: the pick returned, to end then.
    /// Before, a stream a hedge won (SSE, a model's tokens) ran on its
    /// host uncounted, and the host looked idle to every later choice.
    pub fn answered_by_other(
        &mut self,
        id: ClusterId,
        pick: HostPick,
        address: Option<&[u8]>,
    ) -> Option<HostPick> {
        let state = self.clusters.get_mut(id)?;
        state.hosts.track(pick, false);
        let hedge = pick.hedge?;
        let named = state.hosts.get(hedge)?;
        if address != Some(named.address.as_bytes()) {
            return None;
        }
        let winner = HostPick {
            primary: hedge,
            hedge: None,
        };
        state.hosts.track(winner, true);
        Some(winner)
    }

    /// An armed request ended; `attempts` is `upstream.request_attempt_count`
    /// (`Some(1)` when arming failed; `None` if the host could not tell: then
    /// every reserved hedge is paid as sent).
    ///
    /// `latency_us`: the response's time, if it was timed. A hedge sent
    /// although the primary answered before its per-try timeout was sent
    /// early: Envoy sets timers from a time read at the start of its event
    /// loop's pass, so on a busy loop they fire early (a 4 ms per-try
    /// timeout on a 3 ms upstream sent hedges on 40% of requests, 4 callers,
    /// against 4% with one caller). The early share raises the timeout.
    /// `primary_answered`: whether the primary's host gave the answer, when
    /// the filter knows (`Worker::primary_answered`). A second attempt whose
    /// answer came from another host before the timeout is a retry after a
    /// fast failure (a 503, a 429, a reset), not an early timer: counted as
    /// early, an error storm set every hedge 50 ms late, for minutes after.
    /// Not knowing, only answers within `EARLY_TIMER_REACH_US` of the
    /// timeout count: an early timer's hedge races a primary about to
    /// answer, while a retry's answer is a whole fresh attempt later. A
    /// third attempt before the timeout is a retry too: past the hosts
    /// named, the balancer may pick the primary's host again.
    pub fn settle(
        &mut self,
        settlement: Settlement,
        attempts: Option<u64>,
        latency_us: Option<u64>,
        ended_ns: Option<u64>,
        primary_answered: Option<bool>,
    ) {
        let Some(state) = self.clusters.get_mut(settlement.cluster) else {
            return;
        };
        if let Some(deadline) = settlement.deadline_ns {
            let ended = match (ended_ns, latency_us) {
                (Some(at), _) => Ended::At(at),
                (None, Some(us)) => Ended::After(us),
                (None, None) => Ended::Untimed,
            };
            state
                .armed
                .ended(deadline, attempts, ended, &mut state.hosts);
        }
        // the sampled ones only, as its responses are (`StaleLatch::regime`)
        if let (Some(latch), false, true) =
            (state.stale.as_mut(), settlement.shadow, settlement.sampled)
        {
            latch.armed = latch.armed.saturating_add(1);
        }
        let reserved = settlement.hedges;
        // every extra attempt is charged, also past the hedges reserved:
        // with the route's own retries in `x-envoy-max-retries` Envoy may
        // retry a failure, or hedge again at the next per-try timeout
        let sent = extra_attempts(attempts, reserved);
        let extra = u64::from(sent);
        let ticks = delay_ticks(settlement.per_try_timeout_ms, self.tick_us);
        state
            .budget
            .settle(settlement.cohort, ticks, reserved, sent);
        if settlement.shadow {
            // the budget as it would have been; nothing was sent
            state.metrics.add(ClusterMetric::ShadowHedges, extra);
            return;
        }
        state.sent_unsynced += extra;
        if let Some(latency_us) = latency_us {
            judge_timer(state, &settlement, sent, latency_us, primary_answered);
        }
        state.metrics.add(ClusterMetric::HedgesSent, extra);
        state.metrics.add(
            ClusterMetric::HedgesRefunded,
            u64::from(reserved.saturating_sub(sent)),
        );
    }

    /// First-byte mode: an armed request settled at its response headers
    /// (`settle`, with no time) had its first byte after `latency_us`, and
    /// `primary_answered` (see `settle`): the early-timer verdict's share.
    pub fn judge_first_byte(
        &mut self,
        settlement: Settlement,
        attempts: Option<u64>,
        latency_us: u64,
        primary_answered: Option<bool>,
    ) {
        let Some(state) = self.clusters.get_mut(settlement.cluster) else {
            return;
        };
        if settlement.shadow {
            return;
        }
        let sent = extra_attempts(attempts, settlement.hedges);
        judge_timer(state, &settlement, sent, latency_us, primary_answered);
    }

    /// The tick: register new clusters, merge into shared memory, refresh delays.
    pub fn sync(&mut self, now_ms: u64, store: &dyn SharedStore, log: &mut dyn Logger) {
        self.ticks += 1;
        // the armed share's counts are halved every slice: about the span
        // of the recent slices the delay is learned from
        let armed_share_decay =
            0.5f64.powf(self.tick_us as f64 / (self.geometry.slice_ms.max(1) as f64 * 1000.0));
        for (level, line) in self.pending_log.drain(..) {
            log.log(level, &line);
        }
        for c in self.clusters.iter_mut() {
            let delay_ticks = c
                .hedge_delay
                .map_or(0, |d| d.delay_us.div_ceil(self.tick_us.max(1)));
            let requests = std::mem::take(&mut c.requests_this_tick);
            if requests > 0 {
                c.busy_tick = Some(self.ticks);
            }
            let per_second = 1e6 / self.tick_us.max(1) as f64;
            c.budget.tick(self.ticks, requests, per_second, delay_ticks);
            c.refusals.tick(self.tick_us);
            c.armed_share.tick(armed_share_decay);
            c.stride = c.population_this_tick.div_ceil(SAMPLES_PER_TICK).max(1);
            c.samples_this_tick = 0;
            c.population_this_tick = 0;
            c.armed.forget_stale(now_ms.saturating_mul(1_000_000));
            if c.tracking == Tracking::Untracked && std::mem::take(&mut c.wants_slot) {
                c.tracking = Tracking::Pending;
            }
        }
        self.sync_shared(now_ms, store, log, PoolTurn::Rebalance, usize::MAX);
    }

    /// The tick's shared-memory part alone: register new clusters, merge
    /// into each cluster's shared value, refresh the delays. Taking up the
    /// registry and retiring call it out of the ticks' cadence: a second
    /// tick a moment after the last would count a tick that did not pass
    /// (the budget's rate, its cohorts, an eviction marker "seen at two
    /// ticks"). Syncs the first `limit` clusters. Returns how many
    /// clusters' shared values were updated.
    fn sync_shared(
        &mut self,
        now_ms: u64,
        store: &dyn SharedStore,
        log: &mut dyn Logger,
        pool: PoolTurn,
        limit: usize,
    ) -> usize {
        // A retiring state registers nothing: a slot it took would be held
        // for a configuration that may not hedge the cluster, until
        // evicted as idle a window later.
        let retiring = pool == PoolTurn::HandOver;
        if !retiring
            && (!self.unregister.is_empty()
                || self
                    .clusters
                    .iter()
                    .any(|c| c.tracking == Tracking::Pending))
        {
            self.register_pending(now_ms, store, log);
        }
        self.look_at_membership(now_ms, store);
        let n = self.clusters.len().min(limit);
        // taking up the registry and retiring read every cluster
        if pool == PoolTurn::HandOver || limit != usize::MAX {
            return (0..n)
                .filter(|&id| self.sync_cluster(id, now_ms, store, log, pool))
                .count();
        }
        // A tick reads every cluster with news here, and of the quiet ones
        // only as many as keeps each read every `QUIET_READ_US` (round
        // robin). Reading all of them, a worker that had taken up a
        // thousand clusters (the registry's, at a configuration push) read
        // and decoded a thousand values and set fifteen thousand gauges on
        // every tick, mostly of clusters it had no request of. A quiet
        // cluster's delay is then up to that old when its next request
        // comes; from the tick after, it is read on every tick again.
        let quiet_ticks =
            (self.geometry.slice_ms.saturating_mul(1000) / self.tick_us.max(1)).max(1);
        let quiet: Vec<bool> = (0..n)
            .map(|id| {
                self.clusters
                    .get(id)
                    .is_some_and(|c| c.quiet(self.ticks, quiet_ticks))
            })
            .collect();
        let mut synced = (0..n)
            .filter(|&id| !quiet.get(id).copied().unwrap_or(false))
            .filter(|&id| self.sync_cluster(id, now_ms, store, log, pool))
            .count();
        let quiet_n = quiet.iter().filter(|&&q| q).count() as u64;
        self.quiet_credit_us = self
            .quiet_credit_us
            .saturating_add(quiet_n.saturating_mul(self.tick_us));
        let turns = (self.quiet_credit_us / QUIET_READ_US).min(quiet_n);
        self.quiet_credit_us = (self.quiet_credit_us - turns * QUIET_READ_US).min(QUIET_READ_US);
        let start = self.quiet_cursor;
        let mut taken = 0;
        for k in 0..n {
            if taken >= turns {
                break;
            }
            let id = start.wrapping_add(k) % n;
            if quiet.get(id).copied().unwrap_or(false) {
                taken += 1;
                self.quiet_cursor = id.wrapping_add(1);
                synced += usize::from(self.sync_cluster(id, now_ms, store, log, pool));
            }
        }
        synced
    }

    fn tracks_a_cluster(&self) -> bool {
        self.clusters
            .iter()
            .any(|c| c.tracking == Tracking::Tracked)
    }

    /// The admin interface's last read, from shared memory, at most once
    /// every `MEMBERSHIP_LOOK_MS`, decoded only when it changed.
    fn look_at_membership(&mut self, now_ms: u64, store: &dyn SharedStore) {
        // a next look more than a look ahead: the clock was set back, and
        // waiting for it would leave the shared read unread that long
        let wait = self.admin.next_look_ms.saturating_sub(now_ms);
        if self.config.admin_cluster().is_none()
            || (wait > 0 && wait <= MEMBERSHIP_LOOK_MS)
            || !self.tracks_a_cluster()
        {
            return;
        }
        self.admin.next_look_ms = now_ms.saturating_add(MEMBERSHIP_LOOK_MS);
        let Ok(Some((bytes, token))) = store.get(&membership_key(self.geometry)) else {
            return;
        };
        if self.admin.token == Some(token) {
            return;
        }
        // a value that does not decode is replaced by the next read
        if let Ok(membership) = Membership::decode(&bytes) {
            self.take_membership(membership, now_ms);
            self.admin.token = Some(token);
        }
    }

    /// The admin interface's read `membership`, now this worker's. A quiet
    /// cluster whose hosts' health or weights (or outlier detection)
    /// changed is read at the next tick: they are applied at a read
    /// (`Hosts::refresh`), and its next requests would have named a host
    /// just held out (found by a review).
    fn take_membership(&mut self, membership: Membership, now_ms: u64) {
        let before = std::mem::replace(&mut self.admin.membership, membership);
        let period_ms = membership_period_ms(&self.config, self.tick_us);
        let after = &self.admin.membership;
        for c in self.clusters.iter_mut() {
            let name = c.envoy_cluster.as_str();
            if before.members(name, now_ms, period_ms) != after.members(name, now_ms, period_ms)
                || before.outlier_detection(name, now_ms, period_ms)
                    != after.outlier_detection(name, now_ms, period_ms)
            {
                c.membership_news = true;
            }
        }
    }

    /// After `sync`: the path of a read of the admin interface this worker
    /// has claimed (`admin_refresh` after the last claim, by any worker),
    /// for the glue to GET through `admin_cluster`; then `admin_read_done`.
    /// The read asks for the clusters in the shared registry that choose
    /// their hosts or pace for outlier detection (all workers' clusters; a
    /// route with overrides, `<cluster>.route.<route>` there, by its
    /// cluster), and for this worker's own (a route's overrides may choose
    /// hosts where its cluster does not).
    pub fn claim_admin_read(&mut self, now_ms: u64, store: &dyn SharedStore) -> Option<String> {
        self.config.admin_cluster()?;
        let refresh_ms = self.config.admin_refresh_ms();
        let in_flight = self
            .admin
            .in_flight_since_ms
            .is_some_and(|since| now_ms.saturating_sub(since) < 2 * refresh_ms);
        // a worker that tracks no cluster (none answered yet) leaves shared
        // memory alone: another worker reads for the clusters it tracks
        if in_flight
            || now_ms < self.admin.next_try_ms
            || !self.admin.membership.due(now_ms, refresh_ms)
            || !self.tracks_a_cluster()
        {
            return None;
        }
        let registry = store
            .get(&registry_key(self.geometry))
            .ok()
            .flatten()
            .and_then(|(bytes, _)| Registry::decode(&bytes).ok())
            .unwrap_or_default();
        let mut names: Vec<&str> = registry
            .names
            .iter()
            .map(|n| n.split_once(".route.").map_or(n.as_str(), |(c, _)| c))
            .filter(|n| self.config.policy_for(n).reads_admin())
            .collect();
        names.extend(
            self.clusters
                .iter()
                .filter(|c| c.tracking == Tracking::Tracked && c.policy.reads_admin())
                .map(|c| c.envoy_cluster.as_str()),
        );
        // A read that is made anyway asks, until one has answered, for the
        // clusters the configuration names too: a name Envoy does not have
        // (a typo, Istio's port in `outbound|80||...`) would otherwise leave
        // its settings applied to nothing, unsaid.
        if !names.is_empty() && !self.admin.overrides_checked {
            names.extend(self.config.clusters.keys().map(String::as_str));
        }
        names.sort_unstable();
        names.dedup();
        let Some(path) = admin_path(names.iter().copied()) else {
            // nothing to ask for (yet): not before the next period
            self.admin.next_try_ms = now_ms.saturating_add(refresh_ms);
            return None;
        };
        let asked: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let key = membership_key(self.geometry);
        let (mut value, token) = match store.get(&key) {
            Ok(Some((bytes, token))) => (Membership::decode(&bytes).unwrap_or_default(), token),
            Ok(None) => (Membership::default(), CREATE_ONLY),
            Err(_) => return None,
        };
        if !value.due(now_ms, refresh_ms) {
            // another worker claimed it since this one last looked
            self.admin.membership = value;
            return None;
        }
        value.claimed_ms = now_ms;
        store.set(&key, &value.encode(), token).ok()?;
        self.admin.membership = value;
        self.admin.in_flight_since_ms = Some(now_ms);
        self.admin.asked = asked;
        self.admin.pending = None;
        Some(path)
    }

    /// Envoy has no cluster by the name `admin_cluster` holds by default
    /// (not written in the configuration): a plain Envoy need not have
    /// one. Not a failure: said once, at `Info`, and looked for again
    /// every `ABSENT_ADMIN_RETRY_MS` (a cluster Envoy may be given later).
    pub fn admin_cluster_absent(&mut self, now_ms: u64, log: &mut dyn Logger) {
        self.admin.in_flight_since_ms = None;
        self.admin.asked.clear();
        self.admin.pending = None;
        self.admin.next_try_ms = now_ms.saturating_add(ABSENT_ADMIN_RETRY_MS);
        if !std::mem::replace(&mut self.admin.absent, true) {
            log.log(
                Level::Info,
                &format!("no cluster \"{}\" to Envoy's admin interface (admin_cluster's default, which Istio's and Envoy Gateway's bootstraps declare): hosts are chosen without Envoy's word on their health and weight, and outlier pacing stays on; name such a cluster in admin_cluster, or set it to \"\"", self.config.admin_cluster),
            );
        }
    }

    /// The admin read's `/clusters` answer is in, its configuration dumps
    /// are being read.
    pub fn admin_read_half_done(&self) -> bool {
        self.admin.pending.is_some()
    }

    /// An answer to the read `claim_admin_read` asked for (`Ok`: the body of
    /// a 200) or its failure (why). The `/clusters` answer comes first; if
    /// it shows clusters with outlier detection, the configuration dumps
    /// follow (the path of the next one to GET is returned), which say
    /// whether each splits local-origin errors. Then what the read says
    /// goes to shared memory for every worker's next look.
    pub fn admin_read_done(
        &mut self,
        now_ms: u64,
        result: Result<&[u8], String>,
        store: &dyn SharedStore,
        log: &mut dyn Logger,
    ) -> Option<String> {
        let cluster = self.config.admin_cluster.clone();
        if let Some(mut pending) = self.admin.pending.take() {
            match result.and_then(parse_config_dump) {
                Ok(split) => {
                    for (name, split) in split {
                        if let Some(o) = pending.outlier_detection.get_mut(&name) {
                            *o = if split {
                                OutlierDetection::Split
                            } else {
                                OutlierDetection::Unsplit
                            };
                        }
                    }
                    if !pending.dumps.is_empty() {
                        return self.go_on_reading(now_ms, pending, store, log);
                    }
                    if std::mem::replace(&mut self.admin.dump_failing, false) {
                        log.log(
                            Level::Info,
                            &format!("Envoy's configuration dump read again through cluster \"{cluster}\""),
                        );
                    }
                }
                Err(why) => {
                    // the clusters' split stays unknown (paced), the rest holds
                    if !std::mem::replace(&mut self.admin.dump_failing, true) {
                        log.log(
                            Level::Warn,
                            &format!("cannot read Envoy's configuration dump through cluster \"{cluster}\": {why}; clusters with outlier detection stay paced until a read works"),
                        );
                    }
                }
            }
            self.store_admin_read(now_ms, pending, store, log);
            return None;
        }
        self.admin.in_flight_since_ms = None;
        let asked = std::mem::take(&mut self.admin.asked);
        let body = result.as_ref().ok().copied();
        let read = result.and_then(|body| {
            let wanted = |c: &str| asked.binary_search_by(|a| a.as_str().cmp(c)).is_ok();
            let clusters = parse_admin_clusters(body, wanted);
            if clusters.is_empty() {
                Err(format!("its answer names no host of the {} clusters asked for (is it Envoy's admin interface?)", asked.len()))
            } else {
                let outlier_detection =
                    parse_outlier_detection(body, |c| clusters.contains_key(c));
                let dumps = config_dump_paths(outlier_detection.keys().map(String::as_str));
                Ok(PendingRead {
                    clusters,
                    outlier_detection,
                    dumps,
                })
            }
        });
        match read {
            Ok(pending) => {
                if let Some(body) = body {
                    self.warn_of_unknown_clusters(body, &asked, store, log);
                }
                self.go_on_reading(now_ms, pending, store, log)
            }
            Err(why) => {
                self.metrics.add(WorkerMetric::AdminReadFailures, 1);
                if !std::mem::replace(&mut self.admin.failing, true) {
                    log.log(
                        Level::Warn,
                        &format!("cannot read Envoy's admin interface through cluster \"{cluster}\": {why}; hosts are chosen without Envoy's word on their health and weight until a read works"),
                    );
                }
                None
            }
        }
    }

    /// Once, after the first read that asked for them: the clusters the
    /// configuration names that Envoy's `/clusters` does not list, at
    /// `Warn` (their settings apply to no request). A warning, not a
    /// refusal: a cluster may come with a later xDS push. Said by one
    /// worker per Envoy and set of names (a shared mark), though every
    /// worker's first read asks.
    fn warn_of_unknown_clusters(
        &mut self,
        body: &[u8],
        asked: &[String],
        store: &dyn SharedStore,
        log: &mut dyn Logger,
    ) {
        let mut names: Vec<&str> = self.config.clusters.keys().map(String::as_str).collect();
        names.sort_unstable();
        // only a read that asked for them all can tell
        let asked_all = names
            .iter()
            .all(|n| asked.binary_search_by(|a| a.as_str().cmp(n)).is_ok());
        if !asked_all || std::mem::replace(&mut self.admin.overrides_checked, true) {
            return;
        }
        let text = String::from_utf8_lossy(body);
        let unknown: Vec<&str> = names
            .iter()
            .copied()
            .filter(|name| !lists_cluster(&text, name))
            .collect();
        if unknown.is_empty() {
            return;
        }
        let key = unknown_clusters_said_key(self.geometry, fnv1a(names.join("\n").as_bytes()));
        let first =
            matches!(store.get(&key), Ok(None)) && store.set(&key, b"", CREATE_ONLY).is_ok();
        if !first {
            return;
        }
        for name in unknown {
            log.log(
                Level::Warn,
                &format!("clusters.\"{name}\": Envoy has no cluster of this name (its admin interface's /clusters, read through \"{}\"), so these settings apply to no request; the names are Envoy's own (Istio's: \"outbound|80||reviews.default.svc.cluster.local\")", self.config.admin_cluster),
            );
        }
    }

    /// The next configuration dump of `read` to GET (in the same claim), or
    /// with none left, the read written to shared memory.
    fn go_on_reading(
        &mut self,
        now_ms: u64,
        mut read: PendingRead,
        store: &dyn SharedStore,
        log: &mut dyn Logger,
    ) -> Option<String> {
        if read.dumps.is_empty() {
            self.store_admin_read(now_ms, read, store, log);
            return None;
        }
        let next = read.dumps.remove(0);
        self.admin.in_flight_since_ms = Some(now_ms);
        self.admin.pending = Some(read);
        Some(next)
    }

    /// Writes a finished read to shared memory.
    fn store_admin_read(
        &mut self,
        now_ms: u64,
        read: PendingRead,
        store: &dyn SharedStore,
        log: &mut dyn Logger,
    ) {
        self.admin.in_flight_since_ms = None;
        let cluster = self.config.admin_cluster.clone();
        let update = update_shared(
            store,
            &membership_key(self.geometry),
            false,
            Membership::decode,
            Membership::default,
            |m| {
                m.read_ms = now_ms;
                m.clusters = read.clusters.clone();
                m.outlier_detection = read.outlier_detection.clone();
            },
            Membership::encode,
        );
        self.metrics.add(WorkerMetric::AdminReads, 1);
        self.admin.absent = false;
        if let Some(stored) = self.account(update, log, "membership") {
            self.take_membership(stored.value, now_ms);
            // the token is not known: the next look decodes the value again
            self.admin.token = None;
            if std::mem::replace(&mut self.admin.failing, false) {
                log.log(
                    Level::Info,
                    &format!("Envoy's admin interface read again through cluster \"{cluster}\""),
                );
            }
        }
    }

    fn register_pending(&mut self, now_ms: u64, store: &dyn SharedStore, log: &mut dyn Logger) {
        let max = self.config.max_clusters;
        let key = registry_key(self.geometry);
        let mut evicted = self.evict_idle(now_ms, store, &key, max);
        // only while the marker is still there: a worker that put the name
        // back and revived the value since keeps it
        let geometry = self.geometry;
        self.unregister.retain(|name| {
            matches!(
                store.get(&cluster_key(geometry, name)),
                Ok(Some((bytes, _))) if matches!(
                    SharedCluster::decode(&bytes, geometry),
                    Err(DecodeError::Evicted)
                )
            )
        });
        evicted.extend(self.unregister.iter().cloned());
        let clusters = &self.clusters;
        let mut outcome = Vec::new();
        // the names this update took out: an unregistered name another
        // worker removed already is no second eviction
        let mut removed = 0;
        let update = update_shared(
            store,
            &key,
            false,
            Registry::decode,
            Registry::default,
            |registry| {
                // recomputed on every attempt: a conflict means another worker
                // changed the registry in between
                outcome.clear();
                let before = registry.names.len();
                registry.names.retain(|n| !evicted.contains(n));
                removed = before - registry.names.len();
                for (id, state) in clusters.iter().enumerate() {
                    if state.tracking != Tracking::Pending {
                        continue;
                    }
                    let slot = if registry.contains(&state.name) {
                        Slot::Registered
                    } else if registry.names.len() < max {
                        registry.names.push(state.name.clone());
                        Slot::Added
                    } else {
                        Slot::Refused
                    };
                    outcome.push((id, slot));
                }
            },
            Registry::encode,
        );
        if let Some(e) = &update.reset {
            log.log(Level::Warn, &format!("shared registry {key} reset: {e}"));
        }
        if self.account(update, log, "registry").is_none() {
            return;
        }
        self.unregister.clear();
        if removed > 0 {
            self.metrics
                .add(WorkerMetric::ClustersEvicted, removed as u64);
        }
        for (id, slot) in outcome {
            let Some(state) = self.clusters.get_mut(id) else {
                continue;
            };
            let tracked = slot != Slot::Refused;
            // Only the worker that put the name back in the registry may
            // replace an evicted marker: a name still registered beside a
            // marker is being evicted (its removal from the registry follows).
            state.revive = slot == Slot::Added;
            if state.revive {
                let name = &state.name;
                self.markers_seen.forget(|(n, _)| n == name);
            }
            state.tracking = if tracked {
                Tracking::Tracked
            } else {
                Tracking::Untracked
            };
            if !tracked && !self.registry_full_logged {
                self.registry_full_logged = true;
                log.log(
                    Level::Warn,
                    &format!(
                        "max_clusters ({max}) reached: cluster \"{}\" and any further new cluster pass through unhedged",
                        state.name
                    ),
                );
            }
        }
    }

    /// When the registry is full and this worker has clusters waiting for
    /// a slot: gives up the slots of registered clusters idle for a whole
    /// window (no sample in it), up to `EVICTIONS_PER_TICK` a tick among
    /// `4 x EVICTIONS_PER_TICK` looked at in a row, from a place drawn per
    /// tick and worker (`stir`). Each one's key is
    /// left an evicted marker, written with the token read, so a cluster
    /// that turned busy in between keeps its value; a key that already holds
    /// a marker seen at an earlier tick (an eviction whose registry update
    /// failed: `stranded`) is taken out as it is. Clusters this worker has samples or requests of waiting for
    /// the tick are not idle. Returns the names, to take out of the registry.
    fn evict_idle(
        &mut self,
        now_ms: u64,
        store: &dyn SharedStore,
        key: &str,
        max: usize,
    ) -> Vec<String> {
        let mut evicted = Vec::new();
        let Ok(Some((bytes, _))) = store.get(key) else {
            return evicted;
        };
        let Ok(registry) = Registry::decode(&bytes) else {
            return evicted;
        };
        let pending = self
            .clusters
            .iter()
            .filter(|c| c.tracking == Tracking::Pending && !registry.contains(&c.name))
            .count();
        let full = registry.names.len();
        if full < max || pending == 0 || full == 0 {
            return evicted;
        }
        let needed = pending.min(EVICTIONS_PER_TICK);
        let looked_at = full.min(EVICTIONS_PER_TICK * 4);
        let start = self.eviction_cursor;
        for i in 0..looked_at {
            if evicted.len() >= needed {
                break;
            }
            let Some(name) = registry.names.get(start.wrapping_add(i) % full) else {
                continue;
            };
            let busy_here = self
                .index
                .get(name.as_bytes())
                .and_then(|&id| self.clusters.get(id))
                .is_some_and(|c| !c.samples.is_empty() || c.requests_unsynced > 0);
            if busy_here {
                continue;
            }
            let cluster_key = cluster_key(self.geometry, name);
            let Ok(Some((bytes, cas))) = store.get(&cluster_key) else {
                continue;
            };
            let evict = match SharedCluster::decode(&bytes, self.geometry) {
                Ok(cluster) => {
                    self.idle_for_a_slice(
                        name,
                        cluster.requests_total,
                        cluster.idle(now_ms),
                        now_ms,
                    ) && store
                        .set(&cluster_key, &SharedCluster::evicted(), cas)
                        .is_ok()
                }
                Err(DecodeError::Evicted) => self.stranded(name, cas),
                Err(_) => false,
            };
            if evict {
                evicted.push(name.clone());
            }
        }
        evicted
    }

    /// Whether registered `name`, `idle` now (an empty window), was found
    /// idle by this worker a slice ago or more, and not busy since. A value
    /// just created or revived is empty too: another worker's first
    /// samples of it reach it only at that worker's next tick, and a
    /// cluster at less than a response a tick was evicted as soon as it
    /// was revived, and the one that took its slot next, in turn, neither
    /// ever hedged (found by a review). Sightings are kept for a window
    /// (the names looked at are drawn at random, so a second look may come
    /// late), at most `IDLE_REMEMBERED`.
    ///
    /// A sighting is of the value's life (`requests_total`): one from
    /// before an eviction and a revival by another worker evicted the
    /// revived value at its first look (found by a review).
    fn idle_for_a_slice(&mut self, name: &str, requests: u64, idle: bool, now_ms: u64) -> bool {
        if !idle {
            self.idle_seen.forget(|(n, _)| n == name);
            return false;
        }
        let slice_ms = self.geometry.slice_ms.max(1);
        let window_ms = slice_ms.saturating_mul(SLICES as u64);
        self.idle_seen
            .seen_before((name.to_string(), requests), now_ms, slice_ms, window_ms)
    }

    /// Whether the evicted marker found in the key of registered `name`
    /// (`marker`: its CAS token) is stranded: its eviction wrote the marker
    /// and then failed to update the registry (eight conflicts in a row, a
    /// host error). Nothing else takes such a name out, so a busy cluster
    /// was registered, found its marker and was evicted again, tick after
    /// tick, unhedged for good. A marker beside a registered name is also
    /// seen for a moment in two races (an eviction between its two writes;
    /// a worker that has just put the name back, before it replaces the
    /// marker): so it is stranded only if the same marker (its token: a
    /// marker written since has another) was seen at an earlier tick too.
    /// Known by its token, a sighting stays good however long ago it was:
    /// known by tick age (five ticks), a cluster this worker synced less
    /// often than that (below a request a second) never saw one marker
    /// twice, and stayed unhedged (found by a review).
    fn stranded(&mut self, name: &str, marker: u32) -> bool {
        self.markers_seen
            .seen_before((name.to_string(), marker), self.ticks, 1, u64::MAX)
    }

    fn sync_cluster(
        &mut self,
        id: ClusterId,
        now_ms: u64,
        store: &dyn SharedStore,
        log: &mut dyn Logger,
        pool: PoolTurn,
    ) -> bool {
        let geometry = self.geometry;
        let period_ms = membership_period_ms(&self.config, self.tick_us);
        let Some(state) = self.clusters.get_mut(id) else {
            return false;
        };
        if state.tracking != Tracking::Tracked {
            return false;
        }
        let members = self
            .admin
            .membership
            .members(&state.envoy_cluster, now_ms, period_ms);
        let mut budget = state.budget.clone();
        let update = update_shared(
            store,
            &cluster_key(geometry, &state.name),
            state.revive,
            |bytes| SharedCluster::decode(bytes, geometry),
            || SharedCluster::new(geometry),
            |shared| {
                budget = state.budget.clone();
                match pool {
                    PoolTurn::Rebalance => {
                        budget.rebalance(&mut shared.pool, shared.requests_total, now_ms)
                    }
                    PoolTurn::HandOver => budget.hand_over(&mut shared.pool),
                }
                shared.window.merge(now_ms, &state.samples);
                shared.window.expire(now_ms);
                shared.long.merge(now_ms, &state.samples);
                shared.cut_short.merge(now_ms, &state.cut_short);
                state.routes.merge_into(
                    &mut shared.routes,
                    now_ms,
                    state.policy.max_routes,
                    geometry,
                );
                if state.policy.host_choice {
                    state.hosts.merge_into(&mut shared.hosts, now_ms, members);
                } else {
                    hosts::forget_silent(&mut shared.hosts, now_ms, members);
                }
                // past the value's cap a route is not stored, so not learned
                shared.fit_routes();
                shared.requests_total = shared.requests_total.wrapping_add(state.requests_unsynced);
                shared.hedges_sent_total =
                    shared.hedges_sent_total.wrapping_add(state.sent_unsynced);
            },
            SharedCluster::encode,
        );
        if let Some(marker) = update.evicted {
            state.evicted();
            let name = state.name.clone();
            if self.stranded(&name, marker) && !self.unregister.contains(&name) {
                self.unregister.push(name);
            }
            return false;
        }
        if let (Some(e), false) = (&update.reset, state.reset_logged) {
            state.reset_logged = true;
            log.log(
                Level::Warn,
                &format!("shared state of cluster \"{}\" reset: {e}", state.name),
            );
        }
        let Some(shared) = self.account(update, log, "cluster") else {
            // A revival not written: the registry is read again at the next
            // tick before anything is revived, since another worker may have
            // taken the name out meanwhile (a value revived blind then lived
            // outside the registry, one over max_clusters: found by a review).
            if let Some(state) = self.clusters.get_mut(id).filter(|s| s.revive) {
                state.revive = false;
                state.tracking = Tracking::Pending;
            }
            return false;
        };
        let Some(state) = self.clusters.get_mut(id) else {
            return false;
        };
        // the ticks since its last read (a quiet cluster's, up to 10 s)
        if let Some(last) = state.synced_tick {
            state
                .hosts
                .ticks_passed(self.ticks.saturating_sub(last).saturating_sub(1));
        }
        state.synced_tick = Some(self.ticks);
        state.membership_news = false;
        // its value decoded: a marker seen before is gone
        let name = &state.name;
        self.markers_seen.forget(|(n, _)| n == name);
        state.revive = false;
        state.samples.clear();
        state.cut_short.clear();
        state.requests_unsynced = 0;
        state.sent_unsynced = 0;
        state.budget = budget;
        state.shared_bytes = shared.bytes;
        let window = shared.value.window.snapshot(now_ms);
        state.window_samples = window.count();
        state.latency_quantiles_us =
            LATENCY_QUANTILES.map(|q| window.quantile(q).map_or(0, |us| us.round() as u64));
        // which attempt answered is known only where the filter chose hosts
        state.backend_quantiles_us = if state.policy.host_choice {
            let (long, cut) = (&shared.value.long.sketch, &shared.value.cut_short.sketch);
            LATENCY_QUANTILES
                .map(|q| backend_quantile(long, cut, q).map_or(0, |us| us.round() as u64))
        } else {
            [0; 3]
        };
        // the current slice and the one before: one to two slices of samples
        let recent = shared.value.window.snapshot_recent_at_least(
            now_ms,
            RECENT_SLICES,
            state.policy.min_samples,
        );
        // the share of requests the delay is meant to hedge
        let planned = 1.0 - trigger_quantile(&state.policy);
        state.timer.tick(planned);
        // the recent samples were hedged at the per-try timeout in force
        let censored_at = state.hedge_delay.map(|d| d.censoring_point_us());
        let censoring = censored_at.map(|at_us| Censoring {
            at_us,
            armed_share: state.armed_share.share(),
        });
        let epoch = self.geometry.epoch(now_ms);
        if state
            .regime
            .as_mut()
            .is_some_and(|r| r.over(epoch, planned))
        {
            state.regime = None;
        }
        let regime = match (&state.stale, &state.regime) {
            (Some(latch), _) => Some(latch.regime()),
            (None, Some(r)) => Some((&r.since, r.censoring)),
            (None, None) => None,
        };
        state.hedge_delay = hedge_delay(
            &state.policy,
            &shared.value.long.sketch,
            &recent,
            censoring,
            state.budget_state(),
            regime,
            state.hedge_delay.is_some(),
        )
        .map(|d| state.timer.apply(d, &state.policy));
        let max_ms = state.policy.max_delay_ms();
        if let Some(latch) = state.stale.as_mut() {
            if latch.released(state.hedge_delay, planned, max_ms, self.tick_us) {
                state.regime = state
                    .stale
                    .take()
                    .and_then(|l| NewRegime::after(l, epoch + RECENT_SLICES, planned));
            }
        }
        state.shadow_p99_microseconds = match (state.policy.mode, state.hedge_delay) {
            // in shadow mode the window's samples are unhedged
            (Mode::Shadow, Some(d)) => hedged_quantile(&window, d.delay_us as f64, 0.99),
            _ => None,
        };
        let period_ms = membership_period_ms(&self.config, self.tick_us);
        let members = self
            .admin
            .membership
            .members(&state.envoy_cluster, now_ms, period_ms);
        state.hosts_summary = state.hosts.refresh(&shared.value.hosts, members);
        if state.hosts_summary.overflowing && !std::mem::replace(&mut state.overflow_logged, true) {
            log.log(
                Level::Warn,
                &format!(
                    "cluster \"{}\" has more hosts answering than host choice tracks ({MAX_HOSTS}): Envoy's balancer chooses them, hedging goes on",
                    state.name
                ),
            );
        }
        let outlier_detection =
            self.admin
                .membership
                .outlier_detection(&state.envoy_cluster, now_ms, period_ms);
        // kept whether or not pacing is on: the timeouts' 204 follows it too
        if outlier_detection != state.outlier_detection {
            let was = state.pacing();
            state.outlier_detection = outlier_detection;
            if state.pacing() != was {
                log.log(
                    Level::Info,
                    &if was {
                        format!("cluster \"{}\": Envoy's outlier detection there does not count a hedge's timeout (none, or local-origin errors not split; admin interface): outlier pacing off", state.name)
                    } else {
                        format!("cluster \"{}\": Envoy's outlier detection there may count a hedge's timeout, or its word on it is lost: outlier pacing on", state.name)
                    },
                );
            }
        }
        let (checks, misses) = state.hosts.take_override_checks();
        state.override_check.add(checks, misses);
        if state.override_check.tick(now_ms) {
            log.log(
                Level::Warn,
                &format!(
                    "cluster \"{}\" does not follow the host header (no override_host load balancing policy?): host choice paused, hedging goes on; set host_choice false for it to stop checking",
                    state.name
                ),
            );
        }
        let budget = state.budget_state();
        let (timer, policy) = (&state.timer, &state.policy);
        state.routes.refresh(
            &shared.value.routes,
            now_ms,
            policy,
            RecentTerms {
                slices: RECENT_SLICES,
                cluster_censored_at: censored_at,
                armed_share: state.armed_share.share(),
                budget,
            },
            |d| timer.apply(d, policy),
        );
        true
    }

    /// Counts what an `update_shared` met (resets, conflicts, a host error,
    /// logged at most once a minute); the value if it is in shared memory
    /// now. Logged when the tick's count was one, a request's failed header
    /// call first kept a failing shared memory out of the log, and a lasting
    /// failure was logged on every tick (found by a review).
    fn account<T>(
        &mut self,
        update: SharedUpdate<T>,
        log: &mut dyn Logger,
        what: &str,
    ) -> Option<Stored<T>> {
        self.metrics
            .add(WorkerMetric::SharedStateResets, update.resets);
        self.metrics
            .add(WorkerMetric::SyncConflicts, u64::from(update.conflicts));
        match update.result {
            Ok(stored) => stored,
            Err((call, e)) => {
                self.metrics.add(WorkerMetric::HostErrors, 1);
                let minute = (60_000_000 / self.tick_us.max(1)).max(1);
                let quiet = self
                    .shared_error_logged
                    .map_or(true, |at| self.ticks.saturating_sub(at) >= minute);
                if quiet {
                    self.shared_error_logged = Some(self.ticks);
                    log.log(
                        Level::Error,
                        &format!("{call}_shared_data({what}) failed: {e:?}; hedging uses the last known state"),
                    );
                }
                None
            }
        }
    }

    /// Pushes counter deltas and gauges to Envoy's stats (on the tick).
    pub fn flush_metrics(&mut self, sink: &mut dyn MetricsSink) {
        // Every VM sets the same gauge; one without clusters (Envoy's main
        // thread) would overwrite the workers' value with 0.
        let shared_bytes: usize = self.clusters.iter().map(|c| c.shared_bytes).sum();
        self.metrics.flush(sink, None, |_| {
            (shared_bytes > 0).then_some(shared_bytes as u64)
        });
        for state in self.clusters.iter_mut() {
            if state.tracking != Tracking::Tracked {
                // Evicted (it was flushed before): its counters' last
                // deltas, and its gauges set to 0 once. Before, they kept
                // their last values for the VM's life: a gone cluster's
                // `hedge_delay_clamped` kept its alert firing. A cluster
                // never tracked has no metrics of its own.
                if state.metrics.defined() {
                    let clear = !std::mem::replace(&mut state.gauges_cleared, true);
                    state
                        .metrics
                        .flush(sink, Some(&state.name), |_| clear.then_some(0));
                    state.routes.flush_metrics(sink, &state.name);
                }
                continue;
            }
            // Gauges only from a value read this tick: a quiet cluster's are
            // as they were (other workers, or this one at its next read, set
            // them), and setting them all took a thousand clusters' fifteen
            // gauges each on every tick.
            if state.synced_tick != Some(self.ticks) {
                state.metrics.flush(sink, Some(&state.name), |_| None);
                continue;
            }
            let (delay, samples) = (
                state.hedge_delay.map_or(0, |d| d.delay_us),
                state.window_samples,
            );
            let clamped = state.hedge_delay.map_or(0, |d| {
                if d.delay_us >= state.policy.max_delay.as_micros() as u64 {
                    2
                } else if d.delay_us <= state.policy.min_delay.as_micros() as u64 {
                    1
                } else {
                    0
                }
            });
            let (hosts, ignored) = (state.hosts_summary, state.override_check.ignored());
            // 0 out of shadow mode: the gauge outlives a reload from shadow
            // to hedge (the rollout the docs advise)
            let shadow_p99 = state
                .shadow_p99_microseconds
                .map_or(0, |us| us.round() as u64);
            let [p50, p90, p99] = state.latency_quantiles_us;
            let [b50, b90, b99] = state.backend_quantiles_us;
            state.metrics.flush(sink, Some(&state.name), |m| match m {
                ClusterMetric::HedgeDelayUs => Some(delay),
                ClusterMetric::HedgeDelayClamped => Some(clamped),
                ClusterMetric::WindowSamples => Some(samples),
                ClusterMetric::HostsTracked => Some(hosts.tracked as u64),
                ClusterMetric::HostsOnProbation => Some(hosts.on_probation as u64),
                ClusterMetric::HostsHeldOut => Some(hosts.held_out as u64),
                ClusterMetric::SlowestHostShare => {
                    Some((hosts.slowest_share * 1000.0).round() as u64)
                }
                ClusterMetric::HostChoiceIgnored => Some(u64::from(ignored)),
                ClusterMetric::ShadowP99Us => Some(shadow_p99),
                ClusterMetric::LatencyP50Us => Some(p50),
                ClusterMetric::LatencyP90Us => Some(p90),
                ClusterMetric::LatencyP99Us => Some(p99),
                ClusterMetric::BackendP50Us => Some(b50),
                ClusterMetric::BackendP90Us => Some(b90),
                ClusterMetric::BackendP99Us => Some(b99),
                _ => None,
            });
            state.routes.flush_metrics(sink, &state.name);
        }
    }
}

/// The extra attempts Envoy made for a request (`attempts`: its
/// `upstream.request_attempt_count`), or, not known, the `reserved` ones.
fn extra_attempts(attempts: Option<u64>, reserved: u32) -> u32 {
    match attempts {
        Some(a) => u32::try_from(a.saturating_sub(1)).unwrap_or(u32::MAX),
        None => reserved,
    }
}

/// The early-timer verdict's share of an armed request's end (see
/// `Worker::settle`): `sent` extra attempts, answered after `latency_us`.
fn judge_timer(
    state: &mut ClusterState,
    settlement: &Settlement,
    sent: u32,
    latency_us: u64,
    primary_answered: Option<bool>,
) {
    let per_try_us = settlement.per_try_timeout_ms.saturating_mul(1000);
    let before_timeout = sent > 0 && latency_us < per_try_us;
    // A retry after a fast failure: another host answered, or (not
    // known who) the answer came a fresh attempt before the
    // timeout, or a third attempt did (the timers start at most one
    // before it). Neither early nor the timer's hedge: counted as
    // hedges, a storm's retries alone passed the verdict's plan.
    let retried = before_timeout
        && (sent >= 2
            || !primary_answered
                .unwrap_or(latency_us.saturating_add(EARLY_TIMER_REACH_US) >= per_try_us));
    let early = before_timeout && !retried;
    state.timer.observe(sent > 0 && !retried, early);
    // Only a timed answer tells: above `SAMPLES_PER_TICK` requests a tick
    // one in `stride` is timed, and it counts for the requests it stands
    // for, as `hedges_sent_total` counts them all. Counted as one, at 5,000
    // requests a second a worker's wins read a quarter of the truth, and
    // the "hedges rarely win" alert fired on hedges that won (found by a
    // review).
    if early {
        state
            .metrics
            .add(ClusterMetric::EarlyHedges, u64::from(state.stride));
    }
}

/// How long the admin interface's read is trusted: a few periods, or
/// ticks if those are longer (see `Membership::members`).
/// What a worker has seen in some state (a name; a name and a token), and
/// when (in ticks or ms: the caller's unit), at most `cap` of them: for
/// what holds only once seen twice some time apart (an idle cluster, a
/// stranded marker).
#[derive(Debug)]
struct Sightings<K> {
    seen: Vec<(K, u64)>,
    cap: usize,
}

impl<K: PartialEq> Sightings<K> {
    fn new(cap: usize) -> Self {
        Sightings {
            seen: Vec::new(),
            cap,
        }
    }

    /// Whether `what`, seen now (`now`), was seen at least `min_age` and
    /// at most `max_age` before; if so the sighting is spent, else this
    /// one is kept (a first, or again within `min_age`: the first stays).
    ///
    /// A sighting from after `now` (the wall clock was set back) goes: its
    /// age would read 0 until the clock caught up, hours maybe, and as it
    /// matches every later look, none is recorded in its place, so an idle
    /// cluster kept its slot all that time (found by a review). Dropped,
    /// the step back restarts the look.
    fn seen_before(&mut self, what: K, now: u64, min_age: u64, max_age: u64) -> bool {
        self.seen
            .retain(|&(_, at)| at <= now && now - at <= max_age);
        if let Some(i) = self.seen.iter().position(|(k, _)| *k == what) {
            let old_enough = self
                .seen
                .get(i)
                .is_some_and(|&(_, at)| now.saturating_sub(at) >= min_age);
            if old_enough {
                self.seen.swap_remove(i);
            }
            return old_enough;
        }
        if self.seen.len() >= self.cap {
            self.seen.remove(0);
        }
        self.seen.push((what, now));
        false
    }

    /// What `gone` matches is no longer so: its sightings go.
    fn forget(&mut self, gone: impl Fn(&K) -> bool) {
        if !self.seen.is_empty() {
            self.seen.retain(|(k, _)| !gone(k));
        }
    }
}

/// Ticks of `tick_us` an armed request's per-try timeout spans (what the
/// budget keeps its hedges apart by, from arming to settling).
fn delay_ticks(per_try_timeout_ms: u64, tick_us: u64) -> u64 {
    per_try_timeout_ms
        .saturating_mul(1000)
        .div_ceil(tick_us.max(1))
}

fn membership_period_ms(config: &Config, tick_us: u64) -> u64 {
    config
        .admin_refresh_ms()
        .max(tick_us / 1_000)
        .max(MEMBERSHIP_LOOK_MS)
}

/// The window quantiles exported as gauges (`latency_p50_microseconds`...).
const LATENCY_QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// Timed armed requests settled before a verdict on the timer; early hedges
/// must be above `EARLY_TOO_MANY` of them, and all hedges above
/// `OVER_PLAN` times the planned share, for the per-try timeout to be set
/// later (early hedges matter when they spend the budget on requests that
/// were not slow); after `CLEAN_VERDICTS_TO_RELAX` verdicts in a row with
/// hedges under the plan it comes back a millisecond.
const TIMED_FOR_A_VERDICT: u32 = 30;
const EARLY_TOO_MANY: f64 = 0.02;
const OVER_PLAN: f64 = 1.5;
const CLEAN_VERDICTS_TO_RELAX: u32 = 20;

/// How much later than the learned delay the per-try timeout is set, so that
/// Envoy's early timers fire the hedge at the delay (see `Worker::settle`).
#[derive(Debug, Default)]
struct TimerSlack {
    ms: u64,
    timed: u32,
    early: u32,
    hedged: u32,
    clean: u32,
}

impl TimerSlack {
    fn observe(&mut self, hedged: bool, early: bool) {
        self.timed = self.timed.saturating_add(1);
        self.hedged = self.hedged.saturating_add(u32::from(hedged));
        self.early = self.early.saturating_add(u32::from(early));
    }

    /// On the tick: once enough timed requests settled, a verdict; `planned`
    /// is the share of requests the delay plans to hedge.
    fn tick(&mut self, planned: f64) {
        if self.timed < TIMED_FOR_A_VERDICT {
            return;
        }
        let timed = f64::from(self.timed);
        let early = f64::from(self.early) / timed;
        let hedged = f64::from(self.hedged) / timed;
        if early > EARLY_TOO_MANY && hedged > planned * OVER_PLAN {
            self.ms = (self.ms + (self.ms / 4).max(1)).min(MAX_TIMER_SLACK_MS);
            self.clean = 0;
        } else if hedged < planned {
            self.clean += 1;
            if self.clean >= CLEAN_VERDICTS_TO_RELAX {
                self.ms = self.ms.saturating_sub(1);
                self.clean = 0;
            }
        }
        self.timed = 0;
        self.early = 0;
        self.hedged = 0;
    }

    /// The per-try timeout, later by the slack, within `max_delay`.
    fn apply(&self, mut delay: HedgeDelay, policy: &ClusterPolicy) -> HedgeDelay {
        let max_ms = policy.max_delay_ms();
        delay.per_try_timeout_ms = (delay.per_try_timeout_ms + self.ms).min(max_ms.max(1));
        delay
    }
}

/// The delay armed requests showed stale, until the window catches up.
///
/// Why: the window learns a new latency only from requests that ended, so
/// when the whole cluster slows at once (a brownout, a shift up) it learns
/// nothing for as long as the slow requests take, while every request armed
/// at the old delay outlives it and hedges. In virtual time the budget of a
/// full outage went on its first fraction of a second, and into debt, on
/// requests all slow alike; the outage's stragglers, which set the hour's
/// p99, then went unhedged while the debt was repaid. The armed requests
/// tell at once (their primaries fire one after the other:
/// `ArmedRequests::clearly_stale`), so from then on no request is armed
/// (`Skip::StaleDelay`) until one of:
/// - the delay learned on a tick is longer than the stale one, and the
///   latch has seen `REGIME_SAMPLES` responses: the delay is then the new
///   regime's (`NewRegime`). Before, a delay a millisecond longer
///   released it: the recent slices' quantile climbs a millisecond or two
///   a tick, and each step was stale again (set again at it, for the cost
///   of the requests armed within one delay), so at the p94 the latch
///   never saw its 40 responses and the delay climbed 11, 12, 14 ... 16 ms
///   after a shift up x3 toward the new p94 of about 30 ms;
/// - responses since show the latency back (at least `RELEASE_RESPONSES`
///   of them, fewer than three times the planned share above the stale
///   delay): a stall that passed;
/// - `MAX_LATCH_US` have passed, counted in ticks (ten seconds at most a
///   tick early, whatever `sync_interval`: it was fifty ticks, 500 s at a
///   10 s tick).
///
/// A delay at `max_delay` is never latched (nor kept latched): it cannot
/// follow the latency up, and the operator chose to hedge after it; the
/// budget then pays for the first requests that outlive it, as it would
/// without the latch.
#[derive(Debug)]
struct StaleLatch {
    /// The responses since, against the per-try timeout found stale.
    tally: StaleTally,
    /// How long it has held (µs, counted on the ticks).
    held_us: u64,
    /// The responses' latencies: samples of the new regime, which the
    /// delay follows at once (`hedge_delay`'s `regime`). Nothing is armed
    /// while latched, so they are whole but for those of requests armed
    /// before (`armed` of them), cut short at the stale delay.
    since: Sketch,
    armed: u32,
}

const RELEASE_RESPONSES: u32 = 20;
const MAX_LATCH_US: u64 = 10_000_000;

impl StaleLatch {
    fn new(delay: HedgeDelay) -> Self {
        StaleLatch {
            tally: StaleTally::new(delay.per_try_timeout_ms),
            held_us: 0,
            since: Sketch::new(),
            armed: 0,
        }
    }

    /// The samples since, and how they were cut short: the sampled armed
    /// requests among the sampled responses. Counting every armed request
    /// over the sampled responses, above `SAMPLES_PER_TICK` a tick the share
    /// read `stride` times too high (clamped at 1), and the regime's floor
    /// overshot (found by a review).
    fn regime(&self) -> (&Sketch, Censoring) {
        let share = f64::from(self.armed) / f64::from(self.tally.responses.max(1));
        let censoring = Censoring {
            at_us: self.tally.per_try_ms as f64 * 1000.0,
            armed_share: share.clamp(0.0, 1.0),
        };
        (&self.since, censoring)
    }

    fn observe(&mut self, latency_us: u64) {
        self.tally.observe(latency_us);
        self.since.add(latency_us as f64);
    }

    /// Whether its responses are enough to set the delay (`hedge_delay`
    /// reads them from `REGIME_SAMPLES` on).
    fn learned_regime(&self) -> bool {
        self.since.count() >= REGIME_SAMPLES
    }

    /// On the tick (`tick_us` since the last), with the delay just learned:
    /// whether arming may go on (`max_ms`: `max_delay`, which the delay
    /// cannot pass).
    fn released(
        &mut self,
        learned: Option<HedgeDelay>,
        planned: f64,
        max_ms: u64,
        tick_us: u64,
    ) -> bool {
        self.held_us = self.held_us.saturating_add(tick_us);
        let caught_up = learned.is_some_and(|d| {
            (d.per_try_timeout_ms > self.tally.per_try_ms && self.learned_regime())
                || d.per_try_timeout_ms >= max_ms
        });
        caught_up || self.tally.latency_back(planned) || self.held_us >= MAX_LATCH_US
    }
}

/// Responses counted against a per-try timeout found stale: how many, and
/// how many took longer.
#[derive(Debug)]
struct StaleTally {
    per_try_ms: u64,
    responses: u32,
    above: u32,
}

impl StaleTally {
    fn new(per_try_ms: u64) -> Self {
        StaleTally {
            per_try_ms,
            responses: 0,
            above: 0,
        }
    }

    fn observe(&mut self, latency_us: u64) {
        self.responses = self.responses.saturating_add(1);
        if latency_us > self.per_try_ms.saturating_mul(1000) {
            self.above = self.above.saturating_add(1);
        }
    }

    /// Whether the responses show the latency back under the stale delay:
    /// at least `RELEASE_RESPONSES` of them, fewer than three times the
    /// planned share above it.
    fn latency_back(&self, planned: f64) -> bool {
        self.responses >= RELEASE_RESPONSES
            && f64::from(self.above) < 3.0 * planned * f64::from(self.responses)
    }
}

/// The latency a stale latch found, kept as a floor under the delay until
/// the recent slices hold only the new regime.
///
/// Why: once the latch's responses set the delay, the recent slices (the
/// current one and the one before) still hold up to two slices of the old,
/// faster regime. Without the floor the delay fell back to their quantile
/// the next tick, stale again: in virtual time after a shift up x3 at 500
/// req/s the delay climbed 10, 12, 13 ... 16 ms over two seconds toward the
/// new p92 (28 ms), the latch set and released on each step, half of the
/// armed requests hedged, and the budget then refused most requests for
/// two seconds, the stragglers among them.
///
/// It ends when the recent slices have turned over (`until_epoch`), or when
/// responses show the latency back under the delay the latch found stale
/// (the slow spell ended: an outage), as the latch itself would.
#[derive(Debug)]
struct NewRegime {
    since: Sketch,
    censoring: Censoring,
    until_epoch: u64,
    /// The responses since the last judgement, against the stale delay.
    tally: StaleTally,
}

impl NewRegime {
    /// The regime `latch` found, if it learned one (not a stall that passed).
    fn after(latch: StaleLatch, until_epoch: u64, planned: f64) -> Option<Self> {
        if !latch.learned_regime() || latch.tally.latency_back(planned) {
            return None;
        }
        let (_, censoring) = latch.regime();
        Some(NewRegime {
            censoring,
            since: latch.since,
            until_epoch,
            tally: StaleTally::new(latch.tally.per_try_ms),
        })
    }

    fn observe(&mut self, latency_us: u64) {
        self.tally.observe(latency_us);
    }

    /// On the tick (`epoch`: the window's slice now): whether it is over.
    fn over(&mut self, epoch: u64, planned: f64) -> bool {
        // or the clock set back (its end further than the recent slices
        // ahead): the new regime's floor would hold for the step's length
        if epoch >= self.until_epoch || self.until_epoch - epoch > RECENT_SLICES {
            return true;
        }
        if self.tally.responses < RELEASE_RESPONSES {
            return false;
        }
        let back = self.tally.latency_back(planned);
        self.tally = StaleTally::new(self.tally.per_try_ms);
        back
    }
}

/// The most the per-try timeout is set after the delay.
const MAX_TIMER_SLACK_MS: u64 = 50;

/// Where the filter cannot tell which host answered: how far before the
/// per-try timeout an answer to a request hedged early may come. A timer
/// fires early by the time its event loop's pass had run when it was set
/// (a millisecond or two on a busy loop; 4 ms when the box stalls).
const EARLY_TIMER_REACH_US: u64 = 5_000;

/// What `update_shared` met on its way.
struct SharedUpdate<T> {
    /// Stored values that did not decode and were replaced, and the first
    /// one's error.
    resets: u64,
    reset: Option<DecodeError>,
    /// The value was evicted (`DecodeError::Evicted`): nothing was written.
    /// The marker's CAS token (which tells it from a later marker).
    evicted: Option<u32>,
    conflicts: u32,
    /// The value now in shared memory; `None` when every attempt met a
    /// conflict (the work is left to the next tick); the failed host call
    /// and its error.
    result: Result<Option<Stored<T>>, (&'static str, StoreError)>,
}

struct Stored<T> {
    value: T,
    /// Its size in shared memory.
    bytes: usize,
}

/// Reads `key`, applies `update` to its decoded value (`fresh()` if the key
/// is missing or does not decode), and writes it back with compare-and-swap
/// if it changed. On a conflict (another worker wrote in between) it reads
/// and applies again, up to `CAS_ATTEMPTS` times. A missing key (written, like
/// any, only if the update changed something) is written
/// with `CREATE_ONLY`, so two workers creating it at once cannot erase each
/// other's update.
fn update_shared<T: Clone + PartialEq>(
    store: &dyn SharedStore,
    key: &str,
    revive: bool,
    decode: impl Fn(&[u8]) -> Result<T, DecodeError>,
    fresh: impl Fn() -> T,
    mut update: impl FnMut(&mut T),
    encode: impl Fn(&T) -> Vec<u8>,
) -> SharedUpdate<T> {
    let mut outcome = SharedUpdate {
        resets: 0,
        reset: None,
        evicted: None,
        conflicts: 0,
        result: Ok(None),
    };
    for _ in 0..CAS_ATTEMPTS {
        // the evicted marker is replaced even by an unchanged value, and so
        // is a value that did not decode: left, it was counted a reset on
        // every tick of every worker while nothing changed (an idle cluster)
        let mut revived = false;
        let (before, mut bytes, cas) = match store.get(key) {
            Ok(Some((stored, cas))) => match decode(&stored) {
                Ok(value) => (value, stored.len(), cas),
                // given up while idle: only registering it again revives it
                Err(DecodeError::Evicted) if !revive => {
                    outcome.evicted = Some(cas);
                    return outcome;
                }
                Err(DecodeError::Evicted) => {
                    revived = true;
                    (fresh(), 0, cas)
                }
                Err(e) => {
                    outcome.resets += 1;
                    outcome.reset.get_or_insert(e);
                    revived = true;
                    (fresh(), 0, cas)
                }
            },
            Ok(None) => (fresh(), 0, CREATE_ONLY),
            Err(e) => {
                outcome.result = Err(("get", e));
                return outcome;
            }
        };
        let mut value = before.clone();
        update(&mut value);
        // Unchanged means nothing was pending here: samples, requests, sent
        // hedges and tokens each change the value.
        if value != before || revived {
            let encoded = encode(&value);
            bytes = encoded.len();
            match store.set(key, &encoded, cas) {
                Ok(()) => {}
                Err(StoreError::CasMismatch) => {
                    outcome.conflicts += 1;
                    continue;
                }
                Err(e) => {
                    outcome.result = Err(("set", e));
                    return outcome;
                }
            }
        }
        outcome.result = Ok(Some(Stored { value, bytes }));
        return outcome;
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::super::shared_state::memory::MemoryStore;
    use super::*;
    use crate::telemetry::memory::{Lines, Stats};
    use std::time::Duration;

    fn config(json: &str) -> Arc<Config> {
        Arc::new(Config::parse(json.as_bytes()).unwrap())
    }

    const T0: u64 = 1_700_000_000_000;

    /// The default window's geometry (30 s), which the shared keys carry.
    const G30: WindowGeometry = WindowGeometry { slice_ms: 5_000 };

    fn key(cluster: &str) -> String {
        cluster_key(G30, cluster)
    }

    /// The default tick (µs).
    const TICK: u64 = 200_000;

    const GET: Request = Request {
        method: b"GET",
        path: b"/",
        grpc: false,
        upgrade: false,
        client_controls: false,
        client_marker: false,
        client_endpoint: false,
        body_follows: false,
    };

    /// Feeds `n` requests with latency `us` through a worker, as the proxy
    /// glue does (no hedge is ever sent).
    fn traffic(w: &mut Worker, cluster: &str, n: u64, us: u64) -> Vec<Decision> {
        (0..n)
            .map(|_| {
                let plan = w.plan(Some(cluster.as_bytes()), None, &GET);
                w.on_response(plan.cluster.unwrap(), plan.route, us);
                if let Some(s) = plan.settlement() {
                    w.settle(s, Some(1), None, None, None);
                }
                plan.decision
            })
            .collect()
    }

    /// A store, a log and two workers configured by `json`.
    fn two_workers(json: &str) -> (MemoryStore, Lines, Worker, Worker) {
        let cfg = config(json);
        let (a, b) = (Worker::new(cfg.clone()), Worker::new(cfg));
        (MemoryStore::default(), Lines::default(), a, b)
    }

    /// A store, a log and a worker at the defaults whose cluster "c"
    /// answered (the route overrides' tests).
    fn worker_of_c() -> (MemoryStore, Lines, Worker) {
        let mut w = Worker::new(config("{}"));
        w.confirm_cluster(b"c");
        (MemoryStore::default(), Lines::default(), w)
    }

    fn decision(w: &mut Worker, cluster: &[u8], method: &[u8]) -> Decision {
        w.plan(Some(cluster), None, &Request { method, ..GET })
            .decision
    }

    /// A route's `min_samples` raised by xDS: its state is kept, but the
    /// new mark is met whole, not at the half that keeps a delay going.
    #[test]
    fn a_route_s_raised_min_samples_is_met_whole_again() {
        use crate::route_metadata::encode;
        let (store, mut log, mut w) = worker_of_c();
        let low = encode(&serde_json::json!({ "min_samples": 20 }));
        for i in 0..60 {
            let p = w.plan_route(Some(b"c"), Some(b"r"), &low, &GET, None);
            w.on_response(p.cluster.unwrap(), p.route, 5_000 + i * 100);
            if let Some(s) = p.settlement() {
                w.settle(s, Some(1), None, None, None);
            }
        }
        w.sync(T0, &store, &mut log);
        let armed = w.plan_route(Some(b"c"), Some(b"r"), &low, &GET, None);
        assert!(matches!(armed.decision, Decision::Arm(_)), "{armed:?}");
        // 60 samples: past half of 100, short of 100
        let high = encode(&serde_json::json!({ "min_samples": 100 }));
        let p = w.plan_route(Some(b"c"), Some(b"r"), &high, &GET, None);
        assert_eq!(p.decision, Decision::Skip(Skip::WarmingUp));
        w.sync(T0 + 200, &store, &mut log);
        let p = w.plan_route(Some(b"c"), Some(b"r"), &high, &GET, None);
        assert_eq!(p.decision, Decision::Skip(Skip::WarmingUp));
    }

    /// A cluster answering 0.2 requests a second (about 120 in each ten
    /// minutes the long horizon halves its weights in): once armed it
    /// stays armed. With one mark (`min_samples`, 100), each halving took
    /// its count under it and it went unarmed for minutes, over and over.
    #[test]
    fn a_quiet_cluster_once_armed_stays_armed_across_the_halvings() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(
            r#"{"min_samples": 100, "window": "60s", "sync_interval": "10s"}"#,
        ));
        let mut log = Lines::default();
        let mut now_ms = T0;
        let mut armed_from = None;
        let mut unarmed_after = 0;
        // two requests a sync interval of 10 s, for 60 minutes
        for tick in 0..360 {
            w.sync(now_ms, &store, &mut log);
            let hedging = w.cluster(0).is_some_and(|c| c.hedge_delay().is_some());
            match (hedging, armed_from) {
                (true, None) => armed_from = Some(tick),
                (false, Some(_)) => unarmed_after += 1,
                _ => {}
            }
            traffic(&mut w, "c", 2, 5_000 + tick % 7 * 1_000);
            now_ms += 10_000;
        }
        let armed_from = armed_from.expect("never armed");
        assert!(armed_from < 120, "armed only at tick {armed_from}");
        assert_eq!(unarmed_after, 0, "ticks unarmed after it was armed");
    }

    #[test]
    fn latency_gauges_are_the_window_s_quantiles() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 100}"#));
        let mut log = Lines::default();
        w.sync(T0, &store, &mut log);
        // 0.1 ms to 100 ms, evenly: p50 50 ms, p90 90 ms, p99 99 ms
        for i in 1..=1000 {
            let plan = w.plan(Some(b"c"), None, &GET);
            w.on_response(plan.cluster.unwrap(), plan.route, i * 100);
            if let Some(s) = plan.settlement() {
                w.settle(s, Some(1), None, None, None);
            }
        }
        w.sync(T0 + 200, &store, &mut log);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        let get = |name: &str| stats.get(&format!("adaptive_hedge.{name}.c")).unwrap();
        let samples = get("window_samples");
        assert!(samples >= 500, "{samples}");
        for (q, truth) in [("p50", 50_000.0), ("p90", 90_000.0), ("p99", 99_000.0)] {
            let us = get(&format!("latency_{q}_microseconds")) as f64;
            assert!((us / truth - 1.0).abs() < 0.04, "{q}: {us} µs");
        }
    }

    /// One sample of an hour (the wall clock stepped forward while a
    /// request was in flight) among samples of 1 to 10 ms: what the
    /// cluster learned keeps its shape (before, every sample below 168 ms
    /// read 168 ms, in the window and in the long horizon).
    #[test]
    fn an_hour_long_sample_does_not_flatten_what_was_learned() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 100, "max_delay": "1s"}"#));
        let mut log = Lines::default();
        w.sync(T0, &store, &mut log);
        for i in 0..1000 {
            let plan = w.plan(Some(b"c"), None, &GET);
            let latency_us = if i == 500 {
                3_600_000_000
            } else {
                1_000 + i % 100 * 90
            };
            w.on_response(plan.cluster.unwrap(), plan.route, latency_us);
            if let Some(s) = plan.settlement() {
                w.settle(s, Some(1), None, None, None);
            }
        }
        w.sync(T0 + 200, &store, &mut log);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        let p50 = stats
            .get("adaptive_hedge.latency_p50_microseconds.c")
            .unwrap();
        assert!((5_000..6_000).contains(&p50), "p50 {p50} µs");
        let delay = w.cluster(0).unwrap().hedge_delay().unwrap().delay_us;
        assert!(delay < 11_000, "delay {delay} µs");
    }

    #[test]
    fn two_workers_learn_together() {
        let (store, mut log, mut a, mut b) = two_workers(r#"{"min_samples": 100}"#);
        // 60 samples on each worker: neither alone has min_samples
        traffic(&mut a, "c", 60, 2000);
        traffic(&mut b, "c", 60, 2000);
        a.sync(T0, &store, &mut log);
        assert_eq!(
            a.cluster(0).unwrap().hedge_delay(),
            None,
            "60 samples are not enough"
        );
        b.sync(T0 + 10, &store, &mut log);
        a.sync(T0 + 200, &store, &mut log);
        let (da, db) = (
            a.cluster(0).unwrap().hedge_delay(),
            b.cluster(0).unwrap().hedge_delay(),
        );
        assert!(
            da.is_some(),
            "120 samples from both workers warm the cluster up"
        );
        assert_eq!(da, db, "both workers arm the same delay");
        assert_eq!(a.cluster(0).unwrap().window_samples(), 120);
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
        let (bytes, _) = store.get(&key("c")).unwrap().unwrap();
        let shared = SharedCluster::decode(&bytes, WindowGeometry::new(*cfg.window)).unwrap();
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
        assert_eq!(w.cluster(0).unwrap().window_samples(), 50);
        // more conflicts than attempts: kept for the next tick
        traffic(&mut w, "c", 50, 3000);
        *store.conflicts.borrow_mut() = 100;
        w.sync(T0 + 200, &store, &mut log);
        *store.conflicts.borrow_mut() = 0;
        w.sync(T0 + 400, &store, &mut log);
        assert_eq!(w.cluster(0).unwrap().window_samples(), 100);
    }

    /// A store that counts the reads of cluster values.
    #[derive(Default)]
    struct CountingStore {
        inner: MemoryStore,
        reads: std::cell::RefCell<HashMap<String, u32>>,
    }
    impl SharedStore for CountingStore {
        fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
            *self.reads.borrow_mut().entry(key.to_string()).or_default() += 1;
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            self.inner.set(key, value, cas)
        }
    }
    impl CountingStore {
        /// Reads of the values of `clusters` since the last call.
        fn take_reads(&self, clusters: &[String]) -> Vec<u32> {
            let mut reads = self.reads.borrow_mut();
            clusters
                .iter()
                .map(|c| reads.remove(&key(c)).unwrap_or(0))
                .collect()
        }
    }

    /// A tick reads the clusters with news here, and the quiet ones (no
    /// request here for a slice, nothing to merge) each once every
    /// `QUIET_READ_US`, round robin; gauges come only from values read in
    /// the tick. Before, every tick of every worker read, decoded and set
    /// the gauges of every cluster it had taken up: a thousand after a
    /// configuration push adopted the registry's.
    #[test]
    fn quiet_clusters_are_read_in_turn_not_on_every_tick() {
        let store = CountingStore::default();
        let cfg = config(r#"{"min_samples": 10}"#);
        let (mut w, mut other) = (Worker::new(cfg.clone()), Worker::new(cfg));
        let mut log = Lines::default();
        let names: Vec<String> = (0..200).map(|i| format!("c{i}")).collect();
        for name in &names {
            traffic(&mut w, name, 20, 2_000);
        }
        let tick = TICK / 1000;
        let mut now = T0;
        // a slice without requests (25 ticks) and one tick: all quiet
        for _ in 0..27 {
            w.sync(now, &store, &mut log);
            now += tick;
        }
        store.take_reads(&names);
        // ten seconds of ticks: each quiet value read once, about four a tick
        let mut per_tick = Vec::new();
        for _ in 0..50 {
            w.sync(now, &store, &mut log);
            now += tick;
            per_tick.push(store.take_reads(&names));
        }
        let total: Vec<u32> = (0..names.len())
            .map(|i| per_tick.iter().map(|r| r[i]).sum())
            .collect();
        assert!(
            total.iter().all(|&n| n == 1),
            "reads per cluster in 10 s: {total:?}"
        );
        let most = per_tick.iter().map(|r| r.iter().sum::<u32>()).max();
        assert_eq!(most, Some(4), "at most four quiet values read a tick");
        // gauges of the values read only
        let mut stats = Stats::default();
        w.sync(now, &store, &mut log);
        let read: Vec<u32> = store.take_reads(&names);
        w.flush_metrics(&mut stats);
        let delays: Vec<Option<u64>> = names
            .iter()
            .map(|n| stats.get(&format!("adaptive_hedge.hedge_delay_microseconds.{n}")))
            .collect();
        for (i, (r, d)) in read.iter().zip(&delays).enumerate() {
            assert_eq!(
                *r > 0,
                d.unwrap_or(0) > 0,
                "cluster {i}: read {r}, gauge {d:?}"
            );
        }
        // a request makes its cluster read on the next tick, and every
        // tick while it has requests
        now += tick;
        for _ in 0..3 {
            traffic(&mut w, "c7", 1, 2_000);
            w.sync(now, &store, &mut log);
            now += tick;
            assert!(store.take_reads(&names)[7] >= 1, "c7 read on a busy tick");
        }
        // what another worker learns reaches a quiet one within 10 s
        let before = w.cluster(w.index[b"c3".as_slice()]).unwrap().hedge_delay();
        traffic(&mut other, "c3", 200, 40_000);
        other.sync(now, &store, &mut log);
        for _ in 0..51 {
            w.sync(now, &store, &mut log);
            now += tick;
        }
        let after = w.cluster(w.index[b"c3".as_slice()]).unwrap().hedge_delay();
        assert!(
            after.unwrap().delay_us > before.unwrap().delay_us,
            "{before:?} -> {after:?}"
        );
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
        let (store, mut log, mut a, mut b) = two_workers(r#"{"min_samples": 50}"#);
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
        let store = first_ticks_interleaved(&key("c"), "c");
        let (bytes, _) = store.get(&key("c")).unwrap().unwrap();
        let geometry = WindowGeometry::new(Duration::from_secs(30));
        let shared = SharedCluster::decode(&bytes, geometry).unwrap();
        assert_eq!(shared.requests_total, 60);
        assert_eq!(shared.window.snapshot(T0).count(), 60);
    }

    #[test]
    fn workers_creating_the_registry_at_once_lose_no_cluster() {
        let store = first_ticks_interleaved(&registry_key(G30), "d");
        let mut names = registry(&store);
        names.sort();
        assert_eq!(names, ["c", "d"]);
    }

    /// A latch on a stale 10 ms delay: released when the learned delay is
    /// longer once 40 responses came, or when 20 responses since came
    /// mostly in time, or after 50 ticks; not while the responses are slow
    /// and the delay has not moved.
    #[test]
    fn a_stale_latch_holds_until_the_delay_catches_up_or_latency_comes_back() {
        let at = |ms| HedgeDelay {
            delay_us: ms * 1000,
            per_try_timeout_ms: ms,
        };
        let planned = 0.08;
        let mut latch = StaleLatch::new(at(10));
        for _ in 1..REGIME_SAMPLES {
            latch.observe(40_000);
        }
        assert!(
            !latch.released(Some(at(11)), planned, 1000, TICK),
            "longer, but too few responses to tell how much"
        );
        for _ in 0..100 {
            latch.observe(40_000);
        }
        assert!(
            !latch.released(Some(at(10)), planned, 1000, TICK),
            "slow, delay not moved"
        );
        assert!(
            latch.released(Some(at(11)), planned, 1000, TICK),
            "the window learns"
        );

        let mut latch = StaleLatch::new(at(10));
        for i in 0..19 {
            latch.observe(if i < 2 { 40_000 } else { 3_000 });
        }
        assert!(
            !latch.released(Some(at(10)), planned, 1000, TICK),
            "19 responses"
        );
        latch.observe(3_000);
        assert!(
            latch.released(Some(at(10)), planned, 1000, TICK),
            "2 of 20 above: back"
        );

        let mut latch = StaleLatch::new(at(10));
        for _ in 1..50 {
            assert!(!latch.released(None, planned, 1000, TICK));
        }
        assert!(latch.released(None, planned, 1000, TICK), "at most 10 s");
        // ten seconds at any tick: one tick of 10 s, a thousand of 10 ms
        let mut latch = StaleLatch::new(at(10));
        assert!(latch.released(None, planned, 1000, 10_000_000), "10 s tick");
        let mut latch = StaleLatch::new(at(10));
        for _ in 1..1000 {
            assert!(!latch.released(None, planned, 1000, 10_000));
        }
        assert!(latch.released(None, planned, 1000, 10_000), "10 ms ticks");

        let mut latch = StaleLatch::new(at(10));
        assert!(
            latch.released(Some(at(10)), planned, 10, TICK),
            "at max_delay"
        );
    }

    /// A latch's share of armed requests counts the sampled ones only:
    /// its responses are the sampled ones (`StaleLatch::regime`).
    #[test]
    fn a_latch_counts_only_the_sampled_armed_requests() {
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        traffic(&mut w, "c", 20, 3000);
        w.clusters[0].stale = Some(StaleLatch::new(HedgeDelay {
            delay_us: 10_000,
            per_try_timeout_ms: 10,
        }));
        for sampled in [true, false, false, false] {
            let settlement = Settlement {
                cluster: 0,
                hedges: 1,
                cohort: 0,
                per_try_timeout_ms: 10,
                shadow: false,
                deadline_ns: None,
                sampled,
            };
            w.settle(settlement, Some(1), None, None, None);
        }
        assert_eq!(w.clusters[0].stale.as_ref().map(|l| l.armed), Some(1));
    }

    /// What a latch learned floors the delay until the recent slices turn
    /// over, or until responses show the latency back under the stale
    /// delay; a latch that learned too little, or saw a stall pass, leaves
    /// no floor.
    #[test]
    fn a_new_regime_lasts_until_the_recent_slices_turn_over_or_latency_comes_back() {
        let at = |ms| HedgeDelay {
            delay_us: ms * 1000,
            per_try_timeout_ms: ms,
        };
        let planned = 0.08;
        let latch = |slow: u64, fast: u64| {
            let mut latch = StaleLatch::new(at(10));
            for i in 0..slow + fast {
                latch.observe(if i < slow { 30_000 } else { 3_000 });
            }
            latch
        };
        assert!(NewRegime::after(latch(REGIME_SAMPLES - 1, 0), 7, planned).is_none());
        assert!(
            NewRegime::after(latch(4, REGIME_SAMPLES), 7, planned).is_none(),
            "a stall that passed"
        );
        let mut slow = latch(REGIME_SAMPLES, 0);
        slow.armed = 10;
        let mut regime = NewRegime::after(slow, 7, planned).unwrap();
        assert_eq!(regime.since.count(), REGIME_SAMPLES);
        // a quarter of the responses were armed before the latch: cut short
        assert_eq!(regime.censoring.armed_share, 0.25);
        assert_eq!(regime.censoring.at_us, 10_000.0);
        assert!(!regime.over(5, planned), "no responses yet");
        for _ in 0..RELEASE_RESPONSES {
            regime.observe(30_000);
        }
        assert!(!regime.over(6, planned), "still slow");
        assert!(regime.over(7, planned), "the recent slices turned over");

        let mut regime = NewRegime::after(latch(REGIME_SAMPLES, 0), 7, planned).unwrap();
        for i in 0..RELEASE_RESPONSES - 1 {
            regime.observe(if i < 4 { 30_000 } else { 3_000 });
        }
        assert!(!regime.over(5, planned), "19 responses");
        regime.observe(3_000);
        assert!(regime.over(5, planned), "4 of 20 above: back");

        // the clock set back: an end further off than the recent slices
        let mut regime = NewRegime::after(latch(REGIME_SAMPLES, 0), 7, planned).unwrap();
        assert!(regime.over(7 - RECENT_SLICES - 1, planned));
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
        let before = w.cluster(0).unwrap().hedge_delay().unwrap().delay_us as f64;
        assert!(
            (before / 9460.0 - 1.0).abs() < 0.03,
            "p94 before the shift: {before}"
        );
        run(&mut w, &mut now, 30_000, 3);
        let after = w.cluster(0).unwrap().hedge_delay().unwrap().delay_us as f64;
        // nothing was hedged, so the reserve is full: the recent guard is
        // the p84 (6% planned + 10% the reserve pays) of 3..30 ms, above the
        // long horizon's p94 (the new latency's p80)
        assert!(
            (after / 25_680.0 - 1.0).abs() < 0.03,
            "the recent p84 one window after the shift: {after}"
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
            store.set(&key("c"), garbage, 0).unwrap();
            traffic(&mut w, "c", 20, 3000);
            w.sync(T0 + 200, &store, &mut log);
            assert_eq!(
                w.cluster(0).unwrap().window_samples(),
                20,
                "recovered with the new samples"
            );
        }
        assert_eq!(log.0.len(), 1, "{:?}", log.0);
        assert!(log.0[0].contains("reset"));
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(
            stats.get("adaptive_hedge.shared_state_resets_total"),
            Some(3)
        );
    }

    /// Garbage met by an update with nothing to write is replaced all the
    /// same: a reset counted once, not on every tick of every worker after.
    #[test]
    fn a_value_that_does_not_decode_is_replaced_even_by_no_change() {
        let store = MemoryStore::default();
        store.set("k", b"garbage", 0).unwrap();
        let run = || {
            update_shared(
                &store,
                "k",
                false,
                |b| (b == b"ok").then_some(1u8).ok_or(DecodeError::Truncated),
                || 1u8,
                |_| {},
                |_| b"ok".to_vec(),
            )
        };
        assert_eq!(run().resets, 1);
        assert_eq!(store.get("k").unwrap().map(|v| v.0), Some(b"ok".to_vec()));
        assert_eq!(run().resets, 0);
    }

    #[test]
    fn clusters_past_the_limit_pass_through_and_are_counted() {
        let (store, mut log, mut a, mut b) =
            two_workers(r#"{"max_clusters": 2, "min_samples": 1}"#);
        traffic(&mut a, "one", 5, 1000);
        traffic(&mut b, "two", 5, 1000);
        a.sync(T0, &store, &mut log);
        b.sync(T0, &store, &mut log);
        // the registry (shared) is full, though worker a has room locally
        traffic(&mut a, "three", 5, 1000);
        a.sync(T0 + 200, &store, &mut log);
        assert_eq!(
            decision(&mut a, b"three", b"GET"),
            Decision::Skip(Skip::Untracked)
        );
        // the local map is bounded too (twice the limit)
        traffic(&mut a, "four", 1, 1000);
        traffic(&mut a, "five", 1, 1000);
        assert_eq!(
            decision(&mut a, b"six", b"GET"),
            Decision::Skip(Skip::Untracked)
        );
        assert_eq!(log.0.len(), 1);
        let mut stats = Stats::default();
        a.flush_metrics(&mut stats);
        assert_eq!(
            stats.get("adaptive_hedge.untracked_requests_total"),
            Some(2)
        );
        assert!(!stats.names.iter().any(|n| n.ends_with(".three")));
    }

    /// A full registry gives the slot of a cluster idle for a whole window
    /// to a cluster waiting for one; the idle cluster's key keeps only a
    /// marker, and its next request registers it again (taking the slot of
    /// another idle cluster), reviving its value.
    #[test]
    fn idle_clusters_give_their_registry_slot_up() {
        let store = MemoryStore::default();
        let cfg = config(r#"{"max_clusters": 2, "min_samples": 1}"#);
        let mut a = Worker::new(cfg);
        let mut log = Lines::default();
        traffic(&mut a, "one", 5, 1000);
        traffic(&mut a, "two", 5, 1000);
        a.sync(T0, &store, &mut log);
        traffic(&mut a, "three", 5, 1000);
        a.sync(T0 + 200, &store, &mut log);
        assert_eq!(
            decision(&mut a, b"three", b"GET"),
            Decision::Skip(Skip::Untracked),
            "one and two are busy"
        );
        // a window later, one and two idle; three still asked for: found
        // idle once, then again a slice (5 s) later, one goes
        decision(&mut a, b"three", b"GET");
        a.sync(T0 + 31_000, &store, &mut log);
        assert!(!registry(&store).contains(&"three".to_string()));
        let later = T0 + 36_000;
        decision(&mut a, b"three", b"GET");
        a.sync(later, &store, &mut log);
        assert!(registry(&store).contains(&"three".to_string()));
        assert_eq!(registry(&store).len(), 2);
        let gone = if registry(&store).contains(&"one".to_string()) {
            "two"
        } else {
            "one"
        };
        let (marker, _) = store.get(&cluster_key(G30, gone)).unwrap().unwrap();
        assert_eq!(marker, SharedCluster::evicted());
        traffic(&mut a, "three", 5, 1000);
        a.sync(later + 200, &store, &mut log);
        assert!(matches!(
            decision(&mut a, b"three", b"GET"),
            Decision::Arm(_)
        ));
        // the evicted cluster learns it on its next tick, then asks again
        a.sync(later + 400, &store, &mut log);
        assert_eq!(
            decision(&mut a, gone.as_bytes(), b"GET"),
            Decision::Skip(Skip::Untracked)
        );
        a.sync(later + 600, &store, &mut log);
        assert_eq!(
            decision(&mut a, gone.as_bytes(), b"GET"),
            Decision::Skip(Skip::WarmingUp),
            "what it learned went with its slot"
        );
        traffic(&mut a, gone, 5, 1000);
        a.sync(later + 800, &store, &mut log);
        assert!(registry(&store).contains(&gone.to_string()));
        let (value, _) = store.get(&cluster_key(G30, gone)).unwrap().unwrap();
        assert!(SharedCluster::decode(&value, G30).is_ok(), "revived");
        // three is busy: the other idle one went instead
        let other = if gone == "one" { "two" } else { "one" };
        assert!(registry(&store).contains(&"three".to_string()));
        let (marker, _) = store.get(&cluster_key(G30, other)).unwrap().unwrap();
        assert_eq!(marker, SharedCluster::evicted());
        let mut stats = Stats::default();
        a.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.clusters_evicted_total"), Some(2));
    }

    /// The names in the registry of the 30 s window.
    fn registry(store: &MemoryStore) -> Vec<String> {
        let (bytes, _) = store.get(&registry_key(G30)).unwrap().unwrap();
        Registry::decode(&bytes).unwrap().names
    }

    /// A cluster another worker has just registered is empty until that
    /// worker's next tick brings its samples: it keeps its slot, since
    /// idle means found empty a slice apart. Before, a cluster at less than
    /// a response a tick was evicted as soon as it was registered, and the
    /// one that took its slot next, in turn.
    #[test]
    fn a_cluster_just_registered_keeps_its_slot_for_a_slice() {
        let (store, mut log, mut a, mut b) =
            two_workers(r#"{"max_clusters": 1, "min_samples": 1}"#);
        decision(&mut a, b"p", b"GET");
        a.sync(T0, &store, &mut log);
        assert_eq!(registry(&store), ["p"]);
        decision(&mut b, b"q", b"GET");
        b.sync(T0 + 100, &store, &mut log);
        assert_eq!(registry(&store), ["p"], "p was registered 100 ms ago");
        traffic(&mut a, "p", 5, 1000);
        a.sync(T0 + 200, &store, &mut log);
        decision(&mut b, b"q", b"GET");
        b.sync(T0 + 5_200, &store, &mut log);
        assert_eq!(registry(&store), ["p"], "p is busy");
        // idle a whole window, then found so twice a slice apart: q's turn
        for at in [T0 + 36_000, T0 + 41_000] {
            decision(&mut b, b"q", b"GET");
            b.sync(at, &store, &mut log);
        }
        assert_eq!(registry(&store), ["q"]);
    }

    /// The wall clock set back an hour after a first look found x idle:
    /// that sighting is from the future, and it used to be kept (its age
    /// saturated to 0, never a slice) and matched every later look, so x
    /// kept its slot for the hour and y, asking every second, went
    /// unhedged. Now the step back restarts the look: y's slot comes a
    /// slice after it, as without the step.
    #[test]
    fn an_idle_sighting_from_before_a_clock_step_back_does_not_keep_a_slot() {
        for back in [0, 3_600_000] {
            let (store, mut log, mut a, mut b) =
                two_workers(r#"{"max_clusters": 1, "min_samples": 1}"#);
            traffic(&mut a, "x", 5, 1000);
            a.sync(T0, &store, &mut log);
            b.confirm_cluster(b"y");
            b.sync(T0 + 40_000, &store, &mut log); // x idle: a first look
            assert_eq!(registry(&store), ["x"]);
            let start = T0 + 40_000 - back;
            let slot = (1..=600u64).find(|s| {
                decision(&mut b, b"y", b"GET");
                b.sync(start + s * 1_000, &store, &mut log);
                registry(&store) == ["y"]
            });
            let expected = if back == 0 { 5 } else { 6 };
            assert_eq!(slot, Some(expected), "set back {back} ms");
        }
    }

    /// An evicted cluster's gauges go to 0, once: before, a gone cluster
    /// kept its last delay and `hedge_delay_clamped` for the VM's life, an
    /// alert firing on it.
    /// Out of shadow mode the shadow p99 is 0.
    #[test]
    fn an_evicted_cluster_s_gauges_go_to_zero() {
        let store = MemoryStore::default();
        let cfg = config(r#"{"max_clusters": 2, "min_samples": 1, "min_delay": "50ms"}"#);
        let mut a = Worker::new(cfg);
        let mut log = Lines::default();
        traffic(&mut a, "one", 5, 1000);
        traffic(&mut a, "two", 5, 1000);
        a.sync(T0, &store, &mut log);
        traffic(&mut a, "one", 5, 1000);
        traffic(&mut a, "two", 5, 1000);
        a.sync(T0 + 200, &store, &mut log);
        let mut stats = Stats::default();
        a.flush_metrics(&mut stats);
        for name in ["one", "two"] {
            let gauge = |m: &str| stats.get(&format!("adaptive_hedge.{m}.{name}"));
            assert_eq!(gauge("hedge_delay_microseconds"), Some(50_000));
            assert_eq!(gauge("hedge_delay_clamped"), Some(1));
            assert_eq!(gauge("shadow_p99_microseconds"), Some(0));
        }
        // a window later three asks for a slot: an idle one goes, once
        // found idle a slice apart
        for at in [T0 + 31_000, T0 + 36_000] {
            decision(&mut a, b"three", b"GET");
            a.sync(at, &store, &mut log);
        }
        let gone = ["one", "two"]
            .into_iter()
            .find(|name| {
                let (value, _) = store.get(&cluster_key(G30, name)).unwrap().unwrap();
                value == SharedCluster::evicted()
            })
            .unwrap();
        a.sync(T0 + 36_200, &store, &mut log);
        a.flush_metrics(&mut stats);
        let gauge = |stats: &Stats, m: &str| stats.get(&format!("adaptive_hedge.{m}.{gone}"));
        assert_eq!(gauge(&stats, "hedge_delay_microseconds"), Some(0));
        assert_eq!(gauge(&stats, "hedge_delay_clamped"), Some(0));
        assert_eq!(gauge(&stats, "window_samples"), Some(0));
        // once: what sets the gauge later is not the filter
        let clamped = format!("adaptive_hedge.hedge_delay_clamped.{gone}");
        let id = stats.names.iter().position(|n| *n == clamped).unwrap();
        stats.values.insert(id as u32, 7);
        a.flush_metrics(&mut stats);
        assert_eq!(gauge(&stats, "hedge_delay_clamped"), Some(7));
    }

    /// An eviction seen half-way by another worker: the name is still in
    /// the registry beside a marker. That worker does not revive it (only
    /// the one that puts the name back may), and a marker left in the
    /// registry (the evicting worker's registry update failed) is taken
    /// out by the next eviction as it is, once seen at an earlier tick.
    #[test]
    fn a_marker_beside_a_registered_name_is_not_revived_and_is_cleared_later() {
        let (store, mut log, mut a, mut b) =
            two_workers(r#"{"max_clusters": 1, "min_samples": 1}"#);
        traffic(&mut a, "x", 5, 1000);
        a.sync(T0, &store, &mut log);
        // the evicting worker wrote the marker, its registry update is lost
        store
            .set(&cluster_key(G30, "x"), &SharedCluster::evicted(), 0)
            .unwrap();
        traffic(&mut b, "x", 5, 1000);
        b.sync(T0 + 200, &store, &mut log);
        let (value, _) = store.get(&cluster_key(G30, "x")).unwrap().unwrap();
        assert_eq!(value, SharedCluster::evicted(), "b did not revive x");
        assert_eq!(
            decision(&mut b, b"x", b"GET"),
            Decision::Skip(Skip::Untracked)
        );
        // a new cluster waits: the stuck marker's slot is given up, once
        // a has seen the marker at two ticks (at one it may be an eviction
        // between its two writes)
        traffic(&mut a, "y", 5, 1000);
        a.sync(T0 + 400, &store, &mut log);
        assert_eq!(registry(&store), ["x"]);
        decision(&mut a, b"y", b"GET");
        a.sync(T0 + 600, &store, &mut log);
        assert_eq!(registry(&store), ["y"]);
        // and x, asked for again, finds the registry full of a busy y
        b.sync(T0 + 800, &store, &mut log);
        assert_eq!(
            decision(&mut b, b"x", b"GET"),
            Decision::Skip(Skip::Untracked)
        );
    }

    /// A marker is known by its CAS token: seen again at a later tick,
    /// however much later, it is stranded; another marker of the name (an
    /// eviction since undone, then another) is not, at first sight, nor is
    /// one whose value has decoded since.
    #[test]
    fn a_marker_is_stranded_only_when_the_same_one_is_seen_again() {
        let store = MemoryStore::default();
        let mut log = Lines::default();
        let mut w = Worker::new(config(r#"{"min_samples": 1}"#));
        assert!(!w.stranded("x", 7), "first sight");
        assert!(!w.stranded("x", 7), "seen again within the tick");
        w.ticks += 1_000;
        assert!(!w.stranded("x", 9), "another marker: first sight");
        assert!(w.stranded("x", 7), "the same marker, ticks later");
        w.ticks += 1;
        assert!(w.stranded("x", 9), "and the other one at a later tick");
        // a sighting, then the cluster's value decodes on a sync
        traffic(&mut w, "y", 5, 1000);
        w.sync(T0, &store, &mut log);
        assert!(!w.stranded("y", 3));
        traffic(&mut w, "y", 5, 1000);
        w.sync(T0 + 200, &store, &mut log);
        w.ticks += 1;
        assert!(!w.stranded("y", 3), "its value decoded: first sight again");
    }

    /// The same stranded marker with room in the registry and no eviction
    /// to come: before, every worker with traffic for x was registered,
    /// found the marker and was evicted again, tick after tick, for good.
    /// Now the second sighting takes x out of the registry, and the next
    /// tick puts it back and revives its value.
    #[test]
    fn a_stranded_marker_heals_without_an_eviction() {
        let w = heal_stranded_marker(1, 4);
        let d = decision(&mut { w }, b"x", b"GET");
        // tracked and learned (its budget, young, may not pay yet)
        assert!(
            matches!(d, Decision::Arm(_) | Decision::Skip(Skip::BudgetExhausted)),
            "{d:?}"
        );
    }

    /// The same for a cluster this worker syncs once in ten ticks (a
    /// request every two seconds): known by tick age (five ticks), its
    /// marker was never seen twice, and it stayed unhedged for good.
    #[test]
    fn a_quiet_cluster_s_stranded_marker_heals_too() {
        heal_stranded_marker(10, 40);
    }

    /// Cluster x, registered, its value a stranded marker; a request and its
    /// response every `every` ticks: revived within `ticks`.
    fn heal_stranded_marker(every: u64, ticks: u64) -> Worker {
        let store = MemoryStore::default();
        let cfg = config(r#"{"max_clusters": 4, "min_samples": 1}"#);
        let mut w = Worker::new(cfg);
        let mut log = Lines::default();
        traffic(&mut w, "x", 5, 1000);
        w.sync(T0, &store, &mut log);
        store
            .set(&cluster_key(G30, "x"), &SharedCluster::evicted(), 0)
            .unwrap();
        let revived = |store: &MemoryStore| {
            let (value, _) = store.get(&cluster_key(G30, "x")).unwrap().unwrap();
            SharedCluster::decode(&value, G30).is_ok()
        };
        let mut t = T0;
        for tick in 1..=ticks {
            t += 200;
            if tick % every == 0 {
                let plan = w.plan(Some(b"x"), None, &GET);
                if let Some(id) = plan.cluster {
                    w.on_response(id, plan.route, 1000);
                }
            }
            w.sync(t, &store, &mut log);
        }
        assert!(revived(&store), "not revived in {ticks} ticks");
        w
    }

    /// A name this worker still has to take out of the registry (its
    /// update failed when it evicted) that another worker took out since
    /// is no second eviction in `clusters_evicted_total`.
    #[test]
    fn an_eviction_is_counted_once() {
        let store = MemoryStore::default();
        let cfg = config(r#"{"max_clusters": 4, "min_samples": 1}"#);
        let mut w = Worker::new(cfg);
        let mut log = Lines::default();
        traffic(&mut w, "x", 5, 1000);
        traffic(&mut w, "y", 5, 1000);
        w.sync(T0, &store, &mut log);
        store
            .set(&cluster_key(G30, "x"), &SharedCluster::evicted(), 0)
            .unwrap();
        // another worker took x out of the registry already
        let key = registry_key(G30);
        let (bytes, cas) = store.get(&key).unwrap().unwrap();
        let mut registry = Registry::decode(&bytes).unwrap();
        registry.names.retain(|n| n != "x");
        store.set(&key, &registry.encode(), cas).unwrap();
        w.unregister.push("x".into());
        w.sync(T0 + 200, &store, &mut log);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.clusters_evicted_total"), Some(0));
    }

    /// Worker a's first names were refused by the registry (b registered
    /// its clusters first); a can still track the registered ones.
    #[test]
    fn a_worker_full_of_refused_names_still_tracks_registered_clusters() {
        let (store, mut log, mut a, mut b) =
            two_workers(r#"{"max_clusters": 2, "min_samples": 1}"#);
        traffic(&mut b, "b1", 5, 1000);
        traffic(&mut b, "b2", 5, 1000);
        b.sync(T0, &store, &mut log);
        traffic(&mut a, "a1", 5, 1000);
        traffic(&mut a, "a2", 5, 1000);
        a.sync(T0, &store, &mut log);
        traffic(&mut a, "b1", 20, 1000); // earns the tokens of a hedge
        a.sync(T0 + 200, &store, &mut log);
        let d = decision(&mut a, b"b1", b"GET");
        assert!(matches!(d, Decision::Arm(_)), "{d:?}");
        assert_eq!(
            decision(&mut a, b"a1", b"GET"),
            Decision::Skip(Skip::Untracked)
        );
    }

    /// A named route whose overrides change takes no further entry: with
    /// the table of route variants full it is still hedged by its own.
    #[test]
    fn a_route_s_changed_overrides_replace_its_entry() {
        use crate::route_metadata::encode;
        let mut w = Worker::new(config("{}"));
        w.confirm_cluster(b"c");
        let mut plan = |route: &str, hedges: u64| {
            let metadata = encode(&serde_json::json!({ "max_hedges": hedges }));
            w.plan_route(Some(b"c"), Some(route.as_bytes()), &metadata, &GET, None)
                .decision
        };
        for i in 0..MAX_ROUTE_VARIANTS {
            assert_ne!(plan(&format!("r{i}"), 2), Decision::Skip(Skip::Untracked));
        }
        assert_eq!(plan("one more", 2), Decision::Skip(Skip::Untracked));
        for hedges in [3, 2, 3] {
            assert_ne!(plan("r0", hedges), Decision::Skip(Skip::Untracked));
        }
    }

    /// An unnamed route whose overrides xDS changes leaves an entry per
    /// metadata; a full table gives the one used longest ago (not this
    /// tick) to a new route.
    #[test]
    fn a_full_variant_table_gives_the_stalest_entry_up() {
        use crate::route_metadata::encode;
        let (store, mut log, mut w) = worker_of_c();
        let plan = |w: &mut Worker, hedges: usize| {
            let metadata =
                encode(&serde_json::json!({ "percentile": 0.5 + hedges as f64 / 1000.0 }));
            w.plan_route(Some(b"c"), None, &metadata, &GET, None)
                .decision
        };
        for i in 0..MAX_ROUTE_VARIANTS {
            assert_ne!(plan(&mut w, i), Decision::Skip(Skip::Untracked));
        }
        assert_eq!(
            plan(&mut w, 100),
            Decision::Skip(Skip::Untracked),
            "all used this tick"
        );
        w.sync(T0, &store, &mut log);
        assert_ne!(plan(&mut w, 100), Decision::Skip(Skip::Untracked));
    }

    /// Overrides refused are said once, not each time the table gives
    /// their entry up and makes it again (more routes with overrides in
    /// use than it holds); their requests stay unarmed and counted.
    #[test]
    fn refused_overrides_made_again_are_said_once() {
        use crate::route_metadata::encode;
        let (store, mut log, mut w) = worker_of_c();
        let bad = encode(&serde_json::json!({ "percentile": 7 }));
        let good = |i: usize| encode(&serde_json::json!({ "percentile": 0.5 + i as f64 / 1000.0 }));
        let mut now = T0;
        for round in 0..3 {
            let d = w
                .plan_route(Some(b"c"), Some(b"bad"), &bad, &GET, None)
                .decision;
            assert_eq!(d, Decision::Skip(Skip::RouteMetadata), "round {round}");
            now += 200;
            w.sync(now, &store, &mut log);
            // enough other routes to push its entry out
            for i in 0..MAX_ROUTE_VARIANTS {
                w.plan_route(
                    Some(b"c"),
                    Some(format!("r{i}").as_bytes()),
                    &good(i),
                    &GET,
                    None,
                );
            }
            now += 200;
            w.sync(now, &store, &mut log);
        }
        let said = log.0.iter().filter(|l| l.contains("route \"bad\"")).count();
        assert_eq!(said, 1, "{:?}", log.0);
    }

    /// A route's own state is named `<cluster>.route.<route>`; an Envoy
    /// cluster of that name must not share it (its budget would pay for the
    /// route's hedges, and the route's policy would hedge it), whichever is
    /// seen first: the later one is not hedged, and said.
    #[test]
    fn a_cluster_named_as_a_route_s_state_shares_nothing_with_it() {
        use crate::route_metadata::encode;
        let metadata = encode(&serde_json::json!({ "budget_percent": 50 }));
        // the route first: the cluster of its state's name is not hedged
        let mut w = Worker::new(config("{}"));
        w.confirm_cluster(b"svc");
        let route = w.plan_route(Some(b"svc"), Some(b"r"), &metadata, &GET, None);
        assert!(route.cluster.is_some());
        w.confirm_cluster(b"svc.route.r");
        let other = w.plan_route(Some(b"svc.route.r"), None, &[], &GET, None);
        assert_eq!(other.decision, Decision::Skip(Skip::Untracked));
        assert_ne!(other.cluster, route.cluster);
        assert!(w.pending_log.iter().any(|(_, l)| l.contains(
            "cluster \"svc.route.r\" has the name of the state of a route of cluster \"svc\""
        )));
        // the cluster first: the route's overrides are refused
        let mut w = Worker::new(config("{}"));
        w.confirm_cluster(b"svc.route.r");
        w.confirm_cluster(b"svc");
        let cluster = w.plan_route(Some(b"svc.route.r"), None, &[], &GET, None);
        let route = w.plan_route(Some(b"svc"), Some(b"r"), &metadata, &GET, None);
        assert_eq!(route.decision, Decision::Skip(Skip::RouteMetadata));
        assert_ne!(route.cluster, cluster.cluster);
        let state = w.cluster(cluster.cluster.unwrap()).unwrap();
        assert_eq!(
            state.policy.budget_percent,
            ClusterPolicy::default().budget_percent
        );
    }

    /// A route cannot switch host choice on where the configuration
    /// chooses hosts for no cluster (the glue then writes no host header
    /// and reads no response's host): said, and the route's policy says
    /// what is done.
    #[test]
    fn a_route_s_host_choice_without_the_plugin_s_is_said_to_do_nothing() {
        use crate::route_metadata::encode;
        let store = MemoryStore::default();
        let mut log = Lines::default();
        let mut w = Worker::new(config(r#"{"host_choice": false}"#));
        w.confirm_cluster(b"c");
        let metadata = encode(&serde_json::json!({ "host_choice": true }));
        let plan = w.plan_route(Some(b"c"), Some(b"r"), &metadata, &GET, None);
        let id = plan.cluster.unwrap();
        assert!(!w.cluster(id).unwrap().policy.host_choice);
        w.sync(T0, &store, &mut log);
        assert!(
            log.0
                .iter()
                .any(|l| l.contains("route \"r\" of cluster \"c\": filter_metadata.adaptive_hedge.host_choice: true ignored")),
            "{:?}",
            log.0
        );
    }

    /// A worker keeps its names for the VM's life: past twice
    /// `max_clusters` new ones pass unhedged, and the log says so once.
    #[test]
    fn a_full_table_of_names_is_logged_once() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"max_clusters": 1}"#));
        let mut log = Lines::default();
        for name in ["c1", "c2"] {
            w.confirm_cluster(name.as_bytes());
        }
        // as the proxy plans a request to a cluster it has not seen answer
        for name in [&b"c3"[..], b"c4", b"c3"] {
            let plan = w.plan_route(Some(name), None, &[], &GET, None);
            assert_eq!(plan.decision, Decision::Skip(Skip::Untracked));
        }
        w.confirm_cluster(b"c5");
        w.sync(T0, &store, &mut log);
        let full: Vec<_> = log
            .0
            .iter()
            .filter(|l| l.contains("2 x max_clusters"))
            .collect();
        assert_eq!(full.len(), 1, "{:?}", log.0);
        assert!(full[0].contains("\"c3\""), "{}", full[0]);
    }

    /// A delay of seconds keeps many requests armed at once: the exposure
    /// cap then refuses some while tokens are free. That is no sign the
    /// delay costs more than the budget pays, and raising the delay for it
    /// would arm still more at once (a delay of 10 s driven to 76-127 s in
    /// a generated partial outage), so it does not count in the pressure.
    #[test]
    fn refusals_for_the_exposure_cap_are_no_refusal_pressure() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        traffic(&mut w, "c", 500, 10_000_000); // 10 s answers
        w.sync(T0, &store, &mut log);
        let (mut armed, mut refused) = (0, 0);
        let mut cluster = None;
        for tick in 1..=30u64 {
            // 50 requests a tick, none answered yet: all armed at once
            for _ in 0..50 {
                let plan = w.plan(Some(b"c"), None, &GET);
                cluster = plan.cluster;
                match plan.decision {
                    Decision::Arm(_) => armed += 1,
                    Decision::Skip(Skip::BudgetExhausted) => refused += 1,
                    d => panic!("{d:?}"),
                }
            }
            w.sync(T0 + tick * 200, &store, &mut log);
        }
        let state = w.cluster(cluster.unwrap()).unwrap();
        assert!(
            refused > 100 && armed > 100,
            "{armed} armed, {refused} refused"
        );
        assert!(!state.budget.short_of_tokens());
        assert_eq!(state.refusals.value(), 0.0);
    }

    #[test]
    fn metrics_count_what_happened() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        traffic(&mut w, "c", 200, 5000);
        w.sync(T0, &store, &mut log);
        // armed and hedged
        let plan = w.plan(Some(b"c"), None, &GET);
        assert!(matches!(plan.decision, Decision::Arm(_)));
        w.settle(plan.settlement().unwrap(), Some(2), None, None, None);
        // armed, and ended before its hedge
        let plan = w.plan(Some(b"c"), None, &GET);
        w.settle(plan.settlement().unwrap(), Some(1), None, None, None);
        // not idempotent
        assert_eq!(
            decision(&mut w, b"c", b"POST"),
            Decision::Skip(Skip::Method)
        );
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        let get = |name: &str| stats.get(&format!("adaptive_hedge.{name}.c")).unwrap();
        assert_eq!(get("requests_total"), 203);
        assert_eq!(get("hedges_armed_total"), 2);
        assert_eq!(get("hedges_sent_total"), 1);
        assert_eq!(get("hedges_refunded_total"), 1);
        assert_eq!(get("ineligible_total"), 201); // 200 warming up + POST
        assert_eq!(get("budget_exhausted_total"), 0);
        assert_eq!(get("window_samples"), 200);
        let delay = get("hedge_delay_microseconds");
        assert!((4900..=5100).contains(&delay), "{delay}");
        assert_eq!(get("hedge_delay_clamped"), 0);
        for q in ["p50", "p90", "p99"] {
            let us = get(&format!("latency_{q}_microseconds"));
            assert!((4900..=5100).contains(&us), "{q}: {us}");
        }
        // a second flush adds nothing
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.requests_total.c"), Some(203));
    }

    #[test]
    fn samples_are_spread_over_the_tick_and_capped() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(""));
        let sampled = |w: &mut Worker, cluster: &[u8]| w.plan(Some(cluster), None, &GET).sample;
        // a first tick knows no rate: the first SAMPLES_PER_TICK
        let taken = (0..1000).filter(|_| sampled(&mut w, b"a")).count();
        assert_eq!(taken, SAMPLES_PER_TICK as usize);
        assert!(sampled(&mut w, b"b"), "each cluster has its own slots");
        w.sync(T0, &store, &mut Lines::default());
        // then every 4th (1,000 last tick / 256), to the end of the tick
        let taken: Vec<usize> = (0..1000).filter(|_| sampled(&mut w, b"a")).collect();
        assert_eq!(taken.len(), 250);
        assert_eq!(taken.first(), Some(&0));
        assert_eq!(taken.last(), Some(&996));
        // requests that could not be hedged are not samples
        let post = Request {
            method: b"POST",
            ..GET
        };
        w.sync(T0 + 400, &store, &mut Lines::default());
        assert!(!w.plan(Some(b"b"), None, &post).sample);
    }

    #[test]
    fn requests_without_a_cluster_are_not_armed() {
        let mut w = Worker::new(config(""));
        assert_eq!(
            w.plan(None, None, &GET).decision,
            Decision::Skip(Skip::NoCluster)
        );
        assert_eq!(
            decision(&mut w, b"", b"GET"),
            Decision::Skip(Skip::NoCluster)
        );
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(
            stats.get("adaptive_hedge.untracked_requests_total"),
            Some(0)
        );
    }

    #[test]
    fn a_trusted_client_s_request_is_counted_never_armed() {
        let mut w = Worker::new(config(r#"{"trust_client_headers": true}"#));
        let own = Request {
            client_controls: true,
            ..GET
        };
        let plan = w.plan(Some(b"c"), None, &own);
        assert_eq!(plan.decision, Decision::Skip(Skip::ClientControlled));
        assert_eq!(plan.settlement(), None);
        let mut stats = Stats::default();
        w.sync(T0, &MemoryStore::default(), &mut Lines::default());
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.requests_total.c"), Some(1));
        assert_eq!(stats.get("adaptive_hedge.ineligible_total.c"), Some(1));
    }

    /// A store whose writes of one key always conflict.
    struct ConflictsOn<'a>(&'a MemoryStore, String);
    impl SharedStore for ConflictsOn<'_> {
        fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
            self.0.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            if key == self.1 {
                return Err(StoreError::CasMismatch);
            }
            self.0.set(key, value, cas)
        }
    }

    /// A revival whose write failed is not retried blind: the name may
    /// have left the registry meanwhile, and a value revived then lived
    /// outside it. The registry is read again first.
    #[test]
    fn a_revival_not_written_reads_the_registry_again() {
        let store = MemoryStore::default();
        let mut log = Lines::default();
        let mut a = Worker::new(config(r#"{"max_clusters": 2, "min_samples": 1}"#));
        let key = cluster_key(G30, "x");
        let unregister = |store: &MemoryStore| {
            let bytes = Registry { names: Vec::new() }.encode();
            store
                .values
                .borrow_mut()
                .insert(registry_key(G30), (bytes, 99));
        };
        traffic(&mut a, "x", 5, 1000);
        a.sync(T0, &store, &mut log);
        // evicted by another worker: a marker, the name out of the registry
        store.set(&key, &SharedCluster::evicted(), 0).unwrap();
        unregister(&store);
        a.sync(T0 + 200, &store, &mut log);
        decision(&mut a, b"x", b"GET");
        // a puts the name back; its revival's write fails
        a.sync(T0 + 400, &ConflictsOn(&store, key.clone()), &mut log);
        let (value, _) = store.get(&key).unwrap().unwrap();
        assert_eq!(value, SharedCluster::evicted());
        // and another worker takes the stranded name out again
        unregister(&store);
        decision(&mut a, b"x", b"GET");
        a.sync(T0 + 600, &store, &mut log);
        let (value, _) = store.get(&key).unwrap().unwrap();
        let names = registry(&store);
        assert_eq!(
            SharedCluster::decode(&value, G30).is_ok(),
            names.contains(&"x".to_string()),
            "a live value and its name in the registry go together: {names:?}"
        );
    }

    /// A store whose every call fails with a host status.
    struct Broken;
    impl SharedStore for Broken {
        fn get(&self, _: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
            Err(StoreError::Host(2))
        }
        fn set(&self, _: &str, _: &[u8], _: u32) -> Result<(), StoreError> {
            Err(StoreError::Host(2))
        }
    }

    /// Two plugins of one VM id with different windows: each keeps its
    /// own shared values (the keys carry the geometry), neither resets
    /// the other's.
    #[test]
    fn plugins_with_different_windows_keep_apart() {
        let store = MemoryStore::default();
        let mut log = Lines::default();
        let mut a = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut b = Worker::new(config(r#"{"min_samples": 10, "window": "60s"}"#));
        for t in 0..4 {
            traffic(&mut a, "c", 50, 2000);
            traffic(&mut b, "c", 50, 8000);
            a.sync(T0 + t * 200, &store, &mut log);
            b.sync(T0 + t * 200, &store, &mut log);
        }
        assert!(log.0.is_empty(), "{:?}", log.0);
        for w in [&mut a, &mut b] {
            let mut stats = Stats::default();
            w.flush_metrics(&mut stats);
            let resets = stats.get("adaptive_hedge.shared_state_resets_total");
            assert_eq!(resets.unwrap_or(0), 0);
        }
        let delay = |w: &Worker| w.cluster(0).unwrap().hedge_delay().unwrap().delay_us;
        assert!(
            delay(&a) < 3000 && delay(&b) > 6000,
            "{} {}",
            delay(&a),
            delay(&b)
        );
        assert_ne!(key("c"), cluster_key(b.geometry(), "c"));
    }

    /// A failing shared memory is logged once a minute at most, whatever
    /// else counts host errors (a request's header call failing first kept
    /// it out of the log; flushed every tick, a lasting failure was logged
    /// on every tick).
    #[test]
    fn host_errors_are_counted_logged_once_a_minute_and_change_nothing() {
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        traffic(&mut w, "c", 50, 3000);
        w.count_host_errors(1);
        w.sync(T0, &Broken, &mut log);
        w.sync(T0 + 200, &Broken, &mut log);
        assert_eq!(log.0.len(), 1, "{:?}", log.0);
        assert!(
            log.0[0].contains("get_shared_data(registry) failed"),
            "{:?}",
            log.0
        );
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.host_errors_total"), Some(3));
        // a minute of ticks (300 of 200 ms), flushed on each: logged again
        // only after it
        for t in 2..300 {
            w.sync(T0 + t * 200, &Broken, &mut log);
            w.flush_metrics(&mut stats);
        }
        assert_eq!(log.0.len(), 1, "{:?}", log.0);
        w.sync(T0 + 300 * 200, &Broken, &mut log);
        assert_eq!(log.0.len(), 2, "{:?}", log.0);
        // the samples wait for a store that works
        let store = MemoryStore::default();
        w.sync(T0 + 400, &store, &mut log);
        assert_eq!(w.cluster(0).unwrap().window_samples(), 50);
    }

    /// Every metric the filter defines is documented in the README.
    #[test]
    fn readme_documents_every_metric() {
        use crate::policy::hold::HoldMetric;
        use crate::policy::routes::RouteMetric;
        use crate::telemetry::Metric;
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
        )
        .unwrap();
        let names = ClusterMetric::ALL
            .iter()
            .map(|m| m.name())
            .chain(WorkerMetric::ALL.iter().map(|m| m.name()))
            .chain(HoldMetric::ALL.iter().map(|m| m.name()))
            .chain(RouteMetric::ALL.iter().map(|m| m.name()));
        for name in names {
            assert!(readme.contains(&format!("`{name}`")), "README lacks {name}");
        }
    }

    /// Hedges the router sends before their delay (a busy event loop fires
    /// timers early), when they make hedges far more than planned, set the
    /// per-try timeout later; when hedges stay under the plan it comes back
    /// a millisecond at a time.
    #[test]
    fn early_hedges_set_the_per_try_timeout_later() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10, "budget_percent": 50}"#));
        let mut log = Lines::default();
        traffic(&mut w, "c", 200, 3000);
        w.sync(T0, &store, &mut log);
        let per_try = |w: &Worker| {
            w.cluster(0)
                .unwrap()
                .hedge_delay()
                .unwrap()
                .per_try_timeout_ms
        };
        let base = per_try(&w);
        // 40 armed requests answered in 2.5 ms, before their delay; a third
        // of them hedged anyway
        let mut now = T0;
        let mut round = |w: &mut Worker, early_every: u64| {
            for i in 0..40u64 {
                let plan = w.plan(Some(b"c"), None, &GET);
                let sent = if early_every > 0 && i % early_every == 0 {
                    2
                } else {
                    1
                };
                if let Some(s) = plan.settlement() {
                    w.settle(s, Some(sent), Some(2500), None, None);
                }
            }
            now += 200;
            w.sync(now, &store, &mut Lines::default());
        };
        round(&mut w, 3);
        assert_eq!(per_try(&w), base + 1);
        round(&mut w, 3);
        assert_eq!(per_try(&w), base + 2);
        // a few early ones among hedges under plan (1 in 20, all early): no
        // change, and the first of twenty verdicts under plan
        round(&mut w, 20);
        assert_eq!(per_try(&w), base + 2);
        // hedges under the plan: it holds, then relaxes after twenty verdicts
        for _ in 0..18 {
            round(&mut w, 0);
        }
        assert_eq!(per_try(&w), base + 2);
        round(&mut w, 0);
        assert_eq!(per_try(&w), base + 1);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.early_hedges_total.c"), Some(30));
        // the learned delay itself is untouched
        let delay = stats
            .get("adaptive_hedge.hedge_delay_microseconds.c")
            .unwrap();
        assert!((2900..=3100).contains(&delay), "{delay}");
    }

    /// With the route's own retries kept (`route_retries` 2, Istio's
    /// default), Envoy may spend the whole count on hedges: in a stall each
    /// armed request sends one at the delay and another at twice it. The
    /// budget pays for the count: over a minute of stall the attempts Envoy
    /// may send stay within the earnings, the reserve and the exposure cap.
    /// Before, it paid for one hedge a request and armed twice too many.
    #[test]
    fn a_stall_with_the_route_s_retries_stays_within_the_budget() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10, "route_retries": 2}"#));
        let mut now = T0;
        for _ in 0..10 {
            traffic(&mut w, "c", 100, 3000);
            w.sync(now, &store, &mut Lines::default());
            now += 200;
        }
        // a stall: 100 requests a tick for a minute, none ends
        let (mut requests, mut potential) = (0u64, 0u64);
        for _ in 0..300 {
            for _ in 0..100 {
                let plan = w.plan(Some(b"c"), None, &GET);
                requests += 1;
                if let Decision::Arm(a) = &plan.decision {
                    assert_eq!((a.max_retries, a.reserved), (2, 2));
                    potential += u64::from(a.max_retries);
                }
            }
            w.sync(now, &store, &mut Lines::default());
            now += 200;
        }
        // 10% of the stall's requests, the reserve saved before it (at
        // most 10 s of earnings) and the exposure cap (about 1.5 x 2 s)
        let bound = requests / 10 + 500 + 300;
        assert!(
            potential <= bound,
            "{potential} attempts armed, bound {bound}"
        );
        assert!(
            potential >= requests / 20,
            "the budget is used: {potential}"
        );
    }

    /// A configuration pushed to a running Envoy replaces the worker state
    /// in the same VM: the new state knows the shared clusters, their delay
    /// and the old state's savings before its first request (the old one
    /// retires once its last request ended).
    #[test]
    fn a_replaced_worker_state_hedges_at_once_with_what_the_old_one_saved() {
        let store = MemoryStore::default();
        let mut old = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut now = T0;
        for _ in 0..60 {
            traffic(&mut old, "c", 50, 3000);
            old.sync(now, &store, &mut Lines::default());
            now += 200;
        }
        let saved = old.cluster(0).unwrap().budget.reserve_fill();
        assert!(saved > 0.9, "the old state saved its reserve: {saved}");
        // the new configuration's state is made while the old one drains
        let mut new = Worker::new(config(r#"{"min_samples": 10, "debug_header": true}"#));
        assert_eq!(new.adopt_shared(now, &store, &mut Lines::default()), 1);
        assert!(new.cluster(0).unwrap().hedge_delay().is_some());
        let old_geometry = old.geometry();
        let pool = |store: &MemoryStore| {
            let key = cluster_key(old_geometry, "c");
            let (bytes, _) = store.get(&key).unwrap().unwrap();
            SharedCluster::decode(&bytes, old_geometry).unwrap().pool
        };
        let before = pool(&store);
        let free = old.cluster(0).unwrap().budget.free_micro_tokens();
        // a cluster the old state met since its last tick is not registered
        traffic(&mut old, "d", 5, 3000);
        assert_eq!(old.retire(now, &store, &mut Lines::default()), 1);
        assert_eq!(pool(&store), before + free, "its tokens went to the pool");
        assert_eq!(registry(&store), ["c"]);
        now += 200;
        new.sync(now, &store, &mut Lines::default());
        // its first requests are armed: no warm-up, and tokens to pay
        let first = traffic(&mut new, "c", 20, 3000);
        assert!(
            first.iter().all(|d| matches!(d, Decision::Arm(_))),
            "{first:?}"
        );
        // a worker in a fresh VM (nothing shared) still waits its turn
        let mut fresh = Worker::new(config(r#"{"min_samples": 10}"#));
        assert_eq!(
            fresh.adopt_shared(now, &MemoryStore::default(), &mut Lines::default()),
            0
        );
        assert_eq!(
            fresh.plan_route(Some(b"c"), None, &[], &GET, None).decision,
            Decision::Skip(Skip::Unconfirmed)
        );
    }

    /// Taking up a large registry reads only the oldest clusters at once
    /// (it runs as a request's stream is made); the rest at the next tick.
    /// Route states are left to their routes' overrides.
    #[test]
    fn a_large_registry_is_taken_up_in_part_before_the_tick() {
        let store = MemoryStore::default();
        let mut old = Worker::new(config(r#"{"min_samples": 10}"#));
        let names: Vec<String> = (0..100).map(|i| format!("c{i}")).collect();
        for _ in 0..2 {
            for name in &names {
                traffic(&mut old, name, 20, 3000);
            }
            old.sync(T0, &store, &mut Lines::default());
        }
        let mut new = Worker::new(config(r#"{"min_samples": 10}"#));
        assert_eq!(
            new.adopt_shared(T0 + 100, &store, &mut Lines::default()),
            100
        );
        let learned = |w: &Worker| {
            (0..100)
                .filter(|&id| w.cluster(id).is_some_and(|c| c.hedge_delay().is_some()))
                .count()
        };
        assert_eq!(learned(&new), ADOPTED_SYNCED_AT_ONCE);
        new.sync(T0 + 200, &store, &mut Lines::default());
        assert_eq!(learned(&new), 100);
        // no second tick was counted for it
        assert_eq!(new.ticks, 1);
    }

    /// A second attempt answered before the per-try timeout by another
    /// host than the primary's is a retry after a fast failure (a 503 storm
    /// on one host), not a timer that fired early: it leaves the timeout
    /// alone. Where the filter does not know who answered, only answers
    /// close to the timeout count: a retry's answer is a whole fresh
    /// attempt later than the failure, far below a delay at the p94.
    #[test]
    fn retries_after_fast_failures_do_not_set_the_timeout_later() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10, "budget_percent": 50}"#));
        traffic(&mut w, "c", 200, 30_000);
        w.sync(T0, &store, &mut Lines::default());
        let per_try = |w: &Worker| {
            w.cluster(0)
                .unwrap()
                .hedge_delay()
                .unwrap()
                .per_try_timeout_ms
        };
        let base = per_try(&w);
        assert!((29..=32).contains(&base), "{base}");
        let mut now = T0;
        // 40 armed requests, a third retried; answered after `latency_us`
        let mut round = |w: &mut Worker, latency_us: u64, primary_answered: Option<bool>| {
            for i in 0..40u64 {
                let plan = w.plan(Some(b"c"), None, &GET);
                let (sent, answered) = match i % 3 {
                    0 => (2, primary_answered),
                    _ => (1, Some(true)),
                };
                if let Some(s) = plan.settlement() {
                    w.settle(s, Some(sent), Some(latency_us), None, answered);
                }
            }
            now += 200;
            w.sync(now, &store, &mut Lines::default());
        };
        // the retry's host answered, 12 ms in, and 1 ms before the timeout
        round(&mut w, 12_000, Some(false));
        round(&mut w, (base - 1) * 1000, Some(false));
        assert_eq!(per_try(&w), base);
        // not known who answered, 12 ms in: a retry, not an early timer
        round(&mut w, 12_000, None);
        assert_eq!(per_try(&w), base);
        // not known who answered, 1 ms before the timeout: an early timer
        round(&mut w, (base - 1) * 1000, None);
        assert_eq!(per_try(&w), base + 1);
        // the primary's host answered, 12 ms in, hedged: an early timer
        round(&mut w, 12_000, Some(true));
        assert_eq!(per_try(&w), base + 2);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.early_hedges_total.c"), Some(28));
    }

    /// Requests through a worker to three hosts, as the proxy glue reports
    /// them: the host that answers is the one named, else (explored) the
    /// next in round robin; `slow` answers in 20 ms, the others in 2 ms.
    fn host_traffic(w: &mut Worker, n: usize, slow: usize, round_robin: &mut usize) -> [u64; 3] {
        let mut arrivals = [0u64; 3];
        for _ in 0..n {
            let plan = w.plan(Some(b"c"), None, &GET);
            let Some(id) = plan.cluster else { continue };
            let host = match &plan.endpoint {
                Some(e) => e
                    .split(',')
                    .next()
                    .unwrap()
                    .trim_start_matches("h")
                    .parse()
                    .unwrap(),
                None => {
                    *round_robin += 1;
                    *round_robin % 3
                }
            };
            arrivals[host] += 1;
            let latency_us = if host == slow { 20_000 } else { 2_000 };
            w.on_response(id, plan.route, latency_us);
            let address = format!("h{host}");
            answer(w, id, plan.hosts, &address, 1, latency_us, None);
            if let Some(s) = plan.settlement() {
                w.settle(s, Some(1), None, None, None);
            }
        }
        arrivals
    }

    #[test]
    fn the_worker_finds_hosts_and_keeps_traffic_off_the_slow_one() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        let mut rr = 0;
        // until the tick shares what was found, the balancer's round robin
        let first = host_traffic(&mut w, 60, 2, &mut rr);
        assert_eq!(first, [20, 20, 20]);
        w.sync(T0, &store, &mut log);
        let later = host_traffic(&mut w, 1000, 2, &mut rr);
        assert!(later[2] <= 15, "the slow host kept {later:?}");
        w.sync(T0 + 200, &store, &mut log);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        let get = |name: &str| stats.get(&format!("adaptive_hedge.{name}.c")).unwrap();
        assert_eq!(get("hosts_tracked"), 3);
        assert_eq!(get("hosts_on_probation"), 1);
        assert!(get("host_picks_total") >= 950);
        assert!(get("slowest_host_share_permille") <= 15);
        assert_eq!(get("host_choice_ignored"), 0);
        assert!(log.0.is_empty(), "{:?}", log.0);
        // what this worker learned is in the shared value for the others
        let (bytes, _) = store.get(&key("c")).unwrap().unwrap();
        let shared =
            SharedCluster::decode(&bytes, WindowGeometry::new(Duration::from_secs(30))).unwrap();
        assert_eq!(shared.hosts.len(), 3);
        let mut b = Worker::new(config(r#"{"min_samples": 10}"#));
        traffic(&mut b, "c", 1, 2000);
        b.sync(T0 + 200, &store, &mut log);
        b.sync(T0 + 400, &store, &mut log);
        let hosts = b.cluster(0).unwrap().hosts();
        assert_eq!(hosts.len(), 3);
        assert_eq!(hosts.iter_known().filter(|h| h.probation).count(), 1);
    }

    /// After a single attempt the named host is trusted but for one
    /// response in `ADDRESS_CHECK_EVERY`: its latency is the named host's,
    /// and only the responses read count toward the override check.
    #[test]
    fn a_single_attempt_s_host_is_read_only_now_and_then() {
        let (mut w, _, _) = with_three_known_hosts();
        let pick = HostPick {
            primary: 1,
            hedge: None,
        };
        let checks: Vec<bool> = (0..8)
            .map(|_| w.check_address(0, Some(pick), Some(1)))
            .collect();
        assert_eq!(
            checks,
            [true, false, false, false, true, false, false, false]
        );
        // a hedged response, or one the filter did not choose: always read
        assert!(w.check_address(0, Some(pick), Some(2)));
        assert!(w.check_address(0, None, Some(1)));
        let cost = |w: &Worker| w.clusters[0].hosts.get(1).unwrap().cost_us();
        let before = cost(&w);
        for _ in 0..50 {
            w.on_host_response(
                0,
                Some(pick),
                HostResponse {
                    address: None,
                    latency_us: Some(40_000),
                    failed: false,
                    from_upstream: true,
                    attempts: Some(1),
                    per_try_timeout_ms: None,
                },
            );
        }
        assert!(cost(&w) > 2.0 * before, "{before} -> {}", cost(&w));
        // no check was recorded: nothing to judge the cluster by
        assert_eq!(w.clusters[0].hosts.take_override_checks(), (0, 0));
    }

    /// What `/clusters` says of cluster "c": h0 of weight 3, h1, and h2
    /// failing its health checks.
    const ADMIN_SAYS: &[u8] = b"c::added_via_api::false
c::h0::health_flags::healthy
c::h0::weight::3
c::h1::rq_total::7
c::h1::health_flags::healthy
c::h1::weight::1
c::h2::health_flags::/failed_active_hc
c::h2::weight::1
";

    /// Two workers reading the admin interface through `admin`, the first
    /// with the three hosts of cluster `c` measured.
    fn two_workers_reading_admin() -> (MemoryStore, Worker, Worker, Lines, usize) {
        let json = r#"{"min_samples": 10, "admin_cluster": "admin"}"#;
        let (mut w, other) = (Worker::new(config(json)), Worker::new(config(json)));
        let mut rr = 0;
        // no host is slow: only the admin interface tells them apart
        host_traffic(&mut w, 60, usize::MAX, &mut rr);
        (MemoryStore::default(), w, other, Lines::default(), rr)
    }

    #[test]
    fn after_the_clock_is_set_back_other_workers_read_the_admin_read_at_once() {
        let (store, mut w, mut other, mut log, _) = two_workers_reading_admin();
        traffic(&mut other, "c", 1, 2000);
        w.sync(T0, &store, &mut log);
        other.sync(T0, &store, &mut log);
        let back = T0 - 3_600_000;
        w.claim_admin_read(back, &store).unwrap();
        w.admin_read_done(back + 50, Ok(ADMIN_SAYS), &store, &mut log);
        traffic(&mut other, "c", 1, 2000);
        other.sync(back + 200, &store, &mut log);
        assert_eq!(other.cluster(0).unwrap().hosts_summary.held_out, 1);
    }

    /// Another worker evicts an idle cluster and a third revives it: this
    /// worker's sighting of it idle, from before, does not evict the new
    /// value at its first look.
    #[test]
    fn a_revived_cluster_is_not_evicted_on_a_sighting_from_before() {
        let store = MemoryStore::default();
        let mut a = Worker::new(config(r#"{"max_clusters": 1, "min_samples": 1}"#));
        let mut log = Lines::default();
        traffic(&mut a, "p", 5, 1000);
        a.sync(T0, &store, &mut log);
        decision(&mut a, b"q", b"GET");
        a.sync(T0 + 31_000, &store, &mut log); // p idle: a first sighting
        assert_eq!(registry(&store), ["p"]);
        // another worker evicts p, a third revives it (empty, as new)
        store.set(&key("p"), &SharedCluster::evicted(), 0).unwrap();
        store
            .set(&key("p"), &SharedCluster::new(G30).encode(), 0)
            .unwrap();
        decision(&mut a, b"q", b"GET");
        a.sync(T0 + 36_000, &store, &mut log);
        assert_eq!(registry(&store), ["p"], "kept for a slice at least");
    }

    /// An idle tick writes nothing: the shared value of a cluster no
    /// request came to is left as it is (on every worker, every tick).
    #[test]
    fn an_idle_tick_writes_no_cluster_value() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        let mut rr = 0;
        host_traffic(&mut w, 60, usize::MAX, &mut rr);
        w.sync(T0, &store, &mut log);
        w.sync(T0 + 200, &store, &mut log);
        let (_, before) = store.get(&key("c")).unwrap().unwrap();
        w.sync(T0 + 400, &store, &mut log);
        let (_, after) = store.get(&key("c")).unwrap().unwrap();
        assert_eq!(before, after, "nothing changed, nothing written");
    }

    /// A quiet cluster whose hosts' health changes in the admin
    /// interface's read is read at once: its next requests do not name the
    /// host held out (found by a review: 93 of the next 300 went to it).
    /// And its waits counted in ticks go on while it is quiet.
    #[test]
    fn a_quiet_cluster_follows_a_host_held_out_at_once() {
        let (store, mut w, _, mut log, mut rr) = two_workers_reading_admin();
        let mut now = T0;
        for _ in 0..30 {
            w.sync(now, &store, &mut log);
            now += 200;
        }
        assert!(
            w.cluster(0).unwrap().quiet(w.ticks, 25),
            "quiet after a slice"
        );
        w.claim_admin_read(now, &store).unwrap();
        w.admin_read_done(now, Ok(ADMIN_SAYS), &store, &mut log);
        // the read reaches the worker's look (once a second) within ticks
        for _ in 0..6 {
            now += 200;
            w.sync(now, &store, &mut log);
        }
        let arrivals = host_traffic(&mut w, 300, usize::MAX, &mut rr);
        assert!(arrivals[2] <= 10, "the unhealthy host got {arrivals:?}");
    }

    /// A cluster with an armed hedge not yet charged is not quiet, however
    /// long since its last request: its cohort is charged on a tick, and
    /// the pool must see what it costs (a slow endpoint: delays of
    /// seconds). Once charged, it is.
    #[test]
    fn an_armed_hedge_not_yet_charged_keeps_its_cluster_read() {
        let store = MemoryStore::default();
        let cfg = r#"{"min_samples": 10, "min_delay": "20s", "max_delay": "20s"}"#;
        let mut w = Worker::new(config(cfg));
        let mut log = Lines::default();
        traffic(&mut w, "c", 20, 2_000);
        let mut now = T0;
        w.sync(now, &store, &mut log);
        let armed = w.plan(Some(b"c"), None, &GET);
        assert!(
            matches!(armed.decision, Decision::Arm(_)),
            "{:?}",
            armed.decision
        );
        let quiet = |w: &Worker| w.cluster(0).unwrap().quiet(w.ticks, 25);
        for _ in 0..60 {
            now += 200;
            w.sync(now, &store, &mut log);
        }
        assert!(!quiet(&w), "12 s on, its hedge armed at 20 s is uncharged");
        for _ in 0..50 {
            now += 200;
            w.sync(now, &store, &mut log);
        }
        assert!(quiet(&w), "charged 20 s on: quiet");
    }

    /// A cluster evicted while this worker had it, and registered again
    /// by another, is read at this worker's first tick after its next
    /// request, as a new one: not taken for quiet from its old life (found
    /// by a review: its next request went unarmed, warming up).
    #[test]
    fn a_cluster_registered_again_is_read_at_once() {
        let (store, mut log, mut a, mut b) = two_workers(r#"{"min_samples": 10}"#);
        traffic(&mut a, "p", 20, 2_000);
        let mut now = T0;
        a.sync(now, &store, &mut log);
        // another worker's eviction: the marker, the name out of the registry
        store.set(&key("p"), &SharedCluster::evicted(), 0).unwrap();
        let empty = Registry { names: Vec::new() }.encode();
        store.set(&registry_key(G30), &empty, 0).unwrap();
        now += 200;
        a.sync(now, &store, &mut log);
        assert_eq!(a.cluster(0).unwrap().tracking, Tracking::Untracked);
        traffic(&mut b, "p", 20, 2_000);
        b.sync(now, &store, &mut log);
        for _ in 0..30 {
            now += 200;
            a.sync(now, &store, &mut log);
        }
        decision(&mut a, b"p", b"GET");
        now += 200;
        a.sync(now, &store, &mut log);
        let d = decision(&mut a, b"p", b"GET");
        assert!(
            matches!(d, Decision::Arm(_)),
            "{d:?} {:?}",
            a.cluster(0)
                .map(|c| (c.tracking, c.synced_tick, c.hedge_delay))
        );
    }

    #[test]
    fn the_admin_interface_holds_unhealthy_hosts_out_and_weighs_the_rest() {
        let (store, mut w, mut other, mut log, mut rr) = two_workers_reading_admin();
        // nothing to read before a cluster is registered (asked again a
        // period later)
        assert_eq!(w.claim_admin_read(T0 - 5_000, &store), None);
        w.sync(T0, &store, &mut log);
        let path = w.claim_admin_read(T0, &store).unwrap();
        assert_eq!(path, "/clusters?filter=%5E%28%3F%3Ac%29%24");
        // one worker reads per period: the others see its claim
        assert_eq!(other.claim_admin_read(T0 + 100, &store), None);
        assert_eq!(w.claim_admin_read(T0 + 100, &store), None);
        w.admin_read_done(T0 + 50, Ok(ADMIN_SAYS), &store, &mut log);
        w.sync(T0 + 200, &store, &mut log);
        let arrivals = host_traffic(&mut w, 1000, usize::MAX, &mut rr);
        // h2 only from the exploration share (left to the balancer)
        assert!(arrivals[2] <= 15, "the unhealthy host got {arrivals:?}");
        assert!(arrivals[0] > 2 * arrivals[1], "weights: {arrivals:?}");
        w.sync(T0 + 400, &store, &mut log);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.hosts_held_out.c"), Some(1));
        assert_eq!(stats.get("adaptive_hedge.admin_reads_total"), Some(1));
        // nor does the cluster run outlier detection: nothing to pace for
        assert_eq!(
            log.0,
            ["cluster \"c\": Envoy's outlier detection there does not count a hedge's timeout (none, or local-origin errors not split; admin interface): outlier pacing off"]
        );
        assert!(!w.cluster(0).unwrap().pacing());
        log.0.clear();
        // the other worker has it from shared memory on its next tick
        traffic(&mut other, "c", 1, 2000);
        other.sync(T0 + 400, &store, &mut log);
        let held_out = |w: &Worker| w.cluster(0).unwrap().hosts_summary.held_out;
        assert_eq!(held_out(&other), 1);
        // a period later another read is due, and a failed one is logged once
        let path = other.claim_admin_read(T0 + 5_000, &store);
        assert!(path.is_some());
        for _ in 0..2 {
            other.admin_read_done(T0 + 5_100, Err("it answered 404".into()), &store, &mut log);
        }
        assert_eq!(log.0.len(), 2, "{:?}", log.0);
        assert!(log.0[1].contains(
            "cannot read Envoy's admin interface through cluster \"admin\": it answered 404"
        ));
    }

    /// The first admin read also asks for the clusters the configuration
    /// names, and the names Envoy does not list are said once, at `Warn`: a
    /// typo in `clusters` would otherwise leave its settings (`disabled`
    /// to keep a paid API from being sent twice) applied to nothing,
    /// unsaid. A cluster listed with no host yet is Envoy's all the same.
    /// One worker of an Envoy says it (a mark in shared memory).
    #[test]
    fn clusters_the_configuration_names_but_envoy_lacks_are_said_once() {
        let store = MemoryStore::default();
        let json = r#"{"min_samples": 10, "admin_cluster": "admin",
            "clusters": {"c": {"budget_percent": 5}, "no-hosts-yet": {"disabled": true},
                         "outbound|8080||payments": {"disabled": true}}}"#;
        let mut w = Worker::new(config(json));
        let mut log = Lines::default();
        host_traffic(&mut w, 60, usize::MAX, &mut 0);
        w.sync(T0, &store, &mut log);
        let path = w.claim_admin_read(T0, &store).unwrap();
        assert_eq!(
            path,
            "/clusters?filter=%5E%28%3F%3Ac%7Cno%5C-hosts%5C-yet%7Coutbound%5C%7C8080%5C%7C%5C%7Cpayments%29%24"
        );
        let mut answer = ADMIN_SAYS.to_vec();
        answer.extend_from_slice(b"no-hosts-yet::default_priority::max_connections::1024\n");
        w.admin_read_done(T0 + 50, Ok(&answer), &store, &mut log);
        let warned: Vec<&String> = log
            .0
            .iter()
            .filter(|l| l.contains("no cluster of this name"))
            .collect();
        assert_eq!(warned.len(), 1, "{:?}", log.0);
        assert!(
            warned[0].starts_with("clusters.\"outbound|8080||payments\": "),
            "{}",
            warned[0]
        );
        // another worker's first read asks for them too, but it was said
        log.0.clear();
        let mut other = Worker::new(config(json));
        host_traffic(&mut other, 60, usize::MAX, &mut 0);
        other.sync(T0 + 5_000, &store, &mut log);
        let path = other.claim_admin_read(T0 + 5_100, &store).unwrap();
        assert!(path.contains("payments"), "{path}");
        other.admin_read_done(T0 + 5_150, Ok(&answer), &store, &mut log);
        // and the first worker's next read asks for the clusters in use only
        let path = w.claim_admin_read(T0 + 10_200, &store).unwrap();
        assert_eq!(path, "/clusters?filter=%5E%28%3F%3Ac%29%24");
        w.admin_read_done(T0 + 10_250, Ok(&answer), &store, &mut log);
        assert!(
            log.0.iter().all(|l| !l.contains("no cluster of this name")),
            "{:?}",
            log.0
        );
    }

    /// A cluster is paced for outlier detection unless the admin interface
    /// says a hedge's timeout cannot count there: no outlier detection, or
    /// one that does not split local-origin errors (the configuration
    /// dumps, read after `/clusters` when it shows outlier detection); and
    /// only while its word is recent. A cluster configured without pacing
    /// is never paced.
    #[test]
    fn outlier_pacing_follows_what_the_admin_interface_says() {
        let store = MemoryStore::default();
        let json = r#"{"min_samples": 10, "admin_cluster": "admin"}"#;
        let mut w = Worker::new(config(json));
        let mut log = Lines::default();
        let mut rr = 0;
        host_traffic(&mut w, 60, usize::MAX, &mut rr);
        w.sync(T0, &store, &mut log);
        assert!(w.cluster(0).unwrap().pacing(), "not known: paced");
        // and armed requests ask for the timeouts' 204 unless no detector reads it
        let asks_204 = |w: &Worker| w.cluster(0).unwrap().timeouts_as_204();
        assert!(asks_204(&w));
        // a read: `/clusters`, then the dumps it asks for, answered in turn
        // (`{}` past the answers given); the paths asked
        let read = |w: &mut Worker,
                    at: u64,
                    text: &[u8],
                    dumps: &[Result<&[u8], String>],
                    log: &mut Lines| {
            w.claim_admin_read(at, &store).unwrap();
            let mut asked = Vec::new();
            let mut next = w.admin_read_done(at, Ok(text), &store, log);
            let mut answers = dumps.iter();
            while let Some(path) = next {
                asked.push(path);
                let answer = answers.next().cloned().unwrap_or(Ok(b"{}"));
                next = w.admin_read_done(at, answer, &store, log);
            }
            w.sync(at + 1_000, &store, log);
            asked
        };
        let dump = |split: bool| {
            format!(
                r#"{{"configs": [{{"cluster": {{"name": "c", "outlier_detection": {{"split_external_local_origin_errors": {split}}}}}}}]}}"#
            )
        };
        let mut with = b"c::outlier::success_rate_average::-1\n".to_vec();
        with.extend_from_slice(ADMIN_SAYS);
        let split = dump(true);
        let asked = read(
            &mut w,
            T0,
            &with,
            &[Ok(b"{}"), Ok(split.as_bytes())],
            &mut log,
        );
        assert_eq!(asked.len(), 2, "{asked:?}");
        assert!(asked[0].starts_with("/config_dump?resource=dynamic_active_clusters"));
        assert!(asked[1].starts_with("/config_dump?resource=static_clusters"));
        assert!(w.cluster(0).unwrap().pacing());
        assert!(!asks_204(&w), "split: the code is ignored");
        assert!(log.0.is_empty(), "{:?}", log.0);
        // not split: the 204 spares the hosts
        let unsplit = dump(false);
        read(
            &mut w,
            T0 + 5_000,
            &with,
            &[Ok(unsplit.as_bytes())],
            &mut log,
        );
        assert!(!w.cluster(0).unwrap().pacing());
        assert!(asks_204(&w));
        assert_eq!(log.0.len(), 1, "{:?}", log.0);
        assert!(log.0[0].ends_with("outlier pacing off"), "{:?}", log.0);
        // reads that stop: the word goes stale, and the pacing comes back
        w.sync(T0 + 5_000 + 4 * 5_000, &store, &mut log);
        assert!(w.cluster(0).unwrap().pacing());
        assert!(asks_204(&w));
        assert_eq!(log.0.len(), 2, "{:?}", log.0);
        assert!(log.0[1].ends_with("outlier pacing on"), "{:?}", log.0);
        // a dump that fails: the split is not known, the cluster paced;
        // logged once, the rest of the read kept
        let at = T0 + 30_000;
        let asked = read(
            &mut w,
            at,
            &with,
            &[Err("it answered 404".into())],
            &mut log,
        );
        assert_eq!(asked.len(), 1, "a failed dump ends the read");
        assert!(w.cluster(0).unwrap().pacing());
        assert!(asks_204(&w), "the split not known");
        assert_eq!(w.admin.membership.read_ms, at);
        assert!(w.admin.membership.clusters.contains_key("c"));
        assert_eq!(log.0.len(), 3, "{:?}", log.0);
        assert!(log.0[2].contains("cannot read Envoy's configuration dump"));
        // no outlier detection: no dump asked for, not paced
        let asked = read(&mut w, at + 5_000, ADMIN_SAYS, &[], &mut log);
        assert!(asked.is_empty());
        assert!(!w.cluster(0).unwrap().pacing());
        assert!(!asks_204(&w), "no detector");
        // off by configuration: never on, nothing logged; the 204 still
        // follows the admin interface
        let json = r#"{"min_samples": 10, "admin_cluster": "admin", "outlier_pacing": false}"#;
        let mut w = Worker::new(config(json));
        let mut log = Lines::default();
        host_traffic(&mut w, 60, usize::MAX, &mut rr);
        w.sync(T0, &store, &mut log);
        read(
            &mut w,
            at + 10_000,
            &with,
            &[Ok(split.as_bytes())],
            &mut log,
        );
        assert!(!w.cluster(0).unwrap().pacing());
        assert!(!asks_204(&w), "split, pacing off");
        assert!(log.0.is_empty(), "{:?}", log.0);
    }

    /// A waypoint runs without host choice: outlier pacing still holds
    /// armed requests back there, and still learns from the admin
    /// interface where it cannot be needed.
    #[test]
    fn without_host_choice_the_admin_interface_still_turns_needless_pacing_off() {
        let store = MemoryStore::default();
        let json = r#"{"min_samples": 10, "admin_cluster": "admin", "host_choice": false}"#;
        let mut w = Worker::new(config(json));
        let mut log = Lines::default();
        traffic(&mut w, "c", 10, 2000);
        w.sync(T0, &store, &mut log);
        assert!(w.cluster(0).unwrap().pacing());
        let path = w.claim_admin_read(T0, &store).unwrap();
        assert_eq!(path, "/clusters?filter=%5E%28%3F%3Ac%29%24");
        assert_eq!(
            w.admin_read_done(T0 + 50, Ok(ADMIN_SAYS), &store, &mut log),
            None
        );
        w.sync(T0 + 200, &store, &mut log);
        assert!(!w.cluster(0).unwrap().pacing());
        assert_eq!(
            log.0,
            ["cluster \"c\": Envoy's outlier detection there does not count a hedge's timeout (none, or local-origin errors not split; admin interface): outlier pacing off"]
        );
    }

    #[test]
    fn without_host_choice_nor_pacing_the_admin_interface_is_not_read() {
        let store = MemoryStore::default();
        let json = r#"{"admin_cluster": "admin", "host_choice": false, "outlier_pacing": false}"#;
        let mut w = Worker::new(config(json));
        traffic(&mut w, "c", 10, 2000);
        w.sync(T0, &store, &mut Lines::default());
        assert_eq!(w.claim_admin_read(T0, &store), None);
        // on for one cluster: only that one is asked for
        let json = r#"{"admin_cluster": "admin", "host_choice": false, "outlier_pacing": false, "clusters": {"b": {"host_choice": true}}}"#;
        let mut w = Worker::new(config(json));
        traffic(&mut w, "c", 10, 2000);
        traffic(&mut w, "b", 10, 2000);
        w.sync(T0, &store, &mut Lines::default());
        assert_eq!(
            w.claim_admin_read(T0, &store).as_deref(),
            Some("/clusters?filter=%5E%28%3F%3Ab%29%24")
        );
    }

    #[test]
    fn a_cluster_that_ignores_the_host_header_is_logged_once_and_paused() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        let mut rr = 0;
        host_traffic(&mut w, 60, 2, &mut rr);
        w.sync(T0, &store, &mut log);
        // Envoy answers from round robin whatever the header names, on two
        // ticks in a row (one judgement is not enough: OVERRIDE_JUDGEMENTS)
        for tick in 1..=2 {
            for _ in 0..40 {
                let plan = w.plan(Some(b"c"), None, &GET);
                let (Some(id), Some(pick)) = (plan.cluster, plan.hosts) else {
                    continue;
                };
                rr += 1;
                let address = format!("h{}", rr % 3);
                answer(&mut w, id, Some(pick), &address, 1, 2000, None);
            }
            w.sync(T0 + 200 * tick, &store, &mut log);
            assert_eq!(log.0.len(), tick as usize - 1, "{:?}", log.0);
        }
        assert_eq!(log.0.len(), 1, "{:?}", log.0);
        assert!(log.0[0].contains("does not follow the host header"));
        assert_eq!(w.plan(Some(b"c"), None, &GET).endpoint, None, "paused");
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.host_choice_ignored.c"), Some(1));
    }

    /// Envoy's answer to a request the worker chose `pick` for: a success
    /// from `address` after `attempts` attempts and `latency_us`.
    fn answer(
        w: &mut Worker,
        id: ClusterId,
        pick: Option<HostPick>,
        address: &str,
        attempts: u64,
        latency_us: u64,
        per_try_timeout_ms: Option<u64>,
    ) {
        w.on_host_response(
            id,
            pick,
            HostResponse {
                address: Some(address.as_bytes()),
                latency_us: Some(latency_us),
                failed: false,
                from_upstream: true,
                attempts: Some(attempts),
                per_try_timeout_ms,
            },
        );
    }

    /// Plans `n` requests of cluster "c" and answers each one whose hosts
    /// the worker chose as `outcome(i, pick)` says: the host that answered,
    /// the attempts and the latency (µs), armed at 10 ms; `sampled`: its
    /// latency is a sample too. Returns how many a later attempt won.
    fn answer_races(
        w: &mut Worker,
        n: usize,
        sampled: bool,
        outcome: impl Fn(usize, HostPick) -> (usize, u64, u64),
    ) -> u64 {
        let mut won = 0;
        for i in 0..n {
            let plan = w.plan(Some(b"c"), None, &GET);
            let (Some(id), Some(pick)) = (plan.cluster, plan.hosts) else {
                continue;
            };
            let (winner, attempts, latency_us) = outcome(i, pick);
            won += u64::from(winner != pick.primary);
            if sampled {
                w.on_response(id, None, latency_us);
            }
            let address = w.clusters[0].hosts.get(winner).unwrap().address.clone();
            answer(w, id, Some(pick), &address, attempts, latency_us, Some(10));
        }
        won
    }

    /// A worker (`min_samples` 10) that knows hosts h0..h2
    /// (`three_known_hosts`), its store and its log.
    fn with_three_known_hosts() -> (Worker, MemoryStore, Lines) {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut log = Lines::default();
        three_known_hosts(&mut w, &store, &mut log);
        (w, store, log)
    }

    /// Hosts h0..h2 learned and shared (one tick), all equally fast.
    fn three_known_hosts(w: &mut Worker, store: &MemoryStore, log: &mut Lines) {
        let mut rr = 0;
        host_traffic(w, 60, usize::MAX, &mut rr);
        w.sync(T0, store, log);
    }

    fn primary_of(endpoint: &str) -> &str {
        endpoint.split(',').next().unwrap_or_default()
    }

    #[test]
    fn a_host_gone_from_the_cluster_stops_being_named_and_the_cluster_is_not_blamed() {
        let (mut w, store, mut log) = with_three_known_hosts();
        // h1 left the cluster: Envoy skips it and answers from h0
        let mut named_h1 = 0;
        for _ in 0..300 {
            let plan = w.plan(Some(b"c"), None, &GET);
            let (Some(id), Some(pick), Some(endpoint)) = (plan.cluster, plan.hosts, &plan.endpoint)
            else {
                continue;
            };
            let address = match primary_of(endpoint) {
                "h1" => {
                    named_h1 += 1;
                    "h0"
                }
                other => other,
            }
            .to_string();
            answer(&mut w, id, Some(pick), &address, 1, 2000, None);
        }
        assert!(named_h1 >= 50, "h1 named {named_h1} times before the tick");
        w.sync(T0 + 200, &store, &mut log);
        let mut named = 0;
        for _ in 0..1000 {
            let plan = w.plan(Some(b"c"), None, &GET);
            if let Some(endpoint) = &plan.endpoint {
                named += 1;
                assert!(!endpoint.contains("h1"), "{endpoint}");
            }
            if let (Some(id), Some(pick)) = (plan.cluster, plan.hosts) {
                w.end_pick(id, pick);
            }
        }
        // the other hosts are still named (the tick forgot none of them)
        assert!(named >= 900, "{named} of 1000 named a host");
        assert!(log.0.is_empty(), "{:?}", log.0);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.host_choice_ignored.c"), Some(0));
        // it answers again (back in the cluster): it is chosen again
        let h1 = w.clusters[0].hosts.find_or_add(b"h1").unwrap();
        w.on_host_response(
            0,
            None,
            HostResponse {
                address: Some(b"h1"),
                latency_us: Some(2000),
                failed: false,
                from_upstream: true,
                attempts: Some(1),
                per_try_timeout_ms: None,
            },
        );
        let named_again = (0..300)
            .filter_map(|_| w.plan(Some(b"c"), None, &GET).hosts)
            .filter(|pick| pick.primary == h1)
            .count();
        assert!(
            named_again >= 30,
            "h1 named {named_again} of 300 after answering"
        );
    }

    /// As the glue reports a single attempt's answer: the address only
    /// when `check_address` asks for it (otherwise the named host is
    /// trusted), `actual` being the host Envoy really sent it to.
    fn answer_as_glue(w: &mut Worker, id: ClusterId, pick: HostPick, actual: &str) {
        let read = w.check_address(id, Some(pick), Some(1));
        w.on_host_response(
            id,
            Some(pick),
            HostResponse {
                address: read.then_some(actual.as_bytes()),
                latency_us: Some(2000),
                failed: false,
                from_upstream: true,
                attempts: Some(1),
                per_try_timeout_ms: None,
            },
        );
    }

    /// A host removed from the cluster while requests that named it are
    /// in flight across ticks (a CI rehearsal kept one for 15 s: the
    /// responses trusted to the named host without a read gave it samples
    /// and cleared its `unreachable`, so it was named again and renewed in
    /// the shared value). Once one read shows it missed, every response
    /// naming it is read; it stops being named, and the shared value
    /// forgets it.
    #[test]
    fn a_removed_host_is_not_kept_alive_by_answers_trusted_to_it() {
        // `per_tick` requests a tick, those from the `answered`-th on in
        // flight across the tick. Trusting the answers unread, 0 and 20 of
        // 40 kept it named to the end, 30 until tick 13, and at 6 a tick
        // (one read in four: rarely two reads of it in one tick) it was
        // never marked. With every answer naming it read once doubted but
        // the reads judged each tick, at 2 a tick it was named until tick
        // 49, and its misses alone had the cluster paused for ignoring the
        // header (`Hosts::take_override_checks`)
        for (per_tick, answered) in [
            (40, 0),
            (40, 20),
            (40, 30),
            (40, 37),
            (6, 6),
            (4, 4),
            (3, 3),
            (2, 2),
        ] {
            let store = MemoryStore::default();
            let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
            let mut log = Lines::default();
            three_known_hosts(&mut w, &store, &mut log);
            let mut in_flight: Vec<(ClusterId, HostPick, String)> = Vec::new();
            let mut last_named = None;
            let ticks = 2 + super::super::hosts::FORGET_MS / 200;
            for tick in 1..=ticks {
                for (id, pick, actual) in std::mem::take(&mut in_flight) {
                    answer_as_glue(&mut w, id, pick, &actual);
                }
                for i in 0..per_tick {
                    let plan = w.plan(Some(b"c"), None, &GET);
                    let (Some(id), Some(pick), Some(endpoint)) =
                        (plan.cluster, plan.hosts, &plan.endpoint)
                    else {
                        continue;
                    };
                    // Envoy skips h1 and answers from h0
                    let actual = match primary_of(endpoint) {
                        "h1" => {
                            last_named = Some(tick);
                            "h0"
                        }
                        other => other,
                    }
                    .to_string();
                    if i >= answered {
                        in_flight.push((id, pick, actual));
                    } else {
                        answer_as_glue(&mut w, id, pick, &actual);
                    }
                }
                w.sync(T0 + 200 * tick, &store, &mut log);
            }
            let case = format!("{answered} of {per_tick} answered a tick");
            eprintln!("{case}: h1 last named at tick {last_named:?}");
            assert!(
                last_named.is_some_and(|t| t <= 6),
                "{case}: h1 last named at tick {last_named:?}"
            );
            let (bytes, _) = store.get(&key("c")).unwrap().unwrap();
            let shared =
                SharedCluster::decode(&bytes, WindowGeometry::new(Duration::from_secs(30)))
                    .unwrap();
            let mut kept: Vec<&str> = shared.hosts.iter().map(|h| h.address.as_str()).collect();
            kept.sort();
            assert_eq!(kept, ["h0", "h2"], "{case}");
            assert_eq!(w.clusters[0].hosts_summary.tracked, 2);
            assert!(log.0.is_empty(), "{:?}", log.0);
        }
    }

    /// A primary that lost the race (Envoy's retry of a 5xx the client
    /// never sees, or a hedge) counts as failing; winning races do not.
    #[test]
    fn a_race_lost_counts_as_the_primary_failing() {
        let (mut w, store, mut log) = with_three_known_hosts();
        let h2 = w.clusters[0].hosts.find_or_add(b"h2").unwrap();
        let pick = HostPick {
            primary: h2,
            hedge: None,
        };
        // Envoy's retries of a failed h2 went to h0, 2 ms after the start
        for _ in 0..3 {
            w.on_host_response(
                0,
                Some(pick),
                HostResponse {
                    address: Some(b"h0"),
                    latency_us: Some(2000),
                    failed: false,
                    from_upstream: true,
                    attempts: Some(2),
                    per_try_timeout_ms: Some(10),
                },
            );
        }
        w.sync(T0 + 200, &store, &mut log);
        let hosts = w.cluster(0).unwrap().hosts();
        let h2 = hosts.iter_known().find(|h| h.address == "h2").unwrap();
        assert!(h2.probation, "{h2:?}");
        // retries after a fast failure, not hedges that won
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(stats.get("adaptive_hedge.hedges_won_total.c"), Some(0));
        // healthy hosts: hedged requests (one in ten) whose primaries lose
        // half the races, evenly spread: nobody on probation
        let mut w = Worker::new(config(r#"{"min_samples": 10}"#));
        three_known_hosts(&mut w, &store, &mut log);
        let won = answer_races(&mut w, 300, false, |i, pick| match i % 20 {
            0 => ((pick.primary + 1) % 3, 2, 12_000),
            10 => (pick.primary, 2, 12_000),
            _ => (pick.primary, 1, 2_000),
        });
        w.sync(T0 + 400, &store, &mut log);
        let hosts = w.cluster(0).unwrap().hosts();
        assert_eq!(hosts.iter_known().filter(|h| h.probation).count(), 0);
        // the hedges that answered first, after the delay
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert!(won > 5, "{won}");
        assert_eq!(stats.get("adaptive_hedge.hedges_won_total.c"), Some(won));
    }

    /// A hedged answer from a host with no slot (an address too long to
    /// keep): not known to be the primary's, so its primary counts as cut
    /// short (the backend's estimate errs high, never low).
    #[test]
    fn an_unknown_winner_s_primary_counts_as_cut_short() {
        let (mut w, _, _) = with_three_known_hosts();
        let pick = HostPick {
            primary: 0,
            hedge: Some(1),
        };
        let long = "x".repeat(300);
        answer(&mut w, 0, Some(pick), &long, 2, 30_000, Some(10));
        assert_eq!(w.clusters[0].cut_short.count(), 1);
    }

    /// Above `SAMPLES_PER_TICK` requests a tick one in `stride` is timed:
    /// each timed win counts for the requests it stands for.
    #[test]
    fn a_timed_win_counts_for_the_requests_it_stands_for() {
        let (mut w, store, mut log) = with_three_known_hosts();
        for _ in 0..4 * SAMPLES_PER_TICK {
            let plan = w.plan(Some(b"c"), None, &GET);
            if let (Some(id), Some(pick)) = (plan.cluster, plan.hosts) {
                w.end_pick(id, pick);
            }
            if let Some(s) = plan.settlement() {
                w.settle(s, Some(1), None, None, None);
            }
        }
        w.sync(T0 + 200, &store, &mut log);
        assert_eq!(w.clusters[0].stride, 4);
        let won = answer_races(&mut w, 20, true, |_, pick| {
            ((pick.primary + 1) % 3, 2, 12_000)
        });
        assert!(won >= 10, "{won}");
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(
            stats.get("adaptive_hedge.hedges_won_total.c"),
            Some(4 * won)
        );
    }

    /// One request in ten is slow (50 ms) at its primary and hedged after
    /// 10 ms; the hedge answers at 12 ms, except one in twenty whose hedge
    /// is slow too (the primary answers): clients get a p99 of 12 ms, and
    /// the backend's p99, exported beside it, is the primaries' 50 ms.
    #[test]
    fn the_backend_s_tail_behind_the_hedges_is_exported() {
        let (mut w, store, mut log) = with_three_known_hosts();
        answer_races(&mut w, 1000, true, |i, pick| match i % 200 {
            0 => (pick.primary, 2, 50_000),
            1..=19 => ((pick.primary + 1) % 3, 2, 12_000),
            _ => (pick.primary, 1, 2_000),
        });
        w.sync(T0 + 200, &store, &mut log);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        let gauge = |name: &str| {
            stats
                .get(&format!("adaptive_hedge.{name}_microseconds.c"))
                .unwrap() as f64
        };
        let near = |got: f64, want: f64| (got / want - 1.0).abs() < 0.02;
        let [clients, p99, p50] =
            ["latency_p99", "backend_latency_p99", "backend_latency_p50"].map(gauge);
        assert!(near(clients, 12_000.0), "{clients}");
        assert!(near(p99, 50_000.0), "{p99}");
        assert!(near(p50, 2_000.0), "{p50}");
        // without host choice which attempt answered is not known: 0
        let mut w = Worker::new(config(r#"{"min_samples": 10, "host_choice": false}"#));
        for _ in 0..100 {
            let plan = w.plan(Some(b"c"), None, &GET);
            if let Some(id) = plan.cluster {
                w.on_response(id, None, 2_000);
            }
        }
        w.sync(T0 + 400, &MemoryStore::default(), &mut log);
        let mut stats = Stats::default();
        w.flush_metrics(&mut stats);
        assert_eq!(
            stats.get("adaptive_hedge.backend_latency_p99_microseconds.c"),
            Some(0)
        );
        assert!(
            stats
                .get("adaptive_hedge.latency_p99_microseconds.c")
                .unwrap()
                > 0
        );
    }

    #[test]
    fn host_choice_off_reads_and_shares_no_host() {
        let store = MemoryStore::default();
        let mut w = Worker::new(config(r#"{"min_samples": 10, "host_choice": false}"#));
        let mut log = Lines::default();
        let mut rr = 0;
        host_traffic(&mut w, 60, 2, &mut rr);
        w.sync(T0, &store, &mut log);
        assert_eq!(host_traffic(&mut w, 300, 2, &mut rr), [100, 100, 100]);
        w.sync(T0 + 200, &store, &mut log);
        assert!(w.cluster(0).unwrap().hosts().is_empty());
        let (bytes, _) = store.get(&key("c")).unwrap().unwrap();
        let shared =
            SharedCluster::decode(&bytes, WindowGeometry::new(Duration::from_secs(30))).unwrap();
        assert!(shared.hosts.is_empty());
    }

    /// Two configurations share a cluster's value (one drains after a
    /// reload that turned host choice on): the one without host choice
    /// leaves the hosts the other learns.
    #[test]
    fn a_worker_without_host_choice_leaves_the_shared_hosts_be() {
        let store = MemoryStore::default();
        let mut log = Lines::default();
        let mut on = Worker::new(config(r#"{"min_samples": 10}"#));
        let mut off = Worker::new(config(r#"{"min_samples": 10, "host_choice": false}"#));
        let mut rr = 0;
        host_traffic(&mut on, 60, 2, &mut rr);
        host_traffic(&mut off, 60, 2, &mut rr);
        on.sync(T0, &store, &mut log);
        off.sync(T0 + 1, &store, &mut log);
        let (bytes, _) = store.get(&key("c")).unwrap().unwrap();
        let shared = SharedCluster::decode(&bytes, G30).unwrap();
        assert_eq!(shared.hosts.len(), 3);
    }
}
