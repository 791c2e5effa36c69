//! The upstream role's HTTP context: one per attempt (hedges included).
//! Holds a marked attempt's 2xx response headers until its first body byte;
//! the rule is `policy::hold::should_hold`.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host;
use super::placement::Placement;
use crate::policy::hold::{should_hold, HoldStats, FIRST_BYTE_MARKER};

pub struct HoldHttp {
    stats: Rc<RefCell<HoldStats>>,
    placement: Rc<Placement>,
    /// The downstream role armed this request and asked for a first-byte race.
    marked: bool,
    held: bool,
}

impl HoldHttp {
    pub fn new(stats: Rc<RefCell<HoldStats>>, placement: Rc<Placement>) -> Self {
        HoldHttp {
            stats,
            placement,
            marked: false,
            held: false,
        }
    }

    fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            if let Ok(mut stats) = self.stats.try_borrow_mut() {
                stats.on_release();
            }
        }
    }
}

impl Context for HoldHttp {
    fn on_done(&mut self) -> bool {
        // Called for every attempt, the router's cancelled losers included.
        if std::mem::take(&mut self.held) {
            if let Ok(mut stats) = self.stats.try_borrow_mut() {
                stats.on_end_held();
            }
        }
        true
    }
}

impl HttpContext for HoldHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if !self.placement.in_place() {
            return Action::Continue;
        }
        // Left on the request: the header map is shared by every attempt,
        // so removing it here would hide it from the hedge. An unreadable
        // map means "not marked": the attempt simply streams as usual.
        self.marked = matches!(host::request_header(FIRST_BYTE_MARKER), Ok(Some(_)));
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if !self.marked || end_of_stream {
            return Action::Continue;
        }
        let status = host::response_header(":status").ok().flatten();
        if !should_hold(self.marked, status.as_deref(), end_of_stream) {
            return Action::Continue;
        }
        self.held = true;
        if let Ok(mut stats) = self.stats.try_borrow_mut() {
            stats.on_hold();
        }
        // The router sees this attempt's headers only with its first byte.
        Action::Pause
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.held && body_size == 0 && !end_of_stream {
            return Action::Pause; // an empty chunk is not a first byte
        }
        // Continue after a paused headers callback passes the headers on,
        // then this data.
        self.release();
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.release();
        Action::Continue
    }
}
