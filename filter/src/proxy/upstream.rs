//! The upstream role's attempt: one per attempt (hedges included). Holds a
//! marked attempt's 2xx response headers until its first body byte; the
//! rule is `policy::hold::should_hold`.

use std::cell::RefCell;
use std::rc::Rc;

use super::host::{Action, Host, StreamCallbacks};
use super::placement::Placement;
use crate::headers::FIRST_BYTE_MARKER;
use crate::policy::hold::{should_hold, HoldStats};

pub struct UpstreamAttempt<H: Host> {
    host: H,
    stats: Rc<RefCell<HoldStats>>,
    placement: Rc<Placement>,
    /// The downstream role armed this request and asked for a first-byte race.
    marked: bool,
    /// Its headers are held, since this stamp (`HoldStats::on_hold`).
    held: Option<u64>,
}

impl<H: Host> UpstreamAttempt<H> {
    pub fn new(host: H, stats: Rc<RefCell<HoldStats>>, placement: Rc<Placement>) -> Self {
        UpstreamAttempt {
            host,
            stats,
            placement,
            marked: false,
            held: None,
        }
    }

    fn count<R>(&self, event: impl FnOnce(&mut HoldStats) -> R) -> Option<R> {
        let mut stats = self.stats.try_borrow_mut().ok()?;
        Some(event(&mut stats))
    }

    fn release(&mut self) {
        if self.held.take().is_some() {
            self.count(HoldStats::on_release);
        }
    }
}

impl<H: Host> StreamCallbacks for UpstreamAttempt<H> {
    fn on_request_headers(&mut self, _end_of_stream: bool) -> Action {
        if !self.placement.in_place(&mut self.host) {
            return Action::Continue;
        }
        // Left on the request: the header map is shared by every attempt,
        // so removing it here would hide it from the hedge. An unreadable
        // map means "not marked": the attempt simply streams as usual.
        self.marked = matches!(self.host.request_header(FIRST_BYTE_MARKER), Ok(Some(_)));
        Action::Continue
    }

    fn on_response_headers(&mut self, end_of_stream: bool) -> Action {
        if !self.marked || end_of_stream {
            return Action::Continue;
        }
        let status = self.host.response_header(":status").ok().flatten();
        if !should_hold(self.marked, status.as_deref(), end_of_stream) {
            return Action::Continue;
        }
        self.held = Some(self.count(HoldStats::on_hold).unwrap_or(0));
        // The router sees this attempt's headers only with its first byte.
        Action::Pause
    }

    fn on_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.held.is_some() && body_size == 0 && !end_of_stream {
            return Action::Pause; // an empty chunk is not a first byte
        }
        // Continue after a paused headers callback passes the headers on,
        // then this data.
        self.release();
        Action::Continue
    }

    fn on_response_trailers(&mut self) -> Action {
        self.release();
        Action::Continue
    }

    /// Called for every attempt, the router's cancelled losers included.
    fn on_done(&mut self) {
        if let Some(since) = self.held.take() {
            self.count(|stats| stats.on_end_held(since));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::fake::{plugin, FakeHost};
    use crate::proxy::root::{Plugin, Stream};

    const UPSTREAM: &str = r#"{"role": "upstream"}"#;

    /// A new attempt in a cluster's chain (its host known), `marked` or not,
    /// through its request headers.
    fn attempt(
        host: &FakeHost,
        plugin: &Plugin<FakeHost>,
        marked: bool,
    ) -> UpstreamAttempt<FakeHost> {
        let headers: &[(&str, &str)] = if marked {
            &[(":method", "GET"), (FIRST_BYTE_MARKER, "1")]
        } else {
            &[(":method", "GET")]
        };
        host.request(None, headers);
        host.set_property(b"upstream\0address", b"10.0.0.1:80");
        let Stream::Upstream(mut a) = plugin.stream() else {
            panic!("an upstream plugin made a downstream context");
        };
        assert_eq!(a.on_request_headers(true), Action::Continue);
        a
    }

    fn respond(host: &FakeHost, status: &str) {
        host.state_mut().response_headers = vec![(":status".into(), status.as_bytes().to_vec())];
    }

    fn flushed(host: &FakeHost, plugin: &mut Plugin<FakeHost>, name: &str) -> u64 {
        plugin.on_tick();
        host.stat(&format!("adaptive_hedge.{name}")).unwrap_or(0)
    }

    #[test]
    fn a_marked_2xx_waits_for_its_first_body_byte() {
        let (host, mut plugin) = plugin(UPSTREAM);
        let mut a = attempt(&host, &plugin, true);
        respond(&host, "200");
        assert_eq!(a.on_response_headers(false), Action::Pause);
        assert_eq!(a.on_response_body(0, false), Action::Pause, "empty chunk");
        assert_eq!(a.on_response_body(12, false), Action::Continue);
        assert_eq!(
            a.on_response_body(12, false),
            Action::Continue,
            "later chunks stream"
        );
        a.on_done();
        assert_eq!(flushed(&host, &mut plugin, "first_byte_holds_total"), 1);
        assert_eq!(flushed(&host, &mut plugin, "first_byte_releases_total"), 1);
        assert_eq!(
            flushed(&host, &mut plugin, "first_byte_held_ended_total"),
            0
        );
    }

    /// A plugin replaced (a configuration pushed) flushes what it counted
    /// since its last tick: before, the upstream role's last second was
    /// lost (found by a review).
    #[test]
    fn a_retiring_upstream_plugin_flushes_its_counts() {
        let (host, mut plugin) = plugin(UPSTREAM);
        let mut a = attempt(&host, &plugin, true);
        respond(&host, "200");
        assert_eq!(a.on_response_headers(false), Action::Pause);
        a.on_done();
        plugin.on_done();
        assert_eq!(host.stat("adaptive_hedge.first_byte_holds_total"), Some(1));
        assert_eq!(
            host.stat("adaptive_hedge.first_byte_held_ended_total"),
            Some(1)
        );
    }

    #[test]
    fn trailers_or_the_end_release_a_hold_and_a_cancelled_loser_is_counted() {
        let (host, mut plugin) = plugin(UPSTREAM);
        let mut a = attempt(&host, &plugin, true);
        respond(&host, "200");
        assert_eq!(a.on_response_headers(false), Action::Pause);
        assert_eq!(a.on_response_trailers(), Action::Continue);
        let mut b = attempt(&host, &plugin, true);
        respond(&host, "200");
        assert_eq!(b.on_response_headers(false), Action::Pause);
        assert_eq!(
            b.on_response_body(0, true),
            Action::Continue,
            "end of stream"
        );
        let mut loser = attempt(&host, &plugin, true);
        respond(&host, "200");
        assert_eq!(loser.on_response_headers(false), Action::Pause);
        loser.on_done(); // the router cancelled it
        assert_eq!(flushed(&host, &mut plugin, "first_byte_releases_total"), 2);
        assert_eq!(
            flushed(&host, &mut plugin, "first_byte_held_ended_total"),
            1
        );
    }

    #[test]
    fn nothing_else_is_held() {
        let (host, plugin) = plugin(UPSTREAM);
        for (marked, status, end) in [
            (false, "200", false),
            (true, "200", true),
            (true, "204", true),
            (true, "503", false),
            (true, "101", false),
            (true, "304", false),
        ] {
            let mut a = attempt(&host, &plugin, marked);
            respond(&host, status);
            assert_eq!(
                a.on_response_headers(end),
                Action::Continue,
                "{marked} {status}"
            );
        }
        // host calls that fail: not marked, not held
        host.fail("request_header");
        let mut a = attempt(&host, &plugin, true);
        respond(&host, "200");
        assert_eq!(a.on_response_headers(false), Action::Continue);
        host.state_mut().failing = vec!["response_header".into()];
        let mut a = attempt(&host, &plugin, true);
        assert_eq!(a.on_response_headers(false), Action::Continue);
    }

    #[test]
    fn holds_never_released_are_reported_once() {
        let (host, mut plugin) = plugin(UPSTREAM);
        let mut a = attempt(&host, &plugin, true);
        respond(&host, "200");
        a.on_response_headers(false);
        plugin.on_tick();
        host.advance_ms(crate::policy::hold::STUCK_AFTER_MS);
        plugin.on_tick();
        plugin.on_tick();
        let reports = host
            .state()
            .log
            .iter()
            .filter(|(_, l)| l.contains("allow_on_headers_stop_iteration"))
            .count();
        assert_eq!(reports, 1);
    }

    #[test]
    fn in_the_downstream_chain_it_says_so_and_passes_through() {
        let (host, plugin) = plugin(UPSTREAM);
        host.request(None, &[(":method", "GET"), (FIRST_BYTE_MARKER, "1")]);
        let Stream::Upstream(mut a) = plugin.stream() else {
            panic!("wrong role");
        };
        a.on_request_headers(true);
        respond(&host, "200");
        assert_eq!(a.on_response_headers(false), Action::Continue);
        assert!(host.logged("running in the HTTP connection manager's filter chain"));
    }
}
