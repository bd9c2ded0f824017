//! `kokctl`: the same CLI under its own name.

fn main() -> std::process::ExitCode {
    kokctl::main()
}
