//! The root context: validates the plugin configuration once (refusing a bad
//! one, so Envoy rejects it), then on every tick merges this worker's samples
//! and budget into shared memory and refreshes the cached delays.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

use super::host::{self, HostLog, HostMetrics, HostStore};
use super::http::HedgeHttp;
use super::placement::Placement;
use super::upstream::HoldHttp;
use crate::policy::config::{Config, Role};
use crate::policy::hold::HoldStats;
use crate::policy::worker::{Level, Worker};

/// The upstream role's tick: its misconfiguration check and counters need
/// no more than this.
const UPSTREAM_TICK_MS: u32 = 1000;

pub struct HedgeRoot {
    role: Role,
    /// Downstream role: the learning, budget and decisions of this VM.
    worker: Option<Rc<RefCell<Worker>>>,
    /// Upstream role: what its attempts held and released.
    holds: Rc<RefCell<HoldStats>>,
    placement: Rc<Placement>,
}

impl Default for HedgeRoot {
    fn default() -> Self {
        HedgeRoot {
            role: Role::Downstream,
            worker: None,
            holds: Rc::default(),
            placement: Rc::new(Placement::new(Role::Downstream)),
        }
    }
}

impl Context for HedgeRoot {}

impl RootContext for HedgeRoot {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        let bytes = match host::plugin_configuration(plugin_configuration_size) {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(status) => {
                host::log(
                    Level::Error,
                    &format!(
                        "adaptive-hedge: cannot read the plugin configuration (status {})",
                        status.0
                    ),
                );
                return false;
            }
        };
        let config = match Config::parse(&bytes) {
            Ok(config) => Arc::new(config),
            Err(e) => {
                // Envoy logs a generic "Unable to create Wasm HTTP filter" next to this line.
                host::log(Level::Error, &format!("adaptive-hedge: {e}"));
                return false;
            }
        };
        for warning in &config.warnings {
            host::log(Level::Warn, &format!("adaptive-hedge: {warning}"));
        }
        self.role = config.role;
        self.placement = Rc::new(Placement::new(config.role));
        let tick_ms = match config.role {
            Role::Downstream => u32::try_from(config.sync_interval.as_millis()).unwrap_or(u32::MAX),
            Role::Upstream => UPSTREAM_TICK_MS,
        };
        if let Err(status) = host::set_tick_period_ms(tick_ms) {
            host::log(
                Level::Error,
                &format!(
                    "adaptive-hedge: cannot set the tick period (status {})",
                    status.0
                ),
            );
            return false;
        }
        host::log(
            Level::Info,
            &format!(
                "adaptive-hedge {} configured: {}",
                crate::VERSION,
                config.effective_json()
            ),
        );
        if config.role == Role::Downstream {
            self.worker = Some(Rc::new(RefCell::new(Worker::new(config))));
        }
        true
    }

    fn on_tick(&mut self) {
        if self.role == Role::Upstream {
            let (Ok(mut holds), Ok(now_ns)) = (self.holds.try_borrow_mut(), host::now_ns()) else {
                return;
            };
            holds.check(now_ns / 1_000_000, &mut HostLog);
            holds.flush_metrics(&mut HostMetrics);
            return;
        }
        let Some(worker) = &self.worker else { return };
        let Ok(mut worker) = worker.try_borrow_mut() else {
            return;
        };
        let Ok(now_ns) = host::now_ns() else { return };
        worker.sync(now_ns / 1_000_000, &HostStore, &mut HostLog);
        worker.flush_metrics(&mut HostMetrics);
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Never None: the SDK panics on None. Without a worker the context passes through.
        let placement = Rc::clone(&self.placement);
        Some(match self.role {
            Role::Downstream => Box::new(HedgeHttp::new(self.worker.clone(), placement)),
            Role::Upstream => Box::new(HoldHttp::new(Rc::clone(&self.holds), placement)),
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
