//! `oka-init`: PID 1 of every local sandbox. See [`oka_runtime::init`].

fn main() {
    std::process::exit(oka_runtime::init::main());
}
