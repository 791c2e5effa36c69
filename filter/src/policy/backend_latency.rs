//! The backend's own latency while hedging hides it.
//!
//! Under hedging a client waits min(primary, delay + hedge), so the latency
//! clients get (the window's quantiles) hides how slow the backend really
//! is: with 5% stragglers at 10x hedged after the p92, clients see a p99
//! near twice the median while the backend's p99 is a straggler's. The
//! backend's tail cannot be read off the responses either: when a hedge
//! answers first, Envoy resets the primary, and how late it would have been
//! is never seen.
//!
//! What is known is a lower bound: a primary cut short by its hedge took
//! longer than the response's time. That is right-censored data, and the
//! Kaplan-Meier estimator rebuilds the distribution from it without bias as
//! long as when an attempt is cut short does not depend on how slow it is
//! (it depends on the hedge's own latency, an independent draw). The filter
//! keeps, over the long horizon, the primaries' observed times (the
//! cluster's samples) and, apart, those of the primaries cut short; the
//! estimate is read on the tick.
//!
//! What it needs to know is which attempt answered, which only host choice
//! tells (the response names its host, and the filter named the primary's).
//! A hedged response whose winner is not known counts as cut short: then the
//! estimate errs high, never low, between the delay and about twice it.

use super::sketch::{value_for, Sketch};

/// Whether a timed response's primary attempt was cut short by a hedge:
/// the request had more attempts than one, its response came after the
/// per-try timeout (earlier, a second attempt is a retry after a failure,
/// not a hedge), and the attempt that answered was not the primary (or it
/// is not known which one answered).
pub fn primary_cut_short(
    latency_us: u64,
    attempts: Option<u64>,
    per_try_timeout_us: Option<u64>,
    primary_answered: Option<bool>,
) -> bool {
    let hedged =
        attempts.is_some_and(|a| a >= 2) && per_try_timeout_us.is_some_and(|d| latency_us >= d);
    hedged && primary_answered != Some(true)
}

/// The `q` quantile of the primaries' own latency (µs): the Kaplan-Meier
/// estimate from `primaries` (every primary's observed time: its latency,
/// or when it was cut short) of which `cut_short` were cut short at that
/// time. `None` when empty, or when the estimate never falls to `1 - q`
/// (every primary slower than some time was cut short: the quantile is
/// past anything seen).
///
/// Kaplan-Meier, bucket by bucket in ascending order: of the primaries
/// still running at a bucket (`at_risk`: every observation at it or
/// above), those that answered there end the share `answered / at_risk`
/// of what survives; those cut short there leave the risk set after it
/// (a cut-short primary lasted at least that long).
pub fn backend_quantile(primaries: &Sketch, cut_short: &Sketch, q: f64) -> Option<f64> {
    let mut at_risk = primaries.count();
    if at_risk == 0 {
        return None;
    }
    let target = 1.0 - q.clamp(0.0, 1.0);
    let mut survival = 1.0f64;
    for (i, &n) in primaries.counts().iter().enumerate() {
        if n == 0 {
            continue;
        }
        let key = primaries.offset().saturating_add(i as i32);
        let observed = u64::from(n);
        // the long horizons are halved apart: never more cut than seen
        let cut = cut_short.count_at_key(key).min(observed);
        let answered = observed - cut;
        survival *= 1.0 - answered as f64 / at_risk.max(1) as f64;
        if survival <= target {
            return Some(value_for(key));
        }
        at_risk = at_risk.saturating_sub(observed);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn sketch_of(values: impl IntoIterator<Item = f64>) -> Sketch {
        let mut s = Sketch::new();
        for v in values {
            s.add(v);
        }
        s
    }

    fn exact_quantile(values: &[f64], q: f64) -> f64 {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).floor() as usize]
    }

    /// What a filter hedging every request at `delay` sees of `draws`
    /// (primary, hedge): the response's time and whether the primary was cut
    /// short; `known` says whether it knows which attempt answered.
    fn hedged(draws: &[(f64, f64)], delay: f64, known: bool) -> (Sketch, Sketch) {
        let mut primaries = Sketch::new();
        let mut cut = Sketch::new();
        for &(p, h) in draws {
            let (time, attempts, primary_answered) = if p <= delay {
                (p, 1, true)
            } else if p <= delay + h {
                (p, 2, true)
            } else {
                (delay + h, 2, false)
            };
            primaries.add(time);
            if primary_cut_short(
                time as u64,
                Some(attempts),
                Some(delay as u64),
                known.then_some(primary_answered),
            ) {
                cut.add(time);
            }
        }
        (primaries, cut)
    }

    /// A cache in front of a slow backend: 95% of answers at about 20 ms,
    /// 5% at about 200 ms (the e2e test's workload). Hedged after 22 ms
    /// the clients' p99 is a hedge's answer, about 42 ms; the backend's
    /// p99 is in the slow mode, and the estimate finds it.
    fn cache_draw(rng: &mut impl Rng) -> f64 {
        let base = if rng.gen_bool(0.05) {
            200_000.0
        } else {
            20_000.0
        };
        base * (1.0 + 0.03 * (rng.gen::<f64>() * 2.0 - 1.0))
    }

    #[test]
    fn the_backend_s_p99_is_found_behind_the_hedges() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(20);
        let draws: Vec<(f64, f64)> = (0..5_000)
            .map(|_| (cache_draw(&mut rng), cache_draw(&mut rng)))
            .collect();
        let truth = exact_quantile(&draws.iter().map(|d| d.0).collect::<Vec<_>>(), 0.99);
        let (primaries, cut) = hedged(&draws, 22_000.0, true);
        let clients = primaries.quantile(0.99).unwrap();
        assert!(clients < 0.3 * truth, "clients {clients} truth {truth}");
        let backend = backend_quantile(&primaries, &cut, 0.99).unwrap();
        assert!(
            (backend / truth - 1.0).abs() < 0.03,
            "backend {backend} truth {truth}"
        );
        // the body is not touched by the hedging
        let p50 = backend_quantile(&primaries, &cut, 0.5).unwrap();
        let truth50 = exact_quantile(&draws.iter().map(|d| d.0).collect::<Vec<_>>(), 0.5);
        assert!((p50 / truth50 - 1.0).abs() < 0.02, "{p50} vs {truth50}");
    }

    /// A continuous tail (lognormal, sigma 0.6) hedged at its p92: the p90
    /// and p99 are within 5% of the truth; counting the cut-short
    /// primaries as answers (what the clients' quantile does) is not.
    #[test]
    fn a_lognormal_tail_is_rebuilt() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut draw = || {
            let z: f64 = (0..12).map(|_| rng.gen::<f64>()).sum::<f64>() - 6.0;
            10_000.0 * (0.6 * z).exp()
        };
        let draws: Vec<(f64, f64)> = (0..200_000).map(|_| (draw(), draw())).collect();
        let truths: Vec<f64> = draws.iter().map(|d| d.0).collect();
        let delay = exact_quantile(&truths, 0.92);
        let (primaries, cut) = hedged(&draws, delay, true);
        for q in [0.9, 0.99] {
            let truth = exact_quantile(&truths, q);
            let backend = backend_quantile(&primaries, &cut, q).unwrap();
            assert!(
                (backend / truth - 1.0).abs() < 0.05,
                "p{q}: backend {backend} truth {truth}"
            );
        }
        let truth99 = exact_quantile(&truths, 0.99);
        let naive = backend_quantile(&primaries, &Sketch::new(), 0.99).unwrap();
        assert!(naive < 0.85 * truth99, "naive {naive} truth {truth99}");
    }

    /// Without knowing which attempt answered, every hedged primary counts
    /// as cut short: the estimate errs high, never low.
    #[test]
    fn an_unknown_winner_errs_high() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let draws: Vec<(f64, f64)> = (0..20_000)
            .map(|_| (cache_draw(&mut rng), cache_draw(&mut rng)))
            .collect();
        let truths: Vec<f64> = draws.iter().map(|d| d.0).collect();
        let (primaries, cut) = hedged(&draws, 22_000.0, false);
        for q in [0.5, 0.9, 0.99] {
            let truth = exact_quantile(&truths, q);
            let backend = backend_quantile(&primaries, &cut, q);
            assert!(
                backend.is_none_or(|b| b >= 0.98 * truth),
                "p{q}: {backend:?} vs {truth}"
            );
        }
    }

    #[test]
    fn unhedged_it_is_the_plain_quantile() {
        let values: Vec<f64> = (1..=1000).map(|i| i as f64 * 100.0).collect();
        let s = sketch_of(values.iter().copied());
        for q in [0.5, 0.9, 0.99] {
            let plain = s.quantile(q).unwrap();
            let km = backend_quantile(&s, &Sketch::new(), q).unwrap();
            assert!((km / plain - 1.0).abs() < 0.021, "p{q}: {km} vs {plain}");
        }
        assert_eq!(backend_quantile(&Sketch::new(), &Sketch::new(), 0.5), None);
    }

    /// Every primary past 30 ms was cut short: the p99 is past anything
    /// seen, and not made up; more cut than seen in a bucket (the long
    /// horizons halve apart) is read as all of it.
    #[test]
    fn a_tail_never_seen_is_not_made_up() {
        let primaries = sketch_of((0..100).map(|i| if i < 90 { 10_000.0 } else { 30_000.0 }));
        let all_cut = sketch_of((0..20).map(|_| 30_000.0));
        assert_eq!(backend_quantile(&primaries, &all_cut, 0.99), None);
        let p50 = backend_quantile(&primaries, &all_cut, 0.5).unwrap();
        assert!((p50 / 10_000.0 - 1.0).abs() < 0.02, "{p50}");
    }

    #[test]
    fn which_primaries_were_cut_short() {
        // one attempt, or a retry before the per-try timeout: not cut
        assert!(!primary_cut_short(30_000, Some(1), Some(20_000), None));
        assert!(!primary_cut_short(10_000, Some(2), Some(20_000), None));
        // no per-try timeout (not armed): a retry, not a hedge
        assert!(!primary_cut_short(30_000, Some(2), None, None));
        // hedged: cut unless the primary is known to have answered
        assert!(!primary_cut_short(
            30_000,
            Some(2),
            Some(20_000),
            Some(true)
        ));
        assert!(primary_cut_short(
            30_000,
            Some(2),
            Some(20_000),
            Some(false)
        ));
        assert!(primary_cut_short(30_000, Some(3), Some(20_000), None));
        assert!(!primary_cut_short(30_000, None, Some(20_000), None));
    }
}
