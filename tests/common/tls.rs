//! Certificates for TLS tests, made with the openssl CLI in a temporary directory: a private CA,
//! a second CA nobody trusts (the "wrong CA"), a server certificate for `localhost` only (so
//! dialing `127.0.0.1` is a wrong host name), client certificates signed by each CA (mTLS), and
//! a node certificate for `localhost` and `127.0.0.1` usable both ways (Redis Cluster's bus and
//! replication verify the peer's certificate as a client's too; Sentinel names nodes by IP).
//! [`Certs::server_opts`] gives redis-server's TLS directives for the harness (`Opts::extra`):
//! a TLS port beside the harness's plain one, which the tests never use for what they assert.

// Each test crate uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{Cluster, Opts};

pub struct Certs {
    pub dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Certs {
    pub fn generate() -> Certs {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("rl-tls-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        for ca in ["ca", "other-ca"] {
            let (subj, key, crt) = (format!("/CN=redis-ratelimit test {ca}"), format!("{ca}.key"), format!("{ca}.crt"));
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subj]);
            args.extend([
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(&dir, &args);
        }
        std::fs::write(dir.join("server.ext"), "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n").unwrap();
        std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        std::fs::write(
            dir.join("node.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .unwrap();
        for (name, ca, ext, cn) in [
            ("server", "ca", "server.ext", "localhost"),
            ("client", "ca", "client.ext", "client"),
            ("other-client", "other-ca", "client.ext", "client"),
            ("node", "ca", "node.ext", "localhost"),
        ] {
            let mut args = vec!["req"];
            args.extend(ec);
            let (key, csr, crt, subj) =
                (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"), format!("/CN={cn}"));
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
            openssl(&dir, &args);
            let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    &ca_crt,
                    "-CAkey",
                    &ca_key,
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "2",
                    "-extfile",
                    ext,
                ],
            );
        }
        Certs { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// redis-server's TLS directives: a TLS port (returned) with the server certificate,
    /// clients' certificates required (`mtls`) or not.
    pub fn server_opts(&self, mtls: bool) -> (u16, Vec<(String, String)>) {
        self.opts("server", mtls)
    }

    /// [`Certs::server_opts`] with the node certificate (for Sentinel's and Cluster's nodes;
    /// clients' certificates not required).
    pub fn node_opts(&self) -> (u16, Vec<(String, String)>) {
        self.opts("node", false)
    }

    fn opts(&self, cert: &str, mtls: bool) -> (u16, Vec<(String, String)>) {
        let port = crate::common::free_port();
        let p = |f: &str| self.path(f).display().to_string();
        let opts = vec![
            ("tls-port".to_string(), port.to_string()),
            ("tls-cert-file".to_string(), p(&format!("{cert}.crt"))),
            ("tls-key-file".to_string(), p(&format!("{cert}.key"))),
            ("tls-ca-cert-file".to_string(), p("ca.crt")),
            ("tls-auth-clients".to_string(), if mtls { "yes" } else { "no" }.to_string()),
        ];
        (port, opts)
    }
}

impl Certs {
    /// A Redis Cluster of `primaries` nodes that listen only on TLS once started (`tls-cluster
    /// yes`, the bus and replication over TLS; the plain ports, which `redis-cli --cluster
    /// create` used, closed with `CONFIG SET port 0`), and each node's `127.0.0.1:<TLS port>`.
    /// The harness's plain connections to its nodes no longer work.
    pub fn tls_only_cluster(&self, primaries: usize) -> (Cluster, Vec<String>) {
        let mut addrs = Vec::new();
        let cluster = Cluster::start_with_each(primaries, 0, Opts::default(), || {
            let (port, mut extra) = self.node_opts();
            addrs.push(format!("127.0.0.1:{port}"));
            extra.push(("tls-cluster".into(), "yes".into()));
            extra.push(("tls-replication".into(), "yes".into()));
            extra
        });
        for n in &cluster.nodes {
            n.config_set("port", "0");
        }
        (cluster, addrs)
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
