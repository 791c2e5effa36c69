//! The hedge budget: extra upstream attempts are paid with tokens, and tokens
//! are earned only by requests the cluster really receives. No "expected rate"
//! to configure: at 10 req/s or 10,000 req/s the budget is the same share.
//!
//! Per request (worker-local, no shared memory):
//! - every request to the cluster earns `share` tokens (0.1 for a 10% budget),
//!   while the worker holds less than `burst` free tokens;
//! - arming a request reserves one token per hedge it may send;
//! - when the request ends, the tokens of hedges that were not sent are given
//!   back (most armed requests finish before their delay).
//!
//! Reserving at arm time is what makes the cap hold during an outage: a
//! request can only send a hedge it already paid for. Refunds are not capped,
//! so the tokens held by requests in flight float on top of `burst` and a busy
//! cluster is not starved by its own reservations.
//!
//! Across workers (on the sync tick): a worker above `burst` free tokens
//! deposits the surplus into the cluster's shared pool (itself capped at
//! `burst`), and a worker below `burst` withdraws from it. So tokens earned on
//! one worker can pay for hedges on another, and over any period
//!     extra attempts <= share * requests + (workers + 1) * burst
//!                       + tokens reserved by requests in flight at its start.

/// Token amounts are kept in millionths of a token, so that ten requests at
/// a 10% share earn exactly one token (no floating-point drift).
pub const MICROS_PER_TOKEN: u64 = 1_000_000;

/// Converts a fraction of a token (0.1) or a token count (10.0) to micro-tokens.
pub fn micro_tokens(tokens: f64) -> u64 {
    (tokens * MICROS_PER_TOKEN as f64).round() as u64
}

/// One worker's tokens for one cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalBudget {
    /// Free micro-tokens.
    free: u64,
}

impl LocalBudget {
    pub fn free_tokens(&self) -> f64 {
        self.free as f64 / MICROS_PER_TOKEN as f64
    }

    /// A request arrived for the cluster (`share` and `burst` in micro-tokens).
    pub fn earn(&mut self, share: u64, burst: u64) {
        if self.free < burst {
            self.free = (self.free + share).min(burst);
        }
    }

    /// Reserves up to `wanted` whole tokens; returns how many.
    pub fn reserve(&mut self, wanted: u32) -> u32 {
        let available = self.free / MICROS_PER_TOKEN;
        let n = available.min(u64::from(wanted)) as u32;
        self.free -= u64::from(n) * MICROS_PER_TOKEN;
        n
    }

    /// The request ended having sent `sent` extra attempts out of `reserved`.
    pub fn settle(&mut self, reserved: u32, sent: u32) {
        let refund = u64::from(reserved.saturating_sub(sent));
        self.free = self.free.saturating_add(refund * MICROS_PER_TOKEN);
    }

    /// Balances this worker's tokens against the cluster's shared pool
    /// (micro-tokens); neither side keeps more than `burst` after it.
    pub fn rebalance(&mut self, pool: &mut u64, burst: u64) {
        if self.free > burst {
            *pool = pool.saturating_add(self.free - burst);
            self.free = burst;
        } else {
            let take = (burst - self.free).min(*pool);
            *pool -= take;
            self.free += take;
        }
        *pool = (*pool).min(burst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARE: u64 = 100_000; // 10%
    const BURST: u64 = 10 * MICROS_PER_TOKEN;

    #[test]
    fn earns_a_share_of_requests_up_to_burst() {
        let mut b = LocalBudget::default();
        for _ in 0..10 {
            b.earn(SHARE, BURST);
        }
        assert_eq!(b.free_tokens(), 1.0);
        for _ in 0..1000 {
            b.earn(SHARE, BURST);
        }
        assert_eq!(b.free_tokens(), 10.0);
    }

    #[test]
    fn reserve_takes_whole_tokens_only() {
        let mut b = LocalBudget::default();
        for _ in 0..15 {
            b.earn(SHARE, BURST);
        }
        assert_eq!(b.reserve(2), 1);
        assert_eq!(b.reserve(1), 0);
    }

    #[test]
    fn refunded_token_is_reusable() {
        let mut b = LocalBudget::default();
        for _ in 0..10 {
            b.earn(SHARE, BURST);
        }
        assert_eq!(b.reserve(1), 1);
        assert_eq!(b.reserve(1), 0, "the only token is reserved");
        b.settle(1, 0); // the request finished before its delay: no hedge sent
        assert_eq!(
            b.reserve(1),
            1,
            "the refunded token pays for the next hedge"
        );
        b.settle(1, 1); // this one was sent: no refund
        assert_eq!(b.reserve(1), 0);
    }

    #[test]
    fn refunds_float_above_burst() {
        let mut b = LocalBudget::default();
        for _ in 0..200 {
            b.earn(SHARE, BURST);
        }
        assert_eq!(b.reserve(1), 1);
        for _ in 0..20 {
            b.earn(SHARE, BURST); // back at the cap while one token is out
        }
        b.settle(1, 0);
        assert_eq!(b.free_tokens(), 11.0);
    }

    #[test]
    fn rebalance_moves_surplus_through_the_pool() {
        const T: u64 = MICROS_PER_TOKEN;
        let (mut rich, mut poor, mut pool) =
            (LocalBudget { free: 14 * T }, LocalBudget::default(), 0);
        rich.rebalance(&mut pool, BURST);
        assert_eq!((rich.free, pool), (10 * T, 4 * T));
        poor.rebalance(&mut pool, BURST);
        assert_eq!((poor.free, pool), (4 * T, 0));
        // the pool never holds more than one burst
        let mut flush = LocalBudget { free: 50 * T };
        flush.rebalance(&mut pool, BURST);
        assert_eq!(pool, BURST);
    }

    /// A simulated 60 s outage at 1000 req/s, every request slower than the
    /// delay: each armed request sends its hedge. Two workers share the pool.
    #[test]
    fn outage_stays_within_budget_plus_burst() {
        let (share, burst) = (SHARE, BURST);
        let mut workers = [LocalBudget::default(), LocalBudget::default()];
        let mut pool = 0;
        // healthy minute first: the budget fills up (nothing is hedged)
        for i in 0..60_000u64 {
            let w = &mut workers[(i % 2) as usize];
            w.earn(share, burst);
            let r = w.reserve(1);
            w.settle(r, 0);
            if i % 200 == 0 {
                for w in workers.iter_mut() {
                    w.rebalance(&mut pool, burst);
                }
            }
        }
        // the outage: 60,000 requests, each lasting 100 ms (100 in flight)
        let mut in_flight: std::collections::VecDeque<(usize, u32)> = Default::default();
        let mut hedges = 0u64;
        let requests = 60_000u64;
        for i in 0..requests {
            let wi = (i % 2) as usize;
            workers[wi].earn(share, burst);
            let r = workers[wi].reserve(1);
            in_flight.push_back((wi, r));
            if in_flight.len() > 100 {
                let (wj, r) = in_flight.pop_front().unwrap();
                hedges += u64::from(r); // slow: every reserved hedge is sent
                workers[wj].settle(r, r);
            }
            if i % 200 == 0 {
                for w in workers.iter_mut() {
                    w.rebalance(&mut pool, burst);
                }
            }
        }
        hedges += in_flight.iter().map(|&(_, r)| u64::from(r)).sum::<u64>();
        // budget: 10% of 60,000 requests; burst: one per worker plus the pool
        let bound = requests / 10 + 3 * 10;
        assert!(hedges <= bound, "{hedges} hedges > {bound}");
        // and the budget is really used, not starved
        assert!(hedges >= requests / 10 * 95 / 100, "{hedges} hedges");
    }
}
