//! Shared-data values are written by other workers (or by anything else
//! sharing the VM id): whatever bytes sit under the filter's keys decode to a
//! value or an error, never a panic; a decoded value re-encodes to itself;
//! and a worker syncing over garbage resets the key and leaves a value that
//! decodes.
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use adaptive_hedge::policy::config::Config;
use adaptive_hedge::policy::decision::Request;
use adaptive_hedge::policy::membership::{
    parse_admin_clusters, parse_config_dump, parse_outlier_detection, Membership,
};
use adaptive_hedge::policy::shared_state::memory::MemoryStore;
use adaptive_hedge::policy::shared_state::{
    cluster_key, membership_key, registry_key, Registry, SharedCluster, SharedStore,
    MAX_CLUSTER_VALUE_BYTES,
};
use adaptive_hedge::policy::window::WindowGeometry;
use adaptive_hedge::policy::worker::Worker;
use adaptive_hedge::telemetry::{Level, Logger};
use libfuzzer_sys::fuzz_target;

struct Quiet;
impl Logger for Quiet {
    fn log(&mut self, _level: Level, _message: &str) {}
}

fuzz_target!(|data: &[u8]| {
    let geometry = WindowGeometry::new(Duration::from_secs(30));
    if let Ok(cluster) = SharedCluster::decode(data, geometry) {
        let bytes = cluster.encode();
        assert!(bytes.len() <= MAX_CLUSTER_VALUE_BYTES);
        assert_eq!(SharedCluster::decode(&bytes, geometry).ok(), Some(cluster));
    }
    if let Ok(registry) = Registry::decode(data) {
        assert_eq!(Registry::decode(&registry.encode()).ok(), Some(registry));
    }
    if let Ok(membership) = Membership::decode(data) {
        let bytes = membership.encode();
        assert_eq!(Membership::decode(&bytes).ok(), Some(membership));
    }
    // the admin interface's text (from Envoy, but parsed all the same)
    let clusters = parse_admin_clusters(data, |_| true);
    let read = Membership {
        read_ms: 1,
        claimed_ms: 1,
        outlier_detection: parse_outlier_detection(data, |c| clusters.contains_key(c)),
        clusters,
    };
    assert_eq!(Membership::decode(&read.encode()).ok(), Some(read));
    // and its configuration dump's
    let _ = parse_config_dump(data);

    // A worker meets the bytes under its keys.
    let Ok(config) =
        Config::parse(br#"{"min_samples": 1, "max_routes": 2, "admin_cluster": "admin"}"#)
    else {
        return;
    };
    let mut worker = Worker::new(Arc::new(config));
    let store = MemoryStore::default();
    // Where the bytes go: by the first byte's magic, whole under its own key
    // (a seed's value, mutated, reaches the worker's merge), or else split
    // between the registry and the cluster.
    let split = data.len() / 2;
    match data.get(..3) {
        Some(b"AHC") => {
            let _ = store.set(&cluster_key(geometry, "backend"), data, 0);
        }
        _ => {
            let _ = store.set(&registry_key(geometry), &data[..split], 0);
            let _ = store.set(&cluster_key(geometry, "backend"), &data[split..], 0);
        }
    }
    let _ = store.set(&membership_key(geometry), data, 0);
    for i in 0..3u64 {
        let get = Request {
            method: b"GET",
            ..Request::default()
        };
        let plan = worker.plan(Some(b"backend"), Some(b"default"), &get);
        if let Some(id) = plan.cluster {
            worker.on_response(id, plan.route, 1000 + i);
        }
        if let Some(settlement) = plan.settlement() {
            worker.settle(settlement, Some(1), None, None, None);
        }
        worker.sync(1_700_000_000_000 + i * 200, &store, &mut Quiet);
        if worker
            .claim_admin_read(1_700_000_000_000 + i * 200, &store)
            .is_some()
        {
            // the same bytes as every answer of the read (the dumps' too)
            let at = 1_700_000_000_100 + i * 200;
            let mut next = worker.admin_read_done(at, Ok(data), &store, &mut Quiet);
            while next.is_some() {
                next = worker.admin_read_done(at, Ok(data), &store, &mut Quiet);
            }
        }
    }
    if let Ok(Some((bytes, _))) = store.get(&membership_key(geometry)) {
        assert!(
            data == bytes.as_slice() || Membership::decode(&bytes).is_ok(),
            "the worker left a membership that does not decode"
        );
    }
    if let Ok(Some((bytes, _))) = store.get(&cluster_key(geometry, "backend")) {
        assert!(
            SharedCluster::decode(&bytes, geometry).is_ok(),
            "the worker left a value that does not decode"
        );
    }
});
