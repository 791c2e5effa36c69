//! One or more simulated upstream hosts as a standalone server: the hosts of
//! the docker-compose demo and of `make run`.
//!
//!     sim [--listen ADDR]... [--control ADDR] [--model SPEC] [--stream CHUNKS:GAP_MS]
//!
//! `--listen` (repeatable; default 127.0.0.1:8081): one host per address.
//! `--control` (default 127.0.0.1:0): `/stats`, `/reset` and
//! `/model/<host|all>/<spec with slashes>` to change latency while running.
//! `--model` (default `reference`: lognormal mean 5 ms, sd 2 ms, 5%
//! stragglers at 10x): `fixed:<ms>`, `lognormal:<mean>:<sd>:<p>:<mult>`,
//! `cache:<hit_mean>:<hit_sd>:<miss_p>:<miss_mean>:<miss_sd>` or `streaming`
//! (time to first token: cache hits 15 ms sd 3, 20% misses 200 ms sd 25).
//! `--stream` (default off): every response streams CHUNKS chunks GAP_MS
//! apart, the first after the model's delay (an SSE / LLM token stream).
//! Stops on SIGINT/SIGTERM.

use integration_tests::harness::sim::{Latency, Simulator, Stream};

fn main() {
    let mut listen = Vec::new();
    let mut control = "127.0.0.1:0".to_string();
    let mut model = Latency::reference();
    let mut stream = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        match (flag.as_str(), value) {
            ("--listen", Some(v)) => listen.push(v),
            ("--control", Some(v)) => control = v,
            ("--model", Some(v)) => {
                let parts: Vec<&str> = v.split(':').collect();
                model = Latency::parse(&parts).unwrap_or_else(|| {
                    fail(&format!("--model {v:?}: expected reference, streaming, fixed:<ms>, lognormal:<mean_ms>:<sd_ms>:<straggler_prob>:<straggler_mult> or cache:<hit_mean_ms>:<hit_sd_ms>:<miss_prob>:<miss_mean_ms>:<miss_sd_ms>"))
                });
            }
            ("--stream", Some(v)) => {
                stream = Some(Stream::parse(&v).unwrap_or_else(|| {
                    fail(&format!("--stream {v:?}: expected <chunks>:<gap_ms>"))
                }));
            }
            _ => fail(&format!("unknown or incomplete argument {flag:?}")),
        }
    }
    if listen.is_empty() {
        listen.push("127.0.0.1:8081".into());
    }
    let sim = Simulator::start_at(&listen, &control, vec![model.clone(); listen.len()])
        .unwrap_or_else(|e| fail(&format!("cannot listen on {listen:?}: {e}")));
    sim.set_stream(stream);
    println!(
        "sim: {} host(s) on {:?} (ports {:?}), control port {}, model {model:?}, stream {stream:?}",
        listen.len(),
        listen,
        sim.ports(),
        sim.control_port()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&e.to_string()));
    rt.block_on(async {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    });
    let t = sim.total();
    println!(
        "sim: stopping; {} arrivals, {} completions, {} cancellations",
        t.arrivals, t.completions, t.cancellations
    );
}

fn fail(message: &str) -> ! {
    eprintln!("sim: {message}");
    std::process::exit(2);
}
