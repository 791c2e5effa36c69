//! The proxy-wasm glue: a root context per plugin (config, tick) and an HTTP
//! context per request (downstream role) or per attempt (upstream role).
//! Thin on purpose: every decision is in `policy`.

#[cfg(feature = "fault-injection")]
mod fault_injection;
mod host;
mod http;
mod placement;
mod root;
mod upstream;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::HedgeRoot::default())
    });
}}
