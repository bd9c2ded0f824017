//! A hung test fails its binary instead of running the whole test run out of
//! time. With `KOK_TEST_BINARY_TIMEOUT` set (`scripts/test.sh` sets it), a
//! test binary still running that long after it started its first component
//! or test host prints the stack of each of its threads (with gdb, when
//! installed) and exits with code 101. The exit hooks stop every component
//! and host as on any other exit.

use std::process::{Command, Stdio};
use std::sync::Once;
use std::time::Duration;

/// The variable that sets the limit: `90s`, `20m` or plain seconds.
pub const TIMEOUT_VAR: &str = "KOK_TEST_BINARY_TIMEOUT";

/// Start the watchdog if the limit is set; later calls do nothing.
pub(crate) fn arm() {
    static ARMED: Once = Once::new();
    ARMED.call_once(|| {
        let Ok(text) = std::env::var(TIMEOUT_VAR) else {
            return;
        };
        let Some(limit) = parse(&text) else {
            eprintln!("kok-testenv: ignoring {TIMEOUT_VAR}={text:?}: not like 90s, 20m or 600");
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("kok-testenv-watchdog".into())
            .spawn(move || {
                std::thread::sleep(limit);
                expire(limit);
            });
        if let Err(e) = spawned {
            eprintln!("kok-testenv: cannot start the watchdog: {e}");
        }
    });
}

fn expire(limit: Duration) -> ! {
    let exe = std::env::current_exe().unwrap_or_default();
    eprintln!(
        "\nkok-testenv: {} is still running {limit:?} after it started the test environment \
         ({TIMEOUT_VAR}): a test hangs. Its threads:",
        exe.display()
    );
    // gdb attaches to its parent only when the parent allows it (Yama).
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
    }
    let pid = std::process::id().to_string();
    let dumped = Command::new("gdb")
        .args(["-p", &pid, "-batch", "-nx", "-ex", "thread apply all bt 40"])
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::null())
        .status();
    if dumped.is_err() {
        eprintln!("kok-testenv: (gdb is not installed; no stacks)");
    }
    eprintln!("kok-testenv: exiting with code 101");
    std::process::exit(101);
}

fn parse(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (number, unit) = match text.strip_suffix('m') {
        Some(minutes) => (minutes, 60),
        None => (text.strip_suffix('s').unwrap_or(text), 1),
    };
    let number: u64 = number.parse().ok()?;
    (number > 0).then(|| Duration::from_secs(number * unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_seconds_or_minutes() {
        assert_eq!(parse("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse("20m"), Some(Duration::from_secs(1200)));
        assert_eq!(parse(" 600 "), Some(Duration::from_secs(600)));
        assert_eq!(parse("0"), None);
        assert_eq!(parse("1h"), None);
        assert_eq!(parse("soon"), None);
    }
}
