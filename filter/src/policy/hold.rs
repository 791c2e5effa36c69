//! The upstream role: when an attempt's response headers wait for its first
//! body byte.
//!
//! Envoy's router commits to the first attempt whose response headers reach
//! it, and a streaming server (SSE, LLM tokens) sends `200 OK` at once and
//! the first token much later. Run as an upstream HTTP filter on the cluster,
//! the module holds each marked attempt's 2xx headers until that attempt's
//! first body data (or its end, or trailers). The router's per-try timer
//! keeps running meanwhile, the hedge goes out at the learned delay, and the
//! router commits to whichever attempt produces a body byte first.
//!
//! The downstream role marks the requests it arms (the router strips the
//! `x-envoy-*` headers before upstream filters run, so this role cannot see
//! whether hedging is armed). The marker stays on the request: the header
//! map is shared by every attempt, and a later attempt must still see it.

use crate::telemetry::{metric_set, Level, Logger, MetricTable, MetricsSink};

/// Holding is only right for a marked attempt whose response is a 2xx with a
/// body still to come:
/// - a held 5xx would delay the retry that `retry_on` asks for;
/// - a held 101 (WebSocket, CONNECT) never gets a body callback: it would stall;
/// - with `end_stream` (204, 304, HEAD, empty bodies) there is nothing to wait for.
pub fn should_hold(marked: bool, status: Option<&[u8]>, end_stream: bool) -> bool {
    marked && !end_stream && matches!(status, Some([b'2', b'0'..=b'9', b'0'..=b'9']))
}

/// How long holds may stay outstanding without a break, with none ever
/// released, before the role says it looks misconfigured: past any first
/// token a model takes to think (a route with `timeout: 0s`, as advised
/// for streams, never ends a hung hold).
pub const STUCK_AFTER_MS: u64 = 30_000;

/// Holds that ended still held after `LONG_HOLD_MS` or more, with none
/// ever released, before the role says it looks misconfigured (a hung hold
/// ends at the route's timeout; a working one is released, or cancelled as
/// a race's loser beside a released winner, or by a client that gave up).
pub const STUCK_ENDED: u32 = 3;

/// A hold that ended still held counts toward `STUCK_ENDED` once it lasted
/// this long (on the ticks' clock: at least a second): a race's loser cut
/// beside an unheld winner (a 503, a 404) ends at once.
pub const LONG_HOLD_MS: u64 = 2_000;

metric_set! {
    /// The upstream role's counters (worker-wide: `adaptive_hedge.<metric>`).
    pub enum HoldMetric {
        Holds = ("first_byte_holds_total", Counter),
        /// Held headers released by a first byte, an end of stream or trailers.
        Releases = ("first_byte_releases_total", Counter),
        /// Attempts that ended while held: hedge losers cancelled by the
        /// router, resets, timeouts.
        HeldEnded = ("first_byte_held_ended_total", Counter),
    }
}

/// What the upstream role did on this VM (its HTTP contexts count, the root
/// context flushes on the tick).
#[derive(Debug, Default)]
pub struct HoldStats {
    metrics: MetricTable<HoldMetric>,
    released_ever: bool,
    /// Holds not released nor ended yet, and since when (on the ticks)
    /// there has been one without a break.
    open: u32,
    open_since_ms: Option<u64>,
    ended_held: u32,
    warned: bool,
    /// The last tick's time: what a hold is stamped with.
    now_ms: u64,
}

impl HoldStats {
    /// The plugin was configured at `now_ms`: what holds are stamped with
    /// until the first tick (the holds that hang without the Wasm config's
    /// flag begin with the first streams).
    pub fn started(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// A hold began: returns its stamp (the last tick's time), for
    /// `on_end_held`.
    pub fn on_hold(&mut self) -> u64 {
        self.open = self.open.saturating_add(1);
        self.metrics.add(HoldMetric::Holds, 1);
        self.now_ms
    }

    pub fn on_release(&mut self) {
        self.released_ever = true;
        self.open = self.open.saturating_sub(1);
        self.metrics.add(HoldMetric::Releases, 1);
    }

    /// The attempt ended with its headers still held, held since `since_ms`
    /// (the stamp `on_hold` gave). A hold stamped 0 (no clock read yet)
    /// is of unknown length, not a long one: taken for one, three streams
    /// cancelled in the first second (beside a hedge that won) said the
    /// Wasm config lacks its flag (found by a review).
    pub fn on_end_held(&mut self, since_ms: u64) {
        self.open = self.open.saturating_sub(1);
        if since_ms > 0 && self.now_ms.saturating_sub(since_ms) >= LONG_HOLD_MS {
            self.ended_held = self.ended_held.saturating_add(1);
        }
        self.metrics.add(HoldMetric::HeldEnded, 1);
    }

    /// On the tick. Without `allow_on_headers_stop_iteration: true` in the
    /// filter's Wasm config, Envoy turns the hold into "stop everything": the
    /// body never reaches the filter and every held attempt hangs until the
    /// route timeout, with no error anywhere. Nothing inside the module can
    /// read that flag, so it watches for the symptom instead: holds and not a
    /// single release: `STUCK_ENDED` holds that ended still held (at the
    /// route's timeout), or a hold outstanding without a break for
    /// `STUCK_AFTER_MS`. Until 2026-11-28 any hold 5 s after the first one
    /// with no release yet raised it: a first token slower than 5 s, or one
    /// cancelled stream and quiet, named a flag that was there.
    pub fn check(&mut self, now_ms: u64, log: &mut dyn Logger) {
        self.now_ms = self.now_ms.max(now_ms);
        self.open_since_ms = match self.open {
            0 => None,
            _ => Some(self.open_since_ms.unwrap_or(now_ms)),
        };
        if self.released_ever || self.warned {
            return;
        }
        let open_ms = self
            .open_since_ms
            .map_or(0, |since| now_ms.saturating_sub(since));
        if self.ended_held < STUCK_ENDED && open_ms < STUCK_AFTER_MS {
            return;
        }
        self.warned = true;
        let seen = match open_ms >= STUCK_AFTER_MS {
            true => format!("one has been held for {}s", open_ms / 1000),
            false => format!("{} ended still held, seconds later", self.ended_held),
        };
        log.log(
            Level::Error,
            &format!(
                "adaptive-hedge upstream role: response headers were held and none was ever released ({seen}); \
                 if streamed requests hang, this filter's Wasm config lacks \"allow_on_headers_stop_iteration\": true \
                 (without it Envoy never passes the body to the filter); else the upstreams sent no body before \
                 these requests ended"
            ),
        );
    }

    pub fn flush_metrics(&mut self, sink: &mut dyn MetricsSink) {
        self.metrics.flush(sink, None, |_| None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::memory::{Lines, Stats};

    #[test]
    fn holds_only_marked_2xx_with_a_body_to_come() {
        assert!(should_hold(true, Some(b"200"), false));
        assert!(should_hold(true, Some(b"206"), false));
        // not marked: the request was not armed (or the client sent the marker
        // and the downstream role removed it)
        assert!(!should_hold(false, Some(b"200"), false));
        // 204, 304, HEAD and empty bodies end with the headers
        assert!(!should_hold(true, Some(b"200"), true));
        assert!(!should_hold(true, Some(b"204"), true));
        for status in [
            &b"101"[..],
            b"304",
            b"404",
            b"503",
            b"2",
            b"20",
            b"2000",
            b"2x0",
            b"",
        ] {
            assert!(!should_hold(true, Some(status), false), "{status:?}");
        }
        assert!(!should_hold(true, None, false));
    }

    /// Holds that end still held at the route's timeout, none released:
    /// the third names the flag, once.
    #[test]
    fn warns_once_when_holds_end_held_and_none_is_released() {
        let mut stats = HoldStats::default();
        let mut log = Lines::default();
        stats.check(0, &mut log); // nothing held yet: nothing to say
                                  // a race's loser cut at once beside an unheld winner, again and
                                  // again: no evidence
        for i in 0..10 {
            let since = stats.on_hold();
            stats.on_end_held(since);
            stats.check(i * 1_000, &mut log);
        }
        assert!(log.0.is_empty(), "{:?}", log.0);
        for i in 0..u64::from(STUCK_ENDED) {
            let since = stats.on_hold();
            stats.check(10_000 + i * 3_000 + 1_000, &mut log);
            stats.check(10_000 + i * 3_000 + 2_000, &mut log);
            assert!(log.0.is_empty(), "{i}");
            stats.on_end_held(since); // the route timeout ends it, still held
            stats.check(10_000 + i * 3_000 + 3_000, &mut log);
        }
        stats.check(30_000, &mut log);
        assert_eq!(log.0.len(), 1);
        assert!(log.0[0].contains("allow_on_headers_stop_iteration"));
        assert!(log.0[0].contains("3 ended still held"), "{}", log.0[0]);
    }

    /// Holds begun before the first tick are stamped with the time the
    /// plugin was configured, if read, and judged by it; not read (0),
    /// they are not known to be long, so no warning.
    #[test]
    fn holds_from_before_the_first_tick_are_judged_from_the_start() {
        const T: u64 = 1_700_000_000_000;
        for (started, warned) in [(None, false), (Some(T - 500), true)] {
            let mut stats = HoldStats::default();
            if let Some(at) = started {
                stats.started(at);
            }
            let mut log = Lines::default();
            let stamps: Vec<u64> = (0..STUCK_ENDED).map(|_| stats.on_hold()).collect();
            stats.check(T, &mut log);
            stats.check(T + 2_000, &mut log);
            for since in stamps {
                stats.on_end_held(since);
            }
            stats.check(T + 3_000, &mut log);
            assert_eq!(!log.0.is_empty(), warned, "{started:?}: {:?}", log.0);
        }
    }

    /// A hold outstanding without a break for `STUCK_AFTER_MS` (a route
    /// with no timeout): named; a slow first token, or one cancelled
    /// stream and quiet after it, not (they were before, at 5 s).
    #[test]
    fn warns_on_a_hold_outstanding_long_not_on_a_slow_first_token() {
        let mut stats = HoldStats::default();
        let mut log = Lines::default();
        stats.on_hold();
        stats.check(0, &mut log);
        stats.check(STUCK_AFTER_MS - 1_000, &mut log);
        stats.on_end_held(0); // a client gave up on a slow first token
        stats.check(STUCK_AFTER_MS, &mut log);
        stats.check(10 * STUCK_AFTER_MS, &mut log);
        assert!(log.0.is_empty(), "{:?}", log.0);
        stats.on_hold();
        stats.check(11 * STUCK_AFTER_MS, &mut log);
        stats.on_hold(); // another, while the first still waits
        stats.check(12 * STUCK_AFTER_MS - 1, &mut log);
        assert!(log.0.is_empty(), "{:?}", log.0);
        stats.check(12 * STUCK_AFTER_MS, &mut log);
        assert_eq!(log.0.len(), 1);
    }

    #[test]
    fn a_release_proves_the_hold_works() {
        let mut stats = HoldStats::default();
        let mut log = Lines::default();
        stats.on_hold();
        stats.check(0, &mut log);
        stats.on_release();
        stats.on_hold(); // a slow first byte, later
        stats.check(10 * STUCK_AFTER_MS, &mut log);
        assert!(log.0.is_empty());
    }

    #[test]
    fn counters_flush_as_deltas() {
        let mut stats = HoldStats::default();
        let mut sink = Stats::default();
        stats.on_hold();
        stats.on_hold();
        stats.on_release();
        stats.on_end_held(0);
        stats.flush_metrics(&mut sink);
        stats.on_hold();
        stats.flush_metrics(&mut sink);
        let get = |name: &str| sink.get(&format!("adaptive_hedge.{name}"));
        assert_eq!(get("first_byte_holds_total"), Some(3));
        assert_eq!(get("first_byte_releases_total"), Some(1));
        assert_eq!(get("first_byte_held_ended_total"), Some(1));
    }
}
