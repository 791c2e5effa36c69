//! Armed requests past their delay, per worker and cluster: how many per-try
//! timeouts the router has fired and not yet seen end.
//!
//! Why: when a hedge's per-try timeout fires, Envoy's router reports it to
//! outlier detection at once (router `onSoftPerTryTimeout`), even though the
//! attempt goes on and may well answer 200. Armed requests make that report
//! a 204, no failure, unless the cluster sets
//! `split_external_local_origin_errors` (`headers::TIMEOUT_ALT_RESPONSE`); with
//! the split it is a local-origin failure, and
//! `consecutive_local_origin_failure` (5 by default, 10 in the shipped
//! manifests) ejects a host after that many in a row with no new stream to
//! it between. In steady traffic a host gets new streams between its
//! timeouts and nothing happens; but when the whole cluster slows at once
//! (a brownout), every armed request outlives the delay learned before it,
//! and a worker that keeps arming, while host choice sends some host
//! nothing, can put that many timeouts in a row there. Before the 204
//! (every timeout a 504 without the split): measured through Envoy 1.40,
//! all three hosts of a cluster ejected by hedging alone at
//! `consecutive_5xx: 5`, none without the filter.
//!
//! So a worker keeps, per host, the per-try timeouts it has seen fire there
//! since it last saw the host answer and the attempts it has armed there
//! that have not fired yet, and holds hosts back from armed requests
//! (`held_back`):
//!
//! - steady, while the share of recent armed requests whose primary fired
//!   is near what the delay plans: a timeout is a straggler's and the host
//!   answers other requests within milliseconds, so only a host with
//!   `STEADY_TIMEOUTS_PER_HOST` (two) standing is held back;
//! - stale, once that share passes three times the planned one (a
//!   brownout): every pending attempt will fire too, so a host with any
//!   timeout standing or attempt pending is held back.
//!
//! And since, with local-origin errors split, only a new stream to a host
//! resets outlier detection's count, once the delay is stale a host whose
//! armed attempts fired since this worker last started one there, and
//! that has not answered since, gets the worker's next request, unarmed
//! (`Hosts::needs_fresh_attempt`): host choice may otherwise send it
//! nothing while they fire (held back, or the worst of the draw).
//!
//! Measured through Envoy (tests/e2e/mesh.rs, three hosts 10x slower at once):
//! with the split and 10 local-origin failures in a row (the shipped
//! manifests) no host ejected; before the 204, at outlier detection's
//! defaults, 0-3 per run with this pacing (the attempts armed before the
//! delay is seen stale all fire, 30-45 ms into the brownout), 3 of 3
//! without it. The steady cost is within noise (design.md, "Outlier
//! detection", with the variants that failed).

use std::collections::{BTreeMap, BTreeSet};

use super::hosts::{HostId, HostPick, Hosts, HOST_IDS};

/// In steady traffic: per-try timeouts a worker may leave standing on one
/// host (fired since the host last answered) before it sends that host no
/// armed attempt. Two per worker: two workers leave at most four, below
/// the default five in a row of outlier detection's counts; stragglers'
/// timeouts are cleared by the host's next answer, milliseconds later, so
/// this rarely binds.
pub const STEADY_TIMEOUTS_PER_HOST: u32 = 2;

/// Without host choice: armed requests of one worker to one cluster with
/// a timeout fired, before new requests are not armed.
pub const MAX_PAST_DELAY: usize = 2;

/// A request this far past its deadline is dropped on the tick: it ended
/// without being settled (a stream the filter never saw end), or has run
/// so long that the count it set in outlier detection is long gone.
const FORGET_AFTER_NS: u64 = 30_000_000_000;

/// An armed request in flight.
#[derive(Clone, Copy, Debug)]
struct Armed {
    /// When the primary's per-try timeout fires (ns).
    deadline_ns: u64,
    per_try_ns: u64,
    /// The hosts named, if the filter chose them.
    pick: Option<HostPick>,
    /// Timeouts counted so far: the primary's, then the hedge's.
    fired: u8,
    /// The reading it belongs to (see `ArmedRequests::new_reading`).
    reading: u32,
    /// Its place in arming order: `fire` counts the timeouts one call
    /// finds due in this order (see there).
    seq: u64,
}

impl Armed {
    /// When it was armed (ns): its deadline less its per-try timeout.
    fn armed_ns(&self) -> u64 {
        self.deadline_ns.saturating_sub(self.per_try_ns)
    }

    /// The timeouts due by `now_ns`: the primary's at the deadline, the
    /// hedge's one per-try timeout later.
    fn due(&self, now_ns: u64) -> u8 {
        if now_ns < self.deadline_ns {
            0
        } else if now_ns < self.deadline_ns.saturating_add(self.per_try_ns)
            || self.hedge().is_none()
        {
            1
        } else {
            2
        }
    }

    fn hedge(&self) -> Option<usize> {
        self.pick.and_then(|p| p.hedge)
    }

    /// When its next timeout is due (ns), if one is still to come: what
    /// `due` says, for the timeouts not counted yet.
    fn next_due(&self) -> Option<u64> {
        match self.fired {
            0 => Some(self.deadline_ns),
            1 if self.hedge().is_some() => Some(self.deadline_ns.saturating_add(self.per_try_ns)),
            _ => None,
        }
    }

    /// The hosts of its attempts whose timeout has not fired: the
    /// primary's until the first, the hedge's until the second
    /// (`pending_on`).
    fn pending_hosts(&self) -> [Option<HostId>; 2] {
        let primary = self.pick.map(|p| p.primary).filter(|_| self.fired == 0);
        let hedge = self.hedge().filter(|_| self.fired < 2);
        [primary, hedge]
    }

    /// Counts the timeouts from `fired` up to `due` on their hosts; true if
    /// the primary's is among them. The primary's timeout starts the
    /// hedge's attempt on its host.
    fn count(&mut self, due: u8, hosts: &mut Hosts) -> bool {
        let primary_fires = self.fired == 0 && due > 0;
        while self.fired < due {
            if self.fired == 0 {
                if let Some(p) = self.pick {
                    hosts.timed_out(p.primary, self.deadline_ns);
                }
                if let Some(hedge) = self.hedge() {
                    hosts.attempt_started(hedge, self.deadline_ns);
                }
            } else if let Some(hedge) = self.hedge() {
                hosts.timed_out(hedge, self.deadline_ns.saturating_add(self.per_try_ns));
            }
            self.fired += 1;
        }
        primary_fires
    }
}

/// When an armed request ended, as far as the worker knows.
#[derive(Clone, Copy, Debug)]
pub enum Ended {
    /// At this time (ns, the host's clock).
    At(u64),
    /// This long (µs) after it started.
    After(u64),
    /// Not timed.
    Untimed,
}

/// A worker's armed requests to one cluster that have not ended.
///
/// Why indexed rather than a list: every tracked request reads them
/// (`fire`), and there are as many as the worker arms in a response's
/// time (at 10k requests a second and 300 ms, some 3,000), plus those
/// whose end it never saw, for up to `FORGET_AFTER_NS`. A list walked
/// whole by `fire`, `armed` and `ended` cost each request three passes
/// over it (found by a review: natively, 10k calls of `fire` took 8 ms
/// with 100 requests armed, 805 ms with 10,000). Each call now looks at
/// the requests it changes, and finds them in O(log n).
#[derive(Debug)]
pub struct ArmedRequests {
    /// By deadline, each under its own (see `armed`): `ended` finds its
    /// request by it.
    armed: BTreeMap<u64, Armed>,
    /// Each request's next timeout to come, (when, deadline): `fire` takes
    /// the due ones from the front.
    next: BTreeSet<(u64, u64)>,
    /// The deadlines of the requests with a timeout fired: `fire`'s count.
    fired: BTreeSet<u64>,
    /// Attempts whose timeout has not fired, per host id (`pending_on`).
    pending: Vec<u32>,
    /// The next request's place in arming order (`Armed::seq`).
    next_seq: u64,
    /// `fire`'s requests with a timeout due, kept to reuse its room.
    due: Vec<(u64, u64)>,
    /// Requests looked at (tests: what each call costs).
    #[cfg(test)]
    touched: u64,
    /// Share of recent armed requests whose primary timed out (an EWMA):
    /// about the share the delay plans to let through in steady traffic
    /// (8% with the defaults), near 1 when the delay is stale.
    fire_rate: f64,
    /// Past this `fire_rate` the delay is stale.
    stale_above: f64,
    /// Primaries fired since an armed request last ended before its
    /// deadline (see `stale`).
    fires_in_a_row: u32,
    /// When the first and the last of those were armed (ns), and the
    /// per-try timeout of the last one counted (see `clearly_stale`).
    run_armed_ns: Option<(u64, u64)>,
    run_per_try_ns: u64,
    /// Requests armed since `counted_since_ns`, and the rate they came at
    /// over the last whole second counted (per ns; see `clearly_stale`).
    counted: u64,
    counted_since_ns: Option<u64>,
    armed_per_ns: Option<f64>,
    planned: f64,
    /// Outcomes count only for requests armed since the last `new_reading`.
    reading: u32,
}

/// Weight of each armed request in `fire_rate`: with the defaults, three
/// timeouts in a row take it from the planned 6% past `stale_above` (25%:
/// 6% -> 15% -> 24% -> 31%): one armed request in 16 or so fires in steady
/// traffic, runs of three are rare and the next in time brings the rate
/// back under; a brownout is taken as such from its third timeout.
const FIRE_RATE_WEIGHT: f64 = 0.1;

/// The delay is stale (a brownout) when the recent fire rate is past three
/// times what the delay plans, and at least this (the default delay, the
/// p94, plans 6%)...
const STALE_MIN: f64 = 0.25;
/// ... and only while the latest armed requests all fired, at least this
/// many in a row. Why: in a brownout no armed request ends before its
/// deadline, while in steady traffic at a high rate a run of fires that lifts
/// the rate past the mark (two or three stragglers in a row) is followed
/// within a millisecond by requests that end in time. Without it the rate
/// stayed past the mark for several clean ends after such a run, and the
/// stale rule (no armed attempt to a host with one pending) held back 8% to
/// 13% of the requests of a 1,700 req/s workload with 8% stragglers: their
/// stragglers went unhedged and its p99 was 4 times the best fixed delay's
/// (virtual time, `BENCH_TRACE=89`).
const STALE_FIRES_IN_A_ROW: u32 = 2;
/// A delay is clearly stale past this fire rate with this many fires in a
/// row: from the planned 6% (the p94), six fires in a row and nothing
/// ending in time (a brownout's first milliseconds). In steady traffic,
/// with 6% of armed requests firing, six in a row come about once in
/// twenty million.
const CLEARLY_STALE: f64 = 0.5;
const CLEARLY_STALE_IN_A_ROW: u32 = 6;
/// ... and at most this: a route hedging at its p50 is stale only once
/// nearly every armed request fires.
const STALE_MAX: f64 = 0.9;
/// The arming rate is counted over this long (see `clearly_stale`).
const RATE_SPAN_NS: u64 = 1_000_000_000;

/// The span from the earlier start to the later end of both.
fn widen(span: Option<(u64, u64)>, with: (u64, u64)) -> (u64, u64) {
    span.map_or(with, |(first, last)| (first.min(with.0), last.max(with.1)))
}

/// As the default policy plans: its delay is the p94.
impl Default for ArmedRequests {
    fn default() -> Self {
        ArmedRequests::new(0.06)
    }
}

impl ArmedRequests {
    /// `planned_fire_share`: the share of armed requests the delay plans to
    /// outlive it (1 - the quantile it is taken at).
    pub fn new(planned_fire_share: f64) -> Self {
        let planned = planned_fire_share.clamp(0.0, 1.0);
        ArmedRequests {
            armed: BTreeMap::new(),
            next: BTreeSet::new(),
            fired: BTreeSet::new(),
            pending: Vec::new(),
            next_seq: 0,
            due: Vec::new(),
            #[cfg(test)]
            touched: 0,
            fire_rate: planned,
            stale_above: (3.0 * planned).clamp(STALE_MIN, STALE_MAX),
            fires_in_a_row: 0,
            run_armed_ns: None,
            run_per_try_ns: 0,
            counted: 0,
            counted_since_ns: None,
            armed_per_ns: None,
            planned,
            reading: 0,
        }
    }

    /// The policy changed (a route's overrides, over xDS): the share of
    /// armed requests planned to fire, and what reads as stale, follow it;
    /// the reading starts again from the new plan.
    pub fn replan(&mut self, planned_fire_share: f64) {
        let planned = planned_fire_share.clamp(0.0, 1.0);
        self.planned = planned;
        self.stale_above = (3.0 * planned).clamp(STALE_MIN, STALE_MAX);
        self.new_reading();
    }

    /// The delay was found stale and the worker stopped arming with it:
    /// what the requests armed before do from now on says nothing of the
    /// delay the next ones get; the reading starts again from the plan.
    pub fn new_reading(&mut self) {
        self.reading = self.reading.wrapping_add(1);
        self.fire_rate = self.planned;
        self.end_run();
    }

    fn end_run(&mut self) {
        self.fires_in_a_row = 0;
        self.run_armed_ns = None;
    }

    /// A request was armed: its primary's per-try timeout fires at
    /// `deadline_ns`, its hedge's `per_try_ns` later, on the hosts `pick`
    /// names (if the filter chose them).
    ///
    /// Returns the deadline it is kept under, the key `ended` finds it by:
    /// the one asked for, or a nanosecond or two later if another request
    /// is kept under that one (two requests armed in the same nanosecond
    /// with the same delay), so that each request's end finds its own
    /// hosts, not the other's.
    pub fn armed(&mut self, deadline_ns: u64, per_try_ns: u64, pick: Option<HostPick>) -> u64 {
        // the first deadline from the one asked for that no request is
        // kept under: the keys from it, as far as they run without a gap
        let mut key = Some(deadline_ns);
        let mut looked = 0;
        for &taken in self.armed.range(deadline_ns..).map(|(k, _)| k) {
            looked += 1;
            if Some(taken) != key {
                break;
            }
            key = taken.checked_add(1);
        }
        self.touch(looked);
        // every key up to the clock's end taken: not kept, as no end could
        // find it
        let Some(key) = key else {
            return deadline_ns;
        };
        let armed = Armed {
            deadline_ns: key,
            per_try_ns,
            pick,
            fired: 0,
            reading: self.reading,
            seq: self.next_seq,
        };
        self.next_seq = self.next_seq.wrapping_add(1);
        self.count_arming(armed.armed_ns());
        self.next.insert((key, key));
        add_pending(&mut self.pending, &armed, true);
        self.armed.insert(key, armed);
        key
    }

    /// Drops what the indexes hold of `a`, just taken out of `armed`.
    fn unlink(&mut self, a: &Armed) {
        if let Some(at) = a.next_due() {
            self.next.remove(&(at, a.deadline_ns));
        }
        if a.fired > 0 {
            self.fired.remove(&a.deadline_ns);
        }
        add_pending(&mut self.pending, a, false);
    }

    #[cfg(test)]
    fn touch(&mut self, n: usize) {
        self.touched = self.touched.saturating_add(n as u64);
    }

    #[cfg(not(test))]
    fn touch(&mut self, _: usize) {}

    /// The arming rate: requests armed per ns over the last whole second
    /// counted (`clearly_stale` reads it), `at` the time one was armed.
    fn count_arming(&mut self, at: u64) {
        let since = *self.counted_since_ns.get_or_insert(at);
        self.counted += 1;
        if at < since || at - since > 2 * RATE_SPAN_NS {
            // the clock stepped back, or nothing was armed for a while (a
            // latch, a quiet spell): a new count, the last rate kept
            self.counted = 1;
            self.counted_since_ns = Some(at);
        } else if at - since >= RATE_SPAN_NS {
            self.armed_per_ns = Some(self.counted as f64 / (at - since) as f64);
            self.counted = 0;
            self.counted_since_ns = Some(at);
        }
    }

    /// Counts the timeouts due by `now_ns` on their hosts; returns the
    /// requests with a timeout fired (past their deadline at `now_ns`).
    ///
    /// Per request: it takes the timeouts due from the front of `next`,
    /// nothing else. Those one call finds are counted in arming order, as
    /// the list this replaced was walked (a host's timeouts and attempts
    /// depend on the order they are told in: `Hosts::attempt_started`).
    pub fn fire(&mut self, now_ns: u64, hosts: &mut Hosts) -> usize {
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        while let Some(&(at, deadline)) = self.next.first() {
            if at > now_ns {
                break;
            }
            self.next.remove(&(at, deadline));
            if let Some(a) = self.armed.get(&deadline) {
                due.push((a.seq, deadline));
            }
        }
        due.sort_unstable();
        self.touch(due.len());
        // the fires' count, when the first and last were armed, the last's
        // per-try timeout: no list per request
        let mut fires: u32 = 0;
        let mut armed_ns: Option<(u64, u64)> = None;
        let mut per_try_ns = 0;
        let reading = self.reading;
        for &(_, deadline) in &due {
            let Some(a) = self.armed.get_mut(&deadline) else {
                continue;
            };
            let fired_before = a.fired;
            add_pending(&mut self.pending, a, false);
            let primary_fires = a.count(a.due(now_ns), hosts);
            add_pending(&mut self.pending, a, true);
            if fired_before == 0 {
                self.fired.insert(deadline);
            }
            if let Some(at) = a.next_due() {
                self.next.insert((at, deadline));
            }
            if primary_fires && a.reading == reading {
                fires += 1;
                let at = a.armed_ns();
                armed_ns = Some(widen(armed_ns, (at, at)));
                per_try_ns = a.per_try_ns;
            }
        }
        self.due = due;
        // Every request with its deadline by now has fired (its primary's
        // timeout was due), and none fired has a later one unless the
        // clock stepped back since: those are not past it now, and are
        // counted one by one (the requests in flight when it stepped,
        // until they end or the clock passes them again).
        let mut past = self.fired.len();
        if self.fired.last().is_some_and(|&last| last > now_ns) {
            let ahead = self.fired.range(now_ns.saturating_add(1)..).count();
            self.touch(ahead);
            past = past.saturating_sub(ahead);
        }
        if let Some(span) = armed_ns {
            for _ in 0..fires {
                self.step_fire_rate(true);
            }
            self.extend_run(fires, span, per_try_ns);
        }
        past
    }

    /// An armed request's primary fired, or ended without firing.
    fn observe(&mut self, fired: bool, a: &Armed) {
        self.step_fire_rate(fired);
        if fired {
            let at = a.armed_ns();
            self.extend_run(1, (at, at), a.per_try_ns);
        } else {
            self.end_run();
        }
    }

    fn step_fire_rate(&mut self, fired: bool) {
        let x = if fired { 1.0 } else { 0.0 };
        self.fire_rate += FIRE_RATE_WEIGHT * (x - self.fire_rate);
    }

    /// `fires` more primaries fired, armed from `span.0` to `span.1`.
    fn extend_run(&mut self, fires: u32, span: (u64, u64), per_try_ns: u64) {
        self.fires_in_a_row = self.fires_in_a_row.saturating_add(fires);
        self.run_armed_ns = Some(widen(self.run_armed_ns, span));
        self.run_per_try_ns = per_try_ns;
    }

    /// The request armed with `deadline_ns` ended (`ended`) after
    /// `attempts` (if known): the timeouts it fired and that were not
    /// counted yet are, then it is forgotten. Untimed, a second attempt is
    /// taken as the primary's timeout having fired; timed, an answer before
    /// the deadline was a retry after a fast failure, not a timeout
    /// (outlier detection sees that failure whatever the filter does, and
    /// a 503 storm must not read as a stale delay).
    pub fn ended(
        &mut self,
        deadline_ns: u64,
        attempts: Option<u64>,
        ended: Ended,
        hosts: &mut Hosts,
    ) {
        let Some(mut a) = self.armed.remove(&deadline_ns) else {
            return;
        };
        self.touch(1);
        self.unlink(&a);
        let started = a.deadline_ns.saturating_sub(a.per_try_ns);
        let due = match ended {
            Ended::At(at_ns) => a.due(at_ns),
            Ended::After(us) => a.due(started.saturating_add(us.saturating_mul(1000))),
            Ended::Untimed => u8::from(attempts.is_some_and(|n| n >= 2)),
        };
        let never_fired = a.fired == 0;
        let fires_now = a.count(due, hosts);
        if (fires_now || never_fired) && a.reading == self.reading {
            self.observe(fires_now, &a);
        }
    }

    /// Whether the delay is stale: recent armed requests' primaries fire
    /// far more often than the delay plans (a brownout).
    pub fn stale(&self) -> bool {
        self.fire_rate > self.stale_above && self.fires_in_a_row >= STALE_FIRES_IN_A_ROW
    }

    /// Whether the delay is stale beyond doubt: most recent armed requests'
    /// primaries fired, the latest `CLEARLY_STALE_IN_A_ROW` of them in a
    /// row, none ending in time between, and they were not armed all at
    /// once (the worker then stops arming the cluster: `StaleLatch`).
    ///
    /// Why the last: requests that arrive together (a front end's fan-out
    /// of 50 or 100 calls) have their deadlines together, so the few of
    /// such a burst that outlive the delay (its stragglers, the end of the
    /// hosts' queues) fire in one go, after the burst's others ended in
    /// time: six or more in a row, and the next burst went unarmed. So
    /// the run must have been armed no faster than twice the worker's
    /// arming rate of the last second counted (or over one delay, if that
    /// is less): a brownout's requests come as the traffic does. Before
    /// the first second is counted the run's pace is not judged. Requiring
    /// a whole delay cost the generated full outages (more requests armed
    /// before the latch, their hedges spent): p99 ratio 1.80 -> 2.03 on
    /// one draw.
    pub fn clearly_stale(&self) -> bool {
        if self.fire_rate <= CLEARLY_STALE.max(self.stale_above)
            || self.fires_in_a_row < CLEARLY_STALE_IN_A_ROW
        {
            return false;
        }
        let span = self
            .run_armed_ns
            .map_or(0, |(first, last)| last.saturating_sub(first));
        let least = self.armed_per_ns.map_or(0, |rate| {
            let gaps = f64::from(self.fires_in_a_row.saturating_sub(1));
            (0.5 * gaps / rate.max(f64::MIN_POSITIVE)).min(u64::MAX as f64) as u64
        });
        span >= least.min(self.run_per_try_ns)
    }

    /// Whether host `id`, with `standing` timeouts fired since it last
    /// answered, takes no armed attempt now. Steady: at
    /// `STEADY_TIMEOUTS_PER_HOST` standing. Stale delay: every attempt
    /// pending there will fire too, so a host with any timeout standing or
    /// any attempt pending is held back (one timeout at a time per host
    /// and worker).
    pub fn held_back(&self, id: usize, standing: u32) -> bool {
        if self.stale() {
            standing.saturating_add(self.pending_on(id)) >= 1
        } else {
            standing >= STEADY_TIMEOUTS_PER_HOST
        }
    }

    /// Attempts on host `id` whose per-try timeout has not fired yet.
    pub fn pending_on(&self, id: usize) -> u32 {
        self.pending.get(id).copied().unwrap_or(0)
    }

    /// Forgets the requests `FORGET_AFTER_NS` past their deadline: the
    /// first ones by deadline.
    pub fn forget_stale(&mut self, now_ns: u64) {
        while let Some((&deadline, _)) = self.armed.first_key_value() {
            if deadline.saturating_add(FORGET_AFTER_NS) > now_ns {
                break;
            }
            if let Some(a) = self.armed.remove(&deadline) {
                self.touch(1);
                self.unlink(&a);
            }
        }
    }
}

/// Adds (or, not `add`, takes away) the attempts `a` has pending on hosts
/// to their counts. Host ids past `HOST_IDS` are never given out
/// (`Hosts::find_or_add`): none is counted, nor room made for it.
fn add_pending(pending: &mut Vec<u32>, a: &Armed, add: bool) {
    for id in a.pending_hosts().into_iter().flatten() {
        if id >= pending.len() && id < HOST_IDS {
            pending.resize(id + 1, 0);
        }
        if let Some(n) = pending.get_mut(id) {
            *n = if add {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn three_hosts() -> Hosts {
        let mut hosts = Hosts::default();
        for a in ["a:1", "b:1", "c:1"] {
            hosts.find_or_add(a.as_bytes());
        }
        hosts
    }

    fn pick(primary: usize, hedge: usize) -> Option<HostPick> {
        Some(HostPick {
            primary,
            hedge: Some(hedge),
        })
    }

    #[test]
    fn timeouts_are_counted_on_their_hosts_when_due() {
        let mut hosts = three_hosts();
        let mut armed = ArmedRequests::default();
        armed.armed(10 * MS, 10 * MS, pick(0, 1));
        armed.armed(12 * MS, 10 * MS, pick(0, 2));
        assert_eq!(armed.fire(9 * MS, &mut hosts), 0);
        assert_eq!((armed.pending_on(0), armed.pending_on(1)), (2, 1));
        assert_eq!(armed.fire(12 * MS, &mut hosts), 2);
        assert_eq!((armed.pending_on(0), armed.pending_on(1)), (0, 1));
        assert_eq!(hosts.timeouts_unanswered(0), 2);
        assert_eq!(hosts.timeouts_unanswered(1), 0);
        // the first one's hedge is timed out too at 20 ms; counted once
        armed.fire(20 * MS, &mut hosts);
        armed.fire(21 * MS, &mut hosts);
        assert_eq!(hosts.timeouts_unanswered(1), 1);
        // an answer of host 0 resets its count
        hosts.answered_upstream(0);
        assert_eq!(hosts.timeouts_unanswered(0), 0);
        // ending counts what fired since the last look: the second's hedge
        armed.ended(12 * MS, Some(2), Ended::After(25_000), &mut hosts);
        assert_eq!(hosts.timeouts_unanswered(2), 1);
        assert_eq!(
            hosts.timeouts_unanswered(0),
            0,
            "its primary was counted before"
        );
        armed.ended(10 * MS, Some(2), Ended::Untimed, &mut hosts);
        assert!(armed.armed.is_empty());
    }

    /// Two requests armed in the same nanosecond with the same delay: each
    /// one's end counts its own hosts (found by deadline alone, the second
    /// one's end took the first one's entry and blamed its host).
    #[test]
    fn two_requests_with_one_deadline_end_each_on_its_own_hosts() {
        let mut hosts = three_hosts();
        let mut armed = ArmedRequests::default();
        let first = armed.armed(10 * MS, 10 * MS, pick(0, 1));
        let second = armed.armed(10 * MS, 10 * MS, pick(2, 1));
        let third = armed.armed(10 * MS, 10 * MS, pick(1, 2));
        assert!(first != second && second != third && first != third);
        armed.ended(third, Some(1), Ended::After(4_000), &mut hosts);
        armed.ended(second, Some(2), Ended::Untimed, &mut hosts);
        assert_eq!(hosts.timeouts_unanswered(2), 1, "its primary fired");
        assert_eq!(hosts.timeouts_unanswered(0), 0);
        assert_eq!(armed.pending_on(0), 1, "the first is still armed");
        armed.ended(first, Some(1), Ended::After(4_000), &mut hosts);
        assert!(armed.armed.is_empty());
    }

    /// Hosts chosen by score (measured, in the shared value).
    fn three_known_hosts() -> Hosts {
        let mut hosts = three_hosts();
        for id in 0..3 {
            for _ in 0..20 {
                hosts.observe(id, 1000.0);
            }
        }
        let mut shared = Vec::new();
        hosts.merge_into(&mut shared, 1_000, None);
        hosts.refresh(&shared, None);
        hosts
    }

    #[test]
    fn a_hedge_starting_on_its_host_resets_the_timeouts_since_an_attempt_there() {
        let mut hosts = three_known_hosts();
        let mut armed = ArmedRequests::default();
        armed.armed(10 * MS, 10 * MS, pick(0, 1));
        hosts.timed_out(1, 5 * MS);
        assert_eq!(hosts.needs_fresh_attempt(true), Some(1));
        // the primary fires at 10 ms on host 0 and starts the hedge on 1
        armed.fire(10 * MS, &mut hosts);
        assert_eq!(hosts.needs_fresh_attempt(true), Some(0));
        hosts.attempt_started(0, 11 * MS);
        assert_eq!(hosts.needs_fresh_attempt(true), None);
        // then the hedge's own fires
        armed.fire(20 * MS, &mut hosts);
        assert_eq!(hosts.needs_fresh_attempt(true), Some(1));
        assert_eq!(hosts.timeouts_unanswered(1), 2, "without the split");
    }

    #[test]
    fn a_request_that_ends_before_its_deadline_counts_nothing_and_stale_ones_go() {
        let mut hosts = three_hosts();
        let mut armed = ArmedRequests::default();
        armed.armed(10 * MS, 10 * MS, pick(0, 1));
        armed.ended(10 * MS, Some(1), Ended::After(4_000), &mut hosts);
        assert_eq!(hosts.timeouts_unanswered(0), 0);
        // not timed, but a second attempt: the primary's fired
        armed.armed(10 * MS, 10 * MS, pick(0, 1));
        armed.ended(10 * MS, Some(2), Ended::Untimed, &mut hosts);
        assert_eq!(hosts.timeouts_unanswered(0), 1);
        armed.armed(10 * MS, 10 * MS, None);
        armed.forget_stale(10 * MS + FORGET_AFTER_NS);
        assert_eq!(armed.armed.len(), 0);
    }

    #[test]
    fn a_stale_delay_holds_back_hosts_with_any_timeout_standing_or_pending() {
        let mut hosts = three_hosts();
        let mut armed = ArmedRequests::default();
        armed.armed(10 * MS, 10 * MS, pick(0, 1));
        // steady: a pending attempt and one timeout standing are fine
        assert!(!armed.stale());
        assert!(!armed.held_back(0, 0));
        assert!(!armed.held_back(0, 1));
        assert!(armed.held_back(0, STEADY_TIMEOUTS_PER_HOST));
        // primaries fire one after another: the delay is stale
        for i in 0..3 {
            armed.armed((20 + i) * MS, 10 * MS, pick(2, 1));
        }
        armed.fire(23 * MS, &mut hosts);
        assert!(armed.stale());
        assert!(armed.held_back(1, 0), "hedges pending on host 1");
        assert!(armed.held_back(2, 1), "a timeout standing on host 2");
        // host 0: its primary fired at 10 ms and its hedge will at 20 ms
        armed.ended(10 * MS, Some(2), Ended::After(12_000), &mut hosts);
        assert!(!armed.held_back(0, 0));
        // steady again after enough armed requests end in time
        for i in 0..12 {
            armed.armed((100 + i) * MS, 10 * MS, pick(0, 1));
            armed.ended((100 + i) * MS, Some(1), Ended::After(3_000), &mut hosts);
        }
        assert!(!armed.stale());
    }

    /// Three stragglers in a row lift the fire rate past the mark; the next
    /// request that ends in time (in steady traffic, a millisecond later)
    /// ends the stale reading, though the rate is still past it. A brownout
    /// (nothing ends in time) is stale from its third fire.
    #[test]
    fn a_run_of_stragglers_is_stale_only_until_a_request_ends_in_time() {
        let mut hosts = three_hosts();
        let mut armed = ArmedRequests::default();
        let mut t = 0u64;
        let mut one = |armed: &mut ArmedRequests, fires: bool| {
            t += 1;
            armed.armed(t * MS, MS, pick(0, 1));
            let (attempts, us) = if fires { (2, 5_000) } else { (1, 500) };
            armed.ended(t * MS, Some(attempts), Ended::After(us), &mut hosts);
        };
        for _ in 0..2 {
            one(&mut armed, true);
        }
        assert!(!armed.stale(), "two fires from the planned 6%");
        one(&mut armed, true);
        assert!(armed.stale(), "three fires in a row");
        one(&mut armed, false);
        assert!(armed.fire_rate > armed.stale_above, "{}", armed.fire_rate);
        assert!(!armed.stale(), "one ended in time");
        one(&mut armed, true);
        assert!(!armed.stale(), "a single fire");
        one(&mut armed, true);
        assert!(armed.stale(), "two in a row, the rate still high");
    }

    /// Six fires in a row from the plan, armed over a delay: clearly
    /// stale. A new reading starts from the plan, and the requests armed
    /// before it (which will all fire too) no longer count.
    #[test]
    fn clearly_stale_after_a_run_of_fires_and_a_new_reading_forgets_them() {
        let mut hosts = three_hosts();
        let mut armed = ArmedRequests::default();
        // armed every 2 ms with a 10 ms delay (no rate counted yet: the
        // run's pace is not judged)
        for i in 0..12u64 {
            armed.armed((100 + 2 * i) * MS, 10 * MS, pick(0, 1));
        }
        // the first five reach their deadline: fired in a row
        armed.fire(108 * MS, &mut hosts);
        assert!(armed.stale());
        assert!(!armed.clearly_stale(), "five");
        armed.fire(110 * MS, &mut hosts);
        assert!(armed.clearly_stale(), "{}", armed.fire_rate);
        armed.new_reading();
        assert!(!armed.stale() && !armed.clearly_stale());
        // the other six fire too, and end: not counted
        armed.fire(123 * MS, &mut hosts);
        for i in 0..12u64 {
            armed.ended(
                (100 + 2 * i) * MS,
                Some(2),
                Ended::After(50_000),
                &mut hosts,
            );
        }
        assert!(!armed.stale(), "{}", armed.fire_rate);
        // one armed since fires: counted
        armed.armed(200 * MS, 10 * MS, pick(0, 1));
        armed.fire(200 * MS, &mut hosts);
        assert!(armed.fire_rate > 0.1, "{}", armed.fire_rate);
    }

    /// A front end's burst every 200 ms: 50 requests armed within a
    /// millisecond, 43 of them end in time, then the other 7 fire at once.
    /// Seven in a row, but armed together (at 250 a second seven take 24
    /// ms, and the rule wants at least half that): not a brownout, the
    /// next burst is armed. When requests armed as the traffic comes all
    /// fire, it is one.
    #[test]
    fn a_burst_whose_stragglers_fire_together_is_no_brownout() {
        let mut hosts = three_hosts();
        let mut armed = ArmedRequests::default();
        let delay = 18 * MS;
        for burst in 0..10u64 {
            let start = burst * 200 * MS;
            let deadline = |i: u64| start + delay + i * 20_000;
            for i in 0..50u64 {
                armed.armed(deadline(i), delay, pick(0, 1));
            }
            for i in 0..43u64 {
                armed.ended(deadline(i), Some(1), Ended::After(9_000), &mut hosts);
            }
            armed.fire(start + delay + MS, &mut hosts);
            assert!(armed.fires_in_a_row >= 7);
            // from the sixth, the rate of the first second is known
            if burst >= 5 {
                assert!(!armed.clearly_stale(), "burst {burst}: {}", armed.fire_rate);
            }
            for i in 43..50u64 {
                armed.ended(deadline(i), Some(2), Ended::After(40_000), &mut hosts);
            }
        }
        // one in time, then a brownout: one request every 4 ms (the
        // traffic's 250 a second), none ends in time
        let start = 2_000 * MS;
        armed.armed(start, delay, pick(0, 1));
        armed.ended(start, Some(1), Ended::After(9_000), &mut hosts);
        let mut at = start;
        while !armed.clearly_stale() {
            armed.armed(at + delay, delay, pick(0, 1));
            at += 4 * MS;
            armed.fire(at, &mut hosts);
            assert!(at < start + 4 * delay, "not taken as a brownout");
        }
        // at the sixth fire (armed over 20 ms; the rule wants 10)
        assert!(at <= start + delay + 24 * MS, "at {}", (at - start) / MS);
    }

    #[test]
    fn a_delay_planned_to_fire_often_is_not_stale_until_nearly_every_request_fires() {
        let mut hosts = three_hosts();
        // a route hedging at its p50: every other armed request fires
        let mut armed = ArmedRequests::new(0.5);
        for i in 0..400u64 {
            armed.armed(i * MS, MS, pick(0, 1));
            let latency_us = if i % 2 == 0 { 500 } else { 1_500 };
            armed.ended(
                i * MS,
                Some(1 + i % 2),
                Ended::After(latency_us),
                &mut hosts,
            );
            assert!(!armed.stale(), "stale at {i}");
        }
        // then everything fires
        let mut fires = 0;
        while !armed.stale() {
            armed.armed(1000 * MS, MS, pick(0, 1));
            armed.ended(1000 * MS, Some(2), Ended::After(5_000), &mut hosts);
            fires += 1;
            assert!(fires < 30, "not taken as a brownout");
        }
    }

    /// A route's overrides changed to hedge at its p34: what reads as
    /// stale follows the new plan (built for the p94, two armed requests
    /// of three firing read as a brownout).
    #[test]
    fn a_new_plan_moves_what_reads_as_stale() {
        let mut hosts = three_hosts();
        let run = |armed: &mut ArmedRequests, hosts: &mut Hosts| {
            for i in 0..400u64 {
                armed.armed(i * MS, MS, pick(0, 1));
                let fires = i % 3 != 0;
                let latency_us = if fires { 1_500 } else { 500 };
                let attempts = Some(1 + u64::from(fires));
                armed.ended(i * MS, attempts, Ended::After(latency_us), hosts);
                if armed.stale() {
                    return true;
                }
            }
            false
        };
        assert!(
            run(&mut ArmedRequests::new(0.06), &mut hosts),
            "the old plan"
        );
        let mut armed = ArmedRequests::new(0.06);
        armed.replan(0.66);
        assert_eq!(armed.stale_above, ArmedRequests::new(0.66).stale_above);
        assert!(!run(&mut armed, &mut hosts), "the new plan");
    }

    #[test]
    fn a_retry_after_a_fast_failure_is_no_timeout() {
        let mut hosts = three_hosts();
        let mut armed = ArmedRequests::default();
        for i in 0..20 {
            armed.armed(i * MS + 10 * MS, 10 * MS, pick(0, 1));
            // a 503, retried at once: two attempts in 2 ms
            armed.ended(i * MS + 10 * MS, Some(2), Ended::After(2_000), &mut hosts);
        }
        assert_eq!(hosts.timeouts_unanswered(0), 0);
        assert!(!armed.stale());
    }

    /// The list `ArmedRequests` was before it was indexed, walked whole by
    /// each call: what the randomized test holds the index to. The one
    /// change: an end takes its request out in place (`remove`), where the
    /// list moved its last one into the gap (`swap_remove`), so that the
    /// list stays in arming order, the order `fire` counts a call's
    /// timeouts in. Its reading (fire rate, runs, arming rate) is kept by
    /// an `ArmedRequests` whose own requests stay empty: that part did not
    /// change.
    struct Linear {
        armed: Vec<Armed>,
        reading: ArmedRequests,
        /// Requests looked at.
        looked: u64,
    }

    impl Linear {
        fn new(planned_fire_share: f64) -> Self {
            Linear {
                armed: Vec::new(),
                reading: ArmedRequests::new(planned_fire_share),
                looked: 0,
            }
        }

        /// Counts the requests a pass over the list looks at: all but
        /// those after the one it stops at.
        fn look(&mut self, stopped_at: Option<usize>) {
            let n = stopped_at.map_or(self.armed.len(), |i| i + 1);
            self.looked += n as u64;
        }

        fn armed(&mut self, deadline_ns: u64, per_try_ns: u64, pick: Option<HostPick>) -> u64 {
            let mut deadline_ns = deadline_ns;
            loop {
                let at = self.armed.iter().position(|a| a.deadline_ns == deadline_ns);
                self.look(at);
                if at.is_none() {
                    break;
                }
                deadline_ns = deadline_ns.saturating_add(1);
            }
            let armed = Armed {
                deadline_ns,
                per_try_ns,
                pick,
                fired: 0,
                reading: self.reading.reading,
                seq: 0,
            };
            self.reading.count_arming(armed.armed_ns());
            self.armed.push(armed);
            deadline_ns
        }

        fn fire(&mut self, now_ns: u64, hosts: &mut Hosts) -> usize {
            self.look(None);
            let mut past = 0;
            let mut fires: u32 = 0;
            let mut armed_ns: Option<(u64, u64)> = None;
            let mut per_try_ns = 0;
            let reading = self.reading.reading;
            for a in self.armed.iter_mut() {
                let due = a.due(now_ns);
                if a.count(due, hosts) && a.reading == reading {
                    fires += 1;
                    let at = a.armed_ns();
                    armed_ns = Some(widen(armed_ns, (at, at)));
                    per_try_ns = a.per_try_ns;
                }
                past += usize::from(due > 0);
            }
            if let Some(span) = armed_ns {
                for _ in 0..fires {
                    self.reading.step_fire_rate(true);
                }
                self.reading.extend_run(fires, span, per_try_ns);
            }
            past
        }

        fn ended(
            &mut self,
            deadline_ns: u64,
            attempts: Option<u64>,
            ended: Ended,
            hosts: &mut Hosts,
        ) {
            let at = self.armed.iter().position(|a| a.deadline_ns == deadline_ns);
            self.look(at);
            let Some(i) = at else {
                return;
            };
            let mut a = self.armed.remove(i);
            let started = a.deadline_ns.saturating_sub(a.per_try_ns);
            let due = match ended {
                Ended::At(at_ns) => a.due(at_ns),
                Ended::After(us) => a.due(started.saturating_add(us.saturating_mul(1000))),
                Ended::Untimed => u8::from(attempts.is_some_and(|n| n >= 2)),
            };
            let never_fired = a.fired == 0;
            let fires_now = a.count(due, hosts);
            if (fires_now || never_fired) && a.reading == self.reading.reading {
                self.reading.observe(fires_now, &a);
            }
        }

        fn pending_on(&self, id: usize) -> u32 {
            let on = |a: &Armed| {
                let primary = a.fired == 0 && a.pick.is_some_and(|p| p.primary == id);
                let hedge = a.fired < 2 && a.hedge() == Some(id);
                u32::from(primary) + u32::from(hedge)
            };
            self.armed.iter().map(on).sum()
        }

        fn forget_stale(&mut self, now_ns: u64) {
            self.look(None);
            self.armed
                .retain(|a| a.deadline_ns.saturating_add(FORGET_AFTER_NS) > now_ns);
        }
    }

    /// Everything a caller or the tests can read of the two, alike.
    fn assert_alike(armed: &ArmedRequests, linear: &Linear, what: &str) {
        let r = &linear.reading;
        assert_eq!(armed.armed.len(), linear.armed.len(), "{what}: requests");
        for id in 0..5 {
            assert_eq!(
                armed.pending_on(id),
                linear.pending_on(id),
                "{what}: pending on {id}"
            );
        }
        assert_eq!(armed.fire_rate.to_bits(), r.fire_rate.to_bits(), "{what}");
        assert_eq!(armed.fires_in_a_row, r.fires_in_a_row, "{what}");
        assert_eq!(armed.run_armed_ns, r.run_armed_ns, "{what}");
        assert_eq!(armed.run_per_try_ns, r.run_per_try_ns, "{what}");
        assert_eq!(armed.counted, r.counted, "{what}");
        assert_eq!(armed.counted_since_ns, r.counted_since_ns, "{what}");
        assert_eq!(
            armed.armed_per_ns.map(f64::to_bits),
            r.armed_per_ns.map(f64::to_bits),
            "{what}"
        );
        assert_eq!(armed.reading, r.reading, "{what}");
        assert_eq!(armed.stale(), r.stale(), "{what}");
        assert_eq!(armed.clearly_stale(), r.clearly_stale(), "{what}");
    }

    /// Seeded random schedules (requests armed with delays that change,
    /// some in the same nanosecond, ended at any time or never, the clock
    /// stepping back and leaping ahead, new readings and plans): the index
    /// answers every call as the list did, and leaves the hosts' counts
    /// the same.
    #[test]
    fn over_random_schedules_the_index_answers_as_the_list_did() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        const HOSTS: usize = 4;
        let hosts_at_start = {
            let mut hosts = three_known_hosts();
            hosts.find_or_add(b"d:1");
            hosts
        };
        let (mut fires_seen, mut most_armed) = (0usize, 0usize);
        // fires counted after the clock stepped back, readings clearly stale
        let (mut behind, mut clearly_stale) = (0usize, 0usize);
        for seed in 0..60 {
            let mut rng = StdRng::seed_from_u64(seed);
            let planned = [0.06, 0.2, 0.5][rng.gen_range(0..3)];
            let mut armed = ArmedRequests::new(planned);
            let mut linear = Linear::new(planned);
            let mut hosts = hosts_at_start.clone();
            let mut hosts_linear = hosts_at_start.clone();
            let mut now = 1_000 * MS;
            let mut per_try = 10 * MS;
            let mut last_asked = now + per_try;
            // the share of requests that end after their deadline: a
            // brownout now and then
            let mut slow_share = 0.1;
            let mut keys: Vec<u64> = Vec::new();
            for step in 0..3_000 {
                let what = format!("seed {seed}, step {step}");
                match rng.gen_range(0..100) {
                    0..=34 => {
                        let asked = if rng.gen_bool(0.1) {
                            last_asked
                        } else {
                            now + per_try
                        };
                        last_asked = asked;
                        let pick = match rng.gen_range(0..5) {
                            0 => None,
                            1 => Some(HostPick {
                                primary: rng.gen_range(0..HOSTS),
                                hedge: None,
                            }),
                            _ => Some(HostPick {
                                primary: rng.gen_range(0..HOSTS),
                                hedge: Some(rng.gen_range(0..HOSTS)),
                            }),
                        };
                        let key = armed.armed(asked, per_try, pick);
                        assert_eq!(key, linear.armed(asked, per_try, pick), "{what}");
                        keys.push(key);
                    }
                    35..=59 => {
                        let past = armed.fire(now, &mut hosts);
                        assert_eq!(past, linear.fire(now, &mut hosts_linear), "{what}");
                        fires_seen += past;
                        behind += usize::from(past < armed.fired.len());
                    }
                    60..=79 => {
                        let key = if keys.is_empty() || rng.gen_bool(0.05) {
                            rng.gen_range(0..now + per_try)
                        } else {
                            keys.swap_remove(rng.gen_range(0..keys.len()))
                        };
                        let per_try_us = per_try / 1_000;
                        let slow = rng.gen_bool(slow_share);
                        let after_us = if slow {
                            rng.gen_range(per_try_us..3 * per_try_us + 1)
                        } else {
                            rng.gen_range(0..per_try_us)
                        };
                        let ended = match rng.gen_range(0..4) {
                            0 => Ended::At(now.saturating_sub(rng.gen_range(0..2 * per_try))),
                            1 => Ended::Untimed,
                            _ => Ended::After(after_us),
                        };
                        let attempts = [None, Some(1), Some(2), Some(3)][rng.gen_range(0..4)];
                        armed.ended(key, attempts, ended, &mut hosts);
                        linear.ended(key, attempts, ended, &mut hosts_linear);
                    }
                    80..=93 => {
                        now = match rng.gen_range(0..100) {
                            0 => now + 31_000 * MS,
                            // the clock stepped back
                            1..=2 => now.saturating_sub(rng.gen_range(0..3 * per_try)).max(MS),
                            3..=10 => now + rng.gen_range(0..20 * per_try),
                            _ => now + rng.gen_range(0..per_try / 4),
                        };
                    }
                    94..=95 => {
                        armed.forget_stale(now);
                        linear.forget_stale(now);
                    }
                    96 => {
                        armed.new_reading();
                        linear.reading.new_reading();
                    }
                    97 => {
                        let share = rng.gen_range(0.0..1.0);
                        armed.replan(share);
                        linear.reading.replan(share);
                    }
                    98 => {
                        per_try = [MS, 3 * MS, 10 * MS, 40 * MS][rng.gen_range(0..4)];
                        slow_share = [0.05, 0.1, 0.5, 1.0][rng.gen_range(0..4)];
                    }
                    _ => {
                        let id = rng.gen_range(0..HOSTS);
                        if rng.gen_bool(0.5) {
                            hosts.answered_upstream(id);
                            hosts_linear.answered_upstream(id);
                        } else {
                            hosts.attempt_started(id, now);
                            hosts_linear.attempt_started(id, now);
                        }
                    }
                }
                assert_alike(&armed, &linear, &what);
                most_armed = most_armed.max(linear.armed.len());
                clearly_stale += usize::from(armed.clearly_stale());
                if step % 50 == 0 {
                    assert_eq!(format!("{hosts:?}"), format!("{hosts_linear:?}"), "{what}");
                }
            }
            assert_eq!(
                format!("{hosts:?}"),
                format!("{hosts_linear:?}"),
                "seed {seed}"
            );
        }
        // the schedules reach what they are meant to
        assert!(fires_seen > 10_000, "{fires_seen}");
        assert!(most_armed > 100, "{most_armed}");
        assert!(behind > 100, "{behind}");
        assert!(clearly_stale > 1_000, "{clearly_stale}");
    }

    /// The clock stepped back: `fire` counts the requests past their
    /// deadline at the time it is given, as the list did, not all those
    /// that fired.
    #[test]
    fn after_the_clock_steps_back_only_requests_past_their_deadline_then_are_counted() {
        let mut hosts = three_hosts();
        let mut armed = ArmedRequests::default();
        for i in 1..=4 {
            armed.armed(i * 10 * MS, 10 * MS, pick(0, 1));
        }
        assert_eq!(armed.fire(40 * MS, &mut hosts), 4);
        assert_eq!(armed.fire(25 * MS, &mut hosts), 2);
        assert_eq!(hosts.timeouts_unanswered(0), 4, "none counted twice");
        assert_eq!(armed.fire(45 * MS, &mut hosts), 4);
    }

    /// The cost this index is for: with 10,000 requests armed (at 10k
    /// requests a second, a second's worth), each call looks at the
    /// requests it changes. The list looked at every one of them in every
    /// `fire`, about half in an `ended`.
    #[test]
    fn with_ten_thousand_armed_each_call_looks_at_the_requests_it_changes() {
        const ARMED: u64 = 10_000;
        let mut hosts = three_hosts();
        let mut hosts_linear = three_hosts();
        let mut armed = ArmedRequests::default();
        let mut linear = Linear::new(0.06);
        // armed every 100 µs with a 1 s delay
        let deadline = |i: u64| 1_000 * MS + i * 100_000;
        for i in 0..ARMED {
            armed.armed(deadline(i), 1_000 * MS, pick(0, 1));
            linear.armed(deadline(i), 1_000 * MS, pick(0, 1));
        }
        let cost = |armed: &mut ArmedRequests,
                    linear: &mut Linear,
                    call: &mut dyn FnMut(&mut ArmedRequests, &mut Linear)| {
            let (before, before_linear) = (armed.touched, linear.looked);
            call(armed, linear);
            (armed.touched - before, linear.looked - before_linear)
        };
        // nothing due
        let now = 999 * MS;
        let fire = cost(&mut armed, &mut linear, &mut |a, l| {
            assert_eq!(a.fire(now, &mut hosts), 0);
            assert_eq!(l.fire(now, &mut hosts_linear), 0);
        });
        assert_eq!(fire, (0, ARMED));
        // the first one due
        let now = deadline(0);
        let fire = cost(&mut armed, &mut linear, &mut |a, l| {
            assert_eq!(a.fire(now, &mut hosts), 1);
            assert_eq!(l.fire(now, &mut hosts_linear), 1);
        });
        assert_eq!(fire, (1, ARMED));
        // one in the middle ends
        let ended = cost(&mut armed, &mut linear, &mut |a, l| {
            a.ended(deadline(5_000), Some(1), Ended::Untimed, &mut hosts);
            l.ended(deadline(5_000), Some(1), Ended::Untimed, &mut hosts_linear);
        });
        assert_eq!(ended, (1, 5_001));
        // one more armed, after the others; then one under a deadline taken
        let more = cost(&mut armed, &mut linear, &mut |a, l| {
            a.armed(deadline(ARMED), 1_000 * MS, pick(0, 1));
            l.armed(deadline(ARMED), 1_000 * MS, pick(0, 1));
        });
        assert_eq!(more, (0, ARMED - 1));
        let taken = cost(&mut armed, &mut linear, &mut |a, l| {
            a.armed(deadline(7_000), 1_000 * MS, pick(0, 1));
            l.armed(deadline(7_000), 1_000 * MS, pick(0, 1));
        });
        assert_eq!(taken, (2, 7_000 + ARMED));
        assert_eq!(armed.pending_on(0), linear.pending_on(0));
        assert_eq!(armed.pending_on(1), linear.pending_on(1));
        // every one due in turn, one `fire` a request (the list would look
        // at 10,000 each time): each request is looked at when its
        // primary's timeout is due and when its hedge's is, then is
        // forgotten
        let before = armed.touched;
        for i in 1..=2 * ARMED {
            let touched = armed.touched;
            armed.fire(deadline(i), &mut hosts);
            assert!(armed.touched - touched <= 3, "{i}");
        }
        armed.forget_stale(deadline(2 * ARMED) + FORGET_AFTER_NS);
        assert!(armed.armed.is_empty());
        // 10,001 requests, the first one's primary counted before
        assert_eq!(armed.touched - before, 3 * (ARMED + 1) - 1);
    }
}
