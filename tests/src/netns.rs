//! "Hosts" for scale-out tests: network namespaces (`ip netns`), each with its own address on a
//! bridge in the root namespace. Servers in the root namespace listen on the bridge's address;
//! a process started in a host reaches them only through its link, so taking the link down
//! cuts that host off (packets dropped, no reset: what a pulled cable or a partition looks
//! like) while its processes keep running. The file system stays shared, as a NAS would be.
//!
//! Addresses come from 198.18.0.0/15 (set aside for benchmarks), one /24 per test process.
//! Needs root (the test command runs as root on CI machines; `ip` is in iproute2).

use std::process::Command;

pub struct Hosts {
    bridge: String,
    /// The bridge's address: where a host reaches servers of the root namespace.
    pub gateway: String,
    pub subnet: String,
    pub hosts: Vec<Host>,
}

pub struct Host {
    /// The namespace's name.
    pub name: String,
    /// The host's own address.
    pub address: String,
    /// The root side of its link: down = cut off.
    link: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| panic!("ip {}: {e} (iproute2 is needed)", args.join(" ")));
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl Hosts {
    /// A bridge and `n` hosts on it.
    pub fn new(n: usize) -> Hosts {
        assert!(n < 200);
        let tag = std::process::id() % 100_000;
        let net = std::process::id() % 250 + 1;
        let bridge = format!("fbr{tag}");
        let gateway = format!("198.18.{net}.1");
        let subnet = format!("198.18.{net}.0/24");
        // Leftovers of an earlier process with the same pid (killed before its Drop ran).
        let _ = Command::new("ip").args(["link", "del", &bridge]).output();
        ip(&["link", "add", "name", &bridge, "type", "bridge"]);
        let mut hosts = Hosts { bridge: bridge.clone(), gateway: gateway.clone(), subnet, hosts: vec![] };
        ip(&["addr", "add", &format!("{gateway}/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        for k in 0..n {
            let name = format!("ferry{tag}h{k}");
            let link = format!("fv{tag}h{k}");
            let inner = format!("fv{tag}n{k}");
            let address = format!("198.18.{net}.{}", 10 + k);
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
            let _ = Command::new("ip").args(["link", "del", &link]).output();
            ip(&["netns", "add", &name]);
            // Pushed before the links exist, so that Drop removes whatever was made.
            hosts.hosts.push(Host { name: name.clone(), address: address.clone(), link: link.clone() });
            ip(&["link", "add", &link, "type", "veth", "peer", "name", &inner]);
            ip(&["link", "set", &inner, "netns", &name]);
            ip(&["link", "set", &link, "master", &bridge]);
            ip(&["link", "set", &link, "up"]);
            ip(&["-n", &name, "addr", "add", &format!("{address}/24"), "dev", &inner]);
            ip(&["-n", &name, "link", "set", &inner, "up"]);
            ip(&["-n", &name, "link", "set", "lo", "up"]);
        }
        hosts
    }
}

impl Host {
    /// `c` as it would run on this host: `ip netns exec <host> <program> <args>`, with the
    /// same environment and working directory. `ip` execs the program, so the child's pid is
    /// the program's.
    pub fn run(&self, c: &Command) -> Command {
        let mut w = Command::new("ip");
        w.args(["netns", "exec", &self.name]).arg(c.get_program()).args(c.get_args());
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => w.env(k, v),
                None => w.env_remove(k),
            };
        }
        if let Some(d) = c.get_current_dir() {
            w.current_dir(d);
        }
        w
    }

    /// Takes the host's link down: its packets are dropped from now on.
    pub fn cut(&self) {
        ip(&["link", "set", &self.link, "down"]);
    }

    /// Brings the link back.
    pub fn reconnect(&self) {
        ip(&["link", "set", &self.link, "up"]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for h in &self.hosts {
            // Deleting one end of a veth pair deletes both, also while processes still live
            // in the namespace (which keeps the namespace itself until they end).
            let _ = Command::new("ip").args(["link", "del", &h.link]).output();
            let _ = Command::new("ip").args(["netns", "del", &h.name]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
    }
}
