//! Generates the gRPC code from the trimmed copies of Envoy's protos in proto/, with protox (a
//! protobuf compiler written in Rust): building needs no `protoc` on the machine, so `cargo
//! build` works on a clean Debian machine and in CI without an extra package.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/envoy/service/ratelimit/v3/rls.proto", "proto/envoy/service/rate_limit_quota/v3/rlqs.proto"];
    println!("cargo:rerun-if-changed=proto/envoy");
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
