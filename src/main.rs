//! The `claimd` binary: parses arguments, calls the library, prints what it returns.

use clap::Parser;
use std::io::Write;

fn main() {
    claimd::service::run::return_large_buffers_to_the_system();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run());
}

async fn run() {
    let cli = claimd::cli::Cli::parse();
    let out = claimd::cli::execute(cli).await;
    let _ = std::io::stdout().write_all(out.stdout.as_bytes());
    let _ = std::io::stderr().write_all(out.stderr.as_bytes());
    std::process::exit(out.code);
}
