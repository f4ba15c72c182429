//! A PostgreSQL server of a test's own (initdb in a temp dir), for tests that restart it,
//! stop it for a while, or require TLS: the shared server the test command starts must stay
//! up for the other tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct Postgres {
    dir: tempfile::TempDir,
    pub port: u16,
    bin: PathBuf,
    /// With TLS: the CA that signed the server's certificate.
    pub ca: Option<PathBuf>,
    /// Addresses listened on besides 127.0.0.1 (a bridge to network namespaces).
    listen: Vec<String>,
}

fn pg_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed: run the test command (scripts/test.sh installs it)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("pg_ctl").exists())
        .collect();
    dirs.sort_by_key(|p| p.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse::<u32>().ok()));
    dirs.pop().expect("no /usr/lib/postgresql/*/bin/pg_ctl")
}

/// Runs a PostgreSQL program as the `postgres` user when we are root (it refuses root).
fn as_postgres(program: &Path) -> Command {
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(mut c: Command, what: &str) {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

impl Postgres {
    /// Starts a server on 127.0.0.1:<free port>. With `tls`, it makes a CA and a server
    /// certificate and accepts TLS connections only.
    pub fn start(tls: bool) -> Postgres {
        Postgres::start_on(tls, &[])
    }

    /// [`Postgres::start`], also listening on each `(address, subnet)` and trusting clients
    /// from that subnet: the host side of a bridge that network namespaces reach it through.
    pub fn start_on(tls: bool, also: &[(&str, &str)]) -> Postgres {
        let bin = pg_bin();
        let dir = tempfile::Builder::new().prefix("ferry-pg-").tempdir().unwrap();
        let _ = Command::new("chown").args(["-R", "postgres"]).arg(dir.path()).status();
        let data = dir.path().join("data");
        let mut init = as_postgres(&bin.join("initdb"));
        init.arg("-D").arg(&data).args(["-U", "postgres", "--auth=trust", "-E", "UTF8"]);
        run(init, "initdb");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut ca = None;
        if tls {
            let d = dir.path();
            let sh = format!(
                "set -e; cd {d}; \
                 openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=Ferry test ledger CA' -keyout ca.key -out ca.pem \
                   -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null; \
                 openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr 2>/dev/null; \
                 printf 'basicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\nsubjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext; \
                 openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -sha256 -extfile server.ext \
                   -out server.pem 2>/dev/null; \
                 chmod 600 server.key; chown postgres server.key server.pem 2>/dev/null || true; chmod 644 ca.pem",
                d = d.display()
            );
            run(
                {
                    let mut c = Command::new("sh");
                    c.args(["-c", &sh]);
                    c
                },
                "making certificates",
            );
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 0.0.0.0/0 reject\n",
            )
            .unwrap();
            ca = Some(d.join("ca.pem"));
        }
        if !also.is_empty() {
            let hba = data.join("pg_hba.conf");
            let mut text = std::fs::read_to_string(&hba).unwrap();
            for (_, subnet) in also {
                text += &format!("\nhost all all {subnet} trust\n");
            }
            std::fs::write(&hba, text).unwrap();
        }
        let listen = also.iter().map(|(a, _)| a.to_string()).collect();
        let mut pg = Postgres { dir, port, bin, ca, listen };
        // The port was free when looked at; PostgreSQL binds it itself, so another process may
        // take it first: then it fails to start, and starts on another.
        for _ in 0..4 {
            if pg.pg_ctl_start().status.success() {
                return pg;
            }
            pg.port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        }
        pg.start_again();
        pg
    }

    fn pg_ctl_start(&self) -> std::process::Output {
        let log = self.dir.path().join("log");
        let mut c = self.pg_ctl(&["-w", "-t", "60", "-o", &self.options(), "-l"]);
        c.arg(&log).arg("start");
        c.output().unwrap()
    }

    fn options(&self) -> String {
        let d = self.dir.path();
        let listen: Vec<&str> = std::iter::once("127.0.0.1").chain(self.listen.iter().map(String::as_str)).collect();
        let mut o = format!(
            "-c listen_addresses={} -p {} -c unix_socket_directories={} -c max_connections=200",
            listen.join(","),
            self.port,
            d.display()
        );
        if self.ca.is_some() {
            o += &format!(" -c ssl=on -c ssl_cert_file={0}/server.pem -c ssl_key_file={0}/server.key", d.display());
        }
        o
    }

    /// The URL of the `postgres` database (add TLS parameters when started with TLS).
    /// The psql of the server's PostgreSQL version.
    pub fn psql(&self) -> PathBuf {
        self.bin.join("psql")
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The URL of the `postgres` database at `address` (one of those given to `start_on`).
    pub fn url_at(&self, address: &str) -> String {
        format!("postgres://postgres@{address}:{}/postgres", self.port)
    }

    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut c = as_postgres(&self.bin.join("pg_ctl"));
        c.arg("-D").arg(self.dir.path().join("data")).args(args);
        c
    }

    /// Starts the server (again) and waits until it accepts connections.
    pub fn start_again(&self) {
        let out = self.pg_ctl_start();
        let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "pg_ctl start: {}{}{log}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `pg_ctl stop -m <mode>` (fast: sessions are told; immediate: a crash).
    pub fn stop(&self, mode: &str) {
        run(self.pg_ctl(&["-w", "-t", "60", "-m", mode, "stop"]), "pg_ctl stop");
    }

    /// A restart, as an operator's `pg_ctl restart -m <mode>`.
    pub fn restart(&self, mode: &str) {
        self.stop(mode);
        std::thread::sleep(Duration::from_millis(200));
        self.start_again();
    }
}

impl Postgres {
    /// One value from the server, through psql (an independent reader).
    pub fn sql(&self, q: &str) -> String {
        let mode = if self.ca.is_some() { "require" } else { "disable" };
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", q])
            .arg(format!("{}?sslmode={mode}", self.url()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{q}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn count(&self, q: &str) -> i64 {
        let v = self.sql(q);
        v.parse().unwrap_or_else(|_| panic!("{q}: not a number: {v:?}"))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "stop"]).output();
    }
}
