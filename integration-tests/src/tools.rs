//! What the binaries in `src/bin` are made of: the bench's scenarios through
//! real Envoy ([`scenario`]) and in virtual time ([`virtual_time`]; generated
//! workloads judged against their fixed-delay frontier: [`workloads`]), the
//! instruction counts ([`callgrind`]), and the static check of Envoy configs
//! and manifests ([`config_check`]), and the manifests against their CRDs'
//! schemas ([`manifest_schema`]).

pub mod callgrind;
pub mod config_check;
pub mod manifest_schema;
pub mod scenario;
pub mod virtual_time;
pub mod workloads;
