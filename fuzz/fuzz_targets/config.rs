//! The plugin config parser: any bytes give a config or an error naming a
//! field, never a panic; a config the filter accepts, logged as its
//! effective JSON, parses back to the same config.
#![no_main]

use adaptive_hedge::policy::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Config::parse(data) {
        Ok(config) => {
            let logged = config.effective_json();
            let again = Config::parse(logged.as_bytes())
                .unwrap_or_else(|e| panic!("the logged config does not parse: {e}\n{logged}"));
            assert_eq!(
                again.effective_json(),
                logged,
                "round trip changed the config"
            );
        }
        // The field may be literally "" (a key named ""), but the message
        // always has the form Envoy's log shows.
        Err(e) => assert!(
            e.to_string().starts_with("invalid plugin config: field \""),
            "{e}"
        ),
    }
});
