//! What every real-Envoy test and tool stands on: the Envoy process
//! ([`envoy`]), the simulated upstream hosts ([`sim`], with its precise
//! [`timer`]) and the load generators ([`load`]).

pub mod envoy;
pub mod load;
pub mod sim;
pub mod timer;
