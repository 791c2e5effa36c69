//! The named routes of one cluster that learn a delay of their own.
//!
//! Why: one cluster often serves endpoints of very different latency (a
//! cheap lookup and an expensive search behind the same service). The
//! cluster's quantile is then set by the mix: the cheap endpoint is hedged
//! late (its stragglers sit below the mixed p92) and the expensive one early
//! and often (most of its requests outlive the mixed p92, spending the
//! budget on requests that were not slow for what they are).
//!
//! Each route (Envoy's `xds.route_name`; unnamed routes share the cluster's
//! delay) gets a window and a long horizon like the cluster's, kept in the
//! cluster's shared value, at most `max_routes` per cluster (first come;
//! a route not heard from for long gives its slot up). A route arms its own
//! delay once it has `min_samples`; until then, and past `max_routes`, its
//! requests use the cluster's. Every sample also goes into the cluster's
//! window, and the budget stays the cluster's: routes change when a request
//! is hedged, not how many are.

use super::config::ClusterPolicy;
use super::decision::RouteId;
use super::hedge_delay::{hedge_delay, BudgetState, Censoring, HedgeDelay};
use super::shared_state::{SharedRoute, MAX_ROUTE_NAME};
use super::sketch::Sketch;
use super::window::WindowGeometry;
use crate::telemetry::{metric_set, MetricTable, MetricsSink};

metric_set! {
    /// Per route: `adaptive_hedge.<metric>.<cluster>.route.<route>`.
    pub enum RouteMetric {
        /// The route's own delay; 0 while it uses the cluster's.
        HedgeDelayUs = ("route_hedge_delay_microseconds", Gauge),
    }
}

/// A worker's table holds up to this many times `max_routes` names: the
/// shared value decides which learn, and a worker whose first routes were
/// refused (others registered theirs first) must still meet the others.
const LOCAL_ROUTES_PER_LIMIT: usize = 2;

/// A route a worker has not routed a request to for this long gives its
/// local slot up to a new name when the table is full. Before, names were
/// kept for the VM's life: after routes were renamed or added over weeks a
/// busy cluster's table was full of dead names, and new routes never
/// learned their own delay, even once the shared value had given the dead
/// ones' slots up.
const ROUTE_IDLE_MS: u64 = 300_000;

/// Routes given up since the last flush, at most: their gauge is set to 0
/// once (the label would otherwise keep its last delay).
const RETIRED_MAX: usize = 16;

#[derive(Debug)]
struct RouteState {
    name: String,
    /// The tick (`Routes::now_ms`) a request last named it.
    seen_ms: u64,
    /// Samples since the last tick, not yet in the shared value.
    samples: Sketch,
    /// Cached on the tick; `None` until the route has `min_samples` (or has
    /// no slot in the shared value).
    delay: Option<HedgeDelay>,
    metrics: MetricTable<RouteMetric>,
}

/// What a route's recent quantile is taken with (see `hedge_delay`): the
/// window's slices it covers, the cluster's per-try timeout (for routes
/// without a delay of their own yet) and how full the budget's reserve is.
#[derive(Clone, Copy, Debug)]
pub struct RecentTerms {
    pub slices: u64,
    pub cluster_censored_at: Option<f64>,
    /// The share of the cluster's recent samples that were armed (see
    /// `hedge_delay::Censoring`).
    pub armed_share: f64,
    pub budget: BudgetState,
}

/// One cluster's routes, as this worker knows them.
#[derive(Debug, Default)]
pub struct Routes {
    routes: Vec<RouteState>,
    /// The last tick's time (ms).
    now_ms: u64,
    /// Given up since the last flush (see `RETIRED_MAX`).
    retired: Vec<RouteState>,
}

impl Routes {
    /// The route's handle, taking a local slot for a new name (that of a
    /// route idle for `ROUTE_IDLE_MS` if the table is full); `None` for an
    /// empty name, a name that is too long or not UTF-8, or a full table.
    /// Linear: the table holds at most `2 * max_routes` short names.
    pub fn lookup(&mut self, name: &[u8], max_routes: usize) -> Option<RouteId> {
        let now_ms = self.now_ms;
        if let Some(id) = self.routes.iter().position(|r| r.name.as_bytes() == name) {
            if let Some(r) = self.routes.get_mut(id) {
                r.seen_ms = now_ms;
            }
            return Some(id);
        }
        if name.is_empty() || name.len() > MAX_ROUTE_NAME || max_routes == 0 {
            return None;
        }
        // A full table: the place of a route idle for long, found before
        // anything is built (this runs on every request of a route left
        // out). A request in flight may still hold the idle route's id: its
        // one sample then goes to the new route, once in minutes at most.
        let room = self.routes.len() < LOCAL_ROUTES_PER_LIMIT * max_routes;
        let idle = match room {
            true => None,
            false => Some(self.routes.iter().position(|r| {
                r.samples.is_empty() && now_ms.saturating_sub(r.seen_ms) >= ROUTE_IDLE_MS
            })?),
        };
        let fresh = RouteState {
            name: std::str::from_utf8(name).ok()?.to_string(),
            seen_ms: now_ms,
            samples: Sketch::new(),
            delay: None,
            metrics: MetricTable::default(),
        };
        let Some(id) = idle else {
            self.routes.push(fresh);
            return Some(self.routes.len() - 1);
        };
        let slot = self.routes.get_mut(id)?;
        let old = std::mem::replace(slot, fresh);
        if self.retired.len() >= RETIRED_MAX {
            self.retired.remove(0);
        }
        self.retired.push(old);
        Some(id)
    }

    /// The route's learned delay, if it has one.
    pub fn delay(&self, id: RouteId) -> Option<HedgeDelay> {
        self.routes.get(id).and_then(|r| r.delay)
    }

    pub fn add_sample(&mut self, id: RouteId, latency_us: f64) {
        if let Some(r) = self.routes.get_mut(id) {
            r.samples.add(latency_us);
        }
    }

    /// Whether a route took a sample since the last tick.
    pub fn has_news(&self) -> bool {
        self.routes.iter().any(|r| !r.samples.is_empty())
    }

    /// Under the compare-and-swap of the cluster's value (may run more than
    /// once, so it reads `self` only): ages every route's window and long
    /// horizon, and merges this worker's samples, registering a route that
    /// has none yet while there is room (or a forgotten route to replace).
    pub fn merge_into(
        &self,
        shared: &mut Vec<SharedRoute>,
        now_ms: u64,
        max_routes: usize,
        geometry: WindowGeometry,
    ) {
        for route in shared.iter_mut() {
            route.window.expire(now_ms);
            route.long.merge(now_ms, &Sketch::new());
        }
        // A configuration learns the routes within its own limit only (a
        // smaller one shares the value with a larger after a reload).
        for local in self.routes.iter().filter(|r| !r.samples.is_empty()) {
            let within = shared.len().min(max_routes);
            let slot = match shared
                .iter()
                .take(within)
                .position(|s| s.name == local.name)
            {
                Some(i) => Some(i),
                // past the limit, but the value's: taking a forgotten slot
                // for it made a second entry of one name, and the larger
                // configuration lost what it had learned of the route to
                // the first, empty one (found by a review)
                None if shared.iter().skip(within).any(|s| s.name == local.name) => None,
                None if shared.len() < max_routes => {
                    shared.push(SharedRoute::new(local.name.clone(), geometry));
                    Some(shared.len() - 1)
                }
                None => shared
                    .iter()
                    .take(within)
                    .position(|s| s.forgotten(now_ms))
                    .inspect(|&i| {
                        if let Some(s) = shared.get_mut(i) {
                            *s = SharedRoute::new(local.name.clone(), geometry);
                        }
                    }),
            };
            if let Some(s) = slot.and_then(|i| shared.get_mut(i)) {
                s.window.merge(now_ms, &local.samples);
                s.long.merge(now_ms, &local.samples);
            }
        }
        // a config with fewer routes than the value holds (a new one
        // shares the value): the routes past its limit go once idle for a
        // window. At once (as before), a configuration draining after a
        // reload that raised `max_routes` erased, every tick, the routes the
        // new one was learning.
        let mut kept = 0;
        shared.retain(|s| {
            kept += 1;
            kept <= max_routes || !s.window.snapshot(now_ms).is_empty()
        });
    }

    /// After the shared value was written: the samples are in it; every
    /// route's delay from its shared window (`None` without a slot),
    /// adjusted by `adjust` (the cluster's timer slack). A route without a
    /// delay of its own was armed with the cluster's: `cluster_censored_at`.
    pub fn refresh(
        &mut self,
        shared: &[SharedRoute],
        now_ms: u64,
        policy: &ClusterPolicy,
        recent: RecentTerms,
        adjust: impl Fn(HedgeDelay) -> HedgeDelay,
    ) {
        let RecentTerms {
            slices: recent_slices,
            cluster_censored_at,
            armed_share,
            budget,
        } = recent;
        if self.now_ms == 0 {
            // the routes named before the first tick were stamped 0
            for r in self.routes.iter_mut() {
                r.seen_ms = now_ms;
            }
        }
        self.now_ms = now_ms;
        for local in self.routes.iter_mut() {
            // seen more than a second ahead: the clock was set back, and a
            // route so stamped would never look idle until it caught up
            if local.seen_ms > now_ms.saturating_add(1_000) {
                local.seen_ms = now_ms;
            }
            local.samples.clear();
            let censoring = local
                .delay
                .map(|d| d.censoring_point_us())
                .or(cluster_censored_at)
                .map(|at_us| Censoring { at_us, armed_share });
            local.delay = shared
                .iter()
                .take(policy.max_routes)
                .find(|s| s.name == local.name)
                .and_then(|s| {
                    let recent = s.window.snapshot_recent_at_least(
                        now_ms,
                        recent_slices,
                        policy.min_samples,
                    );
                    let hedging = local.delay.is_some();
                    hedge_delay(
                        policy,
                        &s.long.sketch,
                        &recent,
                        censoring,
                        budget,
                        None,
                        hedging,
                    )
                })
                .map(&adjust);
        }
    }

    /// Gives every route up (its cluster's shared value went): their
    /// gauges are set to 0 at the next flush, the table starts empty.
    pub fn retire_all(&mut self) {
        self.retired.append(&mut self.routes);
    }

    /// Sets each route's gauge (on the tick).
    pub fn flush_metrics(&mut self, sink: &mut dyn MetricsSink, cluster: &str) {
        for r in self.retired.iter_mut() {
            r.delay = None;
        }
        for r in self.retired.iter_mut().chain(self.routes.iter_mut()) {
            let delay = r.delay.map_or(0, |d| d.delay_us);
            r.metrics.flush(
                sink,
                Some(&format!("{cluster}.route.{}", r.name)),
                |m| match m {
                    RouteMetric::HedgeDelayUs => Some(delay),
                },
            );
        }
        self.retired.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T0: u64 = 1_700_000_000_000;
    const TERMS: RecentTerms = RecentTerms {
        slices: 2,
        cluster_censored_at: None,
        armed_share: 1.0,
        budget: BudgetState {
            reserve_fill: 0.0,
            refusal_pressure: 0.0,
        },
    };

    fn geometry() -> WindowGeometry {
        WindowGeometry::new(Duration::from_secs(30))
    }

    fn policy() -> ClusterPolicy {
        ClusterPolicy {
            min_samples: 10,
            ..Default::default()
        }
    }

    #[test]
    fn lookup_is_bounded_and_refuses_what_cannot_be_a_name() {
        let mut r = Routes::default();
        assert_eq!(r.lookup(b"a", 1), Some(0));
        assert_eq!(r.lookup(b"a", 1), Some(0));
        assert_eq!(r.lookup(b"b", 1), Some(1));
        assert_eq!(r.lookup(b"c", 1), None, "two per allowed route");
        let mut r = Routes::default();
        assert_eq!(r.lookup(b"", 8), None);
        assert_eq!(r.lookup(&[0xff, 0xfe], 8), None);
        assert_eq!(r.lookup(&[b'x'; MAX_ROUTE_NAME + 1], 8), None);
        assert_eq!(r.lookup(b"ok", 0), None, "max_routes 0 learns none");
    }

    /// A full table of names no request named for five minutes: a new
    /// route takes an idle one's slot, learns, and the idle one's gauge is
    /// set to 0 once.
    /// The clock set back a day: routes seen in the old time are idle
    /// `ROUTE_IDLE_MS` after the step, not a day after it.
    #[test]
    fn routes_seen_before_the_clock_was_set_back_go_idle_in_time() {
        let mut r = Routes::default();
        let shared = Vec::new();
        r.refresh(&shared, T0, &policy(), TERMS, |d| d);
        r.lookup(b"a", 1).unwrap();
        r.lookup(b"b", 1).unwrap();
        assert_eq!(r.lookup(b"c", 1), None, "full");
        let back = T0 - 86_400_000;
        r.refresh(&shared, back, &policy(), TERMS, |d| d);
        r.refresh(&shared, back + ROUTE_IDLE_MS, &policy(), TERMS, |d| d);
        assert!(r.lookup(b"c", 1).is_some());
    }

    #[test]
    fn a_new_route_takes_the_slot_of_one_idle_for_minutes() {
        use crate::telemetry::memory::Stats;
        let mut r = Routes::default();
        let mut shared = Vec::new();
        r.refresh(&shared, T0, &policy(), TERMS, |d| d);
        let old = r.lookup(b"old", 1).unwrap();
        let busy = r.lookup(b"busy", 1).unwrap();
        for _ in 0..20 {
            r.add_sample(old, 1000.0);
        }
        r.merge_into(&mut shared, T0, 1, geometry());
        r.refresh(&shared, T0, &policy(), TERMS, |d| d);
        let mut stats = Stats::default();
        r.flush_metrics(&mut stats, "c");
        assert!(
            stats
                .get("adaptive_hedge.route_hedge_delay_microseconds.c.route.old")
                .unwrap()
                > 0
        );
        assert_eq!(r.lookup(b"new", 1), None, "full");
        // four minutes on, busy still named: nothing idle long enough
        r.refresh(&shared, T0 + 240_000, &policy(), TERMS, |d| d);
        r.lookup(b"busy", 1);
        assert_eq!(r.lookup(b"new", 1), None);
        let later = T0 + ROUTE_IDLE_MS;
        r.refresh(&shared, later, &policy(), TERMS, |d| d);
        let new = r.lookup(b"new", 1);
        assert_eq!(new, Some(old), "old's slot, not busy's");
        assert_eq!(r.lookup(b"busy", 1), Some(busy));
        r.flush_metrics(&mut stats, "c");
        assert_eq!(
            stats.get("adaptive_hedge.route_hedge_delay_microseconds.c.route.old"),
            Some(0)
        );
        assert_eq!(
            stats.get("adaptive_hedge.route_hedge_delay_microseconds.c.route.new"),
            Some(0)
        );
    }

    #[test]
    fn a_route_learns_its_own_delay_once_it_has_enough_samples() {
        let mut r = Routes::default();
        let fast = r.lookup(b"lookup", 8).unwrap();
        let slow = r.lookup(b"search", 8).unwrap();
        for i in 0..100 {
            r.add_sample(fast, 1000.0 + f64::from(i));
        }
        for i in 0..5 {
            r.add_sample(slow, 50_000.0 + f64::from(i));
        }
        let mut shared = Vec::new();
        r.merge_into(&mut shared, T0, 8, geometry());
        r.refresh(&shared, T0, &policy(), TERMS, |d| d);
        let fast_delay = r.delay(fast).unwrap().delay_us;
        assert!((1000..1200).contains(&fast_delay), "{fast_delay}");
        assert_eq!(r.delay(slow), None, "5 samples < min_samples 10");
        assert_eq!(shared.len(), 2);
        assert_eq!(shared[1].window.snapshot(T0).count(), 5);
    }

    #[test]
    fn the_table_is_first_come_and_a_forgotten_route_gives_its_slot_up() {
        let mut a = Routes::default();
        let one = a.lookup(b"one", 1).unwrap();
        a.add_sample(one, 1000.0);
        let mut shared = Vec::new();
        a.merge_into(&mut shared, T0, 1, geometry());
        let mut b = Routes::default();
        let two = b.lookup(b"two", 1).unwrap();
        b.add_sample(two, 1000.0);
        b.merge_into(&mut shared, T0, 1, geometry());
        assert_eq!(shared.len(), 1);
        assert_eq!(shared[0].name, "one", "full: two waits");
        b.refresh(&shared, T0, &policy(), TERMS, |d| d);
        assert_eq!(b.delay(two), None);
        // hours later "one" is forgotten: its window is empty and its long
        // horizon halved to nothing
        let later = T0 + 10 * 3_600_000;
        b.add_sample(two, 1000.0);
        b.merge_into(&mut shared, later, 1, geometry());
        assert_eq!(shared[0].name, "two");
        // a config that allows fewer routes drops the last ones once idle,
        // not those another configuration sharing the value still learns
        let mut busy = SharedRoute::new("four".into(), geometry());
        let mut sample = Sketch::new();
        sample.add(1000.0);
        busy.window.merge(later, &sample);
        shared.push(SharedRoute::new("three".into(), geometry()));
        shared.push(busy);
        Routes::default().merge_into(&mut shared, later, 1, geometry());
        let names: Vec<&str> = shared.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["two", "four"]);
        // and the smaller configuration does not learn "four" itself: past
        // its limit, its samples stay in the cluster's window only
        let mut small = Routes::default();
        let four = small.lookup(b"four", 1).unwrap();
        small.add_sample(four, 1000.0);
        let before = shared[1].window.snapshot(later).count();
        small.merge_into(&mut shared, later, 1, geometry());
        assert_eq!(shared[1].window.snapshot(later).count(), before);
        // nor does it take a forgotten slot for it: one entry a name
        let much_later = later + 10 * 3_600_000;
        shared[1].window.merge(much_later, &sample); // the larger one's
        small.add_sample(four, 1000.0);
        small.merge_into(&mut shared, much_later, 1, geometry());
        let names: Vec<&str> = shared.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["two", "four"]);
    }
}
