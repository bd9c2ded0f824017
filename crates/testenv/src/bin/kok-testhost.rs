//! The program inside every SSH test host: its init and service manager, and
//! the `systemctl` and `journalctl` its users run. See `kok_testenv::hosts`.

fn main() -> std::process::ExitCode {
    kok_testenv::hosts::guest::main()
}
