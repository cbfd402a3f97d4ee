fn main() {
    std::process::exit(redis_ratelimit_sim::cli::main(std::env::args().skip(1).collect()));
}
