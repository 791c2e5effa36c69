//! Reads the request headers, and what the filter needs of the response
//! headers, from one `proxy_get_header_map_pairs` answer each.
//!
//! Why one call: the filter needs `:method`, `upgrade`, whether it is a
//! gRPC call (`content-type`, and then `:path`), and whether the
//! client sent any router control header, the first-byte marker or the
//! host header. Asking
//! for each by name costs a host round trip per name (eight on a request
//! that is not armed), and each costs microseconds. The whole map in one
//! buffer costs one.
//!
//! The buffer is in the host's pairs serialisation (`pairs`), parsed
//! defensively: a malformed buffer is `None`, never a panic.

#[cfg(test)]
use crate::headers::ENDPOINT_HEADER;
use crate::headers::{CONTROL_HEADERS, FIRST_BYTE_MARKER, UPSTREAM_SERVICE_TIME};
use crate::pairs;
#[cfg(test)]
use crate::pairs::serialise;
use crate::policy::decision::Request;

/// Scans a serialised header map for what the decision needs;
/// `endpoint_header` is the configured host header. Header names in Envoy's
/// maps are lower-case already. `None` if the buffer is malformed.
pub fn scan<'a>(buf: &'a [u8], endpoint_header: &[u8]) -> Option<Request<'a>> {
    let mut found = Request::default();
    pairs::for_each(buf, |name, value| {
        if name == b":method" {
            found.method = value;
        } else if name == b":path" {
            found.path = value;
        } else if name == b"content-type" {
            found.grpc = is_grpc(value);
        } else if name == b"upgrade" {
            found.upgrade = true;
        } else if name == FIRST_BYTE_MARKER.as_bytes() {
            found.client_marker = true;
        } else if name == endpoint_header {
            found.client_endpoint = true;
        } else if !found.client_controls && CONTROL_HEADERS.iter().any(|n| n.as_bytes() == name) {
            found.client_controls = true;
        }
    })?;
    Some(found)
}

/// `application/grpc`, or `application/grpc+proto` and the like; not
/// gRPC-Web (`application/grpc-web`), which Envoy's grpc_web filter turns
/// into gRPC before the router if the chain has it.
/// What the filter reads of a response's headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseHeaders {
    /// `:status`, if it is a number.
    pub status: Option<u16>,
    /// The router relayed it from an upstream (`UPSTREAM_SERVICE_TIME`).
    /// Absent is not proof of a local reply: the operator may suppress
    /// Envoy's headers.
    pub relayed: bool,
}

/// The response headers in one buffer, as `scan` reads the request's.
/// Why: `response.code` and `response.code_details` are a property read
/// each (about 12.5k instructions apiece); the map is one read (about 16k).
pub fn scan_response(buf: &[u8]) -> Option<ResponseHeaders> {
    let mut found = ResponseHeaders::default();
    pairs::for_each(buf, |name, value| {
        if name == b":status" {
            found.status = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
        } else if name == UPSTREAM_SERVICE_TIME.as_bytes() {
            found.relayed = true;
        }
    })?;
    Some(found)
}

fn is_grpc(content_type: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    content_type.len() >= GRPC.len()
        && content_type
            .get(..GRPC.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(GRPC))
        && matches!(content_type.get(GRPC.len()), None | Some(b'+' | b';'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: &[u8] = ENDPOINT_HEADER.as_bytes();

    #[test]
    fn finds_grpc_calls_and_their_path() {
        let call = |content_type: &str| {
            let buf = serialise(&[
                (":method", "POST"),
                (":path", "/demo.Echo/Get"),
                ("content-type", content_type),
            ]);
            let h = scan(&buf, E).unwrap();
            assert_eq!(h.path, b"/demo.Echo/Get");
            h.grpc
        };
        assert!(call("application/grpc"));
        assert!(call("application/grpc+proto"));
        assert!(call("Application/GRPC"));
        assert!(!call("application/grpc-web"));
        assert!(!call("application/grpc-web+proto"));
        assert!(!call("application/json"));
        assert!(!call("application/grp"));
    }

    #[test]
    fn finds_the_method_and_control_headers() {
        let buf = serialise(&[
            (":authority", "example"),
            (":path", "/"),
            (":method", "GET"),
            ("x-envoy-retry-on", "5xx"),
        ]);
        let h = scan(&buf, E).unwrap();
        assert_eq!(h.method, b"GET");
        assert!(h.client_controls);

        // a client's timeouts-as-204 would hide its timeouts from outlier
        // detection (found by a review)
        let buf = serialise(&[
            (":method", "GET"),
            ("x-envoy-upstream-rq-timeout-alt-response", "true"),
        ]);
        assert!(scan(&buf, E).unwrap().client_controls);

        let buf = serialise(&[(":method", "POST"), ("x-request-id", "1")]);
        let h = scan(&buf, E).unwrap();
        assert_eq!(h.method, b"POST");
        assert!(!h.client_controls);
        assert!(!h.client_marker);

        let buf = serialise(&[(":method", "GET"), (FIRST_BYTE_MARKER, "1")]);
        let h = scan(&buf, E).unwrap();
        assert!(h.client_marker);
        assert!(
            !h.client_controls,
            "the marker is not a router control header"
        );
        assert!(!h.upgrade);

        let buf = serialise(&[(":method", "GET"), (ENDPOINT_HEADER, "10.0.0.1:80")]);
        let h = scan(&buf, E).unwrap();
        assert!(h.client_endpoint && !h.client_controls);
        assert!(!scan(&buf, b"x-other").unwrap().client_endpoint);

        let buf = serialise(&[(":method", "GET"), ("upgrade", "websocket")]);
        assert!(scan(&buf, E).unwrap().upgrade);

        let empty = serialise::<&str, &str>(&[]);
        let h = scan(&empty, E).unwrap();
        assert_eq!(h, Request::default());
    }

    #[test]
    fn finds_the_status_and_whether_the_router_relayed_the_response() {
        let buf = serialise(&[
            (":status", "503"),
            ("content-type", "text/plain"),
            (UPSTREAM_SERVICE_TIME, "12"),
        ]);
        let r = scan_response(&buf).unwrap();
        assert_eq!(r.status, Some(503));
        assert!(r.relayed);
        let local = serialise(&[(":status", "503"), ("content-length", "19")]);
        let r = scan_response(&local).unwrap();
        assert_eq!((r.status, r.relayed), (Some(503), false));
        let odd = serialise(&[(":status", "5x3"), ("x-envoy-upstream-service-timex", "1")]);
        assert_eq!(scan_response(&odd).unwrap(), ResponseHeaders::default());
        assert_eq!(scan_response(b"\xff\xff\xff\xff"), None, "malformed");
    }

    #[test]
    fn values_may_hold_anything_but_names_match_exactly() {
        let buf = serialise(&[
            ("x-envoy-retry-onx", ""),
            ("x", "x-envoy-retry-on"),
            (":method", ""),
        ]);
        let h = scan(&buf, E).unwrap();
        assert!(!h.client_controls);
        assert_eq!(h.method, b"");
    }

    #[test]
    fn malformed_buffers_are_none_never_a_panic() {
        let good = serialise(&[(":method", "GET"), ("a", "b")]);
        for cut in 0..good.len() {
            assert_eq!(scan(&good[..cut], E), None, "cut at {cut}");
        }
        assert_eq!(scan(&[0xff, 0xff, 0xff, 0xff], E), None);
        let mut long = good.clone();
        long[4] = 0xff; // first name's length past the end
        assert_eq!(scan(&long, E), None);
        // every byte value in every position: no panic
        for i in 0..good.len() {
            for b in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut m = good.clone();
                m[i] = b;
                let _ = scan(&m, E);
            }
        }
    }
}
