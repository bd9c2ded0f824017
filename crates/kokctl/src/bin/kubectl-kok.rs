//! `kubectl kok`: the kubectl plugin entry point.

fn main() -> std::process::ExitCode {
    kokctl::main()
}
