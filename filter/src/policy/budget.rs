//! The hedge budget: extra upstream attempts are paid with tokens, and tokens
//! are earned only by requests the cluster really receives. No "expected rate"
//! to configure: at 10 req/s or 10,000 req/s the budget is the same share.
//!
//! Per request (worker-local, no shared memory):
//! - every request to the cluster earns `share` tokens (0.1 for a 10% budget),
//!   while the worker holds less than `burst` free tokens;
//! - arming sets aside the hedge's expected cost (`set_aside`: 0.08 of a
//!   token when the delay is the p92), not a whole token: most armed requests
//!   finish before their delay;
//! - once the delay of a request armed in some tick has passed (checked on
//!   the ticks), a request of that tick still running has sent its hedge:
//!   the rest of its token is charged then, not when it ends, so that a long
//!   request's hedge is paid when it is sent;
//! - when the request ends, what it did not use comes back: the set-aside of
//!   a request that ended before its delay, the token of a hedge that was
//!   charged but not sent. The balance may go below zero (a debt); arming
//!   waits until the cluster's own traffic has repaid it.
//!
//! The limit on arming: if every armed request not yet charged hedged at
//! once (a stall, or an outage making them all outlive the delay), the debt
//! must stay within the exposure cap: `burst`, or twice what the requests of
//! the last tick plus one delay would cost if that is more. So the cap
//! follows the rate (at high rates many requests are armed at once) without
//! refusing hedges while tokens sit idle; and a stall costs at most one
//! hedge per request armed in that short span, once.
//!
//! Across workers (on the sync tick): a worker above `burst` free tokens
//! deposits the surplus into the cluster's shared pool (itself capped at
//! `burst`), and a worker below `burst` withdraws from it (a worker in debt
//! repays from it). So tokens earned on one worker pay for hedges on another,
//! and over any period
//!     extra attempts <= share * requests + (workers + 1) * burst
//!                       + the exposure caps (the most debt left at its end)

use std::collections::VecDeque;

/// Ticks of armed requests kept apart at most; older ones are charged as
/// hedged (conservative: a delay longer than this many ticks is charged
/// early and refunded when its request ends first).
const MAX_COHORTS: usize = 64;

/// Token amounts are kept in millionths of a token, so that ten requests at
/// a 10% share earn exactly one token (no floating-point drift).
pub const MICROS_PER_TOKEN: u64 = 1_000_000;
const TOKEN: i64 = MICROS_PER_TOKEN as i64;

/// Converts a fraction of a token (0.1) or a token count (10.0) to micro-tokens.
pub fn micro_tokens(tokens: f64) -> u64 {
    (tokens * MICROS_PER_TOKEN as f64).round() as u64
}

fn signed(micros: u64) -> i64 {
    i64::try_from(micros).unwrap_or(i64::MAX)
}

/// A cluster's budget in micro-tokens, derived once from its policy
/// (`hedge_delay::budget_terms`), not per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetTerms {
    /// Earned per request.
    pub share: u64,
    /// Most free tokens a worker (and the shared pool) keeps; most debt.
    pub burst: u64,
    /// Set aside per armed hedge (its expected cost, at most one token).
    pub set_aside: u64,
}

/// The armed hedges of one tick not yet charged in full.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Cohort {
    tick: u64,
    hedges: u64,
    /// The tick from which they have all passed their delay.
    due: u64,
}

/// One worker's tokens for one cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalBudget {
    terms: BudgetTerms,
    /// Free micro-tokens; negative while hedges sent are being repaid.
    free: i64,
    /// Armed hedges not yet charged in full, by the tick they were armed in.
    cohorts: VecDeque<Cohort>,
    /// The most the cohorts may cost beyond their set-asides (see `tick`).
    exposure_cap: i64,
    /// The worker's tick count (see `tick`).
    now: u64,
}

impl LocalBudget {
    pub fn new(terms: BudgetTerms) -> Self {
        LocalBudget {
            terms,
            free: 0,
            cohorts: VecDeque::new(),
            exposure_cap: signed(terms.burst),
            now: 0,
        }
    }

    #[cfg(test)]
    fn free_tokens(&self) -> f64 {
        self.free as f64 / MICROS_PER_TOKEN as f64
    }

    fn set_aside(&self) -> i64 {
        signed(self.terms.set_aside).min(TOKEN)
    }

    /// What the armed hedges not yet charged would cost beyond their
    /// set-asides if every one was sent.
    fn exposure(&self) -> i64 {
        let hedges: u64 = self.cohorts.iter().map(|c| c.hedges).sum();
        signed(hedges).saturating_mul(TOKEN - self.set_aside())
    }

    /// A request arrived for the cluster.
    pub fn earn(&mut self) {
        let burst = signed(self.terms.burst);
        if self.free < burst {
            self.free = self
                .free
                .saturating_add(signed(self.terms.share))
                .min(burst);
        }
    }

    /// How many of `wanted` hedges the budget can pay for now: as many as
    /// there are whole free tokens, and as keep the worst case (every armed
    /// hedge not yet charged sent at once) within the exposure cap.
    pub fn affordable(&self, wanted: u32) -> u32 {
        let headroom = self
            .free
            .saturating_sub(self.exposure())
            .saturating_add(self.exposure_cap);
        (headroom / TOKEN)
            .min(self.free / TOKEN)
            .clamp(0, i64::from(wanted)) as u32
    }

    /// The tick the next armed hedges belong to (their `Settlement`'s).
    pub fn cohort(&self) -> u64 {
        self.now
    }

    /// Arms `hedges` hedges (at most what `affordable` allowed) whose delay
    /// has passed `delay_ticks` ticks after the next one: sets aside
    /// `set_aside` micro-tokens for each.
    pub fn reserve(&mut self, hedges: u32, delay_ticks: u64) {
        let n = i64::from(hedges);
        self.free = self.free.saturating_sub(n.saturating_mul(self.set_aside()));
        let due = self.now.saturating_add(1).saturating_add(delay_ticks);
        match self.cohorts.back_mut() {
            Some(c) if c.tick == self.now => {
                c.hedges += u64::from(hedges);
                c.due = c.due.max(due);
            }
            _ => self.cohorts.push_back(Cohort {
                tick: self.now,
                hedges: u64::from(hedges),
                due,
            }),
        }
    }

    /// A request armed in tick `cohort` with `reserved` hedges ended
    /// having sent `sent`.
    pub fn settle(&mut self, cohort: u64, reserved: u32, sent: u32) {
        let paid = i64::from(sent).saturating_mul(TOKEN);
        let unsettled = self
            .cohorts
            .iter_mut()
            .find(|c| c.tick == cohort && c.hedges >= u64::from(reserved));
        let returned = match unsettled {
            // not charged yet: its set-asides come back
            Some(c) => {
                c.hedges -= u64::from(reserved);
                i64::from(reserved).saturating_mul(self.set_aside())
            }
            // charged as sent already: its tokens come back
            None => i64::from(reserved).saturating_mul(TOKEN),
        };
        self.free = self.free.saturating_add(returned).saturating_sub(paid);
        self.cohorts.retain(|c| c.hedges > 0);
    }

    /// The worker's tick `now`: the armed hedges whose delay has passed are
    /// charged in full (those of requests still running were sent), and the
    /// exposure cap follows the rate: `requests_last_tick` requests, and a
    /// delay of `delay_ticks` ticks.
    pub fn tick(&mut self, now: u64, requests_last_tick: u64, delay_ticks: u64) {
        self.now = now;
        let rest = TOKEN - self.set_aside();
        while let Some(c) = self.cohorts.front() {
            if c.due > now && self.cohorts.len() <= MAX_COHORTS {
                break;
            }
            let charge = signed(c.hedges).saturating_mul(rest);
            self.free = self.free.saturating_sub(charge);
            self.cohorts.pop_front();
        }
        let in_span = requests_last_tick.saturating_mul(delay_ticks.saturating_add(2));
        let span_cost = signed(in_span).saturating_mul(rest).saturating_mul(2);
        self.exposure_cap = signed(self.terms.burst).max(span_cost);
    }

    /// Balances this worker's tokens against the cluster's shared pool
    /// (micro-tokens); neither side keeps more than `burst` after it.
    pub fn rebalance(&mut self, pool: &mut u64) {
        let burst = self.terms.burst;
        let cap = signed(burst);
        if self.free > cap {
            *pool = pool.saturating_add(self.free.abs_diff(cap));
            self.free = cap;
        } else {
            let take = self.free.abs_diff(cap).min(*pool);
            *pool -= take;
            self.free = self.free.saturating_add(signed(take));
        }
        *pool = (*pool).min(burst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BURST: u64 = 10 * MICROS_PER_TOKEN;
    const TERMS: BudgetTerms = BudgetTerms {
        share: 100_000, // 10%
        burst: BURST,
        set_aside: 80_000, // the delay is the p92
    };

    /// Arms what the budget affords of `wanted`, as the worker does.
    fn arm(b: &mut LocalBudget, wanted: u32) -> u32 {
        let n = b.affordable(wanted);
        b.reserve(n);
        n
    }

    fn budget(free: i64) -> LocalBudget {
        LocalBudget {
            free,
            ..LocalBudget::new(TERMS)
        }
    }

    #[test]
    fn earns_a_share_of_requests_up_to_burst() {
        let mut b = LocalBudget::new(TERMS);
        for _ in 0..10 {
            b.earn();
        }
        assert_eq!(b.free_tokens(), 1.0);
        for _ in 0..1000 {
            b.earn();
        }
        assert_eq!(b.free_tokens(), 10.0);
    }

    #[test]
    fn arming_keeps_the_worst_case_debt_within_one_burst() {
        let mut b = LocalBudget::new(TERMS);
        assert_eq!(arm(&mut b, 1), 0, "no free token, no hedge");
        for _ in 0..200 {
            b.earn();
        }
        let armed: u32 = (0..100).map(|_| arm(&mut b, 1)).sum();
        assert_eq!(armed, 20);
        for _ in 0..armed {
            b.settle(1, 1); // a stall: every one of them hedged
        }
        assert!((b.free_tokens() + 10.0).abs() < 1e-9, "{}", b.free_tokens());
        assert_eq!(arm(&mut b, 1), 0, "in debt");
        for _ in 0..105 {
            b.earn();
        }
        assert_eq!(arm(&mut b, 1), 0, "repaid, 0.5 free");
        for _ in 0..5 {
            b.earn();
        }
        assert_eq!(arm(&mut b, 3), 1, "one token free: one hedge");
    }

    #[test]
    fn a_full_budget_arms_two_bursts_of_requests_at_once() {
        let mut b = LocalBudget::new(TERMS);
        for _ in 0..200 {
            b.earn();
        }
        // a client that stalled catches up: 30 requests at once
        let armed: u32 = (0..30).map(|_| arm(&mut b, 1)).sum();
        assert_eq!(armed, 20);
        // they end; 3 of them hedged: the budget is 10 - 3 tokens
        for i in 0..armed {
            b.settle(1, u32::from(i < 3));
        }
        assert!((b.free_tokens() - 7.0).abs() < 1e-9, "{}", b.free_tokens());
        assert_eq!(b.exposure, 0);
    }

    #[test]
    fn rebalance_moves_surplus_through_the_pool() {
        const T: i64 = TOKEN;
        const U: u64 = MICROS_PER_TOKEN;
        let (mut rich, mut poor, mut pool) = (budget(14 * T), LocalBudget::new(TERMS), 0);
        rich.rebalance(&mut pool);
        assert_eq!((rich.free, pool), (10 * T, 4 * U));
        poor.rebalance(&mut pool);
        assert_eq!((poor.free, pool), (4 * T, 0));
        // a worker in debt repays from the pool
        let mut pool = 5 * U;
        let mut owing = budget(-3 * T);
        owing.rebalance(&mut pool);
        assert_eq!((owing.free, pool), (2 * T, 0));
        // the pool never holds more than one burst
        let mut flush = budget(50 * T);
        flush.rebalance(&mut pool);
        assert_eq!(pool, BURST);
    }

    /// A simulated 60 s outage at 1000 req/s, every request slower than the
    /// delay: each armed request sends its hedge. Two workers share the pool.
    #[test]
    fn outage_stays_within_budget_plus_burst_plus_requests_in_flight() {
        let mut workers = [LocalBudget::new(TERMS), LocalBudget::new(TERMS)];
        let mut pool = 0;
        // healthy minute first: the budget fills up (nothing is hedged)
        for i in 0..60_000u64 {
            let w = &mut workers[(i % 2) as usize];
            w.earn();
            let r = arm(w, 1);
            w.settle(r, 0);
            if i % 200 == 0 {
                for w in workers.iter_mut() {
                    w.rebalance(&mut pool);
                }
            }
        }
        // the outage: 60,000 requests, each lasting 100 ms (100 in flight)
        let in_flight_max = 100;
        let mut in_flight: std::collections::VecDeque<(usize, u32)> = Default::default();
        let mut hedges = 0u64;
        let requests = 60_000u64;
        for i in 0..requests {
            let wi = (i % 2) as usize;
            workers[wi].earn();
            let r = arm(&mut workers[wi], 1);
            in_flight.push_back((wi, r));
            if in_flight.len() > in_flight_max {
                let (wj, r) = in_flight.pop_front().unwrap();
                hedges += u64::from(r); // slow: every armed request hedges
                workers[wj].settle(r, r);
            }
            if i % 200 == 0 {
                for w in workers.iter_mut() {
                    w.rebalance(&mut pool);
                }
            }
        }
        hedges += in_flight.iter().map(|&(_, r)| u64::from(r)).sum::<u64>();
        // budget: 10% of 60,000 requests; burst: one per worker plus the
        // pool; and at most a burst of debt per worker
        let bound = requests / 10 + 3 * 10 + 2 * 10;
        assert!(hedges <= bound, "{hedges} hedges > {bound}");
        // and the budget is really used, not starved
        assert!(hedges >= requests / 10 * 95 / 100, "{hedges} hedges");
    }
}
