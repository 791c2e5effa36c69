//! The host calls the proxy glue makes, behind one small trait: in the
//! `.wasm`, `abi::Abi` makes them through the proxy-wasm ABI; in native tests,
//! `fake::FakeHost` answers from memory. Every call returns a value for every
//! status the host can answer with: nothing here can panic.

use crate::policy::shared_state::SharedStore;
use crate::telemetry::{Logger, MetricsSink};

/// A host call answered with a status other than Ok (its numeric code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostStatus(pub u32);

/// What a callback tells Envoy: go on, or hold the stream here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Continue,
    Pause,
}

/// The callbacks of one HTTP stream's context (a request downstream, an
/// attempt upstream); each answers as Envoy's would, by default `Continue`.
pub trait StreamCallbacks {
    /// `end_of_stream`: the request has no body (or it came whole).
    fn on_request_headers(&mut self, end_of_stream: bool) -> Action;
    fn on_response_headers(&mut self, end_of_stream: bool) -> Action;
    fn on_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action;
    fn on_response_trailers(&mut self) -> Action {
        Action::Continue
    }
    /// The request's body (or trailers) ended: the request is complete, and
    /// Envoy's per-try timer starts (for a request with a body).
    fn on_request_end(&mut self) {}
    /// The stream is done and logged (downstream contexts).
    fn on_log(&mut self) {}
    /// The context is done (every context, cancelled attempts included).
    fn on_done(&mut self) {}
}

/// Envoy as the glue sees it. Shared data, stats and the log come through
/// the logic's own traits.
pub trait Host: Clone + SharedStore + MetricsSink + Logger {
    /// Wall-clock time in nanoseconds (the same clock on every worker).
    fn now_ns(&self) -> Result<u64, HostStatus>;
    fn set_tick_period_ms(&self, ms: u32) -> Result<(), HostStatus>;
    /// The plugin configuration (`size` as given to `on_configure`).
    fn plugin_configuration(&self, size: usize) -> Result<Option<Vec<u8>>, HostStatus>;
    /// Every request header in one buffer (the ABI's pairs serialisation,
    /// read by `header_pairs::scan`): one call instead of one per name.
    fn request_header_pairs(&self) -> Result<Option<Vec<u8>>, HostStatus>;
    /// Every response header in one buffer (`header_pairs::scan_response`).
    fn response_header_pairs(&self) -> Result<Option<Vec<u8>>, HostStatus>;
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostStatus>;
    fn response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostStatus>;
    /// Sets a request header, replacing every existing value.
    fn set_request_header(&self, name: &str, value: &[u8]) -> Result<(), HostStatus>;
    /// Removes every value of a request header (a missing one is not an error).
    fn remove_request_header(&self, name: &str) -> Result<(), HostStatus>;
    fn set_response_header(&self, name: &str, value: &[u8]) -> Result<(), HostStatus>;
    /// A property by its path, segments separated by NUL (`b"xds\0cluster_name"`).
    fn property(&self, path: &[u8]) -> Result<Option<Vec<u8>>, HostStatus>;
    /// Sets the stream's filter state `name` (Envoy keeps it as
    /// `wasm.<name>`, readable by access logs).
    fn set_filter_state(&self, name: &str, value: &[u8]) -> Result<(), HostStatus>;
    /// Sends `GET path` to `cluster` (from the root context); the answer
    /// comes to `Plugin::on_http_call_response` with the returned token.
    fn dispatch_get(&self, cluster: &str, path: &str, timeout_ms: u32) -> Result<u32, HostStatus>;
    /// A header of the answer being delivered (`None`: absent, as on a
    /// timeout or a reset).
    fn http_call_response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostStatus>;
    /// The body of the answer being delivered (`size` as given).
    fn http_call_response_body(&self, size: usize) -> Result<Option<Vec<u8>>, HostStatus>;
}

/// An integer property (8 bytes, little-endian); `None` if absent or not one.
pub fn int_property(host: &impl Host, path: &[u8]) -> Option<i64> {
    let bytes = host.property(path).ok()??;
    let array: [u8; 8] = bytes.as_slice().try_into().ok()?;
    Some(i64::from_le_bytes(array))
}
