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
//! with the fault counters every 200 ms. Each line on stdin changes the faults from then on (a
//! schedule of faults, as the soak runs one): `clear` (none), `cut` (every open connection is
//! reset), or fault options as above (`--hang 1` makes a server that accepts and never answers).

use std::io::BufRead;

use ferry_tests::proxy::{FaultProxy, Faults};

const USAGE: &str = "usage: faultproxy TARGET_HOST:PORT [--hang P] [--trickle P] [--reset P --reset-within BYTES] [--reset-any-byte] [--reset-on PATTERN P]... [--silence-on PATTERN P]... [--seed N] [--stats FILE]";

/// Fault options (and `--seed`, `--stats`) from `args`; an error says which argument.
fn parse(args: &[String]) -> Result<(Faults, Option<u64>, Option<String>), String> {
    let mut f = Faults { reset_within: 1 << 20, ..Faults::default() };
    let (mut seed, mut stats) = (None, None);
    let mut i = 0;
    let num = |i: usize| -> Result<f64, String> {
        args.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| format!("{}: expected a number", args[i - 1]))
    };
    while i < args.len() {
        match args[i].as_str() {
            "--hang" => f.hang = num(i + 1)?,
            "--trickle" => f.trickle = num(i + 1)?,
            "--reset" => f.reset = num(i + 1)?,
            "--reset-within" => f.reset_within = num(i + 1)? as u64,
            "--seed" => seed = Some(num(i + 1)? as u64),
            "--stats" => stats = args.get(i + 1).cloned(),
            "--reset-any-byte" => {
                f.reset_both_ways = true;
                i -= 1;
            }
            "--reset-on" | "--silence-on" => {
                let pattern = args.get(i + 1).cloned().unwrap_or_default().into_bytes();
                f.on_request.push((pattern, num(i + 2)?, args[i] == "--reset-on"));
                i += 1;
            }
            other => return Err(format!("unknown argument {other}")),
        }
        i += 2;
    }
    Ok((f, seed, stats))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(target) = args.first().and_then(|t| t.parse().ok()) else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let (f, seed, stats) = parse(&args[1..]).unwrap_or_else(|e| {
        eprintln!("{e}\n{USAGE}");
        std::process::exit(2)
    });
    let proxy = FaultProxy::start(target, seed.unwrap_or(1));
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
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "" => {}
            "clear" => proxy.clear(),
            "cut" => proxy.cut_all(),
            opts => match parse(&opts.split_whitespace().map(str::to_string).collect::<Vec<_>>()) {
                Ok((f, _, _)) => proxy.set(f),
                Err(e) => eprintln!("faultproxy: {e}"),
            },
        }
    }
    eprintln!("faultproxy: {}", proxy.summary());
}
