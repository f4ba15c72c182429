//! `faultproxy`: the tests' fault-injecting TCP proxy as a command, for benchmarks and manual
//! runs.
//!
//!   faultproxy TARGET_HOST:PORT [--hang P] [--trickle P] [--reset P --reset-within BYTES]
//!              [--reset-any-byte] [--reset-on PATTERN P]... [--silence-on PATTERN P]...
//!              [--seed N] [--stats FILE]
//!
//! `--reset-any-byte` counts `--reset-within` over both directions (a reset can hit a reply);
//! `--reset-on` / `--silence-on` reset, or swallow the reply of, a request containing PATTERN
//! (an RPC name such as `complete`) with probability P; both may be given many times.
//!
//! Prints `LISTEN 127.0.0.1:<port>` and serves until stdin closes; with `--stats`, rewrites FILE
//! with the fault counters every 200 ms.

use std::io::BufRead;

use ferry_tests::proxy::{FaultProxy, Faults};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: faultproxy TARGET_HOST:PORT [--hang P] [--trickle P] [--reset P --reset-within BYTES] [--reset-any-byte] [--reset-on PATTERN P]... [--silence-on PATTERN P]... [--seed N] [--stats FILE]";
    let Some(target) = args.first().and_then(|t| t.parse().ok()) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let mut f = Faults { reset_within: 1 << 20, ..Faults::default() };
    let (mut seed, mut stats) = (1u64, None);
    let mut i = 1;
    let num = |i: usize| -> f64 {
        args.get(i).and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("{}: expected a number\n{usage}", args[i - 1]);
            std::process::exit(2)
        })
    };
    while i < args.len() {
        match args[i].as_str() {
            "--hang" => f.hang = num(i + 1),
            "--trickle" => f.trickle = num(i + 1),
            "--reset" => f.reset = num(i + 1),
            "--reset-within" => f.reset_within = num(i + 1) as u64,
            "--seed" => seed = num(i + 1) as u64,
            "--stats" => stats = args.get(i + 1).cloned(),
            "--reset-any-byte" => {
                f.reset_both_ways = true;
                i -= 1;
            }
            "--reset-on" | "--silence-on" => {
                let pattern = args.get(i + 1).cloned().unwrap_or_default().into_bytes();
                f.on_request.push((pattern, num(i + 2), args[i] == "--reset-on"));
                i += 1;
            }
            other => {
                eprintln!("unknown argument {other}\n{usage}");
                std::process::exit(2);
            }
        }
        i += 2;
    }
    let proxy = FaultProxy::start(target, seed);
    proxy.set(f);
    println!("LISTEN {}", proxy.addr);
    let proxy = std::sync::Arc::new(proxy);
    if let Some(path) = stats {
        let p = proxy.clone();
        std::thread::spawn(move || {
            loop {
                let c = p.counters();
                let o = std::sync::atomic::Ordering::SeqCst;
                let json = format!(
                    "{{\"connections\":{},\"resets\":{},\"pattern_resets\":{},\"silences\":{},\"hangs\":{},\"trickles\":{}}}\n",
                    c.connections.load(o),
                    c.resets.load(o),
                    c.pattern_resets.load(o),
                    c.silences.load(o),
                    c.hangs.load(o),
                    c.trickles.load(o)
                );
                let _ = std::fs::write(&path, json);
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        });
    }
    for _ in std::io::stdin().lock().lines() {}
    eprintln!("faultproxy: {}", proxy.summary());
}
