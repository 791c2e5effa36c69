//! What the workers keep in proxy-wasm shared memory, and its byte encoding.
//!
//! Two kinds of keys (same `vm_id` = same shared data), both under
//! `adaptive_hedge/v<encoding version>/slice_<ms>ms/` (`key_prefix`):
//! - `cluster/<name>`: the cluster's [`SharedCluster`]:
//!   its latency window, its long horizon, its budget pool, two lifetime
//!   counters, the windows of its named routes (at most `max_routes`) and
//!   its hosts' costs (at most `MAX_HOSTS`, for host choice);
//! - `clusters`: the registry of tracked cluster names,
//!   which bounds how many cluster keys exist at all.
//!
//! Every value starts with a magic and a version. Anything that does not
//! decode exactly (garbage, a truncated value, another version, a different
//! window geometry) is an error the caller answers by resetting the value:
//! decoding never panics and never reads out of bounds.

use std::fmt;

use super::sketch::{Sketch, MAX_BUCKETS};
use super::window::{ClusterWindow, LongHorizon, Slice, WindowGeometry, SLICES};

const CLUSTER_MAGIC: &[u8; 3] = b"AHC";
const REGISTRY_MAGIC: &[u8; 3] = b"AHR";
/// What an evicted cluster's key holds (Envoy's shared data cannot delete
/// a key): the magic and the version.
const EVICTED_MAGIC: &[u8; 3] = b"AHE";
/// 2: the long horizon; 3: the routes; 4: the hosts; 5: the primaries cut
/// short; 6: sketches of at most `MAX_BUCKETS` buckets. A value of an
/// older version (an older filter) is reset once, like any value that does
/// not decode.
pub const ENCODING_VERSION: u8 = 6;
/// Longer cluster names are not tracked (Istio's are about 60 bytes).
pub const MAX_CLUSTER_NAME: usize = 1024;
/// Longer route names do not learn a delay of their own (Envoy Gateway's
/// are about 80 bytes).
pub const MAX_ROUTE_NAME: usize = 255;
/// Routes one cluster value holds at most (the config allows up to 64).
pub const MAX_ROUTES: usize = 64;
/// Hosts one cluster value holds at most: 64 x about 60 bytes (an IPv6
/// address with its port is at most 47 bytes).
pub const MAX_HOSTS: usize = 64;
/// The highest host cost a value holds (ln µs: e^30 µs is about four
/// months); one above it is garbage, and the value does not decode.
pub const MAX_COST_LOG: f64 = 30.0;
/// Longer `upstream.address` values are not tracked (a Unix socket's path
/// is at most 108 bytes).
pub const MAX_HOST_ADDRESS: usize = 127;
/// A sketch's encoding at its widest (`encode_sketch`).
const SKETCH_BYTES: usize = 2 + 2 + 4 * MAX_BUCKETS;
/// A window and a long horizon at their widest (`encode_latencies`).
const LATENCIES_BYTES: usize = SLICES * (8 + SKETCH_BYTES) + 8 + SKETCH_BYTES;
/// A cluster's own state (its window, long horizons, pool and counters) is
/// at most this long, whatever it holds (16,135 bytes): the header, the
/// latencies, the primaries cut short, the route and host counts.
pub const CLUSTER_OWN_BYTES: usize = 3 + 1 + 4 * 8 + 1 + LATENCIES_BYTES + 8 + SKETCH_BYTES + 2;
const _: () = assert!(CLUSTER_OWN_BYTES <= 16 * 1024, "issue 19's aim");
/// What each tracked host adds at most: its address and five numbers.
pub const HOST_BYTES: usize = 1 + MAX_HOST_ADDRESS + 40;
/// What each named route that learns its own delay adds at most (14,340
/// bytes): its name and its latencies.
pub const ROUTE_BYTES: usize = 1 + MAX_ROUTE_NAME + LATENCIES_BYTES;
/// A cluster's value is at most this long (`SharedCluster::encode`).
pub const MAX_CLUSTER_VALUE_BYTES: usize = 62 * 1024;
/// What the filter keeps in shared memory at most, keys included (of one
/// window geometry's keys, evicted clusters' 4-byte markers aside).
pub const SHARED_MEMORY_CAP_BYTES: usize = 64 << 20;
/// One tracked cluster at most: its value, its key (`cluster/` and the
/// name) and its registry entry (a length and the name).
const CLUSTER_BYTES: usize =
    MAX_CLUSTER_VALUE_BYTES + KEY_PREFIX_BYTES + 8 + MAX_CLUSTER_NAME + 2 + MAX_CLUSTER_NAME;
/// The registry's key (`clusters`) and its header (magic, version, count).
const REGISTRY_FIXED_BYTES: usize = KEY_PREFIX_BYTES + 8 + 3 + 1 + 4;
/// The admin interface's read at most: its key (`admin_membership_v` and
/// up to three digits) and its value. Up to 1 MiB, it is no rounding
/// error: left out, the clusters at the limit left 78 KB of the cap, and
/// the read alone went past it (found by a review).
const MEMBERSHIP_BYTES: usize =
    KEY_PREFIX_BYTES + 21 + super::membership::HEADER_BYTES + super::membership::MAX_VALUE_BYTES;
/// An allowance for the marks that the configuration's `clusters` Envoy
/// lacks were said (`unknown_clusters_said_<16 hex digits>`, an empty
/// value, at most 78 bytes with its key): one per set of configured names
/// with one Envoy lacks, and Envoy's shared data cannot delete them, so a
/// long-lived Envoy may gather some over configuration pushes; this
/// holds 840 at least.
const MARKS_BYTES: usize = 64 * 1024;
/// Clusters tracked at most (`max_clusters`): as many as fit in
/// `SHARED_MEMORY_CAP_BYTES` beside the registry's own bytes, the admin
/// interface's read and the marks' allowance, so the stated cap holds
/// with every other key at its largest too.
pub const MAX_TRACKED_CLUSTERS: usize =
    (SHARED_MEMORY_CAP_BYTES - REGISTRY_FIXED_BYTES - MEMBERSHIP_BYTES - MARKS_BYTES)
        / CLUSTER_BYTES;
/// `adaptive_hedge/v<version>/slice_<ms>ms/` at its longest (a 10-minute
/// window's 100000 ms slice).
const KEY_PREFIX_BYTES: usize = 40;

/// The shared keys carry the encoding version and the window's slice
/// length: plugins of one VM id configured with different windows, or two
/// filter versions side by side during an upgrade, keep apart instead of
/// resetting each other's values on every tick.
fn key_prefix(geometry: WindowGeometry) -> String {
    format!(
        "adaptive_hedge/v{ENCODING_VERSION}/slice_{}ms/",
        geometry.slice_ms
    )
}

/// The shared registry of tracked clusters.
pub fn registry_key(geometry: WindowGeometry) -> String {
    format!("{}clusters", key_prefix(geometry))
}

/// Marks that the configuration's `clusters` Envoy lacks were said, for
/// the set of names hashed in `names_hash`: one worker says them, once per
/// Envoy (each worker's first admin read asks for them).
pub fn unknown_clusters_said_key(geometry: WindowGeometry, names_hash: u64) -> String {
    format!(
        "{}unknown_clusters_said_{names_hash:016x}",
        key_prefix(geometry)
    )
}

/// The admin interface's last read (`membership`).
pub fn membership_key(geometry: WindowGeometry) -> String {
    // its own encoding's version: a filter of the last version beside this
    // one, during a reload, keeps its own value (one key for both, each
    // unable to read the other's, would wipe the other's read every period)
    format!(
        "{}admin_membership_v{}",
        key_prefix(geometry),
        super::membership::VERSION
    )
}

/// A cluster's shared value.
pub fn cluster_key(geometry: WindowGeometry, name: &str) -> String {
    format!("{}cluster/{name}", key_prefix(geometry))
}

/// Why a stored value was not usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Truncated,
    BadMagic,
    UnsupportedVersion(u8),
    /// The window length changed (a new config); the old samples do not fit.
    GeometryChanged,
    Corrupt(&'static str),
    /// The cluster was idle and gave its registry slot up (`evicted`):
    /// not to be written again until it is registered again.
    Evicted,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "value is truncated"),
            DecodeError::BadMagic => write!(f, "value is not an adaptive-hedge record"),
            DecodeError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "encoding version {v} (this filter reads version {ENCODING_VERSION})"
                )
            }
            DecodeError::GeometryChanged => write!(f, "window length changed"),
            DecodeError::Corrupt(what) => write!(f, "corrupt value: {what}"),
            DecodeError::Evicted => write!(f, "evicted while idle"),
        }
    }
}

/// A cluster's state shared by all workers.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedCluster {
    pub window: ClusterWindow,
    pub long: LongHorizon,
    /// Of the long horizon's samples, the primaries a hedge cut short
    /// (`backend_latency`), halved alike.
    pub cut_short: LongHorizon,
    /// Budget micro-tokens deposited by workers with a surplus.
    pub pool: u64,
    /// Requests seen by all workers (lifetime).
    pub requests_total: u64,
    /// Extra upstream attempts sent by all workers (lifetime).
    pub hedges_sent_total: u64,
    /// Named routes of the cluster that learn their own delay, in the order
    /// workers registered them.
    pub routes: Vec<SharedRoute>,
    /// The cluster's hosts, as all workers measured them (`hosts`).
    pub hosts: Vec<SharedHost>,
}

/// One host's cost, as all workers measured it.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedHost {
    /// As Envoy reports it in `upstream.address`.
    pub address: String,
    /// ln(latency in µs): the peak-sensitive EWMA.
    pub cost_log: f64,
    /// Decaying count of failures, as of `stamp_ms`.
    pub failures: f64,
    pub samples: u64,
    pub stamp_ms: u64,
    /// The last tick a worker reported a response from it.
    pub seen_ms: u64,
}

/// One named route's latency, learned apart from the rest of its cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedRoute {
    pub name: String,
    pub window: ClusterWindow,
    pub long: LongHorizon,
}

impl SharedRoute {
    pub fn new(name: String, geometry: WindowGeometry) -> Self {
        SharedRoute {
            name,
            window: ClusterWindow::new(geometry),
            long: LongHorizon::default(),
        }
    }

    /// Whether the route has not been heard from for long: nothing in its
    /// window and less than one sample's weight left in its long horizon
    /// (its slot is then given up for another route).
    pub fn forgotten(&self, now_ms: u64) -> bool {
        self.window.snapshot(now_ms).is_empty() && self.long.sketch.count() == 0
    }
}

impl SharedCluster {
    pub fn new(geometry: WindowGeometry) -> Self {
        SharedCluster {
            window: ClusterWindow::new(geometry),
            long: LongHorizon::default(),
            cut_short: LongHorizon::default(),
            pool: 0,
            requests_total: 0,
            hedges_sent_total: 0,
            routes: Vec::new(),
            hosts: Vec::new(),
        }
    }

    /// The value's bytes, at most `MAX_CLUSTER_VALUE_BYTES`: the cluster's
    /// own latencies and hosts always fit (26.3 KiB at worst); named routes
    /// are kept in the order they were registered while they fit
    /// (`fit_routes`), and a route left out uses the cluster's delay.
    pub fn encode(&self) -> Vec<u8> {
        let (mut out, hosts_out, routes_out, routes) = self.encode_parts();
        out.push(routes);
        out.extend_from_slice(&routes_out);
        out.extend_from_slice(&hosts_out);
        out
    }

    /// Drops the named routes past those that fit the value's cap, so that
    /// what a worker goes on with is what it stored.
    pub fn fit_routes(&mut self) {
        let (_, _, _, kept) = self.encode_parts();
        let mut left = usize::from(kept);
        self.routes.retain(|r| {
            let keep = left > 0 && r.name.len() <= MAX_ROUTE_NAME;
            left -= usize::from(keep);
            keep
        });
    }

    /// The header and the cluster's latencies, the hosts, the routes that
    /// fit and their count.
    fn encode_parts(&self) -> (Vec<u8>, Vec<u8>, Vec<u8>, u8) {
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(CLUSTER_MAGIC);
        out.push(ENCODING_VERSION);
        out.extend_from_slice(&self.window.geometry.slice_ms.to_le_bytes());
        out.extend_from_slice(&self.pool.to_le_bytes());
        out.extend_from_slice(&self.requests_total.to_le_bytes());
        out.extend_from_slice(&self.hedges_sent_total.to_le_bytes());
        out.push(SLICES as u8);
        encode_latencies(&self.window, &self.long, &mut out);
        encode_horizon(&self.cut_short, &mut out);
        let mut hosts_out = Vec::new();
        let hosts: Vec<&SharedHost> = self
            .hosts
            .iter()
            .filter(|h| h.address.len() <= MAX_HOST_ADDRESS)
            .take(MAX_HOSTS)
            .collect();
        hosts_out.push(hosts.len() as u8);
        for host in hosts {
            hosts_out.push(host.address.len() as u8);
            hosts_out.extend_from_slice(host.address.as_bytes());
            hosts_out.extend_from_slice(&host.cost_log.to_le_bytes());
            hosts_out.extend_from_slice(&host.failures.to_le_bytes());
            hosts_out.extend_from_slice(&host.samples.to_le_bytes());
            hosts_out.extend_from_slice(&host.stamp_ms.to_le_bytes());
            hosts_out.extend_from_slice(&host.seen_ms.to_le_bytes());
        }
        // routes beyond MAX_ROUTES or with longer names are never added;
        // the count byte comes first
        let room = MAX_CLUSTER_VALUE_BYTES.saturating_sub(out.len() + 1 + hosts_out.len());
        let mut routes_out = Vec::new();
        let mut routes = 0u8;
        let mut route_out = Vec::new();
        for route in self
            .routes
            .iter()
            .filter(|r| r.name.len() <= MAX_ROUTE_NAME)
            .take(MAX_ROUTES)
        {
            route_out.clear();
            route_out.push(route.name.len() as u8);
            route_out.extend_from_slice(route.name.as_bytes());
            encode_latencies(&route.window, &route.long, &mut route_out);
            if routes_out.len() + route_out.len() > room {
                break;
            }
            routes_out.extend_from_slice(&route_out);
            routes += 1;
        }
        (out, hosts_out, routes_out, routes)
    }

    /// The value an idle cluster's key is left with when its registry slot
    /// goes to another cluster.
    pub fn evicted() -> Vec<u8> {
        let mut out = EVICTED_MAGIC.to_vec();
        out.push(ENCODING_VERSION);
        out
    }

    /// Whether nothing was heard from the cluster for a whole window: its
    /// registry slot may go to another cluster.
    pub fn idle(&self, now_ms: u64) -> bool {
        self.window.is_idle(now_ms)
    }

    /// Decodes a value written by [`SharedCluster::encode`] for the same geometry.
    pub fn decode(bytes: &[u8], geometry: WindowGeometry) -> Result<Self, DecodeError> {
        if bytes.len() == 4
            && bytes.starts_with(EVICTED_MAGIC)
            && bytes.ends_with(&[ENCODING_VERSION])
        {
            return Err(DecodeError::Evicted);
        }
        // what `encode` would not write does not decode: a value kept whole
        // by this worker and cut by the next one's write would differ
        if bytes.len() > MAX_CLUSTER_VALUE_BYTES {
            return Err(DecodeError::Corrupt("cluster value too long"));
        }
        let mut r = Reader { bytes };
        r.header(CLUSTER_MAGIC)?;
        if r.u64()? != geometry.slice_ms {
            return Err(DecodeError::GeometryChanged);
        }
        let pool = r.u64()?;
        let requests_total = r.u64()?;
        let hedges_sent_total = r.u64()?;
        if usize::from(r.u8()?) != SLICES {
            return Err(DecodeError::GeometryChanged);
        }
        let (window, long) = r.latencies(geometry)?;
        let cut_short = r.horizon()?;
        let count = usize::from(r.u8()?);
        if count > MAX_ROUTES {
            return Err(DecodeError::Corrupt("too many routes"));
        }
        let mut routes = Vec::with_capacity(count);
        for _ in 0..count {
            let len = usize::from(r.u8()?);
            let name = std::str::from_utf8(r.take(len)?)
                .map_err(|_| DecodeError::Corrupt("route name is not UTF-8"))?
                .to_string();
            let (window, long) = r.latencies(geometry)?;
            routes.push(SharedRoute { name, window, long });
        }
        let count = usize::from(r.u8()?);
        if count > MAX_HOSTS {
            return Err(DecodeError::Corrupt("too many hosts"));
        }
        let mut hosts = Vec::with_capacity(count);
        for _ in 0..count {
            let len = usize::from(r.u8()?);
            if len > MAX_HOST_ADDRESS {
                return Err(DecodeError::Corrupt("host address too long"));
            }
            let address = std::str::from_utf8(r.take(len)?)
                .map_err(|_| DecodeError::Corrupt("host address is not UTF-8"))?
                .to_string();
            let cost_log = r.f64()?;
            let failures = r.f64()?;
            // a cost of at most `MAX_COST_LOG`, failures not negative: NaN
            // and infinities are garbage (and would never compare equal again)
            if !(0.0..=MAX_COST_LOG).contains(&cost_log) || !(0.0..=1e9).contains(&failures) {
                return Err(DecodeError::Corrupt("host cost out of range"));
            }
            hosts.push(SharedHost {
                address,
                cost_log,
                failures,
                samples: r.u64()?,
                stamp_ms: r.u64()?,
                seen_ms: r.u64()?,
            });
        }
        if !r.bytes.is_empty() {
            return Err(DecodeError::Corrupt("trailing bytes"));
        }
        Ok(SharedCluster {
            window,
            long,
            cut_short,
            pool,
            requests_total,
            hedges_sent_total,
            routes,
            hosts,
        })
    }
}

/// A window's slices (epoch, sketch) and a long horizon (period, sketch).
fn encode_latencies(window: &ClusterWindow, long: &LongHorizon, out: &mut Vec<u8>) {
    for slice in &window.slices {
        out.extend_from_slice(&slice.epoch.to_le_bytes());
        encode_sketch(&slice.sketch, out);
    }
    encode_horizon(long, out);
}

/// A long horizon: its period and sketch.
fn encode_horizon(long: &LongHorizon, out: &mut Vec<u8>) {
    out.extend_from_slice(&long.period.to_le_bytes());
    encode_sketch(&long.sketch, out);
}

/// The set of cluster names that have a shared key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registry {
    pub names: Vec<String>,
}

impl Registry {
    pub fn contains(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.names.iter().map(|n| n.len() + 2).sum::<usize>());
        out.extend_from_slice(REGISTRY_MAGIC);
        out.push(ENCODING_VERSION);
        // names are at most MAX_CLUSTER_NAME bytes (longer ones are never registered)
        let names: Vec<&[u8]> = self
            .names
            .iter()
            .map(|n| n.as_bytes())
            .filter(|n| n.len() <= MAX_CLUSTER_NAME)
            .collect();
        out.extend_from_slice(&(names.len() as u32).to_le_bytes());
        for bytes in names {
            out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
            out.extend_from_slice(bytes);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { bytes };
        r.header(REGISTRY_MAGIC)?;
        let count = r.u32()? as usize;
        // each name takes at least 2 bytes: refuse counts the value cannot hold
        if count > r.bytes.len() / 2 {
            return Err(DecodeError::Corrupt("registry count larger than the value"));
        }
        // any module of the VM may write this key: allocate for what a
        // registry holds, not for what a count says
        let mut names = Vec::with_capacity(count.min(MAX_TRACKED_CLUSTERS));
        for _ in 0..count {
            let len = usize::from(r.u16()?);
            if len > MAX_CLUSTER_NAME {
                return Err(DecodeError::Corrupt(
                    "cluster name longer than any registered",
                ));
            }
            let raw = r.take(len)?;
            let name = std::str::from_utf8(raw)
                .map_err(|_| DecodeError::Corrupt("cluster name is not UTF-8"))?;
            names.push(name.to_string());
        }
        if !r.bytes.is_empty() {
            return Err(DecodeError::Corrupt("trailing bytes"));
        }
        Ok(Registry { names })
    }
}

/// A sketch's bytes: key offset, bucket count (u16 each), the counts (u32).
fn encode_sketch(sketch: &Sketch, out: &mut Vec<u8>) {
    out.extend_from_slice(&(sketch.offset() as u16).to_le_bytes());
    out.extend_from_slice(&(sketch.counts().len() as u16).to_le_bytes());
    for c in sketch.counts() {
        out.extend_from_slice(&c.to_le_bytes());
    }
}

/// Bounds-checked little-endian reader.
/// Reads the little-endian encodings (here and in `membership`).
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    /// Whether every byte was read.
    pub(super) fn is_done(&self) -> bool {
        self.bytes.is_empty()
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(u8::from_le_bytes(self.array()?))
    }
    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn f64(&mut self) -> Result<f64, DecodeError> {
        Ok(f64::from_le_bytes(self.array()?))
    }

    fn sketch(&mut self) -> Result<Sketch, DecodeError> {
        let offset = i32::from(self.u16()?);
        let len = usize::from(self.u16()?);
        if len > MAX_BUCKETS {
            return Err(DecodeError::Corrupt("sketch has too many buckets"));
        }
        let mut counts = Vec::with_capacity(len);
        for _ in 0..len {
            counts.push(self.u32()?);
        }
        Sketch::from_parts(offset, counts)
            .ok_or(DecodeError::Corrupt("sketch buckets out of range"))
    }

    /// What `encode_latencies` wrote.
    fn latencies(
        &mut self,
        geometry: WindowGeometry,
    ) -> Result<(ClusterWindow, LongHorizon), DecodeError> {
        let mut window = ClusterWindow::new(geometry);
        for (index, slot) in window.slices.iter_mut().enumerate() {
            let epoch = self.u64()?;
            let sketch = self.sketch()?;
            // a slice lives in the slot of its epoch: two slots of one
            // epoch would count its samples twice
            if !sketch.is_empty() && epoch % SLICES as u64 != index as u64 {
                return Err(DecodeError::Corrupt("a slice out of its slot"));
            }
            *slot = Slice { epoch, sketch };
        }
        Ok((window, self.horizon()?))
    }

    /// What `encode_horizon` wrote.
    fn horizon(&mut self) -> Result<LongHorizon, DecodeError> {
        Ok(LongHorizon {
            period: self.u64()?,
            sketch: self.sketch()?,
        })
    }

    fn header(&mut self, magic: &[u8; 3]) -> Result<(), DecodeError> {
        if self.take(3)? != magic {
            return Err(DecodeError::BadMagic);
        }
        match self.u8()? {
            ENCODING_VERSION => Ok(()),
            other => Err(DecodeError::UnsupportedVersion(other)),
        }
    }
}

/// A failed shared-data call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// Another worker wrote the value since we read it: read again.
    CasMismatch,
    /// Any other status from the host (its numeric code).
    Host(u32),
}

/// Shared memory as the workers see it (proxy-wasm `get/set_shared_data`).
pub trait SharedStore {
    /// The value and its CAS token, or `None` if the key was never written
    /// (a key holding an empty value is `Some`, with its token).
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError>;
    /// Writes if `cas` still matches the key's token (0: unconditional). A
    /// missing key is created whatever `cas` is (Envoy's host compares a
    /// token only with an existing key's).
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// The token to write a key with after `get` found it missing: the write
/// creates the key, or fails with a CAS mismatch if another worker created
/// it in between (then read and merge again). Why not 0: two workers that
/// both found the key missing would both write unconditionally, and the
/// second would erase the first one's samples, requests and tokens. Envoy
/// hands out tokens from one counter, so an existing key holds this one for
/// at most one write in 2^32, and only then could the two writes collide.
pub const CREATE_ONLY: u32 = u32::MAX;

pub mod memory {
    //! An in-process [`SharedStore`] with Envoy's CAS semantics, for tests and
    //! the virtual-time simulation of the policy (never used in the filter).
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    pub struct MemoryStore {
        pub values: RefCell<HashMap<String, (Vec<u8>, u32)>>,
        /// Fail the next N `set`s with a CAS mismatch (a racing writer).
        pub conflicts: RefCell<u32>,
    }

    impl SharedStore for MemoryStore {
        fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, StoreError> {
            Ok(self.values.borrow().get(key).cloned())
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            let mut conflicts = self.conflicts.borrow_mut();
            if *conflicts > 0 {
                *conflicts -= 1;
                return Err(StoreError::CasMismatch);
            }
            let mut values = self.values.borrow_mut();
            let current = values.get(key).map(|(_, c)| *c);
            if current.is_some_and(|c| cas != 0 && cas != c) {
                return Err(StoreError::CasMismatch);
            }
            values.insert(key.to_string(), (value.to_vec(), current.unwrap_or(0) + 1));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::sketch::{value_for, MAX_KEY};
    use std::time::Duration;

    fn sample_cluster() -> SharedCluster {
        let g = WindowGeometry::new(Duration::from_secs(30));
        let mut c = SharedCluster::new(g);
        let mut s = Sketch::new();
        for v in [900.0, 1000.0, 5000.0, 50_000.0] {
            s.add(v);
        }
        c.window.merge(1_000_000, &s);
        c.window.merge(1_006_000, &s);
        c.long.merge(1_006_000, &s);
        c.cut_short.merge(1_006_000, &s);
        c.pool = 3_500_000;
        c.requests_total = 1234;
        c.hedges_sent_total = 56;
        let mut route = SharedRoute::new("search".into(), g);
        route.window.merge(1_006_000, &s);
        route.long.merge(1_006_000, &s);
        c.routes.push(route);
        c.routes.push(SharedRoute::new("empty".into(), g));
        c.hosts.push(SharedHost {
            address: "10.0.0.7:8080".into(),
            cost_log: 8.5,
            failures: 0.25,
            samples: 420,
            stamp_ms: 1_006_000,
            seen_ms: 1_005_800,
        });
        c.hosts.push(SharedHost {
            address: "[fd00::1]:443".into(),
            cost_log: 7.0,
            failures: 0.0,
            samples: 5,
            stamp_ms: 1_006_000,
            seen_ms: 1_006_000,
        });
        c
    }

    /// A sketch with every bucket in use: the widest a sketch can be.
    fn widest_sketch() -> Sketch {
        let mut s = Sketch::new();
        for key in 0..=MAX_KEY {
            s.add(value_for(key));
        }
        assert_eq!(s.counts().len(), MAX_BUCKETS);
        s
    }

    /// Another worker's value (or a corrupt one) that `encode` would not
    /// write back whole is refused: decoded, this worker would keep a host
    /// the value it writes next leaves out (found by the fuzz round trip's
    /// reading; membership refuses such addresses too).
    #[test]
    fn what_encode_would_drop_does_not_decode() {
        let g = WindowGeometry::new(Duration::from_secs(30));
        let mut long_host = sample_cluster();
        long_host.hosts.truncate(1);
        let address = "a".repeat(MAX_HOST_ADDRESS + 1);
        let mut bytes = long_host.encode();
        let fits = SharedCluster::decode(&bytes, g).unwrap();
        assert_eq!(fits.hosts.len(), 1);
        // the one host's address, written past the cap by hand
        let at = bytes
            .windows(long_host.hosts[0].address.len())
            .position(|w| w == long_host.hosts[0].address.as_bytes())
            .unwrap();
        bytes[at - 1] = address.len() as u8;
        bytes.splice(at..at + long_host.hosts[0].address.len(), address.bytes());
        assert!(SharedCluster::decode(&bytes, g).is_err());
        let mut too_long = long_host.encode();
        too_long.resize(MAX_CLUSTER_VALUE_BYTES + 1, 0);
        assert!(SharedCluster::decode(&too_long, g).is_err());
    }

    /// Bumping `membership::VERSION` alone moves the key with it.
    #[test]
    fn the_membership_key_carries_its_encoding_s_version() {
        let g = WindowGeometry::new(Duration::from_secs(30));
        let key = membership_key(g);
        assert!(
            key.ends_with(&format!(
                "admin_membership_v{}",
                super::super::membership::VERSION
            )),
            "{key}"
        );
    }

    #[test]
    fn a_cluster_value_never_passes_its_cap_and_keeps_its_own_state_whole() {
        let g = WindowGeometry::new(Duration::from_secs(30));
        let wide = widest_sketch();
        let now = 10_000_000;
        let fill = |window: &mut ClusterWindow, long: &mut LongHorizon| {
            for i in 0..SLICES as u64 {
                window.merge(now - i * g.slice_ms, &wide);
            }
            long.merge(now, &wide);
        };
        let mut c = SharedCluster::new(g);
        fill(&mut c.window, &mut c.long);
        c.cut_short.merge(now, &wide);
        // the figures design.md states: the cluster's own state at its
        // widest, then each host at its longest address, each route at its
        // widest with its longest name
        assert_eq!(c.encode().len(), CLUSTER_OWN_BYTES);
        for i in 0..MAX_HOSTS {
            c.hosts.push(SharedHost {
                address: format!("{i:0>width$}", width = MAX_HOST_ADDRESS),
                cost_log: 8.0,
                failures: 0.0,
                samples: 1,
                stamp_ms: now,
                seen_ms: now,
            });
        }
        let alone = c.encode();
        assert!(alone.len() <= MAX_CLUSTER_VALUE_BYTES, "{}", alone.len());
        assert_eq!(alone.len(), CLUSTER_OWN_BYTES + MAX_HOSTS * HOST_BYTES);
        let mut one_route = c.clone();
        let mut route = SharedRoute::new(format!("{:0>255}", 0), g);
        fill(&mut route.window, &mut route.long);
        one_route.routes.push(route);
        assert_eq!(one_route.encode().len(), alone.len() + ROUTE_BYTES);
        for i in 0..MAX_ROUTES {
            let mut route = SharedRoute::new(format!("{i:0>255}"), g);
            fill(&mut route.window, &mut route.long);
            c.routes.push(route);
        }
        let capped = c.encode();
        assert!(capped.len() <= MAX_CLUSTER_VALUE_BYTES, "{}", capped.len());
        let back = SharedCluster::decode(&capped, g).unwrap();
        assert_eq!(
            (
                back.window.clone(),
                back.long.clone(),
                back.cut_short.clone()
            ),
            (c.window.clone(), c.long.clone(), c.cut_short.clone())
        );
        assert_eq!(back.hosts, c.hosts);
        // two of the widest routes fit beside the widest cluster
        assert_eq!(back.routes.len(), 2);
        // a plain cluster with routes of some 4 KB each: the first ones fit
        let mut narrow = Sketch::new();
        for key in 500..630 {
            narrow.add(value_for(key));
        }
        let mut c = SharedCluster::new(g);
        for i in 0..MAX_ROUTES {
            let mut route = SharedRoute::new(format!("route-{i}"), g);
            for s in 0..SLICES as u64 {
                route.window.merge(now - s * g.slice_ms, &narrow);
            }
            route.long.merge(now, &narrow);
            c.routes.push(route);
        }
        let capped = c.encode();
        assert!(capped.len() <= MAX_CLUSTER_VALUE_BYTES, "{}", capped.len());
        let back = SharedCluster::decode(&capped, g).unwrap();
        assert!(
            (2..MAX_ROUTES).contains(&back.routes.len()),
            "{}",
            back.routes.len()
        );
        assert_eq!(
            back.routes[..],
            c.routes[..back.routes.len()],
            "first registered first"
        );
        // and fit_routes leaves in memory what was stored
        let mut fitted = c.clone();
        fitted.fit_routes();
        assert_eq!(fitted.routes, back.routes);
        assert_eq!(fitted.encode(), capped);
        // and a small cluster keeps all its routes
        let mut small = sample_cluster();
        for i in 0..MAX_ROUTES - 2 {
            small.routes.push(SharedRoute::new(format!("r{i}"), g));
        }
        let back = SharedCluster::decode(&small.encode(), g).unwrap();
        assert_eq!(back.routes.len(), MAX_ROUTES);
    }

    /// Every key at its largest (the longest prefix: a 10-minute window)
    /// fits the stated cap: the clusters at the limit, the registry, the
    /// admin interface's read at its cap and the marks' allowance; one
    /// cluster more would not. Before, the read (up to 1 MiB) and the
    /// marks were left out, and 1,022 clusters left 78 KB for them.
    #[test]
    fn the_tracked_clusters_fit_the_shared_memory_cap() {
        use crate::policy::config::Config;
        use crate::policy::membership::{self, Membership};
        let g = WindowGeometry::new(Duration::from_secs(600));
        let key = cluster_key(g, &"c".repeat(MAX_CLUSTER_NAME));
        let per_cluster = MAX_CLUSTER_VALUE_BYTES + key.len() + 2 + MAX_CLUSTER_NAME;
        assert!(per_cluster <= CLUSTER_BYTES);
        let registry = registry_key(g).len() + Registry::default().encode().len();
        assert!(registry <= REGISTRY_FIXED_BYTES);
        let admin_read = membership_key(g).len()
            + Membership::default().encode().len()
            + membership::MAX_VALUE_BYTES;
        assert!(admin_read <= MEMBERSHIP_BYTES);
        let mark = unknown_clusters_said_key(g, u64::MAX).len();
        assert!(MARKS_BYTES / mark >= 840, "marks the allowance holds");
        let others = registry + admin_read + MARKS_BYTES;
        assert!(MAX_TRACKED_CLUSTERS * per_cluster + others <= SHARED_MEMORY_CAP_BYTES);
        assert!((MAX_TRACKED_CLUSTERS + 1) * per_cluster + others > SHARED_MEMORY_CAP_BYTES);
        assert_eq!(MAX_TRACKED_CLUSTERS, 1_006, "README and design.md say so");
        let default_fits = Config::default().max_clusters <= MAX_TRACKED_CLUSTERS;
        assert!(default_fits, "the default max_clusters fits");
    }

    /// The fuzzer's seeds (`fuzz/seeds/shared_state`) are current encodings:
    /// a change of format fails here until they are rewritten with
    /// `WRITE_FUZZ_SEEDS=1 cargo test -p adaptive-hedge seeds`.
    #[test]
    fn fuzz_seeds_are_current_encodings() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/shared_state");
        let g = WindowGeometry::new(Duration::from_secs(30));
        let seeds = [
            ("cluster_empty.bin", SharedCluster::new(g).encode()),
            ("cluster_sample.bin", sample_cluster().encode()),
            (
                "registry.bin",
                Registry {
                    names: vec!["backend".into(), "outbound|8080||payments".into()],
                }
                .encode(),
            ),
            (
                "membership.bin",
                super::super::membership::Membership {
                    read_ms: 1_700_000_000_000,
                    claimed_ms: 1_700_000_000_000,
                    clusters: super::super::membership::parse_admin_clusters(
                        b"backend::10.0.0.1:80::health_flags::healthy\nbackend::10.0.0.1:80::weight::3\nbackend::[::1]:80::health_flags::/failed_active_hc\n",
                        |_| true,
                    ),
                    outlier_detection: [(
                        "backend".to_string(),
                        super::super::membership::OutlierDetection::Split,
                    )]
                    .into_iter()
                    .collect(),
                }
                .encode(),
            ),
        ];
        // libFuzzer cuts a seed to its `-max_len` (the Makefile's `fuzz`):
        // a longer one never decodes there, and the worker never merges a
        // whole value with routes, hosts and sketches
        let makefile = std::fs::read_to_string(dir.join("../../../Makefile")).unwrap();
        let max_len: usize = makefile
            .split("-max_len=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("the Makefile's fuzz target sets -max_len");
        for (name, bytes) in seeds {
            assert!(bytes.len() <= max_len, "{name}: {} bytes", bytes.len());
            let path = dir.join(name);
            if std::env::var_os("WRITE_FUZZ_SEEDS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &bytes).unwrap();
            }
            assert_eq!(
                std::fs::read(&path).ok(),
                Some(bytes),
                "{} is stale",
                path.display()
            );
        }
    }

    #[test]
    fn cluster_round_trips() {
        let c = sample_cluster();
        let bytes = c.encode();
        assert_eq!(SharedCluster::decode(&bytes, c.window.geometry).unwrap(), c);
    }

    #[test]
    fn every_truncation_and_garbage_is_an_error_not_a_panic() {
        let c = sample_cluster();
        let bytes = c.encode();
        for n in 0..bytes.len() {
            assert!(SharedCluster::decode(&bytes[..n], c.window.geometry).is_err());
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(SharedCluster::decode(&longer, c.window.geometry).is_err());
        assert_eq!(
            SharedCluster::decode(b"hello world", c.window.geometry),
            Err(DecodeError::BadMagic)
        );
        // flip every byte once: decoding may succeed or fail, but never panics
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            let _ = SharedCluster::decode(&b, c.window.geometry);
        }
    }

    /// A slice in a slot not its epoch's (two slots of one epoch would
    /// count its samples twice) is refused.
    #[test]
    fn a_slice_out_of_its_slot_is_refused() {
        let mut c = sample_cluster();
        let live = c
            .window
            .slices
            .iter()
            .position(|s| !s.sketch.is_empty())
            .expect("a live slice");
        let epoch = c.window.slices[live].epoch;
        c.window.slices[(live + 1) % SLICES] = Slice {
            epoch,
            sketch: c.window.slices[live].sketch.clone(),
        };
        assert_eq!(
            SharedCluster::decode(&c.encode(), c.window.geometry),
            Err(DecodeError::Corrupt("a slice out of its slot"))
        );
    }

    #[test]
    fn other_version_and_geometry_are_detected() {
        let c = sample_cluster();
        let mut bytes = c.encode();
        bytes[3] = 0;
        assert_eq!(
            SharedCluster::decode(&bytes, c.window.geometry),
            Err(DecodeError::UnsupportedVersion(0))
        );
        let other = WindowGeometry::new(Duration::from_secs(60));
        assert_eq!(
            SharedCluster::decode(&c.encode(), other),
            Err(DecodeError::GeometryChanged)
        );
    }

    #[test]
    fn registry_round_trips_and_rejects_garbage() {
        let r = Registry {
            names: vec!["a".into(), "outbound|80||svc.ns.svc.cluster.local".into()],
        };
        let bytes = r.encode();
        assert_eq!(Registry::decode(&bytes).unwrap(), r);
        for n in 0..bytes.len() {
            assert!(Registry::decode(&bytes[..n]).is_err());
        }
        let mut huge = b"AHR\x01".to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Registry::decode(&huge).is_err());
    }
}
