//! TLS in the connection layer against redis-server's TLS port (issue 35.2), with certificates
//! made for the test (tests/common/tls.rs): a private CA, mTLS, a wrong CA and a wrong host
//! name (each failing with an `ErrorKind::Tls` error that names the problem, at once, not at
//! the call's deadline), skip-hostname-verification (the chain still checked), and files that
//! cannot be read or parsed refused at `connect()`; a Redis Cluster that listens only on TLS.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/tls.rs"]
mod tls;

use std::time::Duration;

use common::{Opts, Server};
use redis_ratelimit_client::connection::{ErrorKind, TlsConfig};
use redis_ratelimit_client::{Connection, ConnectionConfig};
use tls::Certs;
use tokio::time::Instant;

fn server(certs: &Certs, mtls: bool) -> (Server, u16) {
    let (port, extra) = certs.server_opts(mtls);
    (Server::start_with(Opts { extra, ..Default::default() }), port)
}

async fn ping(conn: &Connection) -> Result<(), redis_ratelimit_client::connection::Error> {
    conn.call(&redis::cmd("PING"), Instant::now() + Duration::from_secs(2)).await.map(|_| ())
}

/// The error of the first attempt: it fails the call at once, not at its deadline.
async fn refused(conn: &Connection) -> String {
    let t = Instant::now();
    let e = ping(conn).await.unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(1), "waited {:?} for {e}", t.elapsed());
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    e.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_the_host_name_and_a_wrong_ca() {
    let certs = Certs::generate();
    let (_server, port) = server(&certs, false);
    let ca = TlsConfig::new().ca_file(certs.path("ca.crt"));
    // The private CA, the name in the certificate: rediss:// and the TLS settings alike.
    let conn = ConnectionConfig::single(&format!("rediss://localhost:{port}")).tls(ca.clone()).connect().unwrap();
    ping(&conn).await.unwrap();
    let conn = ConnectionConfig::single(&format!("localhost:{port}")).tls(ca.clone()).connect().unwrap();
    ping(&conn).await.unwrap();
    // rediss:// alone: the system's roots do not know the private CA.
    let conn = ConnectionConfig::single(&format!("rediss://localhost:{port}")).connect().unwrap();
    let e = refused(&conn).await;
    assert!(e.contains("not signed by a trusted CA"), "{e}");
    // Another CA.
    let other = TlsConfig::new().ca_file(certs.path("other-ca.crt"));
    let conn = ConnectionConfig::single(&format!("localhost:{port}")).tls(other.clone()).connect().unwrap();
    let e = refused(&conn).await;
    assert!(e.contains("not signed by a trusted CA"), "{e}");
    // A wrong name: the certificate names localhost, not 127.0.0.1.
    let conn = ConnectionConfig::single(&format!("127.0.0.1:{port}")).tls(ca.clone()).connect().unwrap();
    let e = refused(&conn).await;
    assert!(e.contains("not valid for the name '127.0.0.1'"), "{e}");
    assert!(conn.status().to_string().contains("not valid for the name"), "{}", conn.status());
    // Skipping the host name checks the chain still: the right CA passes, another does not.
    let skip = ca.clone().skip_hostname_verification(true);
    let conn = ConnectionConfig::single(&format!("127.0.0.1:{port}")).tls(skip).connect().unwrap();
    ping(&conn).await.unwrap();
    let conn = ConnectionConfig::single(&format!("127.0.0.1:{port}"))
        .tls(other.skip_hostname_verification(true))
        .connect()
        .unwrap();
    let e = refused(&conn).await;
    assert!(e.contains("not signed by a trusted CA"), "{e}");
    // Plain TCP to the TLS port is not answered as Redis.
    let conn = ConnectionConfig::single(&format!("127.0.0.1:{port}")).connect().unwrap();
    let e = conn.call(&redis::cmd("PING"), Instant::now() + Duration::from_millis(300)).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls() {
    let certs = Certs::generate();
    let (_server, port) = server(&certs, true);
    let url = format!("localhost:{port}");
    let ca = TlsConfig::new().ca_file(certs.path("ca.crt"));
    let with = ca.clone().client_cert(certs.path("client.crt"), certs.path("client.key"));
    let conn = ConnectionConfig::single(&url).tls(with).pool_size(2).connect().unwrap();
    ping(&conn).await.unwrap();
    // No client certificate: the server refuses the handshake (TLS 1.3 says so after it).
    let conn = ConnectionConfig::single(&url).tls(ca.clone()).connect().unwrap();
    let e = refused(&conn).await;
    assert!(e.contains("client certificate"), "{e}");
    // A client certificate of a CA the server does not trust.
    let wrong = ca.clone().client_cert(certs.path("other-client.crt"), certs.path("other-client.key"));
    let conn = ConnectionConfig::single(&url).tls(wrong).connect().unwrap();
    let e = refused(&conn).await;
    assert!(e.contains("client certificate"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_files_that_cannot_be_used_are_configuration_errors() {
    let certs = Certs::generate();
    std::fs::write(certs.path("garbage.pem"), "not a certificate\n").unwrap();
    let connect = |t: TlsConfig| ConnectionConfig::single("localhost:1").tls(t).connect().err().unwrap().to_string();
    let e = connect(TlsConfig::new().ca_file(certs.path("missing.crt")));
    assert!(e.contains("cannot read the TLS CA certificate file") && e.contains("missing.crt"), "{e}");
    let e = connect(TlsConfig::new().ca_file(certs.path("garbage.pem")));
    assert!(e.contains("garbage.pem") && e.contains("no certificate"), "{e}");
    let e = connect(TlsConfig::new().client_cert(certs.path("client.crt"), certs.path("garbage.pem")));
    assert!(e.contains("client key file") && e.contains("garbage.pem"), "{e}");
    let e = connect(TlsConfig::new().client_cert(certs.path("client.crt"), certs.path("server.key")));
    assert!(e.contains("do not make a pair"), "{e}");
    // A server away is not a configuration error.
    assert!(ConnectionConfig::single("localhost:1")
        .tls(TlsConfig::new().ca_file(certs.path("ca.crt")))
        .connect()
        .is_ok());
}

/// A Redis Cluster whose nodes listen only on TLS (`tls-cluster yes`): typed checks on keys of
/// every node enforce their limit, over the private CA with host names verified; another CA is
/// an `ErrorKind::Tls` error naming the certificate problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_listens_only_on_tls() {
    use redis_ratelimit_client::commands::{check, Options};
    use redis_ratelimit_client::spec::Limit;
    let certs = Certs::generate();
    let (_cluster, addrs) = certs.tls_only_cluster(3);
    let conn = ConnectionConfig::cluster(&addrs).tls(TlsConfig::new().ca_file(certs.path("ca.crt"))).connect().unwrap();
    conn.ready(Instant::now() + Duration::from_secs(5)).await.unwrap();
    let limit = Limit::fixed(2, Duration::from_secs(3600)).unwrap();
    // Keys in many slots: every node serves some.
    for k in 0..12 {
        let key = format!("tls:{k}");
        let mut c = conn.clone();
        let mut admitted = Vec::new();
        for _ in 0..3 {
            admitted.push(check(&mut c, &key, &limit, Options::default()).await.unwrap().allowed);
        }
        assert_eq!(admitted, [1, 1, 0], "{key}");
    }
    let wrong = TlsConfig::new().ca_file(certs.path("other-ca.crt"));
    let conn = ConnectionConfig::cluster(&addrs).tls(wrong).connect().unwrap();
    let e = conn.ready(Instant::now() + Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
    assert!(e.to_string().contains("not signed by a trusted CA"), "{e}");
}
