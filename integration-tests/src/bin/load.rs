//! Open-loop load against a URL, printing latency percentiles per round: the
//! load generator of the docker-compose demo and of `make run`.
//!
//!     load --url http://127.0.0.1:10000/ [--rate 200] [--requests 2000] [--rounds 0]
//!          [--fanout N]
//!
//! `--rounds 0` repeats until stopped (SIGINT/SIGTERM). Each round sends
//! `--requests` requests at `--rate` per second whatever the responses do,
//! and times each from its scheduled start. `--fanout N`: each request is a
//! front end's, calling the URL N times in parallel and done when all have
//! answered (`--rate` and `--requests` count front-end requests).

use std::time::Duration;

use integration_tests::harness::load;

fn main() {
    let mut url = "http://127.0.0.1:10000/".to_string();
    let (mut rate, mut requests, mut rounds, mut fanout) = (200.0f64, 2_000u64, 0u64, 0u64);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        match flag.as_str() {
            "--url" => url = value,
            "--rate" => rate = number(&flag, &value),
            "--requests" => requests = number(&flag, &value),
            "--rounds" => rounds = number(&flag, &value),
            "--fanout" => fanout = number(&flag, &value),
            _ => fail(&format!("unknown argument {flag:?}")),
        }
    }
    if rate <= 0.0 || requests == 0 {
        fail("--rate and --requests must be positive");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&e.to_string()));
    rt.block_on(async {
        let client = load::client();
        let timeout = Duration::from_secs(10);
        let mut round = 0u64;
        while rounds == 0 || round < rounds {
            round += 1;
            let run = async {
                if fanout > 0 {
                    load::fan_out(&client, &url, fanout, rate, requests, timeout).await
                } else {
                    load::open_loop(&client, &url, rate, requests, timeout).await
                }
            };
            let result = tokio::select! {
                r = run => r,
                _ = tokio::signal::ctrl_c() => break,
            };
            let shape = if fanout > 0 {
                format!(" (front end waiting for {fanout} calls)")
            } else {
                String::new()
            };
            println!(
                "round {round}: {url} at {rate} req/s{shape}: {}",
                result.summary()
            );
        }
    });
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| fail(&format!("{flag} {value:?}: expected a number")))
}

fn fail(message: &str) -> ! {
    eprintln!("load: {message}");
    std::process::exit(2);
}
