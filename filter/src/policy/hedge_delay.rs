//! After how long a request is hedged: the delay each cluster learns from
//! its latency window, computed on the sync tick (never per request), and
//! the budget terms that go with the quantile it is taken at.

use std::time::Duration;

use super::budget::{micro_tokens, BudgetTerms};
use super::config::ClusterPolicy;
use super::sketch::Sketch;

/// The learned hedge delay of a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HedgeDelay {
    /// The delay before clamping would round to this; kept for the gauge.
    pub delay_us: u64,
    /// What goes into `x-envoy-upstream-rq-per-try-timeout-ms` (rounded up).
    pub per_try_timeout_ms: u64,
}

impl HedgeDelay {
    /// When a request armed with this delay sends its hedge: at its per-try
    /// timeout (µs).
    pub fn censoring_point_us(&self) -> f64 {
        self.per_try_timeout_ms as f64 * 1000.0
    }
}

/// How the recent samples were cut short by hedges (see
/// `uncensored_quantile`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Censoring {
    /// The per-try timeout the armed requests were armed with (µs).
    pub at_us: f64,
    /// The share of the samples whose request was armed, in [0, 1]; the
    /// rest ran alone (refused by the budget, held back, or in shadow
    /// mode), their samples whole.
    pub armed_share: f64,
}

/// The share of a worker's latency samples whose request was armed, over
/// about the recent slices: counts halved every slice (on the tick).
/// Why: requests left unarmed (the budget refused them, the stale latch
/// held them back) give whole samples, and rebuilding those as if a
/// hedge had cut them inflates the recent quantile: in virtual time after
/// a shift up x3 at 500 req/s the delay jumped from about 25 ms to 180-235
/// ms for a tick at each slice turnover, leaving that tick's stragglers
/// unhedged.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ArmedShare {
    armed: f64,
    sampled: f64,
}

impl ArmedShare {
    /// A latency sample was taken of a request, armed or not.
    pub fn sampled(&mut self, armed: bool) {
        self.sampled += 1.0;
        if armed {
            self.armed += 1.0;
        }
    }

    /// On the tick: `decay` is the part of the counts kept.
    pub fn tick(&mut self, decay: f64) {
        self.armed *= decay;
        self.sampled *= decay;
    }

    /// With no sample yet: 1 (every sample taken as cut, as before any
    /// count). Decayed below one sample the counts still say which share
    /// was armed: taken as 1 there (as it was), a worker seeing a sampled
    /// request every few seconds rebuilt whole samples as cut short, in
    /// shadow mode too, where nothing is armed (found by a review).
    pub fn share(&self) -> f64 {
        if self.sampled <= 0.0 {
            1.0
        } else {
            (self.armed / self.sampled).clamp(0.0, 1.0)
        }
    }
}

/// What the budget says of the recent guard (see `hedge_delay`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BudgetState {
    /// How full the reserve is, in [0, 1]: a full one pays for hedging
    /// more of a slower regime.
    pub reserve_fill: f64,
    /// How hard the budget has been refusing armed requests lately, in
    /// [0, 1) (`RefusalPressure`): the guard is raised toward the
    /// distribution's top by that share of the way.
    pub refusal_pressure: f64,
}

/// Whole samples a new regime needs before its quantile counts (see
/// `hedge_delay`): at the default p94 guard, the third-slowest of 40.
pub const REGIME_SAMPLES: u64 = 40;

/// The long horizon's count a delay needs: `min_samples` to begin with,
/// and half of it to go on with (`hedging`: there was a delay at the last
/// tick).
///
/// Why two marks: the long horizon halves its weights every ten minutes,
/// so a cluster answering between `min_samples` and twice that in ten
/// minutes (0.17 to 0.33 requests a second at the default 100) fell under
/// a single mark at every halving and went unarmed until it filled again:
/// on for a few minutes, off for a few, over and over. With the lower
/// mark to go on, a cluster once armed stays armed down to half that
/// rate, where its count never leaves the band; one that never reached
/// `min_samples` still waits for it. `hedging` is the worker's own: a
/// worker's new configuration (a push) starts from `min_samples` again,
/// as does a route whose `min_samples` was raised.
pub fn samples_needed(policy: &ClusterPolicy, hedging: bool) -> u64 {
    if hedging {
        policy.min_samples.div_ceil(2)
    } else {
        policy.min_samples
    }
}

/// The delay to arm requests with; `None` while the long horizon holds
/// fewer than `samples_needed` (still warming up: `min_samples`, or half
/// of it once `hedging`, the cluster or route having had a delay at the
/// last tick).
///
/// It is the larger of the quantile over the long horizon (every sample,
/// halved every ten minutes: see `window::LongHorizon`) and the quantile over
/// the window's most recent slices (`recent`, once they hold `min_samples`
/// themselves).
///
/// Why the long horizon: the p99 a user sees over an hour is set by the
/// slowest periods of that hour, and a fixed delay chosen in hindsight for
/// it spends its hedges there. A delay that follows the current distribution
/// (the p92 of the last 30 s) spends the same share in every period, fast
/// ones included, and after latency drops keeps hedging a share of requests
/// that no longer matter to the hour's tail. Measured on 120 generated
/// workloads (`BENCH_ONLY=workloads make bench`): with the long horizon the
/// shifts down went from 1.16 to 1.05 times the best fixed delay's p99.
///
/// Why the recent slices too: when latency shifts up, the older, faster
/// samples would hold the quantile low, nearly every request would outlive
/// the delay, the budget would run dry on whichever came first, and the real
/// stragglers would go unhedged. The recent quantile follows the shift
/// within a slice or two.
///
/// `censoring`: the per-try timeout the recent samples were armed with
/// and the share armed (`None` while warming up). A hedged request's
/// sample is the earlier of the two attempts, so above the delay the
/// samples understate how late the primaries were; see
/// `uncensored_quantile`.
///
/// `regime`: samples of a regime the recent slices have not caught up
/// with (`worker::NewRegime`: the responses since the delay was found
/// stale), and how the few armed before were cut short; taken at the same
/// guard once they hold `REGIME_SAMPLES`. Why:
/// the recent slices still hold seconds of the old regime after a shift
/// up; their quantile climbs a few ms a tick, and every delay on the way
/// is stale.
pub fn hedge_delay(
    policy: &ClusterPolicy,
    long: &Sketch,
    recent: &Sketch,
    censoring: Option<Censoring>,
    budget: BudgetState,
    regime: Option<(&Sketch, Censoring)>,
    hedging: bool,
) -> Option<HedgeDelay> {
    if long.count() < samples_needed(policy, hedging) {
        return None;
    }
    let trigger = trigger_quantile(policy);
    let mut quantile_us = long.quantile(trigger)?;
    let fill = budget.reserve_fill.clamp(0.0, 1.0);
    // never above the trigger (a `percentile` below 0.5 with a large
    // budget: trigger 0.4, the guard was 0.5)
    let guard = (trigger - fill * policy.budget_share()).max(0.5_f64.min(trigger));
    // refusals say the recent regime's quantile costs more than the
    // budget pays: they would fall on random requests, stragglers
    // included, so the guard hedges fewer, the latest first
    let guard = guard + (1.0 - guard) * budget.refusal_pressure.clamp(0.0, 0.99);
    if recent.count() >= policy.min_samples {
        let recent_us = match censoring {
            Some(c) => uncensored_quantile(recent, guard, c),
            None => recent.quantile(guard),
        };
        if let Some(recent_us) = recent_us {
            quantile_us = quantile_us.max(recent_us);
        }
    }
    // A new regime's floor needs its own `REGIME_SAMPLES` only: under the
    // recent slices' `min_samples` as well (until 2026-11-29), a cluster
    // whose recent slices held fewer (a `min_samples` of 1,000 at 20
    // requests a second) never had it, and hedged at the stale delay until
    // the latch's ten seconds ran out (found by a review).
    if let Some(regime_us) = regime
        .filter(|(r, _)| r.count() >= REGIME_SAMPLES)
        .and_then(|(r, c)| uncensored_quantile(r, guard, c))
    {
        quantile_us = quantile_us.max(regime_us);
    }
    let min_us = policy.min_delay.as_micros() as f64;
    let max_us = policy.max_delay.as_micros() as f64;
    let delay_us = quantile_us.clamp(min_us, max_us).round() as u64;
    let per_try_timeout_ms = Duration::from_micros(delay_us)
        .as_micros()
        .div_ceil(1000)
        .max(1) as u64;
    Some(HedgeDelay {
        delay_us,
        per_try_timeout_ms,
    })
}

/// The quantile `q` of the latency the primaries had, estimated from
/// samples whose hedged requests were censored at `censoring.at_us` (d).
///
/// Why: a hedged request's sample is min(P, d + H), the earlier of the
/// primary and the hedge. With H an independent draw of the same
/// distribution as P, the samples' survival above x is S(x) for x < d and
/// S(x) * S(x - d) above it. So the true survival is rebuilt upward from d:
/// S(x) = S_samples(x) / S(x - d), where S(x - d) is either below d (read
/// from the samples as they are) or already rebuilt. When the delay sits at
/// its quantile this changes nothing (at x = d the divisor is S(0) = 1);
/// after latency rises, the samples' quantile is below the true one (more
/// requests are hedged, and each hedged sample is cut off at d + H), and
/// without the correction the delay climbs toward the true quantile by
/// about one hedge latency per turnover of the samples.
///
/// Samples censored at an earlier, lower delay make the estimate lower
/// than the truth. Requests that were not armed (refused by the budget,
/// held back by the stale latch or the pacing: not censored at all) are
/// the `1 - armed_share` of the samples whose survival is S(x) itself, so
/// S(x) = S_samples(x) / (1 - a + a S(x - d)). Taking every sample as cut
/// divided their whole samples by the survival of the cut ones: under
/// heavy refusals, or after the stale latch, the delay jumped to
/// `max_delay` or to the slowest sample for a tick.
pub fn uncensored_quantile(samples: &Sketch, q: f64, censoring: Censoring) -> Option<f64> {
    let n = samples.count();
    if n == 0 {
        return None;
    }
    // a hair above: 1 - 0.9 is 0.09999999999999998, and a survival of
    // exactly 10 in 100 must meet it (else the quantile is a bucket high:
    // in a bimodal cluster, the slow mode)
    let target = 1.0 - q.clamp(0.0, 1.0) + SURVIVAL_TOLERANCE;
    let survival = survival_points(samples, n);
    let d = censoring.at_us.max(0.0);
    let armed = censoring.armed_share.clamp(0.0, 1.0);
    let mut rebuilt: Vec<(f64, f64)> = Vec::new();
    let mut last = 1.0f64;
    for &(value, observed) in &survival {
        let s = if value < d {
            observed
        } else {
            let y = value - d;
            let below = if y < d {
                survival_at(&survival, y).unwrap_or(1.0)
            } else {
                // below the first rebuilt point (a gap after d): the
                // samples' survival there, not 1
                survival_at(&rebuilt, y)
                    .or_else(|| survival_at(&survival, y))
                    .unwrap_or(1.0)
            };
            // the unarmed share's samples are whole: S_samples(x) =
            // (1 - a) S(x) + a S(x) S(x - d)
            let divisor = (1.0 - armed) + armed * below;
            if divisor > 0.0 {
                (observed / divisor).min(last)
            } else {
                last
            }
        };
        if value >= d {
            rebuilt.push((value, s));
        }
        last = s;
        if s <= target {
            return Some(value);
        }
    }
    survival.last().map(|p| p.0)
}

/// (value, share of the `n` samples above it) at each non-empty bucket,
/// ascending.
fn survival_points(samples: &Sketch, n: u64) -> Vec<(f64, f64)> {
    let mut above = n;
    samples
        .buckets()
        .map(|(value, count)| {
            above = above.saturating_sub(count);
            (value, above as f64 / n as f64)
        })
        .collect()
}

/// The survival at `y` of a step function given by `points` (`None`
/// below the first point).
/// Float slack in comparing a survival with `1 - q`.
const SURVIVAL_TOLERANCE: f64 = 1e-12;

fn survival_at(points: &[(f64, f64)], y: f64) -> Option<f64> {
    let i = points.partition_point(|(v, _)| *v <= y);
    i.checked_sub(1).and_then(|i| points.get(i)).map(|p| p.1)
}

/// The `q` quantile of latency `samples` (not hedged) would have if every
/// request were hedged after `delay_us` with one hedge: a hedged request
/// takes min(P, d + H), P and H independent draws of the same latency, so
/// its survival is S(x) below the delay and S(x) x S(x - d) above it
/// (`mode: shadow`'s estimate; the budget may hedge fewer).
pub fn hedged_quantile(samples: &Sketch, delay_us: f64, q: f64) -> Option<f64> {
    let n = samples.count();
    if n == 0 {
        return None;
    }
    // a hair above: 1 - 0.9 is 0.09999999999999998, and a survival of
    // exactly 10 in 100 must meet it (else the quantile is a bucket high:
    // in a bimodal cluster, the slow mode)
    let target = 1.0 - q.clamp(0.0, 1.0) + SURVIVAL_TOLERANCE;
    let survival = survival_points(samples, n);
    let at = |y: f64| survival_at(&survival, y).unwrap_or(1.0);
    let d = delay_us.max(0.0);
    // the hedged survival steps at the samples' values and at those
    // values plus the delay (a hedge's answer)
    let mut steps: Vec<f64> = survival
        .iter()
        .flat_map(|&(value, _)| [value, value + d])
        .collect();
    steps.sort_by(f64::total_cmp);
    steps.into_iter().find(|&x| {
        let hedged = if x < d { at(x) } else { at(x) * at(x - d) };
        hedged <= target
    })
}

/// Of the budget, the share the delay plans to spend (see `trigger_quantile`).
pub const PLANNED_BUDGET_SHARE: f64 = 0.6;

/// The quantile the delay is taken at: `percentile`, or higher when the
/// budget cannot pay for that many hedges. Why: hedging after the p90 plans a
/// hedge for 10% of requests; with a 10% budget, demand and supply are equal,
/// the token balance random-walks to zero under ordinary noise, and the
/// refusals then fall on random requests, stragglers included (on real Envoy
/// this cost more p99 than a static delay at the same load). Planning to
/// spend at most 60% of the budget keeps refusals rare and leaves the rest
/// to save for when latency rises: with the defaults (p90, 10%) the delay
/// is the p94. At 80% (the p92) the generated workloads saw refusals on
/// most shifts and outages (workload 97's p99 4.9 times the best fixed
/// delay's with 15% of eligible requests refused; 0.99 and 0.1% at 60%);
/// 60% was better than 80% on two independent draws of 120 workloads
/// (docs/evaluation.md), and kept the reference workload at the frontier
/// where 50% (the p95) did not.
pub fn trigger_quantile(policy: &ClusterPolicy) -> f64 {
    let affordable = 1.0 - PLANNED_BUDGET_SHARE * policy.budget_share();
    policy.percentile.max(affordable).min(1.0)
}

/// The least an armed request sets aside (a twentieth of a token), for
/// very high percentiles.
const MIN_SET_ASIDE: f64 = 0.05;

/// A cluster's budget terms, derived once when the cluster is first seen.
/// An armed request sets aside per hedge the share of requests expected to
/// outlive the delay (see `budget`).
pub fn budget_terms(policy: &ClusterPolicy) -> BudgetTerms {
    BudgetTerms {
        share: micro_tokens(policy.budget_share()),
        burst: micro_tokens(policy.budget_burst),
        set_aside: micro_tokens((1.0 - trigger_quantile(policy)).max(MIN_SET_ASIDE)),
        reserve_ms: u64::try_from(policy.budget_reserve.as_millis()).unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    /// 10% stragglers at 10x: unhedged, the p99 is a straggler's; hedged
    /// after the p90 a request is slow only if its hedge straggles too
    /// (1%), so the p99 falls to about the delay plus a fast answer.
    #[test]
    fn the_hedged_quantile_of_a_straggling_workload() {
        let mut sketch = Sketch::new();
        for i in 0..1000 {
            sketch.add(if i % 10 == 0 {
                50_000.0
            } else {
                5_000.0 + i as f64
            });
        }
        let unhedged = sketch.quantile(0.99).unwrap();
        assert!(unhedged > 45_000.0, "{unhedged}");
        let hedged = hedged_quantile(&sketch, 6_000.0, 0.99).unwrap();
        assert!((10_000.0..=13_000.0).contains(&hedged), "{hedged}");
        // a delay past every sample changes nothing
        let late = hedged_quantile(&sketch, 100_000.0, 0.99).unwrap();
        assert!((late - unhedged).abs() < 1.0, "{late} vs {unhedged}");
        assert_eq!(hedged_quantile(&Sketch::new(), 1.0, 0.99), None);
    }

    /// 90 samples at 10 ms and 10 at 100 ms: the p90 is 10 ms, also where
    /// the survival meets 1 - 0.9 exactly (in floats 1 - 0.9 is a hair
    /// below 0.1, and the rebuilt quantile was the slow mode's).
    #[test]
    fn a_survival_of_exactly_one_minus_q_is_the_quantile() {
        let mut sketch = Sketch::new();
        for i in 0..100 {
            sketch.add(if i < 90 { 10_000.0 } else { 100_000.0 });
        }
        let plain = sketch.quantile(0.9).unwrap();
        assert!(plain < 11_000.0, "{plain}");
        let whole = Censoring {
            at_us: 5_000.0,
            armed_share: 0.0,
        };
        assert_eq!(uncensored_quantile(&sketch, 0.9, whole), Some(plain));
        let hedged = hedged_quantile(&sketch, 1e9, 0.9).unwrap();
        assert!(hedged < 11_000.0, "{hedged}");
    }

    use super::*;
    use crate::policy::config::TextDuration;

    fn window_of(values_us: &[f64]) -> Sketch {
        let mut s = Sketch::new();
        for &v in values_us {
            s.add(v);
        }
        s
    }

    /// A budget that affords the configured percentile as it is.
    const ROOMY: f64 = 50.0;

    fn policy(min_samples: u64) -> ClusterPolicy {
        ClusterPolicy {
            min_samples,
            budget_percent: ROOMY,
            ..Default::default()
        }
    }

    /// The delay from the long horizon alone: no recent slices, no
    /// censoring, a budget with nothing refused.
    fn long_horizon_delay(policy: &ClusterPolicy, long: &Sketch) -> Option<HedgeDelay> {
        plain_delay(policy, long, &Sketch::new(), false)
    }

    /// The delay from the long horizon and the recent slices, with no
    /// censoring, no new regime and a budget with nothing refused.
    fn plain_delay(
        policy: &ClusterPolicy,
        long: &Sketch,
        recent: &Sketch,
        hedging: bool,
    ) -> Option<HedgeDelay> {
        let budget = BudgetState::default();
        hedge_delay(policy, long, recent, None, budget, None, hedging)
    }

    /// `plain_delay` of a warmed-up cluster, in µs.
    fn plain_delay_us(policy: &ClusterPolicy, long: &Sketch, recent: &Sketch) -> f64 {
        plain_delay(policy, long, recent, false).map_or(f64::NAN, |d| d.delay_us as f64)
    }

    #[test]
    fn delay_is_the_clamped_quantile_rounded_up_to_ms() {
        let values: Vec<f64> = (1..=100).map(|i| i as f64 * 100.0).collect(); // 0.1..10 ms
        let d = long_horizon_delay(&policy(10), &window_of(&values)).unwrap();
        assert!((d.delay_us as f64 - 9000.0).abs() <= 90.0, "{d:?}");
        assert_eq!(d.per_try_timeout_ms, d.delay_us.div_ceil(1000));

        let tight = ClusterPolicy {
            max_delay: TextDuration(Duration::from_millis(3)),
            ..policy(10)
        };
        let clamped = long_horizon_delay(&tight, &window_of(&values)).unwrap();
        assert_eq!(clamped.per_try_timeout_ms, 3);
        let floor = ClusterPolicy {
            min_delay: TextDuration(Duration::from_millis(20)),
            ..policy(10)
        };
        let floored = long_horizon_delay(&floor, &window_of(&values)).unwrap();
        assert_eq!(floored.per_try_timeout_ms, 20);
    }

    /// A cluster whose latency runs to tens of seconds (a batch endpoint,
    /// or a slow service in an outage) gets its own delay at the default
    /// `max_delay`: a ceiling below its quantile would arm every request
    /// with a delay most of them outlive (generated workloads: the budget
    /// overrun to 12.3% and most outage requests refused, evaluation.md).
    #[test]
    fn a_cluster_of_tens_of_seconds_is_not_clamped_at_the_default_max_delay() {
        let values: Vec<f64> = (1..=100).map(|i| i as f64 * 400_000.0).collect(); // 0.4..40 s
        let d = long_horizon_delay(&policy(10), &window_of(&values)).unwrap();
        assert!((d.delay_us as f64 - 36e6).abs() <= 0.4e6, "{d:?}");
        assert_eq!(d.per_try_timeout_ms, d.delay_us.div_ceil(1000));
    }

    #[test]
    fn recent_slices_raise_the_delay_but_never_lower_it() {
        let policy = policy(50);
        let old: Vec<f64> = (1..=1000).map(|i| i as f64 * 10.0).collect(); // p90 9 ms
        let slow: Vec<f64> = (1..=100).map(|i| i as f64 * 300.0).collect(); // p90 27 ms
        let fast: Vec<f64> = (1..=100).map(|i| i as f64 * 3.0).collect(); // p90 0.27 ms
        let mut window = window_of(&old);
        window.merge(&window_of(&slow));
        let up = plain_delay_us(&policy, &window, &window_of(&slow));
        assert!(
            (up / 27_000.0 - 1.0).abs() < 0.02,
            "follows the shift up at once: {up}"
        );
        let mut window = window_of(&old);
        window.merge(&window_of(&fast));
        let down = plain_delay_us(&policy, &window, &window_of(&fast));
        assert!(
            down > 8_000.0,
            "a shift down waits for the long horizon: {down}"
        );
        // too few recent samples: ignored
        let few = plain_delay_us(&policy, &window_of(&old), &window_of(&slow[..49]));
        assert!((few / 9_000.0 - 1.0).abs() < 0.02, "{few}");
    }

    /// The responses a stale latch gathered set the delay at once, at the
    /// recent guard, once there are `REGIME_SAMPLES` of them: fewer are
    /// too few to read a p92 from.
    #[test]
    fn a_new_regime_sets_the_delay_once_it_holds_enough_samples() {
        let policy = policy(50);
        let old: Vec<f64> = (1..=1000).map(|i| i as f64 * 10.0).collect(); // p92 9.2 ms
        let slow: Vec<f64> = (1..=REGIME_SAMPLES).map(|i| i as f64 * 750.0).collect(); // p92 27.6 ms
                                                                                       // the delay with `recent` in the recent slices, `regime` latched
        let delay_with = |recent: &[f64], regime: &[f64]| {
            hedge_delay(
                &policy,
                &window_of(&old),
                &window_of(recent),
                None,
                BudgetState::default(),
                Some((
                    &window_of(regime),
                    Censoring {
                        at_us: 10_000.0,
                        armed_share: 0.0,
                    },
                )),
                false,
            )
            .unwrap()
            .delay_us as f64
        };
        let delay = |regime: &[f64]| delay_with(&old, regime);
        let few = delay(&slow[1..]);
        assert!((few / 9_200.0 - 1.0).abs() < 0.03, "{few}");
        let enough = delay(&slow);
        assert!((enough / 27_750.0 - 1.0).abs() < 0.03, "{enough}");
        // a faster regime never lowers the delay
        let fast: Vec<f64> = slow.iter().map(|v| v / 10.0).collect();
        let floor = delay(&fast);
        assert!((floor / 9_200.0 - 1.0).abs() < 0.03, "{floor}");
        // nor does it wait for the recent slices' `min_samples` (a low
        // rate: the recent slices hold 30 samples, min_samples is 50)
        let sparse = delay_with(&old[..30], &slow);
        assert!((sparse / 27_750.0 - 1.0).abs() < 0.03, "{sparse}");
    }

    /// With the reserve full, the recent guard lets the delay stay at the
    /// long horizon's quantile while up to 8% + 10% of recent requests
    /// outlive it (the reserve pays), not only 8%; empty, as before.
    #[test]
    fn a_full_reserve_lets_the_long_horizon_delay_stand_through_a_shift() {
        let policy = ClusterPolicy {
            min_samples: 50,
            ..Default::default()
        };
        let old: Vec<f64> = (1..=1000).map(|i| i as f64 * 10.0).collect(); // p92 9.2 ms
                                                                           // the recent: 85% as before, 15% slower than anything before
        let recent: Vec<f64> = (1..=100)
            .map(|i| {
                if i <= 85 {
                    i as f64 * 100.0
                } else {
                    50_000.0 + i as f64
                }
            })
            .collect();
        let delay = |fill| {
            hedge_delay(
                &policy,
                &window_of(&old),
                &window_of(&recent),
                None,
                BudgetState {
                    reserve_fill: fill,
                    refusal_pressure: 0.0,
                },
                None,
                false,
            )
            .unwrap()
            .delay_us as f64
        };
        let empty = delay(0.0);
        assert!(empty > 50_000.0, "15% > 8%: the recent quantile: {empty}");
        let full = delay(1.0);
        assert!(
            (full / 9_200.0 - 1.0).abs() < 0.03,
            "15% < 18%: the long horizon's: {full}"
        );
    }

    #[test]
    fn the_delay_plans_to_spend_at_most_60_percent_of_the_budget() {
        let at = |percentile, budget_percent| {
            trigger_quantile(&ClusterPolicy {
                percentile,
                budget_percent,
                ..Default::default()
            })
        };
        // p90 with a 10% budget would plan to spend all of it: p94.
        assert!((at(0.9, 10.0) - 0.94).abs() < 1e-9);
        assert!((at(0.9, 5.0) - 0.97).abs() < 1e-9);
        // A budget that affords the percentile leaves it alone.
        assert!((at(0.95, 10.0) - 0.95).abs() < 1e-9);
        assert!((at(0.9, 50.0) - 0.9).abs() < 1e-9);

        // Defaults, 0.1..10 ms uniform: the delay is the p94.
        let policy = ClusterPolicy {
            min_samples: 10,
            ..Default::default()
        };
        let values: Vec<f64> = (1..=1000).map(|i| i as f64 * 10.0).collect();
        let d = long_horizon_delay(&policy, &window_of(&values)).unwrap();
        assert!((d.delay_us as f64 / 9_400.0 - 1.0).abs() < 0.02, "{d:?}");
    }

    /// Samples as a filter hedging at `d` sees them: min(P, d + H).
    fn hedged_at(d: f64, draws: &[(f64, f64)]) -> Sketch {
        window_of(
            &draws
                .iter()
                .map(|&(p, h)| if p > d { p.min(d + h) } else { p })
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn the_quantile_hedging_hides_is_recovered() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        // lognormal-ish: 10 ms median, a tail to ~100 ms
        let mut draw = || {
            10_000.0
                * (rng.gen::<f64>() * 2.0 - 1.0).exp()
                * if rng.gen_bool(0.1) { 4.0 } else { 1.0 }
        };
        let draws: Vec<(f64, f64)> = (0..20_000).map(|_| (draw(), draw())).collect();
        let truth = window_of(&draws.iter().map(|d| d.0).collect::<Vec<_>>())
            .quantile(0.92)
            .unwrap();
        // hedged far below the p92 (latency just tripled): the samples'
        // p92 is far below the truth, the rebuilt one close to it
        let low = truth / 3.0;
        let seen = hedged_at(low, &draws);
        let naive = seen.quantile(0.92).unwrap();
        let rebuilt = uncensored_quantile(&seen, 0.92, all_armed(low)).unwrap();
        assert!(naive < 0.85 * truth, "naive {naive} truth {truth}");
        assert!(
            (rebuilt / truth - 1.0).abs() < 0.1,
            "rebuilt {rebuilt} truth {truth}"
        );
        // hedged at the p92 itself: nothing to correct
        let at = uncensored_quantile(&hedged_at(truth, &draws), 0.92, all_armed(truth)).unwrap();
        assert!((at / truth - 1.0).abs() < 0.03, "{at} vs {truth}");
        // never above the truth when the samples were cut lower than said
        let said_higher =
            uncensored_quantile(&hedged_at(low, &draws), 0.92, all_armed(2.0 * low)).unwrap();
        assert!(said_higher <= 1.03 * truth, "{said_higher} vs {truth}");
        // some requests not armed (the budget refused them): their samples
        // are whole; taken as all cut, the rebuilding divides them by the
        // survival of the cut ones and overshoots; told the share, it does
        // not
        let half_armed: Vec<f64> = draws
            .iter()
            .enumerate()
            .map(|(i, &(p, h))| {
                if i % 2 == 0 || p <= low {
                    p
                } else {
                    p.min(low + h)
                }
            })
            .collect();
        let mixed = window_of(&half_armed);
        let as_if_all = uncensored_quantile(&mixed, 0.92, all_armed(low)).unwrap();
        assert!(as_if_all > 1.05 * truth, "{as_if_all} vs {truth}");
        let half = Censoring {
            at_us: low,
            armed_share: 0.5,
        };
        let told = uncensored_quantile(&mixed, 0.92, half).unwrap();
        assert!((told / truth - 1.0).abs() < 0.1, "{told} vs {truth}");
        // none armed (shadow mode, or all held back): the samples as they are
        let none = Censoring {
            at_us: low,
            armed_share: 0.0,
        };
        let whole = window_of(&draws.iter().map(|d| d.0).collect::<Vec<_>>());
        assert_eq!(
            uncensored_quantile(&whole, 0.92, none),
            whole.quantile(0.92)
        );
    }

    fn all_armed(at_us: f64) -> Censoring {
        Censoring {
            at_us,
            armed_share: 1.0,
        }
    }

    /// The share armed follows the recent samples: halved with each tick's
    /// decay, 1 before any.
    #[test]
    fn the_armed_share_follows_the_recent_samples() {
        let mut share = ArmedShare::default();
        assert_eq!(share.share(), 1.0);
        for i in 0..100 {
            share.sampled(i % 4 == 0);
        }
        assert!((share.share() - 0.25).abs() < 1e-9);
        // a slice later, everything armed: the old counts weigh half
        share.tick(0.5);
        for _ in 0..100 {
            share.sampled(true);
        }
        assert!((share.share() - (12.5 + 100.0) / 150.0).abs() < 1e-9);
        // decayed below one sample, the counts still tell: none armed
        let mut quiet = ArmedShare::default();
        quiet.sampled(false);
        quiet.tick(0.1);
        assert_eq!(quiet.share(), 0.0);
    }

    /// A `percentile` below 0.5 with a budget that affords it: the recent
    /// guard is the trigger, not 0.5 above it.
    #[test]
    fn the_recent_guard_is_never_above_the_trigger() {
        let policy = ClusterPolicy {
            percentile: 0.3,
            budget_percent: 100.0,
            ..policy(10)
        };
        let trigger = trigger_quantile(&policy);
        assert!((0.35..0.5).contains(&trigger), "{trigger}");
        let values: Vec<f64> = (1..=1000).map(|i| i as f64 * 100.0).collect();
        let window = window_of(&values);
        let delay = plain_delay_us(&policy, &window, &window);
        let at_trigger = trigger * 100_000.0;
        assert!(
            (delay / at_trigger - 1.0).abs() < 0.03,
            "{delay} vs {at_trigger}"
        );
    }

    #[test]
    fn warming_up_until_min_samples() {
        let policy = policy(100);
        let none = long_horizon_delay(&policy, &window_of(&[1000.0; 99]));
        assert_eq!(none, None);
        assert!(long_horizon_delay(&policy, &window_of(&[1000.0; 100])).is_some());
        // once hedging, half of it keeps the delay
        let go_on =
            |n: usize| plain_delay(&policy, &window_of(&vec![1000.0; n]), &Sketch::new(), true);
        assert!(go_on(50).is_some());
        assert_eq!(go_on(49), None);
    }

    #[test]
    fn an_armed_request_sets_aside_its_expected_cost() {
        let terms = budget_terms(&ClusterPolicy::default());
        assert_eq!(terms.share, 100_000);
        assert_eq!(terms.burst, 10_000_000);
        assert_eq!(terms.set_aside, 60_000, "1 - p94");
        let high = budget_terms(&ClusterPolicy {
            percentile: 0.999,
            ..Default::default()
        });
        assert_eq!(high.set_aside, 50_000, "never less than a twentieth");
    }
}
