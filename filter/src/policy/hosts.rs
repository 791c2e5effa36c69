//! Where a request goes: the hosts of one cluster as one worker knows them,
//! and the choice of the primary's host and the hedge's.
//!
//! Why: a delay per cluster cannot help when one host is the problem. The
//! cluster's balancer (round robin) keeps sending that host its share, and
//! Envoy's `previous_hosts` only keeps the hedge off the primary's host, not
//! off the slow one. A filter can choose through Envoy's `override_host`
//! load-balancing policy: a request header names `primary,hedge` (one entry
//! per attempt); after the list, or for an address Envoy does not know, the
//! cluster's fallback policy picks.
//!
//! - **Cost per host: a peak-sensitive EWMA of log latency.** A sample
//!   above the cost pulls it up by `RISE` of the gap, one below pulls it
//!   down by `FALL` (`RISE` = 4 x `FALL`): a host that turns slow is seen
//!   within a few responses, and must stay fast for a while to be trusted
//!   again. Why not the textbook Peak-EWMA (a sample above the cost
//!   replaces it): with 5% stragglers at 10x on every host, each host sees
//!   a straggler every few hundred ms and every cost sits at the straggler
//!   latency, so a host 20 ms slower on every request looks like the
//!   others. In log space a straggler moves the cost by a share of its
//!   ratio, not of its size; the cost settles at the 80% expectile of
//!   the host's log latency. Small gains (1/16, 1/64 of the gap) keep the
//!   noise of hosts that only differ by chance under `PROBATION_FACTOR`
//!   (simulated: under 2x the median over 300 ticks, at 2 to 100
//!   responses per tick).
//! - **Score** = exp(cost) x (in flight + 1) x (1 + failures): a host's
//!   expected wait if sent one more request (brpc's and Finagle's form);
//!   failures (5xx, resets, local replies, and races a primary lost to a
//!   later attempt: a hedge after the delay, or Envoy's retry after a 5xx
//!   the client never sees; a healthy host loses only the few races its
//!   own tail loses) count as slowness, decaying with
//!   `FAILURE_DECAY_MS`, halved by each success and capped at
//!   `FAILURE_CAP`: a host that failed for a minute is back as soon as it
//!   answers well again (the exploration share measures it), not minutes
//!   later.
//! - **Choice: power of `choices` random choices** by score for the primary
//!   (2 avoids a slow host nearly always without herding every worker onto
//!   the one host that looks best), and the best other host for the hedge:
//!   the hedge exists because the primary may be slow; it must go where the
//!   latency is lowest now.
//! - **Discovery** from what Envoy reports (`upstream.address`): no
//!   property lists a cluster's hosts. A share of requests (`EXPLORE_SHARE`)
//!   is left to the cluster's balancer, so new hosts are found and a host
//!   on probation is measured again.
//! - **Probation** (the Tail at Scale's latency-induced probation): a host
//!   whose score is `PROBATION_FACTOR` times the median host's gets only
//!   the exploration share, never more than half the hosts at once (the
//!   slowest first; Envoy's panic threshold plays the same part): if most
//!   hosts are slow, the slowness is the cluster's, and the delay, not the
//!   host choice, is the answer.
//! - **All workers together**: each worker moves its local costs with its
//!   own responses between ticks and, on the tick, applies them to the
//!   shared cost as it is then (its cost, plus the share of the tick's
//!   starting cost its answers kept times what the other workers moved it
//!   since: see `merge_into`) under the cluster's compare-and-swap, then
//!   starts again from the shared costs. Nothing shared is touched per
//!   request.
//! - **Ageing**: a host not heard from for `FORGET_MS` (removed from the
//!   cluster, or no longer answering) is dropped. Sooner than that, a host
//!   Envoy no longer has is noticed by each worker: named as the primary
//!   of a single-attempt request, it is not the one that answered (Envoy
//!   skips addresses it does not know). Missed every time it was named
//!   since the reads were last judged (`take_override_checks`), while the
//!   other named hosts were followed, it is unreachable: not chosen until
//!   it answers again. Misses spread over
//!   most named hosts are the cluster's (it ignores the header). Once a
//!   read shows a host missed, its answers are no longer trusted to it
//!   unread (`doubted`). Override picks ignore
//!   Envoy's health: an ejected or unhealthy host named in the header still
//!   gets the request, so the filter must not name it. Outlier detection
//!   ejects for errors, and errors put a host on probation here at once;
//!   a host that fails active health checks while still answering requests
//!   well is not seen (no property tells a filter a host's health), unless
//!   the filter reads Envoy's admin interface (`admin_cluster`,
//!   `membership`): then a host Envoy does not call healthy, or no longer
//!   lists, is held out (never named), and the score divides by the host's
//!   load-balancing weight (brpc's form: a host of weight 3 may be three
//!   times as busy before it looks as costly).

use super::membership::{self, Member, Serving};
use super::shared_state::{SharedHost, MAX_COST_LOG, MAX_HOSTS, MAX_HOST_ADDRESS};

/// Share of the gap a sample above the cost closes.
pub const RISE: f64 = 1.0 / 16.0;
/// Share of the gap a sample below the cost closes.
pub const FALL: f64 = 1.0 / 64.0;
/// Requests left to the cluster's own balancer: discovery and recovery.
pub const EXPLORE_SHARE: f64 = 0.01;
/// A host this many times slower (by score) than the median host is on
/// probation.
pub const PROBATION_FACTOR: f64 = 2.5;
/// Per-try timeouts of a worker's armed requests on one host, since the
/// worker last started an attempt there, at which its next request goes
/// to that host (`Hosts::needs_fresh_attempt`). One: in a brownout
/// through Envoy with the split at three local-origin failures, 10 runs
/// ejected 16 hosts without the rule, 9 at two, 2 at one (design.md,
/// "Outlier detection", measured with fresh attempts in any regime).
pub const FRESH_ATTEMPT_AFTER: u32 = 1;
/// Hosts not heard from for this long are forgotten (ms).
pub const FORGET_MS: u64 = 10_000;
/// Hosts with fewer than `MIN_HOST_SAMPLES` answers are forgotten after
/// this long instead (ms). Such a host hears only from the exploration
/// share (1% of the requests over all hosts): without an admin read, a new
/// host of five at 40 requests a second answered once in 12 s on average,
/// so it was forgotten between its answers, and began again from none,
/// for minutes (found by a review). It cannot be chosen by score anyway,
/// and the table stays bounded.
pub const FORGET_UNLEARNED_MS: u64 = 120_000;

/// Drops the hosts of a cluster's shared value not heard from for
/// `FORGET_MS`, but those the admin interface's recent read lists as the
/// cluster's (`members`, sorted by address): a host Envoy still has is
/// silent because two choices avoid it (the costlier of any two), not
/// because it went. Forgotten, it came back as a new host, chosen by score
/// only after `MIN_HOST_SAMPLES` answers of the exploration share: at 40
/// requests a second over four hosts, a host slow for two seconds was
/// forgotten and still had none of the traffic 45 s after it recovered.
/// A worker whose policy does not choose hosts does only this: clearing
/// them instead (as it did) erased, on every tick, what the workers of
/// another configuration sharing the value learned (a reload that turns
/// `host_choice` on, while the old configuration drains).
///
/// Only a member Envoy may send traffic to counts: one outside the
/// priority Envoy serves from (another zone, after a failover) is silent
/// because the filter holds it out, and kept it would hold its slot for
/// as long as Envoy lists it (64 of them, a whole table).
pub fn forget_silent(shared: &mut Vec<SharedHost>, now_ms: u64, members: Option<&[Member]>) {
    let serving = members.map(membership::serving);
    let listed = |address: &str| {
        members
            .and_then(|m| membership::find(m, address))
            .zip(serving)
            .is_some_and(|(m, serving)| membership::in_service(m, serving))
    };
    // Stamps more than a second ahead: the wall clock was set back. Kept,
    // they would freeze the decays (`keep` reads a stamp ahead as now) and
    // keep a gone host's slot until the clock caught up, hours maybe; the
    // window and the admin read's claim take a step back the same way.
    for s in shared.iter_mut() {
        if s.seen_ms > now_ms.saturating_add(CLOCK_SLACK_MS) {
            s.seen_ms = now_ms;
        }
        if s.stamp_ms > now_ms.saturating_add(CLOCK_SLACK_MS) {
            s.stamp_ms = now_ms;
        }
    }
    shared.retain(|s| {
        // a host the admin read does not list is not kept for learning
        let horizon = match s.samples < MIN_HOST_SAMPLES && members.is_none() {
            true => FORGET_UNLEARNED_MS,
            false => FORGET_MS,
        };
        now_ms.saturating_sub(s.seen_ms) < horizon || listed(&s.address)
    });
}

/// How far ahead of this worker's clock another's stamp may be (ticks of
/// different workers) before it is taken for a clock set back.
const CLOCK_SLACK_MS: u64 = 1_000;
/// A failure's weight halves in about this long (ms; the time constant).
pub const FAILURE_DECAY_MS: f64 = 5_000.0;
/// The part of a host's cost above the median host's fades with time
/// (ms; the time constant), as the Peak-EWMA of Finagle and Tower (10 s)
/// forgets a peak. Why: two choices never pick the costlier of the two,
/// so a host once slower than the rest gets only the exploration share
/// (1% over all hosts), too few answers to show it recovered: a host 10x
/// slow for one second stayed the costliest of four, and so without
/// primaries, for about 9 minutes at 50 requests a second (40-70 s at
/// 500). A host still slow is seen again within a few answers (`RISE`).
pub const COST_DECAY_MS: f64 = 10_000.0;
/// Failures counted at most (a host failing everything is on probation
/// at once; it comes back within a few successes).
pub const FAILURE_CAP: f64 = 4.0;
/// Samples a host needs before it is chosen by score (before that, the
/// cluster's balancer sends it its share, which measures it).
pub const MIN_HOST_SAMPLES: u64 = 5;

/// A host's index in its cluster's table: stable while a request that
/// named it is in flight.
pub type HostId = usize;

/// Every host id is below this: a cluster's table holds no more hosts
/// (`Hosts::find_or_add`).
pub const HOST_IDS: usize = 2 * MAX_HOSTS;

/// The hosts chosen for a request: the primary's, and the hedge's if it
/// is armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostPick {
    pub primary: HostId,
    pub hedge: Option<HostId>,
}

/// One upstream host as this worker knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Host {
    /// Exactly as Envoy reports it in `upstream.address` ("10.0.0.7:8080").
    pub address: String,
    /// ln(latency in µs), peak-sensitive EWMA.
    cost_log: f64,
    /// The shared cost this worker started from at the last tick, if the
    /// host was in the shared value then.
    base_log: Option<f64>,
    /// How much of `base_log` the cost still holds: the product of the
    /// EWMA's keep factors (1 - gain) since the tick (see `merge_into`).
    base_kept: f64,
    /// Decaying count of failures (shared, as of the last tick, plus this
    /// worker's since).
    failures: f64,
    new_failures: f64,
    samples: u64,
    new_samples: u64,
    /// Requests this worker sent it by choice that have not ended.
    pub in_flight: u32,
    /// This worker's requests in flight naming it as their hedge's host:
    /// its slot is kept for them (their per-try timeouts count on it).
    hedge_of: u32,
    /// Responses attributed to it since the last tick (this worker).
    responses_this_tick: u32,
    pub probation: bool,
    /// Named as a primary and missed every time since the reads were last
    /// judged (Envoy has no such host any more): not chosen until it
    /// answers.
    unreachable: bool,
    /// Single-attempt requests that named it as the primary whose answer
    /// was read since the reads were last judged (or, missed every time,
    /// since it was last followed), and those another host answered.
    named: u32,
    missed: u32,
    /// Another host answered the last time a read showed who answered it
    /// as the named primary: its single-attempt answers are read, not
    /// trusted to it, until a read shows it answering again.
    doubted: bool,
    /// The worker's tick in which an answer naming it was last read
    /// (`Hosts::first_read_this_tick`).
    read_tick: u64,
    /// Not in the shared value any more: not chosen; its slot is reused
    /// once nothing in flight names it.
    gone: bool,
    /// Per-try timeouts of this worker's armed requests fired on it since
    /// it last answered (see `timeouts`).
    timeouts_unanswered: u32,
    /// Per-try timeouts of this worker's armed requests fired on it since
    /// this worker last started an attempt there, and when that was (ns):
    /// with local-origin errors split, each new stream resets outlier
    /// detection's count (see `FRESH_ATTEMPT_AFTER`).
    timeouts_since_attempt: u32,
    last_attempt_ns: u64,
    /// Envoy's load-balancing weight, as the admin interface last said
    /// (1 without it).
    weight: f64,
    /// The admin interface says Envoy would not send it traffic
    /// (unhealthy, or not in the cluster): never named.
    held_out: bool,
}

impl Host {
    fn new(address: String) -> Self {
        Host {
            address,
            cost_log: 0.0,
            base_log: None,
            base_kept: 1.0,
            failures: 0.0,
            new_failures: 0.0,
            samples: 0,
            new_samples: 0,
            in_flight: 0,
            hedge_of: 0,
            responses_this_tick: 0,
            probation: false,
            unreachable: false,
            named: 0,
            missed: 0,
            doubted: false,
            read_tick: 0,
            gone: false,
            timeouts_unanswered: 0,
            timeouts_since_attempt: 0,
            last_attempt_ns: 0,
            weight: 1.0,
            held_out: false,
        }
    }

    /// A success after `latency_us`.
    fn observe(&mut self, latency_us: f64) {
        self.move_cost(latency_us, true);
        // a success halves the failures (moved as a delta: workers' halves
        // add up in the shared value, floored at zero)
        self.new_failures -= 0.5 * self.failure_count();
        self.unreachable = false;
    }

    /// A sample of the latency (`both_ways`), or a lower bound on it
    /// (only raises the cost).
    fn move_cost(&mut self, latency_us: f64, both_ways: bool) {
        let l = latency_us.max(1.0).ln();
        if self.samples == 0 {
            self.cost_log = l;
            self.base_kept = 0.0;
        } else if l > self.cost_log {
            self.cost_log += RISE * (l - self.cost_log);
            self.base_kept *= 1.0 - RISE;
        } else if both_ways {
            self.cost_log += FALL * (l - self.cost_log);
            self.base_kept *= 1.0 - FALL;
        }
        self.samples = self.samples.saturating_add(1);
        self.new_samples = self.new_samples.saturating_add(1);
        self.responses_this_tick = self.responses_this_tick.saturating_add(1);
    }

    /// The failures counted now (shared as of the tick, plus this
    /// worker's since), capped.
    fn failure_count(&self) -> f64 {
        (self.failures + self.new_failures).clamp(0.0, FAILURE_CAP)
    }

    /// Starts again from the shared value.
    fn update_from(&mut self, shared: &SharedHost) {
        self.gone = false;
        self.cost_log = shared.cost_log;
        self.base_log = Some(shared.cost_log);
        self.base_kept = 1.0;
        self.failures = shared.failures;
        self.new_failures = 0.0;
        self.samples = shared.samples;
        self.new_samples = 0;
    }

    /// The latency estimate (µs).
    pub fn cost_us(&self) -> f64 {
        self.cost_log.exp()
    }

    /// Slowness without the load: what probation compares.
    fn slowness(&self) -> f64 {
        self.cost_us() * (1.0 + self.failure_count())
    }

    /// The expected wait if sent one more request, per unit of weight
    /// (brpc's form: a host of weight 3 may be three times as busy before
    /// it looks as costly). Tried on 2026-11-29 and not kept: the load term
    /// alone per unit of weight, with hosts drawn in proportion to weight.
    /// Idle hosts then compared by latency alone, and among hosts alike
    /// the noise in their costs decided: a host of weight 3 beside three
    /// of weight 1 got 32% of requests through Envoy (Envoy's own balancer:
    /// 50%; this form: above 35%, `tests/e2e/hosts.rs`).
    pub fn score(&self) -> f64 {
        self.slowness() * f64::from(self.in_flight.saturating_add(1)) / self.weight
    }

    /// Chosen by score only once in the shared value (all workers choose
    /// from the same hosts) with `MIN_HOST_SAMPLES`; until then the
    /// cluster's balancer measures it.
    fn known(&self) -> bool {
        self.samples >= MIN_HOST_SAMPLES
            && !self.gone
            && !self.unreachable
            && !self.held_out
            && self.base_log.is_some()
    }
}

/// The hosts of one cluster.
#[derive(Clone, Debug, Default)]
pub struct Hosts {
    hosts: Vec<Host>,
    /// Ticks since the reads of who answered were last judged
    /// (`take_override_checks`).
    unjudged_ticks: u32,
    /// Ticks left during which the cluster has more hosts than the shared
    /// value can hold (see `OVERFLOW_TICKS`).
    overflow_ticks: u32,
    /// The admin interface's last word: fewer than half the members are
    /// healthy, or the serving priority spills over to the next (see
    /// `weigh`): the cluster's balancer chooses.
    panicking: bool,
}

/// A cluster with more hosts answering than the shared value holds
/// (`MAX_HOSTS`): the hosts past it were never measured, so never chosen,
/// and the first 64 took about 99% of the traffic (a scale-up added almost
/// nothing). Host choice steps aside for the cluster's balancer while a
/// host outside the value answered in the last this many ticks; hedging
/// goes on.
const OVERFLOW_TICKS: u32 = 50;

/// Reads of who answered a named primary, over at least two hosts, that
/// `Hosts::take_override_checks` waits for before judging them, unless
/// `MAX_UNJUDGED_TICKS` pass first.
pub const VERDICT_READS: u32 = 4;
/// Ticks after which the reads are judged however few.
pub const MAX_UNJUDGED_TICKS: u32 = 10;

/// What the tick found, for the cluster's gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostsSummary {
    pub tracked: usize,
    pub on_probation: usize,
    /// Share of the responses attributed this tick that came from the
    /// slowest tracked host (0 without responses).
    pub slowest_share: f64,
    /// Tracked hosts the admin interface says Envoy would not use.
    pub held_out: usize,
    /// More hosts answer than the shared value holds: host choice steps
    /// aside (`OVERFLOW_TICKS`).
    pub overflowing: bool,
}

impl Hosts {
    pub fn get(&self, id: HostId) -> Option<&Host> {
        self.hosts.get(id)
    }

    pub fn len(&self) -> usize {
        self.hosts.iter().filter(|h| !h.gone).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The hosts in the shared value (not forgotten).
    pub fn iter_known(&self) -> impl Iterator<Item = &Host> {
        self.hosts.iter().filter(|h| !h.gone)
    }

    /// The host Envoy reported, added if new (`None` for an empty or
    /// too long address, or a full table).
    pub fn find_or_add(&mut self, address: &[u8]) -> Option<HostId> {
        if let Some(id) = self
            .hosts
            .iter()
            .position(|h| h.address.as_bytes() == address)
        {
            if let Some(h) = self.hosts.get_mut(id).filter(|h| h.gone) {
                // forgotten: back as a new host (its cost, counts and marks
                // are of another time; it was chosen by them on this worker
                // until its tick: found by a review), but for the picks of
                // it still in flight
                let (in_flight, hedge_of) = (h.in_flight, h.hedge_of);
                *h = Host {
                    in_flight,
                    hedge_of,
                    ..Host::new(std::mem::take(&mut h.address))
                };
            }
            return Some(id);
        }
        if address.is_empty() || address.len() > MAX_HOST_ADDRESS {
            return None;
        }
        let address = std::str::from_utf8(address).ok()?.to_string();
        // a slot of a forgotten host nothing names any more
        if let Some(id) = self
            .hosts
            .iter()
            .position(|h| h.gone && h.in_flight == 0 && h.hedge_of == 0)
        {
            if let Some(slot) = self.hosts.get_mut(id) {
                *slot = Host::new(address);
            }
            return Some(id);
        }
        if self.hosts.len() >= HOST_IDS {
            self.overflow_ticks = OVERFLOW_TICKS;
            return None;
        }
        self.hosts.push(Host::new(address));
        Some(self.hosts.len() - 1)
    }

    /// A success of `id` after `latency_us`.
    pub fn observe(&mut self, id: HostId, latency_us: f64) {
        if let Some(h) = self.hosts.get_mut(id) {
            h.observe(latency_us);
        }
    }

    /// `id` took at least `latency_us` without answering (a primary that
    /// lost the race to another attempt).
    pub fn observe_bound(&mut self, id: HostId, latency_us: f64) {
        if let Some(h) = self.hosts.get_mut(id) {
            h.move_cost(latency_us, false);
        }
    }

    /// A failure of `id`: a 5xx, a reset, a connect failure, a timeout, a
    /// race lost to another attempt.
    pub fn fail(&mut self, id: HostId) {
        if let Some(h) = self.hosts.get_mut(id) {
            if h.failure_count() < FAILURE_CAP {
                h.new_failures += 1.0;
            }
            h.responses_this_tick = h.responses_this_tick.saturating_add(1);
        }
    }

    /// A per-try timeout of an armed request fired on `id` at `at_ns`.
    pub fn timed_out(&mut self, id: HostId, at_ns: u64) {
        if let Some(h) = self.hosts.get_mut(id) {
            h.timeouts_unanswered = h.timeouts_unanswered.saturating_add(1);
            // one fired before the last attempt started was reset by it
            if at_ns >= h.last_attempt_ns {
                h.timeouts_since_attempt = h.timeouts_since_attempt.saturating_add(1);
            }
        }
    }

    /// This worker started an attempt on `id` at `at_ns` (a primary named
    /// in the header, or a hedge when its primary's timeout fired).
    pub fn attempt_started(&mut self, id: HostId, at_ns: u64) {
        if let Some(h) = self.hosts.get_mut(id) {
            if at_ns >= h.last_attempt_ns {
                h.last_attempt_ns = at_ns;
                h.timeouts_since_attempt = 0;
            }
        }
    }

    /// The host whose timeouts since this worker's last attempt there have
    /// reached `FRESH_ATTEMPT_AFTER` (the most, if several), once the delay
    /// is `stale` (a brownout): the next request goes there, unarmed. Why:
    /// in a brownout host choice stops sending a host anything while its
    /// armed attempts fire (held back, or simply the worst of the draw),
    /// and with local-origin errors split only a new stream resets outlier
    /// detection's count; each worker resetting its own after each timeout
    /// keeps their sum far below the shipped ten. Not in steady traffic:
    /// host choice sends every host in good standing attempts within a few
    /// requests, and each fresh attempt is a request left unhedged (in
    /// virtual time, fresh attempts in steady traffic took the median p999
    /// ratio from 1.10 to 1.28); nor to a host on probation, which may be
    /// failing; nor to a host that answered since (a 503 storm, whose
    /// fast-failed and retried requests read as fired timeouts: there the
    /// host gets new streams anyway, and fresh attempts, unarmed, cost
    /// requests their hedge: client errors +17% against +2-8% without).
    pub fn needs_fresh_attempt(&self, stale: bool) -> Option<HostId> {
        // per request: steady traffic reads no host. Nor while the
        // cluster's balancer is left to choose (Envoy in panic: held-out
        // hosts count again here; a cluster past its hosts' cap): a fresh
        // attempt named an ejected host there (found by a review).
        if !stale || self.panicking || self.overflow_ticks > 0 {
            return None;
        }
        self.hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| {
                h.known()
                    && !h.probation
                    && h.timeouts_since_attempt >= FRESH_ATTEMPT_AFTER
                    && h.timeouts_unanswered > 0
            })
            .max_by_key(|(_, h)| h.timeouts_since_attempt)
            .map(|(i, _)| i)
    }

    /// `id` answered (see `Worker::on_host_response`): the timeouts the
    /// filter left standing there are over.
    pub fn answered_upstream(&mut self, id: HostId) {
        if let Some(h) = self.hosts.get_mut(id) {
            h.timeouts_unanswered = 0;
        }
    }

    /// Timeouts fired on `id` since it last answered, as this worker saw.
    pub fn timeouts_unanswered(&self, id: HostId) -> u32 {
        self.hosts.get(id).map_or(0, |h| h.timeouts_unanswered)
    }

    /// `id` answered (or failed): Envoy has it.
    pub fn answered(&mut self, id: HostId) {
        if let Some(h) = self.hosts.get_mut(id) {
            h.unreachable = false;
        }
    }

    /// A single-attempt request named `primary`; `followed`: it answered.
    pub fn record_override(&mut self, primary: HostId, followed: bool) {
        if let Some(h) = self.hosts.get_mut(primary) {
            h.named = h.named.saturating_add(1);
            h.missed = h.missed.saturating_add(u32::from(!followed));
            h.doubted = !followed;
        }
    }

    /// Whether an answer after a single attempt naming `id` must be read
    /// rather than trusted to it: it was missed at the last read, or is
    /// unreachable. Why: a trusted answer is a sample and clears
    /// `unreachable`, so the requests still in flight to a removed host
    /// would make it chosen again, and renew it in the shared value, for
    /// as long as requests cross the ticks (a CI rehearsal kept one for
    /// 15 s).
    pub fn doubted(&self, id: HostId) -> bool {
        self.hosts
            .get(id)
            .map_or(true, |h| h.doubted || h.unreachable)
    }

    /// Whether an answer naming `id` is the first this tick (`tick`, the
    /// worker's count) to be asked about it; it is then read. Why: one read
    /// in four alone leaves a worker at a few requests a tick a few
    /// seconds without a read of a host that left (through Envoy at 40
    /// requests a second, one run in six named it 3.9 s after its
    /// removal), while at a high rate a read per host and tick adds
    /// next to nothing to the one in four.
    pub fn first_read_this_tick(&mut self, id: HostId, tick: u64) -> bool {
        match self.hosts.get_mut(id) {
            Some(h) if h.read_tick != tick => {
                h.read_tick = tick;
                true
            }
            _ => false,
        }
    }

    /// On the tick: the hosts missed every time they were named (at least
    /// twice) while the others named were followed are unreachable; what
    /// remains (checks, misses) is for the cluster's `OverrideCheck`. A
    /// host missed every time it was named, beside hosts followed, is no
    /// verdict on the cluster: counted, a removed host's misses put one
    /// host of four at the cluster's threshold (a quarter), which blamed
    /// the cluster in 1 run of 5 (tests/e2e/hosts.rs) when named once a tick,
    /// and again in a CI rehearsal when named twice beside another miss.
    ///
    /// The reads are judged once there are `VERDICT_READS` over two hosts
    /// or more (or after `MAX_UNJUDGED_TICKS`), not every tick: with one
    /// response in four read (the rest trusted to the named host), a
    /// worker at a few requests a tick seldom reads a removed host twice
    /// in one tick beside another host followed, while every answer naming
    /// the doubted host is read. Judged each tick, at 40 requests a second
    /// through Envoy the removed host was still named 3.5 s after its
    /// removal, and in a unit test at two requests a tick its misses alone
    /// made the cluster look as if it ignored the header.
    pub fn take_override_checks(&mut self) -> (u32, u32) {
        let named = self.hosts.iter().filter(|h| h.named > 0).count();
        let reads: u32 = self.hosts.iter().map(|h| h.named).sum();
        self.unjudged_ticks = self.unjudged_ticks.saturating_add(1);
        if (named < 2 || reads < VERDICT_READS) && self.unjudged_ticks < MAX_UNJUDGED_TICKS {
            return (0, 0);
        }
        self.unjudged_ticks = 0;
        let missed = self.hosts.iter().filter(|h| h.missed > 0).count();
        let lost = |h: &Host| h.named >= 2 && h.missed == h.named;
        let few_missed = missed > 0 && missed * 2 <= named;
        let concentrated = few_missed && self.hosts.iter().filter(|h| h.missed > 0).all(lost);
        let (mut checks, mut misses) = (0, 0);
        for h in self.hosts.iter_mut() {
            if concentrated && h.missed > 0 {
                h.unreachable = true;
            } else if h.gone || h.held_out || h.unreachable {
                // no longer chosen: its misses say nothing more, and kept
                // they would hold `concentrated` false for the next host
                // removed
            } else if few_missed && h.missed == h.named {
                // missed every time it was named while most named hosts
                // were followed: about the host (removed, or not yet in
                // this worker's host set), not the cluster; a lost host
                // beside another miss is no verdict either (a removed host
                // is a quarter of four hosts' namings, the threshold).
                // Its reads carry over to the next judgement until it is
                // followed: at a few requests a tick a removed host is
                // seldom read twice between two judgements (through
                // Envoy at 10 to 30 requests a second per worker, it was
                // still named 4.7 s after its removal)
                continue;
            } else {
                checks += h.named;
                misses += h.missed;
            }
            h.named = 0;
            h.missed = 0;
        }
        (checks, misses)
    }

    /// A chosen request started (`true`) or ended: in flight on its
    /// primary, and naming its hedge's host.
    pub fn track(&mut self, pick: HostPick, started: bool) {
        let step = |n: u32| {
            if started {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            }
        };
        if let Some(h) = self.hosts.get_mut(pick.primary) {
            h.in_flight = step(h.in_flight);
        }
        if let Some(h) = pick.hedge.and_then(|id| self.hosts.get_mut(id)) {
            h.hedge_of = step(h.hedge_of);
        }
    }

    /// `ticks` ticks passed without a `refresh` (a quiet cluster, read in
    /// turn: `Worker::sync_shared`): the waits counted in refreshes move
    /// by them, so that they last as long as when every tick refreshes
    /// (found by a review: an overflow's 10 s lasted 255 s).
    pub fn ticks_passed(&mut self, ticks: u64) {
        let ticks = u32::try_from(ticks).unwrap_or(u32::MAX);
        self.overflow_ticks = self.overflow_ticks.saturating_sub(ticks);
        self.unjudged_ticks = self.unjudged_ticks.saturating_add(ticks);
    }

    /// Whether this worker learned anything of the hosts since the last
    /// tick (`merge_into` has something to add).
    pub fn has_news(&self) -> bool {
        self.hosts
            .iter()
            .any(|h| h.new_samples > 0 || h.new_failures > 0.0)
    }

    /// Under the compare-and-swap of the cluster's value (may run more than
    /// once, so it reads `self` only): forgets silent hosts, adds what this
    /// worker learned since the last tick.
    pub fn merge_into(
        &self,
        shared: &mut Vec<SharedHost>,
        now_ms: u64,
        members: Option<&[Member]>,
    ) {
        forget_silent(shared, now_ms, members);
        // The fades are applied by a worker with news of the cluster's
        // hosts, over the time since their stamp (the same as tick by tick:
        // the decays are exponential). Applied on every tick, they changed
        // an idle cluster's value, and every worker rewrote every idle
        // cluster every tick (a thousand clusters: megabytes through the
        // shared data's lock each tick; found by a review). Nobody chooses
        // hosts of a cluster without traffic, so nothing is lost.
        if self.has_news() {
            let median = median_cost_log(shared);
            for s in shared.iter_mut() {
                s.failures *= failure_keep(s.stamp_ms, now_ms);
                if let Some(median) = median.filter(|&m| s.cost_log > m) {
                    s.cost_log = median + (s.cost_log - median) * cost_keep(s.stamp_ms, now_ms);
                }
                s.stamp_ms = s.stamp_ms.max(now_ms);
            }
        }
        for local in self
            .hosts
            .iter()
            .filter(|h| h.new_samples > 0 || h.new_failures > 0.0)
        {
            let slot = match shared.iter().position(|s| s.address == local.address) {
                Some(i) => shared.get_mut(i),
                None if shared.len() < MAX_HOSTS => {
                    shared.push(SharedHost {
                        address: local.address.clone(),
                        cost_log: local.cost_log,
                        failures: 0.0,
                        samples: 0,
                        stamp_ms: now_ms,
                        seen_ms: now_ms,
                    });
                    shared.last_mut()
                }
                None => None,
            };
            let Some(s) = slot else { continue };
            if local.new_samples > 0 {
                // This worker's samples applied to the shared cost as it is
                // now: the EWMA is linear between its rises and falls, cost
                // = kept x base + what the samples added, so on the current
                // value they give about cost + kept x (shared - base).
                // Adding the movement alone (cost - base) counted every
                // worker's pull in full: with N workers each closing a share
                // f of the gap in a tick the shared cost moved N x f of it,
                // past the latency once N x f > 1 and swinging wider each
                // tick once N x f > 2 (eight workers at 50 answers a host
                // and tick), until the value no longer decoded. A host found
                // since the tick: its cost, weighed by samples.
                let merged = match local.base_log {
                    // (nothing kept: the worker's first sample set its cost,
                    // so it is weighed as a new host's)
                    Some(base) if s.samples > 0 && local.base_kept > 0.0 => {
                        local.cost_log + local.base_kept * (s.cost_log - base)
                    }
                    _ => {
                        let (old, new) = (s.samples as f64, local.new_samples as f64);
                        (s.cost_log * old + local.cost_log * new) / (old + new)
                    }
                };
                s.cost_log = merged.clamp(0.0, MAX_COST_LOG);
            }
            s.samples = s.samples.saturating_add(local.new_samples);
            s.failures = (s.failures + local.new_failures).clamp(0.0, FAILURE_CAP);
            s.seen_ms = now_ms;
        }
    }

    /// After the shared value was written: every worker starts again from
    /// the shared costs; `members`, the admin interface's recent word on
    /// the cluster (if read), holds hosts out and weighs them; probation
    /// from them. Returns the tick's summary.
    pub fn refresh(&mut self, shared: &[SharedHost], members: Option<&[Member]>) -> HostsSummary {
        let responses: u32 = self.hosts.iter().map(|h| h.responses_this_tick).sum();
        for h in self.hosts.iter_mut() {
            h.gone = true;
        }
        // the hosts known here keep their slots; then the new ones (which
        // may take a slot of a host gone from the shared value)
        let mut new = Vec::new();
        for s in shared {
            match self.hosts.iter_mut().find(|h| h.address == s.address) {
                Some(h) => h.update_from(s),
                None => new.push(s),
            }
        }
        for s in new {
            if let Some(h) = self
                .find_or_add(s.address.as_bytes())
                .and_then(|id| self.hosts.get_mut(id))
            {
                h.update_from(s);
            }
        }
        // a host that answered and has no place in a full shared value
        let outside = shared.len() >= MAX_HOSTS
            && self
                .hosts
                .iter()
                .any(|h| h.gone && h.responses_this_tick > 0);
        self.overflow_ticks = match outside {
            true => OVERFLOW_TICKS,
            false => self.overflow_ticks.saturating_sub(1),
        };
        let held_out = self.weigh(members);
        let slowest = self
            .hosts
            .iter()
            .filter(|h| h.known())
            .max_by(|a, b| a.slowness().total_cmp(&b.slowness()))
            .map_or(0, |h| h.responses_this_tick);
        let on_probation = self.set_probation();
        for h in self.hosts.iter_mut() {
            h.responses_this_tick = 0;
        }
        HostsSummary {
            tracked: self.len(),
            on_probation,
            held_out,
            overflowing: self.overflow_ticks > 0,
            slowest_share: if responses == 0 {
                0.0
            } else {
                f64::from(slowest) / f64::from(responses)
            },
        }
    }

    /// The admin interface's weights and health on the hosts known here
    /// (`members` sorted by address); without it, every host weighs 1 and
    /// none is held out. While fewer than half the members are healthy the
    /// filter names no host and the cluster's balancer chooses: Envoy's
    /// panic threshold (50% unless set) then spreads the load over all
    /// hosts rather than crush the few left, or, where it is 0 (Istio with
    /// outlier detection), keeps to the healthy ones. Until 2026-11-28 the
    /// filter held none out then, and named hosts Istio had ejected (an
    /// override pick ignores health). Returns the hosts held out.
    ///
    /// Where the members span priorities (Istio's locality failover), the
    /// hosts outside the priority Envoy serves from are held out too, and
    /// while that priority spills over to the next the filter names no
    /// host: before, a host of another zone learned during a failover
    /// stayed the filter's choice after the local ones came back, if it
    /// answered faster.
    fn weigh(&mut self, members: Option<&[Member]>) -> usize {
        let serving = members.map(membership::serving);
        let panic = match serving {
            Some(Serving::Spread) => true,
            Some(Serving::Only(_)) => false,
            // excluded hosts are out of Envoy's count (`Member::excluded`)
            _ => members.is_some_and(|m| {
                let counted = m.iter().filter(|m| !m.excluded).count();
                2 * m.iter().filter(|m| m.healthy).count() < counted
            }),
        };
        self.panicking = panic;
        let elsewhere =
            |m: &Member| serving.is_some_and(|serving| !membership::in_service(m, serving));
        let unserved = members.map(membership::degraded_unserved);
        let degraded_unserved =
            |m: &Member| m.degraded && unserved.as_ref().is_some_and(|p| p.contains(&m.priority));
        let find = |address: &str| members.map(|m| membership::find(m, address));
        // no host known here listed at all: the addresses are written
        // differently (or the read is of other hosts), not all removed
        let members = members.filter(|_| {
            self.hosts
                .iter()
                .any(|h| !h.gone && find(&h.address).flatten().is_some())
        });
        let mut held_out = 0;
        for h in self.hosts.iter_mut().filter(|h| !h.gone) {
            let member = members.and(find(&h.address));
            (h.weight, h.held_out) = match member {
                None => (1.0, false),
                // not in the cluster (any more)
                Some(None) => (1.0, true),
                Some(Some(m)) => (
                    f64::from(m.weight.max(1)),
                    (!m.healthy || elsewhere(m) || degraded_unserved(m)) && !panic,
                ),
            };
            held_out += usize::from(h.held_out);
        }
        held_out
    }

    /// Puts on probation the hosts far slower than the median (at most half).
    fn set_probation(&mut self) -> usize {
        for h in self.hosts.iter_mut() {
            h.probation = false;
        }
        let mut ranked: Vec<(f64, HostId)> = self
            .hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| h.known())
            .map(|(i, h)| (h.slowness(), i))
            .collect();
        if ranked.len() < 2 {
            return 0;
        }
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
        // the lower median: of two hosts, the faster one
        let median = ranked.get((ranked.len() - 1) / 2).map_or(0.0, |r| r.0);
        let mut on_probation = 0;
        for &(slowness, i) in ranked.iter().rev().take(ranked.len() / 2) {
            if median > 0.0 && slowness > PROBATION_FACTOR * median {
                if let Some(h) = self.hosts.get_mut(i) {
                    h.probation = true;
                    on_probation += 1;
                }
            }
        }
        on_probation
    }

    /// `choose_avoiding` with no host avoided.
    #[cfg(test)]
    pub fn choose(&self, choices: usize, random: u64, want_hedge: bool) -> Option<HostPick> {
        self.choose_avoiding(choices, random, want_hedge, |_| false)
    }

    /// The primary's host and the hedge's, or `None` to leave the request
    /// to the cluster's balancer. `random`: a fresh random number per
    /// request (the worker's generator; this stays pure). For an armed
    /// request (`want_hedge`), both are drawn among the hosts that
    /// `avoid` does not name (hosts whose per-try timeouts could add up in
    /// outlier detection; see `timeouts`). With no such host the primary is
    /// drawn among all and no hedge host is named: the caller does not arm.
    pub fn choose_avoiding(
        &self,
        choices: usize,
        random: u64,
        want_hedge: bool,
        avoid: impl Fn(HostId) -> bool,
    ) -> Option<HostPick> {
        // the exploration share: the top 24 bits decide
        if self.overflow_ticks > 0
            || self.panicking
            || ((random >> 40) as f64) < EXPLORE_SHARE * (1u64 << 24) as f64
        {
            return None;
        }
        let eligible = || {
            self.hosts
                .iter()
                .enumerate()
                .filter(|(_, h)| h.known() && !h.probation)
        };
        if eligible().count() < 2 {
            return self.the_one_in_good_standing(want_hedge, &avoid);
        }
        let clear = |i: HostId| !(want_hedge && avoid(i));
        let any_clear = eligible().any(|(i, _)| clear(i));
        let candidates = || eligible().filter(move |&(i, _)| !any_clear || clear(i));
        let count = candidates().count();
        // `choices` distinct draws among the eligible hosts (at most 4)
        let mut drawn = [usize::MAX; 4];
        let mut state = random;
        let mut primary: Option<(f64, HostId)> = None;
        for k in 0..choices.clamp(1, 4).min(count) {
            state = mix(state);
            let Some(id) = draw(candidates, &drawn, count - k, state) else {
                break;
            };
            if let Some(slot) = drawn.get_mut(k) {
                *slot = id;
            }
            let score = self.hosts.get(id).map_or(f64::INFINITY, Host::score);
            if primary.map_or(true, |(best, _)| score < best) {
                primary = Some((score, id));
            }
        }
        let (_, primary) = primary?;
        Some(self.pick_with_primary(primary, want_hedge, mix(state), avoid))
    }

    /// One known host in good standing, the others on probation (one of
    /// two hosts far slower): it takes the primaries, the best other known
    /// host the hedges (where Envoy would send them anyway). Left to the
    /// cluster's balancer, as before 2026-11-28, the slow host had its share
    /// of primaries back: half of a two-host cluster's, the slower the host
    /// the more it got. `None` with no such host, or if it is avoided.
    fn the_one_in_good_standing(
        &self,
        want_hedge: bool,
        avoid: &impl Fn(HostId) -> bool,
    ) -> Option<HostPick> {
        let mut good = self
            .hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| h.known() && !h.probation);
        let (primary, _) = good.next()?;
        if good.next().is_some() || (want_hedge && avoid(primary)) {
            return None;
        }
        let hedge = self
            .hosts
            .iter()
            .enumerate()
            .filter(|&(i, h)| i != primary && h.known() && !(want_hedge && avoid(i)))
            .min_by(|a, b| a.1.score().total_cmp(&b.1.score()))
            .map(|(i, _)| i);
        hedge?;
        Some(HostPick {
            primary,
            hedge: hedge.filter(|_| want_hedge),
        })
    }

    /// A pick whose primary is `primary`, with the hedge's host if
    /// `want_hedge`: the better of two other eligible hosts not avoided,
    /// drawn with `random` (the only one if one is left). The hedge exists
    /// because the primary may be slow, so it goes where latency is low
    /// now; but not always to the lowest: every worker reads the same
    /// costs, so the cheapest host took most hedges of the whole cluster
    /// (a review: 16 hosts within chance of each other, one named for 55%
    /// to 76% of hedges), and nothing in its cost pushed back (its score
    /// counts primaries in flight). Two choices never name the costliest
    /// candidate and spread the rest.
    pub fn pick_with_primary(
        &self,
        primary: HostId,
        want_hedge: bool,
        random: u64,
        avoid: impl Fn(HostId) -> bool,
    ) -> HostPick {
        let avoid = &avoid;
        let candidates = || {
            self.hosts
                .iter()
                .enumerate()
                .filter(move |&(i, h)| i != primary && h.known() && !h.probation && !avoid(i))
        };
        let count = if want_hedge { candidates().count() } else { 0 };
        let first = draw(candidates, &[], count, random);
        let second = first.and_then(|a| draw(candidates, &[a], count - 1, mix(random)));
        let score = |id: HostId| self.hosts.get(id).map_or(f64::INFINITY, Host::score);
        let hedge = match (first, second) {
            (Some(a), Some(b)) if score(b) < score(a) => Some(b),
            (a, _) => a,
        };
        HostPick { primary, hedge }
    }

    /// The override header's value for `pick`: `primary[,hedge]`.
    pub fn header_value(&self, pick: HostPick) -> Option<String> {
        let primary = self.hosts.get(pick.primary)?;
        Some(match pick.hedge.and_then(|h| self.hosts.get(h)) {
            Some(hedge) => format!("{},{}", primary.address, hedge.address),
            None => primary.address.clone(),
        })
    }
}

/// One host of `candidates` not in `drawn`, at random (`random`), of the
/// `left` there are (the callers count them once); `None` if none is left.
/// Uniform: the score weighs the weights (see `score`).
fn draw<'h, I>(
    candidates: impl Fn() -> I,
    drawn: &[HostId],
    left: usize,
    random: u64,
) -> Option<HostId>
where
    I: Iterator<Item = (HostId, &'h Host)>,
{
    if left == 0 {
        return None;
    }
    let at = (random % left as u64) as usize;
    candidates()
        .filter(|(i, _)| !drawn.contains(i))
        .nth(at)
        .map(|(i, _)| i)
}

/// Single-attempt responses checked before judging whether a cluster
/// follows the host header.
pub const OVERRIDE_CHECKS: u32 = 20;
/// Judgements in a row that must find the header ignored.
pub const OVERRIDE_JUDGEMENTS: u8 = 2;
/// How long host choice pauses on a cluster that ignores the header before
/// it is checked again (its config may change with xDS).
pub const OVERRIDE_RETRY_MS: u64 = 60_000;

/// Whether a cluster follows the host header: without the `override_host`
/// policy Envoy ignores it (harmless: its balancer picks), and the filter
/// should say so and stop paying for the choice. A named primary that did
/// not answer a single-attempt request was not followed; more than a
/// quarter of misses (a cluster of 2 hosts ignoring the header misses
/// half) is a cluster that ignores it, when two judgements in a row say so:
/// a cluster without the policy misses every time, while a moment of
/// misses on every host (an EDS update, seen on both workers at once in
/// tests/e2e/hosts.rs) is one judgement.
#[derive(Clone, Copy, Debug, Default)]
pub struct OverrideCheck {
    checks: u32,
    misses: u32,
    /// Judgements in a row that found the header ignored.
    ignoring: u8,
    ignored_since_ms: Option<u64>,
    logged: bool,
}

impl OverrideCheck {
    /// Checks made and missed since the last call
    /// (`Hosts::take_override_checks`).
    pub fn add(&mut self, checks: u32, misses: u32) {
        self.checks = self.checks.saturating_add(checks);
        self.misses = self.misses.saturating_add(misses);
    }

    pub fn ignored(&self) -> bool {
        self.ignored_since_ms.is_some()
    }

    /// On the tick: judges the checks made; true the first time a cluster
    /// is found to ignore the header (to log it once).
    pub fn tick(&mut self, now_ms: u64) -> bool {
        if let Some(since) = self.ignored_since_ms {
            // or since a time ahead of the clock (set back): checked again
            // now, not when the clock has caught up
            if now_ms.saturating_sub(since) >= OVERRIDE_RETRY_MS
                || since > now_ms.saturating_add(CLOCK_SLACK_MS)
            {
                *self = OverrideCheck {
                    logged: self.logged,
                    ..OverrideCheck::default()
                };
            }
            return false;
        }
        if self.checks < OVERRIDE_CHECKS {
            return false;
        }
        let ignored = self.misses.saturating_mul(4) > self.checks;
        self.checks = 0;
        self.misses = 0;
        self.ignoring = if ignored {
            self.ignoring.saturating_add(1)
        } else {
            0
        };
        if self.ignoring < OVERRIDE_JUDGEMENTS {
            return false;
        }
        self.ignored_since_ms = Some(now_ms);
        let first = !self.logged;
        self.logged = true;
        first
    }
}

/// The weight a failure keeps from `stamp_ms` to `now_ms`.
fn failure_keep(stamp_ms: u64, now_ms: u64) -> f64 {
    keep(stamp_ms, now_ms, FAILURE_DECAY_MS)
}

/// The share of a host's cost above the median host's kept from
/// `stamp_ms` to `now_ms` (see `COST_DECAY_MS`).
fn cost_keep(stamp_ms: u64, now_ms: u64) -> f64 {
    keep(stamp_ms, now_ms, COST_DECAY_MS)
}

/// What an exponential decay of time constant `tau_ms` keeps from
/// `stamp_ms` to `now_ms`.
fn keep(stamp_ms: u64, now_ms: u64, tau_ms: f64) -> f64 {
    (-(now_ms.saturating_sub(stamp_ms) as f64) / tau_ms).exp()
}

/// The lower median of the costs of the shared hosts measured enough to
/// be chosen by score (`MIN_HOST_SAMPLES`): what a costlier host's cost
/// drifts back to.
fn median_cost_log(shared: &[SharedHost]) -> Option<f64> {
    let mut costs: Vec<f64> = shared
        .iter()
        .filter(|s| s.samples >= MIN_HOST_SAMPLES)
        .map(|s| s.cost_log)
        .collect();
    if costs.len() < 2 {
        return None;
    }
    costs.sort_by(f64::total_cmp);
    costs.get((costs.len() - 1) / 2).copied()
}

/// SplitMix64's finaliser: one well-mixed draw per step.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000;

    /// Hosts measured at `latencies_us`, forty samples apiece, shared
    /// and refreshed (one tick).
    fn measured(latencies_us: &[f64]) -> Hosts {
        measured_with(latencies_us).0
    }

    fn measured_with(latencies_us: &[f64]) -> (Hosts, Vec<SharedHost>) {
        let mut hosts = Hosts::default();
        for (i, &us) in latencies_us.iter().enumerate() {
            let id = hosts
                .find_or_add(format!("10.0.0.{i}:80").as_bytes())
                .unwrap();
            for _ in 0..40 {
                hosts.observe(id, us);
            }
        }
        let mut shared = Vec::new();
        hosts.merge_into(&mut shared, T0, None);
        hosts.refresh(&shared, None);
        (hosts, shared)
    }

    /// Draws from a host: lognormal-ish around `median_us` (a fixed
    /// spread), `straggler` of them 10x.
    fn draw(state: &mut u64, median_us: f64, straggler: f64) -> f64 {
        *state = mix(*state);
        let u = (*state >> 11) as f64 / (1u64 << 53) as f64;
        *state = mix(*state);
        let v = (*state >> 11) as f64 / (1u64 << 53) as f64;
        let spread = (0.8 * (u - 0.5)).exp();
        median_us * spread * if v < straggler { 10.0 } else { 1.0 }
    }

    /// A cluster of more hosts than the shared value holds: the 64 first
    /// measured would take about all the traffic (the others are never
    /// chosen), so host choice steps aside while a host outside the value
    /// answers, and comes back some ticks after none does.
    #[test]
    fn more_hosts_than_the_value_holds_leave_the_choice_to_the_balancer() {
        let latencies = vec![1000.0; MAX_HOSTS];
        let (mut hosts, mut shared) = measured_with(&latencies);
        assert_eq!(shared.len(), MAX_HOSTS);
        assert!(hosts.choose(2, 1 << 63, true).is_some());
        // the 65th host answers (the balancer's exploration share)
        let extra = hosts.find_or_add(b"10.0.1.0:80").unwrap();
        hosts.observe(extra, 1000.0);
        hosts.merge_into(&mut shared, T0 + 1, None);
        assert_eq!(shared.len(), MAX_HOSTS, "no room in the value");
        assert!(hosts.refresh(&shared, None).overflowing);
        assert_eq!(hosts.choose(2, 1 << 63, true), None);
        // a cluster back within the value: after OVERFLOW_TICKS quiet ticks
        for tick in 1..=OVERFLOW_TICKS {
            let summary = hosts.refresh(&shared, None);
            assert_eq!(summary.overflowing, tick < OVERFLOW_TICKS, "{tick}");
        }
        assert!(hosts.choose(2, 1 << 63, true).is_some());
    }

    /// A host on probation gets no fresh attempt for its timeouts (it may
    /// be failing; the comment always said so, the filter did not).
    #[test]
    fn no_fresh_attempt_goes_to_a_host_on_probation() {
        let mut hosts = measured(&[1000.0, 1000.0, 1000.0, 50_000.0]);
        assert!(hosts.get(3).unwrap().probation);
        hosts.timed_out(3, 5);
        assert_eq!(hosts.needs_fresh_attempt(true), None);
        hosts.timed_out(1, 5);
        assert_eq!(hosts.needs_fresh_attempt(true), Some(1));
    }

    /// While the cluster's balancer is left to choose (Envoy in panic, a
    /// cluster past the value's hosts), no fresh attempt names a host:
    /// in a panic the held-out (ejected) hosts count as known again.
    #[test]
    fn no_fresh_attempt_while_the_balancer_chooses() {
        let mut hosts = measured(&[1000.0, 1000.0, 1000.0]);
        hosts.timed_out(1, 5);
        assert_eq!(hosts.needs_fresh_attempt(true), Some(1));
        hosts.panicking = true;
        assert_eq!(hosts.needs_fresh_attempt(true), None);
        hosts.panicking = false;
        hosts.overflow_ticks = 1;
        assert_eq!(hosts.needs_fresh_attempt(true), None);
    }

    /// The clock set back a day: the hosts stamped in the old time are
    /// forgotten `FORGET_MS` after the step, and their costs fade again.
    #[test]
    fn hosts_stamped_before_the_clock_was_set_back_are_forgotten_in_time() {
        let (_, shared) = measured_with(&[1000.0, 1000.0, 5000.0]);
        let back = T0.saturating_sub(86_400_000);
        let mut v = shared.clone();
        for s in v.iter_mut() {
            s.seen_ms = T0;
            s.stamp_ms = T0;
        }
        forget_silent(&mut v, back, None);
        assert_eq!(v.len(), shared.len(), "not forgotten at the step");
        assert!(v.iter().all(|s| s.stamp_ms == back && s.seen_ms == back));
        forget_silent(&mut v, back + FORGET_MS, None);
        assert!(v.is_empty());
        // a stamp a tick ahead (another worker's) is kept as it is
        let mut ahead = shared.clone();
        let stamp = ahead[0].stamp_ms;
        forget_silent(&mut ahead, stamp - 200, None);
        assert_eq!(ahead[0].stamp_ms, stamp);
    }

    /// A host still learning (fewer than `MIN_HOST_SAMPLES` answers, all
    /// from the exploration share) keeps its answers for two minutes of
    /// silence, a learned one for `FORGET_MS`.
    #[test]
    fn a_host_still_learning_is_kept_longer() {
        let host = |address: &str, samples| SharedHost {
            address: address.into(),
            cost_log: 7.0,
            failures: 0.0,
            samples,
            stamp_ms: T0,
            seen_ms: T0,
        };
        let mut v = vec![host("10.0.0.1:80", 400), host("10.0.0.9:80", 1)];
        forget_silent(&mut v, T0 + FORGET_MS, None);
        let left: Vec<&str> = v.iter().map(|h| h.address.as_str()).collect();
        assert_eq!(left, ["10.0.0.9:80"]);
        forget_silent(&mut v, T0 + FORGET_UNLEARNED_MS - 1, None);
        assert_eq!(v.len(), 1);
        forget_silent(&mut v, T0 + FORGET_UNLEARNED_MS, None);
        assert!(v.is_empty());
        // where the admin read lists the cluster's hosts, one it does not
        // list is gone (a rollout's old pods): forgotten in 10 s
        let mut v = vec![host("10.0.0.9:80", 1)];
        forget_silent(&mut v, T0 + FORGET_MS, Some(&[]));
        assert!(v.is_empty());
    }

    /// A silent host is forgotten after `FORGET_MS`, unless the admin
    /// interface's read lists it: Envoy still has it, and it is silent
    /// because two choices avoid it.
    #[test]
    fn a_silent_host_envoy_still_lists_is_not_forgotten() {
        let (_, shared) = measured_with(&[1000.0, 1000.0, 5000.0]);
        let later = T0 + FORGET_MS;
        let mut forgotten = shared.clone();
        forget_silent(&mut forgotten, later, None);
        assert!(forgotten.is_empty());
        let members: Vec<Member> = ["10.0.0.2:80"]
            .iter()
            .map(|a| Member {
                priority: 0,
                degraded: false,
                excluded: false,
                address: a.to_string(),
                weight: 1,
                healthy: true,
            })
            .collect();
        let mut kept = shared.clone();
        forget_silent(&mut kept, later, Some(&members));
        let kept: Vec<&str> = kept.iter().map(|h| h.address.as_str()).collect();
        assert_eq!(kept, ["10.0.0.2:80"]);
        // listed, but at a priority Envoy does not serve from (another
        // zone after a failover): the filter holds it out, so it is silent
        // for good, and forgotten
        let member = |i: usize, priority: u32| Member {
            address: format!("10.0.0.{i}:80"),
            weight: 1,
            healthy: true,
            degraded: false,
            excluded: false,
            priority,
        };
        let zones = [member(0, 0), member(1, 0), member(2, 1)];
        let mut elsewhere = shared;
        forget_silent(&mut elsewhere, later, Some(&zones));
        let kept: Vec<&str> = elsewhere.iter().map(|h| h.address.as_str()).collect();
        assert_eq!(kept, ["10.0.0.0:80", "10.0.0.1:80"]);
    }

    #[test]
    fn the_cost_rises_fast_and_falls_slowly() {
        let mut hosts = measured(&[1000.0]);
        for _ in 0..32 {
            hosts.observe(0, 3000.0);
        }
        let up = hosts.get(0).unwrap().cost_us();
        assert!(up > 2500.0, "32 responses 3x slower: {up}");
        for _ in 0..32 {
            hosts.observe(0, 1000.0);
        }
        let down = hosts.get(0).unwrap().cost_us();
        assert!(down > 1500.0, "32 fast ones later, still wary: {down}");
        for _ in 0..400 {
            hosts.observe(0, 1000.0);
        }
        assert!(hosts.get(0).unwrap().cost_us() < 1050.0);
    }

    /// The estimator against stragglers, over many ticks of random
    /// traffic: hosts with 5% stragglers are never put on probation; one
    /// 20 ms slower nearly always is; one with 30% stragglers is the
    /// costliest nearly always (p2c and the hedge avoid it), though not
    /// always far enough for probation.
    #[test]
    fn probation_tells_a_bad_host_from_ordinary_stragglers() {
        for (bad_median, bad_stragglers) in [(5_000.0, 0.30), (25_000.0, 0.05)] {
            let mut hosts = Hosts::default();
            let mut shared = Vec::new();
            let mut state = 42u64;
            let (mut bad_ticks, mut costliest_ticks, mut false_ticks) = (0, 0, 0);
            for tick in 0..300u64 {
                for _ in 0..25 {
                    for i in 0..4 {
                        let (median, stragglers) = if i == 3 {
                            (bad_median, bad_stragglers)
                        } else {
                            (5_000.0, 0.05)
                        };
                        let id = hosts.find_or_add(format!("h{i}").as_bytes()).unwrap();
                        hosts.observe(id, draw(&mut state, median, stragglers));
                    }
                }
                hosts.merge_into(&mut shared, T0 + tick * 200, None);
                let summary = hosts.refresh(&shared, None);
                if tick >= 10 {
                    bad_ticks += usize::from(hosts.get(3).unwrap().probation);
                    let bad_cost = hosts.get(3).unwrap().cost_us();
                    costliest_ticks +=
                        usize::from((0..3).all(|i| hosts.get(i).unwrap().cost_us() < bad_cost));
                    false_ticks +=
                        summary.on_probation - usize::from(hosts.get(3).unwrap().probation);
                }
            }
            assert!(
                costliest_ticks >= 270,
                "{bad_median}: bad host costliest {costliest_ticks} of 290 ticks"
            );
            if bad_median > 5_000.0 {
                assert!(
                    bad_ticks >= 280,
                    "{bad_median}: bad host on probation {bad_ticks} of 290 ticks"
                );
            }
            assert_eq!(false_ticks, 0, "{bad_median}: good hosts put on probation");
        }
    }

    /// Traffic over four hosts at `per_tick` requests a tick (200 ms), the
    /// hosts chosen as the filter chooses them (the balancer's round robin
    /// for the exploration share), no request in flight across a choice;
    /// `latency(host, tick, draws)` answers. Calls `each_tick(tick,
    /// hosts, chosen per host)` after every tick's refresh.
    fn choose_over_ticks(
        per_tick: u64,
        ticks: u64,
        latency: impl Fn(usize, u64, (f64, f64)) -> f64,
        mut each_tick: impl FnMut(u64, &Hosts, [u64; 4]),
    ) {
        let mut hosts = Hosts::default();
        for i in 0..4 {
            hosts.find_or_add(format!("h{i}").as_bytes()).unwrap();
        }
        let mut shared = Vec::new();
        // the answers draw from a stream of their own: drawn from the
        // choice's, a host's latency followed the number that drew it
        let (mut state, mut answers, mut round_robin) = (9u64, 90u64, 0usize);
        let unit = |state: &mut u64| {
            *state = mix(*state);
            (*state >> 11) as f64 / (1u64 << 53) as f64
        };
        for tick in 0..ticks {
            let mut chosen = [0u64; 4];
            for _ in 0..per_tick {
                state = mix(state);
                let id = match hosts.choose(2, state, false) {
                    Some(pick) => pick.primary,
                    None => {
                        round_robin += 1;
                        round_robin % 4
                    }
                };
                let draws = (unit(&mut answers), unit(&mut answers));
                hosts.observe(id, latency(id, tick, draws));
                if let Some(n) = chosen.get_mut(id) {
                    *n += 1;
                }
            }
            hosts.merge_into(&mut shared, T0 + tick * 200, None);
            hosts.refresh(&shared, None);
            each_tick(tick, &hosts, chosen);
        }
    }

    /// About 5 ms, a fixed spread; `stragglers` of them 10x.
    fn answer(median_us: f64, stragglers: f64, (u, v): (f64, f64)) -> f64 {
        median_us * (0.8 * (u - 0.5)).exp() * if v < stragglers { 10.0 } else { 1.0 }
    }

    /// A host 10x slow for one second: two choices never pick the costlier
    /// of two, so it got only the exploration share, too few answers to
    /// show it recovered, and stayed the costliest (no primaries) for about
    /// nine minutes at 50 requests a second. Its cost above the median
    /// host's now fades with time: tried again within seconds.
    #[test]
    fn a_host_slow_for_a_moment_is_tried_again_within_seconds() {
        let (slow_from, slow_to) = (50, 55);
        let mut back_at = None;
        choose_over_ticks(
            10,
            slow_to + 600,
            |id, tick, draws| {
                let slow = id == 3 && (slow_from..slow_to).contains(&tick);
                answer(if slow { 50_000.0 } else { 5_000.0 }, 0.0, draws)
            },
            |tick, hosts, _| {
                let cost = |i| hosts.get(i).map_or(0.0, Host::cost_us);
                let costliest = (0..3).all(|i| cost(i) <= cost(3));
                if tick == slow_to {
                    assert!(costliest, "the slow host is the costliest when it recovers");
                }
                if tick > slow_to && !costliest && back_at.is_none() {
                    back_at = Some(tick);
                }
            },
        );
        let seconds = back_at.map_or(f64::INFINITY, |t| (t - slow_to) as f64 * 0.2);
        // measured about 22 s; 535 s before
        assert!(
            seconds <= 60.0,
            "the costliest for {seconds} s after it recovered"
        );
    }

    /// What fading costs: a host that stays slow is seen again within a few
    /// answers, so it still gets about the exploration share.
    #[test]
    fn a_host_that_stays_slow_still_gets_about_the_exploration_share() {
        for (per_tick, median_us, stragglers) in [
            (10, 25_000.0, 0.0),
            (10, 5_000.0, 0.3),
            (10, 7_500.0, 0.0),
            (100, 25_000.0, 0.0),
            (100, 5_000.0, 0.3),
        ] {
            let (mut to_slow, mut total) = (0u64, 0u64);
            choose_over_ticks(
                per_tick,
                3_000,
                |id, _, draws| match id {
                    3 => answer(median_us, stragglers, draws),
                    _ => answer(5_000.0, 0.0, draws),
                },
                |tick, _, chosen| {
                    if tick >= 100 {
                        to_slow += chosen[3];
                        total += chosen.iter().sum::<u64>();
                    }
                },
            );
            // the exploration share alone is 0.25%; measured 0.25-0.97%
            let share = to_slow as f64 / total as f64;
            assert!(
                share <= 0.01,
                "{per_tick} a tick, {median_us} us, {stragglers}: {share}"
            );
        }
    }

    #[test]
    fn the_slow_host_is_never_chosen_and_never_the_hedge() {
        let hosts = measured(&[1000.0, 1100.0, 900.0, 21_000.0]);
        assert!(hosts.get(3).unwrap().probation);
        let mut to_slow = 0;
        let mut chosen = 0;
        let mut state = 7u64;
        for _ in 0..10_000 {
            state = mix(state);
            if let Some(pick) = hosts.choose(2, state, true) {
                chosen += 1;
                to_slow += usize::from(pick.primary == 3);
                assert_ne!(pick.hedge, Some(3));
                assert_ne!(pick.hedge, Some(pick.primary));
                assert!(pick.hedge.is_some());
            }
        }
        assert_eq!(to_slow, 0, "on probation: exploration traffic only");
        let explored = 10_000 - chosen;
        assert!(
            (50..150).contains(&explored),
            "about 1% explored: {explored}"
        );
    }

    #[test]
    fn without_probation_two_choices_avoid_the_slowest() {
        // 2x slower: not on probation, but p2c never picks it over another
        let hosts = measured(&[1000.0, 1000.0, 1000.0, 2000.0]);
        assert!(!hosts.get(3).unwrap().probation);
        let (mut to_slow, mut picked) = (0, 0);
        let mut state = 11u64;
        for _ in 0..10_000 {
            state = mix(state);
            if let Some(pick) = hosts.choose(2, state, false) {
                picked += 1;
                to_slow += usize::from(pick.primary == 3);
                assert_eq!(pick.hedge, None);
            }
        }
        assert_eq!(to_slow, 0);
        // all but the exploration share (1%) were chosen
        assert!(picked >= 9_800, "{picked} chosen");
    }

    #[test]
    fn in_flight_spreads_the_load_over_equal_hosts() {
        let mut hosts = measured(&[1000.0, 1000.0, 1000.0]);
        let mut counts = [0usize; 3];
        let mut state = 3u64;
        for _ in 0..3000 {
            state = mix(state);
            if let Some(pick) = hosts.choose(2, state, false) {
                counts[pick.primary] += 1;
                hosts.track(pick, true);
            }
        }
        for c in counts {
            assert!((800..1200).contains(&c), "{counts:?}");
        }
    }

    /// Sixteen hosts whose costs differ within chance (under 6%), one
    /// request in flight at a time: the hedges spread over the hosts and
    /// never go to the costliest candidate. Naming the cheapest other host,
    /// as before, gave host 0 three quarters of the cluster's hedges (every
    /// worker reads the same costs) and hosts 3 to 15 none.
    #[test]
    fn hedges_spread_over_hosts_alike_and_skip_the_costliest() {
        let costs: Vec<f64> = (0..16).map(|i| 1000.0 + 3.5 * f64::from(i)).collect();
        let hosts = measured(&costs);
        let mut named = [0u32; 16];
        let mut state = 11u64;
        for _ in 0..20_000 {
            state = mix(state);
            let Some(pick) = hosts.choose(2, state, true) else {
                continue;
            };
            let hedge = pick.hedge.expect("a hedge host among 16");
            assert_ne!(hedge, pick.primary);
            named[hedge] += 1;
        }
        let total: u32 = named.iter().sum();
        // fair: 1/16 (6.25%); two choices favour the cheaper ones
        assert!(named.iter().all(|&n| n * 8 < total), "{named:?}");
        assert!(
            named.iter().filter(|&&n| n * 40 > total).count() >= 12,
            "{named:?}"
        );
        // the costliest is the hedge only when it is the primary's one
        // other candidate drawn against a cheaper one: never
        assert_eq!(named[15], 0, "{named:?}");
    }

    /// Four hosts measured alike, the third failed 50 times, merged at T0.
    fn four_hosts_the_third_failing() -> (Hosts, Vec<SharedHost>) {
        let (mut hosts, mut shared) = measured_with(&[1000.0, 1000.0, 1000.0, 1000.0]);
        for _ in 0..50 {
            hosts.fail(2);
        }
        hosts.merge_into(&mut shared, T0, None);
        (hosts, shared)
    }

    /// A cluster nobody sent a request to since the last tick: its shared
    /// hosts are left as they are (no write), and the fades catch up at the
    /// next news, over the whole time.
    #[test]
    fn an_idle_cluster_s_hosts_are_not_rewritten() {
        let (mut hosts, mut shared) = four_hosts_the_third_failing();
        hosts.refresh(&shared, None);
        let before = shared.clone();
        hosts.merge_into(&mut shared, T0 + 200, None);
        hosts.merge_into(&mut shared, T0 + 8_000, None);
        assert_eq!(shared, before, "nothing to write");
        hosts.observe(0, 1000.0);
        hosts.merge_into(&mut shared, T0 + 8_000, None);
        assert!(
            shared[2].failures < FAILURE_CAP / 2.0,
            "{}",
            shared[2].failures
        );
    }

    #[test]
    fn failures_count_as_slowness_and_fade() {
        let (mut hosts, mut shared) = four_hosts_the_third_failing();
        assert_eq!(hosts.refresh(&shared, None).on_probation, 1);
        assert!(hosts.get(2).unwrap().probation);
        assert_eq!(
            shared[2].failures, FAILURE_CAP,
            "a minute of failures counts as {FAILURE_CAP}"
        );
        // with time alone (nothing measured of it: on probation,
        // unexplored) it fades, while the others answer
        hosts.observe(0, 1000.0);
        hosts.merge_into(&mut shared, T0 + 8_000, None);
        hosts.refresh(&shared, None);
        assert!(!hosts.get(2).unwrap().probation);
        // failing again, then two successes (exploration) bring it back
        for _ in 0..10 {
            hosts.fail(2);
        }
        hosts.merge_into(&mut shared, T0 + 8_200, None);
        hosts.refresh(&shared, None);
        assert!(hosts.get(2).unwrap().probation);
        hosts.observe(2, 1000.0);
        hosts.observe(2, 1000.0);
        hosts.merge_into(&mut shared, T0 + 8_400, None);
        hosts.refresh(&shared, None);
        assert!(!hosts.get(2).unwrap().probation, "{:?}", shared[2]);
    }

    /// A host Envoy no longer has: every time it was named, another host
    /// answered. It is not chosen until it answers; the cluster is not
    /// blamed. Misses spread over the hosts are the cluster's.
    #[test]
    fn a_host_missed_every_time_is_unreachable_until_it_answers() {
        let mut hosts = measured(&[1000.0, 1000.0, 1000.0, 1000.0]);
        for id in 0..4 {
            for _ in 0..5 {
                hosts.record_override(id, id != 1);
            }
        }
        assert_eq!(hosts.take_override_checks(), (15, 0));
        let (mut state, mut picked) = (5u64, 0);
        for _ in 0..2000 {
            state = mix(state);
            if let Some(pick) = hosts.choose(2, state, true) {
                picked += 1;
                assert_ne!(pick.primary, 1);
                assert_ne!(pick.hedge, Some(1));
            }
        }
        assert!(picked >= 1_900, "{picked} chosen");
        hosts.answered(1);
        assert!((0..2000u64).any(|r| hosts.choose(2, mix(r), false).map(|p| p.primary) == Some(1)));
        // a cluster that ignores the header: misses on most named hosts
        for id in 0..4 {
            for k in 0..3 {
                hosts.record_override(id, k == 0);
            }
        }
        assert_eq!(hosts.take_override_checks(), (12, 8));
        assert!((0..4).all(|id| hosts.get(id).unwrap().known()));
        // a single miss beside hosts followed is no verdict on the host,
        // nor on the cluster
        hosts.record_override(0, false);
        hosts.record_override(1, true);
        hosts.record_override(2, true);
        hosts.record_override(2, true);
        assert_eq!(hosts.take_override_checks(), (3, 0));
        assert!(hosts.get(0).unwrap().known());
        // single misses on most named hosts are the cluster's (h0's miss
        // above carried over: not followed since)
        hosts.record_override(0, false);
        hosts.record_override(1, false);
        hosts.record_override(2, true);
        hosts.record_override(2, true);
        assert_eq!(hosts.take_override_checks(), (5, 3));
        // a host missed every time (twice) beside another host's one miss:
        // not marked unreachable (not concentrated), and its misses are no
        // verdict on the cluster; the other miss counts
        for _ in 0..2 {
            hosts.record_override(3, false);
        }
        for k in 0..5 {
            hosts.record_override(0, k != 0);
            hosts.record_override(1, true);
            hosts.record_override(2, true);
        }
        assert_eq!(hosts.take_override_checks(), (15, 1));
        assert!(hosts.get(3).unwrap().known());
    }

    /// Few reads a tick are judged together: a removed host read missed
    /// once a tick, beside one other host followed now and then, is found
    /// unreachable, and the cluster is not blamed; a host missed every time
    /// it is read carries its reads over to the next judgement. However
    /// few, reads are judged after `MAX_UNJUDGED_TICKS`.
    #[test]
    fn few_reads_a_tick_are_judged_together() {
        let mut hosts = measured(&[1000.0, 1000.0, 1000.0, 1000.0]);
        hosts.record_override(1, false);
        assert_eq!(hosts.take_override_checks(), (0, 0));
        hosts.record_override(1, false);
        hosts.record_override(0, true);
        assert_eq!(hosts.take_override_checks(), (0, 0));
        assert!(hosts.get(1).unwrap().known());
        hosts.record_override(1, false);
        assert_eq!(hosts.take_override_checks(), (1, 0));
        assert!(!hosts.get(1).unwrap().known(), "h1 is unreachable");
        // read once a judgement beside hosts followed: carried over until
        // it is followed, so the second judgement finds it lost
        let mut hosts = measured(&[1000.0, 1000.0, 1000.0, 1000.0]);
        for judgement in 0..2 {
            hosts.record_override(3, false);
            hosts.record_override(0, true);
            hosts.record_override(2, true);
            hosts.record_override(0, true);
            assert_eq!(hosts.take_override_checks(), (3, 0));
            assert_eq!(hosts.get(3).unwrap().known(), judgement == 0);
        }
        // one read, then nothing: judged on the tenth tick
        hosts.record_override(2, false);
        for _ in 1..MAX_UNJUDGED_TICKS {
            assert_eq!(hosts.take_override_checks(), (0, 0));
        }
        assert_eq!(hosts.take_override_checks(), (1, 1));
    }

    #[test]
    fn never_more_than_half_on_probation_and_few_hosts_mean_no_choice() {
        let hosts = measured(&[1000.0, 50_000.0, 60_000.0, 70_000.0]);
        assert!(
            (0..4).all(|i| !hosts.get(i).unwrap().probation),
            "the median itself is slow: the cluster is"
        );
        let two = measured(&[1000.0, 50_000.0]);
        assert!(two.get(1).unwrap().probation);
        // the fast host takes the primaries (left to the balancer, the
        // slow one had half), the slow one the hedges Envoy would send it
        assert_eq!(
            two.choose(2, 1 << 63, true),
            Some(HostPick {
                primary: 0,
                hedge: Some(1)
            })
        );
        assert_eq!(
            two.choose(2, 1 << 63, false),
            Some(HostPick {
                primary: 0,
                hedge: None
            })
        );
        // with it avoided (timeouts standing), the balancer's
        assert_eq!(two.choose_avoiding(2, 1 << 63, true, |i| i == 0), None);
        // one known host alone: the balancer's
        let one = measured(&[1000.0]);
        assert_eq!(one.choose(2, 1 << 63, true), None);
    }

    /// Two workers learn together: what each saw reaches the other at the
    /// tick, and neither's movement is lost.
    #[test]
    fn workers_share_their_costs_on_the_tick() {
        let (mut a, mut b) = (Hosts::default(), Hosts::default());
        let mut shared = Vec::new();
        let x = a.find_or_add(b"x:80").unwrap();
        for _ in 0..20 {
            a.observe(x, 1000.0);
        }
        a.merge_into(&mut shared, T0, None);
        a.refresh(&shared, None);
        b.merge_into(&mut shared, T0, None);
        b.refresh(&shared, None);
        let bx = b.find_or_add(b"x:80").unwrap();
        assert!((b.get(bx).unwrap().cost_us() - 1000.0).abs() < 1.0);
        // both see it turn slow; together the cost moves further than either alone
        for _ in 0..4 {
            a.observe(x, 8000.0);
            b.observe(bx, 8000.0);
        }
        let alone = a.get(x).unwrap().cost_us();
        a.merge_into(&mut shared, T0 + 200, None);
        b.merge_into(&mut shared, T0 + 200, None);
        b.refresh(&shared, None);
        let together = b.get(bx).unwrap().cost_us();
        assert!(together > alone * 1.2, "{together} vs {alone}");
        assert_eq!(shared.first().unwrap().samples, 28);
    }

    /// Many workers, each seeing many answers a tick: the shared cost
    /// follows the latency and never passes it. Adding every worker's
    /// movement in full took it 8 x 96% of the way in one tick, to about
    /// e^35 µs, a value the decoder refuses.
    #[test]
    fn many_busy_workers_move_the_shared_cost_no_further_than_the_latency() {
        let mut workers: Vec<Hosts> = (0..8).map(|_| Hosts::default()).collect();
        let mut shared = Vec::new();
        let mut now = T0;
        let mut tick = |workers: &mut Vec<Hosts>, shared: &mut Vec<SharedHost>, us: f64| {
            now += 200;
            for w in workers.iter_mut() {
                let x = w.find_or_add(b"x:80").unwrap();
                for i in 0..50 {
                    // a little noise around the latency, both ways
                    w.observe(x, us * (0.9 + 0.2 * f64::from(i % 2)));
                }
            }
            for w in workers.iter_mut() {
                w.merge_into(shared, now, None);
            }
            for w in workers.iter_mut() {
                w.refresh(shared, None);
            }
            shared.first().unwrap().cost_log.exp()
        };
        for _ in 0..5 {
            tick(&mut workers, &mut shared, 1_000.0);
        }
        let steady = tick(&mut workers, &mut shared, 1_000.0);
        assert!((900.0..1_100.0).contains(&steady), "{steady}");
        // the host turns 100 times slower: within a tick or two, not past it
        for i in 0..10 {
            let cost = tick(&mut workers, &mut shared, 100_000.0);
            assert!(cost <= 110_000.0, "tick {i}: {cost}");
            if i >= 2 {
                assert!(cost >= 80_000.0, "tick {i}: {cost}");
            }
        }
        // and back, as fast as one worker given all the answers would
        for i in 0..3 {
            let cost = tick(&mut workers, &mut shared, 1_000.0);
            assert!(cost >= 900.0, "tick {i}: {cost}");
            if i == 2 {
                assert!(cost < 2_000.0, "tick {i}: {cost}");
            }
        }
    }

    #[test]
    fn silent_hosts_are_forgotten_and_the_table_is_bounded() {
        let (mut hosts, mut shared) = measured_with(&[1000.0, 1000.0]);
        hosts.observe(0, 1000.0);
        hosts.merge_into(&mut shared, T0 + FORGET_MS - 1, None);
        hosts.observe(0, 1000.0);
        hosts.merge_into(&mut shared, T0 + FORGET_MS + 1, None);
        assert_eq!(hosts.refresh(&shared, None).tracked, 1);
        assert!(hosts.get(1).unwrap().gone);
        // its slot goes to the next new host once nothing names it, as
        // primary or as a hedge's host
        let primary = HostPick {
            primary: 1,
            hedge: None,
        };
        let hedge = HostPick {
            primary: 0,
            hedge: Some(1),
        };
        hosts.track(primary, true);
        hosts.track(hedge, true);
        assert_eq!(hosts.find_or_add(b"new:80"), Some(2));
        hosts.track(primary, false);
        assert_eq!(hosts.find_or_add(b"new2:80"), Some(3));
        hosts.track(hedge, false);
        assert_eq!(hosts.find_or_add(b"newer:80"), Some(1));
        let mut many = Hosts::default();
        for i in 0..(3 * MAX_HOSTS) {
            many.find_or_add(format!("10.1.{}.{}:80", i / 256, i % 256).as_bytes());
        }
        assert_eq!(many.len(), 2 * MAX_HOSTS);
        assert_eq!(many.find_or_add(b""), None);
        for id in 0..many.len() {
            many.observe(id, 1000.0);
        }
        let mut shared = Vec::new();
        many.merge_into(&mut shared, T0, None);
        assert_eq!(shared.len(), MAX_HOSTS);
    }

    #[test]
    fn a_cluster_that_ignores_the_header_is_found_paused_and_checked_again() {
        let mut check = OverrideCheck::default();
        check.add(40, 2); // 1 in 20 missed
        assert!(!check.tick(T0));
        assert!(!check.ignored());
        // a moment of misses everywhere (an EDS update): one judgement
        check.add(OVERRIDE_CHECKS, OVERRIDE_CHECKS / 2);
        assert!(!check.tick(T0));
        check.add(OVERRIDE_CHECKS, 0);
        assert!(!check.tick(T0));
        assert!(!check.ignored());
        // round robin over two hosts: half the named hosts answer, every time
        check.add(OVERRIDE_CHECKS, OVERRIDE_CHECKS / 2);
        assert!(!check.tick(T0));
        check.add(OVERRIDE_CHECKS, OVERRIDE_CHECKS / 2);
        assert!(check.tick(T0), "logged the first time");
        assert!(check.ignored());
        assert!(!check.tick(T0 + OVERRIDE_RETRY_MS - 1));
        assert!(check.ignored());
        assert!(!check.tick(T0 + OVERRIDE_RETRY_MS));
        assert!(!check.ignored(), "checked again");
        for _ in 0..OVERRIDE_JUDGEMENTS {
            check.add(OVERRIDE_CHECKS, OVERRIDE_CHECKS);
            assert!(
                !check.tick(T0 + OVERRIDE_RETRY_MS + 200),
                "logged once only"
            );
        }
        assert!(check.ignored());
    }

    /// A host of another locality (Istio's failover: priority 1), the
    /// fastest, learned while it served: held out while the local hosts
    /// take all the traffic, and no host named while they spill over.
    #[test]
    fn hosts_outside_the_priority_envoy_serves_from_are_held_out() {
        let (mut hosts, shared) = measured_with(&[2000.0, 2000.0, 2000.0, 500.0]);
        let member = |i: usize, healthy: bool, priority: u32| Member {
            address: format!("10.0.0.{i}:80"),
            weight: 1,
            healthy,
            degraded: false,
            excluded: false,
            priority,
        };
        let said = [
            member(0, true, 0),
            member(1, true, 0),
            member(2, true, 0),
            member(3, true, 1),
        ];
        assert_eq!(hosts.refresh(&shared, Some(&said)).held_out, 1);
        let picks: Vec<HostPick> = (0..200u64)
            .filter_map(|r| hosts.choose(2, mix(r), true))
            .collect();
        assert!(picks.len() > 150);
        assert!(
            picks.iter().all(|p| p.primary != 3 && p.hedge != Some(3)),
            "{picks:?}"
        );
        // one local host down: the rest spill to the other locality
        let said = [
            member(0, false, 0),
            member(1, true, 0),
            member(2, true, 0),
            member(3, true, 1),
        ];
        hosts.refresh(&shared, Some(&said));
        assert!((0..200u64).all(|r| hosts.choose(2, mix(r), true).is_none()));
        // without priorities, the fastest host is chosen (the control)
        let said = [
            member(0, true, 0),
            member(1, true, 0),
            member(2, true, 0),
            member(3, true, 0),
        ];
        assert_eq!(hosts.refresh(&shared, Some(&said)).held_out, 0);
        assert!((0..200u64)
            .filter_map(|r| hosts.choose(2, mix(r), true))
            .any(|p| p.primary == 3));
    }

    #[test]
    fn envoy_s_word_holds_hosts_out_and_weighs_them_short_of_its_panic_threshold() {
        let (mut hosts, shared) = measured_with(&[2000.0, 2000.0, 2000.0, 2000.0]);
        let shared_four = shared.clone();
        let address = |i: usize| format!("10.0.0.{i}:80");
        let member = |i: usize, weight: u32, healthy: bool| Member {
            priority: 0,
            degraded: false,
            excluded: false,
            address: address(i),
            weight,
            healthy,
        };
        // host 1 unhealthy, host 3 gone from the cluster, host 0 of weight 4
        let said = [member(0, 4, true), member(1, 1, false), member(2, 1, true)];
        assert_eq!(hosts.refresh(&shared, Some(&said)).held_out, 2);
        let picks: Vec<HostPick> = (0..200u64)
            .filter_map(|r| hosts.choose(2, mix(r), true))
            .collect();
        assert!(picks.len() > 150);
        assert!(picks.iter().all(|p| p.primary == 0 || p.primary == 2));
        assert!(picks
            .iter()
            .all(|p| p.hedge != Some(1) && p.hedge != Some(3)));
        // with two eligible hosts both are drawn: the heavier one wins
        assert!(picks.iter().all(|p| p.primary == 0), "{picks:?}");
        // fewer than half healthy: Envoy's balancer applies its own panic
        // threshold (spreading over all, or, at 0, keeping to the healthy),
        // so the filter names no host
        let said = [
            member(0, 1, false),
            member(1, 1, false),
            member(2, 1, false),
            member(3, 1, true),
        ];
        assert_eq!(hosts.refresh(&shared, Some(&said)).held_out, 0);
        assert!((0..200u64).all(|r| hosts.choose(2, mix(r), true).is_none()));
        // nor with hosts Envoy leaves out of its count: new hosts waiting
        // for their first check are no panic (2 of 2 counted healthy)
        let (mut six, shared_six) = measured_with(&[2000.0; 6]);
        let pending = |i: usize| Member {
            excluded: true,
            ..member(i, 1, false)
        };
        let said: Vec<Member> = (0..6)
            .map(|i| {
                if i < 2 {
                    member(i, 1, true)
                } else {
                    pending(i)
                }
            })
            .collect();
        assert_eq!(six.refresh(&shared_six, Some(&said)).held_out, 4);
        assert!((0..200u64).any(|r| six.choose(2, mix(r), true).is_some()));
        // half healthy is not panic
        let said = [
            member(0, 1, false),
            member(1, 1, false),
            member(2, 1, true),
            member(3, 1, true),
        ];
        assert_eq!(hosts.refresh(&shared, Some(&said)).held_out, 2);
        // a degraded host (an active health check draining it) gets
        // nothing from Envoy while the healthy ones are enough (1.4 x
        // healthy >= all), and is held out; with too few, it serves
        let degraded = |i: usize| Member {
            degraded: true,
            ..member(i, 1, true)
        };
        let said = [
            member(0, 1, true),
            degraded(1),
            member(2, 1, true),
            member(3, 1, true),
        ];
        assert_eq!(hosts.refresh(&shared, Some(&said)).held_out, 1);
        assert!((0..200u64)
            .filter_map(|r| hosts.choose(2, mix(r), true))
            .all(|p| p.primary != 1 && p.hedge != Some(1)));
        let said = [
            member(0, 1, true),
            degraded(1),
            degraded(2),
            member(3, 1, true),
        ];
        assert_eq!(hosts.refresh(&shared, Some(&said)).held_out, 0);
        // an IPv6 host is found by its address as Envoy writes it
        let mut v6 = Hosts::default();
        for a in ["[::1]:80", "[fe80::2]:80"] {
            let id = v6.find_or_add(a.as_bytes()).unwrap();
            for _ in 0..10 {
                v6.observe(id, 1000.0);
            }
        }
        let mut shared = Vec::new();
        v6.merge_into(&mut shared, T0, None);
        let said = [
            Member {
                priority: 0,
                degraded: false,
                excluded: false,
                address: "[::1]:80".into(),
                weight: 1,
                healthy: true,
            },
            Member {
                priority: 0,
                degraded: false,
                excluded: false,
                address: "[fe80::2]:80".into(),
                weight: 1,
                healthy: false,
            },
        ];
        assert_eq!(v6.refresh(&shared, Some(&said)).held_out, 1);
        assert!(v6.get(1).is_some_and(|h| h.held_out));
        // a read naming none of the hosts known here holds none out
        let said = [member(7, 1, true)];
        assert_eq!(hosts.refresh(&shared_four, Some(&said)).held_out, 0);
    }

    #[test]
    fn the_header_names_primary_then_hedge() {
        let hosts = measured(&[1000.0, 1000.0]);
        let pick = HostPick {
            primary: 1,
            hedge: Some(0),
        };
        assert_eq!(
            hosts.header_value(pick).as_deref(),
            Some("10.0.0.1:80,10.0.0.0:80")
        );
        let alone = HostPick {
            primary: 0,
            hedge: None,
        };
        assert_eq!(hosts.header_value(alone).as_deref(), Some("10.0.0.0:80"));
    }
}
