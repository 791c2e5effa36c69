//! [`Host`] through the proxy-wasm ABI (wasm32 only).
//!
//! The SDK's own helpers `panic!` on statuses they do not expect, and a panic
//! traps the VM (every request on it then fails or skips the filter). So the
//! calls are declared here with a plain `u32` status and mapped by hand.

use std::ptr::{null, null_mut};

use super::host::{Host, HostStatus};
use crate::policy::shared_state::{SharedStore, StoreError};
use crate::telemetry::{Level, Logger, MetricKind, MetricsSink};

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const CAS_MISMATCH: u32 = 8;

const MAP_REQUEST_HEADERS: u32 = 0;
const MAP_RESPONSE_HEADERS: u32 = 2;
const MAP_HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
const BUFFER_HTTP_CALL_RESPONSE_BODY: u32 = 4;
const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
}

/// Takes ownership of a buffer the host allocated through this module's
/// `malloc` export (the SDK's allocator: a boxed byte slice of exactly `size`).
///
/// # Safety
/// `data` must be null or come from the host with `size` as its length.
unsafe fn take_host_buffer(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() {
        None
    } else {
        // SAFETY: allocated by the module allocator with capacity == size.
        Some(unsafe { Vec::from_raw_parts(data, size, size) })
    }
}

/// The proxy-wasm host. A unit: every call goes straight to the ABI.
#[derive(Clone, Copy, Debug, Default)]
pub struct Abi;

fn status(code: u32) -> Result<(), HostStatus> {
    match code {
        OK => Ok(()),
        other => Err(HostStatus(other)),
    }
}

/// A buffer the host answered with: taken over on Ok, `None` on NotFound.
///
/// # Safety
/// On Ok, `data` must be null or a host allocation of `size` bytes.
unsafe fn answer(code: u32, data: *mut u8, size: usize) -> Result<Option<Vec<u8>>, HostStatus> {
    match code {
        // SAFETY: the caller's promise.
        OK => Ok(unsafe { take_host_buffer(data, size) }),
        NOT_FOUND => Ok(None),
        other => Err(HostStatus(other)),
    }
}

fn header(map: u32, name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: pointer and length of a live &str; out-pointers to locals.
    let code =
        unsafe { proxy_get_header_map_value(map, name.as_ptr(), name.len(), &mut data, &mut size) };
    // SAFETY: the host allocated `size` bytes on Ok.
    unsafe { answer(code, data, size) }
}

/// The first `size` bytes of one of the host's buffers (`None` when empty).
fn buffer(kind: u32, size: usize) -> Result<Option<Vec<u8>>, HostStatus> {
    if size == 0 {
        return Ok(None);
    }
    let (mut data, mut len) = (null_mut(), 0usize);
    // SAFETY: out-pointers to locals.
    let code = unsafe { proxy_get_buffer_bytes(kind, 0, size, &mut data, &mut len) };
    // SAFETY: the host allocated `len` bytes on Ok.
    unsafe { answer(code, data, len) }
}

fn replace_header(map: u32, name: &str, value: &[u8]) -> Result<(), HostStatus> {
    // SAFETY: pointers and lengths of live slices.
    status(unsafe {
        proxy_replace_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    })
}

impl Host for Abi {
    fn now_ns(&self) -> Result<u64, HostStatus> {
        let mut t = 0u64;
        // SAFETY: the host writes one u64 into `t`.
        status(unsafe { proxy_get_current_time_nanoseconds(&mut t) }).map(|()| t)
    }

    fn set_tick_period_ms(&self, ms: u32) -> Result<(), HostStatus> {
        // SAFETY: plain value.
        status(unsafe { proxy_set_tick_period_milliseconds(ms) })
    }

    fn plugin_configuration(&self, size: usize) -> Result<Option<Vec<u8>>, HostStatus> {
        buffer(BUFFER_PLUGIN_CONFIGURATION, size)
    }

    fn request_header_pairs(&self) -> Result<Option<Vec<u8>>, HostStatus> {
        let (mut data, mut size) = (null_mut(), 0usize);
        // SAFETY: out-pointers to locals.
        let code = unsafe { proxy_get_header_map_pairs(MAP_REQUEST_HEADERS, &mut data, &mut size) };
        // SAFETY: the host allocated `size` bytes on Ok.
        unsafe { answer(code, data, size) }
    }

    fn response_header_pairs(&self) -> Result<Option<Vec<u8>>, HostStatus> {
        let (mut data, mut size) = (null_mut(), 0usize);
        // SAFETY: out-pointers to locals.
        let code =
            unsafe { proxy_get_header_map_pairs(MAP_RESPONSE_HEADERS, &mut data, &mut size) };
        // SAFETY: the host allocated `size` bytes on Ok.
        unsafe { answer(code, data, size) }
    }

    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
        header(MAP_REQUEST_HEADERS, name)
    }

    fn response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
        header(MAP_RESPONSE_HEADERS, name)
    }

    fn set_request_header(&self, name: &str, value: &[u8]) -> Result<(), HostStatus> {
        replace_header(MAP_REQUEST_HEADERS, name, value)
    }

    fn remove_request_header(&self, name: &str) -> Result<(), HostStatus> {
        // SAFETY: pointer and length of a live &str.
        match unsafe {
            proxy_remove_header_map_value(MAP_REQUEST_HEADERS, name.as_ptr(), name.len())
        } {
            OK | NOT_FOUND => Ok(()),
            other => Err(HostStatus(other)),
        }
    }

    fn set_response_header(&self, name: &str, value: &[u8]) -> Result<(), HostStatus> {
        replace_header(MAP_RESPONSE_HEADERS, name, value)
    }

    fn property(&self, path: &[u8]) -> Result<Option<Vec<u8>>, HostStatus> {
        let (mut data, mut size) = (null_mut(), 0usize);
        // SAFETY: pointer and length of a live slice; out-pointers to locals.
        let code = unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) };
        // SAFETY: the host allocated `size` bytes on Ok.
        unsafe { answer(code, data, size) }
    }

    fn set_filter_state(&self, name: &str, value: &[u8]) -> Result<(), HostStatus> {
        // SAFETY: pointers and lengths of live slices, read by the host only.
        status(unsafe {
            proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len())
        })
    }

    fn dispatch_get(&self, cluster: &str, path: &str, timeout_ms: u32) -> Result<u32, HostStatus> {
        // Through the SDK, not the raw call: its dispatcher must know the
        // token to hand the answer to the root context (it panics on an
        // answer with a token it does not know). Its own panic is for a
        // status other than Ok, BadArgument (an unknown cluster, a missing
        // pseudo-header) and InternalFailure, the only ones Envoy's
        // `Context::httpCall` returns.
        let headers = vec![
            (":method", "GET"),
            (":path", path),
            (":authority", "adaptive-hedge"),
        ];
        proxy_wasm::hostcalls::dispatch_http_call(
            cluster,
            headers,
            None,
            vec![],
            std::time::Duration::from_millis(u64::from(timeout_ms)),
        )
        .map_err(|status| HostStatus(status as u32))
    }

    fn http_call_response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
        header(MAP_HTTP_CALL_RESPONSE_HEADERS, name)
    }

    fn http_call_response_body(&self, size: usize) -> Result<Option<Vec<u8>>, HostStatus> {
        buffer(BUFFER_HTTP_CALL_RESPONSE_BODY, size)
    }
}

impl SharedStore for Abi {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
        let (mut data, mut size, mut cas) = (null_mut(), 0usize, 0u32);
        // SAFETY: as above.
        match unsafe {
            proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas)
        } {
            // SAFETY: host-allocated buffer of `size` bytes. An existing key
            // with an empty value comes back OK with no buffer: it is there
            // (its token must be written with), not missing; taken for
            // missing, every write would be refused as a CAS mismatch and
            // the cluster would never sync again.
            OK => Ok(Some((
                unsafe { take_host_buffer(data, size) }.unwrap_or_default(),
                cas,
            ))),
            NOT_FOUND => Ok(None),
            status => Err(StoreError::Host(status)),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let value_ptr = if value.is_empty() {
            null()
        } else {
            value.as_ptr()
        };
        // SAFETY: pointers and lengths of live slices.
        match unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value_ptr, value.len(), cas) }
        {
            OK => Ok(()),
            CAS_MISMATCH => Err(StoreError::CasMismatch),
            status => Err(StoreError::Host(status)),
        }
    }
}

impl MetricsSink for Abi {
    fn define(&mut self, name: &str, kind: MetricKind) -> Option<u32> {
        let kind = match kind {
            MetricKind::Counter => 0,
            MetricKind::Gauge => 1,
        };
        let mut id = 0u32;
        // SAFETY: as above.
        match unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) } {
            OK => Some(id),
            _ => None,
        }
    }

    fn add(&mut self, id: u32, delta: u64) {
        // SAFETY: plain values; a failure only loses this delta.
        let _ = unsafe { proxy_increment_metric(id, i64::try_from(delta).unwrap_or(i64::MAX)) };
    }

    fn set(&mut self, id: u32, value: u64) {
        // SAFETY: plain values.
        let _ = unsafe { proxy_record_metric(id, value) };
    }
}

impl Logger for Abi {
    fn log(&mut self, level: Level, message: &str) {
        let level = match level {
            Level::Info => 2,
            Level::Warn => 3,
            Level::Error => 4,
        };
        // SAFETY: pointer and length of a live &str.
        let _ = unsafe { proxy_log(level, message.as_ptr(), message.len()) };
    }
}
