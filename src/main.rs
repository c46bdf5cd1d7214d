//! The `claimd` binary: parses arguments, calls the library, prints what it returns.

use clap::Parser;
use std::io::Write;

/// Large buffers (request bodies, payloads up to `max_body_bytes`) come and go with the load.
/// glibc's malloc raises its mmap threshold after the first large free, so later bodies are
/// carved from per-thread heaps that are seldom given back: under a flood of 1 MiB bodies the
/// process kept its peak for good. A fixed 128 KiB threshold maps every large buffer on its own
/// and returns it to the system when freed (see docs/performance.md, "Memory").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_large_buffers_to_the_system() {
    const M_MMAP_THRESHOLD: std::os::raw::c_int = -3;
    unsafe extern "C" {
        fn mallopt(param: std::os::raw::c_int, value: std::os::raw::c_int) -> std::os::raw::c_int;
    }
    // SAFETY: mallopt only changes allocator tuning; called before any other thread starts.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_large_buffers_to_the_system() {}

fn main() {
    return_large_buffers_to_the_system();
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
