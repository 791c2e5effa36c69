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
use crate::policy::config::Config;
use crate::policy::worker::{Level, Worker};

#[derive(Default)]
pub struct HedgeRoot {
    worker: Option<Rc<RefCell<Worker>>>,
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
        let tick_ms = u32::try_from(config.sync_interval.as_millis()).unwrap_or(u32::MAX);
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
        self.worker = Some(Rc::new(RefCell::new(Worker::new(config))));
        true
    }

    fn on_tick(&mut self) {
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
        Some(Box::new(HedgeHttp::new(self.worker.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
