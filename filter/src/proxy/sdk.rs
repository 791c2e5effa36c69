//! The proxy-wasm SDK's traits, each callback handed to the role's flow with
//! the ABI as its host (wasm32 only). Nothing is decided here.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action as SdkAction, ContextType};

use super::abi::Abi;
use super::host::{Action, StreamCallbacks};
use super::root::{Plugin, Stream};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(Root(Plugin::new(Abi)))
    });
}}

fn sdk(action: Action) -> SdkAction {
    match action {
        Action::Continue => SdkAction::Continue,
        Action::Pause => SdkAction::Pause,
    }
}

struct Root(Plugin<Abi>);

impl Context for Root {
    fn on_done(&mut self) -> bool {
        self.0.on_done();
        true
    }

    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        self.0.on_http_call_response(token_id, body_size);
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        self.0.on_configure(plugin_configuration_size)
    }

    fn on_tick(&mut self) {
        self.0.on_tick();
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // Never None: the SDK panics on None.
        Some(match self.0.stream() {
            Stream::Downstream(request) => Box::new(Http(request)),
            Stream::Upstream(attempt) => Box::new(Http(attempt)),
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One HTTP stream's context, whichever role made it.
struct Http<S: StreamCallbacks>(S);

impl<S: StreamCallbacks> Context for Http<S> {
    fn on_done(&mut self) -> bool {
        self.0.on_done();
        true
    }
}

impl<S: StreamCallbacks> HttpContext for Http<S> {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> SdkAction {
        sdk(self.0.on_request_headers(end_of_stream))
    }

    fn on_http_request_body(&mut self, _body_size: usize, end_of_stream: bool) -> SdkAction {
        if end_of_stream {
            self.0.on_request_end();
        }
        SdkAction::Continue
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> SdkAction {
        self.0.on_request_end();
        SdkAction::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> SdkAction {
        sdk(self.0.on_response_headers(end_of_stream))
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> SdkAction {
        sdk(self.0.on_response_body(body_size, end_of_stream))
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> SdkAction {
        sdk(self.0.on_response_trailers())
    }

    fn on_log(&mut self) {
        self.0.on_log();
    }
}
