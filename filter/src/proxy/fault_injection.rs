//! Test-only faults, compiled in only with the `fault-injection` feature
//! (`build/adaptive_hedge_fault_injection.wasm`; the shipped module has none).
//! A request header `x-adaptive-hedge-fault` makes the filter:
//! - `trap`: trap its VM, as a bug would (the failure policy then decides
//!   what happens to requests);
//! - `corrupt-shared-data`: write garbage under its shared-data keys;
//! - `foreign-version`: write a value of an unknown encoding version there.

use super::host::Host;
use crate::policy::shared_state::{cluster_key, registry_key};
use crate::policy::window::WindowGeometry;

const FAULT_HEADER: &str = "x-adaptive-hedge-fault";

/// Applies the fault the request asks for, if any.
pub fn inject(host: &impl Host, cluster: Option<&[u8]>, geometry: Option<WindowGeometry>) {
    let Ok(Some(fault)) = host.request_header(FAULT_HEADER) else {
        return;
    };
    let Some(geometry) = geometry else {
        return;
    };
    let key = cluster_key(
        geometry,
        &String::from_utf8_lossy(cluster.unwrap_or_default()),
    );
    match fault.as_slice() {
        #[cfg(target_arch = "wasm32")]
        b"trap" => core::arch::wasm32::unreachable(),
        b"corrupt-shared-data" => {
            let _ = host.set(&key, b"\xde\xad garbage \xbe\xef", 0);
            let _ = host.set(&registry_key(geometry), b"not a registry", 0);
        }
        b"foreign-version" => {
            let _ = host.set(&key, b"AHC\x09from a newer filter", 0);
        }
        _ => {}
    }
}
