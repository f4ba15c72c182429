//! `ferry-copy`: not built yet (issue 3). Fails loudly rather than pretending to work.

fn main() {
    eprintln!("ferry-copy: this stage is not implemented yet in this build of Ferry");
    std::process::exit(ferry_common::cli::exit::FATAL);
}
