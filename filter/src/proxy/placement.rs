//! Is the module running in the chain its `role` says? Checked once per VM,
//! on its first request: a copy of the downstream config pasted into a
//! cluster's `http_filters` (or the reverse) starts without error but would
//! do nothing useful, so it says so in Envoy's log and passes requests
//! through.

use std::cell::Cell;

use super::host::Host;
use crate::policy::config::Role;
use crate::telemetry::Level;

/// Only an upstream filter knows its attempt's host while the request
/// headers pass; before the router nothing has been picked yet.
const UPSTREAM_ADDRESS: &[u8] = b"upstream\0address";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Unchecked,
    Right,
    Wrong,
}

#[derive(Debug)]
pub struct Placement {
    role: Role,
    state: Cell<State>,
}

impl Placement {
    pub fn new(role: Role) -> Self {
        Placement {
            role,
            state: Cell::new(State::Unchecked),
        }
    }

    /// Whether this VM's role runs in its own chain (one host call, on the
    /// first request only).
    pub fn in_place(&self, host: &mut impl Host) -> bool {
        match self.state.get() {
            State::Right => true,
            State::Wrong => false,
            State::Unchecked => {
                let in_upstream_chain = match host.property(UPSTREAM_ADDRESS) {
                    Ok(Some(address)) => !address.is_empty(),
                    Ok(None) => false,
                    // Cannot tell: trust the config rather than break it.
                    Err(_) => self.role == Role::Upstream,
                };
                let right = in_upstream_chain == (self.role == Role::Upstream);
                self.state
                    .set(if right { State::Right } else { State::Wrong });
                if !right {
                    host.log(Level::Error, self.complaint());
                }
                right
            }
        }
    }

    fn complaint(&self) -> &'static str {
        match self.role {
            Role::Upstream => {
                "adaptive-hedge: configured with \"role\": \"upstream\" but running in the HTTP connection manager's \
                 filter chain; this role belongs in the cluster's HttpProtocolOptions.http_filters (before \
                 envoy.filters.http.upstream_codec). Requests pass through untouched."
            }
            Role::Downstream => {
                "adaptive-hedge: running as an upstream filter (a cluster's http_filters) with the downstream role; \
                 there it can neither arm hedging nor hold headers. Use {\"role\": \"upstream\"} for that copy and \
                 put the hedging config on the HTTP connection manager's filter. Requests pass through untouched."
            }
        }
    }
}
