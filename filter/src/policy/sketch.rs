//! DDSketch (Masson, Rim, Lee, VLDB 2019): a quantile sketch whose answers are
//! within a fixed *relative* error of the exact quantile, mergeable by adding
//! bucket counts. That is what lets every Envoy worker feed one shared window.
//!
//! Values are latencies in microseconds. Bucket `k` holds values in
//! (gamma^(k-1), gamma^k]; values at or below 1 µs share bucket 0 and values
//! above gamma^MAX_KEY (about 16 days) share the last bucket.
//!
//! A sketch keeps at most `MAX_BUCKETS` buckets, whatever it is fed: when
//! its samples span more, the lowest buckets collapse into one (DDSketch's
//! collapsing-lowest store). Hedging asks for high quantiles only, and 500
//! buckets span a 21,600-fold range (say 50 µs to 1.1 s): every quantile
//! whose value is within that range of the largest sample keeps the 1%
//! guarantee; lower ones read high. The bound is what keeps a cluster's
//! shared value small (`shared_state`).

/// Relative accuracy: a reported quantile is within 1% of the exact one.
pub const RELATIVE_ACCURACY: f64 = 0.01;
/// Highest bucket key; gamma^1400 µs is about 1.6e12 µs.
pub const MAX_KEY: i32 = 1400;
/// Buckets a sketch keeps at most: gamma^499 is about 21,600, the range the
/// lowest bucket kept spans below the highest.
pub const MAX_BUCKETS: usize = 500;

/// gamma = (1 + a) / (1 - a)
fn gamma() -> f64 {
    (1.0 + RELATIVE_ACCURACY) / (1.0 - RELATIVE_ACCURACY)
}

/// Bucket key for a value in microseconds.
pub fn key_for(value_us: f64) -> i32 {
    if value_us.is_nan() || value_us <= 1.0 {
        // <= 1 µs, or NaN: the lowest bucket.
        return 0;
    }
    let key = (value_us.ln() / gamma().ln()).ceil();
    if key >= MAX_KEY as f64 {
        MAX_KEY
    } else {
        key as i32
    }
}

/// The value a bucket stands for: the point of least relative error to
/// every value the bucket can hold.
pub fn value_for(key: i32) -> f64 {
    if key <= 0 {
        return 1.0;
    }
    let g = gamma();
    2.0 * g.powi(key) / (g + 1.0)
}

/// Dense buckets over the range of keys seen so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sketch {
    /// Key of `counts[0]`.
    offset: i32,
    counts: Vec<u32>,
    total: u64,
}

impl Sketch {
    pub fn new() -> Self {
        Sketch::default()
    }

    /// Rebuilds a sketch from stored buckets; `None` if they are out of
    /// range or more than `MAX_BUCKETS`.
    pub fn from_parts(offset: i32, counts: Vec<u32>) -> Option<Self> {
        let last = i64::from(offset) + counts.len() as i64 - 1;
        if offset < 0
            || counts.len() > MAX_BUCKETS
            || (!counts.is_empty() && last > i64::from(MAX_KEY))
        {
            return None;
        }
        let total = counts.iter().map(|&c| u64::from(c)).sum();
        Some(Sketch {
            offset,
            counts,
            total,
        })
    }

    pub fn offset(&self) -> i32 {
        self.offset
    }

    pub fn counts(&self) -> &[u32] {
        &self.counts
    }

    /// The count of the bucket with this key (0 outside the sketch).
    pub fn count_at_key(&self, key: i32) -> u64 {
        key.checked_sub(self.offset)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.counts.get(i))
            .map_or(0, |&n| u64::from(n))
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    pub fn clear(&mut self) {
        self.counts.clear();
        self.offset = 0;
        self.total = 0;
    }

    pub fn add(&mut self, value_us: f64) {
        self.add_to_key(key_for(value_us), 1);
    }

    fn add_to_key(&mut self, key: i32, n: u32) {
        if n == 0 {
            return;
        }
        let mut key = key.clamp(0, MAX_KEY);
        let span = MAX_BUCKETS as i32;
        if self.counts.is_empty() {
            self.offset = key;
        } else if key < self.offset {
            // below the range: grow down as far as the bound allows, and
            // count the rest in the lowest bucket kept
            let top = self.offset + self.counts.len() as i32 - 1;
            key = key.max(top - (span - 1));
            let grow = (self.offset - key) as usize;
            self.counts.splice(0..0, std::iter::repeat(0).take(grow));
            self.offset = key;
        } else if key - self.offset >= span {
            self.collapse_below(key - (span - 1));
        }
        let index = (key - self.offset) as usize;
        if index >= self.counts.len() {
            self.counts.resize(index + 1, 0);
        }
        // a bucket full at u32::MAX keeps what it can, and the total only
        // that: ranks past the counts would read the top bucket for every
        // quantile (reachable only through another worker's shared value)
        if let Some(c) = self.counts.get_mut(index) {
            let before = *c;
            *c = c.saturating_add(n);
            self.total += u64::from(*c - before);
        }
    }

    /// Moves the counts of every bucket below `lowest` into the bucket
    /// `lowest`, which becomes the first one.
    fn collapse_below(&mut self, lowest: i32) {
        let drop = usize::try_from(lowest - self.offset).unwrap_or(0);
        let drop = drop.min(self.counts.len());
        let moved: u64 = self.counts.drain(..drop).map(u64::from).sum();
        if self.counts.is_empty() {
            self.counts.push(0);
        }
        if let Some(first) = self.counts.first_mut() {
            let kept = (u64::from(*first) + moved).min(u64::from(u32::MAX));
            // what a full bucket cannot hold leaves the total too
            self.total = self.total.saturating_sub(u64::from(*first) + moved - kept);
            *first = kept as u32;
        }
        self.offset = lowest;
    }

    /// Halves every count `times` times: older samples weigh less. Buckets
    /// left empty at either end are dropped. The remainders are carried
    /// down from the top bucket, so every count from the top stays within
    /// one sample of the exact halving: rounding each bucket down on its
    /// own emptied a sparse tail (one sample a bucket) while the body
    /// kept its weight, and a p95 of 100 ms became 10 ms after one
    /// half-life (the long horizon at a few requests a second).
    pub fn halve(&mut self, times: u32) {
        if times == 0 {
            return;
        }
        let mask = 1u64.checked_shl(times).map_or(u64::MAX, |m| m - 1);
        let mut carry = 0u64;
        for c in self.counts.iter_mut().rev() {
            let v = u64::from(*c) + carry;
            carry = v & mask;
            *c = u32::try_from(v.checked_shr(times).unwrap_or(0)).unwrap_or(u32::MAX);
        }
        while self.counts.last() == Some(&0) {
            self.counts.pop();
        }
        let leading = self.counts.iter().take_while(|&&c| c == 0).count();
        self.counts.drain(..leading);
        self.offset = if self.counts.is_empty() {
            0
        } else {
            self.offset + leading as i32
        };
        self.total = self.counts.iter().map(|&c| u64::from(c)).sum();
    }

    /// Adds every sample of `other` (DDSketch merge: bucket-wise sum).
    pub fn merge(&mut self, other: &Sketch) {
        // the highest bucket first: the range grows (and collapses) once,
        // then the rest lands inside it
        let Some((&top, rest)) = other.counts.split_last() else {
            return;
        };
        self.add_to_key(other.offset + rest.len() as i32, top);
        for (i, &n) in rest.iter().enumerate() {
            self.add_to_key(other.offset + i as i32, n);
        }
    }

    /// The non-empty buckets in ascending order: (the value each stands
    /// for, its count).
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| (value_for(self.offset + i as i32), u64::from(n)))
    }

    /// The value at quantile `q` in [0, 1], in microseconds; `None` if empty.
    /// Rank convention: the element at index floor(q * (n - 1)) of the sorted
    /// samples, the same one the accuracy guarantee is stated for.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        let rank = (q * (self.total - 1) as f64).floor() as u64;
        let mut seen = 0u64;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += u64::from(n);
            if seen > rank {
                return Some(value_for(self.offset + i as i32));
            }
        }
        Some(value_for(self.offset + self.counts.len() as i32 - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_distr::{Distribution, LogNormal};

    /// A sparse tail (one sample a bucket) beside a dense body: halving
    /// keeps the tail's weight (rounding each bucket down on its own
    /// emptied it, and a p96 of 100+ ms became 10 ms after a half-life).
    #[test]
    fn halving_keeps_a_sparse_tail_s_weight() {
        let mut s = Sketch::new();
        for _ in 0..94 {
            s.add(10_000.0);
        }
        for v in [
            100_000.0, 110_000.0, 121_000.0, 133_000.0, 146_000.0, 161_000.0,
        ] {
            s.add(v);
        }
        assert!(s.quantile(0.96).unwrap() >= 99_000.0);
        s.halve(1);
        assert_eq!(s.count(), 50);
        let p96 = s.quantile(0.96).unwrap();
        assert!(p96 >= 99_000.0, "{p96}");
        // many halvings at once: the same as one at a time, within a sample
        let mut once = s.clone();
        let mut step = s.clone();
        once.halve(3);
        for _ in 0..3 {
            step.halve(1);
        }
        assert!(once.count().abs_diff(step.count()) <= 1);
        s.halve(40);
        assert!(s.is_empty());
    }

    fn exact(sorted: &[f64], q: f64) -> f64 {
        sorted[(q * (sorted.len() - 1) as f64).floor() as usize]
    }

    /// Lognormal with the reference workload's mean 5 ms and sd 2 ms, in µs.
    fn reference_lognormal() -> LogNormal<f64> {
        let (mean, sd) = (5000.0f64, 2000.0f64);
        let sigma2 = (1.0 + (sd * sd) / (mean * mean)).ln();
        LogNormal::new(mean.ln() - sigma2 / 2.0, sigma2.sqrt()).unwrap()
    }

    #[test]
    fn quantiles_within_one_percent_of_exact_on_100k_lognormal() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let dist = reference_lognormal();
        let mut sketch = Sketch::new();
        let mut values = Vec::with_capacity(100_000);
        for _ in 0..100_000 {
            // stragglers too, so the tail is exercised
            let mut v = dist.sample(&mut rng);
            if values.len() % 20 == 0 {
                v *= 10.0;
            }
            sketch.add(v);
            values.push(v);
        }
        values.sort_by(|a, b| a.partial_cmp(b).unwrap());
        for q in [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0] {
            let want = exact(&values, q);
            let got = sketch.quantile(q).unwrap();
            let err = (got - want).abs() / want;
            assert!(
                err <= RELATIVE_ACCURACY + 1e-9,
                "q={q}: got {got}, exact {want}, err {err}"
            );
        }
        assert_eq!(sketch.count(), 100_000);
    }

    #[test]
    fn merge_equals_one_sketch_fed_everything() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let dist = reference_lognormal();
        let (mut a, mut b, mut all) = (Sketch::new(), Sketch::new(), Sketch::new());
        for i in 0..20_000 {
            let v = dist.sample(&mut rng) * if i % 3 == 0 { 40.0 } else { 1.0 };
            if i % 2 == 0 {
                a.add(v)
            } else {
                b.add(v)
            }
            all.add(v);
        }
        a.merge(&b);
        assert_eq!(a, all);
    }

    /// The same data through this sketch and the `sketches-ddsketch` crate
    /// (DataDog's mapping, relative accuracy 1%): every quantile agrees
    /// within that 1%, on the reference workload, a uniform spread over four
    /// decades, and a heavy Pareto tail.
    #[test]
    fn agrees_with_the_sketches_ddsketch_crate() {
        use rand::Rng;
        use rand_distr::Pareto;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let reference = reference_lognormal();
        let pareto = Pareto::new(1000.0, 1.2).unwrap();
        type Draw = Box<dyn FnMut(&mut rand::rngs::StdRng) -> f64>;
        let workloads: [(&str, Draw); 3] = [
            (
                "reference",
                Box::new(move |r| {
                    let v = reference.sample(r);
                    if r.gen_bool(0.05) {
                        v * 10.0
                    } else {
                        v
                    }
                }),
            ),
            ("uniform", Box::new(|r| r.gen_range(10.0..100_000.0))),
            ("pareto", Box::new(move |r| pareto.sample(r))),
        ];
        for (name, mut draw) in workloads {
            let mut ours = Sketch::new();
            let mut theirs = sketches_ddsketch::DDSketch::new(sketches_ddsketch::Config::new(
                RELATIVE_ACCURACY,
                4096,
                1.0,
            ));
            let mut max = 0f64;
            for _ in 0..50_000 {
                let v = draw(&mut rng);
                ours.add(v);
                theirs.add(v);
                max = max.max(v);
            }
            for q in [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.92, 0.95, 0.99, 0.999] {
                let a = ours.quantile(q).unwrap();
                let b = theirs.quantile(q).unwrap().unwrap();
                if b < max / 21_500.0 {
                    // collapsed (the Pareto's lowest percent): reads high
                    assert!(a >= b, "{name} q={q}: ours {a}, sketches-ddsketch {b}");
                    continue;
                }
                assert!(
                    (a - b).abs() <= RELATIVE_ACCURACY * b,
                    "{name} q={q}: ours {a}, sketches-ddsketch {b}"
                );
            }
            assert_eq!(ours.count(), theirs.count() as u64);
        }
    }

    #[test]
    fn bounded_whatever_it_is_fed() {
        let mut s = Sketch::new();
        for v in [0.0, -5.0, f64::NAN, f64::INFINITY, 1e300, 0.5, 1.0, 2.0] {
            s.add(v);
        }
        assert!(s.counts().len() <= MAX_BUCKETS);
        assert_eq!(s.count(), 8);
        assert!(s.quantile(1.0).unwrap() > 1e12);
        // everything far below the top collapsed into the lowest bucket kept
        assert_eq!(s.offset(), MAX_KEY - (MAX_BUCKETS as i32 - 1));
        assert_eq!(s.counts()[0], 6);
    }

    /// Samples over ten decades: at most `MAX_BUCKETS` buckets, no sample
    /// lost, and every quantile within 21,600x of the largest sample still
    /// within 1%; the ones below read high, never low.
    #[test]
    fn a_wide_spread_collapses_its_lowest_buckets_only() {
        use rand::Rng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut values: Vec<f64> = (0..50_000)
            .map(|_| 10f64.powf(rng.gen_range(0.0..10.0)))
            .collect();
        let mut fed = Sketch::new();
        let (mut a, mut b) = (Sketch::new(), Sketch::new());
        for (i, &v) in values.iter().enumerate() {
            fed.add(v);
            if i % 2 == 0 {
                a.add(v)
            } else {
                b.add(v)
            }
        }
        a.merge(&b);
        values.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let max = values[values.len() - 1];
        for sketch in [&fed, &a] {
            assert_eq!(sketch.count(), 50_000);
            assert!(sketch.counts().len() <= MAX_BUCKETS);
            for q in [0.0, 0.1, 0.5, 0.55, 0.6, 0.7, 0.9, 0.99, 0.999, 1.0] {
                let want = exact(&values, q);
                let got = sketch.quantile(q).unwrap();
                if want >= max / 21_500.0 {
                    assert!((got - want).abs() <= RELATIVE_ACCURACY * want, "q={q}");
                } else {
                    assert!(got >= want * (1.0 - RELATIVE_ACCURACY), "q={q}");
                }
            }
        }
        // a sketch fed in the other order (largest first) ends the same
        let mut down = Sketch::new();
        for &v in values.iter().rev() {
            down.add(v);
        }
        assert_eq!(down, fed);
    }

    #[test]
    fn halving_keeps_the_shape_and_forgets_the_few() {
        let mut s = Sketch::new();
        for _ in 0..8 {
            s.add(1000.0);
        }
        s.add(5.0);
        for _ in 0..4 {
            s.add(50_000.0);
        }
        let median = s.quantile(0.5);
        s.halve(1);
        assert_eq!(s.count(), 4 + 2, "the lone 5 µs sample is gone");
        assert_eq!(s.quantile(0.5), median);
        assert_eq!(s.offset(), key_for(1000.0), "empty buckets dropped");
        s.halve(40);
        assert!(s.is_empty());
        assert_eq!(Sketch::from_parts(s.offset(), s.counts().to_vec()), Some(s));
    }

    #[test]
    fn empty_has_no_quantile() {
        assert_eq!(Sketch::new().quantile(0.5), None);
    }

    #[test]
    fn a_full_bucket_keeps_the_total_equal_to_its_counts() {
        let sum = |s: &Sketch| s.counts().iter().map(|&c| u64::from(c)).sum::<u64>();
        let mut a = Sketch::from_parts(10, vec![u32::MAX]).unwrap();
        a.merge(&Sketch::from_parts(10, vec![5]).unwrap());
        assert_eq!(a.count(), sum(&a));
        // collapsed into a full lowest bucket
        let mut b = Sketch::from_parts(0, vec![u32::MAX, u32::MAX]).unwrap();
        b.merge(&Sketch::from_parts(MAX_BUCKETS as i32 + 5, vec![1]).unwrap());
        assert_eq!(b.count(), sum(&b));
        assert_eq!(b.count(), u64::from(u32::MAX) + 1);
    }

    #[test]
    fn from_parts_checks_range() {
        assert!(Sketch::from_parts(-1, vec![1]).is_none());
        assert!(Sketch::from_parts(MAX_KEY, vec![1, 1]).is_none());
        assert!(Sketch::from_parts(0, vec![1; MAX_BUCKETS + 1]).is_none());
        let s = Sketch::from_parts(10, vec![1, 2, 3]).unwrap();
        assert_eq!(s.count(), 6);
    }
}
