//! A route's overrides as Envoy serialises its metadata, read on a route's
//! first request: any bytes give settings or an error naming the field,
//! never a panic; settings read back go through the config's rules.
#![no_main]

use adaptive_hedge::policy::config::{policy_field_kind, ClusterPolicy, Config};
use adaptive_hedge::route_metadata::{encode, overrides_to_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(json) = overrides_to_json(data, policy_field_kind) {
        // what was read encodes back to bytes that read the same
        assert_eq!(
            overrides_to_json(&encode(&json), policy_field_kind).as_ref(),
            Ok(&json)
        );
        let _ =
            Config::default().route_policy(&ClusterPolicy::default(), json, "", &mut Vec::new());
    }
});
