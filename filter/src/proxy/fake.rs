//! A host in memory for native tests of the glue: request and response
//! headers, properties, a clock, shared data, stats and the log, and any
//! call made to fail with a host status.

use std::cell::{Ref, RefCell, RefMut};
use std::collections::HashMap;
use std::rc::Rc;

use super::host::{Host, HostStatus};
use crate::pairs::serialise;
use crate::policy::shared_state::memory::MemoryStore;
use crate::policy::shared_state::{SharedStore, StoreError};
use crate::telemetry::memory::Stats;
use crate::telemetry::{Level, Logger, MetricKind, MetricsSink};

/// Envoy's answer to a call it cannot serve here (e.g. request headers on
/// the response path).
pub const BAD_ARGUMENT: HostStatus = HostStatus(2);

#[derive(Default)]
pub struct State {
    pub request_headers: Vec<(String, Vec<u8>)>,
    pub response_headers: Vec<(String, Vec<u8>)>,
    /// By path, segments separated by NUL.
    pub properties: HashMap<Vec<u8>, Vec<u8>>,
    /// What the filter wrote with `set_filter_state`.
    pub filter_state: HashMap<String, Vec<u8>>,
    pub now_ns: u64,
    pub configuration: Option<Vec<u8>>,
    pub tick_ms: Option<u32>,
    pub log: Vec<(Level, String)>,
    /// Calls that fail: `"method"` or `"method argument"`
    /// (`"set_request_header x-envoy-max-retries"`).
    pub failing: Vec<String>,
    /// Host calls made, in order (`"method argument"`).
    pub calls: Vec<String>,
    pub store: MemoryStore,
    pub stats: Stats,
    /// `dispatch_get` calls made: (cluster, path, timeout in ms).
    pub dispatched: Vec<(String, String, u32)>,
    /// The answer being delivered: its headers and body.
    pub call_response_headers: Vec<(String, Vec<u8>)>,
    pub call_response_body: Vec<u8>,
}

#[derive(Clone, Default)]
pub struct FakeHost(Rc<RefCell<State>>);

impl FakeHost {
    pub fn state(&self) -> Ref<'_, State> {
        self.0.borrow()
    }

    pub fn state_mut(&self) -> RefMut<'_, State> {
        self.0.borrow_mut()
    }

    /// A fresh request: these headers, routed to `cluster`, and no calls yet.
    pub fn request(&self, cluster: Option<&str>, headers: &[(&str, &str)]) {
        let mut s = self.state_mut();
        s.request_headers = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        s.response_headers.clear();
        s.properties.clear();
        if let Some(cluster) = cluster {
            s.properties
                .insert(b"xds\0cluster_name".to_vec(), cluster.as_bytes().to_vec());
        }
        s.calls.clear();
    }

    /// The response's headers, as the upstream (or Envoy) sent them.
    pub fn respond(&self, headers: &[(&str, &str)]) {
        self.state_mut().response_headers = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
    }

    pub fn set_property(&self, path: &[u8], value: &[u8]) {
        self.state_mut()
            .properties
            .insert(path.to_vec(), value.to_vec());
    }

    pub fn fail(&self, call: &str) {
        self.state_mut().failing.push(call.to_string());
    }

    pub fn advance_ms(&self, ms: u64) {
        self.state_mut().now_ns += ms * 1_000_000;
    }

    /// A request header's value as text, if set.
    pub fn request_header_text(&self, name: &str) -> Option<String> {
        let s = self.state();
        let (_, v) = s.request_headers.iter().find(|(n, _)| n == name)?;
        Some(String::from_utf8_lossy(v).into_owned())
    }

    pub fn response_header_text(&self, name: &str) -> Option<String> {
        let s = self.state();
        let (_, v) = s.response_headers.iter().find(|(n, _)| n == name)?;
        Some(String::from_utf8_lossy(v).into_owned())
    }

    /// Host calls made since the last `request`, by method.
    pub fn calls_to(&self, method: &str) -> usize {
        self.state()
            .calls
            .iter()
            .filter(|c| c.split(' ').next() == Some(method))
            .count()
    }

    /// A stat's value (`adaptive_hedge.<metric>[.<cluster>]`); `None` if it
    /// was never defined.
    pub fn stat(&self, name: &str) -> Option<u64> {
        self.state().stats.get(name)
    }

    pub fn logged(&self, needle: &str) -> bool {
        self.state().log.iter().any(|(_, l)| l.contains(needle))
    }

    /// Records the call; its error if it was made to fail.
    fn call(&self, method: &str, argument: &str) -> Result<(), HostStatus> {
        let mut s = self.state_mut();
        let call = if argument.is_empty() {
            method.to_string()
        } else {
            format!("{method} {argument}")
        };
        let fails = s.failing.iter().any(|f| *f == call || f == method);
        s.calls.push(call);
        if fails {
            Err(BAD_ARGUMENT)
        } else {
            Ok(())
        }
    }
}

/// A header map in the host's pairs serialisation.
fn pairs_of(map: &[(String, Vec<u8>)]) -> Vec<u8> {
    let pairs: Vec<(&str, &str)> = map
        .iter()
        .map(|(n, v)| (n.as_str(), std::str::from_utf8(v).unwrap_or("")))
        .collect();
    serialise(&pairs)
}

fn find(map: &[(String, Vec<u8>)], name: &str) -> Option<Vec<u8>> {
    map.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
}

fn replace(map: &mut Vec<(String, Vec<u8>)>, name: &str, value: &[u8]) {
    map.retain(|(n, _)| n != name);
    map.push((name.to_string(), value.to_vec()));
}

impl Host for FakeHost {
    fn now_ns(&self) -> Result<u64, HostStatus> {
        self.call("now_ns", "")?;
        Ok(self.state().now_ns)
    }

    fn set_tick_period_ms(&self, ms: u32) -> Result<(), HostStatus> {
        self.call("set_tick_period_ms", "")?;
        self.state_mut().tick_ms = Some(ms);
        Ok(())
    }

    fn plugin_configuration(&self, _size: usize) -> Result<Option<Vec<u8>>, HostStatus> {
        self.call("plugin_configuration", "")?;
        Ok(self.state().configuration.clone())
    }

    fn request_header_pairs(&self) -> Result<Option<Vec<u8>>, HostStatus> {
        self.call("request_header_pairs", "")?;
        Ok(Some(pairs_of(&self.state().request_headers)))
    }

    fn response_header_pairs(&self) -> Result<Option<Vec<u8>>, HostStatus> {
        self.call("response_header_pairs", "")?;
        Ok(Some(pairs_of(&self.state().response_headers)))
    }

    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
        self.call("request_header", name)?;
        Ok(find(&self.state().request_headers, name))
    }

    fn response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
        self.call("response_header", name)?;
        Ok(find(&self.state().response_headers, name))
    }

    fn set_request_header(&self, name: &str, value: &[u8]) -> Result<(), HostStatus> {
        self.call("set_request_header", name)?;
        replace(&mut self.state_mut().request_headers, name, value);
        Ok(())
    }

    fn remove_request_header(&self, name: &str) -> Result<(), HostStatus> {
        self.call("remove_request_header", name)?;
        self.state_mut().request_headers.retain(|(n, _)| n != name);
        Ok(())
    }

    fn set_response_header(&self, name: &str, value: &[u8]) -> Result<(), HostStatus> {
        self.call("set_response_header", name)?;
        replace(&mut self.state_mut().response_headers, name, value);
        Ok(())
    }

    fn set_filter_state(&self, name: &str, value: &[u8]) -> Result<(), HostStatus> {
        self.call("set_filter_state", name)?;
        self.state_mut()
            .filter_state
            .insert(name.to_string(), value.to_vec());
        Ok(())
    }

    fn dispatch_get(&self, cluster: &str, path: &str, timeout_ms: u32) -> Result<u32, HostStatus> {
        self.call("dispatch_get", cluster)?;
        let mut s = self.state_mut();
        s.dispatched
            .push((cluster.to_string(), path.to_string(), timeout_ms));
        Ok(s.dispatched.len() as u32)
    }

    fn http_call_response_header(&self, name: &str) -> Result<Option<Vec<u8>>, HostStatus> {
        self.call("http_call_response_header", name)?;
        let s = self.state();
        Ok(s.call_response_headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone()))
    }

    fn http_call_response_body(&self, size: usize) -> Result<Option<Vec<u8>>, HostStatus> {
        self.call("http_call_response_body", "")?;
        let s = self.state();
        let body = s
            .call_response_body
            .get(..size)
            .unwrap_or(&s.call_response_body);
        Ok((!body.is_empty()).then(|| body.to_vec()))
    }

    fn property(&self, path: &[u8]) -> Result<Option<Vec<u8>>, HostStatus> {
        let shown = String::from_utf8_lossy(path).replace('\0', ".");
        self.call("property", &shown)?;
        Ok(self.state().properties.get(path).cloned())
    }
}

impl SharedStore for FakeHost {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
        self.call("get_shared_data", key)
            .map_err(|s| StoreError::Host(s.0))?;
        self.state().store.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        self.call("set_shared_data", key)
            .map_err(|s| StoreError::Host(s.0))?;
        self.state().store.set(key, value, cas)
    }
}

impl MetricsSink for FakeHost {
    fn define(&mut self, name: &str, kind: MetricKind) -> Option<u32> {
        self.call("define_metric", name).ok()?;
        self.state_mut().stats.define(name, kind)
    }

    fn add(&mut self, id: u32, delta: u64) {
        self.state_mut().stats.add(id, delta);
    }

    fn set(&mut self, id: u32, value: u64) {
        self.state_mut().stats.set(id, value);
    }
}

impl Logger for FakeHost {
    fn log(&mut self, level: Level, message: &str) {
        self.state_mut().log.push((level, message.to_string()));
    }
}

/// The plugin configured with `json` on a fake host, or the refusal.
pub fn plugin(json: &str) -> (FakeHost, super::root::Plugin<FakeHost>) {
    let host = FakeHost::default();
    host.state_mut().configuration = Some(json.as_bytes().to_vec());
    host.state_mut().now_ns = 1_700_000_000_000_000_000;
    let mut plugin = super::root::Plugin::new(host.clone());
    assert!(plugin.on_configure(json.len()), "{:?}", host.state().log);
    (host, plugin)
}
