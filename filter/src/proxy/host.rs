//! The host adapter: the proxy-wasm ABI calls this filter makes, each
//! returning a `Result` for every status the host can answer with.
//!
//! The SDK's own helpers `panic!` on statuses they do not expect, and a panic
//! traps the VM (every request on it then fails or skips the filter). So the
//! calls are declared here with a plain `u32` status and mapped by hand.

use std::ptr::{null, null_mut};

use crate::policy::shared_state::{SharedStore, StoreError};
use crate::policy::worker::{Level, Logger, MetricKind, MetricsSink};

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const CAS_MISMATCH: u32 = 8;

const MAP_REQUEST_HEADERS: u32 = 0;
const MAP_RESPONSE_HEADERS: u32 = 2;
const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;

/// A host call answered with a status other than Ok (its numeric code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostStatus(pub u32);

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

pub fn log(level: Level, message: &str) {
    let level = match level {
        Level::Info => 2,
        Level::Warn => 3,
        Level::Error => 4,
    };
    // SAFETY: pointer and length of a live &str.
    let _ = unsafe { proxy_log(level, message.as_ptr(), message.len()) };
}

/// Wall-clock time in nanoseconds (the same clock on every worker).
pub fn now_ns() -> Result<u64, HostStatus> {
    let mut t = 0u64;
    // SAFETY: the host writes one u64 into `t`.
    match unsafe { proxy_get_current_time_nanoseconds(&mut t) } {
        OK => Ok(t),
        status => Err(HostStatus(status)),
    }
}

pub fn set_tick_period_ms(ms: u32) -> Result<(), HostStatus> {
    // SAFETY: plain value.
    match unsafe { proxy_set_tick_period_milliseconds(ms) } {
        OK => Ok(()),
        status => Err(HostStatus(status)),
    }
}

/// The plugin configuration (`size` as given to `on_configure`).
pub fn plugin_configuration(size: usize) -> Result<Option<Vec<u8>>, HostStatus> {
    if size == 0 {
        return Ok(None);
    }
    let (mut data, mut len) = (null_mut(), 0usize);
    // SAFETY: out-pointers to locals; the buffer is taken over below.
    match unsafe {
        proxy_get_buffer_bytes(BUFFER_PLUGIN_CONFIGURATION, 0, size, &mut data, &mut len)
    } {
        // SAFETY: host-allocated buffer of `len` bytes.
        OK => Ok(unsafe { take_host_buffer(data, len) }),
        NOT_FOUND => Ok(None),
        status => Err(HostStatus(status)),
    }
}

/// One request header (the upstream role's marker; the test-only fault injection).
pub fn request_header(name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
    header(MAP_REQUEST_HEADERS, name)
}

/// One response header (the upstream role reads `:status`).
pub fn response_header(name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
    header(MAP_RESPONSE_HEADERS, name)
}

fn header(map: u32, name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: pointer and length of a live &str; out-pointers to locals.
    match unsafe {
        proxy_get_header_map_value(map, name.as_ptr(), name.len(), &mut data, &mut size)
    } {
        // SAFETY: host-allocated buffer of `size` bytes.
        OK => Ok(unsafe { take_host_buffer(data, size) }),
        NOT_FOUND => Ok(None),
        status => Err(HostStatus(status)),
    }
}

/// Every request header in one buffer (the ABI's pairs serialisation, read
/// by `header_pairs::scan`): one host call instead of one per name.
pub fn request_header_pairs() -> Result<Option<Vec<u8>>, HostStatus> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: as above.
    match unsafe { proxy_get_header_map_pairs(MAP_REQUEST_HEADERS, &mut data, &mut size) } {
        // SAFETY: host-allocated buffer of `size` bytes.
        OK => Ok(unsafe { take_host_buffer(data, size) }),
        NOT_FOUND => Ok(None),
        status => Err(HostStatus(status)),
    }
}

/// Sets (replacing every existing value) a request header.
pub fn set_request_header(name: &str, value: &[u8]) -> Result<(), HostStatus> {
    replace_header(MAP_REQUEST_HEADERS, name, value)
}

/// Sets (replacing every existing value) a response header.
pub fn set_response_header(name: &str, value: &[u8]) -> Result<(), HostStatus> {
    replace_header(MAP_RESPONSE_HEADERS, name, value)
}

fn replace_header(map: u32, name: &str, value: &[u8]) -> Result<(), HostStatus> {
    // SAFETY: pointers and lengths of live slices.
    match unsafe {
        proxy_replace_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    } {
        OK => Ok(()),
        status => Err(HostStatus(status)),
    }
}

/// Removes every value of a request header.
pub fn remove_request_header(name: &str) -> Result<(), HostStatus> {
    // SAFETY: pointer and length of a live &str.
    match unsafe { proxy_remove_header_map_value(MAP_REQUEST_HEADERS, name.as_ptr(), name.len()) } {
        OK | NOT_FOUND => Ok(()),
        status => Err(HostStatus(status)),
    }
}

/// A property by its path, segments separated by NUL (`b"xds\0cluster_name"`).
pub fn property(path: &[u8]) -> Result<Option<Vec<u8>>, HostStatus> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: as above.
    match unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) } {
        // SAFETY: host-allocated buffer of `size` bytes.
        OK => Ok(unsafe { take_host_buffer(data, size) }),
        NOT_FOUND => Ok(None),
        status => Err(HostStatus(status)),
    }
}

/// An integer property (8 bytes, little-endian).
pub fn int_property(path: &[u8]) -> Option<i64> {
    let bytes = property(path).ok()??;
    let array: [u8; 8] = bytes.as_slice().try_into().ok()?;
    Some(i64::from_le_bytes(array))
}

/// Shared data through the host.
pub struct HostStore;

impl SharedStore for HostStore {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
        let (mut data, mut size, mut cas) = (null_mut(), 0usize, 0u32);
        // SAFETY: as above.
        match unsafe {
            proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas)
        } {
            // SAFETY: host-allocated buffer of `size` bytes.
            OK => Ok(unsafe { take_host_buffer(data, size) }.map(|v| (v, cas))),
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

/// Envoy stats through the host.
pub struct HostMetrics;

impl MetricsSink for HostMetrics {
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

/// Envoy's log through the host.
pub struct HostLog;

impl Logger for HostLog {
    fn log(&mut self, level: Level, message: &str) {
        log(level, message);
    }
}
