//! The rolling latency window of one cluster: a ring of `SLICES` sketches,
//! each tagged with the epoch (slice number since the Unix epoch) it holds.
//!
//! Old data ages out one slice at a time, so the quantile follows a shift
//! smoothly instead of dropping everything at once. Because every slice
//! carries its epoch, "rotation" needs no coordinator: whoever writes into a
//! slot whose tag is old clears it first, and readers ignore slots outside the
//! window. Every worker derives the same epoch from the host's wall clock, so
//! the shared ring stays consistent under concurrent compare-and-swap writers.

use std::time::Duration;

use super::sketch::Sketch;

/// Latency samples a worker takes per tick and cluster, about (1,280/s at
/// the default 200 ms tick; a 30 s window then holds up to ~38,000 per
/// worker). Past that rate every `stride`-th request of the sampled
/// population is a sample, the stride set on each tick from the last tick's
/// count: samples spread over the whole tick, not the first requests of it
/// (a burst at the start of a tick, as after a stall, is not the tick).
pub const SAMPLES_PER_TICK: u32 = 256;

/// Number of slices in a window: a 30 s window ages out in 5 s steps.
pub const SLICES: usize = 6;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowGeometry {
    pub slice_ms: u64,
}

impl WindowGeometry {
    pub fn new(window: Duration) -> Self {
        let slice_ms = (window.as_millis() as u64 / SLICES as u64).max(1);
        WindowGeometry { slice_ms }
    }

    pub fn epoch(&self, now_ms: u64) -> u64 {
        now_ms / self.slice_ms
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slice {
    pub epoch: u64,
    pub sketch: Sketch,
}

/// A window of latency samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterWindow {
    pub geometry: WindowGeometry,
    pub slices: [Slice; SLICES],
}

impl ClusterWindow {
    pub fn new(geometry: WindowGeometry) -> Self {
        ClusterWindow {
            geometry,
            slices: Default::default(),
        }
    }

    fn is_live(&self, slice: &Slice, now_epoch: u64) -> bool {
        !slice.sketch.is_empty()
            && slice.epoch <= now_epoch
            && now_epoch - slice.epoch < SLICES as u64
    }

    /// Adds a batch of samples taken up to `now_ms` to the current slice.
    pub fn merge(&mut self, now_ms: u64, samples: &Sketch) {
        if samples.is_empty() {
            return;
        }
        let epoch = self.geometry.epoch(now_ms);
        if let Some(slot) = self.slices.get_mut((epoch % SLICES as u64) as usize) {
            if slot.epoch != epoch {
                slot.sketch.clear();
                slot.epoch = epoch;
            }
            slot.sketch.merge(samples);
        }
    }

    /// No sample in the window, nor in the slice one ahead that another
    /// worker may have opened already (see `expire`): its samples are as
    /// recent as can be.
    pub fn is_idle(&self, now_ms: u64) -> bool {
        let now_epoch = self.geometry.epoch(now_ms);
        !self.slices.iter().any(|s| self.is_kept(s, now_epoch))
    }

    /// Live, or the slice one ahead with samples (see `expire`).
    fn is_kept(&self, slice: &Slice, now_epoch: u64) -> bool {
        self.is_live(slice, now_epoch) || (!slice.sketch.is_empty() && slice.epoch == now_epoch + 1)
    }

    /// Clears slices that have left the window (keeps the shared encoding
    /// small). A slice one ahead stays: a worker reads the clock once per
    /// tick, so another may have written the next slice since (at a slice
    /// boundary), and its samples are not to be lost. Snapshots skip it
    /// until its time comes.
    pub fn expire(&mut self, now_ms: u64) {
        let now_epoch = self.geometry.epoch(now_ms);
        for i in 0..SLICES {
            let live = self
                .slices
                .get(i)
                .is_some_and(|s| self.is_kept(s, now_epoch));
            if let (false, Some(slot)) = (live, self.slices.get_mut(i)) {
                slot.sketch.clear();
                slot.epoch = 0;
            }
        }
    }

    /// The samples of the current and the previous `slices - 1` slices.
    pub fn snapshot_recent(&self, now_ms: u64, slices: u64) -> Sketch {
        let now_epoch = self.geometry.epoch(now_ms);
        let mut recent = Sketch::new();
        for slice in &self.slices {
            if self.is_live(slice, now_epoch) && now_epoch - slice.epoch < slices {
                recent.merge(&slice.sketch);
            }
        }
        recent
    }

    /// The newest slices that hold at least `min_count` samples together,
    /// and at least `min_slices` of them (the whole window if it holds
    /// fewer). Why: at a low rate two slices hold too few samples for a
    /// quantile, and a guard that is dropped then leaves the delay at the
    /// long horizon's (a brownout's stale delay) whenever a slice turns
    /// over; more slices answer later but always answer.
    pub fn snapshot_recent_at_least(&self, now_ms: u64, min_slices: u64, min_count: u64) -> Sketch {
        let now_epoch = self.geometry.epoch(now_ms);
        let mut recent = self.snapshot_recent(now_ms, min_slices);
        // one older slice at a time, merged into what is there
        for age in min_slices..SLICES as u64 {
            if recent.count() >= min_count {
                break;
            }
            let older = self
                .slices
                .iter()
                .find(|s| self.is_live(s, now_epoch) && now_epoch - s.epoch == age);
            if let Some(slice) = older {
                recent.merge(&slice.sketch);
            }
        }
        recent
    }

    /// All samples of the window as one sketch.
    pub fn snapshot(&self, now_ms: u64) -> Sketch {
        let now_epoch = self.geometry.epoch(now_ms);
        let mut all = Sketch::new();
        for slice in &self.slices {
            if self.is_live(slice, now_epoch) {
                all.merge(&slice.sketch);
            }
        }
        all
    }
}

/// How fast the long horizon forgets: every sample's weight halves every
/// ten minutes (an hour ago weighs a sixty-fourth).
pub const LONG_HALF_LIFE_MS: u64 = 600_000;

/// Every sample of the cluster, older ones weighing less: the distribution
/// over a long horizon (see `hedge_delay`). One sketch, halved once per
/// half-life; `period` is the half-life count it was last halved at, taken
/// from the wall clock like the window's epochs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LongHorizon {
    pub period: u64,
    pub sketch: Sketch,
}

impl LongHorizon {
    /// Adds samples taken up to `now_ms`, first halving the older ones once
    /// per half-life passed since the last merge. A clock set back by more
    /// than a half-life re-bases the count: kept in the future, nothing was
    /// halved until the clock caught up (after a host booted days ahead and
    /// was corrected, an all-time histogram, and route slots never freed;
    /// found by a review). One half-life back is let be: a worker whose
    /// tick read the clock just before a boundary another one has crossed
    /// would halve twice.
    pub fn merge(&mut self, now_ms: u64, samples: &Sketch) {
        let period = now_ms / LONG_HALF_LIFE_MS;
        if period > self.period {
            let passed = u32::try_from(period - self.period).unwrap_or(u32::MAX);
            self.sketch.halve(passed);
            self.period = period;
        } else if period.saturating_add(1) < self.period {
            self.period = period;
        }
        self.sketch.merge(samples);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(value_us: f64, n: usize) -> Sketch {
        let mut s = Sketch::new();
        for _ in 0..n {
            s.add(value_us);
        }
        s
    }

    #[test]
    fn ages_out_in_steps() {
        let g = WindowGeometry::new(Duration::from_secs(30));
        assert_eq!(g.slice_ms, 5000);
        let mut w = ClusterWindow::new(g);
        let t0 = 1_000_000_000u64; // a slice boundary
        w.merge(t0, &batch(1000.0, 100));
        assert_eq!(w.snapshot(t0).count(), 100);
        w.merge(t0 + 10_000, &batch(1000.0, 50));
        assert_eq!(w.snapshot(t0 + 10_000).count(), 150);
        // the first batch's slice leaves the window after 6 slices
        assert_eq!(w.snapshot(t0 + 29_999).count(), 150);
        assert_eq!(w.snapshot(t0 + 30_000).count(), 50);
        assert_eq!(w.snapshot(t0 + 40_000).count(), 0);
    }

    #[test]
    fn stale_slot_is_cleared_when_reused() {
        let mut w = ClusterWindow::new(WindowGeometry::new(Duration::from_secs(6)));
        w.merge(0, &batch(1000.0, 10));
        // same slot, six slices later
        w.merge(6_000, &batch(2000.0, 3));
        assert_eq!(w.snapshot(6_000).count(), 3);
    }

    #[test]
    fn expire_drops_old_slices() {
        let mut w = ClusterWindow::new(WindowGeometry::new(Duration::from_secs(6)));
        w.merge(0, &batch(1000.0, 10));
        w.merge(3_000, &batch(1000.0, 10));
        w.expire(6_500);
        assert_eq!(w.slices.iter().filter(|s| !s.sketch.is_empty()).count(), 1);
        assert_eq!(w.snapshot(6_500).count(), 10);
    }

    /// Samples a worker past a slice boundary wrote into the next slice
    /// make the window busy for a worker whose clock is still before it
    /// (it evicted the cluster, and those samples, before).
    #[test]
    fn a_slice_one_ahead_is_not_idle() {
        let mut w = ClusterWindow::new(WindowGeometry::new(Duration::from_secs(6)));
        assert!(w.is_idle(5_900));
        w.merge(6_000, &batch(1000.0, 1));
        assert!(w.snapshot(5_900).is_empty());
        assert!(!w.is_idle(5_900));
        assert!(!w.is_idle(6_000));
        assert!(w.is_idle(12_000));
    }

    #[test]
    fn recent_is_the_newest_slices() {
        let mut w = ClusterWindow::new(WindowGeometry::new(Duration::from_secs(30)));
        w.merge(0, &batch(1000.0, 10));
        w.merge(5_000, &batch(1000.0, 20));
        w.merge(10_000, &batch(1000.0, 40));
        assert_eq!(w.snapshot_recent(10_000, 2).count(), 60);
        assert_eq!(w.snapshot_recent(10_000, 1).count(), 40);
        assert_eq!(w.snapshot(10_000).count(), 70);
    }

    #[test]
    fn recent_widens_until_it_holds_enough() {
        let mut w = ClusterWindow::new(WindowGeometry::new(Duration::from_secs(30)));
        w.merge(0, &batch(1000.0, 50));
        w.merge(5_000, &batch(1000.0, 30));
        w.merge(10_000, &batch(1000.0, 40));
        assert_eq!(w.snapshot_recent_at_least(10_000, 2, 60).count(), 70);
        assert_eq!(w.snapshot_recent_at_least(10_000, 2, 71).count(), 120);
        // never more than the window
        assert_eq!(w.snapshot_recent_at_least(10_000, 2, 1_000).count(), 120);
    }

    #[test]
    fn the_long_horizon_halves_old_samples_once_per_half_life() {
        let mut long = LongHorizon::default();
        let t0 = 100 * LONG_HALF_LIFE_MS;
        long.merge(t0, &batch(1000.0, 64));
        long.merge(t0 + 1, &batch(1000.0, 64));
        assert_eq!(long.sketch.count(), 128);
        long.merge(t0 + LONG_HALF_LIFE_MS, &batch(9000.0, 16));
        assert_eq!(long.sketch.count(), 64 + 16);
        long.merge(t0 + 4 * LONG_HALF_LIFE_MS, &Sketch::new());
        assert_eq!(long.sketch.count(), 8 + 2);
    }

    /// A clock set a day back (a host booted ahead, then corrected): the
    /// long horizon halves again a half-life later, not a day later. A
    /// tick that read the clock just before a boundary another worker
    /// crossed halves nothing twice.
    #[test]
    fn the_long_horizon_follows_a_clock_set_back() {
        let mut long = LongHorizon::default();
        let t0 = 1_000 * LONG_HALF_LIFE_MS;
        long.merge(t0, &batch(1000.0, 64));
        long.merge(t0 - 1, &batch(1000.0, 64));
        long.merge(t0, &Sketch::new());
        assert_eq!(long.sketch.count(), 128, "one period back: as it was");
        let back = t0 - 144 * LONG_HALF_LIFE_MS;
        long.merge(back, &Sketch::new());
        assert_eq!(long.sketch.count(), 128);
        long.merge(back + LONG_HALF_LIFE_MS, &Sketch::new());
        assert_eq!(long.sketch.count(), 64, "halved a half-life on");
    }

    /// Worker b read its clock just before a slice boundary that worker a
    /// has crossed and written into: b's tick keeps a's slice.
    #[test]
    fn a_tick_just_before_a_boundary_keeps_the_next_slice() {
        let mut w = ClusterWindow::new(WindowGeometry::new(Duration::from_secs(30)));
        w.merge(4_000, &batch(1000.0, 10));
        w.merge(5_001, &batch(1000.0, 20));
        w.expire(4_999);
        w.merge(4_999, &batch(1000.0, 5));
        assert_eq!(w.snapshot(5_002).count(), 35);
        // a slice further ahead (a clock stepped back) is dropped
        w.merge(20_000, &batch(1000.0, 7));
        w.expire(5_002);
        assert_eq!(w.snapshot(20_000).count(), 35);
    }

    #[test]
    fn future_slices_are_ignored() {
        // a worker whose clock runs ahead wrote a slice "from the future"
        let mut w = ClusterWindow::new(WindowGeometry::new(Duration::from_secs(6)));
        w.merge(10_000, &batch(1000.0, 10));
        assert_eq!(w.snapshot(5_000).count(), 0);
    }
}
